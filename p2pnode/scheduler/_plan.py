"""The planner: cluster view + catalog + signals -> a plan (assignments, preemptions, pending reasons). Pure.

``plan(view, catalog, signals, now, term=..., state=...)`` is deterministic for a given ``seed``. It:

1. accounts what runs: GPU fractions and VRAM per GPU, offers left per node, instances per template, tier-1 GPU
   share per config (quotas) and GPU share per kind (mix);
2. scores every template that wants more instances (:mod:`._weights`) and places instances best-first with a
   lazy greedy queue (a popped template is re-scored; if it fell below the next one it goes back);
3. places an instance on the best feasible node: VRAM floor per config, tier preference per kind, hard
   affinities, strict strategies, the node's capacity offer and degradation level, at most one training job per
   config cluster-wide; nodes are scored on tier rank, stranded GPU time (a fraction left free with too little
   VRAM to use, which can send work one tier further), provider (training avoids ephemeral, selfplay prefers
   cheap), strategy (pack/spread), soft affinity and colocation. Like Nomad's limit iterator, only up to
   ``candidates`` feasible nodes per tier are scored, so a plan costs O(placements × candidates), not O(N);
4. preempts, when nothing fits, a preemptible running job at least ``preemption_gap`` priority points below
   (Nomad's rule), with ``grace_s``;
5. leaves every unplaced template with the reason.

Tiers (seed 003): tier 1 has a GPU with >= 80 GiB or >= 192 GiB on the node, tier 2 a GPU with >= 32 GiB,
tier 3 a GPU with >= 8 GiB; tier 4 is anything smaller (or no GPU).
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..guard import MIN_PRIORITY, OperationPriority, may_start
from ._catalog import Catalog, JobTemplate
from ._signals import NEUTRAL, Signals
from ._weights import FactorWeights, _deficit, _factor_weight, factors, score

__all__ = [
    "Assignment",
    "ClusterView",
    "GpuView",
    "NodeView",
    "Pending",
    "Plan",
    "RunningJob",
    "SchedulerConfig",
    "SchedulerState",
    "Stop",
    "TIER_BY_KIND",
    "node_tier",
    "plan",
    "vram_floor_gib",
]

VRAM_FLOORS_GIB = (("hexagonal", 32.0), ("square19", 16.0), ("square8", 8.0), ("hex8", 8.0))
"""Seed 003's board-to-GPU matching: the VRAM a config needs at least, by config name prefix."""

TIER_BY_KIND = {"training": (1, 2), "selfplay": (3, 2, 1), "evaluation": (2, 1, 3)}
"""Tier preference per kind (seed 003); other kinds: (1, 2, 3). Training never goes below tier 2."""

KIND_PRIORITY = {"training": OperationPriority.HIGH, "evaluation": OperationPriority.HIGH}
"""Guard priority of a kind's work (others: NORMAL): what a node's degradation level admits."""


