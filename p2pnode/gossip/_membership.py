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

Transitions (the only ones; any other is a bug and raises ``IllegalTransition``)::

    (new)   --heard-->    alive        alive   --timeout-->  suspect      suspect --timeout--> dead
    suspect --heard-->    alive        dead    --heard-->    alive        left    --heard-->   alive
    alive|suspect|dead --leave--> left                                    dead    --reap-->    (removed)
    left    --reap-->     (removed)

``now`` is monotonic seconds passed in; nothing here reads a clock.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import msgspec

from ..errors import IllegalTransition

__all__ = [
    "IllegalTransition",
    "MAX_INCARNATION_STEP",
    "Member",
    "MemberState",
    "Membership",
    "MembershipConfig",
    "PROFILES",
    "StateChanged",
    "publish_interval_s",
    "suspect_after_s",
    "suspicion_timeout_s",
]

MAX_INCARNATION_STEP = 16
"""An accusation may raise this node's incarnation by at most this much above its current value. Every honest
accusation names an incarnation some peer saw in our own snapshots, so it is never above ours; the slack only
covers an incarnation file restored from an old backup (a node whose accusations we ignore is still alive to
everyone: any new version makes it so). Each step needs a signature check, and those are budgeted (1,000 a second
by default), so a sustained flood moves our persisted counter by at most ~16,000 a second: 2^53 is beyond 17,000
years away."""
INCARNATION_CEILING = 2**50
"""No accusation above this incarnation is refuted, so our own incarnation stays far below the wire bound."""


class MemberState(str, enum.Enum):
    """A member's state as this node sees it; only :meth:`Membership` transitions (the table above) change it."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


_A, _S, _D, _L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
_TRANSITIONS: dict[tuple[MemberState | None, str], MemberState | None] = {
    (None, "heard"): _A,
    (None, "leave"): _L,
    (_A, "timeout"): _S,
    (_S, "timeout"): _D,
    (_S, "heard"): _A,
    (_D, "heard"): _A,
    (_L, "heard"): _A,
    (_A, "leave"): _L,
    (_S, "leave"): _L,
    (_D, "leave"): _L,
    (_D, "reap"): None,
    (_L, "reap"): None,
}


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


def suspicion_timeout_s(n: int, confirmations: int, cfg: MembershipConfig) -> float:
    """Time from suspect to dead, shortened by independent confirmations (Lifeguard, as memberlist computes it):

    ``min = suspicion_mult × log10(max(n, 10)) × gossip_interval_s``, ``max = suspicion_max_timeout_mult × min``,
    ``timeout = max(min, max − (max − min) × log(c + 1) / log(K + 1))`` with ``c`` confirmations and
    ``K = expected_confirmations``.
    """
    lo = cfg.suspicion_mult * _log_n(n) * cfg.gossip_interval_s
    hi = cfg.suspicion_max_timeout_mult * lo
    k = max(1, cfg.expected_confirmations)
    frac = math.log(min(confirmations, k) + 1) / math.log(k + 1)
    return max(lo, hi - (hi - lo) * frac)


class Member(msgspec.Struct):
    """One member as this node sees it. Times are local monotonic seconds."""

    node_id: str
    state: MemberState
    incarnation: int
    version: int
    last_heard_at: float
    state_since: float
    suspects: dict[str, int] = msgspec.field(default_factory=dict)
    """Whom this member's newest snapshot says it suspects: ``{node_id: incarnation}``."""
    up_since: float = 0.0
    """When this node first heard the member's current run: reset by a new incarnation (a restart or a
    refutation) and by a return from dead or left (local monotonic seconds; leader settling uses it)."""


class StateChanged(msgspec.Struct, frozen=True):
    """Event: ``node_id`` went from ``old`` to ``new`` (``None`` = not a member / reaped) at ``at``."""

    node_id: str
    old: MemberState | None
    new: MemberState | None
    at: float


