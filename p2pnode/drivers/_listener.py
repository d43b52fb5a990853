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
clients never pipeline). A request refused before its body was read (429, 503, 413) ends its connection, as in
hypercorn, but with a lingering close (our side shut, what the client still sends read and dropped for at most
:data:`LINGER_S` seconds and :data:`LINGER_BYTES`), so that the reply is not destroyed by a reset; so do a
400 and a 500. Writes on both paths end after :data:`SEND_TIMEOUT_S` seconds (hypercorn's own are unbounded
and shielded: a client that never reads would hold its connection, and the agent's shutdown, for good). An
error out of hypercorn's connection server ends that connection, never the agent. What the listener ends
itself is counted (:class:`ListenerStats`). On shutdown, idle connections close at once and busy ones get
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
from typing import Any, cast

import h11
import msgspec
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

__all__ = ["GOSSIP_REQUEST_LINE", "ListenerStats", "serve"]

log = logging.getLogger(__name__)

GOSSIP_REQUEST_LINE = b"POST /gossip HTTP/1.1\r\n"
"""The request line served on the fast path; any other goes to hypercorn."""

SEND_TIMEOUT_S = 30.0
"""Seconds a client has to take a reply off the socket, on either path (hypercorn's own writes have no bound)."""

LINGER_S = 2.0
"""Seconds a lingering close reads and drops what a client still sends."""

LINGER_BYTES = 64 * 1024
"""Bytes a lingering close reads and drops at most (the default of :func:`serve`). A peer's refused message is
usually a few KiB and gets its reply; a flood's megabyte bodies are not read (they get a reset)."""

_RECV = 65536

Asgi = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                 Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]


class ListenerStats(msgspec.Struct):
    """Connections and requests the listener ended itself, by reason (counters; Prometheus
    ``p2pnode_http_listener_refused_total``)."""

    bad_request: int = 0
    """Fast path: a request head h11 refused (400), or another route pipelined behind gossip (400)."""
    handler_error: int = 0
    """Fast path: the gossip handler raised (500, logged with its traceback)."""
    slow_client: int = 0
    """Either path: a reply not taken off the socket within :data:`SEND_TIMEOUT_S` (connection closed)."""
    connection_error: int = 0
    """hypercorn path: the per-connection server raised (logged; the connection is closed, the agent goes on)."""

    def as_dict(self) -> dict[str, int]:
        """``{reason: count}``."""
        return {"bad_request": self.bad_request, "handler_error": self.handler_error,
                "slow_client": self.slow_client, "connection_error": self.connection_error}


