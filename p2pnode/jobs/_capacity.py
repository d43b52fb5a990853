"""What this node's capacity offers are computed from, as it samples it (:class:`p2pnode.node.OfferSample`: each
GPU's utilization, the GPUs idle past the guard's grace, the CPUs and memory it gives to jobs, its CPU use); the job
core computes the offers from it inside its step (:mod:`p2pnode.node._offer`: the PID controller's 60-80 % band
for GPU work, seed 000; the free CPUs and memory for CPU-only work, :func:`p2pnode.scheduler.cpu_offer`). And, with
``--fake-gpus``, the simulated load that follows the jobs it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..guardcore import GuardLimits
from ..node import NodeContext, OfferSample, node_view_of
from ..resources import LOAD_PER_GPU, FakeGpus
from ._runner import RunningProcess

__all__ = ["LOAD_PER_GPU", "NodeOffer"]

GIB = 2**30


class NodeOffer:
    """The offers' inputs of node ``ctx`` (see module docstring). ``idle_gpus()`` is the guard's (GPUs idle past the
    idle grace); ``fake_gpus`` the simulated GPUs whose load follows the jobs (None: real GPUs); ``cpu_percent()``
    the guard's CPU figure (the mean over ``guard.cpu_window_s``; None or absent: the newest sample's)."""

    def __init__(self, ctx: NodeContext, limits: GuardLimits, *, idle_gpus: Callable[[], int],
                 fake_gpus: FakeGpus | None = None, cpu_percent: Callable[[], float | None] | None = None) -> None:
        self.ctx = ctx
        self.cpu_percent = cpu_percent or (lambda: None)
        self.limits = limits
        self.idle_gpus = idle_gpus
        self.fake_gpus = fake_gpus
        self._seen: tuple[object, float] = (None, 0.0)  # (the newest sample, when this driver first saw it)

    def sample(self) -> OfferSample | None:
        """The offers' inputs now (None before the first resource sample): the newest sample's GPU utilizations,
        stamped with when this driver first saw it (monotonic: a GPU a job left after it counts free); the guard's
        idle GPUs and CPU use (over its window); the CPUs and memory this node gives to jobs (:func:`p2pnode.node.
        node_view_of` of its own snapshot, else its newest sample's, the memory to the guard's limit)."""
        ctx, g = self.ctx, self.limits
        s = ctx.last_sample
        if s is None:
            return None
        if s is not self._seen[0]:
            self._seen = (s, ctx.now())
        me = ctx.member(ctx.node_id)
        if me is not None:
            view = node_view_of(me.snapshot, disk_max_percent=g.disk_max_percent,
                                vram_limit_ratio=g.gpu_max_percent / 100.0,
                                memory_limit_ratio=g.memory_max_percent / 100.0)
            cpus, memory = view.cpus, view.memory_gib
        else:  # before this node's first snapshot: its measured CPUs and memory
            cpus, memory = float(s.cpu_count), s.mem_total_bytes / GIB * g.memory_max_percent / 100.0
        windowed = self.cpu_percent()
        return OfferSample(gpu_util=tuple((x.index, x.util_percent) for x in s.gpus), sampled_at=self._seen[1],
                           idle_gpus=self.idle_gpus(), cpus=cpus, memory_gib=memory,
                           cpu_percent=s.cpu_percent if windowed is None else windowed,
                           cpu_warn_percent=g.cpu_warn_percent if g.cpu_max_percent > 0 else 100.0)

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
