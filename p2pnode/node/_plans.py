"""Plans across a leader failover: the leader's planning with carry-over, and each node's part. Sans-IO.

* :class:`Planner` (the leader, for term T): from every live member's view (GPUs, tags, offer, degradation
  level, disk, the jobs it reports, the placements it refused) and the newest plan of an elected leader, it
  carries over the desired jobs that are running or were just assigned (so a new leader adopts what runs and
  never starts a second training job for a config), runs :func:`p2pnode.scheduler.plan` and returns the
  :class:`p2pnode.snapshot.PlanSection` for term T. "Just assigned" is measured on this node's monotonic clock
  from the moment it first saw the assignment in a plan: no wall-clock time of another node is compared. Its gang
  table (:mod:`p2pnode.node._gangs`) decides each gang's end and travels in the plan, seeding a new leader's.
* :func:`node_actions` (every node): what the acting plan (see :meth:`p2pnode.node.NodeCore.acting_plan`) asks
  of this node: the assignments to start and the jobs to stop, with reasons.
* :func:`node_view_of` (:mod:`p2pnode.node._nodeview`, re-exported here): the planner's view of a member from its
  typed snapshot.

The agent's job control and the scheduling simulation both use these, so adoption, fencing and refusals are
simulated with the agent's own rules.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any

import msgspec
from msgspec.structs import replace

from ..scheduler import (
    Affinity,
    Catalog,
    ClusterView,
    JobTemplate,
    NodeView,
    Plan,
    Prediction,
    RunningJob,
    SchedulerConfig,
    SchedulerState,
    Signals,
    Stop,
)
from ..scheduler._planlater import plan_at_first_use
from ..scheduler._planview import PredictorLike
from ..snapshot import (
    JobReport,
    PlanJob,
    PlanPending,
    PlanRef,
    PlanSection,
    PlanStop,
    RunRequest,
    plan_digest,
    plan_job_id,
)
from ._acting import acting_plan as acting_plan
from ._claims import ClaimLedger, claim_refusal, ended_refusal
from ._gangs import GangTable, placed_from
from ._gangs import observe as observe_gangs
from ._nodeview import BUSY_GPU_MEMORY_FRACTION, busy_gpus_of, node_view_of, proven_room_view
from ._nodeview import host_of as host_of
from ._operator import run_job_id

__all__ = ["BUSY_GPU_MEMORY_FRACTION", "MAX_REPORTED_JOBS_PER_MEMBER", "RUNNING_KNOWN_TAG", "LeadResult",
           "MemberPlanInput", "Planner", "acting_plan", "busy_gpus_of", "carries_own", "node_actions", "node_view_of",
           "proven_room_view"]

MAX_REPORTED_JOBS_PER_MEMBER = 4096
"""Running jobs of one member the leader carries into its plan, at most (128 GPUs x 32 fractional jobs): a member
reporting more cannot grow the leader's plan without bound."""
MAX_PENDING_IN_PLAN = 64
MAX_REASON_CHARS = 500


RUNNING_KNOWN_TAG = "@running-known"
"""The tag the leader gives, for one plan, every member whose running list it holds, when some member's is unknown
(:func:`proven_room_view`): training templates then require it (:meth:`Planner._guarded`)."""
ALL_RUNNING_KNOWN_TAG = "@all-running-known"
"""A tag no member carries while some member's running list is unknown: the training templates of configs no known
training runs require it then, so they wait (:meth:`Planner._guarded`)."""
NAMED_IN_REASON = 3
"""Members named in one pending reason at most (the others counted: "and 4 more")."""


def _names(ids: Iterable[str]) -> str:
    """``ids`` sorted, at most :data:`NAMED_IN_REASON` named, the others counted."""
    s = sorted(ids)
    more = f" and {len(s) - NAMED_IN_REASON} more" if len(s) > NAMED_IN_REASON else ""
    return ", ".join(s[:NAMED_IN_REASON]) + more


