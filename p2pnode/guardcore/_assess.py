"""Assessment: a resource sample and the limits -> a degradation level 0-4, its reasons and plain-word actions.
Pure functions and a small pure tracker (time passed in).

The **load ratio** of a resource is ``used_percent / max_percent``; the node's ratio is the highest over CPU,
memory and disk, and over GPU memory only when *every* GPU's memory is at or above its limit. A GPU whose memory
is full refuses new work on that GPU alone (:attr:`Assessment.gpus_full`): an 8-GPU node with one GPU full keeps
offering the other seven. GPU utilization is never an overload: it is the scheduler's target (the PID band of
60-80 %, seed 000), so a training job at 97 % is the goal. Levels (seed 001, "Graceful degradation"):

====== ========= =========== ====================================================
level  name      ratio       what may start (:data:`MIN_PRIORITY`)
====== ========= =========== ====================================================
0      normal    < 0.70      everything
1      light     0.70-0.85   everything (warnings)
2      moderate  0.85-0.95   LOW and above
3      heavy     0.95-1.00   HIGH and above
4      critical  >= 1.00     CRITICAL only (data sync, health checks)
====== ========= =========== ====================================================

:class:`DegradationTracker` adds hysteresis (a level is left downward only when the ratio is
``hysteresis_ratio`` below its lower edge) and a minimum dwell time between changes (except a rise to critical,
which is never delayed), so a load oscillating around a boundary changes the level at most once per dwell time.

The level also stops work already running (:func:`jobs_to_stop`, seed 001: at critical only critical work
continues): at level :data:`STOP_LEVEL` every job below :data:`MIN_PRIORITY` of that level is stopped. Lower
levels only refuse new work. Callers pass the level in force (after hysteresis and dwell), never the raw one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ._limits import GuardLimits

__all__ = [
    "LEVEL_EDGES",
    "LEVEL_NAMES",
    "MIN_PRIORITY",
    "STOP_LEVEL",
    "Assessment",
    "DegradationTracker",
    "OperationPriority",
    "ResourceLoad",
    "admission",
    "assess",
    "jobs_to_stop",
    "level_cause",
    "level_for_ratio",
    "may_start",
]

LEVEL_NAMES = ("normal", "light", "moderate", "heavy", "critical")
LEVEL_EDGES = (0.70, 0.85, 0.95, 1.00)
"""Lower edge of levels 1..4 as load ratios."""


class OperationPriority(enum.IntEnum):
    """How important an operation is (seed 001)."""

    BACKGROUND = 0  # optional cleanup, stats collection
    LOW = 1  # extra selfplay, backfill
    NORMAL = 2  # regular selfplay, data generation
    HIGH = 3  # training, evaluation
    CRITICAL = 4  # data sync, model promotion, health checks


MIN_PRIORITY = {
    0: OperationPriority.BACKGROUND,
    1: OperationPriority.BACKGROUND,
    2: OperationPriority.LOW,
    3: OperationPriority.HIGH,
    4: OperationPriority.CRITICAL,
}
"""Lowest priority that may start at each degradation level."""

STOP_LEVEL = 4
"""The degradation level from which running work below that level's :data:`MIN_PRIORITY` is stopped."""


def may_start(priority: OperationPriority | int, level: int) -> bool:
    """True when an operation of ``priority`` may start at degradation ``level`` (see :data:`MIN_PRIORITY`)."""
    return int(priority) >= MIN_PRIORITY[max(0, min(4, level))]


def level_for_ratio(ratio: float) -> int:
    """Degradation level 0-4 of a load ratio (``used / max``), without hysteresis."""
    return sum(ratio >= edge for edge in LEVEL_EDGES)


@dataclass(frozen=True, slots=True)
class ResourceLoad:
    """One resource: ``name`` (``cpu``, ``memory``, ``disk``, ``gpu0_util``, ``gpu0_memory``...), used percent,
    its max and warn limits in percent, and ``ratio = used / max``."""

    name: str
    label: str
    used_percent: float
    max_percent: float
    warn_percent: float

    @property
    def ratio(self) -> float:
        """``used_percent / max_percent`` (0 when the max is 0): 1.0 means at the limit."""
        return self.used_percent / self.max_percent if self.max_percent > 0 else 0.0


_ACTIONS = {
    "cpu": "reduce concurrent jobs or move CPU-heavy work to another node",
    "memory": "reduce batch sizes or concurrent jobs",
    "disk": "archive old games or delete unused data",
    "gpu_memory": "lower the batch size or run fewer jobs on this GPU",
}


