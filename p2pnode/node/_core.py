"""The node core: membership, election, refutation, publication and plan-fencing policy of one node. Sans-IO.

One :class:`NodeCore` per node, driven by the trio agent (:mod:`p2pnode.agent`) and by the simulator
(:mod:`p2pnode.sim`) alike. It holds no socket, no task and no clock: every method takes ``now`` (monotonic
seconds) and, where a wall-clock time is recorded, ``wall`` (Unix seconds).

Inputs:

* :meth:`NodeCore.observe`: a member's newly accepted snapshot version (its ``membership`` section, ``leaving``);
* :meth:`NodeCore.set_rank`: this node's own GPU rank, from its newest resource sample;
* :meth:`NodeCore.reconcile`: time passed (membership timeouts, then vote and leader view);
* :meth:`NodeCore.want_publish`: a subsystem's section changed;
* :meth:`NodeCore.seed_peers_answered`: which members the operator-given peers (join addresses, peers file)
  turned out to be, once they answered (a node starting for the first time adopts their voter roll);
* operator changes of the voter roll (:meth:`NodeCore.change_voter`) and eligibility marks
  (:meth:`NodeCore.change_eligibility`).

Outputs:

* :meth:`NodeCore.publish_due`: whether the driver must publish a new snapshot version now (heartbeat due,
  or news -- vote, suspicions, refutation, a changed section -- and the minimum gap passed);
* :meth:`NodeCore.push_due`: whether the driver must push membership news now, outside the gossip rounds (one
  exchange with each of ``fanout`` random peers; :class:`p2pnode.gossip.NewsPush`), then :meth:`NodeCore.pushed`;
* :meth:`NodeCore.membership_section`, :meth:`NodeCore.vote_section` and :meth:`NodeCore.roll_section`: the
  sections the core owns;
* :meth:`NodeCore.next_deadline`: the earliest monotonic time at which :meth:`reconcile` has work;
* :meth:`NodeCore.acting_plan`: the plan this node may act on (the current leader's, of the current term:
  terms are fencing tokens), and :meth:`NodeCore.newest_plan` for carry-over by a new leader.

Member data comes through ``info(node_id)`` (rank, vote, tags from a member's newest snapshot),
``roll_of(node_id)`` (the ``roll`` section it publishes) and
``roll_candidates()`` (``(node_id, tags, leaving)`` of every member held), so the agent backs them with its
:class:`p2pnode.gossip.ClusterState` and the simulator with its tables. Persistence (snapshot version,
incarnation, vote, voter roll) goes through a :class:`CoreStore` (:mod:`p2pnode.node._store`). The voter roll's
adoption and changes are :class:`p2pnode.node._roll.VoterRollPolicy`, a part of :class:`NodeCore`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from ..election import Candidate, Election, ElectionView, MemberInfo, Vote, VoterRoll, election_inputs
from ..gossip import (
    PUSH_INTERVAL_DIVISOR,
    MemberIndex,
    Membership,
    MembershipConfig,
    MemberState,
    NewsPush,
    ProbeConfig,
    Prober,
    StateChanged,
    publish_interval_s,
)
from ..snapshot import MembershipSection, PlanRef, PlanSection, RollSection, VoteWire
from ._acting import acting_plan
from ._roll import _HOLDING, RollAdoption, RollCandidates, VoterRollPolicy
from ._store import CoreStore, MemoryStore
from ._votetimeout import VoteTimeout

P = TypeVar("P", PlanRef, PlanSection)

__all__ = ["CoreStore", "MemoryStore", "NodeCore", "MIN_PUBLISH_GAP_S", "LEADERS_REMEMBERED", "RollAdoption"]

log = logging.getLogger(__name__)

MIN_PUBLISH_GAP_S = 0.1
"""Event-driven publications (vote, suspicion, refutation, a changed section) are at most this frequent."""
LEADERS_REMEMBERED = 64
"""Terms whose leader this node remembers (the newest: what plan carry-over needs)."""


class NodeCore(VoterRollPolicy):
    """Membership, election and publication policy of node ``node_id`` (see module docstring).

    ``incarnation`` is this run's incarnation (persisted by the caller, one above the last run's); ``vote`` and ``roll``
    the persisted vote and voter roll; ``trusted`` whether members are endorsed by a cluster token (token mode: untagged
    members vote by the classic rule). ``voter_cap`` bounds the voter roll (and the removals it remembers).
    ``known_voters``: a voter set fixed in advance (the simulator's ``voter``-tagged nodes): no roll is kept, and a node
    that does not vote skips ranking candidates (the result is the same, the work is not N x N per round).
    ``leader_settle_s``: a candidate that joined or returned (a new run, a refutation, back from dead) less than this
    many seconds ago is not voted for while a settled candidate or the current leader is there, so a flaky strong node
    (a spot H200 that comes and goes) does not move leadership each time it returns; when no candidate is settled (a
    cluster that just started) every one counts, so the settle time never delays an election (Consul autopilot's "server
    stabilization time" in the same spirit).

    ``vote_timeout`` (on by default): the election timeout of :mod:`p2pnode.node._votetimeout`: a voter that sees a
    quorum of voters alive gives up the candidate it votes for once that one is suspect and unheard for
    ``suspect_after_s + publish_interval_s``, instead of holding its vote until the candidate is dead (Raft's
    election timeout, with check-quorum as its pre-vote); a candidate given up and heard again settles anew.
    False: the vote is held until death (as before; for comparisons).

    ``probes`` (``gossip.probes`` on): SWIM probes (:class:`p2pnode.gossip.Prober`, :attr:`prober`) drive
    suspicion, and the membership adopts accusations heard in snapshots (``adopt_suspicions``); ``probe_rng``
    shuffles the probe order. None: liveness from heartbeats only. ``member_index``: the id -> slot index of the
    membership's table (:class:`p2pnode.gossip.MemberIndex`; the simulator shares one).

    A node that starts with a persisted vote for another member, or with ``expect_peers`` (it was given
    addresses to join), holds its vote (and sees no leader) until it has heard from another live member, or for
    at most ``join_hold_s`` (default: three gossip intervals). Without the hold a restarted agent, alone in its
    view for the first round, voted for itself in a new term and then for the leader in the next one (the
    cluster's term rose twice on every restart, and each new term's first plan waits to settle), and nodes
    started together each elected themselves in term 1 before they met. Raft's election timeout at start-up and
    Consul's ``bootstrap_expect`` play the same role.

    In open mode (not ``trusted``), the voter roll of a node starting for the first time (``roll`` None: no usable
    ``voters.json``) with ``seed_peers`` (the operator gave it peers: join addresses, a peers file) is **adopted**,
    never built from whoever is tagged ``voter`` when it starts (:class:`RollAdoption`): until those peers answered
    (:meth:`seed_peers_answered`) the node holds as above and admits nobody; then, if they publish closed rolls
    (:class:`p2pnode.snapshot.RollSection`) naming the same voters, it takes that roll, closed; if their rolls differ it
    takes none, says so and keeps holding; only if none of them publishes a closed roll (a new cluster) does its own
    bootstrap window open. It decides once every given peer answered, or ``join_hold_s`` after the first one did.
    Without ``seed_peers`` the node watches the members it finds first (:attr:`RollAdoption.WATCHING`): with ``pinned``
    (operator keys pinned: the ``voter`` tags it reads are certified) it adopts the roll its certified voters vouch for;
    without, it adopts nothing it found and follows as a non-voter (:attr:`RollAdoption.FOLLOWING`); when nobody shows a
    term its window opens (the first node of a cluster). In token mode every endorsed member tagged ``voter`` is
    admitted anyway (:class:`p2pnode.election.VoterRoll`).
    """

    def __init__(
        self,
        node_id: str,
        *,
        config: MembershipConfig,
        store: CoreStore,
        info: Callable[[str], MemberInfo | None],
        roll_candidates: RollCandidates,
        incarnation: int = 1,
        vote: Vote | None = None,
        roll: VoterRoll | None = None,
        tags: Sequence[str] = (),
        trusted: bool = False,
        min_voters: int = 1,
        is_voter: bool = True,
        voter_cap: int = 1024,
        known_voters: set[str] | None = None,
        leader_settle_s: float = 0.0,
        join_hold_s: float | None = None,
        expect_peers: bool = False,
        seed_peers: bool = False,
        roll_of: Callable[[str], RollSection | None] | None = None,
        voter_bootstrap_s: float = 120.0,
        pinned: bool = False,
        probes: ProbeConfig | None = None,
        probe_rng: random.Random | None = None,
        first_probe_seq: int = 0,
        vote_timeout: bool = True, member_index: MemberIndex | None = None,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.store = store
        self.info = info
        self.roll_candidates = roll_candidates
        self.tags = tuple(tags)
        self.trusted = trusted
        self.voter_cap = voter_cap
        self.known_voters = known_voters
        self.leader_settle_s = leader_settle_s
        self.join_hold_s = 3 * config.gossip_interval_s if join_hold_s is None else join_hold_s
        self.term_hold_s = 3 * config.gossip_interval_s
        """How long the leader seen by a quorum may stay fenced by a higher term with no vote behind it before this
        voter votes for it above that term (three gossip intervals: the votes of a real election arrive by then)."""
        self._superseded_since: float | None = None
        self.vote_timeout = VoteTimeout(enabled=vote_timeout)
        """The election timeout: this voter gives up a candidate it no longer hears (:mod:`._votetimeout`)."""
        self._joined = not expect_peers and (vote is None or vote.candidate == node_id)  # nothing to hold
        self._up_since: float | None = None  # this node's own run, from its first reconcile
        self.membership = Membership(node_id, config, incarnation=incarnation,
                                     adopt_suspicions=probes is not None, index=member_index)
        self.prober = (Prober(self.membership, probes, rng=probe_rng or random.Random(node_id),
                              first_seq=first_probe_seq) if probes is not None else None)
        """SWIM probes over :attr:`membership` (``probes`` given: ``gossip.probes``), or None (heartbeats only).
        ``first_probe_seq``: the driver's wall clock in microseconds, so a restarted node reuses no seq within
        the receivers' replay window."""
        self.election = Election(node_id, is_voter=is_voter, vote=vote, min_voters=min_voters)
        if self.prober is not None:
            self.prober.term = self.election.highest_term
            self.prober.on_term = self._term_heard
        self._init_roll(roll, roll_of=roll_of, trusted=trusted, voter_bootstrap_s=voter_bootstrap_s,
                        seed_peers=seed_peers, pinned=pinned)
        self.candidate = Candidate(node_id, 0.0, 0)
        self.leaving = False
        self.leaving_soon = False
        """This node is gone soon (its snapshot carries a notice: its probe's, or a clean stop's; the agent sets it
        at each reconcile by the predicate its peers read, :func:`p2pnode.node._info.member_info`): no candidate
        while another member is."""
        self.leaders_by_term: dict[int, str] = {}
        self.leader_changes = 0
        self.last_publish_at = -1e9
        self._wanted = False
        self._published_suspects: dict[str, int] = {}
        self.news_push = NewsPush(config.gossip_interval_s / PUSH_INTERVAL_DIVISOR)
        """Membership news (accusations, refutations) pushed at once (:class:`p2pnode.gossip.NewsPush`)."""

    # -- inputs ----------------------------------------------------------------------------------
    def observe(self, origin: str, version: int, section: MembershipSection, leaving: bool,
                now: float) -> list[StateChanged]:
        """A newly accepted snapshot ``version`` of ``origin``. Returns the membership state changes."""
        return self.membership.observe(origin, version=version, incarnation=section.incarnation, leaving=leaving,
                                       suspects=section.suspects, now=now)

    def set_rank(self, power_score: float, vram_bytes: int) -> None:
        """This node's rank from its own GPUs (:func:`p2pnode.resources.rank_of_gpus`)."""
        self.candidate = Candidate(self.node_id, power_score, vram_bytes)

    @property
    def holding(self) -> bool:
        """Whether the election is still held at start-up (see the class docstring): no leader is seen yet, and
        the node must not act as if it were alone either."""
        return not self._joined or self.adoption in _HOLDING or (self.adoption == RollAdoption.FOLLOWING
                                                                    and self._followed is None)

    def seed_peers_answered(self, node_ids: Iterable[str], *, all_answered: bool = False) -> None:
        """The operator-given peers (join addresses, peers file) that answered so far, as the member ids they
        proved (the driver ties an address to an id only once it holds that id's signed snapshot);
        ``all_answered``: every given address did. Read while the roll is being adopted (see the class
        docstring); ignored afterwards. At most ``voter_cap`` ids are kept. An address that answered without
        proving another member's id (this node's own address in the list) counts as answered, with no id."""
        if self.adoption not in (RollAdoption.WAITING, RollAdoption.CONFLICT) or not self._seeding:
            return
        for n in node_ids:
            if n != self.node_id and len(self._seeds) < self.voter_cap:
                self._seeds.add(n)
        self._seeds_all = all_answered

    def want_publish(self) -> None:
        """A section changed: publish a new version once the minimum gap has passed."""
        self._wanted = True

    def reconcile(self, now: float, wall: float) -> list[StateChanged]:
        """Apply membership timeouts, refute an accusation, admit voters and recompute the vote and the leader
        view. Returns the membership changes (``new is None``: the member was reaped; the driver forgets its
        snapshot). Then ask :meth:`publish_due`."""
        changes = self.membership.tick(now)
        if self.membership.take_refute():
            inc = self.store.incarnation_past(self.membership.incarnation - 1)
            self.membership.incarnation = max(self.membership.incarnation, inc)
            log.warning("refuting suspicion: incarnation now %d", self.membership.incarnation)
            self._wanted = True
        if self._up_since is None:
            self._up_since = now
        if not self._joined:
            self._joined = len(self.membership.live_ids()) > 1 or now - self._up_since >= self.join_hold_s
        if self.adoption in (RollAdoption.WAITING, RollAdoption.CONFLICT) and self._seeding:
            self._adopt_roll(now, wall)
        elif self.adoption in (*_HOLDING, RollAdoption.FOLLOWING) or (
                self._unseeded and self.adoption == RollAdoption.BOOTSTRAP and self.roll.is_open(wall)):
            self._watch_roll(now, wall)
        if self._joined and (not self.holding or self.adoption == RollAdoption.FOLLOWING):
            self._elect(now, wall)  # else the persisted vote holds (see the class docstring)
        if self.adoption not in (*_HOLDING, RollAdoption.FOLLOWING):
            self._merge_marks(wall)  # after the roll's admissions: from the voters it counts now
        if self.membership.suspects() != self._published_suspects:
            self._wanted = True
        return changes

    def _elect(self, now: float, wall: float) -> None:
        """Recompute this node's vote (persisted before it is published) and the leader view."""
        me = MemberInfo(self.candidate, self.election.vote, self.tags, self.leaving_soon)
        if self.adoption == RollAdoption.FOLLOWING:  # a non-voter following the one vouched roll (or none)
            followed = set(self._followed or ()) - {self.node_id}
            inputs = election_inputs(self.membership, self_info=me, self_left=self.leaving, info=self.info,
                                     rank=False, roll=followed or None)
            if not followed:
                inputs["voter_set"] = set()
        elif self.known_voters is None:
            inputs = election_inputs(self.membership, self_info=me, self_left=self.leaving, info=self.info,
                                     roll=self._update_roll(wall), marks=(self.roll.eligible, self.roll.ineligible))
        else:
            inputs = election_inputs(self.membership, self_info=me, self_left=self.leaving, info=self.info,
                                     rank=self.election.is_voter, known_voters=self.known_voters,
                                     marks=(self.roll.eligible, self.roll.ineligible))
        if self.election.is_voter:
            gone = self.vote_timeout.update(self.membership, vote=self.election.vote, votes=inputs["votes"],
                                            voter_set=inputs["voter_set"], alive=inputs["alive"],
                                            min_voters=self.election.min_voters, now=now)
            if gone:
                inputs["candidates"] = [c for c in inputs["candidates"] if c.node_id not in gone]
                if self.vote_timeout.gave_up is not None:
                    log.info("election timeout: giving up %s, suspect and unheard for %.1f s",
                             self.vote_timeout.gave_up, VoteTimeout.timeout_s(self.membership))
        if self.leader_settle_s > 0:
            inputs["candidates"] = self._settled(inputs["candidates"], now)
        before = self.election.view.leader, self.election.view.term
        if self.election.update(**inputs):
            if self.election.vote is not None:
                self.store.save_vote(self.election.vote)
            self._wanted = True
        self._reaffirm(now)
        if self.prober is not None:
            self.prober.term = self.election.highest_term
        view = self.election.view
        if view.leader is not None and view.term is not None and self.leaders_by_term.get(view.term) != view.leader:
            self.leaders_by_term[view.term] = view.leader
            while len(self.leaders_by_term) > LEADERS_REMEMBERED:
                del self.leaders_by_term[min(self.leaders_by_term)]
        if (view.leader, view.term) != before:
            self.leader_changes += 1
            log.info("leader: %s (term %s, %d/%d votes)", view.leader, view.term, view.votes_for_leader, view.voters)

    def _settled(self, candidates: list[Candidate], now: float) -> list[Candidate]:
        """``candidates`` that came up at least ``leader_settle_s`` ago, and the current leader; all of them when
        none is settled (a cluster that just started), so the settle time never delays an election."""
        leader = self.election.view.leader
        cutoff = now - self.leader_settle_s
        kept = []
        for c in candidates:
            if c.node_id == self.node_id:
                up = self._up_since if self._up_since is not None else now
            else:
                m = self.membership.members.get(c.node_id)
                up = max(m.up_since, self.vote_timeout.back_at.get(c.node_id, m.up_since)) if m is not None else now
            if c.node_id == leader or up <= cutoff:
                kept.append(c)
        return kept or candidates

    # -- publication -----------------------------------------------------------------------------
    def publish_interval_s(self) -> float:
        """The adaptive heartbeat interval for the current cluster size (seconds)."""
        return publish_interval_s(self.membership.size, self.config)

    def heartbeat_due(self, now: float, slack_s: float = 0.0) -> bool:
        """The adaptive heartbeat interval passed since the last publication (less ``slack_s`` seconds: a driver
        that checks on a periodic timer of its own passes half its period, so the heartbeat is not skipped to
        the next tick by jitter)."""
        return now - self.last_publish_at >= self.publish_interval_s() - slack_s

    def publish_due(self, now: float, slack_s: float = 0.0) -> bool:
        """Whether the driver must publish now: news waiting and the minimum gap passed, or the heartbeat due
        (see :meth:`heartbeat_due` for ``slack_s``). Never while leaving (the final snapshot is published by the
        leave path)."""
        if self.leaving:
            return False
        return (self._wanted and now - self.last_publish_at >= MIN_PUBLISH_GAP_S) or self.heartbeat_due(now, slack_s)

    def published(self, now: float, suspects: dict[str, int]) -> None:
        """The driver published a snapshot carrying ``suspects`` at ``now``."""
        self.last_publish_at = now
        self._wanted = False
        self._published_suspects = suspects

    def push_due(self, now: float) -> bool:
        """Whether the driver must push membership news now (:class:`p2pnode.gossip.NewsPush`): news owed a push,
        the push interval passed, and no publication of our own waiting (our news travels in our next snapshot)."""
        self.news_push.note(self.membership.news)
        return self.news_push.due(now, publishing=self._publishing())

    def pushed(self, now: float) -> None:
        """The driver started a push (an exchange with each of ``fanout`` random peers) at ``now``."""
        self.news_push.pushed(now)

    def _publishing(self) -> bool:
        return self._wanted or self.membership.refute_needed

    def next_version(self, seen_self_version: int | None) -> int:
        """The version of the next publication. ``seen_self_version``: the highest version of our own origin a
        peer holds, signed with our key (a former run of this node published higher): jump past it, unless it
        is so close to the wire bound that following it would end publication."""
        if seen_self_version is not None:
            from ..snapshot import COUNTER_MAX

            if seen_self_version < COUNTER_MAX // 2:
                log.warning("peers hold our version %d: jumping past it", seen_self_version)
                self.store.advance_version_past(seen_self_version)
            else:
                log.error("peers hold our version %d, too close to the wire bound to jump past; ignored",
                          seen_self_version)
        return self.store.next_version()

    def membership_section(self) -> MembershipSection:
        """This node's ``membership`` section: its incarnation and whom it suspects."""
        return MembershipSection(incarnation=self.membership.incarnation, suspects=self.membership.suspects())

    def vote_section(self) -> VoteWire | None:
        """This node's ``vote`` section (None before it voted)."""
        v = self.election.vote
        return VoteWire(candidate=v.candidate, term=v.term) if v else None

    def next_deadline(self, now: float, *, heartbeat: bool = True) -> float:
        """The earliest monotonic time at which :meth:`reconcile` or a publication has work: a membership
        timeout, the heartbeat (unless ``heartbeat`` is false: a driver that checks :meth:`publish_due` on
        another timer, such as its sampler), the end of the minimum gap when news waits, or the end of the
        start-up hold of the election. Accepted snapshots are inputs that need a reconcile at once; the driver
        wakes for them itself."""
        at = self.last_publish_at + self.publish_interval_s() if heartbeat else now + 3600.0
        if self.adoption == RollAdoption.WAITING and self._seed_first_at is not None:
            at = min(at, self._seed_first_at + self.join_hold_s)
        if self.adoption == RollAdoption.WATCHING:
            first = self._watch_first_at if self._watch_first_at is not None else self._up_since
            at = min(at, (first if first is not None else now) + self.join_hold_s)
        if not self._joined:
            at = min(at, (self._up_since if self._up_since is not None else now) + self.join_hold_s)
        if self._wanted:
            at = min(at, self.last_publish_at + MIN_PUBLISH_GAP_S)
        self.news_push.note(self.membership.news)
        if (push_at := self.news_push.next_deadline()) is not None and not self._publishing():
            at = min(at, push_at)
        d = self.membership.next_deadline()
        if d is not None:
            at = min(at, d)
        if self.election.is_voter and self.election.vote is not None:
            d = self.vote_timeout.next_deadline(self.membership, self.election.vote.candidate)
            if d is not None:
                at = min(at, d)
        return max(at, now)

    # -- plans (fencing) -------------------------------------------------------------------------
    @property
    def view(self) -> ElectionView:
        """The leader view: leader, term, votes, quorum (:class:`p2pnode.election.ElectionView`)."""
        return self.election.view

    def is_leader(self) -> bool:
        """Whether this node leads a term in its own view, and no higher term has been seen here
        (:meth:`p2pnode.election.Election.leads`)."""
        return self.election.leads(self.node_id)

    def _reaffirm(self, now: float) -> None:
        """While the leader seen by a quorum is fenced by a higher term whose votes have not arrived (a term heard
        in a probe of a voter since cut off or dead, or a minority's vote), for longer than
        :attr:`term_hold_s`: vote again for it above that term (:meth:`p2pnode.election.Election.reaffirm`)."""
        if not self.election.superseded():
            self._superseded_since = None
            return
        if self._superseded_since is None:
            self._superseded_since = now
        elif now - self._superseded_since >= self.term_hold_s and self.election.reaffirm():
            assert self.election.vote is not None
            self.store.save_vote(self.election.vote)
            self._wanted = True
            self._superseded_since = None
            log.info("leader %s fenced by a term whose votes did not come for %.1f s: voting for it in term %d",
                     self.election.vote.candidate, self.term_hold_s, self.election.vote.term)

    def _term_heard(self, sender: str, term: int) -> None:
        """A probe or ack from ``sender`` carried ``term``, above the highest this node had seen (the prober's
        :attr:`~p2pnode.gossip.Prober.on_term`): the election adopts it if a voter said it, fencing a leadership
        of an older term before the vote behind it arrives (a voter back from a stall, whose members' snapshots
        still show the votes of its own term)."""
        before = self.election.view.term
        if self.election.observe_term(sender, term):
            assert self.prober is not None
            self.prober.term = self.election.highest_term
            if before is not None and before < term:
                log.info("term %d heard from %s: the leader of term %d is fenced until the votes arrive",
                         term, sender, before)

    def acting_plan(self, leader_plan: P | None) -> P | None:
        """The plan this node may act on: ``leader_plan`` (the current leader's plan ref or document) if it is of the
        leader's current term and no higher term has been seen (the term is the fencing token), else None:
        keep what runs, start nothing."""
        v = self.election.view
        if v.leader is None:
            return None
        return acting_plan(leader_plan, leader_term=v.term, highest_term=self.election.highest_term)

    def newest_plan(self, plans: Iterable[tuple[str, PlanRef | None]]) -> PlanRef | None:
        """The plan of the highest ``(term, seq)`` among ``(origin, plan)`` pairs whose origin this node saw
        elected in that term (:attr:`leaders_by_term`). A plan of any other member, whatever term it claims,
        is ignored: only an elected leader's plan is carried over or shown."""
        best: PlanRef | None = None
        for origin, p in plans:
            if p is None or self.leaders_by_term.get(p.term) != origin:
                continue
            if best is None or (p.term, p.seq) > (best.term, best.seq):
                best = p
        return best

    def state_of(self, node_id: str) -> MemberState | None:
        """``node_id``'s membership state (this node: alive; None: unknown)."""
        return self.membership.state_of(node_id)
