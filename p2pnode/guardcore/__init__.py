"""The guard's pure core: the limits (one source of truth), the degradation assessment with its hysteresis,
admission by operation priority, the windows CPU and memory are assessed over, node pressure and the order load
is shed in, edge-triggered resource events, spawn safeguards, and the disk manager's cleanup rules.

Pure as a whole: the standard library only; time is passed in. :mod:`._limits` (the ``[guard]`` section, host
tiers, ``utilization_band``), :mod:`._assess` (levels, :class:`DegradationTracker`, ``may_start``,
``admission``), :mod:`._window` (:class:`LoadWindows`: CPU over ``cpu_window_s``, memory over
``memory_window_s``, PSI beside them), :mod:`._pressure` (``pressure_of``, ``shed_order``),
:mod:`._events` (:class:`GuardMonitor`, :class:`EventLog`), :mod:`._safeguards` (circuit
breaker, spawn rate), :mod:`._disk` (:func:`plan_cleanup` is pure; :func:`scan` and :func:`execute` are its
blocking file-system half). The drivers are :class:`p2pnode.drivers.GuardDriver` (the agent's loop) and the
library API that scripts import, :mod:`p2pnode.guard`, which re-exports these names.
"""

from __future__ import annotations

from ._assess import (
    LEVEL_EDGES,
    LEVEL_NAMES,
    MIN_PRIORITY,
    Assessment,
    DegradationTracker,
    OperationPriority,
    ResourceLoad,
    admission,
    assess,
    level_change_message,
    level_for_ratio,
    level_reasons,
    load_reason,
    may_start,
)
from ._disk import CleanupPlan, Deletion, FileInfo, execute, plan_cleanup, run_cleanup, scan
from ._events import BACKPRESSURE_LEVEL, EVENT_NAMES, Event, EventLog, GuardMonitor
from ._limits import (
    HOST_TIERS,
    MAX_SPAWNS_PER_MINUTE,
    MIN_SPAWNS_PER_MINUTE,
    GuardLimits,
    HostTier,
    host_tier,
    spawn_rate_per_minute,
    utilization_band,
    validate_limits,
)
from ._pressure import SHED_RESOURCES, Overload, Pressure, may_shed, pressure_of, shed_order
from ._safeguards import CircuitBreaker, SpawnRateLimiter
from ._window import MAX_WINDOW_SAMPLES, LoadWindow, LoadWindows, Signal

__all__ = [
    "BACKPRESSURE_LEVEL",
    "EVENT_NAMES",
    "HOST_TIERS",
    "LEVEL_EDGES",
    "LEVEL_NAMES",
    "MIN_PRIORITY",
    "MAX_SPAWNS_PER_MINUTE",
    "MAX_WINDOW_SAMPLES",
    "MIN_SPAWNS_PER_MINUTE",
    "SHED_RESOURCES",
    "Assessment",
    "CircuitBreaker",
    "CleanupPlan",
    "DegradationTracker",
    "Deletion",
    "Event",
    "EventLog",
    "FileInfo",
    "GuardLimits",
    "GuardMonitor",
    "HostTier",
    "LoadWindow",
    "LoadWindows",
    "OperationPriority",
    "Overload",
    "Pressure",
    "ResourceLoad",
    "Signal",
    "SpawnRateLimiter",
    "admission",
    "assess",
    "execute",
    "host_tier",
    "level_change_message",
    "level_for_ratio",
    "level_reasons",
    "load_reason",
    "may_shed",
    "may_start",
    "plan_cleanup",
    "pressure_of",
    "run_cleanup",
    "scan",
    "shed_order",
    "spawn_rate_per_minute",
    "utilization_band",
    "validate_limits",
]
