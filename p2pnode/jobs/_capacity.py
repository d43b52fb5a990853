"""This node's capacity offers: how many more GPU jobs it asks the leader for, from its GPUs' utilization (the
PID controller's 60-80 % band, seed 000), GPUs idle past the grace period, GPUs its own jobs just left, and its
degradation level; how many more CPU-only jobs (``num_gpus = 0``), from the CPUs and memory its jobs leave free
(:func:`p2pnode.scheduler.cpu_offer`); and, with ``--fake-gpus``, the simulated load that follows the jobs it runs.

GPU utilization is the controller's input, never an overload signal: a free GPU (our jobs hold less than all of
it, below the band and not at its memory limit) is offered at once, one offer each, whatever the node's mean
utilization, so one GPU at 100 % never idles the other seven. The two offers are separate counts: CPU capacity
never adds to the GPU offer (which stays the PID band's), and a GPU-less node or one whose GPUs are busy still
offers its spare CPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import psutil

from ..guardcore import GuardLimits
from ..node import NodeContext, node_view_of
from ..resources import LOAD_PER_GPU, FakeGpus
from ..scheduler import CapacityController, cpu_offer
from ._runner import RunningProcess

__all__ = ["LOAD_PER_GPU", "NodeOffer"]

GIB = 2**30


class NodeOffer:
    """The offers of node ``ctx`` (see module docstring): :attr:`offer` (GPU jobs) and :attr:`cpu_offer`
    (CPU-only jobs). ``idle_gpus()`` and ``gpus_full()`` are the guard's (GPUs idle past the idle grace; GPUs at or
    above the GPU memory limit); ``fake_gpus`` the simulated GPUs whose load follows the jobs (None: real GPUs);
    ``cpu_percent()`` the guard's CPU figure (the mean over ``guard.cpu_window_s``; None or absent: the newest
    sample's)."""

    def __init__(self, ctx: NodeContext, limits: GuardLimits, *, idle_gpus: Callable[[], int],
                 gpus_full: Callable[[], Iterable[int]], fake_gpus: FakeGpus | None = None,
                 cpu_percent: Callable[[], float | None] | None = None) -> None:
        self.ctx = ctx
        self.cpu_percent = cpu_percent or (lambda: None)
        self.limits = limits
        self.idle_gpus = idle_gpus
        self.gpus_full = gpus_full
        self.fake_gpus = fake_gpus
        self.pid = CapacityController.for_host(limits, mem_total_bytes=psutil.virtual_memory().total)
        self.offer = 0
        self.cpu_offer = 0
        self._freed: set[int] = set()  # GPUs our jobs left since the sample ``_freed_in`` was taken
        self._freed_in: object = None

    def update(self, jobs: Iterable[RunningProcess]) -> int:
        """The PID controller's offer (GPU jobs) from this node's newest sample, idle GPUs and degradation level,
        with ``jobs`` (this node's) holding GPUs; kept in :attr:`offer` and returned. The CPU offer is refreshed
        too (:meth:`update_cpu`)."""
        ctx = self.ctx
        s = ctx.last_sample
        if s is None:
            return self.offer
        jobs = list(jobs)
        util = sum(g.util_percent for g in s.gpus) / len(s.gpus) if s.gpus else 0.0
        self.offer = self.pid.update(util, gpus=len(s.gpus), idle_gpus=max(self.idle_gpus(), self.free_gpus(jobs)),
                                     level=ctx.degradation_level, now=ctx.now())
        self.update_cpu(jobs)
        return self.offer

    def update_cpu(self, jobs: Iterable[RunningProcess]) -> int:
        """The CPU offer (CPU-only jobs, :func:`p2pnode.scheduler.cpu_offer`) from the CPUs and memory this node
        gives to jobs (declared, else measured: :func:`p2pnode.node.node_view_of` of its own snapshot, else its
        newest sample), what ``jobs`` (this node's, those not being stopped) hold of them by their templates, its
        CPU use (as the guard assesses it: over its window) against the guard's CPU warn level, its degradation
        level and its cordon; kept in
        :attr:`cpu_offer` and returned."""
        ctx, g = self.ctx, self.limits
        s = ctx.last_sample
        if s is None:
            return self.cpu_offer
        me = ctx.member(ctx.node_id)
        if me is not None:
            view = node_view_of(me.snapshot, disk_max_percent=g.disk_max_percent,
                                vram_limit_ratio=g.gpu_max_percent / 100.0,
                                memory_limit_ratio=g.memory_max_percent / 100.0)
            cpus, memory, cordoned = view.cpus, view.memory_gib, me.snapshot.operator.cordoned
        else:  # before this node's first snapshot: its measured CPUs and memory
            cpus, memory, cordoned = float(s.cpu_count), s.mem_total_bytes / GIB * g.memory_max_percent / 100.0, False
        held = [j.template.resources for j in jobs if j.stopping is None]
        windowed = self.cpu_percent()
        cpu_now = s.cpu_percent if windowed is None else windowed
        self.cpu_offer = cpu_offer(cpus=cpus, memory_gib=memory, held_cpus=sum(r.num_cpus for r in held),
                                   held_memory_gib=sum(r.memory_gib for r in held), cpu_percent=cpu_now,
                                   cpu_warn_percent=g.cpu_warn_percent if g.cpu_max_percent > 0 else 100.0,
                                   level=ctx.degradation_level,
                                   cordoned=cordoned)
        return self.cpu_offer

    def free_gpus(self, jobs: Iterable[RunningProcess]) -> int:
        """GPUs with a share free (``jobs`` hold less than all of it), below the utilization band and not full:
        capacity at once, one offer each (the planner fills a GPU idle at its plan's start with as many fractional
        jobs as fit it for that one offer, and gives a partly held GPU one job per offer: issue 38)."""
        s = self.ctx.last_sample
        if s is None:
            return 0
        held: dict[int, float] = {}
        for j in jobs:
            for g in j.gpus:
                held[g] = held.get(g, 0.0) + j.gpu_fraction
        full = set(self.gpus_full())
        freed = self._freed if self._freed_in is s else set()  # our job left since this sample was taken
        return sum(1 for g in s.gpus if held.get(g.index, 0.0) < 1.0 - 1e-9 and g.index not in full
                   and (g.util_percent < self.pid.band_min_percent or g.index in freed))

    def freed(self, gpus: Iterable[int]) -> None:
        """A job of ours left ``gpus``: count them free at once (the newest sample still shows its load)."""
        if self._freed_in is not self.ctx.last_sample:
            self._freed, self._freed_in = set(), self.ctx.last_sample
        self._freed.update(gpus)

    def drive_fake_gpus(self, jobs: Iterable[RunningProcess], floor: Callable[[str], float] | None = None) -> None:
        """Set each fake GPU's utilization and memory from the ``jobs`` on it: :data:`LOAD_PER_GPU` per unit of GPU
        each holds (a job told its share by ``P2PNODE_GPU_FRACTION`` sizes its work to it), and the VRAM each uses:
        what its template asks, at least its config's ``floor``, never more than it was given (a job caps its
        memory at ``P2PNODE_VRAM_GIB`` but uses what it needs, not the remainder the planner added to its share:
        issue 38). Nothing with real GPUs."""
        source = self.fake_gpus
        if source is None:
            return
        util: dict[int, float] = {}
        mem: dict[int, float] = {}
        for j in jobs:
            for g in j.gpus:
                util[g] = util.get(g, 0.0) + j.gpu_fraction * LOAD_PER_GPU.get(j.template.kind, 70.0)
                need = max(j.template.resources.vram_gib, floor(j.template.config) if floor else 0.0)
                mem[g] = mem.get(g, 0.0) + min(j.vram_gib, need if need > 0 else j.vram_gib) * GIB
        for g in range(len(source.read())):
            source.set_load(g, util_percent=util.get(g, 0.0), mem_used_bytes=int(mem.get(g, 0.0)))
