"""One GPU capacity model (issue 38), used by the planner, scaling and the simulator alike. Pure.

A GPU's *usable* VRAM is its memory times the guard's GPU memory limit (``[guard] gpu_max_percent``, 80 % by
default: a 24 GiB RTX 4090 has 19.2 GiB usable). The planner commits VRAM only up to it, scaling judges a class
by it and the simulation measures stranding against it, so the three never disagree about what fits (the
planner refused 32 GiB selfplay on a 32 GiB 5090 that scaling had just bought for it).

A job asking ``num_gpus`` < 1 (a fraction) and ``vram`` GiB per GPU fits ``min(floor(1 / num_gpus), floor(usable
/ vram))`` times on one empty GPU (:func:`instances_per_gpu`); a job asking one or more whole GPUs needs that
many GPUs with ``vram`` usable each (:func:`fits_node`).
"""

from __future__ import annotations

import math

__all__ = ["EPS", "MAX_VRAM_GIB", "fits_gpu", "fits_node", "instances_per_gpu", "usable_vram_gib"]

EPS = 1e-9
"""Tolerance of every comparison of GPU fractions and GiB (sums of fractions such as 0.25 + 0.5 + 0.25)."""

MAX_VRAM_GIB = 4096.0
"""GiB one GPU counts for at most (planner and scaling alike): a member's snapshot may claim up to 2**62 bytes of
one GPU, but a plan grants VRAM only within the wire's bound (``PlanJob.vram_gib`` <= 1e6), so
:func:`p2pnode.node.node_view_of` clamps a GPU's size to it and the planner grants no more than it
(:meth:`p2pnode.scheduler._nodecap._NodeCap.fit`); scaling refuses a class shape above it."""


def usable_vram_gib(vram_gib: float, limit_ratio: float) -> float:
    """GiB of a GPU of ``vram_gib`` GiB the planner may commit under the guard's limit ``limit_ratio`` (0-1, e.g.
    0.8 for ``gpu_max_percent = 80``); a ratio outside 0-1 is clamped, a negative size counts as 0."""
    return max(0.0, vram_gib) * min(1.0, max(0.0, limit_ratio))


def fits_gpu(usable_gib: float, vram_gib: float) -> bool:
    """Whether a job needing ``vram_gib`` per GPU fits a GPU with ``usable_gib`` usable (free) GiB."""
    return vram_gib <= usable_gib + EPS


def instances_per_gpu(usable_gib: float, num_gpus: float, vram_gib: float) -> int:
    """How many instances of a job asking ``num_gpus`` (a fraction below 1; 1 or more: whole GPUs, at most one
    instance per GPU) and ``vram_gib`` per GPU fit one empty GPU with ``usable_gib`` usable GiB (0: none)."""
    if num_gpus <= 0:
        return 0
    if not fits_gpu(usable_gib, vram_gib):
        return 0
    if num_gpus >= 1.0 - EPS:
        return 1
    by_fraction = math.floor(1.0 / num_gpus + EPS)
    by_vram = math.floor(usable_gib / vram_gib + EPS) if vram_gib > EPS else by_fraction
    return max(0, min(by_fraction, by_vram))


def fits_node(gpus: int, vram_gib: float, limit_ratio: float, num_gpus: float, need_gib: float) -> bool:
    """Whether one instance of a job asking ``num_gpus`` GPUs (a fraction: one GPU) with ``need_gib`` per GPU fits an
    empty node of ``gpus`` GPUs of ``vram_gib`` GiB each under the guard's limit ``limit_ratio``."""
    if num_gpus <= 0:
        return True
    if gpus <= 0 or math.ceil(num_gpus - EPS) > gpus:
        return False
    return fits_gpu(usable_vram_gib(vram_gib, limit_ratio), need_gib)
