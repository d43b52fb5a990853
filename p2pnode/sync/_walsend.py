"""The sending side of a live WAL-mode database: segments of committed frames, litestream's method (blocking I/O).

Each :meth:`WalSender.poll` (one per sync interval, from a worker thread):

1. opens a **read-only** connection (``mode=ro``: it never checkpoints, so it never deletes the log on close) and
   asks the journal mode; a database not in WAL mode gets ``None`` (it keeps the backup path of :mod:`._source`);
2. starts a **read transaction** (``BEGIN`` and a ``SELECT``): while it is open no checkpoint can reset the log,
   so the frames read are the ones committed, not new frames written over them;
3. reads the log from the shipped position on and verifies each frame against SQLite's cumulative checksum
   (:func:`p2pnode.synccore.scan_log`, in pieces); the committed frames since the position become one ``frames``
   segment, each page once (its last committed version), pages past the new database size dropped;
4. ends the transaction and closes the connection at once: the writer's checkpoints run between polls as if
   the sender were not there (the ``-wal`` stays at the writer's autocheckpoint size), the writer never waits on
   the sender for more than one read of the new frames, and a writer that switches its journal mode finds no
   other connection open (SQLite refuses to leave WAL mode while another connection is open).

A **reset** (the log's salts changed since the position) is resolved by :func:`p2pnode.synccore.reset_outcome`:
the old log's frames after the position are usually still on disk past the new log's frames, and are shipped
first; when they cannot be proven complete (the new log overwrote them, the file was truncated, the log was
deleted by the writer's last close, the page size changed with ``VACUUM``) the sender takes a **snapshot**: the
database file with the current log's committed pages laid over it, read under the same read transaction, so it
is the database exactly at the position that follows it. A snapshot is also taken at the first poll and every
``snapshot_interval_s``.

**A resync instead of a snapshot.** The sender keeps a 64-bit BLAKE3 hash of every page of the database as the
replica holds it (:attr:`WalSender.page_hashes`: from the last snapshot's copy, updated with every ``frames``
segment; 8 bytes a page, 2 MiB per GiB of 4 KiB pages, kept for databases of at most ``max_hashed_pages``). When
frames were lost (a ``wal_checkpoint(TRUNCATE)`` by another connection, the writer's last close deleting the log,
a reset over unshipped frames, one transaction larger than a segment), the sender reads the database as a snapshot
would (the file with the current log's committed pages over it, under the same read transaction), hashes each
page, and sends the pages whose hash differs as one ordinary ``frames`` segment following the last one (page 1
always): the replica reaches the same state a snapshot would give, at a cost in bytes proportional to the change
(the read and the hashing stay O(database), on the sender only). More changed pages than a segment holds (a
``VACUUM`` that moved most pages) take a snapshot, as does anything that leaves the replica's state unknown
(:meth:`WalSender.restart`: a target refused or was not reached) or a new page size. Counted as ``resyncs`` and
``resync:<why>``.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import blake3

from .._lazy import lazy_module
from ..identity import Identity
from ..synccore import (
    WAL_FRAME_HEADER_BYTES,
    WalFormatError,
    WalHeader,
    WalPosition,
    WalScan,
    collapse_frames,
    frame_offset,
    parse_frame_header,
    parse_wal_header,
    reset_outcome,
    scan_log,
)
from ._walwire import MAX_SEGMENT_PAGES, SegmentHeader, deflate_pages, encode_segment, payload_hash

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

__all__ = ["Outgoing", "WalSender"]

log = logging.getLogger(__name__)

_READ_ATTEMPTS = 3
_COPY_BYTES = 8 << 20
PAGE_HASH_BYTES = 8
"""Bytes of BLAKE3 kept per page for a resync (a changed page goes unnoticed with probability 2^-64). Keyed with
a random key per sender, never stored nor sent, so a writer who crafts rows cannot search offline for two
versions of a page with the same 64-bit hash (a birthday search: 2^32 hashes), which would leave the replica at
the old one."""
_RESYNC_REASONS = frozenset({"truncated", "several_resets", "overwritten", "cut", "unreadable", "log_gone",
                             "large"})
"""Snapshot reasons after which the replica is still at the last segment sent: a resync can take their place."""


def _page_hash(page: bytes | memoryview, key: bytes) -> bytes:
    return blake3.blake3(page, key=key).digest(length=PAGE_HASH_BYTES)


def _hash_file_pages(path: Path, db_pages: int, page_size: int, key: bytes) -> bytearray:
    """The :data:`PAGE_HASH_BYTES`-byte hash (keyed by ``key``) of each of the first ``db_pages`` pages of
    ``path``."""
    out = bytearray(db_pages * PAGE_HASH_BYTES)
    per = max(1, _COPY_BYTES // page_size)
    with open(path, "rb") as fh:
        for first in range(0, db_pages, per):
            n = min(per, db_pages - first)
            mv = memoryview(os.pread(fh.fileno(), n * page_size, first * page_size).ljust(n * page_size, b"\0"))
            for k in range(n):
                i = (first + k) * PAGE_HASH_BYTES
                out[i:i + PAGE_HASH_BYTES] = _page_hash(mv[k * page_size:(k + 1) * page_size], key)
    return out


@dataclass(slots=True)
class Outgoing:
    """A segment ready to send: its signed ``head`` (:func:`~._walwire.encode_segment`), its ``header``, and its
    ``payload``: the pages' bytes, or the path of the snapshot's staging file (removed by :meth:`discard`). A
    plain dataclass, not a Struct: it is never decoded (msgspec cannot decode ``bytes | Path``)."""

    head: bytes
    header: SegmentHeader
    payload: bytes | Path

    def discard(self) -> None:
        if isinstance(self.payload, Path):
            self.payload.unlink(missing_ok=True)


def _copy_prefix(src_path: Path, dest: Path, size: int) -> None:
    """``dest`` = the first ``size`` bytes of ``src_path``, zero-filled past its end (``copy_file_range``: a
    kernel copy, or a reflink where the file system shares extents; a read/write loop where it cannot)."""
    with open(src_path, "rb") as src, open(dest, "wb") as out:
        done = 0
        try:
            while done < size:
                n = os.copy_file_range(src.fileno(), out.fileno(), size - done, done, done)
                if n == 0:
                    break
                done += n
        except OSError:
            src.seek(done)
            out.seek(done)
            while done < size and (chunk := src.read(min(_COPY_BYTES, size - done))):
                out.write(chunk)
                done += len(chunk)
        out.truncate(size)


class _Retry(Exception):
    """The log's header changed while it was read: read again."""


