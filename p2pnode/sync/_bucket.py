"""Byte pacing: :class:`TokenBucket` (pure), for pushes (:mod:`._push`) and the blocks a node serves
(:mod:`._distserve`). Apart from the pusher, which only a node that pushes imports (issue 43: an idle agent's RSS).
"""

from __future__ import annotations

__all__ = ["TokenBucket"]


class TokenBucket:
    """Pacing for ``rate`` bytes per second with bursts of ``burst`` bytes (``rate`` 0: unlimited). Pure: the
    caller passes monotonic time and sleeps for :meth:`take`'s answer."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.at: float | None = None

    def take(self, n: int, now: float) -> float:
        """Take ``n`` bytes at ``now`` (monotonic s); return the seconds to wait before sending them."""
        if self.rate <= 0:
            return 0.0
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate
