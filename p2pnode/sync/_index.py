"""The replica index: which replicas this durable node holds for whom, persisted, and the receipts it signs for them.

Layout under the data dir::

    replicas/<origin>/<path>         complete replicas (never deleted because the origin deleted)
    .sync/replicas.json              index: (origin, path) -> size, root, block size, seq, mtime, committed at
    .sync/manifests/<origin>/<key>   the block hashes of a replica of :data:`PERSIST_MANIFEST_BYTES` or more

A record is written only after its replica was verified, fsynced and renamed into place
(:meth:`ReplicaStore.apply <p2pnode.sync.ReplicaStore.apply>`); at start a record counts only if the file still
has the recorded size and mtime. The index is read back through one typed decoder (:class:`_Record`, bounded
types of :mod:`p2pnode.snapshot`; origin and path checked as on the wire): a bad record is dropped, logged and
counted (``.sync/replicas.json``: ``bad_entry``; the file not JSON: ``malformed``, :mod:`p2pnode.statefiles`), and
its origin offers the file again. A large replica's block hashes are kept beside the index (``<key>``: 32 hex
characters of the path's BLAKE3), so the first new version after a restart carries its unchanged blocks without
hashing the whole replica again; they count only when, with the record's size and block size, they hash to the
record's root (else they are dropped, counted as ``.sync/manifests``: ``bad_entry``, and the replica is hashed);
at start, kept hashes no record names are removed. Nothing under ``.sync/manifests`` is followed through a
symlink: a link there is removed itself at start, never written or deleted through, and only a regular file is
read (a FIFO or a directory there neither hangs nor fails a push or a retirement; such entries are counted as
``.sync/manifests``: ``bad_entry``).
Receipts ``[path, size, root]`` go into this node's signed snapshot (the newest,
within a byte budget) and, in full, to ``GET /sync/receipts``; each origin's full list is bound to the snapshot
by its digest (:func:`receipts_digest`). Blocking I/O.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Annotated, Any

import blake3
import msgpack
import msgspec
from msgspec import Meta

from .._files import atomic_write_bytes
from ..snapshot import ByteCount, Counter, NodeId, WallSeconds
from ..statefiles import decode_entries, decode_entry, read_json_file, report_for
from ..synccore import BLOCK_HASH_BYTES, MAX_BLOCK_BYTES, Manifest, PathError, check_rel_path, hash_file
from ._refuse import SyncReject

__all__ = ["MAX_RECEIPT_DIGESTS", "RECEIPTS_BUDGET_BYTES", "ReplicaIndex", "receipts_digest"]

log = logging.getLogger(__name__)

RECEIPTS_BUDGET_BYTES = 24 * 1024
"""Encoded bytes of receipts a snapshot carries at most (the snapshot itself is bounded at 64 KiB)."""
MAX_RECEIPT_DIGESTS = 128
"""Origins whose receipt digest a durable node's snapshot carries at most."""


INDEX_FILE = ".sync/replicas.json"
MANIFESTS_DIR = ".sync/manifests"
PERSIST_MANIFEST_BYTES = 16 * 2**20
"""Replicas of at least this many bytes have their block hashes persisted (smaller ones are hashed again after a
restart in a few milliseconds; a file per replica would cost more)."""


