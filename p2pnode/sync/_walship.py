"""Live WAL-mode databases over ``POST /sync/wal``: the sender's pass and the receiver's route (drivers).

**Sender** (:class:`WalShipper`, on a node that pushes): after each push pass (in the background, one WAL pass at a
time, so a slow target never holds up the next push pass), for every tracked ``sqlite`` file it
polls a :class:`~._walsend.WalSender` (in a worker thread) and posts the segments, in order, to the file's durable
targets: the best-ranked ``R`` durable members of the rendezvous ranking the push path uses
(:func:`~p2pnode.synccore.plan_targets` with nothing confirmed), so the targets of a file stay the same from pass
to pass. A database not in WAL mode (``not_wal``), or one the sender cannot read (``error``), is skipped and
counted: it keeps the backup path alone. A target that refuses a segment (a gap after it missed one, a restart, a
new target) or cannot be reached makes the sender forget its position: the next poll is a snapshot, sent to every
target. A refusal that leaves the replica where it was and says so (:data:`RETRY_REFUSALS`: ``busy``, a reader of
the replica held its lock past the receiver's wait; ``overloaded``) is not such a loss: the segment is kept and
offered again, with those after it, at the next pass to the targets that have not applied it (at most
:data:`MAX_PENDING_SEGMENTS` and :data:`MAX_PENDING_BYTES` kept; beyond, a snapshot as before).
The counters (:attr:`WalShipper.stats`) separate the bytes of ``frames`` segments from snapshots.

**Receiver** (:class:`WalInbound`, on a durable node): the same checks as ``POST /sync/push`` before a body byte
is read (durable, disk not critical, a member's key, a time within skew, a declared length), then the request
signature (:func:`~._wire.sign_headers` over the segment's length prefix and header, which bind the payload by its
BLAKE3) and the segment's own origin signature; the payload is held in memory up to ``max_request_bytes`` (from
the shared body budget) or streamed to a file under ``<data_dir>/.sync/walin/`` once the replica's room was
checked; then :class:`~._walreplica.WalReplicas` applies it under the origin's lock into
``<data_dir>/walreplicas/<origin>/<path>``. The answer (msgpack) is the applied position ``{"seq", "kind",
"salts", "frames", "db_pages"}`` or a refusal ``{"error": reason, "detail"}`` with its status, counted.

**Receipts and deletion are unchanged.** A WAL replica is kept apart from the backup path's replica
(``replicas/``): it carries no receipt, is not challenged and is never retired by the retention pass; it is the
fresh copy (lag of one interval), while the backup path's receipts (``(path, size, root)`` of a staging copy)
remain the only thing that lets the ephemeral side delete, so the rule "R receipts of a version that includes it"
holds exactly as before.

**The backup path's cadence.** The shipper keeps each database's :class:`~p2pnode.synccore.WalStanding` (its
targets' applied positions as they answer, the last segment shipped, the last fallback: ``not_wal``, ``error``,
``failed``, ``refused:<reason>``, ``no_target``); the scan asks :meth:`WalShipper.backup_due` before it copies a
changed database (:func:`~p2pnode.synccore.backup_due`): while R targets hold the last segment, only every
``sync.wal_backup_interval_s``; at once after a fallback. A deferred copy leaves the file's version and signature
where they were, so the replicated predicate (R receipts of the *live* version) stays False meanwhile: a WAL
position never lets anything be deleted.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import trio

from .._lazy import lazy_module
from ..errors import SyncReplyRejected
from ..identity import PersistentCounter
from ..inputs import InputError
from ..inputs import content_length as decode_content_length
from ..synccore import (
    TargetPosition,
    WalFormatError,
    WalStanding,
    backup_due,
    current_targets,
    current_window_s,
    effective_r,
    plan_targets,
)
from ._blocks import CONNECT_TIMEOUT_S, read_capped
from ._refuse import RefusalLog, SyncReject
from ._walreplica import WalReplicas
from ._walsend import Outgoing, WalSender
from ._walwire import MAX_SEGMENT_HEADER_BYTES, SIGNATURE_BYTES, SegmentHeader, decode_segment
from ._wire import precheck_headers, sign_headers

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

if TYPE_CHECKING:
    from ..config import SyncConfig
    from ..node import NodeContext
    from ._inbound import Inbound
    from ._source import LocalFiles

__all__ = ["MAX_WAL_REPLY_BYTES", "WAL_PATH", "WalInbound", "WalShipper"]

log = logging.getLogger(__name__)

WAL_PATH = "/sync/wal"
"""The route segments go to (part of what a request signature covers)."""
MAX_WAL_REPLY_BYTES = 4096
"""A target's answer to a segment is at most this long (``reply_oversized`` beyond)."""
MIN_BODY_BYTES_PER_S = 256 * 1024
"""The slowest body the receiver waits for: a segment's head (length, header, signature) arrives within
``sync.request_timeout_s`` of the request, and its payload within ``sync.request_timeout_s`` plus its signed length
at this rate after the head, else ``too_slow`` (408), however its chunks are spaced (a sender trickling one byte per
timeout holds a slot no longer than that). The head's deadline does not grow with the declared
``content-length``: nothing is authenticated before the head is in."""
_READ_BYTES = 1 << 20
RETRY_REFUSALS = frozenset({"busy", "overloaded"})
"""Refusals after which the target's replica is still at the segment before: the segment is offered again."""
MAX_PENDING_SEGMENTS = 32
"""Segments of one database kept for targets that answered :data:`RETRY_REFUSALS` (about 3 minutes of intervals);
beyond, the sender starts again with a snapshot."""
MAX_PENDING_BYTES = 64 << 20
"""Bytes of ``frames`` payloads (held in memory) kept for one database beside :data:`MAX_PENDING_SEGMENTS`: one
segment of 16,384 pages of 4 KiB; beyond, a snapshot (a segment can hold up to 1 GiB of 64 KiB pages, so 32 of
them could otherwise hold tens of GiB). Segments before a kept snapshot are dropped: a target that lacks the
snapshot takes it whatever it holds."""


