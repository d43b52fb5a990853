"""``POST /gossip`` as a bare ASGI handler: the one route every peer calls several times a second, served without
the web framework's routing and middleware layers (about a third of an idle agent's CPU went to them).

Admission happens before the body is read: the sender host's byte bucket (429, ``retry-after: 1``; charged the
declared ``content-length``, or a whole ``gossip.max_body_bytes`` for a chunked or undeclared body), then a
request slot (503 when all ``gossip.max_concurrent_requests`` are taken). The body is read within
``gossip.max_body_bytes`` and ``gossip.request_timeout_s`` (413 ``oversized``, 408 ``too_slow``; a client gone
mid-body is ``malformed``), then decoded, verified and installed by :meth:`p2pnode.drivers.GossipDriver.handle`.
A reply to a client that already hung up is dropped and counted (``http_clients_gone``).

The route gets a :class:`GossipEndpoint`: the gossip driver's inbound half, where rejections are counted, the
gossip limits and the HTTP counters; nothing else of the node.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import msgspec
import trio
from starlette.types import Receive, Scope, Send

from ..config import GossipConfig
from ..errors import RejectedMessage, RejectReason
from ..gossip import Gossiper
from ..inputs import InputError, content_length
from ._surfaces import GossipInbound, HttpCounters, HttpSurfaces

__all__ = ["GossipEndpoint", "serve_gossip"]


class GossipEndpoint(msgspec.Struct, frozen=True, kw_only=True):
    """What ``POST /gossip`` uses: the driver's admission and handling (``driver``), the counter of rejected
    messages (``count_rejection``, :meth:`p2pnode.gossip.ClusterState.count_rejection`), the body limits
    (``limits``: ``max_body_bytes``, ``request_timeout_s``) and the replies dropped (``counters``)."""

    driver: GossipInbound
    count_rejection: Callable[[RejectReason], None]
    limits: GossipConfig
    counters: HttpCounters

    @classmethod
    def of(cls, s: HttpSurfaces) -> GossipEndpoint:
        """The endpoint over an agent's surfaces."""
        return cls(driver=s.gossip, count_rejection=s.cluster.count_rejection, limits=s.node.config.gossip,
                   counters=s.counters)


async def _read_body(receive: Receive, declared: int | None, limit: int, deadline_s: float) -> bytes:
    """The request body, at most ``limit`` bytes within ``deadline_s`` seconds (``declared``: its content-length,
    None when chunked or absent). Raises ``RejectedMessage`` (``oversized``, ``too_slow``, ``malformed`` when the
    client disconnects first)."""
    if declared is not None and declared > limit:
        raise RejectedMessage(RejectReason.OVERSIZED, f"declared {declared} bytes > limit {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        with trio.fail_after(deadline_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise RejectedMessage(RejectReason.MALFORMED, f"client disconnected after {size} body bytes")
                chunk = message.get("body", b"")
                if chunk:
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        raise RejectedMessage(RejectReason.OVERSIZED, f"body exceeds limit {limit}")
                if not message.get("more_body", False):
                    break
    except trio.TooSlowError:
        raise RejectedMessage(RejectReason.TOO_SLOW, f"{size} body bytes in {deadline_s:g} s") from None
    return b"".join(chunks)


async def _reply(counters: HttpCounters, send: Send, status: int, body: bytes, content_type: str,
                 retry_after: bool = False) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    if retry_after:
        headers.append((b"retry-after", b"1"))
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except (trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError):
        # hypercorn closed the socket of a client that hung up (see _ClientGoneGuard), or the listener's fast path
        # found it gone (p2pnode.drivers._listener)
        counters.client_gone()


async def _refuse(counters: HttpCounters, send: Send, status: int, error: str, detail: str) -> None:
    body = json.dumps({"error": error, "detail": detail}).encode()
    await _reply(counters, send, status, body, "application/json", retry_after=True)


async def serve_gossip(endpoint: GossipEndpoint, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one ``POST /gossip`` (see module docstring) at ``endpoint``."""
    header: str | None = None
    chunked = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            header = value.decode("latin-1")
        elif name == b"transfer-encoding":
            chunked = True
    if chunked:  # the body's length is the chunks' (RFC 9112 6.3): a content-length beside it is no declaration
        header = None
    try:
        declared = content_length(header)
    except InputError as exc:
        endpoint.count_rejection(RejectReason.MALFORMED)
        await _refuse(endpoint.counters, send, 400, "malformed", exc.detail)
        return
    client = scope.get("client")
    host = client[0] if client else ""
    driver = endpoint.driver
    if not driver.admit(host, declared):
        await _refuse(endpoint.counters, send, 429, "rate_limited", "gossip bytes per second of this host exceeded")
        return
    try:
        driver.slots.acquire_nowait()
    except trio.WouldBlock:
        driver.busy += 1
        await _refuse(endpoint.counters, send, 503, "busy", "too many gossip requests at once")
        return
    try:
        g = endpoint.limits
        try:
            body = await _read_body(receive, declared, g.max_body_bytes, g.request_timeout_s)
        except RejectedMessage as exc:
            endpoint.count_rejection(exc.reason)
            reply = Gossiper.error_reply(exc)
        else:
            reply = await driver.handle(body)
            # The reply counts against the same host's bytes: a 56-byte pull of a 1 MiB delta is no lever.
            driver.charge_reply(host, len(reply.body))
    finally:
        driver.slots.release()
    await _reply(endpoint.counters, send, reply.status, reply.body, reply.content_type)
