"""Resource sampling: psutil for CPU/memory/disk, one NVML boundary for GPUs, fake GPU profiles, power ranking."""

from ._gpus import FakeGpus, GpuReading, GpuSource, NoGpus, NvmlGpus, NvmlLibrary, open_gpu_source, parse_fake_gpus
from ._power import GPU_MODELS, UNKNOWN_GPU_SCORE, GpuModel, gpu_power_score, match_model, normalize_model_name, rank_of_gpus
from ._sampler import ResourceSample, ResourceSampler

__all__ = [
    "GPU_MODELS",
    "UNKNOWN_GPU_SCORE",
    "FakeGpus",
    "GpuModel",
    "GpuReading",
    "GpuSource",
    "NoGpus",
    "NvmlGpus",
    "NvmlLibrary",
    "ResourceSample",
    "ResourceSampler",
    "gpu_power_score",
    "match_model",
    "normalize_model_name",
    "open_gpu_source",
    "rank_of_gpus",
    "parse_fake_gpus",
]