@dataclass(frozen=True, slots=True)
class Assessment:
    """The guard's verdict on one sample: ``level`` 0-4 (raw, before hysteresis), the highest ``ratio``, each
    resource's load, ``reasons`` (resources at or above their warn limit) and ``actions`` in plain words."""

    level: int
    ratio: float
    loads: tuple[ResourceLoad, ...]
    reasons: tuple[str, ...]
    actions: tuple[str, ...]
    gpus_full: tuple[int, ...] = ()
    """Indexes of the GPUs whose memory is at or above the GPU limit: no new work on them."""

    @property
    def level_name(self) -> str:
        """The level's name: ``normal``, ``light``, ``moderate``, ``heavy`` or ``critical``."""
        return LEVEL_NAMES[self.level]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: level, its name, the ratio, each resource's used/max/warn percent and ratio, reasons, actions."""
        return {
            "level": self.level,
            "level_name": self.level_name,
            "ratio": round(self.ratio, 4),
            "resources": {
                x.name: {"used_percent": round(x.used_percent, 2), "max_percent": x.max_percent,
                         "warn_percent": x.warn_percent, "ratio": round(x.ratio, 4)}
                for x in self.loads
            },
            "reasons": list(self.reasons),
            "actions": list(self.actions),
            "gpus_full": list(self.gpus_full),
        }


def loads_of(sample: dict[str, Any], limits: GuardLimits) -> list[ResourceLoad]:
    """The loads of a resource sample in wire form (:meth:`p2pnode.resources.ResourceSample.to_wire`)."""
    out = [
        ResourceLoad("cpu", "CPU", float(sample.get("cpu_percent", 0.0)), limits.cpu_max_percent,
                     limits.cpu_warn_percent),
        ResourceLoad("memory", "Memory", float(sample.get("mem_percent", 0.0)), limits.memory_max_percent,
                     limits.memory_warn_percent),
        ResourceLoad("disk", "Disk", float(sample.get("disk_percent", 0.0)), limits.disk_max_percent,
                     limits.disk_warn_percent),
    ]
    for g in sample.get("gpus", []):
        i = g.get("index", 0)
        total = g.get("mem_total_bytes") or 0
        mem_pct = 100.0 * g.get("mem_used_bytes", 0) / total if total else 0.0
        out.append(ResourceLoad(f"gpu{i}_util", f"GPU {i} utilization", float(g.get("util_percent", 0.0)),
                                limits.gpu_max_percent, limits.gpu_warn_percent))
        out.append(ResourceLoad(f"gpu{i}_memory", f"GPU {i} memory", mem_pct, limits.gpu_max_percent,
                                limits.gpu_warn_percent))
    return out


def assess(sample: dict[str, Any], limits: GuardLimits) -> Assessment:
    """Assess a resource sample (wire form) against ``limits``. Never raises for missing fields (they count 0)."""
    loads = loads_of(sample, limits)
    node = [x for x in loads if x.name in ("cpu", "memory", "disk")]
    gpu_memory = [x for x in loads if x.name.startswith("gpu") and x.name.endswith("_memory")]
    worst = max((x.ratio for x in node), default=0.0)
    if gpu_memory and all(x.ratio >= 1.0 for x in gpu_memory):  # every GPU full: the node takes no GPU work
        worst = max(worst, min(x.ratio for x in gpu_memory))
    full = tuple(int(x.name[3:-7]) for x in gpu_memory if x.ratio >= 1.0)
    reasons, actions = [], []
    for load in sorted(loads, key=lambda x: -x.ratio):
        kind = ("gpu_util" if load.name.endswith("_util")
                else "gpu_memory" if load.name.endswith("_memory") and load.name.startswith("gpu") else load.name)
        if kind == "gpu_util":
            continue  # the scheduler's target, not an overload
        if load.used_percent >= load.warn_percent:
            state = "at or above its limit" if load.used_percent >= load.max_percent else "above its warning level"
            reasons.append(f"{load.label} at {load.used_percent:.0f} % is {state} ({load.max_percent:g} %)")
            actions.append(f"{load.label} at {load.used_percent:.0f} %: {_ACTIONS[kind]}")
        elif load.name in ("cpu", "memory", "disk"):
            actions.append(f"{load.label} OK at {load.used_percent:.0f} %")
    return Assessment(level_for_ratio(worst), worst, tuple(loads), tuple(reasons), tuple(actions), full)


