"""Plan fencing: :func:`acting_plan` (pure), what every node asks of the leader's plan; apart from the planner
(:mod:`._plans`, which re-exports it), which only a node with job control loads (issue 43: an idle agent's RSS).
"""

from __future__ import annotations

from typing import TypeVar

from ..snapshot import PlanRef, PlanSection

__all__ = ["acting_plan"]

P = TypeVar("P", PlanRef, PlanSection)


def acting_plan(p: P | None, *, leader_term: int | None, highest_term: int) -> P | None:
    """Fencing: ``p`` (the leader's plan ref or document) may be acted on only if it is of the term in which this node
    sees the leader elected (``leader_term``) and no higher term has been seen here (``highest_term``); else
    None: keep what runs, start nothing."""
    if p is None or leader_term is None or p.term != leader_term or leader_term < highest_term:
        return None
    return p
