"""The job core of one node: every job decision, sans-IO (no sockets, no trio, no clock; ``now`` is passed in).

The agent's job control (:class:`p2pnode.jobs.JobControl`) and the scheduling simulation
(:mod:`p2pnode.sim._sched`) drive the same :class:`JobCore`: they hand it what they know (:class:`JobInputs`:
the election view, the members' job-related state, the jobs running here, the guard's admission) and the news
of the moment (:meth:`JobCore.fetched`, :meth:`JobCore.job_exited`), call :meth:`JobCore.step` and carry out
the typed effects it returns (:data:`Effect`), and wake it again at :meth:`JobCore.next_deadline` or at the next
news. Nothing here sleeps or polls; the deadlines below are what a driver waits for.

The rules, each where the old drivers kept them, each with its deadline:

* **Fencing** (every node): only the plan of the leader of the current term is acted on, and only while no
  higher term is seen (:func:`p2pnode.node._plans.acting_plan`: the term is the fencing token). Without a leader
  a node runs only ``autonomous`` templates, and not while the election is still held at start-up; a durable node
  in a fleet with ephemeral members keeps free one GPU its catalog's largest stable-kind template (training) needs
  (:func:`p2pnode.scheduler.reserve_for_stable`), so the first leader's plan can place it there: only before this
  run saw any leader, and for at most ``STABLE_RESERVE_INTERVALS`` intervals from its first leaderless step.
* **Re-adoption grace**: a job re-adopted after an agent restart counts as started when this run first acts on a
  plan, so a plan made before the leader heard of it does not stop it for ``adopt_grace_s``; a running job the
  plan no longer holds is stopped once it ran ``adopt_grace_s`` (deadline: the earliest such expiry).
* **Admission** (every start): the spawn-rate limit, scaled with the node's GPUs and CPUs
  (:func:`p2pnode.guardcore.spawn_rate_per_minute`; a start it holds back waits, with its reason in
  :attr:`JobCore.waiting`, deadline: the next token), the guard's admission of the template's kind and
  priority, the operator's cordon, the circuit breaker and GPU/resource conflicts; a refusal is final for that
  job id (the leader re-places the work under a new id).
* **Load shedding** (kubelet's node-pressure eviction, :mod:`p2pnode.guardcore._pressure`): levels refuse new
  work at once, but running work is stopped only when CPU or memory stays over its limit for ``dwell_s``
  (deadline: the end of the dwell), one job at a time, lowest priority first; the next only once the stopped
  job left and a sample taken after that still shows the pressure. CPU pressure never stops training-priority
  work; memory pressure stops it last.
* **Leading** (the node the election names, for term T): the first plan of a term waits ``settle_s`` (two gossip
  rounds: a competing claim of the same term surfaces first), and while a predecessor's plan or a live member's
  running-job list is still being fetched it holds, at most :data:`HOLD_S` (then such a member is offered only the
  room its offers prove, never a training: :func:`p2pnode.node._plans.proven_room_view`); members dead or left with
  jobs for less than ``orphan_grace_s`` keep their jobs counted (their fenced jobs, with a lease kept, for the
  holder's lease plus a drift margin instead: :func:`p2pnode.node._lease.takeover_after_s`); plans come on the
  cadence of :func:`p2pnode.scheduler.next_plan_at` (every ``interval_s``, sooner when capacity appears, when the
  last plan used its budget, when a member refused an assignment, or when a member reports a job the plan does not
  hold: a duplicate training to fence).
  Planning fails closed: a member whose data breaks the planner is found and quarantined.
* **Offers** (:class:`p2pnode.node._offer.Offers`): the capacity offers are computed inside the step from what the
  driver sampled (:attr:`JobInputs.sample`), every ``interval_s``, when the jobs running here change and at once
  when a job ends, before anything is planned or started: a job that just ended offers its GPU in this very step.
* **The job table** (:mod:`p2pnode.node._table`): every job id this node knows has one record with an explicit state
  (assigned, waiting, starting, running, stopping with its rule, ended with its outcome; refused), changed only by
  the table's one transition table; an event with no transition is counted, never silently dropped. Every
  :class:`StopJob` names its rule (``plan``, ``adoption`` for a re-adopted job past its grace, ``shed``).

The parts, each with its own state and deadline (:meth:`JobCore.next_deadline` is their minimum): the table's
keeper (:class:`p2pnode.node._book.JobBook`), admission and starts (:class:`p2pnode.node._admit.Admission`),
load shedding (:class:`p2pnode.node._shed.Shedding`), the leader's part (:class:`p2pnode.node._lead.Leading`);
the inputs and effects are in :mod:`p2pnode.node._jobio`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import DATA_ERRORS
from ..guardcore import (
    CircuitBreaker,
    SpawnRateLimiter,
)
from ..scheduler import (
    CapacityController,
    Catalog,
    ClusterView,
    Plan,
    Predictor,
)
from ..scheduler._planlater import plan_at_first_use
from ..scheduler._planview import PLAN_MIN_GAP_S
from ..snapshot import JobReport, PlanJob, PlanRef, PlanSection, UsageDoc
from ._admit import Admission
from ._book import JobBook
from ._jobio import (
    CancelFetch,
    Effect,
    Fetch,
    FetchCheckpoint,
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
    whole_version,
)
from ._jobstate import StopRule, plan_rule
from ._lead import HOLD_S, MAX_CULPRIT_TRIES, PLANS_KEPT, Leading
from ._lease import takeover_after_s
from ._offer import Offers
from ._plandist import part_version
from ._plans import LeadResult, Planner, node_actions
from ._shed import SAMPLES_AFTER_SHED, Shedding
from ._table import (
    Event,
    Exited,
    JobRecord,
    JobTable,
    RanView,
    TransitionError,
    Withdrawn,
)

if TYPE_CHECKING:  # the scaling core loads with job control's scaling only (issue 43: idle RSS)
    from ..scheduler._scaling import FleetNode, ScalingCore

__all__ = ["HOLD_S", "MAX_CULPRIT_TRIES", "PLANS_KEPT", "SAMPLES_AFTER_SHED", "CancelFetch", "Effect", "Fetch",
           "FetchCheckpoint", "JobCore",
           "JobInputs", "Leadership", "LocalJob", "MemberJobs", "OfferSample", "PublishPlan", "Quarantine",
           "Refuse", "StartJob", "StopJob", "whole_version"]

MAX_REASON_CHARS = 500
PREDICTOR_REFRESH_S = 30.0
"""A leader rebuilds its predictor from changed summaries at most this often (seconds; at once for a new
catalog)."""
NEVER = math.inf


# -- the core -----------------------------------------------------------------------------------------------------
@dataclass
class JobCore:
    """The job policy of node ``node_id`` over ``catalog`` (see the module docstring). Times in seconds.

    ``interval_s``: scheduling and offer period; ``adopt_grace_s``: re-adoption grace; ``orphan_grace_s``: how
    long a dead member's jobs still count; ``settle_s``: the wait before a new term's first plan; ``dwell_s``: how
    long CPU or memory must stay over its limit before running work is shed; ``spawns_per_minute``: a fixed
    spawn-rate limit (None: ``spawns_per_minute_per_gpu`` and ``_per_cpu`` times this node's GPUs and CPUs,
    :func:`p2pnode.guardcore.spawn_rate_per_minute`);
    ``breaker_failures`` / ``breaker_cooldown_s``: the circuit breaker over failed jobs; ``min_gap_s``: the least gap
    between plans when capacity appears or the last plan used its budget (None: plan every ``interval_s`` only,
    a baseline); ``ran``: job ids this
    node ran in an earlier run (its run history, runs ended or not: ``remembered`` in :attr:`table`, never started
    again by a stale plan, adopted when found running; after construction a read-only set viewing :attr:`table`,
    :class:`RanView`); ``plan_fn``: the scheduler's
    :func:`p2pnode.scheduler.plan` (the simulator passes a timed or capped one)."""

    node_id: str
    catalog: Catalog
    interval_s: float = 5.0
    adopt_grace_s: float = 30.0
    orphan_grace_s: float = 60.0
    lease_s: float = 0.0
    """The lease on fenced work (``scheduler.lease_s``; 0: none): a dead member's fenced jobs (trainings, ``exclusive``
    templates) count for :func:`~p2pnode.node._lease.takeover_after_s` of it, not ``orphan_grace_s`` (issue 42)."""
    settle_s: float = 2.0
    dwell_s: float = 10.0
    spawns_per_minute: float | None = None
    spawns_per_minute_per_gpu: float = 10.0
    spawns_per_minute_per_cpu: float = 1.0
    breaker_failures: int = 5
    breaker_cooldown_s: float = 60.0
    min_gap_s: float | None = PLAN_MIN_GAP_S
    ran: Set[str] = field(default_factory=set)
    plan_fn: Callable[..., Plan] = plan_at_first_use
    scaling: ScalingCore | None = None
    """The leader's scaling decisions and action ledger (:mod:`p2pnode.scheduler._scaling`; None: off)."""
    pid: CapacityController | None = None
    """This node's PID controller over GPU utilization (:class:`p2pnode.scheduler.CapacityController`; None: its
    defaults), whose offers the core computes (:mod:`p2pnode.node._offer`)."""
    fetch_checkpoints: bool = False
    """A leader's placement of a template with ``[job.checkpoint]`` fetches its config's newest checkpoint before it
    starts (issue 41: :class:`FetchCheckpoint`; the agent's job control sets it; off: started at once, as the
    simulator does)."""
    certified_class: dict[str, str] = field(default_factory=dict)
    """Node id -> the node class a role certificate of a pinned operator key gives it (the job control fills it
    at every step from :func:`p2pnode.certs.certified_class` of the members held; empty with no key pinned).
    A member counts toward a scaling class only by this or by the provider's own answers
    (:func:`p2pnode.scheduler._scaling.counted_fleet`), never by its own claim."""

    def set_catalog(self, catalog: Catalog) -> None:
        """Plan and admit by ``catalog`` from the next step on (a pushed catalog adopted without a restart)."""
        self.catalog = catalog
        self.planner.catalog = catalog
        self.book.catalog = catalog

    def __post_init__(self) -> None:
        self.table = JobTable(history=self.ran)
        """Every job id this node knows, with its state (:class:`p2pnode.node._table.JobTable`): the core updates
        it as it emits :class:`StartJob`, :class:`StopJob` and :class:`Refuse`, and as the driver reports what the
        executor observed (:meth:`observe`, :meth:`job_exited`, :meth:`start_failed`, and the running jobs handed
        in at each step)."""
        self.ran = RanView(self.table)
        self.term_seen = 0  # the highest term acted with (``jobs.term_seen``): no older plan is acted on again
        self.planner = Planner(self.catalog, interval_s=self.interval_s, adopt_grace_s=self.adopt_grace_s,
                               plan_fn=self.plan_fn, dead_hold_s=takeover_after_s(self.lease_s) * (self.lease_s > 0))
        self.breaker = CircuitBreaker(failures=self.breaker_failures, cooldown_s=self.breaker_cooldown_s)
        self.book = JobBook(self.table, self.breaker, self.catalog)
        """The table's keeper: what the core emits and the driver reports, as table events
        (:class:`p2pnode.node._book.JobBook`)."""
        self.admission = Admission(self)
        """Admission and starts (:class:`p2pnode.node._admit.Admission`)."""
        self.spawn_limit = SpawnRateLimiter(per_minute=self.admission.spawn_rate(0, 0.0))
        self.waiting: tuple[tuple[str, str, str], ...] = ()
        """Starts the spawn-rate limit holds back, ``(job_id, template, reason)``: the reason says when the next."""
        self.waiting_gpu_jobs = 0
        """How many of :attr:`waiting` hold GPUs (what the leader names as the first cause of GPU work waiting)."""
        # every node
        self.leading = Leading(self)
        """The leader's part (:class:`p2pnode.node._lead.Leading`): settle, hold, cadence, planning, scaling."""
        self._nudged = False  # a job ended or a running list arrived: (leading) plan now
        self.offers = Offers(self.pid if self.pid is not None else CapacityController(), self.interval_s)
        """This node's capacity offers (:class:`p2pnode.node._offer.Offers`), computed in the step from
        :attr:`JobInputs.sample`; the driver publishes :attr:`offer` and :attr:`cpu_offer`."""
        self.shedding = Shedding(self.dwell_s)
        """Load shedding (:class:`p2pnode.node._shed.Shedding`), with its own deadline (the end of a dwell)."""
        self._acting_since: float | None = None  # when this run first acted on a leader's plan
        self._acted: tuple[Any, ...] | None = None  # what the last act looked at (a new plan is acted on once)
        self._act_at = NEVER  # when the last act's outcome may change with time alone
        self._reserve_until: float | None = None  # the leaderless GPU reserve's end (None: not begun; -inf: over)
        self._docs: dict[tuple[str, str], tuple[str, Any]] = {}  # key -> (version, checked document)
        self._asked: dict[tuple[str, str], str] = {}  # key -> the version last asked for
        self.local_seq = 0
        self.own_usage: UsageDoc | None = None
        """This node's run-history summary (the driver sets it: :meth:`set_usage`)."""
        self.predictor = Predictor({}, self.catalog)
        """The fleet's predictions (:class:`p2pnode.scheduler.Predictor`): while leading, from every member's
        summary held and this node's; else from this node's alone. Rebuilt only when those or the catalog
        change (:meth:`_refresh_predictor`, at each step)."""
        self._predictor_key: tuple[Any, ...] = ()
        self._predictor_at = -NEVER  # when the predictor was last built (monotonic)
        self._now = 0.0  # the newest step's time (monotonic)

    # -- the leader's part, as the drivers and tools read it --------------------------------------
    @property
    def my_plan(self) -> PlanSection | None:
        """The newest plan this node made while leading (:attr:`p2pnode.node._lead.Leading.my_plan`)."""
        return self.leading.my_plan

    @my_plan.setter
    def my_plan(self, p: PlanSection | None) -> None:
        self.leading.my_plan = p

    @property
    def recent(self) -> deque[PlanSection]:
        """The last :data:`PLANS_KEPT` plans served."""
        return self.leading.recent

    @property
    def last_result(self) -> LeadResult | None:
        """The newest planning round's result."""
        return self.leading.last_result

    @property
    def missing(self) -> list[str]:
        """Live members whose running-job list was never fetched (at the last plan)."""
        return self.leading.missing

    @property
    def unknown_offered(self) -> int:
        """See :attr:`p2pnode.node._lead.Leading.unknown_offered`."""
        return self.leading.unknown_offered

    @property
    def unknown_withheld(self) -> int:
        """See :attr:`p2pnode.node._lead.Leading.unknown_withheld`."""
        return self.leading.unknown_withheld

    @property
    def unknown_held_trainings(self) -> int:
        """See :attr:`p2pnode.node._lead.Leading.unknown_held_trainings`."""
        return self.leading.unknown_held_trainings

    @property
    def planning_errors(self) -> int:
        """Plans skipped because planning failed with no member to blame."""
        return self.leading.planning_errors

    @property
    def last_planning_error(self) -> Exception | None:
        """The newest such failure."""
        return self.leading.last_planning_error

    @property
    def planned_without(self) -> str:
        """What the last first plan of a term had to do without, after the hold ('' once the driver logged it)."""
        return self.leading.planned_without

    @planned_without.setter
    def planned_without(self, v: str) -> None:
        self.leading.planned_without = v

    def served(self, digest: str | None) -> PlanSection | None:
        """See :meth:`p2pnode.node._lead.Leading.served`."""
        return self.leading.served(digest)

    def plan_now(self, inp: JobInputs, term: int, now: float) -> list[Effect]:
        """See :meth:`p2pnode.node._lead.Leading.plan_now`."""
        return self.leading.plan_now(inp, term, now)

    def newest_plan(self, inp: JobInputs) -> PlanRef | None:
        """See :meth:`p2pnode.node._lead.Leading.newest_plan`."""
        return self.leading.newest_plan(inp)

    def plan_doc(self, inp: JobInputs, ref: PlanRef | None, out: list[Effect]) -> PlanSection | None:
        """See :meth:`p2pnode.node._lead.Leading.plan_doc`."""
        return self.leading.plan_doc(inp, ref, out)

    def running_of(self, inp: JobInputs, m: MemberJobs, out: list[Effect]) -> list[JobReport] | None:
        """See :meth:`p2pnode.node._lead.Leading.running_of`."""
        return self.leading.running_of(inp, m, out)

    def fleet(self, inp: JobInputs, view: ClusterView) -> list[FleetNode]:
        """See :meth:`p2pnode.node._lead.Leading.fleet`."""
        return self.leading.fleet(inp, view)

    def scaling_result(self, action_id: str, error: str, wall: float,
                       nodes: Sequence[tuple[str, str, str, str]] | None = None) -> None:
        """See :meth:`p2pnode.node._lead.Leading.scaling_result`."""
        self.leading.scaling_result(action_id, error, wall, nodes)

    def scaling_listed(self, nodes: Sequence[tuple[str, str, str, str]] | None, error: str,
                       wall: float) -> list[Effect]:
        """See :meth:`p2pnode.node._lead.Leading.scaling_listed`."""
        return self.leading.scaling_listed(nodes, error, wall)

    @property
    def offer(self) -> int:
        """GPU jobs this node asks for, as the last step computed them (:class:`p2pnode.node._offer.Offers`)."""
        return self.offers.offer

    @property
    def cpu_offer(self) -> int:
        """CPU-only jobs this node asks for, as the last step computed them."""
        return self.offers.cpu_offer

    # -- news ------------------------------------------------------------------------------------
    def fetched(self, key: tuple[str, str], version: str, doc: Any) -> None:
        """A document asked for with :class:`Fetch` arrived, checked: a part is acted on at the next step; a
        running list or a whole plan may be what a held plan waits for (and is capacity news)."""
        self._docs[key] = (version, doc)
        if self._asked.get(key) == version:
            del self._asked[key]
        if key[0] not in ("part", "usage"):  # (a summary is no capacity news: the next step reads it)
            self._nudged = self.offers.due = True

    def set_usage(self, doc: UsageDoc) -> None:
        """This node's run-history summary changed (a job ended): the predictor takes it at the next step."""
        self.own_usage = doc

    def forget(self, origin: str) -> None:
        """``origin`` is gone for good: drop what was fetched from it."""
        for key in [k for k in self._docs if k[1] == origin]:
            del self._docs[key]
        for key in [k for k in self._asked if k[1] == origin]:
            del self._asked[key]
        self.leading.forget(origin)

    def held(self, key: tuple[str, str], version: str | None = None) -> Any:
        """The document held for ``key`` (only at ``version`` when given), else None."""
        d = self._docs.get(key)
        if d is None or (version is not None and d[0] != version):
            return None
        return d[1]

    def job_exited(self, job_id: str, failed: bool | None, now: float, *, status: int | None = None,
                   signal: int | None = None) -> None:
        """A job of this node ended (:meth:`p2pnode.node._book.JobBook.job_exited`): its capacity is offered (and,
        leading, re-planned) at once."""
        self.book.job_exited(job_id, failed, now, status=status, signal=signal)
        self._ended(job_id, now)

    def start_failed(self, now: float, job_id: str | None = None, error: str = "") -> None:
        """A :class:`StartJob` could not be carried out (:meth:`p2pnode.node._book.JobBook.start_failed`)."""
        self.book.start_failed(now, job_id, error)

    def observe(self, ev: Event, now: float) -> JobRecord | TransitionError:
        """What the executor observed of a job (:meth:`p2pnode.node._book.JobBook.observe`); an exit offers its
        capacity (and, leading, re-plans) at once."""
        r = self.book.observe(ev, now)
        if isinstance(ev, Exited) and not isinstance(r, TransitionError):
            self._ended(ev.job_id, now)
        return r

    def _ended(self, job_id: str, now: float) -> None:
        """``job_id`` left this node at ``now``: its GPUs are offered at the next step (the newest sample still shows
        its load on them), and, leading, re-planned at once."""
        r = self.table.get(job_id)
        if r is not None:
            self.offers.freed(r.gpus, now)
        self._nudged = self.offers.due = True

    def history(self, n: int = 50) -> list[JobRecord]:
        """The newest ``n`` finished jobs of this node (ended or refused: their stop rule, reason and outcome),
        newest first (for the ``/jobs`` view)."""
        return self.table.history(n)

    # -- the step --------------------------------------------------------------------------------
    def step(self, inp: JobInputs, now: float) -> list[Effect]:
        """Everything due at ``now`` (monotonic seconds) given ``inp``: the effects to carry out, in order. The
        offers are computed first when due (:meth:`p2pnode.node._offer.Offers.step`, from ``inp.sample``), so what
        is planned and started in this same step sees them: a job that just ended offers its GPU in this very
        step, with no second one."""
        out: list[Effect] = []
        self._now = now
        self.term_seen = max(self.term_seen, inp.leadership.highest_term, inp.leadership.term or 0)  # (acting)
        self.book.observe_running(inp, now)
        self.book.resume_stops(inp, now, out)  # a stop restored from the ledger, its process re-adopted
        if inp.leaving:
            return out
        shed = self.shedding.step(inp.pressure, inp.running, self.book.stopping(inp), self.catalog, now)
        if shed is not None:
            self.book.stop(shed, now, out)
        inp = self.offers.step(inp, self.node_id, self.catalog, now)
        self._refresh_predictor(inp, now, out)
        self.leading.schedule(inp, now, out)
        self._act(inp, now, out)
        self.book.sync_waiting(self.waiting, now)
        return out

    def _refresh_predictor(self, inp: JobInputs, now: float, out: list[Effect]) -> None:
        """While leading, fetch each live member's summary whose digest changed; rebuild :attr:`predictor` when
        the catalog changed, or the summaries held (this node's included) changed and the last build is
        :data:`PREDICTOR_REFRESH_S` old (a fleet's summaries change at every job end; a build over 1,000 of them
        takes a third of a second)."""
        docs: dict[str, UsageDoc] = {}
        if inp.leadership.leader == self.node_id:
            for m in inp.members:
                if m.origin == self.node_id or not m.usage_digest:
                    continue
                key = ("usage", m.origin)
                held = self._docs.get(key)
                if m.live and (held is None or held[0] != m.usage_digest):
                    self._want(Fetch(key, m.usage_digest, m.origin), out)
                if held is not None:  # the last one checked, while a newer one is on its way
                    docs[m.origin] = held[1]
        if self.own_usage is not None:
            docs[self.node_id] = self.own_usage
        built = (id(self.catalog), *sorted((o, id(d)) for o, d in docs.items()))
        if built != self._predictor_key and (built[0] != (self._predictor_key or (None,))[0]
                                              or now - self._predictor_at >= PREDICTOR_REFRESH_S):
            self._predictor_key, self._predictor_at = built, now
            self.predictor = Predictor(docs, self.catalog)

    def next_deadline(self) -> float:
        """When :meth:`step` must run again at the latest, with no news (monotonic seconds; ``inf``: never): the
        minimum of the act's own (an adoption grace, a spawn token, the leaderless reserve) and those of the parts
        (the offers' period, shedding, the table, the leader)."""
        return min(self.offers.next_deadline(), self._act_at, self.shedding.next_deadline(),
                   self.book.next_deadline(), self.leading.next_deadline())

    def _want(self, f: Fetch, out: list[Effect]) -> None:
        if self._asked.get(f.key) != f.version:
            self._asked[f.key] = f.version
            out.append(f)

    # -- acting ----------------------------------------------------------------------------------
    def _acting(self, inp: JobInputs, out: list[Effect]) -> PlanSection | None:
        """The plan this node acts on now: its own while it leads, else its part of the leader's current plan
        (fetched when not held); None when there is none of the current term."""
        lsh = inp.leadership
        if lsh.leader == self.node_id:
            acting: PlanSection | None = lsh.acting(self.my_plan)
            return acting
        leader = next((m for m in inp.members if m.origin == lsh.leader), None)
        ref = lsh.acting(leader.plan) if leader is not None else None
        if ref is None or lsh.leader is None:
            return None
        key, version = ("part", lsh.leader), part_version(ref)
        part: PlanSection | None = self.held(key, version)
        if part is None:
            self._want(Fetch(key, version, lsh.leader, ref), out)
        return part

    def _act(self, inp: JobInputs, now: float, out: list[Effect]) -> None:
        """Start and stop this node's jobs after the acting plan, or autonomous work without a leader. A plan is
        acted on once: again only when what it acts on changed (plan, running jobs, level, cordon) or a deadline
        of its own passed (an adoption grace ran out, a spawn token came back)."""
        lsh = inp.leadership
        if lsh.leader is None and not lsh.holding:  # at start-up the cluster may have a leader not heard yet
            self.admission.autonomous(inp, now, out)
            return
        if lsh.leader is not None:
            self._reserve_until = -NEVER  # a leader was seen: its plans place the stable work from now on
        acting = self._acting(inp, out) if lsh.leader is not None else None
        if acting is None:  # no plan of the current term yet (or our part is on its way): keep what runs,
            self._acted, self._act_at, self.waiting = None, NEVER, ()  # and look at the next plan afresh
            return
        looked_at = (acting.term, acting.seq, acting.digest, frozenset(inp.running), inp.level >= 4, inp.cordoned,
                     frozenset(inp.resumes))
        if looked_at == self._acted and now < self._act_at:
            return
        self._acted, self._act_at = looked_at, NEVER
        if self._acting_since is None:
            self._acting_since = now
        # A re-adopted job counts as started when this run first acts on a plan: the plans made before the leader
        # heard of it (while this agent was down, or before its first snapshot reached the leader) do not hold it,
        # and must not stop it before the leader had ``adopt_grace_s`` to re-plan with it.
        since = self._acting_since
        running = {k: max(j.started_at, since) if j.adopted else j.started_at for k, j in inp.running.items()}
        try:
            starts, stops = node_actions(acting, self.node_id, running, self.ran, self.catalog.templates, now,
                                         self.adopt_grace_s)
        except DATA_ERRORS as exc:  # a decoder gap: the leader's snapshot is set aside, this node carries on
            if lsh.leader != self.node_id and lsh.leader is not None:
                out.append(Quarantine(lsh.leader, "plan adoption", exc))
            self.waiting = ()
            return
        stopping = self.book.stopping(inp)
        stopped = {job_id for job_id, _ in stops}
        ordered = {s.job_id: s.rule for s in acting.stops}  # the plan's stops name their rule (gang_ended, ...)
        mine = {j.job_id for j in acting.assignments if j.node == self.node_id}
        for r in self.table.in_state("fetching"):  # issue 41: a fetch for a job the plan dropped is withdrawn
            if r.job_id not in mine:
                self.table.apply(Withdrawn(r.job_id), now)
                out.append(CancelFetch(r.job_id))
        for job_id, reason in stops:  # stops first: a preemption frees its GPU for the job that replaces it
            if job_id not in stopping:  # not in the plan's stops: its grace ran out (a re-adopted job: adoption's),
                rule: StopRule = (plan_rule(ordered[job_id]) if job_id in ordered else  # or the plan holds it with
                                  "template_removed" if job_id in mine else  # a template this node's catalog lacks
                                  "adoption" if inp.running[job_id].adopted else "plan")
                self.book.stop(StopJob(job_id, reason, rule), now, out)
        for k, started in running.items():  # a job the plan does not hold is stopped once its grace ran out
            if k not in mine and k not in stopped:
                self._act_at = min(self._act_at, started + self.adopt_grace_s)
        self.admission.start_all(inp, starts, acting.term, now, out)

    def admit(self, inp: JobInputs, j: PlanJob, now: float, out: list[Effect], *, term: int = 0) -> bool:
        """Whether ``j`` may start here now (:meth:`p2pnode.node._admit.Admission.admit`); a refusal is a
        :class:`Refuse` in ``out``."""
        return self.admission.admit(inp, j, now, out, term=term)
