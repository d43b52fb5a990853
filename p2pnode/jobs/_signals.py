"""Signals from the training pipeline, as one node holds and merges them.

A node accepts signals by ``POST /signals`` or from a watched file (``scheduler.signals_file``) and carries
them in its ``jobs`` section, each stamped with a Lamport clock: one above the highest clock it has seen for that
config in any snapshot. The newest signal of a config cluster-wide is the one with the highest
``(clock, origin)`` pair (Lamport, "Time, Clocks, and the Ordering of Events in a Distributed System", 1978),
so a node with a skewed wall clock can never make its signal win, and every node picks the same one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
import trio

from ..inputs import InputError
from ..scheduler import SignalError, Signals, decode_signal_body, merge_signals, next_clock, validate_signals
from ..scheduler._signals import MAX_SIGNALS_PER_REQUEST
from ..snapshot import JobsSection, SignalEntry
from ..statefiles import StateFileReport

WATCH_PERIOD_S = 1.0
"""How often the signals file's mtime is looked at (seconds)."""

__all__ = ["SignalBook", "newest_signals", "MAX_SIGNALS_IN_SNAPSHOT"]

log = logging.getLogger(__name__)
MAX_SIGNALS_IN_SNAPSHOT = 64
_FIELDS = ("curriculum_weight", "elo_velocity", "data_age_s", "quality", "game_count")


def newest_signals(sections: Iterable[tuple[str, JobsSection]]) -> dict[str, Signals]:
    """The newest signal per config among ``(origin, jobs section)`` pairs (:func:`p2pnode.scheduler.merge_signals`:
    highest ``(clock, origin)``). Values that no longer validate (a newer agent's field) are skipped."""
    candidates = []
    for origin, jobs in sections:
        for cfg, entry in jobs.signals.items():
            try:
                candidates.append((cfg, entry.clock, origin, validate_signals({"config": cfg, **entry.values})))
            except SignalError:
                continue
    return merge_signals(candidates)


class SignalBook:
    """The signals this node accepted, ``{config: SignalEntry}`` (newest :data:`MAX_SIGNALS_IN_SNAPSHOT` kept).

    ``known_configs``: configs of the catalog (others are rejected); ``seen_clocks()``: ``(config, clock)`` of
    every signal in any member's snapshot; ``on_change``: a new signal was accepted (publish).
    """

    def __init__(self, known_configs: Iterable[str], *, seen_clocks: Callable[[], Iterable[tuple[str, int]]],
                 on_change: Callable[[], None], report: StateFileReport | None = None) -> None:
        self.known = set(known_configs)
        self.report = report if report is not None else StateFileReport()
        self.seen_clocks = seen_clocks
        self.on_change = on_change
        self.entries: dict[str, SignalEntry] = {}
        self.rejected = 0
        self._file_mtime = 0.0

    def accept(self, raw: Any) -> list[Signals]:
        """Validate one signal or a list of them (JSON-like). Raises :class:`SignalError` with every reason
        (unknown config, out of range, more than 256 at once); nothing is kept unless all are valid."""
        items = raw if isinstance(raw, list) else [raw]
        if len(items) > MAX_SIGNALS_PER_REQUEST:
            raise SignalError([f"at most {MAX_SIGNALS_PER_REQUEST} signals at once"])
        out, reasons = [], []
        for i, item in enumerate(items):
            try:
                s = validate_signals(item)
            except SignalError as exc:
                reasons += [f"[{i}] {r}" for r in exc.reasons]
                continue
            if s.config not in self.known:
                reasons.append(f"[{i}] config {s.config!r} is not in the catalog")
                continue
            out.append(s)
        if reasons:
            self.rejected += 1
            raise SignalError(reasons)
        seen = list(self.seen_clocks()) + [(cfg, e.clock) for cfg, e in self.entries.items()]
        for s in out:
            self.entries.pop(s.config, None)
            clock = next_clock(s.config, seen)
            seen.append((s.config, clock))
            self.entries[s.config] = SignalEntry(clock=clock, values={k: getattr(s, k) for k in _FIELDS})
        while len(self.entries) > MAX_SIGNALS_IN_SNAPSHOT:
            del self.entries[next(iter(self.entries))]
        self.on_change()
        return out

    def watch_file(self, path: str) -> None:
        """Load ``path`` when its mtime changed (missing: nothing). A file that is not JSON is ignored; a bad entry
        (out of bounds, an unknown config) is dropped and the rest kept; each is logged and counted in the data
        dir's :class:`p2pnode.statefiles.StateFileReport` under the file's name."""
        if not path:
            return
        try:
            mtime = os.stat(path).st_mtime
            if mtime == self._file_mtime:
                return
            self._file_mtime = mtime
            body = Path(path).read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("signals file %s unreadable: %s", path, exc)
            return
        name = Path(path).name
        try:
            items = decode_signal_body(body)
        except InputError as exc:
            if exc.reason == "malformed":
                self.report.drop(name, "malformed", exc.detail)
                return
            items = []  # one bad entry: decode them one at a time, keep the good ones
            try:
                parts = msgspec.json.decode(body, type=list[msgspec.Raw])
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):  # the bad entry
                parts = [msgspec.Raw(body)]
            for i, part in enumerate(parts):
                try:
                    items += decode_signal_body(bytes(part))
                except InputError as e:
                    self.report.drop(name, "bad_entry", f"[{i}] {e.detail}")
        kept = 0
        for item in items:
            try:
                kept += len(self.accept(item))
            except SignalError as exc:
                self.report.drop(name, "bad_entry", "; ".join(exc.reasons))
        log.info("signals file %s loaded: %d signal(s)", path, kept)

    async def watch(self, path: str, on_news: Callable[[], None], period_s: float = WATCH_PERIOD_S) -> None:
        """Watch ``path`` (the ``scheduler.signals_file``; '' none: returns at once): its mtime is looked at every
        ``period_s`` seconds (a stat, no inotify dependency) and a changed file is loaded (:meth:`watch_file`),
        then ``on_news()`` is called."""
        if not path:
            return
        while True:
            before = self._file_mtime
            self.watch_file(path)
            if self._file_mtime != before:
                on_news()
            await trio.sleep(period_s)
