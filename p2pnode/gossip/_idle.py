"""Quiet rounds: how many peers an anti-entropy round contacts when this node holds nothing to spread. Pure.

A round contacts ``fanout`` peers (3) while anything is moving, and ``idle_fanout`` peers (1) while the cluster,
as this node sees it, is quiet (:func:`quiet_round`):

* no news (a snapshot that says more than a heartbeat, :func:`p2pnode.gossip.carries_news`, ours or a peer's)
  was installed here within :func:`news_hold_s`: a node that holds news keeps pushing it to ``fanout`` peers a
  round for the rounds a fanout-wide push needs to reach every member;
* no contact of this node failed within :func:`news_hold_s` either (``failed_at``: a timeout, a refused or
  unusable reply, :meth:`p2pnode.gossip.Gossiper.on_failure`): on a lossy network one pull a round leaves too
  little of the silence timeout (20 nodes at 20 % loss: a member unheard for 7.0 s between two versions where
  the timeout is 6.2 s, against 5-6 s with every round ``fanout`` wide; ``tests/test_gossip_quiet.py``), so loss
  keeps the rounds wide;
* no member is suspect (membership news is moving: accusations, refutations, confirmations);
* every alive member was heard (a new snapshot version, or a probe ack) within :func:`heard_within_s`: halfway
  from one heartbeat to the silence after which it is suspected (:func:`p2pnode.gossip.suspect_after_s`). A member
  heard less lately is pulled from ``fanout`` peers a round again, for at least the other half of that time before
  its silence timer fires, as every round did before (so a slower quiet spread of heartbeats never turns into a
  suspicion by itself).

Heartbeats still go out at their own rate: they spread by pull (memberlist's idle cost likewise is its probes and
a push-pull now and then, not a broadcast per heartbeat). Every quiet round still pulls from one peer, and each
node is pulled from by about one peer a round, so a heartbeat reaches a member within a few rounds.

``now`` is monotonic seconds passed in; nothing here reads a clock.
"""

from __future__ import annotations

import math

from ._membership import Membership, publish_interval_s, suspect_after_s
from ._state import ClusterState

__all__ = ["heard_within_s", "news_hold_s", "quiet_round"]


def heard_within_s(membership: Membership) -> float:
    """Seconds within which every alive member must have been heard for a round to be quiet:
    ``publish_interval_s(N) + (suspect_after_s(N) − publish_interval_s(N)) / 2`` (lan, N = 10: 1 + 4 / 2 = 3 s)."""
    n, cfg = membership.size, membership.cfg
    publish = publish_interval_s(n, cfg)
    return publish + (suspect_after_s(n, cfg) - publish) / 2


def news_hold_s(n: int, fanout: int, gossip_interval_s: float) -> float:
    """Seconds after news was installed here during which rounds stay ``fanout`` wide:
    ``(ceil(log_{fanout+1} n) + 1) × gossip_interval_s`` (each round each holder reaches ``fanout`` more members;
    one round more for the pushes that fail or meet members already told). lan, N = 10, fanout 3: 3 s."""
    rounds = math.ceil(math.log(max(n, 2)) / math.log(fanout + 1)) + 1
    return rounds * gossip_interval_s


def quiet_round(membership: Membership, state: ClusterState, now: float, *, fanout: int,
                failed_at: float = float("-inf")) -> bool:
    """Whether the round starting at ``now`` may contact ``idle_fanout`` peers instead of ``fanout`` (module
    docstring): no news installed and no contact failed (``failed_at``, :attr:`p2pnode.gossip.Gossiper.failed_at`)
    within :func:`news_hold_s`, no member suspect, every alive member heard within :func:`heard_within_s`.
    O(members)."""
    hold = news_hold_s(membership.size, fanout, membership.cfg.gossip_interval_s)
    if now - max(state.news_at, failed_at) < hold:
        return False
    return membership.quiet_since(now - heard_within_s(membership))
