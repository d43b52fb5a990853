"""Levels from windows, not samples: CPU and memory assessed over a time window. Pure; ``now`` is passed in.

One CPU sample at 100 % used to raise the degradation level straight to 4 and the dwell held it for 30 s after the
load was gone: an 8-GPU box with a CPU hog running 2 s in every 10 kept 3.1 of 8 GPUs busy. CPU is compressible
(kubelet never evicts on it): a spike slows work, it endangers nothing. So:

* **CPU** counts as the mean of the samples taken in the last ``guard.cpu_window_s`` (default 10 s): a spike of
  ``d`` seconds at 100 % over a quiet node moves the mean by about ``100 · d / window`` points (20 for 2 s of
  10, under the first level's edge: 56 %, 0.70 of the 80 % limit), so with the defaults spikes under about 5 s over a
  quiet node never raise the level, while longer ones do (about 5.6 s reaches level 1, 8 s critical) and a
  sustained overload reaches critical within the window (the mean passes 80 % after 8 s at 100 %). A node
  already near an edge is raised by a shorter spike. In the agent (``idle_start``), in the first
  ``cpu_window_s`` after the first sample the part of the window not yet sampled counts as idle (the mean times
  the share sampled), so the agent's own start is no more than a spike; this discount is the level's only (the
  CPU offer reads :attr:`Signal.window_percent`). A script's one-off check (``idle_start`` False) counts its
  first sample, measured over a short blocking interval, as the whole window.
* **Memory** keeps a short window (``guard.memory_window_s``, default 3 s) for levels 1-3, but a sample at or
  above ``memory_max_percent`` counts at once: memory is not compressible, the OOM killer does not wait.
* **Disk** is each sample alone (it does not spike).
* **PSI** (pressure stall information, :mod:`p2pnode.resources._psi`: CPU ``some avg10``, memory ``full avg10``)
  is shown beside the window as a second signal and never moves the level: the limits of seed 001 are on
  utilization, and PSI is absent on older kernels and in many containers, where the same limits must hold.

:class:`LoadWindow` is one resource's samples (bounded: at most :data:`MAX_WINDOW_SAMPLES`, and none older than
its window; non-finite samples are dropped and counted, others clamped to 0-100); :class:`LoadWindows` holds the
CPU and memory windows and turns a sample into the figures the guard assesses (:class:`Signal`, one per resource,
with the window value, the raw sample and PSI).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import msgspec

from ._limits import GuardLimits

__all__ = ["MAX_WINDOW_SAMPLES", "LoadWindow", "LoadWindows", "Signal", "clamp_percent"]

MAX_WINDOW_SAMPLES = 4096
"""Samples one window keeps at most (the newest): 600 s of samples every 0.15 s."""


class LoadWindow:
    """The used percent of one resource over the last ``window_s`` seconds: ``add(now, percent)`` per sample,
    :meth:`mean` of those taken in ``(now - window_s, now]``. ``window_s`` 0 keeps the newest sample alone."""

    __slots__ = ("_first_at", "_samples", "dropped", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = max(0.0, float(window_s))
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_WINDOW_SAMPLES)
        self._first_at: float | None = None
        self.dropped = 0
        """Samples not recorded since start: not a finite number (NaN, inf; a broken probe)."""

    def coverage(self, now: float) -> float:
        """The share of the window (0-1) sampled by ``now``: the time since the first sample over ``window_s``
        (1 for a window of 0 s; 0 before the first sample)."""
        if self._first_at is None:
            return 0.0
        return 1.0 if self.window_s <= 0 else min(1.0, max(0.0, (now - self._first_at) / self.window_s))

    def add(self, now: float, percent: float) -> None:
        """Record a sample of ``percent`` taken at ``now`` (monotonic s; never earlier than the previous one's),
        clamped to 0-100. A value that is not a finite number (NaN, inf) is dropped and counted in :attr:`dropped`:
        one NaN would make the mean NaN, and a NaN compares False with every edge (level 0 for the whole window)."""
        value = clamp_percent(percent)
        if value is None:
            self.dropped += 1
            return
        percent = value
        if self._first_at is None:
            self._first_at = now
        if self.window_s <= 0:
            self._samples.clear()
        self._samples.append((now, percent))
        while self._samples and self._samples[0][0] <= now - self.window_s and len(self._samples) > 1:
            self._samples.popleft()

    def _current(self, now: float) -> list[float]:
        inside = [v for at, v in self._samples if now - self.window_s < at <= now]
        if not inside and self._samples:  # no sample in the window (the sampler stalled): the newest stands
            inside = [self._samples[-1][1]]
        return inside

    def mean(self, now: float) -> float | None:
        """The mean percent of the samples in the window at ``now`` (the newest sample when none is inside it);
        None before the first sample."""
        inside = self._current(now)
        return sum(inside) / len(inside) if inside else None

    def count(self, now: float) -> int:
        """Samples the window's mean at ``now`` is taken over."""
        return len(self._current(now))

    def newest(self) -> float | None:
        """The newest sample's percent, or None."""
        return self._samples[-1][1] if self._samples else None


def clamp_percent(value: Any) -> float | None:
    """``value`` as a percent clamped to 0-100, or None when it is not a finite number."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return min(100.0, max(0.0, v)) if math.isfinite(v) else None


class Signal(msgspec.Struct, frozen=True):
    """What one node resource counts as (``resource``: ``cpu`` or ``memory``): ``assessed_percent``, the figure the
    level, pressure and offers use; ``window_percent``, the mean over ``window_s`` (``samples`` of them);
    ``sample_percent``, the newest sample alone; ``basis``: ``window`` or ``sample`` (memory at or above its limit,
    or a window of 0 s); PSI ``avg10`` percents where read (``psi_some``, ``psi_full``; None: not read). PSI is
    shown beside the window, it never moves the level (module docstring)."""

    resource: str
    assessed_percent: float
    window_percent: float
    sample_percent: float
    window_s: float
    samples: int
    basis: str
    psi_some: float | None = None
    psi_full: float | None = None
    covered: float = 1.0
    """The share of the CPU window sampled so far (0-1; below 1 only in the agent's first ``window_s`` after its
    first sample, when the part not yet sampled counts as idle: :class:`LoadWindows` ``idle_start``)."""

    @property
    def label(self) -> str:
        """The resource as the guard's reasons name it: ``CPU (10 s mean)``, ``Memory (3 s mean)``, while the CPU
        window fills ``CPU (10 s mean, 4 s sampled)``, or, assessed on the sample alone, ``CPU`` / ``Memory``."""
        name = "CPU" if self.resource == "cpu" else "Memory"
        if self.basis != "window":
            return name
        if self.covered < 1.0:
            return f"{name} ({self.window_s:g} s mean, {self.covered * self.window_s:.0f} s sampled)"
        return f"{name} ({self.window_s:g} s mean)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, percents rounded to 0.01."""
        return {"assessed_percent": round(self.assessed_percent, 2), "window_percent": round(self.window_percent, 2),
                "sample_percent": round(self.sample_percent, 2), "window_s": self.window_s, "samples": self.samples,
                "basis": self.basis, "covered": round(self.covered, 3), "psi_some_avg10": self.psi_some,
                "psi_full_avg10": self.psi_full, "psi_moves_level": False}


class LoadWindows:
    """The CPU and memory windows of one node (``guard.cpu_window_s``, ``guard.memory_window_s``).

    ``observe(sample, now, psi)`` records a sample (its wire form: ``cpu_percent``, ``mem_percent``) and returns
    the :class:`Signal` of each; ``windowed(sample, signals)`` is the sample with those two figures replaced by
    the assessed ones, as :func:`p2pnode.guardcore.assess` takes it. ``idle_start`` (the agent's): while the CPU
    window fills, the part not yet sampled counts as idle; False (a script's guard library): the samples taken so
    far are the window, however few (the first one measured over a short blocking interval)."""

    def __init__(self, limits: GuardLimits, *, idle_start: bool = True) -> None:
        self.limits = limits
        self.idle_start = idle_start
        self.cpu = LoadWindow(limits.cpu_window_s)
        self.memory = LoadWindow(limits.memory_window_s)

    def observe(self, sample: dict[str, Any], now: float, psi: Any = None, *,
                record: bool = True) -> tuple[Signal, Signal]:
        """Record ``sample`` taken at ``now`` (``record`` False: assess what is recorded at ``now`` without adding
        it, for a sample already recorded) and return the CPU and memory :class:`Signal`. ``psi``: a
        :class:`p2pnode.resources.PressureStall` or None."""
        cpu_raw, mem_raw = sample.get("cpu_percent", 0.0), sample.get("mem_percent", 0.0)
        if record:
            self.cpu.add(now, cpu_raw)
            self.memory.add(now, mem_raw)
        # A sample that is not a finite number was dropped: the newest recorded one stands for it (0 before any).
        cpu_now = clamp_percent(cpu_raw)
        cpu_now = cpu_now if cpu_now is not None else self.cpu.newest() or 0.0
        mem_now = clamp_percent(mem_raw)
        mem_now = mem_now if mem_now is not None else self.memory.newest() or 0.0
        return (self._signal("cpu", self.cpu, cpu_now, now, psi),
                self._signal("memory", self.memory, mem_now, now, psi))

    def _signal(self, resource: str, w: LoadWindow, raw: float, now: float, psi: Any) -> Signal:
        mean = w.mean(now)
        mean = raw if mean is None else mean
        at_once = resource == "memory" and self.limits.memory_max_percent > 0 and raw >= self.limits.memory_max_percent
        basis = "sample" if w.window_s <= 0 or at_once else "window"
        some = psi.avg10(resource, "some") if psi is not None else None
        full = psi.avg10(resource, "full") if psi is not None else None
        # CPU only: until the window has been sampled whole (the first cpu_window_s after start), the part not yet
        # sampled counts as idle, so a burst at start (the agent's own) is a spike like any other.
        covered = w.coverage(now) if self.idle_start and resource == "cpu" and basis == "window" else 1.0
        assessed = raw if at_once else mean * covered
        return Signal(resource, assessed, mean, raw, w.window_s, w.count(now) or 1, basis, some, full, covered)

    @staticmethod
    def windowed(sample: dict[str, Any], signals: tuple[Signal, ...]) -> dict[str, Any]:
        """``sample`` (wire form) with ``cpu_percent`` and ``mem_percent`` as ``signals`` assess them."""
        by = {s.resource: s.assessed_percent for s in signals}
        return {**sample, "cpu_percent": by.get("cpu", sample.get("cpu_percent", 0.0)),
                "mem_percent": by.get("memory", sample.get("mem_percent", 0.0))}
