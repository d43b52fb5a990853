"""Room for stable kinds on a durable node that plans its own work before any leader exists. Pure.

A node with no leader runs ``autonomous`` templates on its own view (:meth:`p2pnode.node.JobCore.step`, a plan with
``autonomous_only``). Left alone, that plan fills a durable box's GPUs with autonomous selfplay at start-up, and
the first leader's plan then finds no room there for the work ``[policy] stable`` sends to durable nodes (training:
on seed 003's fleet the durable H200 ran selfplay 0.6 s after its start and no training ever ran on it). So before
that plan, :func:`reserve_for_stable` marks as kept (taking no new work, :attr:`p2pnode.scheduler.GpuView.kept`)
at most one GPU that the largest template of a stable kind able to run here needs; the leader's plan, which sees
the node's real GPUs, places the stable work there (a larger training's other GPUs come from its preemption).

Bounded: nothing is kept for a template that is itself ``autonomous`` (the node runs it on its own), in a fleet
with no ephemeral member (the planner then searches no durable node first), while a job of a stable kind already
runs on the node, nor (the caller's part, :meth:`p2pnode.node.JobCore.step`) longer than
:data:`STABLE_RESERVE_INTERVALS` plan intervals without a leader.

A template's ``max_concurrency`` is cluster-wide, but each leaderless node plans on its own view, where only its own
instances count: on seed 003's fleet six nodes starting together ran 15-17 ``selfplay-hex8_2p`` and 13
``selfplay-square8_2p`` against a cap of 8 each, and until that surplus ended (60-90 s) the first leader's plans
replaced no ending instance of them, so holes in partly held GPUs stayed empty. :func:`leaderless_catalog` bounds
each node's share from what gossip tells it (issue 38): the cluster runs at most the cap plus one instance per node
(rounding) when every node knows every member, and no more than the cap once a node hears of instances already
running elsewhere. Nothing running is stopped for it (no work lost); trainings are not ``autonomous`` and keep their
own rule (one per config cluster-wide, the leader's).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import msgspec

from ._catalog import Catalog
from ._gpucap import EPS, fits_gpu, usable_vram_gib
from ._planshape import _fits_empty, _shape_of
from ._planview import NodeView, RunningJob, node_tier

__all__ = ["STABLE_RESERVE_INTERVALS", "leaderless_cap", "leaderless_catalog", "reserve_for_stable", "stable_need"]

STABLE_RESERVE_INTERVALS = 3
"""Plan intervals (``[scheduler] interval_s``, 5 s by default: 15 s) a node with no leader keeps a GPU for a stable
kind, counted from its first leaderless step; after that (an election that does not come: a partition, a lost
quorum) its autonomous plan uses every GPU, and once a leader was seen it keeps nothing again in this run."""


def stable_need(v: NodeView, catalog: Catalog) -> tuple[int, float] | None:
    """``(GPUs, VRAM GiB per GPU)`` the largest template of a stable kind (``[policy] stable``) needs on node
    ``v`` -- the most GPUs, then the most VRAM -- among those the node could take when empty: its tier in the
    kind's tiers, its hard tags on the node, its GPUs (a fraction counts as one whole GPU), VRAM floor, CPUs,
    memory and custom resources fit; a template run only on demand (``max_concurrency = 0``) or ``autonomous``
    (run here without a leader anyway) does not count. None when ``v`` is ephemeral, has no GPU, or no such
    template fits it."""
    if v.ephemeral or not v.gpus or not catalog.policy.stable:
        return None
    tier = node_tier(v)
    need: tuple[int, float] | None = None
    for t in catalog.templates.values():
        if t.resources.num_gpus <= 0 or t.max_concurrency <= 0 or t.autonomous or not catalog.is_stable(t.kind):
            continue
        sh = _shape_of(t, catalog)
        if tier not in sh.tiers or not set(sh.hard) <= v.tags or not _fits_empty(t, sh, v):
            continue
        k = (max(1, math.ceil(t.resources.num_gpus - EPS)), sh.vram)
        if need is None or k > need:
            need = k
    return need


def reserve_for_stable(v: NodeView, catalog: Catalog, running: Iterable[RunningJob] = (), *,
                       mixed: bool = True) -> NodeView:
    """The view of node ``v`` that its leaderless (autonomous) plan uses: one GPU that :func:`stable_need` asks
    for (at most one, whatever the template's GPU count or fraction: a bounded cost), the lowest-indexed one no
    job in ``running`` holds whose usable VRAM (:func:`p2pnode.scheduler._gpucap.usable_vram_gib`) fits it,
    marked :attr:`GpuView.kept` so that autonomous work leaves it free (what runs is never stopped for it).
    ``v`` itself when nothing is to be kept: ``mixed`` False (no ephemeral member known: the planner puts no
    durable node first), a job of a stable kind already in ``running``, no such template, no such GPU free."""
    running = tuple(running)
    if not mixed or any(catalog.is_stable(t.kind) for r in running
                        if (t := catalog.templates.get(r.template)) is not None):
        return v
    need = stable_need(v, catalog)
    if need is None:
        return v
    vram = need[1]
    busy = {i for r in running for i in r.gpus}
    free = [g.index for g in v.gpus if not g.full and g.index not in busy
            and fits_gpu(usable_vram_gib(g.vram_gib, v.vram_limit_ratio), vram)]
    if not free:
        return v
    keep = min(free)
    return msgspec.structs.replace(v, gpus=tuple(msgspec.structs.replace(g, kept=True) if g.index == keep else g
                                                 for g in v.gpus))


def leaderless_cap(cap: int, mine: float, total: float, elsewhere: int) -> int:
    """Instances of a template with ``max_concurrency`` ``cap`` a node may run with no leader:
    ``ceil(cap x mine / total)`` (its share of the capacity of the live members known that the template may use,
    ``mine`` and ``total`` in GPUs, or CPUs for CPU-only work, this node included in ``total``), and no more than
    the cap less the ``elsewhere`` instances other members report running. ``cap`` when ``total`` is 0 (nothing
    known to share with); never below 0."""
    share = cap if total <= 0 else math.ceil(cap * min(1.0, mine / total) - EPS)
    return max(0, min(share, cap - elsewhere))


def leaderless_catalog(catalog: Catalog, me: NodeView, others: Iterable[NodeView],
                       elsewhere: Iterable[str] = ()) -> Catalog:
    """``catalog`` with each ``autonomous`` template's ``max_concurrency`` lowered to :func:`leaderless_cap` for
    node ``me``: ``others`` the views of the other live members it knows, ``elsewhere`` the template names of the
    jobs they report running (one entry per job). A member counts toward a template's total when its tier is one
    the template may use (:meth:`Catalog.tiers_of`), by its GPUs (a GPU template) or its CPUs (a CPU-only one).
    The catalog itself when no cap is lowered; its digest is kept (the same catalog, planned by a narrower
    share)."""
    others = tuple(others)
    counts: dict[str, int] = {}
    for name in elsewhere:
        counts[name] = counts.get(name, 0) + 1
    lowered = {}
    for t in catalog.templates.values():
        if not t.autonomous or t.max_concurrency <= 0:
            continue
        tiers, gpu = catalog.tiers_of(t), t.resources.num_gpus > 0
        mine = _units(me, tiers, gpu)
        cap = leaderless_cap(t.max_concurrency, mine, mine + sum(_units(v, tiers, gpu) for v in others),
                             counts.get(t.name, 0))
        if cap < t.max_concurrency:
            lowered[t.name] = msgspec.structs.replace(t, max_concurrency=cap)
    if not lowered:
        return catalog
    return dataclasses.replace(catalog, templates={k: lowered.get(k, t) for k, t in catalog.templates.items()})


def _units(v: NodeView, tiers: tuple[int, ...], gpu: bool) -> float:
    """What node ``v`` counts toward a template's share: its GPUs (``gpu``) or CPUs (at least 1: a node that does
    not account CPUs still takes CPU work), 0 when its tier is not in ``tiers``."""
    if node_tier(v) not in tiers:
        return 0.0
    return float(len(v.gpus)) if gpu else max(1.0, v.cpus)
