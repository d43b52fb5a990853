"""One plan's state and accounting (pure): step 1 of :func:`p2pnode.scheduler.plan` (what runs: GPU fractions and VRAM
per GPU, offers left per node, instances per template, the tier-1 GPU share per config and the GPU share per kind,
the training job kept per config, the members of gangs the leader's gang table ended), the score's quota and mix
factors as work is placed, an assignment's bookkeeping (:meth:`_PlanState._assign`), and the memory a job is
predicted to need (:mod:`._planpreempt`, "Predictions": peak memory).

:class:`_PlanState` is the base of the planner's parts (:mod:`._planreasons`, :mod:`._plancands`,
:mod:`._planpreempt`, :mod:`._plantakeback`, :mod:`._plangang`), each a class adding one concern's methods to it; the
state itself (``__slots__``) is set up here, once, in :meth:`_PlanState.__init__`.
"""

from __future__ import annotations

import random
from collections import defaultdict

from ._catalog import Catalog, JobTemplate
from ._nodecap import NodeCap as _Node
from ._nodefit import Figures, Holding, Misfit, figures_of, need_of
from ._planshape import (
    _over_cap,
    _remnants,
    _Shape,
    _training_keepers,
    _unit,
    _Window,
)
from ._planview import (
    Assignment,
    ClusterView,
    RunningJob,
    SchedulerConfig,
    SchedulerState,
    Stop,
    node_tier,
)
from ._predict import Prediction
from ._signals import NEUTRAL, Signals
from ._weights import _deficit, _factor_weight, factors, score


