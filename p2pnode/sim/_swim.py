"""SWIM detection on a virtual clock: real :class:`~p2pnode.gossip._probe.Prober` and
:class:`~p2pnode.gossip._membership.Membership` cores per node, a seeded in-memory packet network (latency, loss,
blocked links, killed nodes) and a modelled snapshot layer.

Probe packets are delivered as the cores' own messages, or (``codec=True``) sealed and opened by each node's real
:class:`~p2pnode.gossip._probewire.ProbeCodec` with its own Ed25519 identity; ``loss`` drops datagrams
only (the stream fallback, TCP, retransmits within the probe's deadline); ``blocked`` links drop both; nodes in
``datagrams_blocked`` get no datagrams at all. Snapshots are modelled: a node publishes ``(version, incarnation,
suspects)`` every :func:`~p2pnode.gossip.publish_interval_s` and at once when its accusations or incarnation
change, and every other running node observes it ``spread_s`` later (the push-pull's O(log N) rounds; news is
pushed at once). Time jumps from one deadline to the next (a heap of events).

:func:`detection` kills one node and reports when each survivor marks it suspect and dead, beside memberlist's
formula ``suspicion_mult × max(1, log10 N) × interval``.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Any

import msgspec

from ..gossip._membership import Membership, MembershipConfig, MemberState, publish_interval_s
from ..gossip._probe import Ack, Nack, Ping, PingReq, ProbeConfig, Prober, SendAck, SendNack, SendPing, SendPingReq
from ..gossip._probewire import ProbeCodec, ProbeKeys
from ..identity import Identity

__all__ = ["SwimCluster", "detection", "memberlist_detection_s"]


def memberlist_detection_s(n: int, cfg: MembershipConfig) -> float:
    """memberlist's suspicion timeout with all confirmations (``util.go`` ``suspicionTimeout``):
    ``suspicion_mult × max(1, log10 N) × interval``."""
    return cfg.suspicion_mult * max(1.0, math.log10(max(1, n))) * cfg.gossip_interval_s


class _Node(msgspec.Struct):
    node_id: str
    membership: Membership
    prober: Prober
    version: int = 0
    published: tuple[int, dict[str, int]] | None = None
    next_publish_at: float = 0.0
    running: bool = True
    wake_gen: int = 0
    membership_due: float = 0.0
    """Cached :meth:`Membership.next_deadline` (never later than the true one: recomputed after every tick,
    observation and prober state change; an early one only costs a wake that finds nothing due)."""


class SwimCluster:
    """``n`` nodes that know each other from the start (see module docstring). ``loss``: each packet is dropped
    with this probability; ``blocked``: directed (sender, receiver) pairs whose packets are dropped."""

    def __init__(self, n: int, *, seed: int = 0, cfg: MembershipConfig | None = None,
                 probe: ProbeConfig | None = None, latency_s: float = 0.002, loss: float = 0.0,
                 spread_s: float | None = None, codec: bool = False) -> None:
        self.cfg = cfg or MembershipConfig()
        self.rng = random.Random(seed)
        self.latency_s = latency_s
        self.loss = loss
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
        for i, node_id in enumerate(ids):
            m = Membership(node_id, self.cfg, adopt_suspicions=True)
            for other in ids:
                if other != node_id:
                    m.observe(other, version=1, incarnation=0, leaving=False, suspects={}, now=0.0)
            p = Prober(m, probe, rng=random.Random(seed * 1_000_003 + i))
            node = _Node(node_id, m, p, version=1)
            node.next_publish_at = self.rng.uniform(0.0, publish_interval_s(n, self.cfg))
            self.nodes[node_id] = node
            node.membership_due = m.next_deadline() or math.inf
            self._push(self.rng.uniform(0.0, (probe or ProbeConfig()).probe_interval_s), "wake", (node_id, 0))

    # -- event plumbing ------------------------------------------------------------------------------------------
    def _push(self, at: float, kind: str, payload: Any) -> None:
        self._tie += 1
        heapq.heappush(self._q, (at, self._tie, kind, payload))

    def _schedule(self, node: _Node, *, membership_changed: bool = False) -> None:
        if membership_changed:
            d = node.membership.next_deadline()
            node.membership_due = d if d is not None else math.inf
        times = [node.next_publish_at, node.membership_due]
        d = node.prober.next_deadline()
        if d is not None:
            times.append(d)
        node.wake_gen += 1
        self._push(max(self.now, min(times)), "wake", (node.node_id, node.wake_gen))

    def kill(self, node_id: str) -> None:
        """``node_id`` stops: it sends, answers and publishes nothing from now on."""
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
        self._maybe_publish(node)
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
        if state != node.published or self.now >= node.next_publish_at:
            node.version += 1
            node.published = state
            node.next_publish_at = self.now + publish_interval_s(m.size, self.cfg)
            self._push(self.now + self.spread_s, "snapshot", (node.node_id, node.version, state[0], dict(state[1])))

    def _send(self, sender: str, msg: Ping | PingReq | Ack | Nack, *, stream: bool = False) -> None:
        self.packets += 1
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
        self._maybe_publish(node)
        self._schedule(node, membership_changed=changed)

    def _observe(self, payload: tuple[str, int, int, dict[str, int]]) -> None:
        origin, version, incarnation, suspects = payload
        for node in self.nodes.values():
            if node.running and node.node_id != origin:
                changes = node.membership.observe(origin, version=version, incarnation=incarnation, leaving=False,
                                                  suspects=suspects, now=self.now)
                if changes or suspects or node.membership.refute_needed:  # accusations move suspicion timers
                    self._record(node, changes)
                    self._maybe_publish(node)
                    self._schedule(node, membership_changed=True)

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
              warmup_s: float = 5.0, horizon_s: float | None = None) -> dict:
    """Kill one node of ``n`` after ``warmup_s`` and report, over the survivors: when the first and the last
    marked it suspect and dead (seconds after the kill), false suspicions and deaths of live nodes (events: one
    per observer), packets per node per second, and memberlist's formula for the same N."""
    cfg = cfg or MembershipConfig()
    sim = SwimCluster(n, seed=seed, cfg=cfg, loss=loss)
    victim = sim.rng.choice(list(sim.nodes))
    sim.run_until(warmup_s)
    sim.kill(victim)
    formula = memberlist_detection_s(n, cfg)
    horizon = horizon_s if horizon_s is not None else warmup_s + 3 * formula + 20 * cfg.gossip_interval_s
    sim.run_until(horizon)
    survivors = [x for x in sim.running_ids()]
    suspect = sim.first(victim, MemberState.SUSPECT.value, after=warmup_s)
    dead = sim.first(victim, MemberState.DEAD.value, after=warmup_s)
    false = sum(1 for at, _, m, new in sim.events if new == "suspect" and m != victim)
    false_dead = sum(1 for at, _, m, new in sim.events if new == "dead" and m != victim)
    return {
        "nodes": n,
        "seed": seed,
        "loss": loss,
        "suspect_first_s": min(suspect.values(), default=math.inf) - warmup_s,
        "dead_first_s": min(dead.values(), default=math.inf) - warmup_s,
        "dead_all_s": (max(dead.values()) - warmup_s) if len(dead) == len(survivors) else math.inf,
        "memberlist_formula_s": formula,
        "false_suspicions": false,
        "false_deaths": false_dead,
        "packets_per_node_s": sim.packets / (n * horizon),
    }
