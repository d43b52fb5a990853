"""Signals per config from the training pipeline, and their validator. Pure.

A signal is ``{"config": "hex8_2p", "curriculum_weight": 1.2, "elo_velocity": 14.0, "data_age_s": 600,
"quality": 0.8, "game_count": 120000}``: curriculum weight (>= 0, 1 = nominal), Elo velocity in Elo per day
(may be negative), data age in seconds since the newest data, quality 0-1, and games so far. Missing fields take
neutral values; anything out of range is rejected with a reason.

Merging signals across nodes (a Lamport clock per config, never wall-clock time)
-------------------------------------------------------------------------------
Any node may accept a signal for a config (``POST /signals``), and every node publishes the signals it holds in
its snapshot. Which one is newest must not depend on whose wall clock runs ahead, so each accepted signal is
stamped with a :class:`SignalStamp` ``(clock, origin)``:

* **stamping**: the accepting node sets ``clock = max(clock seen for that config in any snapshot, its own
  included) + 1`` (:func:`next_clock`) and ``origin`` to its node id. A signal accepted after another one was
  seen therefore always carries a higher clock (Lamport's happened-before).
* **merging**: for each config the candidate with the highest ``(clock, origin)`` pair wins
  (:func:`merge_signals`): the clock first, and between two signals accepted concurrently with the same clock,
  the larger origin id, so every node picks the same one whatever order it saw them in. Should two different
  signals ever carry the same stamp (only a forger can make that), the larger value tuple wins, so the merge
  stays commutative, associative and idempotent.

Clocks are bounded by :data:`CLOCK_MAX` (2^50, like terms and incarnations): a candidate with a clock outside
``1..CLOCK_MAX`` is ignored, and :func:`next_clock` saturates there, so a peer publishing the maximum cannot make
this node's next clock unpublishable (it can only tie, and ties go by origin).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from ..errors import P2PNodeError
from ..inputs import InputError, decode_json, decode_msgpack
from ..snapshot import Num, ParamInt, Short, Str

__all__ = [
    "CLOCK_MAX",
    "NEUTRAL",
    "SignalError",
    "SignalStamp",
    "Signals",
    "decode_signal_body",
    "merge_signals",
    "merge_stamped",
    "next_clock",
    "validate_signals",
]

CLOCK_MAX = 2**50
"""Highest valid signal clock (see the module docstring); a decoder rejects larger ones."""

_CONFIG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class SignalError(P2PNodeError):
    """A signal was rejected; ``reasons`` lists why."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("; ".join(reasons))


class Signals(msgspec.Struct, frozen=True):
    """One config's training signals (see the module docstring for fields, units and bounds)."""

    config: str
    curriculum_weight: float = 1.0
    elo_velocity: float = 0.0
    data_age_s: float = 0.0
    quality: float = 0.5
    game_count: int = 0


NEUTRAL = Signals("")

_BOUNDS = {
    "curriculum_weight": (0.0, 100.0),
    "elo_velocity": (-10000.0, 10000.0),
    "data_age_s": (0.0, 10 * 365 * 86400.0),
    "quality": (0.0, 1.0),
    "game_count": (0, 10**12),
}


