"""The leader role's serving half: while this node leads, its snapshot carries only the ref of its plan (term, seq,
digest, :meth:`LeaderRole.plan_section`); the whole plan and each node's signed part are served from the last
:data:`p2pnode.node._jobs.PLANS_KEPT` plans, because the refs the nodes hold lag behind
(:mod:`p2pnode.node._plandist`). Views on any node read the newest plan of an elected leader through it, fetched
on demand. Planning itself (settle, hold, carry-over, fencing, failing closed) is the job core's
(:class:`p2pnode.node.JobCore`).

:class:`p2pnode.jobs.JobControl` owns one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from ..node import JobCore, JobInputs, NodeContext
from ..node._plandist import part_of, seal_part
from ..node._planinputs import KeptInputs, plan_inputs_json
from ..snapshot import PlanRef, PlanSection, encode_snapshot, plan_ref

__all__ = ["LeaderRole"]

log = logging.getLogger(__name__)
MAX_PARTS_CACHED = 4096
PLAN_PUSH_NODES = 4
"""Members a new plan gives work or stops that hear of it at once (:meth:`p2pnode.node.NodeContext.publish_to`: this
node's snapshot with the plan's ref, one version, in a gossip exchange with each outside the round), the first ones
of the plan; the rest by gossip, within a round or two. Bounded: each push is an exchange (issue 38: an end's
replacement waited 0.35-0.7 s here)."""


class LeaderRole:
    """Serving the plans of node ``ctx``'s job ``core``; ``inputs()`` gives what the node knows now and
    ``apply(effects)`` carries out the core's effects (fetches asked for by a view)."""

    def __init__(self, ctx: NodeContext, core: JobCore, inputs: Callable[[], JobInputs],
                 apply: Callable[[list[Any]], None]) -> None:
        self.ctx = ctx
        self.core = core
        self.inputs = inputs
        self.apply = apply
        self.fetched = trio.Event()  # set (and replaced) whenever a document arrives
        self._parts: dict[tuple[int, str], bytes] = {}  # (seq, node) -> signed part, for the recent plans
        self._inputs = KeptInputs()  # what each recent plan was computed from (GET /plan?inputs=1)
        self._inputs_lock = trio.Lock()  # one document built at a time: readers meanwhile wait and share it

    @property
    def my_plan(self) -> PlanSection | None:
        """The newest plan this node made while leading (None when it does not lead)."""
        return self.core.my_plan

    @property
    def planning_errors(self) -> int:
        """Plans skipped because planning failed with no member to blame (a bug of ours)."""
        return self.core.planning_errors

    def published(self, section: PlanSection) -> None:
        """The core made plan ``section``: publish its ref, at once to the first :data:`PLAN_PUSH_NODES` members it
        gives work or stops, else soon (parts are sealed on request); the facts it was computed from are kept."""
        self._inputs.made(self.core.last_result, section)
        decision = self.core.last_result.decision if self.core.last_result is not None else None
        told: list[str] = []
        if decision is not None and (decision.assignments or decision.stops):
            log.info("plan term %d seq %d: %d new, %d stops, %d pending", section.term, section.seq,
                     len(decision.assignments), len(decision.stops), len(section.pending))
            nodes = [*(a.node_id for a in decision.assignments), *(s.node_id for s in decision.stops)]
            told = [n for n in dict.fromkeys(nodes) if n != self.ctx.node_id][:PLAN_PUSH_NODES]
        if told:
            self.ctx.publish_to(*told)  # one snapshot version, gossiped to each of them at once
        else:
            self.ctx.publish_soon()

    def plan_section(self) -> PlanRef | None:
        """The ref of the plan this node serves (while it leads), for its snapshot; or None."""
        return plan_ref(self.core.my_plan) if self.core.my_plan is not None else None

    def signed_part(self, node_id: str, digest: str | None = None) -> bytes | None:
        """``GET /plan/part?node=&digest=``: ``node_id``'s part of this leader's plan ``digest`` (else its newest),
        signed (cached per plan sequence); None while this node serves no plan."""
        p = self.core.served(digest)
        if p is None:
            return None
        key = (p.seq, node_id)
        data = self._parts.get(key)
        if data is None:
            live = {x.seq for x in self.core.recent}
            if len(self._parts) > MAX_PARTS_CACHED or any(k[0] not in live for k in self._parts):
                self._parts = {k: v for k, v in self._parts.items()
                               if k[0] in live and len(self._parts) <= MAX_PARTS_CACHED}
            data = self._parts[key] = seal_part(self.ctx.identity, part_of(p, node_id))
        return data

    def whole_plan_bytes(self, digest: str | None = None) -> bytes | None:
        """``GET /plan?format=msgpack&digest=``: this leader's whole plan ``digest`` among its recent ones, else its
        newest (the reader checks it against the ref it holds)."""
        p = self.core.served(digest)
        return encode_snapshot(p) if p is not None else None  # type: ignore[arg-type]

    async def plan_inputs_json(self, p: PlanSection) -> msgspec.Raw | None:
        """The facts this leader computed plan ``p`` from, as JSON (``GET /plan?inputs=1``,
        :func:`p2pnode.node._planinputs.plan_inputs_doc`); None when ``p`` is not one of the plans it still serves
        (another leader's, or an older one). Built once per plan, in a worker thread (about 0.3 s at 2,000 members
        and 16,000 jobs: never on the event loop, never again for the next reader)."""
        if self.core.my_plan is None:
            return None
        async with self._inputs_lock:
            data = self._inputs.encoded(p)
            if data is None:
                r = self._inputs.round_of(p)
                if r is None:
                    return None
                data = await trio.to_thread.run_sync(plan_inputs_json, r)
                self._inputs.keep_encoded(p, data)
        return msgspec.Raw(data)

    def newest_plan(self) -> PlanRef | None:
        """The ref of the newest plan of an elected leader this node knows (ours included)."""
        return self.core.newest_plan(self.inputs())

    def plan_doc(self, ref: PlanRef | None) -> PlanSection | None:
        """The whole plan named by ``ref`` when this node holds it; else None, and a fetch is asked for."""
        out: list[Any] = []
        doc = self.core.plan_doc(self.inputs(), ref, out)
        self.apply(out)
        return doc

    async def whole_plan(self, wait_s: float = 3.0) -> PlanSection | None:
        """The newest plan of an elected leader, whole, fetched on demand (for ``GET /plan`` and ``/jobs`` on a
        node that does not lead); waits at most ``wait_s`` seconds (woken by each fetched document); None when
        there is none or it is unreachable."""
        ref = self.newest_plan()
        with trio.move_on_after(wait_s):
            while True:
                arrived = self.fetched
                doc = self.plan_doc(ref)
                if doc is not None or ref is None:
                    return doc
                await arrived.wait()
        return None
