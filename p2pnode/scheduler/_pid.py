"""Per-node capacity offer from a PID controller on GPU utilization. Pure.

Each node runs its own controller (not shared). The error ``e`` is the distance in percentage points from its
GPU utilization up to the band's lower edge (positive: room for more work); inside the band and above it the
node takes nothing new and the integral decays, so the node drifts into the band from below and never winds up
while it holds. Below the band the output ``u = kp·e + ki·∫e dt + kd·de/dt`` (seed 000's gains kp 0.1, ki 0.01,
kd 0.05) is in "GPUs' worth of work": the offer is ``round(u × gpus / points_per_job)`` jobs, so an error of
``points_per_job`` points on each GPU asks for about one job per GPU per plan, and a node ramps up over a few
plans instead of overshooting. Anti-windup: the integral is clamped to ``±integral_limit`` and not integrated
while the output saturates at ``max_jobs_per_gpu`` per GPU. Idle GPUs raise the offer at once; a node at or
above the backpressure level offers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CapacityController"]


@dataclass
class CapacityController:
    """``update(util_percent, gpus=, idle_gpus=, level=, now=) -> offer`` (jobs this node accepts now)."""

    band_min_percent: float = 60.0
    band_max_percent: float = 80.0
    kp: float = 0.1
    ki: float = 0.01
    kd: float = 0.05
    points_per_job: float = 1.0
    integral_limit: float = 600.0
    max_jobs_per_gpu: float = 4.0
    backpressure_level: int = 2
    decay: float = 0.5
    integral: float = 0.0
    last_error: float | None = None
    last_at: float | None = None
    output: float = 0.0

    def error(self, util_percent: float) -> float:
        """Percentage points below the band's lower edge (0 inside or above the band)."""
        return max(0.0, self.band_min_percent - util_percent)

    def update(self, util_percent: float, *, gpus: int, idle_gpus: int, level: int, now: float, running: int = 0) -> int:
        if level >= self.backpressure_level or gpus == 0:
            self.integral *= self.decay
            self.last_at, self.last_error, self.output = now, None, 0.0
            return 0
        e = self.error(util_percent)
        dt = 0.0 if self.last_at is None else max(0.0, now - self.last_at)
        derivative = 0.0 if self.last_error is None or dt == 0 else (e - self.last_error) / dt
        self.last_error, self.last_at = e, now
        if e <= 0.0:
            self.integral *= self.decay  # holding in (or above) the band: forget, do not wind up
            self.output = 0.0
            return idle_gpus
        hi = self.max_jobs_per_gpu * self.points_per_job * 10.0
        trial = self.kp * e + self.ki * (self.integral + e * dt) + self.kd * derivative
        if trial < hi:  # conditional integration: not while saturated
            self.integral = min(self.integral_limit, self.integral + e * dt)
        self.output = max(0.0, min(hi, self.kp * e + self.ki * self.integral + self.kd * derivative))
        offer = int(round(self.output * gpus / (self.points_per_job * 10.0)))
        return max(offer, idle_gpus, 1)
