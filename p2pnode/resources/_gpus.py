"""GPU readings behind one small boundary: real NVML, simulated (fake) GPUs, or none with a reason.

The boundary is :class:`GpuSource` (``read() -> list[GpuReading]``). :class:`NvmlGpus` is the only code that
talks to NVML, through the handful of ``nvidia-ml-py`` functions listed in :class:`NvmlLibrary`; tests hand it
a fake library object. :class:`FakeGpus` simulates GPU profiles from a spec such as ``"H100,RTX 4090"`` or
``"2xH100"``, so every GPU-dependent feature can run on machines without GPUs; its utilization and memory
can be driven by the job runner (:meth:`FakeGpus.set_load`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import re
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ConfigError
from ._power import GPU_MODELS, GpuModel, match_model

__all__ = [
    "FakeGpus", "GpuReading", "GpuSource", "NoGpus", "NvmlGpus", "NvmlLibrary", "open_gpu_source", "parse_fake_gpus",
]

log = logging.getLogger(__name__)

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one instant. Memory in bytes, utilization in percent (0-100), temperature in °C,
    power in watts; ``None`` where the device does not report the value."""

    index: int
    name: str
    uuid: str
    util_percent: float
    mem_used_bytes: int
    mem_total_bytes: int
    temperature_c: float | None
    power_w: float | None

    def to_wire(self) -> dict[str, Any]:
        """The reading as the msgpack-ready map carried in snapshots."""
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "util_percent": self.util_percent,
            "mem_used_bytes": self.mem_used_bytes,
            "mem_total_bytes": self.mem_total_bytes,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
        }


class GpuSource(Protocol):
    """Where GPU readings come from. ``kind`` is ``"nvml"``, ``"fake"`` or ``"none"``; ``absent_reason``
    says why there are no GPUs (``None`` when there are)."""

    kind: str
    absent_reason: str | None

    def read(self) -> list[GpuReading]:
        """The GPUs now, one reading each (empty when there are none). May block (NVML): call from a thread."""

    def close(self) -> None:
        """Release the source (NVML is shut down); reading afterwards is an error."""


