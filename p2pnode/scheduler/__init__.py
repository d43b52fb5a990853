"""The weighted scheduler core (pure): catalog, signals, bounded weights, placement, plans, per-node PID offer."""

from ._catalog import (
    KINDS,
    STRATEGIES,
    Affinity,
    Catalog,
    CatalogError,
    JobTemplate,
    Param,
    Placement,
    ResourceRequest,
    load_catalog,
    parse_catalog,
)
from ._invariants import plan_violations
from ._pid import CapacityController
from ._plan import (
    TIER_BY_KIND,
    Assignment,
    ClusterView,
    GpuView,
    NodeView,
    Pending,
    Plan,
    RunningJob,
    SchedulerConfig,
    SchedulerState,
    Stop,
    node_tier,
    plan,
    vram_floor_gib,
)
from ._signals import NEUTRAL, SignalError, Signals, validate_signals
from ._weights import FactorWeights, Factors, factors, score

__all__ = [
    "KINDS", "NEUTRAL", "STRATEGIES", "TIER_BY_KIND", "Affinity", "Assignment", "CapacityController", "Catalog",
    "CatalogError", "ClusterView", "FactorWeights", "Factors", "GpuView", "JobTemplate", "NodeView", "Param",
    "Pending", "Placement", "Plan", "ResourceRequest", "RunningJob", "SchedulerConfig", "SchedulerState",
    "SignalError", "Signals", "Stop", "factors", "load_catalog", "node_tier", "parse_catalog", "plan", "plan_violations", "score",
    "validate_signals", "vram_floor_gib",
]
