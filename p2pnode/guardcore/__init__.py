"""The guard's pure core: the limits (one source of truth), the degradation assessment with its hysteresis,
admission by operation priority and the jobs a level stops, edge-triggered resource events, spawn safeguards,
and the disk manager's cleanup rules.

Pure as a whole: the standard library only; time is passed in. :mod:`._limits` (the ``[guard]`` section, host
tiers, ``utilization_band``), :mod:`._assess` (levels, :class:`DegradationTracker`, ``may_start``,
``jobs_to_stop``), :mod:`._events` (:class:`GuardMonitor`, :class:`EventLog`), :mod:`._safeguards` (circuit
breaker, spawn rate), :mod:`._disk` (:func:`plan_cleanup` is pure; :func:`scan` and :func:`execute` are its
blocking file-system half). The drivers are :class:`p2pnode.drivers.GuardDriver` (the agent's loop) and the
library API that scripts import, :mod:`p2pnode.guard`, which re-exports these names.
"""

from __future__ import annotations

from ._assess import (
    LEVEL_EDGES,
    LEVEL_NAMES,
    MIN_PRIORITY,
    STOP_LEVEL,
    Assessment,
    DegradationTracker,
    OperationPriority,
    ResourceLoad,
    admission,
    assess,
    jobs_to_stop,
    level_cause,
    level_for_ratio,
    may_start,
)
from ._disk import CleanupPlan, Deletion, FileInfo, execute, plan_cleanup, run_cleanup, scan
from ._events import EVENT_NAMES, Event, EventLog, GuardMonitor
from ._limits import HOST_TIERS, GuardLimits, HostTier, host_tier, utilization_band, validate_limits
from ._safeguards import CircuitBreaker, SpawnRateLimiter

__all__ = [
    "EVENT_NAMES",
    "HOST_TIERS",
    "LEVEL_EDGES",
    "LEVEL_NAMES",
    "MIN_PRIORITY",
    "STOP_LEVEL",
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
    "OperationPriority",
    "ResourceLoad",
    "SpawnRateLimiter",
    "admission",
    "assess",
    "execute",
    "host_tier",
    "jobs_to_stop",
    "level_cause",
    "level_for_ratio",
    "may_start",
    "plan_cleanup",
    "run_cleanup",
    "scan",
    "utilization_band",
    "validate_limits",
]
