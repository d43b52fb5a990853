"""One source of truth for resource limits (seed 001: CPU/memory/GPU 80 % max, 70 % warn; disk 70/65).

:class:`GuardLimits` is also the ``[guard]`` section of the config file, so the agent, ``p2pnode guard`` and the
library API (:mod:`p2pnode.guard`) read the same values: defaults < TOML < ``P2PNODE_*`` env. Env names follow
the seed project's (``P2PNODE_TARGET_UTIL_MIN``, ``P2PNODE_MAX_DISK_PERCENT``, ``P2PNODE_MEMORY_LIMIT_GB``,
``P2PNODE_IDLE_CHECK_INTERVAL``, ``P2PNODE_IDLE_GPU_THRESHOLD``, ``P2PNODE_IDLE_GRACE_PERIOD``, ``P2PNODE_PID_KP``,
``P2PNODE_PID_KI``, ``P2PNODE_PID_KD``) and, for the rest, ``P2PNODE_<FIELD>``.

Host tiers (seed 001) give each class of host its GPU utilization target: high-end (>= 96 GiB RAM) 65 %, mid
(>= 32 GiB) 60 %, low 55 %, CPU-only 50 %. :func:`utilization_band` makes the target the lower edge of the PID
band, unless the operator set ``target_util_min_percent``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

__all__ = ["HOST_TIERS", "MAX_SPAWNS_PER_MINUTE", "MIN_SPAWNS_PER_MINUTE", "GuardLimits", "HostTier", "host_tier",
           "spawn_rate_per_minute", "utilization_band", "validate_limits"]


def _env(name: str) -> dict[str, str]:
    return {"env": name}


@dataclass(frozen=True, kw_only=True)
class GuardLimits:
    """``[guard]``: limits in percent of capacity (0-100) unless the name says otherwise."""

    cpu_max_percent: float = field(default=80.0, metadata=_env("P2PNODE_CPU_MAX_PERCENT"))
    """CPU utilization at which the guard is critical (level 4). 0: CPU is not assessed (no level, no warning, no
    CPU pressure, no CPU-offer cut-off), for GPU boxes whose data loaders keep every core busy by design."""
    cpu_warn_percent: float = field(default=70.0, metadata=_env("P2PNODE_CPU_WARN_PERCENT"))
    """CPU utilization that draws a recommendation."""
    cpu_window_s: float = field(default=10.0, metadata=_env("P2PNODE_CPU_WINDOW_S"))
    """Seconds of CPU samples the guard assesses together: CPU counts toward the degradation level, CPU pressure
    and the CPU offer as the mean of the samples taken in the last ``cpu_window_s`` (:mod:`._window`): a spike of ``d``
    seconds at 100 % moves the mean by about ``100 · d / cpu_window_s`` points, so with the default 10 s spikes
    under about 5 s over a quiet node never raise the level (CPU is compressible: a spike slows work, it endangers
    nothing). 0: each sample alone (the behaviour before windows). Longer windows ride out longer bursts and
    react later to a sustained overload (at most 600 s, and at most ``MAX_WINDOW_SAMPLES`` (4096) samples of
    ``agent.sample_interval_s``)."""
    memory_max_percent: float = field(default=80.0, metadata=_env("P2PNODE_MEMORY_MAX_PERCENT"))
    memory_warn_percent: float = field(default=70.0, metadata=_env("P2PNODE_MEMORY_WARN_PERCENT"))
    memory_window_s: float = field(default=3.0, metadata=_env("P2PNODE_MEMORY_WINDOW_S"))
    """Seconds of memory samples averaged for levels 1-3 (a short window: memory is not compressible). A sample at
    or above ``memory_max_percent`` counts at once (level 4 without waiting for the window). 0: each sample
    alone (at most 60 s)."""
    gpu_max_percent: float = field(default=80.0, metadata=_env("P2PNODE_GPU_MAX_PERCENT"))
    """Applies to GPU utilization and to GPU memory, per GPU."""
    gpu_warn_percent: float = field(default=70.0, metadata=_env("P2PNODE_GPU_WARN_PERCENT"))
    disk_max_percent: float = field(default=70.0, metadata=_env("P2PNODE_MAX_DISK_PERCENT"))
    """Disk usage of the data dir's file system at which the guard is critical and training is refused; it is
    also the disk manager's critical threshold."""
    disk_warn_percent: float = field(default=65.0, metadata=_env("P2PNODE_DISK_WARN_PERCENT"))
    """Disk usage that draws a recommendation; also the disk manager's cleanup threshold."""
    disk_notice_percent: float = field(default=60.0, metadata=_env("P2PNODE_DISK_NOTICE_PERCENT"))
    """The disk manager's warning threshold (DISK_SPACE_LOW is emitted from here)."""
    target_util_min_percent: float | None = field(default=None, metadata=_env("P2PNODE_TARGET_UTIL_MIN"))
    """Lower edge of the GPU utilization target band: the set-point the PID controller drives utilization up to.
    Unset (None): the host tier's target (:func:`utilization_band`: 65 % on high-end hosts, 60 % mid, 55 % low)."""
    target_util_max_percent: float = field(default=80.0, metadata=_env("P2PNODE_TARGET_UTIL_MAX"))
    """Upper edge of the GPU utilization target band."""
    pid_kp: float = field(default=0.1, metadata=_env("P2PNODE_PID_KP"))
    """Proportional gain of the capacity PID controller (:class:`p2pnode.scheduler.CapacityController`): its
    output ``u = kp·e + ki·∫e dt + kd·de/dt``, ``e`` in percentage points below the band, asks for ``u / 10`` jobs
    per GPU. Higher gains ramp a node up faster and overshoot more."""
    pid_ki: float = field(default=0.01, metadata=_env("P2PNODE_PID_KI"))
    """Integral gain (per point-second below the band): removes a steady shortfall; higher winds up sooner."""
    pid_kd: float = field(default=0.05, metadata=_env("P2PNODE_PID_KD"))
    """Derivative gain (per point per second): damps the ramp when utilization climbs fast; higher reacts to
    noise."""
    memory_limit_gb: float = field(default=80.0, metadata=_env("P2PNODE_MEMORY_LIMIT_GB"))
    """Memory limit of one job, GiB: the resident set (RSS) of its whole process tree, sampled every
    ``check_interval_s``; a job over it is stopped, with the reason in the job history. 0 = no limit."""
    idle_gpu_threshold_percent: float = field(default=5.0, metadata=_env("P2PNODE_IDLE_GPU_THRESHOLD"))
    """A GPU below this utilization is idle."""
    idle_grace_period_s: float = field(default=300.0, metadata=_env("P2PNODE_IDLE_GRACE_PERIOD"))
    """A GPU idle this long raises IDLE_RESOURCE_DETECTED."""
    idle_check_interval_s: float = field(default=60.0, metadata=_env("P2PNODE_IDLE_CHECK_INTERVAL"))
    """Seconds between idle-GPU checks: a GPU below ``idle_gpu_threshold_percent`` at a check starts its idle
    grace period (any sample above the threshold ends it). Checks ride on the guard's assessments, so the
    effective interval is a multiple of ``check_interval_s``."""
    check_interval_s: float = field(default=5.0, metadata=_env("P2PNODE_GUARD_CHECK_INTERVAL"))
    """Seconds between guard assessments in the agent (and disk-manager passes)."""
    dwell_s: float = field(default=30.0, metadata=_env("P2PNODE_GUARD_DWELL_S"))
    """Minimum time between a change of the degradation level and one in the other direction (a fall soon after a
    rise, a rise soon after a fall; a rise to critical is never delayed); the steps of one rise or one fall are
    not held."""
    hysteresis_ratio: float = field(default=0.03, metadata=_env("P2PNODE_GUARD_HYSTERESIS"))
    """A level is left downward only when the load ratio is this far below its lower edge (0.03 = 3 points)."""
    log_retention_days: float = field(default=7.0, metadata=_env("P2PNODE_LOG_RETENTION_DAYS"))
    """The disk manager deletes log files older than this."""
    checkpoint_keep: int = field(default=3, metadata=_env("P2PNODE_CHECKPOINT_KEEP"))
    """The disk manager keeps this many newest checkpoints per directory."""
    breaker_failures: int = field(default=5, metadata=_env("P2PNODE_BREAKER_FAILURES"))
    """Consecutive spawn failures that open the circuit breaker."""
    breaker_cooldown_s: float = field(default=300.0, metadata=_env("P2PNODE_BREAKER_COOLDOWN_S"))
    """Time the breaker stays open before a trial spawn."""
    max_spawns_per_minute: float | None = field(default=None, metadata=_env("P2PNODE_MAX_SPAWNS_PER_MINUTE"))
    """A fixed spawn-rate limit for the node (jobs per minute; token bucket, burst of the same size). Unset (None):
    the rate scales with the node (:func:`spawn_rate_per_minute`)."""
    spawns_per_minute_per_gpu: float = field(default=10.0, metadata=_env("P2PNODE_SPAWNS_PER_MINUTE_PER_GPU"))
    """Spawn-rate limit per GPU of the node (jobs per minute), unless ``max_spawns_per_minute`` is set."""
    spawns_per_minute_per_cpu: float = field(default=1.0, metadata=_env("P2PNODE_SPAWNS_PER_MINUTE_PER_CPU"))
    """Spawn-rate limit per CPU the node gives to jobs (jobs per minute), unless ``max_spawns_per_minute`` is
    set."""
    hook_timeout_s: float = field(default=10.0, metadata=_env("P2PNODE_HOOK_TIMEOUT_S"))
    """Event hook scripts are killed after this long."""
    cleanup: str = field(default="on", metadata=_env("P2PNODE_DISK_CLEANUP"))
    """Disk manager mode: ``on`` (delete), ``dry-run`` (log what would go and why), ``off``."""
    hooks: tuple[str, ...] = field(default=(), metadata=_env("P2PNODE_HOOKS"))
    """Event hooks, ``"EVENT=/path/to/script"`` or ``"*=/path/to/script"``; the script gets the event name as its
    argument and the JSON payload on stdin (as Serf's event handlers)."""


