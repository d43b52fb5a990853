"""The planner: cluster view + catalog + signals -> a plan (assignments, preemptions, pending reasons). Pure.

``plan(view, catalog, signals, now, term=..., state=...)`` is deterministic for a given ``seed``. It (each step a
method of ``_Planning``, called in this order by :func:`plan`):

1. accounts what runs: GPU fractions and VRAM per GPU, offers left per node, instances per template, tier-1 GPU
   share per config (quotas) and GPU share per kind (mix) (:mod:`._planstate`);
2. scores every template that wants more instances (:mod:`._weights`) and places instances best-first with a
   lazy greedy queue (a popped template is re-scored; if it fell below the next one it goes back);
3. places an instance on the best feasible node: VRAM floor per config, tier preference per kind and the kind's
   guard priority (all three from the catalog's ``[policy]``, :class:`~p2pnode.scheduler.Policy`), hard
   affinities, strict strategies, the node's capacity offer and degradation level, at most one training job per
   config cluster-wide (of two running, as after a node re-adopted one, the older stays and the other stops);
   nodes are scored and searched as :mod:`._plancands` says (only up to ``candidates`` feasible nodes per tier
   are scored, each template shape keeps its window, so a placement costs O(1) scorings); a stable kind searches
   durable nodes first (:mod:`._plantakeback`), a gang places all its members or none (:mod:`._plangang`; an
   elastic gang at least its minimum, and a running one gets members back first, :mod:`._plangrow`);
   a template no node could take even when empty waits as ``"unsatisfiable: ..."``;
4. preempts, when nothing fits, a preemptible running job at least ``preemption_gap`` priority points below
   (Nomad's rule), with ``grace_s`` (:mod:`._planpreempt`);
5. leaves every unplaced template with the reason, a GPU template's counted when the plan is made
   (:mod:`._planreasons`).

The parts (issue 39, one concern per module): :mod:`._planview` (inputs, outputs, config), :mod:`._planshape` (a
template's shape, a node's rules, score costs), :mod:`._planstate` (``_PlanState``: the plan's state and
accounting), :mod:`._planreasons` (``_Reasons``), :mod:`._plancands` (``_Candidates``), :mod:`._planpreempt`
(``_Preempting``), :mod:`._plantakeback` (``_TakeBack``), :mod:`._plangang` (``_GangPlacing``), :mod:`._plangrow`
(``_GangGrowing``); each class adds its
concern's methods to the one below it, and ``_Planning`` here is the queue over them all.

GPU capacity (issue 38, :mod:`._nodecap` over :mod:`._gpucap`): ``[guard] gpu_max_percent`` caps the VRAM
committed on each GPU (its *usable* VRAM, ``NodeView.vram_limit_ratio``); what the guard measures (a GPU whose
memory in use is at or above that limit is ``GpuView.full``) is separate. A placement whose GPU would keep a
remainder no fractional template of the catalog that may use the node fits gives the job that remainder (its
``Assignment.gpu_fraction`` and ``vram_gib`` grow), a whole-GPU job gets its GPUs' usable VRAM, so a busy GPU is
committed to its usable VRAM. A fractional job on a GPU idle at the plan's start spends one offer for the GPU,
others on that GPU in the same plan none: a free GPU is offered as the fractions that fit it.

Predictions (issue 27): :mod:`._planpreempt`, "Predictions".

Stable kinds (issue 38): :mod:`._plantakeback`, "Stable kinds".

Tiers (seed 003): :func:`node_tier` (:mod:`._planview`, the planner's inputs and outputs).

CPU-only work (issue 24): a template with ``num_gpus = 0`` is placed by the same steps against CPUs, memory and
custom resources instead of GPUs, and from the node's CPU offer (:attr:`NodeView.cpu_offer`,
:func:`p2pnode.scheduler.cpu_offer`) instead of its GPU offer: GPU work never takes a CPU offer and CPU work
never a GPU offer, so a GPU-less node (GPU offer 0) and a node whose GPUs are busy in the PID band take CPU work,
and CPU work never pushes a node's GPUs past their band. The kind's ``[policy] tiers`` are about GPUs: a CPU-only
template may use every tier (:meth:`~p2pnode.scheduler.Catalog.tiers_of`), tier 4 (no GPU or small GPUs) first
and the biggest GPU boxes last, unless its kind's ``[policy] cpu_tiers`` or a hard affinity says otherwise;
within a tier it prefers nodes without GPUs, then (spread) the node with the most CPUs free, so GPU boxes keep
their CPUs for their GPU jobs' data loaders while other nodes have room. A CPU template that waits says what it
lacks: CPUs and memory, or the CPU offers (``"no capacity offered for CPU work ..."``).
"""

