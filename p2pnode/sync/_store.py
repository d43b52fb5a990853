"""The receiving side of sync: replicas of other nodes' files, and the transfers that build them (blocking I/O).

Layout under the data dir::

    replicas/<origin>/<path>                   complete replicas (never deleted because the origin deleted)
    .sync/incoming/<origin>/<key>.part         the file being assembled for one (origin, path)
    .sync/incoming/<origin>/<key>.json         its manifest and path (resume state)
    .sync/replicas.json                        index: (origin, path) -> size, root, block size, seq, committed at

A transfer is keyed by ``(origin, path)`` and fixed to one manifest root. On a new root the receiver carries over
every block it already has at the same index with the same hash, from the old partial file or from the current
replica (``copy_file_range``), and asks for the rest. A block pushed over HTTP is verified against the manifest
before it is written; a block streamed over the data channel (``_channel``) is spliced into place and hashed
from the partial file as it lands, and counts only if it matches. The verified set is not persisted but
recomputed by hashing the partial file after a restart, so a ``kill -9`` at any point resumes from the blocks
that are really on disk. Completion checks every block of the partial file against the manifest from the file
itself: blocks already hashed from the file after their last write (streamed ones, ones found after a restart)
are not read again, every other block (HTTP pushes, carried-over blocks) is re-hashed; then the file is fsynced,
renamed over the replica and the directory fsynced: a replica is always a complete, verified version, never a
partial one.

:class:`ReplicaStore` is not thread-safe per origin: the caller serialises calls for one origin (the HTTP route
holds a per-origin lock and runs them in a worker thread).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import logging
import mmap
import os
import select
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import msgpack

from .._files import atomic_write_bytes
from ._manifest import MAX_BLOCK_BYTES, Manifest, PathError, check_rel_path, hash_block, hash_file

__all__ = ["PushItem", "RefusalLog", "ReplicaStore", "SyncReject", "REJECT_REASONS"]

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
    "busy",
    "receipts_mismatch",
    "overloaded",
    "too_slow",
    "disconnected",
)
"""Counted reasons for refusing sync input (``p2pnode_sync_rejected_total{reason}``)."""
RECEIPTS_BUDGET_BYTES = 24 * 1024
"""Encoded bytes of receipts a snapshot carries at most (the snapshot itself is bounded at 64 KiB)."""


MAX_RECEIPT_DIGESTS = 128
"""Origins whose receipt digest a durable node's snapshot carries at most."""
FREE_SPACE_MARGIN_BYTES = 64 * 2**20
"""Free bytes a new transfer must leave beside its own size and the bytes still to come of the transfers under
way (see :meth:`ReplicaStore.reserved_bytes`)."""


def receipts_digest(receipts: list[list[Any]]) -> str:
    """A 16-hex-character BLAKE3 digest of a receipt list ``[[path, size, root], ...]`` sorted by path (its
    canonical msgpack encoding). The sender recomputes it over a fetched list."""
    return blake3.blake3(msgpack.packb(receipts, use_bin_type=True)).hexdigest(length=8)


class SyncReject(Exception):
    """Refused sync input: ``reason`` (one of :data:`REJECT_REASONS`) and an HTTP status."""

    STATUS = {"oversized": 413, "bad_signature": 401, "not_member": 403, "stale_version": 409,
              "backpressure": 507, "no_space": 507, "busy": 503, "overloaded": 503, "too_slow": 408,
              "disconnected": 400}

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail

    @property
    def status(self) -> int:
        return self.STATUS.get(self.reason, 400 if self.reason in ("malformed", "path_escape") else 422)


REFUSAL_LOG_INTERVAL_S = 10.0
"""A refusal is logged at most once per reason in this many seconds (all are counted)."""