class WalReply(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """A target's answer: the applied position, or a refusal's reason."""

    seq: int | None = None
    error: str | None = None


_REPLY = msgspec.msgpack.Decoder(WalReply)


async def _file_chunks(path: Path, head: bytes) -> AsyncIterator[bytes]:
    yield head
    with open(path, "rb") as fh:
        while chunk := await trio.to_thread.run_sync(fh.read, _READ_BYTES):
            yield chunk


class WalShipper:
    """The sending side (see module docstring). ``stats``: ``segments``, ``snapshots``, ``frames_bytes`` and
    ``snapshot_bytes`` (request bodies sent), ``refused:<reason>``, ``failed`` (a target not reached),
    ``not_wal``, ``error``; each sender's own counters are in :attr:`senders`."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, source: LocalFiles, state_dir: Path) -> None:
        self.ctx, self.cfg, self.source = ctx, cfg, source
        self.seq = PersistentCounter(state_dir / "wal.seq", block=1000)
        """Segment sequence numbers (persistent, so they grow across restarts); apart from the manifests' counter,
        which the push pass's scan uses from another thread."""
        self.staging_dir = staging_dir = state_dir / "walstaging"
        staging_dir.mkdir(parents=True, exist_ok=True)
        for stale in staging_dir.iterdir():  # snapshots of an earlier run
            stale.unlink(missing_ok=True)
        self.senders: dict[str, WalSender] = {}
        self.standing: dict[str, WalStanding] = {}
        """Each database's targets and their applied positions (:class:`~p2pnode.synccore.WalStanding`)."""
        self.backed_up_at: dict[str, float] = {}
        """When the backup path last copied each database (monotonic s; :meth:`backup_taken`)."""
        self.pending: dict[str, list[Outgoing]] = {}
        """Each database's segments that a target answered with one of :data:`RETRY_REFUSALS` (and those after
        them), in order: offered again at the next pass to the targets that have not applied them."""
        self.stats: Counter[str] = Counter()

    def _sender(self, rel: str) -> WalSender:
        s = self.senders.get(rel)
        if s is None:
            s = self.senders[rel] = WalSender(self.source.root / rel, rel, self.ctx.identity,
                                              next_seq=self.seq.next, staging_dir=self.staging_dir)
        return s

    def targets(self, rel: str, candidates: set[str], known: int, refusing: frozenset[str]) -> list[str]:
        """The durable members ``rel``'s segments go to: the first ``R`` of its rendezvous ranking."""
        return plan_targets(self.ctx.node_id + "/" + rel, confirmed=frozenset(), candidates=candidates,
                            r=self.cfg.replication_factor, durable_members=known, refusing=refusing)

    async def pass_once(self, candidates: set[str], known: int, refusing: frozenset[str]) -> None:
        """Poll every tracked ``sqlite`` file and post its new segments to its targets (``candidates``: the
        dialable durable members; ``known``: durable members known, for R)."""
        files = [f.path for f in self.source.files.copy().values() if f.cls == "sqlite"]  # a scan may run meanwhile
        for gone in set(self.senders) - set(files):
            del self.senders[gone]
        for gone in set(self.pending) - set(files):
            for seg in self.pending.pop(gone):
                seg.discard()
        for gone in set(self.standing) - set(files):
            del self.standing[gone]
        r = effective_r(self.cfg.replication_factor, known) if known else 0
        if r <= 0:
            for st in self.standing.values():
                self._fell_back(st, "no_durable_member")
            return
        started = time.monotonic()
        for rel in files:  # every database's pass is under way from here (see current_targets)
            self.standing.setdefault(rel, WalStanding()).pass_started_at = started
        try:
            for rel in files:
                targets = self.targets(rel, candidates, known, refusing)
                st = self.standing[rel]
                st.r, st.targets = r, tuple(targets)
                try:
                    if targets:
                        await self._ship(rel, targets, st)
                    else:
                        self._fell_back(st, "no_target")
                finally:
                    st.pass_started_at = None
        finally:
            for rel in files:
                if rel in self.standing:
                    self.standing[rel].pass_started_at = None

    def _fell_back(self, st: WalStanding, why: str) -> None:
        st.fallback_at, st.fallback = time.monotonic(), why

    async def _ship(self, rel: str, targets: list[str], st: WalStanding) -> None:
        sender = self._sender(rel)
        pending = self.pending.pop(rel, [])
        try:
            out = await trio.to_thread.run_sync(lambda: sender.poll(now=time.monotonic()))
        except (OSError, ValueError, sqlite3.Error, WalFormatError) as exc:  # the backup path carries it
            self.stats["error"] += 1
            _discard(pending)
            sender.restart()
            self._fell_back(st, "error")
            log.info("sync: WAL of %s unreadable (%s: %s); the backup path carries it", rel,
                     exc.__class__.__name__, exc)
            return
        if out is None:
            _discard(pending)
            self.stats["not_wal"] += 1
            self._fell_back(st, "not_wal")
            return
        segs = _from_last_snapshot(pending + out)
        may_keep = len(segs) <= MAX_PENDING_SEGMENTS and _held_bytes(segs) <= MAX_PENDING_BYTES
        later: set[str] = set()  # targets that answered "offer it again": nothing after it goes to them now
        lost = False
        try:
            for seg in segs:
                for t in targets:
                    if t in later or _holds(st, t, seg):
                        continue
                    answer = await self._post(t, seg, st)
                    if answer in RETRY_REFUSALS and may_keep:
                        later.add(t)
                    elif answer is not None:
                        lost = True
                if lost:
                    sender.restart()  # the next poll is a snapshot every target can apply
                    break
        finally:
            keep = [] if lost else [seg for seg in segs if not all(_holds(st, t, seg) for t in targets)]
            _discard([seg for seg in segs if seg not in keep])
            if keep:
                self.pending[rel] = keep
        st.last_seq = sender.last_seq
        if not lost and not keep:
            st.passed_at = time.monotonic()

    # -- the backup path's cadence (called from the scan's worker thread: reads only) ------------------------
    def backup_due(self, rel: str) -> bool:
        """Whether the backup path should copy the changed database ``rel`` now
        (:func:`~p2pnode.synccore.backup_due`: rarely while R targets hold its log's last segment, else every
        interval); a target counts as current within :func:`~p2pnode.synccore.current_window_s`."""
        return backup_due(self.standing.get(rel), now=time.monotonic(), last_backup_at=self.backed_up_at.get(rel),
                          backup_interval_s=self.cfg.wal_backup_interval_s,
                          window_s=current_window_s(self.cfg.interval_s))

    def backup_taken(self, rel: str) -> None:
        """The backup path took its copy of ``rel`` now."""
        self.backed_up_at[rel] = time.monotonic()

    def carried_by(self, rel: str) -> str:
        """``wal`` while the backup path copies ``rel`` only every ``wal_backup_interval_s`` on the strength of its
        log (R current targets, no fallback since the last copy), else ``backup`` (copied every interval)."""
        return "backup" if backup_due(self.standing.get(rel), now=time.monotonic(),
                                      last_backup_at=self.backed_up_at.get(rel),
                                      backup_interval_s=math.inf if self.cfg.wal_backup_interval_s > 0 else 0.0,
                                      window_s=current_window_s(self.cfg.interval_s)) else "wal"

    async def _post(self, target: str, seg: Outgoing, st: WalStanding) -> str | None:
        """Post one segment to ``target``; None when it answered the segment applied, else why not (its refusal's
        reason, or ``failed``: not answered within twice the receiver's own deadline, ``request_timeout_s`` plus
        its bytes at :data:`MIN_BODY_BYTES_PER_S`, so a target that trickles its reading or its answer cannot hold
        the pass, and with it the targets' standing as current, for ever). Any refusal is counted
        (``refused:<reason>``), ``stale_version`` too: a replica ahead of this sender's counter (a lost data dir)
        stays visible instead of being taken for applied. A refusal of :data:`RETRY_REFUSALS` is no fallback (the
        segment is offered again)."""
        m = self.ctx.member(target)
        client = self.ctx.client
        if m is None or not m.addr or client is None:
            self.stats["failed"] += 1
            self._fell_back(st, "failed")
            return "failed"
        h = seg.header
        headers = sign_headers(self.ctx.identity, "POST", WAL_PATH, seg.head)
        size = len(seg.head) + h.payload_bytes
        headers.update({"content-type": "application/octet-stream", "content-length": str(size)})
        content: bytes | AsyncIterator[bytes]
        content = seg.head + seg.payload if isinstance(seg.payload, bytes) else _file_chunks(seg.payload, seg.head)
        timeout = httpx.Timeout(self.cfg.request_timeout_s, connect=min(CONNECT_TIMEOUT_S, self.cfg.request_timeout_s))
        try:
            with trio.fail_after(2 * (self.cfg.request_timeout_s + size / MIN_BODY_BYTES_PER_S)):
                async with client.stream("POST", f"http://{m.addr}{WAL_PATH}", content=content, headers=headers,
                                         timeout=timeout) as resp:
                    raw = await read_capped(resp, MAX_WAL_REPLY_BYTES, "WAL reply")
                    status = resp.status_code
            reply = _REPLY.decode(raw)
        except (httpx.HTTPError, OSError, msgspec.DecodeError, msgspec.ValidationError, trio.TooSlowError) as exc:
            self.stats["failed"] += 1
            self._fell_back(st, "failed")
            log.info("sync: WAL segment %d of %s to %s failed: %s", h.seq, h.path, target, exc)
            return "failed"
        except SyncReplyRejected as exc:  # an oversized reply
            self.stats["failed"] += 1
            self._fell_back(st, "failed")
            log.info("sync: WAL segment %d of %s to %s: %s", h.seq, h.path, target, exc)
            return "failed"
        self.stats["segments" if h.kind == "frames" else "snapshots"] += 1
        self.stats["frames_bytes" if h.kind == "frames" else "snapshot_bytes"] += size
        if status == 200 and reply.seq == h.seq:
            st.positions[target] = TargetPosition(h.seq, time.monotonic())
            return None
        why = reply.error or str(status)
        self.stats[f"refused:{why}"] += 1
        if why not in RETRY_REFUSALS:
            self._fell_back(st, f"refused:{why}")
        log.info("sync: %s refused WAL segment %d of %s: %s", target, h.seq, h.path, why)
        return why

    def view(self) -> dict[str, Any]:
        """The ``wal`` part of ``GET /sync/status`` (sender side)."""
        now = time.monotonic()
        per = {rel: {"seq": s.last_seq, **dict(sorted(s.stats.items())), **self._standing_view(rel, now)}
               for rel, s in sorted(self.senders.items())}
        return {**dict(sorted(self.stats.items())), "files": per}

    def _standing_view(self, rel: str, now: float) -> dict[str, Any]:
        """``applied`` ({target: seq}), ``targets`` (each target's applied seq and seconds since it answered),
        ``current`` (targets at the last segment), ``carried_by``, the last ``fallback`` and its age."""
        st = self.standing.get(rel)
        if st is None:
            return {"applied": {}, "carried_by": "backup"}
        at = self.backed_up_at.get(rel)
        return {"applied": {t: p.seq for t, p in sorted(st.positions.items())},
                "targets": {t: {"seq": p.seq, "answered_s_ago": round(now - p.answered_at, 3)} if p is not None
                            else {"seq": None, "answered_s_ago": None}
                            for t, p in ((t, st.positions.get(t)) for t in sorted(st.targets))},
                "current": current_targets(st, now, current_window_s(self.cfg.interval_s)), "r": st.r,
                "carried_by": self.carried_by(rel), "fallback": st.fallback or None,
                "fallback_s_ago": round(now - st.fallback_at, 3) if st.fallback_at is not None else None,
                "backup_s_ago": round(now - at, 3) if at is not None else None}


def _holds(st: WalStanding, target: str, seg: Outgoing) -> bool:
    """Whether ``target`` answered ``seg`` or a later segment applied (sequence numbers only grow)."""
    p = st.positions.get(target)
    return p is not None and p.seq >= seg.header.seq


def _discard(segs: list[Outgoing]) -> None:
    for seg in segs:
        seg.discard()


def _from_last_snapshot(segs: list[Outgoing]) -> list[Outgoing]:
    """``segs`` from the last snapshot on (those before it discarded: it applies on any older replica)."""
    last = max((i for i, seg in enumerate(segs) if seg.header.kind == "snapshot"), default=0)
    _discard(segs[:last])
    return segs[last:]


def _held_bytes(segs: list[Outgoing]) -> int:
    """Bytes of the segments' payloads held in memory (a snapshot's is a staging file)."""
    return sum(len(seg.payload) for seg in segs if isinstance(seg.payload, bytes))


class WalInbound:
    """The receiving side (see module docstring): ``POST /sync/wal`` into :attr:`replicas`."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, inbound: Inbound) -> None:
        self.ctx, self.cfg, self.inbound = ctx, cfg, inbound
        self.replicas = WalReplicas(ctx.data_dir / "walreplicas", key_of=inbound.key_of)
        self.incoming = ctx.data_dir / ".sync" / "walin"
        self.incoming.mkdir(parents=True, exist_ok=True)
        for stale in self.incoming.iterdir():
            stale.unlink(missing_ok=True)
        self.bytes_received = 0
        self._n = 0
        self._log = RefusalLog("sync: refused a WAL segment")

    def _refusal(self, exc: SyncReject) -> tuple[int, bytes]:
        self.inbound.count(exc.reason)
        self._log(exc, time.monotonic())
        return exc.status, msgspec.msgpack.encode({"error": exc.reason, "detail": exc.detail[:200]})

    async def receive(self, headers: Any, content_length: str | None,
                      chunks: AsyncIterable[bytes]) -> tuple[int, bytes]:
        """``POST /sync/wal`` with its body unread: (HTTP status, msgpack answer). Refusals are counted (those the
        replicas refuse in :attr:`WalReplicas.refused`, the rest with the push route's)."""
        try:
            if self.inbound.store is None:
                raise SyncReject("not_member", "this node is not tagged durable: it keeps no replicas")
            try:
                declared = decode_content_length(content_length)
            except InputError as exc:
                raise SyncReject("malformed", exc.detail) from None
            if declared is None:
                raise SyncReject("malformed", "a WAL segment needs a declared length")
            self.inbound.admit()
            auth = precheck_headers(headers, key_of=self.inbound.key_of, now=time.time(),
                                    max_skew_s=self.cfg.max_clock_skew_s)
        except SyncReject as exc:
            return self._refusal(exc)
        it = chunks.__aiter__()
        try:
            with trio.fail_after(self.cfg.request_timeout_s):  # not longer for a larger declared length
                head, rest = await self._read_head(it, declared)
            h, used = decode_segment(head, key_of=self.inbound.key_of)
            if auth.verify("POST", WAL_PATH, head[:used - SIGNATURE_BYTES]) != h.origin:
                raise SyncReject("bad_signature", "the request and the segment name different origins")
            if declared != used + h.payload_bytes:
                raise SyncReject("malformed", f"{declared} bytes declared, the segment has {used + h.payload_bytes}")
        except trio.TooSlowError:
            return self._refusal(SyncReject("too_slow", "segment header not complete in time"))
        except SyncReject as exc:
            return self._refusal(exc)
        deadline = trio.current_time() + self.cfg.request_timeout_s + h.payload_bytes / MIN_BODY_BYTES_PER_S
        return await self._take_payload(h, head, rest, it, deadline)

    async def _read_head(self, it: AsyncIterator[bytes], declared: int) -> tuple[bytes, bytearray]:
        """The segment's head (length, header, signature) and the payload bytes read with it."""
        buf = bytearray()
        need = 4
        while True:
            while len(buf) < need:
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    raise SyncReject("malformed", "body ends inside the segment header") from None
                buf += chunk
                if len(buf) > declared:
                    raise SyncReject("malformed", "body longer than declared")
            if need > 4:
                return bytes(buf[:need]), buf[need:]
            n = int.from_bytes(buf[:4], "big")
            if n > MAX_SEGMENT_HEADER_BYTES:
                raise SyncReject("oversized", f"segment header of {n} bytes")
            need = 4 + n + SIGNATURE_BYTES

    async def _take_payload(self, h: SegmentHeader, head: bytes, rest: bytearray,
                            it: AsyncIterator[bytes], deadline: float) -> tuple[int, bytes]:
        """Read the payload (memory or a file), apply it under the origin's lock, answer the position."""
        budget = self.inbound.body_budget
        in_memory = h.payload_bytes <= self.cfg.max_request_bytes
        spool: Path | None = None
        reserved = 0
        try:
            if in_memory:
                if not budget.take_nowait(h.payload_bytes):
                    raise SyncReject("overloaded", "body bytes held by pushes under way")
                reserved = h.payload_bytes
            else:
                self.replicas.check_room(h)
                self._n += 1
                spool = self.incoming / f"{os.getpid()}.{self._n}.seg"
            with trio.fail_at(deadline):
                payload = await self._read_payload(h, rest, it, spool)
            body: memoryview | Path = spool if spool is not None else memoryview(payload)
            async with self.inbound.lock_of(h.origin):
                await trio.to_thread.run_sync(self.replicas.receive, head, body)
        except trio.TooSlowError:
            return self._refusal(SyncReject("too_slow", f"segment {h.seq}: payload not complete in time"))
        except SyncReject as exc:  # those of the replicas are also in WalReplicas.refused
            return self._refusal(exc)
        finally:
            if reserved:
                budget.release(reserved)
            if spool is not None:
                spool.unlink(missing_ok=True)
        self.bytes_received += len(head) + h.payload_bytes
        return 200, msgspec.msgpack.encode({"seq": h.seq, "kind": h.kind, "salts": list(h.salts),
                                            "frames": h.frames, "db_pages": h.db_pages})

    async def _read_payload(self, h: SegmentHeader, rest: bytearray, it: AsyncIterator[bytes],
                            spool: Path | None) -> bytearray:
        """The payload's ``payload_bytes`` bytes (into ``spool`` when given); the caller bounds the whole body."""
        want = h.payload_bytes
        got = len(rest)
        if got > want:
            raise SyncReject("malformed", "body longer than declared")
        fh = open(spool, "wb") if spool is not None else None  # noqa: SIM115 (closed below)
        try:
            if fh is not None:
                fh.write(rest)
                rest = bytearray()
            while got < want:
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    raise SyncReject("malformed", f"body ends after {got} of {want} payload bytes") from None
                got += len(chunk)
                if got > want:
                    raise SyncReject("malformed", "body longer than declared")
                if fh is not None:
                    await trio.to_thread.run_sync(fh.write, chunk)
                else:
                    rest += chunk
        finally:
            if fh is not None:
                fh.close()
        return rest

    def view(self) -> dict[str, Any]:
        """The ``wal`` part of ``GET /sync/status`` (receiver side)."""
        r = self.replicas
        return {"applied": dict(sorted(r.applied.items())), "refused": dict(sorted(r.refused.items())),
                "bytes": self.bytes_received,
                "replicas": [{"origin": o, "path": p, "seq": rep.state.seq if rep.state else None}
                             for (o, p), rep in sorted(r.replicas.items())]}
