"""The resource sampler: one :class:`ResourceSample` of this machine per call (psutil + a GPU source)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from ..resources import GpuSource, ResourceSample, gpu_power_score

__all__ = ["ResourceSampler"]

MIN_CPU_WINDOW_S = 0.2


class ResourceSampler:
    """Samples CPU, load, memory, the disk holding ``disk_path``, and GPUs from ``gpus``.

    CPU percent is measured between successive :meth:`sample` calls (psutil's ``interval=None``); the
    constructor primes it so the first sample is not psutil's meaningless 0.0. psutil calls take
    microseconds; ``gpus.read()`` may block on NVML, so async callers run :meth:`sample` in a thread.
    """

    def __init__(self, disk_path: Path, gpus: GpuSource, *, cpu_interval_s: float | None = None) -> None:
        """``cpu_interval_s``: None measures CPU between calls (the agent); a number blocks that long per sample
        to measure it now (one-off checks from scripts)."""
        self._disk_path = str(disk_path)
        self._gpus = gpus
        self._cpu_interval_s = cpu_interval_s
        psutil.cpu_percent(interval=None)
        self._primed_at = time.monotonic()

    @property
    def gpu_source(self) -> GpuSource:
        """The GPU source this sampler reads."""
        return self._gpus

    def _cpu_percent(self) -> float:
        interval = self._cpu_interval_s
        if interval is None:
            # psutil measures since the previous call; right after priming that window is too short to mean
            # anything (it reads 0 or 100 %), so the first sample waits out a 0.2 s window once.
            wait = MIN_CPU_WINDOW_S - (time.monotonic() - self._primed_at)
            interval = wait if wait > 0 else None
        return float(psutil.cpu_percent(interval=interval))

    def sample(self, disk_path: Path | None = None) -> ResourceSample:
        """Sample now; ``disk_path`` overrides the file system whose usage is reported."""
        path = str(disk_path) if disk_path is not None else self._disk_path
        vm = psutil.virtual_memory()
        du = psutil.disk_usage(path)
        gpus = tuple(self._gpus.read())
        return ResourceSample(
            cpu_percent=self._cpu_percent(),
            cpu_count=psutil.cpu_count(logical=True) or 1,
            load_avg=tuple(round(x, 3) for x in os.getloadavg()),  # type: ignore[arg-type]
            mem_total_bytes=int(vm.total),
            mem_available_bytes=int(vm.available),
            mem_used_bytes=int(vm.total - vm.available),
            mem_percent=float(vm.percent),
            disk_path=path,
            disk_total_bytes=int(du.total),
            disk_used_bytes=int(du.used),
            disk_free_bytes=int(du.free),
            disk_percent=float(du.percent),
            gpus=gpus,
            gpu_source=self._gpus.kind,
            gpu_absent_reason=self._gpus.absent_reason,
            power_score=sum(gpu_power_score(g.name) for g in gpus),
        )
