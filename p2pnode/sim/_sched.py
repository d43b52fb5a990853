"""Scheduling scenario: a fleet shaped like seed 003's inventory, scaled to N nodes, a catalog of C configs,
jobs with durations, signals that change, and a leader failover in the middle. Pure and seeded (wall time is
measured only to report plan time).

Every plan interval each node's own PID controller turns its simulated GPU utilization into a capacity offer;
the leader plans; assignments start, jobs end after their sampled duration. Reported: plan time (median, p99)
beside a plain greedy first-fit planner timed on the same views, GPU utilization per tier against the target
band, quota error per config, the longest wait of any config, and every invariant violation (checked on each
plan with :func:`p2pnode.scheduler.plan_violations`).
"""

from __future__ import annotations

import random
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

from ..scheduler import (
    Assignment,
    CapacityController,
    ClusterView,
    GpuView,
    NodeView,
    Plan,
    SchedulerConfig,
    Signals,
    node_tier,
    parse_catalog,
    plan,
    plan_violations,
)
from ..scheduler._plan import PLAN_MIN_GAP_S, next_plan_at

__all__ = ["FLEET_MIX", "GPU_BOXES", "greedy_first_fit", "make_catalog", "make_fleet", "make_gpu_boxes",
           "run_placement_rate", "run_scheduling"]

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
    "tiers": {"training": [1, 2], "selfplay": [3, 2, 1], "evaluation": [2, 1, 3]},
    "priorities": {"training": "high", "evaluation": "high"},
}
"""The catalog ``[policy]`` of seed 003's boards, as in ``deploy/examples/catalog.toml``."""
LOAD = {"selfplay": 0.7, "training": 0.9, "evaluation": 0.6}
"""Simulated GPU utilization a job drives per unit of GPU it holds, by kind."""


def make_fleet(n: int, rng: random.Random) -> dict[str, NodeView]:
    """``n`` nodes shaped like :data:`FLEET_MIX` (seeded), as planner views."""
    nodes = {}
    for i in range(n):
        share, vram, cost, eph = rng.choices(FLEET_MIX, weights=[m[0] for m in FLEET_MIX])[0]
        nid = f"n{i:05d}"
        nodes[nid] = NodeView(nid, tuple(GpuView(k, float(v)) for k, v in enumerate(vram)),
                              frozenset({"ephemeral"} if eph else {"durable"}), cost, eph)
    return nodes


def make_catalog(configs: int, *, selfplay_max_concurrency: int = 6):
    """``configs`` configs over the four boards, each with selfplay (at most ``selfplay_max_concurrency``
    instances), training and evaluation templates."""
    jobs, quotas = [], {}
    for i in range(configs):
        board, gpus, vram = BOARDS[i % len(BOARDS)]
        cfg = f"{board}_{2 + i % 3}p_v{i}"
        jobs += [
            {"name": f"sp-{cfg}", "kind": "selfplay", "config": cfg, "argv": ["selfplay", "{config}"], "priority": 50,
             "autonomous": True, "max_concurrency": selfplay_max_concurrency,
             "resources": {"num_gpus": gpus, "vram_gib": vram}},
            {"name": f"tr-{cfg}", "kind": "training", "config": cfg, "argv": ["train", "{config}"], "priority": 70,
             "preemptible": False, "resources": {"num_gpus": 1, "vram_gib": max(16, vram * 2)}},
            {"name": f"ev-{cfg}", "kind": "evaluation", "config": cfg, "argv": ["eval", "{config}"], "priority": 60,
             "max_concurrency": 1, "resources": {"num_gpus": 0.5 if gpus < 1 else 1, "vram_gib": vram}},
        ]
        quotas[cfg] = (2.0 if board == "hexagonal" else 1.5 if board == "square19" else 1.0)
    total = sum(quotas.values())
    return parse_catalog({"job": jobs, "quotas": {k: v / total for k, v in quotas.items()}, "policy": POLICY})


def greedy_first_fit(view: ClusterView, catalog, term: int) -> Plan:
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
    out = []
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


