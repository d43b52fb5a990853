"""The guard driver: assesses each resource sample against the limits, keeps the degradation level, raises
events, runs event hooks and the disk manager. Decisions are the guard's pure functions (:mod:`p2pnode.guard`).

* on every resource sample (the agent calls :meth:`GuardDriver.check` from its sampler loop, every
  ``agent.sample_interval_s``) and every ``guard.check_interval_s``: the sample enters the CPU and memory windows
  (:class:`p2pnode.guardcore.LoadWindows`: CPU over ``guard.cpu_window_s``, memory over ``guard.memory_window_s``,
  PSI read by the sampler beside them), :func:`p2pnode.guard.assess` on the windowed figures, the level through the
  :class:`p2pnode.guard.DegradationTracker` (hysteresis, dwell), events from the
  :class:`p2pnode.guard.GuardMonitor`; the disk manager runs (in a worker thread) once disk use passes
  ``disk_warn_percent``, deleting only what the sync ledger says is replicated (sync first challenges the holders
  it counts: proof of possession, :meth:`p2pnode.sync.SyncService.verify_before_delete`); idle GPUs are looked at on the
  first assessment after each ``guard.idle_check_interval_s`` (:class:`p2pnode.guard.GuardMonitor`);
* the level in force (:attr:`GuardDriver.level`, after hysteresis and dwell) refuses new work
  (:meth:`GuardDriver.admits`); running work is shed under CPU or memory pressure by the job core, one job at
  a time (:mod:`p2pnode.guardcore._pressure`);
* events (guard's and those of other subsystems, :meth:`GuardDriver.emit_event`) are logged, carried in the
  snapshot's ``events`` section and handed to the hooks: ``script EVENT`` with the event's JSON on stdin, one
  at a time, killed after ``hook_timeout_s`` (Serf's event-handler contract).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import trio

from ..guardcore import (
    LEVEL_NAMES,
    Assessment,
    DegradationTracker,
    GuardLimits,
    GuardMonitor,
    LoadWindows,
    OperationPriority,
    admission,
    assess,
    level_change_message,
    level_reasons,
    run_cleanup,
)
from ..resources import ResourceSample
from ..snapshot import EventEntry, GuardSummary

__all__ = ["GuardDriver", "RECENT_EVENTS_IN_SNAPSHOT"]

log = logging.getLogger(__name__)
RECENT_EVENTS_IN_SNAPSHOT = 10


VIEW_KINDS = ("training", "selfplay", "evaluation")
"""Kinds of work ``GET /guard`` shows the admission of (with the catalog's own kinds)."""


class GuardDriver:
    """The guard of one node. ``now`` is monotonic seconds; ``on_news`` asks for a publication (an event);
    ``priority_of(kind)`` the guard priority of a kind of work (the catalog's ``[policy] priorities``,
    :meth:`p2pnode.scheduler.Catalog.priority_of`; None: NORMAL for every kind), ``kinds`` the catalog's kinds."""

    def __init__(self, limits: GuardLimits, *, node_id: str, data_dir: Path, now: Callable[[], float],
                 on_news: Callable[[], None],
                 priority_of: Callable[[str], OperationPriority] | None = None, kinds: Iterable[str] = ()) -> None:
        self.limits = limits
        self.priority_of = priority_of or (lambda kind: OperationPriority.NORMAL)
        self.kinds = tuple(dict.fromkeys((*VIEW_KINDS, *sorted(kinds))))
        self.node_id = node_id
        self.data_dir = data_dir
        self.now = now
        self.on_news = on_news
        self.tracker = DegradationTracker(limits)
        self.monitor = GuardMonitor(limits)
        self.windows = LoadWindows(limits)
        self._recorded: ResourceSample | None = None  # the newest sample in the windows (each enters them once)
        self.sample: ResourceSample | None = None
        """The newest sample assessed (its raw figures and PSI)."""
        self.psi_rejected: Counter[str] = Counter()
        """PSI files the sampler rejected, by reason (the agent shares its sampler's counter here)."""
        self.assessment: Assessment | None = None
        self.last_cleanup: dict[str, Any] | None = None
        self.memory_enforcement: dict[str, Any] | None = None
        """How per-job memory limits are enforced on this node, as the job runner found at start
        (:func:`p2pnode.jobs._cgroup.enforcement`; the agent sets it)."""
        self.hooks: list[tuple[str, str]] = [(p, s) for p, s in (h.split("=", 1) for h in limits.hooks)]
        self.hook_runs = 0
        self.hook_failures = 0
        self.events_dropped = 0
        self._cleaning = False  # a disk-manager pass (with its preparation) is under way
        self.cleanups_skipped = 0
        """Checks past ``disk_warn_percent`` that started no disk-manager pass: the previous one was still under way."""
        self.event_counts: Counter[str] = Counter()  # events emitted since start, per name (a true counter)
        self._event_send, self._event_recv = trio.open_memory_channel[Any](256)

    @property
    def level(self) -> int:
        """The degradation level 0-4 after hysteresis."""
        return self.tracker.level

    def reasons(self) -> tuple[str, ...]:
        """Why the node is at the level in force now (:func:`p2pnode.guard.level_reasons`): the newest assessment's
        reasons, and what holds the level where it differs from that assessment's (the dwell, with when it ends,
        or hysteresis)."""
        return level_reasons(self.assessment, self.tracker.level, self.limits,
                             since_change_s=self.now() - self.tracker.changed_at)

    def section(self) -> GuardSummary:
        """This node's ``guard`` snapshot section (its ``reasons`` are :meth:`reasons`: true of the level)."""
        a = self.assessment
        return GuardSummary(level=self.tracker.level, raw_level=a.level if a else 0,
                            ratio=round(a.ratio, 4) if a else 0.0, reasons=list(self.reasons())[:16],
                            gpus_full=list(a.gpus_full)[:32] if a else [])

    def events_section(self) -> list[EventEntry]:
        """The newest events, for this node's snapshot."""
        return [EventEntry(name=e.name, seq=e.seq, at=e.at, payload=e.payload)
                for e in self.monitor.log.recent(RECENT_EVENTS_IN_SNAPSHOT)]

    def check(self, sample: ResourceSample | None) -> list[Any]:
        """Assess ``sample`` (entering the windows once: the same sample checked again is not counted twice),
        update the degradation level and raise events. Returns the new events."""
        if sample is None:
            return []
        wire = sample.to_wire()
        signals = self.windows.observe(wire, self.now(), sample.psi, record=sample is not self._recorded)
        self._recorded = self.sample = sample
        self.assessment = assess(self.windows.windowed(wire, signals), self.limits, signals)
        before = self.tracker.level
        level = self.tracker.update(self.assessment, self.now())
        if level != before:
            log.log(logging.WARNING if level > before else logging.INFO, "%s",
                    level_change_message(before, level, self.assessment, self.limits))
        events = self.monitor.observe(wire, self.assessment, level, now=self.now(), at=time.time())
        for ev in events:
            self._dispatch(ev)
        return events

    def emit_event(self, name: str, payload: dict[str, Any]) -> None:
        """Record an event raised outside the guard (e.g. sync), hand it to the hooks and publish it soon."""
        self._dispatch(self.monitor.log.emit(name, payload, at=time.time()))

    def _dispatch(self, ev: Any) -> None:
        log.info("event %s %s", ev.name, json.dumps(ev.payload))
        self.event_counts[ev.name] += 1
        if self.hooks:
            try:
                self._event_send.send_nowait(ev)
            except trio.WouldBlock:
                self.events_dropped += 1
        self.on_news()

    def admits(self, kind: str, priority: OperationPriority | int | None = None) -> tuple[bool, str]:
        """May work of ``kind`` and ``priority`` (default: the kind's, :attr:`priority_of`) start here now (see
        :func:`p2pnode.guard.admission`)?"""
        if self.assessment is None:
            return True, ""
        prio = self.priority_of(kind) if priority is None else priority
        return admission(self.assessment, self.tracker.level, self.limits, kind=kind, priority=prio,
                         since_change_s=self.now() - self.tracker.changed_at)

    def cpu_percent(self) -> float | None:
        """CPU use over the guard's window (the mean over ``guard.cpu_window_s`` of the samples taken), percent, for
        the CPU offer; None before the first sample. Unlike the level's figure it has no start-up discount (the
        part of the window not yet sampled counting as idle, :class:`p2pnode.guardcore.LoadWindows`): the agent's
        first ``cpu_window_s`` offers CPU on what it measured, not on a share of it."""
        if self.assessment is None:
            return None
        cpu = next((x for x in self.assessment.signals if x.resource == "cpu"), None)
        return cpu.window_percent if cpu is not None and cpu.basis == "window" else self.assessment.used_percent("cpu")

    def gpus_full(self) -> tuple[int, ...]:
        """GPUs whose memory is at or above the GPU limit in the newest assessment: no new work on them."""
        return self.assessment.gpus_full if self.assessment is not None else ()

    def idle_gpus(self) -> int:
        """GPUs idle past the idle grace (:meth:`p2pnode.guard.GuardMonitor.idle_gpus`)."""
        return self.monitor.idle_gpus(self.now())

    def cleanup_pass(self, *, dry_run: bool | None = None, replicated: Callable[[str], bool] | None = None,
                     protected: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """One disk-manager pass over the data dir (blocking I/O: run it in a thread from trio code, with
        ``replicated`` and ``protected`` from :meth:`p2pnode.sync.SyncService.replicated_predicate` and
        ``protected_predicate`` taken in the trio thread)."""
        dry = self.limits.cleanup == "dry-run" if dry_run is None else dry_run
        pred = replicated if replicated is not None else (lambda path: False)
        keep = protected if protected is not None else (lambda path: False)
        self.last_cleanup = run_cleanup(self.data_dir, self.limits, dry_run=dry, replicated=pred, protected=keep)
        return self.last_cleanup

    async def run(self, sample: Callable[[], ResourceSample | None],
                  replicated: Callable[[], Callable[[str], bool]],
                  protected: Callable[[], Callable[[str], bool]] = lambda: (lambda path: False),
                  prepare: Callable[[], Awaitable[None]] | None = None) -> None:
        """Check every ``check_interval_s``; clean up past ``disk_warn_percent``; run hooks. Until cancelled.
        ``prepare()`` runs before each cleanup pass, before the predicates are taken (sync: challenge the holders
        of the files that may go, :meth:`p2pnode.sync.SyncService.verify_before_delete`, which may wait for
        answers up to ``sync.challenge_timeout_s`` and 5 s). Preparation and cleanup run in their own task, one
        pass at a time: assessment goes on every ``check_interval_s`` meanwhile (it matters most under disk
        pressure), and a check that finds a pass still under way starts none (counted in ``cleanups_skipped``)."""
        async with trio.open_nursery() as n:
            if self.hooks:
                n.start_soon(self._hook_loop)
            while True:
                await trio.sleep(self.limits.check_interval_s)
                s = sample()
                self.check(s)
                if self.limits.cleanup != "off" and s is not None and s.disk_percent >= self.limits.disk_warn_percent:
                    if self._cleaning:
                        self.cleanups_skipped += 1
                        continue
                    self._cleaning = True
                    n.start_soon(self._clean, replicated, protected, prepare)

    async def _clean(self, replicated: Callable[[], Callable[[str], bool]],
                     protected: Callable[[], Callable[[str], bool]],
                     prepare: Callable[[], Awaitable[None]] | None) -> None:
        """One disk-manager pass: ``prepare()``, then the predicates taken and the pass run in a worker thread."""
        try:
            if prepare is not None:
                await prepare()
            pred, keep = replicated(), protected()
            await trio.to_thread.run_sync(functools.partial(self.cleanup_pass, replicated=pred, protected=keep))
        finally:
            self._cleaning = False

    async def _hook_loop(self) -> None:
        async for ev in self._event_recv:
            for pattern, script in self.hooks:
                if pattern not in ("*", ev.name):
                    continue
                self.hook_runs += 1
                payload = json.dumps({"node_id": self.node_id, **ev.to_wire()}).encode()
                try:
                    with trio.fail_after(self.limits.hook_timeout_s):
                        r = await trio.run_process([script, ev.name], stdin=payload, capture_stdout=True,
                                                   capture_stderr=True, check=False)
                    if r.returncode != 0:
                        self.hook_failures += 1
                        log.warning("hook %s for %s exited %d: %s", script, ev.name, r.returncode,
                                    r.stderr.decode(errors="replace")[-500:])
                except (trio.TooSlowError, OSError) as exc:
                    self.hook_failures += 1
                    log.warning("hook %s for %s failed: %s", script, ev.name, exc or "timed out")

    def view(self) -> dict[str, Any]:
        """``GET /guard``: level (in force, with its name and :meth:`reasons`), assessment (with ``signals``: CPU
        and memory as assessed, their window mean, the raw sample and PSI ``avg10``), ``windows`` (the settings,
        and that PSI is shown, never moves the level), ``pressure_stall`` (the PSI files read: source, every line),
        ``psi_rejected`` by reason, admission per kind (at the kind's own priority, :attr:`priority_of`), last
        cleanup, hooks, how per-job memory limits are enforced."""
        a = self.assessment
        admits = {}
        for k in self.kinds:
            prio = OperationPriority(int(self.priority_of(k)))
            ok, reason = self.admits(k, prio)
            admits[k] = {"ok": ok, "reason": reason, "priority": prio.name}
        return {
            "level": self.tracker.level,
            "level_name": LEVEL_NAMES[self.tracker.level],
            "reasons": list(self.reasons()),
            "level_changes": self.tracker.changes,
            "assessment": a.to_dict() if a else None,
            "windows": {"cpu_window_s": self.limits.cpu_window_s, "memory_window_s": self.limits.memory_window_s,
                        "psi_moves_level": False,
                        "dropped_samples": {"cpu": self.windows.cpu.dropped, "memory": self.windows.memory.dropped},
                        "rule": "CPU counts as its mean over cpu_window_s; memory as its mean over memory_window_s, "
                                "or at once at or above its limit; disk as each sample; PSI is shown beside them "
                                "and never moves the level"},
            "pressure_stall": self.sample.psi.to_dict() if self.sample is not None and self.sample.psi else None,
            "psi_rejected": dict(self.psi_rejected),
            "admits": admits,
            "last_cleanup": self.last_cleanup,
            "cleanups_skipped": self.cleanups_skipped,
            "hooks": {"configured": len(self.hooks), "runs": self.hook_runs, "failures": self.hook_failures},
            "memory_enforcement": self.memory_enforcement,
        }
