"""What placing one template needs, and what may refuse a node (pure): a template's :class:`_Shape` (computed once
per plan), its :class:`_Window` of scored candidates, the fractional shapes a GPU's remainder may still serve
(:func:`_remnants`), the rule of one training job per config (:func:`_training_keepers`), a node's fit when empty
(:func:`_fits_empty`) and its rules (:func:`_blocker`), and the planner's score costs and reason texts. Used by
the planner's steps (:mod:`._plan` and the modules of its parts) and by :mod:`._stable`.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Any

import msgspec

from ..guardcore import may_start
from ._catalog import Catalog, JobTemplate
from ._gpucap import EPS, usable_vram_gib
from ._nodecap import NodeCap as _Node
from ._nodecap import Remnant, least_shapes
from ._nodefit import Holding, Misfit, misfit, need_of
from ._planview import NodeView, RunningJob


class _Shape(msgspec.Struct, frozen=True):
    """What placing one template needs, computed once per plan (not once per candidate node)."""

    tiers: tuple[int, ...]
    prio: int
    prio_name: str
    vram: float
    num_gpus: float
    hard: tuple[str, ...]
    soft: tuple[str, ...]
    pack: bool
    strict_spread: bool
    strict_pack: bool
    training: bool
    selfplay: bool
    group: str | None
    params: tuple[tuple[str, Any], ...]
    window: tuple
    """Templates with equal ``window`` keys score nodes alike (up to their own instance count under spread)."""
    checks: bool
    """Whether :func:`_blocker` can refuse it on a node that does not account CPUs or memory (beyond admission)."""
    predicted: bool = False
    """Its predicted peak memory (RSS or VRAM, from history) may refuse a node (:func:`_blocker` of
    :meth:`._planstate._PlanState._need`): its window is its own (templates of one shape may need different
    memory)."""
    stable: bool = False
    """Its kind wants durable nodes (``[policy] stable``): :mod:`._plantakeback`, "Stable kinds"."""
    need: Holding = msgspec.field(default_factory=Holding)
    """What one instance asks by its declared figures (:func:`._nodefit.need_of` without a prediction): what
    :func:`_blocker` checks unless it is ``predicted`` (then :meth:`._planstate._PlanState._need`, per node class)."""


class _Window:
    """One template's scored candidates during a plan, and where its scan of each tier's pool stands."""

    __slots__ = ("entries", "pos", "left", "epoch", "reason")

    def __init__(self) -> None:
        self.entries: list[list[Any]] = []
        self.pos: dict[int, int] = {}
        self.left: dict[int, int] = {}
        self.epoch: dict[int, int] = {}
        self.reason = ""


def _shape_of(t: JobTemplate, catalog: Catalog, predicted: bool = False) -> _Shape:
    r = t.resources
    vram = max(r.vram_gib, catalog.vram_floor_gib(t.config)) if r.num_gpus > 0 else 0.0
    hard = tuple(a.tag for a in t.placement.affinity if a.hard)
    strategy = t.placement.strategy
    prio = catalog.priority_of(t.kind)
    return _Shape(
        tiers=catalog.tiers_of(t), prio=int(prio), prio_name=prio.name, vram=vram, num_gpus=r.num_gpus,
        hard=hard, soft=tuple(a.tag for a in t.placement.affinity if not a.hard),
        pack=strategy in ("pack", "strict_pack"), strict_spread=strategy == "strict_spread",
        strict_pack=strategy == "strict_pack", training=t.kind == "training", selfplay=t.kind == "selfplay",
        group=t.placement.colocation_group, params=tuple(sorted(t.param_values().items())),
        window=(t.kind, vram, r.num_gpus, hard, tuple(a.tag for a in t.placement.affinity if not a.hard),
                t.placement.colocation_group, strategy, r.num_cpus, r.memory_gib, r.custom)
        + ((t.name,) if predicted else ()),
        checks=bool(hard or r.custom or strategy.startswith("strict") or t.kind == "training"),
        predicted=predicted, stable=catalog.is_stable(t.kind), need=need_of(r, None),
    )


def _remnants(catalog: Catalog, templates: Any) -> dict[int, tuple[Remnant, ...]]:
    """Per tier, the shapes (:data:`._nodecap.Remnant`: fraction, VRAM with the config's floor, hard tags) of the
    fractional GPU templates among ``templates`` that may use it: what a GPU's remainder there may still serve."""
    by_tier: dict[int, list[Remnant]] = defaultdict(list)
    for t in templates:
        r = t.resources
        if not 0 < r.num_gpus < 1:
            continue
        shape = (r.num_gpus, max(r.vram_gib, catalog.vram_floor_gib(t.config)),
                 frozenset(a.tag for a in t.placement.affinity if a.hard))
        for tier in catalog.tiers_of(t):
            by_tier[tier].append(shape)
    return {tier: least_shapes(shapes) for tier, shapes in by_tier.items()}


def _unit(r: RunningJob) -> str:
    """What counts as one job: a gang (its id) or a single job (its id)."""
    return r.gang.id if r.gang is not None else r.job_id


def _training_keepers(running: tuple[RunningJob, ...], templates: dict[str, JobTemplate]) -> dict[str, RunningJob]:
    """Per config, the training job that stays when several run (a node re-adopted one after it was down while
    the config was placed elsewhere): the lowest term, then the oldest start, then the lowest id. The others
    are stopped: at most one training job per config. A gang is one job: every member of the kept gang stays. A
    start unknown (0.0: assigned, not reported yet) counts as the newest: a job reported running is not stopped
    for one that may never start."""
    keep: dict[str, RunningJob] = {}
    inf = float("inf")
    for r in running:
        t = templates.get(r.template)
        if t is None or t.kind != "training":
            continue
        k = keep.get(t.config)
        if k is None or (r.term, r.started_at or inf, _unit(r)) < (k.term, k.started_at or inf, _unit(k)):
            keep[t.config] = r
    return keep


def _over_cap(running: tuple[RunningJob, ...], templates: dict[str, JobTemplate]) -> dict[str, tuple[int, int]]:
    """The running jobs to stop because their template runs more instances than its ``max_concurrency``, by job id,
    each with ``(instances, cap)``. Only preemptible work, never a gang member or a training (one per config
    cluster-wide, its own rule), not a job whose template left the catalog, and only catalog instances: placed by a
    leader as ``<term>-<seq>`` (``plan_id``) or started by a node without a leader (term 0), never a one-off run;
    a stopped instance keeps its room held until it exits (the plan accounts it). A surplus comes from nodes that
    planned ``autonomous`` work on their own before any leader existed (each counted only its own instances:
    :func:`p2pnode.scheduler.leaderless_catalog` bounds it where they knew each other), or from a catalog that
    lowered the cap; Nomad likewise stops the allocations over a group's lowered ``count``. Until the surplus is
    stopped no end of its template is replaced, so the room ends leave stays empty.

    Which instances stop: greedily, the one whose GPUs keep the least VRAM committed by the jobs that stay (an
    instance alone on its GPU frees it whole; of two surplus instances sharing a GPU the second then frees it), so
    the stops leave whole GPUs free rather than part-held ones that only the capped templates could fill; among
    equals the youngest (least work lost; a start unknown, 0.0, counts as the newest, as in
    :func:`_training_keepers`). A CPU-only instance keeps nothing on a GPU: the youngest first."""
    by_template: dict[str, list[RunningJob]] = {}
    for r in running:
        t = templates.get(r.template)
        if t is None or not t.preemptible or t.kind == "training" or r.gang is not None:
            continue
        if r.plan_id is None and r.term != 0:  # not a catalog instance (a one-off run the operator asked for)
            continue
        by_template.setdefault(t.name, []).append(r)
    need = {name: len(rs) - templates[name].max_concurrency for name, rs in by_template.items()
            if len(rs) > templates[name].max_concurrency}
    if not need:
        return {}
    committed: dict[tuple[str, int], float] = {}
    for r in running:
        for g in r.gpus:
            committed[(r.node_id, g)] = committed.get((r.node_id, g), 0.0) + r.vram_gib
    candidates = [r for name in need for r in by_template[name]]
    on_gpu: dict[tuple[str, int], list[RunningJob]] = {}
    for r in candidates:
        for g in r.gpus:
            on_gpu.setdefault((r.node_id, g), []).append(r)
    inf = float("inf")

    def key(r: RunningJob) -> tuple[float, float, str]:
        stays = sum(committed[(r.node_id, g)] for g in r.gpus) - r.vram_gib * len(r.gpus)
        return (round(max(0.0, stays), 6), -(r.started_at or inf), r.job_id)

    index = {r.job_id: i for i, r in enumerate(candidates)}
    heap = [(key(r), i) for i, r in enumerate(candidates)]
    heapq.heapify(heap)
    out: dict[str, tuple[int, int]] = {}
    while heap:
        k, i = heapq.heappop(heap)
        r = candidates[i]
        if r.job_id in out or need[r.template] <= 0 or k != key(r):
            continue  # stopped already, its template's surplus is stopped, or a stale key (a newer one is queued)
        need[r.template] -= 1
        out[r.job_id] = (len(by_template[r.template]), templates[r.template].max_concurrency)
        for g in r.gpus:
            committed[(r.node_id, g)] -= r.vram_gib
            for m in on_gpu[(r.node_id, g)]:
                if m.job_id not in out:
                    heapq.heappush(heap, (key(m), index[m.job_id]))
    return out


def _offering(n: _Node, gpu: bool) -> bool:
    """Whether ``n`` still offers work of its pool's kind: GPU work (a GPU offer left, or a GPU this plan opened
    with a fraction free, and GPU room), or CPU-only work (a CPU offer left)."""
    if gpu:
        return (n.offer_left > 0 or n.open_room > 0) and (n.whole_free > 0 or n.best_vram > 0)
    return n.cpu_offer_left > 0


def _same_values(tags: frozenset[str], keys: tuple[str, ...]) -> tuple[str, ...] | None:
    """The values of tag ``keys`` on a node (tags ``key=value``), or None when it lacks one: a gang's members
    share them (one provider, one region)."""
    out = []
    for k in keys:
        prefix = k + "="
        v = next((tag[len(prefix):] for tag in sorted(tags) if tag.startswith(prefix)), None)
        if v is None:
            return None
        out.append(v)
    return tuple(out)


def _fits_empty(t: JobTemplate, sh: _Shape, n: NodeView) -> bool:
    """Whether ``n`` could take one instance of ``t`` with nothing running (GPUs and VRAM, CPUs, memory, custom)."""
    r = t.resources
    k = int(r.num_gpus) if r.num_gpus >= 1 else (1 if r.num_gpus > 0 else 0)
    have = dict(n.custom)
    return ((k == 0 or sum(1 for g in n.gpus if usable_vram_gib(g.vram_gib, n.vram_limit_ratio) + EPS >= sh.vram) >= k)
            and (n.cpus <= 0 or n.cpus + 1e-9 >= r.num_cpus)
            and (n.memory_gib <= 0 or n.memory_gib + 1e-9 >= r.memory_gib)
            and all(have.get(name, 0.0) + 1e-9 >= amount for name, amount in r.custom))


TIER_RANK_COST = 10.0
STABLE_COST = 100.0
"""Score an ephemeral node loses for work of a stable kind: more than every tier step, the stranding cost and the
tag preferences together (a gang's members, scored side by side, go on durable nodes first too)."""
WASTE_COST = 25.0
HOLE_COST = 40.0
"""Score a fractional placement gains on a GPU that work already partly holds, plus the share held (0-1): fractions
are bin-packed, best fit first, before a fresh GPU is opened (Kubernetes' GPU-sharing binpack, Slurm's packing of
GPU shards), whatever the strategy says about nodes: the strategy then spreads or packs the GPUs it opens. More
than every tier step (a hole on a later tier of the kind fills before a fresh GPU of its first: the hole's GPU is
in use already, and placing the job elsewhere leaves that rest idle while it takes a GPU more), less than
``STABLE_COST`` (a stable kind's durable nodes still come first). Among holes the kind's tiers come first, then the
fullest GPU (best fit), less what each placement strands (``WASTE_COST``); among fresh GPUs, as before."""
GIB = 2**30
GPU_BOX_COST = 1.0
"""Score a node with GPUs loses for CPU-only work against a GPU-less node of its tier (a tenth of a tier step)."""
_NOT_GPU_ROOM = ("unsatisfiable", "a training job", "plan budget")
"""Pending reasons a spawn-rate backlog does not explain (no GPU room is not what holds them)."""
_GPU_WHY = "\x00"
"""Placeholder of a GPU template's pending reason, replaced when the plan is made by
:meth:`._planreasons._Reasons._gpu_reason` (every node's blocker as the plan leaves it)."""
_NO_OFFER_CPU = ("no capacity offered for CPU work (every node's CPU offer is used: its CPUs or memory are held, "
                 "its CPU is above the warn level, or it is degraded or cordoned)")


def _blocker(n: _Node, t: JobTemplate, running_instances: int, catalog: Catalog,
             need: Holding) -> str | Misfit | None:
    """Why ``t`` may not go on ``n`` apart from GPU fit and offer, or None; ``"strategy"`` (no reason of its own)
    when the template's placement rules the node out: a strict strategy, or hard tags the node lacks. Such a
    node is no cause: where no node carries the tags :func:`_unsatisfiable` says so, and otherwise the reason is
    what the nodes carrying them lack, named with the node (``node x carries the required tags @node=x but has 0
    of custom resource 'nvlink' free (asks 1)``). Resources: :func:`._nodefit.misfit` of ``need`` (what one
    instance asks here: ``_Shape.need``, or with predictions :meth:`._planstate._PlanState._need`), the check a
    node's admission makes too; a misfit only the predicted figures make is returned last, as the :class:`Misfit`
    (the planner words it: :meth:`._planstate._PlanState._predicted_why`)."""
    v = n.view
    hard = [a.tag for a in t.placement.affinity if a.hard]
    if hard and not all(tag in v.tags for tag in hard):
        return "strategy"
    prio = catalog.priority_of(t.kind)
    if not may_start(prio, v.level):
        return f"nodes that fit are degraded (level {v.level} refuses {prio.name} work)"
    if t.kind == "training" and v.disk_percent >= v.disk_max_percent:
        return "nodes that fit refuse training (disk at or above critical)"
    m = misfit(n, need)
    if m is not None and not m.predicted:
        which = "nodes that fit" if t.resources.num_gpus > 0 else "nodes offering CPU work"
        tagged = f"node {v.node_id} carries the required tags {', '.join(hard)} but has" if hard else ""
        if m.resource == "cpus":
            return f"{tagged} {m.free:g} free CPUs (asks {m.asks:g})" if hard else f"{which} lack {m.asks:g} free CPUs"
        if m.resource == "memory":
            return (f"{tagged} {m.free:g} GiB of free memory (asks {m.asks:g})" if hard
                    else f"{which} lack {m.asks:g} GiB of free memory")
        return (f"{tagged} {m.free:g} of custom resource {m.name!r} free (asks {m.asks:g})" if hard
                else f"{which} lack {m.asks:g} free of custom resource {m.name!r}")
    if t.gang is not None:
        return m  # a gang's strategy lays out its own members (_GangPlacing._try_gang), whatever other gangs do
    if t.placement.strategy == "strict_spread" and n.templates[t.name]:
        return "strategy"
    if t.placement.strategy == "strict_pack" and running_instances and not n.templates[t.name]:
        return "strategy"
    return m
