"""Replication of this node's files as its peers confirm it: receipts, the replicated predicate, under-replication.

A file counts as replicated on a durable member only through a receipt in that member's own signed snapshot
(its :class:`~p2pnode.snapshot.SyncSection`), never through an HTTP reply. A snapshot carries the newest
receipts only; when a holder's snapshot announces, by digest, a longer receipt list for this node than it
carries, the full list is fetched (``GET /sync/receipts``) and counts only if it hashes to that signed digest.
From the receipts: the :class:`ReceiptIndex` the pusher plans with, the predicate the disk manager deletes by,
the lag of each file below R and the edge-triggered ``UNDER_REPLICATED`` / ``REPLICATION_RESTORED`` events.

On a durable node, :class:`RetentionInputs` gathers what its retention pass (:mod:`._retention`) decides from:
the other durable members' receipts for the origins it holds replicas of (from their snapshots; a longer list
fetched and counted only if it hashes to the signed digest) and each origin's listing (``GET /sync/manifest``,
counted only if it hashes to the ``sync.digest`` of the origin's newest verified snapshot).

Fetched lists and listings are read up to their byte bound and decoded once, into typed values
(:func:`p2pnode.inputs.decode_receipts`, :func:`~p2pnode.inputs.decode_listing`); one refused is a peer's error,
counted by its reason (``reply_malformed``, ``reply_invalid``, ``reply_oversized``; ``receipts_mismatch`` for a
list that does not hash to its signed digest) and the pass carries on without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ..errors import DATA_ERRORS, SyncReplyRejected
from ..gossip import MemberState
from ..inputs import MAX_SYNC_REPLY_BYTES, decode_listing, decode_receipts
from ..snapshot import SyncSection
from ..synccore import (
    Held,
    PossessionBook,
    PossessionPolicy,
    ReceiptIndex,
    listing_digest,
)
from ._blocks import CONNECT_TIMEOUT_S, read_reply
from ._index import receipts_digest

if TYPE_CHECKING:
    from ..config import SyncConfig
    from ..node import NodeContext
    from ._source import LocalFile, LocalFiles

__all__ = ["LISTING_ATTEMPTS", "MAX_LISTING_BODY", "MAX_RECEIPTS_BODY", "Replication", "RetentionInputs"]

log = logging.getLogger(__name__)

MAX_RECEIPTS_BODY = MAX_SYNC_REPLY_BYTES  # 64 MiB
"""Bytes of a fetched receipt list at most (about 600,000 receipts of 60-byte paths)."""


MAX_LISTING_BODY = MAX_SYNC_REPLY_BYTES  # 64 MiB
"""Bytes of an origin's fetched ``/sync/manifest`` at most (beyond: its listing stays unknown, its replicas kept)."""
LISTING_ATTEMPTS = 3
"""Fetches of one origin's listing per retention pass: a listing fetched just after the origin's files changed
matches its next snapshot, not the one held (each miss waits :data:`LISTING_RETRY_S` for that snapshot)."""
LISTING_RETRY_S = 2.0


def _as_map(receipts: Iterable[tuple[str, int, bytes]]) -> dict[str, tuple[int, bytes]]:
    return {path: (size, root) for path, size, root in receipts}


async def _get_receipts(client: Any, addr: str, origin: str, timeout_s: float) -> list[tuple[str, int, bytes]]:
    """``GET /sync/receipts?origin=`` from ``addr``: the decoded list ``[(path, size, root), ...]``. Raises
    ``httpx.HTTPError`` (a status other than 200 included), ``OSError`` or :class:`SyncReplyRejected` (a reply
    beyond :data:`MAX_RECEIPTS_BODY` or one the typed decoder refuses)."""
    timeout = httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)
    async with client.stream("GET", f"http://{addr}/sync/receipts", params={"origin": origin},
                             timeout=timeout) as resp:
        body = await read_reply(resp, MAX_RECEIPTS_BODY, "receipt list")
    return decode_receipts(body)  # typed and bounded (p2pnode.inputs)