def validate_signals(raw: Any) -> Signals:
    """A :class:`Signals` from untrusted input, or :class:`SignalError` with every reason."""
    if not isinstance(raw, dict):
        raise SignalError(["signal must be a map"])
    reasons = []
    config = raw.get("config")
    if not (isinstance(config, str) and _CONFIG.match(config)):
        reasons.append("config: required, e.g. \"hex8_2p\"")
    unknown = set(raw) - set(_BOUNDS) - {"config"}
    if unknown:
        reasons.append(f"unknown fields: {', '.join(sorted(map(str, unknown)))}")
    values: dict[str, Any] = {}
    for k, (lo, hi) in _BOUNDS.items():
        if k not in raw:
            continue
        v = raw[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            reasons.append(f"{k}: must be a finite number")
        elif not lo <= v <= hi:
            reasons.append(f"{k}: {v} outside [{lo}, {hi}]")
        elif k == "game_count" and not float(v).is_integer():
            reasons.append("game_count: must be whole")
        else:
            values[k] = int(v) if k == "game_count" else float(v)
    if reasons or not isinstance(config, str):
        raise SignalError(reasons or ["config: required"])
    return Signals(config, **values)


MAX_SIGNALS_PER_REQUEST = 256
"""Signals one request (or the signals file) may carry."""


_SignalMap = Annotated[dict[Short, Str | ParamInt | Num | bool | None], Meta(max_length=16)]
"""One signal as it arrives (``POST /signals``, the signals file): a small map of typed, bounded scalars (text
without control characters, integers within +-2^53, finite numbers within +-1e15); :func:`validate_signals`
then checks each field's range and names every problem at once."""
_SignalBody = _SignalMap | Annotated[list[_SignalMap], Meta(max_length=MAX_SIGNALS_PER_REQUEST)]


def decode_signal_body(body: bytes, *, msgpack: bool = False) -> list[dict[str, Any]]:
    """One signal or a list of at most :data:`MAX_SIGNALS_PER_REQUEST` (JSON, or msgpack with ``msgpack``) as
    plain maps for :func:`validate_signals`. Raises :class:`p2pnode.inputs.InputError`: ``malformed`` (not
    JSON/msgpack; status 400), ``invalid`` (a value of the wrong type, a non-finite or huge number, control
    characters, too many signals or fields; status 422)."""
    try:
        got: Any = decode_msgpack(body, _SignalBody) if msgpack else decode_json(body, _SignalBody)  # type: ignore[arg-type]
    except InputError as exc:
        exc.status = 422 if exc.reason == "invalid" else 400
        raise
    return got if isinstance(got, list) else [got]


class SignalStamp(msgspec.Struct, frozen=True, order=True):
    """The Lamport stamp of one accepted signal: ``clock`` (1..:data:`CLOCK_MAX`) then ``origin`` (the node id
    that accepted it). Stamps compare as ``(clock, origin)`` tuples; the highest is the newest."""

    clock: int
    origin: str


def next_clock(config: str, seen_clocks: Iterable[tuple[str, int]]) -> int:
    """The clock to stamp a newly accepted signal for ``config`` with: one above the highest clock seen for
    ``config`` among ``seen_clocks`` (``(config, clock)`` pairs from every snapshot held, this node's own
    included), 1 when none; saturates at :data:`CLOCK_MAX`. Clocks outside ``1..CLOCK_MAX`` are ignored."""
    top = max((c for cfg, c in seen_clocks if cfg == config and 1 <= c <= CLOCK_MAX), default=0)
    return min(top + 1, CLOCK_MAX)


def merge_stamped(
    candidates: Iterable[tuple[str, int, str, Signals]],
) -> dict[str, tuple[SignalStamp, Signals]]:
    """The newest signal per config with its stamp, from ``(config, clock, origin, signals)`` candidates
    gathered from every snapshot: the highest ``(clock, origin)`` wins. Candidates with a clock outside
    ``1..CLOCK_MAX`` are skipped; the result is independent of the candidates' order."""
    out: dict[str, tuple[SignalStamp, Signals]] = {}
    for config, clock, origin, signals in candidates:
        if not 1 <= clock <= CLOCK_MAX:
            continue
        stamp = SignalStamp(clock, origin)
        held = out.get(config)
        if held is None or stamp > held[0] or (stamp == held[0] and _values(signals) > _values(held[1])):
            out[config] = (stamp, signals)
    return out


def _values(s: Signals) -> tuple[str, float, float, float, float, int]:
    """A total order on signal values: the last tie-break of two signals with the same stamp."""
    return (s.config, s.curriculum_weight, s.elo_velocity, s.data_age_s, s.quality, s.game_count)


def merge_signals(candidates: Iterable[tuple[str, int, str, Signals]]) -> dict[str, Signals]:
    """The newest :class:`Signals` per config (see :func:`merge_stamped`), as the planner takes them."""
    return {config: s for config, (_, s) in merge_stamped(candidates).items()}
