"""Distribution's member-facing routes (:mod:`._distribute` drives the rest): the wire forms of
``POST /sync/dist/publication``, ``POST /sync/dist/blocks`` and ``POST /sync/dist/list``, and :class:`DistServer`,
which answers them for the publications a node holds (docs/protocol.md, distribution).

Requests are signed by a member's key (:func:`~._wire.verify_headers`, as pushes are); a publication or its blocks
only for a root this node published or accepted as its name's current version; blocks it holds verified, 16 MiB a
request at most (one block always), streamed (:class:`BlockStream`: read and sent a piece of at most 1 MiB at a
time, so a reply holds one piece in memory, not its 16 MiB), at most ``publish_serve_streams`` requests at once
(503 ``busy`` beyond, a slot held until the reply ends), paced by ``publish_max_bytes_per_s``. A held file
shorter than the blocks asked is ``damaged`` (409), one that fails a read mid-reply ends it short: listed no more
until the driver verified it again. Refusals are counted by reason (:data:`SERVE_REFUSALS`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any

import blake3
import msgspec
import trio
from msgspec import Meta

from ..config import SyncConfig
from ..errors import PeerError, SyncRejected
from ..gossip import MemberState
from ..snapshot import HeldPublication
from ..synccore import MAX_REQUEST_BYTES, PublicationBook, encode_publication
from ._bucket import TokenBucket
from ._distfiles import DistFiles, Holding
from ._wire import verify_headers

if TYPE_CHECKING:
    from ..node import NodeContext

__all__ = ["BLOCKS_PATH", "BlockStream", "DistServer", "LIST_PATH", "MAX_PUBLISH_BODY", "PUBLICATION_PATH",
           "PUBLISH_REQUEST", "SERVE_REFUSALS"]

log = logging.getLogger(__name__)

PUBLICATION_PATH = "/sync/dist/publication"
BLOCKS_PATH = "/sync/dist/blocks"
LIST_PATH = "/sync/dist/list"
LIST_PAGE = 64
"""Entries per page of ``POST /sync/dist/list`` (and in the snapshot's ``sync.published``)."""
MAX_BLOCKS_PER_REQUEST = 16
READ_PIECE_BYTES = 1 << 20
"""Bytes of a blocks reply read, paced and sent at a time (:class:`BlockStream`)."""
MIN_SEND_BYTES_PER_S = 256 * 1024
"""The slowest a client may take a blocks reply's pieces: each piece is sent within ``sync.request_timeout_s``
plus its bytes at this rate (:meth:`BlockStream.send_timeout_s`), else the reply is cut (``too_slow``), so a member
that stops reading does not hold a serving slot for ever (as the WAL receiver bounds a body,
:mod:`p2pnode.sync._walship`). Pacing waits are not counted: only the time a send waits for the client."""

SERVE_REFUSALS = ("not_serving", "not_member", "bad_signature", "malformed", "unknown_root", "missing_block",
                  "too_large", "damaged", "busy", "too_slow")
"""Why a request for a publication, a listing or blocks was refused (``serve_refused`` in ``GET /sync/status``)."""
_STATUS = {"not_serving": 404, "not_member": 403, "bad_signature": 401, "malformed": 400, "unknown_root": 404,
           "missing_block": 404, "too_large": 413, "damaged": 409, "busy": 503,
           "too_slow": 408}


class Refused(PeerError):
    """A request refused: ``reason`` is one of :data:`SERVE_REFUSALS` (or ``malformed`` for a bad body)."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in SERVE_REFUSALS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class PublishRequest(msgspec.Struct, frozen=True):
    """``POST /sync/publish`` (``p2pnode sync publish``): the file's ``path`` on this node and the msgpack
    ``publication`` signed by an operator key."""

    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    publication: Annotated[bytes, Meta(max_length=2**23)]


MAX_PUBLISH_BODY = 2**23 + 8192
"""Bytes of a ``POST /sync/publish`` body at most."""


class PubRequest(msgspec.Struct, frozen=True):
    """``POST /sync/dist/publication``: the publication with this manifest ``root`` (and this ``name``, when given:
    the same bytes may be published under two names)."""

    root: Annotated[bytes, Meta(min_length=32, max_length=32)]
    name: Annotated[str, Meta(max_length=255)] = ""


class BlocksRequest(msgspec.Struct, frozen=True):
    """``POST /sync/dist/blocks``: these block ``indices`` of the publication with this ``root``."""

    root: Annotated[bytes, Meta(min_length=32, max_length=32)]
    indices: Annotated[list[Annotated[int, Meta(ge=0, le=2**32)]],
                       Meta(min_length=1, max_length=MAX_BLOCKS_PER_REQUEST)]


class ListRequest(msgspec.Struct, frozen=True):
    """``POST /sync/dist/list``: the entries whose names sort after ``after``."""

    after: Annotated[str, Meta(max_length=255)] = ""


class ListReply(msgspec.Struct, frozen=True):
    """A page of a listing: up to :data:`LIST_PAGE` entries by name; ``more``: pages follow."""

    entries: Annotated[list[HeldPublication], Meta(max_length=LIST_PAGE)]
    more: bool = False


PUBLISH_REQUEST = msgspec.msgpack.Decoder(PublishRequest)
_PUB_REQUEST = msgspec.msgpack.Decoder(PubRequest)
_BLOCKS_REQUEST = msgspec.msgpack.Decoder(BlocksRequest)
_LIST_REQUEST = msgspec.msgpack.Decoder(ListRequest)
LIST_REPLY = msgspec.msgpack.Decoder(ListReply)


def bitmap(have: set[int] | None, blocks: int) -> bytes:
    """Bit ``i % 8`` of byte ``i // 8`` set for each block held; empty for all of them."""
    if have is None or len(have) >= blocks:
        return b""
    out = bytearray((blocks + 7) // 8)
    for i in have:
        out[i // 8] |= 1 << (i % 8)
    return bytes(out) or b"\x00"


def unbitmap(bits: bytes, blocks: int) -> set[int] | None:
    """The blocks a :func:`bitmap` says are held (None: all of them)."""
    if not bits:
        return None
    return {i for i in range(min(blocks, len(bits) * 8)) if bits[i // 8] >> (i % 8) & 1}


def decode_request(decoder: msgspec.msgpack.Decoder[Any], body: bytes) -> Any:
    """``body`` through ``decoder``; :class:`Refused` (``malformed``) when it does not decode."""
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as exc:
        raise Refused("malformed", str(exc)[:200]) from None


class BlockStream:
    """The body of one blocks reply: ``length`` bytes, blocks ``indices`` of the held file in order, read (in a
    worker thread), paced and yielded a piece of at most :data:`READ_PIECE_BYTES` at a time by :meth:`chunks`.
    Holds one of the server's serving slots until :meth:`close` (idempotent; :meth:`chunks` calls it when it ends,
    and the route when the response ends whichever way, so a reply never iterated frees its slot too). A read that
    fails or comes up short mid-stream marks the copy damaged and ends the body short of ``length`` (the fetcher
    counts a short reply as a failed request)."""

    def __init__(self, server: DistServer, h: Holding, indices: list[int]) -> None:
        self.server, self.h, self.indices = server, h, indices
        self.length = sum(h.pub.manifest.block_len(i) for i in indices)
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.server.serve_slots.release()

    def send_timeout_s(self, n: int) -> float:
        """Seconds a piece of ``n`` bytes may take to be sent to the client (:data:`MIN_SEND_BYTES_PER_S`)."""
        return self.server.cfg.request_timeout_s + n / MIN_SEND_BYTES_PER_S

    def cut_slow(self) -> None:
        """The client took a piece slower than :meth:`send_timeout_s`: the reply was cut (counted ``too_slow``)."""
        self.server.serve_refused["too_slow"] += 1
        log.info("sync: serving %s v%d: a client reading slower than %d B/s, reply cut", self.h.pub.name,
                 self.h.pub.version, MIN_SEND_BYTES_PER_S)

    async def chunks(self) -> AsyncIterator[bytes]:
        srv, h = self.server, self.h
        m, bs = h.pub.manifest, h.pub.block_size
        fd = -1
        try:
            fd = await trio.to_thread.run_sync(os.open, h.path, os.O_RDONLY)
            for i in self.indices:
                offset, left = i * bs, m.block_len(i)
                while left > 0:
                    n = min(left, READ_PIECE_BYTES)
                    data = await trio.to_thread.run_sync(os.pread, fd, n, offset)
                    if len(data) != n:
                        srv._damaged(h, f"{h.path}: short read of block {i}")
                        return
                    wait = srv.bucket.take(n, trio.current_time())
                    if wait > 0:
                        await trio.sleep(wait)
                    srv.bytes_served += n
                    offset += n
                    left -= n
                    yield data
        except OSError as exc:  # truncated or unreadable here: verified again next pass
            srv._damaged(h, str(exc))
        finally:
            if fd >= 0:
                os.close(fd)
            self.close()


class DistServer:
    """Answers members' requests for the publications in ``holdings`` (the driver's, shared: name -> the newest
    version held or fetched) accepted in ``book`` (module docstring). Counters: ``bytes_served``,
    ``serve_refused``; ``damaged``: names whose file failed a read (the driver verifies them again)."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, files: DistFiles, holdings: dict[str, Holding],
                 book: PublicationBook) -> None:
        self.ctx, self.cfg, self.files, self.holdings, self.book = ctx, cfg, files, holdings, book
        self.serve_slots = trio.Semaphore(cfg.publish_serve_streams)
        self.bucket = TokenBucket(cfg.publish_max_bytes_per_s, cfg.publish_max_bytes_per_s)  # bursts of 1 s
        self.bytes_served = 0
        self.serve_refused: Counter[str] = Counter()
        self.damaged: set[str] = set()

    def key_of(self, origin: str) -> bytes | None:
        """A member's key (not this node, not dead or left): only members are served."""
        m = self.ctx.member(origin)
        if m is None or origin == self.ctx.node_id or self.ctx.state_of(origin) in (MemberState.DEAD,
                                                                                   MemberState.LEFT):
            return None
        return m.key

    def _served(self, root: bytes, name: str = "") -> Holding | None:
        for h in self.holdings.values():
            if h.pub.root != root or (name and h.pub.name != name):
                continue
            if h.origin or self.book.current.get(h.pub.name) is h.pub:
                if h.pub.name in self.damaged:
                    raise Refused("damaged", "this node's copy is being verified again")
                return h
        return None

    async def serve(self, path: str, headers: Any, body: bytes) -> tuple[int, bytes | BlockStream]:
        """``POST /sync/dist/publication`` and ``POST /sync/dist/blocks``: (HTTP status, body; the blocks as a
        :class:`BlockStream`, which the caller closes once the reply ended). Refusals are
        counted by reason (``serve_refused``): ``not_serving``, ``not_member``/``bad_signature``, ``malformed``,
        ``unknown_root``, ``missing_block``, ``busy``."""
        try:
            if not self.cfg.serve_published:
                raise Refused("not_serving", "this node does not serve published files")
            try:
                verify_headers(headers, "POST", path, body, key_of=self.key_of, now=time.time(),
                               max_skew_s=self.cfg.max_clock_skew_s)
            except SyncRejected as exc:
                raise Refused("not_member" if exc.reason == "not_member" else "bad_signature", exc.detail) from None
            if path == LIST_PATH:
                lreq = decode_request(_LIST_REQUEST, body)
                entries = [e for e in self._listing() if e.name > lreq.after]
                return 200, msgspec.msgpack.encode(ListReply(entries[:LIST_PAGE], len(entries) > LIST_PAGE))
            if path == PUBLICATION_PATH:
                req = decode_request(_PUB_REQUEST, body)
                h = self._served(req.root, req.name)
                if h is None:
                    raise Refused("unknown_root", "no such publication here")
                return 200, encode_publication(h.pub)
            breq = decode_request(_BLOCKS_REQUEST, body)
            h = self._served(breq.root)
            if h is None:
                raise Refused("unknown_root", "no such publication here")
            m = h.pub.manifest
            if any(not (0 <= i < m.blocks and h.has(i)) for i in breq.indices):
                raise Refused("missing_block", "a block this node does not hold")
            indices = sorted(set(breq.indices))
            asked = sum(m.block_len(i) for i in indices)
            if len(indices) > 1 and asked > MAX_REQUEST_BYTES:
                raise Refused("too_large", f"{asked} block bytes asked, {MAX_REQUEST_BYTES} at most")
            return 200, await self._stream(h, indices)
        except Refused as exc:
            self.serve_refused[exc.reason] += 1
            return _STATUS[exc.reason], msgspec.msgpack.encode({"error": exc.reason, "detail": str(exc)[:200]})

    async def _stream(self, h: Holding, indices: list[int]) -> BlockStream:
        """The reply to a blocks request, once a serving slot is taken (``busy`` when none is free) and the held
        file is long enough for every block asked (``damaged`` when not: verified again by the driver)."""
        try:
            self.serve_slots.acquire_nowait()
        except trio.WouldBlock:
            raise Refused("busy", "every serving slot is taken") from None
        m, bs = h.pub.manifest, h.pub.block_size
        try:
            try:
                size = (await trio.to_thread.run_sync(os.stat, h.path)).st_size
            except OSError as exc:
                raise self._damaged(h, str(exc)) from None
            if size < max(i * bs + m.block_len(i) for i in indices):
                raise self._damaged(h, f"{h.path}: {size} bytes, shorter than its manifest")
        except BaseException:  # a refusal, or the request cancelled during the stat: the slot is not the reply's
            self.serve_slots.release()
            raise
        return BlockStream(self, h, indices)

    def _damaged(self, h: Holding, why: str) -> Refused:
        """``h``'s copy failed a read: listed no more until the driver verified it again."""
        self.damaged.add(h.pub.name)
        log.warning("sync: serving %s v%d: %s", h.pub.name, h.pub.version, why)
        return Refused("damaged", "this node's copy failed a read; it is verified again")

    # -- this node's listing -------------------------------------------------------------------------------------
    def section_entries(self) -> list[HeldPublication]:
        """What ``sync.published`` lists: the first :data:`LIST_PAGE` publications held or being fetched, by name,
        with the blocks held."""
        return self._listing()[:LIST_PAGE]

    def section_fields(self) -> dict[str, Any]:
        """The ``sync`` section's fields of distribution: ``published`` (the first page), and when there are more,
        ``published_total`` and ``published_digest`` (members page the rest from ``POST /sync/dist/list``)."""
        entries = self._listing()
        out: dict[str, Any] = {"published": entries[:LIST_PAGE]}
        if len(entries) > LIST_PAGE:
            out["published_total"] = len(entries)
            out["published_digest"] = blake3.blake3(msgspec.msgpack.encode(entries)).hexdigest()[:32]
        return out

    def _listing(self) -> list[HeldPublication]:
        """Every publication held or being fetched, by name (a damaged copy is not listed)."""
        out = []
        for h in sorted(self.holdings.values(), key=lambda h: h.pub.name):
            if h.pub.name in self.damaged:
                continue
            p = h.pub
            have = h.have
            out.append(HeldPublication(name=p.name, version=p.version, root=p.root, to=p.to,
                                       have=bitmap(have, p.manifest.blocks), serves=self.cfg.serve_published,
                                       origin=h.origin))
        return out
