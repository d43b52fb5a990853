"""Spread of one fresh update by push-pull anti-entropy, at any N (10,000 takes seconds). Pure, seeded.

Rounds are synchronous (a node forwards in round r only what it held when r began), the model Serf's
estimate assumes. Each round (one gossip interval) every node runs the exchange of
:class:`p2pnode.gossip.Gossiper` with ``fanout`` distinct random peers: (1) request with its digest and own
envelope, (2) reply with what the initiator lacks, (3) a push of what the peer lacks. Each of the three
messages is lost independently with probability ``loss``. The update starts at one node; the result is the
round at which 50 / 99 / 99.9 / 100 % of nodes hold it, next to Serf's closed-form estimate
(``serf_fraction``) for the same N, fanout and loss.
"""

from __future__ import annotations

import math
import random

import msgspec

__all__ = ["SpreadResult", "serf_fraction", "serf_rounds_to", "simulate_spread"]

QUANTILES = (0.5, 0.99, 0.999, 1.0)


def serf_fraction(n: int, fanout: int, loss: float, rounds: float) -> float:
    """Serf's convergence estimate: fraction of ``n`` nodes informed after ``rounds`` gossip intervals,
    ``1 / (1 + (n + 1) · e^(−b·x))`` with ``b = 0.5 · fanout · (1 − loss)`` (serf docs, "Gossip convergence")."""
    b = 0.5 * fanout * (1.0 - loss)
    return 1.0 / (1.0 + (n + 1) * math.exp(-b * rounds))


def serf_rounds_to(n: int, fanout: int, loss: float, fraction: float) -> int | None:
    """Smallest whole number of rounds at which :func:`serf_fraction` reaches ``fraction`` (``None`` for 1.0,
    which the logistic curve never reaches)."""
    if fraction >= 1.0:
        return None
    b = 0.5 * fanout * (1.0 - loss)
    return math.ceil(math.log((n + 1) * fraction / (1.0 - fraction)) / b)


class SpreadResult(msgspec.Struct, frozen=True):
    """``rounds[q]``: first round at which a fraction ``q`` of nodes held the update; ``serf[q]``: the estimate.
    ``messages`` counts every message sent (delivered or lost)."""

    n: int
    fanout: int
    loss: float
    rounds: dict[float, int | None]
    serf: dict[float, int | None]
    messages: int
    curve: list[float]


def simulate_spread(n: int, *, fanout: int = 3, loss: float = 0.0, seed: int = 0,
                    max_rounds: int = 200) -> SpreadResult:
    """Run the spread experiment (see module docstring). Raises ``ValueError`` for n < 2 or loss outside [0, 1)."""
    if n < 2 or not 0.0 <= loss < 1.0:
        raise ValueError("need n >= 2 and 0 <= loss < 1")
    rng = random.Random(seed)
    has = [False] * n
    has[rng.randrange(n)] = True
    count = 1
    rounds: dict[float, int | None] = {q: None for q in QUANTILES}
    curve = [count / n]
    messages = 0
    order = list(range(n))
    k = min(fanout, n - 1)
    rand, sample = rng.random, rng.sample
    for r in range(1, max_rounds + 1):
        rng.shuffle(order)
        informed = list(has)  # synchronous rounds: what a node forwards in round r is what it held at its start
        for i in order:
            for j in sample(range(n - 1), k):
                j += j >= i  # uniform over the other nodes
                messages += 1
                if rand() < loss:
                    continue  # (1) lost: nothing happens (it carries only i's own envelope besides the digest)
                messages += 1
                if rand() < loss:
                    continue  # (2) lost
                if informed[j] and not has[i]:
                    has[i] = True
                    count += 1
                elif informed[i] and not informed[j]:
                    messages += 1
                    if rand() >= loss and not has[j]:  # (3) push delivered
                        has[j] = True
                        count += 1
        curve.append(count / n)
        for q in QUANTILES:
            if rounds[q] is None and count >= math.ceil(q * n):
                rounds[q] = r
        if count == n:
            break
    serf = {q: serf_rounds_to(n, fanout, loss, q) for q in QUANTILES}
    return SpreadResult(n, fanout, loss, rounds, serf, messages, curve)
