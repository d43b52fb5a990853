"""Leader election by GPU power, with terms as fencing tokens and a majority of the voter set. Pure.

* **Rank**: GPU power score (sum over a node's GPUs), then total VRAM in bytes, then node id (:func:`rank_key`).
* **Voters**: members tagged ``voter``; where none is tagged, every member that has not left (dead members
  included: a partition's minority must not shrink the denominator). ``min_voters`` sets a floor on the voter
  set's size, so a lone fresh node cannot elect itself in a cluster meant to be larger.
* **Eligibility**: a member may lead unless it is tagged ``ephemeral`` (a spot or marketplace box the provider
  can take back at any time), or the operator marked it (``p2pnode node eligible|ineligible|unmark ID``, kept
  with the voter roll as last-writer-wins registers that every member merges from its voters' rolls, so the
  voters converge on the same marks: :meth:`VoterRoll.merge`). A voter votes for
  an eligible member while one is alive or suspect, and for the strongest member otherwise (a cluster of spot
  boxes still has a leader). :func:`is_eligible`. A member **gone soon** (its snapshot carries a notice: an
  interruption notice, or a clean stop under way, ``jobs.notice_deadline_ms``; :attr:`MemberInfo.leaving_soon`) is
  no candidate while another eligible member is (while no member at all is eligible: while any other member is;
  :func:`election_inputs`): a leader elected on a machine about to go would be elected again elsewhere moments
  later. Eligibility comes first: an eligible member gone soon still leads before an ineligible one.
* **Vote**: each voter publishes ``(candidate, term)`` for the highest-ranked eligible member it sees alive or
  suspect; the vote may stay with a suspect member but never moves to one (``suspect`` of :meth:`Election.update`),
  and the node core's election timeout gives a suspect candidate up once it has been unheard for longer than the
  leader's lease on this vote (:mod:`p2pnode.node._votetimeout`: Raft's election timeout, with check-quorum and a
  pre-vote). It changes candidate only to a term above its own: a new term above every term seen, or the newest term
  when that term is already for the same candidate; and it may move to a higher term for the same candidate
  (to converge with other voters). So a voter votes at most once per term, and
  no two candidates can hold a majority in one term.
* **Leader**: the candidate holding a **quorum** (a majority of the voter set) of votes for the same term,
  counting only voters this observer sees **alive** (and itself). That is the lease: when a leader stops
  hearing from a majority (they turn suspect after ``suspect_after_s`` at the latest, or their snapshots accuse
  it: ``doubting`` of :meth:`Election.update`), it steps down, where a cut took both directions at once before
  the majority side gives it up (``suspect_after_s`` plus a heartbeat unheard, :mod:`p2pnode.node._votetimeout`) or
  declares it dead, and elects another (terms fence the rest: an overlap is of two terms, never one).
* **Only voters move terms**: votes of members outside the voter set are ignored before anything else, so they
  raise neither :attr:`Election.highest_term` nor the fence, and a node outside the voter set casts no vote.
* **Bounded terms**: a vote more than :data:`MAX_TERM_STEP` above the highest term held is ignored, unless a
  quorum of the voter set holds that term.
* **Fencing**: :meth:`Election.accepts` says whether a decision carrying ``term`` may be acted on: never one
  below the highest term seen.

Raft (Ongaro & Ousterhout, 2014) is the source of one-vote-per-term and majority quorums; the ranking replaces
Raft's randomized candidacy, so the strongest reachable node leads without a contest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

import msgspec

from .certs import UNCERTIFIED_LEAD_TAG

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .gossip import Membership
    from .snapshot import EligibilityMark

__all__ = [
    "EPHEMERAL_TAG", "MARK_SKEW_S", "MAX_TERM_STEP", "VoterRoll", "Candidate", "Election", "ElectionView",
    "MemberInfo", "Vote", "election_inputs", "is_eligible", "quorum_size", "rank_key",
]

EPHEMERAL_TAG = "ephemeral"
"""The tag of a member the provider can take back at any time (spot, marketplace): not eligible to lead while an
eligible member is alive (:func:`is_eligible`)."""

MARK_SKEW_S = 600.0
"""An eligibility mark stamped more than this ahead of this node's wall clock is ignored (counted in
``VoterRoll.marks_ignored``) until the clock catches up: a stamp far in the future (a voter's broken clock, a
forged mark) would otherwise win every later mark on that node."""

MAX_TERM_STEP = 16
"""A vote whose term is more than this above the highest term this node holds is ignored (and counted in
``Election.implausible_votes``), unless a quorum of the voter set votes in that term or higher: terms grow by one
per election, so only a forged vote jumps, and adopting it would push every node's persisted term toward the wire
maximum. A new node (term 0) still joins a cluster at any term, because that cluster's voters hold it."""

