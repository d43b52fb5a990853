"""Receiving pushes on a durable node: checks before the body, a body budget, per-origin locks, the data channel.

``POST /sync/push`` is decided as far as possible before a body byte is read (declared length, durable role,
disk not critical, a member's key, a time within skew), then a reservation from :class:`ByteBudget` bounds the
bodies held at once, and the signature is checked as soon as the signed header part arrived. Block streams
arrive on the data channel (:class:`~._channel.StreamServer`) with the same checks. Both apply what they got to
the :class:`~._store.ReplicaStore` under the origin's lock, in a worker thread; a commit is published to its
origin at once (:meth:`~p2pnode.node.NodeContext.publish_to`), since it counts only from this node's snapshot.

Retention (``sync.retention_cap_bytes``): while the last retention pass found the replica folder past its cap with
nothing more that may go (:attr:`Inbound.cap_full`), every push and stream is refused like a critical disk (507
``backpressure``, counted also as ``replica_cap`` in :attr:`Inbound.cap_refusals`); a commit that takes the folder
past the cap calls :attr:`Inbound.on_over_cap` (the driver runs a retention pass soon).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncIterable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..gossip import MemberState
from ..inputs import InputError
from ..inputs import content_length as decode_content_length
from ._channel import StreamServer
from ._ckchannel import CheckpointReads
from ._refuse import RefusalLog, SyncReject
from ._wire import PUSH_PATH, PushAuth, decode_push, encode_reply, header_part_length, precheck_headers

if TYPE_CHECKING:
    from ..config import SyncConfig
    from ..node import NodeContext
    from ._store import ReplicaStore

__all__ = ["PUSH_BODY_BUDGET_BYTES", "ByteBudget", "Inbound"]

log = logging.getLogger(__name__)

PUSH_BODY_BUDGET_BYTES = 64 * 2**20
"""Bytes of ``POST /sync/push`` bodies a durable node holds at once, at least ``sync.max_request_bytes``. A
request reserves its declared ``Content-Length`` (a chunked one: ``max_request_bytes``) before its body is read
and keeps it until it is answered; one that does not fit is refused at once (503 ``overloaded``, retry-after).
With the defaults: eight 8 MiB pushes, or one chunked body, at a time."""


class ByteBudget:
    """At most ``capacity`` bytes reserved at once. :meth:`take_nowait` never waits (the caller refuses instead)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0

    def take_nowait(self, n: int) -> bool:
        """Reserve ``n`` bytes; False (nothing reserved) when they do not fit beside those reserved."""
        if self.used + n > self.capacity:
            return False
        self.used += n
        self.peak = max(self.peak, self.used)
        return True

    def release(self, n: int) -> None:
        """Give back ``n`` bytes reserved by :meth:`take_nowait`."""
        self.used -= n


class Inbound:
    """Pushes and block streams from members into ``store`` (None: this node is not durable and refuses them all
    as ``not_member``). ``rejected``: refusals before the store (shared with the driver's other counters)."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, store: ReplicaStore | None, rejected: Counter[str]) -> None:
        self.ctx, self.cfg, self.store, self.rejected = ctx, cfg, store, rejected
        self.body_budget = ByteBudget(max(cfg.max_request_bytes, PUSH_BODY_BUDGET_BYTES))
        self._origin_locks: dict[str, trio.Lock] = {}
        self._log_refusal = RefusalLog("sync: refused a push")
        self.data_port: int | None = None  # the data channel's bound port
        self.channel: StreamServer | None = None
        self.read_auth: Callable[[str | None, str, str], str | None] = lambda header, method, target: "no_reader"
        """A member-signed read's check (None: accepted, else the reason; the agent sets it to its trust's): the
        data channel's checkpoint reads (:mod:`._ckchannel`) are refused until then."""
        self.checkpoint_file: Callable[[bytes, int], tuple[Path, str, int, int] | None] = lambda digest, index: None
        """Where a checkpoint's file is read here (the sync service sets it: the HTTP route's lookup)."""
        self.cap_full: str | None = None  # why the replica folder is full (set by the retention pass), None: room
        self.cap_refusals: Counter[str] = Counter()
        self.on_over_cap: Callable[[], None] | None = None
        self.on_commit: Callable[[str, tuple[str, ...]], None] | None = None
        """Called after each commit with the origin and the paths committed (the sync service: the checkpoint pass
        runs when a checkpoint waiting for one of these files may be held now)."""

    def key_of(self, origin: str) -> bytes | None:
        """The public key of ``origin`` when it may push here: a member (not this node) neither dead nor left."""
        m = self.ctx.member(origin)
        if m is None or origin == self.ctx.node_id:
            return None
        if self.ctx.state_of(origin) in (MemberState.DEAD, MemberState.LEFT):
            return None
        return m.key

    def admit(self) -> None:
        """Raise ``SyncReject("backpressure")`` while this node's disk is at its critical level, or while its replica
        folder is past ``retention_cap_bytes`` with only replicas left that may not go (:attr:`cap_full`; also
        counted in :attr:`cap_refusals` as ``replica_cap``)."""
        sample = self.ctx.last_sample
        limit = self.ctx.config.guard.disk_max_percent
        if sample is not None and sample.disk_percent >= limit:
            raise SyncReject("backpressure", f"disk at {sample.disk_percent:.1f} % >= {limit:g} % (critical)")
        if self.cap_full is not None:
            self.cap_refusals["replica_cap"] += 1
            raise SyncReject("backpressure", self.cap_full)

    def committed(self, origin: str, paths: tuple[str, ...] = ()) -> None:
        """After a commit of ``paths`` from ``origin``: publish to it at once (the receipt counts only from our
        snapshot), call :attr:`on_commit` and, when the replica folder passed its cap, :attr:`on_over_cap`."""
        self.ctx.publish_to(origin)
        if self.on_commit is not None:
            self.on_commit(origin, paths)
        cap = self.cfg.retention_cap_bytes
        if cap > 0 and self.on_over_cap is not None and self.store is not None and self.store.held_bytes() > cap:
            self.on_over_cap()

    def lock_of(self, origin: str) -> trio.Lock:
        """The lock serialising ``origin``'s store calls (shared by the HTTP route and the data channel)."""
        return self._origin_locks.setdefault(origin, trio.Lock())

    def count(self, reason: str) -> None:
        """Count a refusal that did not reach the store."""
        self.rejected[reason] += 1

    async def serve_channel(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``sync.data_port``. A port that cannot be bound is logged and the channel left off: senders
        then use HTTP. ``task_status.started()`` once listening (or given up)."""
        assert self.store is not None
        bind = self.ctx.config.agent.bind or "0.0.0.0"  # one listener: one port to advertise, also for port 0
        try:
            listeners = await trio.open_tcp_listeners(self.cfg.data_port, host=bind)
        except OSError as exc:
            log.warning("sync: data channel off, port %d on %s unavailable (%s); blocks go over HTTP",
                        self.cfg.data_port, bind, exc)
            task_status.started()
            return
        self.data_port = listeners[0].socket.getsockname()[1]
        self.channel = StreamServer(
            self.store, key_of=self.key_of, admit=self.admit, lock_of=self.lock_of,
            on_commit=self.committed, count=self.count, now=time.time,
            max_skew_s=self.cfg.max_clock_skew_s, timeout_s=self.cfg.request_timeout_s)
        self.channel.reads = CheckpointReads(
            authenticate=lambda header, method, target: self.read_auth(header, method, target),
            checkpoint_file=lambda digest, index: self.checkpoint_file(digest, index), count=self.count,
            timeout_s=self.cfg.request_timeout_s)
        log.info("sync: data channel on port %d", self.data_port)
        self.ctx.publish_soon()  # news: senders that saw only the first snapshot would use HTTP until a heartbeat
        task_status.started()
        await trio.serve_listeners(self.channel.handle, listeners)

    def _refusal(self, exc: SyncReject) -> tuple[int, bytes]:
        self.count(exc.reason)
        self._log_refusal(exc, time.monotonic())
        return exc.status, encode_reply([{"path": "", "status": "rejected", "reason": exc.reason,
                                          "detail": exc.detail}])

    def _precheck(self, headers: Any) -> PushAuth:
        """What can be decided before a body byte is read: durable, disk not critical, the headers name a member
        whose key we hold, a time within skew, a well-formed signature. Raises :class:`SyncReject`."""
        if self.store is None:
            raise SyncReject("not_member", "this node is not tagged durable: it keeps no replicas")
        self.admit()
        return precheck_headers(headers, key_of=self.key_of, now=time.time(), max_skew_s=self.cfg.max_clock_skew_s)

    async def receive_push(self, headers: Any, content_length: str | None,
                           chunks: AsyncIterable[bytes]) -> tuple[int, bytes]:
        """``POST /sync/push`` with its body still unread (``chunks``): returns (HTTP status, msgpack reply).

        Bounded work before authentication: (1) a declared length above ``max_request_bytes`` is refused (413) and
        the headers are checked (:meth:`_precheck`), all before a body byte is read; (2) the declared length (a
        chunked body: ``max_request_bytes``) is reserved from :attr:`body_budget`, else 503 ``overloaded``
        at once; (3) the body is read into one buffer within ``request_timeout_s`` seconds (else 408
        ``too_slow``), and the signature is checked as soon as the signed header part has arrived, before the
        blocks. Every refusal is counted. A client that disconnects makes ``chunks`` raise (the caller's
        framework exception, e.g. starlette's ``ClientDisconnect``): it propagates, the reservation released."""
        limit = self.cfg.max_request_bytes
        try:
            try:
                declared = decode_content_length(content_length)
            except InputError as exc:
                raise SyncReject("malformed", exc.detail) from None
            if declared is not None and declared > limit:
                raise SyncReject("oversized", f"declared {declared} bytes > limit {limit}")
            auth = self._precheck(headers)
        except SyncReject as exc:
            return self._refusal(exc)
        reserve = declared if declared is not None else limit
        if not self.body_budget.take_nowait(reserve):
            return self._refusal(SyncReject("overloaded", f"{self.body_budget.used} of {self.body_budget.capacity} "
                                            "body bytes held by pushes under way"))
        try:
            try:
                with trio.fail_after(self.cfg.request_timeout_s):
                    origin, body = await self._read_body(auth, declared, chunks)
            except trio.TooSlowError:
                raise SyncReject("too_slow", f"body not complete within {self.cfg.request_timeout_s:g} s") from None
            return await self._apply(origin, body)
        except SyncReject as exc:
            return self._refusal(exc)
        finally:
            self.body_budget.release(reserve)

    async def _read_body(self, auth: PushAuth, declared: int | None,
                         chunks: AsyncIterable[bytes]) -> tuple[str, bytearray]:
        """The authenticated origin and the body: one buffer (of the declared size, else grown), the signature
        checked once the length prefix and header are in. Raises :class:`SyncReject` (``oversized``,
        ``malformed``, ``bad_signature``)."""
        limit = self.cfg.max_request_bytes if declared is None else declared
        buf = bytearray(declared) if declared is not None else bytearray()
        size, signed_end, origin = 0, None, None
        async for chunk in chunks:
            n = len(chunk)
            if size + n > limit:
                raise SyncReject("oversized" if declared is None else "malformed",
                                 f"body exceeds {'the limit' if declared is None else 'its declared length'} {limit}")
            if declared is not None:
                buf[size:size + n] = chunk
            else:
                buf += chunk
            size += n
            if origin is None:
                if signed_end is None and size >= 4:
                    signed_end = header_part_length(buf, limit)
                if signed_end is not None and size >= signed_end:
                    with memoryview(buf) as view, view[:signed_end] as part:
                        origin = auth.verify("POST", PUSH_PATH, part)
        if declared is not None and size != declared:
            raise SyncReject("malformed", f"body of {size} bytes, {declared} declared")
        if origin is None:
            raise SyncReject("malformed", f"body of {size} bytes ends inside its header")
        return origin, buf

    async def _apply(self, origin: str, body: bytes | bytearray) -> tuple[int, bytes]:
        """Decode an authenticated push body and apply its items. Raises ``SyncReject("malformed")``."""
        items = decode_push(body)
        store = self.store
        assert store is not None
        await trio.to_thread.run_sync(store.prehash, items)
        async with self.lock_of(origin):
            results = await trio.to_thread.run_sync(lambda: [store.apply(origin, it) for it in items])
        paths = tuple(str(r.get("path", "")) for r in results if r["status"] == "committed")
        if paths:
            self.committed(origin, paths)
        status = next((r.pop("http_status") for r in results if "http_status" in r), 200)
        for r in results:
            r.pop("http_status", None)
        return status, encode_reply(results)
