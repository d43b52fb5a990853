"""The weighted scheduler core (pure): catalog, signals, bounded weights, placement, plans, per-node PID offer
(GPU work) and CPU offer (CPU-only work).

It imports only the guard's pure core (:mod:`p2pnode.guardcore`), never the guard's I/O API, and knows no
fleet's domain: VRAM floors, tier preferences and kind priorities come from the catalog's ``[policy]``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._catalog import (
        ALL_TIERS,
        CPU_TIERS,
        ENGINES,
        KINDS,
        MAX_GANG_MEMBERS,
        PRIORITY_NAMES,
        STABLE_KINDS,
        STRATEGIES,
        Affinity,
        Catalog,
        CatalogError,
        Gang,
        JobTemplate,
        Param,
        Placement,
        Policy,
        ResourceRequest,
        catalog_from_text,
        load_catalog,
        parse_catalog,
    )
    from ._catalog_sources import CatalogSources
    from ._checkpointspec import CHECKPOINT_SIGNALS, CheckpointSpec, checkpoint_globs
    from ._cpuoffer import cpu_offer
    from ._invariants import plan_violations
    from ._nodefit import Figures, Holding, Misfit, figures_of, memory_need_gib, misfit, need_of, node_misfit
    from ._pid import CapacityController
    from ._plan import plan
    from ._planview import (
        PLAN_MIN_GAP_S,
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
        next_plan_at,
        node_tier,
        plan_due,
    )
    from ._predict import (
        OUTLIER_FACTOR,
        SKETCH_RELATIVE_ACCURACY,
        Prediction,
        Predictor,
        RunRecord,
        merge_wires,
        node_class_of,
        open_usage,
        quantile,
        sketch_from_wire,
        sketch_of,
        summarize,
    )
    from ._signals import (
        CLOCK_MAX,
        NEUTRAL,
        SignalError,
        Signals,
        SignalStamp,
        decode_signal_body,
        merge_signals,
        merge_stamped,
        next_clock,
        validate_signals,
    )
    from ._signed import (
        CatalogBook,
        CatalogFloor,
        CatalogRefused,
        SignedCatalog,
        decode_signed,
        decode_signer,
        encode_signed,
        public_key_text,
        sign_catalog,
    )
    from ._stable import STABLE_RESERVE_INTERVALS, leaderless_cap, leaderless_catalog, reserve_for_stable, stable_need
    from ._weights import Factors, FactorWeights, factors, score

__all__ = [
    "decode_signal_body",
    "ALL_TIERS", "CLOCK_MAX", "CPU_TIERS", "ENGINES", "Gang", "KINDS", "MAX_GANG_MEMBERS", "NEUTRAL",
    "PRIORITY_NAMES", "STABLE_KINDS", "STABLE_RESERVE_INTERVALS", "STRATEGIES", "Affinity", "Assignment",
    "leaderless_cap", "leaderless_catalog", "reserve_for_stable", "stable_need",
    "cpu_offer",
    "Figures", "Holding", "Misfit", "figures_of", "memory_need_gib", "misfit", "need_of", "node_misfit",
    "CapacityController", "Catalog", "CatalogError", "ClusterView", "FactorWeights", "Factors", "GpuView",
    "JobTemplate", "NodeView", "Param", "Pending", "Placement", "Plan", "Policy", "ResourceRequest", "RunningJob",
    "SchedulerConfig", "SchedulerState", "SignalError", "SignalStamp", "Signals", "Stop", "factors", "load_catalog",
    "merge_signals", "merge_stamped", "next_clock", "next_plan_at", "node_tier", "parse_catalog", "plan",
    "plan_due", "plan_violations", "PLAN_MIN_GAP_S",
    "score", "validate_signals", "catalog_from_text",
    "CatalogBook", "CatalogFloor", "CatalogRefused", "CatalogSources",
    "SignedCatalog", "decode_signed", "decode_signer", "encode_signed",
    "public_key_text", "sign_catalog",
    "OUTLIER_FACTOR", "SKETCH_RELATIVE_ACCURACY", "Prediction", "Predictor", "RunRecord", "merge_wires",
    "node_class_of", "open_usage", "quantile", "sketch_from_wire", "sketch_of", "summarize",
    "CHECKPOINT_SIGNALS", "CheckpointSpec", "checkpoint_globs",
]

_HOME: dict[str, str] = {
    **dict.fromkeys(('ALL_TIERS', 'Affinity', 'CPU_TIERS', 'Catalog', 'CatalogError', 'ENGINES', 'Gang',
        'JobTemplate', 'KINDS', 'MAX_GANG_MEMBERS', 'PRIORITY_NAMES', 'Param', 'Placement', 'Policy',
        'ResourceRequest', 'STABLE_KINDS', 'STRATEGIES', 'catalog_from_text', 'load_catalog', 'parse_catalog'),
        '_catalog'),
    **dict.fromkeys(('CatalogSources',), '_catalog_sources'),
    **dict.fromkeys(('CHECKPOINT_SIGNALS', 'CheckpointSpec', 'checkpoint_globs'), '_checkpointspec'),
    **dict.fromkeys(('cpu_offer',), '_cpuoffer'),
    **dict.fromkeys(('plan_violations',), '_invariants'),
    **dict.fromkeys(('Figures', 'Holding', 'Misfit', 'figures_of', 'memory_need_gib', 'misfit', 'need_of',
        'node_misfit'), '_nodefit'),
    **dict.fromkeys(('CapacityController',), '_pid'),
    **dict.fromkeys(('Assignment', 'ClusterView', 'GpuView', 'NodeView', 'PLAN_MIN_GAP_S', 'Pending', 'Plan',
        'RunningJob', 'SchedulerConfig', 'SchedulerState', 'Stop', 'next_plan_at', 'node_tier', 'plan_due'),
        '_planview'),
    **dict.fromkeys(('plan',), '_plan'),
    **dict.fromkeys(('OUTLIER_FACTOR', 'Prediction', 'Predictor', 'RunRecord', 'SKETCH_RELATIVE_ACCURACY',
        'merge_wires', 'node_class_of', 'open_usage', 'quantile', 'sketch_from_wire', 'sketch_of', 'summarize'),
        '_predict'),
    **dict.fromkeys(('CLOCK_MAX', 'NEUTRAL', 'SignalError', 'SignalStamp', 'Signals', 'decode_signal_body',
        'merge_signals', 'merge_stamped', 'next_clock', 'validate_signals'), '_signals'),
    **dict.fromkeys(('CatalogBook', 'CatalogFloor', 'CatalogRefused', 'SignedCatalog', 'decode_signed',
        'decode_signer', 'encode_signed', 'public_key_text', 'sign_catalog'), '_signed'),
    **dict.fromkeys(('STABLE_RESERVE_INTERVALS', 'leaderless_cap', 'leaderless_catalog', 'reserve_for_stable',
        'stable_need'), '_stable'),
    **dict.fromkeys(('FactorWeights', 'Factors', 'factors', 'score'), '_weights'),
}
"""Each public name's module: :func:`__getattr__` imports it at the name's first use (issue 43: a node that does
not lead never loads the planner, ``_plan`` and the modules it places with)."""


if not TYPE_CHECKING:  # (hidden from mypy, which would read any unknown name as Any)

    def __getattr__(name: str) -> Any:
        """The public name ``name``, imported from its module at its first read and kept in this package
        (PEP 562); ``AttributeError`` for any other name."""
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home}", __name__), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(_HOME))