TERM_CEILING = 2**50
"""No vote above this term is ever adopted (a quorum of hostile voters included), so this node's own next term
(one above the highest it adopted) stays far below the wire bound of 2^53 (:data:`p2pnode.snapshot.COUNTER_MAX`)."""


class Vote(msgspec.Struct, frozen=True):
    """A voter's vote for ``candidate`` in ``term``."""

    candidate: str
    term: int

    def to_wire(self) -> dict:
        """The vote as carried in a snapshot: ``{"candidate": node id, "term": int}``."""
        return {"candidate": self.candidate, "term": self.term}


class Candidate(msgspec.Struct, frozen=True):
    """What ranking needs of a member: power score, total VRAM in bytes, node id."""

    node_id: str
    power_score: float
    vram_bytes: int


def rank_key(c: Candidate) -> tuple[float, int, str]:
    """Higher is stronger: (power score, total VRAM bytes, node id)."""
    return (c.power_score, c.vram_bytes, c.node_id)


def is_eligible(node_id: str, tags: Collection[str], *, eligible: Collection[str] = (),
                ineligible: Collection[str] = ()) -> bool:
    """Whether ``node_id`` may lead: the operator's mark first (``ineligible``, then ``eligible``: the voter
    roll's :attr:`VoterRoll.eligible` / :attr:`VoterRoll.ineligible`), else unless it is tagged
    :data:`EPHEMERAL_TAG` or, where operator keys are pinned, is not certified to lead (its effective tags carry
    :data:`p2pnode.certs.UNCERTIFIED_LEAD_TAG`). Leadership that moves each time the spot market takes a box
    away costs a settle and a plan each time; Nomad and Consul keep their servers on durable machines for the
    same reason."""
    if node_id in ineligible:
        return False
    if node_id in eligible:
        return True
    return EPHEMERAL_TAG not in tags and UNCERTIFIED_LEAD_TAG not in tags


def quorum_size(voters: int) -> int:
    """Majority of ``voters``: ``voters // 2 + 1``."""
    return voters // 2 + 1


class ElectionView(msgspec.Struct, frozen=True):
    """An observer's conclusion: ``leader`` (or ``None``) and its ``term``; ``highest_term`` seen anywhere;
    ``votes_for_leader`` and ``quorum`` behind it; the ``voters`` counted in the voter set."""

    leader: str | None
    term: int | None
    highest_term: int
    votes_for_leader: int
    quorum: int
    voters: int


