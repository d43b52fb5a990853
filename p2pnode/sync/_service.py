"""The sync driver inside the agent: push loop (ephemeral nodes), push route (durable nodes), receipts, views.

Roles come from tags: a node tagged ``ephemeral`` pushes its data; a node tagged ``durable`` keeps replicas
(both tags: both). Every ``sync.interval_s`` (or at once on ``POST /sync/trigger``) a pusher:

1. re-examines its files (:class:`LocalFiles`: manifests, SQLite backups);
2. counts, per file, the signed receipts of distinct durable members matching the current ``(size, root)``
   (:class:`ReceiptIndex`) and picks the missing targets by rendezvous hashing (:func:`plan_targets`);
3. per target, sends one request with every pending file's manifest, carrying the blocks that changed since the
   version that target last committed (small appends: one request per interval); the reply lists the blocks
   still needed. They follow as one block stream on the target's data channel (``_channel``: ``sendfile`` to
   ``splice``) when it advertises one, else (or when it cannot be reached) in HTTP batches of ``request_bytes``
   (the next batch is read while one is in flight); either way checked against the file's signature around the
   reads and paced by ``max_bytes_per_s``. These block transfers run in the background: a pass never waits for
   a large file, so a new game in a database still leaves within one interval while a checkpoint is on its way.

A target that answers 507 (disk at its critical level, or no space) is skipped for ``backpressure_backoff_s``
and the next member in the file's ranking takes its place. An HTTP reply never counts as a replica: only a
receipt in the target's own signed snapshot does.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3
import httpx
import msgpack
import trio

from ..gossip import MemberState
from ._channel import StreamServer, send_stream, split_host
from ._ledger import ReceiptIndex, deletable, effective_r, plan_targets
from ._manifest import Manifest, changed_blocks
from ._source import LocalFile, LocalFiles
from ._store import REJECT_REASONS, PushItem, RefusalLog, ReplicaStore, SyncReject, receipts_digest
from ._wire import (
    PushAuth,
    decode_push,
    decode_reply,
    encode_push,
    encode_reply,
    encode_stream_header,
    header_part_length,
    precheck_headers,
    sign_headers,
)

if TYPE_CHECKING:
    from ..agent import Agent

__all__ = ["PUSH_BODY_BUDGET_BYTES", "REJECT_REASONS", "ByteBudget", "SyncService", "TokenBucket"]

log = logging.getLogger(__name__)

PUSH_PATH = "/sync/push"
MAX_ROUNDS_PER_FILE = 4
CONNECT_TIMEOUT_S = 5.0  # an unreachable target (partition, dead host) fails fast; a slow transfer may take longer
IN_FLIGHT = 2  # push requests in flight per target: one is written while the next travels and is hashed
TRANSFERS_PER_TARGET = 2  # files whose blocks travel to one target at the same time
NO_CHANNEL_BACKOFF_S = 60.0
MAX_RECEIPTS_BODY = 64 * 2**20  # a fetched receipt list (about 600,000 receipts of 60-byte paths)  # a data channel that could not be reached is retried after this (HTTP meanwhile)
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
        self.used -= n


class _ChannelBusy(Exception):
    """The target's data channel refused a stream with ``busy`` (all its stream slots taken): use HTTP."""


