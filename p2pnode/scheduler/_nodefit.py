"""Whether one job fits one node given what runs there: the one per-node accounting that the leader's placement
(:class:`._nodecap.NodeCap`, :mod:`._planstate`) and a node's own admission (:mod:`p2pnode.node._admit`) share
(issue 39). Pure.

* **Memory: declared or predicted, chosen once.** A job holds :func:`memory_need_gib`: its predicted peak RSS p90
  when history predicts one for its template on the node's class (never below its declared ``memory_gib``), else
  its declared ``memory_gib``. The leader accounts running jobs and places new ones by it (:meth:`._planstate.
  _Planning._extra_gib`, ``_mem_misfit``); a node admits by it, with its own predictor's figure for its class.
* **GPUs.** The GPUs a plan assigned, each within its fraction (sums to 1) and its usable VRAM
  (:func:`._gpucap.usable_vram_gib`), the same :class:`._nodecap.NodeCap` arithmetic (``take``) the planner uses.
* **CPUs, memory, custom resources** counted only where the node accounts them (``cpus``/``memory_gib`` > 0 in its
  :class:`NodeView`, as the planner's ``_blocker``); **disk**: the room below the guard's disk limit, when known.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import msgspec

from ._gpucap import EPS
from ._nodecap import NodeCap
from ._planview import NodeView

__all__ = ["Holding", "memory_need_gib", "node_misfit"]


def memory_need_gib(declared_gib: float, predicted_gib: float | None) -> float:
    """GiB of memory one instance holds (the one choice between declared and predicted figures): the predicted
    peak RSS p90 ``predicted_gib`` (None: no prediction from history) when above ``declared_gib``, else
    ``declared_gib``."""
    if predicted_gib is None:
        return declared_gib
    return max(declared_gib, predicted_gib)


class Holding(msgspec.Struct, frozen=True):
    """What one job holds, or asks, on a node: ``gpus`` (indices) with ``gpu_fraction`` and ``vram_gib`` of each,
    ``cpus``, ``memory_gib`` (:func:`memory_need_gib`), ``disk_gib`` and ``custom`` ``(name, amount)`` pairs."""

    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 0.0
    vram_gib: float = 0.0
    cpus: float = 0.0
    memory_gib: float = 0.0
    disk_gib: float = 0.0
    custom: tuple[tuple[str, float], ...] = ()


def node_cap(view: NodeView, held: Iterable[Holding]) -> NodeCap:
    """The planner's free capacity of ``view``'s node once ``held`` is accounted (GPU fractions, VRAM, CPUs,
    memory, custom resources), every GPU counted from empty (full GPUs are :func:`node_misfit`'s own check)."""
    cap = NodeCap(view, 0)
    cap.frac_free = dict.fromkeys(cap.frac_free, 1.0)
    for h in held:
        cap.take(h.gpus, h.gpu_fraction, h.vram_gib, refresh=False)
        cap.cpus -= h.cpus
        cap.memory -= h.memory_gib
        for name, amount in h.custom:
            cap.custom[name] = cap.custom.get(name, 0.0) - amount
    return cap


def node_misfit(view: NodeView, held: Iterable[Holding], want: Holding, *, full: Collection[int] = (),
                disk_room_gib: float | None = None) -> str:
    """Why ``want`` does not fit ``view``'s node on top of ``held`` (the jobs that hold resources there), or ''.
    ``full``: GPUs at or above the guard's GPU memory limit (no new work on them; with the view's own ``full``
    flags); ``disk_room_gib``: GiB left below the guard's disk limit before ``held`` (None: not counted)."""
    held = list(held)
    cap = node_cap(view, held)
    flagged = {g.index for g in view.gpus if g.full}
    for g in want.gpus:
        if g not in cap.frac_free:
            return f"no GPU {g} on this node"
        if g in full or g in flagged:
            return f"GPU {g} memory is at or above the GPU limit: no new work on it"
        used_f, used_v = 1.0 - cap.frac_free[g], cap.usable[g] - cap.vram_free[g]
        if want.gpu_fraction > cap.frac_free[g] + EPS or want.vram_gib > cap.vram_free[g] + EPS:
            return f"GPU {g} already committed ({used_f:g} of it, {used_v:g} GiB)"
    if view.cpus > 0 and want.cpus > cap.cpus + EPS:
        return f"asks {want.cpus:g} CPUs; {max(0.0, cap.cpus):g} of {view.cpus:g} are free here"
    if view.memory_gib > 0 and want.memory_gib > cap.memory + EPS:
        return (f"asks {want.memory_gib:g} GiB of memory; {max(0.0, cap.memory):.1f} of {view.memory_gib:.1f} GiB "
                "are free here")
    if want.disk_gib > 0 and disk_room_gib is not None:
        room = disk_room_gib - sum(h.disk_gib for h in held)
        if want.disk_gib > room + EPS:
            return f"asks {want.disk_gib:g} GiB of disk; {max(0.0, room):.1f} GiB left below the disk limit"
    for name, amount in want.custom:
        free = cap.custom.get(name, 0.0)
        if amount > free + EPS:
            return f"asks {amount:g} of custom resource {name!r}; {max(0.0, free):g} declared and free here"
    return ""
