"""Whether one job fits one node given what runs there: the one per-node accounting that the leader's placement
(:mod:`._plancands`, :func:`._planshape._blocker`, over its :class:`._nodecap.NodeCap`) and a node's own admission
(:mod:`p2pnode.node._admit`, :func:`node_misfit`) both call: :func:`misfit` (issue 39, item 4). Pure.

* **Declared or predicted, chosen once** (:func:`need_of`): a job asks its declared figures, except that where
  history predicts its template's peak RSS p90 on the node's class, it holds that peak when above its declared
  ``memory_gib`` (:func:`memory_need_gib`), and where history predicts its peak VRAM p90, that figure per GPU must
  fit what one of the node's GPUs may commit (:func:`._gpucap.usable_vram_gib`). The leader's prediction comes
  from the fleet's history (:class:`._predict.Predictor`), and its plan carries the figures it placed each job by
  (:func:`figures_of`; :class:`p2pnode.snapshot.PlanJob` ``memory_gib``, ``vram_peak_gib``): a node admits a
  planned job by them (``need_of(..., planned=...)``), so a node with no history of its own judges it as the
  leader did. Only where a plan carries none (the leader had no history figure, or predates the fields) and for
  its leaderless plan (:meth:`p2pnode.node._admit.Admission.autonomous`) does a node use its own predictor (its
  own runs' history, and the fleet's while it leads: :meth:`p2pnode.node.JobCore._refresh_predictor`), for its
  class.
* **Checks, in order** (:func:`misfit`): CPUs and memory only where the node accounts them (``cpus`` /
  ``memory_gib`` > 0 in its :class:`NodeView`), the declared memory before custom resources and the predicted
  memory after them (the leader's reasons name what the declared figures alone lack first), then the predicted
  VRAM per GPU. The leader words a :class:`Misfit` for its pending reasons, a node for its refusal. The leader
  skips the call where it cannot refuse (a node that accounts neither CPUs nor memory, for a template with no
  custom resources and no prediction: ``_Candidates._assess``).
* **GPUs** (:func:`node_misfit`, a node's side): the GPUs a plan assigned, each within its fraction (sums to 1)
  and its usable VRAM, by the same :class:`._nodecap.NodeCap` arithmetic (``take``) the planner uses (the leader
  chooses GPUs by :meth:`._nodecap.NodeCap.fit`, which keeps the same bounds); **disk**: the room below the
  guard's disk limit, when known (a node's side only: the leader has no disk figures per job).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import NamedTuple

import msgspec

from ._gpucap import EPS
from ._nodecap import NodeCap
from ._planview import NodeView
from ._predict import Prediction
from ._templates import ResourceRequest

__all__ = ["Figures", "Holding", "Misfit", "figures_of", "memory_need_gib", "misfit", "misfit_words", "need_of",
           "node_misfit"]

GIB = 2**30
MAX_FIGURE_GIB = 1e6
"""A predicted figure (GiB), at most: the wire's bound of :class:`p2pnode.snapshot.PlanJob` ``memory_gib`` and
``vram_peak_gib``. History's figures are clamped to it (a NaN counts as the bound) before anything is decided by
them, so a plan never carries a figure a node cannot decode, and a node holding the plan's figure decides as the
leader did (no node has that much memory, nor a GPU that much VRAM)."""


def memory_need_gib(declared_gib: float, predicted_gib: float | None) -> float:
    """GiB of memory one instance holds: the predicted peak RSS p90 ``predicted_gib`` (None: no prediction from
    history) when above ``declared_gib``, else ``declared_gib``."""
    if predicted_gib is None:
        return declared_gib
    return max(declared_gib, predicted_gib)


class Holding(msgspec.Struct, frozen=True):
    """What one job holds, or asks, on a node: ``gpus`` (indices) with ``gpu_fraction`` and ``vram_gib`` of each,
    ``cpus``, ``memory_gib`` (:func:`memory_need_gib`), ``disk_gib`` and ``custom`` ``(name, amount)`` pairs;
    from :func:`need_of` also ``declared_memory_gib`` (None: ``memory_gib`` is the declared figure),
    ``vram_peak_gib`` (predicted peak VRAM p90 per GPU, 0: none predicted) and ``runs`` (the runs behind the
    prediction)."""

    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 0.0
    vram_gib: float = 0.0
    cpus: float = 0.0
    memory_gib: float = 0.0
    disk_gib: float = 0.0
    custom: tuple[tuple[str, float], ...] = ()
    declared_memory_gib: float | None = None
    vram_peak_gib: float = 0.0
    runs: int = 0


class Figures(NamedTuple):
    """The predicted figures a leader placed one job by, as its plan carries them to the node
    (:class:`p2pnode.snapshot.PlanJob` ``memory_gib``, ``vram_peak_gib``): ``memory_gib`` the GiB of memory one
    instance holds (:func:`memory_need_gib` of the declared figure and the predicted peak RSS p90), ``vram_peak_gib``
    the predicted peak VRAM p90 per GPU (0: none predicted)."""

    memory_gib: float
    vram_peak_gib: float = 0.0


def figures_of(need: Holding) -> Figures | None:
    """The :class:`Figures` of ``need`` (:func:`need_of`) that a plan carries, or None where ``need`` holds the
    declared figures (no history figure: the plan carries none). ``need_of(r, None, planned=figures_of(need))``
    is ``need`` but for ``runs``."""
    if need.declared_memory_gib is None:
        return None
    return Figures(min(MAX_FIGURE_GIB, need.memory_gib), need.vram_peak_gib)


def _figure(gib: float) -> float:
    """``gib`` within 0..:data:`MAX_FIGURE_GIB` (NaN: the bound)."""
    return max(0.0, min(MAX_FIGURE_GIB, gib))


def need_of(r: ResourceRequest, p: Prediction | None, gpus: tuple[int, ...] = (), gpu_fraction: float = 0.0,
            vram_gib: float = 0.0, *, planned: Figures | None = None) -> Holding:
    """What one instance of a template with resources ``r`` asks of a node whose class has prediction ``p``
    (None, or a prediction not from history: the declared figures), with ``gpus``, ``gpu_fraction`` and
    ``vram_gib`` where a plan assigned them: the one choice between declared and predicted figures (module
    docstring). The predicted VRAM per GPU is the peak VRAM p90 over the GPUs the template asks (at least one).
    ``planned``: the figures the leader's plan placed the job by (:func:`figures_of`, carried in
    :class:`p2pnode.snapshot.PlanJob`), taken instead of ``p``: a node admits a planned job as the leader placed it
    (the memory never below ``r``'s declared figure)."""
    custom = tuple(r.custom)
    if planned is not None:
        return Holding(gpus, gpu_fraction, vram_gib, r.num_cpus, memory_need_gib(r.memory_gib, planned.memory_gib),
                       r.disk_gib, custom, r.memory_gib, planned.vram_peak_gib)
    if p is None or p.source != "history" or (p.rss_p90_bytes is None and p.vram_p90_bytes is None):
        return Holding(gpus, gpu_fraction, vram_gib, r.num_cpus, r.memory_gib, r.disk_gib, custom)
    memory = memory_need_gib(r.memory_gib, None if p.rss_p90_bytes is None else _figure(p.rss_p90_bytes / GIB))
    peak = 0.0
    if p.vram_p90_bytes is not None and r.num_gpus > 0:
        peak = _figure(p.vram_p90_bytes / GIB / max(1, int(r.num_gpus)))
    return Holding(gpus, gpu_fraction, vram_gib, r.num_cpus, memory, r.disk_gib, custom, r.memory_gib, peak, p.runs)


class Misfit(NamedTuple):
    """Why a job does not fit a node (:func:`misfit`): ``resource`` (``"cpus"``, ``"memory"``, ``"custom"`` with
    its ``name``, ``"vram"``: the predicted peak VRAM per GPU), what it ``asks``, what is ``free`` (for
    ``"vram"``: the most one GPU of the node may commit), and whether only the ``predicted`` figure misfits (the
    declared one would fit)."""

    resource: str
    asks: float
    free: float
    name: str = ""
    predicted: bool = False


def misfit(cap: NodeCap, need: Holding) -> Misfit | None:
    """The first resource of ``need`` (:func:`need_of`) that ``cap``'s node (its free capacity: the planner's
    :class:`NodeCap` as a plan stands, or :func:`node_cap` of what runs on a node) lacks, or None: the one check
    the leader's placement and a node's admission share (module docstring)."""
    v = cap.view
    if v.cpus > 0 and need.cpus > cap.cpus + EPS:
        return Misfit("cpus", need.cpus, cap.cpus)
    short = v.memory_gib > 0 and need.memory_gib > cap.memory + EPS
    declared = need.memory_gib if need.declared_memory_gib is None else need.declared_memory_gib
    if short and declared > cap.memory + EPS:
        return Misfit("memory", declared, cap.memory)
    for name, amount in need.custom:
        free = cap.custom.get(name, 0.0)
        if amount > free + EPS:
            return Misfit("custom", amount, free, name)
    if short:
        return Misfit("memory", need.memory_gib, cap.memory, predicted=True)
    if need.vram_peak_gib > 0 and cap.usable:
        top = max(cap.usable.values())
        if need.vram_peak_gib > top + EPS:
            return Misfit("vram", need.vram_peak_gib, top, predicted=True)
    return None


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
    """Why ``want`` (:func:`need_of` with the GPUs a plan assigned) does not fit ``view``'s node on top of ``held``
    (the jobs that hold resources there), or '': its GPUs, then the disk, then :func:`misfit` (what the leader's
    placement checks). ``full``: GPUs at or above the guard's GPU memory limit (no new work on them; with the
    view's own ``full`` flags); ``disk_room_gib``: GiB left below the guard's disk limit before ``held`` (None: not
    counted)."""
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
    if want.disk_gib > 0 and disk_room_gib is not None:
        room = disk_room_gib - sum(h.disk_gib for h in held)
        if want.disk_gib > room + EPS:
            return f"asks {want.disk_gib:g} GiB of disk; {max(0.0, room):.1f} GiB left below the disk limit"
    m = misfit(cap, want)
    return "" if m is None else misfit_words(view, m)


def misfit_words(view: NodeView, m: Misfit) -> str:
    """A node's refusal for ``m`` (:func:`misfit` on ``view``'s node), e.g. ``"asks 4 CPUs; 2 of 6 are free
    here"``."""
    free = max(0.0, m.free)
    if m.resource == "cpus":
        return f"asks {m.asks:g} CPUs; {free:g} of {view.cpus:g} are free here"
    if m.resource == "memory":
        return f"asks {m.asks:g} GiB of memory; {free:.1f} of {view.memory_gib:.1f} GiB are free here"
    if m.resource == "custom":
        return f"asks {m.asks:g} of custom resource {m.name!r}; {free:g} declared and free here"
    return (f"predicted peak VRAM {m.asks:.1f} GiB per GPU exceeds what one GPU here may commit "
            f"({free:.1f} GiB)")
