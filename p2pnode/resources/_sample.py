"""One resource sample of a machine, as a typed value (no psutil here: the node core and views use it)."""

from __future__ import annotations

from typing import Any

import msgspec

from ._gpus import GpuReading
from ._psi import PressureStall

__all__ = ["ResourceSample"]


class ResourceSample(msgspec.Struct, frozen=True):
    """This machine at one instant.

    CPU in percent of all cores (0-100) and core count; load averages over 1/5/15 min; memory and disk in bytes
    (disk is the file system holding ``disk_path``, as ``df`` reports it); GPUs from the node's GPU source
    with ``gpu_source`` (``nvml``, ``fake`` or ``none``) and ``gpu_absent_reason`` when there are none;
    ``power_score`` is the sum of the GPUs' power scores; ``psi``: pressure stall information read with the
    sample (:mod:`._psi`; None where the kernel or the container offers none). PSI stays on this node: it is not
    part of the wire form (:meth:`to_wire`), peers never see it.
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
    gpus: tuple[GpuReading, ...] = msgspec.field(default=())
    gpu_source: str = "none"
    gpu_absent_reason: str | None = None
    power_score: float = 0.0
    psi: PressureStall | None = None

    @property
    def vram_total_bytes(self) -> int:
        """Memory of all GPUs together, bytes."""
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
