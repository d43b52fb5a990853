"""A checkpoint file over the data channel (issue 41's fetch): the holder ``sendfile(2)``s the bytes, the taker
``splice(2)``s them into its partial file and hashes each block from the page cache (drivers only; the same
zero-copy path as the sync push, :mod:`._channel` and :mod:`._splice`).

Why: over HTTP every byte is copied four times in user space by the Python HTTP stacks, and a 1 GiB fetch reached
0.07-0.15 of ``cp`` + ``sync`` (``docs/benchmarks.md``). The request is the HTTP route's own, carried on the data
port instead: the same target (``/sync/checkpoint/file?digest=HEX&file=N&offset=BYTES``) and the same member-signed
``x-p2pnode-auth`` value, checked by the same :meth:`p2pnode.drivers.Trust.authenticate_read` (the receiver is named
in the signature, its nonce spent once) and decoded by the same :class:`p2pnode.inputs.CheckpointFileQuery`::

    taker                                                holder (a node with a data channel: durable)
    P2R1 | length | msgpack {target, auth}          ->   authenticate, decode, find and open the file beneath
                                                    <-   frame {ok: true} (or {ok: false, status})
                                                    <-   the bytes from offset to the signed size, raw; close

The block hashes still come over HTTP (``part=hashes``, checked against the signed root); every block is checked
against them before it counts, exactly as over HTTP (:class:`p2pnode.sync.CheckpointFetch`).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Annotated

import msgspec
import trio
from msgspec import Meta

from .._files import open_beneath
from ..errors import SyncReplyRejected
from ..inputs import ChannelFrame, CheckpointFileQuery, InputError, decode_channel_frame, decode_query
from ..synccore import hash_block
from ..synccore._manifest import BLOCK_HASH_BYTES
from ._refuse import SyncReject
from ._splice import WRITEBACK_BYTES, _DiskFull, _Splicer, _start_writeback
from ._wire import MAX_FRAME, encode_frame

__all__ = ["READ_MAGIC", "CheckpointReads", "pull_checkpoint_file"]

log = logging.getLogger(__name__)

READ_MAGIC = b"P2R1"
"""The first bytes of a checkpoint read on the data channel (a block stream starts ``P2B1``)."""
MAX_READ_REQUEST = 4096
"""Largest read request accepted (a target of about 120 bytes and a signature header of a few hundred)."""
SEND_PIECE_BYTES = 8 << 20
"""Bytes handed to ``sendfile`` at a time."""
CHECKPOINT_FILE_PATH = "/sync/checkpoint/file"


class ReadRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A checkpoint read on the data channel (typed and bounded, decoded once): the HTTP route's target and its
    ``x-p2pnode-auth`` value."""

    target: Annotated[str, Meta(max_length=512)]
    auth: Annotated[str, Meta(max_length=2048)] | None = None


_REQUEST = msgspec.msgpack.Decoder(ReadRequest)


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class CheckpointReads:
    """The holder's side, called by :class:`~._channel.StreamServer` for a connection that starts with
    :data:`READ_MAGIC`. ``authenticate(header, method, target)``: None when accepted, else the refusal reason
    (the agent's :meth:`~p2pnode.drivers.Trust.authenticate_read`, any member may read); ``checkpoint_file(digest,
    index)``: where the file is read, as the HTTP route's (:func:`~._checkpoints.checkpoint_file_of`); ``count``:
    counts a refusal reason. Counters: ``reads``, ``read_bytes``."""

    def __init__(self, *, authenticate: Callable[[str | None, str, str], str | None],
                 checkpoint_file: Callable[[bytes, int], tuple[os.PathLike[str], str, int, int] | None],
                 count: Callable[[str], None], timeout_s: float) -> None:
        self.authenticate, self.checkpoint_file, self.count = authenticate, checkpoint_file, count
        self.timeout_s = timeout_s
        self.reads = 0
        self.read_bytes = 0

    def _open(self, body: bytes) -> tuple[int, int, int]:
        """The request's file: ``(fd, offset, size)``. Raises :class:`_Refused`."""
        try:
            req = _REQUEST.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise _Refused(400, "malformed") from exc
        path, _, query = req.target.partition("?")
        if path != CHECKPOINT_FILE_PATH:
            raise _Refused(400, "malformed")
        reason = self.authenticate(req.auth, "GET", req.target)
        if reason is not None:
            raise _Refused(401, "unauthorized")
        try:
            q = decode_query(urllib.parse.parse_qsl(query, keep_blank_values=True), CheckpointFileQuery)
        except (InputError, ValueError) as exc:
            raise _Refused(400, "invalid") from exc
        if q.part != "bytes":
            raise _Refused(400, "invalid")
        found = self.checkpoint_file(bytes.fromhex(q.digest), q.file)
        if found is None or q.offset > found[2]:
            raise _Refused(404, "not_found")
        base, rel, size, _ = found
        try:
            return open_beneath(base, rel, size=size), q.offset, size  # type: ignore[arg-type]
        except OSError as exc:
            raise _Refused(404, "not_found") from exc

    async def serve(self, stream: trio.SocketStream, body: bytes) -> None:
        """Answer one authenticated read (the prefix already read; ``body`` its request) and return."""
        try:
            fd, offset, size = await trio.to_thread.run_sync(self._open, body)
        except _Refused as exc:
            self.count(f"checkpoint_read_{exc.reason}")
            with trio.move_on_after(2.0):
                await stream.send_all(encode_frame({"ok": False, "status": exc.status}))
            return
        stop = threading.Event()
        try:
            await stream.send_all(encode_frame({"ok": True}))
        except BaseException:
            os.close(fd)
            raise
        try:
            sock_fd = os.dup(stream.socket.fileno())  # the worker's own: trio may close the stream's while it ends
        except BaseException:
            os.close(fd)
            raise
        owner = threading.Lock()
        claimed: list[str] = []  # "worker" (it closes both fds) or "task" (the worker never ran: closed here)

        def work() -> int:
            with owner:
                if claimed:
                    return 0
                claimed.append("worker")
            return _send_range(sock_fd, fd, offset, size, timeout_s=self.timeout_s, stop=stop)

        try:
            sent = await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        except BaseException:
            stop.set()  # a running worker stops within 0.5 s and closes the file and its socket
            with owner:
                if not claimed:  # cancelled while waiting for a thread slot: the worker will never own them
                    claimed.append("task")
                    os.close(fd)
                    os.close(sock_fd)
            raise
        self.reads += 1
        self.read_bytes += sent


