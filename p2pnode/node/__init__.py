"""The node layer between the pure cores and the trio drivers: one :class:`NodeCore` per node (membership,
election, publication and plan-fencing policy, sans-IO), one :class:`JobCore` per node (every job decision:
fencing, graces, admission, the critical-level dwell, leading; sans-IO), the :class:`NodeContext` every subsystem
gets instead of the agent, and the plan logic under the job core (:class:`Planner`, :func:`node_actions`). The
agent's job control and the simulator drive the same :class:`JobCore`.
"""

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
