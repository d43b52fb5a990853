"""Resource events and the monitor that raises them from successive samples. Pure (times passed in).

Events (seed 000): ``IDLE_RESOURCE_DETECTED`` (a GPU below the idle threshold for the grace period),
``RESOURCE_CONSTRAINT`` (a resource reached its warn limit), ``NODE_OVERLOADED`` (the degradation level reached
heavy), ``DISK_SPACE_LOW`` (disk reached the disk manager's notice threshold), ``BACKPRESSURE_ACTIVATED`` /
``BACKPRESSURE_RELEASED`` (the level entered / left moderate-or-worse, where low-priority work is refused; the
level events carry the level in force, its name and the reasons that moved it: the loads that raised it, or the
load ratio under the edge it fell below);
raised by sync (:mod:`p2pnode.sync`): ``UNDER_REPLICATED`` / ``REPLICATION_RESTORED`` (a file that had R confirmed
replicas has fewer / has R again), ``MODEL_UPDATED`` (a published file's new version verified and switched in at
``<sync.subscribe_dir>/<name>``; payload: name, version, path, root, publisher; one per version).
Every event is edge-triggered: it fires when its condition starts and re-arms when it ends.

Idle GPUs are checked every ``idle_check_interval_s`` (seed 000's idle daemon): a GPU below the idle threshold at
a check starts its idle grace period; any observation above the threshold ends it at once (a GPU that got work is
never offered as idle for up to a check interval); the event fires at the first check past the grace period.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec

from ._assess import LEVEL_NAMES, Assessment, fell_under
from ._limits import GuardLimits

__all__ = ["EVENT_NAMES", "Event", "EventLog", "GuardMonitor"]

EVENT_NAMES = (
    "IDLE_RESOURCE_DETECTED",
    "RESOURCE_CONSTRAINT",
    "NODE_OVERLOADED",
    "DISK_SPACE_LOW",
    "BACKPRESSURE_ACTIVATED",
    "BACKPRESSURE_RELEASED",
    "UNDER_REPLICATED",
    "REPLICATION_RESTORED",
    "MODEL_UPDATED",
)
BACKPRESSURE_LEVEL = 2
"""Degradation level (moderate) from which a node applies backpressure: it offers no capacity (GPU or CPU work)
and publishes a ``BACKPRESSURE`` event."""
OVERLOADED_LEVEL = 3


class Event(msgspec.Struct, frozen=True):
    """One event: ``seq`` (per node, increasing), ``name``, ``at`` (wall-clock seconds, for people), ``payload``."""

    seq: int
    name: str
    at: float
    payload: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        """The event as carried in the snapshot's events section."""
        return {"seq": self.seq, "name": self.name, "at": self.at, "payload": self.payload}


class EventLog:
    """The newest ``capacity`` events of this node."""

    def __init__(self, capacity: int = 100) -> None:
        self._events: deque[Event] = deque(maxlen=capacity)
        self._seq = 0

    def emit(self, name: str, payload: dict[str, Any], at: float) -> Event:
        """Record event ``name`` (one of :data:`EVENT_NAMES`, else ``ValueError``) stamped ``at`` (wall-clock s)
        with the next sequence number, and return it."""
        if name not in EVENT_NAMES:
            raise ValueError(f"unknown event {name!r}")
        self._seq += 1
        ev = Event(self._seq, name, at, payload)
        self._events.append(ev)
        return ev

    def recent(self, n: int | None = None) -> list[Event]:
        """The newest ``n`` events (all held when ``n`` is None), oldest first."""
        evs = list(self._events)
        return evs if n is None else evs[-n:]


