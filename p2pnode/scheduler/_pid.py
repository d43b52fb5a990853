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

:meth:`CapacityController.for_host` builds a node's controller from the ``[guard]`` limits: the gains
(``pid_kp``, ``pid_ki``, ``pid_kd``) and the band of :func:`p2pnode.guard.utilization_band` (the host tier's
target as the lower edge unless the operator set ``target_util_min_percent``).
"""

from __future__ import annotations

import msgspec

from ..guardcore import BACKPRESSURE_LEVEL, GuardLimits, utilization_band

__all__ = ["CapacityController"]


class CapacityController(msgspec.Struct):
    """``update(util_percent, gpus=, idle_gpus=, level=, now=) -> offer`` (jobs this node accepts now)."""

    band_min_percent: float = 60.0
    band_max_percent: float = 80.0
    kp: float = 0.1
    ki: float = 0.01
    kd: float = 0.05
    points_per_job: float = 1.0
    integral_limit: float = 600.0
    max_jobs_per_gpu: float = 4.0
    backpressure_level: int = BACKPRESSURE_LEVEL
    decay: float = 0.5
    integral: float = 0.0
    last_error: float | None = None
    last_at: float | None = None
    output: float = 0.0

    def __post_init__(self) -> None:
        # ``GuardLimits.target_util_min_percent`` is None when the operator left it to the host tier; a caller that
        # passes it on as is (not through for_host) gets the seed's 60 % rather than a TypeError at the first update.
        if self.band_min_percent is None:
            self.band_min_percent = 60.0

    @classmethod
    def for_host(cls, limits: GuardLimits, *, mem_total_bytes: int, gpu_count: int = 1) -> CapacityController:
        """The controller of a host with ``mem_total_bytes`` of RAM and ``gpu_count`` GPUs under ``limits``: band
        from :func:`p2pnode.guard.utilization_band`, gains ``pid_kp``/``pid_ki``/``pid_kd``. (``gpu_count`` only
        tells a CPU-only host, which gets no GPU work whatever its band.)"""
        lo, hi = utilization_band(limits, mem_total_bytes=mem_total_bytes, gpu_count=gpu_count)
        return cls(band_min_percent=lo, band_max_percent=hi, kp=limits.pid_kp, ki=limits.pid_ki, kd=limits.pid_kd)

    def error(self, util_percent: float) -> float:
        """Percentage points below the band's lower edge (0 inside or above the band)."""
        return max(0.0, self.band_min_percent - util_percent)

    def update(
        self, util_percent: float, *, gpus: int, idle_gpus: int, level: int, now: float, running: int = 0
    ) -> int:
        """The offer (jobs this node accepts now) after a sample at ``now`` (monotonic s): ``util_percent`` is the
        mean GPU utilization (0-100) over ``gpus`` GPUs, ``idle_gpus`` of them idle; ``level`` is the guard's
        degradation level (at or above ``backpressure_level`` the offer is 0). ``running`` is accepted for the
        callers' convenience and not used by the controller."""
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
