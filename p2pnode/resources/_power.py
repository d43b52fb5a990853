"""GPU models: the power ranking table, VRAM profiles for fake GPUs, and model-name matching.

The score is the seed table's (H200 2500, H100 2000, A100 624, 5090 419, L40 362, 4090 330). Those figures
are NVIDIA's peak FP16 tensor TFLOPS as published on the datasheets and architecture whitepapers: with
structured sparsity for data-center parts (A100 624, L40 362), dense with FP16 accumulate for GeForce parts
(RTX 4090 330, RTX 5090 419); H200 is ranked above H100 for its larger, faster HBM3e. The rest of the table
follows the same convention, from the same sources (NVIDIA Hopper, Ada, Ampere, Blackwell and Turing
whitepapers and product datasheets). Scores rank nodes; they are not a performance model.

Matching (see :func:`match_model`): the NVML model name is normalized to lower-case alphanumeric tokens with
vendor words ("nvidia", "geforce", "tesla", "quadro", "rtx") dropped; an entry matches when its tokens occur
as a contiguous run of whole tokens, and the longest matching entry wins. Whole tokens keep
"NVIDIA GH200 480GB" from scoring as H200 and "L40S" from scoring as L40; the longest match makes an exact
model ("RTX 3060 Ti") win over its family ("RTX 3060").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import msgspec

__all__ = [
    "GPU_MODELS", "GpuModel", "UNKNOWN_GPU_SCORE", "gpu_power_score", "match_model", "normalize_model_name",
    "rank_of_gpus",
]

UNKNOWN_GPU_SCORE = 1.0
"""Score of a GPU whose model is not in the table: above a CPU-only node (0), below every known model."""

_DROP = frozenset({"nvidia", "geforce", "tesla", "quadro", "rtx"})
_SPLIT = re.compile(r"[^a-z0-9]+")


class GpuModel(msgspec.Struct, frozen=True):
    """One table row: ``tokens`` to match, power ``score``, and the profile used for fake GPUs."""

    tokens: tuple[str, ...]
    score: float
    nvml_name: str
    vram_gib: float
    tdp_w: float


def _m(key: str, score: float, name: str, vram_gib: float, tdp_w: float) -> GpuModel:
    return GpuModel(normalize_model_name(key), score, name, vram_gib, tdp_w)


def normalize_model_name(name: str) -> tuple[str, ...]:
    """``"NVIDIA GeForce RTX 3060 Ti"`` -> ``("3060", "ti")``: lower-case alphanumeric tokens, vendor words dropped."""
    return tuple(t for t in _SPLIT.split(name.lower()) if t and t not in _DROP)


GPU_MODELS: tuple[GpuModel, ...] = (
    # Data center, Blackwell / Hopper (FP16 tensor, sparse).
    _m("B200", 4500, "NVIDIA B200", 180, 1000),
    _m("B100", 3500, "NVIDIA B100", 180, 700),
    _m("H200", 2500, "NVIDIA H200", 141, 700),  # seed table
    _m("H200 NVL", 2500, "NVIDIA H200 NVL", 141, 600),
    _m("GH200", 1979, "NVIDIA GH200 480GB", 96, 900),  # H100-class GPU on Grace: not an H200
    _m("H100", 2000, "NVIDIA H100 80GB HBM3", 80, 700),  # seed table
    _m("H100 PCIe", 1513, "NVIDIA H100 PCIe", 80, 350),
    _m("H100 NVL", 1979, "NVIDIA H100 NVL", 94, 400),
    _m("H800", 1979, "NVIDIA H800", 80, 700),
    _m("H20", 296, "NVIDIA H20", 96, 400),
    # Ada / Ampere data center (FP16 tensor, sparse).
    _m("L40S", 733, "NVIDIA L40S", 48, 350),
    _m("L40", 362, "NVIDIA L40", 48, 300),  # seed table
    _m("L4", 242, "NVIDIA L4", 24, 72),
    _m("A100", 624, "NVIDIA A100-SXM4-80GB", 80, 400),  # seed table
    _m("A800", 624, "NVIDIA A800-SXM4-80GB", 80, 400),
    _m("A40", 299, "NVIDIA A40", 48, 300),
    _m("A30", 330, "NVIDIA A30", 24, 165),
    _m("A10", 250, "NVIDIA A10", 24, 150),
    _m("A10G", 140, "NVIDIA A10G", 24, 300),
    _m("V100", 125, "Tesla V100-SXM2-32GB", 32, 300),  # Volta: no sparsity
    _m("T4", 65, "Tesla T4", 16, 70),
    # Workstation.
    _m("RTX 6000 Ada", 364, "NVIDIA RTX 6000 Ada Generation", 48, 300),
    _m("RTX A6000", 310, "NVIDIA RTX A6000", 48, 300),
    _m("RTX A5000", 222, "NVIDIA RTX A5000", 24, 230),
    _m("RTX A4000", 153, "NVIDIA RTX A4000", 16, 140),
    # GeForce (FP16 tensor with FP16 accumulate, dense).
    _m("RTX 5090", 419, "NVIDIA GeForce RTX 5090", 32, 575),  # seed table
    _m("RTX 5080", 225, "NVIDIA GeForce RTX 5080", 16, 360),
    _m("RTX 5070 Ti", 176, "NVIDIA GeForce RTX 5070 Ti", 16, 300),
    _m("RTX 5070", 124, "NVIDIA GeForce RTX 5070", 12, 250),
    _m("RTX 4090", 330, "NVIDIA GeForce RTX 4090", 24, 450),  # seed table
    _m("RTX 4080 SUPER", 209, "NVIDIA GeForce RTX 4080 SUPER", 16, 320),
    _m("RTX 4080", 195, "NVIDIA GeForce RTX 4080", 16, 320),
    _m("RTX 4070 Ti", 160, "NVIDIA GeForce RTX 4070 Ti", 12, 285),
    _m("RTX 4070", 117, "NVIDIA GeForce RTX 4070", 12, 200),
    _m("RTX 4060 Ti", 88, "NVIDIA GeForce RTX 4060 Ti", 16, 165),
    _m("RTX 4060", 60, "NVIDIA GeForce RTX 4060", 8, 115),
    _m("RTX 3090 Ti", 160, "NVIDIA GeForce RTX 3090 Ti", 24, 450),
    _m("RTX 3090", 142, "NVIDIA GeForce RTX 3090", 24, 350),
    _m("RTX 3080 Ti", 136, "NVIDIA GeForce RTX 3080 Ti", 12, 350),
    _m("RTX 3080", 119, "NVIDIA GeForce RTX 3080", 10, 320),
    _m("RTX 3070", 81, "NVIDIA GeForce RTX 3070", 8, 220),
    _m("RTX 3060 Ti", 65, "NVIDIA GeForce RTX 3060 Ti", 8, 200),
    _m("RTX 3060", 51, "NVIDIA GeForce RTX 3060", 12, 170),
    _m("RTX 2080 Ti", 108, "NVIDIA GeForce RTX 2080 Ti", 11, 250),
    _m("RTX 2080", 80, "NVIDIA GeForce RTX 2080", 8, 215),
)


def _contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


@functools.lru_cache(maxsize=4096)
def match_model(name: str) -> GpuModel | None:
    """The table entry for an NVML model ``name``, or ``None`` when no entry matches.

    Among matching entries the one with the most tokens wins (exact model before family). Cached (4,096 names,
    least recently used out): ranking reads every member's GPUs at each reconcile.
    """
    tokens = normalize_model_name(name)
    best: GpuModel | None = None
    for model in GPU_MODELS:
        if _contains(tokens, model.tokens) and (best is None or len(model.tokens) > len(best.tokens)):
            best = model
    return best


def gpu_power_score(name: str) -> float:
    """Power score of one GPU by NVML model name; :data:`UNKNOWN_GPU_SCORE` for a model not in the table."""
    model = match_model(name)
    return model.score if model is not None else UNKNOWN_GPU_SCORE


UNKNOWN_GPU_MAX_VRAM_BYTES = 48 * 2**30
"""VRAM credited for ranking to a GPU whose model is not in the table, at most."""


def rank_of_gpus(gpus: Iterable[tuple[str, int]]) -> tuple[float, int]:
    """``(power score, VRAM bytes)`` that ranking credits to a node reporting ``gpus`` as
    ``(model name, memory total bytes)`` pairs: the table's score of each model (never a score the node states
    itself), and each GPU's memory capped at its model's table VRAM + 10 % (unknown models: 48 GiB). Used for
    our own sample and for every member's snapshot, so ranking is the same everywhere."""
    score, vram = 0.0, 0
    for name, mem in gpus:
        model = match_model(name)
        score += model.score if model is not None else UNKNOWN_GPU_SCORE
        cap = int(model.vram_gib * 1.1 * 2**30) if model is not None else UNKNOWN_GPU_MAX_VRAM_BYTES
        vram += max(0, min(int(mem), cap))
    return score, vram
