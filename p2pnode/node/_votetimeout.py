"""The election timeout of one voter: when it stops holding its vote for a candidate it no longer hears. Sans-IO
(``now`` passed in, monotonic seconds; no clock, no trio).

Before, a voter kept voting for a suspect candidate until its membership declared that candidate dead (the
Lifeguard suspicion timeout, 4-24 s after the suspicion at N = 5 on the ``lan`` profile, by how many others
confirmed it), so the majority side of a partition that cut its leader off waited for the death before it could
elect (6.3-10.8 s in ``bench/election_netns.py``). Raft's answer is the follower's election timeout: a follower that
has not heard from its leader for that long starts a new term (Ongaro & Ousterhout 2014, section 5.2), with
pre-vote and check-quorum (Ongaro's thesis, section 9.6) so a node that merely lost touch cannot disrupt a healthy
leader. Here:

**The rule** (:meth:`VoteTimeout.update`). A voter gives up the candidate it votes for when, at ``now``,

1. that candidate is **suspect** in this voter's view (a failed probe, an accusation heard, or its own silence
   timer: :class:`p2pnode.gossip.Membership`);
2. this voter has heard **nothing** of it (no new snapshot version, directly or relayed by any peer's push-pull, and
   no probe ack, direct or through a relay) for :meth:`VoteTimeout.timeout_s` = ``suspect_after_s(N) +
   publish_interval_s(N)`` (6 s at N = 5, ``lan``). That is the leader's lease on this voter's vote plus one
   heartbeat: a leader counts a voter's vote only while it sees that voter alive
   (:class:`p2pnode.election.Election`), and its own silence timer makes a voter it has not heard for
   ``suspect_after_s`` suspect; the two sides' last news of each other differ by at most about a heartbeat when a
   cut takes both directions at once, so such a leader has stepped down (no quorum alive) by the time they move.
   A one-way cut is not bounded so: a leader that still hears a voter counts it until that voter's accusation
   reaches it (``doubting`` of :meth:`p2pnode.election.Election.update`), and a voter that suspects the leader
   only by an accusation heard lists none; a cut of the other direction just before then leaves the leader
   leading on its side until its silence timer, in an older term than the majority's (the Lifeguard death, 4 s
   after a confirmed suspicion at N = 5, has the same gap; closing it needs a give-up counted from this voter's
   own published accusation, which makes this rule slower than the death it was written to beat);
3. **check-quorum / pre-vote**: this voter sees a quorum of the voter set alive, itself included, and at least one
   other voter it sees alive has lost the candidate too: it accuses it (lists it, at its current incarnation,
   among the suspects of its snapshot: its own failed probe or silence timer; Lifeguard's independent
   confirmation), or it already votes for another candidate in a higher term. A voter cut off on
   its own, or on a minority side, gives up nobody and so opens no term that would fence the leader when it comes
   back (the disruption pre-vote prevents); nor does a voter whose own link or host loses the candidate's news
   while the others still hear it. A voter that merely missed a snapshot or a probe hears the candidate again
   through the others' push-pull within a round, long before the timeout.

A candidate given up is no candidate of this voter's vote (:meth:`p2pnode.node.NodeCore.reconcile` drops it before
:meth:`p2pnode.election.Election.update`), which then moves the vote, as ever, only to a new term above every term
seen, to the best candidate this voter sees **alive** (a vote never moves to a suspect member; it may stay with
one). Safety is the election's and is untouched: one vote per term, a leader needs a quorum of the voter set in one
term, terms fence plans (two majorities meet, so no two leaders in one term). Exclusive work is fenced by leases
(:mod:`p2pnode.node._lease`), whose takeover bound does not depend on when an election happens.

A candidate given up stays so until it is heard again; then it counts as **back** from then on (:attr:`back_at`),
as a member back from dead does, for ``election.leader_settle_s`` (:meth:`NodeCore._settled`): a strong node given
up across a partition does not take the lead back the moment the partition heals (it usually refutes the
accusations anyway, which resets its ``up_since``). State is bounded by the membership: members reaped or unknown
are forgotten.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from ..election import Vote, quorum_size
from ..gossip import Membership, MemberState, publish_interval_s, suspect_after_s

__all__ = ["VoteTimeout"]

_S, _A = MemberState.SUSPECT, MemberState.ALIVE


class VoteTimeout:
    """One voter's election timeout (module docstring). ``enabled`` False: the rule is off (a vote is held for a
    suspect candidate until it is dead, as before; for comparisons in tests)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.given_up: dict[str, float] = {}
        """Members this voter gave up, with when (monotonic s); each until it is heard again."""
        self.back_at: dict[str, float] = {}
        """Members heard again after they were given up, with when (monotonic s): settling counts from then."""
        self.moves = 0
        """Times this voter gave up the candidate it voted for (``/status`` ``election.vote_timeouts``)."""
        self.gave_up: str | None = None
        """The candidate the last :meth:`update` gave up (None: none), for the driver's log."""
        self._checked_at = -math.inf
        """The ``now`` of the last :meth:`update`: a due time at or before it was already judged."""

    @staticmethod
    def timeout_s(membership: Membership) -> float:
        """``suspect_after_s(N) + publish_interval_s(N)`` seconds for the membership's size N (module docstring)."""
        n, cfg = membership.size, membership.cfg
        return suspect_after_s(n, cfg) + publish_interval_s(n, cfg)

    def update(self, membership: Membership, *, vote: Vote | None, votes: Mapping[str, Vote],
               voter_set: Collection[str], alive: Collection[str], min_voters: int, now: float) -> set[str]:
        """Apply the rule at ``now`` for a voter whose vote is ``vote`` (None: none yet); ``votes`` (the others'),
        ``voter_set`` and ``alive`` (this node included) as :func:`p2pnode.election.election_inputs` gives them,
        ``min_voters`` the election's floor. Returns the members given up (suspect ones, no candidates of this
        voter's vote)."""
        self._checked_at = now
        self.gave_up = None
        for node_id in list(self.given_up):
            st = membership.state_of(node_id)
            if st is not _S:
                del self.given_up[node_id]
                if st is _A:
                    self.back_at[node_id] = now
        for node_id in [n for n in self.back_at if n not in membership.members]:
            del self.back_at[node_id]
        if (self.enabled and vote is not None and vote.candidate not in self.given_up
                and now >= self._due(membership, vote.candidate)
                and sum(1 for n in voter_set if n in alive) >= quorum_size(max(len(voter_set), min_voters))
                and self._confirmed(membership, vote, votes, voter_set, alive)):
            self.given_up[vote.candidate] = now
            self.gave_up = vote.candidate
            self.moves += 1
        return set(self.given_up)

    @staticmethod
    def _confirmed(membership: Membership, vote: Vote, votes: Mapping[str, Vote], voter_set: Collection[str],
                   alive: Collection[str]) -> bool:
        """Whether another voter this node sees alive has lost ``vote``'s candidate too: it accuses it (lists it at
        its current incarnation among its snapshot's suspects), or it already voted for another candidate in a
        term above ``vote``'s."""
        c = vote.candidate
        inc = membership.members[c].incarnation
        if any(m.state is _A and m.node_id in voter_set and m.suspects.get(c, -1) >= inc
               for m in membership.members.values()):
            return True
        return any(n in voter_set and n in alive and v.candidate != c and v.term > vote.term for n, v in votes.items())

    def _due(self, membership: Membership, candidate: str) -> float:
        m = membership.members.get(candidate)
        if m is None or m.state is not _S:
            return math.inf
        return max(m.last_heard_at, m.last_acked_at) + self.timeout_s(membership)

    def next_deadline(self, membership: Membership, candidate: str | None) -> float | None:
        """When the rule may next give ``candidate`` (this voter's) up by time alone (None: not while it is not
        suspect, or already given up, or the rule is off, or that time was already judged by :meth:`update` and
        the other conditions failed: they change only with news, a snapshot or a membership transition, on which
        the driver reconciles anyway, so a failed check is not retried on a timer)."""
        if not self.enabled or candidate is None or candidate in self.given_up:
            return None
        at = self._due(membership, candidate)
        return None if math.isinf(at) or at <= self._checked_at else at
