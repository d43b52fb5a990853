"""Membership: the one module that owns member states (alive, suspect, dead, left) and their transitions. Pure.

Liveness comes from snapshots: every node republishes its snapshot at least every
:func:`publish_interval_s` (a heartbeat whose rate adapts to cluster size, so that each node verifies at most
``target_verifications_per_s`` signatures per second), and an observer that sees no *new version* of a member
for :func:`suspect_after_s` marks it **suspect**. Each node lists the members it suspects (with their
incarnation) in its own snapshot; those lists are the **confirmations** of Lifeguard (Dadgar et al., "Lifeguard:
Local Health Awareness for More Accurate Failure Detection", 2018): the more independent members suspect the
same incarnation, the shorter the time before it is declared **dead** (:func:`suspicion_timeout_s`, the
formula of hashicorp/memberlist ``suspicion.go``). A suspected node **refutes** by raising its incarnation and
publishing at once; an accusation of an older incarnation is void. A new version from a suspect or dead member
makes it alive again (a healed partition merges by itself; dead members are kept, and dialled, for
``reconnect_window_s`` before they are reaped). A snapshot with ``leaving`` makes a member **left**, not dead.

With SWIM probes (:mod:`p2pnode.gossip._probe`, ``adopt_suspicions=True``) suspicion also starts from a failed
probe (:meth:`Membership.probe_failed`) and from an accusation heard in another member's snapshot (memberlist's
``suspectNode``: the accuser is the first of the suspicion's confirmers, not a confirmation); a probe ack that
carries a higher incarnation refutes (:meth:`Membership.acked`). A suspicion then ends only by a refutation: a
snapshot of the suspected incarnation, like an ack of it, may have been sent before the member died (a heartbeat
still spreading), so it does not make the member alive again (memberlist ``aliveNode`` ignores an alive message
that does not raise the incarnation of a suspect). The suspected member refutes as soon as it hears the accusation.
This node lists in its own snapshot only the members *it* accuses (its failed probes, its own silence timer), so
confirmations stay independent.

Transitions (the only ones; any other is a bug and raises ``IllegalTransition``)::

    (new)   --heard-->    alive        alive   --timeout-->  suspect      suspect --timeout--> dead
    alive   --suspected-> suspect  (a failed probe, or an accusation heard; with probes only)
    suspect --heard-->    alive  (with probes: only at a higher incarnation, a refutation)
    dead    --heard-->    alive        left    --heard-->   alive
    alive|suspect|dead --leave--> left                                    dead    --reap-->    (removed)
    left    --reap-->     (removed)

``now`` is monotonic seconds passed in; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import IllegalTransition
from ._members import (
    _CODE_TRANSITIONS,
    ABSENT,
    ALIVE,
    DEAD,
    LEFT,
    NO_SUSPECTS,
    STATES,
    SUSPECT,
    Member,
    MemberIndex,
    MemberState,
    MembersView,
    MemberTable,
    StateChanged,
    alive_heard_since,
    confirmation_counts,
    scan,
)

__all__ = [
    "IllegalTransition",
    "MAX_INCARNATION_STEP",
    "Member",
    "MemberIndex",
    "MemberState",
    "Membership",
    "MembershipConfig",
    "PROFILES",
    "StateChanged",
    "publish_interval_s",
    "expected_confirmations",
    "suspect_after_s",
    "suspicion_timeout_s",
]

MAX_INCARNATION_STEP = 16
"""An accusation may raise this node's incarnation by at most this much above its current value. Every honest
accusation names an incarnation some peer saw in our own snapshots, so it is never above ours; the slack only
covers an incarnation file restored from an old backup (then our newer versions lower the one peers hold:
:meth:`Membership.observe`). Each step needs a signature check, and those are budgeted (1,000 a second by
default), so a sustained flood moves our persisted counter by at most ~16,000 a second: 2^53 is 17,000 years away."""
INCARNATION_CEILING = 2**50
"""No accusation above this incarnation is refuted, so our own incarnation stays far below the wire bound."""


_A, _S, _D, _L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


@dataclass(frozen=True, kw_only=True)
class MembershipConfig:
    """Failure-detection parameters. Seconds throughout. See :data:`PROFILES` for LAN, WAN and local-test.

    ``gossip_interval_s`` is the anti-entropy round; ``suspicion_mult`` scales every timeout with
    log10(N) (memberlist's SuspicionMult: higher = fewer false suspicions, slower detection);
    ``suspicion_max_timeout_mult`` bounds the un-confirmed suspicion timeout (memberlist's
    SuspicionMaxTimeoutMult); ``expected_confirmations`` is Lifeguard's K; ``min_publish_interval_s`` and
    ``target_verifications_per_s`` set the heartbeat (publish) rate; ``reconnect_window_s`` keeps dead members
    (and keeps dialling them) before reaping; ``left_retention_s`` keeps left members visible.
    """

    gossip_interval_s: float = 1.0
    suspicion_mult: float = 4.0
    suspicion_max_timeout_mult: float = 6.0
    expected_confirmations: int = 3
    min_publish_interval_s: float = 1.0
    target_verifications_per_s: float = 100.0
    reconnect_window_s: float = 24 * 3600.0
    left_retention_s: float = 3600.0


PROFILES: dict[str, MembershipConfig] = {
    # memberlist DefaultLANConfig: SuspicionMult 4, SuspicionMaxTimeoutMult 6.
    "lan": MembershipConfig(),
    # memberlist DefaultWANConfig: SuspicionMult 6; slower rounds tolerate higher latency and loss.
    "wan": MembershipConfig(gossip_interval_s=2.0, suspicion_mult=6.0, min_publish_interval_s=2.0),
    # Fast detection for tests on one machine (loopback or namespaces); not for real networks.
    "local-test": MembershipConfig(
        gossip_interval_s=0.5, suspicion_mult=3.0, suspicion_max_timeout_mult=4.0, min_publish_interval_s=0.5
    ),
}


def _log_n(n: int) -> float:
    return math.log10(max(n, 10))


def publish_interval_s(n: int, cfg: MembershipConfig) -> float:
    """Seconds between heartbeat publications in a cluster of ``n`` members: ``max(min_publish_interval_s,
    n / target_verifications_per_s)``, so each node receives (and verifies) at most about
    ``target_verifications_per_s`` new snapshot versions per second whatever ``n`` is."""
    return max(cfg.min_publish_interval_s, n / cfg.target_verifications_per_s)


def suspect_after_s(n: int, cfg: MembershipConfig) -> float:
    """Silence (no new version) after which a member becomes suspect: one publish interval plus
    ``suspicion_mult × log10(max(n, 10)) × gossip_interval_s`` for the version to travel the O(log n) rounds."""
    return publish_interval_s(n, cfg) + cfg.suspicion_mult * _log_n(n) * cfg.gossip_interval_s


def expected_confirmations(n: int, cfg: MembershipConfig) -> int:
    """Lifeguard's K in a cluster of ``n`` members: ``min(expected_confirmations, suspicion_mult − 2)``, and 0 when
    fewer than K members besides us and the suspect could confirm (``n − 2 < K``), so a small cluster waits the
    minimum instead of the maximum (hashicorp/memberlist ``state.go`` ``suspectNode``: "we hit the nominal timeout
    two probe intervals short of what we expect given the suspicion multiplier")."""
    k = max(0, min(cfg.expected_confirmations, int(cfg.suspicion_mult) - 2))
    return 0 if n - 2 < k else k


def suspicion_timeout_s(n: int, confirmations: int, cfg: MembershipConfig) -> float:
    """Time from suspect to dead, shortened by independent confirmations (Lifeguard, as memberlist computes it):

    ``min = suspicion_mult × log10(max(n, 10)) × gossip_interval_s``, ``max = suspicion_max_timeout_mult × min``,
    ``timeout = max(min, max − (max − min) × log(c + 1) / log(K + 1))`` with ``c`` confirmations and
    ``K =`` :func:`expected_confirmations` (``K = 0``: the minimum at once). hashicorp/memberlist
    ``suspicion.go`` ``remainingSuspicionTime`` and ``util.go`` ``suspicionTimeout``.
    """
    lo = cfg.suspicion_mult * _log_n(n) * cfg.gossip_interval_s
    k = expected_confirmations(n, cfg)
    if k < 1:
        return lo
    hi = cfg.suspicion_max_timeout_mult * lo
    frac = math.log(min(confirmations, k) + 1) / math.log(k + 1)
    return max(lo, hi - (hi - lo) * frac)


_NO_SUSPECTS = NO_SUSPECTS


class Membership:
    """Member states as seen by ``self_id`` (see module docstring).

    Feed it with :meth:`observe` for every newly accepted snapshot and call :meth:`tick` regularly (at the
    latest at :meth:`next_deadline`). ``incarnation`` is this node's own; :meth:`observe` raises it when another
    member accuses it (``refute_needed`` is then set, and the driver publishes at once). What it knows of each
    member is one slot of a columnar :class:`p2pnode.gossip._members.MemberTable` keyed by ``index`` (its own by
    default; the simulator shares one across its nodes); :attr:`members` is a read-only view of it.
    """

    def __init__(self, self_id: str, cfg: MembershipConfig | None = None, *, incarnation: int = 0,
                 adopt_suspicions: bool = False, index: MemberIndex | None = None) -> None:
        self.self_id = self_id
        self.cfg = cfg or MembershipConfig()
        self.incarnation = incarnation
        self.refute_needed = False
        self._t = MemberTable(index if index is not None else MemberIndex())
        self.members = MembersView(self._t)
        """``{node_id: Member}``, read-only, in the order members were first heard (see :mod:`._members`)."""
        self.false_suspicions_refuted = 0
        self.implausible_suspicions = 0
        self.suspicions_started = 0
        """Transitions to suspect (alive -> suspect) so far, whatever started them."""
        self.adopt_suspicions = adopt_suspicions
        """SWIM mode: an accusation in a member's snapshot starts our own suspicion (see module docstring)."""
        self._accusing: set[str] = set()
        """Suspect members this node accuses itself (failed probe or silence): the ones its snapshot lists."""
        self._condemned: set[str] = set()
        """Members this node accused and then declared dead: its snapshot keeps listing them while others' timers
        of the same suspicion may still run (:meth:`suspects`), so its confirmation is not withdrawn."""
        self._now = -math.inf
        """The latest ``now`` a transition or a tick saw (monotonic seconds)."""
        # Indexes kept by the methods below so that a tick with nothing due costs O(1), not O(members): the
        # simulator runs thousands of these, and a real node of a large cluster ticks every round.
        self._not_left = 0
        """Members not left (:attr:`size` less one)."""
        self._suspect: set[str] = set()
        """Members in state suspect."""
        self._quiet_until = -math.inf
        """A lower bound of :meth:`next_deadline`, set by a :meth:`tick` that found nothing due; anything that can
        bring a deadline earlier (a transition, a new member, a changed suspect list or incarnation, a probe
        result) resets it. :meth:`tick` before it has nothing to do."""
        self.changes = 0
        """Counts changes of the member set and of members' states: a key for caches of views built from them."""
        self.news = 0
        """Membership news so far, for :class:`p2pnode.gossip.NewsPush` (pushed at once, as memberlist broadcasts
        suspect, alive and dead messages): this node began accusing a member or its incarnation rose, or a member's
        snapshot brought an accusation or an incarnation new to this node. Only grows."""

    # -- the one place states change -------------------------------------------------------------
    def _transition(self, node_id: str, event: str, now: float) -> StateChanged:
        t = self._t
        s = t.slot_of(node_id)
        old = t.state[s] if s >= 0 else ABSENT
        new = _CODE_TRANSITIONS.get((old, event), -1)
        if new < 0 or s < 0:
            raise IllegalTransition(f"{node_id}: {STATES[old].value if old else 'new'} --{event}-->")  # type: ignore[union-attr]
        self._now = max(self._now, now)
        if new == DEAD and node_id in self._accusing:
            self._condemned.add(node_id)
        elif new != DEAD:
            self._condemned.discard(node_id)
        if new != SUSPECT:
            self._accusing.discard(node_id)
            self._suspect.discard(node_id)
        else:
            self._suspect.add(node_id)
            if old != SUSPECT:
                self.suspicions_started += 1
        self._not_left += (new != ABSENT and new != LEFT) - (old != LEFT)
        self._quiet_until = -math.inf
        self.changes += 1
        if new == ABSENT:
            t.remove(s)
        else:
            t.state[s] = new
            t.since[s] = now
        return StateChanged(node_id, STATES[old], STATES[new], now)

    # -- inputs ----------------------------------------------------------------------------------
    def observe(
        self,
        node_id: str,
        *,
        version: int,
        incarnation: int,
        leaving: bool,
        suspects: dict[str, int],
        now: float,
    ) -> list[StateChanged]:
        """A new snapshot ``version`` of ``node_id`` was accepted at ``now``. Returns the state changes.

        ``suspects`` is kept as given, not copied: it is the snapshot's own list, which nothing changes after
        decoding (in the simulator every observer of a version shares the one dict its publisher made)."""
        if node_id == self.self_id:
            return []
        accused = suspects.get(self.self_id)
        if accused is not None:
            self.accused(accused)
        t = self._t
        s = t.slot_of(node_id)
        if s < 0:
            new = LEFT if leaving else ALIVE
            if any(self._wanted_accusation(x, inc) for x, inc in suspects.items()):
                self.news += 1
            t.add(node_id, new, incarnation, version, now, suspects or _NO_SUSPECTS)
            self._not_left += new != LEFT
            self._quiet_until = -math.inf
            self.changes += 1
            return [StateChanged(node_id, None, STATES[new], now), *self._adopt(node_id, suspects, now)]
        if version <= t.version[s]:
            return []
        t.version[s] = version
        t.heard[s] = now
        held, held_inc = t.susp[s], t.inc[s]
        if incarnation > held_inc or any(held.get(x, -1) < inc and self._wanted_accusation(x, inc)
                                         for x, inc in suspects.items()):
            self.news += 1  # a refutation (or a restart), or an accusation still short of K: pushed on at once
        if suspects != held:  # (a heartbeat with the same list moves no deadline earlier)
            self._quiet_until = -math.inf
            t.acc[s] = bool(suspects)
            t.susp[s] = suspects or _NO_SUSPECTS
        refuted = incarnation > held_inc
        if incarnation < held_inc and self.adopt_suspicions:
            # restarted from an older incarnation file: its word wins, or it could not refute (accused)
            t.inc[s] = incarnation
            refuted = True
            self.news += 1
        st = t.state[s]
        if refuted:
            self._quiet_until = -math.inf
            t.inc[s] = incarnation
            t.up[s] = now
        elif st == DEAD or st == LEFT:
            t.up[s] = now
        events: list[StateChanged] = []
        if leaving:
            if st != LEFT:
                events.append(self._transition(node_id, "leave", now))
        elif st == SUSPECT and self.adopt_suspicions and not refuted:
            pass  # SWIM: a version of the suspected incarnation may predate the suspicion; only a refutation ends it
        elif st != ALIVE:
            events.append(self._transition(node_id, "heard", now))
        if t.state[s] == ALIVE and suspects and self.adopt_suspicions:
            events.extend(self._adopt(node_id, suspects, now))
        return events

    def heard_many(self, node_ids: list[str], versions: list[int], incarnations: list[int], leaving: list[bool],
                   suspects: list[dict[str, int]], now: float) -> list[StateChanged]:
        """:meth:`observe` of each ``(node_ids[i], versions[i], ...)`` in turn, all at ``now``; the same effects
        and events, in order. A plain heartbeat (a member alive here at that incarnation, not leaving, listing the same
        suspects as the version held, none of them us, nothing to adopt) only takes a newer version and the time,
        without a call: the simulator delivers about 100 of those per node per round."""
        t = self._t
        state, inc, ver, heard, susp = t.state, t.inc, t.version, t.heard, t.susp
        get, me, acc = t.index.slots.get, self.self_id, t.acc
        events: list[StateChanged] = []
        for node_id, v, i, gone, sus in zip(node_ids, versions, incarnations, leaving, suspects):
            s = get(node_id, -1)
            if (0 <= s < len(state) and state[s] == ALIVE and i == inc[s] and not gone and node_id != me
                    and (not sus or (not self.adopt_suspicions and me not in sus))):
                if v <= ver[s]:
                    continue
                ver[s] = v  # a heartbeat: a newer version and the time, no transition, nothing to adopt
                heard[s] = now
                held = susp[s]
                if sus is held or sus == held:
                    continue
                # a new suspect list: as observe (news before the list is taken; a changed list ends a rest)
                if any(held.get(x, -1) < xi and self._wanted_accusation(x, xi) for x, xi in sus.items()):
                    self.news += 1
                self._quiet_until = -math.inf
                acc[s] = bool(sus)
                susp[s] = sus or _NO_SUSPECTS
                continue
            events += self.observe(node_id, version=v, incarnation=i, leaving=gone, suspects=sus, now=now)
        return events

    def met(self, node_ids: list[str], version: int, incarnation: int, now: float) -> None:
        """Members heard of for the first time, all at ``now``, each at ``version`` and ``incarnation``, alive and
        listing no suspects: the state :meth:`observe` of each in turn leaves (without its events). For a node
        that starts knowing a converged cluster (the simulator's start: N members per node, N² in all, written
        here by columns). Raises ``ValueError`` for this node or a member already held."""
        t = self._t
        slots = [t.index.slot(x) for x in node_ids]
        if self.self_id in node_ids or any(t.slot_of(x) >= 0 for x in node_ids):
            raise ValueError("met: this node or a member already held")
        t.add_many(slots, ALIVE, incarnation, version, now)
        self._not_left += len(slots)
        if slots:
            self._quiet_until = -math.inf
            self.changes += len(slots)

    def _wanted_accusation(self, target: str, incarnation: int) -> bool:
        """Whether an accusation of ``target`` at ``incarnation``, new from its accuser, is news worth pushing on:
        it names a live member's current incarnation, and fewer than ``1 + K`` alive members accuse it so far (the
        first accuser and :func:`expected_confirmations`; memberlist's ``suspicion.Confirm`` stops re-broadcasting
        at K confirmations). Reads the members that list suspects; it runs only for accusations new to this node."""
        t = self._t
        state, susp, slots = t.state, t.susp, t.index.slots
        ts = slots.get(target, -1)
        if not 0 <= ts < len(state) or not ALIVE <= state[ts] <= SUSPECT or incarnation < t.inc[ts]:
            return False
        wanted = 1 + expected_confirmations(1 + self._not_left, self.cfg)
        held, target_inc = 0, t.inc[ts]
        for s in t.accusers():
            if state[s] == ALIVE and susp[s].get(target, -1) >= target_inc:
                held += 1
                if held >= wanted:
                    return False
        return True

    def accused(self, incarnation: int) -> bool:
        """Another member accuses *this* node at ``incarnation`` (in its snapshot, or in a probe that says it
        suspects us). An accusation of our current incarnation or above is refuted: our incarnation becomes
        ``incarnation + 1`` and ``refute_needed`` is set. Returns True when our incarnation rose."""
        if incarnation < self.incarnation:
            return False
        if incarnation > min(self.incarnation + MAX_INCARNATION_STEP, INCARNATION_CEILING):
            # Nobody can have seen an incarnation this far above ours (it only grows from our own
            # snapshots): a forged or broken accusation. Refuting it would push our persisted counter
            # toward the wire bound, so it is ignored and counted.
            self.implausible_suspicions += 1
            return False
        self.incarnation = incarnation + 1
        self.refute_needed = True
        self.news += 1
        return True

    def _adopt(self, accuser: str, suspects: dict[str, int], now: float) -> list[StateChanged]:
        """SWIM mode: the alive ``accuser`` suspects ``suspects``; each alive member it accuses at its current
        incarnation (or above) becomes suspect here too (not accused by us: the accuser is the first confirmer)."""
        if not self.adopt_suspicions or not suspects:
            return []
        events = []
        t = self._t
        for target, inc in suspects.items():
            s = t.slot_of(target)
            if s >= 0 and t.state[s] == ALIVE and target != accuser and inc >= t.inc[s]:
                events.append(self._transition(target, "suspected", now))
        return events

    def probe_failed(self, node_id: str, incarnation: int, now: float) -> list[StateChanged]:
        """This node's probe of ``node_id`` (at the ``incarnation`` it knew) got no ack, direct or indirect, by
        the end of its interval: this node accuses it (listed in our snapshot; a confirmation to others). An
        alive member becomes suspect; an accusation of an older incarnation than the one now held is void."""
        t = self._t
        s = t.slot_of(node_id)
        if s < 0 or incarnation < t.inc[s] or t.state[s] not in (ALIVE, SUSPECT):
            return []
        self._quiet_until = -math.inf
        events = [self._transition(node_id, "suspected", now)] if t.state[s] == ALIVE else []
        if node_id not in self._accusing:
            self._accusing.add(node_id)
            self.news += 1
        return events

    def acked(self, node_id: str, incarnation: int, now: float) -> list[StateChanged]:
        """A probe of ``node_id`` was acknowledged at ``now`` (directly, or by a relay), the ack saying its
        incarnation is ``incarnation``. A sign of life (holds off the silence timer), but not the end of our
        accusation (a relay's ping does not tell the member it is suspected, and only its refutation ends the
        suspicion); an incarnation above the one held refutes (suspect -> alive), by at most
        :data:`MAX_INCARNATION_STEP` (a higher claim is counted in ``implausible_suspicions`` and ignored).
        A dead or left member is not revived by an ack (only by its signed snapshot)."""
        t = self._t
        s = t.slot_of(node_id)
        if s < 0 or t.state[s] not in (ALIVE, SUSPECT):
            return []
        if incarnation > min(t.inc[s] + MAX_INCARNATION_STEP, INCARNATION_CEILING):
            self.implausible_suspicions += 1
            return []
        t.acked[s] = max(t.acked[s], now)
        self._quiet_until = -math.inf
        if incarnation <= t.inc[s]:
            return []
        t.inc[s] = incarnation
        t.up[s] = now
        return [self._transition(node_id, "heard", now)] if t.state[s] == SUSPECT else []

    # -- time ------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """N for the timeout formulas: members not left, this node included."""
        return 1 + self._not_left

    def quiet_since(self, heard_after: float) -> bool:
        """Whether no member is suspect and every alive member was heard (a new version, or a probe ack) at or
        after ``heard_after`` (monotonic seconds): what :func:`p2pnode.gossip.quiet_round` asks every round, read
        from the columns without building a :class:`Member` per member."""
        return not self._suspect and alive_heard_since(self._t, heard_after)

    def confirmations(self, node_id: str) -> int:
        """Alive members other than us and ``node_id`` whose snapshot suspects ``node_id``'s current incarnation."""
        t = self._t
        ts = t.slot_of(node_id)
        if ts < 0:
            return 0
        target_inc = t.inc[ts]
        return sum(1 for s in t.accusers()
                   if s != ts and t.state[s] == ALIVE and t.susp[s].get(node_id, -1) >= target_inc)

    def confirmation_counts(self, cap: int | None = None) -> dict[str, int]:
        """:meth:`confirmations` of every *suspect* member at once (what the timers need), in one pass over the
        alive members that list suspects: each costs ``min(len(its suspects), number of suspects)``, so thousands
        of members (or a member listing thousands of suspects) never make a tick quadratic. ``cap``: counts stop
        there, and the pass ends once every suspect reached it (the timers read no more than K + 1, see
        :meth:`_timer_cap`)."""
        return confirmation_counts(self._t, self._suspect, cap)

    def _timer_cap(self, n: int) -> int:
        """The most :meth:`confirmation_counts` the timers can tell apart in a cluster of ``n``: K + 1 (one
        accuser is the suspicion's originator, and :func:`suspicion_timeout_s` reads at most K confirmations)."""
        return expected_confirmations(n, self.cfg) + 1

    def _confirmed(self, node_id: str, counts: dict[str, int]) -> int:
        """Confirmations of a suspicion: the distinct accusers (members listing it, and us when we accuse it)
        less the first (memberlist counts the suspicion's originator in its set, not in ``n``)."""
        return max(0, counts.get(node_id, 0) - (0 if node_id in self._accusing else 1))

    def deadline_of(self, m: Member, n: int, counts: dict[str, int] | None = None) -> float | None:
        """When ``m`` next changes state by time alone (``None``: only by news). ``counts``: a precomputed
        :meth:`confirmation_counts` (computed here when not given)."""
        if m.state is _A:
            return max(m.last_heard_at, m.last_acked_at) + suspect_after_s(n, self.cfg)
        if m.state is _S:
            if counts is None:
                counts = self.confirmation_counts(self._timer_cap(n))
            c = self._confirmed(m.node_id, counts)
            return m.state_since + suspicion_timeout_s(n, c, self.cfg)
        if m.state is _D:
            return m.state_since + self.cfg.reconnect_window_s
        return m.state_since + self.cfg.left_retention_s

    def tick(self, now: float) -> list[StateChanged]:
        """Apply every timeout due at ``now``: alive -> suspect -> dead, and reap old dead and left members.

        Same rules as :meth:`deadline_of`, with the size-dependent thresholds computed once per call (this runs
        for every member of every node in the simulator). A tick that finds nothing due notes the earliest
        deadline it saw, and until then (while nothing moved a deadline earlier) the next ticks return at once."""
        self._now = max(self._now, now)
        if now < self._quiet_until:
            return []
        n = self.size
        cfg = self.cfg
        silent_for = suspect_after_s(n, cfg)
        reconnect, retention = cfg.reconnect_window_s, cfg.left_retention_s
        counts = self.confirmation_counts(self._timer_cap(n))
        t = self._t
        ids, since = t.index.ids, t.since
        due_slots, earliest = scan(  # earliest: of (deadline - now) over the members not due
            t, now, silent_for, reconnect, retention,
            lambda s: since[s] + suspicion_timeout_s(n, self._confirmed(ids[s], counts), cfg) - now)
        due = [(ids[s], "reap" if t.state[s] == DEAD or t.state[s] == LEFT else "timeout") for s in due_slots]
        if not due:
            # Quiet until the earliest deadline, less a margin far above float rounding (so never past it).
            self._quiet_until = now + earliest - 1e-6
        events = []
        for node_id, event in due:
            events.append(self._transition(node_id, event, now))
            if events[-1].new is _S:
                self._accusing.add(node_id)  # our own silence timer: our accusation
                self.news += 1
        return events

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`tick` would change something (``None`` when nothing is timed)."""
        n = self.size
        counts = self.confirmation_counts(self._timer_cap(n))
        deadlines = [d for m in self.members.values() if (d := self.deadline_of(m, n, counts)) is not None]
        return min(deadlines, default=None)

    # -- outputs ---------------------------------------------------------------------------------
    def suspects(self) -> dict[str, int]:
        """``{node_id: incarnation}`` of the members this node accuses (suspect by its own failed probe or silence
        timer; not those it only heard accused), for its own snapshot; and those it accused and has since declared
        dead, for the longest suspicion timeout after (memberlist keeps a suspicion's confirmers in a set that only
        grows: a confirmer that reached its verdict first must not slow the others down to the unconfirmed
        timeout, which made a 2 | 3 partition's majority take 21-29 s to agree the leader dead). In the members'
        order."""
        own = self._accusing
        if not own and not self._condemned:
            return {}
        t = self._t
        ids = t.index.ids
        mine = sorted((s for x in own if (s := t.slot_of(x)) >= 0), key=t.seq.__getitem__)
        out = {ids[s]: t.inc[s] for s in mine if t.state[s] == SUSPECT}
        if self._condemned:  # accused, then dead here: still a confirmation while others' timers may run
            window = suspicion_timeout_s(self.size, 0, self.cfg)
            for node_id in list(self._condemned):
                s = t.slot_of(node_id)
                if s < 0 or t.state[s] != DEAD or self._now - t.since[s] >= window:
                    self._condemned.discard(node_id)
                else:
                    out[node_id] = t.inc[s]
        return out

    def take_refute(self) -> bool:
        """True once after this node was accused: the driver must publish a snapshot now (refutation)."""
        needed, self.refute_needed = self.refute_needed, False
        if needed:
            self.false_suspicions_refuted += 1
        return needed

    def state_of(self, node_id: str) -> MemberState | None:
        """The state of ``node_id`` (``ALIVE`` for this node itself); ``None`` for a node never heard of, or reaped."""
        if node_id == self.self_id:
            return _A
        s = self._t.slot_of(node_id)
        return STATES[self._t.state[s]] if s >= 0 else None

    def live_ids(self) -> set[str]:
        """Members alive or suspect, and this node."""
        t = self._t
        ids, state = t.index.ids, t.state
        return {self.self_id} | {ids[s] for s in t.slots() if state[s] == ALIVE or state[s] == SUSPECT}
