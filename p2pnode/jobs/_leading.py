"""The leader role of job control: plans while this node leads, serves its plans, and reads the plans and
running-job lists of others.

* **Planning** (the node the election names, for term T): a :class:`p2pnode.node.Planner` builds the plan of
  term T from the live members' sections and running-job lists and the newest plan of an elected leader
  (carry-over: see :mod:`p2pnode.node._plans`). A new leader that cannot get its predecessor's plan, or a
  member's running-job list, holds its first plan for up to :data:`HOLD_S` so nothing is placed twice; every new
  term's first plan waits two gossip rounds.
* **Serving**: this node's snapshot carries only the plan's ref (term, seq, digest, :meth:`LeaderRole.plan_section`);
  the whole plan and each node's signed part are served from the last :data:`PLANS_KEPT` plans, because the refs
  the nodes hold lag behind (:mod:`p2pnode.node._plandist`).
* **Reading**: the whole plan a ref names (:meth:`LeaderRole.plan_doc`) and a member's running jobs
  (:meth:`LeaderRole.running_of`), inline or fetched at their signed digest (:mod:`._fetch`).

:class:`p2pnode.jobs.JobControl` owns one and drives it from its scheduling loop.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from ..errors import DATA_ERRORS
from ..node import Member, MemberPlanInput, NodeContext, NodeCore, Planner, node_view_of
from ..node._plandist import open_running, open_whole, part_of, seal_part
from ..node._plans import carries_own
from ..scheduler import Catalog
from ..snapshot import JobReport, OperatorSection, PlanRef, PlanSection, encode_snapshot, plan_ref
from ._fetch import PlanFetcher, Want

__all__ = ["HOLD_S", "PLANS_KEPT", "LeaderRole"]

log = logging.getLogger(__name__)
HOLD_S = 10.0
"""A new leader missing its predecessor's plan or a live member's running-job list waits at most this long
(seconds) for them before planning without them."""
PLANS_KEPT = 8
MAX_CULPRIT_TRIES = 64
"""Members tried one at a time when planning fails on a member's data (see :meth:`LeaderRole.lead`)."""
"""Plans a leader keeps serving after it made newer ones (a node's part is asked for by the digest it saw)."""


