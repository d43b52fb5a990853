"""Prober: SWIM failure detection (liveness apart from state), as hashicorp/memberlist ``state.go`` does it. Pure.

Every probe interval this node probes one member, round-robin over a shuffled list of the alive and suspect
members (reshuffled at the end of each pass; a member new to the list is inserted at a random position, as
memberlist's ``aliveNode`` does):

1. :class:`SendPing` to the target (``seq``, the incarnation we hold, and whether we suspect it, so that it can
   refute at once). An :class:`Ack` from the target, carrying its incarnation, ends the probe.
2. No ack within ``probe_timeout_s``: :class:`SendPingReq` to ``indirect_checks`` random alive members, naming the
   target by node id, and the same ping again over the stream transport (``SendPing(fallback=True)``: memberlist's
   TCP fallback) (the relay pings the address of the target's *signed snapshot*, never one from a request).
   A relay answers with an ack of the target (its incarnation), or a :class:`Nack` when the target did not answer
   it within ``probe_timeout_s``.
3. No ack, direct or relayed, by the end of the interval: :meth:`Membership.probe_failed` (this node accuses the
   target; the one module that owns member states makes it suspect, and the suspicion timer of
   :func:`p2pnode.gossip._membership.suspicion_timeout_s` makes it dead).

**Local health** (Lifeguard's awareness, memberlist ``awareness.go``): a score in ``[0, awareness_max_multiplier
− 1]``; a probe acked lowers it by 1; a failed probe raises it by the number of nacks missing from the relays
(by 1 when no relay was asked), and a ping telling us we are suspected raises it by 1. The probe interval is
scaled by ``score + 1`` (a node that misses acks itself slows down before accusing others); the probe timeout is
not, as in memberlist ("we don't really expect waiting longer to help get UDP through").

**Terms** (Raft's rule that every message carries its sender's term, and a higher one moves the receiver's at
once): every ping and ack this node sends carries :attr:`Prober.term` (the highest election term it has seen, set by
its owner), and an authenticated ping or ack carrying a higher term is handed to :attr:`Prober.on_term` before
anything else is done with it. A voter back from a stall thus learns of the terms elected meanwhile from the
very acks that renew its lease, before the renewal can let it act on the term it led (a lease renewed by a quorum
of acks hears every term a quorum elected before them: two majorities meet).

**Direct acks** (issue 42's lease): a probe or a lease ping (:meth:`Prober.ping`, sent when the driver's lease
asks) answered by its target itself, not through a relay, is also a :class:`DirectAck` naming the target and when the
ping was *sent*, kept (with :attr:`Prober.keep_direct_acks` on, at most :data:`MAX_DIRECT_ACKS`) for the driver to take
(:meth:`Prober.take_direct_acks`); the node's lease (:class:`p2pnode.node._lease.Lease`) renews from those only. An ack
carrying a term above the one this node adopted (refused by its election: too far above, or not a voter's) renews
nothing.

Effects out: :class:`SendPing`, :class:`SendPingReq`, :class:`SendAck`, :class:`SendNack` (addressed by node id:
the driver resolves the address from the member's signed snapshot) and the state changes
(:class:`~p2pnode.gossip._membership.StateChanged`: suspect, alive) that :class:`Membership` made; dead comes from
``Membership.tick`` (the suspicion timer), which the driver already runs. ``now`` is monotonic seconds passed in.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

from ._membership import Membership, MemberState, StateChanged

__all__ = [
    "Ack",
    "DirectAck",
    "Nack",
    "Ping",
    "PingReq",
    "ProbeConfig",
    "Prober",
    "SendAck",
    "SendNack",
    "SendPing",
    "SendPingReq",
]

_A, _S = MemberState.ALIVE, MemberState.SUSPECT


class ProbeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """SWIM probe parameters (memberlist ``DefaultLANConfig``: ProbeInterval 1 s, ProbeTimeout 500 ms,
    IndirectChecks 3, AwarenessMaxMultiplier 8). ``probe_interval_s``: one member probed per interval (shorter =
    faster detection, more packets); ``probe_timeout_s``: wait for a direct ack before asking relays (above the
    network's round trip); ``indirect_checks``: relays asked (more = fewer false suspicions from one lossy
    path); ``awareness_max_multiplier``: the most the local-health score may stretch the interval;
    ``max_relays``: ping-reqs this node serves at once (more are refused and counted)."""

    probe_interval_s: float = 1.0
    probe_timeout_s: float = 0.5
    indirect_checks: int = 3
    awareness_max_multiplier: int = 8
    max_relays: int = 64


# -- messages (decoded and authenticated by p2pnode.gossip._probewire) ------------------------------------------
class Ping(msgspec.Struct, frozen=True):
    """``sender`` asks ``to`` for an ack. ``incarnation``: the one the sender holds for ``to``; ``suspected``: the
    sender suspects ``to`` (who refutes if ``incarnation`` is its current one)."""

    seq: int
    sender: str
    to: str
    incarnation: int
    suspected: bool = False
    term: int = 0
    """The sender's highest election term (:attr:`Prober.term`; 0: not said, an older agent)."""


