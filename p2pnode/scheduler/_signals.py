"""Signals per config from the training pipeline, and their validator. Pure.

A signal is ``{"config": "hex8_2p", "curriculum_weight": 1.2, "elo_velocity": 14.0, "data_age_s": 600,
"quality": 0.8, "game_count": 120000}``: curriculum weight (>= 0, 1 = nominal), Elo velocity in Elo per day
(may be negative), data age in seconds since the newest data, quality 0-1, and games so far. Missing fields take
neutral values; anything out of range is rejected with a reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import P2PNodeError

__all__ = ["NEUTRAL", "SignalError", "Signals", "validate_signals"]

_CONFIG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class SignalError(P2PNodeError):
    """A signal was rejected; ``reasons`` lists why."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("; ".join(reasons))


@dataclass(frozen=True, slots=True)
class Signals:
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
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            reasons.append(f"{k}: must be a finite number")
        elif not lo <= v <= hi:
            reasons.append(f"{k}: {v} outside [{lo}, {hi}]")
        elif k == "game_count" and not float(v).is_integer():
            reasons.append("game_count: must be whole")
        else:
            values[k] = int(v) if k == "game_count" else float(v)
    if reasons:
        raise SignalError(reasons)
    return Signals(config, **values)
