"""What a node has, as values: the GPU model table and power ranking, GPU readings and their sources (simulated
or none), the :class:`ResourceSample` of a machine, pressure stall information (:mod:`._psi`: its decoder and
which files to read), and the operator's declared resources.

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
from ._psi import (
    MAX_PSI_BYTES,
    PSI_RESOURCES,
    STALL_REJECTIONS,
    PressureStall,
    ResourceStall,
    StallAverages,
    StallRejected,
    cgroup2_mount,
    decode_stall,
    in_container,
    pressure_dir,
    pressure_files,
)
from ._sample import ResourceSample

__all__ = [
    "GPU_MODELS",
    "LOAD_PER_GPU",
    "MAX_PSI_BYTES",
    "PSI_RESOURCES",
    "STALL_REJECTIONS",
    "UNKNOWN_GPU_SCORE",
    "FakeGpus",
    "GpuModel",
    "GpuReading",
    "GpuSource",
    "NoGpus",
    "PressureStall",
    "ResourceSample",
    "ResourceStall",
    "StallAverages",
    "StallRejected",
    "cgroup2_mount",
    "decode_stall",
    "gpu_power_score",
    "in_container",
    "match_model",
    "normalize_model_name",
    "parse_fake_gpu_load",
    "parse_fake_gpus",
    "parse_resources",
    "pressure_dir",
    "pressure_files",
    "rank_of_gpus",
]