class PingReq(msgspec.Struct, frozen=True):
    """``sender`` asks the relay ``to`` to ping ``target`` (a node id; never an address) and relay the ack."""

    seq: int
    sender: str
    to: str
    target: str
    incarnation: int


class Ack(msgspec.Struct, frozen=True):
    """``sender`` tells ``to`` that ``node`` (``None``: the sender itself) answered probe ``seq``, at
    ``incarnation``; ``term``: the sender's highest election term (0: not said)."""

    seq: int
    sender: str
    to: str
    incarnation: int
    node: str | None = None
    term: int = 0


class Nack(msgspec.Struct, frozen=True):
    """The relay ``sender`` tells ``to`` that the target of ping-req ``seq`` did not answer it in time."""

    seq: int
    sender: str
    to: str


ProbeMessage = Ping | PingReq | Ack | Nack


# -- effects -----------------------------------------------------------------------------------------------------
class SendPing(msgspec.Struct, frozen=True):
    """Send a :class:`Ping` to member ``msg.to`` (address: its signed snapshot's). ``fallback``: send it over the
    stream transport (HTTP), as memberlist's TCP ping alongside the ping-reqs, for a member whose datagrams are
    dropped on the way (some marketplaces map TCP only); its ack counts like a direct one."""

    msg: Ping
    fallback: bool = False


class SendPingReq(msgspec.Struct, frozen=True):
    """Send a :class:`PingReq` to the relay ``msg.to``."""

    msg: PingReq


class SendAck(msgspec.Struct, frozen=True):
    """Send an :class:`Ack` to ``msg.to`` (no larger than the request it answers: the wire codec checks)."""

    msg: Ack


class SendNack(msgspec.Struct, frozen=True):
    """Send a :class:`Nack` to ``msg.to``."""

    msg: Nack


class DirectAck(msgspec.Struct, frozen=True):
    """``node`` itself acked a ping of ours sent at ``sent_at`` (monotonic seconds): a renewal for the lease."""

    node: str
    sent_at: float


Effect = SendPing | SendPingReq | SendAck | SendNack | StateChanged

MAX_LEASE_PINGS = 1024
"""Lease pings awaiting their ack (the oldest is forgotten past this: a ping that old is not answered)."""
MAX_DIRECT_ACKS = 1024
"""Direct acks kept for the driver to take (the oldest dropped past this)."""


class _Probe(msgspec.Struct):
    target: str
    seq: int
    incarnation: int
    started_at: float
    timeout_at: float
    deadline: float
    relays: list[str] = msgspec.field(default_factory=list)
    nacks: int = 0
    indirect: bool = False
    fallback_seq: int = -1


class _Relay(msgspec.Struct):
    requester: str
    requester_seq: int
    target: str
    timeout_at: float


