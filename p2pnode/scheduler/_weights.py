"""Bounded multifactor priority, in the manner of Slurm's multifactor plugin. Pure.

Every factor is normalized to [0, 1]; the score is their weighted sum with weights that add up to 1, so a
factor can move a template by at most its weight (no 500× multipliers: a starved config gains at most
``starvation``'s weight). Factors:

=================  ===================================================================  =======
factor             normalization                                                        weight
=================  ===================================================================  =======
priority           template priority / 100                                              0.20
curriculum         min(curriculum_weight / 2, 1)  (1 = nominal -> 0.5)                 0.15
elo_velocity       1 − exp(−max(v, 0) / 20 Elo per day)                                 0.10
staleness          1 − exp(−data_age_s / 3600 s)                                        0.10
quality            quality (0-1)                                                        0.05
starvation         min(wait_s / starvation_cap_s, 1), growing linearly with wait       0.15
quota              (quota share − used share) / quota share of tier-1 GPU time, ≥ 0     0.15
mix                (kind target − kind share) / kind target of GPU time, ≥ 0           0.10
=================  ===================================================================  =======
"""

from __future__ import annotations

import functools
import math

import msgspec

from ._signals import Signals

__all__ = ["FactorWeights", "Factors", "factors", "score"]

ELO_SCALE_PER_DAY = 20.0
STALENESS_SCALE_S = 3600.0


class FactorWeights(msgspec.Struct, frozen=True, kw_only=True):
    """Weights of the factors; :func:`score` normalizes them to sum 1."""

    priority: float = 0.20
    curriculum: float = 0.15
    elo_velocity: float = 0.10
    staleness: float = 0.10
    quality: float = 0.05
    starvation: float = 0.15
    quota: float = 0.15
    mix: float = 0.10


class Factors(msgspec.Struct, frozen=True):
    """The normalized factors of one template at one moment, each in [0, 1]."""

    priority: float
    curriculum: float
    elo_velocity: float
    staleness: float
    quality: float
    starvation: float
    quota: float
    mix: float


def _clamp(x: float) -> float:
    return 0.0 if x < 0 else 1.0 if x > 1 else x


def _deficit(target: float, used: float) -> float:
    return _clamp((target - used) / target) if target > 0 else 0.0


def factors(
    *,
    priority: int,
    signals: Signals,
    wait_s: float,
    starvation_cap_s: float,
    quota_share: float,
    quota_used: float,
    mix_target: float,
    mix_used: float,
) -> Factors:
    """Normalize the raw inputs (see module docstring). ``quota_*`` and ``mix_*`` are shares (0-1)."""
    return Factors(
        priority=_clamp(priority / 100.0),
        curriculum=_clamp(signals.curriculum_weight / 2.0),
        elo_velocity=1.0 - math.exp(-max(signals.elo_velocity, 0.0) / ELO_SCALE_PER_DAY),
        staleness=1.0 - math.exp(-max(signals.data_age_s, 0.0) / STALENESS_SCALE_S),
        quality=_clamp(signals.quality),
        starvation=_clamp(wait_s / starvation_cap_s) if starvation_cap_s > 0 else 0.0,
        quota=_deficit(quota_share, quota_used),
        mix=_deficit(mix_target, mix_used),
    )


_NAMES: tuple[str, ...] = FactorWeights.__struct_fields__


@functools.lru_cache(maxsize=64)
def _normalized(w: FactorWeights) -> tuple[float, ...]:
    total = sum(getattr(w, n) for n in _NAMES) or 1.0
    return tuple(getattr(w, n) / total for n in _NAMES)


def score(f: Factors, w: FactorWeights = FactorWeights()) -> float:
    """Weighted sum of the factors with weights normalized to 1: a value in [0, 1]."""
    a = _normalized(w)
    return (a[0] * f.priority + a[1] * f.curriculum + a[2] * f.elo_velocity + a[3] * f.staleness
            + a[4] * f.quality + a[5] * f.starvation + a[6] * f.quota + a[7] * f.mix)


def _factor_weight(w: FactorWeights, name: str) -> float:
    """The normalized weight of one factor."""
    return _normalized(w)[_NAMES.index(name)]