class GuardMonitor(msgspec.Struct):
    """Turns successive (sample, assessment, level) into events. ``now`` is monotonic seconds (for the idle
    grace period), ``at`` wall-clock seconds (stamped on events)."""

    limits: GuardLimits
    log: EventLog = msgspec.field(default_factory=EventLog)
    _constrained: set[str] = msgspec.field(default_factory=set)
    _disk_low: bool = False
    _overloaded: bool = False
    _backpressure: bool = False
    _idle_since: dict[int, float] = msgspec.field(default_factory=dict)
    _idle_reported: set[int] = msgspec.field(default_factory=set)
    _next_idle_check: float = -1e18

    def idle_gpus(self, now: float) -> int:
        """GPUs idle (below the idle threshold) for at least the grace period as of the last observation."""
        return sum(1 for since in self._idle_since.values() if now - since >= self.limits.idle_grace_period_s)

    def observe(self, sample: dict[str, Any], a: Assessment, level: int, *, now: float, at: float) -> list[Event]:
        """The events that start with this observation (edge-triggered, see the module docstring): ``sample`` in
        wire form, its assessment ``a``, the tracked ``level``; ``now`` monotonic s, ``at`` wall-clock s."""
        out: list[Event] = []
        L = self.limits
        for load in a.loads:
            hot = load.max_percent > 0 and load.used_percent >= load.warn_percent  # (max 0: not assessed)
            if hot and load.name not in self._constrained:
                self._constrained.add(load.name)
                out.append(self.log.emit("RESOURCE_CONSTRAINT", {
                    "resource": load.name, "used_percent": round(load.used_percent, 2),
                    "warn_percent": load.warn_percent, "max_percent": load.max_percent}, at))
            elif not hot:
                self._constrained.discard(load.name)
        disk = float(sample.get("disk_percent", 0.0))
        if disk >= L.disk_notice_percent and not self._disk_low:
            self._disk_low = True
            out.append(self.log.emit("DISK_SPACE_LOW", {
                "disk_percent": round(disk, 2), "path": sample.get("disk_path"),
                "notice_percent": L.disk_notice_percent, "cleanup_percent": L.disk_warn_percent,
                "critical_percent": L.disk_max_percent}, at))
        elif disk < L.disk_notice_percent - 100 * L.hysteresis_ratio:
            self._disk_low = False
        named = {"level": level, "level_name": LEVEL_NAMES[max(0, min(4, level))]}
        if level >= OVERLOADED_LEVEL and not self._overloaded:
            self._overloaded = True
            out.append(self.log.emit("NODE_OVERLOADED", {**named, "reasons": list(a.reasons)[:16]}, at))
        elif level < OVERLOADED_LEVEL:
            self._overloaded = False
        if level >= BACKPRESSURE_LEVEL and not self._backpressure:
            self._backpressure = True
            out.append(self.log.emit("BACKPRESSURE_ACTIVATED", {**named, "reasons": list(a.reasons)[:16]}, at))
        elif level < BACKPRESSURE_LEVEL and self._backpressure:
            self._backpressure = False
            out.append(self.log.emit("BACKPRESSURE_RELEASED", {
                **named, "reasons": [fell_under(level, a, L), *a.reasons][:16]}, at))
        idle_check = now >= self._next_idle_check
        if idle_check:
            self._next_idle_check = now + L.idle_check_interval_s
        for g in sample.get("gpus", []):
            i = int(g.get("index", 0))
            if float(g.get("util_percent", 0.0)) < L.idle_gpu_threshold_percent:
                if not idle_check:
                    continue  # idleness is looked at only every idle_check_interval_s
                since = self._idle_since.setdefault(i, now)
                if now - since >= L.idle_grace_period_s and i not in self._idle_reported:
                    self._idle_reported.add(i)
                    out.append(self.log.emit("IDLE_RESOURCE_DETECTED", {
                        "gpu": i, "uuid": g.get("uuid"), "model": g.get("name"),
                        "util_percent": g.get("util_percent"), "idle_for_s": round(now - since, 1)}, at))
            else:
                self._idle_since.pop(i, None)
                self._idle_reported.discard(i)
        return out
