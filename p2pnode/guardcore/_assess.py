"""Assessment: a resource sample and the limits -> a degradation level 0-4, its reasons and plain-word actions.
Pure functions and a small pure tracker (time passed in).

The **load ratio** of a resource is ``used_percent / max_percent``; the node's ratio is the highest over CPU,
memory and disk. GPU memory never raises the node's level: a GPU whose memory is full refuses new work on that
GPU alone (:attr:`Assessment.gpus_full`), so an 8-GPU node with one GPU full keeps offering the other seven, and
a node whose GPUs are all full still takes CPU-only work (its data loaders, rollout workers). GPU utilization is
never an overload: it is the scheduler's target (the PID band of 60-80 %, seed 000), so a training job at 97 %
is the goal. Levels (seed 001, "Graceful degradation"):

====== ========= =========== ====================================================
level  name      ratio       what may start (:data:`MIN_PRIORITY`)
====== ========= =========== ====================================================
0      normal    < 0.70      everything
1      light     0.70-0.85   everything (warnings)
2      moderate  0.85-0.95   LOW and above
3      heavy     0.95-1.00   HIGH and above
4      critical  >= 1.00     CRITICAL only (data sync, health checks)
====== ========= =========== ====================================================

CPU and memory enter the assessment over windows (:mod:`._window`, ``assess(sample, limits, signals)``): CPU as
its mean over ``guard.cpu_window_s``, memory over ``guard.memory_window_s`` or at once at its limit, so one CPU
sample at 100 % never raises the level (a spike of ``d`` s moves the mean by ``100 · d / cpu_window_s``
points); the reasons name the window (``CPU (10 s mean) at 96 % ...``).

:class:`DegradationTracker` adds hysteresis (a level is left downward only when the ratio is
``hysteresis_ratio`` below its lower edge) and a minimum dwell time between changes of direction (a fall within
``dwell_s`` of a rise, or a rise within ``dwell_s`` of a fall, waits; a rise to critical never does), so a load
oscillating around a boundary changes the level at most once per dwell time, while the steps of one rise (or
one fall) follow the windowed load at once.

Levels only refuse new work (callers pass the level in force, after hysteresis and dwell, never the raw one).
Running work is shed one job at a time under CPU or memory pressure, lowest priority first
(:mod:`._pressure`, kubelet's node-pressure eviction), not all at once at critical: seed 001's "at critical only
critical work continues" killed the training a CPU spike only slows.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import msgspec

from ._limits import GuardLimits
from ._window import Signal

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
    "level_change_message",
    "level_for_ratio",
    "level_reasons",
    "load_reason",
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


class ResourceLoad(msgspec.Struct, frozen=True):
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


class Assessment(msgspec.Struct, frozen=True):
    """The guard's verdict on one sample: ``level`` 0-4 (raw, before hysteresis), the highest ``ratio``, each
    resource's load, ``reasons`` and ``actions`` in plain words. ``reasons`` name every resource at or above its
    warn limit and every node resource (CPU, memory, disk) whose ratio reaches level 1 or more (its load counts
    toward the level even below its warn limit), worst first: at a level above 0 they are never empty."""

    level: int
    ratio: float
    loads: tuple[ResourceLoad, ...]
    reasons: tuple[str, ...]
    actions: tuple[str, ...]
    gpus_full: tuple[int, ...] = ()
    """Indexes of the GPUs whose memory is at or above the GPU limit: no new work on them."""
    signals: tuple[Signal, ...] = ()
    """What CPU and memory counted as (:class:`p2pnode.guardcore.Signal`: the window mean, the raw sample, PSI);
    empty for an assessment of one sample alone."""

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
            "signals": {x.resource: x.to_dict() for x in self.signals},
        }

    def used_percent(self, name: str) -> float | None:
        """The used percent resource ``name`` (``cpu``, ``memory``, ``disk``...) was assessed at, or None."""
        return next((x.used_percent for x in self.loads if x.name == name), None)


def loads_of(sample: dict[str, Any], limits: GuardLimits, signals: tuple[Signal, ...] = ()) -> list[ResourceLoad]:
    """The loads of a resource sample in wire form (:meth:`p2pnode.resources.ResourceSample.to_wire`); CPU and
    memory as ``signals`` assessed them where given (their window figures, labelled ``CPU (10 s mean)``...)."""
    by = {x.resource: x for x in signals}
    cpu, mem = by.get("cpu"), by.get("memory")
    out = [
        ResourceLoad("cpu", cpu.label if cpu else "CPU",
                     cpu.assessed_percent if cpu else float(sample.get("cpu_percent", 0.0)),
                     limits.cpu_max_percent, limits.cpu_warn_percent),
        ResourceLoad("memory", mem.label if mem else "Memory",
                     mem.assessed_percent if mem else float(sample.get("mem_percent", 0.0)),
                     limits.memory_max_percent, limits.memory_warn_percent),
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


def assess(sample: dict[str, Any], limits: GuardLimits, signals: tuple[Signal, ...] = ()) -> Assessment:
    """Assess a resource sample (wire form) against ``limits``; CPU and memory at what ``signals`` say they count
    as (:meth:`p2pnode.guardcore.LoadWindows.observe`: their windows), else at the sample's own figures. Never
    raises for missing fields (they count 0)."""
    loads = loads_of(sample, limits, signals)
    node = [x for x in loads if x.name in ("cpu", "memory", "disk")]
    gpu_memory = [x for x in loads if x.name.startswith("gpu") and x.name.endswith("_memory")]
    worst = max((x.ratio for x in node), default=0.0)  # GPU memory: per GPU (``full``), never the node's level
    full = tuple(int(x.name[3:-7]) for x in gpu_memory if x.ratio >= 1.0)
    reasons, actions = [], []
    for load in sorted(loads, key=lambda x: -x.ratio):
        kind = ("gpu_util" if load.name.endswith("_util")
                else "gpu_memory" if load.name.endswith("_memory") and load.name.startswith("gpu") else load.name)
        if kind == "gpu_util" or load.max_percent <= 0:
            continue  # the scheduler's target, not an overload; or a resource not assessed (cpu_max_percent 0)
        whole = kind != "gpu_memory"  # a node resource (CPU, memory, disk): its ratio is the level's
        if load.used_percent >= load.warn_percent or load.ratio >= (LEVEL_EDGES[0] if whole else 1.0):
            reasons.append(load_reason(load))
            actions.append(f"{load.label} at {load.used_percent:.0f} %: {_ACTIONS[kind]}")
        elif whole:
            actions.append(f"{load.label} OK at {load.used_percent:.0f} %")
    return Assessment(level_for_ratio(worst), worst, tuple(loads), tuple(reasons), tuple(actions), full,
                      tuple(signals))


def load_reason(load: ResourceLoad) -> str:
    """One resource's load in words, with the threshold it passed: ``CPU at 100 % is at or above its limit
    (80 %)``, ``CPU at 75 % is above its warning level (70 %; limit 80 %)``, or, for a load that counts toward
    the level below its warn limit, ``CPU at 68 % is 0.85 of its limit (80 %)``."""
    used = f"{load.label} at {load.used_percent:.0f} %"
    if load.used_percent >= load.max_percent:
        return f"{used} is at or above its limit ({load.max_percent:g} %)"
    if load.used_percent >= load.warn_percent:
        return f"{used} is above its warning level ({load.warn_percent:g} %; limit {load.max_percent:g} %)"
    return f"{used} is {load.ratio:.2f} of its limit ({load.max_percent:g} %)"


def level_reasons(a: Assessment | None, level: int, limits: GuardLimits, *,
                  since_change_s: float | None = None) -> tuple[str, ...]:
    """Why the node is at ``level``, the level in force (:class:`DegradationTracker`, after hysteresis and dwell),
    in words true of assessment ``a``: its reasons, preceded, where the level in force is not ``a``'s own level,
    by what holds it there. Held above it after the load fell: by the dwell (``level 3 (heavy) is held by the
    dwell: load ratio 0.62 is back under its edge 0.95; the level may fall in 12 s``) or by hysteresis (``... the
    ratio 0.93 is under its edge 0.95 but not yet under 0.92``); held below it while a rise waits out the dwell
    (``load ratio 0.96 reaches level 3 (heavy); level 1 (light) holds until the dwell ends in 12 s``).
    ``since_change_s`` is the time since the level last changed (``now - tracker.changed_at``, s), for when the
    dwell ends; None leaves the time out. Empty at level 0 with nothing at or above its warn limit."""
    if a is None:
        return ()
    level = max(0, min(4, level))
    dwell_left = None if since_change_s is None else max(0.0, limits.dwell_s - since_change_s)
    held: list[str] = []
    if level > a.level:
        edge = LEVEL_EDGES[level - 1]
        floor = edge - limits.hysteresis_ratio
        name = f"level {level} ({LEVEL_NAMES[level]})"
        if a.ratio >= floor:
            held.append(f"{name} is held by hysteresis: load ratio {a.ratio:.2f} is under its edge {edge:.2f} "
                        f"but not yet under {floor:.2f}")
        else:
            when = (f"in {math.ceil(dwell_left):.0f} s" if dwell_left is not None
                    else f"once {limits.dwell_s:g} s have passed since its last change")
            held.append(f"{name} is held by the dwell: load ratio {a.ratio:.2f} is back under its edge {edge:.2f}; "
                        f"the level may fall {when}")
    elif level < a.level:
        when = (f"ends in {math.ceil(dwell_left):.0f} s" if dwell_left is not None
                else f"({limits.dwell_s:g} s since the last change) ends")
        held.append(f"load ratio {a.ratio:.2f} reaches level {a.level} ({a.level_name}); level {level} "
                    f"({LEVEL_NAMES[level]}) holds until the dwell {when}")
    return (*held, *a.reasons)


def level_change_message(before: int, after: int, a: Assessment, limits: GuardLimits) -> str:
    """A change of the level in force from ``before`` to ``after`` on assessment ``a``, in words: the direction,
    the new level's name and what caused it. Up: the resources that raised it (``degradation level 0 -> 2
    (moderate), up: CPU at 68 % is 0.85 of its limit (80 %)``); down: the load ratio under the edge it left, less
    the hysteresis margin, and what still counts (``degradation level 3 -> 1 (light), down: load ratio 0.72 is
    under 0.82 (the moderate edge 0.85 less the hysteresis); still: CPU at 58 % is 0.72 of its limit (80 %)``)."""
    head = f"degradation level {before} -> {after} ({LEVEL_NAMES[after]})"
    if after > before:
        return f"{head}, up: {'; '.join(a.reasons) or f'load ratio {a.ratio:.2f}'}"
    still = f"; still: {'; '.join(a.reasons)}" if a.reasons else ""
    return f"{head}, down: {fell_under(after, a, limits)}{still}"


def fell_under(level: int, a: Assessment, limits: GuardLimits) -> str:
    """Why the level in force fell to ``level`` (0-3) on assessment ``a``: the load ratio is under the lower edge
    of the level above, less the hysteresis margin (:class:`DegradationTracker`), e.g. ``load ratio 0.72 is under
    0.82 (the moderate edge 0.85 less the hysteresis)``."""
    edge = LEVEL_EDGES[level]  # the lower edge of level + 1: the last edge the load fell under
    return (f"load ratio {a.ratio:.2f} is under {edge - limits.hysteresis_ratio:.2f} (the {LEVEL_NAMES[level + 1]} "
            f"edge {edge:.2f} less the hysteresis)")


class DegradationTracker(msgspec.Struct):
    """The degradation level over time, with hysteresis and dwell (see module docstring).

    ``update(assessment, now)`` returns the level in force; ``changed_at`` is when it last changed and
    ``direction`` which way (1 up, -1 down, 0 never). The dwell holds a change only where it reverses the last
    one (a rise soon after a fall, a fall soon after a rise): the steps of one rise, or of one fall, follow the
    window's mean at once, so a sustained load reaches its level within the window and the level comes back
    within it once the load is gone.
    """

    limits: GuardLimits
    level: int = 0
    changed_at: float = msgspec.field(default=-1e18)
    changes: int = 0
    direction: int = 0

    def update(self, a: Assessment, now: float) -> int:
        """The level in force after assessment ``a`` at ``now`` (monotonic s). A rise follows the ratio at once,
        unless the level last fell less than ``dwell_s`` ago (then it waits out the dwell; a rise to critical never
        waits). A fall goes at once as far as the ratio is ``hysteresis_ratio`` below each lower edge, unless the
        level last rose less than ``dwell_s`` ago (then it waits out the dwell)."""
        target = a.level
        dwelt = now - self.changed_at >= self.limits.dwell_s
        if target > self.level:
            if target == 4 or self.direction >= 0 or dwelt:
                self._set(target, now)
        elif target < self.level and (self.direction <= 0 or dwelt):
            # Leave downward only as far as the ratio is clearly (by the hysteresis margin) below each edge.
            new = self.level
            while new > target and a.ratio < LEVEL_EDGES[new - 1] - self.limits.hysteresis_ratio:
                new -= 1
            if new != self.level:
                self._set(new, now)
        return self.level

    def _set(self, level: int, now: float) -> None:
        self.direction = 1 if level > self.level else -1
        self.level = level
        self.changed_at = now
        self.changes += 1


def admission(
    a: Assessment, level: int, limits: GuardLimits, *, kind: str, priority: OperationPriority | int,
    since_change_s: float | None = None,
) -> tuple[bool, str]:
    """May work of ``kind`` (``training``, ``selfplay``, ...) and ``priority`` start on this node now?

    Refused when the degradation ``level`` (in force) admits no work of that priority (:func:`may_start`), with
    :func:`level_reasons` (``since_change_s`` as there), and training work is refused whenever disk usage is at
    or above the critical threshold (``disk_max_percent``). Returns ``(True, "")`` or ``(False, reason)``.
    """
    disk = next((x for x in a.loads if x.name == "disk"), None)
    if kind == "training" and disk is not None and disk.used_percent >= limits.disk_max_percent:
        return False, f"training refused: disk at {disk.used_percent:.0f} % >= critical {limits.disk_max_percent:g} %"
    if not may_start(priority, level):
        p = OperationPriority(int(priority)).name
        why = "; ".join(level_reasons(a, level, limits, since_change_s=since_change_s))
        return False, f"{p} work refused at degradation level {level} ({LEVEL_NAMES[level]}): {why}"
    return True, ""
