"""Cluster totals and the dashboard's time series: pure, no I/O, no clock.

:func:`cluster_totals` sums the live members' snapshots (what ``ray status`` shows for a Ray cluster: GPUs busy of
total, VRAM, CPUs, memory, jobs). :class:`ClusterSeries` keeps one :class:`SeriesPoint` of those figures per
``step_s`` in a ring buffer of ``capacity`` points (default 900 × 1 s = the last 15 minutes, at most about 230 KB),
fed by the agent on each resource sample (``agent._sample_loop``) and served at ``GET /ui/series`` and in
``GET /ui/state`` (:mod:`p2pnode.http._ui`). Its memory is bounded whatever the sample rate: points closer than
``STEP_SLACK × step_s`` to the previous one are dropped (the slack lets a sampler that ticks exactly every
``step_s``, give or take timer jitter, keep every point).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec

from .snapshot import Snapshot

__all__ = ["BUSY_UTIL_PERCENT", "ClusterSeries", "ClusterTotals", "SeriesPoint", "cluster_point", "cluster_totals"]

BUSY_UTIL_PERCENT = 10.0
"""A GPU counts as busy when a running job of its member holds it, or its utilization is at least this (percent):
jobs listed by count only (members running more than ``INLINE_RUNNING`` jobs) and work outside p2pnode still show."""

DEFAULT_CAPACITY = 900
"""Points kept by default: 15 minutes at one point per second."""

DEFAULT_STEP_S = 1.0
"""Time between two points, seconds (a faster sampler does not shorten the window)."""

STEP_SLACK = 0.9
"""A point is kept when it comes at least this fraction of ``step_s`` after the previous one."""


class ClusterTotals(msgspec.Struct, frozen=True, kw_only=True):
    """Sums over live (alive and suspect) members. Utilization and CPU percent are means weighted by GPU and CPU
    count; bytes are bytes."""

    members: int = 0
    gpus_total: int = 0
    gpus_busy: int = 0
    gpu_util_percent: float = 0.0
    vram_used_bytes: int = 0
    vram_total_bytes: int = 0
    cpus: int = 0
    cpu_percent: float = 0.0
    mem_used_bytes: int = 0
    mem_total_bytes: int = 0
    jobs_running: int = 0


def cluster_totals(snapshots: Iterable[Snapshot]) -> ClusterTotals:
    """:class:`ClusterTotals` of ``snapshots`` (pass the live members' newest snapshots, this node's included).

    A GPU is busy when a job in its member's inline running list holds it or its utilization is at least
    :data:`BUSY_UTIL_PERCENT`; ``jobs_running`` sums ``jobs.running_count`` (exact even for members whose list
    is carried by count only)."""
    members = gpus = busy = vram_used = vram_total = cpus = mem_used = mem_total = jobs = 0
    util_sum = cpu_sum = 0.0
    for s in snapshots:
        r = s.resources
        members += 1
        held = {i for j in s.jobs.running for i in j.gpus}
        for g in r.gpus:
            gpus += 1
            util_sum += g.util_percent
            busy += g.index in held or g.util_percent >= BUSY_UTIL_PERCENT
            vram_used += g.mem_used_bytes
            vram_total += g.mem_total_bytes
        cpus += r.cpu_count
        cpu_sum += r.cpu_percent * r.cpu_count
        mem_used += r.mem_used_bytes
        mem_total += r.mem_total_bytes
        jobs += s.jobs.running_count
    return ClusterTotals(members=members, gpus_total=gpus, gpus_busy=busy,
                         gpu_util_percent=round(util_sum / gpus, 2) if gpus else 0.0,
                         vram_used_bytes=vram_used, vram_total_bytes=vram_total, cpus=cpus,
                         cpu_percent=round(cpu_sum / cpus, 2) if cpus else 0.0,
                         mem_used_bytes=mem_used, mem_total_bytes=mem_total, jobs_running=jobs)


class SeriesPoint(msgspec.Struct, frozen=True, kw_only=True):
    """One sample of the cluster: wall-clock ``t`` (seconds), mean GPU utilization and GPUs busy of total, VRAM
    used (percent of the cluster's VRAM), mean CPU percent, jobs running and pending (the leader's plan), live
    members."""

    t: float
    gpu_util_percent: float = 0.0
    gpus_busy: int = 0
    gpus_total: int = 0
    vram_used_percent: float = 0.0
    cpu_percent: float = 0.0
    jobs_running: int = 0
    jobs_pending: int = 0
    members: int = 0


FIELDS: tuple[str, ...] = SeriesPoint.__struct_fields__
"""Column names of :meth:`ClusterSeries.view`'s rows, in order."""


