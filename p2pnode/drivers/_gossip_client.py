"""The gossip client: ``POST /gossip`` over kept-alive HTTP/1.1 connections, one per peer, spoken with h11.

Every node sends a few gossip requests per second to a handful of peers, and nothing else on the hot path; a
general HTTP client's layers (URL parsing, auth and redirect flows, cookies, response models) cost more CPU
than the exchange itself (about a quarter of an idle agent's CPU). h11 (the sans-IO HTTP/1.1 state machine
httpx itself uses) does the protocol; this module only keeps connections and bounds what it reads:

* one idle connection kept per address, reused for the next request, closed after ``keepalive_s`` idle
  (below the server's 5 s keep-alive) and at most ``max_idle`` kept in all;
* a reply larger than ``max_reply_bytes`` (declared or received) is refused and the connection dropped, so a
  peer cannot make us buffer more than the gossip body bound;
* a request on a reused connection that the peer had closed meanwhile is retried once on a fresh one (gossip
  requests are idempotent: a repeated merge changes nothing);
* every failure is a :class:`GossipTransportError` (an ``OSError``), within ``timeout_s`` seconds overall.
"""

from __future__ import annotations

import h11
import msgspec
import trio

from ..errors import PeerError
from ..inputs import decimal

__all__ = ["GossipClient", "GossipReplyBytes", "GossipTransportError"]

RECEIVE_CHUNK = 65536


class GossipTransportError(PeerError, OSError):
    """A gossip request failed: connection refused or lost, timeout, protocol error or an oversized reply (an
    ``OSError`` too, as transport failures are)."""


class GossipReplyBytes(msgspec.Struct, frozen=True):
    """A reply as received: HTTP ``status_code``, ``content_type`` (lower case) and the body bytes."""

    status_code: int
    content_type: str
    content: bytes


class _Conn(msgspec.Struct):
    stream: trio.SocketStream
    h11: h11.Connection
    idle_since: float


def _split(addr: str) -> tuple[str, int]:
    """``host, port`` of a peer's ``addr`` (a typed :data:`p2pnode.snapshot.Addr`: its port is 1-65535)."""
    host, _, port_s = addr.rpartition(":")
    port = decimal(port_s, max_digits=5)
    if port is None:
        raise GossipTransportError(f"address {addr!r} has no port")
    return host.strip("[]"), port


class GossipClient:
    """Kept-alive gossip connections (see module docstring). ``max_reply_bytes`` bounds a reply body."""

    def __init__(self, *, max_reply_bytes: int, keepalive_s: float = 4.0, max_idle: int = 64) -> None:
        self.max_reply_bytes = max_reply_bytes
        self.keepalive_s = keepalive_s
        self.max_idle = max_idle
        self._idle: dict[str, _Conn] = {}
        self.connections_opened = 0

    async def post(self, addr: str, body: bytes, timeout_s: float) -> GossipReplyBytes:
        """``POST /gossip`` with ``body`` (msgpack) to ``addr`` (``host:port``). Raises
        :class:`GossipTransportError` (also for an address that cannot be dialled)."""
        try:
            with trio.fail_after(timeout_s):
                await self._expire()
                conn = self._idle.pop(addr, None)
                if conn is not None:
                    try:
                        return await self._exchange(addr, conn, body)
                    except GossipTransportError:
                        pass  # the peer closed the kept connection meanwhile: once more on a fresh one
                return await self._exchange(addr, await self._open(addr), body)
        except trio.TooSlowError:
            raise GossipTransportError(f"gossip with {addr}: no reply within {timeout_s:g} s") from None

    async def _open(self, addr: str) -> _Conn:
        try:
            host, port = _split(addr)
            stream = await trio.open_tcp_stream(host, port)
        except (OSError, ValueError) as exc:  # ValueError: a port out of range or a host IDNA refuses
            raise GossipTransportError(f"cannot connect to {addr}: {exc}") from None
        self.connections_opened += 1
        return _Conn(stream, h11.Connection(h11.CLIENT, max_incomplete_event_size=16384), trio.current_time())

    async def _exchange(self, addr: str, conn: _Conn, body: bytes) -> GossipReplyBytes:
        c = conn.h11
        try:
            request = h11.Request(method="POST", target="/gossip", headers=[
                ("host", addr), ("content-type", "application/msgpack"), ("content-length", str(len(body)))])
            await conn.stream.send_all(c.send(request) + c.send(h11.Data(data=body)) + c.send(h11.EndOfMessage()))
            status, ctype, chunks, size = 0, "", [], 0
            while True:
                event = c.next_event()
                if event is h11.NEED_DATA:
                    c.receive_data(await conn.stream.receive_some(RECEIVE_CHUNK))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    for name, value in event.headers:
                        if name == b"content-type":
                            ctype = value.decode("latin-1").lower()
                        elif name == b"content-length":
                            declared = decimal(value.decode("latin-1"))  # h11 checked it is digits
                            if declared is None or declared > self.max_reply_bytes:
                                raise GossipTransportError(f"reply of {value[:24]!r} bytes from {addr}")
                elif isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > self.max_reply_bytes:
                        raise GossipTransportError(f"reply from {addr} exceeds {self.max_reply_bytes} bytes")
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise GossipTransportError(f"{addr} closed the connection")
                # InformationalResponse (1xx) and PAUSED cannot occur for this request; ignore anything else
        except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError) as exc:
            await self._close(conn)
            if isinstance(exc, GossipTransportError):
                raise
            raise GossipTransportError(f"gossip with {addr}: {exc.__class__.__name__}: {exc}") from None
        except BaseException:  # cancelled mid-exchange: the connection's state is unknown, never reuse it
            await self._close(conn)
            raise
        if c.our_state is h11.DONE and c.their_state is h11.DONE and len(self._idle) < self.max_idle:
            c.start_next_cycle()
            conn.idle_since = trio.current_time()
            old = self._idle.pop(addr, None)
            self._idle[addr] = conn
            if old is not None:
                await self._close(old)
        else:
            await self._close(conn)
        return GossipReplyBytes(status, ctype, b"".join(chunks))

    async def _expire(self) -> None:
        """Close connections idle for ``keepalive_s`` or more (the server may close them any moment after)."""
        now = trio.current_time()
        # Taken out of the pool before the first await: another task may expire or reuse the pool meanwhile.
        stale = [a for a, c in self._idle.items() if now - c.idle_since >= self.keepalive_s]
        expired = [self._idle.pop(a) for a in stale]
        for conn in expired:
            await self._close(conn)

    @staticmethod
    async def _close(conn: _Conn) -> None:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(conn.stream)

    async def aclose(self) -> None:
        """Close every kept connection."""
        while self._idle:
            await self._close(self._idle.popitem()[1])
