"""The machine probes: psutil for CPU, load, memory and disk (:class:`ResourceSampler`), NVML for real GPUs
(:class:`NvmlGpus`), and :func:`open_gpu_source`, which picks a node's GPU source.

They fill the plain values of :mod:`p2pnode.resources`; the agent and the guard's library API call them, the
cores never do.
"""

from __future__ import annotations

from ._nvml import NVML_LIBRARY, NvmlGpus, NvmlLibrary, open_gpu_source
from ._sampler import ResourceSampler

__all__ = ["NVML_LIBRARY", "NvmlGpus", "NvmlLibrary", "ResourceSampler", "open_gpu_source"]