class Membership:
    """Member states as seen by ``self_id`` (see module docstring).

    Feed it with :meth:`observe` for every newly accepted snapshot and call :meth:`tick` regularly (at the
    latest at :meth:`next_deadline`). ``incarnation`` is this node's own; :meth:`observe` raises it when another
    member accuses it (``refute_needed`` is then set, and the driver publishes at once).
    """

    def __init__(self, self_id: str, cfg: MembershipConfig | None = None, *, incarnation: int = 0) -> None:
        self.self_id = self_id
        self.cfg = cfg or MembershipConfig()
        self.incarnation = incarnation
        self.refute_needed = False
        self.members: dict[str, Member] = {}
        self.false_suspicions_refuted = 0
        self.implausible_suspicions = 0

    # -- the one place states change -------------------------------------------------------------
    def _transition(self, node_id: str, event: str, now: float) -> StateChanged:
        m = self.members.get(node_id)
        old = m.state if m else None
        try:
            new = _TRANSITIONS[(old, event)]
        except KeyError:
            raise IllegalTransition(f"{node_id}: {old.value if old else 'new'} --{event}-->") from None
        if new is None:
            del self.members[node_id]
        else:
            assert m is not None
            m.state = new
            m.state_since = now
        return StateChanged(node_id, old, new, now)

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
        """A new snapshot ``version`` of ``node_id`` was accepted at ``now``. Returns the state changes."""
        if node_id == self.self_id:
            return []
        accused = suspects.get(self.self_id)
        if accused is not None and accused >= self.incarnation:
            if accused > min(self.incarnation + MAX_INCARNATION_STEP, INCARNATION_CEILING):
                # Nobody can have seen an incarnation this far above ours (it only grows from our own
                # snapshots): a forged or broken accusation. Refuting it would push our persisted counter
                # toward the wire bound, so it is ignored and counted.
                self.implausible_suspicions += 1
            else:
                self.incarnation = accused + 1
                self.refute_needed = True
        m = self.members.get(node_id)
        if m is None:
            new = _TRANSITIONS[(None, "leave" if leaving else "heard")]
            assert new is not None
            self.members[node_id] = Member(node_id, new, incarnation, version, now, now, dict(suspects), now)
            return [StateChanged(node_id, None, new, now)]
        events: list[StateChanged] = []
        if version <= m.version:
            return []
        m.version = version
        m.last_heard_at = now
        m.suspects = dict(suspects)
        if incarnation > m.incarnation:
            m.incarnation = incarnation
            m.up_since = now
        elif m.state is _D or m.state is _L:
            m.up_since = now
        if leaving:
            if m.state is not _L:
                events.append(self._transition(node_id, "leave", now))
        elif m.state is not _A:
            events.append(self._transition(node_id, "heard", now))
        return events

    # -- time ------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """N for the timeout formulas: members not left, this node included."""
        return 1 + sum(1 for m in self.members.values() if m.state is not _L)

    def confirmations(self, node_id: str) -> int:
        """Alive members other than us and ``node_id`` whose snapshot suspects ``node_id``'s current incarnation."""
        target = self.members.get(node_id)
        if target is None:
            return 0
        return sum(
            1
            for m in self.members.values()
            if m.node_id != node_id and m.state is _A and m.suspects.get(node_id, -1) >= target.incarnation
        )

    def confirmation_counts(self) -> dict[str, int]:
        """:meth:`confirmations` of every *suspect* member at once (what the timers need), in one pass over the
        alive members: each costs ``min(len(its suspects), number of suspects)``, so thousands of members (or a
        member listing thousands of suspects) never make a tick quadratic."""
        suspect = {m.node_id: m.incarnation for m in self.members.values() if m.state is _S}
        counts: dict[str, int] = {}
        if not suspect:
            return counts
        for m in self.members.values():
            if m.state is not _A or not m.suspects:
                continue
            if len(m.suspects) <= len(suspect):
                pairs = ((t, inc) for t, inc in m.suspects.items() if t in suspect)
            else:
                pairs = ((t, m.suspects[t]) for t in suspect if t in m.suspects)
            for t, inc in pairs:
                if t != m.node_id and inc >= suspect[t]:
                    counts[t] = counts.get(t, 0) + 1
        return counts

    def deadline_of(self, m: Member, n: int, counts: dict[str, int] | None = None) -> float | None:
        """When ``m`` next changes state by time alone (``None``: only by news). ``counts``: a precomputed
        :meth:`confirmation_counts` (computed here when not given)."""
        if m.state is _A:
            return m.last_heard_at + suspect_after_s(n, self.cfg)
        if m.state is _S:
            c = (counts if counts is not None else self.confirmation_counts()).get(m.node_id, 0)
            return m.state_since + suspicion_timeout_s(n, c, self.cfg)
        if m.state is _D:
            return m.state_since + self.cfg.reconnect_window_s
        return m.state_since + self.cfg.left_retention_s

    def tick(self, now: float) -> list[StateChanged]:
        """Apply every timeout due at ``now``: alive -> suspect -> dead, and reap old dead and left members.

        Same rules as :meth:`deadline_of`, with the size-dependent thresholds computed once per call (this runs
        for every member of every node in the simulator)."""
        n = self.size
        silent_for = suspect_after_s(n, self.cfg)
        reconnect, retention = self.cfg.reconnect_window_s, self.cfg.left_retention_s
        due: list[tuple[str, str]] = []
        counts = self.confirmation_counts()
        for m in self.members.values():
            st = m.state
            if st is _A:
                if now - m.last_heard_at >= silent_for:
                    due.append((m.node_id, "timeout"))
            elif st is _S:
                if now >= m.state_since + suspicion_timeout_s(n, counts.get(m.node_id, 0), self.cfg):
                    due.append((m.node_id, "timeout"))
            elif now - m.state_since >= (reconnect if st is _D else retention):
                due.append((m.node_id, "reap"))
        return [self._transition(node_id, event, now) for node_id, event in due]

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`tick` would change something (``None`` when nothing is timed)."""
        n = self.size
        counts = self.confirmation_counts()
        deadlines = [d for m in self.members.values() if (d := self.deadline_of(m, n, counts)) is not None]
        return min(deadlines, default=None)

    # -- outputs ---------------------------------------------------------------------------------
    def suspects(self) -> dict[str, int]:
        """``{node_id: incarnation}`` of the members this node suspects, for its own snapshot."""
        return {m.node_id: m.incarnation for m in self.members.values() if m.state is _S}

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
        m = self.members.get(node_id)
        return m.state if m else None

    def live_ids(self) -> set[str]:
        """Members alive or suspect, and this node."""
        return {self.self_id} | {m.node_id for m in self.members.values() if m.state in (_A, _S)}
