"""State files read back at start or reload: their one decoder, and the report of what was dropped.

Every file the agent reads back from its data dir (``operator.json``, ``keyring.json``, the job ledger and
history, ``peers.json``, the sync replica index, retention and partial-transfer state, the watched signals file,
the ``snapshot.version`` and ``incarnation`` counters) becomes bounded typed values here, with the bounded types of
:mod:`p2pnode.snapshot` (ASCII digits only, no control characters, finite numbers in range, integers bounded
before any conversion). The rule, the same for every file:

* a bad **entry** (a wrong type, a control character, a NaN, a 400-digit integer, a lone surrogate) is dropped
  with one logged line naming the file and what was wrong, and counted by ``(file, reason)`` in the data dir's
  :class:`StateFileReport`; the rest of the file loads;
* a file that is not readable as a whole (garbage, truncated JSON) is ignored the same way (reason
  ``malformed``) and the agent starts without it;
* only files the operator must fix stop the agent (exit 2, one line): the config file, the node key, a keyring
  with no usable token, and a counter file that cannot be read (:func:`parse_counter`: a node that forgot its
  counters would publish versions its peers already hold).

Reasons: ``malformed`` (the whole file ignored), ``bad_entry`` (one entry dropped), ``bad_field`` (one field of a
file's header reset to its default), ``bad_primary`` (keyring: the primary key id names no usable token).

The report of a data dir is found by its path (:func:`report_for`), so the loaders, spread over the subsystems,
need no extra argument; the agent opens a fresh one at start (:func:`open_report`), shows it in ``/status``
(``state_files``) and exports it as ``p2pnode_state_file_entries_dropped_total{file,reason}``.

This module is a decoder module: the only place, with :mod:`p2pnode.snapshot`, where text read back from a file
becomes a number.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from .snapshot import COUNTER_MAX

__all__ = ["StateFileReport", "decode_entries", "decode_entry", "decimal", "file_name", "load_json", "open_report",
           "read_json_file", "report_for"]

log = logging.getLogger(__name__)

MAX_LOGGED = 16
"""Drops logged per (file, reason) and report; the rest are counted only (one line says so)."""
MAX_REMEMBERED = 10_000
"""Distinct drops a report remembers, so that reading the same bad entry again does not count it again."""
MAX_FILE_BYTES = 16 * 1024 * 1024
"""A JSON state file larger than this is ignored as ``malformed`` (the largest, the replica index, holds a few
hundred bytes per replica)."""
_MAX_INT_DIGITS = 20  # longer integers are out of every bound here: they never reach int()

_DECODE_ERRORS = (msgspec.ValidationError, msgspec.DecodeError, UnicodeError, ValueError, TypeError,
                  OverflowError, RecursionError)


class StateFileReport:
    """What the state-file decoders dropped in one data dir: ``{(file, reason): count}`` (thread-safe: the
    sync store loads in worker threads). ``file`` is the file's name relative to the data dir."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self._seen: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def drop(self, file: str, reason: str, detail: str) -> None:
        """Count one dropped entry (or file, or field) of ``file`` for ``reason``; log it (the first
        :data:`MAX_LOGGED` per file and reason, then one line saying the rest are only counted). The same drop
        (same ``detail``, which names the entry) read again (a file loaded twice, a ledger re-read, a reload) is
        counted and logged once (up to :data:`MAX_REMEMBERED` distinct drops; beyond, each read counts)."""
        key = (file, reason, detail)
        with self._lock:
            if key in self._seen:
                return
            if len(self._seen) < MAX_REMEMBERED:
                self._seen.add(key)
            n = self.counts[(file, reason)] = self.counts.get((file, reason), 0) + 1
        if n <= MAX_LOGGED:
            log.warning("state file %s: dropped (%s): %s", file, reason, detail[:300])
        if n == MAX_LOGGED:
            log.warning("state file %s: further %s drops are counted, not logged", file, reason)

    def count(self, file: str, reason: str | None = None) -> int:
        """Drops counted for ``file`` (for ``reason``, or all reasons)."""
        with self._lock:
            return sum(n for (f, r), n in self.counts.items() if f == file and reason in (None, r))

    def items(self) -> list[tuple[tuple[str, str], int]]:
        """``[((file, reason), count)]``, sorted (a copy: for the metrics exporter)."""
        with self._lock:
            return sorted(self.counts.items())

    def view(self) -> dict[str, dict[str, int]]:
        """``{file: {reason: count}}`` for ``/status``."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for (f, r), n in sorted(self.counts.items()):
                out.setdefault(f, {})[r] = n
        return out


_REPORTS: dict[str, StateFileReport] = {}
_REPORTS_LOCK = threading.Lock()


def _key(data_dir: Path) -> str:
    return str(Path(data_dir).absolute())


def report_for(data_dir: Path) -> StateFileReport:
    """The report of ``data_dir`` (created on first use)."""
    with _REPORTS_LOCK:
        return _REPORTS.setdefault(_key(data_dir), StateFileReport())


def open_report(data_dir: Path) -> StateFileReport:
    """A fresh report for ``data_dir`` (an agent starting on it: drops of an earlier run in this process are
    forgotten)."""
    with _REPORTS_LOCK:
        r = _REPORTS[_key(data_dir)] = StateFileReport()
        return r


def file_name(data_dir: Path, path: Path) -> str:
    """``path`` relative to ``data_dir`` (its name as the report shows it), else its base name."""
    try:
        return str(Path(path).absolute().relative_to(Path(data_dir).absolute()))
    except ValueError:
        return Path(path).name


# -- decoding --------------------------------------------------------------------------------------------
class _Malformed(Exception):
    pass


def _parse_int(text: str) -> Any:
    # JSON's grammar gives ASCII digits only; a longer integer than any bound is replaced by inf, which every
    # integer type refuses and every bounded float type too, so that entry alone is dropped.
    return int(text) if len(text) <= _MAX_INT_DIGITS else math.inf


def _parse_constant(name: str) -> Any:
    return math.nan  # NaN, Infinity, -Infinity: refused by every bounded type (entry dropped, not the file)


def load_json(raw: bytes) -> Any:
    """A state file's bytes as JSON builtins, lenient where one entry may be bad: ``NaN``/``Infinity`` and
    integers of more than 20 digits become values every bounded type refuses (so that entry alone is dropped).
    Raises ``ValueError`` for bytes that are not one JSON document (garbage, truncated, not UTF-8, too deep,
    over :data:`MAX_FILE_BYTES`)."""
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{len(raw)} bytes, more than {MAX_FILE_BYTES}")
    try:
        return json.loads(raw, parse_int=_parse_int, parse_constant=_parse_constant)
    except (ValueError, RecursionError, UnicodeError) as exc:
        raise ValueError(str(exc)[:200]) from None


def decode_entry(obj: Any, kind: Any) -> Any:
    """``obj`` (JSON builtins) as ``kind`` (a msgspec Struct or bounded type). Raises ``ValueError`` naming what
    was wrong (every msgspec and Unicode error is translated)."""
    try:
        value = msgspec.convert(obj, kind)
        msgspec.json.encode(value)  # a lone surrogate passes the type but could never be written or published
    except _DECODE_ERRORS as exc:
        raise ValueError(str(exc)[:200] or type(exc).__name__) from None
    return value


def decode_entries(items: Any, kind: Any, *, file: str, report: StateFileReport,
                   limit: int | None = None) -> list[Any]:
    """Each item of ``items`` (a list of JSON builtins) as ``kind``; a bad item is dropped and counted
    (``bad_entry``), one not a list at all counts once and gives ``[]``. At most ``limit`` items are read (the
    rest dropped and counted)."""
    if not isinstance(items, list):
        report.drop(file, "bad_entry", f"expected a list, found {type(items).__name__}")
        return []
    out: list[Any] = []
    for i, item in enumerate(items):
        if limit is not None and i >= limit:
            report.drop(file, "bad_entry", f"[{i}]: beyond the {limit} entries this file holds at most")
            continue
        try:
            out.append(decode_entry(item, kind))
        except ValueError as exc:
            report.drop(file, "bad_entry", f"[{i}] {_short(item)}: {exc}")
    return out


def read_json_file(path: Path, *, file: str, report: StateFileReport) -> Any:
    """The JSON builtins of the state file ``path`` (:func:`load_json`); None when it is missing, or not
    readable as a whole (counted ``malformed``: the agent goes on without it)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        report.drop(file, "malformed", f"unreadable: {exc}")
        return None
    try:
        return load_json(raw)
    except ValueError as exc:
        report.drop(file, "malformed", f"not JSON ({exc}): ignored")
        return None


def _short(obj: Any) -> str:
    try:
        text = repr(obj)
    except (ValueError, RecursionError):  # pragma: no cover - repr of JSON builtins
        text = type(obj).__name__
    return text if len(text) <= 80 else text[:77] + "..."


_DECIMAL = re.compile(r"[0-9]{1,20}\Z", re.ASCII)


def decimal(text: str | bytes, *, max_value: int = COUNTER_MAX) -> int | None:
    """The non-negative integer written in ``text`` (ASCII digits, surrounding whitespace allowed) when it is at
    most ``max_value``; None otherwise (``"²"``, ``"١٢"``, a sign, 400 digits, empty)."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    text = text.strip()
    if not _DECIMAL.match(text):
        return None
    n = int(text)
    return n if n <= max_value else None


def drop_all(report: StateFileReport, file: str, reason: str, details: Iterable[str]) -> None:
    """Count and log each of ``details`` as one drop of ``file`` for ``reason``."""
    for d in details:
        report.drop(file, reason, d)