class HostTier(msgspec.Struct, frozen=True):
    """A class of host by memory, with its GPU utilization target (percent)."""

    name: str
    min_memory_gib: float
    target_util_percent: float


HOST_TIERS = (
    HostTier("high-end", 96.0, 65.0),
    HostTier("mid", 32.0, 60.0),
    HostTier("low", 0.0, 55.0),
)
CPU_ONLY = HostTier("cpu-only", 0.0, 50.0)


def host_tier(mem_total_bytes: int, gpu_count: int) -> HostTier:
    """High-end (>= 96 GiB RAM), mid (>= 32 GiB), low, or CPU-only (no GPU), with its utilization target."""
    if gpu_count == 0:
        return CPU_ONLY
    gib = mem_total_bytes / 2**30
    return next(t for t in HOST_TIERS if gib >= t.min_memory_gib)


def utilization_band(limits: GuardLimits, *, mem_total_bytes: int, gpu_count: int) -> tuple[float, float]:
    """The GPU utilization band ``(min, max)`` in percent that a node's PID controller holds.

    The lower edge is the set-point (the controller asks for work only below it): the operator's
    ``target_util_min_percent`` when set, else the host tier's target (:func:`host_tier`; mid-tier hosts get
    60 %, i.e. the band of seed 000, high-end ones 65 %, low-tier ones 55 %). The upper edge is
    ``target_util_max_percent``; a tier target above it is lowered to it. A host without GPUs gets the CPU-only
    target, which no GPU work uses (the controller offers nothing without a GPU).
    """
    hi = limits.target_util_max_percent
    lo = limits.target_util_min_percent
    if lo is None:
        lo = host_tier(mem_total_bytes, gpu_count).target_util_percent
    return min(lo, hi), hi