class MemberPlanInput(msgspec.Struct, frozen=True):
    """One member as the leader plans with it: ``view`` (None for a member dead less than the orphan grace: its
    jobs still count, nothing new goes there), the jobs it reports running and the job ids it refused."""

    node_id: str
    view: NodeView | None
    running: tuple[JobReport, ...] = ()
    refused: frozenset[str] = frozenset()
    ended_ok: frozenset[str] = frozenset()
    """Job ids of gang members it reports ended with status 0 lately (a gang completing)."""
    ended: frozenset[str] = frozenset()
    """Job ids of every gang member it reports ended lately: never carried as "assigned, not started yet" (one
    that ended before any report named it running would otherwise hold its gang for the adoption grace)."""
    dead: bool = False
    """Declared dead (its jobs count within the orphan grace, ``view`` None): its gang members are down."""
    running_known: bool = True
    """Whether ``running`` is its running list (inline in its snapshot, or fetched at its signed digest, or an older
    fetched one). False: its list was never fetched; ``view`` is then the room its offers prove
    (:func:`proven_room_view`) and no training goes there, nor a new training of a config no known training runs
    anywhere; what the previous plan placed there counts, for the planner's grace at most: past it (the list still
    unknown), the member gets no view and its carried assignments expire as any unreported one."""
    behind: bool = False
    """Its running list is known but was built before the member acted with the term being planned
    (``jobs.term_seen`` below it): it may still have started something of a plan of an older term this leader
    never held (elected before that plan reached it), so the list may lack a training. Like an unknown list: no
    training goes there and a new training of a config no known training runs waits, while it is live and within
    the planner's grace (a live member names the new term at its next snapshot), or while it is dead and its
    fenced jobs still count (the lease: it stopped any such training by then); its jobs count as reported."""


class LeadResult(msgspec.Struct, frozen=True):
    """What :meth:`Planner.lead` decided: the ``section`` to publish, the scheduler's ``decision`` (new
    assignments, stops, pending) and the cluster ``view`` it planned on (for invariant checks)."""

    section: PlanSection
    decision: Plan
    view: ClusterView
    offered_unknown: tuple[str, ...] = ()
    """Members planned with the room their offers prove, their running list unknown (:func:`proven_room_view`)."""
    withheld: tuple[str, ...] = ()
    """Members given no view (no new work) because their running list stayed unknown past the grace."""
    held_configs: tuple[str, ...] = ()
    """Configs whose new training waits because some member's running list is unknown (it may run it)."""
    cordoned: frozenset[str] = frozenset()
    """Members of ``view`` planned as cordoned (their offers 0: the operator's cordon, or drained for a scale-down)."""


def carries_own(own: PlanSection | None, ref: PlanRef | None) -> bool:
    """Whether a leader carries its own newest plan ``own`` over into the next one, rather than the plan named by
    ``ref`` (the newest ref of an elected leader in the snapshots, its own published one included): yes unless
    ``ref`` is of a later term or sequence. A leader's own snapshot names its plan only after the least gap
    between publications, so the newest ref may be its previous plan: carrying that one over would forget what
    the newer plan assigned and is not yet reported running, and place it again (a second training of a config)."""
    return own is not None and (ref is None or (own.term, own.seq) >= (ref.term, ref.seq))