def vram_floor_gib(config: str) -> float:
    """The VRAM floor of ``config`` (0 when no rule matches)."""
    return next((v for prefix, v in VRAM_FLOORS_GIB if config.startswith(prefix)), 0.0)


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    vram_gib: float


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the planner sees it: GPUs, tags, provider facts, offer (jobs it accepts now) and guard state."""

    node_id: str
    gpus: tuple[GpuView, ...]
    tags: frozenset[str] = frozenset()
    cost_per_hour: float = 0.0
    ephemeral: bool = False
    offer: int = 0
    level: int = 0
    disk_percent: float = 0.0
    disk_max_percent: float = 70.0
    cpus: float = 0.0
    """CPUs the node gives to jobs (0: not accounted)."""
    memory_gib: float = 0.0
    """Memory the node gives to jobs, GiB (0: not accounted)."""
    custom: tuple[tuple[str, float], ...] = ()
    """Custom resources (Ray's sense), e.g. ``(("nvlink", 1.0),)``; a job requesting one needs it here."""
    vram_limit_ratio: float = 1.0
    """Share of each GPU's VRAM the planner may commit (the guard's GPU memory limit, e.g. 0.8)."""


def node_tier(n: NodeView) -> int:
    """Tier 1-4 of a node (see module docstring)."""
    top = max((g.vram_gib for g in n.gpus), default=0.0)
    if top >= 80 or sum(g.vram_gib for g in n.gpus) >= 192:
        return 1
    if top >= 32:
        return 2
    if top >= 8:
        return 3
    return 4


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job instance running (or assigned) somewhere: which GPUs, what fraction of each, VRAM per GPU."""

    job_id: str
    template: str
    node_id: str
    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 0.0
    vram_gib: float = 0.0
    started_at: float = 0.0
    term: int = 0


@dataclass(frozen=True)
class ClusterView:
    nodes: dict[str, NodeView]
    running: tuple[RunningJob, ...] = ()


@dataclass(frozen=True, slots=True)
class Assignment:
    job_id: str
    template: str
    node_id: str
    gpus: tuple[int, ...]
    gpu_fraction: float
    vram_gib: float
    params: tuple[tuple[str, Any], ...]
    term: int
    score: float


@dataclass(frozen=True, slots=True)
class Stop:
    job_id: str
    node_id: str
    reason: str
    grace_s: float


@dataclass(frozen=True, slots=True)
class Pending:
    template: str
    reason: str
    wait_s: float


@dataclass(frozen=True)
class Plan:
    """A leader's decision for ``term`` (the fencing token): start these, stop those, and why the rest wait."""

    term: int
    computed_at: float
    assignments: tuple[Assignment, ...]
    stops: tuple[Stop, ...]
    pending: tuple[Pending, ...]


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Planner knobs. ``starvation_cap_s``: wait at which the starvation factor is full; ``candidates``: feasible
    nodes scored per tier (Nomad-style limit); ``preemption_gap``: priority points (Nomad: 10)."""

    weights: FactorWeights = field(default_factory=FactorWeights)
    starvation_cap_s: float = 1800.0
    candidates: int = 8
    preemption_gap: int = 10
    grace_s: float = 30.0
    max_assignments: int = 128
    score_tolerance: float = 0.002
    """Lazy greedy: a re-scored template is placed if within this of the next stale score (scores are 0-1)."""
    """Placements per plan at most (the rest wait for the next plan): bounds a plan's time, as a scheduler pass."""


@dataclass
class SchedulerState:
    """What the planner remembers between plans: since when each template has been waiting (monotonic s)."""

    pending_since: dict[str, float] = field(default_factory=dict)
    job_seq: int = 0


class _Node:
    """Mutable free capacity of one node during planning."""

    __slots__ = ("view", "tier", "offer_left", "frac_free", "vram_free", "templates", "groups", "jobs",
                 "best_vram", "best_frac", "whole_free", "whole_vram", "min_priority", "cpus", "memory", "custom")

    def __init__(self, v: NodeView) -> None:
        self.view = v
        self.tier = node_tier(v)
        self.offer_left = v.offer
        self.frac_free = {g.index: 1.0 for g in v.gpus}
        self.vram_free = {g.index: g.vram_gib * v.vram_limit_ratio for g in v.gpus}
        self.templates: dict[str, int] = defaultdict(int)
        self.groups: set[str] = set()
        self.jobs = 0
        self.min_priority = MIN_PRIORITY[max(0, min(4, v.level))]
        self.cpus = v.cpus
        self.memory = v.memory_gib
        self.custom = dict(v.custom)
        self._refresh()

    def use(self, t: JobTemplate, sign: float = 1.0) -> None:
        """Account (or, with ``sign=-1``, release) a template's CPUs, memory and custom resources."""
        r = t.resources
        self.cpus -= sign * r.num_cpus
        self.memory -= sign * r.memory_gib
        for name, amount in r.custom:
            self.custom[name] = self.custom.get(name, 0.0) - sign * amount

    def _refresh(self) -> None:
        """Summaries that let most nodes be rejected without looking at their GPUs."""
        self.best_vram = max((self.vram_free[i] for i, f in self.frac_free.items() if f > 1e-9), default=0.0)
        self.best_frac = max(self.frac_free.values(), default=0.0)
        whole = [self.vram_free[i] for i, f in self.frac_free.items() if f >= 1.0 - 1e-9]
        self.whole_free = len(whole)
        self.whole_vram = max(whole, default=0.0)

    def take(self, gpus: tuple[int, ...], fraction: float, vram: float, *, refresh: bool = True) -> None:
        for i in gpus:
            if i in self.frac_free:
                self.frac_free[i] -= fraction
                self.vram_free[i] -= vram
        if refresh:
            self._refresh()

    def could_fit(self, num_gpus: float, vram: float) -> bool:
        """Cheap necessary condition for :meth:`fit`."""
        if num_gpus <= 0:
            return True
        if num_gpus < 1:
            return self.best_vram + 1e-9 >= vram and self.best_frac + 1e-9 >= num_gpus
        return self.whole_free >= int(num_gpus) and self.whole_vram + 1e-9 >= vram

    def fit(self, num_gpus: float, vram: float) -> tuple[tuple[int, ...], float] | None:
        """GPU indices (and the fraction of each) for a request, or None. Fractions go to the fullest GPU that
        still fits (best fit keeps whole GPUs free); whole GPUs must be entirely free."""
        if num_gpus <= 0:
            return (), 0.0
        if num_gpus < 1:
            best = None
            for i, f in self.frac_free.items():
                if f + 1e-9 >= num_gpus and self.vram_free[i] + 1e-9 >= vram:
                    if best is None or f < self.frac_free[best]:
                        best = i
            return ((best,), num_gpus) if best is not None else None
        free = [i for i, f in self.frac_free.items() if f >= 1.0 - 1e-9 and self.vram_free[i] + 1e-9 >= vram]
        k = int(num_gpus)
        return (tuple(sorted(free)[:k]), 1.0) if len(free) >= k else None


def _kind_priority(kind: str) -> OperationPriority:
    return KIND_PRIORITY.get(kind, OperationPriority.NORMAL)


def plan(
    view: ClusterView,
    catalog: Catalog,
    signals: dict[str, Signals],
    now: float,
    *,
    term: int,
    state: SchedulerState | None = None,
    config: SchedulerConfig | None = None,
    seed: int = 0,
    autonomous_only: bool = False,
) -> Plan:
    """Compute a plan (see module docstring). ``autonomous_only`` restricts to templates marked ``autonomous``
    (what nodes run without a leader). ``state`` is updated in place (waiting times)."""
    state = state if state is not None else SchedulerState()
    cfg = config or SchedulerConfig()
    rng = random.Random(seed)
    nodes = {nid: _Node(v) for nid, v in view.nodes.items()}
    by_tier: dict[int, list[_Node]] = defaultdict(list)
    for n in sorted(nodes.values(), key=lambda n: n.view.node_id):
        by_tier[n.tier].append(n)
    tier1_gpus = sum(len(n.view.gpus) for n in by_tier.get(1, []))
    tier_max_vram = {k: max((g.vram_gib for n in v for g in n.view.gpus), default=0.0) for k, v in by_tier.items()}
    # Only nodes offering work and holding some free GPU room are ever candidates.
    by_tier = defaultdict(list, {k: [n for n in v if n.offer_left > 0] for k, v in by_tier.items()})

    # 1. What runs.
    instances: dict[str, int] = defaultdict(int)
    training_on: dict[str, str] = {}
    tier1_used: dict[str, float] = defaultdict(float)
    kind_used: dict[str, float] = defaultdict(float)
    used_total = 0.0
    stops: list[Stop] = []
    running_by_node: dict[str, list[RunningJob]] = defaultdict(list)
    for r in view.running:
        t = catalog.templates.get(r.template)
        n = nodes.get(r.node_id)
        if t is None:
            stops.append(Stop(r.job_id, r.node_id, f"template {r.template!r} is no longer in the catalog", cfg.grace_s))
            continue
        instances[t.name] += 1
        gpu_time = r.gpu_fraction * len(r.gpus)
        used_total += gpu_time
        kind_used[t.kind] += gpu_time
        if t.kind == "training":
            training_on[t.config] = r.node_id
        if n is not None:
            n.take(r.gpus, r.gpu_fraction, r.vram_gib, refresh=False)
            n.use(t)
            n.templates[t.name] += 1
            n.jobs += 1
            if t.placement.colocation_group:
                n.groups.add(t.placement.colocation_group)
            running_by_node[n.view.node_id].append(r)
            if n.tier == 1:
                tier1_used[t.config] += gpu_time
    for n in running_by_node:
        nodes[n]._refresh()
    preemptible_pool = sorted(
        (r for r in view.running if r.template in catalog.templates and catalog.templates[r.template].preemptible),
        key=lambda r: catalog.templates[r.template].priority,
    )
    preempted: set[str] = set()

    # Within one plan only the quota and mix factors change (shares move as work is placed): the rest of each
    # template's score is computed once.
    quota_w, mix_w = _factor_weight(cfg.weights, "quota"), _factor_weight(cfg.weights, "mix")
    static: dict[str, float] = {}

    def current_score(t: JobTemplate) -> float:
        quota_share = catalog.quota_for(t.config)
        mix_target = catalog.mix.get(t.kind, 0.0)
        quota_used = tier1_used[t.config] / tier1_gpus if tier1_gpus else 0.0
        mix_used = kind_used[t.kind] / used_total if used_total > 0 else 0.0
        base = static.get(t.name)
        if base is None:
            f = factors(
                priority=t.priority, signals=signals.get(t.config, NEUTRAL),
                wait_s=now - state.pending_since.get(t.name, now), starvation_cap_s=cfg.starvation_cap_s,
                quota_share=quota_share, quota_used=quota_used, mix_target=mix_target, mix_used=mix_used,
            )
            base = static[t.name] = score(f, cfg.weights) - quota_w * f.quota - mix_w * f.mix
        return base + quota_w * _deficit(quota_share, quota_used) + mix_w * _deficit(mix_target, mix_used)

    # 2. Candidates, best first (lazy greedy).
    wanted = [t for t in catalog.templates.values()
              if instances[t.name] < t.max_concurrency and (t.autonomous or not autonomous_only)]
    heap = [(-current_score(t), t.name) for t in wanted]
    heapq.heapify(heap)
    assignments: list[Assignment] = []
    pending: dict[str, str] = {}
    failed_shapes: set[tuple] = set()
    offer_total = sum(n.offer_left for n in nodes.values())

    def candidates_for(t: JobTemplate, vram: float) -> tuple[_Node | None, str]:
        tiers = TIER_BY_KIND.get(t.kind, (1, 2, 3))
        soft = [a.tag for a in t.placement.affinity if not a.hard]
        prio = _kind_priority(t.kind)
        num_gpus = t.resources.num_gpus
        reason = f"no node in tiers {'/'.join(map(str, tiers))} has a GPU with {vram:g} GiB free"
        best, best_key = None, None
        for rank, tier in enumerate(tiers):
            pool = by_tier.get(tier, [])
            if not pool or tier_max_vram.get(tier, 0.0) + 1e-9 < vram:
                continue
            start = rng.randrange(len(pool))
            seen = 0
            for k in range(len(pool)):
                n = pool[(start + k) % len(pool)]
                v = n.view
                if n.offer_left <= 0 or not n.could_fit(num_gpus, vram):
                    continue
                if prio < n.min_priority:
                    reason = f"nodes that fit are degraded (level {v.level} refuses {prio.name} work)"
                    continue
                blocked = _blocker(n, t, instances[t.name])
                if blocked:
                    reason = blocked if blocked != "strategy" else reason
                    continue
                fit = n.fit(t.resources.num_gpus, vram)
                if fit is None:
                    continue
                used = 1.0 - sum(n.frac_free.values()) / max(1, len(n.frac_free))
                key = (
                    -rank * TIER_RANK_COST,
                    -WASTE_COST * _stranded(n, fit, vram),
                    -(5.0 if t.kind == "training" and v.ephemeral else 0.0),
                    -(v.cost_per_hour / 10.0 if t.kind == "selfplay" else 0.0),
                    (used if t.placement.strategy in ("pack", "strict_pack") else -used - n.templates[t.name]),
                    sum(1.0 for tag in soft if tag in v.tags),
                    1.0 if t.placement.colocation_group in n.groups else 0.0,
                )
                total = sum(key)
                if best_key is None or total > best_key:
                    best, best_key = n, total
                seen += 1
                if seen >= cfg.candidates:
                    break
            # A later tier can only win by avoiding stranded GPU time worth more than a tier step.
            if best is not None and best_key is not None and best_key > -(rank + 1) * TIER_RANK_COST:
                break
        return (best, "") if best is not None else (None, reason)

    while heap and offer_total > 0 and len(assignments) < cfg.max_assignments:
        neg, name = heapq.heappop(heap)
        t = catalog.templates[name]
        s_now = current_score(t)
        if heap and s_now < -heap[0][0] - cfg.score_tolerance:
            heapq.heappush(heap, (-s_now, name))
            continue
        if t.kind == "training" and t.config in training_on:
            pending.setdefault(name, f"a training job for {t.config} already runs on {training_on[t.config]}")
            continue
        vram = max(t.resources.vram_gib, vram_floor_gib(t.config)) if t.resources.num_gpus > 0 else 0.0
        shape = (t.kind, vram, t.resources.num_gpus, t.placement.strategy, tuple(a.tag for a in t.placement.affinity if a.hard))
        node = None
        reason = "no capacity"
        if shape not in failed_shapes or t.placement.strategy.startswith("strict"):
            node, reason = candidates_for(t, vram)
        else:
            reason = pending.get(name) or "no node fits (same shape as another template that did not fit)"
        job_stop = None
        if node is None:
            failed_shapes.add(shape)
            node, job_stop = _preempt(t, vram, nodes, preemptible_pool, preempted, catalog, cfg, instances[name])
        if node is None:
            pending[name] = reason
            continue
        if job_stop is not None:
            stops.append(job_stop)
        fit = node.fit(t.resources.num_gpus, vram)
        assert fit is not None
        gpus, frac = fit
        node.take(gpus, frac, vram)
        node.use(t)
        node.offer_left -= 1
        offer_total -= 1
        if node.offer_left <= 0 or (node.whole_free == 0 and node.best_vram <= 0):
            by_tier[node.tier] = [x for x in by_tier[node.tier] if x is not node]
        node.templates[name] += 1
        node.jobs += 1
        if t.placement.colocation_group:
            node.groups.add(t.placement.colocation_group)
        instances[name] += 1
        gpu_time = frac * len(gpus)
        used_total += gpu_time
        kind_used[t.kind] += gpu_time
        if node.tier == 1:
            tier1_used[t.config] += gpu_time
        if t.kind == "training":
            training_on[t.config] = node.view.node_id
        state.job_seq += 1
        assignments.append(Assignment(
            job_id=f"{term}-{state.job_seq}", template=name, node_id=node.view.node_id, gpus=gpus, gpu_fraction=frac,
            vram_gib=vram, params=tuple(sorted(t.param_values().items())), term=term, score=round(s_now, 6)))
        state.pending_since.pop(name, None)
        if instances[name] < t.max_concurrency:
            heapq.heappush(heap, (-current_score(t), name))
    for _, name in heap:
        pending.setdefault(name, "no capacity offered (every node's offer is used)" if offer_total <= 0
                           else f"plan budget of {cfg.max_assignments} placements used; next plan")
    out_pending = []
    for name, reason in sorted(pending.items()):
        since = state.pending_since.setdefault(name, now)
        out_pending.append(Pending(name, reason, now - since))
    for name in list(state.pending_since):
        if name not in pending:
            del state.pending_since[name]
    return Plan(term, now, tuple(assignments), tuple(stops), tuple(out_pending))


TIER_RANK_COST = 10.0
WASTE_COST = 25.0
MIN_USEFUL_VRAM_GIB = 8.0


def _stranded(n: _Node, fit: tuple[tuple[int, ...], float], vram: float) -> float:
    """GPU fraction a placement would strand: left free on its GPU but with too little VRAM for any job."""
    gpus, frac = fit
    if len(gpus) != 1 or frac >= 1.0:
        return 0.0
    i = gpus[0]
    left = n.frac_free[i] - frac
    return left if left > 1e-9 and n.vram_free[i] - vram < MIN_USEFUL_VRAM_GIB else 0.0


def _blocker(n: _Node, t: JobTemplate, running_instances: int) -> str | None:
    """Why ``t`` may not go on ``n`` apart from GPU fit and offer (``"strategy"`` for strict strategies), or None."""
    v = n.view
    prio = _kind_priority(t.kind)
    if not may_start(prio, v.level):
        return f"nodes that fit are degraded (level {v.level} refuses {prio.name} work)"
    if t.kind == "training" and v.disk_percent >= v.disk_max_percent:
        return "nodes that fit refuse training (disk at or above critical)"
    hard = [a.tag for a in t.placement.affinity if a.hard]
    if hard and not all(tag in v.tags for tag in hard):
        return f"no node carries the required tags {', '.join(hard)}"
    r = t.resources
    if v.cpus > 0 and n.cpus + 1e-9 < r.num_cpus:
        return f"nodes that fit lack {r.num_cpus:g} free CPUs"
    if v.memory_gib > 0 and n.memory + 1e-9 < r.memory_gib:
        return f"nodes that fit lack {r.memory_gib:g} GiB of free memory"
    for name, amount in r.custom:
        if n.custom.get(name, 0.0) + 1e-9 < amount:
            return f"no node offers {amount:g} of custom resource {name!r}"
    if t.placement.strategy == "strict_spread" and n.templates[t.name]:
        return "strategy"
    if t.placement.strategy == "strict_pack" and running_instances and not n.templates[t.name]:
        return "strategy"
    return None


def _preempt(
    t: JobTemplate,
    vram: float,
    nodes: dict[str, _Node],
    pool: list[RunningJob],
    preempted: set[str],
    catalog: Catalog,
    cfg: SchedulerConfig,
    running_instances: int,
) -> tuple[_Node | None, Stop | None]:
    """A node where stopping one preemptible job at least ``preemption_gap`` points lower makes ``t`` fit."""
    if t.resources.num_gpus <= 0:
        return None, None
    tiers = TIER_BY_KIND.get(t.kind, (1, 2, 3))
    for r in pool:
        victim = catalog.templates[r.template]
        if victim.priority > t.priority - cfg.preemption_gap:
            break  # the pool is sorted by priority: no lower one is left
        n = nodes.get(r.node_id)
        if r.job_id in preempted or n is None or n.tier not in tiers or not r.gpus:
            continue
        n.take(r.gpus, -r.gpu_fraction, -r.vram_gib)  # as if it stopped
        n.use(victim, -1.0)
        if _blocker(n, t, running_instances) is None and n.fit(t.resources.num_gpus, vram) is not None:
            preempted.add(r.job_id)
            n.offer_left = max(n.offer_left, 1)
            return n, Stop(r.job_id, r.node_id, f"preempted by {t.name} (priority {t.priority} vs {victim.priority})",
                           cfg.grace_s)
        n.take(r.gpus, r.gpu_fraction, r.vram_gib)
        n.use(victim)
    return None, None