class _Record(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One record of the replica index as read back (see the module docstring)."""

    origin: NodeId
    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    size: ByteCount
    root: Annotated[str, Meta(pattern=r"^[0-9a-f]{64}\Z")]
    block_size: Annotated[int, Meta(ge=1, le=MAX_BLOCK_BYTES)]
    seq: Counter
    mtime_ns: Annotated[int, Meta(ge=0, le=2**63 - 1)]
    committed_at: WallSeconds


def check_origin(origin: str) -> str:
    """``origin`` when it names one directory under ``replicas/`` (a node id, one plain path component);
    raises :class:`PathError` otherwise."""
    if "/" in origin or check_rel_path(origin) != origin:
        raise PathError(f"origin {origin!r} is not one path component")
    return origin


def receipts_digest(receipts: list[Any]) -> str:
    """A 16-hex-character BLAKE3 digest of a receipt list ``[[path, size, root], ...]`` sorted by path (its
    canonical msgpack encoding; tuples and lists encode alike). The sender recomputes it over a fetched list."""
    return blake3.blake3(msgpack.packb(receipts, use_bin_type=True)).hexdigest(length=8)


class ReplicaIndex:
    """The committed replicas under ``data_dir`` (see module docstring). ``records``: ``{(origin, path): record}``
    with ``size`` (bytes), ``root`` (hex), ``block_size``, ``seq``, ``mtime_ns`` and ``committed_at`` (Unix s).
    Not thread-safe for writers: commits of one origin are serialised by the caller; readers copy first."""

    def __init__(self, data_dir: Path) -> None:
        self.replicas = Path(data_dir) / "replicas"
        self.index_file = Path(data_dir) / ".sync" / "replicas.json"
        self.manifests_dir = Path(data_dir) / MANIFESTS_DIR
        self.replicas.mkdir(parents=True, exist_ok=True)
        self.index_file.parent.mkdir(parents=True, exist_ok=True)
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        self._manifests: dict[tuple[str, str], Manifest] = {}
        self._digests: dict[str, str] = {}  # origin -> receipts digest, dropped on each commit for that origin
        self._load()
        self._drop_orphan_hashes()

    def _load(self) -> None:
        report = report_for(self.replicas.parent)
        raw = read_json_file(self.index_file, file=INDEX_FILE, report=report)
        if raw is None:
            return
        if not isinstance(raw, dict):
            report.drop(INDEX_FILE, "malformed", f"expected an object, found {type(raw).__name__}: ignored (the "
                                                 "replicas are offered again by their origins)")
            return
        for rec in decode_entries(raw.get("replicas", []), _Record, file=INDEX_FILE, report=report):
            try:
                origin, path = check_origin(rec.origin), check_rel_path(rec.path)
            except PathError as exc:
                report.drop(INDEX_FILE, "bad_entry", str(exc))
                continue
            try:
                st = self.replica_path(origin, path).lstat()
            except OSError:
                continue  # the replica is gone (a retirement cut short, or removed by hand): not an error
            if stat.S_ISREG(st.st_mode) and st.st_size == rec.size and st.st_mtime_ns == rec.mtime_ns:
                self.records[(origin, path)] = msgspec.structs.asdict(rec)

    def _save(self) -> None:
        recs = sorted(self.records.values(), key=lambda r: (r["origin"], r["path"]))
        atomic_write_bytes(self.index_file, json.dumps({"replicas": recs}).encode())

    def record(self, origin: str, path: str, manifest: Manifest, seq: int, mtime_ns: int) -> None:
        """Note a replica just committed (its file in place and fsynced) and persist the index. A record the index
        could not read back is never persisted (logged: the file stays, as a replica the index does not know)."""
        rec = {
            "origin": origin, "path": path, "size": manifest.size, "root": manifest.root.hex(),
            "block_size": manifest.block_size, "seq": seq, "mtime_ns": mtime_ns, "committed_at": time.time(),
        }
        try:
            decode_entry(rec, _Record)
        except ValueError as exc:
            log.error("sync: replica of %r:%r not indexed: %s", origin[:64], path[:200], exc)
            return
        self.records[(origin, path)] = rec
        self._manifests[(origin, path)] = manifest
        self._digests.pop(origin, None)
        self._save_hashes(origin, path, manifest)
        self._save()

    def remove(self, origin: str, path: str) -> None:
        """Forget the replica of ``origin``'s ``path`` (its file already moved away) and persist the index: its
        receipt is withdrawn. Then its kept block hashes go (one that cannot be removed is logged: start-up
        removes it)."""
        self.records.pop((origin, path), None)
        self._manifests.pop((origin, path), None)
        self._digests.pop(origin, None)
        self._save()
        try:
            d = self._hashes_dir(origin, create=False)
            if d is not None:
                (d / self._hashes_key(path)).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("sync: the kept block hashes of %s:%s were not removed: %s", origin[:64], path[:200], exc)

    # -- persisted block hashes ------------------------------------------------------------------------
    # Everything under .sync/manifests is ours: a symlink there is never followed (nor written or deleted
    # through), only removed itself; an entry that is not a regular file is never opened for its bytes.
    @staticmethod
    def _hashes_key(path: str) -> str:
        return blake3.blake3(path.encode("utf-8", "surrogateescape")).hexdigest(length=16)

    def _hashes_dir(self, origin: str, *, create: bool) -> Path | None:
        """``.sync/manifests/<origin>`` when it and ``.sync/manifests`` are directories, not symlinks (made when
        missing and ``create``); None when one is missing (``create`` False) or is something else (counted as
        ``.sync/manifests``: ``bad_entry``; start-up removes it). Raises ``OSError`` (``mkdir`` failed)."""
        for d in (self.manifests_dir, self.manifests_dir / origin):
            try:
                st = d.lstat()
            except FileNotFoundError:
                if not create:
                    return None
                d.mkdir()  # never through a symlink: one made meanwhile is FileExistsError
                continue
            if not stat.S_ISDIR(st.st_mode):
                report_for(self.replicas.parent).drop(MANIFESTS_DIR, "bad_entry", f"{d.name}: a symlink or not a "
                                                      "directory; block hashes are not kept there")
                return None
        return self.manifests_dir / origin

    def _drop_orphan_hashes(self) -> None:
        """Remove kept block hashes no record names (a replica gone or changed while the node was down, a write cut
        short by a crash), and whatever else is there that is not ours: a symlink (the link itself, never what it
        points at) or another file where a directory or a regular file belongs (counted as ``.sync/manifests``:
        ``bad_entry``; a directory is counted and left alone)."""
        keep = {(o, self._hashes_key(p)) for o, p in self.records}
        report = report_for(self.replicas.parent)

        def junk(entry: os.DirEntry[str] | Path, what: str, *, remove: bool = True) -> None:
            report.drop(MANIFESTS_DIR, "bad_entry", f"{entry.name}: {what}" + ("; removed" if remove else ""))
            if remove:
                os.unlink(entry)

        try:
            st = self.manifests_dir.lstat()
        except FileNotFoundError:
            return
        try:
            if not stat.S_ISDIR(st.st_mode):
                junk(self.manifests_dir, "a symlink or not a directory")
                return
            with os.scandir(self.manifests_dir) as it:
                origins = list(it)
            for o in origins:
                if not o.is_dir(follow_symlinks=False):
                    junk(o, "a symlink or not a directory")
                    continue
                with os.scandir(o.path) as it:
                    entries = list(it)
                for f in entries:
                    if f.is_dir(follow_symlinks=False):
                        junk(f, "a directory", remove=False)
                    elif not f.is_file(follow_symlinks=False):
                        junk(f, "a symlink or not a regular file")
                    elif (o.name, f.name) not in keep:
                        os.unlink(f.path)
        except OSError as exc:
            log.warning("sync: could not clean %s: %s", self.manifests_dir, exc)

    def _save_hashes(self, origin: str, path: str, manifest: Manifest) -> None:
        """Persist the block hashes of a replica just committed (large ones only, see module docstring); one
        that cannot be written is logged (the replica is hashed again after a restart)."""
        try:
            d = self._hashes_dir(origin, create=manifest.size >= PERSIST_MANIFEST_BYTES)
            if d is None:
                return
            f = d / self._hashes_key(path)
            if manifest.size < PERSIST_MANIFEST_BYTES:
                f.unlink(missing_ok=True)
                return
            atomic_write_bytes(f, manifest.hashes)  # the rename replaces a symlink there, never its target
        except OSError as exc:
            log.warning("sync: the block hashes of %s:%s were not kept: %s", origin[:64], path[:200], exc)

    def _load_hashes(self, origin: str, path: str, rec: dict[str, Any]) -> Manifest | None:
        """The replica's manifest from its persisted block hashes, when they hash, with the record's size and
        block size, to the record's root; None when there are none or they do not, or they are not a regular
        file (dropped and counted; a directory is only counted)."""
        d = self._hashes_dir(origin, create=False)
        if d is None:
            return None
        f = d / self._hashes_key(path)
        want = -(-rec["size"] // rec["block_size"]) * BLOCK_HASH_BYTES  # the record's fields: decoded, bounded
        raw = b""
        try:
            regular = stat.S_ISREG(f.lstat().st_mode)
            if regular:  # O_NONBLOCK: a FIFO put there meanwhile does not hang the push (and fails S_ISREG)
                fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with open(fd, "rb") as fh:
                    regular = stat.S_ISREG(os.fstat(fd).st_mode)
                    raw = fh.read(want + 1) if regular else b""
        except OSError:
            return None
        m = Manifest.build(rec["size"], rec["block_size"], raw)
        if regular and len(raw) == want and m.root.hex() == rec["root"]:
            return m
        report_for(self.replicas.parent).drop(MANIFESTS_DIR, "bad_entry", f"{f.name}: {len(raw)} bytes that do not "
                                              "hash to the replica's root (or not a regular file); the replica is "
                                              "hashed again")
        try:
            if not stat.S_ISDIR(f.lstat().st_mode):
                f.unlink()
        except OSError as exc:
            log.warning("sync: could not remove %s: %s", f, exc)
        return None

    # -- receipts --------------------------------------------------------------------------------------
    def receipts(self, limit: int, *, budget_bytes: int = RECEIPTS_BUDGET_BYTES) -> dict[str, list[list[Any]]]:
        """Receipts for the snapshot: ``{origin: [[path, size, root(bytes)], ...]}``, the most recently committed
        replicas, at most ``limit`` of them and about ``budget_bytes`` encoded (paths may be long; the snapshot
        has a hard bound)."""
        recs = sorted(self.records.values(), key=lambda r: r["committed_at"], reverse=True)[:limit]
        out: dict[str, list[list[Any]]] = {}
        used = 0
        for r in recs:
            used += len(r["path"].encode("utf-8", "surrogateescape")) + 48
            if used > budget_bytes:
                break
            out.setdefault(r["origin"], []).append([r["path"], r["size"], bytes.fromhex(r["root"])])
        return out

    def receipts_for(self, origin: str) -> list[list[Any]]:
        """Every replica held for ``origin`` as receipts ``[[path, size, root(bytes)], ...]``, sorted by path
        (``GET /sync/receipts``; its digest is :meth:`receipt_digests`' entry)."""
        recs = list(self.records.items())  # one C-level copy: commits run in worker threads
        return sorted(([r["path"], r["size"], bytes.fromhex(r["root"])] for (o, _), r in recs if o == origin),
                      key=lambda r: r[0])

    def receipt_digests(self, limit: int = MAX_RECEIPT_DIGESTS) -> dict[str, str]:
        """``{origin: digest}`` of :func:`receipts_digest` over each origin's full receipt list, for the origins
        with the most recent commits (at most ``limit``). Carried in the snapshot: a sender fetches its full list
        over HTTP and accepts it only if it hashes to this signed digest."""
        latest: dict[str, float] = {}
        for (o, _), r in list(self.records.items()):
            latest[o] = max(latest.get(o, 0.0), r["committed_at"])
        out = {}
        for o in sorted(latest, key=lambda o: latest[o], reverse=True)[:limit]:
            d = self._digests.get(o)
            if d is None:
                d = self._digests[o] = receipts_digest(self.receipts_for(o))
            out[o] = d
        return out

    def held_bytes(self) -> int:
        """Bytes of all replicas held."""
        return sum(r["size"] for r in list(self.records.values()))

    # -- paths -------------------------------------------------------------------------------------------
    def replica_path(self, origin: str, path: str) -> Path:
        """Where ``origin``'s ``path`` (already checked by :func:`check_rel_path`) is kept."""
        return self.replicas / origin / path

    def safe_dest(self, origin: str, path: str) -> Path:
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

    def replica_manifest(self, origin: str, path: str, block_size: int) -> Manifest | None:
        """The current replica's manifest at ``block_size`` (cached), None when there is no replica. A replica file
        the index does not know (a kill between the rename and the index write) is hashed too: its blocks are
        still checked one by one against the offered manifest before they count."""
        rec = self.records.get((origin, path))
        p = self.replica_path(origin, path)
        try:
            st = p.lstat()
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        size = rec["size"] if rec is not None else st.st_size
        m = self._manifests.get((origin, path))
        if m is None and rec is not None and rec["block_size"] == block_size:
            m = self._load_hashes(origin, path, rec)  # after a restart: the hashes kept at its commit
            if m is not None:
                self._manifests[(origin, path)] = m
        if m is not None and m.block_size == block_size and m.size == size and rec is not None:
            return m
        try:
            m = hash_file(p, block_size=block_size, size=size)
        except (OSError, ValueError):
            return None
        self._manifests[(origin, path)] = m
        return m