class RefusalLog:
    """Logs refusals (``what: reason: detail``) at most once per reason per ``interval_s`` seconds, with the
    number left unlogged since: a flood of bad input is counted in full but costs a few log lines."""

    def __init__(self, what: str, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self.what = what
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def __call__(self, exc: SyncReject, now: float) -> None:
        """Log ``exc`` unless its reason was logged less than ``interval_s`` before ``now`` (monotonic s)."""
        last = self._last.get(exc.reason)
        if last is not None and now - last < self.interval_s:
            self._quiet[exc.reason] += 1
            return
        self._last[exc.reason] = now
        more = self._quiet.pop(exc.reason, 0)
        log.info("%s: %s%s", self.what, exc, f" (and {more} more like it)" if more else "")


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
    read_back: set[int] = field(default_factory=set)
    streaming: bool = False
    """A block stream is writing this partial file (outside the origin's lock): other writers are refused."""
    """Verified blocks whose bytes were hashed from the partial file itself after their last write (streamed
    blocks as they land, blocks found on disk after a restart): the commit need not read them again."""


WRITEBACK_BYTES = 8 * 2**20
"""Dirty bytes of a stream after which their writeback is started."""
MAX_REJECTED_LISTED = 64
"""Rejected blocks detailed in one reply (all are counted in ``rejected_count``)."""
_SPLICE_PIPE_BYTES = 2**20
RCVLOWAT_BYTES = 256 * 1024
_libc = None


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` back (``sync_file_range(2)`` with
    ``SYNC_FILE_RANGE_WRITE``: asynchronous, no durability promise; the commit's fsync gives that). A no-op
    where the call does not exist."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.sync_file_range(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE


class _Splicer:
    """Reads exact byte counts from a non-blocking socket into a file at given offsets: ``splice(2)`` through a
    pipe where the platform has it (the bytes never enter user space), ``recv_into`` + ``pwrite`` otherwise."""

    def __init__(self, sock_fd: int, fd: int, timeout_s: float, stop: threading.Event | None) -> None:
        self.sock_fd, self.fd, self.timeout_s, self.stop = sock_fd, fd, timeout_s, stop
        self.poll = select.poll()
        self.poll.register(sock_fd, select.POLLIN)
        self.sock = socket.socket(fileno=os.dup(sock_fd))  # for setsockopt only (same connection)
        self.lowat = 1
        self.pipe: tuple[int, int] | None = None
        self.buf: memoryview | None = None
        self.piece = _SPLICE_PIPE_BYTES

    def __enter__(self) -> _Splicer:
        if hasattr(os, "splice"):
            r, w = os.pipe2(os.O_CLOEXEC)
            self.pipe = (r, w)
            try:
                self.piece = fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), _SPLICE_PIPE_BYTES)
            except OSError:
                self.piece = fcntl.fcntl(w, getattr(fcntl, "F_GETPIPE_SZ", 1032))  # the default: more, smaller pieces
        else:
            self.buf = memoryview(bytearray(_SPLICE_PIPE_BYTES))
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        if self.pipe is not None:
            os.close(self.pipe[0])
            os.close(self.pipe[1])

    def _wait(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.stop is not None and self.stop.is_set():
                raise InterruptedError("stream receive stopped")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no stream bytes for {self.timeout_s:g} s")
            if self.poll.poll(min(left, 0.5) * 1000):
                return

    def read_into(self, offset: int, n: int) -> int:
        """Move the next piece of the stream, at most ``n`` bytes (and at most a pipe's worth), into the file at
        ``offset``; return its length (> 0). Waits for data with ``poll`` (waking when ``SO_RCVLOWAT`` bytes,
        or all that is still due, have arrived: fewer, larger pieces, so fewer GIL hand-offs per GiB)."""
        want = min(n, self.piece)
        lowat = min(want, RCVLOWAT_BYTES)
        if lowat != self.lowat:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
                self.lowat = lowat
            except OSError:
                pass
        while True:
            try:
                if self.pipe is not None:
                    k = os.splice(self.sock_fd, self.pipe[1], want)
                else:
                    assert self.buf is not None
                    k = os.readv(self.sock_fd, [self.buf[:want]])
            except BlockingIOError:
                self._wait()
                continue
            break
        if k == 0:
            raise ConnectionError("the stream ended before its last block")
        if self.pipe is not None:
            moved = 0
            while moved < k:
                moved += os.splice(self.pipe[0], self.fd, k - moved, offset_dst=offset + moved)
        else:
            assert self.buf is not None
            done = 0
            while done < k:
                done += os.pwrite(self.fd, self.buf[done:k], offset + done)
        return k


def _key(path: str) -> str:
    return blake3.blake3(path.encode("utf-8", "surrogateescape")).hexdigest(length=16)


class ReplicaStore:
    """Replicas held for other nodes under ``data_dir`` (see module docstring).

    Counters: ``bytes_received`` (verified block bytes written), ``blocks_carried`` (blocks reused from an old
    partial file or replica), ``commits``, ``rejected[reason]``.
    """

    def __init__(self, data_dir: Path, *, free_bytes: Callable[[], int] | None = None) -> None:
        """``free_bytes()``: bytes free for an unprivileged writer where partial files go (default: ``statvfs``
        of ``.sync/incoming``; tests pass a fake)."""
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
        self._digests: dict[str, str] = {}  # origin -> receipts digest, dropped on each commit for that origin
        self._free_bytes = free_bytes if free_bytes is not None else self._statvfs_free
        self._leftover: dict[Path, int] = {}  # partial file from before a restart, not reopened yet -> bytes to come
        self._load_index()
        self._scan_leftovers()

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

    def _scan_leftovers(self) -> None:
        """Reserve the bytes still to come of partial transfers found on disk (a restart): until their origin offers
        them again or they expire, they are transfers under way."""
        for state in self.incoming.glob("*/*.json"):
            try:
                size = int(json.loads(state.read_text())["size"])
                part = state.with_suffix(".part")
                allocated = part.stat().st_blocks * 512 if part.exists() else 0
            except (OSError, ValueError, KeyError, TypeError):
                continue
            self._leftover[part] = max(0, size - allocated)

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

    def receipts_for(self, origin: str) -> list[list[Any]]:
        """Every replica held for ``origin`` as receipts ``[[path, size, root(bytes)], ...]``, sorted by path
        (``GET /sync/receipts``; its digest is :meth:`receipt_digests`' entry)."""
        recs = list(self.index.items())  # one C-level copy: commits run in worker threads
        return sorted(([r["path"], r["size"], bytes.fromhex(r["root"])] for (o, _), r in recs if o == origin),
                      key=lambda r: r[0])

    def receipt_digests(self, limit: int = MAX_RECEIPT_DIGESTS) -> dict[str, str]:
        """``{origin: digest}`` of :func:`receipts_digest` over each origin's full receipt list, for the origins
        with the most recent commits (at most ``limit``). Carried in the snapshot: a sender fetches its full list
        over HTTP and accepts it only if it hashes to this signed digest."""
        latest: dict[str, float] = {}
        for (o, _), r in list(self.index.items()):
            latest[o] = max(latest.get(o, 0.0), r["committed_at"])
        out = {}
        for o in sorted(latest, key=lambda o: latest[o], reverse=True)[:limit]:
            d = self._digests.get(o)
            if d is None:
                d = self._digests[o] = receipts_digest(self.receipts_for(o))
            out[o] = d
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
            self._leftover.pop(part, None)
            part.unlink(missing_ok=True)
            state.unlink(missing_ok=True)
            n += 1
            log.info("sync: dropped a partial transfer from %s untouched for %.0f s", origin, age)
        return n

    def held_bytes(self) -> int:
        return sum(r["size"] for r in self.index.values())

    def partial_bytes(self) -> int:
        return sum(len(t.verified) * t.manifest.block_size for t in self._transfers.values())

    def reserved_bytes(self, exclude: Path | None = None) -> int:
        """Bytes still to come of the transfers under way (their manifests' sizes minus the blocks verified so far;
        partial files from before a restart: their size minus the bytes allocated on disk), the partial file
        ``exclude`` left out. A partial file is sparse until its blocks arrive, so free space alone does not
        show what its transfer will still take."""
        total = 0
        for t in list(self._transfers.values()):
            if t.part != exclude:
                m = t.manifest
                total += max(0, m.size - sum(m.block_len(i) for i in list(t.verified)))
        return total + sum(n for p, n in list(self._leftover.items()) if p != exclude)

    def _statvfs_free(self) -> int:
        st = os.statvfs(self.incoming)
        return st.f_bavail * st.f_frsize

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
        try:
            allocated = part.stat().st_blocks * 512  # sparse: only the blocks written so far take space
        except FileNotFoundError:
            allocated = 0
        self._check_space(m.size - allocated, part)
        self._leftover.pop(part, None)
        atomic_write_bytes(state, json.dumps({"path": item.path, "seq": item.seq, "size": m.size,
                                              "block_size": m.block_size, "hashes": m.hashes.hex()}).encode())
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            verified: set[int] = set()
            on_disk: set[int] = set()
            if old is not None and old.block_size == m.block_size:
                # blocks of the old partial file at the same index with the same hash: check they are on disk
                same = [i for i in range(min(old.blocks, m.blocks))
                        if old.block_hash(i) == m.block_hash(i) and old.block_len(i) == m.block_len(i)]
                verified = self._verify_on_disk(fd, m, same)
                on_disk = set(verified)
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
        t = _Transfer(origin, item.path, m, item.seq, part, state, verified, set(on_disk))
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

    def _prepare(self, origin: str, item: PushItem) -> _Transfer | None:
        """The transfer for ``item`` (opened or resumed), or None when the replica already is this version.
        Raises :class:`SyncReject` (path, manifest, stale version, space) before any byte is written."""
        try:
            check_rel_path(item.path)
        except PathError as exc:
            raise SyncReject("path_escape", str(exc)) from None
        m = item.manifest
        if not m.is_consistent():
            raise SyncReject("bad_manifest", "block count, size and root do not agree")
        rec = self.index.get((origin, item.path))
        if rec is not None and rec["root"] == m.root.hex():
            return None
        if rec is not None and rec["seq"] > item.seq:
            raise SyncReject("stale_version", f"holding seq {rec['seq']} > offered {item.seq}")
        cur = self._transfers.get((origin, item.path))
        if cur is not None and cur.streaming:
            raise SyncReject("busy", f"a block stream of {item.path!r} is under way")
        self._safe_dest(origin, item.path)  # reject escapes before any byte is written
        return self._open_transfer(origin, item)

    def _apply(self, origin: str, item: PushItem) -> dict[str, Any]:
        t = self._prepare(origin, item)
        if t is None:
            return {"path": item.path, "status": "have", "need": []}
        m = item.manifest
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
        return self._outcome(t, item.commit, bad)

    def _outcome(self, t: _Transfer, commit: bool, bad: list[SyncReject]) -> dict[str, Any]:
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

    # -- the block stream (data channel) -------------------------------------------------------------------
    def open_stream(self, origin: str, item: PushItem) -> _Transfer | None:
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

    def finish_stream(self, t: _Transfer, commit: bool, bad: list[SyncReject]) -> dict[str, Any]:
        """End a stream (the caller holds the origin's lock again): commit when every block is verified and
        ``commit``; the result item of :meth:`apply`. Raises ``SyncReject("corrupt_on_commit")``."""
        t.streaming = False
        return self._outcome(t, commit, bad)

    def receive_stream(self, t: _Transfer, runs: list[tuple[int, int]], sock_fd: int, *,
                       timeout_s: float, stop: threading.Event | None = None) -> list[SyncReject]:
        """Receive the blocks of ``runs`` (``[(first block, count)]``, ascending) from the connected socket
        ``sock_fd`` (non-blocking) into ``t``'s partial file (opened by :meth:`open_stream`; blocking, without
        the origin's lock, so other files of the origin are served meanwhile). Returns the blocks refused.

        Each block goes from the socket into its place in the partial file with ``splice(2)`` (through a pipe: no
        copy into user space), is hashed from the page cache and counts only if it matches its manifest hash; a
        mismatch is counted (``bad_block_hash``) and the block stays needed. Dirty pages are handed to writeback
        as they accumulate (``sync_file_range``), so the commit's fsync finds little left to flush (RocksDB's
        ``bytes_per_sync`` does the same). Raises ``ConnectionError``
        when the stream ends early, ``TimeoutError`` after ``timeout_s`` seconds without a byte, ``InterruptedError``
        when ``stop`` is set; the blocks verified until then are kept (resume)."""
        m = t.manifest
        bad: list[SyncReject] = []
        t0 = time.perf_counter()
        for first, count in runs:  # about to be overwritten: each counts again only once hashed from the file
            t.verified.difference_update(range(first, first + count))
            t.read_back.difference_update(range(first, first + count))
        if runs:
            fd = os.open(t.part, os.O_RDWR | os.O_NOFOLLOW)
            try:
                if os.fstat(fd).st_size != m.size:
                    os.ftruncate(fd, m.size)
                with _Splicer(sock_fd, fd, timeout_s, stop) as rx, mmap.mmap(fd, m.size, prot=mmap.PROT_READ) as mm, \
                        memoryview(mm) as view:
                    dirty_from = None
                    for first, count in runs:
                        start, end = first * m.block_size, min(m.size, (first + count) * m.block_size)
                        i, pos = first, start
                        while pos < end:
                            pos += rx.read_into(pos, end - pos)  # one piece: as much as arrived, up to the pipe
                            while i < first + count and (i * m.block_size + m.block_len(i) <= pos):
                                off, n = i * m.block_size, m.block_len(i)
                                if hash_block(view[off : off + n]) == m.block_hash(i):
                                    t.verified.add(i)
                                    t.read_back.add(i)
                                    self.bytes_received += n
                                else:
                                    t.verified.discard(i)
                                    t.read_back.discard(i)
                                    self.rejected["bad_block_hash"] += 1
                                    bad.append(SyncReject("bad_block_hash",
                                                          f"block {i} of {t.path!r} does not match its hash"))
                                i += 1
                            dirty_from = start if dirty_from is None else dirty_from
                            if pos - dirty_from >= WRITEBACK_BYTES:
                                _start_writeback(fd, dirty_from, pos - dirty_from)
                                dirty_from = pos
                        dirty_from = None
            finally:
                os.close(fd)
        log.debug("sync: received %d runs of %s in %.3f s", len(runs), t.path, time.perf_counter() - t0)
        return bad

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
                        t.read_back.discard(index)  # checked in memory before the write: the commit re-reads it
                        self.bytes_received += len(data)
                    run = []
                run.append(b)
        finally:
            os.close(fd)

    def _commit(self, t: _Transfer) -> None:
        m = t.manifest
        t0 = time.perf_counter()
        todo = [i for i in range(m.blocks) if i not in t.read_back]
        try:
            if os.path.getsize(t.part) != m.size or not t.verified.issuperset(range(m.blocks)):
                good: set[int] | None = None
            elif len(todo) > m.blocks // 2:  # most blocks: the whole file, hashed by several threads
                got = hash_file(t.part, block_size=m.block_size, size=m.size, mapped=True)  # ours: nobody truncates it
                good = {i for i in range(m.blocks) if got.block_hash(i) == m.block_hash(i)}
            else:
                fd = os.open(t.part, os.O_RDONLY)
                try:
                    good = (set(range(m.blocks)) - set(todo)) | self._verify_on_disk(fd, m, todo)
                finally:
                    os.close(fd)
        except (OSError, ValueError) as exc:
            good = None
            log.warning("sync: re-hashing %s failed: %s", t.part, exc)
        if good is None or len(good) != m.blocks:
            t.verified = good or set()
            t.read_back = set(t.verified)
            raise SyncReject("corrupt_on_commit", f"{t.path!r}: the assembled file does not match its root")
        dest = self._safe_dest(t.origin, t.path)
        t1 = time.perf_counter()
        fd = os.open(t.part, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        log.debug("sync: commit of %s: %d blocks re-hashed in %.3f s, fsynced in %.3f s", t.path, len(todo),
                  t1 - t0, time.perf_counter() - t1)
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
        self._digests.pop(t.origin, None)
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
            "reserved_bytes": self.reserved_bytes(),
            "bytes_received": self.bytes_received,
            "blocks_carried": self.blocks_carried,
            "commits": self.commits,
            "rejected": dict(sorted(self.rejected.items())),
        }