from __future__ import annotations

import heapq
import random

from ._catalog import Catalog, JobTemplate
from ._gpucap import EPS
from ._nodecap import NodeCap as _Node
from ._plangrow import _GangGrowing
from ._planreasons import _gang_unsatisfiable, _unsatisfiable
from ._planshape import (
    _GPU_WHY,
    _NO_OFFER_CPU,
    _NOT_GPU_ROOM,
    _remnants,
    _Shape,
    _shape_of,
)
from ._planshape import GIB as GIB
from ._planshape import GPU_BOX_COST as GPU_BOX_COST
from ._planshape import STABLE_COST as STABLE_COST
from ._planshape import TIER_RANK_COST as TIER_RANK_COST
from ._planshape import WASTE_COST as WASTE_COST
from ._plantakeback import _TakeBack
from ._planview import (
    PLAN_MIN_GAP_S,
    Assignment,
    ClusterView,
    GpuView,
    NodeView,
    Pending,
    Plan,
    PredictorLike,
    RunningJob,
    SchedulerConfig,
    SchedulerState,
    Stop,
    next_plan_at,
    node_tier,
    plan_due,
)
from ._signals import Signals

__all__ = [
    "PLAN_MIN_GAP_S",
    "Assignment",
    "ClusterView",
    "GpuView",
    "NodeView",
    "Pending",
    "Plan",
    "PredictorLike",
    "RunningJob",
    "SchedulerConfig",
    "SchedulerState",
    "Stop",
    "next_plan_at",
    "node_tier",
    "plan",
    "plan_due",
]


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
    p = _Planning(view, catalog, signals, now, term, state if state is not None else SchedulerState(),
                  config or SchedulerConfig(), random.Random(seed))
    p.continue_job_ids()
    p.account_running()
    p.open_pools()
    p.grow_gangs()
    heap = p.queue_wanted(autonomous_only)
    p.place_best_first(heap)
    return p.result(heap)