class _PlanState:
    """One plan in the making, step by step (:func:`._plan.plan` calls them in order): the nodes' free capacity, what
    runs (instances per template, the tier-1 GPU share per config, the GPU share per kind), the candidate pools
    and windows, and the plan's stops, assignments and pending reasons so far."""

    __slots__ = ("view", "catalog", "signals", "now", "term", "state", "cfg", "rng", "templates", "nodes",
                 "by_tier", "tier1_gpus", "tier_max_vram", "instances", "training_on", "tier1_used", "kind_used",
                 "used_total", "stops", "gpu_pools", "cpu_pools", "epochs", "windows", "preemptible_pool",
                 "preempted", "quota_w", "mix_w", "static", "pending", "shapes", "assignments", "failed_shapes",
                 "offer_total", "cpu_offer_total", "gang_members", "gang_blocks", "blocks", "predictor", "pmemo",
                 "nmemo",  # what one instance asks, per template and node class (_need)
                 "ends", "by_elapsed", "claimed", "most", "end_scan", "mixed", "durable_pools", "durable_victims",
                 "durable_failed", "open_room", "why_memo", "granted", "displaced", "live_names", "live")

    def __init__(self, view: ClusterView, catalog: Catalog, signals: dict[str, Signals], now: float, term: int,
                 state: SchedulerState, cfg: SchedulerConfig, rng: random.Random) -> None:
        self.view, self.catalog, self.signals, self.now, self.term = view, catalog, signals, now, term
        self.state, self.cfg, self.rng = state, cfg, rng
        self.templates = catalog.templates
        # Summaries of free capacity are computed once what runs is accounted (open_pools: NodeCap.start_plan).
        self.nodes = {nid: _Node(v, node_tier(v), refresh=False) for nid, v in view.nodes.items()}
        remnant = _remnants(catalog, catalog.templates.values())
        for n in self.nodes.values():
            n.remnant = remnant.get(n.tier, ())
        by_tier: dict[int, list[_Node]] = defaultdict(list)
        for n in sorted(self.nodes.values(), key=lambda n: n.view.node_id):
            by_tier[n.tier].append(n)
        self.by_tier = by_tier
        self.tier1_gpus = sum(len(n.view.gpus) for n in by_tier.get(1, []))
        self.tier_max_vram = {k: max((max(n.usable.values()) for n in v if n.usable), default=0.0)
                              for k, v in by_tier.items()}  # usable VRAM of the tier's biggest GPU
        # What runs, and what the plan places: the shares that move the quota and mix factors.
        self.instances: dict[str, int] = defaultdict(int)
        self.training_on: dict[str, str] = {}
        self.tier1_used: dict[str, float] = defaultdict(float)
        self.kind_used: dict[str, float] = defaultdict(float)
        self.used_total = 0.0
        # Candidates: per tier, the nodes offering GPU work with GPU room, and those offering CPU work; per
        # template shape, a window of scored nodes (see _candidates_for).
        self.gpu_pools: dict[int, list[_Node]] = {}
        self.cpu_pools: dict[int, list[_Node]] = {}
        self.epochs: dict[tuple, int] = defaultdict(int)  # (gpu, tier[, "durable"]) -> times its pool was compacted
        self.windows: dict[tuple, _Window] = {}
        self.preemptible_pool: list[RunningJob] | None = None  # built on the first preemption attempt
        self.preempted: set[str] = set()
        # Within one plan only the quota and mix factors change (shares move as work is placed): the rest of each
        # template's score is computed once.
        self.quota_w, self.mix_w = _factor_weight(cfg.weights, "quota"), _factor_weight(cfg.weights, "mix")
        self.static: dict[str, float] = {}
        # The plan so far.
        self.stops: list[Stop] = []
        self.pending: dict[str, str] = {}
        self.shapes: dict[str, _Shape] = {}
        self.assignments: list[Assignment] = []
        self.failed_shapes: dict[tuple, str] = {}  # a shape no node could take -> why
        self.offer_total = 0
        self.cpu_offer_total = 0
        # Gangs: the members running per gang id, the port blocks in use per node, every block of the range.
        self.gang_members: dict[str, list[RunningJob]] = defaultdict(list)
        self.gang_blocks: dict[str, set[tuple[int, int]]] = defaultdict(set)  # node -> (first port, ports) in use
        lo, hi = cfg.gang_ports
        size = max(1, cfg.gang_port_block)
        self.blocks = tuple(range(lo, hi - size + 2, size)) if 0 < lo <= hi <= 65535 else ()
        # Predictions (_planpreempt.py): memoized per template and node class; the running jobs with a predicted end
        # (soonest first) and the preemptible ones by elapsed time, built on first use; the ends some waiting
        # template counts on; the most free memory (or VRAM) seen on a node refused for predicted memory.
        self.predictor = view.predictor
        self.pmemo: dict[tuple[str, str], Prediction | None] = {}
        self.nmemo: dict[tuple[str, str], Holding] = {}  # what one instance asks, per template and node class
        self.ends: list[tuple[float, RunningJob]] | None = None
        self.by_elapsed: list[RunningJob] | None = None
        self.claimed: set[str] = set()
        self.most: dict[tuple[str, str], float] = {}
        self.end_scan: dict[tuple, int] = {}  # template shape -> where its scan of the ends resumes (-1: done)
        # Stable kinds (_plantakeback.py): only a fleet with durable and ephemeral nodes searches durable nodes
        # first; their pools per tier, the preemptible jobs on them, and the shapes no preemption there can place
        # are built on first use.
        eph = sum(1 for n in self.nodes.values() if n.view.ephemeral)
        self.mixed = 0 < eph < len(self.nodes)
        self.durable_pools: dict[bool, dict[int, list[_Node]]] = {}
        self.durable_victims: list[RunningJob] | None = None
        self.durable_failed: set[tuple] = set()
        self.open_room = 0  # GPUs this plan opened that still have a fraction free (fractional work needs no offer)
        self.why_memo: dict[tuple, tuple[dict[str, int], int, int, float]] = {}  # _gpu_reason's counts per shape
        self.live_names: set[str] = set()  # fractional templates that may still get an instance (queue_wanted)
        self.live = remnant  # their shapes per tier (every template's until queue_wanted counted the instances)
        self.granted = 0  # GPU offers preemptions gave nodes that had none left (not in the plan's offer total)
        self.displaced: list[JobTemplate] = []  # taken back for the next assignment (_displace): placed again after it

    def continue_job_ids(self) -> None:
        """New ids continue above every running job's id of this term: a leader restarted within its term (its
        sequence lost) re-adopts its jobs and must not hand their ids to new work."""
        state, term = self.state, self.term
        for r in self.view.running:
            if r.plan_id is not None and r.plan_id.term == term:
                state.job_seq = max(state.job_seq, r.plan_id.seq)

    def account_running(self) -> None:
        """Step 1: account what runs on its node (GPU fractions and VRAM, resources, instances, colocation
        groups) and in the shares; stop a job whose template left the catalog, a member of a gang that ends,
        every training job of a config but the one :func:`_training_keepers` keeps, and the preemptible instances
        over their template's ``max_concurrency``, youngest first (:func:`._planshape._over_cap`) (each such job is
        marked preempted: no preemption stops it again)."""
        templates, nodes, grace_s = self.templates, self.nodes, self.cfg.grace_s
        trainer = _training_keepers(self.view.running, templates)
        # A leader's plan only: a node's own leaderless plan (term 0) acts on no stop, and must account what runs.
        surplus = _over_cap(self.view.running, templates) if self.term > 0 else {}
        for r in self.view.running:
            if r.gang is not None:
                self.gang_members[r.gang.id].append(r)
                self.gang_blocks[r.node_id].add((r.gang.port_base, r.gang.ports))
        broken = self._broken_gangs()
        counted: set[str] = set()
        instances, kind_used, tier1_used, predictor = self.instances, self.kind_used, self.tier1_used, self.predictor
        for r in self.view.running:
            t = templates.get(r.template)
            if t is None:
                self.stops.append(Stop(r.job_id, r.node_id, f"template {r.template!r} is no longer in the catalog",
                                       grace_s, "template_removed"))
                self.preempted.add(r.job_id)  # stopped: no preemption stops it again or counts on its room
                continue
            if r.gang is not None and r.gang.id in broken:
                self.stops.append(Stop(r.job_id, r.node_id, broken[r.gang.id], grace_s, "gang_ended"))
                self.preempted.add(r.job_id)
                continue
            if t.kind == "training" and _unit(trainer[t.config]) != _unit(r):
                k = trainer[t.config]
                self.stops.append(Stop(r.job_id, r.node_id, f"duplicate training of {t.config}: {_unit(k)} on "
                                       f"{k.node_id} (term {k.term}) runs it; one stays (as when a node re-adopts a "
                                       "job after it was down)", grace_s))
                self.preempted.add(r.job_id)
                continue
            if r.job_id in surplus:  # not an instance any more; its room stays held until it exits
                n, cap = surplus[r.job_id]
                self.stops.append(Stop(r.job_id, r.node_id, f"over max_concurrency: {n} instances of {t.name} run, "
                                       f"its cap is {cap} (as when nodes without a leader each started it)", grace_s))
                self.preempted.add(r.job_id)
            elif r.gang is None or r.gang.id not in counted:  # a gang counts as one job
                instances[t.name] += 1
                if r.gang is not None:
                    counted.add(r.gang.id)
            gpu_time = r.gpu_fraction * len(r.gpus)
            self.used_total += gpu_time
            kind_used[t.kind] += gpu_time
            if t.kind == "training":
                self.training_on[t.config] = r.node_id
            host = nodes.get(r.node_id)
            if host is not None:
                host.take(r.gpus, r.gpu_fraction, r.vram_gib, refresh=False)
                if predictor is None:
                    host.use(t)
                else:
                    host.use(t, 1.0, self._extra_gib(t, host))
                host.templates[t.name] += 1
                host.jobs += 1
                if t.placement.colocation_group:
                    host.groups.add(t.placement.colocation_group)
                if host.tier == 1:
                    tier1_used[t.config] += gpu_time

    def _broken_gangs(self) -> dict[str, str]:
        """Gangs to end, by id, with the reason: those running here that the leader's gang table ended
        (``view.gang_ends``, :mod:`p2pnode.node._gangs`). All or nothing, as placement."""
        ends = self.view.gang_ends
        if not ends:
            return {}
        return {gid: ends[gid] for gid in self.gang_members if gid in ends}

    def open_pools(self) -> None:
        """The candidate pools per tier, once what runs is accounted: for GPU work the nodes with a GPU offer and
        GPU room, for CPU-only work the nodes with a CPU offer. A node that fills up during the plan is skipped,
        and dropped from its pool once dead entries are half of it (amortized O(1) per placement)."""
        for n in self.nodes.values():
            n.start_plan()
        self.gpu_pools = {k: [n for n in v if n.offer_left > 0 and n.has_room()] for k, v in self.by_tier.items()}
        self.cpu_pools = {k: [n for n in v if n.cpu_offer_left > 0] for k, v in self.by_tier.items()}

    def current_score(self, t: JobTemplate) -> float:
        """``t``'s score now: its static part (computed once per plan) and the quota and mix factors of the shares
        as placed so far."""
        catalog, tier1_gpus, used_total, quota_w, mix_w = (self.catalog, self.tier1_gpus, self.used_total,
                                                           self.quota_w, self.mix_w)
        quota_share = catalog.quota_for(t.config)
        mix_target = catalog.mix.get(t.kind, 0.0)
        quota_used = self.tier1_used[t.config] / tier1_gpus if tier1_gpus else 0.0
        mix_used = self.kind_used[t.kind] / used_total if used_total > 0 else 0.0
        base = self.static.get(t.name)
        if base is None:
            cfg, now = self.cfg, self.now
            f = factors(
                priority=t.priority, signals=self.signals.get(t.config, NEUTRAL),
                wait_s=now - self.state.pending_since.get(t.name, now), starvation_cap_s=cfg.starvation_cap_s,
                quota_share=quota_share, quota_used=quota_used, mix_target=mix_target, mix_used=mix_used,
            )
            base = self.static[t.name] = score(f, cfg.weights) - quota_w * f.quota - mix_w * f.mix
        return base + quota_w * _deficit(quota_share, quota_used) + mix_w * _deficit(mix_target, mix_used)

    def _assign(self, t: JobTemplate, sh: _Shape, node: _Node, fit: tuple, s_now: float) -> int:
        """Place one instance of ``t`` on ``node`` (GPUs, fraction and VRAM ``fit``, :meth:`_Node.fit`): take its
        capacity and the offer it costs (:meth:`_Node.charge`), move the shares, and add the assignment under the
        next job id of this term. Returns the GPU offers it spent (0 or 1)."""
        name = t.name
        if 0 < sh.num_gpus < 1:
            if name in self.live_names and self.instances[name] + 1 >= t.max_concurrency:
                self._live_change(name, False)  # its last instance: a remainder only it could use goes to this one
            fit = node.grow(fit, self.live.get(node.tier, ()))
        gpus, frac, vram = fit
        room = node.open_room
        spent = 0
        if sh.num_gpus > 0:
            spent = node.charge(gpus, sh.num_gpus < 1)
        else:
            node.cpu_offer_left -= 1
        node.take(gpus, frac, vram)
        self.open_room += node.open_room - room
        if self.predictor is None:
            node.use(t)
        else:
            node.use(t, 1.0, self._extra_gib(t, node))
        node.templates[name] += 1
        node.jobs += 1
        if sh.group:
            node.groups.add(sh.group)
        self.instances[name] += 1
        gpu_time = frac * len(gpus)
        self.used_total += gpu_time
        self.kind_used[t.kind] += gpu_time
        if node.tier == 1:
            self.tier1_used[t.config] += gpu_time
        if sh.training:
            self.training_on[t.config] = node.view.node_id
        state, term = self.state, self.term
        state.job_seq += 1
        figures = self._figures(t, node)
        self.assignments.append(Assignment(
            job_id=f"{term}-{state.job_seq}", template=name, node_id=node.view.node_id, gpus=gpus, gpu_fraction=frac,
            vram_gib=vram, params=sh.params, term=term, score=round(s_now, 6),
            memory_gib=None if figures is None else figures.memory_gib,
            vram_peak_gib=0.0 if figures is None else figures.vram_peak_gib))
        state.pending_since.pop(name, None)
        return spent

    def _live_change(self, name: str, live: bool) -> None:
        """Template ``name`` may again (``live``) or may no more get an instance in this plan: the shapes a GPU's
        remainder is kept for (:meth:`._nodecap.NodeCap.grow`) follow."""
        if live:
            self.live_names.add(name)
        else:
            self.live_names.discard(name)
        self.live = _remnants(self.catalog, (self.templates[n] for n in self.live_names))

    def _stop_rest_of_gang(self, stop: Stop) -> None:
        """A preempted gang member takes its whole gang with it: preemption never leaves part of a gang."""
        for members in self.gang_members.values():
            if any(m.job_id == stop.job_id for m in members):
                for m in members:
                    if m.job_id != stop.job_id and m.job_id not in self.preempted:
                        self.preempted.add(m.job_id)
                        self.stops.append(Stop(m.job_id, m.node_id, f"{stop.reason} (its gang goes whole)",
                                               stop.grace_s))
                return

    # -- predictions (_planpreempt.py, "Predictions") ----------------------------------------------------------
    def _predict(self, template: str, node_class: str) -> Prediction | None:
        """The history figures for ``template`` on ``node_class`` (None: no predictor, nothing known, or only the
        declared values), memoized for the plan."""
        key = (template, node_class)
        memo = self.pmemo
        if key in memo:
            return memo[key]
        p = self.predictor.predict(template, node_class) if self.predictor is not None else None
        if p is not None and p.source != "history":
            p = None
        memo[key] = p
        return p

    def _has_memory_figures(self, t: JobTemplate, classes: list[str]) -> bool:
        """Whether a peak RSS or VRAM figure from history is predicted for ``t`` on one of the fleet's node
        ``classes`` (its nodes then need :meth:`_need`)."""
        for c in classes:
            p = self._predict(t.name, c)
            if p is not None and (p.rss_p90_bytes is not None or p.vram_p90_bytes is not None):
                return True
        return False

    def _need(self, t: JobTemplate, n: _Node) -> Holding:
        """What one instance of ``t`` asks of ``n`` (:func:`._nodefit.need_of` with its prediction for the node's
        class: the one choice between declared and predicted figures), memoized for the plan."""
        key = (t.name, n.view.node_class)
        need = self.nmemo.get(key)
        if need is None:
            need = self.nmemo[key] = need_of(t.resources, self._predict(t.name, n.view.node_class))
        return need

    def _figures(self, t: JobTemplate, n: _Node) -> Figures | None:
        """The predicted figures one instance of ``t`` is placed on ``n`` by, which its assignment carries to the
        node (:func:`._nodefit.figures_of` of :meth:`_need`); None without a predictor or a history figure."""
        return None if self.predictor is None else figures_of(self._need(t, n))

    def _extra_gib(self, t: JobTemplate, n: _Node) -> float:
        """Memory (GiB) one instance of ``t`` holds on ``n`` beyond its declared ``memory_gib``: its predicted peak
        RSS p90 above it (:meth:`_need`), on a node that accounts memory; else 0."""
        if n.view.memory_gib <= 0:
            return 0.0
        return self._need(t, n).memory_gib - t.resources.memory_gib

    def _predicted_why(self, n: _Node, t: JobTemplate, m: Misfit) -> str:
        """The pending reason for ``m``, a misfit of ``t`` on ``n`` only its predicted figures make
        (:func:`._planshape._blocker`): its predicted peak memory over the node's free memory (what it gives to
        jobs less what its jobs hold, declared or predicted), or its predicted peak VRAM per GPU over what one of
        the node's GPUs may commit, with the most any node refused for it has (its figure counted)."""
        runs = self._need(t, n).runs
        if m.resource == "memory":
            most = self._most(t.name, "rss", max(0.0, m.free), True)
            return (f"predicted peak memory {m.asks:.1f} GiB (p90 of {runs} runs) exceeds the free memory of every "
                    f"node that fits (most {most:.3g} GiB)")
        most = self._most(t.name, "vram", m.free, True)
        return (f"predicted peak VRAM {m.asks:.1f} GiB per GPU (p90 of {runs} runs) exceeds what one GPU of "
                f"every node that fits may commit (most {most:.3g} GiB)")

    def _most(self, name: str, what: str, value: float, note: bool) -> float:
        key = (name, what)
        most = max(self.most.get(key, 0.0), value)
        if note:
            self.most[key] = most
        return most

    def _elapsed(self, r: RunningJob) -> float | None:
        """Seconds ``r`` has run (``view.wall - started_at``, at least 0), None when either is unknown."""
        wall = self.view.wall
        if wall <= 0.0 or r.started_at <= 0.0:
            return None
        return max(0.0, wall - r.started_at)