class Replication:
    """What the durable members confirm of this node's files (see module docstring). ``count(reason)`` counts a
    refused receipt list (``receipts_mismatch``, ``reply_*``). Counters: ``receipt_fetches``,
    ``receipt_fetch_failures`` (refused lists included)."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, root: Path, source: LocalFiles | None,
                 count: Callable[[str], None]) -> None:
        self.ctx, self.cfg, self.root, self.source, self.count = ctx, cfg, root, source, count
        self._fetched: dict[str, tuple[str, dict[str, tuple[int, bytes]]]] = {}  # holder -> (digest, receipts)
        self._fetching: set[str] = set()
        self.receipt_fetches = 0
        self.receipt_fetch_failures = 0
        self.below: set[str] = set()  # files below R now
        self._reached: set[str] = set()  # files that reached R once (events fire on falling below it after)
        self.unconfirmed_since: dict[str, float] = {}  # path -> wall-clock time since which it is below R
        self.book = PossessionBook(PossessionPolicy(reverify_interval_s=cfg.challenge_interval_s,
                                                    delete_window_s=cfg.challenge_window_s))
        """Proof of possession (:mod:`p2pnode.synccore._possession`): holders that failed a challenge do not count
        (:meth:`counted`), and a file is deletable only when R holders passed one recently."""

    def counted(self, index: ReceiptIndex, path: str, size: int, root: bytes) -> frozenset[str]:
        """Durable members whose receipts match ``(size, root)`` and that have not failed a challenge for it."""
        return self.book.counted(path, size, root, index.confirmed_by(path, size, root))

    def durable(self) -> tuple[set[str], set[str]]:
        """Durable members known (not left; dead ones included, they still hold R up) and those that count now
        (alive or suspect), this node excluded."""
        known, counting = set(), set()
        me = self.ctx.node_id
        for m in self.ctx.members():
            if m.origin == me or "durable" not in m.snapshot.tags:
                continue
            st = self.ctx.state_of(m.origin)
            if st is MemberState.LEFT or m.leaving:
                continue
            known.add(m.origin)
            if st in (None, MemberState.ALIVE, MemberState.SUSPECT):
                counting.add(m.origin)
        return known, counting

    def receipt_index(self) -> tuple[ReceiptIndex, int, set[str]]:
        """Receipts for this node's files, the number of durable members known, and those counting now."""
        known, counting = self.durable()
        me = self.ctx.node_id
        receipts: dict[str, dict[str, tuple[int, bytes]]] = {}
        for holder in counting:
            sync = self.ctx.section(holder, SyncSection)
            if sync is None:
                continue
            fetched = self._fetched.get(holder)
            digest = sync.receipt_digests.get(me)
            if fetched is not None and digest is not None and fetched[0] == digest:
                receipts[holder] = fetched[1]  # the full list, bound to this signed snapshot by its digest
            else:
                try:
                    receipts[holder] = _as_map(sync.receipts.get(me, []))
                except DATA_ERRORS as exc:  # a decoder gap: this holder is set aside, the sync pass carries on
                    self.ctx.quarantine(holder, "sync receipts", exc)
        return ReceiptIndex(receipts, counting), len(known), counting

    def stale_receipt_lists(self, counting: set[str]) -> list[tuple[str, str, str]]:
        """``(holder, addr, digest)`` for holders whose snapshot announces a receipt list for this node that the
        receipts in the snapshot do not cover (more than fit there) and that has not been fetched yet."""
        me = self.ctx.node_id
        out = []
        for holder in counting:
            m = self.ctx.member(holder)
            if m is None or not m.addr:
                continue
            sync = self.ctx.section(holder, SyncSection)
            digest = sync.receipt_digests.get(me) if sync is not None else None
            if sync is None or digest is None or (self._fetched.get(holder) or ("",))[0] == digest:
                continue
            inline = sorted(sync.receipts.get(me, []), key=lambda r: r[0])
            if receipts_digest(inline) == digest:
                self._fetched[holder] = (digest, _as_map(inline))
                continue
            out.append((holder, m.addr, digest))
        return out

    def fetches_due(self, counting: set[str]) -> list[tuple[str, str, str]]:
        """:meth:`stale_receipt_lists` not being fetched already, now marked as being fetched: run
        :meth:`fetch_receipts` for each."""
        out = [s for s in self.stale_receipt_lists(counting) if s[0] not in self._fetching]
        self._fetching.update(h for h, _, _ in out)
        return out

    async def fetch_receipts(self, holder: str, addr: str, digest: str) -> None:
        """``GET /sync/receipts?origin=<me>`` from ``holder``; the list counts only if it hashes to the digest in
        the holder's signed snapshot (so it is as good as receipts in that snapshot), else it is dropped and
        counted (``receipts_mismatch``). Failures are counted and logged, never raised."""
        client = self.ctx.client
        assert client is not None
        try:
            raw = await _get_receipts(client, addr, self.ctx.node_id, self.cfg.request_timeout_s)
        except SyncReplyRejected as exc:  # a peer's error: counted by its reason
            self.receipt_fetch_failures += 1
            self.count(exc.reason)
            log.info("sync: refused the receipts %s sent: %s", holder, exc)
            return
        except (httpx.HTTPError, OSError) as exc:
            self.receipt_fetch_failures += 1
            log.info("sync: fetching receipts from %s failed: %s", holder, exc)
            return
        finally:
            self._fetching.discard(holder)
        if receipts_digest(raw) != digest:
            self.count("receipts_mismatch")
            log.warning("sync: receipts from %s do not match the digest in its snapshot; ignored", holder)
            return
        self._fetched[holder] = (digest, _as_map(raw))
        self.receipt_fetches += 1

    def replicated_predicate(self) -> Callable[[str], bool]:
        """For the disk manager: a predicate over paths relative to the data dir, True only when the file's
        current version is ``ready`` by :meth:`p2pnode.synccore.PossessionBook.delete_readiness` (R distinct durable
        members confirm it, none failed a challenge since its last pass, R of them passed one for this version
        within ``sync.challenge_window_s``: :meth:`~._possess.Challenger.verify_before_delete` asks them first), and
        the file is still exactly what was hashed (same inode, size, mtime; for SQLite, same ``-wal`` too).
        Take it in the trio thread; calling it (it only stats files) is safe from the cleaner's worker thread."""
        source = self.source
        if source is None:
            return lambda path: False
        index, known, _ = self.receipt_index()
        if known == 0:
            return lambda path: False
        r = self.cfg.replication_factor
        now = time.monotonic()
        ok = set()
        for f in source.files.values():  # the one delete rule: PossessionBook.delete_readiness
            m = f.manifest
            if self.book.delete_readiness(now, f.path, m.size, m.root, index.confirmed_by(f.path, m.size, m.root),
                                          r=r, durable_members=known) == "ready":
                ok.add(f.path)
        versions: dict[str, tuple[str, tuple[int, ...]]] = {}
        for f in source.files.values():
            if f.path in ok:
                try:
                    rel = (self.root / f.path).relative_to(self.ctx.data_dir).as_posix()
                except ValueError:
                    continue
                versions[rel] = (f.path, f.signature)

        def replicated(path: str) -> bool:
            v = versions.get(path)
            return v is not None and source.live_signature(v[0]) == v[1]

        return replicated

    def protected_predicate(self) -> Callable[[str], bool]:
        """For the disk manager: a predicate over paths relative to the data dir, True for a file of the sync
        root (synced or about to be) whose current version is not confirmed by R durable members: no cleanup
        rule may delete it. Always False on a node that does not push (no sync source)."""
        if self.source is None:
            return lambda path: False
        try:  # resolved both (links, ".."): a root named through a link into the data dir is still in it
            root = self.root.resolve().relative_to(self.ctx.data_dir.resolve()).as_posix()
        except ValueError:
            return lambda path: False  # the sync root is outside the data dir: the cleaner never scans it
        replicated = self.replicated_predicate()
        prefix = "" if root in ("", ".") else root + "/"
        return lambda path: path.startswith(prefix) and not replicated(path)

    def track_level(self, f: LocalFile, confirmed: int, r_eff: int, known: int) -> None:
        """Lag bookkeeping and the edge-triggered ``UNDER_REPLICATED`` / ``REPLICATION_RESTORED`` events (only for
        files that reached R once: a new file is not an incident)."""
        path = f.path
        payload = {"path": path, "confirmed": confirmed, "r": r_eff}
        if known == 0 or confirmed < r_eff:
            self.unconfirmed_since.setdefault(path, f.seen_at)
            if path not in self.below:
                self.below.add(path)
                if path in self._reached:
                    self.ctx.emit_event("UNDER_REPLICATED", payload)
        else:
            self.unconfirmed_since.pop(path, None)
            if path in self.below:
                self.below.discard(path)
                if path in self._reached:
                    self.ctx.emit_event("REPLICATION_RESTORED", payload)
            self._reached.add(path)

    def forget_gone(self, present: Iterable[str]) -> None:
        """Drop the lag of files no longer synced (``present``: the paths still there)."""
        for gone in set(self.unconfirmed_since) - set(present):
            del self.unconfirmed_since[gone]


