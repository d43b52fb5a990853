"""This node's capacity offers, computed inside the job core's step from what the driver sampled (issue 39 item 6:
no request for input, no second step): how many more GPU jobs it asks the leader for (``offer``: the PID
controller over GPU utilization, :class:`p2pnode.scheduler.CapacityController`, raised to the GPUs that are free
at once) and how many more CPU-only jobs (``cpu_offer``, :func:`p2pnode.scheduler.cpu_offer`, from the CPUs and
memory its jobs leave free). Sans-IO: the values come in :class:`p2pnode.node.OfferSample` (in
:attr:`p2pnode.node.JobInputs.sample`), ``now`` is passed in.

GPU utilization is the controller's input, never an overload signal: a free GPU (this node's jobs hold less than
all of it, below the band and not at its memory limit) is offered at once, one offer each, whatever the node's mean
utilization, so one GPU at 100 % never idles the other seven; a GPU a job of ours left after the sample was taken
counts free (the sample still shows that job's load): a job that just ended offers its GPU in this very step. The
two offers are separate counts: CPU capacity never adds to the GPU offer, and a GPU-less node or one whose GPUs are
busy still offers its spare CPUs. A cordoned node offers nothing.

Cadence: the offers are computed every ``interval_s``, at once after a job ended or a capacity news
(:attr:`Offers.due`), and whenever the set of jobs running here changed; autonomous placements take from them
until the next computation (:meth:`Offers.used`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

from ..scheduler import CapacityController, Catalog, cpu_offer
from ._jobio import JobInputs, LocalJob, OfferSample

__all__ = ["Offers", "free_gpus", "gpu_offer", "node_cpu_offer", "with_offers"]

EPS = 1e-9


def free_gpus(sample: OfferSample, running: Iterable[LocalJob], *, full: Iterable[int], freed: Iterable[int],
              band_min_percent: float) -> int:
    """GPUs of ``sample`` with a share free (the ``running`` jobs hold less than all of it), not ``full`` (memory at
    the guard's limit) and below the band's lower edge or ``freed`` (a job of ours left it after the sample was
    taken): capacity at once, one offer each (the planner fills a GPU idle at its plan's start with as many
    fractional jobs as fit it for that one offer: issue 38)."""
    held: dict[int, float] = {}
    for j in running:
        for g in j.gpus:
            held[g] = held.get(g, 0.0) + j.gpu_fraction
    full, freed = set(full), set(freed)
    return sum(1 for g, util in sample.gpu_util if held.get(g, 0.0) < 1.0 - EPS and g not in full
               and (util < band_min_percent or g in freed))


def gpu_offer(pid: CapacityController, sample: OfferSample, running: Iterable[LocalJob], *, full: Iterable[int],
              freed: Iterable[int], level: int, now: float) -> int:
    """The GPU offer (jobs): ``pid`` updated at ``now`` with the mean utilization of ``sample``'s GPUs, its idle GPUs
    the guard's (idle past its grace) or the free ones (:func:`free_gpus`), whichever more, at degradation
    ``level``."""
    utils = [u for _, u in sample.gpu_util]
    util = sum(utils) / len(utils) if utils else 0.0
    free = free_gpus(sample, running, full=full, freed=freed, band_min_percent=pid.band_min_percent)
    return pid.update(util, gpus=len(utils), idle_gpus=max(sample.idle_gpus, free), level=level, now=now)


def node_cpu_offer(sample: OfferSample, running: Iterable[LocalJob], catalog: Catalog, *, level: int,
                   cordoned: bool) -> int:
    """The CPU offer (CPU-only jobs, :func:`p2pnode.scheduler.cpu_offer`): ``sample``'s CPUs and memory for jobs
    less what the ``running`` jobs not being stopped hold (what they started with, else their template's in
    ``catalog``), its CPU use against the guard's warn level, the degradation ``level`` and the cordon."""
    cpus = mem = 0.0
    for j in running:
        if j.stopping:
            continue
        t = catalog.templates.get(j.template)
        r = j.holds if j.holds is not None else t.resources if t is not None else None
        if r is not None:
            cpus, mem = cpus + r.num_cpus, mem + r.memory_gib
    return cpu_offer(cpus=sample.cpus, memory_gib=sample.memory_gib, held_cpus=cpus, held_memory_gib=mem,
                     cpu_percent=sample.cpu_percent, cpu_warn_percent=sample.cpu_warn_percent, level=level,
                     cordoned=cordoned)


class Offers:
    """This node's offers (module docstring): :attr:`offer` (GPU jobs) and :attr:`cpu_offer` (CPU-only jobs), as
    last computed by :meth:`step`, less what autonomous placements took since (:meth:`used`). ``pid``: the node's
    controller (its state: the integral, the last error); ``interval_s``: the period of the computation."""

    def __init__(self, pid: CapacityController, interval_s: float) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.offer = 0
        self.cpu_offer = 0
        self.due = False
        """A job ended or capacity news arrived: compute at the next step whatever the period."""
        self._last = -math.inf  # when last computed (monotonic; -inf: never)
        self._running: frozenset[str] | None = None  # the job ids running here at the last computation
        self._freed: dict[int, float] = {}  # GPU index -> when a job of ours last left it (monotonic)

    def freed(self, gpus: Iterable[int], now: float) -> None:
        """A job of ours left ``gpus`` at ``now``: free at once (until a sample taken after it)."""
        for g in gpus:
            self._freed[g] = now

    def used(self, gpu: int, cpu: int) -> None:
        """Autonomous placements took ``gpu`` GPU jobs and ``cpu`` CPU-only jobs of the offers (until the next
        computation)."""
        self.offer, self.cpu_offer = max(0, self.offer - gpu), max(0, self.cpu_offer - cpu)

    def step(self, inp: JobInputs, node_id: str, catalog: Catalog, now: float) -> JobInputs:
        """Compute the offers from ``inp.sample`` when due (the period passed, :attr:`due`, or the jobs running
        here changed); ``inp`` with them in place (its ``offer``/``cpu_offer`` and this node's member view), or
        ``inp`` itself when it carries no sample (a driver with no sample to give hands fixed offers in)."""
        s, running = inp.sample, frozenset(inp.running)
        if self.due or running != self._running or now - self._last >= self.interval_s:
            self.due, self._last, self._running = False, now, running
            if s is None:  # (the period kept all the same: a driver's sample may come at the next one)
                return inp
            freed = [g for g, at in self._freed.items() if at > s.sampled_at]
            self._freed = {g: at for g, at in self._freed.items() if at > s.sampled_at}
            gpu = gpu_offer(self.pid, s, inp.running.values(), full=inp.full_gpus, freed=freed, level=inp.level,
                            now=now)
            self.offer = 0 if inp.cordoned else gpu
            self.cpu_offer = node_cpu_offer(s, inp.running.values(), catalog, level=inp.level, cordoned=inp.cordoned)
        if s is None:
            return inp
        return with_offers(inp, node_id, self.offer, self.cpu_offer)

    def next_deadline(self) -> float:
        """The next computation by the period (monotonic seconds; at once when :attr:`due`)."""
        return self._last if self.due else self._last + self.interval_s


def with_offers(inp: JobInputs, node_id: str, offer: int, cpu: int) -> JobInputs:
    """``inp`` with node ``node_id``'s offers ``offer`` and ``cpu`` in place: its own, and its member view's (what
    planning on itself and autonomous work see); every other member is the same object."""
    members = list(inp.members)
    for i, m in enumerate(members):
        if m.origin == node_id:
            view = m.view if m.view is None else msgspec.structs.replace(m.view, offer=offer, cpu_offer=cpu)
            members[i] = msgspec.structs.replace(m, offer=offer, cpu_offer=cpu, view=view)
            break
    return msgspec.structs.replace(inp, offer=offer, cpu_offer=cpu, members=members)