def _send_range(sock_fd: int, fd: int, offset: int, end: int, *, timeout_s: float, stop: threading.Event) -> int:
    """``sendfile`` bytes ``[offset, end)`` of ``fd`` to the non-blocking socket ``sock_fd`` (blocking: a worker
    thread); the bytes sent. Raises ``TimeoutError`` after ``timeout_s`` without progress, ``OSError`` when the
    reader goes away, ``InterruptedError`` when ``stop`` is set. Closes ``fd`` and ``sock_fd``."""
    try:
        return _send(sock_fd, fd, offset, end, timeout_s=timeout_s, stop=stop)
    finally:
        os.close(fd)
        os.close(sock_fd)


def _send(sock_fd: int, fd: int, offset: int, end: int, *, timeout_s: float, stop: threading.Event) -> int:
    poll = select.poll()
    poll.register(sock_fd, select.POLLOUT)
    start = offset
    deadline = time.monotonic() + timeout_s
    while offset < end:
        if stop.is_set():
            raise InterruptedError("checkpoint read stopped")
        try:
            k = os.sendfile(sock_fd, fd, offset, min(SEND_PIECE_BYTES, end - offset))
        except BlockingIOError:
            k = -1
        if k == 0:
            break  # the file is shorter than signed (truncated meanwhile): the reader sees a short reply
        if k > 0:
            offset += k
            deadline = time.monotonic() + timeout_s
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the reader took nothing for {timeout_s:g} s")
        poll.poll(min(left, 0.5) * 1000)
    return offset - start


class _ChannelBadBlock(OSError):
    """A block from the holder does not match its hash (nothing of it kept)."""


def pull_checkpoint_file(host: str, port: int, target: str, auth: str | None, part: str | os.PathLike[str], *,
                         have: int, size: int, block_size: int, hashes: bytes, connect_timeout_s: float,
                         timeout_s: float, stop: threading.Event, progress: Callable[[int], None]) -> int:
    """Read ``target``'s bytes from ``have`` on from the holder's data channel into ``part`` (blocking: a worker
    thread), checking each block against ``hashes`` as it lands; the verified size. ``part`` is opened only once
    the holder has said ``{ok: true}``, and cut back to the verified end only when this call wrote into it (so a
    call that never got its reply cannot touch a file another fetch resumed or placed meanwhile). Every wait
    (connect, the reply, the bytes) is a ``poll`` of at most :data:`STOP_STEP_S` that checks ``stop``.
    ``progress(verified)`` after each verified block. Raises ``ConnectionRefusedError`` / ``TimeoutError`` /
    ``socket.gaierror`` when no channel answers (the caller uses HTTP), ``PermissionError`` /
    ``FileNotFoundError`` / ``OSError`` when the holder refuses the read (its ``status`` attribute: the HTTP
    status), :class:`_ChannelBadBlock` for a block that does not match, ``ConnectionError`` for a reply that ends
    early, ``InterruptedError`` when ``stop`` is set."""
    body = msgspec.msgpack.encode(ReadRequest(target=target, auth=auth))
    sock = _connect(host, port, connect_timeout_s, stop)
    try:
        sock.setblocking(False)
        _send_all(sock, READ_MAGIC + len(body).to_bytes(4, "big") + body, timeout_s, stop)
        ready = _read_frame(sock, timeout_s, stop)
        if ready.ok is not True:
            exc = {401: PermissionError, 404: FileNotFoundError}.get(ready.status, OSError)(
                f"the holder's data channel refused the read (HTTP {ready.status})")
            exc.status = ready.status  # type: ignore[attr-defined]
            raise exc
        if stop.is_set():  # (the reply may have been there at once, with no wait to see stop in)
            raise InterruptedError("checkpoint read stopped")
        fd = os.open(part, os.O_RDWR | os.O_NOFOLLOW)
        verified = pos = have
        touched = False  # whether this call moved bytes into the file (a splice may fail half done)
        try:
            with _Splicer(sock.fileno(), fd, timeout_s, stop) as rx:
                dirty_from = have
                while pos < size:
                    if stop.is_set():
                        raise InterruptedError("checkpoint read stopped")
                    touched = True
                    try:
                        pos += rx.read_into(pos, size - pos)
                    except _DiskFull as full:
                        raise OSError(errno.ENOSPC, f"the partial checkpoint file: {full}") from full
                    while verified < pos and (n := min(block_size, size - verified)) <= pos - verified:
                        i = verified // block_size
                        if hash_block(os.pread(fd, n, verified)) != hashes[i * BLOCK_HASH_BYTES:(i + 1) *
                                                                             BLOCK_HASH_BYTES]:
                            raise _ChannelBadBlock(f"block {i} does not match its hash")
                        verified += n
                        progress(verified)
                    if pos - dirty_from >= WRITEBACK_BYTES:
                        _start_writeback(fd, dirty_from, pos - dirty_from)
                        dirty_from = pos
            return verified
        finally:
            try:
                if touched:  # only when this call wrote: what it wrote past its verified end goes
                    os.ftruncate(fd, verified)
            finally:
                os.close(fd)
    finally:
        sock.close()


