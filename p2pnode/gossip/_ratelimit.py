"""Token buckets for inbound work: bytes per remote host, signature checks per second. Pure (``now`` passed in).

A bucket holds up to ``burst`` tokens and refills at ``rate_per_s``; :meth:`TokenBuckets.take` spends tokens
if they are there. Keyed buckets are bounded (``max_keys``; the least recently used key is forgotten, which
only ever *gives* a forgotten sender a full bucket again, never takes tokens from another).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["TokenBuckets"]


class TokenBuckets:
    """One token bucket per key (see module docstring). Use key ``""`` for a single global bucket."""

    def __init__(self, *, rate_per_s: float, burst: float, max_keys: int = 4096) -> None:
        if rate_per_s <= 0 or burst <= 0:
            raise ValueError("rate_per_s and burst must be positive")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)
        self.refused = 0

    def available(self, key: str, now: float) -> float:
        """Tokens ``key`` holds at ``now``."""
        tokens, at = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + max(0.0, now - at) * self.rate_per_s)

    def take(self, key: str, amount: float, now: float) -> bool:
        """Spend ``amount`` tokens of ``key`` at ``now`` if it holds them (True); else spend nothing, count the
        refusal and return False. An amount above ``burst`` is never granted."""
        tokens = self.available(key, now)
        if amount > tokens:
            self.refused += 1
            self._store(key, tokens, now)
            return False
        self._store(key, tokens - amount, now)
        return True

    def charge(self, key: str, amount: float, now: float) -> None:
        """Spend ``amount`` tokens after the fact (work already done); the bucket may go negative (a debt)."""
        self._store(key, self.available(key, now) - amount, now)

    def _store(self, key: str, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
