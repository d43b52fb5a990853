"""The sync data channel: block streams over plain TCP beside the HTTP port (drivers only; framing in ``_wire``).

Why a second port: over HTTP every block byte is copied four times in user space by the Python HTTP stacks on
both ends, and 1 GiB cost the receiver ~6.5 CPU-seconds here (``docs/benchmarks.md``). On the data channel the
sender hands file pages to the socket with ``sendfile(2)`` and the receiver moves them from the socket into the
partial file with ``splice(2)``; only hashing reads them. Control stays on HTTP: the first request of a pass
(manifests, small deltas) and everything else go through ``POST /sync/push``; only the bulk of a transfer (the
blocks a target answered it still needs) takes the channel. Like Syncthing's data port or Consul's RPC port,
it is a separate listener (``sync.data_port``, default 8771), advertised in the durable node's signed snapshot.
A sender that cannot connect falls back to HTTP for that target.

One connection carries one file's blocks::

    sender                                            receiver
    P2B1 | header length | header | signature   ->    authenticate, check, open the partial file
                                                <-    frame {ok: true} (or {ok: false, status, files: [result]})
    the blocks of the runs, raw, in order       ->    splice each into place, hash it, count it if it matches
                                                <-    frame {status, files: [result]}   (then both close)

A frame is a 4-byte big-endian length and a msgpack map. The result is :meth:`ReplicaStore.apply`'s.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ..errors import SyncReplyRejected
from ..inputs import ChannelFrame, decode_channel_frame
from ..synccore import Manifest
from ._ckchannel import READ_MAGIC, CheckpointReads, read_request_length
from ._refuse import RefusalLog, SyncReject
from ._wire import (
    MAX_FRAME,
    SIGNATURE_BYTES,
    STREAM_PREFIX_BYTES,
    decode_stream_header,
    encode_frame,
    stream_header_length,
)

if TYPE_CHECKING:  # a durable node's (issue 43: an idle agent's RSS)
    from ._store import ReplicaStore

__all__ = ["HEADER_TIMEOUT_S", "MAX_CONNECTIONS", "MAX_PENDING", "StreamServer", "send_stream", "split_host"]

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 2.0
"""A connection must deliver its complete signed header within this many seconds of being accepted, else it is
refused (``too_slow``). A sender writes its header (at most :data:`MAX_STREAM_HEADER`, usually a few KiB) at once."""
MAX_CONNECTIONS = 16
"""Block streams a receiver serves at once. A slot is taken only after a valid signed header arrived, so
connections that send nothing never hold one; a stream beyond it is refused at once (``busy``, the sender then
uses HTTP)."""
MAX_PENDING = 256
"""Connections waiting for their header at most (each costs a socket and a task, for at most
:data:`HEADER_TIMEOUT_S`); a new one beyond it drops the oldest waiting one (``overloaded``)."""
SEND_CHUNK_BYTES = 8 * 2**20
"""Bytes handed to ``sendfile`` at a time by default (progress and pacing step)."""


async def _receive_exactly(stream: trio.SocketStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        if not chunk:
            raise SyncReject("malformed", f"connection closed after {len(buf)} of {n} header bytes")
        buf += chunk
    return bytes(buf)


class StreamServer:
    """The receiving end, served with ``trio.serve_listeners(server.handle, listeners)``.

    ``key_of(origin)``: the member's public key or None (not a member); ``admit()``: raises
    ``SyncReject("backpressure")`` when the disk is at its critical level; ``lock_of(origin)``: the per-origin
    lock shared with the HTTP route; ``on_commit(origin, paths)``: called in the trio thread after a commit (publish
    the receipt to the origin, wake the checkpoint pass); ``count(reason)``: counts a refusal that did not reach the
    store. Counters: ``streams``, ``stream_bytes``.
    """

    def __init__(self, store: ReplicaStore, *, key_of: Callable[[str], bytes | None], admit: Callable[[], None],
                 lock_of: Callable[[str], trio.Lock], on_commit: Callable[[str, tuple[str, ...]], None],
                 count: Callable[[str], None], now: Callable[[], float], max_skew_s: float, timeout_s: float) -> None:
        self.store = store
        self.key_of, self.admit, self.lock_of, self.on_commit, self.count = key_of, admit, lock_of, on_commit, count
        self.now, self.max_skew_s, self.timeout_s = now, max_skew_s, timeout_s
        self.slots = trio.Semaphore(MAX_CONNECTIONS)
        self._pending: OrderedDict[int, list[Any]] = OrderedDict()  # id -> [cancel scope, evicted]
        self._log_refusal = RefusalLog("sync: refused a block stream")
        self._next_id = 0
        self.reads: CheckpointReads | None = None
        """Checkpoint reads (:mod:`._ckchannel`; None: a connection starting ``P2R1`` is refused as malformed)."""
        self.streams = 0
        self.stream_bytes = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one accepted connection (one block stream) and close it; never raises but ``Cancelled``."""
        async with stream:
            try:
                await self._handle(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.info("sync: a data-channel connection broke: %s", exc)
            except Exception:  # one connection's bug must not take the agent (membership, jobs) down with it
                log.exception("sync: a data-channel connection failed unexpectedly")

    async def _read_header(self, stream: trio.SocketStream) -> tuple[bytes, bytes] | None:
        """The raw header and signature (for a checkpoint read: :data:`READ_MAGIC` and its request), or None when
        the connection was refused (counted): no complete header within :data:`HEADER_TIMEOUT_S` (``too_slow``), or
        dropped for a newer one beyond :data:`MAX_PENDING` waiting connections (``overloaded``). Raises
        ``SyncReject`` for a wrong magic or an oversized header."""
        me = self._next_id
        self._next_id += 1
        entry: list[Any] = [trio.CancelScope(deadline=trio.current_time() + HEADER_TIMEOUT_S), False]
        self._pending[me] = entry
        while len(self._pending) > MAX_PENDING:
            _, oldest = self._pending.popitem(last=False)
            oldest[1] = True
            oldest[0].cancel()
        try:
            with entry[0]:
                prefix = await _receive_exactly(stream, STREAM_PREFIX_BYTES)
                if prefix[:4] == READ_MAGIC and self.reads is not None:  # a checkpoint read (._ckchannel)
                    return READ_MAGIC, await _receive_exactly(stream, read_request_length(prefix))
                header = await _receive_exactly(stream, stream_header_length(prefix))
                sig = await _receive_exactly(stream, SIGNATURE_BYTES)
                return header, sig
        finally:
            self._pending.pop(me, None)
        if entry[1]:  # reached only when the scope was cancelled
            self.count("overloaded")
            log.debug("sync: dropped a data-channel connection still without a header (%d waiting)", MAX_PENDING)
        else:
            await self._refuse(stream, SyncReject("too_slow", f"no complete header within {HEADER_TIMEOUT_S:g} s"),
                               timeout_s=0.5)
        return None

    async def _refuse(self, stream: trio.SocketStream, exc: SyncReject, *, counted: bool = False,
                      timeout_s: float = 2.0) -> None:
        """Count (unless ``counted``) and answer a refusal frame, giving up on a peer that does not read it
        within ``timeout_s`` seconds."""
        if not counted:
            self.count(exc.reason)
        self._log_refusal(exc, time.monotonic())
        with trio.move_on_after(timeout_s):
            try:
                await stream.send_all(encode_frame({"ok": False, "status": exc.status, "files": [
                    {"path": "", "status": "rejected", "reason": exc.reason, "detail": exc.detail}]}))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            got = await self._read_header(stream)
            if got is None:
                return
            if got[0] == READ_MAGIC and self.reads is not None:
                await self._serve_read(stream, got[1])
                return
            origin, item, runs = decode_stream_header(*got, key_of=self.key_of, now=self.now(),
                                                      max_skew_s=self.max_skew_s)
            self.admit()
        except SyncReject as exc:
            await self._refuse(stream, exc)
            return
        try:
            self.slots.acquire_nowait()
        except trio.WouldBlock:
            await self._refuse(stream, SyncReject("busy", f"{MAX_CONNECTIONS} streams under way"))
            return
        try:
            await self._serve(stream, origin, item, runs)
        finally:
            self.slots.release()

    async def _serve_read(self, stream: trio.SocketStream, body: bytes) -> None:
        """A checkpoint read (:mod:`._ckchannel`), holding a slot like a block stream."""
        assert self.reads is not None
        try:
            self.slots.acquire_nowait()
        except trio.WouldBlock:
            self.count("busy")
            with trio.move_on_after(2.0):
                await stream.send_all(encode_frame({"ok": False, "status": 503}))
            return
        try:
            await self.reads.serve(stream, body)
        finally:
            self.slots.release()

    async def _serve(self, stream: trio.SocketStream, origin: str, item: Any, runs: list[tuple[int, int]]) -> None:
        """Receive one authenticated stream (holding a slot): open the transfer, splice the blocks, finish."""
        store = self.store
        lock = self.lock_of(origin)
        async with lock:
            try:
                t = await trio.to_thread.run_sync(store.open_stream, origin, item)
            except SyncReject as exc:
                await self._refuse(stream, exc, counted=True)
                return
        if t is None:
            await stream.send_all(encode_frame({"ok": False, "status": 200, "files": [
                {"path": item.path, "status": "have", "need": []}]}))
            return
        # The blocks arrive without the origin's lock (a large file must not hold up that origin's other files,
        # such as a live database's next commit); the transfer is marked streaming, so no other writer touches it.
        before = store.bytes_received
        bad: list[SyncReject] | None = None
        stop = threading.Event()
        fd = stream.socket.fileno()
        try:
            await stream.send_all(encode_frame({"ok": True}))
            bad = await trio.to_thread.run_sync(
                lambda: store.receive_stream(t, runs, fd, timeout_s=self.timeout_s, stop=stop), abandon_on_cancel=True)
        except trio.Cancelled:
            stop.set()  # shutting down: the worker stops within 0.5 s; a restart finds the verified blocks on disk
            raise
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:  # includes ConnectionError,
            log.info("sync: stream of %s from %s stopped: %s (%d blocks verified so far)",  # TimeoutError
                     item.path, origin, exc, len(t.verified))
        except BaseException:
            t.streaming = False  # a bug: the transfer must not stay locked for good
            raise
        finally:
            self.streams += 1
            self.stream_bytes += store.bytes_received - before
        async with lock:
            try:
                result = await trio.to_thread.run_sync(store.finish_stream, t, item.commit and bad is not None,
                                                       bad or [])
            except SyncReject as exc:  # corrupt_on_commit
                store.rejected[exc.reason] += 1
                result = {"path": item.path, "status": "rejected", "reason": exc.reason, "detail": exc.detail,
                          "http_status": exc.status}
        if bad is None:
            return
        if result.get("status") == "committed":
            self.on_commit(origin, (item.path,))
        status = result.pop("http_status", 200)
        await stream.send_all(encode_frame({"status": status, "files": [result]}))


def _read_frame(sock: socket.socket) -> ChannelFrame:
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) != 4:
        raise ConnectionError("the receiver closed the data channel")
    n = int.from_bytes(head, "big")
    if n > MAX_FRAME:
        raise SyncReplyRejected("reply_oversized", f"data-channel frame of {n} bytes > {MAX_FRAME}")
    body = sock.recv(n, socket.MSG_WAITALL) if n else b""
    if len(body) != n:
        raise ConnectionError("the receiver closed the data channel mid-frame")
    return decode_channel_frame(body)  # typed and bounded (p2pnode.inputs)


