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
* :meth:`NodeCore.membership_section`, :meth:`NodeCore.vote_section` and :meth:`NodeCore.roll_section`: the
  sections the core owns;
* :meth:`NodeCore.next_deadline`: the earliest monotonic time at which :meth:`reconcile` has work;
* :meth:`NodeCore.acting_plan`: the plan this node may act on (the current leader's, of the current term:
  terms are fencing tokens), and :meth:`NodeCore.newest_plan` for carry-over by a new leader.

Member data comes through ``info(node_id)`` (rank, vote, tags from a member's newest snapshot),
``roll_of(node_id)`` (the ``roll`` section it publishes) and
``roll_candidates()`` (``(node_id, tags, leaving)`` of every member held), so the agent backs them with its
:class:`p2pnode.gossip.ClusterState` and the simulator with its tables. Persistence (snapshot version,
incarnation, vote, voter roll) goes through a :class:`CoreStore`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from ..election import Candidate, Election, ElectionView, MemberInfo, Vote, VoterRoll, election_inputs
from ..gossip import Membership, MembershipConfig, MemberState, StateChanged, publish_interval_s
from ..snapshot import ROLL_MAX, MembershipSection, PlanRef, PlanSection, RollSection, VoteWire
from ._plans import acting_plan
from ._store import CoreStore, MemoryStore

P = TypeVar("P", PlanRef, PlanSection)

__all__ = ["CoreStore", "MemoryStore", "NodeCore", "MIN_PUBLISH_GAP_S", "LEADERS_REMEMBERED", "RollAdoption"]

log = logging.getLogger(__name__)

MIN_PUBLISH_GAP_S = 0.1
"""Event-driven publications (vote, suspicion, refutation, a changed section) are at most this frequent."""
LEADERS_REMEMBERED = 64
"""Terms whose leader this node remembers (the newest: what plan carry-over needs)."""


RollCandidates = Callable[[], Iterable[tuple[str, Sequence[str], bool]]]


class RollAdoption:
    """Where a node's voter roll came from (``/status`` ``election.roll.adoption``)."""

    KEPT = "kept"
    """Persisted from an earlier run, or this node has no operator-given peers (the first node of a cluster):
    the roll's own bootstrap window applies."""
    WAITING = "waiting"
    """First start with operator-given peers: no leader is seen and nobody is admitted until they answer."""
    CONFLICT = "conflict"
    """Those peers publish closed rolls that differ: none is adopted until they agree (the operator makes them
    agree with ``p2pnode node admit|remove``, applied to every live member)."""
    ADOPTED = "adopted"
    """The closed roll those peers publish was adopted (closed here too)."""
    BOOTSTRAP = "bootstrap"
    """None of those peers publishes a closed roll (a new cluster): this node's own bootstrap window opened."""
    WATCHING = "watching"
    """First start in open mode with no operator-given peer (mDNS finds only): the node counts no roll and casts
    no vote until it has watched the members it found for ``join_hold_s``. Then, where operator keys are pinned, it
    adopts the closed roll a quorum of that roll's own certified voters publishes; with no key pinned it adopts
    nothing (:attr:`FOLLOWING`). When no member tagged ``voter`` shows a term (a new cluster) it opens its own
    window (:meth:`NodeCore._watch_roll`)."""
    FOLLOWING = "following"
    """Open mode (no operator key pinned), first start, found only (no ``--join``, no peers file), and members
    tagged ``voter`` show a term: any member can claim that tag and publish a closed roll of itself and its
    friends, so nothing found is adopted. The node keeps no roll (nothing persisted, no ``roll`` section), casts
    no vote and never opens its own window; it follows, as a non-voter, the leader a quorum of the **one** closed
    roll a majority of its own voters publishes. With two or more such rolls (fakes publishing theirs) it follows
    none (``conflict`` names them): no leader, it keeps what runs and starts nothing. It leaves this state when
    the operator gives it seeds (restart with ``--join`` or a peers file) or admits a voter on it
    (``p2pnode node admit``: the roll it follows is adopted, with the admission)."""


_HOLDING = (RollAdoption.WAITING, RollAdoption.CONFLICT, RollAdoption.WATCHING)
"""Adoption states in which the node counts no roll and casts no vote."""


class NodeCore:
    """Membership, election and publication policy of node ``node_id`` (see module docstring).

    ``incarnation`` is this run's incarnation (persisted by the caller, one above the last run's); ``vote`` and
    ``roll`` the persisted vote and voter roll; ``trusted`` whether members are endorsed by a cluster token
    (token mode: untagged members vote by the classic rule). ``voter_cap`` bounds the voter roll (and the
    removals it remembers). ``known_voters``: a voter set fixed in advance (the simulator's ``voter``-tagged
    nodes): no roll is kept, and a node that does not vote skips ranking candidates (the result is the same,
    the work is not N x N per round). ``leader_settle_s``: a candidate that joined or returned (a new run, a
    refutation, back from dead) less than this many seconds ago is not voted for while a settled candidate or
    the current leader is there, so a flaky strong node (a spot H200 that comes and goes) does not move
    leadership each time it returns; when no candidate is settled (a cluster that just started) every one counts,
    so the settle time never delays an election (Consul autopilot's "server stabilization time" in the same
    spirit).

    A node that starts with a persisted vote for another member, or with ``expect_peers`` (it was given
    addresses to join), holds its vote (and sees no leader) until it has heard from another live member, or for
    at most ``join_hold_s`` (default: three gossip intervals). Without the hold a restarted agent, alone in its
    view for the first round, voted for itself in a new term and then for the leader in the next one (the
    cluster's term rose twice on every restart, and each new term's first plan waits to settle), and nodes
    started together each elected themselves in term 1 before they met. Raft's election timeout at start-up and
    Consul's ``bootstrap_expect`` play the same role.

    In open mode (not ``trusted``), the voter roll of a node starting for the first time (``roll`` None: no
    usable ``voters.json``) with ``seed_peers`` (the operator gave it peers: join addresses, a peers file) is
    **adopted**, never built from whoever is tagged ``voter`` when it starts (:class:`RollAdoption`): until
    those peers answered
    (:meth:`seed_peers_answered`) the node holds as above and admits nobody; then, if they publish closed rolls
    (:class:`p2pnode.snapshot.RollSection`) naming the same voters, it takes that roll, closed; if their rolls
    differ it takes none, says so and keeps holding; only if none of them publishes a closed roll (a new
    cluster) does its own bootstrap window open. It decides once every given peer answered, or ``join_hold_s``
    after the first one did. Without ``seed_peers`` the node watches the members it finds first
    (:attr:`RollAdoption.WATCHING`): with ``pinned`` (operator keys pinned: the ``voter`` tags it reads are
    certified) it adopts the roll its certified voters vouch for; without, it adopts nothing it found and follows
    as a non-voter (:attr:`RollAdoption.FOLLOWING`); when nobody shows a term its window opens (the first node of
    a cluster). In token mode every endorsed member tagged ``voter`` is admitted anyway
    (:class:`p2pnode.election.VoterRoll`).
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
        self._joined = not expect_peers and (vote is None or vote.candidate == node_id)  # nothing to hold
        self._up_since: float | None = None  # this node's own run, from its first reconcile
        self.membership = Membership(node_id, config, incarnation=incarnation)
        self.election = Election(node_id, is_voter=is_voter, vote=vote, min_voters=min_voters)
        self.roll = roll if roll is not None else VoterRoll(trusted=trusted, bootstrap_s=voter_bootstrap_s)
        self.roll_of = roll_of or (lambda node_id: None)
        fresh = roll is None and known_voters is None and not trusted
        self.adoption = (RollAdoption.WAITING if fresh and seed_peers else RollAdoption.WATCHING if fresh
                         else RollAdoption.KEPT)
        self._unseeded = fresh and not seed_peers  # its own window, if it opens, yields to a vouched closed roll
        self.pinned = pinned  # operator keys pinned: members' voter tags are certified (else mere claims)
        self._followed: frozenset[str] | None = None  # FOLLOWING: the one vouched roll whose leader is followed
        self._followed_by: list[str] = []  # the publishers of the followed roll
        self._late_logged = False
        self._watch_first_at: float | None = None  # when a WATCHING node first held another member
        self._seeds: set[str] = set()  # member ids of the operator-given peers that answered
        self._seeds_all = False  # every operator-given peer answered
        self._seed_first_at: float | None = None
        self._waiting_logged = False
        self._conflict: dict[str, list[str]] = {}  # seed -> the voters its closed roll names (while in conflict)
        self.candidate = Candidate(node_id, 0.0, 0)
        self.leaving = False
        self.leaders_by_term: dict[int, str] = {}
        self.leader_changes = 0
        self.last_publish_at = -1e9
        self._wanted = False
        self._published_suspects: dict[str, int] = {}
        self._refusals_logged: set[str] = set()
        self._marks_from: dict[str, RollSection] = {}  # the roll section each source's marks were merged from

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
        me = MemberInfo(self.candidate, self.election.vote, self.tags)
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
        if self.leader_settle_s > 0:
            inputs["candidates"] = self._settled(inputs["candidates"], now)
        before = self.election.view.leader, self.election.view.term
        if self.election.update(**inputs):
            if self.election.vote is not None:
                self.store.save_vote(self.election.vote)
            self._wanted = True
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
                up = m.up_since if m is not None else now
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

    def roll_section(self, wall: float) -> RollSection | None:
        """This node's ``roll`` section at wall-clock ``wall`` (Unix seconds): the voter roll it counts, ``closed``
        once open mode's bootstrap window is over (or the roll was adopted), and the eligibility marks. None while
        the roll is being adopted, while it holds neither a voter nor a mark, or when it holds more than
        :data:`p2pnode.snapshot.ROLL_MAX` voters."""
        roll = self.roll
        if self.adoption in (*_HOLDING, RollAdoption.FOLLOWING) or not (roll.members or roll.marks) \
                or len(roll.members) > ROLL_MAX:
            return None
        return RollSection(voters=sorted(roll.members), removed=sorted(roll.removed)[:ROLL_MAX],
                           created_at=roll.created_at, closed=not roll.is_open(wall), marks=roll.wire_marks())

    def roll_view(self) -> dict:
        """How the roll was obtained, for ``/status``: ``adoption`` (:class:`RollAdoption`), the operator-given
        ``seeds`` that answered, and while in conflict the voters each one's roll names (bounded)."""
        return {"adoption": self.adoption, "seeds": sorted(self._seeds)[:64],
                "following": sorted(self._followed or ())[:64],
                "conflict": {n: v[:64] for n, v in sorted(self._conflict.items())[:16]},
                "marks_ignored": self.roll.marks_ignored}

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
        d = self.membership.next_deadline()
        if d is not None:
            at = min(at, d)
        return max(at, now)

    # -- voter roll ------------------------------------------------------------------------------
    @property
    def _seeding(self) -> bool:
        """Whether the roll is being adopted from operator-given peers (not from watching the members found)."""
        return not self._unseeded

    def _voting_members(self) -> set[str]:
        """Members held (not leaving) that vote as a roll counts them: those tagged ``voter`` as the tag counts here
        (where operator keys are pinned: certified); in open mode where none is tagged, every member, as
        :meth:`_update_roll` does (a cluster of untagged voters is an established cluster too: without this a
        fresh node found by mDNS would see no term among them and open its own window, fakes included)."""
        held = self.roll_candidates()
        tagged = {o for o, tags, leaving in held if "voter" in tags and not leaving}
        if tagged or self.pinned:
            return tagged
        return {o for o, _tags, leaving in held if not leaving}

    def _termed(self) -> list[str]:
        """Members held (not this node) of an established cluster: tagged ``voter`` as the tag counts here (where
        operator keys are pinned: certified; an uncertified member showing a term keeps nobody waiting), and
        publishing a closed roll, or a vote of term > 0 without a roll still in its bootstrap window (members
        whose window is open are a cluster forming, which a fresh node may join by its own window, as nodes
        started together do)."""
        tagged = self._voting_members()
        out = []
        for n in self.membership.members:
            if n not in tagged:
                continue
            mi = self.info(n)
            r = self.roll_of(n)
            voted = mi is not None and mi.vote is not None and mi.vote.term > 0
            if (r is not None and r.closed) or (voted and r is None):
                out.append(n)
        return out

    def _vouched_rolls(self) -> dict[frozenset[str], list[str]]:
        """Closed rolls published by a quorum of their own voters, with those publishers. Publishers count only
        while they show the ``voter`` tag as it counts here (where operator keys are pinned: certified), so
        members merely claiming a roll of themselves, or fakes, never vouch for one; a roll is vouched when its
        voters that publish it are a majority of it (the quorum that elects its leader)."""
        tagged = self._voting_members()
        groups: dict[frozenset[str], list[str]] = {}
        for n in sorted(tagged):
            if n == self.node_id:
                continue
            r = self.roll_of(n)
            if r is None or not r.closed or not r.voters or n not in r.voters:
                continue
            groups.setdefault(frozenset(r.voters), []).append(n)
        return {v: p for v, p in groups.items() if len(p) >= len(v) // 2 + 1}

    def _watch_roll(self, now: float, wall: float) -> None:
        """A fresh node with no operator-given peer (:attr:`RollAdoption.WATCHING`). Where operator keys are pinned
        it adopts the closed roll a quorum of its certified voters publishes (:meth:`_vouched_rolls`), at once; with
        several, the one most of them vouch for (a tie: none, CONFLICT); a node whose own window is still open
        leaves it for such a roll (it met an existing cluster late). In open mode it adopts nothing found (any
        member may claim the voter tag and a roll): once the members found were watched for ``join_hold_s``,
        members tagged ``voter`` with a term make it a non-voter that follows (:attr:`RollAdoption.FOLLOWING`,
        :meth:`_follow`). If no such member shows a term by then (or nobody was found in that time), it opens its
        own window (:attr:`RollAdoption.BOOTSTRAP`)."""
        vouched = self._vouched_rolls()
        if self.pinned and vouched:
            self._adopt_vouched(vouched, wall)
            return
        if self.adoption == RollAdoption.BOOTSTRAP:
            if vouched and not self._late_logged:
                self._late_logged = True
                log.warning("voter roll: a closed roll a quorum of its voters publishes appeared (%d voters) while "
                            "this node's own window is open; open mode adopts no roll it only found: restart it "
                            "with --join to join that cluster", len(next(iter(vouched))))
            return
        if self._watch_first_at is None and self.membership.members:
            self._watch_first_at = now
        first = self._watch_first_at if self._watch_first_at is not None else self._up_since
        if self.adoption != RollAdoption.FOLLOWING and (first is None or now - first < self.join_hold_s):
            return
        termed = self._termed()
        if not self.pinned and (termed or vouched or self.adoption == RollAdoption.FOLLOWING):
            self._follow(vouched, termed)  # once following, never its own window (a partition is no new cluster)
            return
        if termed:
            if not self._waiting_logged:
                self._waiting_logged = True
                log.warning("voter roll: certified voters with a term are here (%s) but no closed roll a quorum of "
                            "its voters publishes: this node counts no roll and casts no vote until one does (or "
                            "give it --join)", ", ".join(termed[:8]))
            return
        self.adoption, self._followed, self._conflict = RollAdoption.BOOTSTRAP, None, {}
        log.warning("voter roll: no member found shows a term: a new cluster, the bootstrap window opens here")

    def _adopt_vouched(self, vouched: dict[frozenset[str], list[str]], wall: float) -> None:
        """Adopt the vouched roll most certified publishers vouch for (keys pinned; a tie: CONFLICT)."""
        ranked = sorted(vouched.items(), key=lambda kv: (-len(kv[1]), sorted(kv[0])))
        if len(ranked) > 1 and len(ranked[0][1]) == len(ranked[1][1]):
            self._conflict = {p[0]: sorted(v) for v, p in ranked[:16]}
            self.adoption = RollAdoption.CONFLICT
            return
        if self.adoption == RollAdoption.BOOTSTRAP and self.node_id in ranked[0][0]:
            return  # our own cluster's roll
        voters, publishers = ranked[0]
        self._take_roll(voters, publishers, wall)
        log.info("voter roll adopted from the %d of its %d certified voters that publish it (found, not given: %s)",
                 len(publishers), len(voters), ", ".join(publishers[:8]))

    def _take_roll(self, voters: frozenset[str], publishers: Iterable[str], wall: float) -> None:
        """Adopt ``voters`` closed, with the removals and marks ``publishers`` publish; persisted."""
        publishers = list(publishers)
        marks = [m for n in publishers for r in [self.roll_of(n)] if r is not None for m in r.marks]
        removed = {x for n in publishers for r in [self.roll_of(n)] if r is not None for x in r.removed}
        self.roll.adopt(set(voters), set(sorted(removed - voters)[:ROLL_MAX]), wall, marks=marks)
        self.store.save_roll(self.roll)
        self.adoption, self._conflict, self._followed, self._wanted = RollAdoption.ADOPTED, {}, None, True
        self._unseeded = False

    def _follow(self, vouched: dict[frozenset[str], list[str]], termed: list[str]) -> None:
        """Open mode, found only, a cluster with a term here (:attr:`RollAdoption.FOLLOWING`): follow the leader of
        the one vouched roll, as a non-voter; with none or several, no leader (the rolls in ``conflict``)."""
        followed = next(iter(vouched)) if len(vouched) == 1 else None
        conflict = {p[0]: sorted(v) for v, p in sorted(vouched.items(), key=lambda kv: sorted(kv[0]))[:16]} \
            if len(vouched) > 1 else {}
        if (self.adoption, followed, conflict) != (RollAdoption.FOLLOWING, self._followed, self._conflict):
            if followed is not None:
                log.warning("voter roll: open mode, found only: following, as a non-voter, the leader of the closed "
                            "roll %d of its %d voters publish; adopting none (give --join to become a voter)",
                            len(vouched[followed]), len(followed))
            else:
                log.warning("voter roll: open mode, found only: %s; this node follows no leader and adopts no roll "
                            "until it is given --join (members with a term: %s)",
                            f"{len(vouched)} different closed rolls are each published by a quorum of their voters"
                            if vouched else "no closed roll a quorum of its voters publishes",
                            ", ".join(termed[:8]))
        self.adoption, self._followed, self._conflict = RollAdoption.FOLLOWING, followed, conflict
        self._followed_by = vouched[followed] if followed is not None else []

    def _adopt_roll(self, now: float, wall: float) -> None:
        """Adopt the closed roll the operator-given peers publish (rules: the class docstring)."""
        held = sorted(n for n in self._seeds if self.info(n) is not None)
        if not held and self._seeds_all:  # every given address answered, none as another member: ourselves
            self.adoption = RollAdoption.BOOTSTRAP
            log.warning("voter roll: the peers given are this node itself: the first node of a cluster, the "
                        "bootstrap window opens here")
            return
        if not held:
            up = self._up_since if self._up_since is not None else now
            if now - up >= self.join_hold_s and not self._waiting_logged:
                self._waiting_logged = True
                log.warning("voter roll: none of the peers given (join addresses, peers file) answered yet; this "
                            "node sees no leader and admits no voter until one does")
            return
        if self._seed_first_at is None:
            self._seed_first_at = now
        if not self._seeds_all and now - self._seed_first_at < self.join_hold_s:
            return  # the other given peers may still answer (and disagree)
        rolls: dict[str, RollSection] = {}
        for n in held:
            r = self.roll_of(n)
            if r is not None and r.closed and r.voters:
                rolls[n] = r
        if not rolls:
            self.adoption = RollAdoption.BOOTSTRAP
            log.warning("voter roll: none of the peers given (%s) publishes a closed roll: a new cluster, the "
                        "bootstrap window opens here", ", ".join(held[:8]))
            return
        distinct = {frozenset(r.voters) for r in rolls.values()}
        if len(distinct) > 1:
            conflict = {n: sorted(r.voters) for n, r in rolls.items()}
            if conflict != self._conflict:
                log.error("voter roll: the peers given publish different rolls (%s); adopting none and seeing no "
                          "leader until they agree: make them agree with `p2pnode node admit|remove ID`",
                          "; ".join(f"{n}: {len(v)} voters" for n, v in sorted(conflict.items())[:8]))
            self._conflict = conflict
            self.adoption = RollAdoption.CONFLICT
            return
        voters = set(next(iter(distinct)))
        removed: set[str] = set()
        for r in rolls.values():
            removed.update(r.removed)
        self.roll.adopt(voters, set(sorted(removed - voters)[:ROLL_MAX]), wall,
                        marks=[m for n, r in rolls.items() if n in voters for m in r.marks])  # voters' marks only
        self.store.save_roll(self.roll)
        self.adoption = RollAdoption.ADOPTED
        self._conflict = {}
        self._wanted = True
        log.info("voter roll adopted from %s: %d voters (%s)", ", ".join(sorted(rolls)[:8]), len(voters),
                 ", ".join(sorted(voters)[:8]))

    def _update_roll(self, wall: float) -> set[str] | None:
        """Admit members into the sticky voter roll (rules: :class:`VoterRoll`) and return the voter set to
        count (``None``: the classic rule of :meth:`Election.voter_set`).

        Candidates are the members tagged ``voter``. Where no member is tagged: in open mode every member (not
        leaving) is a candidate, so that members that appear after the roll closed, fake ones included, never
        vote; in token mode (members are endorsed) the classic rule applies: every member not left votes until
        it is reaped."""
        tagged = {self.node_id} if "voter" in self.tags else set()
        untagged: set[str] = set() if tagged else {self.node_id}
        for origin, tags, leaving in self.roll_candidates():
            if origin == self.node_id:
                continue
            if "voter" in tags:
                tagged.add(origin)
            elif not leaving:
                untagged.add(origin)
        if tagged:
            candidates, kind = tagged, "claims the voter tag"
        elif not self.trusted:
            candidates, kind = untagged, "joined (no member is tagged voter)"
        else:
            candidates, kind = set(), ""
        roll = self.roll
        if candidates - roll.members - roll.removed - roll.refused:
            if roll.observe(candidates, wall):
                self.store.save_roll(roll)
            for n in sorted(roll.refused & candidates):
                if n not in self._refusals_logged and len(self._refusals_logged) < 1024:
                    self._refusals_logged.add(n)
                    log.warning("member %s %s after the voter roll closed (open mode): it does not vote; admit it "
                                "with `p2pnode node admit %s`", n, kind, n)
        if not candidates or not roll.members:
            return None
        if tagged:
            return roll.members - (untagged - tagged)  # known untagged members never count once tags exist
        return set(roll.members)

    def change_voter(self, node_id: str, *, admit: bool, wall: float = 0.0) -> bool:
        """The operator admits ``node_id`` to the voter roll or removes it (``p2pnode node admit|remove``) at
        wall-clock ``wall`` (Unix seconds). Returns True when the roll changed (persisted at once, effective at the
        next reconcile). The roll holds at most ``voter_cap`` voters and remembers as many removals. On a node
        :attr:`RollAdoption.FOLLOWING` one roll, the operator's act vouches for that roll: it is adopted first; on
        one following none, the change is refused (False): the node has no roll to change."""
        if self.adoption == RollAdoption.FOLLOWING:
            if self._followed is None:
                log.warning("voter roll: %s %s refused: this node follows no roll (open mode, found only); restart "
                            "it with --join", "admit" if admit else "remove", node_id)
                return False
            followed = self._followed
            self._take_roll(followed, self._followed_by, wall)
            log.warning("voter roll: the operator acted on the roll: adopted the roll this node followed (%d voters)",
                        len(followed))
        roll = self.roll
        if admit and node_id not in roll.members and len(roll.members) >= self.voter_cap:
            return False
        changed = roll.admit(node_id) if admit else roll.remove(node_id)
        while len(roll.removed) > self.voter_cap:
            roll.removed.pop()
        if changed or not admit:
            self.store.save_roll(roll)
        if changed:
            log.warning("operator %s voter %s", "admitted" if admit else "removed", node_id)
            self._wanted = True
        return changed

    def change_eligibility(self, node_id: str, state: str, wall: float) -> bool:
        """The operator marks ``node_id`` ``eligible``, ``ineligible`` or ``cleared`` (``p2pnode node
        eligible|ineligible|unmark``; rules: :func:`p2pnode.election.is_eligible`) at wall-clock ``wall`` (Unix
        seconds). Returns True when the roll changed (persisted at once, published with the roll, merged by every
        member that counts this node as a voter: :meth:`p2pnode.election.VoterRoll.merge`). Past
        :data:`p2pnode.snapshot.MARKS_MAX` marks the oldest is forgotten (logged, and in ``roll.forgotten``)."""
        changed = self.roll.mark(node_id, state, wall)
        if changed:
            self.store.save_roll(self.roll)
            log.warning("operator marked %s %s", node_id, {"eligible": "eligible to lead", "ineligible":
                        "not eligible to lead", "cleared": "by its tags again"}.get(state, state))
            for m in self.roll.forgotten:
                log.warning("the roll holds at most %d eligibility marks: forgot the oldest, %s %s",
                            len(self.roll.marks), m.node, m.state)
            self._wanted = True
        return changed

    def _mark_sources(self) -> set[str]:
        """The members whose published marks this node merges: the voters it counts (the roll, else the fixed
        voter set); in token mode with no voter roll (every endorsed member votes), every member held."""
        if self.known_voters is not None:
            return self.known_voters
        if self.roll.members:
            return self.roll.members
        if self.trusted:
            held = list(self.roll_candidates())
            if any("voter" in tags for _o, tags, _l in held) or "voter" in self.tags:
                return set()  # members claim the voter tag: only those the roll admits vote (none yet)
            return {origin for origin, _tags, _leaving in held}
        return set()

    def _merge_marks(self, wall: float) -> None:
        """Merge the eligibility marks of every source (:meth:`_mark_sources`) whose roll section is new since the
        last merge, so a voter that missed the operator's mark (down at the time, or started later) takes it from
        the others (rules: :meth:`p2pnode.election.VoterRoll.merge`)."""
        sources = self._mark_sources()
        changed = False
        for n in sources:
            if n == self.node_id:
                continue
            r = self.roll_of(n)
            if r is None or self._marks_from.get(n) is r:
                continue
            self._marks_from[n] = r
            if r.marks and self.roll.merge(r.marks, wall):
                changed = True
        if len(self._marks_from) > len(sources):
            self._marks_from = {n: r for n, r in self._marks_from.items() if n in sources}
        if changed:
            self.store.save_roll(self.roll)
            self._wanted = True
            roll = self.roll
            log.info("eligibility marks merged from the voters: eligible %s; ineligible %s",
                     ", ".join(sorted(roll.eligible)[:8]) or "-", ", ".join(sorted(roll.ineligible)[:8]) or "-")

    # -- plans (fencing) -------------------------------------------------------------------------
    @property
    def view(self) -> ElectionView:
        """The leader view: leader, term, votes, quorum (:class:`p2pnode.election.ElectionView`)."""
        return self.election.view

    def is_leader(self) -> bool:
        """Whether this node leads a term in its own view."""
        v = self.election.view
        return v.leader == self.node_id and v.term is not None

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
