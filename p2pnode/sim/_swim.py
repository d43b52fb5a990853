"""SWIM detection on a virtual clock: real :class:`~p2pnode.gossip._probe.Prober` and
:class:`~p2pnode.gossip._membership.Membership` cores per node, a seeded in-memory packet network (latency, loss,
blocked links, killed nodes) and a model of the snapshot layer.

Probe packets are delivered as the cores' own messages, or (``codec=True``) sealed and opened by each node's real
:class:`~p2pnode.gossip._probewire.ProbeCodec` with its own Ed25519 identity; ``loss`` drops datagrams
only (the stream fallback, TCP, retransmits within the probe's deadline); ``blocked`` links drop both; nodes in
``datagrams_blocked`` get no datagrams at all. Time jumps from one deadline to the next (a heap of events).

Snapshots: a node publishes ``(version, incarnation, suspects)`` every :func:`~p2pnode.gossip.publish_interval_s`
(a heartbeat), and a **news** version when its accusations or incarnation changed, within the agent's core-loop gap
(uniform in ``[0, gossip_interval_s / 4]``, the agent's ``RECONCILE_GAP_PER_INTERVAL``). Heartbeats are modelled:
every running node observes one ``spread_s`` later (the push-pull's O(log N) rounds). News versions travel as the
driver moves them: every node, every ``gossip_interval_s`` (± 10 %), exchanges with ``fanout`` random members
(a killed one does not answer), and each exchange hands over the newer news versions both ways (push-pull: the
initiator's own envelope one latency after the round starts, a pulled one after two, a pushed one after three);
with ``push`` on, each node also pushes its news at once as the agent does (:class:`~p2pnode.gossip.NewsPush`
over :attr:`Membership.news <p2pnode.gossip.Membership.news>`, the same policy object: ``PUSH_ROUNDS`` exchanges
with ``fanout`` random members each, at most one push per ``gossip_interval_s / 5``). ``blocked`` links carry no
exchange. Counted: probe packets and their bytes (the real codec's sizes), exchanges (rounds and pushes), and
snapshot versions accepted (each one Ed25519 verification in the agent).

:func:`detection` kills one node and reports when each survivor marks it suspect and dead, beside memberlist's
end-to-end bound for the same N (:func:`memberlist_bound`).
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from typing import Any

import msgspec

from ..gossip._membership import Membership, MembershipConfig, MemberState, publish_interval_s
from ..gossip._newspush import PUSH_INTERVAL_DIVISOR, NewsPush
from ..gossip._probe import Ack, Nack, Ping, PingReq, ProbeConfig, Prober, SendAck, SendNack, SendPing, SendPingReq
from ..gossip._probewire import ProbeCodec, ProbeKeys
from ..identity import Identity

__all__ = ["MemberlistBound", "SwimCluster", "detection", "memberlist_bound", "memberlist_detection_s"]

RECONCILE_GAP_PER_INTERVAL = 4
"""The agent's core loop reconciles (and publishes news) at most this many times per gossip interval
(``p2pnode.agent.RECONCILE_GAP_PER_INTERVAL``; not imported: the agent is a driver)."""


def memberlist_detection_s(n: int, cfg: MembershipConfig) -> float:
    """memberlist's suspicion timeout with all confirmations (``util.go`` ``suspicionTimeout``):
    ``suspicion_mult × max(1, log10 N) × interval``: the middle part of :func:`memberlist_bound`."""
    return cfg.suspicion_mult * max(1.0, math.log10(max(1, n))) * cfg.gossip_interval_s


class MemberlistBound(msgspec.Struct, frozen=True):
    """memberlist's time from a node's death to its last member marking it dead, by parts (seconds); see
    :func:`memberlist_bound`."""

    first_probe_s: float
    failed_probe_s: float
    suspicion_s: float
    dissemination_rounds: int
    dissemination_s: float
    total_s: float


def memberlist_bound(n: int, *, probe_interval_s: float = 1.0, suspicion_mult: float = 4.0,
                     gossip_interval_s: float = 0.2, gossip_nodes: int = 3) -> MemberlistBound:
    """When every member of hashicorp/memberlist (``DefaultLANConfig``, ``config.go``: ProbeInterval 1 s,
    ProbeTimeout 500 ms, SuspicionMult 4, GossipInterval 200 ms, GossipNodes 3) has marked a killed member dead,
    end to end, counted from the kill (memberlist at commit 1b4c746, July 2026):

    1. **first probe**: each member probes one member per ``ProbeInterval`` (``state.go`` ``probe``, round-robin
       over a shuffled list), so across N − 1 probers the killed one is probed about once an interval: one
       interval on average (SWIM's expected first-detection time; a Poisson wait, not a hard bound).
    2. **failed probe**: the prober suspects it only when the *interval* ends (``state.go`` ``probeNode``:
       ``deadline := sent.Add(probeInterval)``; the 500 ms ProbeTimeout only starts the indirect probes).
    3. **suspicion**: the suspicion timer's minimum, reached once ``k = SuspicionMult − 2`` independent confirmations
       arrive (they do, as the others' probes fail: one a second): ``SuspicionMult × max(1, log10 N) ×
       ProbeInterval`` (``util.go`` ``suspicionTimeout``, ``state.go`` ``suspectNode``, ``suspicion.go``
       ``remainingSuspicionTime``). The first timer to fire belongs to the first accuser.
    4. **dissemination**: its ``dead`` message is then adopted by every member that hears it (``state.go``
       ``deadNode``), broadcast to ``GossipNodes`` random members every ``GossipInterval`` and re-broadcast by each
       (``state.go`` ``gossip``, ``encodeAndBroadcast``; RetransmitMult 4 keeps it going long enough): a push
       epidemic of fanout f reaches all N in about ``log_{f+1} N + ln N / f`` rounds (Pittel 1987; Karp et al.
       2000), rounded up. memberlist also piggybacks broadcasts on probes and acks (two packets a second against
       fifteen gossip packets): left out, which makes the bound looser for us, not tighter.

    ``total_s`` is the sum: 11.0 s at N = 100, 15.6 s at 1,000, 17.0 s at 2,000.
    """
    first = probe_interval_s
    failed = probe_interval_s
    suspicion = suspicion_mult * max(1.0, math.log10(max(1, n))) * probe_interval_s
    f = gossip_nodes
    rounds = math.ceil(math.log(max(n, 2)) / math.log(f + 1) + math.log(max(n, 2)) / f) if f > 0 else 0
    spread = rounds * gossip_interval_s
    return MemberlistBound(first, failed, suspicion, rounds, spread, first + failed + suspicion + spread)


@functools.cache
def _probe_packet_bytes() -> int:
    """Bytes of one sealed ping (the real :class:`ProbeCodec`, two fresh identities, a 10-digit seq and a term):
    every probe packet is counted at this size (an ack is never larger than its request)."""
    a, b = Identity.generate(), Identity.generate()
    pubs = {a.node_id: a.public_key, b.node_id: b.public_key}
    codec = ProbeCodec(ProbeKeys(a.node_id, a.private_key, pubs.get))
    packet = codec.seal(Ping(1_800_000_000, a.node_id, b.node_id, 3, False, 12), 1_800_000_000_000)
    assert packet is not None
    return len(packet)


class _Node(msgspec.Struct):
    node_id: str
    membership: Membership
    prober: Prober
    push: NewsPush
    version: int = 0
    published: tuple[int, dict[str, int]] | None = None
    next_publish_at: float = 0.0
    news_publish_at: float | None = None
    """When the news waiting here is published (the agent's core loop: within its gap); None: none waits."""
    running: bool = True
    wake_gen: int = 0
    membership_due: float = 0.0
    """Cached :meth:`Membership.next_deadline` (never later than the true one: recomputed after every tick,
    observation and prober state change; an early one only costs a wake that finds nothing due)."""


class SwimCluster:
    """``n`` nodes that know each other from the start (see module docstring). ``loss``: each packet is dropped
    with this probability; ``blocked``: directed (sender, receiver) pairs whose packets are dropped (and no
    exchange crosses them); ``fanout``: the gossip rounds' and the pushes' peers; ``push``: news pushed at once
    (:class:`~p2pnode.gossip.NewsPush`), as the agent does; off: news travels by the rounds only (before issue 42's
    fast path)."""

    def __init__(self, n: int, *, seed: int = 0, cfg: MembershipConfig | None = None,
                 probe: ProbeConfig | None = None, latency_s: float = 0.002, loss: float = 0.0,
                 spread_s: float | None = None, codec: bool = False, fanout: int = 3, push: bool = True) -> None:
        self.cfg = cfg or MembershipConfig()
        self.rng = random.Random(seed)
        self.latency_s = latency_s
        self.loss = loss
        self.fanout = fanout
        self.spread_s = spread_s if spread_s is not None else \
            self.cfg.gossip_interval_s * max(1, math.ceil(math.log(max(n, 2), 4)))
        self.blocked: set[tuple[str, str]] = set()
        self.datagrams_blocked: set[str] = set()
        """Nodes whose datagrams (UDP) are dropped both ways; the stream fallback (HTTP) still reaches them."""
        self.now = 0.0
        self._q: list[tuple[float, int, str, Any]] = []
        self._tie = 0
        self.nodes: dict[str, _Node] = {}
        self.events: list[tuple[float, str, str, str | None]] = []  # (at, observer, member, new state)
        self.packets = 0
        self.probe_bytes = 0
        self.exchanges = 0
        self.push_exchanges = 0
        self.verifications = 0
        """Snapshot versions accepted by running nodes (one Ed25519 verification each in the agent)."""
        self._news: dict[str, tuple[int, int, dict[str, int]]] = {}
        """Origins whose newest news version is still spreading: ``(version, incarnation, suspects)``."""
        self._holds: dict[str, dict[str, int]] = {}
        """Per spreading origin: the newest of its versions each node holds (absent: older than the news)."""
        self.codecs: dict[str, ProbeCodec] = {}
        if codec:
            identities = [Identity.generate() for _ in range(n)]
            ids = [ident.node_id for ident in identities]
            pubs = {ident.node_id: ident.public_key for ident in identities}
            for ident in identities:
                keys = ProbeKeys(ident.node_id, ident.private_key, pubs.get)
                self.codecs[ident.node_id] = ProbeCodec(keys, rate_per_s=1e6, burst=1e6)
        else:
            ids = [f"n{i:05d}" for i in range(n)]
        self.ids = ids
        self._packet_bytes = _probe_packet_bytes()
        push_interval = self.cfg.gossip_interval_s / PUSH_INTERVAL_DIVISOR if push else 0.0
        for i, node_id in enumerate(ids):
            m = Membership(node_id, self.cfg, adopt_suspicions=True)
            for other in ids:
                if other != node_id:
                    m.observe(other, version=1, incarnation=0, leaving=False, suspects={}, now=0.0)
            p = Prober(m, probe, rng=random.Random(seed * 1_000_003 + i))
            node = _Node(node_id, m, p, NewsPush(push_interval), version=1)
            node.push.note(m.news)
            node.next_publish_at = self.rng.uniform(0.0, publish_interval_s(n, self.cfg))
            self.nodes[node_id] = node
            node.membership_due = m.next_deadline() or math.inf
            self._push(self.rng.uniform(0.0, (probe or ProbeConfig()).probe_interval_s), "wake", (node_id, 0))
            self._push(self.rng.uniform(0.0, self.cfg.gossip_interval_s), "round", node_id)

    # -- event plumbing ------------------------------------------------------------------------------------------
    def _push(self, at: float, kind: str, payload: Any) -> None:
        self._tie += 1
        heapq.heappush(self._q, (at, self._tie, kind, payload))

    def _schedule(self, node: _Node, *, membership_changed: bool = False) -> None:
        if membership_changed:
            d = node.membership.next_deadline()
            node.membership_due = d if d is not None else math.inf
        times = [node.next_publish_at, node.membership_due]
        push_at = node.push.next_deadline() if node.news_publish_at is None else None  # (after the publication)
        for d in (node.prober.next_deadline(), node.news_publish_at, push_at):
            if d is not None:
                times.append(d)
        node.wake_gen += 1
        self._push(max(self.now, min(times)), "wake", (node.node_id, node.wake_gen))

    def kill(self, node_id: str) -> None:
        """``node_id`` stops: it sends, answers, publishes and gossips nothing from now on."""
        self.nodes[node_id].running = False

    def run_until(self, t: float) -> None:
        """Process every event up to virtual time ``t``."""
        while self._q and self._q[0][0] <= t:
            at, _, kind, payload = heapq.heappop(self._q)
            self.now = at
            if kind == "wake":
                node_id, gen = payload
                node = self.nodes[node_id]
                if node.running and (gen == node.wake_gen or gen == 0):
                    self._wake(node)
            elif kind == "packet":
                self._deliver(payload)
            elif kind == "round":
                self._round(payload)
            elif kind == "news":
                self._news_arrived(*payload)
            else:
                self._observe(payload)
        self.now = t

    # -- nodes ---------------------------------------------------------------------------------------------------
    def _wake(self, node: _Node) -> None:
        now = self.now
        failed = node.prober.probes_failed
        changed = self._act(node, node.prober.tick(now)) or node.prober.probes_failed != failed
        if now >= node.membership_due or changed:  # (a failed probe may add a confirmation without a change)
            self._record(node, node.membership.tick(now))
            changed = True
        self._after(node, changed)

    def _after(self, node: _Node, changed: bool) -> None:
        """What the agent does after any input: publish (heartbeat, or news within the core loop's gap), push
        news when :class:`NewsPush` says so, and sleep until the next deadline."""
        self._maybe_publish(node)
        self._maybe_push(node)
        self._schedule(node, membership_changed=changed)

    def _act(self, node: _Node, effects: list, *, stream: bool = False) -> bool:
        """Send the effects' messages and record their state changes; True when there were state changes."""
        changed = False
        for e in effects:
            if isinstance(e, SendPing | SendPingReq | SendAck | SendNack):
                # a reply to a message that came over the stream goes back on it (the HTTP response)
                via_stream = (isinstance(e, SendPing) and e.fallback) or (stream and isinstance(e, SendAck))
                self._send(node.node_id, e.msg, stream=via_stream)
            else:
                changed = True
                self.events.append((self.now, node.node_id, e.node_id, e.new.value if e.new else None))
        return changed

    def _record(self, node: _Node, changes: list) -> None:
        for c in changes:
            self.events.append((self.now, node.node_id, c.node_id, c.new.value if c.new else None))

    def _maybe_publish(self, node: _Node) -> None:
        m = node.membership
        m.take_refute()
        state = (m.incarnation, m.suspects())
        news = state != node.published
        if news and node.news_publish_at is None:  # the core loop publishes it at its next pass
            node.news_publish_at = self.now + self.rng.uniform(0.0, self.cfg.gossip_interval_s
                                                               / RECONCILE_GAP_PER_INTERVAL)
        due = node.news_publish_at is not None and self.now >= node.news_publish_at
        if not (due or self.now >= node.next_publish_at):
            return
        node.version += 1
        node.published = state
        node.news_publish_at = None
        node.next_publish_at = self.now + publish_interval_s(m.size, self.cfg)
        if news:  # spreads by the exchanges, as the driver moves it
            self._news[node.node_id] = (node.version, state[0], dict(state[1]))
            self._holds[node.node_id] = {node.node_id: node.version}
        else:  # a heartbeat: modelled, observed everywhere spread_s later
            self._push(self.now + self.spread_s, "snapshot", (node.node_id, node.version, state[0], dict(state[1])))

    def _maybe_push(self, node: _Node) -> None:
        node.push.note(node.membership.news)
        if node.push.due(self.now, publishing=node.news_publish_at is not None):
            for peer in self._peers(node.node_id):
                self._exchange(node.node_id, peer)
                self.push_exchanges += 1
            node.push.pushed(self.now)

    # -- the gossip layer (news versions) ------------------------------------------------------------------------
    def _peers(self, node_id: str) -> list[str]:
        out: list[str] = []
        while len(out) < min(self.fanout, len(self.ids) - 1):
            peer = self.ids[self.rng.randrange(len(self.ids))]
            if peer != node_id and peer not in out:
                out.append(peer)
        return out

    def _round(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if not node.running:
            return
        for peer in self._peers(node_id):
            self._exchange(node_id, peer)
        self._push(self.now + self.cfg.gossip_interval_s * self.rng.uniform(0.9, 1.1), "round", node_id)

    def _exchange(self, a: str, b: str) -> None:
        """One push-pull exchange started by ``a`` with ``b``: the newer news versions cross both ways."""
        self.exchanges += 1
        if not self.nodes[b].running or (a, b) in self.blocked or (b, a) in self.blocked:
            return
        lat = self.latency_s
        for origin in self._news:
            held = self._holds[origin]
            va, vb = held.get(a, 0), held.get(b, 0)
            if va > vb:  # in the request when it is a's own envelope, else in the third message (the push)
                self._push(self.now + (lat if origin == a else 3 * lat), "news", (b, origin, va))
            elif vb > va:  # in the reply
                self._push(self.now + 2 * lat, "news", (a, origin, vb))

    def _news_arrived(self, to: str, origin: str, version: int) -> None:
        node = self.nodes[to]
        news = self._news.get(origin)
        held = self._holds.get(origin)
        if not node.running or news is None or held is None or held.get(to, 0) >= version or version != news[0]:
            return
        held[to] = version
        self._observe_one(node, origin, version, news[1], news[2])

    def _observe_one(self, node: _Node, origin: str, version: int, incarnation: int,
                     suspects: dict[str, int]) -> None:
        m = node.membership
        held = m.members.get(origin)
        if held is not None and held.version >= version:
            return
        self.verifications += 1
        news = m.news
        changes = m.observe(origin, version=version, incarnation=incarnation, leaving=False, suspects=suspects,
                            now=self.now)
        if changes or suspects or m.refute_needed or m.news != news:  # accusations move timers; news is pushed
            self._record(node, changes)
            self._after(node, True)

    def _send(self, sender: str, msg: Ping | PingReq | Ack | Nack, *, stream: bool = False) -> None:
        self.packets += 1
        self.probe_bytes += self._packet_bytes
        if (sender, msg.to) in self.blocked:
            return
        # random loss hits datagrams; the stream (TCP) retransmits within the probe's deadline
        if not stream and (sender in self.datagrams_blocked or msg.to in self.datagrams_blocked
                           or (self.loss and self.rng.random() < self.loss)):
            return
        if self.codecs:
            packet = self.codecs[sender].seal(msg, self._wall_ms())
            if packet is None:
                return
            self._push(self.now + self.latency_s, "packet", (msg.to, packet, stream, sender))
            return
        self._push(self.now + self.latency_s, "packet", (msg.to, msg, stream, sender))

    def _wall_ms(self) -> int:
        return 1_800_000_000_000 + int(self.now * 1000)

    def _deliver(self, payload: tuple[str, Any, bool, str]) -> None:
        to, msg, stream, sender = payload
        node = self.nodes[to]
        if not node.running:
            return
        if self.codecs:
            msg = self.codecs[to].open(msg, sender, self.now, self._wall_ms())
            if msg is None:
                return
        changed = self._act(node, node.prober.receive(msg, self.now), stream=stream)
        self._after(node, changed)

    def _observe(self, payload: tuple[str, int, int, dict[str, int]]) -> None:
        origin, version, incarnation, suspects = payload
        held = self._holds.get(origin)
        for node in self.nodes.values():
            if node.running and node.node_id != origin:
                if held is not None:
                    held[node.node_id] = max(held.get(node.node_id, 0), version)
                self._observe_one(node, origin, version, incarnation, suspects)
        news = self._news.get(origin)
        if news is not None and version >= news[0]:  # a later heartbeat reached everyone: the news is spent
            del self._news[origin]
            del self._holds[origin]

    # -- queries -------------------------------------------------------------------------------------------------
    def first(self, member: str, state: str, *, after: float = 0.0) -> dict[str, float]:
        """Per observer: when it first marked ``member`` as ``state`` at or after ``after``."""
        out: dict[str, float] = {}
        for at, observer, m, new in self.events:
            if m == member and new == state and at >= after and observer not in out:
                out[observer] = at
        return out

    def running_ids(self) -> list[str]:
        """Nodes not killed."""
        return [n for n, node in self.nodes.items() if node.running]


def detection(n: int, *, seed: int = 0, loss: float = 0.0, cfg: MembershipConfig | None = None,
              warmup_s: float = 5.0, horizon_s: float | None = None, push: bool = True) -> dict:
    """Kill one node of ``n`` after ``warmup_s`` and report, over the survivors: when the first and the last
    marked it suspect and dead (seconds after the kill), false suspicions and deaths of live nodes (events: one
    per observer), memberlist's end-to-end bound for the same N (``memberlist_formula_s``, its parts in
    ``memberlist_parts``: :func:`memberlist_bound` with this profile's probe interval and suspicion multiplier), and
    per node per second: probe packets and their bytes, gossip exchanges (rounds and pushes; pushes apart), snapshot
    versions accepted (= Ed25519 verifications) and their bytes (a sealed 2-GPU snapshot each). ``push``: news
    pushed at once (see :class:`SwimCluster`)."""
    from ._experiments import wire_sizes

    cfg = cfg or MembershipConfig()
    sim = SwimCluster(n, seed=seed, cfg=cfg, loss=loss, push=push)
    victim = sim.rng.choice(list(sim.nodes))
    sim.run_until(warmup_s)
    sim.kill(victim)
    bound = memberlist_bound(n, probe_interval_s=cfg.gossip_interval_s, suspicion_mult=cfg.suspicion_mult)
    horizon = horizon_s if horizon_s is not None else \
        warmup_s + 3 * memberlist_detection_s(n, cfg) + 20 * cfg.gossip_interval_s
    sim.run_until(horizon)
    survivors = [x for x in sim.running_ids()]
    suspect = sim.first(victim, MemberState.SUSPECT.value, after=warmup_s)
    dead = sim.first(victim, MemberState.DEAD.value, after=warmup_s)
    false = sum(1 for at, _, m, new in sim.events if new == "suspect" and m != victim)
    false_dead = sum(1 for at, _, m, new in sim.events if new == "dead" and m != victim)
    per_node_s = 1.0 / (n * horizon)
    return {
        "nodes": n,
        "seed": seed,
        "loss": loss,
        "push": push,
        "suspect_first_s": min(suspect.values(), default=math.inf) - warmup_s,
        "suspect_all_s": (max(suspect.values()) - warmup_s) if len(suspect) == len(survivors) else math.inf,
        "dead_first_s": min(dead.values(), default=math.inf) - warmup_s,
        "dead_all_s": (max(dead.values()) - warmup_s) if len(dead) == len(survivors) else math.inf,
        "memberlist_formula_s": bound.total_s,
        "memberlist_parts": msgspec.structs.asdict(bound),
        "false_suspicions": false,
        "false_deaths": false_dead,
        "packets_per_node_s": sim.packets * per_node_s,
        "probe_bytes_per_node_s": sim.probe_bytes * per_node_s,
        "exchanges_per_node_s": sim.exchanges * per_node_s,
        "push_exchanges_per_node_s": sim.push_exchanges * per_node_s,
        "verifications_per_node_s": sim.verifications * per_node_s,
        "snapshot_bytes_per_node_s": sim.verifications * wire_sizes()[1] * per_node_s,
    }
