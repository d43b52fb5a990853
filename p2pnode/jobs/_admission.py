"""A node's own admission of an assignment, on top of the guard's: whether the GPUs the plan assigned and the
CPUs, memory, disk and custom resources its template asks for are free here. Pure: the node's newest sample and
snapshot and its running jobs are passed in.

The leader places with the same accounting (:func:`p2pnode.scheduler.plan`); the node checks again because its
view is newer than the leader's (a job that started since, a GPU whose memory filled). Jobs being stopped do not
count: their grace period overlaps the job that replaces them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ..guardcore import GuardLimits
from ..node import node_view_of
from ..resources import ResourceSample
from ..scheduler._catalog import ResourceRequest
from ..snapshot import PlanJob, Snapshot
from ._runner import RunningProcess

__all__ = ["gpu_conflict", "resource_conflict"]

GIB = 2**30


def gpu_conflict(j: PlanJob, sample: ResourceSample | None, running: Iterable[RunningProcess], *,
                 gpu_max_percent: float, full: Collection[int] = ()) -> str:
    """Why the GPUs assigned to ``j`` cannot take it on this node, or ''. ``sample``: the node's newest resource
    sample (GPU totals); ``running``: its jobs; ``gpu_max_percent``: the GPU memory limit (percent of each GPU's
    memory); ``full``: GPUs whose memory is at or above that limit (no new work on them)."""
    totals = {g.index: g.mem_total_bytes / GIB for g in sample.gpus} if sample else {}
    limit = gpu_max_percent / 100.0
    holding_all = [r for r in running if r.stopping is None]
    for g in j.gpus:
        if g not in totals:
            return f"no GPU {g} on this node"
        if g in full:
            return f"GPU {g} memory is at or above the GPU limit ({gpu_max_percent:g} %): no new work on it"
        holding = [r for r in holding_all if g in r.gpus]
        used_f = sum(r.gpu_fraction for r in holding)
        used_v = sum(r.vram_gib for r in holding)
        if used_f + j.gpu_fraction > 1.0 + 1e-9 or used_v + j.vram_gib > totals[g] * limit + 1e-9:
            return f"GPU {g} already committed ({used_f:g} of it, {used_v:g} GiB)"
    return ""


def resource_conflict(want: ResourceRequest, me: Snapshot, running: Iterable[RunningProcess],
                      limits: GuardLimits) -> str:
    """Why this node cannot give a template asking ``want`` the CPUs, memory, disk or custom resources, on top of
    what its ``running`` jobs hold; or ''. ``me``: this node's own newest snapshot. Capacity as the planner sees
    it (:func:`p2pnode.node.node_view_of`: declared, else measured); disk: the room left below the guard's disk
    limit (``limits.disk_max_percent``)."""
    view = node_view_of(me, disk_max_percent=limits.disk_max_percent,
                        vram_limit_ratio=limits.gpu_max_percent / 100.0,
                        memory_limit_ratio=limits.memory_max_percent / 100.0)
    held = [r.template.resources for r in running if r.stopping is None]
    cpus = sum(r.num_cpus for r in held)
    if view.cpus > 0 and cpus + want.num_cpus > view.cpus + 1e-9:
        return f"asks {want.num_cpus:g} CPUs; {max(0.0, view.cpus - cpus):g} of {view.cpus:g} are free here"
    mem = sum(r.memory_gib for r in held)
    if view.memory_gib > 0 and mem + want.memory_gib > view.memory_gib + 1e-9:
        return (f"asks {want.memory_gib:g} GiB of memory; {max(0.0, view.memory_gib - mem):.1f} of "
                f"{view.memory_gib:.1f} GiB are free here")
    res = me.resources
    if want.disk_gib > 0 and res.disk_total_bytes > 0:
        room = (res.disk_total_bytes * limits.disk_max_percent / 100.0 - res.disk_used_bytes) / GIB
        room -= sum(r.disk_gib for r in held)
        if want.disk_gib > room + 1e-9:
            return f"asks {want.disk_gib:g} GiB of disk; {max(0.0, room):.1f} GiB left below the disk limit"
    have = dict(view.custom)
    for name, amount in want.custom:
        used = sum(a for r in held for n, a in r.custom if n == name)
        if used + amount > have.get(name, 0.0) + 1e-9:
            return (f"asks {amount:g} of custom resource {name!r}; {max(0.0, have.get(name, 0.0) - used):g} "
                    "declared and free here")
    return ""