def send_stream(host: str, port: int, header: bytes, path: str | os.PathLike[str], manifest: Manifest,
                runs: list[tuple[int, int]], *, connect_timeout_s: float, timeout_s: float,
                chunk_bytes: int = SEND_CHUNK_BYTES, pace: Callable[[int], None] | None = None,
                progress: Callable[[int], None] | None = None,
                stop: threading.Event | None = None) -> ChannelFrame:
    """Send one block stream (blocking): ``header`` (from :func:`encode_stream_header`), then the blocks of
    ``runs`` read from ``path`` with ``sendfile(2)``, and return the receiver's final frame (or its refusal).
    Bytes go in pieces of ``chunk_bytes``: ``pace(n)`` blocks until ``n`` more bytes may go (bandwidth cap);
    ``progress(n)`` is told of each piece sent.
    Raises ``OSError`` (``ConnectionRefusedError`` / ``TimeoutError`` on connect: no channel there) and
    :class:`~p2pnode.errors.SyncReplyRejected` for a frame that is not one (``reply_malformed``, ``reply_invalid``,
    ``reply_oversized``); ``InterruptedError`` when ``stop`` is set between chunks."""
    sock = socket.create_connection((host, port), timeout=connect_timeout_s)
    try:
        sock.settimeout(timeout_s)
        sock.sendall(header)
        ready = _read_frame(sock)
        if ready.ok is not True:
            return ready
        bs = manifest.block_size
        with open(path, "rb") as fh:
            for first, count in runs:
                off = first * bs
                end = min(manifest.size, (first + count) * bs)
                while off < end:
                    if stop is not None and stop.is_set():
                        raise InterruptedError("stream send stopped")
                    n = min(chunk_bytes, end - off)
                    if pace is not None:
                        pace(n)
                    sent = sock.sendfile(fh, off, n)
                    if sent != n:
                        raise ConnectionError(f"sendfile sent {sent} of {n} bytes (file shrank?)")
                    off += n
                    if progress is not None:
                        progress(n)
        return _read_frame(sock)
    finally:
        sock.close()


def split_host(addr: str) -> str:
    """The host of a ``host:port`` or ``[v6]:port`` address."""
    host = addr.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host

