"""The replica store: other nodes' pushes applied to partial files, verified, committed as replicas (blocking I/O).

Under the data dir: ``replicas/`` and ``.sync/replicas.json`` (:mod:`._index`), ``.sync/incoming/<origin>/``
(partial files and their resume state, :mod:`._partial`).

A transfer is keyed by ``(origin, path)`` and fixed to one manifest root. On a new root the receiver carries over
every block it already has at the same index with the same hash, from the old partial file or from the current
replica (shared by reflink on XFS or btrfs, so a new version writes only its change; copied elsewhere:
:func:`~._partial.copy_blocks`), and asks for the rest. A block pushed over HTTP is verified against the manifest
before it is written; a block streamed over the data channel (``_channel``) is spliced into place and hashed
from the partial file as it lands (:mod:`._splice`), and counts only if it matches. The verified set is not
persisted but recomputed by hashing the partial file after a restart, so a ``kill -9`` at any point resumes from
the blocks that are really on disk. Completion checks every block of the partial file against the manifest from
the file itself (blocks already hashed from the file after their last write are not read again); then the file
is fsynced, renamed over the replica and the directory fsynced: a replica is always a complete, verified
version, never a partial one. A new transfer must fit in the free space beside what the transfers under way will
still take (``no_space``, 507): its size less the blocks it keeps from the old partial file and, where partial
files can share a replica's blocks at its block size, the blocks it shares (:meth:`ReplicaStore._need_bytes`). A
disk that fills anyway refuses the blocks as ``no_space`` too (:func:`~._partial.no_space_refused`).

Retention: :mod:`._retention` decides which replicas retire, :mod:`._retire` deletes them crash-safely and keeps
the sightings of files gone from their origin's listing.

:class:`ReplicaStore` is not thread-safe per origin: the caller serialises calls for one origin (the HTTP route
holds a per-origin lock and runs them in a worker thread).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._files import atomic_write_bytes
from ..synccore import Held, Manifest, PathError, check_rel_path
from ._index import MAX_RECEIPT_DIGESTS, RECEIPTS_BUDGET_BYTES, ReplicaIndex
from ._partial import (
    Transfer,
    check_block,
    copy_blocks,
    load_state,
    no_space_refused,
    partial_key,
    prehash,
    read_state,
    verify_assembled,
    verify_on_disk,
    write_blocks,
)
from ._reflink import can_clone, clone_block_bytes, same_fs
from ._refuse import SyncReject
from ._retire import Retirement
from ._splice import receive_runs
from ._wire import PushItem

__all__ = ["FREE_SPACE_MARGIN_BYTES", "MAX_REJECTED_LISTED", "ReplicaStore"]

log = logging.getLogger(__name__)

FREE_SPACE_MARGIN_BYTES = 64 * 2**20
"""Free bytes a new transfer must leave beside its own size and the bytes still to come of the transfers under
way (see :meth:`ReplicaStore.reserved_bytes`)."""
MAX_REJECTED_LISTED = 64
"""Rejected blocks detailed in one reply (all are counted in ``rejected_count``)."""


class ReplicaStore:
    """Replicas held for other nodes under ``data_dir`` (see module docstring).

    Counters: ``bytes_received`` (verified block bytes written), ``blocks_carried`` (blocks reused from an old
    partial file or replica), of the replica's bytes carried ``bytes_cloned`` (shared by reflink) and
    ``bytes_copied`` (copied), ``commits``, ``rejected[reason]``. ``index``: the committed replicas
    (``{(origin, path): record}``, see :class:`ReplicaIndex`).
    """

    prehash = staticmethod(prehash)

    def __init__(self, data_dir: Path, *, free_bytes: Callable[[], int] | None = None) -> None:
        """``free_bytes()``: bytes free for an unprivileged writer where partial files go (default: ``statvfs``
        of ``.sync/incoming``; tests pass a fake)."""
        self.data_dir = Path(data_dir)
        self.held = ReplicaIndex(self.data_dir)
        self.replicas = self.held.replicas
        self.incoming = self.data_dir / ".sync" / "incoming"
        self.incoming.mkdir(parents=True, exist_ok=True)
        self._transfers: dict[tuple[str, str], Transfer] = {}
        self.bytes_received = 0
        self.blocks_carried = 0
        self.bytes_cloned = 0
        self.bytes_copied = 0
        self.commits = 0
        self.rejected: Counter[str] = Counter()
        self._free_bytes = free_bytes if free_bytes is not None else self._statvfs_free
        self._leftover: dict[Path, int] = {}  # partial file from before a restart, not reopened yet -> bytes to come
        self.clones = same_fs(self.incoming, self.held.replicas) and can_clone(self.incoming)
        """Partial files here can share a replica's blocks (reflink): a new version's free-space check counts only
        the bytes it does not share with the replica."""
        self.clone_bytes = clone_block_bytes(self.incoming) if self.clones else 0
        """The file system block (bytes) clones are aligned to; a block size not a multiple of it is copied."""
        self._scan_leftovers()
        self.retirement = Retirement(self.held, self.data_dir)
        self.retire = self.retirement.retire
        """:meth:`._retire.Retirement.retire` (the caller holds the origin's lock)."""

    # -- the index (see _index) --------------------------------------------------------------------------
    @property
    def index(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The committed replicas: ``{(origin, path): record}`` (see :class:`ReplicaIndex`)."""
        return self.held.records

    def receipts(self, limit: int, *, budget_bytes: int = RECEIPTS_BUDGET_BYTES) -> dict[str, list[list[Any]]]:
        """:meth:`ReplicaIndex.receipts`: the newest receipts (at most ``limit``, about ``budget_bytes`` encoded)
        for this node's snapshot, ``{origin: [[path, size, root], ...]}``."""
        return self.held.receipts(limit, budget_bytes=budget_bytes)

    def receipts_for(self, origin: str) -> list[list[Any]]:
        """:meth:`ReplicaIndex.receipts_for`: every receipt for ``origin``, sorted by path."""
        return self.held.receipts_for(origin)

    def receipt_digests(self, limit: int = MAX_RECEIPT_DIGESTS) -> dict[str, str]:
        """:meth:`ReplicaIndex.receipt_digests`: ``{origin: digest of its full receipt list}`` for the ``limit``
        origins with the newest commits."""
        return self.held.receipt_digests(limit)

    def held_bytes(self) -> int:
        """Bytes of all replicas held."""
        return self.held.held_bytes()

    # -- space -------------------------------------------------------------------------------------------
    def _scan_leftovers(self) -> None:
        """Reserve the bytes still to come of partial transfers found on disk (a restart): until their origin offers
        them again or they expire, they are transfers under way."""
        for state in self.incoming.glob("*/*.json"):
            d = read_state(state)  # a bad one is counted (the state-file report) and reserves nothing
            if d is None:
                continue
            try:
                part = state.with_suffix(".part")
                allocated = part.stat().st_blocks * 512 if part.exists() else 0
            except OSError:
                continue
            self._leftover[part] = max(0, d.size - allocated)

    def expire_partials(self, max_age_s: float, now: float) -> int:
        """Delete partial transfers untouched for ``max_age_s`` seconds (wall clock ``now``): their origin changed
        the file, vanished, or gave up; it still holds the data and a new offer starts over. Returns how many."""
        n = 0
        for part in self.incoming.glob("*/*.part"):
            state = part.with_suffix(".json")
            try:
                age = now - max(part.stat().st_mtime, state.stat().st_mtime if state.exists() else 0.0)
            except OSError:
                continue
            if age < max_age_s:
                continue
            origin = part.parent.name
            for key, t in list(self._transfers.items()):
                if t.part == part:
                    del self._transfers[key]
            self._leftover.pop(part, None)
            part.unlink(missing_ok=True)
            state.unlink(missing_ok=True)
            n += 1
            log.info("sync: dropped a partial transfer from %s untouched for %.0f s", origin, age)
        return n

    def partial_bytes(self) -> int:
        """Bytes of verified blocks in partial files (approximate: whole blocks)."""
        return sum(len(t.verified) * t.manifest.block_size for t in self._transfers.values())

    def reserved_bytes(self, exclude: Path | None = None) -> int:
        """Bytes still to come of the transfers under way (their manifests' sizes minus the blocks verified so far;
        partial files from before a restart: their size minus the bytes allocated on disk), the partial file
        ``exclude`` left out. A partial file is sparse until its blocks arrive, so free space alone does not
        show what its transfer will still take."""
        total = sum(t.remaining_bytes() for t in list(self._transfers.values()) if t.part != exclude)
        return total + sum(n for p, n in list(self._leftover.items()) if p != exclude)

    def _statvfs_free(self) -> int:
        st = os.statvfs(self.incoming)
        return st.f_bavail * st.f_frsize

    def _check_space(self, need: int, part: Path) -> None:
        """Raise ``SyncReject("no_space")`` (507) unless ``need`` more bytes for ``part`` fit in the free space beside
        the bytes reserved by the other transfers under way and :data:`FREE_SPACE_MARGIN_BYTES`."""
        if need <= 0:
            return
        reserved = self.reserved_bytes(exclude=part)
        free = self._free_bytes()
        if free < need + reserved + FREE_SPACE_MARGIN_BYTES:
            raise SyncReject("no_space", f"{need} bytes needed beside {reserved} bytes still to come for transfers "
                             f"under way (and a margin of {FREE_SPACE_MARGIN_BYTES}); {free} free")

    # -- retention (decided by _retention) ----------------------------------------------------------------
    def held_replicas(self) -> list[Held]:
        """Every replica held, as the retention policy's input (:class:`~._retention.Held`)."""
        return [Held(o, p, r["size"], bytes.fromhex(r["root"]), r["seq"], r["committed_at"])
                for (o, p), r in list(self.index.items())]

    # -- a push --------------------------------------------------------------------------------------------
    def apply(self, origin: str, item: PushItem) -> dict[str, Any]:
        """Apply one push item from ``origin`` (already authenticated). Returns ``{path, status, need, ...}`` with
        ``status`` one of ``have`` (the replica already is this version), ``committed``, ``need`` (blocks still
        missing, listed in ``need``) or ``rejected`` (with ``reason``, ``detail`` and ``http_status``; counted).
        A rejected block is not written; the item's valid blocks are (``rejected_blocks``, ``rejected_count``)."""
        try:
            t = self._prepare(origin, item)
            if t is None:
                return {"path": item.path, "status": "have", "need": []}
            bad: list[SyncReject] = []
            good: list[tuple[int, bytes | memoryview]] = []
            same = t.manifest.root == item.manifest.root
            for index, data in item.blocks:
                try:
                    check_block(t, index, data, prehashed=index in item.prehashed and same)
                    good.append((index, data))
                except SyncReject as exc:
                    self.rejected[exc.reason] += 1
                    bad.append(exc)
            if good:
                write_blocks(t, good, self._received)  # a full disk: SyncReject("no_space"), counted below
            return self._outcome(t, item.commit, bad)
        except SyncReject as exc:
            self.rejected[exc.reason] += 1
            log.info("sync: rejected %s from %s: %s", item.path, origin, exc)
            return {"path": item.path, "status": "rejected", "reason": exc.reason, "detail": exc.detail,
                    "http_status": exc.status}

    def _received(self, n: int) -> None:
        self.bytes_received += n

    def _prepare(self, origin: str, item: PushItem) -> Transfer | None:
        """The transfer for ``item`` (opened or resumed), or None when the replica already is this version.
        Raises :class:`SyncReject` (path, manifest, stale version, busy, space) before any byte is written."""
        try:
            check_rel_path(item.path)
        except PathError as exc:
            raise SyncReject("path_escape", str(exc)) from None
        m = item.manifest
        if not m.is_consistent():
            raise SyncReject("bad_manifest", "block count, size and root do not agree")
        rec = self.index.get((origin, item.path))
        if rec is not None and rec["root"] == m.root.hex():
            if self._replica_intact(origin, item.path, rec["size"]):
                return None
            log.warning("sync: the replica of %s:%s is gone from disk; receipt withdrawn, taking it again", origin,
                        item.path)
            self.held.remove(origin, item.path)
            rec = None
        if rec is not None and rec["seq"] > item.seq:
            raise SyncReject("stale_version", f"holding seq {rec['seq']} > offered {item.seq}")
        cur = self._transfers.get((origin, item.path))
        if cur is not None and cur.streaming:
            raise SyncReject("busy", f"a block stream of {item.path!r} is under way")
        self.held.safe_dest(origin, item.path)  # reject escapes before any byte is written
        return self._open_transfer(origin, item)

    def _replica_intact(self, origin: str, path: str, size: int) -> bool:
        """The replica file is there, a regular file of ``size`` bytes (a file deleted or cut under this node is
        not: its receipt must not stand)."""
        try:
            st = self.held.replica_path(origin, path).lstat()
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == size

    def _open_transfer(self, origin: str, item: PushItem) -> Transfer:
        key = (origin, item.path)
        t = self._transfers.get(key)
        if t is not None and t.manifest.root == item.manifest.root:
            return t
        d = self.incoming / origin
        d.mkdir(parents=True, exist_ok=True)
        k = partial_key(item.path)
        part, state = d / f"{k}.part", d / f"{k}.json"
        old = t.manifest if t is not None else load_state(state)
        m = item.manifest
        kept = self._kept_blocks(part, old, m)  # read only: nothing is written before the space check
        replica = self.held.replica_manifest(origin, item.path, m.block_size)
        carry = [] if replica is None else [
            i for i in range(min(m.blocks, replica.blocks)) if i not in kept
            and replica.block_hash(i) == m.block_hash(i) and replica.block_len(i) == m.block_len(i)]
        self._check_space(self._need_bytes(part, m, kept, carry), part)
        self._leftover.pop(part, None)
        with no_space_refused(f"the state file of {item.path!r}"):
            atomic_write_bytes(state, json.dumps({"path": item.path, "seq": item.seq, "size": m.size,
                                                  "block_size": m.block_size, "hashes": m.hashes.hex()}).encode())
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            verified = set(kept)
            os.ftruncate(fd, m.size)
            if carry:
                carried = copy_blocks(self.held.replica_path(origin, item.path), fd, m, carry)
                verified |= carried.blocks
                self.bytes_cloned += carried.cloned_bytes
                self.bytes_copied += carried.copied_bytes
            self.blocks_carried += len(verified)
        finally:
            os.close(fd)
        t = Transfer(origin, item.path, m, item.seq, part, state, verified, set(kept))
        self._transfers[key] = t
        return t

    @staticmethod
    def _kept_blocks(part: Path, old: Manifest | None, m: Manifest) -> set[int]:
        """The blocks of the old partial file ``part`` (started for ``old``) that ``m`` keeps at the same index
        with the same hash and that are on disk (hashed from the file; none when it is missing or unreadable)."""
        if old is None or old.block_size != m.block_size:
            return set()
        same = [i for i in range(min(old.blocks, m.blocks))
                if old.block_hash(i) == m.block_hash(i) and old.block_len(i) == m.block_len(i)]
        if not same:
            return set()
        try:
            fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return set()
        try:
            return verify_on_disk(fd, m, same) if stat.S_ISREG(os.fstat(fd).st_mode) else set()
        finally:
            os.close(fd)

    def _need_bytes(self, part: Path, m: Manifest, kept: set[int], carry: list[int]) -> int:
        """Bytes of disk the version ``m`` will still take in the partial file ``part``: its size less the blocks
        already there (``kept``: the old partial file's) and, where the replica's blocks will be cloned
        (:attr:`clones`, and ``m``'s block size a multiple of :attr:`clone_bytes`), the blocks shared with the
        replica (``carry``); the two sets are disjoint, so no block counts twice. Where clones are on, a write
        to a block the partial file shares with the replica copies it (copy-on-write), so the file's allocated
        bytes are not counted; elsewhere a block is overwritten in place and they are."""
        if self.clones:
            keep = list(kept)
            if m.block_size % self.clone_bytes == 0:
                keep += carry
            return m.size - sum(m.block_len(i) for i in keep)
        try:
            allocated = part.lstat().st_blocks * 512  # sparse: only the blocks written so far take space
        except FileNotFoundError:
            allocated = 0
        return m.size - max(allocated, sum(m.block_len(i) for i in kept))

    def _outcome(self, t: Transfer, commit: bool, bad: list[SyncReject]) -> dict[str, Any]:
        m = t.manifest
        need = [i for i in range(m.blocks) if i not in t.verified]
        out: dict[str, Any] = {"path": t.path, "status": "need", "need": need}
        if not need and commit:
            self._commit(t)
            out = {"path": t.path, "status": "committed", "need": []}
        if bad:
            out["rejected_blocks"] = [{"reason": b.reason, "detail": b.detail} for b in bad[:MAX_REJECTED_LISTED]]
            out["rejected_count"] = len(bad)  # the list is bounded; a reply must fit the sender's frame bound
            out["http_status"] = bad[0].status
        return out

    def _commit(self, t: Transfer) -> None:
        """Check the assembled file, fsync it, rename it over the replica, fsync the directory, record it. Raises
        ``SyncReject("corrupt_on_commit")`` (the bad blocks are needed again)."""
        m = t.manifest
        t0 = time.perf_counter()
        good, rehashed = verify_assembled(t)
        if good is None or len(good) != m.blocks:
            t.verified = good or set()
            t.read_back = set(t.verified)
            raise SyncReject("corrupt_on_commit", f"{t.path!r}: the assembled file does not match its root")
        dest = self.held.safe_dest(t.origin, t.path)
        t1 = time.perf_counter()
        fd = os.open(t.part, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        log.debug("sync: commit of %s: %d blocks re-hashed in %.3f s, fsynced in %.3f s", t.path, rehashed,
                  t1 - t0, time.perf_counter() - t1)
        os.replace(t.part, dest)
        dfd = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._transfers.pop((t.origin, t.path), None)
        self.held.record(t.origin, t.path, m, t.seq, dest.lstat().st_mtime_ns)
        t.state.unlink(missing_ok=True)
        self.commits += 1
        log.info("sync: replica of %s:%s committed (%d bytes)", t.origin, t.path, m.size)

    # -- a block stream (data channel) ---------------------------------------------------------------------
    def open_stream(self, origin: str, item: PushItem) -> Transfer | None:
        """Start receiving a block stream for ``item`` from ``origin`` (authenticated; the caller holds the
        origin's lock): the transfer, marked ``streaming`` until :meth:`finish_stream`, or None when the replica
        already is this version. Raises :class:`SyncReject` (counted) before any byte is written."""
        try:
            t = self._prepare(origin, item)
        except SyncReject as exc:
            self.rejected[exc.reason] += 1
            log.info("sync: rejected a stream of %s from %s: %s", item.path, origin, exc)
            raise
        if t is not None:
            t.streaming = True
        return t

    def receive_stream(self, t: Transfer, runs: list[tuple[int, int]], sock_fd: int, *,
                       timeout_s: float, stop: threading.Event | None = None) -> list[SyncReject]:
        """Receive the blocks of ``runs`` (``[(first block, count)]``, ascending) from the connected socket
        ``sock_fd`` (non-blocking) into ``t``'s partial file (opened by :meth:`open_stream`; blocking, without
        the origin's lock, so other files of the origin are served meanwhile). Returns the blocks refused
        (counted). See :func:`p2pnode.sync._splice.receive_runs` for how and what it raises (``ConnectionError``,
        ``TimeoutError``, ``InterruptedError``; the blocks verified until then are kept)."""
        t0 = time.perf_counter()

        def received(n: int) -> None:
            self.bytes_received += n

        bad = receive_runs(t, runs, sock_fd, timeout_s=timeout_s, stop=stop, received=received,
                           rejected=self.rejected)
        log.debug("sync: received %d runs of %s in %.3f s", len(runs), t.path, time.perf_counter() - t0)
        return bad

    def finish_stream(self, t: Transfer, commit: bool, bad: list[SyncReject]) -> dict[str, Any]:
        """End a stream (the caller holds the origin's lock again): commit when every block is verified and
        ``commit``; the result item of :meth:`apply`. Raises ``SyncReject("corrupt_on_commit")``."""
        t.streaming = False
        return self._outcome(t, commit, bad)

    def view(self) -> dict[str, Any]:
        """The ``received`` part of ``GET /sync/status``: replicas held, transfers under way, counters."""
        return {
            "replicas": len(self.index),
            "replica_bytes": self.held_bytes(),
            "transfers": [
                {"origin": t.origin, "path": t.path, "size": t.manifest.size, "blocks": t.manifest.blocks,
                 "verified_blocks": len(t.verified)}
                for t in self._transfers.values()
            ],
            "reserved_bytes": self.reserved_bytes(),
            "bytes_received": self.bytes_received,
            "blocks_carried": self.blocks_carried,
            "bytes_cloned": self.bytes_cloned,
            "bytes_copied": self.bytes_copied,
            "commits": self.commits,
            "retired": self.retirement.retired,
            "retired_bytes": self.retirement.retired_bytes,
            "rejected": dict(sorted(self.rejected.items())),
        }
