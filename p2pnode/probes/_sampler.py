"""The resource sampler: one :class:`ResourceSample` of this machine per call (psutil + a GPU source)."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import psutil

from ..resources import (
    MAX_PSI_BYTES,
    GpuSource,
    PressureStall,
    ResourceSample,
    StallRejected,
    cgroup2_mount,
    decode_stall,
    gpu_power_score,
    in_container,
    pressure_dir,
    pressure_files,
)

__all__ = ["ResourceSampler"]

MIN_CPU_WINDOW_S = 0.2


class ResourceSampler:
    """Samples CPU, load, memory, the disk holding ``disk_path``, and GPUs from ``gpus``.

    CPU percent is measured between successive :meth:`sample` calls (psutil's ``interval=None``); the
    constructor primes it so the first sample is not psutil's meaningless 0.0. psutil calls take
    microseconds; ``gpus.read()`` may block on NVML, so async callers run :meth:`sample` in a thread.
    """

    def __init__(self, disk_path: Path, gpus: GpuSource, *, cpu_interval_s: float | None = None,
                 psi: dict[str, str] | None = None) -> None:
        """``cpu_interval_s``: None measures CPU between calls (the agent); a number blocks that long per sample
        to measure it now (one-off checks from scripts). ``psi``: the PSI file per resource (default:
        :func:`psi_files`; ``{}`` reads none)."""
        self._disk_path = str(disk_path)
        self._gpus = gpus
        self._cpu_interval_s = cpu_interval_s
        self.psi_files = psi_files() if psi is None else psi
        """The PSI file of each resource (:func:`psi_files`, chosen once, at construction: the agent may move
        itself into a leaf cgroup of its own later, whose pressure would count the agent alone)."""
        self.psi_rejected: Counter[str] = Counter()
        """PSI files rejected since start, by reason (:data:`p2pnode.resources.STALL_REJECTIONS`)."""
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
            psi=self.read_psi(),
        )

    def read_psi(self) -> PressureStall | None:
        """PSI of each resource from :attr:`psi_files` (each file read up to :data:`MAX_PSI_BYTES` + 1 bytes and
        decoded by :func:`p2pnode.resources.decode_stall`; a rejected or unreadable one is None for that resource
        and counted in :attr:`psi_rejected`); None when no file was read."""
        if not self.psi_files:
            return None
        found = {}
        for resource, path in self.psi_files.items():
            try:
                with open(path, "rb") as f:
                    found[resource] = decode_stall(f.read(MAX_PSI_BYTES + 1))
            except StallRejected as exc:
                self.psi_rejected[exc.reason] += 1
            except OSError:
                self.psi_rejected["unreadable"] += 1
        if not found:
            return None
        return PressureStall(**found, source=os.path.dirname(next(iter(self.psi_files.values()))))


def psi_files() -> dict[str, str]:
    """This machine's PSI files (:func:`p2pnode.resources.pressure_dir`): inside a container its own cgroup's
    ``cpu.pressure`` (and ``memory``, ``io``), else ``/proc/pressure/*``; ``{}`` when neither exists (a kernel
    without PSI, or not Linux)."""
    def read(path: str) -> str:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read(1 << 20)
        except OSError:
            return ""

    d = pressure_dir(in_container=in_container(env=os.environ, exists=os.path.exists),
                     proc_self_cgroup=read("/proc/self/cgroup"), cgroup2_mount=cgroup2_mount(read("/proc/self/mounts")),
                     exists=os.path.exists)
    files = pressure_files(d)
    return files if os.path.exists(files["cpu"]) else {}
