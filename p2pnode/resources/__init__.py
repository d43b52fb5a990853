"""What a node has, as values: the GPU model table and power ranking, GPU readings and their sources (simulated
or none), the :class:`ResourceSample` of a machine, and the operator's declared resources.

Pure as a whole: the standard library only. The machine probes that fill these values (psutil, NVML) are in
:mod:`p2pnode.probes`.
"""

from __future__ import annotations

from ._declared import parse_resources
from ._gpus import LOAD_PER_GPU, FakeGpus, GpuReading, GpuSource, NoGpus, parse_fake_gpu_load, parse_fake_gpus
from ._power import (
    GPU_MODELS,
    UNKNOWN_GPU_SCORE,
    GpuModel,
    gpu_power_score,
    match_model,
    normalize_model_name,
    rank_of_gpus,
)
from ._sample import ResourceSample

__all__ = [
    "GPU_MODELS",
    "LOAD_PER_GPU",
    "UNKNOWN_GPU_SCORE",
    "FakeGpus",
    "GpuModel",
    "GpuReading",
    "GpuSource",
    "NoGpus",
    "ResourceSample",
    "gpu_power_score",
    "match_model",
    "normalize_model_name",
    "parse_fake_gpu_load",
    "parse_fake_gpus",
    "parse_resources",
    "rank_of_gpus",
]
