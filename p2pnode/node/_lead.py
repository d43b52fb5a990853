"""The leader's part of :class:`p2pnode.node.JobCore` (the node the election names, for term T), with its own
deadline: the first plan of a term waits ``settle_s`` (two gossip rounds: a competing claim of the same term
surfaces first), and while a predecessor's plan or a live member's running-job list is still being fetched it
holds, at most :data:`HOLD_S` (then such a member is offered only the room its offers prove, never a training:
:func:`p2pnode.node._plans.proven_room_view`); members dead or left with jobs for less than ``orphan_grace_s`` keep
their jobs counted; plans come on the cadence of :func:`p2pnode.scheduler.next_plan_at` (every ``interval_s``,
sooner when capacity appears: a live member's GPU or CPU offer rose since the step before, and above what the last
plan saw it offer and left it (:class:`_OfferWatch`: an offer flapping is no news), as when one of its jobs ended and
its share is offered at once; when the last plan used its budget, when a member refused an assignment,
or when a member reports a job the plan does not hold: a duplicate training to fence; never sooner than
``min_gap_s`` after the last plan, so a flood of job ends brings at most one plan per ``min_gap_s``). Planning
fails closed: a member whose data breaks the planner is found and quarantined. The scaling evaluation runs after
each new plan. Sans-IO: the fetched documents, the catalog, the planner, the predictor and the settings are the
core's."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import DATA_ERRORS
from ..gossip import MemberState
from ..scheduler import Catalog, ClusterView, Predictor, next_plan_at
from ..scheduler._planview import PLAN_MIN_GAP_S
from ..snapshot import JobReport, PlanRef, PlanSection
from ._jobio import Effect, Fetch, JobInputs, MemberJobs, PublishPlan, Quarantine, whole_version
from ._lease import last_sign, takeover_after_s
from ._plans import LeadResult, MemberPlanInput, Planner, carries_own, proven_room_view

if TYPE_CHECKING:  # the scaling core loads with job control's scaling only (issue 43: idle RSS)
    from ..scheduler._scaling import FleetNode, ScalingCore

__all__ = ["HOLD_S", "MAX_CULPRIT_TRIES", "PLANS_KEPT", "Leading"]

HOLD_S = 10.0
"""A new leader missing its predecessor's plan (the predecessor alive: :func:`may_serve`) or a live member's
running-job list waits at most this long (seconds) for them before planning without them."""
PLANS_KEPT = 8
"""Plans a leader keeps serving after it made newer ones (a node's part is asked for by the digest it saw)."""
MAX_CULPRIT_TRIES = 64
"""Members tried one at a time when planning fails on a member's data (see :meth:`Leading._plan_failing_closed`)."""
NEVER = math.inf


def _fleet_node() -> type[FleetNode]:
    """:class:`p2pnode.scheduler._scaling.FleetNode`, imported here: with scaling configured only (issue 43: an idle
    agent's RSS)."""
    from ..scheduler._scaling import FleetNode

    return FleetNode


class _Core(Protocol):
    """What the leader's part reads and writes of :class:`p2pnode.node.JobCore`: its settings, catalog, planner,
    predictor and scaling, and the documents it fetched."""

    node_id: str
    catalog: Catalog
    interval_s: float
    orphan_grace_s: float
    lease_s: float
    settle_s: float
    min_gap_s: float | None
    planner: Planner
    predictor: Predictor
    scaling: ScalingCore | None
    certified_class: dict[str, str]
    _docs: dict[tuple[str, str], tuple[str, Any]]
    _now: float
    _nudged: bool

    def held(self, key: tuple[str, str], version: str | None = None) -> Any: ...

    def _want(self, f: Fetch, out: list[Effect]) -> None: ...


class _OfferWatch:
    """Members' GPU and CPU-only offers (``(gpu, cpu)`` per member), for the prompt replan: a live member other
    than this node offers more than at the step before (a member first seen counts from none) and more than its
    floor: the most it offered from the step after the plan before the last one through the last plan's step, less
    what the last plan newly assigned it (none before a first plan). So a job ending once the plan's jobs started
    (their share spent) is news, and so is one ending after a plan that gave the member its offer, but an offer
    flapping 1, 0, 1, 0 brings one early plan, not one every ``min_gap_s``: its 1 was seen before that plan
    (review of issue 39). Bounded by the members: each plan keeps the floors of the members seen since the one
    before."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[int, int]] = {}  # member to its offer at the last step
        self.high: dict[str, tuple[int, int]] = {}  # member to its highest offer since the last plan (its step on)
        self.floor: dict[str, tuple[int, int]] = {}  # member to the offer the last plan left it

    def rose(self, members: Sequence[Any], me: str) -> bool:
        """Whether a member's offer rose at this step (see the class docstring): ``members`` with ``origin``,
        ``live``, ``offer`` and ``cpu_offer``; ``me`` this node (its own offer is not news)."""
        rose = False
        for m in members:
            if not m.live or m.origin == me:
                continue
            now = (m.offer, m.cpu_offer)
            was, floor = self.last.get(m.origin, (0, 0)), self.floor.get(m.origin, (0, 0))
            if any(x > w and x > f for x, w, f in zip(now, was, floor, strict=True)):
                rose = True
            self.last[m.origin] = now
            hi = self.high.get(m.origin, (0, 0))
            self.high[m.origin] = (max(hi[0], now[0]), max(hi[1], now[1]))
        return rose

    def planned(self, before: PlanSection | None, plan: PlanSection | None) -> None:
        """A plan was made (``before``: this node's previous one): each member's floor is its highest offer since
        the plan before, less the GPUs and CPU-only jobs ``plan`` newly assigned it."""
        if plan is None:
            return
        known = {a.job_id for a in before.assignments} if before is not None else set()
        spent: dict[str, tuple[int, int]] = {}
        for a in plan.assignments:
            if a.job_id not in known:
                g, c = spent.get(a.node, (0, 0))
                spent[a.node] = (g + len(a.gpus), c + (not a.gpus))
        self.floor = {o: (max(0, h[0] - spent.get(o, (0, 0))[0]), max(0, h[1] - spent.get(o, (0, 0))[1]))
                      for o, h in self.high.items()}
        self.high = {}

    def forget(self, origin: str) -> None:
        for d in (self.last, self.high, self.floor):
            d.pop(origin, None)


def listed_before(m: MemberJobs, term: int, held: tuple[str, Any] | None) -> bool:
    """Whether the running list a leader of ``term`` plans with for ``m`` may lack a job ``m`` started from an older
    term's plan: its snapshot names a lower ``jobs.term_seen``, or the list used is an older one than the snapshot
    names (``held``: the fetched ``(digest, list)``, kept while the newer one is on its way; its own term unknown).
    Not reported (``term_seen`` None: a unit test's or the simulator's member): False."""
    if m.term_seen is None:
        return False
    return m.term_seen < term or (m.running is None and held is not None and held[0] != m.running_digest)


def may_serve(inp: JobInputs, ref: PlanRef) -> bool:
    """Whether the leader that made the plan ``ref`` names is alive here, so the fetch of its plan may be answered:
    a new leader holds its first plan for it (:data:`HOLD_S`) only then. One that is suspect or dead (the usual
    reason for a new term) serves nothing; what a member may have started from its last plan is covered without it
    (:attr:`p2pnode.node._plans.MemberPlanInput.behind`)."""
    origin = inp.leadership.leaders_by_term.get(ref.term)
    return any(m.origin == origin and m.state is MemberState.ALIVE for m in inp.members)


class Leading:
    """The leader's state and rules (see the module docstring) for ``core``; :attr:`my_plan` is the newest plan
    this node made (None: none, or another node leads)."""

    def __init__(self, core: _Core) -> None:
        self.core = core
        self.my_plan: PlanSection | None = None
        self.recent: deque[PlanSection] = deque(maxlen=PLANS_KEPT)  # the last plans served
        self.last_result: LeadResult | None = None
        self.missing: list[str] = []  # live members whose running-job list was never fetched
        self.unknown_offered = 0
        """Members planned with while their running list was unknown, one per member and plan (offered only the room
        their offers prove: :func:`p2pnode.node._plans.proven_room_view`)."""
        self.unknown_withheld = 0
        """Members given no new work because their running list stayed unknown past the planner's grace, one per
        member and plan (:attr:`p2pnode.node._plans.LeadResult.withheld`)."""
        self.unknown_held_trainings = 0
        """Configs whose new training waited because some member's running list was unknown, one per config and
        plan (:attr:`p2pnode.node._plans.LeadResult.held_configs`)."""
        self.planning_errors = 0  # plans skipped because planning failed with no member to blame (a bug of ours)
        self.last_planning_error: Exception | None = None
        self._hold_since: float | None = None  # when this node's current term first lacked an input
        self._led_since: tuple[int, float] | None = None  # (term, when this node first tried to plan it)
        self._retry_at = NEVER  # while a first plan settles or holds: when to try again
        self._leading = False
        self._last_plan: float | None = None
        self._plan_term: int | None = None  # the term the cadence's last plan belongs to
        self.planned_without = ""  # what the last first plan of a term had to do without, after the hold ('')
        self._budget_used = False
        self._offers = _OfferWatch()  # members' offers: whether one rose (capacity appeared)
        self._changed_at: float | None = None  # capacity appeared since the last plan, first seen then
        self._running_seen: dict[str, str] = {}  # member to the running digest last checked against the plan
        self._refused_seen: dict[str, frozenset[str]] = {}  # member to the refusals it last reported
        self._scaling_at = NEVER  # when the scaling evaluation has news without input (monotonic)
        self._scaling_news = False  # a provider answered: evaluate again at the next step

    def forget(self, origin: str) -> None:
        """``origin`` is gone for good: drop what was seen of it."""
        self._running_seen.pop(origin, None)
        self._refused_seen.pop(origin, None)
        self._offers.forget(origin)

    def next_deadline(self) -> float:
        """While leading: the retry of a settling or held first plan, else the cadence's next plan, or the scaling
        evaluation's own deadline (monotonic seconds); ``inf`` while another node leads."""
        if not self._leading:
            return NEVER
        return min(self._retry_at if self._retry_at < NEVER else self._next_plan_at(), self._scaling_at)

    def schedule(self, inp: JobInputs, now: float, out: list[Effect]) -> None:
        """While leading, a plan when :func:`p2pnode.scheduler.next_plan_at` says one is due (capacity that
        appeared brings it forward)."""
        nudged, self.core._nudged = self.core._nudged, False
        lsh = inp.leadership
        self._leading = leading = lsh.leads(self.core.node_id)  # a leader of a superseded term plans nothing
        rose = self._offers.rose(inp.members, self.core.node_id)  # capacity appeared (a member's job ended, ...)
        if self._changed_at is None and (nudged or rose):
            self._changed_at = now
        if leading and self._changed_at is None and self._unplanned_running(inp, out):
            self._changed_at = now
        if leading and self._changed_at is None and self._new_refusals(inp):
            self._changed_at = now
        if leading and lsh.term != self._plan_term:  # a new term: its first plan is tried at once (then settles)
            self._plan_term, self._last_plan, self._retry_at = lsh.term, None, NEVER
        if leading and self.core.scaling is not None:  # the ledger and drain list adopted before the term's first plan
            assert lsh.term is not None
            self.core.scaling.lead(lsh.term, [(m.origin, m.scaling) for m in inp.members], inp.wall,
                              leaders_by_term=lsh.leaders_by_term)
        planned = False
        if leading and self._lead_due(now):
            assert lsh.term is not None
            before = self.my_plan
            self._lead(inp, lsh.term, now, out)
            if self.my_plan is not before:
                planned = True
                self._offers.planned(before, self.my_plan)
                self._last_plan, self._changed_at = now, None
                self._budget_used = self.last_result is not None and self.last_result.decision.budget_used
        if leading and self.core.scaling is not None:
            self._scale(inp, now, planned, out)
        elif not leading:
            if lsh.leader is not None:
                self.my_plan = None
            self._last_plan, self._budget_used, self._changed_at = None, False, None
            self._retry_at, self._plan_term, self._hold_since = NEVER, None, None
            if self.core.scaling is not None and self.core.scaling.term:
                self.core.scaling.resign()
                self._scaling_at = NEVER

    def _lead_due(self, now: float) -> bool:
        """Whether to try to plan now: while a first plan holds for a document, at every step (its arrival is
        news); while it settles or after a failed round, at its retry time; else on the planning cadence."""
        if self._hold_since is not None:
            return True
        if self._retry_at < NEVER:
            return now >= self._retry_at
        return now >= self._next_plan_at()

    def _next_plan_at(self) -> float:
        """When the next plan is due (:func:`p2pnode.scheduler.next_plan_at`), or sooner when a completing gang's
        grace ends (the gang table's deadline, :meth:`p2pnode.node._gangs.GangTable.next_deadline`), never sooner
        than the least gap after the last plan."""
        if self.core.min_gap_s is None:
            due = next_plan_at(self._last_plan, interval_s=self.core.interval_s)
        else:
            due = next_plan_at(self._last_plan, interval_s=self.core.interval_s, min_gap_s=self.core.min_gap_s,
                               capacity_changed_at=self._changed_at, budget_used=self._budget_used)
        gang_due = self.core.planner.gangs.next_deadline()
        if gang_due < due and self._last_plan is not None:
            due = max(gang_due, self._last_plan + (self.core.min_gap_s or PLAN_MIN_GAP_S))
        return due

    def _new_refusals(self, inp: JobInputs) -> bool:
        """Whether a live member refused an assignment since the last look: its work waits to be placed again."""
        found = False
        for m in inp.members:
            if m.live and m.refused and self._refused_seen.get(m.origin) != m.refused:
                self._refused_seen[m.origin] = m.refused
                found = True
        return found

    # -- scaling (leader) ---------------------------------------------------------------------------
    def _scale(self, inp: JobInputs, now: float, planned: bool, out: list[Effect]) -> None:
        """The scaling evaluation (:class:`p2pnode.scheduler._scaling.ScalingCore`) after each new plan, when a
        provider answered, and at its own deadlines (a cooldown's or an idle timeout's end), on the newest plan."""
        sc = self.core.scaling
        assert sc is not None
        r = self.last_result
        if r is None or self.my_plan is None or not (planned or self._scaling_news or now >= self._scaling_at):
            return
        self._scaling_news = False
        fleet = self.fleet(inp, r.view)
        out.extend(sc.step(fleet, self.my_plan.pending, self.core.catalog, self.core.predictor, inp.wall,
                           certified_class=self.core.certified_class))
        due = sc.next_deadline(inp.wall)
        self._scaling_at = now + (due - inp.wall) if due < NEVER else NEVER

    def fleet(self, inp: JobInputs, view: ClusterView) -> list[FleetNode]:
        """The live members as the scaling evaluation sees them (from the plan's view of the cluster), each with
        its running jobs and the placements of the newest plan it has not started yet: a node given work in the
        plan that chose it for a drain is not idle (it is drained anew, never removed with a job starting)."""
        by_node: dict[str, list[tuple[str, float, float]]] = {}  # node -> [(template, elapsed s, GPUs held)]
        running = set()
        for r in view.running:
            running.add(r.job_id)
            by_node.setdefault(r.node_id, []).append(
                (r.template, max(0.0, inp.wall - r.started_at) if r.started_at else 0.0, len(r.gpus) * r.gpu_fraction))
        for a in self.my_plan.assignments if self.my_plan is not None else ():
            if a.job_id not in running:
                by_node.setdefault(a.node, []).append((a.template, 0.0, len(a.gpus) * a.gpu_fraction))
        members = {m.origin: m for m in inp.members}
        out = []
        for node_id, v in view.nodes.items():
            m = members.get(node_id)
            if m is None:
                continue
            jobs = by_node.get(node_id, [])
            out.append(_fleet_node()(
                node_id=node_id, node_class=m.node_class or "cpu", gpus=len(v.gpus),
                gpu_used=sum(g for _t, _e, g in jobs), running=tuple((t, e) for t, e, _g in jobs),
                started_by=m.scaling.started_by, voter="voter" in v.tags, under_replicated=m.under_replicated,
                durable="durable" in v.tags, vram_gib=min((g.vram_gib for g in v.gpus), default=0.0)))
        return out

    def scaling_result(self, action_id: str, error: str, wall: float,
                       nodes: Sequence[tuple[str, str, str, str]] | None = None) -> None:
        """The provider answered the action ``action_id`` (``error`` "": done; ``nodes``: its answer as
        ``(request_id, node_id, state, node_class)``); evaluated again at the next step."""
        if self.core.scaling is not None:
            self.core.scaling.result(action_id, error, wall, nodes)
            self._scaling_news = True

    def scaling_listed(self, nodes: Sequence[tuple[str, str, str, str]] | None, error: str,
                       wall: float) -> list[Effect]:
        """The provider's ``list()`` as ``(request_id, node_id, state, node_class)`` (None: it failed with
        ``error``): the actions to issue again (see :meth:`p2pnode.scheduler._scaling.ScalingCore.listed`)."""
        if self.core.scaling is None:
            return []
        self._scaling_news = True
        return list(self.core.scaling.listed(nodes, error, wall))

    def plan_now(self, inp: JobInputs, term: int, now: float) -> list[Effect]:
        """Plan ``term`` now whatever the cadence says (the settle and the hold still apply): for tools that
        drive the core case by case (the snapshot fuzzer). Returns the effects."""
        out: list[Effect] = []
        self.core._now = now
        self._lead(inp, term, now, out)
        return out

    def _lead(self, inp: JobInputs, term: int, now: float, out: list[Effect]) -> None:
        """The plan of ``term`` (this node leads): see the module docstring (settle, hold, fail closed)."""
        self._retry_at = NEVER
        first = self.my_plan is None or self.my_plan.term != term
        if self._led_since is None or self._led_since[0] != term:
            self._led_since = (term, now)
        if first and now - self._led_since[1] < self.core.settle_s:
            self._retry_at = self._led_since[1] + self.core.settle_s
            return  # just elected: a competing claim of this term (a bootstrap) surfaces first
        ref = self.newest_plan(inp)
        previous = self.my_plan if carries_own(self.my_plan, ref) else self.plan_doc(inp, ref, out)
        inputs = self._plan_inputs(inp, term, now, out)
        if first and ((ref is not None and previous is None and may_serve(inp, ref)) or self.missing):
            if self._hold_since is None:
                self._hold_since = now
            if now - self._hold_since < HOLD_S:
                self._retry_at = self._hold_since + HOLD_S  # or sooner: a fetched document is news
                return
            self.planned_without = ("the previous plan" if previous is None and ref is not None
                                    else f"the running jobs of {', '.join(self.missing)}")
        self._hold_since = None
        r = self._plan_failing_closed(inp, term, inputs, previous, ref, now, out)
        if r is None:
            self._retry_at = now + PLAN_MIN_GAP_S
            return
        self.last_result = r
        self.unknown_offered += len(r.offered_unknown)
        self.unknown_withheld += len(r.withheld)
        self.unknown_held_trainings += len(r.held_configs)
        self.my_plan = r.section
        self.recent.append(r.section)
        out.append(PublishPlan(r.section))

    def newest_plan(self, inp: JobInputs) -> PlanRef | None:
        """The ref of the newest plan of an elected leader this node knows (its own published one included)."""
        return inp.leadership.newest_plan((m.origin, m.plan) for m in inp.members)

    def plan_doc(self, inp: JobInputs, ref: PlanRef | None, out: list[Effect]) -> PlanSection | None:
        """The whole plan ``ref`` names when held (this node's own, or one fetched from its leader and checked);
        else None, and a :class:`Fetch` for it is in ``out``."""
        if ref is None:
            return None
        mine = self.my_plan
        if mine is not None and (mine.term, mine.seq, mine.digest) == (ref.term, ref.seq, ref.digest):
            return mine
        origin = inp.leadership.leaders_by_term.get(ref.term)
        if origin == self.core.node_id:  # a plan of ours that our published snapshot names (ours may be newer)
            return next((p for p in reversed(self.recent)
                         if (p.term, p.seq, p.digest) == (ref.term, ref.seq, ref.digest)), None)
        if origin is None:
            return None
        key, version = ("whole", origin), whole_version(ref)
        doc: PlanSection | None = self.core.held(key, version)
        if doc is None:
            self.core._want(Fetch(key, version, origin, ref), out)
        return doc

    def served(self, digest: str | None) -> PlanSection | None:
        """This leader's plan with ``digest`` among its recent ones (a node asks for the plan its ref names), else
        its newest; None while it serves no plan."""
        if self.my_plan is None:
            return None
        if digest:
            for p in reversed(self.recent):
                if p.digest == digest and p.term == self.my_plan.term:
                    return p
        return self.my_plan

    def running_of(self, inp: JobInputs, m: MemberJobs, out: list[Effect]) -> list[JobReport] | None:
        """``m``'s running jobs: this node's own, inline in its snapshot, or the list fetched at its signed digest
        (an older fetched list while the new one is on its way); None when never fetched (a fetch is in
        ``out``)."""
        if m.origin == self.core.node_id:  # the snapshot's own entries (LocalJob.report: one builder)
            return [j.report() for j in inp.running.values()]
        if m.running is not None:
            return list(m.running)
        key = ("running", m.origin)
        held = self.core._docs.get(key)
        if held is None or held[0] != m.running_digest:
            self.core._want(Fetch(key, m.running_digest, m.origin), out)
        return list(held[1]) if held is not None else None

    def _plan_inputs(self, inp: JobInputs, term: int, now: float, out: list[Effect]) -> list[MemberPlanInput]:
        """Live members with their views, and members dead (or left with jobs running) for less than
        ``orphan_grace_s`` without one: their jobs stay in the plan (and count), so a false death under load never
        stops work nor lets a second training job of the same config start."""
        items: list[MemberPlanInput] = []
        self.missing = []
        for m in inp.members:
            try:
                item = self._plan_input(inp, m, term, now, out)
            except DATA_ERRORS as exc:  # a decoder gap: this member is set aside, planning carries on
                if m.origin == self.core.node_id:
                    raise
                out.append(Quarantine(m.origin, "planning", exc))
                continue
            if item is not None:
                items.append(item)
        return items

    def _fenced(self, r: JobReport) -> bool:
        """Whether the lease fences the job ``r`` reports (its template's, else a training's)."""
        t = self.core.catalog.templates.get(r.template)
        return t.fenced if t is not None else r.kind == "training"

    def _plan_input(self, inp: JobInputs, m: MemberJobs, term: int, now: float,
                    out: list[Effect]) -> MemberPlanInput | None:
        """One member's planning input for ``term`` (None: it takes no part). A member dead (or left with jobs
        running) counts for ``orphan_grace_s``; with a lease kept its fenced jobs count until
        :func:`takeover_after_s` after its last sign of life (:func:`p2pnode.node._lease.last_sign`) instead, its
        other jobs for ``orphan_grace_s``. A list built before its member acted with ``term`` (``jobs.term_seen``)
        is :attr:`MemberPlanInput.behind` while live, and while dead as long as its fenced jobs count by a lease."""
        orphaned = now - m.state_since < self.core.orphan_grace_s
        lease_s = self.core.lease_s
        fenced_held = orphaned
        if lease_s > 0 and (m.state is MemberState.DEAD or m.state is MemberState.LEFT and m.running):
            sign = last_sign(m.origin, m.state_since, ((x.seen_at, x.acks, x.acks_horizon_ms,
                                                        x.state_since if x.live else -math.inf)
                                                       for x in inp.members if x.origin != m.origin))
            fenced_held = now < sign + takeover_after_s(lease_s)
        if m.origin == self.core.node_id or m.live:
            view, keep = m.view, None
        elif m.state is MemberState.DEAD and (orphaned or fenced_held):
            view, keep = None, (orphaned, fenced_held)
        elif m.state is MemberState.LEFT and m.running and (orphaned or fenced_held):
            view, keep = None, (orphaned, fenced_held)  # left with jobs running (on_agent_stop = "leave")
        else:
            return None
        reports = self.running_of(inp, m, out)
        if keep is not None and reports is not None and keep != (True, True):
            reports = [r for r in reports if (keep[1] if self._fenced(r) else keep[0])]
        if reports is None:  # never fetched: only the room its offers prove, no training (see proven_room_view);
            self.missing.append(m.origin)  # the planner gives it nothing once unknown past its grace
            view = proven_room_view(view, m.busy_gpus) if view is not None else None
        behind = m.origin != self.core.node_id and (m.live or lease_s > 0 and fenced_held) and listed_before(
            m, term, self.core._docs.get(("running", m.origin)))
        return MemberPlanInput(m.origin, view, tuple(reports or ()), m.refused, m.ended_ok, m.ended,
                               dead=m.state is MemberState.DEAD, running_known=reports is not None, behind=behind)

    def _plan_failing_closed(self, inp: JobInputs, term: int, items: list[MemberPlanInput],
                             previous: PlanSection | None, ref: PlanRef | None, now: float,
                             out: list[Effect]) -> LeadResult | None:
        """``Planner.lead`` over every member's input; when a member's data breaks it (a gap in a decoder: should
        never happen), the member whose input it is is found by planning without each member in turn (at most
        :data:`MAX_CULPRIT_TRIES`), quarantined, and the plan made without it. When no single member is to blame,
        the round is skipped and counted (``planning_errors``)."""
        ops = {m.origin: m.operator for m in inp.members if m.live or m.origin == self.core.node_id}
        prev_leader = inp.leadership.leaders_by_term.get(ref.term) if previous is not None and ref else None

        def attempt(without: str | None) -> LeadResult:
            runs, done, cordoned = [], set(), set()
            for origin, op in ops.items():
                if origin == without:
                    continue
                runs += op.runs
                done.update(op.done_runs)
                if op.cordoned:
                    cordoned.add(origin)
            cordoned.update(self.core.scaling.draining if self.core.scaling is not None else (),  # drained for a
                            (m.origin for m in inp.members if m.noticed))  # scale-down, or noticed (issue 41)
            kept = [i for i in items if i.node_id != without]
            prev = None if without is not None and without == prev_leader else previous
            return self.core.planner.lead(term, kept, prev, inp.signals, now, inp.wall, runs=runs, done_runs=done,
                                     cordoned=cordoned, predictor=self.core.predictor)

        try:
            return attempt(None)
        except DATA_ERRORS as exc:
            error = exc
        suspects = [o for o in dict.fromkeys([*(i.node_id for i in items), *ops, *([prev_leader] if prev_leader
                                                                                   else [])])
                    if o != self.core.node_id][:MAX_CULPRIT_TRIES]
        for origin in suspects:
            try:
                r = attempt(origin)
            except DATA_ERRORS:
                continue
            out.append(Quarantine(origin, "planning", error))
            return r
        self.planning_errors += 1
        self.last_planning_error = error
        return None

    def _unplanned_running(self, inp: JobInputs, out: list[Effect]) -> bool:
        """Whether a live member reports a running job this node's plan does not hold (a job re-adopted by an
        agent that came back, or one started under another leader): the plan must account for it at once (it may
        be a second training of a config, to be fenced). Only members whose ``running_digest`` changed since the
        last look are looked at, so the check costs nothing while the cluster's running sets stand still."""
        p = self.my_plan
        if p is None:
            return False
        held: set[str] | None = None
        found = False
        for m in inp.members:
            if m.origin == self.core.node_id or not m.live or self._running_seen.get(m.origin) == m.running_digest:
                continue
            try:
                # that list, not an older one (asked for when not held: looked at once it arrives)
                reports: Sequence[JobReport] | None = (m.running if m.running is not None
                                                       else self.core.held(("running", m.origin), m.running_digest))
                if reports is None:
                    self.core._want(Fetch(("running", m.origin), m.running_digest, m.origin), out)
                    continue
                self._running_seen[m.origin] = m.running_digest
                if held is None:
                    held = {a.job_id for a in p.assignments}
                if any(r.job_id not in held for r in reports):
                    found = True
            except DATA_ERRORS as exc:  # a decoder gap: this member is set aside, the loop carries on
                out.append(Quarantine(m.origin, "running list", exc))
        return found
