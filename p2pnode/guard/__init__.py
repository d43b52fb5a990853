"""The resource-guard library that scripts on a node import (see :mod:`._api`), with or without a running agent:

    from p2pnode.guard import can_proceed, require_resources, ResourceGuard, OperationPriority

It samples this machine (psutil, NVML through :mod:`p2pnode.probes`, anyio for the async limiter) against the
limits of the agent's config. The rules it applies (limits, degradation levels, priorities, events, safeguards,
the disk manager's cleanup) are the guard's pure core, :mod:`p2pnode.guardcore`, whose names are re-exported
here so that a script needs one import path. Code inside p2pnode imports them from :mod:`p2pnode.guardcore`.
"""

from __future__ import annotations

from typing import Any

from ..guardcore import (
    EVENT_NAMES,
    HOST_TIERS,
    LEVEL_NAMES,
    MIN_PRIORITY,
    Assessment,
    CircuitBreaker,
    CleanupPlan,
    DegradationTracker,
    Deletion,
    Event,
    EventLog,
    FileInfo,
    GuardLimits,
    GuardMonitor,
    HostTier,
    OperationPriority,
    ResourceLoad,
    SpawnRateLimiter,
    admission,
    assess,
    execute,
    host_tier,
    level_change_message,
    level_for_ratio,
    level_reasons,
    load_reason,
    may_start,
    plan_cleanup,
    run_cleanup,
    scan,
    utilization_band,
    validate_limits,
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

__all__ = [  # noqa: F822 - LIMITS is served by __getattr__ below (the config is read on first use)
    # the library API (._api)
    "LIMITS",
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
    "limits",
    "print_resource_status",
    "require_resources",
    "respect_resource_limits",
    "should_proceed_with_priority",
    "wait_for_resources",
    # the rules it applies (p2pnode.guardcore)
    "EVENT_NAMES",
    "HOST_TIERS",
    "LEVEL_NAMES",
    "MIN_PRIORITY",
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
    "level_change_message",
    "level_for_ratio",
    "level_reasons",
    "load_reason",
    "may_start",
    "plan_cleanup",
    "run_cleanup",
    "scan",
    "utilization_band",
    "validate_limits",
]


def __getattr__(name: str) -> Any:
    """``LIMITS``: the limits in force, read from the config on first use (:func:`limits`); a bad config file fails
    that read, not ``import p2pnode.guard``. Raises :class:`AttributeError` for any other unknown name."""
    if name == "LIMITS":
        return limits()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
