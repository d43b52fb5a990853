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
from dataclasses import dataclass

from ..scheduler import (
    Assignment,
    CapacityController,
    ClusterView,
    GpuView,
    NodeView,
    Plan,
    RunningJob,
    SchedulerState,
    Signals,
    node_tier,
    parse_catalog,
    plan,
    plan_violations,
    vram_floor_gib,
)

__all__ = ["FLEET_MIX", "greedy_first_fit", "make_catalog", "make_fleet", "run_scheduling"]

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
LOAD = {"selfplay": 0.7, "training": 0.9, "evaluation": 0.6}
"""Simulated GPU utilization a job drives per unit of GPU it holds, by kind."""


def make_fleet(n: int, rng: random.Random) -> dict[str, NodeView]:
    nodes = {}
    for i in range(n):
        share, vram, cost, eph = rng.choices(FLEET_MIX, weights=[m[0] for m in FLEET_MIX])[0]
        nid = f"n{i:05d}"
        nodes[nid] = NodeView(nid, tuple(GpuView(k, float(v)) for k, v in enumerate(vram)),
                              frozenset({"ephemeral"} if eph else {"durable"}), cost, eph)
    return nodes


def make_catalog(configs: int):
    """``configs`` configs over the four boards, each with selfplay, training and evaluation templates."""
    jobs, quotas = [], {}
    for i in range(configs):
        board, gpus, vram = BOARDS[i % len(BOARDS)]
        cfg = f"{board}_{2 + i % 3}p_v{i}"
        jobs += [
            {"name": f"sp-{cfg}", "kind": "selfplay", "config": cfg, "argv": ["selfplay", "{config}"], "priority": 50,
             "autonomous": True, "max_concurrency": 6, "resources": {"num_gpus": gpus, "vram_gib": vram}},
            {"name": f"tr-{cfg}", "kind": "training", "config": cfg, "argv": ["train", "{config}"], "priority": 70,
             "preemptible": False, "resources": {"num_gpus": 1, "vram_gib": max(16, vram * 2)}},
            {"name": f"ev-{cfg}", "kind": "evaluation", "config": cfg, "argv": ["eval", "{config}"], "priority": 60,
             "max_concurrency": 1, "resources": {"num_gpus": 0.5 if gpus < 1 else 1, "vram_gib": vram}},
        ]
        quotas[cfg] = (2.0 if board == "hexagonal" else 1.5 if board == "square19" else 1.0)
    total = sum(quotas.values())
    return parse_catalog({"job": jobs, "quotas": {k: v / total for k, v in quotas.items()}})


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
        need = max(t.resources.vram_gib, vram_floor_gib(t.config))
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
) -> dict:
    """Run the scenario (see module docstring) and return its figures."""
    rng = random.Random(seed)
    fleet = make_fleet(n, rng)
    catalog = make_catalog(configs)
    pids = {nid: CapacityController(band_min_percent=band[0], band_max_percent=band[1]) for nid in fleet}
    jobs: dict[str, _Job] = {}
    state = SchedulerState()
    term = 1
    plan_ms, greedy_ms = [], []
    violations: list[str] = []
    util_by_tier: dict[int, list[float]] = defaultdict(list)
    quota_err: dict[str, list[float]] = defaultdict(list)
    longest_wait = 0.0
    signals: dict[str, Signals] = {}
    leader = max(fleet, key=lambda nid: (node_tier(fleet[nid]) == 1, sum(g.vram_gib for g in fleet[nid].gpus), nid))
    failover_at = duration_s / 2
    durations = {"selfplay": 600.0, "training": 2400.0, "evaluation": 400.0}
    tier_of = {nid: node_tier(v) for nid, v in fleet.items()}
    tier1_gpus = sum(len(v.gpus) for nid, v in fleet.items() if tier_of[nid] == 1)
    t = 0.0
    while t < duration_s:
        for jid in [j for j, job in jobs.items() if job.ends_at <= t]:
            del jobs[jid]
        if t and t % 60 < interval_s:  # signals change over time
            for cfg in rng.sample(catalog.configs, max(1, len(catalog.configs) // 10)):
                signals[cfg] = Signals(cfg, rng.uniform(0.2, 2.0), rng.uniform(-5, 60), rng.uniform(0, 7200),
                                       rng.uniform(0.3, 1.0), rng.randrange(10**6))
        failover = failover_at <= t < failover_at + interval_s
        if failover:  # the leader dies: its jobs are lost, a new leader (new term) starts without the old state
            for jid in [j for j, job in jobs.items() if job.node_id == leader]:
                del jobs[jid]
            fleet.pop(leader)
            pids.pop(leader)
            term += 1
            state = SchedulerState()
        # Each node: utilization from its jobs, PID offer.
        per_gpu: dict[tuple[str, int], float] = defaultdict(float)
        for job in jobs.values():
            for g in job.gpus:
                per_gpu[(job.node_id, g)] += job.fraction * job.load
        nodes = {}
        queued_tiers = set()
        for nid, v in fleet.items():
            utils = [min(100.0, 100.0 * per_gpu[(nid, g.index)]) for g in v.gpus]
            util = sum(utils) / len(utils) if utils else 0.0
            idle = sum(1 for u in utils if u < 5.0)
            offer = pids[nid].update(util, gpus=len(v.gpus), idle_gpus=idle, level=0, now=t)
            nodes[nid] = NodeView(v.node_id, v.gpus, v.tags, v.cost_per_hour, v.ephemeral, offer)
            if t >= 300:
                util_by_tier[tier_of[nid]].append(util)
        running = tuple(RunningJob(j.job_id, j.template, j.node_id, j.gpus, j.fraction, j.vram) for j in jobs.values())
        view = ClusterView(nodes, running)
        if failover:
            t += interval_s  # no plan in the interval of the election
            continue
        t0 = time.perf_counter()
        p = plan(view, catalog, signals, t, term=term, state=state, seed=seed * 1_000_003 + int(t))
        plan_ms.append((time.perf_counter() - t0) * 1000.0)
        t0 = time.perf_counter()
        greedy_first_fit(view, catalog, term)
        greedy_ms.append((time.perf_counter() - t0) * 1000.0)
        violations += [f"t={t:.0f}: {v}" for v in plan_violations(view, catalog, p, term=term)]
        for s in p.stops:
            jobs.pop(s.job_id, None)
        for a in p.assignments:
            kind = catalog.templates[a.template].kind
            jobs[a.job_id] = _Job(a.job_id, a.template, a.node_id, a.gpus, a.gpu_fraction, a.vram_gib,
                                  t + rng.expovariate(1.0 / durations.get(kind, 600.0)), LOAD.get(kind, 0.7))
        for pend in p.pending:
            if pend.reason.startswith("a training job"):
                continue  # not waiting: its config is training
            longest_wait = max(longest_wait, pend.wait_s)
            queued_tiers.update((1, 2, 3))
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
    }