class RetentionInputs:
    """What a durable node's retention pass needs from its peers (see module docstring): :meth:`durable`,
    :meth:`confirmations` and :meth:`listings` read what is held (snapshots, lists fetched before); the driver
    calls :meth:`refresh` first to fetch what changed. ``count(reason)`` counts a fetched receipt list that does
    not match its digest (``receipts_mismatch``) and a reply refused by its decoder (``reply_*``). Counters:
    ``receipt_fetches``, ``listing_fetches``, ``fetch_failures`` (refused replies included), ``listing_mismatches``
    (a fetched listing matched no snapshot of its origin)."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, count: Callable[[str], None]) -> None:
        self.ctx, self.cfg, self.count = ctx, cfg, count
        self._lists: dict[tuple[str, str], tuple[str, dict[str, tuple[int, bytes]]]] = {}  # (holder, origin)
        self._listings: dict[str, tuple[str, dict[str, bytes]]] = {}  # origin -> (digest, {path: root})
        self.receipt_fetches = 0
        self.listing_fetches = 0
        self.fetch_failures = 0
        self.listing_mismatches = 0

    def durable(self) -> tuple[set[str], set[str]]:
        """Durable members known (not left; dead ones included; this node too, when its own entry's effective roles
        say durable: a claimed tag an operator key did not certify does not count) and the other
        durable members whose receipts count for deletion now: **alive** only (a suspect may be gone)."""
        known, alive = set(), set()
        me = self.ctx.node_id
        for m in self.ctx.members():
            if "durable" not in m.snapshot.tags:
                continue
            st = MemberState.ALIVE if m.origin == me else self.ctx.state_of(m.origin)
            if st is MemberState.LEFT or m.leaving:
                continue
            known.add(m.origin)
            if m.origin != me and st is MemberState.ALIVE:
                alive.add(m.origin)
        return known, alive

    def _receipts(self, holder: str, origin: str, sync: SyncSection) -> dict[str, tuple[int, bytes]]:
        fetched = self._lists.get((holder, origin))
        digest = sync.receipt_digests.get(origin)
        if fetched is not None and digest is not None and fetched[0] == digest:
            return fetched[1]
        return _as_map(sync.receipts.get(origin, []))  # signed by the holder, if perhaps not all it holds

    def confirmations(self, held: Iterable[Held]) -> dict[tuple[str, str], frozenset[str]]:
        """``{(origin, path): other alive durable members whose receipts match the held size and root}``."""
        _, alive = self.durable()
        sections = {h: s for h in alive if (s := self.ctx.section(h, SyncSection)) is not None}
        maps: dict[tuple[str, str], dict[str, tuple[int, bytes]]] = {}
        out: dict[tuple[str, str], frozenset[str]] = {}
        broken: set[str] = set()
        for r in held:
            who = []
            for holder, sync in sections.items():
                if holder in broken:
                    continue
                m = maps.get((holder, r.origin))
                if m is None:
                    try:
                        m = maps[(holder, r.origin)] = self._receipts(holder, r.origin, sync)
                    except DATA_ERRORS as exc:  # a decoder gap: the holder confirms nothing, retention goes on
                        broken.add(holder)
                        self.ctx.quarantine(holder, "retention", exc)
                        continue
                if m.get(r.path) == (r.size, r.root):
                    who.append(holder)
            if who:
                out[r.key] = frozenset(who)
        return out

    def listings(self, origins: Iterable[str], held: Iterable[Held] = ()) -> dict[str, dict[str, bytes] | None]:
        """``{origin: {path: root}}`` for each of ``origins`` whose listing matches the ``sync.digest`` of its newest
        verified snapshot (fetched before, or the replicas ``held`` of it when they hash to that digest: this
        node holds exactly what it lists); None when unknown (no snapshot, not pushing, not fetched yet)."""
        mine: dict[str, dict[str, bytes]] = {}
        for r in held:
            mine.setdefault(r.origin, {})[r.path] = r.root
        out: dict[str, dict[str, bytes] | None] = {}
        for origin in origins:
            sync = self.ctx.section(origin, SyncSection)
            digest = sync.digest if sync is not None else ""
            cached = self._listings.get(origin)
            if not digest:
                out[origin] = None
            elif cached is not None and cached[0] == digest:
                out[origin] = cached[1]
            elif listing_digest(mine.get(origin, {})) == digest:
                out[origin] = mine.get(origin, {})
            else:
                out[origin] = None
        return out

    async def refresh(self, held: list[Held]) -> None:
        """Fetch what the next :meth:`confirmations` and :meth:`listings` lack: receipt lists longer than a
        holder's snapshot carries (for the origins held here), and the listings of origins whose digest changed.
        Failures are counted and logged, never raised."""
        client = self.ctx.client
        if client is None:
            return
        origins = sorted({r.origin for r in held})
        _, alive = self.durable()
        for holder in sorted(alive):
            m = self.ctx.member(holder)
            sync = self.ctx.section(holder, SyncSection)
            if m is None or not m.addr or sync is None:
                continue
            for origin in origins:
                digest = sync.receipt_digests.get(origin)
                cached = self._lists.get((holder, origin))
                if digest is None or (cached is not None and cached[0] == digest):
                    continue
                inline = sorted(sync.receipts.get(origin, []), key=lambda r: r[0])
                if receipts_digest(inline) == digest:
                    self._lists[(holder, origin)] = (digest, _as_map(inline))
                    continue
                try:
                    raw = await _get_receipts(client, m.addr, origin, self.cfg.request_timeout_s)
                except (httpx.HTTPError, OSError, SyncReplyRejected) as exc:
                    self._failed(exc)
                    log.info("sync: fetching %s's receipts for %s failed: %s", holder, origin, exc)
                    continue
                if receipts_digest(raw) != digest:
                    self.count("receipts_mismatch")
                    log.warning("sync: receipts from %s do not match the digest in its snapshot; ignored", holder)
                    continue
                self._lists[(holder, origin)] = (digest, _as_map(raw))
                self.receipt_fetches += 1
        known = self.listings(origins, held)
        for origin in origins:
            if known[origin] is None:
                await self._fetch_listing(client, origin)
        for gone in set(self._listings) - set(origins):
            del self._listings[gone]
        for key in [k for k in self._lists if k[1] not in origins or k[0] not in alive]:
            del self._lists[key]

    async def _fetch_listing(self, client: Any, origin: str) -> None:
        """Fetch ``origin``'s ``/sync/manifest`` until it matches the digest of a snapshot of it held here (at
        most :data:`LISTING_ATTEMPTS` times)."""
        for _ in range(LISTING_ATTEMPTS):
            m = self.ctx.member(origin)
            sync = self.ctx.section(origin, SyncSection)
            if m is None or not m.addr or sync is None or not sync.digest:
                return
            if self.ctx.state_of(origin) in (MemberState.DEAD, MemberState.LEFT):
                return
            try:
                files = await self._get_listing(client, m.addr)
            except (httpx.HTTPError, OSError, SyncReplyRejected) as exc:
                self._failed(exc)
                log.info("sync: fetching the listing of %s failed: %s", origin, exc)
                return
            self.listing_fetches += 1
            got = listing_digest(files)
            for _ in range(2):
                sync = self.ctx.section(origin, SyncSection)
                if sync is not None and sync.digest == got:
                    self._listings[origin] = (got, files)
                    return
                await trio.sleep(LISTING_RETRY_S)
            self.listing_mismatches += 1
        log.info("sync: the listing of %s kept changing; its replicas count as listed until the next pass", origin)

    def _failed(self, exc: Exception) -> None:
        """Count a failed fetch; a reply refused by its decoder also by its reason (a peer's error)."""
        self.fetch_failures += 1
        if isinstance(exc, SyncReplyRejected):
            self.count(exc.reason)

    async def _get_listing(self, client: Any, addr: str) -> dict[str, bytes]:
        """``GET /sync/manifest`` from ``addr``: ``{path: root}``. Raises ``httpx.HTTPError`` (a status other than
        200 included), ``OSError`` or :class:`SyncReplyRejected` (beyond :data:`MAX_LISTING_BODY`, or refused by
        the typed decoder)."""
        timeout = httpx.Timeout(self.cfg.request_timeout_s, connect=CONNECT_TIMEOUT_S)
        async with client.stream("GET", f"http://{addr}/sync/manifest", timeout=timeout) as resp:
            body = await read_reply(resp, MAX_LISTING_BODY, "listing")
        return decode_listing(body)  # typed and bounded (p2pnode.inputs)