class LeaderRole:
    """The leader role of node ``ctx`` (see module docstring). ``own_running()``, ``own_offer()`` and
    ``own_operator()`` give this node's running jobs, capacity offer and operator section (its own snapshot may
    lag behind them); ``signals()`` the newest signal per config."""

    def __init__(self, ctx: NodeContext, core: NodeCore, catalog: Catalog, fetcher: PlanFetcher, *,
                 own_running: Callable[[], list[JobReport]], own_offer: Callable[[], int],
                 own_operator: Callable[[], OperatorSection], signals: Callable[[], dict[str, Any]]) -> None:
        self.ctx = ctx
        self.core = core
        self.fetcher = fetcher
        self.settings = ctx.config.scheduler
        self.limits = ctx.config.guard
        self.own_running = own_running
        self.own_offer = own_offer
        self.own_operator = own_operator
        self.signals = signals
        self.planner = Planner(catalog, interval_s=self.settings.interval_s, adopt_grace_s=self.settings.adopt_grace_s)
        self.my_plan: PlanSection | None = None
        self.last_budget_used = False
        self.missing: list[str] = []  # live members whose running-job list was never fetched
        self._hold_since: float | None = None  # when this node's current term first lacked an input
        self._led_since: tuple[int, float] | None = None  # (term, when this node first planned for it)
        self._parts: dict[tuple[int, str], bytes] = {}  # (seq, node) -> signed part, for the current plan
        self._recent: deque[PlanSection] = deque(maxlen=PLANS_KEPT)  # the last plans served
        self.planning_errors = 0  # plans skipped because planning failed with no member to blame (a bug of ours)

    def plan_section(self) -> PlanRef | None:
        """The ref of the plan this node serves (while it leads), for its snapshot; or None."""
        return plan_ref(self.my_plan) if self.my_plan is not None else None

    def _served(self, digest: str | None) -> PlanSection | None:
        """This leader's plan with ``digest`` among its recent ones (a node asks for the plan its ref names), else
        its newest; None while it serves no plan."""
        if self.my_plan is None:
            return None
        if digest:
            for p in reversed(self._recent):
                if p.digest == digest and p.term == self.my_plan.term:
                    return p
        return self.my_plan

    def signed_part(self, node_id: str, digest: str | None = None) -> bytes | None:
        """``GET /plan/part?node=&digest=``: ``node_id``'s part of this leader's plan ``digest`` (else its newest),
        signed (cached per plan sequence); None while this node serves no plan."""
        p = self._served(digest)
        if p is None:
            return None
        key = (p.seq, node_id)
        data = self._parts.get(key)
        if data is None:
            live = {x.seq for x in self._recent}
            if len(self._parts) > 4096 or any(k[0] not in live for k in self._parts):
                self._parts = {k: v for k, v in self._parts.items() if k[0] in live and len(self._parts) <= 4096}
            data = self._parts[key] = seal_part(self.ctx.identity, part_of(p, node_id))
        return data

    def whole_plan_bytes(self, digest: str | None = None) -> bytes | None:
        """``GET /plan?format=msgpack&digest=``: this leader's whole plan ``digest`` among its recent ones, else its
        newest (the reader checks it against the ref it holds)."""
        p = self._served(digest)
        return encode_snapshot(p) if p is not None else None  # type: ignore[arg-type]

    def newest_plan(self) -> PlanRef | None:
        """The ref of the newest plan of an elected leader this node knows (ours included)."""
        return self.core.newest_plan((m.origin, m.snapshot.plan) for m in self.ctx.members())

    def _leader_of(self, ref: PlanRef) -> str | None:
        return self.core.leaders_by_term.get(ref.term)

    def plan_doc(self, ref: PlanRef | None) -> PlanSection | None:
        """The whole plan named by ``ref`` when this node holds it (its own, or one fetched from its leader and
        checked); else None, and a fetch is asked for."""
        if ref is None:
            return None
        mine = self.my_plan
        if mine is not None and (mine.term, mine.seq, mine.digest) == (ref.term, ref.seq, ref.digest):
            return mine
        origin = self._leader_of(ref)
        if origin == self.ctx.node_id:  # a plan of ours that our published snapshot names (ours may be newer)
            return next((p for p in reversed(self._recent)
                         if (p.term, p.seq, p.digest) == (ref.term, ref.seq, ref.digest)), None)
        if origin is None:
            return None
        key = ("whole", origin)
        version = f"{ref.term}/{ref.seq}/{ref.digest}"
        self.fetcher.want(Want(key, version, origin, f"/plan?format=msgpack&digest={ref.digest}",
                               lambda data, r=ref: open_whole(data, r)))
        doc: PlanSection | None = self.fetcher.get(key, version)
        return doc

    async def whole_plan(self, wait_s: float = 3.0) -> PlanSection | None:
        """The newest plan of an elected leader, whole, fetched on demand (for ``GET /plan`` and ``/jobs`` on a
        node that does not lead); waits at most ``wait_s`` seconds; None when there is none or it is unreachable."""
        ref = self.newest_plan()
        with trio.move_on_after(wait_s):
            while True:
                doc = self.plan_doc(ref)
                if doc is not None or ref is None:
                    return doc
                await trio.sleep(0.05)
        return None

    def running_of(self, m: Member) -> list[JobReport] | None:
        """``m``'s running jobs: inline in its snapshot, or the list fetched at its signed digest (an older
        fetched list while the new one is on its way); None when never fetched (a fetch is asked for)."""
        js = m.snapshot.jobs
        if m.origin == self.ctx.node_id:
            return self.own_running()
        if js.running_inline:
            return list(js.running)
        key = ("running", m.origin)
        self.fetcher.want(Want(key, js.running_digest, m.origin, "/jobs/running",
                               lambda data, d=js.running_digest: open_running(data, d)))
        held: list[JobReport] | None = self.fetcher.get(key)
        return held

    def _plan_inputs(self) -> list[MemberPlanInput]:
        """Live members with their views, and members dead for less than ``orphan_grace_s`` without one: their
        jobs stay in the plan (and count), so a false death under load never stops work nor lets a second
        training job of the same config start."""
        ctx, out = self.ctx, []
        now = ctx.now()
        self.missing = []
        for m in ctx.members():
            try:
                item = self._plan_input(m, now)
            except DATA_ERRORS as exc:  # a decoder gap: this member is set aside, planning carries on
                if m.origin == ctx.node_id:
                    raise
                ctx.quarantine(m.origin, "planning", exc)
                continue
            if item is not None:
                out.append(item)
        return out

    def _plan_input(self, m: Member, now: float) -> MemberPlanInput | None:
        """One member's planning input (None: it takes no part)."""
        ctx = self.ctx
        if m.origin == ctx.node_id:
            view = node_view_of(m.snapshot, disk_max_percent=self.limits.disk_max_percent,
                                vram_limit_ratio=self.limits.gpu_max_percent / 100.0, offer=self.own_offer(),
                                level=ctx.degradation_level,
                                memory_limit_ratio=self.limits.memory_max_percent / 100.0)
        elif m.state in (m.state.ALIVE, m.state.SUSPECT):
            view = node_view_of(m.snapshot, disk_max_percent=self.limits.disk_max_percent,
                                vram_limit_ratio=self.limits.gpu_max_percent / 100.0,
                                memory_limit_ratio=self.limits.memory_max_percent / 100.0)
        elif m.state is m.state.DEAD and now - self._dead_since(m.origin) < self.settings.orphan_grace_s:
            view = None
        elif m.state is m.state.LEFT and m.snapshot.jobs.running_inline and m.snapshot.jobs.running \
                and now - self._dead_since(m.origin) < self.settings.orphan_grace_s:
            view = None  # left with its jobs running (on_agent_stop = "leave"): they count, as a dead one's
        else:
            return None
        reports = self.running_of(m)
        if reports is None:  # never fetched: nothing new goes there until its list is known
            self.missing.append(m.origin)
            view, reports = None, []
        return MemberPlanInput(m.origin, view, tuple(reports), frozenset(r.job_id for r in m.snapshot.jobs.refused))

    def _dead_since(self, origin: str) -> float:
        m = self.core.membership.members.get(origin)
        return m.state_since if m is not None else -1e18

    def lead(self, term: int) -> None:
        """Compute the plan of ``term`` (this node leads) and publish its ref. A new term's first plan waits two
        gossip rounds after this node first tried to plan it (a competing claim of the same term, as when two
        nodes bootstrap apart, surfaces first); and while the newest plan of a predecessor or a live member's
        running-job list is still being fetched, it waits (at most :data:`HOLD_S`): planning without them could
        place a job twice (a second training of a config)."""
        now = self.ctx.now()
        first = self.my_plan is None or self.my_plan.term != term
        if self._led_since is None or self._led_since[0] != term:
            self._led_since = (term, now)
        settle = 2 * self.ctx.config.membership().gossip_interval_s
        if first and now - self._led_since[1] < settle:
            return  # just elected: two gossip rounds for a competing claim of this term (a bootstrap) to surface
        ref = self.newest_plan()
        previous = self.my_plan if carries_own(self.my_plan, ref) else self.plan_doc(ref)
        inputs = self._plan_inputs()
        if first and ((ref is not None and previous is None) or self.missing):
            if self._hold_since is None:
                self._hold_since = now
            if now - self._hold_since < HOLD_S:
                return
            log.warning("planning term %d without %s after %.0f s", term,
                        "the previous plan" if previous is None and ref is not None else
                        f"the running jobs of {', '.join(self.missing)}", HOLD_S)
        self._hold_since = None
        r = self._plan_failing_closed(term, inputs, previous, ref, now)
        if r is None:
            return
        self.my_plan = r.section
        self._recent.append(r.section)
        self.last_budget_used = r.decision.budget_used
        if r.decision.assignments or r.decision.stops:
            log.info("plan term %d seq %d: %d new, %d stops, %d pending", term, r.section.seq,
                     len(r.decision.assignments), len(r.decision.stops), len(r.section.pending))
        self.ctx.publish_soon()

    def _plan_failing_closed(self, term: int, inputs: list[MemberPlanInput], previous: PlanSection | None,
                             ref: PlanRef | None, now: float) -> Any:
        """``Planner.lead`` over every member's input; when a member's data breaks it (a gap in a decoder: should
        never happen), the member whose input it is is found by planning without each member in turn (at most
        :data:`MAX_CULPRIT_TRIES`), quarantined, and the plan made without it. When no single member is to blame,
        the round is skipped, counted (``planning_errors``) and logged: the scheduling loop and the agent carry
        on either way."""
        ops: dict[str, OperatorSection] = {}
        for m in self.ctx.members(live=True):
            ops[m.origin] = m.snapshot.operator if m.origin != self.ctx.node_id else self.own_operator()
        prev_leader = self._leader_of(ref) if previous is not None and ref is not None else None

        def attempt(without: str | None) -> Any:
            runs, done, cordoned = [], set(), set()
            for origin, op in ops.items():
                if origin == without:
                    continue
                runs += op.runs
                done.update(op.done_runs)
                if op.cordoned:
                    cordoned.add(origin)
            kept = [i for i in inputs if i.node_id != without]
            prev = None if without is not None and without == prev_leader else previous
            return self.planner.lead(term, kept, prev, self.signals(), now, time.time(), runs=runs, done_runs=done,
                                     cordoned=cordoned)

        try:
            return attempt(None)
        except DATA_ERRORS as exc:
            error = exc
        suspects = [o for o in dict.fromkeys([*(i.node_id for i in inputs), *ops, *([prev_leader] if prev_leader
                                                                                     else [])])
                    if o != self.ctx.node_id][:MAX_CULPRIT_TRIES]
        for origin in suspects:
            try:
                r = attempt(origin)
            except DATA_ERRORS:
                continue
            self.ctx.quarantine(origin, "planning", error)
            return r
        self.planning_errors += 1
        log.error("planning term %d failed, no member to blame (skipped; a bug of ours): %s: %s", term,
                  error.__class__.__name__, error, exc_info=error if self.planning_errors == 1 else None)
        return None

    def unplanned_running(self, seen: dict[str, str]) -> bool:
        """Whether a live member reports a running job this node's plan does not hold (a job re-adopted by an
        agent that came back, or one started under another leader): the plan must account for it at once (it may
        be a second training of a config, to be fenced). Only members whose ``running_digest`` changed since the
        last call are looked at (``seen``: origin to digest, updated), so the check costs nothing while the
        cluster's running sets stand still."""
        plan = self.my_plan
        if plan is None:
            return False
        held: set[str] | None = None
        found = False
        for m in self.ctx.members(live=True):
            if m.origin == self.ctx.node_id:
                continue
            digest = m.snapshot.jobs.running_digest
            if seen.get(m.origin) == digest:
                continue
            try:
                reports = self.running_of(m)  # asks for a fetch when the list is not inline
                if not m.snapshot.jobs.running_inline:
                    reports = self.fetcher.get(("running", m.origin), digest)  # that list, not an older one
                if reports is None:
                    continue  # asked for: looked at once it is fetched (a fetched list wakes the scheduling loop)
                seen[m.origin] = digest
                if held is None:
                    held = {a.job_id for a in plan.assignments}
                if any(r.job_id not in held for r in reports):
                    found = True
            except DATA_ERRORS as exc:  # a decoder gap: this member is set aside, the loop carries on
                self.ctx.quarantine(m.origin, "running list", exc)
        return found