async def serve(app: Any, config: HypercornConfig, gossip: Asgi, *, linger_bytes: int = LINGER_BYTES,
                stats: ListenerStats | None = None, shutdown_trigger: Callable[[], Awaitable[Any]],
                done: trio.Event | None = None,
                task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` (ASGI) on ``config.bind`` until ``shutdown_trigger()`` returns; ``task_status.started`` gets
    the bound URLs (``["http://host:port"]``), as ``hypercorn.trio.serve`` gives them. ``gossip`` answers the
    fast path's ``POST /gossip`` requests (an ASGI callable; the scope carries ``method``, ``path``,
    ``headers`` and ``client``). When the handler answered without reading the whole body (a refusal), the
    connection ends with a lingering close that reads and drops at most ``linger_bytes`` more. ``stats`` counts
    what the listener ended itself; ``done`` is set when it returns. Plain HTTP only (no TLS config is read);
    the app gets no ``lifespan`` events.

    Shutdown: idle connections close at once, busy ones get ``config.graceful_timeout`` seconds; if this task is
    cancelled instead, every connection ends now (writes blocked on a client included). Raises ``OSError`` when a
    bind fails."""
    wrapped = wrap_app(app, config.wsgi_max_body_size, None)
    context = WorkerContext(None)
    sockets = config.create_sockets()
    listeners = []
    binds = []
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
    front = _Front(wrapped, config, context, gossip, linger_bytes, stats or ListenerStats())
    try:
        await _run(front, listeners, binds, shutdown_trigger, task_status)
    finally:
        if done is not None:
            done.set()


async def _run(front: _Front, listeners: list[trio.SocketListener], binds: list[str],
               shutdown_trigger: Callable[[], Awaitable[Any]], task_status: trio.TaskStatus[list[str]]) -> None:
    config, context = front.config, front.context
    async with trio.open_nursery() as connections:
        try:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(functools.partial(trio.serve_listeners, front.handle, listeners,
                                                       handler_nursery=connections))
                task_status.started(binds)
                await shutdown_trigger()
                accepting.cancel_scope.cancel()
            await context.terminated.set()  # hypercorn's idle connections close
            front.shutdown(trio.current_time() + config.graceful_timeout)
            connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        except BaseException:
            front.shutdown(-inf)  # cancelled: hypercorn's shielded writes must not hold the nursery open
            raise


class _Front:
    """Routes each accepted connection (see the module docstring)."""

    def __init__(self, app: Any, config: HypercornConfig, context: WorkerContext, gossip: Asgi,
                 linger_bytes: int, stats: ListenerStats) -> None:
        self.app = app
        self.config = config
        self.context = context
        self.gossip = gossip
        self.linger_bytes = linger_bytes
        self.stats = stats
        self.idle: set[trio.CancelScope] = set()  # fast connections waiting for their next request
        self.writes: set[trio.CancelScope] = set()  # writes of hypercorn's connections under way
        self.write_deadline = inf

    def shutdown(self, deadline: float) -> None:
        """End every fast connection that is between requests; writes under way on hypercorn's connections end
        by ``deadline`` (trio time; ``-inf``: now)."""
        self.write_deadline = min(self.write_deadline, deadline)
        for scope in list(self.idle):
            scope.cancel()
        for scope in list(self.writes):
            scope.deadline = min(scope.deadline, deadline)

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
                    await self._hypercorn(stream)
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

    async def _hypercorn(self, stream: trio.SocketStream) -> None:
        """The rest of the connection through hypercorn's own per-connection server, its writes bounded."""
        with trio.CancelScope() as whole:
            # hypercorn annotates the stream as an SSLStream but takes any stream: one without do_handshake() is
            # plain TCP to it (TCPServer.run), as _BoundedStream is.
            bounded = cast("trio.SSLStream[trio.SocketStream]", _BoundedStream(stream, self, whole))
            try:
                await TCPServer(self.app, self.config, self.context, ConnectionState({}), bounded).run()
            except Exception as exc:  # an ExceptionGroup out of hypercorn's task group: not the agent's end
                self.stats.connection_error += 1
                log.debug("HTTP connection ended by an error: %r", exc)

    async def _peek(self, stream: trio.SocketStream) -> bytes | None:
        """The next request's first line, or as much of it as has arrived, without consuming it. None when the
        connection closed, stayed idle ``keep_alive_timeout`` seconds, or the agent shuts down."""
        if self.write_deadline != inf:
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
            self.stats.bad_request += 1
            await self._refuse(stream, conn, 400, b'{"error":"only POST /gossip on this connection"}')
            return False
        reply = _Exchange(stream, conn, self.stats)
        peer = stream.socket.getpeername()
        scope = {"type": "http", "method": "POST", "path": "/gossip", "headers": list(request.headers),
                 "client": (peer[0], peer[1])}
        try:
            await self.gossip(scope, reply.receive, reply.send)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return False
        except Exception:  # a bug must not end the agent: answered 500, as hypercorn answers for a failing app
            self.stats.handler_error += 1
            log.exception("POST /gossip failed")
            if not reply.sent:
                await self._refuse(stream, conn, 500, b'{"error":"internal error"}')
            return False
        if not reply.sent:
            return False
        if conn.their_state is not h11.DONE:  # refused before its body was read: no keep-alive (as hypercorn)
            await _linger(stream, self.linger_bytes)
            return False
        if conn.our_state is not h11.DONE:
            return False
        conn.start_next_cycle()
        return True

    async def _refuse(self, stream: trio.SocketStream, conn: h11.Connection, status: int, body: bytes) -> None:
        """Answer ``status`` with a JSON ``body`` and end the connection (lingering close)."""
        if await _send(stream, conn, _simple(status, body), self.stats, close=True):
            await _linger(stream, self.linger_bytes)

    async def _request(self, stream: trio.SocketStream, conn: h11.Connection) -> h11.Request | None:
        """The request head, read within ``read_timeout`` seconds per read; None when the client closed, was
        too slow or broke the protocol (a 400 is sent for the last)."""
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                self.stats.bad_request += 1
                await self._refuse(stream, conn, 400, b'{"error":"bad request"}')
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


class _BoundedStream:
    """What hypercorn's per-connection server gets instead of the socket stream: the same stream, with each
    write bounded by :data:`SEND_TIMEOUT_S` and ended by shutdown. hypercorn writes inside a shielded cancel
    scope; the write's own scope (inside that shield) still ends it, and a write that timed out ends the whole
    connection (its reader would otherwise wait on a paused pipeline for good). No ``do_handshake``: hypercorn
    treats it as plain TCP."""

    def __init__(self, stream: trio.SocketStream, front: _Front, whole: trio.CancelScope) -> None:
        self._stream = stream
        self._front = front
        self._whole = whole
        self.socket = stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """The stream's ``receive_some``."""
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """The stream's ``send_all`` within :data:`SEND_TIMEOUT_S` (and the shutdown's deadline). Raises
        ``trio.BrokenResourceError`` when it did not finish in time."""
        front = self._front
        with trio.CancelScope(deadline=min(trio.current_time() + SEND_TIMEOUT_S, front.write_deadline)) as scope:
            front.writes.add(scope)
            try:
                await self._stream.send_all(data)
                return
            finally:
                front.writes.discard(scope)
        front.stats.slow_client += 1
        self._whole.cancel()
        raise trio.BrokenResourceError("the client took no reply in time")

    async def send_eof(self) -> None:
        """The stream's ``send_eof``."""
        await self._stream.send_eof()

    async def wait_send_all_might_not_block(self) -> None:
        """The stream's ``wait_send_all_might_not_block``."""
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """The stream's ``aclose``."""
        await self._stream.aclose()


async def _linger(stream: trio.SocketStream, max_bytes: int) -> None:
    """Lingering close (nginx's ``lingering_close``): end our side, then read and drop what the client still
    sends, for at most :data:`LINGER_S` seconds and ``max_bytes`` bytes. Closing with unread input makes the
    kernel reset the connection, which can destroy a reply the client has not read yet. Never raises for what
    the client does."""
    try:
        await stream.send_eof()
        dropped = 0
        with trio.move_on_after(LINGER_S):
            while dropped <= max_bytes:
                data = await stream.receive_some(_RECV)
                if not data:
                    return
                dropped += len(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


def _simple(status: int, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


async def _send(stream: trio.SocketStream, conn: h11.Connection, reply: tuple[int, list[tuple[bytes, bytes]], bytes],
                stats: ListenerStats, *, close: bool = False) -> bool:
    """Write a whole reply in one write (``connection: close`` when ``close``). False when h11 refuses it (the
    connection is past answering). Raises ``trio.BrokenResourceError`` when the client is gone or does not read
    it within :data:`SEND_TIMEOUT_S` (the connection is then unusable; the caller closes it)."""
    status, headers, body = reply
    if close:
        headers = [*headers, (b"connection", b"close")]
    try:
        data = conn.send(h11.Response(status_code=status, headers=headers))
        data = (data or b"") + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
    except h11.LocalProtocolError:
        return False
    try:
        with trio.fail_after(SEND_TIMEOUT_S):
            await stream.send_all(data)
    except trio.TooSlowError:
        stats.slow_client += 1
        raise trio.BrokenResourceError(f"the client took no reply within {SEND_TIMEOUT_S:g} s") from None
    return True


class _Exchange:
    """The ASGI ``receive`` and ``send`` of one fast-path request, on h11."""

    def __init__(self, stream: trio.SocketStream, conn: h11.Connection, stats: ListenerStats) -> None:
        self.stream = stream
        self.conn = conn
        self.stats = stats
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
            try:
                if self.conn.they_are_waiting_for_100_continue:
                    await self.stream.send_all(
                        self.conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
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
        if message.get("more_body", False):
            raise RuntimeError("the gossip handler sends its reply in one body message")
        # a body left unread (a refusal) ends the connection after the reply: say so, or the client reuses it
        close = self.gone or self.conn.their_state is not h11.DONE
        self.sent = await _send(self.stream, self.conn, (self.status, self.headers, message.get("body", b"")),
                                self.stats, close=close)
