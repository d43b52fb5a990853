"""Live WAL-mode databases over ``POST /sync/wal``: the sender's pass here, the receiver's route in
:mod:`._walinbound` (drivers; only a node that pushes imports this module).

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
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import trio

from .._lazy import lazy_module
from ..errors import SyncReplyRejected
from ..identity import PersistentCounter
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
from ._walinbound import MIN_BODY_BYTES_PER_S as MIN_BODY_BYTES_PER_S
from ._walinbound import WAL_PATH, WalInbound
from ._walsend import Outgoing, WalSender
from ._wire import sign_headers

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

if TYPE_CHECKING:
    from ..config import SyncConfig
    from ..node import NodeContext
    from ._source import LocalFiles

__all__ = ["MAX_WAL_REPLY_BYTES", "WAL_PATH", "WalInbound", "WalShipper"]

log = logging.getLogger(__name__)

MAX_WAL_REPLY_BYTES = 4096
"""A target's answer to a segment is at most this long (``reply_oversized`` beyond)."""
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
