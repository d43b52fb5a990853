"""Zero-copy stream receive: a block stream's bytes spliced from the socket into a partial file and hashed as they land.

Each block goes from the socket into its place in the partial file with ``splice(2)`` (through a pipe: no copy
into user space; ``recv`` + ``pwrite`` where the platform lacks it), is hashed from the page cache and counts only
if it matches its manifest hash. Dirty pages are handed to writeback as they accumulate (``sync_file_range``),
so the commit's fsync finds little left to flush (RocksDB's ``bytes_per_sync`` does the same). Blocking I/O: run
in a worker thread.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import mmap
import os
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..synccore import hash_block
from ._partial import NO_SPACE_ERRNOS, Transfer
from ._refuse import SyncReject

__all__ = ["RCVLOWAT_BYTES", "WRITEBACK_BYTES", "receive_runs"]

log = logging.getLogger(__name__)

WRITEBACK_BYTES = 8 * 2**20
"""Dirty bytes of a stream after which their writeback is started."""
_SPLICE_PIPE_BYTES = 2**20
RCVLOWAT_BYTES = 256 * 1024
"""A receiver wakes when this many bytes (or all still due) have arrived: fewer, larger pieces."""
_libc: Any = None


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` back (``sync_file_range(2)`` with
    ``SYNC_FILE_RANGE_WRITE``: asynchronous, no durability promise; the commit's fsync gives that). A no-op
    where the call does not exist."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.sync_file_range(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE


class _DiskFull(Exception):
    """The partial file could not take a piece (``ENOSPC``/``EDQUOT``) after ``taken`` bytes of it left the
    socket."""

    def __init__(self, taken: int, exc: OSError) -> None:
        super().__init__(exc.strerror)
        self.taken = taken


class _Splicer:
    """Reads exact byte counts from a non-blocking socket into a file at given offsets: ``splice(2)`` through a
    pipe where the platform has it (the bytes never enter user space), ``recv_into`` + ``pwrite`` otherwise."""

    def __init__(self, sock_fd: int, fd: int, timeout_s: float, stop: threading.Event | None) -> None:
        self.sock_fd, self.fd, self.timeout_s, self.stop = sock_fd, fd, timeout_s, stop
        self.poll = select.poll()
        self.poll.register(sock_fd, select.POLLIN)
        self.sock = socket.socket(fileno=os.dup(sock_fd))  # for setsockopt only (same connection)
        self.lowat = 1
        self.pipe: tuple[int, int] | None = None
        self.buf: memoryview | None = None
        self.piece = _SPLICE_PIPE_BYTES

    def __enter__(self) -> _Splicer:
        if hasattr(os, "splice"):
            r, w = os.pipe2(os.O_CLOEXEC)
            self.pipe = (r, w)
            try:
                self.piece = fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), _SPLICE_PIPE_BYTES)
            except OSError:
                self.piece = fcntl.fcntl(w, getattr(fcntl, "F_GETPIPE_SZ", 1032))  # the default: more, smaller pieces
        else:
            self.buf = memoryview(bytearray(_SPLICE_PIPE_BYTES))
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        if self.pipe is not None:
            os.close(self.pipe[0])
            os.close(self.pipe[1])

    def _wait(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.stop is not None and self.stop.is_set():
                raise InterruptedError("stream receive stopped")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no stream bytes for {self.timeout_s:g} s")
            if self.poll.poll(min(left, 0.5) * 1000):
                return

    def read_into(self, offset: int, n: int) -> int:
        """Move the next piece of the stream, at most ``n`` bytes (and at most a pipe's worth), into the file at
        ``offset``; return its length (> 0). Waits for data with ``poll`` (waking when ``SO_RCVLOWAT`` bytes,
        or all that is still due, have arrived: fewer, larger pieces, so fewer GIL hand-offs per GiB)."""
        want = min(n, self.piece)
        self._set_lowat(min(want, RCVLOWAT_BYTES))
        while True:
            try:
                if self.pipe is not None:
                    k = os.splice(self.sock_fd, self.pipe[1], want)
                else:
                    assert self.buf is not None
                    k = os.readv(self.sock_fd, [self.buf[:want]])
            except BlockingIOError:
                self._wait()
                continue
            break
        if k == 0:
            raise ConnectionError("the stream ended before its last block")
        try:
            if self.pipe is not None:
                moved = 0
                while moved < k:
                    moved += os.splice(self.pipe[0], self.fd, k - moved, offset_dst=offset + moved)
            else:
                assert self.buf is not None
                done = 0
                while done < k:
                    done += os.pwrite(self.fd, self.buf[done:k], offset + done)
        except OSError as exc:
            if exc.errno in NO_SPACE_ERRNOS:
                raise _DiskFull(k, exc) from exc
            raise
        return k

    def discard(self, n: int) -> None:
        """Read the next ``n`` bytes of the stream and drop them (the partial file cannot take them: the sender
        still reads the answer after its last byte rather than a reset). Waits as :meth:`read_into`."""
        scratch = memoryview(bytearray(min(n, _SPLICE_PIPE_BYTES) or 1))
        while n > 0:
            self._set_lowat(min(n, len(scratch), RCVLOWAT_BYTES))
            try:
                k = os.readv(self.sock_fd, [scratch[:min(n, len(scratch))]])
            except BlockingIOError:
                self._wait()
                continue
            if k == 0:
                raise ConnectionError("the stream ended before its last block")
            n -= k

    def _set_lowat(self, lowat: int) -> None:
        if lowat != self.lowat:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
                self.lowat = lowat
            except OSError:
                pass


def receive_runs(t: Transfer, runs: list[tuple[int, int]], sock_fd: int, *, timeout_s: float,
                 stop: threading.Event | None, received: Callable[[int], None],
                 rejected: Counter[str]) -> list[SyncReject]:
    """Receive the blocks of ``runs`` (``[(first block, count)]``, ascending) from the connected non-blocking
    socket ``sock_fd`` into ``t``'s partial file (see module docstring). Returns the blocks refused
    (``bad_block_hash``, each counted in ``rejected`` as it lands; each stays needed); ``received(n)`` is told
    the bytes of each block verified. A full disk (``ENOSPC``/``EDQUOT``) ends the writing: the rest of the stream
    is read and dropped, and ``no_space`` (counted) heads the list, so the answer is a 507. Raises
    ``ConnectionError`` when the stream ends early, ``TimeoutError`` after ``timeout_s`` seconds without a byte,
    ``InterruptedError`` when ``stop`` is set; the blocks verified until then are kept in ``t.verified``
    (resume)."""
    m = t.manifest
    bad: list[SyncReject] = []
    for first, count in runs:  # about to be overwritten: each counts again only once hashed from the file
        t.verified.difference_update(range(first, first + count))
        t.read_back.difference_update(range(first, first + count))
    if not runs:
        return bad
    total = sum(min(m.size, (first + count) * m.block_size) - first * m.block_size for first, count in runs)
    taken = 0  # stream bytes read from the socket
    fd = os.open(t.part, os.O_RDWR | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size != m.size:
            os.ftruncate(fd, m.size)
        with _Splicer(sock_fd, fd, timeout_s, stop) as rx, mmap.mmap(fd, m.size, prot=mmap.PROT_READ) as mm, \
                memoryview(mm) as view:
            try:
                for first, count in runs:
                    start, end = first * m.block_size, min(m.size, (first + count) * m.block_size)
                    i, pos, dirty_from = first, start, start
                    while pos < end:
                        k = rx.read_into(pos, end - pos)  # one piece: as much as arrived, up to the pipe
                        pos += k
                        taken += k
                        while i < first + count and (i * m.block_size + m.block_len(i) <= pos):
                            off, n = i * m.block_size, m.block_len(i)
                            if hash_block(view[off : off + n]) == m.block_hash(i):
                                t.verified.add(i)
                                t.read_back.add(i)
                                received(n)
                            else:
                                t.verified.discard(i)
                                t.read_back.discard(i)
                                rejected["bad_block_hash"] += 1
                                bad.append(SyncReject("bad_block_hash",
                                                      f"block {i} of {t.path!r} does not match its hash"))
                            i += 1
                        if pos - dirty_from >= WRITEBACK_BYTES:
                            _start_writeback(fd, dirty_from, pos - dirty_from)
                            dirty_from = pos
            except _DiskFull as full:
                rejected["no_space"] += 1
                bad.insert(0, SyncReject("no_space", f"writing {t.path!r}: {full}"))
                rx.discard(total - taken - full.taken)
    finally:
        os.close(fd)
    return bad