class _Planning(_GangGrowing, _TakeBack):
    """One plan in the making (:func:`plan` calls its steps in order): the state and accounting of
    :class:`._planstate._PlanState`, and the queue of wanted templates placed best-first."""

    __slots__ = ()

    def queue_wanted(self, autonomous_only: bool) -> list[tuple[float, str]]:
        """Step 2: every template that wants another instance, as a heap best first (lazy greedy). A template no
        node of the view could take even when empty waits with the reason (``"unsatisfiable: ..."``) and is not
        searched for."""
        never: dict[tuple, str | None] = {}
        wanted = []
        classes = sorted({n.view.node_class for n in self.nodes.values()}) if self.predictor is not None else []
        for t in self.templates.values():
            if self.instances[t.name] >= t.max_concurrency or (autonomous_only and not t.autonomous):
                continue
            sh = self.shapes[t.name] = _shape_of(t, self.catalog, self._has_memory_figures(t, classes))
            why = _unsatisfiable(t, sh, self.view, never)
            if why is None and t.gang is not None:
                key = ("gang", t.engine, t.gang, t.placement.strategy, sh.tiers, sh.hard, sh.vram, t.resources)
                if key not in never:
                    never[key] = _gang_unsatisfiable(t, sh, self.nodes.values(), bool(self.blocks))
                why = never[key]
            if why is not None:
                self.pending[t.name] = why
            else:
                wanted.append(t)
        waiting = _remnants(self.catalog, wanted)
        for n in self.nodes.values():
            n.waiting = waiting.get(n.tier, ())
        self.live_names = {t.name for t in self.templates.values()
                           if 0 < t.resources.num_gpus < 1 and self.instances[t.name] < t.max_concurrency}
        self.live = _remnants(self.catalog, (self.templates[n] for n in self.live_names))
        heap = [(-self.current_score(t), t.name) for t in wanted]
        heapq.heapify(heap)
        return heap

    def place_best_first(self, heap: list[tuple[float, str]]) -> None:
        """Steps 3 and 4: pop the best template, re-score it (if it fell below the next one it goes back), place
        one instance on the best feasible node (or preempt for it), and queue it again while it wants more; until
        the offers (GPU offers for GPU work, CPU offers for CPU-only work), the heap or the plan's placement budget
        run out. A placement that would strand GPU time (a fraction left free with too little VRAM for any job,
        e.g. a half-GPU job taking all 16 GiB of a 16 GiB card: 32 % busy where a whole-GPU job drives 65 %) is
        made only after every other template had its turn: another template may use that GPU whole."""
        cfg, templates, pending, assignments = self.cfg, self.templates, self.pending, self.assignments
        training_on, shapes, instances = self.training_on, self.shapes, self.instances
        current_score, find_node, assign = self.current_score, self._find_node, self._assign
        offer_total = sum(n.offer_left for n in self.nodes.values())
        cpu_total = sum(n.cpu_offer_left for n in self.nodes.values())
        deferred: list[tuple[float, str]] = []  # templates whose best placement strands GPU time: placed last
        stranding_ok = False
        while (heap or (deferred and not stranding_ok)) and (offer_total > 0 or self.open_room > 0 or cpu_total > 0) \
                and len(assignments) < cfg.max_assignments:
            if not heap:  # only stranding placements are left: make them (a stranded half beats an idle GPU)
                heap[:], deferred, stranding_ok = deferred, [], True  # in place: result() reads the caller's heap
                heapq.heapify(heap)
            _, name = heapq.heappop(heap)
            t = templates[name]
            s_now = current_score(t)
            if heap and s_now < -heap[0][0] - cfg.score_tolerance:
                heapq.heappush(heap, (-s_now, name))
                continue
            gpu = t.resources.num_gpus > 0
            offered = (offer_total > 0 or (self.open_room > 0 and t.resources.num_gpus < 1)) if gpu else cpu_total > 0
            if not offered:
                pending.setdefault(name, _GPU_WHY if gpu else _NO_OFFER_CPU)
                continue
            if t.kind == "training" and t.config in training_on:
                pending.setdefault(name, f"a training job for {t.config} already runs on {training_on[t.config]}")
                continue
            sh = shapes[name]
            if t.gang is not None:
                placed, why = self._place_gang(t, sh, s_now)
                if not placed:
                    pending[name] = why
                    continue
                if gpu:
                    offer_total -= placed
                else:
                    cpu_total -= placed
                if instances[name] < t.max_concurrency:
                    heapq.heappush(heap, (-current_score(t), name))
                continue
            node, fit, job_stop, reason = find_node(t, sh)
            offer_total, self.granted = offer_total + self.granted, 0  # a preemption's offer is spent below
            displaced, self.displaced = self.displaced, []
            if node is None or fit is None:  # (a node comes with its fit: no fit is a fault, not a crash)
                pending[name] = reason or f"no fit on {node.view.node_id if node else '?'} after it made room"
                continue
            if (job_stop is None and not displaced and not stranding_ok and heap
                    and node.strand(fit, sh.num_gpus) > EPS):
                deferred.append((-s_now, name))  # another template may use this GPU whole: it goes first
                continue
            if job_stop is not None:
                self.stops.append(job_stop)
                self._stop_rest_of_gang(job_stop)
            spent = assign(t, sh, node, fit, s_now)
            for v in displaced:  # once ``t`` holds its room: it cannot go back there
                spent += self._place_again(v, node, t)
            if gpu:
                offer_total -= spent
            else:
                cpu_total -= 1
            if instances[name] < t.max_concurrency:
                heapq.heappush(heap, (-current_score(t), name))
        heap.extend(deferred)  # still queued: result() gives them their reason
        self.offer_total, self.cpu_offer_total = offer_total, cpu_total

    def _find_node(self, t: JobTemplate, sh: _Shape) -> tuple[_Node | None, tuple | None, Stop | None, str]:
        """``(node, fit, stop, reason)`` for one instance of ``t``: the best candidate, else a node where a
        preemption makes room (``stop`` the preempted job), else no node and why; a stable kind in a fleet of
        durable and ephemeral nodes tries the durable ones first (:meth:`_durable_node`). A shape that found no
        candidate is not searched again in this plan (strict strategies excepted: they depend on the template's
        instances)."""
        r = t.resources
        shape = (t.kind, sh.vram, sh.num_gpus, t.placement.strategy, sh.hard, r.num_cpus, r.memory_gib, r.custom)
        node: _Node | None = None
        fit: tuple | None = None
        reason = "no capacity"
        search = shape not in self.failed_shapes or t.placement.strategy.startswith("strict")
        if sh.stable and self.mixed:  # durable nodes first: one that fits, else one a preemption makes room on
            found = self._durable_node(t, sh, search)
            if found[0] is not None:
                return found
        if search:
            node, fit, reason = self._candidates_for(t, sh)
        else:
            reason = self.pending.get(t.name) or self.failed_shapes[shape]  # the same cause as its twin's
        job_stop = None
        if node is None:
            self.failed_shapes.setdefault(shape, reason)
            if self.predictor is not None and sh.num_gpus > 0:
                return self._wait_or_preempt(t, sh, reason)
            node, job_stop = self._preempt(t, sh, self._victims_by_priority(), by_priority=True)
            fit = node.fit(sh.num_gpus, sh.vram) if node is not None else None
        return node, fit, job_stop, reason

    def result(self, heap: list[tuple[float, str]]) -> Plan:
        """Step 5: every template still queued waits (offers of its kind -- GPU or CPU -- used up, or the plan's
        budget), each pending one with its reason and how long it has waited; templates no longer waiting leave
        ``pending_since``."""
        cfg, state, now, pending = self.cfg, self.state, self.now, self.pending
        for _, name in heap:
            gpu = self.templates[name].resources.num_gpus > 0
            if (self.offer_total + self.open_room if gpu else self.cpu_offer_total) <= 0:
                pending.setdefault(name, _GPU_WHY if gpu else _NO_OFFER_CPU)
            else:
                pending.setdefault(name, f"plan budget of {cfg.max_assignments} placements used; next plan")
        held = self._held_by_spawn_limits()
        out_pending = []
        for name, reason in sorted(pending.items()):
            if _GPU_WHY in reason:
                reason = reason.replace(_GPU_WHY, self._gpu_reason(self.templates[name], self.shapes[name]))
            if held and self.templates[name].resources.num_gpus > 0 and not reason.startswith(_NOT_GPU_ROOM):
                reason = f"{held}; {reason}"  # the first cause: GPUs held by assignments not started yet
            since = state.pending_since.setdefault(name, now)
            out_pending.append(Pending(name, reason, now - since))
        for name in list(state.pending_since):
            if name not in pending:
                del state.pending_since[name]
        offers_left = self.offer_total + self.open_room > 0 or self.cpu_offer_total > 0
        return Plan(self.term, now, tuple(self.assignments), tuple(self.stops), tuple(out_pending),
                    budget_used=bool(heap) and offers_left and len(self.assignments) >= cfg.max_assignments)


