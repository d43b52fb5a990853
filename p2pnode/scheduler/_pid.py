"""Per-node capacity offer from a PID controller on GPU utilization. Pure.

Each node runs its own controller (not shared): the error is the distance from its GPU utilization to the
middle of its target band (zero inside the band), and the output, added to the jobs it runs, is how many jobs it
offers. Gains are seed 000's (kp 0.1, ki 0.01, kd 0.05) with the error in percentage points. Anti-windup: the
integral is clamped to ``±integral_limit`` and frozen while the output saturates (conditional integration).
Idle GPUs raise the offer at once; a node at or above the backpressure level offers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CapacityController"]


@dataclass
class CapacityController:
    """``update(util_percent, running, gpus, idle_gpus, level, now) -> offer`` (jobs this node accepts now)."""

    band_min_percent: float = 60.0
    band_max_percent: float = 80.0
    kp: float = 0.1
    ki: float = 0.01
    kd: float = 0.05
    integral_limit: float = 200.0
    max_extra_per_gpu: float = 4.0
    backpressure_level: int = 2
    integral: float = 0.0
    last_error: float | None = None
    last_at: float | None = None
    output: float = 0.0

    def error(self, util_percent: float) -> float:
        """Percentage points below the band (positive: room for more work), above it (negative), or 0 inside."""
        if util_percent < self.band_min_percent:
            return self.band_min_percent - util_percent
        if util_percent > self.band_max_percent:
            return self.band_max_percent - util_percent
        return 0.0

    def update(self, util_percent: float, *, running: int, gpus: int, idle_gpus: int, level: int, now: float) -> int:
        if level >= self.backpressure_level or gpus == 0:
            self.last_at, self.last_error = now, None
            self.output = 0.0
            return 0
        e = self.error(util_percent)
        dt = 0.0 if self.last_at is None else max(0.0, now - self.last_at)
        derivative = 0.0 if self.last_error is None or dt == 0 else (e - self.last_error) / dt
        hi = self.max_extra_per_gpu * gpus
        unclamped = self.kp * e + self.ki * (self.integral + e * dt) + self.kd * derivative
        if 0.0 <= unclamped <= hi or (unclamped > hi and e < 0) or (unclamped < 0 and e > 0):
            self.integral = max(-self.integral_limit, min(self.integral_limit, self.integral + e * dt))
        self.output = max(0.0, min(hi, self.kp * e + self.ki * self.integral + self.kd * derivative))
        self.last_error, self.last_at = e, now
        offer = int(round(self.output))
        return max(offer, idle_gpus)  # idle GPUs ask for work at once
