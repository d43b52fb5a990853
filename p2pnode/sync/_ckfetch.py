"""Checkpoints, every node's side (issue 41): :class:`CheckpointFetch` fetches a trusted checkpoint from its
holders (a trio driver; which checkpoint is newest and who holds it is :mod:`._ckboard`'s, the origin's and the
durable holder's sides are :mod:`._checkpoints`)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import trio

from ..reqauth import AUTH_HEADER
from ..snapshot import SyncSection
from ..synccore import (
    CheckpointFile,
    NewestCheckpoint,
)
from ..synccore._checkpoints import COMPLETE_MARKER
from ..synccore._manifest import BLOCK_HASH_BYTES, hash_block, manifest_root
from ._channel import split_host
from ._checkpoints import read_limited
from ._ckchannel import _ChannelBadBlock, pull_checkpoint_file
from ._splice import WRITEBACK_BYTES, _start_writeback

__all__ = ["CheckpointFetch"]

log = logging.getLogger(__name__)


# -- the fetch: a checkpoint's files from its holders ------------------------------------------------------------
FETCH_BATCH_BYTES = 8 << 20
"""Bytes a fetch hands its disk side at a time (one thread hop: the blocks in it checked and written)."""
FETCH_QUEUE_BATCHES = 2
"""Batches a fetch holds between the network and the disk at most (backpressure: the holder's reply waits)."""
CHANNEL_CONNECT_TIMEOUT_S = 3.0
"""A holder's data channel must accept within this (seconds), else the fetch reads it over HTTP."""
MIN_TRY_PROGRESS_BYTES = 1 << 20
"""A try from a holder that verifies less than this (or the rest of the file) counts as slow (review M1)."""
MAX_SLOW_TRIES = 3
"""Slow tries a holder gets per file before the next holder is asked (review M1)."""
FETCH_DEADLINE_S = 6 * 3600.0
"""A whole checkpoint fetch at most (seconds; the constructor's ``deadline_s``): 1 TiB at 50 MB/s."""


def _durable(m: Any) -> bool:
    return "durable" in getattr(getattr(m, "snapshot", None), "tags", ())


class CheckpointFetch:
    """Fetches one trusted checkpoint (``newest``: its body and holders) into ``dest_dir`` (issue 41, item 3's
    transfer; the decision and the job's start are job control's). For each file it first reads the block hashes
    from a holder (``GET /sync/checkpoint/file?part=hashes``) and keeps them only when they hash to the manifest
    root the signed body names; then it reads the file (over the holder's data channel when its snapshot advertises
    one, :mod:`._ckchannel`; else, or when the channel gives nothing, ``GET /sync/checkpoint/file``) into
    ``<dest_dir>/.partial/<digest>/<index>`` and checks each block against its hash as it arrives: a block that does
    not match ends that holder (counted ``bad_block`` in :attr:`refused`), the partial file is cut back to its last
    verified block and the next holder resumes from there; a reply that ends early is asked again from the same
    holder while each try verifies more (:meth:`_fetch_file`). A partial file left by an earlier run is checked block
    by block before it is resumed (what does not verify is dropped). Holders: the durable ones first, each group in
    random order (a member that merely lists the digest is tried last). When all files are in, they are renamed to
    ``<dest_dir>/<entry name>`` (a directory entry gets its ``.complete`` marker). ``totals``: where the fetch
    adds :attr:`refused` and :attr:`channel` (``channel_<reason>``) when it ends (the board's
    :attr:`~._ckboard.CheckpointBoard.fetches`). ``progress(done_bytes, total_bytes)`` is called as bytes arrive.
    The whole fetch ends after ``deadline_s`` (``trio.TooSlowError``).
    A fetch that fails or is cancelled leaves its verified blocks in ``.partial/<digest>``: a later fetch of the same
    checkpoint resumes from them; a fetch of another one into ``dest_dir`` removes them (:meth:`_prepare`)."""

    def __init__(self, ctx: Any, newest: NewestCheckpoint, dest_dir: Path, *, timeout_s: float,
                 sign_read: Callable[[str, str, str], dict[str, str]] | None = None,
                 progress: Callable[[int, int], None] = lambda done, total: None,
                 deadline_s: float = FETCH_DEADLINE_S, totals: Counter[str] | None = None) -> None:
        self.ctx = ctx
        self.newest = newest
        self.dest_dir = Path(dest_dir)
        self.partial = self.dest_dir / ".partial" / newest.digest.hex()
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.sign_read = sign_read or (lambda method, target, receiver: {})
        self.progress = progress
        self.totals = totals
        self.refused: Counter[str] = Counter()
        self.bytes_fetched = 0
        self.channel: Counter[str] = Counter()
        """Data-channel reads that gave nothing, by reason (``refused_<HTTP status>`` when the holder refused,
        ``unreachable``: no connection or no reply in time, ``failed``: anything else), and ``http_fallbacks``:
        files (or their rest) then read over HTTP."""
        self._verified = 0
        """The verified end of the partial file of the file being fetched (bytes; :meth:`_fetch_file`)."""
        self.timings = {"hashes_s": 0.0, "channel_s": 0.0, "http_s": 0.0}
        """Seconds on block-hash lists, and on files fetched whole over the channel or HTTP (fsync included)."""

    async def run(self) -> Path:
        """Fetch every file, then put the checkpoint in place; its path. Raises ``OSError`` when no holder gave a
        file that verifies, ``trio.TooSlowError`` past ``deadline_s``; either way (and when cancelled) the verified
        bytes stay in ``.partial/<digest>`` for the next fetch of this checkpoint (:meth:`_leave`)."""
        body = self.newest.body
        try:
            with trio.fail_after(self.deadline_s):
                await trio.to_thread.run_sync(self._prepare)
                total = body.size
                done_before = 0
                t0 = time.monotonic()
                for i, f in enumerate(body.files):
                    await self._fetch_file(i, f, self.partial / str(i), total, done_before)
                    done_before += f.size
                placed = await trio.to_thread.run_sync(self._place)
                log.info("sync: checkpoint %s fetched, %d bytes in %.2f s (block hashes %.2f s, data channel %.2f s, "
                         "HTTP %.2f s, each with its fsync)", self.newest.digest.hex(), total, time.monotonic() - t0,
                         self.timings["hashes_s"], self.timings["channel_s"], self.timings["http_s"])
                return placed
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._leave)
            raise
        finally:
            if self.totals is not None:
                self.totals.update({**{f"channel_{k}": v for k, v in self.channel.items()}, **self.refused})

    def _prepare(self) -> None:
        """Blocking: make ``.partial/<digest>``, and remove every other checkpoint's partial folder beside it (a
        fetch into ``dest_dir`` is of the newest checkpoint: the others are superseded). So at most one partial
        checkpoint is kept per ``dest_dir``, at most its signed size."""
        self.partial.mkdir(parents=True, exist_ok=True)
        for p in self.partial.parent.iterdir():
            if p != self.partial:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    def _leave(self) -> None:
        """Blocking, after a failed or cancelled fetch: keep ``.partial/<digest>`` when it holds any bytes (only
        verified blocks are ever written; the next fetch checks them again, block by block, before it resumes:
        :meth:`_verified_prefix`), else remove it."""
        try:
            held = sum(p.stat().st_size for p in self.partial.iterdir() if p.is_file())
        except OSError:
            held = 0
        if not held:
            shutil.rmtree(self.partial, ignore_errors=True)

    def holders(self) -> list[tuple[str, str]]:
        """``(holder, addr)`` to try: the durable ones first, each group shuffled."""
        durable: list[tuple[str, str]] = []
        other: list[tuple[str, str]] = []
        for h in self.newest.holders:
            m = self.ctx.member(h)
            if m is None or not getattr(m, "addr", None):
                continue
            (durable if _durable(m) else other).append((h, m.addr))
        rnd = random.SystemRandom()
        rnd.shuffle(durable)
        rnd.shuffle(other)
        return durable + other

    async def _fetch_file(self, index: int, f: CheckpointFile, part: Path, total: int, done_before: int) -> None:
        """File ``index`` into ``part``, from the holders in turn. A holder whose reply ends early (the connection
        closed, a read timed out) is asked again from the new verified end as long as each try verifies more: the
        agents' HTTP server closes a connection after ``read_timeout`` (30 s) without a byte from the client, even
        mid-reply, so a file that takes longer than that from one holder comes in several replies (measured by
        ``bench/checkpoint_fetch.py``: 1 GiB at 30 MB/s was cut after 32 s). A holder whose tries verify less than
        :data:`MIN_TRY_PROGRESS_BYTES` (or the rest of the file) :data:`MAX_SLOW_TRIES` times is not asked again
        (review M1: one block per connection). The partial file left by an earlier run is checked from disk once,
        when the block hashes are in (:meth:`_verified_prefix`); from then on the verified end is kept in memory
        (:attr:`_verified`; only verified blocks are ever left in the file), so a retry costs no re-check."""
        hashes: bytes | None = None
        for holder, addr in self.holders():
            try:
                if hashes is None:
                    t0 = time.monotonic()
                    hashes = await self._hashes_from(addr, holder, index, f)
                    self.timings["hashes_s"] += time.monotonic() - t0
                    if hashes is None:
                        continue
                    self._verified = await trio.to_thread.run_sync(self._verified_prefix, part, f, hashes)
                chan = self._channel_of(holder, addr)
                slow = 0
                while True:
                    have = self._verified
                    t0 = time.monotonic()
                    try:
                        if chan is not None:
                            try:
                                await self._pull(chan, holder, index, f, hashes, part, have, total, done_before)
                                self.timings["channel_s"] += time.monotonic() - t0
                                return
                            except _NoChannel as exc:
                                log.info("sync: checkpoint file %d from %s over HTTP: its data channel %s", index,
                                         holder[:16], exc)
                                self.channel["http_fallbacks"] += 1
                                chan = None
                                continue
                        await self._read_from(addr, holder, index, f, hashes, part, have, total, done_before)
                        self.timings["http_s"] += time.monotonic() - t0
                        return
                    except (httpx.ReadError, httpx.ReadTimeout, httpx.RemoteProtocolError, _Short) as exc:  # cut off
                        self.refused["cut_off"] += 1
                        log.info("sync: checkpoint file %d from %s cut off at %d of %d bytes: %s", index,
                                 holder[:16], self._verified, f.size, exc)
                    if self._verified - have < min(MIN_TRY_PROGRESS_BYTES, f.size - have):
                        slow += 1
                        if self._verified == have or slow >= MAX_SLOW_TRIES:
                            break  # this holder's tries verify nothing more, or too little: the next holder
            except _BadBlock as exc:
                self.refused["bad_block"] += 1
                log.warning("sync: checkpoint file %d from %s: %s; fetched on elsewhere", index, holder[:16], exc)
            except (httpx.HTTPError, OSError, ValueError) as exc:
                self.refused["unreachable"] += 1
                log.info("sync: checkpoint file %d from %s: %s", index, holder[:16], exc)
        raise OSError(f"no holder of checkpoint {self.newest.digest.hex()} gave file {index} whole")

    def _channel_of(self, holder: str, addr: str) -> tuple[str, int] | None:
        """The holder's data channel ``(host, port)`` (``data_port`` in its signed snapshot), or None."""
        section = getattr(self.ctx, "section", None)
        sync = section(holder, SyncSection) if section is not None else None
        port = sync.data_port if sync is not None else None
        return (split_host(addr), port) if port else None

    async def _pull(self, chan: tuple[str, int], holder: str, index: int, f: CheckpointFile, hashes: bytes,
                    part: Path, have: int, total: int, done_before: int) -> None:
        """File ``index`` from ``have`` on over the holder's data channel (:mod:`._ckchannel`: ``sendfile`` there,
        ``splice`` here, each block checked against ``hashes`` as it lands; only verified blocks stay), then
        fsync. Raises :class:`_NoChannel` when the channel gave nothing (not there, refused, busy: HTTP next),
        :class:`_BadBlock`, or :class:`_Short` when it broke after some blocks (asked again)."""
        if have == f.size:  # nothing to read (an empty file, or one a resumed fetch had whole)
            self.progress(done_before + have, total)
            return
        target = f"/sync/checkpoint/file?digest={self.newest.digest.hex()}&file={index}&offset={have}"
        auth = self.sign_read("GET", target, holder).get(AUTH_HEADER)
        stop, done = threading.Event(), threading.Event()
        token = trio.lowlevel.current_trio_token()
        reported = [have]

        def progress(verified: int) -> None:  # in the worker thread, after each block: to trio every 64 MiB
            self._verified = verified  # (read once the worker has ended)
            if verified - reported[0] >= 8 * WRITEBACK_BYTES or verified == f.size:
                reported[0] = verified
                trio.from_thread.run_sync(self.progress, done_before + verified, total, trio_token=token)

        def pull() -> int:
            try:
                return pull_checkpoint_file(chan[0], chan[1], target, auth, part, have=have, size=f.size,
                                            block_size=f.block_size, hashes=hashes, connect_timeout_s=min(
                                                self.timeout_s, CHANNEL_CONNECT_TIMEOUT_S),
                                            timeout_s=self.timeout_s, stop=stop, progress=progress)
            finally:
                done.set()

        try:
            got = await trio.to_thread.run_sync(pull, abandon_on_cancel=True)
        except trio.Cancelled:
            stop.set()  # every wait of the worker checks stop (0.1-0.5 s): wait until it has ended, cutting the
            with trio.CancelScope(shield=True):  # file back to its verified end, so no later fetch (the lock is
                await trio.to_thread.run_sync(done.wait)  # released on return) finds it still writing
            raise
        except _ChannelBadBlock as exc:
            raise _BadBlock(str(exc)) from exc
        except (OSError, ValueError, trio.RunFinishedError) as exc:
            got = self._verified  # the worker cut the file back to it
            if got > have:
                raise _Short(f"the data channel broke at {got} of {f.size} bytes: {exc}") from exc
            status = getattr(exc, "status", None)  # the holder's refusal (:func:`pull_checkpoint_file`)
            self.channel[f"refused_{status}" if isinstance(status, int) else "unreachable"
                         if isinstance(exc, (ConnectionRefusedError, TimeoutError, socket.gaierror)) else "failed"] += 1
            raise _NoChannel(str(exc)) from exc
        self.bytes_fetched += got - have
        fd = os.open(part, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            await trio.to_thread.run_sync(os.fsync, fd)
        finally:
            os.close(fd)
        if got != f.size:
            raise _Short(f"{got} of {f.size} bytes")

    async def _hashes_from(self, addr: str, holder: str, index: int, f: CheckpointFile) -> bytes | None:
        """The block hashes of file ``index`` from ``holder``, when they hash to its signed root; else None
        (counted ``bad_hashes``)."""
        target = f"/sync/checkpoint/file?digest={self.newest.digest.hex()}&file={index}&part=hashes"
        want = -(-f.size // f.block_size) * BLOCK_HASH_BYTES
        status, data = await read_limited(self.ctx.client, f"http://{addr}{target}", timeout_s=self.timeout_s,
                                          headers=self.sign_read("GET", target, holder), limit=want)
        if status != 200:
            raise OSError(f"HTTP {status}")
        if len(data) != want or manifest_root(f.size, f.block_size, data) != f.root:
            self.refused["bad_hashes"] += 1
            log.warning("sync: checkpoint file %d: the block hashes from %s do not match its signed root", index,
                        holder[:16])
            return None
        return data

    @staticmethod
    def _verified_prefix(part: Path, f: CheckpointFile, hashes: bytes) -> int:
        """Bytes of ``part`` (left by an earlier holder or run) that verify block by block; the rest is cut off."""
        try:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            part.unlink(missing_ok=True)
            return 0
        try:
            size = min(os.fstat(fd).st_size, f.size)
            good = 0
            while good < size:
                n = min(f.block_size, f.size - good)
                if good + n > size:
                    break  # a short tail: read again
                i = good // f.block_size
                if hash_block(os.pread(fd, n, good)) != hashes[i * BLOCK_HASH_BYTES:(i + 1) * BLOCK_HASH_BYTES]:
                    break
                good += n
            os.ftruncate(fd, good)
            return good
        finally:
            os.close(fd)

    async def _read_from(self, addr: str, holder: str, index: int, f: CheckpointFile, hashes: bytes, part: Path,
                         have: int, total: int, done_before: int) -> None:
        """The bytes of file ``index`` from ``have`` on, from one holder's reply, into ``part``: a pipeline of two
        tasks, so the network and the disk overlap. The reader takes the reply's pieces as they come (no
        re-chunking copy; a reply in a content-encoding is refused: nothing is decompressed), joins them into
        batches of about :data:`FETCH_BATCH_BYTES` cut at a block boundary and hands them on through a channel of
        :data:`FETCH_QUEUE_BATCHES`; the writer checks each block of a batch against its hash and writes it
        (:meth:`_write_blocks`, one thread hop a batch), asking the kernel to start writing each
        :data:`WRITEBACK_BYTES` back, so the closing fsync finds little left. A reply that ends early or breaks:
        the blocks that arrived whole before it are still checked and kept, then :class:`_Short` or the client's
        error is raised (the caller asks again from the new verified end). A bad block ends the reply at once
        (:class:`_BadBlock`; nothing of that block written)."""
        if have == f.size:
            self.progress(done_before + have, total)
            return
        target = f"/sync/checkpoint/file?digest={self.newest.digest.hex()}&file={index}&offset={have}"
        sender, receiver = trio.open_memory_channel[memoryview](FETCH_QUEUE_BATCHES)
        state = _Pipe(have)
        async with self.ctx.client.stream("GET", f"http://{addr}{target}", timeout=self.timeout_s,
                                          headers=self.sign_read("GET", target, holder)) as resp:
            if resp.status_code != 200:
                raise OSError(f"HTTP {resp.status_code}")
            if resp.headers.get("content-encoding", "identity") != "identity":
                raise OSError(f"a reply in content-encoding {resp.headers['content-encoding'][:40]!r}")
            fd = os.open(part, os.O_WRONLY | os.O_NOFOLLOW)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_batches, receiver, fd, f, hashes, state, total, done_before,
                                       nursery.cancel_scope)
                    await self._read_batches(resp, sender, f, state)
                if state.error is not None:
                    raise state.error
                await trio.to_thread.run_sync(os.fsync, fd)
            finally:
                os.close(fd)
        if state.have != f.size:
            raise _Short(f"{state.have} of {f.size} bytes")

    async def _read_batches(self, resp: httpx.Response, sender: trio.MemorySendChannel[memoryview],
                            f: CheckpointFile, state: _Pipe) -> None:
        """The reader of :meth:`_read_from`: a reply's bytes in block-aligned batches into ``sender`` (closed at
        the end). A reply that breaks, or sends more than the signed size (:class:`_BadBlock`), ends the reading;
        its error is kept in ``state.error`` and the writer still checks what came before it."""
        async with sender:
            pieces: list[bytes] = []
            held = 0
            got = state.have  # the file offset of the first byte of ``pieces``
            try:
                async for chunk in resp.aiter_bytes():  # identity: no decoding, no re-chunking
                    if got + held + len(chunk) > f.size:
                        raise _BadBlock("more bytes than the signed size")
                    self.bytes_fetched += len(chunk)
                    pieces.append(chunk)
                    held += len(chunk)
                    if held >= FETCH_BATCH_BYTES:
                        whole = (got + held) // f.block_size * f.block_size - got  # up to a block boundary
                        if whole > 0:
                            data = b"".join(pieces)
                            pieces, held = ([data[whole:]] if whole < len(data) else []), len(data) - whole
                            try:
                                await sender.send(memoryview(data)[:whole])
                            except trio.BrokenResourceError:  # the writer stopped at a bad block
                                return
                            got += whole
            except (httpx.HTTPError, OSError) as exc:  # the reply broke or overran: what came before it is kept
                if state.error is None:
                    state.error = exc
            if pieces:
                with contextlib.suppress(trio.BrokenResourceError):  # the writer stopped at a bad block
                    await sender.send(memoryview(b"".join(pieces)))

    async def _write_batches(self, receiver: trio.MemoryReceiveChannel[memoryview], fd: int, f: CheckpointFile,
                             hashes: bytes, state: _Pipe, total: int, done_before: int,
                             scope: trio.CancelScope) -> None:
        """The writer of :meth:`_read_from`: each batch checked and written in a worker thread; a bad block (or a
        write that fails) is kept in ``state.error`` and ends the reply (``scope`` cancelled)."""
        async with receiver:
            async for batch in receiver:
                try:
                    state.have = await trio.to_thread.run_sync(self._write_blocks, fd, f, hashes, batch, state)
                    self._verified = state.have
                except OSError as exc:  # a bad block, or the disk's error
                    state.error = exc
                    scope.cancel()
                    return
                self.progress(done_before + state.have, total)

    @staticmethod
    def _write_blocks(fd: int, f: CheckpointFile, hashes: bytes, batch: memoryview, state: _Pipe) -> int:
        """Write the whole blocks of ``batch`` (which starts at ``state.have``, a block boundary; the last, short
        block too when it ends the file), each checked against its hash first; the new verified size. What is
        left of ``batch`` after them (a reply that ended mid-block) is dropped. Raises :class:`_BadBlock`
        (nothing of that block written: the file ends at the last verified block). Blocking."""
        have = state.have
        pos = 0
        while pos < len(batch):
            n = min(f.block_size, f.size - have)
            if len(batch) - pos < n:
                break
            i = have // f.block_size
            block = batch[pos:pos + n]
            if hash_block(block) != hashes[i * BLOCK_HASH_BYTES:(i + 1) * BLOCK_HASH_BYTES]:
                os.ftruncate(fd, have)
                raise _BadBlock(f"block {i} does not match its hash")
            os.pwrite(fd, block, have)
            pos += n
            have += n
            if have - state.dirty_from >= WRITEBACK_BYTES:
                _start_writeback(fd, state.dirty_from, have - state.dirty_from)
                state.dirty_from = have
        return have

    def _place(self) -> Path:
        body = self.newest.body
        dest = self.dest_dir / body.name
        if len(body.files) == 1 and body.files[0].path == "":
            os.replace(self.partial / "0", dest)
        else:
            tmp = self.dest_dir / f".{body.name}.placing"
            shutil.rmtree(tmp, ignore_errors=True)
            for i, f in enumerate(body.files):
                p = tmp / f.path
                p.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.partial / str(i), p)
            (tmp / COMPLETE_MARKER).write_bytes(b"")
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
        shutil.rmtree(self.partial, ignore_errors=True)
        return dest


class _BadBlock(OSError):
    """A holder sent a block that does not match its hash, or more bytes than signed."""


class _NoChannel(Exception):
    """A holder's data channel gave no block (none there, it refused the read, or it is busy): HTTP instead."""


class _Short(OSError):
    """A holder's reply ended (cleanly) before the file's signed size."""


class _Pipe:
    """What the two tasks of one reply (:meth:`CheckpointFetch._read_from`) share: ``have`` (the verified size of
    the partial file), ``dirty_from`` (where the bytes not yet handed to writeback start), ``error`` (the first
    failure: the reply's, or a bad block)."""

    def __init__(self, have: int) -> None:
        self.have = have
        self.dirty_from = have
        self.error: OSError | httpx.HTTPError | None = None
