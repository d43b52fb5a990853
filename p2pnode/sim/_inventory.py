"""Seed 003's cluster inventory ("Cluster Utilization Strategy", December 2025) as planner views: the machines it
lists by name, with their GPUs, provider and whether the provider may take them away (Vast.ai marketplace
instances are ephemeral; RunPod, Nebius and Vultr instances are durable). The coordinator (an M3 Max, MPS: no
CUDA GPU) is a GPU-less node. Pure data for the scheduling simulation (``p2pnode simulate --scenario scheduling
--inventory seed003``).
"""

from __future__ import annotations

from ..scheduler import GpuView, NodeView

__all__ = ["SEED003", "SEED003_CONFIGS", "seed003_fleet"]

SEED003: tuple[tuple[str, tuple[float, ...], str, float], ...] = (
    # (name, VRAM GiB per GPU, provider, cost per hour in USD as listed by the providers in 2025)
    ("runpod-h100", (80.0,), "runpod", 2.5),
    ("runpod-a100-1", (80.0,), "runpod", 1.6),
    ("runpod-a100-2", (80.0,), "runpod", 1.6),
    ("runpod-l40s-2", (48.0,), "runpod", 0.9),
    ("vast-29129529", (24.0,) * 8, "vast", 3.2),
    ("vast-29118471", (24.0,) * 8, "vast", 2.0),
    ("vast-29128352", (32.0, 32.0), "vast", 1.2),
    ("vast-28925166", (32.0,), "vast", 0.7),
    ("vast-29128356", (32.0,), "vast", 0.7),
    ("vast-28918742", (46.0,), "vast", 0.5),
    ("vast-29031159", (16.0,), "vast", 0.3),
    ("vast-29126088", (16.0,), "vast", 0.2),
    ("vast-29031161", (12.0,), "vast", 0.15),
    ("vast-28890015", (11.0,), "vast", 0.15),
    ("vast-28889766", (8.0,), "vast", 0.12),
    ("vast-29046315", (8.0,), "vast", 0.12),
    ("nebius-backbone-1", (48.0,), "nebius", 1.0),
    ("vultr-a100-20gb", (20.0,), "vultr", 0.6),
    ("local-m3", (), "local", 0.0),
)
SEED003_CONFIGS = 12
"""Seed 003's boards (hex8, square8, square19, hexagonal) for 2, 3 and 4 players."""


def seed003_fleet(*, cpus: float = 16.0, memory_gib: float = 64.0,
                  vram_limit_ratio: float = 1.0) -> dict[str, NodeView]:
    """Seed 003's machines as planner views (each node giving ``cpus`` CPUs and ``memory_gib`` GiB to jobs, and
    committing each GPU's VRAM up to ``vram_limit_ratio``: the guard's ``gpu_max_percent`` / 100, as an agent
    publishes it)."""
    nodes = {}
    for name, vram, provider, cost in SEED003:
        eph = provider == "vast"
        nodes[name] = NodeView(name, tuple(GpuView(i, v) for i, v in enumerate(vram)),
                               frozenset({f"provider={provider}", "ephemeral" if eph else "durable"}), cost, eph,
                               cpus=cpus, memory_gib=memory_gib, vram_limit_ratio=vram_limit_ratio)
    return nodes