class TokenBucket:
    """Pacing for ``rate`` bytes per second with bursts of ``burst`` bytes (``rate`` 0: unlimited). Pure: the
    caller passes monotonic time and sleeps for :meth:`take`'s answer."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.at: float | None = None

    def take(self, n: int, now: float) -> float:
        """Take ``n`` bytes; return the seconds to wait before sending them."""
        if self.rate <= 0:
            return 0.0
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class SyncService:
    """Sync for one agent (see module docstring). Counters feed ``/sync/status`` and ``/metrics``."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.cfg = agent.config.sync
        tags = set(agent.config.agent.tags)
        self.pushes = self.cfg.enabled and "ephemeral" in tags
        self.keeps = self.cfg.enabled and "durable" in tags
        state_dir = agent.data_dir / ".sync"
        state_dir.mkdir(parents=True, exist_ok=True)
        self.root = Path(self.cfg.root).absolute() if self.cfg.root else agent.data_dir / "data"
        self.store = ReplicaStore(agent.data_dir) if self.keeps else None
        self.source = (
            LocalFiles(self.root, globs=self.cfg.globs, append_globs=self.cfg.append_globs, state_dir=state_dir,
                       settle_s=self.cfg.settle_s)
            if self.pushes else None
        )
        self.bucket = TokenBucket(self.cfg.max_bytes_per_s, self.cfg.request_bytes)  # bursts of one request
        self._acked: dict[tuple[str, str], Manifest] = {}
        self._refusing: dict[str, float] = {}
        self._origin_locks: dict[str, trio.Lock] = {}
        self._trigger = trio.Event()
        self._file_view: dict[str, dict[str, Any]] = {}
        self._progress: dict[str, list[int]] = {}
        self._below: set[str] = set()
        self._reached: set[str] = set()
        self._busy: set[tuple[str, str]] = set()  # (target, path) block transfers under way
        self._pushing: set[str] = set()  # targets with a manifest request under way
        self._nursery: trio.Nursery | None = None  # files that reached R once (events fire on falling below it after)
        self._unconfirmed_since: dict[str, float] = {}
        self._target_slots: dict[str, trio.Semaphore] = {}
        self._fetched: dict[str, tuple[str, dict[str, tuple[int, bytes]]]] = {}  # holder -> (digest, receipts)
        self._fetching: set[str] = set()
        self.receipt_fetches = 0
        self.receipt_fetch_failures = 0
        self._no_channel: dict[tuple[str, int], float] = {}  # (host, port) -> trio time until which HTTP is used
        self.data_port: int | None = None  # the data channel's bound port (durable nodes)
        self.channel: StreamServer | None = None
        self.streams_sent = 0
        self.channel_fallbacks = 0
        self.passes = 0
        self.bytes_sent = 0
        self.blocks_sent = 0
        self.blocks_resent = 0
        self.requests = 0
        self.request_failures = 0
        self.push_rejected: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()  # requests refused before reaching the store
        self.body_budget = ByteBudget(max(self.cfg.max_request_bytes, PUSH_BODY_BUDGET_BYTES))
        self._log_refusal = RefusalLog("sync: refused a push")

    # -- receipts ------------------------------------------------------------------------------------
    def _durable(self) -> tuple[set[str], set[str]]:
        """Durable members known (not left; dead ones included, they still hold R up) and those that count now
        (alive or suspect), self excluded."""
        known, counting = set(), set()
        a = self.agent
        for e in a.state.entries():
            if e.origin == a.node_id or "durable" not in e.snapshot.get("tags", []):
                continue
            st = a.membership.state_of(e.origin)
            if st is MemberState.LEFT or e.leaving:
                continue
            known.add(e.origin)
            if st in (None, MemberState.ALIVE, MemberState.SUSPECT):
                counting.add(e.origin)
        return known, counting

    def receipt_index(self) -> tuple[ReceiptIndex, int, set[str]]:
        """Receipts for this node's files, the number of durable members known, and those counting now."""
        known, counting = self._durable()
        me = self.agent.node_id
        receipts: dict[str, dict[str, tuple[int, bytes]]] = {}
        for holder in counting:
            e = self.agent.state.get(holder)
            if e is None:
                continue
            sync = e.snapshot.get("sync") or {}
            fetched = self._fetched.get(holder)
            digest = (sync.get("receipt_digests") or {}).get(me)
            if fetched is not None and digest is not None and fetched[0] == digest:
                receipts[holder] = fetched[1]  # the full list, bound to this signed snapshot by its digest
            else:
                receipts[holder] = {r[0]: (r[1], r[2]) for r in (sync.get("receipts") or {}).get(me, [])}
        return ReceiptIndex(receipts, counting), len(known), counting

    def _stale_receipt_lists(self, counting: set[str]) -> list[tuple[str, str, str]]:
        """``(holder, addr, digest)`` for holders whose snapshot announces a receipt list for this node that the
        receipts in the snapshot do not cover (more than fit there) and that has not been fetched yet."""
        me = self.agent.node_id
        out = []
        for holder in counting:
            e = self.agent.state.get(holder)
            if e is None or not e.addr:
                continue
            sync = e.snapshot.get("sync") or {}
            digest = (sync.get("receipt_digests") or {}).get(me)
            if digest is None or (self._fetched.get(holder) or ("",))[0] == digest:
                continue
            inline = sorted((sync.get("receipts") or {}).get(me, []), key=lambda r: r[0])
            if receipts_digest(inline) == digest:
                self._fetched[holder] = (digest, {r[0]: (r[1], r[2]) for r in inline})
                continue
            out.append((holder, e.addr, digest))
        return out

    async def _fetch_receipts(self, holder: str, addr: str, digest: str) -> None:
        """``GET /sync/receipts?origin=<me>`` from ``holder``; the list counts only if it hashes to the digest in
        the holder's signed snapshot (so it is as good as receipts in that snapshot), else it is dropped and
        counted (``receipts_mismatch``)."""
        client = self.agent._client
        assert client is not None
        try:
            resp = await client.get(f"http://{addr}/sync/receipts", params={"origin": self.agent.node_id},
                                    timeout=httpx.Timeout(self.cfg.request_timeout_s, connect=CONNECT_TIMEOUT_S))
            body = resp.content
            if resp.status_code != 200 or len(body) > MAX_RECEIPTS_BODY:
                raise ValueError(f"status {resp.status_code}, {len(body)} bytes")
            raw = msgpack.unpackb(body, raw=False, max_bin_len=64, max_str_len=4096, max_array_len=1 << 22)
            if not isinstance(raw, list) or not all(
                    isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and isinstance(r[1], int)
                    and isinstance(r[2], bytes) and len(r[2]) == 32 for r in raw):
                raise ValueError("not a receipt list")
        except (httpx.HTTPError, OSError, ValueError, msgpack.UnpackException) as exc:
            self.receipt_fetch_failures += 1
            log.info("sync: fetching receipts from %s failed: %s", holder, exc)
            return
        finally:
            self._fetching.discard(holder)
        if receipts_digest(raw) != digest:
            self.rejected["receipts_mismatch"] += 1
            log.warning("sync: receipts from %s do not match the digest in its snapshot; ignored", holder)
            return
        self._fetched[holder] = (digest, {r[0]: (r[1], r[2]) for r in raw})
        self.receipt_fetches += 1

    def replicated_predicate(self) -> Callable[[str], bool]:
        """For the disk manager: a predicate over paths relative to the data dir, True only when the file's
        current version is confirmed by R distinct durable members (receipts matching its size and root) and
        the file is still exactly what was hashed (same inode, size, mtime; for SQLite, same ``-wal`` too).
        Take it in the trio thread; calling it (it only stats files) is safe from the cleaner's worker thread."""
        if self.source is None:
            return lambda path: False
        index, known, _ = self.receipt_index()
        if known == 0:
            return lambda path: False
        ok = deletable({f.path: (f.manifest.size, f.manifest.root) for f in self.source.files.values()}, index,
                       r=self.cfg.replication_factor, durable_members=known)
        versions: dict[str, tuple[str, tuple[int, ...]]] = {}
        for f in self.source.files.values():
            if f.path in ok:
                try:
                    rel = (self.root / f.path).relative_to(self.agent.data_dir).as_posix()
                except ValueError:
                    continue
                versions[rel] = (f.path, f.signature)
        source = self.source

        def replicated(path: str) -> bool:
            v = versions.get(path)
            return v is not None and source.live_signature(v[0]) == v[1]

        return replicated

    def snapshot_fields(self) -> dict[str, Any]:
        """The ``sync`` snapshot field: receipts (durable nodes) and a compact digest of this node's manifests."""
        out: dict[str, Any] = {}
        if self.store is not None:
            out["receipts"] = self.store.receipts(self.cfg.max_receipts)
            out["receipt_digests"] = self.store.receipt_digests()
            if self.data_port:
                out["data_port"] = self.data_port
        if self.source is not None:
            files = sorted(self.source.files.values(), key=lambda f: f.path)
            h = blake3.blake3()
            for f in files:
                h.update(f.path.encode() + b"\x00" + f.manifest.root)
            out["digest"] = h.hexdigest(length=16)
            out["files"] = len(files)
            out["bytes"] = sum(f.manifest.size for f in files)
            out["under_replicated"] = len(self._below)
        return {"sync": out} if out else {}

    # -- receiving -----------------------------------------------------------------------------------
    def _key_of(self, origin: str) -> bytes | None:
        e = self.agent.state.get(origin)
        if e is None or origin == self.agent.node_id:
            return None
        if self.agent.membership.state_of(origin) in (MemberState.DEAD, MemberState.LEFT):
            return None
        return e.envelope.key

    def count_rejection(self, reason: str) -> None:
        self.rejected[reason] += 1

    def _admit(self) -> None:
        """Raise ``SyncReject("backpressure")`` while this node's disk is at its critical level."""
        sample = self.agent.last_sample
        if sample is not None and sample.disk_percent >= self.agent.limits.disk_max_percent:
            raise SyncReject("backpressure", f"disk at {sample.disk_percent:.1f} % >= "
                             f"{self.agent.limits.disk_max_percent:g} % (critical)")

    def _lock_of(self, origin: str) -> trio.Lock:
        return self._origin_locks.setdefault(origin, trio.Lock())

    async def _serve_channel(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``sync.data_port`` (durable nodes). A port that cannot be bound is logged and the channel left
        off: senders then use HTTP."""
        assert self.store is not None
        bind = self.agent.config.agent.bind or "0.0.0.0"  # one listener: one port to advertise, also for port 0
        try:
            listeners = await trio.open_tcp_listeners(self.cfg.data_port, host=bind)
        except OSError as exc:
            log.warning("sync: data channel off, port %d on %s unavailable (%s); blocks go over HTTP",
                        self.cfg.data_port, bind, exc)
            task_status.started()
            return
        self.data_port = listeners[0].socket.getsockname()[1]
        self.channel = StreamServer(
            self.store, key_of=self._key_of, admit=self._admit, lock_of=self._lock_of,
            on_commit=self.agent.publish_to, count=self.count_rejection, now=time.time,
            max_skew_s=self.cfg.max_clock_skew_s, timeout_s=self.cfg.request_timeout_s)
        log.info("sync: data channel on port %d", self.data_port)
        task_status.started()
        await trio.serve_listeners(self.channel.handle, listeners)

    def _refusal(self, exc: SyncReject) -> tuple[int, bytes]:
        self.count_rejection(exc.reason)
        self._log_refusal(exc, time.monotonic())
        return exc.status, encode_reply([{"path": "", "status": "rejected", "reason": exc.reason,
                                          "detail": exc.detail}])

    def _precheck(self, headers: Any) -> PushAuth:
        """What can be decided before a body byte is read: durable, disk not critical, the headers name a member
        whose key we hold, a time within skew, a well-formed signature. Raises :class:`SyncReject`."""
        if self.store is None:
            raise SyncReject("not_member", "this node is not tagged durable: it keeps no replicas")
        self._admit()
        return precheck_headers(headers, key_of=self._key_of, now=time.time(), max_skew_s=self.cfg.max_clock_skew_s)

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
            declared = int(content_length) if content_length is not None and content_length.isdigit() else None
            if content_length is not None and declared is None:
                raise SyncReject("malformed", f"content-length {content_length[:32]!r}")
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
                    origin, body = await self._read_push_body(auth, declared, chunks)
            except trio.TooSlowError:
                raise SyncReject("too_slow", f"body not complete within {self.cfg.request_timeout_s:g} s") from None
            return await self._apply_push(origin, body)
        except SyncReject as exc:
            return self._refusal(exc)
        finally:
            self.body_budget.release(reserve)

    async def _read_push_body(self, auth: PushAuth, declared: int | None,
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

    async def _apply_push(self, origin: str, body: bytes | bytearray) -> tuple[int, bytes]:
        """Decode an authenticated push body and apply its items. Raises ``SyncReject("malformed")``."""
        items = decode_push(body)
        lock = self._lock_of(origin)
        store = self.store
        await trio.to_thread.run_sync(store.prehash, items)
        async with lock:
            results = await trio.to_thread.run_sync(lambda: [store.apply(origin, it) for it in items])
        if any(r["status"] == "committed" for r in results):
            self.agent.publish_to(origin)
        status = next((r.pop("http_status") for r in results if "http_status" in r), 200)
        for r in results:
            r.pop("http_status", None)
        return status, encode_reply(results)

    # -- pushing -------------------------------------------------------------------------------------
    def trigger(self) -> None:
        """Run a pass now (``POST /sync/trigger``, ``p2pnode sync push``)."""
        self._trigger.set()

    async def _expire_loop(self) -> None:
        assert self.store is not None
        while True:
            await trio.to_thread.run_sync(self.store.expire_partials, self.cfg.partial_ttl_s, time.time())
            await trio.sleep(min(3600.0, self.cfg.partial_ttl_s / 4))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            self._nursery = n
            if self.store is not None:
                n.start_soon(self._expire_loop)
                if self.cfg.data_port >= 0:
                    await n.start(self._serve_channel)
            task_status.started()
            if self.source is not None:
                await self._push_loop()

    async def _push_loop(self) -> None:
        while True:
            try:
                await self.pass_once()
            except (OSError, httpx.HTTPError) as exc:
                log.warning("sync pass failed: %s", exc)
            except Exception:  # a sync bug must not take the agent (membership, jobs) down with it
                log.exception("sync pass failed unexpectedly; retrying next interval")
            with trio.move_on_after(self.cfg.interval_s):
                await self._trigger.wait()
            self._trigger = trio.Event()

    async def pass_once(self) -> None:
        """One pass (see module docstring)."""
        assert self.source is not None
        self.passes += 1
        t0 = time.perf_counter()
        files = await trio.to_thread.run_sync(self.source.scan, time.time())
        log.debug("sync: pass %d scanned %d files in %.3f s", self.passes, len(files), time.perf_counter() - t0)
        _, counting = self._durable()
        for holder, addr, digest in self._stale_receipt_lists(counting):
            if holder not in self._fetching:  # in the background under the agent: used from the next pass on
                self._fetching.add(holder)
                if self._nursery is not None:
                    self._nursery.start_soon(self._fetch_receipts, holder, addr, digest)
                else:
                    await self._fetch_receipts(holder, addr, digest)
        index, known, counting = self.receipt_index()
        now = trio.current_time()
        self._refusing = {n: t for n, t in self._refusing.items() if t > now}
        refusing = frozenset(self._refusing)
        r = self.cfg.replication_factor
        r_eff = effective_r(r, known)
        by_target: dict[str, list[LocalFile]] = {}
        view: dict[str, dict[str, Any]] = {}
        key_base = self.agent.node_id + "/"
        for f in files.values():
            confirmed = index.confirmed_by(f.path, f.manifest.size, f.manifest.root)
            targets = plan_targets(key_base + f.path, confirmed=confirmed, candidates=counting, r=r,
                                   durable_members=known, refusing=refusing) if known else []
            for t in targets:
                by_target.setdefault(t, []).append(f)
            view[f.path] = {"path": f.path, "class": f.cls, "size": f.manifest.size, "seq": f.seq,
                            "root": f.manifest.root.hex(), "confirmed": sorted(confirmed), "r": r_eff,
                            "targets": targets, "seen_at": f.seen_at}
            self._track_level(f, len(confirmed), r_eff, known)
        for gone in set(self._unconfirmed_since) - set(files):
            del self._unconfirmed_since[gone]
        for key in [k for k in self._acked if k[1] not in files]:
            del self._acked[key]
        self._file_view = view
        self._progress = {k: v for k, v in self._progress.items() if any(k == p for _, p in self._busy)}
        # Under the agent each target's push runs in the background and the pass returns: an unreachable or slow
        # target never holds up the next scan (new files are hashed, lag is measured, others are served).
        async with trio.open_nursery() as n:
            for target, tfiles in by_target.items():
                e = self.agent.state.get(target)
                if e is None or not e.addr or target in self._pushing:
                    continue
                self._pushing.add(target)
                (self._nursery or n).start_soon(self._push_target, target, e.addr, tfiles)

    def _track_level(self, f: LocalFile, confirmed: int, r_eff: int, known: int) -> None:
        """Lag bookkeeping and the edge-triggered ``UNDER_REPLICATED`` / ``REPLICATION_RESTORED`` events (only for
        files that reached R once: a new file is not an incident)."""
        path = f.path
        below = known == 0 or confirmed < r_eff
        if below:
            self._unconfirmed_since.setdefault(path, f.seen_at)
            if path not in self._below:
                self._below.add(path)
                if path in self._reached:
                    self.agent.emit_event("UNDER_REPLICATED", {"path": path, "confirmed": confirmed, "r": r_eff})
        else:
            self._unconfirmed_since.pop(path, None)
            if path in self._below:
                self._below.discard(path)
                if path in self._reached:
                    self.agent.emit_event("REPLICATION_RESTORED", {"path": path, "confirmed": confirmed, "r": r_eff})
            self._reached.add(path)

    async def _post(self, addr: str, body: bytes) -> httpx.Response:
        client = self.agent._client
        assert client is not None
        wait = self.bucket.take(len(body), trio.current_time())
        if wait > 0:
            await trio.sleep(wait)
        headers = sign_headers(self.agent.identity, "POST", PUSH_PATH, body)
        headers["content-type"] = "application/msgpack"
        self.requests += 1
        self.bytes_sent += len(body)
        timeout = httpx.Timeout(self.cfg.request_timeout_s, connect=min(CONNECT_TIMEOUT_S, self.cfg.request_timeout_s))
        return await client.post(f"http://{addr}{PUSH_PATH}", content=body, headers=headers, timeout=timeout)

    async def _push_target(self, target: str, addr: str, files: list[LocalFile]) -> None:
        try:
            await self._push_target_inner(target, addr, files)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self.request_failures += 1
            log.info("sync: push to %s (%s) failed: %s", target, addr, exc)
        finally:
            self._pushing.discard(target)

    def _item(self, f: LocalFile, blocks: list[tuple[int, bytes]]) -> PushItem:
        return PushItem(f.path, f.manifest, f.seq, blocks, True, f.cls)

    def _read_blocks(self, f: LocalFile, indices: list[int]) -> list[tuple[int, bytes]] | None:
        """Read blocks of ``f`` (blocking). None when the file changed since it was hashed: its signature (inode,
        size, mtime in ns) is checked before and after the reads, so the bytes read are the bytes hashed without
        hashing them twice (a block that slipped through anyway is caught by the receiver's hash check)."""
        m = f.manifest
        expect = f.signature if f.cls != "sqlite" else None  # the SQLite staging copy is ours: nobody writes it
        if expect is not None and self.source.live_signature(f.path) != expect:
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
        if expect is not None and self.source.live_signature(f.path) != expect:
            return None
        return out

    async def _push_target_inner(self, target: str, addr: str, files: list[LocalFile]) -> None:
        # 1. one request: every file's manifest, with the blocks that changed since the version this target
        #    committed last (when that is small enough to ride along).
        budget = self.cfg.request_bytes
        items, used = [], 0
        for f in sorted(files, key=lambda f: f.seen_at):
            if (target, f.path) in self._busy:
                continue  # a transfer of it to this target is under way (it is offered again once it ends)
            base = self._acked.get((target, f.path))
            blocks: list[tuple[int, bytes]] = []
            if base is not None:
                delta = changed_blocks(base, f.manifest)
                size = sum(f.manifest.block_len(i) for i in delta)
                if used + size + len(f.manifest.hashes) <= budget:
                    got = await trio.to_thread.run_sync(self._read_blocks, f, delta)
                    if got is None:
                        self.source.mark_stale(f.path)
                        continue
                    blocks, used = got, used + size
            used += len(f.manifest.hashes) + 256
            items.append((f, self._item(f, blocks)))
            self._progress[f.path] = [0, f.manifest.size]
        need: dict[str, list[int]] = {}
        byname = {f.path: f for f, _ in items}
        for chunk in _chunks(items, budget):
            results = await self._send(target, addr, [it for _, it in chunk])
            if results is None:
                return
            for res in results:
                self._note_result(target, byname, res, need)
        # 2. the blocks still needed, file by file, in batches; the next batch is read while one is in flight.
        #    Under the agent these run in the background, so a large file never holds up the next pass (a new
        #    game in a database still leaves within one interval while a checkpoint is on its way).
        for path, indices in need.items():
            self._busy.add((target, path))
            if self._nursery is not None:
                self._nursery.start_soon(self._transfer, target, addr, byname[path], indices)
            else:
                await self._transfer(target, addr, byname[path], indices)

    async def _transfer(self, target: str, addr: str, f: LocalFile, indices: list[int] | None) -> None:
        """Send the blocks of ``f`` the target still needs (up to ``MAX_ROUNDS_PER_FILE`` rounds, for blocks it
        refused). At most ``TRANSFERS_PER_TARGET`` files travel to one target at a time, oldest first: a node with
        hundreds of pending files does not open hundreds of streams (or HTTP requests) at once."""
        try:
            async with self._target_slots.setdefault(target, trio.Semaphore(TRANSFERS_PER_TARGET)):
                for _round in range(MAX_ROUNDS_PER_FILE):
                    if not indices:
                        break
                    self._progress[f.path] = [0, sum(f.manifest.block_len(i) for i in indices)]
                    indices = await self._send_blocks(target, addr, f, indices)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self.request_failures += 1
            log.info("sync: transfer of %s to %s failed: %s", f.path, target, exc)
        finally:
            self._busy.discard((target, f.path))

    def _note_result(self, target: str, byname: dict[str, LocalFile], res: dict[str, Any],
                     need: dict[str, list[int]]) -> None:
        f = byname.get(res["path"])
        if f is None:
            return
        st = res.get("status")
        if st in ("have", "committed"):
            self._acked[(target, f.path)] = f.manifest
            need.pop(f.path, None)
            p = self._progress.get(f.path)
            if p:
                p[0] = p[1]
        elif st == "need":
            need[f.path] = [i for i in res.get("need", []) if isinstance(i, int)]
            if res.get("rejected_blocks"):
                n = res.get("rejected_count")
                self.blocks_resent += n if isinstance(n, int) and n >= 0 else len(res["rejected_blocks"])
                for b in res["rejected_blocks"]:
                    self.push_rejected[str(b.get("reason"))] += 1
        elif st == "rejected":
            reason = str(res.get("reason"))
            self.push_rejected[reason] += 1
            if reason in ("backpressure", "no_space"):
                self._refusing[target] = trio.current_time() + self.cfg.backpressure_backoff_s
            log.info("sync: %s refused %s: %s %s", target, f.path, reason, res.get("detail", ""))

    async def _send(self, target: str, addr: str, items: list[PushItem]) -> list[dict[str, Any]] | None:
        resp = await self._post(addr, encode_push(items))
        if resp.status_code == 507:
            self._refusing[target] = trio.current_time() + self.cfg.backpressure_backoff_s
        try:
            results = decode_reply(resp.content)
        except ValueError as exc:
            self.request_failures += 1
            log.info("sync: %s answered %d: %s", target, resp.status_code, exc)
            return None
        if resp.status_code != 200 and len(results) == 1 and results[0].get("path") == "":
            self.push_rejected[str(results[0].get("reason"))] += 1
            log.info("sync: %s refused the request (%d): %s", target, resp.status_code, results[0].get("detail"))
            return None
        return results

    def _channel_of(self, target: str, addr: str) -> tuple[str, int] | None:
        """The target's data channel ``(host, port)`` from its snapshot, unless it failed to connect lately."""
        e = self.agent.state.get(target)
        port = ((e.snapshot.get("sync") or {}).get("data_port") if e is not None else None)
        if not port:
            return None
        chan = (split_host(addr), int(port))
        until = self._no_channel.get(chan)
        if until is not None and until > trio.current_time():
            return None
        return chan

    async def _stream_blocks(self, target: str, chan: tuple[str, int], f: LocalFile,
                             indices: list[int]) -> list[int] | None:
        """Send ``indices`` of ``f`` over the target's data channel (see ``_channel``): the blocks it still needs
        after this stream ([] when committed), or None when the file changed or the target refused. Raises
        ``OSError`` when the channel cannot be reached and :class:`_ChannelBusy` when its stream slots are all
        taken (the caller falls back to HTTP for both)."""
        m = f.manifest
        expect = f.signature if f.cls != "sqlite" else None  # the SQLite staging copy is ours: nobody writes it
        if expect is not None and self.source.live_signature(f.path) != expect:
            self.source.mark_stale(f.path)
            return None
        runs: list[tuple[int, int]] = []
        for i in sorted(set(indices)):
            if runs and runs[-1][0] + runs[-1][1] == i:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((i, 1))
        item = self._item(f, [])
        header = encode_stream_header(self.agent.identity, item, runs)
        total = sum(m.block_len(i) for i in indices)
        prog = self._progress.setdefault(f.path, [0, total])
        limited = self.cfg.max_bytes_per_s > 0

        def pace(n: int) -> None:
            wait = trio.from_thread.run_sync(lambda: self.bucket.take(n, trio.current_time()))
            if wait > 0:
                time.sleep(wait)

        def progress(n: int) -> None:
            prog[0] = min(prog[1], prog[0] + n)
            self.bytes_sent += n

        stop = threading.Event()
        timeout = min(CONNECT_TIMEOUT_S, self.cfg.request_timeout_s)
        t0 = time.perf_counter()
        self.requests += 1
        try:
            reply = await trio.to_thread.run_sync(
                lambda: send_stream(chan[0], chan[1], header, f.read_path, m, runs, connect_timeout_s=timeout,
                                    timeout_s=self.cfg.request_timeout_s, chunk_bytes=self.cfg.request_bytes,
                                    pace=pace if limited else None,
                                    progress=progress, stop=stop),
                abandon_on_cancel=True)
        except BaseException:
            stop.set()
            raise
        self.streams_sent += 1
        self.blocks_sent += len(indices)
        log.debug("sync: streamed %d blocks (%d bytes) of %s to %s in %.3f s", len(indices), total, f.path, target,
                  time.perf_counter() - t0)
        if expect is not None and self.source.live_signature(f.path) != expect:
            self.source.mark_stale(f.path)  # changed while it was sent: blocks that differ were refused
        results = reply.get("files") if isinstance(reply.get("files"), list) else []
        need: dict[str, list[int]] = {}
        for res in results:
            if not isinstance(res, dict):
                continue
            if res.get("path") == "":
                self.push_rejected[str(res.get("reason"))] += 1
                if res.get("reason") in ("backpressure", "no_space"):
                    self._refusing[target] = trio.current_time() + self.cfg.backpressure_backoff_s
                log.info("sync: %s refused a stream of %s: %s", target, f.path, res.get("detail"))
                if res.get("reason") == "busy":
                    raise _ChannelBusy(str(res.get("detail")))
                return None
            self._note_result(target, {f.path: f}, res, need)
            if res.get("status") in ("have", "committed"):
                return []
            if res.get("status") == "rejected":
                return None
        return need.get(f.path) if f.path in need else None

    async def _send_blocks(self, target: str, addr: str, f: LocalFile, indices: list[int]) -> list[int] | None:
        """Send ``indices`` of ``f``: over the target's data channel when it advertises one (falling back to
        HTTP when it cannot be reached), else in HTTP batches of ``request_bytes``, ``IN_FLIGHT`` requests at a
        time (the next batch is read and verified while others travel). Returns the blocks the receiver still
        needs after the last request it answered ([] when committed), or None when the file changed or the
        target refused."""
        chan = self._channel_of(target, addr)
        if chan is not None:
            try:
                return await self._stream_blocks(target, chan, f, indices)
            except (ConnectionRefusedError, socket.timeout, socket.gaierror) as exc:
                if self._progress.get(f.path, [0])[0] > 0:
                    raise  # it broke mid-stream: the next pass resumes
                self._no_channel[chan] = trio.current_time() + NO_CHANNEL_BACKOFF_S
                self.channel_fallbacks += 1
                log.info("sync: data channel of %s at %s:%d unreachable (%s); HTTP for %.0f s", target, *chan, exc,
                         NO_CHANNEL_BACKOFF_S)
            except _ChannelBusy as exc:  # refused before any block went: this transfer goes over HTTP
                self.channel_fallbacks += 1
                log.info("sync: data channel of %s at %s:%d refused a stream (%s); this one goes over HTTP", target,
                         *chan, exc)
        m = f.manifest
        batches: list[list[int]] = [[]]
        size = 0
        for i in indices:
            n = m.block_len(i)
            if batches[-1] and size + n > self.cfg.request_bytes:
                batches.append([])
                size = 0
            batches[-1].append(i)
            size += n
        send, recv = trio.open_memory_channel[list[tuple[int, bytes]] | None](1)
        outcome: dict[str, Any] = {"committed": False, "need": list(indices), "abort": False}

        async def reader() -> None:
            async with send:
                for b in batches:
                    got = await trio.to_thread.run_sync(self._read_blocks, f, b)
                    try:
                        await send.send(got)
                    except trio.BrokenResourceError:
                        return  # the senders stopped (abort)
                    if got is None:
                        return

        async def sender(recv: trio.MemoryReceiveChannel) -> None:
            async with recv:
                async for blocks in recv:
                    if outcome["abort"]:
                        return
                    if blocks is None:
                        self.source.mark_stale(f.path)
                        outcome["abort"] = True
                        return
                    try:
                        results = await self._send(target, addr, [self._item(f, blocks)])
                    except (httpx.HTTPError, OSError) as exc:
                        self.request_failures += 1
                        log.info("sync: push of %s to %s failed: %s", f.path, target, exc)
                        outcome["abort"] = True
                        return
                    self.blocks_sent += len(blocks)
                    if results is None:
                        outcome["abort"] = True
                        return
                    p = self._progress.get(f.path)
                    if p:
                        p[0] = min(p[1], p[0] + sum(len(d) for _, d in blocks))
                    need: dict[str, list[int]] = {}
                    for res in results:
                        self._note_result(target, {f.path: f}, res, need)
                        if res.get("status") in ("have", "committed"):
                            outcome["committed"] = True
                        elif res.get("status") == "rejected":
                            outcome["abort"] = True
                            return
                    outcome["need"] = need.get(f.path, [])

        async with trio.open_nursery() as n:
            n.start_soon(reader)
            for _ in range(IN_FLIGHT):
                n.start_soon(sender, recv.clone())
            recv.close()
        if outcome["committed"]:
            return []
        return None if outcome["abort"] else outcome["need"]

    # -- views ---------------------------------------------------------------------------------------
    def status_view(self) -> dict[str, Any]:
        """``GET /sync/status``: role, R, each file (class, size, replicas confirmed of R, lag, bytes pending),
        counters; and for durable nodes, the replicas held and transfers under way."""
        now = time.time()
        index, known, counting = self.receipt_index()
        r_eff = effective_r(self.cfg.replication_factor, known)
        files = []
        if self.source is not None:
            for f in sorted(self.source.files.values(), key=lambda f: f.path):
                confirmed = index.confirmed_by(f.path, f.manifest.size, f.manifest.root)
                done = len(confirmed) >= r_eff and known > 0
                v = self._file_view.get(f.path, {})
                prog = self._progress.get(f.path)
                pending = 0 if done else (prog[1] - prog[0] if prog else f.manifest.size) * max(1, r_eff - len(confirmed))
                files.append({
                    "path": f.path, "class": f.cls, "size": f.manifest.size, "seq": f.seq,
                    "root": f.manifest.root.hex(), "replicas": len(confirmed), "r": r_eff,
                    "confirmed_by": sorted(confirmed), "targets": v.get("targets", []),
                    "lag_s": 0.0 if done else round(max(0.0, now - self._unconfirmed_since.get(f.path, f.seen_at)), 3),
                    "bytes_pending": pending,
                    "progress": {"sent": prog[0], "total": prog[1]} if prog else None,
                })
        return {
            "node_id": self.agent.node_id,
            "pushes": self.pushes,
            "keeps": self.keeps,
            "root": str(self.root),
            "replication_factor": self.cfg.replication_factor,
            "r_effective": r_eff,
            "durable_members": known,
            "durable_counting": sorted(counting),
            "refusing": sorted(self._refusing),
            "data_port": self.data_port,
            "files": files,
            "errors": dict(self.source.errors) if self.source else {},
            "sent": {"passes": self.passes, "requests": self.requests, "request_failures": self.request_failures,
                     "bytes": self.bytes_sent, "blocks": self.blocks_sent, "blocks_resent": self.blocks_resent,
                     "streams": self.streams_sent, "channel_fallbacks": self.channel_fallbacks,
                     "receipt_fetches": self.receipt_fetches, "receipt_fetch_failures": self.receipt_fetch_failures,
                     "rejected_by_targets": dict(sorted(self.push_rejected.items())),
                     "sqlite_backups": self.source.backups if self.source else 0},
            "received": {**(self.store.view() if self.store else {}),
                         **({"streams": self.channel.streams} if self.channel else {}),
                         "refused_requests": dict(sorted(self.rejected.items()))},
        }

    def rejected_total(self) -> Counter[str]:
        c: Counter[str] = Counter(self.rejected)
        if self.store is not None:
            c.update(self.store.rejected)
        return c


def _chunks(items: list[tuple[LocalFile, PushItem]], budget: int) -> list[list[tuple[LocalFile, PushItem]]]:
    out: list[list[tuple[LocalFile, PushItem]]] = [[]]
    used = 0
    for f, it in items:
        n = len(it.manifest.hashes) + sum(len(d) for _, d in it.blocks) + 256
        if out[-1] and used + n > budget:
            out.append([])
            used = 0
        out[-1].append((f, it))
        used += n
    return out if out[0] else []

