"""The resource sampler: one :class:`ResourceSample` of this machine per call (psutil + a GPU source)."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
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

__all__ = ["ResourceSampler", "cpu_busy_percent"]

MIN_CPU_WINDOW_S = 0.2
"""The shortest span a first (or re-primed) CPU measurement covers: it blocks until that long after the baseline."""
MIN_CPU_SPAN_S = 0.05
"""Two calls closer than this (or within one tick of the kernel's CPU counters) measure nothing new: the later one
returns the previous figure and keeps the baseline."""


def _busy_total(t: object) -> tuple[float, float]:
    """Busy and total CPU seconds of ``psutil.cpu_times()`` as psutil's own ``cpu_percent`` counts them: total
    without the guest times (Linux counts them in user and nice already); busy is total less idle and iowait."""
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # type: ignore[call-overload]
    return total - getattr(t, "idle", 0.0) - getattr(t, "iowait", 0.0), total


def cpu_busy_percent(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """The busy share (percent, 0-100) of all CPUs between two ``(busy, total)`` readings (:func:`_busy_total`);
    None when no CPU time passed between them (the counters tick every 1/USER_HZ s)."""
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return None
    return min(100.0, max(0.0, 100.0 * busy / total))


class ResourceSampler:
    """Samples CPU, load, memory, the disk holding ``disk_path``, and GPUs from ``gpus``.

    CPU percent is measured between successive :meth:`sample` calls, from one ``psutil.cpu_times()`` baseline kept
    here under a lock (psutil's own ``cpu_percent(interval=None)`` keeps its baseline per thread since psutil 5.9.6:
    a sample taken on a fresh worker thread, as ``trio.to_thread`` and ``anyio.to_thread`` take them, would read 0
    or 100 % noise). The first measurement, and one whose baseline is older than ``cpu_stale_s``, waits until
    :data:`MIN_CPU_WINDOW_S` after its baseline. psutil calls take microseconds; ``gpus.read()`` may block on NVML,
    so async callers run :meth:`sample` in a thread.
    """

    def __init__(self, disk_path: Path, gpus: GpuSource, *, cpu_interval_s: float | None = None,
                 psi: dict[str, str] | None = None, cpu_stale_s: float | None = None) -> None:
        """``cpu_interval_s``: None measures CPU between calls (the agent, the guard library); a number blocks that
        long per sample to measure it now. ``cpu_stale_s``: a baseline older than this is taken again and the
        measurement covers the :data:`MIN_CPU_WINDOW_S` after it, not the long quiet gap before (a script that
        looks once a minute; None: never stale, the agent samples steadily). ``psi``: the PSI file per resource
        (default: :func:`psi_files`; ``{}`` reads none)."""
        self._disk_path = str(disk_path)
        self._gpus = gpus
        self._cpu_interval_s = cpu_interval_s
        self._cpu_stale_s = cpu_stale_s
        self.psi_files = psi_files() if psi is None else psi
        """The PSI file of each resource (:func:`psi_files`, chosen once, at construction: the agent may move
        itself into a leaf cgroup of its own later, whose pressure would count the agent alone)."""
        self.psi_rejected: Counter[str] = Counter()
        """PSI files rejected since start, by reason (:data:`p2pnode.resources.STALL_REJECTIONS`)."""
        self._cpu_lock = threading.Lock()
        self._cpu_base = (time.monotonic(), *_busy_total(psutil.cpu_times()))
        self._cpu_last = 0.0
        self._cpu_primed = False

    @property
    def gpu_source(self) -> GpuSource:
        """The GPU source this sampler reads."""
        return self._gpus

    def _cpu_percent(self) -> float:
        if self._cpu_interval_s is not None:
            before = _busy_total(psutil.cpu_times())
            time.sleep(self._cpu_interval_s)
            got = cpu_busy_percent(before, _busy_total(psutil.cpu_times()))
            return self._cpu_last if got is None else got
        with self._cpu_lock:  # one baseline for every thread; a second caller waits out the first one's 0.2 s
            at = time.monotonic()
            if self._cpu_stale_s is not None and at - self._cpu_base[0] > self._cpu_stale_s:
                self._cpu_base = (at, *_busy_total(psutil.cpu_times()))
                self._cpu_primed = False
            if not self._cpu_primed:
                # Right after the baseline the span is too short to mean anything: wait out MIN_CPU_WINDOW_S once.
                wait = MIN_CPU_WINDOW_S - (at - self._cpu_base[0])
                if wait > 0:
                    time.sleep(wait)
                    at = time.monotonic()
                self._cpu_primed = True
            elif at - self._cpu_base[0] < MIN_CPU_SPAN_S:
                return self._cpu_last
            now = _busy_total(psutil.cpu_times())
            got = cpu_busy_percent(self._cpu_base[1:], now)
            if got is None:
                return self._cpu_last
            self._cpu_base, self._cpu_last = (at, *now), got
            return got

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


def psi_files(exists: Callable[[str], bool] = os.path.exists) -> dict[str, str]:
    """This machine's PSI files (:func:`p2pnode.resources.pressure_dir`): inside a container its own cgroup's
    ``cpu.pressure`` (and ``memory``, ``io``), else ``/proc/pressure/*``, those that exist now (a cgroup without
    the memory controller has no ``memory.pressure``: it is left out, not counted unreadable at every sample);
    ``{}`` when there is no CPU file (a kernel without PSI, or not Linux)."""
    def read(path: str) -> str:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read(1 << 20)
        except OSError:
            return ""

    d = pressure_dir(in_container=in_container(env=os.environ, exists=exists),
                     proc_self_cgroup=read("/proc/self/cgroup"), cgroup2_mount=cgroup2_mount(read("/proc/self/mounts")),
                     exists=exists)
    files = pressure_files(d)
    return {r: f for r, f in files.items() if exists(f)} if exists(files["cpu"]) else {}
