"""The resource sampler: one :class:`ResourceSample` of this machine per call (psutil + a GPU source)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ._gpus import GpuReading, GpuSource
from ._power import gpu_power_score

__all__ = ["ResourceSample", "ResourceSampler"]

MIN_CPU_WINDOW_S = 0.2


@dataclass(frozen=True, slots=True)
class ResourceSample:
    """This machine at one instant.

    CPU in percent of all cores (0-100) and core count; load averages over 1/5/15 min; memory and disk in bytes
    (disk is the file system holding ``disk_path``, as ``df`` reports it); GPUs from the node's GPU source
    with ``gpu_source`` (``nvml``, ``fake`` or ``none``) and ``gpu_absent_reason`` when there are none;
    ``power_score`` is the sum of the GPUs' power scores.
    """

    cpu_percent: float
    cpu_count: int
    load_avg: tuple[float, float, float]
    mem_total_bytes: int
    mem_available_bytes: int
    mem_used_bytes: int
    mem_percent: float
    disk_path: str
    disk_total_bytes: int
    disk_used_bytes: int
    disk_free_bytes: int
    disk_percent: float
    gpus: tuple[GpuReading, ...] = field(default=())
    gpu_source: str = "none"
    gpu_absent_reason: str | None = None
    power_score: float = 0.0

    @property
    def vram_total_bytes(self) -> int:
        return sum(g.mem_total_bytes for g in self.gpus)

    def to_wire(self) -> dict[str, Any]:
        """The sample as the msgpack-ready map carried in snapshots."""
        return {
            "cpu_percent": self.cpu_percent,
            "cpu_count": self.cpu_count,
            "load_avg": list(self.load_avg),
            "mem_total_bytes": self.mem_total_bytes,
            "mem_available_bytes": self.mem_available_bytes,
            "mem_used_bytes": self.mem_used_bytes,
            "mem_percent": self.mem_percent,
            "disk_path": self.disk_path,
            "disk_total_bytes": self.disk_total_bytes,
            "disk_used_bytes": self.disk_used_bytes,
            "disk_free_bytes": self.disk_free_bytes,
            "disk_percent": self.disk_percent,
            "gpus": [g.to_wire() for g in self.gpus],
            "gpu_source": self.gpu_source,
            "gpu_absent_reason": self.gpu_absent_reason,
            "power_score": self.power_score,
            "vram_total_bytes": self.vram_total_bytes,
        }


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
