"""GPU readings behind one small boundary: simulated (fake) GPUs, none with a reason, or real NVML.

The boundary is :class:`GpuSource` (``read() -> list[GpuReading]``). :class:`FakeGpus` simulates GPU profiles
from a spec such as ``"H100,RTX 4090"`` or ``"2xH100"``, so every GPU-dependent feature can run on machines
without GPUs; its utilization and memory can be driven by the job runner (:meth:`FakeGpus.set_load`).
:class:`NoGpus` says why there are none. The real source, ``NvmlGpus``, and ``open_gpu_source``, which picks
one of the three, are machine probes and live in :mod:`p2pnode.probes`.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol

import msgspec

from ..errors import ConfigError
from ._power import GPU_MODELS, GpuModel, match_model

__all__ = ["LOAD_PER_GPU", "FakeGpus", "GpuReading", "GpuSource", "NoGpus", "parse_fake_gpu_load",
           "parse_fake_gpus"]

GIB = 1024**3
LOAD_PER_GPU = {"selfplay": 65.0, "training": 75.0, "evaluation": 55.0}
"""Utilization (percent of a whole GPU) a job of each kind drives on a simulated GPU per unit of GPU it holds:
the load model of ``--fake-gpus`` (:class:`p2pnode.jobs.NodeOffer`) and of the scheduling simulation, one table
for both. A kind not listed drives 70 %."""


class GpuReading(msgspec.Struct, frozen=True):
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
    absent_reason: str | None

    def __init__(self, reason: str) -> None:
        self.absent_reason = reason

    def read(self) -> list[GpuReading]:
        """Always empty."""
        return []

    def close(self) -> None:
        """Nothing to release."""
        pass