class Election:
    """One node's vote and its view of the leader. ``vote`` and ``term`` must be persisted by the driver (a
    voter that forgot its vote could vote twice in one term); restore them with the constructor."""

    def __init__(self, self_id: str, *, is_voter: bool, vote: Vote | None = None, min_voters: int = 1) -> None:
        self.self_id = self_id
        self.is_voter = is_voter
        self.vote = vote
        self.min_voters = max(1, min_voters)
        self.highest_term = vote.term if vote else 0
        self.implausible_votes = 0
        self.outside_votes = 0
        """Votes of members outside the voter set at the last update (ignored: they move no term)."""
        self.outside_terms = 0
        """Terms heard in probes from members outside the voter set (:meth:`observe_term`; ignored)."""
        self.implausible_terms = 0
        """Terms heard in probes more than :data:`MAX_TERM_STEP` above the highest held (ignored)."""
        self.reaffirmed = 0
        """Times this voter moved its vote for a superseded leader above the highest term (:meth:`reaffirm`)."""
        self.voters: frozenset[str] = frozenset()
        """The voter set of the last update (the lease's quorum is a majority of it, :mod:`p2pnode.node._lease`)."""
        self.view = ElectionView(None, None, self.highest_term, 0, quorum_size(self.min_voters), 0)

    def accepts(self, term: int) -> bool:
        """Fencing: act on a decision of ``term`` only if no higher term has been seen."""
        return term >= self.highest_term

    def leads(self, node_id: str) -> bool:
        """Whether ``node_id`` leads in this view and may act as the leader: elected in :attr:`view`'s term, and
        no higher term seen here (a leader of a term already superseded is fenced, :meth:`accepts`)."""
        v = self.view
        return v.leader == node_id and v.term is not None and v.term >= self.highest_term

    def superseded(self) -> bool:
        """Whether the leader this view sees by a quorum was elected below :attr:`highest_term` (it is fenced)."""
        v = self.view
        return v.leader is not None and v.term is not None and v.term < self.highest_term

    def reaffirm(self) -> bool:
        """This voter votes again for the leader it sees by a quorum but fenced by a higher term, one term above
        every term held (Raft's step down and elect again: the higher term's vote may never arrive, its voter cut
        off or dead, and until another election nothing would be acted on). Only a voter that sees that quorum
        and votes for that leader does it (an isolated voter sees no quorum, so no two sides raise each other's
        terms); the driver calls it once the fence has lasted longer than the votes take to arrive. The other
        voters follow it at once (:meth:`update`: a vote for their candidate at a higher term). Returns True when
        the vote changed (persist and publish it)."""
        v = self.view
        if not (self.is_voter and self.self_id in self.voters and self.superseded() and self.vote is not None
                and self.vote.candidate == v.leader and self.highest_term < TERM_CEILING):
            return False
        self.highest_term += 1
        self.vote = Vote(self.vote.candidate, self.highest_term)
        self.view = msgspec.structs.replace(self.view, highest_term=self.highest_term)
        self.reaffirmed += 1
        return True

    def observe_term(self, node_id: str, term: int) -> bool:
        """A voter's message said its highest term is ``term`` (an authenticated probe or ack,
        :mod:`p2pnode.gossip._probe`): raise :attr:`highest_term` to it at once, before the vote that carries it
        arrives, so a leader of an older term is fenced from then on (Raft: a node that sees a higher term in any
        message adopts it; Ongaro & Ousterhout 2014, section 5.1). As for votes, only voters of the last update
        move terms (others counted in :attr:`outside_terms`), and a term more than :data:`MAX_TERM_STEP` above the
        highest held is ignored (counted in :attr:`implausible_terms`): a message cannot show that a quorum holds
        it, a vote can (the prober then lets that ack renew no lease). A term heard so may have no vote behind it
        that ever arrives (its voter cut off or dead): :meth:`reaffirm` then moves the leader's voters above it.
        Returns True when :attr:`highest_term` rose."""
        if node_id not in self.voters or node_id == self.self_id:
            self.outside_terms += 1
            return False
        if term > min(self.highest_term + MAX_TERM_STEP, TERM_CEILING):
            self.implausible_terms += 1
            return False
        if term <= self.highest_term:
            return False
        self.highest_term = term
        self.view = msgspec.structs.replace(self.view, highest_term=term)
        return True

    def update(
        self,
        *,
        candidates: list[Candidate],
        votes: dict[str, Vote],
        voter_set: set[str],
        alive: set[str],
        eligible: set[str] | None = None,
        suspect: Collection[str] = (),
        doubting: Collection[str] = (),
    ) -> bool:
        """Recompute this node's vote and the leader view. Returns True when our own vote changed (publish it).

        ``candidates``: members seen alive or suspect (this node included); ``votes``: the newest vote of each
        other member (from snapshots); ``voter_set``: see module docstring; ``alive``: members whose votes count
        for the lease (alive in our view; this node included); ``eligible``: the candidates that may lead
        (:func:`is_eligible`; None: all); ``suspect``: the candidates seen suspect: the vote may stay with one (a
        suspicion is often refuted within a round) but never moves to one (a vote goes to a member this voter
        hears; :mod:`p2pnode.node._votetimeout`); ``doubting``: the voters whose newest snapshot accuses this node
        (lists it among its suspects, at any incarnation): their votes for this node do not count (check-quorum, Raft
        thesis section 6.2: a leader counts a voter only while that voter hears it; one that hears the voter but
        not the reverse would otherwise lead on while the voter's election timeout moves it elsewhere). Votes of
        members outside ``voter_set`` are ignored (they move no term and no fence); this node votes only while it
        is in ``voter_set``.
        """
        # Only voters move terms: a member outside the voter set (a stranger in open mode, a member the roll
        # refused) could otherwise publish a vote one term above the leader's and fence every plan of it.
        self.voters = frozenset(voter_set)
        counted = {n: v for n, v in votes.items() if n in voter_set}
        self.outside_votes = len(votes) - len(counted)
        votes = counted
        plausible = self.highest_term + MAX_TERM_STEP
        held = sorted((v.term for v in votes.values()), reverse=True)
        need = quorum_size(max(len(voter_set), self.min_voters))
        if len(held) >= need:
            plausible = max(plausible, held[need - 1])  # a term a quorum of voters holds is real
        plausible = min(plausible, TERM_CEILING)  # whoever holds it, our own next term stays on the wire
        ignored = [n for n, v in votes.items() if v.term > plausible]
        if ignored:
            # A term this far above every term we know was not reached by elections (one step each): a forged
            # or broken vote. Adopting it would push our persisted term toward the wire maximum.
            self.implausible_votes += len(ignored)
            votes = {n: v for n, v in votes.items() if v.term <= plausible}
        for v in votes.values():
            self.highest_term = max(self.highest_term, v.term)
        changed = False
        if self.is_voter and self.self_id in voter_set and candidates:
            mine = self.vote.candidate if self.vote else None
            pool = [c for c in candidates if c.node_id not in suspect or c.node_id == mine] or candidates
            preferred = [c for c in pool if c.node_id in eligible] if eligible is not None else []
            best = max(preferred or pool, key=rank_key).node_id
            if self.vote is None or self.vote.candidate != best:
                # Join the newest term if it is already for `best` (we never voted in it: our own term is
                # lower); otherwise open a new term above every term seen.
                own = self.vote.term if self.vote else 0
                joined = any(v.candidate == best and v.term == self.highest_term for v in votes.values())
                if not (joined and self.highest_term > own):
                    self.highest_term += 1
                self.vote = Vote(best, self.highest_term)
                changed = True
            else:
                higher = max((v.term for v in votes.values() if v.candidate == best), default=0)
                if higher > self.vote.term:
                    self.vote = Vote(best, higher)
                    changed = True
        self.highest_term = max(self.highest_term, self.vote.term if self.vote else 0)

        all_votes = dict(votes)
        if self.is_voter and self.self_id in voter_set and self.vote is not None:
            all_votes[self.self_id] = self.vote
        n_voters = max(len(voter_set), self.min_voters)
        quorum = quorum_size(n_voters)
        tally: Counter[tuple[str, int]] = Counter(
            (v.candidate, v.term) for voter, v in all_votes.items()
            if voter in voter_set and voter in alive and not (v.candidate == self.self_id and voter in doubting)
        )
        leader, term, count = None, None, 0
        for (cand, t), c in tally.items():
            if c >= quorum and (term is None or t > term):
                leader, term, count = cand, t, c
        self.view = ElectionView(leader, term, self.highest_term, count, quorum, n_voters)
        return changed

    @staticmethod
    def voter_set(members: Mapping[str, tuple[Collection[str], bool]]) -> set[str]:
        """The voter set from ``{node_id: (tags, left)}``: members tagged ``voter`` (left ones excluded), or, where
        none is tagged, every member that has not left."""
        tagged = {n for n, (tags, left) in members.items() if "voter" in tags and not left}
        if tagged or any("voter" in tags for tags, _ in members.values()):
            return tagged
        return {n for n, (_, left) in members.items() if not left}


