"""The sender: each pass picks the durable targets of this node's files and offers each target their manifests.

Every ``sync.interval_s`` (or at once on ``POST /sync/trigger``) a pass:

1. re-examines this node's files (:class:`LocalFiles`: manifests, SQLite backups);
2. counts, per file, the receipts of distinct durable members matching the current ``(size, root)``
   (:class:`~._replication.Replication`) and picks the missing targets by rendezvous hashing (:func:`plan_targets`);
3. per target, sends one request with every pending file's manifest, carrying the blocks that changed since the
   version that target last committed (small appends: one request per interval); the reply lists the blocks
   still needed, which :class:`~._blocks.BlockSender` then moves in the background, at most
   :data:`TRANSFERS_PER_TARGET` files per target at a time: a pass never waits for a large file.

A target that answers 507 (disk at its critical level, or no space) is skipped for ``backpressure_backoff_s``
and the next member in the file's ranking takes its place. An HTTP reply never counts as a replica.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ._blocks import CONNECT_TIMEOUT_S, BlockSender
from ._ledger import effective_r, plan_targets
from ._manifest import Manifest, changed_blocks
from ._wire import PUSH_PATH, PushItem, decode_reply, encode_push, sign_headers

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


class TokenBucket:
    """Pacing for ``rate`` bytes per second with bursts of ``burst`` bytes (``rate`` 0: unlimited). Pure: the
    caller passes monotonic time and sleeps for :meth:`take`'s answer."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.at: float | None = None

    def take(self, n: int, now: float) -> float:
        """Take ``n`` bytes at ``now`` (monotonic s); return the seconds to wait before sending them."""
        if self.rate <= 0:
            return 0.0
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class Pusher:
    """This node's outgoing sync (see module docstring). ``nursery``: where transfers and receipt fetches run in
    the background (set by the driver; None: each waits, as in tests). Counters feed ``/sync/status``."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, source: LocalFiles, replication: Replication) -> None:
        self.ctx, self.cfg, self.source, self.replication = ctx, cfg, source, replication
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

    def _background(self, n: trio.Nursery) -> trio.Nursery:
        return self.nursery or n

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
        r = self.cfg.replication_factor
        r_eff = effective_r(r, known)
        by_target: dict[str, list[LocalFile]] = {}
        view: dict[str, dict[str, Any]] = {}
        key_base = self.ctx.node_id + "/"
        for f in files.values():
            confirmed = index.confirmed_by(f.path, f.manifest.size, f.manifest.root)
            targets = plan_targets(key_base + f.path, confirmed=confirmed, candidates=counting, r=r,
                                   durable_members=known, refusing=refusing) if known else []
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

    def back_off(self, target: str, reason: object) -> None:
        """Skip ``target`` for ``backpressure_backoff_s`` when it refused for lack of disk (``reason``
        ``backpressure`` or ``no_space``, or HTTP 507)."""
        if reason in ("backpressure", "no_space", 507):
            self.refusing[target] = trio.current_time() + self.cfg.backpressure_backoff_s

    def note_result(self, target: str, byname: dict[str, LocalFile], res: dict[str, Any],
                    need: dict[str, list[int]]) -> None:
        """Account one per-file result of a reply (see :meth:`ReplicaStore.apply`): a commit is remembered as the
        delta base for ``target``, blocks still needed go into ``need[path]``, refusals are counted."""
        f = byname.get(res["path"])
        if f is None:
            return
        st = res.get("status")
        if st in ("have", "committed"):
            self._acked[(target, f.path)] = f.manifest
            need.pop(f.path, None)
            p = self.progress.get(f.path)
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
            self.back_off(target, reason)
            log.info("sync: %s refused %s: %s %s", target, f.path, reason, res.get("detail", ""))

    def item(self, f: LocalFile, blocks: list[tuple[int, bytes]]) -> PushItem:
        """The push item of ``f``'s current version carrying ``blocks``."""
        return PushItem(f.path, f.manifest, f.seq, list(blocks), True, f.cls)

    async def send(self, target: str, addr: str, items: list[PushItem]) -> list[dict[str, Any]] | None:
        """``POST /sync/push`` of ``items``: the per-file results, or None when the reply is not one or the whole
        request was refused (counted). Raises ``httpx.HTTPError`` / ``OSError``."""
        resp = await self._post(addr, encode_push(items))
        self.back_off(target, resp.status_code)
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

    async def _post(self, addr: str, body: bytes) -> httpx.Response:
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
        return await client.post(f"http://{addr}{PUSH_PATH}", content=body, headers=headers, timeout=timeout)


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
