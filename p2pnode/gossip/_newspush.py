"""NewsPush: when a node pushes membership news at once, outside the gossip rounds. Pure.

Snapshots otherwise spread by push-pull rounds (every ``gossip_interval_s``, ``fanout`` peers): a new accusation
reaches every member after about ``log4 N`` rounds (5 s at N = 1,000 on the LAN profile), and each member's
suspicion timer starts only when it arrives, so the last member declared a killed node dead that much later than the
first (docs/benchmarks.md "SWIM probe detection"). memberlist spreads its suspect, alive and dead messages as
*broadcasts* instead: every ``GossipInterval`` (200 ms) a node sends its pending broadcasts to ``GossipNodes`` (3)
random members, and a member that learns something new re-broadcasts it (hashicorp/memberlist ``state.go``
``gossip`` and ``suspectNode``/``deadNode``/``aliveNode`` calling ``encodeAndBroadcast``).

We do the same with the signed snapshots themselves: :attr:`p2pnode.gossip.Membership.news` counts membership news
(this node's own accusations or incarnation changed; a member's snapshot brought an accusation, or an incarnation,
new to this node). When it moves, this policy asks the driver for ``rounds`` **pushes**, at most one per
``interval_s``: each push is one push-pull exchange with each of ``fanout`` random peers (the same exchange as a
round's, so the news travels as the signed snapshots that hold it, verified on arrival; a receiver for which they
are news pushes them on). News that arrives while pushes are pending is carried by them (coalesced). A news of
this node's own waits for its publication (``publishing``): the push must carry the new snapshot.

Bound: at most ``1 / interval_s`` pushes a second (``fanout / interval_s`` exchanges: memberlist's 3 packets per
200 ms), and only while news keeps coming; an idle cluster pushes nothing. ``now`` is monotonic seconds passed in.
"""

from __future__ import annotations

__all__ = ["NewsPush", "PUSH_INTERVAL_DIVISOR", "PUSH_ROUNDS"]

PUSH_INTERVAL_DIVISOR = 5
"""Pushes are at most ``gossip_interval_s / 5`` apart (LAN: 200 ms, memberlist's GossipInterval beside its 1 s
ProbeInterval)."""
PUSH_ROUNDS = 2
"""Pushes per news (each to ``fanout`` random peers). One push of each news by every member that learns it (an
"infect and die" epidemic with fanout 3) misses about 6 % of the members (1 − π = e^(−3π)); two miss about 0.3 %,
who get it from the next round's pull. memberlist retransmits ``RetransmitMult × ceil(log10(N + 1))`` times."""


class NewsPush:
    """The push schedule of one node (see module docstring). Feed :meth:`note` the membership news counter,
    ask :meth:`due`, report :meth:`pushed`; :meth:`next_deadline` for the wake-up. ``interval_s`` <= 0: never."""

    def __init__(self, interval_s: float, *, rounds: int = PUSH_ROUNDS) -> None:
        self.interval_s = interval_s
        self.rounds = rounds
        self.pending = 0
        """Pushes still owed to the newest news."""
        self.last_push_at = float("-inf")
        self.pushes = 0
        """Pushes made so far (each one exchange with each of ``fanout`` peers)."""
        self._seen = 0

    def note(self, news: int) -> None:
        """The membership news counter is now ``news``: a change owes ``rounds`` pushes (from now)."""
        if news != self._seen and self.interval_s > 0:
            self._seen = news
            self.pending = self.rounds

    def due(self, now: float, *, publishing: bool = False) -> bool:
        """Whether the driver must push now: pushes owed, the last one ``interval_s`` ago, and no publication of
        this node's own waiting (``publishing``: the push must carry it)."""
        return self.pending > 0 and not publishing and now >= self.last_push_at + self.interval_s

    def pushed(self, now: float) -> None:
        """The driver started a push at ``now``."""
        self.pending = max(0, self.pending - 1)
        self.last_push_at = now
        self.pushes += 1

    def next_deadline(self) -> float | None:
        """When the next owed push may go (``None``: none owed)."""
        return self.last_push_at + self.interval_s if self.pending > 0 else None