STOP_STEP_S = 0.1
"""The longest a data-channel taker waits (seconds) before it looks at its ``stop`` again."""


def _wait_for(sock: socket.socket, events: int, deadline: float, stop: threading.Event, what: str) -> None:
    poll = select.poll()
    poll.register(sock.fileno(), events)
    while True:
        if stop.is_set():
            raise InterruptedError("checkpoint read stopped")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the holder's data channel: no {what} in time")
        if poll.poll(min(left, STOP_STEP_S) * 1000):
            return


def _connect(host: str, port: int, timeout_s: float, stop: threading.Event) -> socket.socket:
    """A connected non-blocking socket to ``(host, port)``, within ``timeout_s``, checking ``stop``. Raises
    ``OSError`` (``TimeoutError``, ``ConnectionRefusedError``, ``socket.gaierror``), ``InterruptedError``."""
    deadline = time.monotonic() + timeout_s
    error: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            err = sock.connect_ex(addr)
            if err in (errno.EINPROGRESS, errno.EAGAIN):
                _wait_for(sock, select.POLLOUT, deadline, stop, "connection")
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err == 0:
                return sock
            error = OSError(err, os.strerror(err))
            if err == errno.ECONNREFUSED:
                error = ConnectionRefusedError(err, os.strerror(err))
        except BaseException:
            sock.close()
            raise
        sock.close()
    raise error


def _send_all(sock: socket.socket, data: bytes, timeout_s: float, stop: threading.Event) -> None:
    view = memoryview(data)
    deadline = time.monotonic() + timeout_s
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            _wait_for(sock, select.POLLOUT, deadline, stop, "room for the request")


def _recv_exactly(sock: socket.socket, n: int, deadline: float, stop: threading.Event) -> bytes:
    """``n`` bytes from the non-blocking ``sock`` (however many reads they take), or fewer when it closes."""
    buf = bytearray()
    while len(buf) < n:
        try:
            got = sock.recv(n - len(buf))
        except BlockingIOError:
            _wait_for(sock, select.POLLIN, deadline, stop, "reply")
            continue
        if not got:
            break
        buf += got
    return bytes(buf)


def _read_frame(sock: socket.socket, timeout_s: float, stop: threading.Event) -> ChannelFrame:
    deadline = time.monotonic() + timeout_s
    head = _recv_exactly(sock, 4, deadline, stop)
    if len(head) != 4:
        raise ConnectionError("the holder closed the data channel")
    n = int.from_bytes(head, "big")
    if n > MAX_FRAME:
        raise ConnectionError(f"data-channel frame of {n} bytes > {MAX_FRAME}")
    data = _recv_exactly(sock, n, deadline, stop)
    if len(data) != n:
        raise ConnectionError("the holder closed the data channel mid-frame")
    try:
        return decode_channel_frame(data)
    except SyncReplyRejected as exc:  # a frame that is not one: no channel to use
        raise ConnectionError(f"not a data-channel frame: {exc}") from exc


def read_request_length(prefix: bytes) -> int:
    """The request length from a :data:`READ_MAGIC` prefix (8 bytes). Raises ``SyncReject``."""
    n = int.from_bytes(prefix[4:8], "big")
    if n > MAX_READ_REQUEST:
        raise SyncReject("oversized", f"checkpoint read of {n} bytes > {MAX_READ_REQUEST}")
    return n
