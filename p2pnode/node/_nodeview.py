"""The planner's view of a member (:class:`p2pnode.scheduler.NodeView`) from its typed snapshot, and the room a
member whose running list is unknown proves by its offers. Pure functions, used by the leader's planning
(:mod:`p2pnode.node._plans`, :mod:`p2pnode.node._lead`) and the agent's job control.
"""

from __future__ import annotations

from msgspec.structs import replace

from ..resources import rank_of_gpus
from ..scheduler import GpuView, NodeView, node_class_of
from ..scheduler._cpuoffer import CPU_PER_JOB, MEMORY_PER_JOB_GIB
from ..scheduler._gpucap import MAX_VRAM_GIB
from ..snapshot import Snapshot, cost_per_hour

__all__ = ["BUSY_GPU_MEMORY_FRACTION", "busy_gpus_of", "host_of", "node_view_of", "proven_room_view"]

GIB = 2**30


def node_view_of(snap: Snapshot, *, disk_max_percent: float, vram_limit_ratio: float,
                 offer: int | None = None, level: int | None = None, memory_limit_ratio: float = 0.8,
                 cpu_offer: int | None = None, addr: str | None = None) -> NodeView:
    """The planner's view of a member from its snapshot (VRAM committed only up to ``vram_limit_ratio`` of each
    GPU, the guard's GPU memory limit). ``offer`` (GPU jobs), ``cpu_offer`` (CPU-only jobs) and ``level``
    override the snapshot's (this node's own); a node the operator cordoned offers nothing. CPUs
    and memory for jobs: the declared ``cpus`` / ``memory_gib`` (:mod:`p2pnode.resources._declared`), else the
    CPU count and the total memory times ``memory_limit_ratio`` (the guard's memory limit); custom resources:
    the other declared ones. Node class (for predictions): the one it publishes (``jobs.node_class``), else
    :func:`p2pnode.scheduler.node_class_of` its GPU names. ``addr``: the address to give gang peers (a member's
    :attr:`p2pnode.node.Member.addr`, "" when the dial policy refuses the advertised one: such a node hosts no
    gang, so no gang member's engine dials it); None: the snapshot's own. A GPU counts for at most
    :data:`p2pnode.scheduler._gpucap.MAX_VRAM_GIB` GiB (a snapshot may claim up to 2**62 bytes; the plan's VRAM
    grants must stay within the wire's bound)."""
    r = snap.resources
    declared = r.declared
    cpus = declared.get("cpus", float(r.cpu_count))
    memory = declared.get("memory_gib", r.mem_total_bytes / GIB * memory_limit_ratio)
    custom = tuple(sorted((k, v) for k, v in declared.items() if k not in ("cpus", "memory_gib")))
    tags = frozenset(snap.tags)
    full = set(snap.guard.gpus_full)
    cost = cost_per_hour(tags)
    return NodeView(
        snap.origin,
        tuple(GpuView(g.index, min(g.mem_total_bytes / GIB, MAX_VRAM_GIB), g.index in full)
              for g in snap.resources.gpus),
        tags, cost, "ephemeral" in tags,
        0 if snap.operator.cordoned else snap.jobs.offer if offer is None else offer,
        snap.guard.level if level is None else level,
        snap.resources.disk_percent, disk_max_percent, cpus=cpus, memory_gib=memory, custom=custom,
        vram_limit_ratio=vram_limit_ratio,
        cpu_offer=0 if snap.operator.cordoned else snap.jobs.cpu_offer if cpu_offer is None else cpu_offer,
        waiting=snap.jobs.waiting, spawn_rate=snap.jobs.spawn_rate, host=host_of(snap.addr if addr is None else addr),
        engines=frozenset(snap.jobs.engines) or frozenset({"process"}),
        power=rank_of_gpus((g.name, g.mem_total_bytes) for g in snap.resources.gpus)[0],
        node_class=snap.jobs.node_class or node_class_of(g.name for g in snap.resources.gpus),
    )


BUSY_GPU_MEMORY_FRACTION = 0.05
"""A GPU whose measured memory in use is at least this share of its memory holds work (:func:`busy_gpus_of`)."""
def busy_gpus_of(snap: Snapshot) -> frozenset[int]:
    """The GPU indices of ``snap``'s newest resource sample whose measured memory in use is at least
    :data:`BUSY_GPU_MEMORY_FRACTION` of their memory: work is on them, whoever runs it."""
    return frozenset(g.index for g in snap.resources.gpus
                     if g.mem_total_bytes and g.mem_used_bytes >= BUSY_GPU_MEMORY_FRACTION * g.mem_total_bytes)


def proven_room_view(v: NodeView, busy_gpus: frozenset[int] | set[int]) -> NodeView:
    """The planner's view of a member whose running list is unknown (its snapshot names it by digest and the leader
    could not fetch it yet): only the room its own offers prove. GPU work: its GPU offer (a count of jobs), on the
    GPUs its newest sample shows free (``busy_gpus``, :func:`busy_gpus_of`, are taken as full); CPU-only work: its
    CPU offer, which counts free unit jobs (:data:`p2pnode.scheduler._cpuoffer.CPU_PER_JOB` CPUs and
    :data:`~p2pnode.scheduler._cpuoffer.MEMORY_PER_JOB_GIB` GiB each), so its CPUs and memory are that many units
    (when it accounts them); none of its custom resources (its jobs may hold them); no gang member (no ``host``: a
    gang's port blocks are laid out from its running jobs). Training is kept off it, and new trainings of configs
    with no training known to run anywhere are held, by the planner (:meth:`Planner._guarded`): one training per
    config, and it may run one already. The planner offers this view only within the grace
    (``adopt_grace_s`` + 2 x ``interval_s``) after it first planned with the list unknown; past it the member gets no
    view, no new work, and what earlier plans placed there stops counting (:meth:`Planner._lead`)."""
    units = v.cpu_offer
    floor = 1e-6  # accounted, with nothing free (0 would mean "not accounted")
    return replace(
        v, gpus=tuple(replace(g, full=True) if g.index in busy_gpus and not g.full else g for g in v.gpus),
        cpus=max(floor, min(v.cpus, units * CPU_PER_JOB)) if v.cpus > 0 else 0.0,
        memory_gib=max(floor, min(v.memory_gib, units * MEMORY_PER_JOB_GIB)) if v.memory_gib > 0 else 0.0,
        custom=(), host="")


def host_of(addr: str) -> str:
    """The host of an advertised ``host:port`` or ``[v6]:port`` (already checked against the snapshot's
    :data:`p2pnode.snapshot.ADDR_PATTERN`); "" for none."""
    if addr.startswith("["):
        return addr[1:].partition("]")[0]
    return addr.rpartition(":")[0]