class WalSender:
    """Segments of one live database ``db_path`` (synced as ``rel``) signed by ``identity``; ``next_seq()``
    hands out the origin's persistent sequence numbers; snapshots are staged in ``staging_dir``.

    Counters in :attr:`stats`: ``segments``, ``snapshots``, ``snapshot:<why>`` (``start``, ``schedule``,
    ``log_gone``, ``large`` (one transaction of more than ``max_segment_frames``
    frames: a ``VACUUM`` or a bulk load; a snapshot streams from the files, a segment would sit in memory; more
    frames of several smaller transactions go in several polls' segments) and the reasons
    of :func:`~p2pnode.synccore.reset_outcome`), ``page_bytes`` (pages shipped in
    ``frames`` segments), ``payload_bytes`` (the same, as sent: deflated when smaller), ``snapshot_bytes``,
    ``resets_continued`` (resets that lost nothing), ``resyncs`` and ``resync:<why>`` (a loss of frames answered
    by the changed pages instead of a snapshot; see module docstring). ``max_hashed_pages``: the largest database
    (in pages) whose page hashes are kept (8 bytes each); larger ones take snapshots."""

    def __init__(self, db_path: Path, rel: str, identity: Identity, *, next_seq: Callable[[], int],
                 staging_dir: Path, snapshot_interval_s: float | None = None,
                 max_segment_frames: int = 16384, deflate: bool = True, max_hashed_pages: int = 1 << 22) -> None:
        self.db_path = Path(db_path)
        self.wal_path = Path(str(db_path) + "-wal")
        self.rel = rel
        self.identity = identity
        self.next_seq = next_seq
        self.staging_dir = Path(staging_dir)
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        self.snapshot_interval_s = snapshot_interval_s
        self.max_segment_frames = min(max_segment_frames, MAX_SEGMENT_PAGES)
        self.deflate = deflate
        self.position: WalPosition | None = None
        """The shipped position; None before the first snapshot and after :meth:`restart`."""
        self.empty_db_sig: tuple[int, int, int] | None = None
        """When the last snapshot found no log: the database file's (inode, size, mtime); the first log that
        appears continues that snapshot only if the file has not changed since (nothing was checkpointed)."""
        self.last_seq = 0
        self.db_pages = 0
        self.wal_sig: tuple[int, int] = (0, 0)
        """(inode, size) of the log when the position was read: a smaller or other file was truncated."""
        self.next_snapshot_at = 0.0
        self.max_hashed_pages = max_hashed_pages
        self.hash_key = os.urandom(32)
        """The key of the page hashes (:data:`PAGE_HASH_BYTES`): this process's, never stored or sent."""
        self.page_hashes: bytearray | None = None
        """The hash of each page of the database at the position, as the replica holds it (see module docstring);
        None when unknown (before a snapshot, after :meth:`restart`, past ``max_hashed_pages``)."""
        self.stats: Counter[str] = Counter()

    def restart(self) -> None:
        """Forget the position: the next poll sends a snapshot (the receiver refused a segment as out of order)."""
        self.position = None
        self.empty_db_sig = None
        self.page_hashes = None

    # -- the poll -------------------------------------------------------------------------------------------
    def poll(self, *, now: float, wall: float | None = None) -> list[Outgoing] | None:
        """The segments that bring a replica from the shipped position to the last commit (maybe none), or None
        when the database is not in WAL mode. ``now``: monotonic seconds (the snapshot schedule); ``wall``: Unix
        seconds for ``sent_at``. Raises ``sqlite3.Error``/``OSError`` when the database cannot be read."""
        uri = "file:" + urllib.parse.quote(str(self.db_path)) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=1.0, check_same_thread=False)
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                self.restart()
                return None
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
            try:
                for _ in range(_READ_ATTEMPTS):
                    try:
                        return self._read(conn, now, time.time() if wall is None else wall)
                    except _Retry:
                        continue
                raise OSError(f"the log of {self.rel} kept changing while read")
            finally:
                conn.execute("COMMIT")
        finally:
            conn.close()

    def _read(self, conn: sqlite3.Connection, now: float, wall: float) -> list[Outgoing]:
        try:
            fd = os.open(self.wal_path, os.O_RDONLY)
        except FileNotFoundError:
            fd = -1
        try:
            st = os.fstat(fd) if fd >= 0 else None
            head = os.pread(fd, 32, 0) if fd >= 0 else b""
            header = None
            if len(head) == 32:
                try:
                    header = parse_wal_header(head)
                except WalFormatError as exc:
                    raise _Retry() from exc  # a header being written
            pos = self.position
            if pos is None:
                return self._snapshot(conn, fd, header, head, "start", now, wall)
            if self.snapshot_interval_s is not None and now >= self.next_snapshot_at:
                return self._snapshot(conn, fd, header, head, "schedule", now, wall)
            if self.empty_db_sig is not None:
                if self._db_sig() != self.empty_db_sig:
                    return self._snapshot(conn, fd, header, head, "log_gone", now, wall)
                if header is None or st is None:
                    return []
                scan = self._scan(fd, WalPosition.start_of(header), header)
                if scan.end == "limit" and not scan.frames:
                    if self._commit_ahead(fd, WalPosition.start_of(header)):
                        return self._snapshot(conn, fd, header, head, "large", now, wall)
                    return []  # one transaction still being written, longer than a segment: wait for it
                frames, new_pos, db_pages = scan.frames, scan.position, scan.db_pages
            elif header is None:
                return self._snapshot(conn, fd, header, head, "log_gone", now, wall)
            elif st is None:
                raise _Retry()  # unreachable: a header was read from an open log
            elif pos.same_log(header):
                scan = self._scan(fd, pos, header)
                if scan.end == "limit" and not scan.frames:
                    if self._commit_ahead(fd, pos):
                        return self._snapshot(conn, fd, header, head, "large", now, wall)
                    return []  # one transaction still being written, longer than a segment: wait for it
                frames, new_pos, db_pages = scan.frames, scan.position, scan.db_pages
            else:
                got = self._across_reset(fd, st, header, pos)
                if isinstance(got, str):
                    return self._snapshot(conn, fd, header, head, got, now, wall)
                frames, new_pos, db_pages = got
            if os.pread(fd, 32, 0) != head:
                raise _Retry()
            return self._frames_segment(frames, new_pos, db_pages or self.db_pages, st, wall)
        finally:
            if fd >= 0:
                os.close(fd)

    def _scan(self, fd: int, start: WalPosition, header: WalHeader, *, keep_pages: bool = True) -> WalScan:
        """The log's valid frames after ``start``, read in pieces; at most ``max_segment_frames`` of them when
        their pages are kept (``end`` ``limit`` beyond: the caller sends a snapshot instead)."""
        base = frame_offset(start.frames + 1, start.page_size)
        return scan_log(lambda off, n: os.pread(fd, n, base + off), start, big_endian=header.big_endian,
                        max_frames=self.max_segment_frames if keep_pages else None, keep_pages=keep_pages)

    def _commit_ahead(self, fd: int, start: WalPosition) -> bool:
        """Whether a frame header of this log after ``start`` claims a commit (headers only, unverified: a
        snapshot then verifies the chain itself). A scan that found no commit within ``max_segment_frames``
        frames asks this: no commit ahead is one long transaction still being written (wait for it); one ahead
        makes a segment too large (a snapshot)."""
        step = WAL_FRAME_HEADER_BYTES + start.page_size
        off = frame_offset(start.frames + 1, start.page_size)
        while len(hdr := os.pread(fd, WAL_FRAME_HEADER_BYTES, off)) == WAL_FRAME_HEADER_BYTES:
            _, commit, salt1, salt2, _, _ = parse_frame_header(hdr)
            if (salt1, salt2) != (start.salt1, start.salt2):
                return False
            if commit:
                return True
            off += step
        return False

    def _across_reset(self, fd: int, st: os.stat_result, header: WalHeader,
                      pos: WalPosition) -> tuple[list, WalPosition, int] | str:
        """The frames from ``pos`` in the old log to the last commit of the new one, or the snapshot reason."""
        new = self._scan(fd, WalPosition.start_of(header), header)
        off = frame_offset(pos.frames + 1, pos.page_size)
        tail = self._scan(fd, pos, header)
        if "limit" in (new.end, tail.end):
            return "large"
        again = os.pread(fd, 8, off + 8)
        first = struct.unpack(">II", again) if len(again) == 8 else None
        shrank = st.st_ino != self.wal_sig[0] or st.st_size < self.wal_sig[1]
        outcome = reset_outcome(pos, header, new_frames=new.position.frames + new.pending, old_tail=tail,
                                tail_first_salts=first, shrank=shrank)
        if outcome != "continue":
            return outcome.split(":", 1)[1]
        self.stats["resets_continued"] += 1
        return tail.frames + new.frames, new.position, new.db_pages or tail.db_pages

    def _db_sig(self) -> tuple[int, int, int]:
        st = os.stat(self.db_path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _frames_segment(self, frames: list, new_pos: WalPosition, db_pages: int, st: os.stat_result | None,
                        wall: float) -> list[Outgoing]:
        self.wal_sig = (st.st_ino, st.st_size) if st is not None else (0, 0)
        if not frames:
            # nothing committed since: the position may still move to the start of a new log (after a reset that
            # lost nothing, or the first log after a snapshot of a database without one)
            self.position, self.empty_db_sig = new_pos, None
            return []
        pages = {p: b for p, b in collapse_frames(frames).items() if p <= db_pages}
        return self._emit(pages, new_pos, db_pages, wall)

    def _emit(self, pages: dict[int, bytes], new_pos: WalPosition, db_pages: int, wall: float) -> list[Outgoing]:
        """One ``frames`` segment of ``pages`` ({pgno: page}) following the last segment; the position moves to
        ``new_pos`` and the page hashes follow the replica."""
        if self.page_hashes is not None and db_pages > self.max_hashed_pages:
            self.page_hashes = None  # grown past the bound: snapshots again, and no memory for its hashes
        if self.page_hashes is not None:
            hashes = self.page_hashes
            del hashes[db_pages * PAGE_HASH_BYTES:]
            hashes.extend(bytes(db_pages * PAGE_HASH_BYTES - len(hashes)))  # a page no segment carried: unknown
            for p, b in pages.items():
                hashes[(p - 1) * PAGE_HASH_BYTES:p * PAGE_HASH_BYTES] = _page_hash(b, self.hash_key)
        order = sorted(pages)
        payload = b"".join(pages[p] for p in order)
        self.stats["page_bytes"] += len(payload)
        packed = deflate_pages(payload) if self.deflate else None
        encoding: Literal["raw", "zlib"] = "raw" if packed is None else "zlib"
        payload = payload if packed is None else packed
        seq = self.next_seq()
        h = SegmentHeader(self.identity.node_id, self.rel, "frames", seq, self.last_seq, new_pos.page_size,
                          db_pages, order, len(payload), payload_hash(payload), (new_pos.salt1, new_pos.salt2),
                          new_pos.frames, wall, encoding)
        self.position, self.empty_db_sig, self.last_seq, self.db_pages = new_pos, None, seq, db_pages
        self.stats["segments"] += 1
        self.stats["payload_bytes"] += len(payload)
        return [Outgoing(encode_segment(self.identity, h), h, payload)]

    # -- snapshots ------------------------------------------------------------------------------------------
    def _snapshot(self, conn: sqlite3.Connection, fd: int, header: WalHeader | None, head: bytes, why: str,
                  now: float, wall: float) -> list[Outgoing]:
        """The database at the current log's last commit, read under the open read transaction: the database
        file with the log's committed pages laid over it (pages the log holds are never read from the file, so
        a checkpoint copying them meanwhile does not matter). After a loss of frames (:data:`_RESYNC_REASONS`)
        with the page hashes known, a resync instead when its pages fit in a segment (module docstring)."""
        if why in _RESYNC_REASONS and self.page_hashes is not None and self.position is not None:
            got = self._resync(conn, fd, header, head, why, wall)
            if got is not None:
                return got
        st = os.fstat(fd) if fd >= 0 else None
        latest: dict[int, int] = {}  # pgno -> the index of its last committed frame in the current log
        if header is not None:
            scan = self._scan(fd, WalPosition.start_of(header), header, keep_pages=False)
            page_size, db_pages, new_pos = header.page_size, scan.db_pages, scan.position
            latest = {f.pgno: f.index for f in scan.frames}
        else:
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            db_pages, new_pos = 0, None
        db_sig = self._db_sig()
        if not db_pages:
            db_pages = db_sig[1] // page_size
        if db_pages < 1:
            raise OSError(f"{self.rel}: an empty database")
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        key = blake3.blake3(self.rel.encode("utf-8", "surrogateescape")).hexdigest(length=16)
        seq = self.next_seq()
        dest = self.staging_dir / f"{key}.wal-snapshot.{seq}"
        size = db_pages * page_size
        _copy_prefix(self.db_path, dest, size)
        with open(dest, "r+b") as out:
            for pgno, index in latest.items():
                if pgno <= db_pages:
                    os.pwrite(out.fileno(), os.pread(fd, page_size, frame_offset(index, page_size) + 24),
                              (pgno - 1) * page_size)
        h3 = blake3.blake3(max_threads=blake3.blake3.AUTO)
        h3.update_mmap(dest)
        hashes = (_hash_file_pages(dest, db_pages, page_size, self.hash_key) if db_pages <= self.max_hashed_pages
                  else None)
        if fd >= 0 and os.pread(fd, 32, 0) != head:
            dest.unlink(missing_ok=True)
            raise _Retry()
        salts = (new_pos.salt1, new_pos.salt2) if new_pos else (0, 0)
        hd = SegmentHeader(self.identity.node_id, self.rel, "snapshot", seq, 0, page_size, db_pages, [], size,
                           h3.digest(), salts, new_pos.frames if new_pos else 0, wall)
        if new_pos is None:
            self.position = WalPosition(0, 0, 0, (0, 0), page_size, 0)
            self.empty_db_sig = db_sig
        else:
            self.position, self.empty_db_sig = new_pos, None
        self.wal_sig = (st.st_ino, st.st_size) if st is not None else (0, 0)
        self.last_seq, self.db_pages, self.page_hashes = seq, db_pages, hashes
        if self.snapshot_interval_s is not None:
            self.next_snapshot_at = now + self.snapshot_interval_s
        self.stats["snapshots"] += 1
        self.stats[f"snapshot:{why}"] += 1
        self.stats["snapshot_bytes"] += size
        log.info("sync: %s: snapshot (%s) of %d pages at seq %d", self.rel, why, db_pages, seq)
        return [Outgoing(encode_segment(self.identity, hd), hd, dest)]

    def _resync(self, conn: sqlite3.Connection, fd: int, header: WalHeader | None, head: bytes, why: str,
                wall: float) -> list[Outgoing] | None:
        """The pages that differ between the database now (read as :meth:`_snapshot` reads it) and the replica
        (:attr:`page_hashes`), as one ``frames`` segment; None when they are more than a segment holds, the page
        size changed or the database is too large to hash (a snapshot then)."""
        assert self.page_hashes is not None and self.position is not None
        st = os.fstat(fd) if fd >= 0 else None
        latest: dict[int, int] = {}
        new_pos: WalPosition | None = None
        db_pages = 0
        if header is not None:
            scan = self._scan(fd, WalPosition.start_of(header), header, keep_pages=False)
            page_size, db_pages, new_pos = header.page_size, scan.db_pages, scan.position
            latest = {f.pgno: f.index for f in scan.frames}
        else:
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        if page_size != self.position.page_size:
            return None
        db_sig = self._db_sig()
        db_pages = db_pages or db_sig[1] // page_size
        if not 1 <= db_pages <= self.max_hashed_pages:
            return None
        old, k = self.page_hashes, PAGE_HASH_BYTES
        changed: dict[int, bytes] = {}
        per = max(1, _COPY_BYTES // page_size)
        with open(self.db_path, "rb") as db:
            for first in range(1, db_pages + 1, per):
                n = min(per, db_pages + 1 - first)
                mv = memoryview(os.pread(db.fileno(), n * page_size, (first - 1) * page_size).ljust(n * page_size,
                                                                                                   b"\0"))
                for pgno in range(first, first + n):
                    index = latest.get(pgno)
                    page = (os.pread(fd, page_size, frame_offset(index, page_size) + WAL_FRAME_HEADER_BYTES)
                            if index else mv[(pgno - first) * page_size:(pgno - first + 1) * page_size])
                    if pgno == 1 or _page_hash(page, self.hash_key) != old[(pgno - 1) * k:pgno * k]:
                        changed[pgno] = bytes(page)
                        if len(changed) > self.max_segment_frames:
                            return None
        if fd >= 0 and os.pread(fd, 32, 0) != head:
            raise _Retry()
        pos = new_pos if new_pos is not None else WalPosition(0, 0, 0, (0, 0), page_size, 0)
        out = self._emit(changed, pos, db_pages, wall)
        self.empty_db_sig = db_sig if new_pos is None else None
        self.wal_sig = (st.st_ino, st.st_size) if st is not None else (0, 0)
        self.stats["resyncs"] += 1
        self.stats[f"resync:{why}"] += 1
        log.info("sync: %s: resync (%s) instead of a snapshot: %d of %d pages changed, seq %d", self.rel, why,
                 len(changed), db_pages, self.last_seq)
        return out
