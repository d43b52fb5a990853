"""The node layer between the pure cores and the trio drivers: one :class:`NodeCore` per node (membership,
election, publication and plan-fencing policy, sans-IO), one :class:`JobCore` per node (every job decision:
fencing, graces, admission, the critical-level dwell, leading; sans-IO), the :class:`NodeContext` every subsystem
gets instead of the agent, and the plan logic under the job core (:class:`Planner`, :func:`node_actions`). The
agent's job control and the simulator drive the same :class:`JobCore`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._claims import CLAIM_REASONS, ClaimLedger
    from ._context import Member, NodeContext
    from ._core import MIN_PUBLISH_GAP_S, CoreStore, MemoryStore, NodeCore, RollAdoption
    from ._info import MemberInfoCache, member_info
    from ._jobs import (
        CancelFetch,
        Effect,
        Fetch,
        FetchCheckpoint,
        JobCore,
        JobInputs,
        Leadership,
        LocalJob,
        MemberJobs,
        OfferSample,
        PublishPlan,
        Quarantine,
        Refuse,
        StartJob,
        StopJob,
    )
    from ._plans import MAX_REPORTED_JOBS_PER_MEMBER, MemberPlanInput, Planner, node_actions, node_view_of

__all__ = [
    "CLAIM_REASONS",
    "MAX_REPORTED_JOBS_PER_MEMBER",
    "MIN_PUBLISH_GAP_S",
    "ClaimLedger",
    "CancelFetch",
    "CoreStore",
    "Effect",
    "Fetch",
    "FetchCheckpoint",
    "JobCore",
    "JobInputs",
    "Leadership",
    "LocalJob",
    "MemberJobs",
    "OfferSample",
    "PublishPlan",
    "Quarantine",
    "Refuse",
    "StartJob",
    "StopJob",
    "Member",
    "MemberInfoCache",
    "MemberPlanInput",
    "MemoryStore",
    "NodeContext",
    "NodeCore",
    "Planner",
    "RollAdoption",
    "member_info",
    "node_actions",
    "node_view_of",
]

_HOME: dict[str, str] = {
    **dict.fromkeys(('CLAIM_REASONS', 'ClaimLedger'), '_claims'),
    **dict.fromkeys(('Member', 'NodeContext'), '_context'),
    **dict.fromkeys(('MIN_PUBLISH_GAP_S', 'NodeCore'), '_core'),
    **dict.fromkeys(('MemberInfoCache', 'member_info'), '_info'),
    **dict.fromkeys(('CancelFetch', 'Effect', 'Fetch', 'FetchCheckpoint', 'JobInputs', 'Leadership', 'LocalJob',
        'MemberJobs', 'OfferSample', 'PublishPlan', 'Quarantine', 'Refuse', 'StartJob', 'StopJob'), '_jobio'),
    **dict.fromkeys(('JobCore',), '_jobs'),
    **dict.fromkeys(('node_view_of',), '_nodeview'),
    **dict.fromkeys(('MAX_REPORTED_JOBS_PER_MEMBER', 'MemberPlanInput', 'Planner', 'node_actions'), '_plans'),
    **dict.fromkeys(('RollAdoption',), '_roll'),
    **dict.fromkeys(('CoreStore', 'MemoryStore'), '_store'),
}
"""Each public name's module: :func:`__getattr__` imports it at the name's first use (issue 43: an agent without
job control never loads the job core, :class:`JobCore`, and the leader's modules)."""


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
