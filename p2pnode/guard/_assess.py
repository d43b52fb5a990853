"""Assessment: a resource sample and the limits -> a degradation level 0-4, its reasons and plain-word actions.
Pure functions and a small pure tracker (time passed in).

The **load ratio** of a resource is ``used_percent / max_percent``; the node's ratio is the highest over CPU,
memory, each GPU's utilization, each GPU's memory and disk. Levels (seed 001, "Graceful degradation"):

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
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ._limits import GuardLimits

__all__ = [
    "LEVEL_EDGES",
    "LEVEL_NAMES",
    "MIN_PRIORITY",
    "Assessment",
    "DegradationTracker",
    "OperationPriority",
    "ResourceLoad",
    "admission",
    "assess",
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
        return self.used_percent / self.max_percent if self.max_percent > 0 else 0.0


_ACTIONS = {
    "cpu": "reduce concurrent jobs or move CPU-heavy work to another node",
    "memory": "reduce batch sizes or concurrent jobs",
    "disk": "archive old games or delete unused data",
    "gpu_util": "hold new GPU jobs until utilization drops",
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

    @property
    def level_name(self) -> str:
        return LEVEL_NAMES[self.level]

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "level_name": self.level_name,
            "ratio": round(self.ratio, 4),
            "resources": {
                l.name: {"used_percent": round(l.used_percent, 2), "max_percent": l.max_percent,
                         "warn_percent": l.warn_percent, "ratio": round(l.ratio, 4)}
                for l in self.loads
            },
            "reasons": list(self.reasons),
            "actions": list(self.actions),
        }


def loads_of(sample: dict[str, Any], limits: GuardLimits) -> list[ResourceLoad]:
    """The loads of a resource sample in wire form (:meth:`p2pnode.resources.ResourceSample.to_wire`)."""
    out = [
        ResourceLoad("cpu", "CPU", float(sample.get("cpu_percent", 0.0)), limits.cpu_max_percent, limits.cpu_warn_percent),
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
    worst = max((l.ratio for l in loads), default=0.0)
    reasons, actions = [], []
    for l in sorted(loads, key=lambda l: -l.ratio):
        kind = "gpu_util" if l.name.endswith("_util") else "gpu_memory" if l.name.endswith("_memory") and l.name.startswith("gpu") else l.name
        if l.used_percent >= l.warn_percent:
            state = "at or above its limit" if l.used_percent >= l.max_percent else "above its warning level"
            reasons.append(f"{l.label} at {l.used_percent:.0f} % is {state} ({l.max_percent:g} %)")
            actions.append(f"{l.label} at {l.used_percent:.0f} %: {_ACTIONS[kind]}")
        elif l.name in ("cpu", "memory", "disk"):
            actions.append(f"{l.label} OK at {l.used_percent:.0f} %")
    return Assessment(level_for_ratio(worst), worst, tuple(loads), tuple(reasons), tuple(actions))


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
    disk = next((l for l in a.loads if l.name == "disk"), None)
    if kind == "training" and disk is not None and disk.used_percent >= limits.disk_max_percent:
        return False, f"training refused: disk at {disk.used_percent:.0f} % >= critical {limits.disk_max_percent:g} %"
    if not may_start(priority, level):
        p = OperationPriority(int(priority)).name
        return False, f"{p} work refused at degradation level {level} ({LEVEL_NAMES[level]}): {'; '.join(a.reasons)}"
    return True, ""
