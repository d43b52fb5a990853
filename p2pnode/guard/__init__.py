"""Guard limits: one source of truth for limits, the degradation assessment, safeguards, and the library API
that scripts on a node import (see :mod:`p2pnode.guard._api`)."""

from ._assess import (
    LEVEL_NAMES,
    MIN_PRIORITY,
    Assessment,
    DegradationTracker,
    OperationPriority,
    ResourceLoad,
    assess,
    level_for_ratio,
    may_start,
)
from ._limits import HOST_TIERS, GuardLimits, HostTier, host_tier, validate_limits
from ._safeguards import CircuitBreaker, SpawnRateLimiter

__all__ = [
    "HOST_TIERS",
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
    "assess",
    "host_tier",
    "level_for_ratio",
    "may_start",
    "validate_limits",
]
