"""Scheduling scenario: a fleet shaped like seed 003's inventory, scaled to N nodes, a catalog of C configs,
jobs with durations, signals that change, and a leader failover in the middle. Pure and seeded (wall time is
measured only to report plan time).

Each node's job core computes its capacity offer in its own step, from its simulated GPU utilization (its PID
controller, :mod:`p2pnode.node._offer`; its CPU offer, for CPU-only templates, follows the CPUs and memory its jobs
hold: :func:`p2pnode.scheduler.cpu_offer`), and the others see the offer of its last step; a node whose job
ended is stepped at once, as the agent is woken by the exit;
the leader plans; assignments start, jobs end after their sampled duration. Reported: plan time (median, p99)
beside a plain greedy first-fit planner timed on the same views, GPU utilization per tier against the target
band, quota error per config, the longest wait of any config, running time lost to preemption, and every
invariant violation (checked on each plan with :func:`p2pnode.scheduler.plan_violations`).

Workloads (``workload``): ``exponential`` (the default: exponential run times by kind, the same for every
template: memoryless, so history predicts nothing of a running job's end), or ``varied``: each template has its
own median run time (drawn once, log-uniform within :data:`VARIED_MEDIANS_S` of its kind), each run that median
times its node tier's speed (:data:`TIER_SLOWDOWN`) times a log-normal spread (sigma :data:`RUN_SPREAD`), as runs
of one program on one kind of machine are. With ``predictions``, every run that ends by itself becomes a run
record of its node (template, node class, run time), each node's records are summarised as the agent does
(:func:`p2pnode.scheduler.summarize`) and the leader plans with the :class:`p2pnode.scheduler.Predictor` of them
all (rebuilt at most every :data:`PREDICTOR_EVERY_S` when runs ended). :func:`run_scheduling_predict` runs one
seed both ways side by side.
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from ..gossip import MemberState
from ..node import (
    Fetch,
    JobCore,
    JobInputs,
    Leadership,
    LocalJob,
    MemberJobs,
    PublishPlan,
    Refuse,
    StartJob,
    StopJob,
)
from ..node._jobio import OfferSample
from ..node._plans import LeadResult
from ..node._table import StopAsked
from ..resources import LOAD_PER_GPU
from ..scheduler import (
    Assignment,
    CapacityController,
    Catalog,
    ClusterView,
    GpuView,
    NodeView,
    Plan,
    Predictor,
    RunRecord,
    SchedulerConfig,
    Signals,
    node_tier,
    parse_catalog,
    plan,
    plan_violations,
    summarize,
)
from ..scheduler._gpucap import EPS, usable_vram_gib
from ..scheduler._plan import PLAN_MIN_GAP_S, PredictorLike
from ..snapshot import GangSlot, PlanJob, PlanSection, plan_ref
from ._inventory import seed003_fleet
from ._stops import SimStops, StopsConfig

__all__ = ["FLEET_MIX", "GPU_BOXES", "greedy_first_fit", "make_catalog", "make_fleet", "make_gpu_boxes",
           "run_placement_rate", "run_scheduling", "run_scheduling_predict"]

WALL0 = 1_700_000_000.0
"""The simulated wall clock (Unix seconds) at virtual time 0: members stamp their jobs' starts on it
(``JobReport.started_at``) and the leader's plans take it as ``wall``."""
VARIED_MEDIANS_S = {"selfplay": (300.0, 2400.0), "training": (1200.0, 4800.0), "evaluation": (120.0, 900.0)}
"""``varied`` workload: the range (seconds) a template's median run time is drawn from (log-uniform), by kind."""
TIER_SLOWDOWN = {1: 0.75, 2: 1.0, 3: 1.35, 4: 1.6}
"""``varied`` workload: a run's time on a node of each tier against its template's median (bigger GPUs run
faster): the node class matters to a prediction."""
RUN_SPREAD = 0.25
"""``varied`` workload: sigma of the log-normal spread of one template's run times on one tier (p90/p50 = 1.38)."""
PREDICTOR_EVERY_S = 60.0
"""With predictions: the leader's predictor is rebuilt from the nodes' summaries at most this often (seconds of
virtual time) while runs end (an agent fetches a member's summary when its digest changes)."""

# (share of nodes, GPU VRAM GiB list, cost per hour, ephemeral) after seed 003's inventory.
FLEET_MIX = (
    (0.06, [80], 2.5, False),  # H100
    (0.10, [80], 1.6, False),  # A100 80GB
    (0.05, [24] * 8, 3.2, True),  # 8x RTX 4090 (tier 1 by node VRAM)
    (0.04, [24] * 8, 2.0, True),  # 8x RTX 3090
    (0.08, [32, 32], 1.2, True),  # 2x RTX 5090
    (0.10, [32], 0.7, True),  # RTX 5090
    (0.10, [48], 0.9, False),  # L40S
    (0.05, [46], 0.5, True),  # A40
    (0.06, [16], 0.3, True),  # RTX 5080
    (0.12, [16], 0.2, True),  # RTX 4060 Ti
    (0.14, [12], 0.15, True),  # RTX 3060
    (0.10, [8], 0.12, True),  # RTX 3060 Ti
)
BOARDS = (("hex8", 1.0, 4), ("square8", 1.0, 4), ("square19", 0.5, 12), ("hexagonal", 1.0, 24))
POLICY = {
    "vram_floors_gib": {"hexagonal*": 32, "square19*": 16, "square8*": 8, "hex8*": 8},
    "tiers": {"training": [1, 2], "selfplay": [3, 2, 1], "evaluation": [2, 1]},
    "priorities": {"training": "high", "evaluation": "high"},
}
"""The catalog ``[policy]`` of seed 003's boards, as in ``deploy/examples/catalog.toml``."""
LOAD = {k: v / 100.0 for k, v in LOAD_PER_GPU.items()}
"""Simulated GPU utilization a job drives per unit of GPU it holds, by kind: the load model of ``--fake-gpus``
(:data:`p2pnode.resources.LOAD_PER_GPU`), one table for the agent's simulated GPUs and this simulation."""


def make_fleet(n: int, rng: random.Random) -> dict[str, NodeView]:
    """``n`` nodes shaped like :data:`FLEET_MIX` (seeded), as planner views."""
    nodes = {}
    for i in range(n):
        share, vram, cost, eph = rng.choices(FLEET_MIX, weights=[m[0] for m in FLEET_MIX])[0]
        nid = f"n{i:05d}"
        nodes[nid] = NodeView(nid, tuple(GpuView(k, float(v)) for k, v in enumerate(vram)),
                              frozenset({"ephemeral"} if eph else {"durable"}), cost, eph,
                              host=f"10.{i // 62500 % 250}.{i // 250 % 250}.{i % 250 + 1}")
    return nodes


GANG_EVERY = 20
"""One config in this many trains as a gang (issue 26): 5 % of the configs, with 2-8 members."""


