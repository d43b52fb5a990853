"""A node's own interruption notice (issue 41, item 3), sans-IO: no clock, no process, ``now`` (monotonic seconds)
and ``wall`` (Unix seconds) passed in, :meth:`InterruptionNotice.next_deadline`.

The operator's probe (``[agent] interruption_probe``, run by :mod:`p2pnode.jobs._noticeprobe` every
``interruption_probe_interval_s``) asks the platform whether this machine is about to be taken back (a spot
instance's interruption, a preemption) and prints **one JSON object** on stdout, at most :data:`MAX_PROBE_BYTES`
(4 KiB), surrounding whitespace allowed:

* ``{"notice": false}``: no notice (a notice held before is withdrawn: the probe is the platform's word);
* ``{"notice": true, "deadline_s": 120, "reason": "spot"}``: this node is gone ``deadline_s`` seconds from now
  (a finite number 0-86400), for ``reason`` (optional, at most 64 characters of letters, digits, space and
  ``_ . : / -``). A later notice with a later deadline does not move it back: the earliest stands.

Decoded by ONE msgspec decoder (:data:`_DECODER`, :class:`ProbeOutput`: unknown fields ignored, each known one
bounded). A probe that cannot start or exits non-zero (``failed``), runs past its time limit (``timeout``),
prints more than 4 KiB (``too_long``) or prints anything else (``malformed``: binary, NaN, a negative or infinite
deadline, control characters in the reason, a second object, nothing at all) is counted in :attr:`counts` by that
reason and never read as a notice: it changes nothing (a notice held stays held). Successful probes are counted
``ok`` (no notice) or ``notice``.
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["MAX_DEADLINE_S", "MAX_PROBE_BYTES", "PROBE_OUTCOMES", "InterruptionNotice", "Notice", "ProbeOutput"]

MAX_PROBE_BYTES = 4096
"""Bytes of probe stdout read at most (more: ``too_long``)."""
MAX_DEADLINE_S = 86400.0
"""The furthest deadline a notice may name (seconds)."""
PROBE_OUTCOMES: tuple[str, ...] = ("ok", "notice", "failed", "timeout", "too_long", "malformed")
"""What a probe run is counted as (:attr:`InterruptionNotice.counts`, ``/metrics``)."""


class ProbeOutput(msgspec.Struct, frozen=True):
    """The probe's stdout (module docstring)."""

    notice: bool
    deadline_s: Annotated[float, Meta(ge=0.0, le=MAX_DEADLINE_S)] | None = None
    reason: Annotated[str, Meta(max_length=64, pattern=r"^[A-Za-z0-9 _.:/\-]*\Z")] = ""


_DECODER = msgspec.json.Decoder(ProbeOutput)


class Notice(msgspec.Struct, frozen=True):
    """A notice held: the node is gone at ``at`` (monotonic seconds) = ``wall_at`` (Unix seconds), for
    ``reason``."""

    at: float
    wall_at: float
    reason: str


class InterruptionNotice:
    """The notice this node holds (:attr:`notice`, None: none) from its probe's runs (module docstring).
    :meth:`probed` with each run's stdout, :meth:`failed` with each failed run's reason; the driver runs the probe
    again at :meth:`next_deadline`. ``interval_s``: seconds between the starts of two runs."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.notice: Notice | None = None
        self.counts: dict[str, int] = dict.fromkeys(PROBE_OUTCOMES, 0)
        self._next = -math.inf

    def next_deadline(self) -> float:
        """When the probe runs next (monotonic seconds; ``-inf`` before the first run: at once)."""
        return self._next

    def probed(self, out: bytes, now: float, wall: float) -> bool:
        """A run started at ``now`` (``wall``) printed ``out``: the notice it gives or withdraws. Whether
        :attr:`notice` changed."""
        self._next = now + self.interval_s
        if len(out) > MAX_PROBE_BYTES:
            return self.failed("too_long", now)
        try:
            got = _DECODER.decode(out)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return self.failed("malformed", now)
        if not got.notice:
            self.counts["ok"] += 1
            before, self.notice = self.notice, None
            return before is not None
        if got.deadline_s is None:
            return self.failed("malformed", now)
        self.counts["notice"] += 1
        new = Notice(now + got.deadline_s, wall + got.deadline_s, got.reason or "interruption")
        if self.notice is not None and self.notice.at <= new.at:
            return False
        self.notice = new
        return True

    def failed(self, reason: str, now: float) -> bool:
        """A run started at ``now`` failed for ``reason`` (one of :data:`PROBE_OUTCOMES` past ``notice``):
        counted, nothing else changes. Returns False (the notice did not change)."""
        self._next = now + self.interval_s
        self.counts[reason if reason in self.counts else "failed"] += 1
        return False

    @property
    def at(self) -> float:
        """When the node is gone (monotonic seconds; ``inf``: no notice)."""
        return self.notice.at if self.notice is not None else math.inf
