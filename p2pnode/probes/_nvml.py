"""Real GPUs through NVML, and the choice of a node's GPU source (fakes, NVML, or none with the reason).

:class:`NvmlGpus` is the only code that talks to NVML, through the handful of ``nvidia-ml-py`` functions listed in
:class:`NvmlLibrary`; tests hand it a fake library object. ``pynvml`` is imported only by :func:`open_gpu_source`,
and only on a host whose driver library loads, so a GPU-less host never pays for it.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any, Protocol

from ..resources import FakeGpus, GpuReading, GpuSource, NoGpus, parse_fake_gpus

__all__ = ["NVML_LIBRARY", "NvmlGpus", "NvmlLibrary", "open_gpu_source"]

log = logging.getLogger(__name__)


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


def open_gpu_source(fake_spec: str | None, *, seed: str = "", lib: NvmlLibrary | None = None) -> GpuSource:
    """Choose the GPU source: fakes when ``fake_spec`` is set, else NVML, else :class:`NoGpus` with the reason.

    ``lib`` overrides the ``pynvml`` module (tests). Raises :class:`ConfigError` for a bad ``fake_spec``.
    """
    if fake_spec:
        return FakeGpus(parse_fake_gpus(fake_spec), seed=seed)
    nvml: NvmlLibrary
    if lib is not None:
        nvml = lib
    else:
        missing = _nvml_library_missing()
        if missing:  # a GPU-less host: pynvml (1.3 MiB of Python) is never imported
            log.info("no GPUs: %s", missing)
            return NoGpus(missing)
        try:
            import pynvml  # from nvidia-ml-py
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            return NoGpus(f"nvidia-ml-py not installed: {exc}")
        nvml = pynvml
    try:
        return NvmlGpus(nvml)
    except nvml.NVMLError as exc:
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