MIN_SPAWNS_PER_MINUTE = 10.0
"""The scaled spawn-rate limit is never below this (jobs per minute): a small node still starts a burst of work."""
MAX_SPAWNS_PER_MINUTE = 100_000.0
"""No spawn-rate limit is above this (jobs per minute), however many CPUs a node declares."""


def spawn_rate_per_minute(*, gpus: int, cpus: float, fixed: float | None = None, per_gpu: float = 10.0,
                          per_cpu: float = 1.0) -> float:
    """The spawn-rate limit of a node with ``gpus`` GPUs and ``cpus`` CPUs for jobs (jobs per minute; the token
    bucket's burst is the same number): ``fixed`` (``guard.max_spawns_per_minute``) when the operator set it,
    else ``per_gpu × gpus + per_cpu × cpus`` (``guard.spawns_per_minute_per_gpu`` / ``_per_cpu``), at least
    :data:`MIN_SPAWNS_PER_MINUTE` and at most :data:`MAX_SPAWNS_PER_MINUTE`. The limit guards against a fork
    storm, not against failing jobs (that is the circuit breaker's work): scaled with the node, an 8-GPU box with
    64 CPUs starts 144 jobs a minute, where one rate for every node (10) kept a box running short or shared-GPU
    jobs from refilling its GPUs as fast as they free up (``bench/gpu_busy.py``)."""
    if fixed is not None:
        return min(fixed, MAX_SPAWNS_PER_MINUTE)
    scaled = per_gpu * max(0, gpus) + per_cpu * max(0.0, cpus)
    return min(MAX_SPAWNS_PER_MINUTE, max(MIN_SPAWNS_PER_MINUTE, scaled))


