"""Resource sampling: psutil for CPU/memory/disk, one NVML boundary for GPUs, fake GPU profiles, power ranking.

The GPU model table, power ranking (:mod:`._power`), GPU sources (:mod:`._gpus`, which loads NVML only when
opened) and the :class:`ResourceSample` value (:mod:`._sample`) need only the standard library and are imported
eagerly. The sampler (:mod:`._sampler`) needs psutil and is loaded on first use of ``ResourceSampler``
(PEP 562), so that pure code such as the snapshot ranking can import ``rank_of_gpus`` on a machine without
psutil. (No ``TYPE_CHECKING`` import of it either: import-linter counts those, and type checkers see the
name as ``Any`` through ``__getattr__``.)
"""

from __future__ import annotations

import importlib
from typing import Any

from ._declared import parse_resources
from ._gpus import (
    FakeGpus,
    GpuReading,
    GpuSource,
    NoGpus,
    NvmlGpus,
    NvmlLibrary,
    open_gpu_source,
    parse_fake_gpu_load,
    parse_fake_gpus,
)
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

_SAMPLER_NAMES = frozenset({"ResourceSampler"})

__all__ = [
    "parse_resources",
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
    "parse_fake_gpu_load",
    "parse_fake_gpus",
]


def __getattr__(name: str) -> Any:
    """PEP 562: ``ResourceSampler`` imports :mod:`._sampler` (psutil) on first use.
    Raises :class:`AttributeError` for any other unknown name."""
    if name in _SAMPLER_NAMES:
        value = getattr(importlib.import_module("._sampler", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public surface, including the lazily loaded names."""
    return sorted(set(globals()) | _SAMPLER_NAMES)