class VoterRoll:
    """The voters this node counts, sticky: a voter stays on the roll when it dies or is reaped (a partition's
    minority must never reach quorum by forgetting the majority); only the operator removes one
    (:meth:`remove`, ``p2pnode node remove ID``). The driver persists :meth:`to_wire` and restores it.

    Admission of members tagged ``voter``:

    * ``trusted`` (token mode: every member holds an endorsed key): every tagged member is admitted.
    * open mode (anyone can claim the tag): tagged members seen within ``bootstrap_s`` of the roll's creation
      are admitted; after that window the roll is closed and a newly tagged member waits for the operator
      (:meth:`admit`, ``p2pnode node admit ID``). So members that merely *claim* the tag later can neither
      outvote the voters that were there first nor, as silent extra voters, raise the quorum beyond their
      reach. (Admitting even a minority automatically would: with 3 voters, one fake late voter makes the
      quorum 3 of 4, and one honest voter down then stops every election.)

    Removed ids stay barred from automatic admission until admitted again by the operator. ``now`` is the clock
    the driver keeps consistent across restarts (the agent uses wall-clock seconds, as the roll is persisted).

    A node starting for the first time in an existing cluster has no window of its own: it takes (:meth:`adopt`)
    the closed roll its operator-given peers publish (:meth:`p2pnode.node.NodeCore.seed_peers_answered`), and
    the adopted roll is ``closed`` from the start.
    """

    def __init__(self, *, trusted: bool, bootstrap_s: float = 120.0, created_at: float | None = None,
                 voters: set[str] | None = None, removed: set[str] | None = None, closed: bool = False,
                 marks: Iterable[EligibilityMark] = ()) -> None:
        self.trusted = trusted
        self.bootstrap_s = bootstrap_s
        self.created_at = created_at
        self.closed = closed
        self.members: set[str] = set(voters or ())
        self.removed = set(removed or ())
        self.refused: set[str] = set()  # tagged members not admitted (bounded by the member cap)
        self.marks: dict[str, EligibilityMark] = {}
        """The operator's eligibility marks by node id (:class:`p2pnode.snapshot.EligibilityMark`), cleared ones
        included, at most :data:`p2pnode.snapshot.MARKS_MAX`."""
        self.marks_ignored = 0
        """Marks seen stamped more than :data:`MARK_SKEW_S` ahead of this node's clock, ignored."""
        self.forgotten: list[EligibilityMark] = []
        """The marks the last :meth:`mark` forgot to stay within :data:`p2pnode.snapshot.MARKS_MAX`."""
        self.eligible: frozenset[str] = frozenset()
        """Members the operator marked eligible to lead, whatever their tags (:func:`is_eligible`)."""
        self.ineligible: frozenset[str] = frozenset()
        """Members the operator marked never to lead while an eligible member is alive."""
        for m in marks:
            self._take(m)
        self._trim()
        self._index()

    def is_open(self, now: float) -> bool:
        """Whether members tagged ``voter`` are admitted at ``now`` (token mode, or open mode within the bootstrap
        window of a roll not adopted from peers)."""
        if self.trusted:
            return True
        return not self.closed and (self.created_at is None or now - self.created_at <= self.bootstrap_s)

    def adopt(self, voters: set[str], removed: set[str], now: float, *,
              marks: Iterable[EligibilityMark] = ()) -> None:
        """Take ``voters``, ``removed`` and the operator's eligibility marks (merged: :meth:`merge`) from the
        peers' published roll (a node starting for the first time in an existing cluster): the roll is closed at
        once, so no member tagged ``voter`` is admitted by itself. ``now``: wall-clock seconds."""
        self.members = set(voters)
        self.removed = set(removed) - self.members
        self.merge(marks, now)
        self.refused -= self.members
        self.created_at = now
        self.closed = True

    def observe(self, tagged: set[str], now: float) -> bool:
        """Admit members seen tagged ``voter`` by the rules above. Returns True when the roll changed."""
        if self.created_at is None:
            self.created_at = now
        open_window = self.is_open(now)
        changed = False
        for n in sorted(tagged - self.members - self.removed):
            if open_window:
                self.members.add(n)
                self.refused.discard(n)
                changed = True
            else:
                self.refused.add(n)
        return changed

    def admit(self, node_id: str) -> bool:
        """The operator admits ``node_id`` as a voter. Returns True when the roll changed."""
        self.removed.discard(node_id)
        self.refused.discard(node_id)
        if node_id in self.members:
            return False
        self.members.add(node_id)
        return True

    def remove(self, node_id: str) -> bool:
        """The operator removes ``node_id`` from the voters (gone for good). Returns True when it was one."""
        was = node_id in self.members
        self.members.discard(node_id)
        self.removed.add(node_id)
        return was

    def mark(self, node_id: str, state: str, wall: float) -> bool:
        """The operator marks ``node_id`` ``state`` (``eligible``, ``ineligible``, or ``cleared``: the tags decide
        again; ``p2pnode node eligible|ineligible|unmark``), overriding its tags (:func:`is_eligible`), stamped
        at wall-clock ``wall`` (Unix seconds) and above every stamp held, so the new mark wins every mark this
        node knows of. Marking a node again with the state it holds stamps it anew (the operator's latest word
        wins, and it is kept as one of the newest). Returns True when a mark was recorded (False: nothing held to
        clear and the roll is full). When the roll already holds
        :data:`p2pnode.snapshot.MARKS_MAX` marks, the oldest is forgotten (named in :attr:`forgotten`), as
        :meth:`merge` does: marks of long-gone spot boxes age out instead of blocking new ones."""
        from .snapshot import MARKS_MAX, EligibilityMark

        self.forgotten = []
        held = self.marks.get(node_id)
        if held is None and state == "cleared" and len(self.marks) >= MARKS_MAX:
            return False  # nothing held to clear, and remembering the clearing would forget a mark
        self.drop_future(wall)
        high = max((m.stamp for m in self.marks.values()), default=0)
        self.marks[node_id] = EligibilityMark(node_id, state, max(int(wall * 1000), high + 1))  # type: ignore[arg-type]
        self.forgotten = self._trim()
        self._index()
        return True

    def merge(self, marks: Iterable[EligibilityMark], wall: float) -> bool:
        """Merge marks a voter publishes (or a roll being adopted holds): per node, the mark with the higher
        ``(stamp, state)`` wins (a last-writer-wins register, as Cassandra's cells and the LWW-element-set of
        Shapiro et al., 2011); then only the :data:`p2pnode.snapshot.MARKS_MAX` newest are kept. Merging is
        commutative, associative and idempotent, so every member that hears the same marks holds the same ones,
        whatever the order. A mark stamped more than :data:`MARK_SKEW_S` past ``wall`` (Unix seconds) is ignored
        and counted. Returns True when the marks changed."""
        before = dict(self.marks)
        self.drop_future(wall)
        limit = int((wall + MARK_SKEW_S) * 1000)
        for m in marks:
            if m.stamp > limit:
                self.marks_ignored += 1
                continue
            self._take(m)
        self._trim()
        if self.marks == before:
            return False
        self._index()
        return True

    def drop_future(self, wall: float) -> None:
        """Forget held marks stamped more than :data:`MARK_SKEW_S` past ``wall`` (Unix seconds), this node's own
        included: once a clock that ran ahead is set right, the marks it stamped ahead stop outranking every
        later one, here as on the members that ignored them (:meth:`merge`)."""
        limit = int((wall + MARK_SKEW_S) * 1000)
        future = [n for n, m in self.marks.items() if m.stamp > limit]
        for n in future:
            del self.marks[n]
            self.marks_ignored += 1
        if future:
            self._index()

    def _take(self, m: EligibilityMark) -> None:
        held = self.marks.get(m.node)
        if held is None or _mark_order(m) > _mark_order(held):
            self.marks[m.node] = m

    def _trim(self) -> list[EligibilityMark]:
        from .snapshot import MARKS_MAX

        out = []
        while len(self.marks) > MARKS_MAX:
            out.append(self.marks.pop(min(self.marks.values(), key=_mark_order).node))
        return out

    def _index(self) -> None:
        self.eligible = frozenset(n for n, m in self.marks.items() if m.state == "eligible")
        self.ineligible = frozenset(n for n, m in self.marks.items() if m.state == "ineligible")

    def wire_marks(self) -> list[EligibilityMark]:
        """The marks as published and stored, sorted by node."""
        return [self.marks[n] for n in sorted(self.marks)]

    def to_wire(self) -> dict:
        """The roll as stored (``voters.json``): ``created_at`` (wall-clock s or None), sorted ``voters`` and
        ``removed``, ``closed`` (adopted from peers), ``marks`` sorted by node. The published form is
        :class:`p2pnode.snapshot.RollSection`."""
        return {"created_at": self.created_at, "voters": sorted(self.members), "removed": sorted(self.removed),
                "closed": self.closed, "marks": msgspec.to_builtins(self.wire_marks())}

    @classmethod
    def from_wire(cls, d: object, *, trusted: bool, bootstrap_s: float = 120.0) -> VoterRoll:
        """A roll from its stored or published form (:class:`p2pnode.snapshot.RollSection`'s bounds: node ids,
        at most :data:`p2pnode.snapshot.ROLL_MAX` of each list, :data:`p2pnode.snapshot.MARKS_MAX` marks). Raises
        ``ValueError`` naming what is wrong."""
        from .snapshot import RollSection

        try:
            r = msgspec.convert(d, RollSection)
        except msgspec.ValidationError as exc:
            raise ValueError(f"voter roll: {exc}") from None
        return cls(trusted=trusted, bootstrap_s=bootstrap_s, created_at=r.created_at, voters=set(r.voters),
                   removed=set(r.removed), closed=r.closed, marks=r.marks)