@dataclass
class _Job:
    job_id: str
    template: str
    node_id: str
    gpus: tuple[int, ...]
    fraction: float
    vram: float
    ends_at: float
    load: float
    started_at: float = 0.0


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


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
) -> dict:
    """Run the scenario (see module docstring) and return its figures.

    Plans go through the agent's own code: the leader's :class:`p2pnode.node.Planner` (carry-over of the
    previous leader's plan, adoption grace), fencing by :func:`p2pnode.node._plans.acting_plan`, and each node's
    :func:`p2pnode.node.node_actions`. A node refuses an assignment with probability ``refusal_rate`` (as its
    guard would); the refusal is reported and the leader places the work again under a new id. At the failover
    the leader dies; for one interval half of the nodes have already seen the next term (they must ignore the
    dead leader's plan: counted in ``fenced``) while the others still act on it; the new leader carries its plan
    over, keeping the dead leader's jobs counted for ``orphan_grace_s``."""
    from ..node import MemberPlanInput, Planner
    from ..node._plans import acting_plan
    from ..snapshot import PlanSection

    rng = random.Random(seed)
    fleet = make_fleet(n, rng)
    catalog = make_catalog(configs)
    pids = {nid: CapacityController(band_min_percent=band[0], band_max_percent=band[1]) for nid in fleet}
    jobs: dict[str, _Job] = {}
    refused: dict[str, set[str]] = defaultdict(set)
    done: dict[str, set[str]] = defaultdict(set)
    planner = Planner(catalog, interval_s=interval_s, adopt_grace_s=adopt_grace_s)
    term = 1
    plan_ms, greedy_ms = [], []
    violations: list[str] = []
    counts = {"refusals": 0, "fenced": 0, "carried_over": 0, "double_training": 0}
    util_by_tier: dict[int, list[float]] = defaultdict(list)
    quota_err: dict[str, list[float]] = defaultdict(list)
    longest_wait = 0.0
    signals: dict[str, Signals] = {}
    leader = max(fleet, key=lambda nid: (node_tier(fleet[nid]) == 1, sum(g.vram_gib for g in fleet[nid].gpus), nid))
    dead: dict[str, float] = {}
    failover_at = duration_s / 2
    durations = {"selfplay": 600.0, "training": 2400.0, "evaluation": 400.0}
    tier_of = {nid: node_tier(v) for nid, v in fleet.items()}
    tier1_gpus = sum(len(v.gpus) for nid, v in fleet.items() if tier_of[nid] == 1)
    published: PlanSection | None = None  # the newest plan of an elected leader, as every node holds it
    t = 0.0
    while t < duration_s:
        for jid in [j for j, job in jobs.items() if job.ends_at <= t]:
            done[jobs[jid].node_id].add(jid)
            del jobs[jid]
        if t and t % 60 < interval_s:  # signals change over time
            for cfg in rng.sample(catalog.configs, max(1, len(catalog.configs) // 10)):
                signals[cfg] = Signals(cfg, rng.uniform(0.2, 2.0), rng.uniform(-5, 60), rng.uniform(0, 7200),
                                       rng.uniform(0.3, 1.0), rng.randrange(10**6))
        failover = failover_at <= t < failover_at + interval_s
        if failover:  # the leader dies (kill -9): its processes are gone, its last plan still travels
            for jid in [j for j, job in jobs.items() if job.node_id == leader]:
                del jobs[jid]
            fleet.pop(leader)
            pids.pop(leader)
            dead[leader] = t
            term += 1
            planner = Planner(catalog, interval_s=interval_s, adopt_grace_s=adopt_grace_s)  # a new node leads
            leader = max(fleet, key=lambda nid: (node_tier(fleet[nid]) == 1, sum(g.vram_gib for g in fleet[nid].gpus),
                                                 nid))
        # Each node: utilization from its jobs, PID offer.
        per_gpu: dict[tuple[str, int], float] = defaultdict(float)
        by_node: dict[str, list[_Job]] = defaultdict(list)
        for job in jobs.values():
            by_node[job.node_id].append(job)
            for g in job.gpus:
                per_gpu[(job.node_id, g)] += job.fraction * job.load
        members = []
        for nid, v in fleet.items():
            utils = [min(100.0, 100.0 * per_gpu[(nid, g.index)]) for g in v.gpus]
            util = sum(utils) / len(utils) if utils else 0.0
            idle = sum(1 for u in utils if u < 5.0)
            offer = pids[nid].update(util, gpus=len(v.gpus), idle_gpus=idle, level=0, now=t)
            view = NodeView(v.node_id, v.gpus, v.tags, v.cost_per_hour, v.ephemeral, offer)
            members.append(MemberPlanInput(nid, view, _reports(by_node[nid], term), frozenset(refused[nid])))
            if t >= 300:
                util_by_tier[tier_of[nid]].append(util)
        for nid, since in dead.items():
            if t - since < orphan_grace_s:
                members.append(MemberPlanInput(nid, None, _reports(by_node[nid], term)))
        if failover:
            # The interval of the election: no plan of the new term yet. Half of the nodes already saw the next
            # term and must ignore the dead leader's plan; the others still act on it (they saw no higher term).
            for i, nid in enumerate(fleet):
                fenced = acting_plan(published, leader_term=term - 1, highest_term=term if i % 2 else term - 1)
                if fenced is None:
                    counts["fenced"] += 1
                else:
                    _act(fenced, nid, jobs, by_node[nid], done[nid], refused[nid], catalog, t, adopt_grace_s,
                         rng, 0.0, durations, counts)
            t += interval_s
            continue
        t0 = time.perf_counter()
        r = planner.lead(term, members, published, signals, t, t)
        plan_ms.append((time.perf_counter() - t0) * 1000.0)
        t0 = time.perf_counter()
        greedy_first_fit(r.view, catalog, term)
        greedy_ms.append((time.perf_counter() - t0) * 1000.0)
        violations += [f"t={t:.0f}: {v}" for v in plan_violations(r.view, catalog, r.decision, term=term)]
        if published is not None and published.term < term:
            counts["carried_over"] += sum(1 for a in r.section.assignments if a.term < term)
        published = r.section
        for nid in fleet:
            p = acting_plan(published, leader_term=term, highest_term=term)
            assert p is not None
            _act(p, nid, jobs, by_node[nid], done[nid], refused[nid], catalog, t, adopt_grace_s, rng, refusal_rate,
                 durations, counts)
        training: dict[str, int] = defaultdict(int)
        for j in jobs.values():
            if catalog.templates[j.template].kind == "training":
                training[catalog.templates[j.template].config] += 1
        for cfg, k in training.items():
            if k > 1:
                counts["double_training"] += 1
                violations.append(f"t={t:.0f}: {k} training jobs of {cfg} running")
        for pend in r.decision.pending:
            if pend.reason.startswith("a training job"):
                continue  # not waiting: its config is training
            longest_wait = max(longest_wait, pend.wait_s)
        if t >= 300 and tier1_gpus:
            used: dict[str, float] = defaultdict(float)
            for j in jobs.values():
                if tier_of.get(j.node_id) == 1:
                    used[catalog.templates[j.template].config] += j.fraction * len(j.gpus)
            for cfg in catalog.configs:
                quota_err[cfg].append(abs(used[cfg] / tier1_gpus - catalog.quota_for(cfg)))
        t += interval_s
    tiers = {}
    for tier, us in sorted(util_by_tier.items()):
        mean = statistics.fmean(us)
        tiers[tier] = {"mean_util_percent": round(mean, 1), "in_band": band[0] <= mean <= band[1],
                       "samples": len(us)}
    q = [statistics.fmean(v) for v in quota_err.values()]
    return {
        "nodes": n,
        "configs": configs,
        "templates": len(catalog.templates),
        "duration_s": duration_s,
        "interval_s": interval_s,
        "plans": len(plan_ms),
        "plan_ms": {"median": round(statistics.median(plan_ms), 2), "p99": round(_percentile(plan_ms, 0.99), 2),
                    "max": round(max(plan_ms), 2)},
        "greedy_first_fit_ms": {"median": round(statistics.median(greedy_ms), 2),
                                "p99": round(_percentile(greedy_ms, 0.99), 2)},
        "ratio_median_vs_greedy": round(statistics.median(plan_ms) / max(1e-9, statistics.median(greedy_ms)), 2),
        "util_by_tier": tiers,
        "quota_error_mean": round(statistics.fmean(q), 4) if q else None,
        "quota_error_max": round(max(q), 4) if q else None,
        "longest_wait_s": longest_wait,
        "starvation_cap_s": starvation_cap_s,
        "violations": violations[:20],
        "violation_count": len(violations),
        "running_at_end": len(jobs),
        "final_term": term,
        **counts,
    }


def _reports(node_jobs: list[_Job], term: int) -> tuple:
    """A node's running jobs as its snapshot reports them."""
    from ..snapshot import JobReport

    return tuple(JobReport(job_id=j.job_id, template=j.template, gpus=list(j.gpus), gpu_fraction=j.fraction,
                           vram_gib=j.vram, term=term) for j in node_jobs)


def _act(p, nid: str, jobs: dict, node_jobs: list[_Job], done: set[str], refused: set[str], catalog, t: float,
         adopt_grace_s: float, rng: random.Random, refusal_rate: float, durations: dict, counts: dict) -> None:
    """Node ``nid`` acts on plan ``p`` with the agent's rule (:func:`p2pnode.node.node_actions`); the guard
    refuses an assignment with probability ``refusal_rate``."""
    from ..node import node_actions

    running = {j.job_id: j.started_at for j in node_jobs}
    starts, stops = node_actions(p, nid, running, done | refused, catalog.templates, t, adopt_grace_s)
    for job_id, _reason in stops:
        jobs.pop(job_id, None)
        done.add(job_id)
    for a in starts:
        if rng.random() < refusal_rate:
            refused.add(a.job_id)
            counts["refusals"] += 1
            continue
        kind = catalog.templates[a.template].kind
        jobs[a.job_id] = _Job(a.job_id, a.template, nid, tuple(a.gpus), a.gpu_fraction, a.vram_gib,
                              t + rng.expovariate(1.0 / durations.get(kind, 600.0)), LOAD.get(kind, 0.7), t)


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


@contextmanager
def _timed_plan(max_assignments: int | None, times_ms: list[float]):
    """Run the leader's :class:`p2pnode.node.Planner` with a per-plan cap (None: the default; another cap gives
    a baseline measured in the same run) and time each :func:`p2pnode.scheduler.plan` call into ``times_ms``.
    ``Planner.lead`` takes no scheduler config, so the sim swaps the ``plan`` it calls for the duration."""
    from ..node import _plans

    cfg = SchedulerConfig(max_assignments=max_assignments) if max_assignments is not None else None

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return plan(*args, config=cfg, **kwargs)
        finally:
            times_ms.append((time.perf_counter() - t0) * 1000.0)

    saved = _plans.plan
    _plans.plan = timed  # type: ignore[assignment]
    try:
        yield
    finally:
        _plans.plan = saved  # type: ignore[assignment]


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
    GPUs). Plans go through the agent's :class:`p2pnode.node.Planner`, fencing and :func:`node_actions`; nodes
    refuse ``refusal_rate`` of their assignments (re-placed under new ids). The leader plans every
    ``interval_s`` and, unless ``min_gap_s`` is None, on demand by :func:`p2pnode.scheduler._plan.next_plan_at`
    (at least ``min_gap_s`` apart) when its last plan used its budget or a node refused work.
    ``max_assignments``: the per-plan cap (None: :class:`SchedulerConfig`'s default). Jobs outlive the horizon,
    so the fleet is full when a plan finds nothing more to place (a few half GPUs may stay free once the
    half-GPU demand is placed: ``placed_gpu_share``). Virtual time; wall time only for plan times.

    Returns ``fully_placed_s`` (seconds from the leader's first plan to the last plan that placed work, once a
    later plan placed nothing; None if not within ``horizon_s``), plan times in ms (median, p99, max) of
    :func:`p2pnode.scheduler.plan` (``plan_ms``) and of the whole ``Planner.lead`` (``lead_ms``: carry-over
    and the plan section of every running job besides), plans, the most placements in one plan, free whole
    GPUs at the end, refusals and every invariant violation (:func:`p2pnode.scheduler.plan_violations`)."""
    from ..node import MemberPlanInput, Planner
    from ..node._plans import acting_plan
    from ..snapshot import PlanSection

    rng = random.Random(seed)
    fleet = make_gpu_boxes(n, gpus_per_node, rng)
    catalog = make_catalog(configs, selfplay_max_concurrency=60)
    total_gpus = sum(len(v.gpus) for v in fleet.values())
    planner = Planner(catalog, interval_s=interval_s)
    jobs: dict[str, _Job] = {}
    refused: dict[str, set[str]] = defaultdict(set)
    done: dict[str, set[str]] = defaultdict(set)
    counts = {"refusals": 0}
    plan_ms: list[float] = []
    lead_ms: list[float] = []
    last_placing = 0.0
    per_plan: list[int] = []
    violations: list[str] = []
    published: PlanSection | None = None
    durations = {"selfplay": 1e9, "training": 1e9, "evaluation": 1e9}
    fully_placed_s = None
    t = 0.0
    with _timed_plan(max_assignments, plan_ms):
        while t <= horizon_s:
            by_node: dict[str, list[_Job]] = defaultdict(list)
            for job in jobs.values():
                by_node[job.node_id].append(job)
            members = [MemberPlanInput(nid, v, _reports(by_node[nid], 1), frozenset(refused[nid]))
                       for nid, v in fleet.items()]
            t0 = time.perf_counter()
            r = planner.lead(1, members, published, {}, t, t)
            lead_ms.append((time.perf_counter() - t0) * 1000.0)
            per_plan.append(len(r.decision.assignments))
            violations += [f"t={t:g}: {v}" for v in plan_violations(r.view, catalog, r.decision, term=1)]
            published = r.section
            before = counts["refusals"]
            for nid in fleet:
                p = acting_plan(published, leader_term=1, highest_term=1)
                assert p is not None
                _act(p, nid, jobs, by_node[nid], done[nid], refused[nid], catalog, t, 30.0, rng, refusal_rate,
                     durations, counts)
            if r.decision.assignments:
                last_placing = t
            elif not r.decision.budget_used and t > 0:
                fully_placed_s = last_placing
                break
            if min_gap_s is None:
                t += interval_s
            else:
                t = next_plan_at(t, interval_s=interval_s, min_gap_s=min_gap_s, budget_used=r.decision.budget_used,
                                 capacity_changed_at=t if counts["refusals"] > before else None)
    placed = sum(j.fraction * len(j.gpus) for j in jobs.values())
    return {
        "nodes": n,
        "gpus": total_gpus,
        "configs": configs,
        "interval_s": interval_s,
        "min_gap_s": min_gap_s,
        "max_assignments": max_assignments or SchedulerConfig().max_assignments,
        "fully_placed_s": fully_placed_s,
        "placed_gpu_share": round(placed / total_gpus, 4),
        "jobs": len(jobs),
        "plans": len(plan_ms),
        "most_placements_in_a_plan": max(per_plan, default=0),
        "free_whole_gpus": _free_whole_gpus(fleet, jobs),
        "plan_ms": _times(plan_ms),
        "lead_ms": _times(lead_ms),
        "violations": violations[:20],
        "violation_count": len(violations),
        **counts,
    }


def _times(ms: list[float]) -> dict:
    return {"median": round(statistics.median(ms), 2), "p99": round(_percentile(ms, 0.99), 2),
            "max": round(max(ms), 2)}


def _free_whole_gpus(fleet: dict[str, NodeView], jobs: dict[str, _Job]) -> int:
    used: dict[tuple[str, int], float] = defaultdict(float)
    for j in jobs.values():
        for g in j.gpus:
            used[(j.node_id, g)] += j.fraction
    return sum(1 for nid, v in fleet.items() for g in v.gpus if used[(nid, g.index)] <= 1e-9)