class Planner(msgspec.Struct):
    """The leader's planning state across its terms (scheduler state, plan sequence, first sightings, the gang
    table: each gang's state, carried in the plan it publishes, :mod:`p2pnode.node._gangs`).

    ``adopt_grace_s`` + 2 x ``interval_s`` (seconds) is how long an assignment that no node reports yet still
    counts as placed (so it is not placed twice) after this node first saw it in a plan.
    """

    catalog: Catalog
    interval_s: float = 5.0
    adopt_grace_s: float = 30.0
    state: SchedulerState = msgspec.field(default_factory=SchedulerState)
    seq: int = 0
    first_seen: dict[str, float] = msgspec.field(default_factory=dict)
    _run_state: SchedulerState = msgspec.field(default_factory=SchedulerState)
    """Waiting times of the operators' one-off requests (apart from the catalog's templates)."""
    plan_fn: Callable[..., Plan] = plan_at_first_use
    """The scheduler's :func:`p2pnode.scheduler.plan` (a simulation passes a timed or capped one)."""
    reported: set[str] = msgspec.field(default_factory=set)
    """Job ids a member reported running while this node led: once such a job is no longer reported, it ended
    (it is never carried over as "assigned, not started yet": its GPU is free at once)."""
    gangs: GangTable = msgspec.field(default_factory=lambda: GangTable(grace_s=SchedulerConfig().gang_complete_grace_s))
    """The gang table (:mod:`p2pnode.node._gangs`): each gang's state and its members' (which ended with status 0),
    fed from the plan and the members' believed reports, published in the plan and seeded from a predecessor's."""
    made: tuple[int, int, str] | None = None
    """``(term, seq, digest)`` of the newest plan this planner made: a carried plan that is not it seeds the gang
    table (:meth:`p2pnode.node._gangs.GangTable.seed`)."""
    claims: ClaimLedger = msgspec.field(default_factory=ClaimLedger)
    """Members' claims the plan does not back, ignored and counted (:mod:`p2pnode.node._claims`)."""
    _guarded_cache: tuple[Catalog, tuple[str, ...], Catalog] | None = None
    """``(catalog, held configs, the same with training kept where running lists are known and the held configs'
    training waiting)`` (:meth:`_guarded`)."""
    dead_hold_s: float = 0.0
    """How long a dead member that is :attr:`MemberPlanInput.behind` holds new trainings at most (seconds from the
    first plan of the term that found it behind): :func:`p2pnode.node._lease.takeover_after_s` of the lease (it
    stopped any training it started by then; 0: no lease, the grace)."""
    behind_since: dict[str, tuple[int, float]] = msgspec.field(default_factory=dict)
    """Live member to ``(term, when)``: when (monotonic s) this planner first planned term ``term`` with it
    :attr:`MemberPlanInput.behind`. Within the grace its list holds the new trainings (:meth:`_guarded`), past it no
    longer; kept for the term while the member is in the plan, so a member whose reports go back and forth holds
    them for one grace a term at most."""
    unknown_since: dict[str, float] = msgspec.field(default_factory=dict)
    """Member to when (monotonic s) this planner first planned with its running list unknown, while it still is:
    within the grace it is offered the room its offers prove, past it nothing (:meth:`_lead`). Members with a view
    only: what a dead member (within the orphan grace) was assigned counts for that grace, as before."""

    def _believed(self, j: JobReport, node_id: str, carried: Mapping[str, PlanJob], has_plan: bool,
                  now: float, issued: tuple[int, int] = (0, 0)) -> bool:
        """Whether member ``node_id``'s report ``j`` counts (:func:`p2pnode.node._claims.claim_refusal` against the
        carried plan's entries ``carried``; ``has_plan``: there is one; ``issued``: the current term and the
        highest sequence issued in it, :meth:`_issued`); one that does not is counted against the member."""
        why = claim_refusal(j, node_id, carried.get(j.job_id), has_plan, issued)
        if why is None:
            return True
        g = j.gang
        self.claims.note(node_id, why, j.job_id, now, gang=g.id if g is not None else "",
                         rank=g.rank if g is not None else -1)
        return False

    def _believed_ended(self, ids: frozenset[str], node_id: str, carried: Mapping[str, PlanJob],
                        now: float) -> frozenset[str]:
        """The job ids of member ``node_id``'s ``ended`` report that count: not those the carried plan gives to
        another node (counted against the member, :func:`p2pnode.node._claims.ended_refusal`)."""
        if not ids or not carried:
            return ids
        kept = []
        for job_id in ids:
            why = ended_refusal(job_id, node_id, carried.get(job_id))
            if why is None:
                kept.append(job_id)
            else:
                self.claims.note(node_id, why, job_id, now)
        return ids if len(kept) == len(ids) else frozenset(kept)

    def _issued(self, term: int, previous: PlanSection | None) -> tuple[int, int]:
        """``(term, highest sequence issued in it)``: this planner's sequence, or, for a leader restarted within
        its term (its sequence lost), the highest of ``term``'s ids in the carried plan if higher. A job id of
        ``term`` above it was never issued (:func:`p2pnode.node._claims.claim_refusal`). A carried plan this planner
        did not make also counts the ids of ``term`` its stops and its gang table name (an ended gang's members no
        longer assigned). The scheduler's sequence is raised to it: new ids continue above them all, so no id is issued
        twice (review of issue 39)."""
        seq = self.state.job_seq
        if previous is not None and previous.term == term:
            seq = max([seq, *(pid.seq for j in previous.assignments
                              if (pid := j.plan_id) is not None and pid.term == term)])
            if (previous.term, previous.seq, previous.digest) != self.made:
                named = [s.job_id for s in previous.stops] + [g.id for g in previous.gangs]
                named += [m.job_id for g in previous.gangs for m in g.members if m.job_id]
                seq = max([seq, *(pid.seq for i in named if (pid := plan_job_id(i)) is not None and pid.term == term)])
        self.state.job_seq = seq  # new ids continue above it: none is issued twice
        return term, seq

    @staticmethod
    def _carried(r: RunningJob, c: PlanJob | None, wall: float) -> PlanJob:
        """The plan entry of a job that runs or was assigned: its previous entry when that says the same (most
        jobs, plan after plan: no new struct per running job), else a new one (a job adopted from a report). The
        predicted figures it was placed by stay those of its first entry (none for a job adopted from a report:
        it runs already), so its part does not change as predictions move."""
        if c is not None and c.node == r.node_id and c.term == r.term and c.gpu_fraction == r.gpu_fraction \
                and c.vram_gib == r.vram_gib and tuple(c.gpus) == r.gpus:
            return c
        return PlanJob(job_id=r.job_id, node=r.node_id, template=r.template, gpus=list(r.gpus),
                       gpu_fraction=r.gpu_fraction, vram_gib=r.vram_gib, params=c.params if c is not None else {},
                       term=r.term, assigned_at=c.assigned_at if c is not None else wall,
                       gang=r.gang if r.gang is not None else c.gang if c is not None else None,
                       memory_gib=c.memory_gib if c is not None else None,
                       vram_peak_gib=c.vram_peak_gib if c is not None else 0.0)

    def _place_runs(self, runs: list[RunRequest], view: ClusterView, decided: Plan, stopped: set[str],
                    signals: dict[str, Signals], now: float, wall: float, term: int,
                    cordoned: frozenset[str] | set[str], catalog: Catalog | None = None,
                    ) -> tuple[list[PlanJob], list[PlanPending]]:
        """Place one-off ``runs`` on what the plan left: a second pass of :func:`p2pnode.scheduler.plan` over a
        catalog where every template wants no more instances (what runs is still accounted) and each request is
        a template of its own with one instance, pinned by a hard affinity to its node or tag. Each node that is
        not cordoned offers one GPU one-off and one CPU-only one-off per plan (the operator asked; the node's
        admission still decides). ``catalog``: the one the plan used (:meth:`_guarded`; None: this planner's)."""
        base = catalog if catalog is not None else self.catalog
        templates = base.templates
        mini: dict[str, JobTemplate] = {name: replace(t, max_concurrency=0) for name, t in templates.items()}
        by_key: dict[str, tuple[RunRequest, JobTemplate, dict[str, Any]]] = {}
        waiting: list[PlanPending] = []
        for r in runs:
            t = templates.get(r.template)
            label = f"{r.template} (run {r.id})"
            if t is None:
                waiting.append(PlanPending(template=label, reason="unsatisfiable: not in the catalog"))
                continue
            if t.gang is not None:
                waiting.append(PlanPending(template=label, reason="unsatisfiable: a gang is placed from the catalog "
                                           "(max_concurrency), not as a one-off run"))
                continue
            try:
                params = t.param_values(dict(r.params))
            except ValueError as exc:
                waiting.append(PlanPending(template=label, reason=f"unsatisfiable: {exc}"[:MAX_REASON_CHARS]))
                continue
            hard = tuple(Affinity(tag, hard=True) for tag in ((f"@node={r.node}",) if r.node else ())
                         + ((r.tag,) if r.tag else ()))
            key = f"{t.name}#{r.id}"
            mini[key] = replace(t, name=key, max_concurrency=1,
                                placement=replace(t.placement, affinity=t.placement.affinity + hard))
            by_key[key] = (r, t, params)
        if not by_key:
            return [], waiting
        nodes = {nid: replace(v, offer=0 if nid in cordoned else 1, cpu_offer=0 if nid in cordoned else 1,
                              tags=v.tags | {f"@node={nid}"})
                 for nid, v in view.nodes.items()}
        running = [r for r in view.running if r.job_id not in stopped] + [
            RunningJob(a.job_id, a.template, a.node_id, a.gpus, a.gpu_fraction, a.vram_gib, 0.0, term,
                       plan_job_id(a.job_id))
            for a in decided.assignments]
        mini_catalog = dataclasses.replace(base, templates=mini)
        runs_predictor = None if view.predictor is None else _RunPredictor(view.predictor, by_key)
        p = self.plan_fn(ClusterView(nodes, tuple(running), predictor=runs_predictor, wall=view.wall), mini_catalog,
                         signals, now, term=term, state=self._run_state, seed=term * 1_000_003 + self.seq + 1)
        extra = []
        for a in p.assignments:
            r, t, params = by_key[a.template]
            extra.append(PlanJob(job_id=run_job_id(r.id), node=a.node_id, template=t.name, gpus=list(a.gpus),
                                 gpu_fraction=a.gpu_fraction, vram_gib=a.vram_gib, params=params, term=term,
                                 assigned_at=wall, memory_gib=a.memory_gib, vram_peak_gib=a.vram_peak_gib))
            self.first_seen.setdefault(run_job_id(r.id), now)
        for x in p.pending:
            if x.template in by_key:
                r = by_key[x.template][0]
                waiting.append(PlanPending(template=f"{r.template} (run {r.id})", reason=x.reason[:MAX_REASON_CHARS],
                                           wait_s=round(x.wait_s, 1), of=r.template))
        return extra, waiting

    def _behind(self, term: int, members: list[MemberPlanInput], now: float, grace: float) -> set[str]:
        """The members :attr:`MemberPlanInput.behind` whose lists hold the new trainings of ``term`` now: those
        within ``grace`` (seconds; a dead one: within :attr:`dead_hold_s`, if longer) of the first plan of the term
        that found them behind. Bounded whatever members report: a member that flaps, or whose last sign of life
        others keep reporting fresh, holds them once a term."""
        kept = {nid: v for nid, v in self.behind_since.items() if v[0] == term}
        self.behind_since = {m.node_id: kept.get(m.node_id) or (term, now) for m in members
                             if m.behind or m.node_id in kept}
        return {m.node_id for m in members if m.behind and now - self.behind_since[m.node_id][1]
                < (max(grace, self.dead_hold_s) if m.dead else grace)}

    def _guarded(self, nodes: dict[str, NodeView], unknown: set[str], running: Mapping[str, RunningJob],
                 holding: set[str]) -> tuple[Catalog, tuple[str, ...]]:
        """The catalog to plan with, ``nodes`` tagged for it, and the configs whose new training waits.

        While no member in the plan (live, or dead within the orphan grace) has an unknown running list
        (``unknown``), this planner's catalog, nothing held. Else, for this plan: every member with a view whose
        list is known carries :data:`RUNNING_KNOWN_TAG`, which every training template requires (hard affinity),
        so no training goes to a member whose list is unknown; and, while some of them (``holding``) are within
        the planner's grace (their list may still come), the training templates of each config no training in
        ``running`` (reported by a known list, or assigned and counted) belongs to also require
        :data:`ALL_RUNNING_KNOWN_TAG`, which no member carries: they wait (the configs returned).

        What this guarantees: no plan places a training of a config on any member while a member whose running
        list the leader never held may run that config's training, except where a training of that config already
        counts in the plan (then the scheduler's own one-per-config rule places none). What it does not: a
        training the plan does not hold on an unknown member is not stopped by this plan (the member stops it as no
        longer in the plan after the adoption grace, or it is fenced as a duplicate once its list is fetched); and
        the hold lasts the grace only: past it the member gets no view and no work, its assignments expire as any
        unreported one (as before running lists were kept by digest), and new trainings go ahead, so one member
        that never serves its list cannot hold the cluster's trainings for as long as it is a member (named in the
        reasons and counted by the caller)."""
        templates = self.catalog.templates
        if not unknown or not any(t.kind == "training" for t in templates.values()):
            return self.catalog, ()
        trained = {templates[r.template].config for r in running.values()
                   if r.template in templates and templates[r.template].kind == "training"}
        held = (tuple(sorted({t.config for t in templates.values() if t.kind == "training"} - trained))
                if holding else ())
        for nid, v in nodes.items():
            if nid not in unknown:
                nodes[nid] = replace(v, tags=v.tags | {RUNNING_KNOWN_TAG})
        if self._guarded_cache is None or self._guarded_cache[:2] != (self.catalog, held):
            need = (Affinity(RUNNING_KNOWN_TAG, hard=True),)
            wait = (*need, Affinity(ALL_RUNNING_KNOWN_TAG, hard=True))
            guarded = {name: replace(t, placement=replace(t.placement, affinity=t.placement.affinity + (
                wait if t.config in held else need))) if t.kind == "training" else t for name, t in templates.items()}
            self._guarded_cache = (self.catalog, held, dataclasses.replace(self.catalog, templates=guarded))
        return self._guarded_cache[2], held

    def _reason(self, template: str, reason: str, guarded: Iterable[str], unknown: Iterable[str],
                held: tuple[str, ...], withheld: Iterable[str]) -> str:
        """A pending reason as the operator reads it while running lists are unknown (:meth:`_guarded`):
        ``guarded`` members planned with a view whose list is unknown (no training goes there), ``unknown`` those
        of them within the grace (whose lists hold the new trainings), ``held`` the configs whose new training
        waits, ``withheld`` the members given no view. The planner's words about the tags said plainly, the members
        named (a few, the rest counted)."""
        t = self.catalog.templates.get(template)
        if t is None:
            return reason
        clauses = []
        if t.kind == "training" and t.config in held:
            clauses.append(f"a new training of {t.config} waits until the running jobs of {_names(unknown)} are "
                           "known (fetched, and listed since this term: one training per config, and they may run "
                           "it)")
        elif t.kind == "training" and guarded:
            clauses.append(f"training is not placed on {_names(guarded)} until its running jobs are known (fetched, "
                           "and listed since this term: one training per config, and it may run one)")
        withheld = list(withheld)
        if withheld:
            clauses.append(f"no work goes to {_names(withheld)}: running list unknown past the grace, until fetched")
        if not clauses:
            return reason
        why = "; ".join(clauses)
        if RUNNING_KNOWN_TAG in reason or ALL_RUNNING_KNOWN_TAG in reason:
            return f"{why}; the planner: {reason}"
        return f"{reason}; {why}"

    def _feed_gangs(self, previous: PlanSection | None, running: Iterable[RunningJob], reported: Set[str],
                    ended_ok: Set[str], failed: Set[str], down: Set[str], now: float) -> None:
        """Before a plan: seed the gang table from ``previous`` when this planner did not make it (a predecessor's
        plan, or its own before a restart), then feed it what the members report (:func:`p2pnode.node._gangs.
        observe`: ``running`` believed or counted, ``reported`` running, ``ended_ok``, ``failed`` (ended otherwise
        or refused), ``down`` nodes)."""
        if previous is not None and (previous.term, previous.seq, previous.digest) != self.made:
            self.gangs.seed(previous, now)
        observe_gangs(self.gangs, running, reported, ended_ok, failed, down, now)

    def observe(self, p: PlanSection | None, now: float) -> None:
        """Note the first time (monotonic ``now``) each assignment of ``p`` was seen here; forget the others."""
        if p is None:
            return
        ids = {j.job_id for j in p.assignments}
        for job_id in ids:
            self.first_seen.setdefault(job_id, now)
        for job_id in [k for k in self.first_seen if k not in ids]:
            del self.first_seen[job_id]

    def lead(self, term: int, members: Iterable[MemberPlanInput], previous: PlanSection | None,
             signals: Mapping[str, Signals], now: float, wall: float, *, runs: Sequence[RunRequest] = (),
             done_runs: frozenset[str] | set[str] = frozenset(), cordoned: frozenset[str] | set[str] = frozenset(),
             predictor: PredictorLike | None = None) -> LeadResult:
        """See :meth:`_lead`; when it raises, the gang table is as it was before (:meth:`GangTable.checkpoint`: the
        leader's retries without each suspect member must not end an innocent gang). The cyclic garbage collector is
        paused while planning: a plan builds tens of thousands of acyclic objects (freed by reference counting), and
        collections in the middle of it traverse the growing plan again and again (measured at 9,500 running jobs: a
        plan's p90 roughly halved)."""
        enabled = gc.isenabled()
        gc.disable()
        kept, unknown_since, reported = self.gangs.checkpoint(), self.unknown_since, self.reported  # (both replaced)
        try:
            return self._lead(term, members, previous, signals, now, wall, runs=runs, done_runs=done_runs,
                              cordoned=cordoned, predictor=predictor)
        except BaseException:
            self.gangs.rollback(kept)  # a failed attempt changes no gang (the leader retries without a suspect),
            self.unknown_since, self.reported = unknown_since, reported  # nor a member's grace
            raise
        finally:
            if enabled:
                gc.enable()

    def _lead(self, term: int, members: Iterable[MemberPlanInput], previous: PlanSection | None,
              signals: Mapping[str, Signals], now: float, wall: float, *, runs: Sequence[RunRequest],
              done_runs: frozenset[str] | set[str], cordoned: frozenset[str] | set[str],
              predictor: PredictorLike | None = None) -> LeadResult:
        """The plan of ``term``: carried-over jobs (running, or assigned within the grace) plus new assignments, minus
        the stops. ``now`` monotonic, ``wall`` Unix seconds (only stamped on new assignments, for display). ``runs``:
        the operators' one-off requests (:mod:`._operator`), placed after the catalog's work under their job ids, one
        per node and plan, except those in ``done_runs`` (ran somewhere) or placed; one withdrawn before it started
        is not carried. ``cordoned`` nodes (the operator's, or drained for a scale-down) take no new work at all.
        ``predictor``: the fleet's predictions (None: none). A reported job keeps its member's wall-clock start
        (``JobReport.started_at``), compared with ``wall`` alone (elapsed, for predicted ends); not reported: 0.0."""
        templates = self.catalog.templates
        nodes: dict[str, NodeView] = {}
        running: dict[str, RunningJob] = {}
        refused: set[str] = set()
        known, ended_ok, ended, down = set[str](), set[str](), set[str](), set[str]()
        carried = {j.job_id: j for j in previous.assignments} if previous is not None else {}
        has_plan = previous is not None
        issued = self._issued(term, previous)
        unknown: set[str] = set()  # members whose running list is unknown (never fetched)
        grace = self.adopt_grace_s + 2 * self.interval_s
        members = list(members)
        self.unknown_since = {m.node_id: self.unknown_since.get(m.node_id, now) for m in members
                              if not m.running_known and m.view is not None}  # (a dead one's: orphan grace)
        withheld = {nid for nid, t in self.unknown_since.items() if now - t >= grace}
        behind = self._behind(term, members, now, grace)
        for m in members:
            known.add(m.node_id)
            if not m.running_known:
                unknown.add(m.node_id)
            if m.dead:
                down.add(m.node_id)
            refused |= m.refused
            ended_ok |= self._believed_ended(m.ended_ok, m.node_id, carried, now)
            ended |= self._believed_ended(m.ended, m.node_id, carried, now)
            # a cordoned node (the operator's, or drained for a scale-down) offers nothing; a withheld one, no view
            if m.view is not None and m.node_id not in withheld:
                nodes[m.node_id] = (replace(m.view, offer=0, cpu_offer=0) if m.node_id in cordoned and
                                    (m.view.offer or m.view.cpu_offer) else m.view)
            for j in m.running[:MAX_REPORTED_JOBS_PER_MEMBER]:
                if j.template in templates and self._believed(j, m.node_id, carried, has_plan, now, issued):
                    running[j.job_id] = RunningJob(j.job_id, j.template, m.node_id, tuple(j.gpus), j.gpu_fraction,
                                                   j.vram_gib, j.started_at, j.term, j.plan_id, j.gang)
        self.observe(previous, now)
        reported_now = set(running)
        waiting_list = unknown - withheld
        refused |= {j for j in carried if j.startswith("run-")} - {run_job_id(r.id) for r in runs} - set(done_runs)
        for c in carried.values():
            # Assigned but not reported yet: still counts, so nothing is placed twice (training above all),
            # unless its node refused it, did not start it within the adoption grace, or ran it and it ended. On a
            # member whose running list is unknown it counts while the list may still come (within the grace of
            # the member's first unknown plan); past it, as any unreported assignment (bounded: F6 of issue 38).
            if c.job_id in running or c.job_id in refused or c.job_id in ended or (
                    c.job_id in self.reported and c.node not in waiting_list):
                continue
            fresh = now - self.first_seen.get(c.job_id, now) < grace or c.node in waiting_list
            if fresh and c.node in known and c.template in templates:
                running[c.job_id] = RunningJob(c.job_id, c.template, c.node, tuple(c.gpus), c.gpu_fraction,
                                               c.vram_gib, 0.0, c.term or term, c.plan_id, c.gang)
        self.reported = (self.reported & set(carried)) | reported_now
        self._feed_gangs(previous, running.values(), reported_now, ended_ok, (ended - ended_ok) | refused, down, now)
        catalog, held = self._guarded(nodes, unknown | behind, running, waiting_list | behind)
        view = ClusterView(nodes, tuple(running.values()), self.gangs.ended_reasons(), predictor, wall)
        p = self.plan_fn(view, catalog, dict(signals), now, term=term, state=self.state,
                         seed=term * 1_000_003 + self.seq)
        stopped = {s.job_id for s in p.stops}
        gang_of = {r.job_id: r.gang.id for r in view.running if r.gang is not None}
        self.gangs.planned(placed_from(p.assignments), [(gang_of[s.job_id], s.reason) for s in p.stops
                                                        if s.job_id in gang_of and s.rule != "gang_ended"], now)
        assignments = [self._carried(r, carried.get(r.job_id), wall) for r in view.running if r.job_id not in stopped]
        assignments += [PlanJob(job_id=x.job_id, node=x.node_id, template=x.template, gpus=list(x.gpus),
                                gpu_fraction=x.gpu_fraction, vram_gib=x.vram_gib, params=dict(x.params), term=term,
                                assigned_at=wall, gang=x.gang, memory_gib=x.memory_gib,
                                vram_peak_gib=x.vram_peak_gib)  # the figures it was placed by (issue 39, item 4)
                        for x in p.assignments]
        stops = [plan_stop(s) for s in p.stops]
        guarded = sorted(unknown & nodes.keys())
        why = functools.partial(self._reason, guarded=sorted((unknown | behind) & nodes.keys()),
                                unknown=sorted(waiting_list | behind), held=held, withheld=withheld)
        pending = [PlanPending(template=x.template, reason=why(x.template, x.reason)[:MAX_REASON_CHARS],
                               wait_s=round(x.wait_s, 1)) for x in p.pending]
        if runs:
            placed = {a.job_id for a in assignments}
            todo = [r for r in runs if run_job_id(r.id) not in placed | set(done_runs) | refused]
            extra, waiting = self._place_runs(todo, view, p, stopped, dict(signals), now, wall, term, cordoned,
                                              catalog)
            waiting = [replace(w, reason=why(w.of, w.reason)[:MAX_REASON_CHARS]) for w in waiting]
            assignments += extra
            pending = waiting + pending
        self.seq += 1
        gangs = self.gangs.to_plan(now)
        section = PlanSection(
            term=term, seq=self.seq, digest=plan_digest(assignments, stops, gangs), at=wall, assignments=assignments,
            stops=stops, pending=pending[:MAX_PENDING_IN_PLAN], gangs=gangs,
        )
        self.made = (term, section.seq, section.digest)
        for x in p.assignments:
            self.first_seen.setdefault(x.job_id, now)
        return LeadResult(section, p, view, tuple(guarded), tuple(sorted(withheld)), held,
                          frozenset(c for c in cordoned if c in nodes))


