"""Moving one file's blocks to one target: a ``sendfile`` stream on its data channel, else paced HTTP batches.

When the target advertises a data channel (``data_port`` in its signed :class:`~p2pnode.snapshot.SyncSection`)
the blocks go as one stream there (``_channel``: ``sendfile`` to ``splice``); when it cannot be reached or answers
what is not a frame (a bad reply, counted; both retried after :data:`NO_CHANNEL_BACKOFF_S`) or all its stream
slots are taken, they go in HTTP batches of ``request_bytes``, :data:`IN_FLIGHT` requests at a time (the next
batch is read while one is in flight). Either way the file's signature (inode, size, mtime) is checked around the
reads, so the bytes sent are the bytes hashed, and the bytes are paced by ``max_bytes_per_s``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ..errors import SyncReplyRejected
from ..inputs import check_push_results
from ..snapshot import SyncSection
from ._channel import send_stream, split_host
from ._wire import encode_stream_header

if TYPE_CHECKING:
    from ._source import LocalFile

__all__ = ["CONNECT_TIMEOUT_S", "IN_FLIGHT", "NO_CHANNEL_BACKOFF_S", "BlockSender", "read_reply"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
"""An unreachable target (partition, dead host) fails fast; a slow transfer may take longer."""
IN_FLIGHT = 2
"""HTTP push requests in flight per file: one is written while the next travels and is hashed."""
NO_CHANNEL_BACKOFF_S = 60.0
"""A data channel that could not be reached is retried after this many seconds (HTTP meanwhile)."""


async def read_reply(resp: httpx.Response, limit: int, what: str) -> bytes:
    """The body of a peer's streamed HTTP reply (``client.stream(...)``), read up to ``limit`` bytes: a peer that
    sends more costs this node ``limit`` bytes, not its memory. Raises ``httpx.HTTPStatusError`` for a status other
    than 200 (a refusal, not garbage; the caller's failure count takes it) and
    :class:`~p2pnode.errors.SyncReplyRejected` (``reply_oversized``) beyond ``limit``."""
    if resp.status_code != 200:
        raise httpx.HTTPStatusError(f"{what}: status {resp.status_code}", request=resp.request, response=resp)
    return await read_capped(resp, limit, what)


async def read_capped(resp: httpx.Response, limit: int, what: str) -> bytes:
    """The body of a streamed response, whatever its status, up to ``limit`` bytes (``reply_oversized`` beyond)."""
    body = bytearray()
    async for chunk in resp.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise SyncReplyRejected("reply_oversized", f"{what}: more than {limit} bytes")
    return bytes(body)


class _ChannelBusy(Exception):
    """The target's data channel refused a stream with ``busy`` (all its stream slots taken): use HTTP."""


class BlockSender:
    """Sends blocks for a :class:`~._push.Pusher` (its counters, pacing, progress and refusal bookkeeping).
    Counters: ``streams_sent``, ``channel_fallbacks``."""

    def __init__(self, pusher: Any) -> None:
        """``pusher``: the owning :class:`~._push.Pusher` (not imported: it imports this module)."""
        self.p = pusher
        self._no_channel: dict[tuple[str, int], float] = {}  # (host, port) -> trio time until which HTTP is used
        self.streams_sent = 0
        self.channel_fallbacks = 0

    def read_blocks(self, f: LocalFile, indices: list[int]) -> list[tuple[int, bytes]] | None:
        """Read blocks of ``f`` (blocking). None when the file changed since it was hashed: its signature (inode,
        size, mtime in ns) is checked before and after the reads, so the bytes read are the bytes hashed without
        hashing them twice (a block that slipped through anyway is caught by the receiver's hash check)."""
        m = f.manifest
        source = self.p.source
        expect = f.signature if f.cls != "sqlite" else None  # the SQLite staging copy is ours: nobody writes it
        if expect is not None and source.live_signature(f.path) != expect:
            return None
        out = []
        try:
            fd = os.open(f.read_path, os.O_RDONLY)
        except OSError:
            return None
        try:
            for i in indices:
                data = os.pread(fd, m.block_len(i), i * m.block_size)
                if len(data) != m.block_len(i):
                    return None
                out.append((i, data))
        finally:
            os.close(fd)
        if expect is not None and source.live_signature(f.path) != expect:
            return None
        return out

    def channel_of(self, target: str, addr: str) -> tuple[str, int] | None:
        """The target's data channel ``(host, port)`` from its snapshot, unless it failed to connect lately."""
        sync = self.p.ctx.section(target, SyncSection)
        port = sync.data_port if sync is not None else None
        if not port:
            return None
        chan = (split_host(addr), port)
        until = self._no_channel.get(chan)
        if until is not None and until > trio.current_time():
            return None
        return chan

    async def send_blocks(self, target: str, addr: str, f: LocalFile, indices: list[int]) -> list[int] | None:
        """Send ``indices`` of ``f`` (see module docstring). Returns the blocks the receiver still needs after the
        last request it answered ([] when committed), or None when the file changed or the target refused.
        Raises ``httpx.HTTPError`` / ``OSError`` when a stream broke mid-way (the next pass resumes). A data
        channel that answers something other than a frame is counted as a bad reply and not used for
        :data:`NO_CHANNEL_BACKOFF_S` (HTTP at once when no block went yet)."""
        chan = self.channel_of(target, addr)
        if chan is not None:
            try:
                return await self._stream_blocks(target, chan, f, indices)
            except (TimeoutError, ConnectionRefusedError, socket.gaierror) as exc:
                if self.p.progress.get(f.path, [0])[0] > 0:
                    raise  # it broke mid-stream: the next pass resumes
                self._no_channel[chan] = trio.current_time() + NO_CHANNEL_BACKOFF_S
                self.channel_fallbacks += 1
                log.info("sync: data channel of %s at %s:%d unreachable (%s); HTTP for %.0f s", target, *chan, exc,
                         NO_CHANNEL_BACKOFF_S)
            except _ChannelBusy as exc:  # refused before any block went: this transfer goes over HTTP
                self.channel_fallbacks += 1
                log.info("sync: data channel of %s at %s:%d refused a stream (%s); this one goes over HTTP", target,
                         *chan, exc)
            except SyncReplyRejected as exc:  # it answered what is not a frame: a peer's error, HTTP for a while
                self.p.bad_reply(target, exc)
                self._no_channel[chan] = trio.current_time() + NO_CHANNEL_BACKOFF_S
                self.channel_fallbacks += 1
                if self.p.progress.get(f.path, [0])[0] > 0:
                    return None  # blocks went: the next pass asks the target what it still needs
        return await self._http_batches(target, addr, f, indices)

    async def _stream_blocks(self, target: str, chan: tuple[str, int], f: LocalFile,
                             indices: list[int]) -> list[int] | None:
        """Send ``indices`` of ``f`` over the target's data channel (see ``_channel``): the blocks it still needs
        after this stream ([] when committed), or None when the file changed or the target refused. Raises
        ``OSError`` when the channel cannot be reached and :class:`_ChannelBusy` when its stream slots are all
        taken (the caller falls back to HTTP for both)."""
        p, cfg, source = self.p, self.p.cfg, self.p.source
        m = f.manifest
        expect = f.signature if f.cls != "sqlite" else None  # the SQLite staging copy is ours: nobody writes it
        if expect is not None and source.live_signature(f.path) != expect:
            source.mark_stale(f.path)
            return None
        runs: list[tuple[int, int]] = []
        for i in sorted(set(indices)):
            if runs and runs[-1][0] + runs[-1][1] == i:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((i, 1))
        header = encode_stream_header(p.ctx.identity, p.item(f, []), runs)
        total = sum(m.block_len(i) for i in indices)
        prog = p.progress.setdefault(f.path, [0, total])

        def pace(n: int) -> None:
            wait = trio.from_thread.run_sync(lambda: p.bucket.take(n, trio.current_time()))
            if wait > 0:
                time.sleep(wait)

        def progress(n: int) -> None:
            prog[0] = min(prog[1], prog[0] + n)
            p.bytes_sent += n

        stop = threading.Event()
        timeout = min(CONNECT_TIMEOUT_S, cfg.request_timeout_s)
        t0 = time.perf_counter()
        p.requests += 1
        try:
            reply = await trio.to_thread.run_sync(
                lambda: send_stream(chan[0], chan[1], header, f.read_path, m, runs, connect_timeout_s=timeout,
                                    timeout_s=cfg.request_timeout_s, chunk_bytes=cfg.request_bytes,
                                    pace=pace if cfg.max_bytes_per_s > 0 else None, progress=progress, stop=stop),
                abandon_on_cancel=True)
        except BaseException:
            stop.set()
            raise
        self.streams_sent += 1
        p.blocks_sent += len(indices)
        log.debug("sync: streamed %d blocks (%d bytes) of %s to %s in %.3f s", len(indices), total, f.path, target,
                  time.perf_counter() - t0)
        if expect is not None and source.live_signature(f.path) != expect:
            source.mark_stale(f.path)  # changed while it was sent: blocks that differ were refused
        need: dict[str, list[int]] = {}
        for res in check_push_results(reply.files, {f.path: m.blocks}):  # typed, bounded, about what was sent
            if res.path == "":
                p.note_refusal(target, res.reason)
                log.info("sync: %s refused a stream of %s: %s", target, f.path, res.detail)
                if res.reason == "busy":
                    raise _ChannelBusy(res.detail)
                return None
            p.note_result(target, {f.path: f}, res, need)
            if res.status in ("have", "committed"):
                return []
            if res.status == "rejected":
                return None
        return need.get(f.path) if f.path in need else None

    async def _http_batches(self, target: str, addr: str, f: LocalFile, indices: list[int]) -> list[int] | None:
        """Send ``indices`` of ``f`` in ``POST /sync/push`` batches of ``request_bytes``, :data:`IN_FLIGHT` at a
        time, the next batch read (and checked against the file's signature) while others travel."""
        p = self.p
        m = f.manifest
        batches: list[list[int]] = [[]]
        size = 0
        for i in indices:
            n = m.block_len(i)
            if batches[-1] and size + n > p.cfg.request_bytes:
                batches.append([])
                size = 0
            batches[-1].append(i)
            size += n
        send, recv = trio.open_memory_channel[list[tuple[int, bytes]] | None](1)
        outcome: dict[str, Any] = {"committed": False, "need": list(indices), "abort": False}

        async def reader() -> None:
            async with send:
                for b in batches:
                    got = await trio.to_thread.run_sync(self.read_blocks, f, b)
                    try:
                        await send.send(got)
                    except trio.BrokenResourceError:
                        return  # the senders stopped (abort)
                    if got is None:
                        return

        async def sender(recv: trio.MemoryReceiveChannel[list[tuple[int, bytes]] | None]) -> None:
            async with recv:
                async for blocks in recv:
                    if outcome["abort"]:
                        return
                    if blocks is None:
                        p.source.mark_stale(f.path)
                        outcome["abort"] = True
                        return
                    try:
                        results = await p.send(target, addr, [p.item(f, blocks)])
                    except (httpx.HTTPError, OSError) as exc:
                        p.request_failures += 1
                        log.info("sync: push of %s to %s failed: %s", f.path, target, exc)
                        outcome["abort"] = True
                        return
                    p.blocks_sent += len(blocks)
                    if results is None:
                        outcome["abort"] = True
                        return
                    prog = p.progress.get(f.path)
                    if prog:
                        prog[0] = min(prog[1], prog[0] + sum(len(d) for _, d in blocks))
                    need: dict[str, list[int]] = {}
                    for res in results:
                        p.note_result(target, {f.path: f}, res, need)
                        if res.status in ("have", "committed"):
                            outcome["committed"] = True
                        elif res.status == "rejected":
                            outcome["abort"] = True
                            return
                    outcome["need"] = need.get(f.path, [])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            for _ in range(IN_FLIGHT):
                nursery.start_soon(sender, recv.clone())
            recv.close()
        if outcome["committed"]:
            return []
        return None if outcome["abort"] else outcome["need"]
