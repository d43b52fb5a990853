"""The node layer between the pure cores and the trio drivers: one :class:`NodeCore` per node (membership,
election, publication and plan-fencing policy, sans-IO), the :class:`NodeContext` every subsystem gets instead
of the agent, and the plan logic shared by the agent and the simulator (:class:`Planner`, :func:`node_actions`).
"""

from ._context import Member, NodeContext
from ._core import MIN_PUBLISH_GAP_S, CoreStore, MemoryStore, NodeCore, RollAdoption
from ._info import MemberInfoCache, member_info
from ._plans import MAX_REPORTED_JOBS_PER_MEMBER, MemberPlanInput, Planner, node_actions, node_view_of

__all__ = [
    "MAX_REPORTED_JOBS_PER_MEMBER",
    "MIN_PUBLISH_GAP_S",
    "CoreStore",
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
