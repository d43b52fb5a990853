"""Guard limits: one source of truth for limits, the degradation assessment, safeguards, and the library API
that scripts on a node import (see :mod:`p2pnode.guard._api`).

The pure parts (:mod:`._limits`, :mod:`._assess`, :mod:`._events`, :mod:`._safeguards`, and the planning half of
:mod:`._disk`) are imported here eagerly and need only the standard library. The library API in :mod:`._api`
samples the machine (psutil, NVML, anyio) and is loaded on first use of one of its names (PEP 562), so that
``from p2pnode.guard import may_start`` never pulls psutil or anyio, while
``from p2pnode.guard import check_gpu_memory`` keeps working. (There is no ``TYPE_CHECKING`` import of ``_api``
either: import-linter counts those; type checkers see the lazy names as ``Any`` through ``__getattr__``.)
"""

from __future__ import annotations

import importlib
from typing import Any

from ._assess import (
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

_API_NAMES = frozenset({
    "LIMITS",
    "limits",
    "AsyncResourceLimiter",
    "ResourceGuard",
    "ResourceUnavailable",
    "can_proceed",
    "check_cpu",
    "check_disk_space",
    "check_gpu_memory",
    "check_memory",
    "get_degradation_level",
    "get_recommended_actions",
    "get_resource_status",
    "print_resource_status",
    "require_resources",
    "respect_resource_limits",
    "should_proceed_with_priority",
    "wait_for_resources",
})
"""Names served by :mod:`._api` (psutil, NVML, anyio), imported on first access."""

__all__ = [
    "HOST_TIERS",
    *sorted(_API_NAMES),
    "LEVEL_NAMES",
    "MIN_PRIORITY",
    "STOP_LEVEL",
    "Assessment",
    "CircuitBreaker",
    "DegradationTracker",
    "GuardLimits",
    "HostTier",
    "OperationPriority",
    "ResourceLoad",
    "SpawnRateLimiter",
    "EVENT_NAMES",
    "CleanupPlan",
    "Deletion",
    "Event",
    "EventLog",
    "FileInfo",
    "GuardMonitor",
    "admission",
    "assess",
    "execute",
    "plan_cleanup",
    "run_cleanup",
    "scan",
    "host_tier",
    "jobs_to_stop",
    "level_cause",
    "level_for_ratio",
    "may_start",
    "utilization_band",
    "validate_limits",
]


def __getattr__(name: str) -> Any:
    """PEP 562: the library API's names load :mod:`._api` on first use; ``LIMITS`` is read from the config then.

    Everything but ``LIMITS`` is cached in this module's namespace after the first access. Raises
    :class:`AttributeError` for any other name."""
    if name in _API_NAMES:
        api = importlib.import_module("._api", __name__)
        value = getattr(api, name)
        if name != "LIMITS":  # LIMITS stays a lazy read of the config in force
            globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public surface, including the lazily loaded names."""
    return sorted(set(globals()) | _API_NAMES)
