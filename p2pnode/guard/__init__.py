"""Guard limits: one source of truth for limits, the degradation assessment, safeguards, and the library API
that scripts on a node import (see :mod:`p2pnode.guard._api`)."""

from ._assess import (
    LEVEL_NAMES,
    MIN_PRIORITY,
    Assessment,
    DegradationTracker,
    OperationPriority,
    ResourceLoad,
    admission,
    assess,
    level_for_ratio,
    may_start,
)
from ._api import (
    AsyncResourceLimiter,
    ResourceGuard,
    ResourceUnavailable,
    can_proceed,
    check_cpu,
    check_disk_space,
    check_gpu_memory,
    check_memory,
    get_degradation_level,
    get_recommended_actions,
    get_resource_status,
    limits,
    print_resource_status,
    require_resources,
    respect_resource_limits,
    should_proceed_with_priority,
    wait_for_resources,
)
from ._disk import CleanupPlan, Deletion, FileInfo, execute, plan_cleanup, run_cleanup, scan
from ._events import EVENT_NAMES, Event, EventLog, GuardMonitor
from ._limits import HOST_TIERS, GuardLimits, HostTier, host_tier, validate_limits
from ._safeguards import CircuitBreaker, SpawnRateLimiter

__all__ = [
    "HOST_TIERS",
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
    "LEVEL_NAMES",
    "MIN_PRIORITY",
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
    "level_for_ratio",
    "may_start",
    "validate_limits",
]


def __getattr__(name: str):  # PEP 562: ``LIMITS`` is loaded on first use
    if name == "LIMITS":
        return limits()
    raise AttributeError(f"module 'p2pnode.guard' has no attribute {name!r}")
