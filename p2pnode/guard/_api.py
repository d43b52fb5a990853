"""The resource-guard library API that scripts on a node import (seed 001), with or without a running agent.

    from p2pnode.guard import can_proceed, require_resources, ResourceGuard, OperationPriority

    if not can_proceed(disk_required_gb=5, mem_required_gb=2):
        ...
    with ResourceGuard(disk_required_gb=5.0, mem_required_gb=4.0) as guard:
        if not guard.ok:
            return

Every check samples this machine directly (psutil; GPUs through the NVML boundary, every process's memory on
each GPU; ``P2PNODE_FAKE_GPUS`` simulates GPUs) against :data:`LIMITS`, the ``[guard]`` limits of the agent's
config (``$P2PNODE_CONFIG`` and ``P2PNODE_*`` env). Sizes are GiB (2**30 bytes); the ``_gb`` names are the seed
API's. "Room" for a resource is what can still be used before its max limit: ``total × max% − used``.
The disk checked is the file system of ``path`` (default: the agent's data dir if it exists, else the working
directory). CPU and memory count as the agent's guard counts them (:class:`p2pnode.guardcore.LoadWindows`): CPU as
the mean of this process's samples in the last ``guard.cpu_window_s``, memory over ``guard.memory_window_s`` (at
once at or above its limit), with PSI shown beside them. Each sample's CPU is measured since the previous one,
from one baseline shared by every thread (the first, and any after more than ``cpu_window_s`` without a sample,
over a blocking 0.2 s). Unlike the agent's, the window has no start-up discount: a one-off call (:func:`check_cpu`,
:func:`get_degradation_level`, the first poll of :func:`wait_for_resources`) counts its 0.2 s measurement as the
window, so a saturated machine refuses at once; a script that polls (:func:`wait_for_resources`,
:class:`AsyncResourceLimiter`) gets the mean of its polls over the window, where a spike is diluted.
Blocking waits use ``time.sleep``; :class:`AsyncResourceLimiter` and async functions decorated
with :func:`respect_resource_limits` use anyio, so they work under asyncio and trio alike.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio

from ..config import default_data_dir, load_config
from ..errors import P2PNodeError
from ..guardcore import (
    LEVEL_NAMES,
    Assessment,
    GuardLimits,
    LoadWindows,
    OperationPriority,
    assess,
    level_reasons,
    may_start,
)
from ..probes import ResourceSampler, open_gpu_source
from ..resources import ResourceSample

__all__ = [  # noqa: F822 - LIMITS is served by the module __getattr__ below (read on first use)
    "LIMITS",
    "limits",
    "AsyncResourceLimiter",
    "ResourceGuard",
    "ResourceUnavailable",
    "can_proceed",
    "check_cpu",
    "check_disk_space",
    "check_gpu_memory",
    "check_memory",
    "get_degradation_level",
    "get_recommended_actions",
    "get_resource_status",
    "print_resource_status",
    "require_resources",
    "respect_resource_limits",
    "should_proceed_with_priority",
    "wait_for_resources",
]

GIB = 2**30
F = TypeVar("F", bound=Callable[..., Any])


def _load_limits() -> GuardLimits:
    path = os.environ.get("P2PNODE_CONFIG")
    return load_config(Path(path) if path else None).guard


_LIMITS: GuardLimits | None = None
_LIMITS_LOCK = threading.Lock()


def limits() -> GuardLimits:
    """The limits in force (defaults < ``$P2PNODE_CONFIG`` < env), read on first use; also ``LIMITS``.

    Read once, under a lock: the async limiters call this from worker threads, and reading the config is the
    process's first msgspec decode of its types, which msgspec (0.22) does not make safe against a second
    thread doing the same (:func:`p2pnode.inputs.warm_type_info`)."""
    global _LIMITS
    if _LIMITS is None:
        with _LIMITS_LOCK:
            if _LIMITS is None:
                _LIMITS = _load_limits()
    return _LIMITS


def __getattr__(name: str) -> Any:  # PEP 562: LIMITS is read on first use, so a bad config fails a call, not the import
    if name == "LIMITS":
        return limits()
    raise AttributeError(name)


class ResourceUnavailable(P2PNodeError):
    """A required resource is not available within its limit. ``resource`` (``disk``, ``memory``, ``gpu``,
    ``cpu``), ``need_bytes`` and ``free_bytes`` (room within the limit; for CPU, percent) say which and how much.
    ``permanent`` is True when no wait can help: GPU memory asked of a machine without GPUs (or of a GPU it does
    not have), or more than the largest GPU holds within the GPU limit; the waiting calls then raise (or return
    False) at once instead of polling until their timeout."""

    def __init__(self, resource: str, need: float, free: float, message: str, *, permanent: bool = False) -> None:
        self.resource = resource
        self.need_bytes = need
        self.free_bytes = free
        self.permanent = permanent
        super().__init__(message)


class _Probe:
    """Lazily opened sampler shared by the API (NVML is initialised once per process)."""

    _lock = threading.Lock()
    _sampler: ResourceSampler | None = None

    @classmethod
    def sample(cls, path: str | os.PathLike | None = None) -> ResourceSample:
        """A sample of this machine now (:class:`p2pnode.probes.ResourceSampler`), the disk that of ``path``
        (default: the data dir, else the working dir). CPU is measured since the previous sample, the first (and
        any after more than ``guard.cpu_window_s`` without one) over a blocking 0.2 s: a script that polls gets
        the whole time between its polls into the window, a one-off call 0.2 s measured now. Opens the sampler
        (and NVML) on first use; raises what psutil raises for a path that does not exist."""
        with cls._lock:
            if cls._sampler is None:
                cls._sampler = ResourceSampler(
                    _default_path(), open_gpu_source(os.environ.get("P2PNODE_FAKE_GPUS") or None), cpu_interval_s=None,
                    cpu_stale_s=limits().cpu_window_s)
            return cls._sampler.sample(Path(path) if path is not None else _default_path())


class _Windows:
    """This process's CPU and memory windows (:class:`p2pnode.guardcore.LoadWindows`), made again when the limits
    in force change; each sample enters them once (the same sample object seen again is not counted twice)."""

    _lock = threading.Lock()
    _windows: LoadWindows | None = None
    _recorded: ResourceSample | None = None

    @classmethod
    def assess(cls, s: ResourceSample, lim: GuardLimits) -> Assessment:
        """Sample ``s`` entered into this process's windows (once per sample object) and assessed over them against
        ``lim`` (:func:`p2pnode.guardcore.assess`; no tracker: the level is the assessment's own). No start-up
        discount (``idle_start`` False): a one-off call's first sample, measured over 0.2 s, is its window."""
        with cls._lock:
            if cls._windows is None or cls._windows.limits is not lim:
                cls._windows, cls._recorded = LoadWindows(lim, idle_start=False), None
            wire = s.to_wire()
            signals = cls._windows.observe(wire, time.monotonic(), s.psi, record=s is not cls._recorded)
            cls._recorded = s
            return assess(cls._windows.windowed(wire, signals), lim, signals)


def _assessed(path: str | os.PathLike | None = None) -> tuple[ResourceSample, Assessment]:
    """A sample of this machine now and its assessment over the windows (as the agent's guard makes it)."""
    s = _Probe.sample(path)
    return s, _Windows.assess(s, limits())


def _default_path() -> Path:
    d = default_data_dir()
    return d if d.exists() else Path.cwd()


def _room_disk(s: ResourceSample, limits: GuardLimits) -> float:
    """Bytes that still fit on the disk within its limit. The capacity is what an unprivileged process can fill
    (used + available: ``f_bavail``, without the blocks reserved for root), as ``disk_percent`` counts it, and
    the room never exceeds the bytes actually available."""
    capacity = s.disk_used_bytes + s.disk_free_bytes
    return min(float(s.disk_free_bytes), capacity * limits.disk_max_percent / 100.0 - s.disk_used_bytes)


def _room_memory(s: ResourceSample, limits: GuardLimits) -> float:
    return s.mem_total_bytes * limits.memory_max_percent / 100.0 - s.mem_used_bytes


def _room_gpus(s: ResourceSample, limits: GuardLimits) -> list[float]:
    return [g.mem_total_bytes * limits.gpu_max_percent / 100.0 - g.mem_used_bytes for g in s.gpus]


def _shortfalls(
    s: ResourceSample,
    limits: GuardLimits,
    *,
    disk_gb: float = 0.0,
    mem_gb: float = 0.0,
    gpu_gb: float | None = None,
    cpu: bool = False,
    device: int | None = None,
    cpu_percent: float | None = None,
) -> list[ResourceUnavailable]:
    """What is missing of the request on sample ``s``; ``cpu_percent``: CPU as assessed (over its window; None:
    the sample's own)."""
    out = []
    room = _room_disk(s, limits)
    if disk_gb > 0 or room < 0:
        if disk_gb * GIB > room:
            out.append(ResourceUnavailable(
                "disk", disk_gb * GIB, max(0.0, room),
                f"disk: need {disk_gb:g} GiB on {s.disk_path}, {max(0.0, room) / GIB:.1f} GiB free within the "
                f"{limits.disk_max_percent:g} % limit (disk at {s.disk_percent:.0f} %)"))
    room = _room_memory(s, limits)
    if mem_gb > 0 or room < 0:
        if mem_gb * GIB > room:
            out.append(ResourceUnavailable(
                "memory", mem_gb * GIB, max(0.0, room),
                f"memory: need {mem_gb:g} GiB, {max(0.0, room) / GIB:.1f} GiB free within the "
                f"{limits.memory_max_percent:g} % limit (memory at {s.mem_percent:.0f} %)"))
    if gpu_gb is not None:
        rooms = _room_gpus(s, limits)
        if device is not None:
            rooms = rooms[device : device + 1] if device >= 0 else []
        gpus = s.gpus if device is None else s.gpus[device : device + 1] if device >= 0 else ()
        best = max(rooms, default=None)
        most = max((g.mem_total_bytes * limits.gpu_max_percent / 100.0 for g in gpus), default=0.0)
        if best is None or gpu_gb * GIB > best:
            where = f"GPU {device}" if device is not None else "any GPU"
            free = max(0.0, best or 0.0)
            if best is None:
                n = len(s.gpus)
                why = (f"{s.gpu_absent_reason or 'this machine has no GPU'}: no wait can satisfy it" if not n
                       else f"this machine has {n} GPU{'s' if n > 1 else ''} "
                            f"({f'indexes 0-{n - 1}' if n > 1 else 'index 0'}): no wait can satisfy it")
            elif gpu_gb * GIB > most:
                why = (f"{'it' if device is not None else 'the largest'} holds {most / GIB:.1f} GiB within the "
                       f"{limits.gpu_max_percent:g} % limit: no wait can satisfy it")
            else:
                why = f"{free / GIB:.1f} GiB free within the {limits.gpu_max_percent:g} % limit"
            out.append(ResourceUnavailable("gpu", gpu_gb * GIB, free, f"gpu: need {gpu_gb:g} GiB on {where}, {why}",
                                           permanent=best is None or gpu_gb * GIB > most))
    used = s.cpu_percent if cpu_percent is None else cpu_percent
    if cpu and limits.cpu_max_percent > 0 and used >= limits.cpu_max_percent:  # (0: not assessed)
        over = f" over {limits.cpu_window_s:g} s" if cpu_percent is not None and limits.cpu_window_s > 0 else ""
        out.append(ResourceUnavailable(
            "cpu", 0.0, max(0.0, limits.cpu_max_percent - used),
            f"cpu: at {used:.0f} %{over}, at or above the {limits.cpu_max_percent:g} % limit"))
    return out


def check_disk_space(required_gb: float = 0.0, path: str | os.PathLike | None = None) -> bool:
    """True when ``required_gb`` GiB more fit on ``path``'s file system within the disk limit."""
    return not _shortfalls(_Probe.sample(path), limits(), disk_gb=required_gb)


def check_memory(required_gb: float = 0.0) -> bool:
    """True when ``required_gb`` GiB more of memory fit within the memory limit."""
    s = _Probe.sample()
    return not [e for e in _shortfalls(s, limits(), mem_gb=required_gb) if e.resource == "memory"]


def check_cpu() -> bool:
    """True when CPU utilization, as the guard assesses it (the mean of this process's samples over
    ``guard.cpu_window_s``; a first call: 0.2 s measured now), is below the CPU limit."""
    s, a = _assessed()
    return not [e for e in _shortfalls(s, limits(), cpu=True, cpu_percent=a.used_percent("cpu"))
                if e.resource == "cpu"]


def check_gpu_memory(required_gb: float = 0.0, device: int | None = None) -> bool:
    """True when GPU ``device`` (default: any GPU) has ``required_gb`` GiB free within the GPU limit, counting
    every process's memory on it (NVML). False on a machine without GPUs."""
    s = _Probe.sample()
    return not [e for e in _shortfalls(s, limits(), gpu_gb=required_gb, device=device) if e.resource == "gpu"]


def _problems(
    *, check_disk: bool, check_mem: bool, check_cpu: bool, check_gpu: bool, disk_required_gb: float,
    mem_required_gb: float, gpu_required_gb: float, priority: OperationPriority | int | None,
    path: str | os.PathLike | None,
) -> list[ResourceUnavailable]:
    s, a = _assessed(path)
    found = _shortfalls(
        s, limits(),
        disk_gb=disk_required_gb if check_disk else 0.0,
        mem_gb=mem_required_gb if check_mem else 0.0,
        gpu_gb=gpu_required_gb if check_gpu else None,
        cpu=check_cpu, cpu_percent=a.used_percent("cpu"),
    )
    found = [e for e in found if (e.resource != "disk" or check_disk) and (e.resource != "memory" or check_mem)]
    if priority is not None:
        if not may_start(priority, a.level):  # over the windows, no tracker: the level is the assessment's own
            found.append(ResourceUnavailable(
                "degradation", float(priority), float(a.level),
                f"degradation level {a.level} ({LEVEL_NAMES[a.level]}) admits no {OperationPriority(priority).name} "
                f"work: {'; '.join(level_reasons(a, a.level, limits()))}"))
    return sorted(found, key=lambda e: not e.permanent)  # what no wait can satisfy first: it is what is raised


def _requirements(
    disk_gb: float = 0.0,
    mem_gb: float = 0.0,
    gpu_gb: float = 0.0,
    *,
    cpu: bool = False,
    priority: OperationPriority | int | None = None,
    path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Keyword arguments of :func:`_problems` for the usual "need this much" requests."""
    return dict(check_disk=True, check_mem=True, check_cpu=cpu, check_gpu=gpu_gb > 0, disk_required_gb=disk_gb,
                mem_required_gb=mem_gb, gpu_required_gb=gpu_gb, priority=priority, path=path)


def _wait_sync(requirements: dict[str, Any], timeout: float, interval: float) -> list[ResourceUnavailable]:
    """Poll :func:`_problems` until none are left (returns []) or ``timeout`` seconds pass (returns the last);
    returns at once when one of them is permanent (no wait can satisfy it)."""
    deadline = time.monotonic() + timeout
    while problems := _problems(**requirements):
        left = deadline - time.monotonic()
        if left <= 0 or problems[0].permanent:
            return problems
        time.sleep(min(interval, left))
    return []


def can_proceed(
    check_disk: bool = True,
    check_mem: bool = True,
    check_cpu: bool = False,
    check_gpu: bool = False,
    *,
    disk_required_gb: float = 0.0,
    mem_required_gb: float = 0.0,
    gpu_required_gb: float = 0.0,
    priority: OperationPriority | int | None = OperationPriority.NORMAL,
    path: str | os.PathLike | None = None,
) -> bool:
    """True when every requested check passes and the degradation level admits ``priority`` work."""
    return not _problems(check_disk=check_disk, check_mem=check_mem, check_cpu=check_cpu, check_gpu=check_gpu,
                         disk_required_gb=disk_required_gb, mem_required_gb=mem_required_gb,
                         gpu_required_gb=gpu_required_gb, priority=priority, path=path)


def require_resources(
    disk_gb: float = 0.0,
    mem_gb: float = 0.0,
    gpu_gb: float | None = None,
    *,
    cpu: bool = False,
    path: str | os.PathLike | None = None,
) -> None:
    """Raise :class:`ResourceUnavailable` naming the first missing resource, what is needed and what is free."""
    found = _shortfalls(_Probe.sample(path), limits(), disk_gb=disk_gb, mem_gb=mem_gb, gpu_gb=gpu_gb, cpu=cpu)
    if found:
        raise found[0]


def wait_for_resources(timeout: float = 300.0, interval: float = 10.0, **requirements: Any) -> bool:
    """Poll :func:`can_proceed` (same keyword arguments) every ``interval`` seconds for up to ``timeout``
    seconds; True as soon as it passes, False at the timeout, or at once when no wait can satisfy a requirement
    (:attr:`ResourceUnavailable.permanent`: GPU memory on a machine without GPUs)."""
    kw = dict(check_disk=True, check_mem=True, check_cpu=False, check_gpu=False, disk_required_gb=0.0,
              mem_required_gb=0.0, gpu_required_gb=0.0, priority=OperationPriority.NORMAL, path=None)
    kw.update(requirements)
    return not _wait_sync(kw, timeout, interval)


def get_resource_status(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """This machine now: the sample, the assessment (level, reasons, actions; ``signals``: CPU and memory as
    assessed over their windows, the raw sample and PSI ``avg10``), the PSI files read (``pressure_stall``) and the
    limits, as a dict."""
    s, a = _assessed(path)
    return {
        "sample": s.to_wire(),
        "assessment": a.to_dict(),
        "pressure_stall": s.psi.to_dict() if s.psi is not None else None,
        "room_gib": {
            "disk": round(max(0.0, _room_disk(s, limits())) / GIB, 3),
            "memory": round(max(0.0, _room_memory(s, limits())) / GIB, 3),
            "gpus": [round(max(0.0, r) / GIB, 3) for r in _room_gpus(s, limits())],
        },
        "limits": {k: v for k, v in vars(limits()).items() if not k.startswith("_")},
    }


def print_resource_status(path: str | os.PathLike | None = None, status: dict[str, Any] | None = None) -> None:
    """Print :func:`get_resource_status` as a table with the recommended actions (rich)."""
    from rich.console import Console
    from rich.table import Table

    st = status or get_resource_status(path)
    a = st["assessment"]
    console = Console()
    console.print(f"[bold]degradation level[/] {a['level']} ({a['level_name']}), load ratio {a['ratio']:.2f}")
    table = Table()
    for col in ("resource", "used %", "warn %", "max %", "ratio"):
        table.add_column(col, justify="left" if col == "resource" else "right")
    for name, r in a["resources"].items():
        style = "red" if r["ratio"] >= 1 else "yellow" if r["used_percent"] >= r["warn_percent"] else ""
        table.add_row(name, f"{r['used_percent']:.1f}", f"{r['warn_percent']:g}", f"{r['max_percent']:g}",
                      f"{r['ratio']:.2f}", style=style)
    console.print(table)
    for line in signal_lines(a.get("signals") or {}, st.get("pressure_stall")):
        console.print(line)
    for action in a["actions"]:
        console.print(f"- {action}")


def _pct(value: Any) -> str:
    """A percent as ``42.0 %``, or ``- %`` where it is missing (None: a NaN the agent sent as null) or not a
    finite number."""
    return f"{value:.1f} %" if isinstance(value, (int, float)) and math.isfinite(value) else "- %"


def signal_lines(signals: dict[str, Any], psi: dict[str, Any] | None) -> list[str]:
    """CPU and memory as assessed, in words (``CPU 42.0 %: mean of 10 samples over 10 s; newest sample 100.0 %;
    PSI some avg10 3.2 %``), and I/O PSI where read; PSI is shown, it never moves the level. A figure missing
    (None) or not finite is shown as ``-``."""
    out = []
    for name, sig in signals.items():
        label = "CPU" if name == "cpu" else "Memory"
        n = sig.get("samples") or 0
        window = sig.get("window_s") or 0
        basis = (f"mean of {n} sample{'s' if n != 1 else ''} over {window:g} s" if sig.get("basis") == "window"
                 else "the newest sample" + (" (at or above its limit: at once)" if window > 0 else ""))
        stalls = [f"PSI {k} avg10 {_pct(sig[f'psi_{k}_avg10'])}" for k in ("some", "full")
                  if sig.get(f"psi_{k}_avg10") is not None and (name == "cpu") == (k == "some")]
        out.append(f"{label} {_pct(sig.get('assessed_percent'))}: {basis}; newest sample "
                   f"{_pct(sig.get('sample_percent'))}" + "".join(f"; {x}" for x in stalls))
    io = (psi or {}).get("io")
    if io:
        full = io.get("full") or {}
        out.append(f"I/O PSI some avg10 {_pct((io.get('some') or {}).get('avg10'))}, full avg10 "
                   f"{_pct(full.get('avg10', 0.0))}")
    if psi:
        out.append(f"(PSI from {psi['source']}: shown beside the windows, it never moves the level)")
    return out


def get_degradation_level(path: str | os.PathLike | None = None) -> int:
    """The degradation level 0-4 of this machine now (CPU and memory over their windows, no hysteresis)."""
    return _assessed(path)[1].level


def should_proceed_with_priority(priority: OperationPriority | int, path: str | os.PathLike | None = None) -> bool:
    """True when work of ``priority`` may start at the current degradation level."""
    return may_start(priority, get_degradation_level(path))


def get_recommended_actions(path: str | os.PathLike | None = None) -> list[str]:
    """Plain-word actions, e.g. ``"Disk at 72 %: archive old games or delete unused data"``."""
    return list(_assessed(path)[1].actions)


class ResourceGuard:
    """``with ResourceGuard(disk_required_gb=5, mem_required_gb=4) as guard: if guard.ok: ...``

    Checks once on entry; never raises for missing resources: ``ok`` is False and ``problems`` lists them.
    """

    def __init__(
        self,
        disk_required_gb: float = 0.0,
        mem_required_gb: float = 0.0,
        gpu_required_gb: float = 0.0,
        *,
        check_cpu: bool = False,
        priority: OperationPriority | int | None = None,
        path: str | os.PathLike | None = None,
    ) -> None:
        self._kw = _requirements(disk_required_gb, mem_required_gb, gpu_required_gb, cpu=check_cpu,
                                 priority=priority, path=path)
        self.ok = False
        self.problems: list[ResourceUnavailable] = []

    def __enter__(self) -> ResourceGuard:
        self.problems = _problems(**self._kw)
        self.ok = not self.problems
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class AsyncResourceLimiter:
    """Waits for resources and bounds concurrency, under asyncio or trio (anyio).

    ``async with limiter.acquire("training"):`` waits (polling every ``poll_interval_s`` seconds, sampling in
    a worker thread) until the requirements pass, holding one of ``max_concurrent`` slots; raises
    :class:`ResourceUnavailable` after ``timeout_s`` seconds (``None``: wait forever), or at once for a
    requirement no wait can satisfy (:attr:`ResourceUnavailable.permanent`, e.g. ``gpu_required_gb`` on a
    machine without GPUs).
    """

    def __init__(
        self,
        disk_required_gb: float = 0.0,
        mem_required_gb: float = 0.0,
        gpu_required_gb: float = 0.0,
        *,
        max_concurrent: int = 1,
        poll_interval_s: float = 5.0,
        timeout_s: float | None = None,
        priority: OperationPriority | int | None = None,
        path: str | os.PathLike | None = None,
    ) -> None:
        self._kw = _requirements(disk_required_gb, mem_required_gb, gpu_required_gb, priority=priority, path=path)
        self.max_concurrent = max_concurrent
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.active: list[str] = []
        self._slots: anyio.Semaphore | None = None

    @asynccontextmanager
    async def acquire(self, name: str = "operation") -> AsyncIterator[None]:
        """Take one of ``max_concurrent`` slots, then wait (checking every ``poll_interval_s``) until the required
        resources are within their limits, and hold the slot as ``name`` (listed in :attr:`active`) for the body.
        Raises :class:`ResourceUnavailable` (the first missing resource) when ``timeout_s`` passes first, and at
        once when a requirement is permanent (no wait can satisfy it)."""
        if self._slots is None:
            self._slots = anyio.Semaphore(self.max_concurrent)
        async with self._slots:
            problems: list[ResourceUnavailable] = []
            with anyio.move_on_after(self.timeout_s) as scope:
                while True:
                    problems = await anyio.to_thread.run_sync(functools.partial(_problems, **self._kw))
                    if not problems:
                        break
                    if problems[0].permanent:
                        raise problems[0]
                    await anyio.sleep(self.poll_interval_s)
            if scope.cancelled_caught:
                raise problems[0] if problems else ResourceUnavailable("unknown", 0, 0, f"{name}: timed out")
            self.active.append(name)
            try:
                yield
            finally:
                self.active.remove(name)


def respect_resource_limits(
    disk_gb: float = 0.0,
    mem_gb: float = 0.0,
    gpu_gb: float = 0.0,
    *,
    timeout_s: float = 300.0,
    poll_interval_s: float = 5.0,
    priority: OperationPriority | int | None = None,
) -> Callable[[F], F]:
    """Decorator: wait (up to ``timeout_s``) for the resources before each call of a sync or async function;
    raise :class:`ResourceUnavailable` naming the missing resource when they do not come."""

    def wrap(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            limiter = AsyncResourceLimiter(disk_gb, mem_gb, gpu_gb, max_concurrent=1 << 30,
                                           poll_interval_s=poll_interval_s, timeout_s=timeout_s, priority=priority)

            @functools.wraps(fn)
            async def async_inner(*args: Any, **kwargs: Any) -> Any:
                async with limiter.acquire(fn.__name__):
                    return await fn(*args, **kwargs)

            return async_inner  # type: ignore[return-value]

        kw = _requirements(disk_gb, mem_gb, gpu_gb, priority=priority)

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            problems = _wait_sync(kw, timeout_s, poll_interval_s)
            if problems:
                raise problems[0]
            return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap
