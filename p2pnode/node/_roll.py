"""The voter roll of one node: where it comes from (:class:`RollAdoption`: kept, adopted from the operator-given
peers, watched for, followed) and how it changes (admissions, operator changes, eligibility marks). Sans-IO.

:class:`VoterRollPolicy` is the part of :class:`p2pnode.node.NodeCore` that keeps the roll (rules: the
:class:`~p2pnode.node.NodeCore` docstring); the core calls it from :meth:`~p2pnode.node.NodeCore.reconcile` and
:meth:`~p2pnode.node.NodeCore._elect`, and publishes :meth:`VoterRollPolicy.roll_section`. Its state (the
attributes declared below) is set up by :meth:`p2pnode.node.NodeCore.__init__`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from ..election import MemberInfo, VoterRoll
from ..gossip import Membership
from ..snapshot import ROLL_MAX, RollSection
from ._store import CoreStore

__all__ = ["RollAdoption", "RollCandidates", "VoterRollPolicy"]

log = logging.getLogger("p2pnode.node._core")  # the node core's log, as before the split


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
    window (:meth:`VoterRollPolicy._watch_roll`)."""
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


class VoterRollPolicy:
    """The voter-roll half of :class:`p2pnode.node.NodeCore` (a mixin: the core's state below is its own)."""

    # the core's own state, read here (set by NodeCore.__init__)
    node_id: str
    store: CoreStore
    info: Callable[[str], MemberInfo | None]
    roll_candidates: RollCandidates
    membership: Membership
    tags: tuple[str, ...]
    trusted: bool
    voter_cap: int
    known_voters: set[str] | None
    join_hold_s: float
    _up_since: float | None
    _wanted: bool

    def _init_roll(self, roll: VoterRoll | None, *, roll_of: Callable[[str], RollSection | None] | None,
                   trusted: bool, voter_bootstrap_s: float, seed_peers: bool, pinned: bool) -> None:
        """The roll's state at start-up (arguments: :class:`p2pnode.node.NodeCore`); after ``known_voters`` is set."""
        self.roll = roll if roll is not None else VoterRoll(trusted=trusted, bootstrap_s=voter_bootstrap_s)
        self.roll_of = roll_of or (lambda _node_id: None)
        fresh = roll is None and self.known_voters is None and not trusted
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
        self._refusals_logged: set[str] = set()
        self._marks_from: dict[str, RollSection] = {}  # the roll section each source's marks were merged from

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