def cluster_point(t: float, snapshots: Iterable[Snapshot], leader: str | None) -> SeriesPoint:
    """The :class:`SeriesPoint` at wall-clock ``t`` of the live members' ``snapshots``; jobs pending come from the
    plan reference in ``leader``'s snapshot (0 without a leader or plan)."""
    snaps = list(snapshots)
    tot = cluster_totals(snaps)
    pending = 0
    for s in snaps:
        if s.origin == leader and s.plan is not None:
            pending = s.plan.pending
    vram = 100.0 * tot.vram_used_bytes / tot.vram_total_bytes if tot.vram_total_bytes else 0.0
    return SeriesPoint(t=round(t, 3), gpu_util_percent=tot.gpu_util_percent, gpus_busy=tot.gpus_busy,
                       gpus_total=tot.gpus_total, vram_used_percent=round(vram, 2), cpu_percent=tot.cpu_percent,
                       jobs_running=tot.jobs_running, jobs_pending=pending, members=tot.members)


class ClusterSeries:
    """A ring buffer of :class:`SeriesPoint`: at most ``capacity`` points, about ``step_s`` seconds apart (at
    least ``STEP_SLACK × step_s``).

    >>> s = ClusterSeries(capacity=2, step_s=1.0)
    >>> for t in (0.0, 0.5, 0.95, 2.0):
    ...     _ = s.add(SeriesPoint(t=t))
    >>> [p.t for p in s.points()], s.dropped
    ([0.95, 2.0], 1)
    """

    def __init__(self, *, capacity: int = DEFAULT_CAPACITY, step_s: float = DEFAULT_STEP_S) -> None:
        if capacity < 1 or step_s < 0:
            raise ValueError(f"capacity must be >= 1 and step_s >= 0 (got {capacity}, {step_s})")
        self.capacity = capacity
        self.step_s = step_s
        self._points: deque[SeriesPoint] = deque(maxlen=capacity)
        self.dropped = 0
        """Points refused because they came too soon after the previous one."""

    def __len__(self) -> int:
        return len(self._points)

    def add(self, point: SeriesPoint) -> bool:
        """Append ``point`` (the oldest falls out when full); False, counted in ``dropped``, when it is closer than
        ``STEP_SLACK × step_s`` to the newest point or older than it (a wall clock stepped back: the series stays
        ordered)."""
        if not self._due(point.t):
            self.dropped += 1
            return False
        self._points.append(point)
        return True

    def record(self, t: float, snapshots: Iterable[Snapshot], leader: str | None) -> bool:
        """:meth:`add` the :func:`cluster_point` of ``snapshots`` at ``t`` (the agent's one call per sample)."""
        if not self._due(t):
            self.dropped += 1  # skip the sums too
            return False
        return self.add(cluster_point(t, snapshots, leader))

    def _due(self, t: float) -> bool:
        return not self._points or t >= self._points[-1].t + STEP_SLACK * self.step_s

    def points(self, since: float | None = None) -> list[SeriesPoint]:
        """Points newer than ``since`` (every point when None), oldest first."""
        if since is None:
            return list(self._points)
        out: list[SeriesPoint] = []
        for p in reversed(self._points):
            if p.t <= since:
                break
            out.append(p)
        out.reverse()
        return out

    def view(self, since: float | None = None) -> dict[str, Any]:
        """The JSON form: ``fields`` names the columns of each row of ``points`` (oldest first, newer than
        ``since``); ``step_s`` and ``window_s`` (capacity × step) tell the page how much to keep."""
        return {
            "fields": list(FIELDS),
            "step_s": self.step_s,
            "window_s": self.capacity * self.step_s,
            "points": [[getattr(p, f) for f in FIELDS] for p in self.points(since)],
        }
