"""Spawn safeguards: a circuit breaker and a spawn-rate limit. Pure; ``now`` is monotonic seconds.

The breaker follows the classic closed -> open -> half-open cycle (Nygard, "Release It!"): ``failures``
consecutive failed spawns open it; while open nothing spawns; after ``cooldown_s`` one trial spawn is allowed
(half-open) and its outcome closes or re-opens the breaker. The rate limit is a token bucket of
``per_minute`` tokens refilled continuously, with a burst of the same size.
"""

from __future__ import annotations

import msgspec

__all__ = ["CircuitBreaker", "SpawnRateLimiter"]

_EPS = 1e-9
"""Tokens counted as whole despite float rounding (a token that comes due at a computed time is there then)."""


class CircuitBreaker(msgspec.Struct):
    """Stops spawning after ``failures`` consecutive failures; recovers after ``cooldown_s``."""

    failures: int = 5
    cooldown_s: float = 300.0
    state: str = "closed"  # closed | open | half-open
    consecutive_failures: int = 0
    opened_at: float = msgspec.field(default=0.0)
    trips: int = 0

    def allow(self, now: float) -> bool:
        """May a spawn be attempted at ``now``? (In half-open state, one trial at a time.)"""
        if self.state == "open" and now - self.opened_at >= self.cooldown_s:
            self.state = "half-open"
            return True
        return self.state == "closed"

    def record(self, ok: bool, now: float) -> None:
        """Record the outcome of a spawn attempted after :meth:`allow` said yes."""
        if ok:
            self.state = "closed"
            self.consecutive_failures = 0
            return
        self.consecutive_failures += 1
        if self.state == "half-open" or self.consecutive_failures >= self.failures:
            if self.state != "open":
                self.trips += 1
            self.state = "open"
            self.opened_at = now

    def reopens_at(self) -> float | None:
        """When an open breaker allows its trial spawn (``None`` unless open)."""
        return self.opened_at + self.cooldown_s if self.state == "open" else None


class SpawnRateLimiter(msgspec.Struct):
    """Token bucket: at most ``per_minute`` spawns per minute on average, bursts up to the same number."""

    per_minute: float = 10.0
    tokens: float = msgspec.field(default=-1.0)
    updated_at: float | None = None
    refused: int = 0

    def try_acquire(self, now: float) -> bool:
        """Take a token at ``now`` if one is available; count a refusal otherwise."""
        if self.updated_at is None:
            self.tokens, self.updated_at = self.per_minute, now
        self.tokens = min(self.per_minute, self.tokens + (now - self.updated_at) * self.per_minute / 60.0)
        self.updated_at = now
        if self.tokens >= 1.0 - _EPS:  # a token due at exactly ``next_token_at()`` is there despite rounding
            self.tokens = max(0.0, self.tokens - 1.0)
            return True
        self.refused += 1
        return False

    def next_token_at(self, now: float) -> float:
        """When the next token is there (``now`` when one is; monotonic s), at the current rate."""
        if self.updated_at is None or self.per_minute <= 0:
            return now if self.per_minute > 0 else float("inf")
        tokens = min(self.per_minute, self.tokens + (now - self.updated_at) * self.per_minute / 60.0)
        return now if tokens >= 1.0 - _EPS else now + (1.0 - tokens) * 60.0 / self.per_minute