@dataclass
class DegradationTracker:
    """The degradation level over time, with hysteresis and dwell (see module docstring).

    ``update(assessment, now)`` returns the level in force; ``changed_at`` is when it last changed.
    """

    limits: GuardLimits
    level: int = 0
    changed_at: float = field(default=-1e18)
    changes: int = 0

    def update(self, a: Assessment, now: float) -> int:
        """The level in force after assessment ``a`` at ``now`` (monotonic s): a rise waits out the dwell time (not
        one to critical), a fall also needs the ratio ``hysteresis_ratio`` below each lower edge."""
        target = a.level
        if target > self.level:
            if target == 4 or now - self.changed_at >= self.limits.dwell_s:
                self._set(target, now)
        elif target < self.level and now - self.changed_at >= self.limits.dwell_s:
            # Leave downward only as far as the ratio is clearly (by the hysteresis margin) below each edge.
            new = self.level
            while new > target and a.ratio < LEVEL_EDGES[new - 1] - self.limits.hysteresis_ratio:
                new -= 1
            if new != self.level:
                self._set(new, now)
        return self.level

    def _set(self, level: int, now: float) -> None:
        self.level = level
        self.changed_at = now
        self.changes += 1


def admission(
    a: Assessment, level: int, limits: GuardLimits, *, kind: str, priority: OperationPriority | int
) -> tuple[bool, str]:
    """May work of ``kind`` (``training``, ``selfplay``, ...) and ``priority`` start on this node now?

    Refused when the degradation ``level`` admits no work of that priority (:func:`may_start`), and training
    work is refused whenever disk usage is at or above the critical threshold (``disk_max_percent``).
    Returns ``(True, "")`` or ``(False, reason)``.
    """
    disk = next((x for x in a.loads if x.name == "disk"), None)
    if kind == "training" and disk is not None and disk.used_percent >= limits.disk_max_percent:
        return False, f"training refused: disk at {disk.used_percent:.0f} % >= critical {limits.disk_max_percent:g} %"
    if not may_start(priority, level):
        p = OperationPriority(int(priority)).name
        return False, f"{p} work refused at degradation level {level} ({LEVEL_NAMES[level]}): {'; '.join(a.reasons)}"
    return True, ""


def level_cause(a: Assessment | None) -> str:
    """What holds the node at its level, in a few words for a stop reason: the resources at or above their limit
    (``memory 93 % >= 80 %``), every GPU's memory when all are full, else the worst node resource (the level is
    then held by hysteresis). '' without an assessment."""
    if a is None:
        return ""
    node = [x for x in a.loads if x.name in ("cpu", "memory", "disk")]
    over = [f"{x.label.lower()} {x.used_percent:.0f} % >= {x.max_percent:g} %"
            for x in sorted(node, key=lambda x: -x.ratio) if x.ratio >= 1.0]
    gpu_memory = [x for x in a.loads if x.name.startswith("gpu") and x.name.endswith("_memory")]
    if gpu_memory and all(x.ratio >= 1.0 for x in gpu_memory):
        over.append(f"every GPU's memory >= {gpu_memory[0].max_percent:g} %")
    if over:
        return ", ".join(over)
    worst = max(node, key=lambda x: x.ratio, default=None)
    if worst is None:
        return ""
    return f"{worst.label.lower()} {worst.used_percent:.0f} % of {worst.max_percent:g} %, held by hysteresis"


def jobs_to_stop(
    level: int, running: Iterable[tuple[str, OperationPriority | int]], a: Assessment | None = None
) -> list[tuple[str, str]]:
    """The running jobs the degradation ``level`` no longer allows, as ``(job_id, reason)`` in ``running``'s order.

    ``level`` is the level in force (:class:`DegradationTracker`, after hysteresis and dwell), never the raw one;
    ``running`` gives each job's id and guard priority; ``a`` (optional) the newest assessment, whose
    :func:`level_cause` goes into the reason. At :data:`STOP_LEVEL` (critical) every job below
    ``MIN_PRIORITY[STOP_LEVEL]`` (CRITICAL) is stopped, e.g. ``guard level 4 (critical: memory 93 % >= 80 %):
    only CRITICAL work continues``; below it nothing is stopped (new work is refused by :func:`admission`).
    """
    level = max(0, min(4, level))
    if level < STOP_LEVEL:
        return []
    floor = MIN_PRIORITY[level]
    cause = level_cause(a)
    reason = (f"guard level {level} ({LEVEL_NAMES[level]}{': ' + cause if cause else ''}): "
              f"only {floor.name} work continues")
    return [(job_id, reason) for job_id, priority in running if int(priority) < floor]
