"""The receiving side of sync: replicas of other nodes' files, and the transfers that build them (blocking I/O).

Layout under the data dir::

    replicas/<origin>/<path>                   complete replicas (never deleted because the origin deleted)
    .sync/incoming/<origin>/<key>.part         the file being assembled for one (origin, path)
    .sync/incoming/<origin>/<key>.json         its manifest and path (resume state)
    .sync/replicas.json                        index: (origin, path) -> size, root, block size, seq, committed at

A transfer is keyed by ``(origin, path)`` and fixed to one manifest root. On a new root the receiver carries over
every block it already has at the same index with the same hash, from the old partial file or from the current
replica (``copy_file_range``), and asks for the rest. Each block is verified against the manifest before it is
written; the verified set is not persisted but recomputed by hashing the partial file after a restart, so a
``kill -9`` at any point resumes from the blocks that are really on disk. Completion re-hashes the whole
partial file against the root, fsyncs it, renames it over the replica and fsyncs the directory: a replica is
always a complete, verified version, never a partial one.

:class:`ReplicaStore` is not thread-safe per origin: the caller serialises calls for one origin (the HTTP route
holds a per-origin lock and runs them in a worker thread).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from .._files import atomic_write_bytes
from ._manifest import MAX_BLOCK_BYTES, Manifest, PathError, check_rel_path, hash_block, hash_file

__all__ = ["PushItem", "ReplicaStore", "SyncReject", "REJECT_REASONS"]

log = logging.getLogger(__name__)

REJECT_REASONS = (
    "malformed",
    "oversized",
    "bad_signature",
    "not_member",
    "path_escape",
    "bad_manifest",
    "block_out_of_range",
    "bad_block_length",
    "bad_block_hash",
    "stale_version",
    "backpressure",
    "no_space",
    "corrupt_on_commit",
)
"""Counted reasons for refusing sync input (``p2pnode_sync_rejected_total{reason}``)."""
RECEIPTS_BUDGET_BYTES = 24 * 1024
"""Encoded bytes of receipts a snapshot carries at most (the snapshot itself is bounded at 64 KiB)."""


class SyncReject(Exception):
    """Refused sync input: ``reason`` (one of :data:`REJECT_REASONS`) and an HTTP status."""

    STATUS = {"oversized": 413, "bad_signature": 401, "not_member": 403, "stale_version": 409,
              "backpressure": 507, "no_space": 507}

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail

    @property
    def status(self) -> int:
        return self.STATUS.get(self.reason, 400 if self.reason in ("malformed", "path_escape") else 422)


@dataclass(slots=True)
class PushItem:
    """One file in a push request: its manifest and sequence number, blocks ``[(index, bytes)]``, and whether to
    commit once every block is present."""

    path: str
    manifest: Manifest
    seq: int
    blocks: list[tuple[int, bytes | memoryview]] = field(default_factory=list)
    commit: bool = True
    cls: str = "sealed"
    prehashed: set[int] = field(default_factory=set)
    """Indices of ``blocks`` already checked against ``manifest`` (by :meth:`ReplicaStore.prehash`, outside the
    per-origin lock, so hashing one request overlaps with writing the previous one)."""


@dataclass(slots=True)
class _Transfer:
    origin: str
    path: str
    manifest: Manifest
    seq: int
    part: Path
    state: Path
    verified: set[int]


def _key(path: str) -> str:
    return blake3.blake3(path.encode("utf-8", "surrogateescape")).hexdigest(length=16)


class ReplicaStore:
    """Replicas held for other nodes under ``data_dir`` (see module docstring).

    Counters: ``bytes_received`` (verified block bytes written), ``blocks_carried`` (blocks reused from an old
    partial file or replica), ``commits``, ``rejected[reason]``.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.replicas = self.data_dir / "replicas"
        self.incoming = self.data_dir / ".sync" / "incoming"
        self.index_file = self.data_dir / ".sync" / "replicas.json"
        self.replicas.mkdir(parents=True, exist_ok=True)
        self.incoming.mkdir(parents=True, exist_ok=True)
        self.index: dict[tuple[str, str], dict[str, Any]] = {}
        self._manifests: dict[tuple[str, str], Manifest] = {}
        self._transfers: dict[tuple[str, str], _Transfer] = {}
        self.bytes_received = 0
        self.blocks_carried = 0
        self.commits = 0
        self.rejected: Counter[str] = Counter()
        self._load_index()

    # -- index ---------------------------------------------------------------------------------------
    def _load_index(self) -> None:
        try:
            raw = json.loads(self.index_file.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("sync: unreadable replica index %s (%s): replicas are re-offered by their origins", self.index_file, exc)
            return
        for rec in raw.get("replicas", []):
            try:
                origin, path = rec["origin"], check_rel_path(rec["path"])
                p = self._replica_path(origin, path)
                st = p.lstat()
            except (KeyError, TypeError, PathError, OSError):
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size == rec["size"] and st.st_mtime_ns == rec["mtime_ns"]:
                self.index[(origin, path)] = rec

    def _save_index(self) -> None:
        recs = sorted(self.index.values(), key=lambda r: (r["origin"], r["path"]))
        atomic_write_bytes(self.index_file, json.dumps({"replicas": recs}).encode())

    def receipts(self, limit: int, *, budget_bytes: int = RECEIPTS_BUDGET_BYTES) -> dict[str, list[list[Any]]]:
        """Receipts for the snapshot: ``{origin: [[path, size, root(bytes)], ...]}``, the most recently committed
        replicas, at most ``limit`` of them and about ``budget_bytes`` encoded (paths may be long; the snapshot
        has a hard bound)."""
        recs = sorted(self.index.values(), key=lambda r: r["committed_at"], reverse=True)[:limit]
        out: dict[str, list[list[Any]]] = {}
        used = 0
        for r in recs:
            used += len(r["path"].encode("utf-8", "surrogateescape")) + 48
            if used > budget_bytes:
                break
            out.setdefault(r["origin"], []).append([r["path"], r["size"], bytes.fromhex(r["root"])])
        return out

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
            part.unlink(missing_ok=True)
            state.unlink(missing_ok=True)
            n += 1
            log.info("sync: dropped a partial transfer from %s untouched for %.0f s", origin, age)
        return n

    def held_bytes(self) -> int:
        return sum(r["size"] for r in self.index.values())

    def partial_bytes(self) -> int:
        return sum(len(t.verified) * t.manifest.block_size for t in self._transfers.values())

    # -- paths ---------------------------------------------------------------------------------------
    def _replica_path(self, origin: str, path: str) -> Path:
        return self.replicas / origin / path

    def _safe_dest(self, origin: str, path: str) -> Path:
        """The replica's path, its parent directories created; raises ``SyncReject(path_escape)`` when a component
        on the way is a symlink or not a directory, or the destination is not a regular file."""
        base = self.replicas / origin
        base.mkdir(parents=True, exist_ok=True)
        cur = base
        parts = path.split("/")
        for part in parts[:-1]:
            cur = cur / part
            try:
                st = cur.lstat()
            except FileNotFoundError:
                cur.mkdir()
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise SyncReject("path_escape", f"{path!r}: {part!r} is a symlink or not a directory")
        dest = cur / parts[-1]
        try:
            st = dest.lstat()
        except FileNotFoundError:
            return dest
        if not stat.S_ISREG(st.st_mode):
            raise SyncReject("path_escape", f"{path!r}: the replica exists and is not a regular file")
        return dest

    # -- transfers -----------------------------------------------------------------------------------
    def _replica_manifest(self, origin: str, path: str, block_size: int) -> Manifest | None:
        """The current replica's manifest at ``block_size`` (cached). A replica file the index does not know (a
        kill between the rename and the index write) is hashed too: its blocks are still checked one by one
        against the offered manifest before they count."""
        rec = self.index.get((origin, path))
        p = self._replica_path(origin, path)
        try:
            st = p.lstat()
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        size = rec["size"] if rec is not None else st.st_size
        m = self._manifests.get((origin, path))
        if m is not None and m.block_size == block_size and m.size == size and rec is not None:
            return m
        try:
            m = hash_file(p, block_size=block_size, size=size)
        except (OSError, ValueError):
            return None
        self._manifests[(origin, path)] = m
        return m

    def _open_transfer(self, origin: str, item: PushItem) -> _Transfer:
        key = (origin, item.path)
        t = self._transfers.get(key)
        if t is not None and t.manifest.root == item.manifest.root:
            return t
        d = self.incoming / origin
        d.mkdir(parents=True, exist_ok=True)
        k = _key(item.path)
        part, state = d / f"{k}.part", d / f"{k}.json"
        old = t.manifest if t is not None else self._load_state(state)
        m = item.manifest
        self._check_space(m.size - (os.path.getsize(part) if part.exists() else 0))
        atomic_write_bytes(state, json.dumps({"path": item.path, "seq": item.seq, "size": m.size,
                                              "block_size": m.block_size, "hashes": m.hashes.hex()}).encode())
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            verified: set[int] = set()
            if old is not None and old.block_size == m.block_size:
                # blocks of the old partial file at the same index with the same hash: check they are on disk
                same = [i for i in range(min(old.blocks, m.blocks))
                        if old.block_hash(i) == m.block_hash(i) and old.block_len(i) == m.block_len(i)]
                verified = self._verify_on_disk(fd, m, same)
            os.ftruncate(fd, m.size)
            replica = self._replica_manifest(origin, item.path, m.block_size)
            if replica is not None:
                carry = [i for i in range(m.blocks) if i not in verified and i < replica.blocks
                         and replica.block_hash(i) == m.block_hash(i) and replica.block_len(i) == m.block_len(i)]
                if carry:
                    verified |= self._copy_blocks(self._replica_path(origin, item.path), fd, m, carry)
            self.blocks_carried += len(verified)
        finally:
            os.close(fd)
        t = _Transfer(origin, item.path, m, item.seq, part, state, verified)
        self._transfers[key] = t
        return t

    def _load_state(self, state: Path) -> Manifest | None:
        try:
            d = json.loads(state.read_text())
            return Manifest.build(int(d["size"]), int(d["block_size"]), bytes.fromhex(d["hashes"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _verify_on_disk(self, fd: int, m: Manifest, indices: list[int]) -> set[int]:
        """The blocks of ``indices`` whose bytes in ``fd`` match the manifest (a partial file after a restart)."""
        size = os.fstat(fd).st_size
        ok = set()
        for i in indices:
            n = m.block_len(i)
            if i * m.block_size + n > size:
                continue
            if hash_block(os.pread(fd, n, i * m.block_size)) == m.block_hash(i):
                ok.add(i)
        return ok

    def _copy_blocks(self, src: Path, fd: int, m: Manifest, indices: list[int]) -> set[int]:
        """Copy runs of blocks from the replica into the partial file (kernel copy); return those copied."""
        done: set[int] = set()
        try:
            sfd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return done
        try:
            runs: list[list[int]] = []
            for i in indices:
                if runs and runs[-1][-1] == i - 1:
                    runs[-1].append(i)
                else:
                    runs.append([i])
            for run in runs:
                off = run[0] * m.block_size
                length = sum(m.block_len(i) for i in run)
                copied = 0
                while copied < length:
                    n = os.copy_file_range(sfd, fd, length - copied, off + copied, off + copied)
                    if n <= 0:
                        break
                    copied += n
                if copied == length:
                    done.update(run)
        except OSError as exc:
            log.warning("sync: copying blocks from %s failed: %s", src, exc)
        finally:
            os.close(sfd)
        return done

    def _check_space(self, need: int) -> None:
        st = os.statvfs(self.incoming)
        if need > 0 and st.f_bavail * st.f_frsize < need + 64 * 2**20:
            raise SyncReject("no_space", f"{need} bytes needed, {st.f_bavail * st.f_frsize} free")

    # -- the request -----------------------------------------------------------------------------------
    def apply(self, origin: str, item: PushItem) -> dict[str, Any]:
        """Apply one push item from ``origin`` (already authenticated). Returns ``{path, status, need, ...}`` with
        ``status`` one of ``have`` (the replica already is this version), ``committed``, ``need`` (blocks still
        missing, listed in ``need``) or ``rejected`` (with ``reason`` and ``detail``; counted). A rejected block
        is not written; the item's valid blocks are."""
        try:
            return self._apply(origin, item)
        except SyncReject as exc:
            self.rejected[exc.reason] += 1
            log.info("sync: rejected %s from %s: %s", item.path, origin, exc)
            return {"path": item.path, "status": "rejected", "reason": exc.reason, "detail": exc.detail,
                    "http_status": exc.status}

    def _apply(self, origin: str, item: PushItem) -> dict[str, Any]:
        try:
            check_rel_path(item.path)
        except PathError as exc:
            raise SyncReject("path_escape", str(exc)) from None
        m = item.manifest
        if not m.is_consistent():
            raise SyncReject("bad_manifest", "block count, size and root do not agree")
        key = (origin, item.path)
        rec = self.index.get(key)
        if rec is not None and rec["root"] == m.root.hex():
            return {"path": item.path, "status": "have", "need": []}
        if rec is not None and rec["seq"] > item.seq:
            raise SyncReject("stale_version", f"holding seq {rec['seq']} > offered {item.seq}")
        self._safe_dest(origin, item.path)  # reject escapes before any byte is written
        t = self._open_transfer(origin, item)
        bad: list[SyncReject] = []
        good: list[tuple[int, bytes | memoryview]] = []
        for index, data in item.blocks:
            try:
                self._check_block(t, index, data, prehashed=index in item.prehashed and t.manifest.root == m.root)
                good.append((index, data))
            except SyncReject as exc:
                self.rejected[exc.reason] += 1
                bad.append(exc)
        if good:
            self._write_blocks(t, good)
        need = [i for i in range(m.blocks) if i not in t.verified]
        out: dict[str, Any] = {"path": item.path, "status": "need", "need": need}
        if not need and item.commit:
            self._commit(t)
            out = {"path": item.path, "status": "committed", "need": []}
        if bad:
            out["rejected_blocks"] = [{"reason": b.reason, "detail": b.detail} for b in bad]
            out["http_status"] = bad[0].status
        return out

    @staticmethod
    def prehash(items: list[PushItem]) -> None:
        """Check every block against its item's manifest and note the good ones in ``prehashed`` (blocking,
        thread-safe: touches only the items)."""
        for it in items:
            m = it.manifest
            for index, data in it.blocks:
                if 0 <= index < m.blocks and len(data) == m.block_len(index) and hash_block(data) == m.block_hash(index):
                    it.prehashed.add(index)

    def _check_block(self, t: _Transfer, index: int, data: bytes | memoryview, prehashed: bool = False) -> None:
        """Raise :class:`SyncReject` unless ``data`` is block ``index`` of the transfer's manifest."""
        m = t.manifest
        if not (isinstance(index, int) and 0 <= index < m.blocks):
            raise SyncReject("block_out_of_range", f"block {index!r} of {m.blocks}")
        if len(data) != m.block_len(index) or len(data) > MAX_BLOCK_BYTES:
            raise SyncReject("bad_block_length", f"block {index}: {len(data)} bytes, expected {m.block_len(index)}")
        if not prehashed and hash_block(data) != m.block_hash(index):
            raise SyncReject("bad_block_hash", f"block {index} of {t.path!r} does not match its hash")

    def _write_blocks(self, t: _Transfer, blocks: list[tuple[int, bytes | memoryview]]) -> None:
        """Write verified blocks into the partial file: one ``pwritev`` per run of consecutive blocks (one
        system call, so one GIL hand-off, per request rather than per block)."""
        bs = t.manifest.block_size
        blocks = sorted(blocks, key=lambda b: b[0])
        fd = os.open(t.part, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            run: list[tuple[int, bytes | memoryview]] = []
            for b in blocks + [(-2, b"")]:
                if run and b[0] != run[-1][0] + 1:
                    off = run[0][0] * bs
                    bufs = [memoryview(d) for _, d in run]
                    total = sum(len(v) for v in bufs)
                    done = os.pwritev(fd, bufs, off)
                    while done < total:  # short write: finish the rest block by block
                        flat = memoryview(b"".join(bufs))[done:]
                        done += os.pwrite(fd, flat, off + done)
                    for index, data in run:
                        t.verified.add(index)
                        self.bytes_received += len(data)
                    run = []
                run.append(b)
        finally:
            os.close(fd)

    def _commit(self, t: _Transfer) -> None:
        m = t.manifest
        try:
            got = hash_file(t.part, block_size=m.block_size, size=m.size)
        except (OSError, ValueError) as exc:
            got = None
            log.warning("sync: re-hashing %s failed: %s", t.part, exc)
        if got is None or got.root != m.root or os.path.getsize(t.part) != m.size:
            if got is not None:
                t.verified = {i for i in range(m.blocks) if got.block_hash(i) == m.block_hash(i)}
            else:
                t.verified = set()
            raise SyncReject("corrupt_on_commit", f"{t.path!r}: the assembled file does not match its root")
        dest = self._safe_dest(t.origin, t.path)
        fd = os.open(t.part, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(t.part, dest)
        dfd = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        st = dest.lstat()
        self.index[(t.origin, t.path)] = {
            "origin": t.origin, "path": t.path, "size": m.size, "root": m.root.hex(), "block_size": m.block_size,
            "seq": t.seq, "mtime_ns": st.st_mtime_ns, "committed_at": time.time(),
        }
        self._manifests[(t.origin, t.path)] = m
        self._transfers.pop((t.origin, t.path), None)
        self._save_index()
        t.state.unlink(missing_ok=True)
        self.commits += 1
        log.info("sync: replica of %s:%s committed (%d bytes)", t.origin, t.path, m.size)

    def view(self) -> dict[str, Any]:
        return {
            "replicas": len(self.index),
            "replica_bytes": self.held_bytes(),
            "transfers": [
                {"origin": t.origin, "path": t.path, "size": t.manifest.size, "blocks": t.manifest.blocks,
                 "verified_blocks": len(t.verified)}
                for t in self._transfers.values()
            ],
            "bytes_received": self.bytes_received,
            "blocks_carried": self.blocks_carried,
            "commits": self.commits,
            "rejected": dict(sorted(self.rejected.items())),
        }

