"""The agent's HTTP listener: hypercorn serves every connection, except that a kept-alive connection of
``POST /gossip`` requests is answered by a lean HTTP/1.1 loop on h11.

Every peer calls ``POST /gossip`` several times a second on connections it keeps (see
:class:`p2pnode.drivers.GossipClient`). Through hypercorn each such request took about fifteen passes of trio's
scheduler (a task per request, a send per header block and body, events between them): a third of an idle
agent's CPU. Here a connection's next request line is peeked at (``MSG_PEEK``, nothing consumed): when it
reads exactly ``POST /gossip HTTP/1.1`` the request is parsed by h11 (which does the protocol, as it does for
the gossip client) and handed to the same ASGI handler hypercorn would call (:func:`p2pnode.http.serve_gossip`:
admission, body bounds, decoding, counting); its reply goes out in one write. Anything else (another route, a
short or odd request line, a query string, HTTP/1.0) hands the untouched connection to hypercorn's own
per-connection server for the rest of its life, so every route keeps hypercorn's behaviour. The fast path is an
optimization only: a gossip request served by either path gets the same answer.

Bounds on the fast path mirror hypercorn's (:func:`p2pnode.drivers._host.server_config`): the request head at
most ``h11_max_incomplete_size`` bytes, ``read_timeout`` seconds per read of the head, an idle connection kept
``keep_alive_timeout`` seconds; the body's bound and deadline are the gossip handler's. A request pipelined
behind a gossip request that is not itself a gossip request is answered 400 and the connection closed (our
clients never pipeline). A body the handler refused before reading it is drained (the connection is kept) up to
``max_drain_bytes``; beyond that, and after a 400 or 500, the connection ends with a lingering close (our side
shut, the client's input read and dropped for up to 2 s), so that the reply is not destroyed by a reset. On
shutdown, idle connections close at once and busy ones get
``graceful_timeout`` seconds, as in hypercorn.

Built on hypercorn 0.18's per-connection server (``hypercorn.trio.tcp_server.TCPServer``) and worker context;
the version is pinned below 0.19 in ``pyproject.toml``.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Awaitable, Callable
from math import inf
from typing import Any

import h11
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

__all__ = ["GOSSIP_REQUEST_LINE", "serve"]

log = logging.getLogger(__name__)

GOSSIP_REQUEST_LINE = b"POST /gossip HTTP/1.1\r\n"
"""The request line served on the fast path; any other goes to hypercorn."""

_RECV = 65536

Asgi = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                 Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]


async def serve(app: Any, config: HypercornConfig, gossip: Asgi, *, max_drain_bytes: int = 1 << 20,
                shutdown_trigger: Callable[[], Awaitable[Any]],
                task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` (ASGI) on ``config.bind`` until ``shutdown_trigger()`` returns; ``task_status.started`` gets
    the bound URLs (``["http://host:port"]``), as ``hypercorn.trio.serve`` gives them. ``gossip`` answers the
    fast path's ``POST /gossip`` requests (an ASGI callable; the scope carries ``method``, ``path``,
    ``headers`` and ``client``). A body the handler left unread (a refusal before reading it) is read and
    dropped up to ``max_drain_bytes`` so that the connection stays usable, as hypercorn does; a longer one ends
    the connection after a lingering close (so that the reply is not lost to a reset). Plain HTTP only (no TLS
    config is read). The app gets no ``lifespan`` events. Raises ``OSError`` when a bind fails."""
    wrapped = wrap_app(app, config.wsgi_max_body_size, None)
    context = WorkerContext(None)
    sockets = config.create_sockets()
    listeners = []
    binds = []
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
    front = _Front(wrapped, config, context, gossip, max_drain_bytes)
    async with trio.open_nursery() as connections:
        async with trio.open_nursery() as accepting:
            accepting.start_soon(functools.partial(trio.serve_listeners, front.handle, listeners,
                                                       handler_nursery=connections))
            task_status.started(binds)
            await shutdown_trigger()
            accepting.cancel_scope.cancel()
        await context.terminated.set()  # hypercorn's connections close when idle
        front.close_idle()
        connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout


class _Front:
    """Routes each accepted connection (see the module docstring)."""

    def __init__(self, app: Any, config: HypercornConfig, context: WorkerContext, gossip: Asgi,
                 max_drain_bytes: int) -> None:
        self.app = app
        self.config = config
        self.context = context
        self.gossip = gossip
        self.max_drain_bytes = max_drain_bytes
        self.idle: set[trio.CancelScope] = set()  # fast connections waiting for their next request
        self.closing = False

    def close_idle(self) -> None:
        """Shutdown: end every fast connection that is between requests."""
        self.closing = True
        for scope in list(self.idle):
            scope.cancel()

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one connection to its end. Never raises for what a client does."""
        conn: h11.Connection | None = None
        try:
            while True:
                if conn is not None and conn.trailing_data[0]:
                    if not await self._gossip(stream, conn):  # a pipelined request: only gossip is served here
                        return
                    continue
                line = await self._peek(stream)
                if line is None:
                    return
                if line != GOSSIP_REQUEST_LINE:  # nothing of this request is consumed: hypercorn gets it whole
                    await TCPServer(self.app, self.config, self.context, ConnectionState({}), stream).run()
                    return
                if conn is None:
                    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.config.h11_max_incomplete_size)
                if not await self._gossip(stream, conn):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _peek(self, stream: trio.SocketStream) -> bytes | None:
        """The next request's first line, or as much of it as has arrived, without consuming it. None when the
        connection closed, stayed idle ``keep_alive_timeout`` seconds, or the agent shuts down."""
        if self.closing:
            return None
        want = len(GOSSIP_REQUEST_LINE)
        with trio.CancelScope(deadline=trio.current_time() + self.config.keep_alive_timeout) as scope:
            self.idle.add(scope)
            try:
                head = await stream.socket.recv(want, socket.MSG_PEEK)
            finally:
                self.idle.discard(scope)
        if scope.cancelled_caught or not head:
            return None
        return head

    async def _gossip(self, stream: trio.SocketStream, conn: h11.Connection) -> bool:
        """Serve one request from ``conn`` (a ``POST /gossip`` expected). True when the connection may carry
        another request."""
        request = await self._request(stream, conn)
        if request is None:
            return False
        if request.method != b"POST" or request.target != b"/gossip":
            await _send(stream, conn, _simple(400, b'{"error":"only POST /gossip on this connection"}'), close=True)
            await _linger(stream)
            return False
        reply = _Exchange(stream, conn, self.config)
        peer = stream.socket.getpeername()
        scope = {"type": "http", "method": "POST", "path": "/gossip", "headers": list(request.headers),
                 "client": (peer[0], peer[1])}
        try:
            await self.gossip(scope, reply.receive, reply.send)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return False
        except Exception:  # a bug must not end the agent: answered 500, as hypercorn answers for a failing app
            log.exception("POST /gossip failed")
            if not reply.sent:
                await _send(stream, conn, _simple(500, b'{"error":"internal error"}'), close=True)
                await _linger(stream)
            return False
        if not reply.sent:
            return False
        if conn.their_state is h11.SEND_BODY and not await self._drain(stream, conn):
            await _linger(stream)
            return False
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return False
        conn.start_next_cycle()
        return True

    async def _request(self, stream: trio.SocketStream, conn: h11.Connection) -> h11.Request | None:
        """The request head, read within ``read_timeout`` seconds per read; None when the client closed, was
        too slow or broke the protocol (a 400 is sent for the last)."""
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                await _send(stream, conn, _simple(400, b'{"error":"bad request"}'), close=True)
                await _linger(stream)
                return None
            if isinstance(event, h11.Request):
                return event
            if event is not h11.NEED_DATA:
                return None
            with trio.move_on_after(self.config.read_timeout or inf) as scope:
                data = await stream.receive_some(_RECV)
            if scope.cancelled_caught:
                return None
            conn.receive_data(data)


    async def _drain(self, stream: trio.SocketStream, conn: h11.Connection) -> bool:
        """Read and drop the rest of a request body the handler did not read. True when it ended within
        ``max_drain_bytes`` and ``read_timeout`` seconds per read (the connection may carry another request)."""
        dropped = 0
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                return False
            if isinstance(event, h11.EndOfMessage):
                return True
            if isinstance(event, h11.Data):
                dropped += len(event.data)
                if dropped > self.max_drain_bytes:
                    return False
                continue
            if event is not h11.NEED_DATA:
                return False
            with trio.move_on_after(self.config.read_timeout or inf) as scope:
                data = await stream.receive_some(_RECV)
            if scope.cancelled_caught:
                return False
            conn.receive_data(data)


_LINGER_S = 2.0
_LINGER_BYTES = 4 << 20


async def _linger(stream: trio.SocketStream) -> None:
    """Lingering close (nginx's ``lingering_close``): end our side, then read and drop what the client still
    sends, for at most ``_LINGER_S`` seconds and ``_LINGER_BYTES`` bytes. Closing with unread input makes the
    kernel reset the connection, which can destroy a reply the client has not read yet. Never raises for what
    the client does."""
    try:
        await stream.send_eof()
        dropped = 0
        with trio.move_on_after(_LINGER_S):
            while dropped <= _LINGER_BYTES:
                data = await stream.receive_some(_RECV)
                if not data:
                    return
                dropped += len(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


def _simple(status: int, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


_SEND_TIMEOUT_S = 30.0
"""Seconds a client has to take a whole reply (up to ``gossip.max_body_bytes``) off the socket."""


async def _send(stream: trio.SocketStream, conn: h11.Connection,
                reply: tuple[int, list[tuple[bytes, bytes]], bytes], *, close: bool = False) -> None:
    """Write a whole reply in one write (``connection: close`` when ``close``). Raises
    ``trio.BrokenResourceError`` when the client is gone or does not read it within ``_SEND_TIMEOUT_S`` (the
    connection is then unusable and is closed by the caller)."""
    status, headers, body = reply
    if close:
        headers = [*headers, (b"connection", b"close")]
    try:
        data = conn.send(h11.Response(status_code=status, headers=headers))
        data = (data or b"") + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
    except h11.LocalProtocolError:  # the connection is past answering (a reply was already sent)
        return
    try:
        with trio.fail_after(_SEND_TIMEOUT_S):
            await stream.send_all(data)
    except trio.TooSlowError:
        raise trio.BrokenResourceError(f"the client took no reply within {_SEND_TIMEOUT_S:g} s") from None


class _Exchange:
    """The ASGI ``receive`` and ``send`` of one fast-path request, on h11."""

    def __init__(self, stream: trio.SocketStream, conn: h11.Connection, config: HypercornConfig) -> None:
        self.stream = stream
        self.conn = conn
        self.config = config
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.sent = False
        self.gone = False

    async def receive(self) -> dict[str, Any]:
        """The next body chunk (``http.request``), or ``http.disconnect`` when the client closed or broke the
        protocol. The caller bounds size and time."""
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                self.gone = True
                return {"type": "http.disconnect"}
            if isinstance(event, h11.Data):
                return {"type": "http.request", "body": bytes(event.data), "more_body": True}
            if isinstance(event, h11.EndOfMessage):
                return {"type": "http.request", "body": b"", "more_body": False}
            if event is not h11.NEED_DATA:
                self.gone = True
                return {"type": "http.disconnect"}
            if self.conn.they_are_waiting_for_100_continue:
                await self.stream.send_all(self.conn.send(h11.InformationalResponse(status_code=100, headers=[]))
                                           or b"")
            try:
                data = await self.stream.receive_some(_RECV)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            self.conn.receive_data(data)

    async def send(self, message: dict[str, Any]) -> None:
        """``http.response.start`` is held; the whole reply is written with the (single) ``http.response.body``.
        Raises ``trio.BrokenResourceError`` / ``trio.ClosedResourceError`` when the client is gone (the handler
        counts it)."""
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", ()))
            return
        if message["type"] != "http.response.body" or self.sent:
            return
        body = message.get("body", b"")
        if message.get("more_body", False):
            raise RuntimeError("the gossip handler sends its reply in one body message")
        await _send(self.stream, self.conn, (self.status, self.headers, body), close=self.gone)
        self.sent = True
