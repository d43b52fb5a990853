"""The probe driver: SWIM packets over UDP on the gossip port, with the HTTP fallback. Moves bytes only.

Every decision is in :class:`p2pnode.gossip._probe.Prober` (what to send, when, what a message means) and
:class:`p2pnode.gossip._probewire.ProbeCodec` (rate limit, bounds, MAC, freshness, replay). This driver:

* binds a UDP socket (the gossip port, same host), and hands every datagram (at most
  :data:`~p2pnode.gossip._probewire.MAX_PACKET_BYTES` + 1 read) to the codec with its source host;
* sleeps until the prober's :meth:`~p2pnode.gossip._probe.Prober.next_deadline` or until an inbound message
  changed it (a trio Event; no polling), then ticks;
* sends each effect to the address of the receiver's **signed snapshot** (``addr_of``: host:port), never to an
  address a packet names; a reply (ack, nack) is sealed no larger than the request it answers (the codec);
* ``SendPing(fallback=True)`` goes over the stream transport (``stream_post(addr, packet) -> reply packet``, the
  agent's HTTP client posting to ``/probe``; memberlist's TCP fallback), and the reply is handled like a datagram;
  inbound, :meth:`ProbeDriver.handle_stream` answers such a request with the sealed ack as the response body.

With a ``lease`` (:class:`p2pnode.node._lease.Lease`, set by the agent when its lease is on), the driver also wakes
at the lease's renewal deadline and pings the voters it names (:meth:`~p2pnode.gossip._probe.Prober.ping`), and hands
it each :class:`~p2pnode.gossip.DirectAck` the prober kept (``acked(node, sent_at, now)``); nothing else renews it.

State changes the prober made (suspect, alive) are handed to ``on_changes`` (the agent republishes its snapshot
when its accusations changed, as it does after a membership tick).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from ..gossip import (
    MAX_PROBE_PACKET_BYTES,
    ProbeCodec,
    ProbeEffect,
    Prober,
    SendAck,
    SendNack,
    SendPing,
    SendPingReq,
    StateChanged,
    parse_hostport,
)
from ..node._lease import AckLog

__all__ = ["ProbeDriver"]

log = logging.getLogger(__name__)


class Renewal(Protocol):
    """What the driver needs of a lease (:class:`p2pnode.node._lease.Lease`)."""

    def due(self, now: float) -> list[tuple[str, bool]]: ...
    def next_deadline(self) -> float: ...
    def acked(self, voter: str, sent_at: float, now: float) -> bool: ...


class ProbeDriver:
    """Runs one node's prober over UDP (see module docstring). ``now``: monotonic seconds (trio's clock);
    ``wall_ms``: the wall clock in milliseconds (probe freshness); ``addr_of(node_id)``: ``host:port`` from the
    member's signed snapshot, or ``None``."""

    def __init__(self, prober: Prober, codec: ProbeCodec, *, addr_of: Callable[[str], str | None],
                 now: Callable[[], float], wall_ms: Callable[[], int],
                 stream_post: Callable[[str, bytes], Awaitable[bytes | None]] | None = None,
                 on_changes: Callable[[list[StateChanged]], None] | None = None) -> None:
        self.prober = prober
        self.codec = codec
        self.addr_of = addr_of
        self.now = now
        self.wall_ms = wall_ms
        self.stream_post = stream_post
        self.on_changes = on_changes
        self._sock: trio.socket.SocketType | None = None
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.send_errors = 0
        self.no_address = 0
        self._lease: Renewal | None = None
        self.acks_given = AckLog()
        """The direct acks this node gave (a member's own ping answered; issue 42: the leader's bound on a silent
        lease holder's last sign of life, published in ``jobs.acks``)."""

    @property
    def lease(self) -> Renewal | None:
        """The node's lease, renewed by the direct acks of its voters (None: no lease kept)."""
        return self._lease

    @lease.setter
    def lease(self, lease: Renewal | None) -> None:
        self._lease = lease
        self.prober.keep_direct_acks = lease is not None

    async def bind(self, host: str, port: int) -> tuple[str, int]:
        """Open the UDP socket on ``host:port`` (port 0: any free one); returns the bound ``(host, port)``."""
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        sock = trio.socket.socket(family, trio.socket.SOCK_DGRAM)
        try:
            await sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self._sock = sock
        return sock.getsockname()[:2]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Probe and answer probes on the socket :meth:`bind` opened, until cancelled (then the socket closes)."""
        sock = self._sock
        if sock is None:
            raise RuntimeError("ProbeDriver.bind() first")
        self.acks_given.start(self.now())
        with sock:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._receive_loop, sock)
                nursery.start_soon(self._timer_loop)
                task_status.started()

    async def _timer_loop(self) -> None:
        while True:
            deadline = self.prober.next_deadline()  # None only before the first tick: tick at once
            if deadline is not None:
                renew_at = self.lease.next_deadline() if self.lease is not None else math.inf
                with trio.move_on_at(min(deadline, renew_at)):
                    await self._changed.wait()
            self._changed = trio.Event()
            now = self.now()
            effects = self.prober.tick(now)
            if self.lease is not None:
                for voter, unanswered in self.lease.due(now):
                    effects += self.prober.ping(voter, now, fallback=unanswered)
            await self._act(effects)

    async def _receive_loop(self, sock: trio.socket.SocketType) -> None:
        while True:
            try:
                data, src = await sock.recvfrom(MAX_PROBE_PACKET_BYTES + 1)
            except OSError:  # e.g. ICMP port unreachable surfaced on Linux: nothing to do with it
                continue
            await self.handle_datagram(data, src[0])

    async def handle_datagram(self, data: bytes, source_host: str) -> None:
        """One inbound datagram from ``source_host``: open, hand to the prober, send its effects."""
        msg = self.codec.open(data, source_host, self.now(), self.wall_ms())
        if msg is None:
            return
        await self._act(self.prober.receive(msg, self.now()))
        self._changed.set()

    def handle_stream(self, body: bytes, source_host: str) -> bytes | None:
        """An inbound stream (HTTP ``POST /probe``) request: the sealed ack to send as the response body, or
        ``None`` (refused and counted by the codec, or nothing to answer). Other effects are sent as usual."""
        msg = self.codec.open(body, source_host, self.now(), self.wall_ms())
        if msg is None:
            return None
        effects = self.prober.receive(msg, self.now())
        reply = None
        rest: list[ProbeEffect] = []
        for e in effects:
            if reply is None and isinstance(e, SendAck) and e.msg.to == msg.sender:
                reply = self.codec.seal(e.msg, self.wall_ms())
                if reply is not None and e.msg.node is None:
                    self.acks_given.gave(e.msg.to, self.now())
            else:
                rest.append(e)
        if rest and self._nursery is not None:
            self._nursery.start_soon(self._act, rest)
        self._changed.set()
        return reply

    async def _act(self, effects: list[ProbeEffect]) -> None:
        changes = [e for e in effects if isinstance(e, StateChanged)]
        if changes and self.on_changes is not None:
            self.on_changes(changes)
        if self.lease is not None:
            for a in self.prober.take_direct_acks():
                self.lease.acked(a.node, a.sent_at, self.now())
        for e in effects:
            if isinstance(e, StateChanged):
                continue
            packet = self.codec.seal(e.msg, self.wall_ms())  # a reply: within its request's size (the codec)
            addr = self.addr_of(e.msg.to)
            if packet is None:
                continue
            if addr is None:
                self.no_address += 1
                continue
            if isinstance(e, SendPing) and e.fallback:
                if self.stream_post is not None and self._nursery is not None:
                    self._nursery.start_soon(self._fallback, addr, packet)
                continue
            assert isinstance(e, SendPing | SendPingReq | SendAck | SendNack)
            if isinstance(e, SendAck) and e.msg.node is None:
                self.acks_given.gave(e.msg.to, self.now())  # after the ping came, so after it was sent
            await self._sendto(addr, packet)

    async def _sendto(self, addr: str, packet: bytes) -> None:
        if self._sock is None:
            return
        try:
            host, port = parse_hostport(addr)
            await self._sock.sendto(packet, (host, port))
        except (OSError, ValueError) as exc:
            self.send_errors += 1
            log.debug("probe to %s not sent: %s", addr, exc)

    async def _fallback(self, addr: str, packet: bytes) -> None:
        assert self.stream_post is not None
        try:
            reply = await self.stream_post(addr, packet)
        except (OSError, trio.TooSlowError) as exc:
            log.debug("probe fallback to %s failed: %s", addr, exc)
            return
        if reply:
            host, _ = parse_hostport(addr)
            await self.handle_datagram(reply, host)