class _RunPredictor:
    """The leader's ``predictor`` for the pass that places one-off runs (:meth:`Planner._place_runs`), whose
    templates are named ``<template>#<id>`` (``by_key``): each is predicted as its catalog template, so a run is
    placed by the figures its node admits it by (:func:`p2pnode.scheduler.need_of`)."""

    def __init__(self, predictor: PredictorLike, by_key: Mapping[str, tuple[RunRequest, JobTemplate, Any]]) -> None:
        self.predictor, self.by_key = predictor, by_key

    def predict(self, template: str, node_class: str = "") -> Prediction | None:
        named = self.by_key.get(template)
        return self.predictor.predict(named[1].name if named is not None else template, node_class)


def plan_stop(s: Stop) -> PlanStop:  # issue 39 (stop rules in the history): the plan's stop names its rule
    """The plan document's entry for the scheduler's stop ``s``: its job, node, reason (bounded) and rule."""
    return PlanStop(job_id=s.job_id, node=s.node_id, reason=s.reason[:MAX_REASON_CHARS], rule=s.rule)


def node_actions(p: PlanSection, node_id: str, running: Mapping[str, float], done: Set[str],
                 known_templates: Iterable[str] | Mapping[str, object], now: float,
                 adopt_grace_s: float) -> tuple[list[PlanJob], list[tuple[str, str]]]:
    """What plan ``p`` (already fenced: the acting plan) asks of ``node_id``.

    ``running``: this node's jobs, ``{job_id: started_at}`` in monotonic seconds; ``done``: job ids this node
    already ran or refused (never started again by a stale plan). Returns ``(starts, stops)``: assignments to
    start (in plan order; admission is the caller's) and ``(job_id, reason)`` to stop: jobs the plan stops, and
    jobs the plan no longer holds once they ran ``adopt_grace_s`` (the leader had time to hear of them), or holds
    with a template ``known_templates`` lacks (a pushed catalog dropped it here first: ``template 'T' is no longer
    in this node's catalog``)."""
    templates = set(known_templates)
    mine = {j.job_id: j for j in p.assignments if j.node == node_id and j.template in templates}
    gone = {j.job_id: j.template for j in p.assignments if j.node == node_id and j.template not in templates}
    ordered = {s.job_id: s.reason for s in p.stops}
    stops: list[tuple[str, str]] = []
    for job_id, started in running.items():
        if job_id in ordered:
            stops.append((job_id, f"{ordered[job_id]} (term {p.term})"))
        elif job_id not in mine and now - started >= adopt_grace_s:
            stops.append((job_id, f"template {gone[job_id]!r} is no longer in this node's catalog (term {p.term})"
                           if job_id in gone else f"no longer in the plan of term {p.term}"))
    starts = [j for job_id, j in mine.items() if job_id not in running and job_id not in done]
    return starts, stops