class NvmlLibrary(Protocol):
    """The subset of ``pynvml`` (package ``nvidia-ml-py``) that :class:`NvmlGpus` calls."""

    NVMLError: type[Exception]
    NVML_TEMPERATURE_GPU: int

    def nvmlInit(self) -> None:
        """pynvml's function of this name."""
        ...
    def nvmlShutdown(self) -> None:
        """pynvml's function of this name."""
        ...
    def nvmlDeviceGetCount(self) -> int:
        """pynvml's function of this name."""
        ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        """pynvml's function of this name."""
        ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        """pynvml's function of this name."""
        ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        """pynvml's function of this name."""
        ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """pynvml's function of this name (percent)."""
        ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        """pynvml's function of this name (bytes)."""
        ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        """pynvml's function of this name (degrees Celsius)."""
        ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """pynvml's function of this name (milliwatts)."""
        ...


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlGpus:
    """Real GPUs through NVML. Construct with :func:`open_gpu_source`; ``lib`` is the ``pynvml`` module.

    Memory comes from ``nvmlDeviceGetMemoryInfo`` (device-wide, all processes), utilization from
    ``nvmlDeviceGetUtilizationRates().gpu`` (percent), power from ``nvmlDeviceGetPowerUsage`` (mW -> W).
    """

    kind = "nvml"
    absent_reason: str | None = None

    def __init__(self, lib: NvmlLibrary) -> None:
        self._lib = lib
        lib.nvmlInit()
        self._handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(lib.nvmlDeviceGetCount())]
        self._names = [_text(lib.nvmlDeviceGetName(h)) for h in self._handles]
        self._uuids = [_text(lib.nvmlDeviceGetUUID(h)) for h in self._handles]
        if not self._handles:
            self.absent_reason = "NVML found no GPUs"

    def _optional(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._lib.NVMLError:
            return None

    def read(self) -> list[GpuReading]:
        """Read every GPU. A value the device does not support becomes ``None`` (utilization: 0.0)."""
        out = []
        lib = self._lib
        for i, h in enumerate(self._handles):
            util = self._optional(lib.nvmlDeviceGetUtilizationRates, h)
            mem = lib.nvmlDeviceGetMemoryInfo(h)
            temp = self._optional(lib.nvmlDeviceGetTemperature, h, lib.NVML_TEMPERATURE_GPU)
            power_mw = self._optional(lib.nvmlDeviceGetPowerUsage, h)
            out.append(
                GpuReading(
                    index=i,
                    name=self._names[i],
                    uuid=self._uuids[i],
                    util_percent=float(util.gpu) if util is not None else 0.0,
                    mem_used_bytes=int(mem.used),
                    mem_total_bytes=int(mem.total),
                    temperature_c=float(temp) if temp is not None else None,
                    power_w=power_mw / 1000.0 if power_mw is not None else None,
                )
            )
        return out

    def close(self) -> None:
        """Shut NVML down (errors while shutting down are ignored)."""
        try:
            self._lib.nvmlShutdown()
        except self._lib.NVMLError:  # pragma: no cover - shutdown errors are harmless
            pass


_COUNT = re.compile(r"^\s*(\d+)\s*[x×*]\s*(.+?)\s*$", re.IGNORECASE)


def parse_fake_gpu_load(spec: str) -> tuple[int, float, float]:
    """Parse ``"INDEX=UTIL[/MEM]"`` (percent) into ``(index, util_percent, mem_percent)``. Raises
    :class:`ConfigError` for anything else (a negative index, a percent outside 0-100, not a number)."""
    try:
        index, _, load = spec.partition("=")
        util, _, mem = load.partition("/")
        i, u, m = int(index), float(util), float(mem) if mem else 0.0
    except ValueError:
        raise ConfigError(f"fake GPU load {spec!r}: expected INDEX=UTIL[/MEM] in percent, e.g. 0=100/90") from None
    if i < 0 or not (0.0 <= u <= 100.0) or not (0.0 <= m <= 100.0):
        raise ConfigError(f"fake GPU load {spec!r}: the index must be >= 0 and the percentages 0-100")
    return i, u, m


def parse_fake_gpus(spec: str) -> list[GpuModel]:
    """Parse ``"H100,RTX 4090"`` or ``"2xH100, A100"`` into table models, one per simulated GPU.

    Raises :class:`ConfigError` naming the unknown model and listing a few known ones.
    """
    models: list[GpuModel] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        count = 1
        m = _COUNT.match(part)
        if m:
            count, part = int(m.group(1)), m.group(2)
        model = match_model(part)
        if model is None:
            known = ", ".join(" ".join(g.tokens).upper() for g in GPU_MODELS[:8])
            raise ConfigError(f"fake_gpus: unknown GPU model {part!r} (known models include {known}, ...)")
        if not 1 <= count <= 64:
            raise ConfigError(f"fake_gpus: count {count} for {part!r} must be between 1 and 64")
        models.extend([model] * count)
    if not models:
        raise ConfigError("fake_gpus: empty GPU spec")
    return models


class FakeGpus:
    """Simulated GPUs with the table's name, VRAM and TDP. Idle until :meth:`set_load` is called.

    ``seed`` (e.g. the node id) makes the simulated UUIDs distinct per node and stable across restarts.
    """

    kind = "fake"
    absent_reason: str | None = None

    def __init__(self, models: list[GpuModel], *, seed: str = "") -> None:
        self._models = list(models)
        self._load: dict[int, tuple[float, int]] = {}
        self._held: dict[int, tuple[float, int]] = {}
        self._uuids = [
            "GPU-fake-" + hashlib.blake2b(f"{seed}/{i}/{m.nvml_name}".encode(), digest_size=8).hexdigest()
            for i, m in enumerate(self._models)
        ]

    def set_load(self, index: int, *, util_percent: float, mem_used_bytes: int) -> None:
        """Drive simulated GPU ``index``: utilization 0-100 %, memory used in bytes (clamped to VRAM), on top of
        its :meth:`hold` load."""
        total = int(self._models[index].vram_gib * GIB)
        self._load[index] = (max(0.0, min(100.0, util_percent)), max(0, min(total, mem_used_bytes)))

    def hold(self, index: int, *, util_percent: float, mem_percent: float = 0.0) -> None:
        """Keep simulated GPU ``index`` at least this busy whatever :meth:`set_load` says (``agent.fake_gpu_load``):
        utilization and memory in percent, added to the jobs' load and clamped. Raises ``IndexError`` for a GPU
        that is not simulated."""
        total = int(self._models[index].vram_gib * GIB)
        self._held[index] = (max(0.0, min(100.0, util_percent)), int(total * max(0.0, min(100.0, mem_percent)) / 100))

    def read(self) -> list[GpuReading]:
        """One reading per simulated GPU, with the load set by :meth:`set_load` (idle by default)."""
        out = []
        for i, m in enumerate(self._models):
            util, used = self._load.get(i, (0.0, 0))
            held_util, held_used = self._held.get(i, (0.0, 0))
            util, used = min(100.0, util + held_util), min(int(m.vram_gib * GIB), used + held_used)
            out.append(
                GpuReading(
                    index=i,
                    name=m.nvml_name,
                    uuid=self._uuids[i],
                    util_percent=util,
                    mem_used_bytes=used,
                    mem_total_bytes=int(m.vram_gib * GIB),
                    temperature_c=30.0 + 0.5 * util,
                    power_w=round(m.tdp_w * (0.1 + 0.9 * util / 100.0), 1),
                )
            )
        return out

    def close(self) -> None:
        """Nothing to release."""
        pass


class NoGpus:
    """No GPUs; ``absent_reason`` says why (shown in the snapshot)."""

    kind = "none"

    def __init__(self, reason: str) -> None:
        self.absent_reason = reason

    def read(self) -> list[GpuReading]:
        """Always empty."""
        return []

    def close(self) -> None:
        """Nothing to release."""
        pass


def open_gpu_source(fake_spec: str | None, *, seed: str = "", lib: NvmlLibrary | None = None) -> GpuSource:
    """Choose the GPU source: fakes when ``fake_spec`` is set, else NVML, else :class:`NoGpus` with the reason.

    ``lib`` overrides the ``pynvml`` module (tests). Raises :class:`ConfigError` for a bad ``fake_spec``.
    """
    if fake_spec:
        return FakeGpus(parse_fake_gpus(fake_spec), seed=seed)
    if lib is None:
        missing = _nvml_library_missing()
        if missing:  # a GPU-less host: pynvml (1.3 MiB of Python) is never imported
            log.info("no GPUs: %s", missing)
            return NoGpus(missing)
        try:
            import pynvml as lib  # type: ignore[no-redef]  # from nvidia-ml-py
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            return NoGpus(f"nvidia-ml-py not installed: {exc}")
    try:
        return NvmlGpus(lib)
    except lib.NVMLError as exc:
        reason = f"NVML unavailable: {exc.__class__.__name__}: {exc}"
        log.info("no GPUs: %s", reason)
        return NoGpus(reason)


NVML_LIBRARY = "libnvidia-ml.so.1"
"""The shared library ``nvmlInit`` loads on Linux (nvidia-ml-py's ``_LoadNvmlLibrary``)."""


def _nvml_library_missing() -> str | None:
    """Why NVML cannot load on this host (the driver's ``libnvidia-ml.so.1`` is not found), or None when it loads
    (or on a platform where nvidia-ml-py looks elsewhere, which ``nvmlInit`` then decides)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError as exc:
        return f"NVML unavailable: {NVML_LIBRARY} not found ({exc})"
    return None