class Prober:
    """The SWIM probe loop of one node (see module docstring) over ``membership`` (which must have been built
    with ``adopt_suspicions=True``: suspicion spreads by accusations, as memberlist's suspect messages do).

    Call :meth:`tick` at :meth:`next_deadline` and feed every authenticated inbound message to :meth:`receive`.
    ``first_seq``: where sequence numbers start; the agent passes its wall clock in microseconds, so a restarted
    node never repeats a seq its last run used within the receivers' replay window (those would be refused).
    Counters: ``probes``, ``probes_failed``, ``acks`` (probes acked, directly or relayed), ``indirect_probes``,
    ``unexpected`` (acks and nacks that match no probe of ours: late, or not from whom we asked), ``relays_refused``
    (ping-reqs beyond ``max_relays``, or for a target we do not hold).
    """

    def __init__(self, membership: Membership, cfg: ProbeConfig | None = None, *, rng: random.Random,
                 first_seq: int = 0) -> None:
        self.membership = membership
        self.cfg = cfg or ProbeConfig()
        self.rng = rng
        self.self_id = membership.self_id
        self.score = 0
        """Local-health score (Lifeguard awareness): 0 healthy .. ``awareness_max_multiplier − 1``."""
        self._seq = first_seq
        self._order: list[str] = []
        self._listed: set[str] = set()
        self._index = 0
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._pings: dict[int, tuple[str, float]] = {}  # lease pings: seq -> (target, sent at)
        self.reachable: Callable[[str], bool] | None = None
        """Whether this node can address a member's probes (the driver: its signed snapshot's address passes the
        dial policy). A member it cannot is never probed, so never suspected for that (a DNS name or a loopback
        address advertised, a snapshot not yet held): the silence timer alone watches it. None: every member."""
        self.keep_direct_acks = False
        """Keep each :class:`DirectAck` for :meth:`take_direct_acks` (the driver turns it on when it keeps a lease)."""
        self._direct: list[DirectAck] = []
        self._next_probe_at: float | None = None
        self.term = 0
        """The highest election term this node has seen (its owner keeps it current): carried in every ping and
        ack it sends."""
        self.on_term: Callable[[str, int], None] | None = None
        """Called with ``(sender, term)`` for an authenticated ping or ack carrying a term above :attr:`term`,
        before the message is handled (the owner's election decides whether to believe it)."""
        self.probes = 0
        self.probes_failed = 0
        self.acks = 0
        self.indirect_probes = 0
        self.unexpected = 0
        self.relays_refused = 0
        self.acks_unadopted = 0

    # -- helpers ---------------------------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _probeable(self, node_id: str) -> bool:
        m = self.membership.members.get(node_id)
        return m is not None and m.state in (_A, _S) and (self.reachable is None or self.reachable(node_id))

    def _sync_order(self) -> None:
        """Insert members new to the list at random positions (memberlist ``aliveNode``); reaped ones go when a
        pass ends."""
        members = self.membership.members
        if len(members) == len(self._listed) and all(n in members for n in self._listed):
            return
        for node_id in members:
            if node_id not in self._listed:
                pos = self.rng.randint(0, len(self._order))
                self._order.insert(pos, node_id)
                self._listed.add(node_id)
                if pos < self._index:
                    self._index += 1

    def _reshuffle(self) -> None:
        self._order = [n for n in self._order if n in self.membership.members]
        self._listed = set(self._order)
        self.rng.shuffle(self._order)
        self._index = 0

    def _pick(self) -> str | None:
        """The next probeable member, round-robin (memberlist ``probe``: skip dead, left and ourselves)."""
        self._sync_order()
        for _ in range(2):
            while self._index < len(self._order):
                node_id = self._order[self._index]
                self._index += 1
                if self._probeable(node_id):
                    return node_id
            self._reshuffle()
            self._sync_order()
        return None

    def interval_s(self) -> float:
        """The probe interval scaled by local health: ``probe_interval_s × (score + 1)``."""
        return self.cfg.probe_interval_s * (self.score + 1)

    def _apply_awareness(self, delta: int) -> None:
        self.score = min(max(0, self.score + delta), self.cfg.awareness_max_multiplier - 1)

    # -- time ------------------------------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do (``None`` before the first :meth:`tick`)."""
        times = [r.timeout_at for r in self._relays.values()]
        p = self._probe
        if p is not None:
            times.append(p.deadline if p.indirect else p.timeout_at)
        elif self._next_probe_at is not None:
            times.append(self._next_probe_at)
        return min(times, default=None)

    def tick(self, now: float) -> list[Effect]:
        """Do what is due at ``now``: nacks for relays that timed out, ping-reqs for a direct probe that timed
        out, the verdict on a probe whose interval ended, and the next probe."""
        out: list[Effect] = []
        for seq in [s for s, r in self._relays.items() if now >= r.timeout_at]:
            r = self._relays.pop(seq)
            out.append(SendNack(Nack(r.requester_seq, self.self_id, r.requester)))
        p = self._probe
        if p is not None and not p.indirect and now >= p.timeout_at:
            out.extend(self._go_indirect(p))
        if p is not None and p.indirect and now >= p.deadline:
            out.extend(self._fail(p, now))
        if self._probe is None and (self._next_probe_at is None or now >= self._next_probe_at):
            out.extend(self._start(now))
        return out

    def _start(self, now: float) -> list[Effect]:
        target = self._pick()
        if target is None:
            self._next_probe_at = now + self.cfg.probe_interval_s
            return []
        m = self.membership.members[target]
        interval = self.interval_s()
        p = _Probe(target, self._next_seq(), m.incarnation, now, now + self.cfg.probe_timeout_s, now + interval)
        self._probe = p
        self._next_probe_at = now + interval
        self.probes += 1
        return [SendPing(Ping(p.seq, self.self_id, target, m.incarnation, m.state is _S, self.term))]

    def _go_indirect(self, p: _Probe) -> list[Effect]:
        """memberlist ``kRandomNodes``: up to ``indirect_checks`` alive members other than us and the target."""
        p.indirect = True
        candidates = [n for n, m in self.membership.members.items() if m.state is _A and n != p.target]
        k = min(self.cfg.indirect_checks, len(candidates))
        p.relays = self.rng.sample(candidates, k) if k else []
        if p.relays:
            self.indirect_probes += 1
        m = self.membership.members.get(p.target)
        p.fallback_seq = self._next_seq()  # its own seq: the datagram ping may have arrived (only its ack was lost)
        out: list[Effect] = [SendPing(Ping(p.fallback_seq, self.self_id, p.target, p.incarnation,
                                           m is not None and m.state is _S, self.term), fallback=True)]
        return out + [SendPingReq(PingReq(p.seq, self.self_id, r, p.target, p.incarnation)) for r in p.relays]

    def _fail(self, p: _Probe, now: float) -> list[Effect]:
        self._probe = None
        self.probes_failed += 1
        expected = len(p.relays)
        self._apply_awareness(expected - min(p.nacks, expected) if expected else 1)
        self._next_probe_at = p.deadline  # memberlist's ticker: the next probe as soon as this interval ends
        return list(self.membership.probe_failed(p.target, p.incarnation, now))

    # -- inbound ---------------------------------------------------------------------------------------------
    def receive(self, msg: Ping | PingReq | Ack | Nack, now: float) -> list[Effect]:
        """An authenticated message addressed to us (the codec checked its MAC, receiver, freshness and rate).
        Returns the effects: an ack to a ping, a ping to a relay's target, a relayed ack, state changes. A higher
        term it carries goes to :attr:`on_term` first."""
        if isinstance(msg, Ping | Ack) and msg.term > self.term and self.on_term is not None:
            self.on_term(msg.sender, msg.term)
        if isinstance(msg, Ping):
            return self._on_ping(msg)
        if isinstance(msg, PingReq):
            return self._on_ping_req(msg, now)
        if isinstance(msg, Ack):
            return self._on_ack(msg, now)
        return self._on_nack(msg)

    def _on_ping(self, msg: Ping) -> list[Effect]:
        if msg.suspected and self.membership.accused(msg.incarnation):
            # refute at once (the ack carries the new incarnation); being suspected is a sign that we may be the
            # slow one, so local health worsens (memberlist ``refute``: awareness.ApplyDelta(1))
            self._apply_awareness(1)
        return [SendAck(Ack(msg.seq, self.self_id, msg.sender, self.membership.incarnation, term=self.term))]

    def _on_ping_req(self, msg: PingReq, now: float) -> list[Effect]:
        target = self.membership.members.get(msg.target)
        if target is None or target.state not in (_A, _S) or msg.target == msg.sender \
                or len(self._relays) >= self.cfg.max_relays:
            self.relays_refused += 1
            return [SendNack(Nack(msg.seq, self.self_id, msg.sender))]
        seq = self._next_seq()
        self._relays[seq] = _Relay(msg.sender, msg.seq, msg.target, now + self.cfg.probe_timeout_s)
        return [SendPing(Ping(seq, self.self_id, msg.target, max(msg.incarnation, target.incarnation), term=self.term))]

    def _direct_ack(self, ack: Ack, sent_at: float) -> None:
        """Keep ``ack`` (its sender's own) as a :class:`DirectAck`, unless it carries a term this node did not adopt
        (:attr:`on_term` refused it: implausible, or not a voter's): an ack of a term this node does not hold must
        renew no lease, or a node back from a stall longer than the bound on a term's step would renew its lease
        while still leading its old term. Such acks are counted in :attr:`acks_unadopted`."""
        if ack.term > self.term and self.on_term is not None:
            self.acks_unadopted += 1
            return
        if self.keep_direct_acks:
            self._direct.append(DirectAck(ack.sender, sent_at))
            del self._direct[:-MAX_DIRECT_ACKS]

    def take_direct_acks(self) -> list[DirectAck]:
        """The direct acks since the last call, oldest first (see module docstring)."""
        out, self._direct = self._direct, []
        return out

    def ping(self, target: str, now: float, *, fallback: bool = False) -> list[Effect]:
        """A ping to ``target`` outside the round-robin (the lease's renewal of a voter; ``fallback``: over the
        stream transport): its ack from ``target`` itself is a :class:`DirectAck` (and a sign of life); no ack
        changes nothing (the probes judge liveness)."""
        m = self.membership.members.get(target)
        if m is None or target == self.self_id:
            return []
        seq = self._next_seq()
        self._pings[seq] = (target, now)
        while len(self._pings) > MAX_LEASE_PINGS:
            del self._pings[next(iter(self._pings))]
        return [SendPing(Ping(seq, self.self_id, target, m.incarnation, m.state is _S, self.term), fallback=fallback)]

    def _on_ack(self, msg: Ack, now: float) -> list[Effect]:
        about = msg.node or msg.sender
        pinged = self._pings.get(msg.seq)
        if pinged is not None and msg.node is None and msg.sender == pinged[0]:
            del self._pings[msg.seq]
            self._direct_ack(msg, pinged[1])
            return list(self.membership.acked(msg.sender, msg.incarnation, now))
        relay = self._relays.get(msg.seq)
        if relay is not None and msg.node is None and msg.sender == relay.target:
            del self._relays[msg.seq]
            out: list[Effect] = [SendAck(Ack(relay.requester_seq, self.self_id, relay.requester, msg.incarnation,
                                             relay.target, self.term))]
            return out + list(self.membership.acked(relay.target, msg.incarnation, now))
        p = self._probe
        if p is None:
            self.unexpected += 1
            return []
        direct = msg.sender == p.target and msg.node is None and msg.seq in (p.seq, p.fallback_seq)
        relayed = msg.seq == p.seq and about == p.target and msg.sender in p.relays
        if not (direct or relayed):
            self.unexpected += 1
            return []
        self._probe = None
        self.acks += 1
        self._apply_awareness(-1)
        self._next_probe_at = max(p.started_at + self.cfg.probe_interval_s, now)
        # Only the target's own ack (MAC under its pair key) may move its incarnation; a relayed one is a sign of
        # life only, so no relay can raise the incarnation we hold (and void honest accusations).
        inc = msg.incarnation if msg.sender == p.target else p.incarnation
        if direct:
            self._direct_ack(msg, p.started_at)
        return list(self.membership.acked(p.target, inc, now))

    def _on_nack(self, msg: Nack) -> list[Effect]:
        p = self._probe
        if p is None or msg.seq != p.seq or msg.sender not in p.relays:
            self.unexpected += 1
            return []
        p.nacks += 1
        return []
