"""The sender: each pass picks the durable targets of this node's files and offers each target their manifests.

Every ``sync.interval_s`` (or at once on ``POST /sync/trigger``) a pass:

1. re-examines this node's files (:class:`LocalFiles`: manifests, SQLite backups);
2. counts, per file, the receipts of distinct durable members matching the current ``(size, root)``
   (:class:`~._replication.Replication`), less the holders that failed a proof-of-possession challenge for it
   (:mod:`._possess`), and picks the missing targets by rendezvous hashing (:func:`plan_targets`), never one
   that failed;
3. per target, sends one request with every pending file's manifest, carrying the blocks that changed since the
   version that target last committed (small appends: one request per interval); the reply lists the blocks
   still needed, which :class:`~._blocks.BlockSender` then moves in the background, at most
   :data:`TRANSFERS_PER_TARGET` files per target at a time: a pass never waits for a large file.

A target that answers 507 (disk at its critical level, or no space) is skipped for ``backpressure_backoff_s``
and the next member in the file's ranking takes its place. An HTTP reply never counts as a replica. A reply is
decoded once, into typed results (:func:`p2pnode.inputs.decode_push_reply`); one that does not decode, or that asks
for blocks beyond the file, is a peer's error: counted by its reason (``reply_malformed``, ``reply_invalid``,
``reply_oversized``), that request fails, the pass carries on.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ..errors import SyncReplyRejected
from ..inputs import MAX_SYNC_REPLY_BYTES, PushResult, check_push_results, decode_push_reply
from ..synccore import Manifest, changed_blocks, effective_r, plan_targets
from ._blocks import CONNECT_TIMEOUT_S, BlockSender, read_capped
from ._bucket import TokenBucket
from ._refuse import REJECT_REASONS, RefusalLog
from ._wire import PUSH_PATH, PushItem, encode_push, sign_headers

if TYPE_CHECKING:
    from ..config import SyncConfig
    from ..node import NodeContext
    from ._replication import Replication
    from ._source import LocalFile, LocalFiles

__all__ = ["MAX_ROUNDS_PER_FILE", "TRANSFERS_PER_TARGET", "Pusher", "TokenBucket"]

log = logging.getLogger(__name__)

MAX_ROUNDS_PER_FILE = 4
"""Rounds of block sending per file and pass (a round resends the blocks the target refused)."""
TRANSFERS_PER_TARGET = 2
"""Files whose blocks travel to one target at the same time."""


class Pusher:
    """This node's outgoing sync (see module docstring). ``nursery``: where transfers and receipt fetches run in
    the background (set by the driver; None: each waits, as in tests). ``count(reason)`` counts a target's reply
    refused (:class:`~p2pnode.errors.SyncReplyRejected`). Counters feed ``/sync/status``."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, source: LocalFiles, replication: Replication,
                 count: Callable[[str], None]) -> None:
        self.ctx, self.cfg, self.source, self.replication, self.count = ctx, cfg, source, replication, count
        self.bucket = TokenBucket(cfg.max_bytes_per_s, cfg.request_bytes)  # bursts of one request
        self.nursery: trio.Nursery | None = None
        self.refusing: dict[str, float] = {}  # target -> trio time until which it is skipped (backpressure)
        self.file_view: dict[str, dict[str, Any]] = {}
        self.progress: dict[str, list[int]] = {}  # path -> [bytes sent, bytes to send] of the transfer under way
        self._acked: dict[tuple[str, str], Manifest] = {}  # (target, path) -> manifest it last committed
        self._busy: set[tuple[str, str]] = set()  # (target, path) block transfers under way
        self._pushing: set[str] = set()  # targets with a manifest request under way
        self._target_slots: dict[str, trio.Semaphore] = {}
        self.blocks = BlockSender(self)
        self.passes = self.requests = self.request_failures = 0
        self.bytes_sent = self.blocks_sent = self.blocks_resent = 0
        self.push_rejected: Counter[str] = Counter()
        self._log_bad_reply = RefusalLog("sync: refused a target's reply")

    def _background(self, n: trio.Nursery) -> trio.Nursery:
        return self.nursery or n

    def _dialable(self, counting: set[str]) -> set[str]:
        """The counting durable members this node may dial (:attr:`p2pnode.node.Member.addr`: one whose advertised
        address the dial policy refuses is never a push target, so it cannot crowd out the real ones)."""
        out = set()
        for t in counting:
            m = self.ctx.member(t)
            if m is not None and m.addr:
                out.add(t)
        return out

    async def pass_once(self) -> None:
        """One pass (see module docstring)."""
        self.passes += 1
        t0 = time.perf_counter()
        files = await trio.to_thread.run_sync(self.source.scan, time.time())
        log.debug("sync: pass %d scanned %d files in %.3f s", self.passes, len(files), time.perf_counter() - t0)
        rep = self.replication
        _, counting = rep.durable()
        for holder, addr, digest in rep.fetches_due(counting):  # in the background: used from the next pass on
            if self.nursery is not None:
                self.nursery.start_soon(rep.fetch_receipts, holder, addr, digest)
            else:
                await rep.fetch_receipts(holder, addr, digest)
        index, known, counting = rep.receipt_index()
        now = trio.current_time()
        self.refusing = {n: t for n, t in self.refusing.items() if t > now}
        refusing = frozenset(self.refusing)
        dialable = self._dialable(counting)
        r = self.cfg.replication_factor
        r_eff = effective_r(r, known)
        by_target: dict[str, list[LocalFile]] = {}
        view: dict[str, dict[str, Any]] = {}
        key_base = self.ctx.node_id + "/"
        for f in files.values():
            mf = f.manifest
            failed = rep.book.failed_holders(f.path, mf.size, mf.root)  # failed a challenge: not counted, not a target
            confirmed = index.confirmed_by(f.path, mf.size, mf.root) - failed
            targets = plan_targets(key_base + f.path, confirmed=confirmed, candidates=dialable, r=r,
                                   durable_members=known, refusing=refusing | failed) if known else []
            for t in targets:
                by_target.setdefault(t, []).append(f)
            view[f.path] = {"path": f.path, "class": f.cls, "size": f.manifest.size, "seq": f.seq,
                            "root": f.manifest.root.hex(), "confirmed": sorted(confirmed), "r": r_eff,
                            "targets": targets, "seen_at": f.seen_at}
            rep.track_level(f, len(confirmed), r_eff, known)
        rep.forget_gone(files)
        for key in [k for k in self._acked if k[1] not in files]:
            del self._acked[key]
        self.file_view = view
        self.progress = {k: v for k, v in self.progress.items() if any(k == p for _, p in self._busy)}
        # Under the agent each target's push runs in the background and the pass returns: an unreachable or slow
        # target never holds up the next scan (new files are hashed, lag is measured, others are served).
        async with trio.open_nursery() as n:
            for target, tfiles in by_target.items():
                m = self.ctx.member(target)
                if m is None or not m.addr or target in self._pushing:
                    continue
                self._pushing.add(target)
                self._background(n).start_soon(self._push_target, target, m.addr, tfiles)

    async def _push_target(self, target: str, addr: str, files: list[LocalFile]) -> None:
        try:
            await self._offer(target, addr, files)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self.request_failures += 1
            log.info("sync: push to %s (%s) failed: %s", target, addr, exc)
        finally:
            self._pushing.discard(target)

    async def _offer(self, target: str, addr: str, files: list[LocalFile]) -> None:
        """Offer ``files`` to ``target``: their manifests (with small deltas) in requests of ``request_bytes``,
        then the blocks still needed, file by file, in the background."""
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
                    got = await trio.to_thread.run_sync(self.blocks.read_blocks, f, delta)
                    if got is None:
                        self.source.mark_stale(f.path)
                        continue
                    blocks, used = got, used + size
            used += len(f.manifest.hashes) + 256
            items.append((f, self.item(f, blocks)))
            self.progress[f.path] = [0, f.manifest.size]
        need: dict[str, list[int]] = {}
        byname = {f.path: f for f, _ in items}
        for chunk in _chunks(items, budget):
            results = await self.send(target, addr, [it for _, it in chunk])
            if results is None:
                return
            for res in results:
                self.note_result(target, byname, res, need)
        for path, indices in need.items():
            self._busy.add((target, path))
            if self.nursery is not None:
                self.nursery.start_soon(self._transfer, target, addr, byname[path], indices)
            else:
                await self._transfer(target, addr, byname[path], indices)

    async def _transfer(self, target: str, addr: str, f: LocalFile, indices: list[int] | None) -> None:
        """Send the blocks of ``f`` the target still needs (up to :data:`MAX_ROUNDS_PER_FILE` rounds, for blocks
        it refused). At most :data:`TRANSFERS_PER_TARGET` files travel to one target at a time, oldest first: a
        node with hundreds of pending files does not open hundreds of streams (or HTTP requests) at once."""
        try:
            async with self._target_slots.setdefault(target, trio.Semaphore(TRANSFERS_PER_TARGET)):
                for _round in range(MAX_ROUNDS_PER_FILE):
                    if not indices:
                        break
                    self.progress[f.path] = [0, sum(f.manifest.block_len(i) for i in indices)]
                    indices = await self.blocks.send_blocks(target, addr, f, indices)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self.request_failures += 1
            log.info("sync: transfer of %s to %s failed: %s", f.path, target, exc)
        finally:
            self._busy.discard((target, f.path))

    def back_off(self, target: str, reason: str | int) -> None:
        """Skip ``target`` for ``backpressure_backoff_s`` when it refused for lack of disk (``reason``
        ``backpressure`` or ``no_space``, or HTTP 507)."""
        if reason in ("backpressure", "no_space", 507):
            self.refusing[target] = trio.current_time() + self.cfg.backpressure_backoff_s

    def note_refusal(self, target: str, reason: str) -> None:
        """Count a refusal by ``target`` (a file's, a block's or a whole request's) and back off on a full disk.
        A reason this node does not know (a newer peer's) is counted as ``other``: the labels stay a closed set."""
        self.push_rejected[reason if reason in REJECT_REASONS else "other"] += 1
        self.back_off(target, reason)

    def bad_reply(self, target: str, exc: SyncReplyRejected) -> None:
        """Count ``target``'s reply that this node refused (a peer's error: the request failed, the pass goes on)."""
        self.request_failures += 1
        self.count(exc.reason)
        self._log_bad_reply(SyncReplyRejected(exc.reason, f"from {target}: {exc.detail}"), time.monotonic())

    def note_result(self, target: str, byname: dict[str, LocalFile], res: PushResult,
                    need: dict[str, list[int]]) -> None:
        """Account one per-file result of a reply (see :meth:`ReplicaStore.apply`; checked against what was
        offered by :func:`~p2pnode.inputs.check_push_results`): a commit is remembered as the delta base for
        ``target``, blocks still needed go into ``need[path]``, refusals are counted."""
        f = byname.get(res.path)
        if f is None:
            return
        if res.status in ("have", "committed"):
            self._acked[(target, f.path)] = f.manifest
            need.pop(f.path, None)
            p = self.progress.get(f.path)
            if p:
                p[0] = p[1]
        elif res.status == "need":
            need[f.path] = list(res.need)
            if res.rejected_blocks:
                n = res.rejected_count if res.rejected_count is not None else len(res.rejected_blocks)
                self.blocks_resent += min(n, f.manifest.blocks)
                for b in res.rejected_blocks:
                    self.note_refusal(target, b.reason)
        elif res.status == "rejected":
            self.note_refusal(target, res.reason)
            log.info("sync: %s refused %s: %s %s", target, f.path, res.reason, res.detail)

    def item(self, f: LocalFile, blocks: list[tuple[int, bytes]]) -> PushItem:
        """The push item of ``f``'s current version carrying ``blocks``."""
        return PushItem(f.path, f.manifest, f.seq, list(blocks), True, f.cls)

    async def send(self, target: str, addr: str, items: list[PushItem]) -> list[PushResult] | None:
        """``POST /sync/push`` of ``items``: the per-file results, or None when the reply is not one (a bad reply,
        counted: it does not decode, names a file not offered or a block beyond one) or the whole request was
        refused (counted). Raises ``httpx.HTTPError`` / ``OSError``."""
        try:
            status, body = await self._post(addr, encode_push(items))
            self.back_off(target, status)
            results = decode_push_reply(body)  # typed and bounded (p2pnode.inputs)
            check_push_results(results, {it.path: it.manifest.blocks for it in items})
        except SyncReplyRejected as exc:
            self.bad_reply(target, exc)
            return None
        if status != 200 and len(results) == 1 and results[0].path == "":
            self.note_refusal(target, results[0].reason)
            log.info("sync: %s refused the request (%d): %s", target, status, results[0].detail)
            return None
        return results

    async def _post(self, addr: str, body: bytes) -> tuple[int, bytes]:
        """Post a push body: the reply's status and body (at most :data:`~p2pnode.inputs.MAX_SYNC_REPLY_BYTES`
        read, ``reply_oversized`` beyond)."""
        client = self.ctx.client
        assert client is not None
        wait = self.bucket.take(len(body), trio.current_time())
        if wait > 0:
            await trio.sleep(wait)
        headers = sign_headers(self.ctx.identity, "POST", PUSH_PATH, body)
        headers["content-type"] = "application/msgpack"
        self.requests += 1
        self.bytes_sent += len(body)
        timeout = httpx.Timeout(self.cfg.request_timeout_s, connect=min(CONNECT_TIMEOUT_S, self.cfg.request_timeout_s))
        async with client.stream("POST", f"http://{addr}{PUSH_PATH}", content=body, headers=headers,
                                 timeout=timeout) as resp:
            return resp.status_code, await read_capped(resp, MAX_SYNC_REPLY_BYTES, "push reply")


def _chunks(items: list[tuple[LocalFile, PushItem]], budget: int) -> list[list[tuple[LocalFile, PushItem]]]:
    """``items`` in consecutive groups of about ``budget`` bytes (manifest hashes, blocks and 256 per item)."""
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