MAX_CPU_WINDOW_S = 600.0
MAX_MEMORY_WINDOW_S = 60.0


def _window_errors(g: GuardLimits) -> list[str]:
    """Windows out of range: ``cpu_window_s`` in [0, 600], ``memory_window_s`` in [0, 60], finite."""
    out = []
    for name, most in (("cpu_window_s", MAX_CPU_WINDOW_S), ("memory_window_s", MAX_MEMORY_WINDOW_S)):
        v = getattr(g, name)
        if not (math.isfinite(v) and 0 <= v <= most):
            out.append(f"guard.{name} = {v:g} must be in [0, {most:g}] seconds (0: each sample alone)")
    return out


def validate_limits(g: GuardLimits) -> list[str]:
    """Every inconsistency in ``g``, as messages naming the settings (empty when consistent)."""
    errors = []
    for res in ("cpu", "memory", "gpu", "disk"):
        warn, mx = getattr(g, f"{res}_warn_percent"), getattr(g, f"{res}_max_percent")
        wname = f"guard.{res}_warn_percent"
        mname = f"guard.{res}_max_percent"
        if res == "cpu" and mx == 0:
            continue  # CPU not assessed: its warning level does not matter
        if not 0 < mx <= 100:
            errors.append(f"{mname} = {mx:g} must be in (0, 100]" + (" (or 0: not assessed)" if res == "cpu" else ""))
        if warn > mx:
            errors.append(f"{wname} = {warn:g} is above {mname} = {mx:g}: the warning must come first")
    if not g.disk_notice_percent <= g.disk_warn_percent <= g.disk_max_percent:
        errors.append(
            f"disk thresholds out of order: guard.disk_notice_percent = {g.disk_notice_percent:g}, "
            f"guard.disk_warn_percent = {g.disk_warn_percent:g}, guard.disk_max_percent = {g.disk_max_percent:g} "
            "must be notice <= warn (cleanup) <= max (critical)"
        )
    lo = g.target_util_min_percent
    if not 0 <= (0.0 if lo is None else lo) <= g.target_util_max_percent <= g.gpu_max_percent:
        shown = "unset (host tier)" if lo is None else f"{lo:g}"
        errors.append(
            f"target band guard.target_util_min_percent = {shown} .. "
            f"guard.target_util_max_percent = {g.target_util_max_percent:g} must lie within 0 .. "
            f"guard.gpu_max_percent = {g.gpu_max_percent:g}"
        )
    for name in ("pid_kp", "pid_ki", "pid_kd", "memory_limit_gb"):
        v = getattr(g, name)
        if not (math.isfinite(v) and v >= 0):
            errors.append(f"guard.{name} = {v:g} must be a finite number >= 0")
    for name in ("idle_grace_period_s", "idle_check_interval_s", "check_interval_s",
                 "breaker_cooldown_s", "hook_timeout_s"):
        if getattr(g, name) <= 0:
            errors.append(f"guard.{name} must be positive")
    fixed = g.max_spawns_per_minute
    if fixed is not None and not (math.isfinite(fixed) and 0 < fixed <= MAX_SPAWNS_PER_MINUTE):
        errors.append(f"guard.max_spawns_per_minute = {fixed:g} must be in (0, {MAX_SPAWNS_PER_MINUTE:g}] "
                      "(or unset: per GPU and CPU)")
    for name in ("spawns_per_minute_per_gpu", "spawns_per_minute_per_cpu"):
        v = getattr(g, name)
        if not (math.isfinite(v) and v >= 0):
            errors.append(f"guard.{name} = {v:g} must be a finite number >= 0")
    errors.extend(_window_errors(g))
    if g.dwell_s < 0 or not 0 <= g.hysteresis_ratio < 0.2:
        errors.append("guard.dwell_s must be >= 0 and guard.hysteresis_ratio in [0, 0.2)")
    if g.checkpoint_keep < 1 or g.breaker_failures < 1:
        errors.append("guard.checkpoint_keep and guard.breaker_failures must be at least 1")
    if g.cleanup not in ("on", "dry-run", "off"):
        errors.append(f"guard.cleanup must be on, dry-run or off, not {g.cleanup!r}")
    for h in g.hooks:
        if "=" not in h:
            errors.append(f"guard.hooks entry {h!r} must be EVENT=/path/to/script")
    return errors