def _mark_order(m: EligibilityMark) -> tuple[int, str, str]:
    """The order of marks: stamp, then state, then node (a total order, so every merge keeps the same ones)."""
    return (m.stamp, m.state, m.node)


class MemberInfo(msgspec.Struct, frozen=True):
    """What the election reads from a member's newest snapshot: its rank, its vote, its tags and whether it is
    gone soon (``leaving_soon``: a notice in its snapshot, module docstring)."""

    candidate: Candidate
    vote: Vote | None
    tags: tuple[str, ...]
    leaving_soon: bool = False


def election_inputs(
    membership: Membership,
    *,
    self_info: MemberInfo,
    self_left: bool,
    info: Callable[[str], MemberInfo | None],
    rank: bool = True,
    known_voters: set[str] | None = None,
    roll: set[str] | None = None,
    marks: tuple[Collection[str], Collection[str]] = ((), ()),
) -> dict:
    """The keyword arguments of :meth:`Election.update` from a membership view: candidates are this node and the
    members alive or suspect (``suspect`` names the latter); votes come from every member's newest snapshot; the
    voter set follows :meth:`Election.voter_set`; ``alive`` (whose votes count for the lease) is this node and the
    alive members; ``doubting`` the members whose newest snapshot accuses this node (their votes for it do not
    count in its own view: :meth:`Election.update`). ``info(node_id)`` reads a member's snapshot (``None`` if it
    holds none). The agent and the simulator both call this, so they elect by the same rules.

    ``roll``, when given and not empty, is the voter set (:class:`VoterRoll`; members that left excluded).
    ``rank=False`` skips gathering candidates (a node whose vote is not counted needs none);
    ``known_voters``, when the voter set is already known (it is the set of ``voter``-tagged members), limits
    the snapshots read to theirs. Both only save work: the result for the voter set is the same.
    ``marks`` is the roll's ``(eligible, ineligible)`` (:class:`VoterRoll`): with the candidates' tags it gives
    ``eligible``, the candidates that may lead (:func:`is_eligible`).
    """
    from .gossip import MemberState

    me = membership.self_id
    candidates = [self_info.candidate] if rank else []
    going = {me} if self_info.leaving_soon else set()
    eligible_ids, ineligible_ids = marks
    eligible = {me} if is_eligible(me, self_info.tags, eligible=eligible_ids, ineligible=ineligible_ids) else set()
    votes: dict[str, Vote] = {}
    tags: dict[str, tuple[tuple[str, ...] | list[str], bool]] = {me: (self_info.tags, self_left)}
    alive = {me}
    doubting: set[str] = set()
    members = membership.members
    if not rank and known_voters is not None:  # only the voters' snapshots matter: read theirs, not every member's
        pairs = [(v, m) for v in known_voters if (m := members.get(v)) is not None]
    else:
        pairs = members.items()
    for node_id, m in pairs:
        mi = info(node_id)
        tags[node_id] = (mi.tags if mi else (), m.state is MemberState.LEFT)
        if mi is None:
            continue
        if mi.vote is not None:
            votes[node_id] = mi.vote
        if m.state is MemberState.ALIVE:
            alive.add(node_id)
        if me in m.suspects:
            doubting.add(node_id)
        if rank and m.state in (MemberState.ALIVE, MemberState.SUSPECT):
            candidates.append(mi.candidate)
            if mi.leaving_soon:
                going.add(node_id)
            if is_eligible(node_id, mi.tags, eligible=eligible_ids, ineligible=ineligible_ids):
                eligible.add(node_id)
    suspect = {c.node_id for c in candidates if membership.state_of(c.node_id) is MemberState.SUSPECT}
    voter_set = Election.voter_set(tags)
    if roll:
        # The sticky roll (see VoterRoll): its members not announced as left, known to us or not.
        voter_set = {n for n in roll if not tags.get(n, ((), False))[1]}
    staying = [c for c in candidates if c.node_id not in going]
    if going and staying and (not eligible or any(c.node_id in eligible for c in staying)):
        # Gone soon: no candidate while another may lead as well (eligible first: a member gone soon that may lead
        # still outranks an ephemeral or uncertified one that may not; nobody eligible: any other member).
        candidates = staying
        eligible -= going
    return {"candidates": candidates, "votes": votes, "voter_set": voter_set, "alive": alive, "eligible": eligible,
            "suspect": suspect, "doubting": doubting}
