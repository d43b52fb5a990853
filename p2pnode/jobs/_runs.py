"""Driver side of :mod:`p2pnode.node._runs` (issue 39): members' snapshots as :class:`MemberRuns`, the input of
the requesting node's table of one-off run outcomes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ..gossip import MemberState
from ..node import Member, NodeContext
from ..node._operator import IntentStore
from ..node._runs import RUN_PREFIX, MemberRuns
from ..snapshot import JobReport

__all__ = ["follow_runs", "member_runs"]


def member_runs(members: Iterable[Member],
                running_of: Callable[[Member], Iterable[JobReport] | None]) -> list[MemberRuns]:
    """What each member's newest snapshot says of one-off runs. The running list is the snapshot's own when it is
    inline (consistent with its ``ended`` reports: complete), else ``running_of(member)`` (a list fetched at a
    digest, maybe an older one: not complete). A dead or left member is ``gone``."""
    out = []
    for m in members:
        js = m.snapshot.jobs
        if js.running_inline:
            running: frozenset[str] | None = frozenset(r.job_id for r in js.running)
        else:
            reports = running_of(m) if m.state not in (MemberState.DEAD, MemberState.LEFT) else None
            running = frozenset(r.job_id for r in reports) if reports is not None else None
        out.append(MemberRuns(node_id=m.origin, gone=m.state in (MemberState.DEAD, MemberState.LEFT),
                              running=running, running_complete=js.running_inline,
                              ended=tuple(e for e in js.ended if e.job_id.startswith(RUN_PREFIX)),
                              refused={r.job_id: r.reason for r in js.refused if r.job_id.startswith(RUN_PREFIX)}))
    return out


def follow_runs(intents: IntentStore, ctx: NodeContext,
                running_of: Callable[[Member], Iterable[JobReport] | None], now_wall: float,
                placed: Mapping[str, str] | None = None) -> None:
    """Move the outcomes of the one-off runs requested here on (:meth:`IntentStore.observe_runs`): from every
    member while one waits to be placed (as the requests already are), else only from the nodes they run on
    (a member this node no longer holds is missing from the input: its run is lost if it was held since this
    agent started, else after the grace). ``placed``: the acting plan's node per ``run-<id>`` job when this node
    knows it (it leads): only that node's reports are believed. Nothing while all are final."""
    if not intents.runs.open():
        return
    if intents.runs.waiting():
        members = ctx.members()
    else:
        members = [m for m in (ctx.member(n) for n in intents.runs.nodes()) if m is not None]
    intents.observe_runs(member_runs(members, running_of), now_wall, placed)
