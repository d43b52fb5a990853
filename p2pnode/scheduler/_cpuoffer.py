"""Per-node CPU offer: how many more CPU-only jobs (``num_gpus = 0``) a node accepts now. Pure.

The GPU offer (:class:`p2pnode.scheduler.CapacityController`) follows GPU utilization into the PID loop's
60-80 % band; CPU work has no such band to fill. Like Ray and Nomad scheduling CPU tasks against CPUs and memory,
a node offers CPU work by what its running jobs leave of the CPUs and memory it gives to jobs (declared with
``--resource cpus=N`` / ``memory_gib=G``, else measured: :func:`p2pnode.node.node_view_of`)::

    offer = min(floor(free_cpus / cpus_per_job), floor(free_memory_gib / memory_per_job_gib))

with ``free = capacity - held by running jobs`` and the catalog's default request (1 CPU, 1 GiB) as the unit job,
capped at ``max_jobs``. It is a count of placements per plan, as the GPU offer: the planner still checks each
template's own CPUs and memory against the node's free capacity, so a job asking 4 CPUs takes one offer and 4
CPUs. The offer is 0 at or above the backpressure degradation level (as the GPU offer), when the node is
cordoned, and while the host's CPU is above the guard's CPU warn level (``GuardLimits.cpu_warn_percent``): a
host already busy on its CPUs (its GPU jobs' data loaders, say) takes no more CPU work.

The two offers are separate counts (``offer`` and ``cpu_offer`` in the ``jobs`` section of the snapshot): GPU
work never uses the CPU offer, CPU work never the GPU offer, so a GPU-less node takes CPU work and a node whose
GPUs are in or above the band (GPU offer 0) still gives its spare CPUs.
"""

from __future__ import annotations

import math

from ..guardcore import BACKPRESSURE_LEVEL

__all__ = ["CPU_OFFER_MAX_JOBS", "CPU_PER_JOB", "MEMORY_PER_JOB_GIB", "cpu_offer"]

CPU_PER_JOB = 1.0
"""CPUs of the unit job the CPU offer counts in (the catalog's default ``num_cpus``)."""
MEMORY_PER_JOB_GIB = 1.0
"""Memory (GiB) of the unit job the CPU offer counts in (the catalog's default ``memory_gib``)."""
CPU_OFFER_MAX_JOBS = 1024
"""CPU-only jobs one node offers at most at once (a 1,024-core box of 1-CPU jobs): bounds a plan's placements
on one node and the snapshot's field."""


def cpu_offer(*, cpus: float, memory_gib: float, held_cpus: float, held_memory_gib: float, cpu_percent: float,
              cpu_warn_percent: float, level: int, cordoned: bool = False,
              backpressure_level: int = BACKPRESSURE_LEVEL, cpu_per_job: float = CPU_PER_JOB,
              memory_per_job_gib: float = MEMORY_PER_JOB_GIB, max_jobs: int = CPU_OFFER_MAX_JOBS) -> int:
    """CPU-only jobs a node accepts now (see module docstring).

    ``cpus`` (logical CPUs) and ``memory_gib`` (GiB): what the node gives to jobs; ``held_cpus`` and
    ``held_memory_gib``: what its running jobs (GPU jobs too) hold of them, by their templates' requests.
    ``cpu_percent``: the host's measured CPU use, percent of all cores (0-100); ``cpu_warn_percent``: the guard's
    CPU warn level, above which the offer is 0. ``level``: the guard's degradation level (0 at or above
    ``backpressure_level``); ``cordoned``: the operator cordoned the node (0). ``cpu_per_job`` and
    ``memory_per_job_gib``: the unit job counted in; ``max_jobs``: the cap. A capacity that is not accounted (0
    CPUs or 0 GiB) does not limit the count."""
    if cordoned or level >= backpressure_level or cpu_percent > cpu_warn_percent:
        return 0
    n = max_jobs
    if cpus > 0:
        n = min(n, math.floor(max(0.0, cpus - held_cpus) / cpu_per_job + 1e-9))
    if memory_gib > 0:
        n = min(n, math.floor(max(0.0, memory_gib - held_memory_gib) / memory_per_job_gib + 1e-9))
    return max(0, n)
