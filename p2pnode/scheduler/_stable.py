"""Room for stable kinds on a durable node that plans its own work before any leader exists. Pure.

A node with no leader runs ``autonomous`` templates on its own view (:meth:`p2pnode.node.JobCore.step`, a plan with
``autonomous_only``). Left alone, that plan fills a durable box's GPUs with autonomous selfplay at start-up, and
the first leader's plan then finds no room there for the work ``[policy] stable`` sends to durable nodes (training:
on seed 003's fleet the durable H200 ran selfplay 0.6 s after its start and no training ever ran on it). So before
that plan, :func:`reserve_for_stable` marks as full (taking no new work, :attr:`p2pnode.scheduler.GpuView.full`)
the GPUs that the largest template of a stable kind able to run here needs; the leader's plan, which sees the
node's real GPUs, places the stable work there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

from ._catalog import Catalog
from ._plan import GpuView, NodeView, RunningJob, _fits_empty, _shape_of, node_tier

__all__ = ["reserve_for_stable", "stable_need"]


def stable_need(v: NodeView, catalog: Catalog) -> tuple[int, float] | None:
    """``(GPUs, VRAM GiB per GPU)`` the largest template of a stable kind (``[policy] stable``) needs on node
    ``v`` -- the most GPUs, then the most VRAM -- among those the node could take when empty: its tier in the
    kind's tiers, its hard tags on the node, its GPUs (a fraction counts as one whole GPU), VRAM floor, CPUs,
    memory and custom resources fit; a template run only on demand (``max_concurrency = 0``) does not count.
    None when ``v`` is ephemeral, has no GPU, or no such template fits it."""
    if v.ephemeral or not v.gpus or not catalog.policy.stable:
        return None
    tier = node_tier(v)
    need: tuple[int, float] | None = None
    for t in catalog.templates.values():
        if t.resources.num_gpus <= 0 or t.max_concurrency <= 0 or not catalog.is_stable(t.kind):
            continue
        sh = _shape_of(t, catalog)
        if tier not in sh.tiers or not set(sh.hard) <= v.tags or not _fits_empty(t, sh, v):
            continue
        k = (max(1, math.ceil(t.resources.num_gpus - 1e-9)), sh.vram)
        if need is None or k > need:
            need = k
    return need


def reserve_for_stable(v: NodeView, catalog: Catalog, running: Iterable[RunningJob] = ()) -> NodeView:
    """The view of node ``v`` that its leaderless (autonomous) plan uses: the GPUs :func:`stable_need` asks for,
    taken from the GPUs no job in ``running`` holds whose VRAM under the node's limit fits it (lowest index
    first, as the planner picks whole GPUs), marked full so that autonomous work leaves them free. Fewer are kept
    when fewer are free (what runs is never stopped for it); ``v`` itself when nothing is to be kept."""
    need = stable_need(v, catalog)
    if need is None:
        return v
    k, vram = need
    busy = {i for r in running for i in r.gpus}
    free = [g.index for g in v.gpus
            if not g.full and g.index not in busy and g.vram_gib * v.vram_limit_ratio + 1e-9 >= vram]
    keep = set(sorted(free)[:k])
    if not keep:
        return v
    return msgspec.structs.replace(v, gpus=tuple(GpuView(g.index, g.vram_gib, g.full or g.index in keep)
                                                 for g in v.gpus))