def make_catalog(configs: int, *, selfplay_max_concurrency: int = 6, gangs: bool = True) -> Catalog:
    """``configs`` configs over the four boards, each with selfplay (at most ``selfplay_max_concurrency``
    instances), training and evaluation templates; with ``gangs``, one config in :data:`GANG_EVERY` trains as a
    gang of 2-8 members (``gang-<config>``) instead of one job."""
    jobs, quotas = [], {}
    for i in range(configs):
        board, gpus, vram = BOARDS[i % len(BOARDS)]
        cfg = f"{board}_{2 + i % 3}p_v{i}"
        train: dict[str, Any] = {"name": f"tr-{cfg}", "kind": "training", "config": cfg, "argv": ["train", "{config}"],
                                 "priority": 70, "preemptible": False,
                                 "resources": {"num_gpus": 1, "vram_gib": max(16, vram * 2)}}
        if gangs and i % GANG_EVERY == GANG_EVERY // 2:
            train.update(name=f"gang-{cfg}", gang={"members": 2 + (i // GANG_EVERY) % 7})
        jobs += [
            {"name": f"sp-{cfg}", "kind": "selfplay", "config": cfg, "argv": ["selfplay", "{config}"], "priority": 50,
             "autonomous": True, "max_concurrency": selfplay_max_concurrency,
             "resources": {"num_gpus": gpus, "vram_gib": vram}},
            train,
            {"name": f"ev-{cfg}", "kind": "evaluation", "config": cfg, "argv": ["eval", "{config}"], "priority": 60,
             "max_concurrency": 1, "resources": {"num_gpus": 0.5 if gpus < 1 else 1, "vram_gib": vram}},
        ]
        quotas[cfg] = (2.0 if board == "hexagonal" else 1.5 if board == "square19" else 1.0)
    total = sum(quotas.values())
    return parse_catalog({"job": jobs, "quotas": {k: v / total for k, v in quotas.items()}, "policy": POLICY})


def greedy_first_fit(view: ClusterView, catalog: Catalog, term: int) -> Plan:
    """Baseline: templates in catalog order, each instance on the first node (by id) with a fitting GPU and
    offer left. No weights, no tiers, no preemption."""
    free = {nid: {g.index: [1.0, g.vram_gib] for g in n.gpus} for nid, n in view.nodes.items()}
    offer = {nid: n.offer for nid, n in view.nodes.items()}
    count: dict[str, int] = defaultdict(int)
    for r in view.running:
        count[r.template] += 1
        for g in r.gpus:
            if r.node_id in free and g in free[r.node_id]:
                free[r.node_id][g][0] -= r.gpu_fraction
                free[r.node_id][g][1] -= r.vram_gib
    out: list[Assignment] = []
    order = sorted(view.nodes)
    for t in catalog.templates.values():
        need = max(t.resources.vram_gib, catalog.vram_floor_gib(t.config))
        while count[t.name] < t.max_concurrency:
            placed = False
            for nid in order:
                if offer[nid] <= 0:
                    continue
                for g, (f, v) in free[nid].items():
                    if f >= min(1.0, t.resources.num_gpus) - 1e-9 and v >= need:
                        free[nid][g][0] -= min(1.0, t.resources.num_gpus)
                        free[nid][g][1] -= need
                        offer[nid] -= 1
                        count[t.name] += 1
                        out.append(Assignment(f"g{len(out)}", t.name, nid, (g,), min(1.0, t.resources.num_gpus), need,
                                              (), term, 0.0))
                        placed = True
                        break
                if placed:
                    break
            if not placed:
                break
    return Plan(term, 0.0, tuple(out), (), ())


class _Job(msgspec.Struct):
    job_id: str
    template: str
    node_id: str
    gpus: tuple[int, ...]
    fraction: float
    vram: float
    ends_at: float
    load: float
    started_at: float = 0.0
    term: int = 0
    gang: GangSlot | None = None
    kind: str = ""


def _local(j: _Job) -> LocalJob:
    """``j`` as its node's core sees it (and, :meth:`LocalJob.report`, as its node's running list reports it: started
    at the simulated wall clock :data:`WALL0` plus its virtual start)."""
    return LocalJob(j.job_id, j.template, j.kind, j.gpus, j.fraction, j.vram, j.started_at, j.term, gang=j.gang,
                    started_wall=WALL0 + j.started_at)


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


class _Fleet:
    """The simulated nodes as a driver of their :class:`p2pnode.node.JobCore` s: each node's core decides, the fleet
    carries out its effects (a start becomes a :class:`_Job` that ends after a sampled duration, a stop removes
    one, a fetch is answered at once with the leader's plan) and counts what happened. ``refusal_rate``: the
    chance that a node's guard refuses an assignment (the leader then places the work again under a new id).
    ``band``: the GPU utilization band of the nodes' PID controllers, whose offers their cores compute from the
    utilization their jobs drive (None: the offers are fixed, those of the members' views)."""

    def __init__(self, catalog: Catalog, rng: random.Random, *, interval_s: float, adopt_grace_s: float,
                 orphan_grace_s: float, refusal_rate: float, durations: dict[str, float],
                 plan_fn: Callable[..., Plan] | None = None,
                 min_gap_s: float | None = PLAN_MIN_GAP_S,
                 run_time: Callable[[str, str], float] | None = None,
                 node_class: dict[str, str] | None = None, stops: SimStops | None = None,
                 band: tuple[float, float] | None = None) -> None:
        self.catalog = catalog
        self.band = band
        self.woken: set[str] = set()  # nodes with news since their last step (a job of theirs ended or stopped)
        self.stops = stops
        """The nodes' own stop rules, drains and memory overruns (:mod:`._stops`; None: none)."""
        self.by_rule: Counter[str] = Counter()  # every stop carried out, by its rule
        self.refusal_reasons: Counter[str] = Counter()  # every refusal (admission conflict), by its reason
        self.rng = rng
        self.refusal_rate = refusal_rate
        self.durations = durations
        self.run_time = run_time
        """``(template, node id) -> seconds`` a run takes (None: exponential with the kind's mean ``durations``)."""
        self.node_class = node_class or {}
        self.records: dict[str, list[RunRecord]] = defaultdict(list)
        """Per node, the runs that ended by themselves (what its ``jobs.db`` would hold)."""
        self.records_at = 0.0  # when a run last ended
        self.lost_s = 0.0  # seconds preempted jobs had run
        self.lost_gpu_s = 0.0  # the same, times the GPUs they held
        self.lost_runs: list[tuple[str, float, float, float]] = []
        """Each preempted job: ``(node id, started, stopped, GPU load it drove)``, its load the fraction of each
        of its GPUs times its kind's :data:`LOAD` times its GPU count (the busy time that counted for nothing)."""
        self.jobs: dict[str, _Job] = {}
        self.on_node: dict[str, dict[str, _Job]] = defaultdict(dict)
        self.refused: dict[str, set[str]] = defaultdict(set)
        self.ended: dict[str, deque[tuple[str, bool]]] = defaultdict(lambda: deque(maxlen=16))
        """Per node, the gang members that ended lately, and whether with status 0 (its snapshot's ``ended``)."""
        self.gang_ends: dict[str, float] = {}  # a gang's members end together: when rank 0's run is over
        self.counts = {"refusals": 0, "preempted": 0}
        self._new_core: Callable[..., JobCore] = functools.partial(
            JobCore, catalog=catalog, interval_s=interval_s, adopt_grace_s=adopt_grace_s,
            orphan_grace_s=orphan_grace_s, settle_s=0.0, spawns_per_minute=1e9, min_gap_s=min_gap_s,
            plan_fn=plan_fn or plan)
        self.cores: dict[str, JobCore] = {}
        self.published: dict[str, PlanSection] = {}  # leader -> the newest plan it published
        self.drawn: dict[str, bool] = {}  # assignment id -> refused by the simulated guard
        self.published_key: tuple = ()
        self.assigned_ids: dict[str, list[str]] = {}  # node -> the assignment ids the plans published give it
        self.now = 0.0

    def core(self, nid: str) -> JobCore:
        c = self.cores.get(nid)
        if c is None:
            b = self.band
            c = self.cores[nid] = self._new_core(nid, pid=None if b is None else CapacityController(
                band_min_percent=b[0], band_max_percent=b[1]))
        return c

    def sample(self, nid: str, view: NodeView | None, t: float) -> OfferSample | None:
        """What node ``nid``'s offers are computed from at ``t`` (None without a ``band``, or a view): each GPU's
        utilization from the jobs on it (:data:`LOAD` per unit of GPU they hold), its CPUs and memory."""
        if self.band is None or view is None:
            return None
        util: dict[int, float] = defaultdict(float)
        for j in self.on_node[nid].values():
            for g in j.gpus:
                util[g] += j.fraction * j.load
        return OfferSample(gpu_util=tuple((g.index, min(100.0, 100.0 * util[g.index])) for g in view.gpus),
                           sampled_at=t, cpus=view.cpus, memory_gib=view.memory_gib)

    def _refusals(self, nid: str) -> dict[str, str]:
        """The simulated guard's refusals of the assignments to ``nid`` in the plans published (issue 39: a value
        for the core, not a callback): each refused with probability ``refusal_rate``, by a draw of its own keyed
        by node and job id (the scenario's random stream is not shifted by it)."""
        if not self.refusal_rate:
            return {}
        key = tuple((o, id(p)) for o, p in self.published.items())
        if key != self.published_key:
            self.published_key, self.assigned_ids = key, defaultdict(list)
            for p in self.published.values():
                for j in p.assignments:
                    self.assigned_ids[j.node].append(j.job_id)
        drawn = self.drawn
        out: dict[str, str] = {}
        for k in self.assigned_ids.get(nid, ()):
            if k not in drawn:
                drawn[k] = random.Random(f"{nid}/{k}").random() < self.refusal_rate
            if drawn[k]:
                out[k] = "refused by the simulated guard"
        if len(drawn) > 100_000:
            drawn.clear()
        return out

    def step(self, nid: str, leadership: Leadership, members: list[MemberJobs], t: float) -> list:
        """Step node ``nid``'s core at ``t`` and carry out its effects (a fetch is answered and the core stepped
        again, as a driver would when the document arrives; with a ``band``, so are starts: the offers follow the
        jobs running)."""
        core = self.core(nid)
        done: list = []
        refuse = self._refusals(nid)
        self.woken.discard(nid)
        me = next((m.view for m in members if m.origin == nid), None)
        for _ in range(4):
            running = {j.job_id: _local(j) for j in self.on_node[nid].values()}
            inp = JobInputs(leadership, members, running, wall=WALL0 + t, signals=self.signals,
                            refuse_jobs=refuse, cordoned=self.stops is not None and self.stops.draining(nid),
                            sample=self.sample(nid, me, t))
            effects = core.step(inp, t)
            done += effects
            fetched = False
            for e in effects:
                if isinstance(e, Fetch) and e.ref is not None and e.key[1] in self.published:
                    p = self.published[e.key[1]]
                    if (p.term, p.digest) == (e.ref.term, e.ref.digest):
                        core.fetched(e.key, e.version, p)
                        fetched = True
                elif isinstance(e, StartJob):
                    self._start(nid, e.job, e.term, t)
                elif isinstance(e, StopJob):
                    self.by_rule[e.rule] += 1
                    job = self.remove(e.job_id)
                    if job is not None and e.reason.startswith("preempted by"):
                        self.counts["preempted"] += 1
                        self.lost_s += t - job.started_at
                        self.lost_gpu_s += (t - job.started_at) * job.fraction * len(job.gpus)
                        self.lost_runs.append((nid, job.started_at, t, job.fraction * len(job.gpus) * job.load))
                    if job is not None and job.gang is not None:
                        self.ended[nid].append((e.job_id, False))
                elif isinstance(e, Refuse):
                    self.refused[nid].add(e.job_id)
                    self.counts["refusals"] += 1
                    self.refusal_reasons[_reason_key(e.reason)] += 1
                elif isinstance(e, PublishPlan):
                    self.published[nid] = e.section
            # a stop here ends its job at once: that exit is news, and a start waiting for it (issue 39: the
            # core's own stop_wait) follows in the same step, as a driver steps again on a job's exit
            exited = any(isinstance(e, StopJob) for e in effects) and bool(core.waiting)
            started = self.band is not None and any(isinstance(e, StartJob) for e in effects)
            if not fetched and not exited and not started:
                break
        return done

    def _start(self, nid: str, a: PlanJob, term: int, t: float) -> None:
        kind = self.catalog.templates[a.template].kind
        if self.run_time is not None:
            ends = t + self.run_time(a.template, nid)
        else:
            ends = t + self.rng.expovariate(1.0 / self.durations.get(kind, 600.0))
        if a.gang is not None:
            ends = self.gang_ends.setdefault(a.gang.id, ends)
        if self.stops is not None:
            self.stops.started(nid, a.job_id, t, ends)
        self.jobs[a.job_id] = self.on_node[nid][a.job_id] = _Job(
            a.job_id, a.template, nid, tuple(a.gpus), a.gpu_fraction, a.vram_gib, ends, LOAD.get(kind, 0.7), t,
            term, a.gang, kind)

    def remove(self, job_id: str) -> _Job | None:
        job = self.jobs.pop(job_id, None)
        if job is not None:
            self.on_node[job.node_id].pop(job_id, None)
        return job

    def end_jobs(self, t: float) -> None:
        """Jobs whose sampled duration ran out end (the node's core hears of it)."""
        for jid in [j for j, job in self.jobs.items() if job.ends_at <= t]:
            job = self.remove(jid)
            if self.stops is not None:
                self.stops.ended(jid)
            if job is not None:
                self.core(job.node_id).job_exited(jid, False, t)
                self.woken.add(job.node_id)
                self.records[job.node_id].append(RunRecord(job.template, self.node_class.get(job.node_id, ""),
                                                           job.ends_at - job.started_at))
                self.records_at = t
                if job.gang is not None:
                    self.ended[job.node_id].append((jid, True))

    def rule_stops(self, t: float) -> None:
        """The nodes' own stop rules at ``t`` (:class:`._stops.SimStops`), carried out as the agent's executor
        does (:meth:`p2pnode.jobs._control.JobControl.apply`): the table records the stop (``StopAsked``), the job
        is stopped, and the node's core sees it gone (exited, stopped) at its next step."""
        if self.stops is None:
            return
        for nid, stops in self.stops.step(t, self.on_node).items():
            core = self.core(nid)
            for e in stops:
                if core.table.state(e.job_id) in ("starting", "running"):
                    core.observe(StopAsked(e.job_id, e.rule, e.reason), t)
                job = self.remove(e.job_id)
                self.woken.add(nid)
                if job is not None:
                    self.by_rule[e.rule] += 1
                    if job.gang is not None:  # its gang ends: the leader hears of it from the snapshot
                        self.ended[nid].append((e.job_id, False))
                self.stops.ended(e.job_id)

    def transition_errors(self) -> int:
        """Events the nodes' job tables had no transition for, over every node (0 in a correct run)."""
        return sum(sum(c.table.errors.values()) for c in self.cores.values())

    def by_node(self) -> dict[str, list[_Job]]:
        return defaultdict(list, {nid: list(js.values()) for nid, js in self.on_node.items()})

    signals: dict = {}


def _reason_key(reason: str) -> str:
    """A refusal's reason without its figures (digits dropped), so that like refusals count together."""
    return " ".join(w for w in reason.split() if not set(w) & _DIGITS)[:80]


_DIGITS = set("0123456789")


def _member(nid: str, view: NodeView | None, jobs: list[_Job], refused: set[str], *, plan: PlanSection | None = None,
            state: MemberState = MemberState.ALIVE, since: float = 0.0,
            ended: Iterable[tuple[str, bool]] = ()) -> MemberJobs:
    """Node ``nid`` as the others see it from its snapshot: its view, its running jobs inline, its refusals, the
    ref of the plan it publishes, the gang members that ended there lately."""
    ended = list(ended)
    return MemberJobs(nid, state, since, view, _reports(jobs), "", frozenset(refused), view.offer if view else 0,
                      plan=plan_ref(plan) if plan is not None else None, cpu_offer=view.cpu_offer if view else 0,
                      ended_ok=frozenset(j for j, ok in ended if ok), ended=frozenset(j for j, _ in ended))


def run_scheduling(
    n: int = 1000,
    configs: int = 200,
    *,
    duration_s: float = 1800.0,
    interval_s: float = 10.0,
    seed: int = 0,
    band: tuple[float, float] = (60.0, 80.0),
    starvation_cap_s: float = 1800.0,
    refusal_rate: float = 0.01,
    orphan_grace_s: float = 60.0,
    adopt_grace_s: float = 30.0,
    inventory: str = "random",
    gangs: bool = True,
    workload: str = "exponential",
    predictions: bool = False,
    gpu_max_percent: float = 80.0,
    catalog: Catalog | None = None,
    stops: StopsConfig | None = None,
) -> dict:
    """Run the scenario (see module docstring) and return its figures. ``inventory``: ``random`` (``n`` nodes
    drawn from :data:`FLEET_MIX`) or ``seed003`` (seed 003's own machines, :mod:`._inventory`; ``n`` is ignored);
    ``gangs``: one config in :data:`GANG_EVERY` trains as a gang (False: every training is one job);
    ``workload``: ``exponential`` or ``varied`` run times; ``predictions``: the leader plans with the fleet's
    predictor built from the runs that ended (module docstring); ``gpu_max_percent``: every node's guard GPU
    memory limit (its views commit each GPU's VRAM up to it, :func:`p2pnode.scheduler._gpucap.usable_vram_gib`; the
    guard's default 80); ``catalog``: the jobs (None: :func:`make_catalog` of ``configs`` configs); ``stops``:
    drains, maximum runtimes and memory overruns for the nodes' own stop rules (:mod:`._stops`; None: the
    catalog's runtimes only). The figures count every stop by its rule (``stops_by_rule``), every refusal by its
    reason (``refusals_by_reason``), the drains (``drains``) and the nodes' job-table transition errors
    (``transition_errors``, 0 in a correct run).

    Every node is driven by the agent's own :class:`p2pnode.node.JobCore` (no copy of its policy): the leader's
    plans (carry-over of the previous leader's plan, adoption grace, orphan grace), fencing by the term, each
    node's starts, stops and refusals. A node's guard refuses an assignment with probability ``refusal_rate``;
    the refusal is reported and the leader places the work again under a new id. At the failover the leader dies;
    for one interval half of the nodes have already seen the next term (their cores must ignore the dead leader's
    plan: counted in ``fenced``) while the others still act on it; the new leader carries its plan over, keeping
    the dead leader's jobs counted for ``orphan_grace_s``."""
    sc = _Scheduling(n, configs, seed=seed, band=band, interval_s=interval_s, refusal_rate=refusal_rate,
                     orphan_grace_s=orphan_grace_s, adopt_grace_s=adopt_grace_s, inventory=inventory, gangs=gangs,
                     workload=workload, predictions=predictions, gpu_max_percent=gpu_max_percent,
                     catalog=catalog, stops=stops or StopsConfig())
    sc.stops.schedule_drains([nid for nid in sc.fleet if nid != sc.leader], duration_s)
    failover_at = duration_s / 2
    t = 0.0
    while t < duration_s:
        sc.sim.end_jobs(t)
        sc.sim.rule_stops(t)
        sc.refresh_predictor(t)
        if t and t % 60 < interval_s:  # signals change over time
            sc.change_signals()
        if failover_at <= t < failover_at + interval_s:
            sc.election_interval(t)
        else:
            sc.interval(t)
        t += interval_s
    return {"nodes": len(sc.tier_of), "inventory": inventory, "configs": len(sc.catalog.configs),
            "duration_s": duration_s, "interval_s": interval_s, "workload": workload, "predictions": predictions,
            "gpu_max_percent": gpu_max_percent,
            "starvation_cap_s": starvation_cap_s, **sc.report()}


def run_scheduling_predict(n: int = 1000, configs: int = 200, *, duration_s: float = 3600.0, seed: int = 0,
                           workload: str = "varied", **kw: Any) -> dict:
    """One seed of :func:`run_scheduling` without and with predictions, side by side (``{"without": figures,
    "with": figures}``), on the ``varied`` workload by default (module docstring). The figures that compare:
    ``util_by_tier``, ``quota_error_mean``, ``preemption_lost_s`` (seconds preempted jobs had run, summed),
    ``preempted``, ``wait_s`` and ``longest_wait_s``."""
    return {name: run_scheduling(n, configs, duration_s=duration_s, seed=seed, workload=workload,
                                 predictions=with_, **kw)
            for name, with_ in (("without", False), ("with", True))}


class _Scheduling:
    """The state of :func:`run_scheduling` between its intervals, one method per step of an interval."""

    def __init__(self, n: int, configs: int, *, seed: int, band: tuple[float, float], interval_s: float,
                 refusal_rate: float, orphan_grace_s: float, adopt_grace_s: float, inventory: str = "random",
                 gangs: bool = True, workload: str = "exponential", predictions: bool = False,
                 gpu_max_percent: float = 80.0, catalog: Catalog | None = None,
                 stops: StopsConfig | None = None) -> None:
        self.rng = rng = random.Random(seed)
        fleet = seed003_fleet() if inventory == "seed003" else make_fleet(n, rng)
        ratio = gpu_max_percent / 100.0
        self.fleet = fleet = {nid: msgspec.structs.replace(v, node_class=v.node_class or _class_of(v),
                                                           vram_limit_ratio=ratio)
                              for nid, v in fleet.items()}
        self.catalog = catalog if catalog is not None else make_catalog(configs, gangs=gangs)
        if workload not in ("exponential", "varied"):
            raise ValueError(f"workload {workload!r}: exponential or varied")
        self.medians = _template_medians(self.catalog, random.Random(seed * 7919 + 1)) if workload == "varied" \
            else {}
        self.predictions = predictions
        self.predictor: PredictorLike | None = None
        self.predictor_at = -PREDICTOR_EVERY_S
        self.docs: dict[str, Any] = {}  # node -> its summary (UsageDoc), re-made when its runs changed
        self.summarised: dict[str, int] = {}  # node -> runs in its summary
        self.predictor_ms: list[float] = []  # each rebuild of the predictor, its figures merged
        self.band = band
        self.plan_ms: list[float] = []
        self.greedy_ms: list[float] = []
        self.sim = _Fleet(self.catalog, rng, interval_s=interval_s, adopt_grace_s=adopt_grace_s,
                          orphan_grace_s=orphan_grace_s, refusal_rate=refusal_rate,
                          durations={"selfplay": 600.0, "training": 2400.0, "evaluation": 400.0},
                          plan_fn=self._timed_plan, run_time=self._run_time if self.medians else None,
                          node_class={nid: v.node_class for nid, v in fleet.items()},
                          stops=SimStops(stops or StopsConfig(), self.catalog, seed=seed), band=band)
        self.sim.woken.update(fleet)  # no offer yet: each steps before the first plan
        self.stops: SimStops = self.sim.stops  # type: ignore[assignment]
        self.sim.signals = {}
        self.term = 1
        self.violations: list[str] = []
        self.counts = {"fenced": 0, "carried_over": 0, "double_training": 0}
        self.util_by_tier: dict[int, list[float]] = defaultdict(list)
        self.util_all: dict[int, list[float]] = defaultdict(list)  # every GPU at every interval (t >= 300 s)
        self.interval_s = interval_s
        self.quota_err: dict[str, list[float]] = defaultdict(list)
        self.longest_wait = 0.0
        self.waits_predicted = 0  # pending reasons "waits ~N s for <job> ... (predicted)", over every plan
        self.training_gpus = {False: 0.0, True: 0.0}  # GPUs training holds, summed per interval (t >= 300 s), by
        # whether its node is ephemeral: the share on durable nodes is [policy] stable's (issue 38)
        self.pending_prev: dict[str, tuple[float, float]] = {}  # template -> (its wait in the last plan, when)
        self.waits: dict[str, list[float]] = {"gang": [], "single": []}  # per placement: how long it had waited
        self.waiting: set[tuple[tuple[int, ...], float, float]] = set()  # (tiers, GPUs, VRAM GiB per GPU) of the
        # work the newest plan left waiting
        self.vram_committed: dict[int, list[float]] = defaultdict(list)  # per tier, each busy GPU at each interval
        self.stranded = 0  # GPU samples whose free share fits work that waits, at two samples in a row (t >= 300 s)
        self.strand_now: set[tuple[str, int]] = set()  # GPUs whose free share fits waiting work, this sample
        self.strand_last: set[tuple[str, int]] = set()  # the same at the last sample
        self.gpu_samples = 0
        self.leader = self._strongest()
        self.leaders_by_term = {self.term: self.leader}
        self.dead: dict[str, float] = {}
        self.tier_of = {nid: node_tier(v) for nid, v in fleet.items()}
        self.top_vram = {nid: max((usable_vram_gib(g.vram_gib, v.vram_limit_ratio) for g in v.gpus), default=0.0)
                         for nid, v in fleet.items()}  # usable VRAM of the node's biggest GPU
        self.tier1_gpus = sum(len(v.gpus) for nid, v in fleet.items() if self.tier_of[nid] == 1)

    def _timed_plan(self, view: ClusterView, *args: Any, **kwargs: Any) -> Plan:
        """The leader's plan, timed, with this run's predictor (None without predictions, whatever the core has)."""
        view = msgspec.structs.replace(view, predictor=self.predictor)
        t0 = time.perf_counter()
        try:
            return plan(view, *args, **kwargs)
        finally:
            self.plan_ms.append((time.perf_counter() - t0) * 1000.0)

    def _run_time(self, template: str, nid: str) -> float:
        """``varied`` workload: one run of ``template`` on node ``nid`` (module docstring), seconds."""
        return (self.medians[template] * TIER_SLOWDOWN[self.tier_of[nid]]
                * self.rng.lognormvariate(0.0, RUN_SPREAD))

    def refresh_predictor(self, t: float) -> None:
        """With predictions: the leader's predictor from every node's summary of its runs, rebuilt at most every
        :data:`PREDICTOR_EVERY_S` once runs ended since (a node's summary is made again only when it ran more)."""
        sim = self.sim
        if not self.predictions or sim.records_at <= self.predictor_at or t - self.predictor_at < PREDICTOR_EVERY_S:
            return
        for nid, runs in sim.records.items():
            if self.summarised.get(nid) != len(runs):
                self.docs[nid], self.summarised[nid] = summarize(nid, runs), len(runs)
        t0 = time.perf_counter()
        predictor = Predictor(dict(self.docs), self.catalog)
        for name in self.catalog.templates:  # its merged figures, built once (else in the next plan's time)
            predictor.predict(name)
        self.predictor_ms.append((time.perf_counter() - t0) * 1000.0)
        self.predictor, self.predictor_at = predictor, t

    def _strongest(self) -> str:
        fleet = self.fleet
        return max(fleet, key=lambda nid: (node_tier(fleet[nid]) == 1, sum(g.vram_gib for g in fleet[nid].gpus), nid))

    def change_signals(self) -> None:
        """A tenth of the configs get new signals."""
        rng, catalog = self.rng, self.catalog
        for cfg in rng.sample(catalog.configs, max(1, len(catalog.configs) // 10)):
            self.sim.signals[cfg] = Signals(cfg, rng.uniform(0.2, 2.0), rng.uniform(-5, 60), rng.uniform(0, 7200),
                                            rng.uniform(0.3, 1.0), rng.randrange(10**6))

    def members_at(self, t: float) -> dict[str, MemberJobs]:
        """Each node with the offers its core computed at its last step (:mod:`p2pnode.node._offer`; none while it
        drains), as the members the cores see; the dead ones too. Utilization per tier is recorded per GPU."""
        sim, by_node, templates = self.sim, self.sim.by_node(), self.catalog.templates
        per_gpu: dict[tuple[str, int], float] = defaultdict(float)
        share: dict[tuple[str, int], float] = defaultdict(float)  # fraction committed
        vram: dict[tuple[str, int], float] = defaultdict(float)  # VRAM committed, GiB
        for job in sim.jobs.values():
            for g in job.gpus:
                per_gpu[(job.node_id, g)] += job.fraction * job.load
                share[(job.node_id, g)] += job.fraction
                vram[(job.node_id, g)] += job.vram
            host, kind = self.fleet.get(job.node_id), templates[job.template].kind if job.template in templates else ""
            if t >= 300 and host is not None and kind == "training":
                self.training_gpus[host.ephemeral] += job.fraction * len(job.gpus)
        members: dict[str, MemberJobs] = {}
        self.strand_last, self.strand_now = self.strand_now, set()
        for nid, v in self.fleet.items():
            utils = [min(100.0, 100.0 * per_gpu[(nid, g.index)]) for g in v.gpus]
            members[nid] = self._member_now(nid, by_node[nid])
            if t >= 300 and self._work_waits_for(nid):  # the band is the target while work that fits the
                self.util_by_tier[self.tier_of[nid]].extend(utils)  # node waits (else its GPUs may rightly idle)
            if t >= 300:
                self.util_all[self.tier_of[nid]].extend(utils)
                self._vram_samples(nid, v, share, vram)
        for nid, since in self.dead.items():
            members[nid] = _member(nid, None, by_node[nid], set(), plan=sim.published.get(nid),
                                   state=MemberState.DEAD, since=since)
        return members

    def _member_now(self, nid: str, jobs: list[_Job]) -> MemberJobs:
        """Node ``nid`` as the others see it now: its view with the offers of its core's last step (none while it
        drains), its running ``jobs``, refusals, published plan and ended gang members."""
        sim, c = self.sim, self.sim.core(nid)
        draining = self.stops.draining(nid)  # a draining node asks for nothing
        view = msgspec.structs.replace(self.fleet[nid], offer=0 if draining else c.offer,
                                       cpu_offer=0 if draining else c.cpu_offer)
        return _member(nid, view, jobs, sim.refused[nid], plan=sim.published.get(nid), ended=sim.ended[nid])

    def _woken(self, lsh: Leadership, members: dict[str, MemberJobs], t: float) -> None:
        """The nodes with news (a job of theirs ended or was stopped; or never stepped) step before the leader
        plans, as the agent steps at a job's exit: their offers (and what they start on their part of the current
        plan) are what the leader sees now."""
        sim = self.sim
        woken = [nid for nid in self.fleet if nid in sim.woken and nid != lsh.leader]
        for nid in woken:
            sim.step(nid, lsh, [members[nid], members[lsh.leader]] if lsh.leader in members else [members[nid]], t)
        by_node = sim.by_node() if woken else {}
        for nid in woken:
            members[nid] = self._member_now(nid, by_node[nid])

    def _vram_samples(self, nid: str, v: NodeView, share: dict[tuple[str, int], float],
                      vram: dict[tuple[str, int], float]) -> None:
        """Per-GPU VRAM stranding of node ``nid`` now: each GPU holding work records its committed VRAM over its
        usable VRAM; a GPU whose free share (fraction and usable VRAM) fits work the newest plan left waiting, in
        a tier that work may use, and did at the last sample too (a plan came between: a job that ended just now
        is not counted before the leader could act), is a stranded sample."""
        tier = self.tier_of[nid]
        for g in v.gpus:
            key = (nid, g.index)
            usable = usable_vram_gib(g.vram_gib, v.vram_limit_ratio)
            self.gpu_samples += 1
            if share[key] > EPS and usable > 0:
                self.vram_committed[tier].append(min(1.0, vram[key] / usable))
            free_f, free_v = 1.0 - share[key], usable - vram[key]
            if free_f > EPS and any(tier in tiers and 0 < gpus <= free_f + EPS and need <= free_v + EPS
                                    for tiers, gpus, need in self.waiting):
                self.strand_now.add(key)
                self.stranded += key in self.strand_last

    def _work_waits_for(self, nid: str) -> bool:
        """Whether work the newest plan left waiting could run on node ``nid`` (its tier, a GPU big enough)."""
        tier, top = self.tier_of[nid], self.top_vram[nid]
        return any(tier in tiers and top + EPS >= vram for tiers, _gpus, vram in self.waiting)

    def election_interval(self, t: float) -> None:
        """The leader dies (kill -9: its processes are gone, its last plan still travels), and for this interval
        no plan of the new term exists yet. Half of the nodes already saw the next term and must ignore the dead
        leader's plan; the others still act on it (they saw no higher term)."""
        old, sim = self.leader, self.sim
        for jid in list(sim.on_node[old]):
            sim.remove(jid)
        self.fleet.pop(old)
        self.dead[old] = t
        self.term += 1
        self.leader = self._strongest()
        self.leaders_by_term[self.term] = self.leader
        members = self.members_at(t)
        for i, nid in enumerate(self.fleet):
            lsh = Leadership(old, self.term - 1, self.term if i % 2 else self.term - 1, False, self.leaders_by_term)
            if lsh.acting(sim.published.get(old)) is None:
                self.counts["fenced"] += 1
            sim.step(nid, lsh, [members[nid], members[old]], t)

    def interval(self, t: float) -> None:
        """The leader's core plans (when its cadence says so), every other node's core acts on its part."""
        sim, leader, term = self.sim, self.leader, self.term
        members = self.members_at(t)
        lsh = Leadership(leader, term, term, False, self.leaders_by_term)
        self._woken(lsh, members, t)
        previous = sim.published.get(leader)
        sim.step(leader, lsh, list(members.values()), t)
        r = sim.core(leader).last_result
        members[leader] = _member(leader, members[leader].view, sim.by_node()[leader], sim.refused[leader],
                                  plan=sim.published.get(leader))
        if r is not None and sim.published.get(leader) is not previous:
            self._record_plan(r, previous is None, t)
        for nid in self.fleet:
            if nid != leader:
                sim.step(nid, lsh, [members[nid], members[leader]], t)
        self._check(t)

    def _record_plan(self, r: LeadResult, first_of_term: bool, t: float) -> None:
        """A new plan: the greedy baseline timed on its view, its invariants, what it carried over."""
        t0 = time.perf_counter()
        greedy_first_fit(r.view, self.catalog, self.term)
        self.greedy_ms.append((time.perf_counter() - t0) * 1000.0)
        self.violations += [f"t={t:.0f}: {v}" for v in plan_violations(r.view, self.catalog, r.decision,
                                                                       term=self.term)]
        if first_of_term:
            self.counts["carried_over"] += sum(1 for a in r.section.assignments if a.term < self.term)
        placed = {a.template for a in r.decision.assignments}
        for name in placed:  # a placement waited since its template last waited (0: placed in its first plan)
            wait, at = self.pending_prev.get(name, (0.0, t))
            kind = "gang" if self.catalog.templates[name].gang is not None else "single"
            self.waits[kind].append(wait + (t - at) if name in self.pending_prev else 0.0)
        self.pending_prev = {p.template: (p.wait_s, t) for p in r.decision.pending if p.template not in placed}
        self.waits_predicted += sum(1 for p in r.decision.pending if p.reason.startswith("waits ~"))
        self.waiting = set()
        for pend in r.decision.pending:
            if pend.reason.startswith("a training job"):
                continue  # not waiting: its config is training
            self.longest_wait = max(self.longest_wait, pend.wait_s)
            tpl = self.catalog.templates[pend.template]
            vram = max(tpl.resources.vram_gib, self.catalog.vram_floor_gib(tpl.config))
            gpus = tpl.resources.num_gpus
            self.waiting.add((self.catalog.tiers_of(tpl), gpus, vram if gpus > 0 else 0.0))

    def _check(self, t: float) -> None:
        """No config trains twice; the quota error of the tier-1 GPUs."""
        catalog, jobs = self.catalog, self.sim.jobs
        training: dict[str, set[str]] = defaultdict(set)
        for j in jobs.values():
            if catalog.templates[j.template].kind == "training":  # a gang is one training job
                training[catalog.templates[j.template].config].add(j.gang.id if j.gang is not None else j.job_id)
        for cfg, units in training.items():
            k = len(units)
            if k > 1:
                self.counts["double_training"] += 1
                self.violations.append(f"t={t:.0f}: {k} training jobs of {cfg} running")
        if t >= 300 and self.tier1_gpus:
            used: dict[str, float] = defaultdict(float)
            for j in jobs.values():
                if self.tier_of.get(j.node_id) == 1:
                    used[catalog.templates[j.template].config] += j.fraction * len(j.gpus)
            for cfg in catalog.configs:
                self.quota_err[cfg].append(abs(used[cfg] / self.tier1_gpus - catalog.quota_for(cfg)))

    def report(self) -> dict[str, Any]:
        """The figures of the run (see :func:`run_scheduling`)."""
        band, plan_ms, greedy_ms = self.band, self.plan_ms, self.greedy_ms
        tiers = {}
        for tier, us in sorted(self.util_by_tier.items()):
            if not us:  # GPU-less nodes only (tier 4): no GPU to be busy
                continue
            mean = statistics.fmean(us)
            tiers[tier] = {"mean_util_percent": round(mean, 1), "in_band": band[0] <= mean <= band[1],
                           "samples": len(us)}
        q = [statistics.fmean(v) for v in self.quota_err.values()]
        return {
            "templates": len(self.catalog.templates),
            "plans": len(plan_ms),
            "plan_ms": {"median": round(statistics.median(plan_ms), 2),
                        "p99": round(_percentile(plan_ms, 0.99), 2), "max": round(max(plan_ms), 2)},
            "greedy_first_fit_ms": {"median": round(statistics.median(greedy_ms), 2),
                                    "p99": round(_percentile(greedy_ms, 0.99), 2)},
            "ratio_median_vs_greedy": round(statistics.median(plan_ms) / max(1e-9, statistics.median(greedy_ms)),
                                            2),
            "util_by_tier": tiers,
            "quota_error_mean": round(statistics.fmean(q), 4) if q else None,
            "quota_error_max": round(max(q), 4) if q else None,
            "longest_wait_s": self.longest_wait,
            "gang_templates": sum(1 for x in self.catalog.templates.values() if x.gang is not None),
            "wait_s": {kind: {"placements": len(ws), "p50": round(_percentile(ws, 0.5), 1),
                              "p99": round(_percentile(ws, 0.99), 1)} for kind, ws in self.waits.items()},
            "gangs_running_at_end": len({j.gang.id for j in self.sim.jobs.values() if j.gang is not None}),
            "violations": self.violations[:20],
            "violation_count": len(self.violations),
            "running_at_end": len(self.sim.jobs),
            "final_term": self.term,
            "refusals": self.sim.counts["refusals"],
            "preempted": self.sim.counts["preempted"],
            "preemption_lost_s": round(self.sim.lost_s, 1),
            "preemption_lost_gpu_s": round(self.sim.lost_gpu_s, 1),
            "util_all_by_tier": {tier: round(statistics.fmean(us), 1) for tier, us in sorted(self.util_all.items())
                                 if us},
            "useful_util_by_tier": self._useful_util(),
            "util_all_fleet": self._fleet_util(useful=False),
            "useful_util_fleet": self._fleet_util(useful=True),
            "predictor_build_ms": _times(self.predictor_ms) if self.predictor_ms else None,
            "waits_for_predicted_end": self.waits_predicted,
            "training_on_durable_percent": round(100.0 * self.training_gpus[False] / total_training, 1)
            if (total_training := sum(self.training_gpus.values())) else None,
            **self._stranding(),
            **self.counts,
            "stops_by_rule": dict(sorted(self.sim.by_rule.items())),
            "refusals_by_reason": dict(self.sim.refusal_reasons.most_common()),
            "drains": self.stops.report(),
            "transition_errors": self.sim.transition_errors(),
        }


    def _stranding(self) -> dict[str, Any]:
        """Per-GPU VRAM stranding from 300 s on (:meth:`_vram_samples`): the mean committed share of a busy GPU's
        usable VRAM per tier and fleet-wide (percent), the share of busy-GPU samples under 90 % committed, and the
        GPU samples with a free share that waiting work fits (``stranded_gpu_samples``, and its share of all)."""
        every = [x for xs in self.vram_committed.values() for x in xs]
        return {
            "vram_committed_percent_by_tier": {tier: round(100.0 * statistics.fmean(xs), 1)
                                               for tier, xs in sorted(self.vram_committed.items()) if xs},
            "vram_committed_percent": round(100.0 * statistics.fmean(every), 1) if every else None,
            "busy_gpus_under_90_percent": round(sum(1 for x in every if x < 0.9 - EPS) / len(every), 4)
            if every else None,
            "stranded_gpu_samples": self.stranded,
            "stranded_share": round(self.stranded / self.gpu_samples, 4) if self.gpu_samples else 0.0,
        }

    def _fleet_util(self, *, useful: bool) -> float:
        """Every GPU of the fleet at every interval from 300 s on, one mean (percent); ``useful``: less the busy
        time of work a preemption threw away (:meth:`_useful_util`, whichever tier ran it and runs it again)."""
        samples = [u for us in self.util_all.values() for u in us]
        if not samples:
            return 0.0
        lost = sum(max(0.0, stop - max(start, 300.0)) * load * 100.0 for _n, start, stop, load in self.sim.lost_runs)
        return round(statistics.fmean(samples) - (lost / (len(samples) * self.interval_s) if useful else 0.0), 2)

    def _useful_util(self) -> dict[int, float]:
        """Per tier, the utilization of every GPU (``util_all_by_tier``, percent, from 300 s on) less the part
        that ran work a preemption threw away (:attr:`_Fleet.lost_runs`: that busy time is run again, so it
        counts as utilization without producing anything; in the mean, a GPU sample is one GPU for one interval)."""
        lost: dict[int, float] = defaultdict(float)  # percent-GPU-seconds of work thrown away, from 300 s on
        for nid, start, stop, load in self.sim.lost_runs:
            lost[self.tier_of[nid]] += max(0.0, stop - max(start, 300.0)) * load * 100.0
        return {tier: round(statistics.fmean(us) - lost[tier] / (len(us) * self.interval_s), 1)
                for tier, us in sorted(self.util_all.items()) if us}


def _class_of(v: NodeView) -> str:
    """A simulated node's class (its GPUs carry no model name): ``"<count>x<GiB>G"`` of its biggest GPU."""
    if not v.gpus:
        return "cpu"
    return f"{len(v.gpus)}x{max(g.vram_gib for g in v.gpus):.0f}G"


def _template_medians(catalog: Catalog, rng: random.Random) -> dict[str, float]:
    """``varied`` workload: each template's median run time (seconds), log-uniform in its kind's range."""
    out = {}
    for name in sorted(catalog.templates):
        lo, hi = VARIED_MEDIANS_S.get(catalog.templates[name].kind, (300.0, 1200.0))
        out[name] = lo * (hi / lo) ** rng.random()
    return out


def _reports(node_jobs: list[_Job]) -> tuple:
    """A node's running jobs as its snapshot reports them (:meth:`LocalJob.report`, as the agent's)."""
    return tuple(_local(j).report() for j in node_jobs)


# 8-GPU boxes for the placement-rate experiment: (GPU VRAM GiB, cost per hour, ephemeral). Every GPU has at least
# 32 GiB, so two half-GPU jobs (16 GiB floor) share one and an empty fleet can be filled to the last GPU.
GPU_BOXES = ((80, 2.5, False), (80, 1.6, False), (48, 0.9, False), (46, 0.5, True), (32, 1.2, True))


def make_gpu_boxes(n: int, gpus: int, rng: random.Random) -> dict[str, NodeView]:
    """``n`` nodes of ``gpus`` GPUs each, shaped like :data:`GPU_BOXES` (seeded), offering two jobs per GPU (the
    most half-GPU jobs it can hold: node-side spawn limits are left out of the placement rate)."""
    nodes = {}
    for i in range(n):
        vram, cost, eph = rng.choice(GPU_BOXES)
        nid = f"b{i:05d}"
        nodes[nid] = NodeView(nid, tuple(GpuView(k, float(vram)) for k in range(gpus)),
                              frozenset({"ephemeral"} if eph else {"durable"}), cost, eph, offer=2 * gpus)
    return nodes


def run_placement_rate(
    n: int = 1000,
    gpus_per_node: int = 8,
    configs: int = 200,
    *,
    interval_s: float = 5.0,
    min_gap_s: float | None = PLAN_MIN_GAP_S,
    max_assignments: int | None = None,
    horizon_s: float = 900.0,
    seed: int = 0,
    refusal_rate: float = 0.01,
) -> dict:
    """How fast the leader fills an empty fleet of ``n`` × ``gpus_per_node`` GPUs (:func:`make_gpu_boxes`) from a
    catalog that can fill it (:func:`make_catalog` with 60 selfplay instances per config: more GPU demand than
    GPUs). Every node is driven by the agent's own :class:`p2pnode.node.JobCore` (planning, fencing, starts and
    refusals), and the leader's core says when it plans next (:meth:`~p2pnode.node.JobCore.next_deadline`): every
    ``interval_s`` and, unless ``min_gap_s`` is None, on demand (at least ``min_gap_s`` apart) when its last plan
    used its budget or a node refused work; nodes refuse ``refusal_rate`` of their assignments (re-placed under
    new ids).
    ``max_assignments``: the per-plan cap (None: :class:`SchedulerConfig`'s default). Jobs outlive the horizon,
    so the fleet is full when a plan finds nothing more to place (a few half GPUs may stay free once the
    half-GPU demand is placed: ``placed_gpu_share``). Virtual time; wall time only for plan times.

    Returns ``fully_placed_s`` (seconds from the leader's first plan to the last plan that placed work, once a
    later plan placed nothing; None if not within ``horizon_s``), plan times in ms (median, p99, max) of
    :func:`p2pnode.scheduler.plan` (``plan_ms``) and of the leader's whole step (``lead_ms``: carry-over, the
    plan section of every running job and acting on its own part besides), plans, the most placements in one
    plan, free whole GPUs at the end, refusals and every invariant violation
    (:func:`p2pnode.scheduler.plan_violations`)."""
    rng = random.Random(seed)
    fleet = make_gpu_boxes(n, gpus_per_node, rng)
    catalog = make_catalog(configs, selfplay_max_concurrency=60)
    total_gpus = sum(len(v.gpus) for v in fleet.values())
    cfg = SchedulerConfig(max_assignments=max_assignments) if max_assignments is not None else None
    plan_ms: list[float] = []

    def timed_plan(*args: Any, **kwargs: Any) -> Plan:
        t0 = time.perf_counter()
        try:
            return plan(*args, config=cfg, **kwargs)
        finally:
            plan_ms.append((time.perf_counter() - t0) * 1000.0)

    sim = _Fleet(catalog, rng, interval_s=interval_s, adopt_grace_s=30.0, orphan_grace_s=60.0,
                 refusal_rate=refusal_rate, durations={"selfplay": 1e9, "training": 1e9, "evaluation": 1e9},
                 plan_fn=timed_plan, min_gap_s=min_gap_s)
    sim.signals = {}
    leader = min(fleet)
    lsh = Leadership(leader, 1, 1, False, {1: leader})
    lead_ms: list[float] = []
    last_placing = 0.0
    per_plan: list[int] = []
    violations: list[str] = []
    fully_placed_s = None
    t = 0.0
    while t <= horizon_s:
        members = {m.origin: m for m in _members(sim, fleet)}
        before = sim.published.get(leader)
        t0 = time.perf_counter()
        sim.step(leader, lsh, list(members.values()), t)
        lead_ms.append((time.perf_counter() - t0) * 1000.0)
        r = sim.core(leader).last_result
        planned = r is not None and sim.published.get(leader) is not before
        members[leader] = _member(leader, fleet[leader], sim.by_node()[leader], sim.refused[leader],
                                  plan=sim.published.get(leader))
        for nid in fleet:
            if nid != leader:
                sim.step(nid, lsh, [members[nid], members[leader]], t)
        sim.step(leader, lsh, _members(sim, fleet), t)  # the refusals reach the leader: it plans again sooner
        if planned and r is not None:
            per_plan.append(len(r.decision.assignments))
            violations += [f"t={t:g}: {v}" for v in plan_violations(r.view, catalog, r.decision, term=1)]
            if r.decision.assignments:
                last_placing = t
            elif not r.decision.budget_used and t > 0:
                fully_placed_s = last_placing
                break
        t = max(sim.core(leader).next_deadline(), t + 1e-3)
    placed = sum(j.fraction * len(j.gpus) for j in sim.jobs.values())
    return {
        "nodes": n, "gpus": total_gpus, "configs": configs, "interval_s": interval_s, "min_gap_s": min_gap_s,
        "max_assignments": max_assignments or SchedulerConfig().max_assignments, "fully_placed_s": fully_placed_s,
        "placed_gpu_share": round(placed / total_gpus, 4), "jobs": len(sim.jobs), "plans": len(plan_ms),
        "most_placements_in_a_plan": max(per_plan, default=0), "free_whole_gpus": _free_whole_gpus(fleet, sim.jobs),
        "plan_ms": _times(plan_ms), "lead_ms": _times(lead_ms), "violations": violations[:20],
        "violation_count": len(violations), **sim.counts,
    }


def _members(sim: _Fleet, fleet: dict[str, NodeView]) -> list[MemberJobs]:
    """Every node of ``fleet`` as the others see it now (its running jobs, refusals and published plan)."""
    by_node = sim.by_node()
    return [_member(nid, v, by_node[nid], sim.refused[nid], plan=sim.published.get(nid)) for nid, v in fleet.items()]


def _times(ms: list[float]) -> dict:
    return {"median": round(statistics.median(ms), 2), "p99": round(_percentile(ms, 0.99), 2),
            "max": round(max(ms), 2)}


def _free_whole_gpus(fleet: dict[str, NodeView], jobs: dict[str, _Job]) -> int:
    used: dict[tuple[str, int], float] = defaultdict(float)
    for j in jobs.values():
        for g in j.gpus:
            used[(j.node_id, g)] += j.fraction
    return sum(1 for nid, v in fleet.items() for g in v.gpus if used[(nid, g.index)] <= 1e-9)
