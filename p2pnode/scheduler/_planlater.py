"""The planner imported at its first use: :func:`plan_at_first_use` (pure, like :func:`~._plan.plan`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._planview import Plan

__all__ = ["plan_at_first_use"]


def plan_at_first_use(*args: Any, **kw: Any) -> Plan:
    """:func:`p2pnode.scheduler.plan` (same arguments, same result), its module imported at the first call: the
    default ``plan_fn`` of a node's planner and admission, so that a node that never plans (it does not lead, it has
    no catalog) never loads the planner's ten modules (issue 43: an idle agent's RSS). The first call imports them
    (about 20 ms here, once, where the first plan is made)."""
    from ._plan import plan

    return plan(*args, **kw)
