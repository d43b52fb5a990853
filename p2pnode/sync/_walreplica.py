"""The receiving side of a live database's WAL segments: a replica applied in order, never torn (blocking I/O).

A replica is an ordinary SQLite database file in rollback-journal mode (bytes 18-19 of page 1 set to 1, so a
reader opens it without a ``-wal`` or ``-shm``), always equal to its source at one transaction boundary. Beside
it: ``<replica>.walstate`` (JSON: origin, the last applied ``seq``, page size, database size in pages, the
source's WAL position; replaced by rename) and, while a segment is applied, ``<replica>.walundo`` or
``<replica>.walsnap``.

Applying a ``frames`` segment (:meth:`WalReplica.apply`), each step durable before the next:

1. the **undo record** ``.walundo``: the replica's current bytes of every page the segment writes, its size and
   the ``seq`` the segment brings (written aside, fsynced, renamed in, folder fsynced);
2. under SQLite's exclusive lock on the replica (taken by a connection, so readers wait as for any writer;
   ``busy`` when one holds a read transaction past ``lock_timeout_s``), the pages written at
   ``(pgno - 1) × page_size``, the file grown to ``db_pages × page_size``, the header's change counter
   moved on (readers with cached pages drop them) with the in-header size made valid, fsynced;
3. the new state renamed in (fsynced), then the file cut to ``db_pages × page_size`` if the segment shrank it
   (not before: the undo record holds only the pages written, so a rollback could not put back cut pages;
   readers go by the in-header size meanwhile);
4. the undo record removed.

A ``snapshot`` is written whole to ``.walsnap`` (fsynced, checked against its hash), the state renamed in with
the snapshot marked pending, then ``.walsnap`` renamed over the replica and the state marked done.

On open (:meth:`WalReplica.recover`), an undo record whose ``seq`` the state has not reached is rolled back
(the pages put back, the size restored), one it has reached is dropped; a pending snapshot whose ``.walsnap``
is still there is renamed in. So a crash at any point leaves the replica at the boundary before the segment or
the one after it, and the sender's next segments (or a resent one) carry on from there. Costs: the segment's
pages written twice (undo and replica) and three fsyncs.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import blake3
import msgspec
from msgspec import Meta

from .._lazy import lazy_module
from ..synccore import SQLITE_MAGIC, PathError, check_rel_path
from ._refuse import SyncReject
from ._walwire import SegmentHeader, decode_segment, inflate_pages
from ._wire import KeyOf

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

__all__ = ["WalReplica", "WalReplicas"]

log = logging.getLogger(__name__)

_COPY_BYTES = 8 << 20


class _State(msgspec.Struct):
    origin: Annotated[str, Meta(max_length=64)]
    seq: Annotated[int, Meta(ge=0, le=2**53)]
    page_size: Annotated[int, Meta(ge=512, le=65536)]
    db_pages: Annotated[int, Meta(ge=0, le=2**32)]
    salts: tuple[int, int] = (0, 0)
    frames: int = 0
    snapshot_pending: bool = False


class _Undo(msgspec.Struct):
    target_seq: int
    old_size: int
    page_size: int
    pages: list[tuple[int, bytes]]


class _Crash(Exception):
    """Test hook: the apply stops at a named step, as a kill -9 there would (nothing after it runs)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _read_counter(path: Path) -> int | None:
    """The file change counter of the database at ``path`` (bytes 24-27), or None when there is none."""
    try:
        with open(path, "rb") as fh:
            raw = os.pread(fh.fileno(), 4, 24)
    except OSError:
        return None
    return int.from_bytes(raw, "big") if len(raw) == 4 else None


def _patch_header(page1: bytearray, counter: int, db_pages: int) -> None:
    """The replica's database header (fileformat2 section 1.3): rollback journaling (bytes 18-19: 1, where the
    source's WAL mode has 2), the file change counter (24) moved on so readers drop their cached pages, the
    in-header database size (28) and the version-valid-for number (92) that makes that size valid."""
    page1[18] = 1
    page1[19] = 1
    c = (counter & 0xFFFFFFFF).to_bytes(4, "big")
    page1[24:28] = c
    page1[28:32] = db_pages.to_bytes(4, "big")
    page1[92:96] = c


class WalReplica:
    """The replica at ``path`` of one source database (see module docstring). ``crash_at``: a step name at
    which :meth:`apply` stops (tests: ``undo``, ``pages``, ``half_pages``, ``state``; ``snap_file``,
    ``snap_state``, ``snap_rename``)."""

    def __init__(self, path: Path, *, lock_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self.state_path = Path(str(path) + ".walstate")
        self.undo_path = Path(str(path) + ".walundo")
        self.snap_path = Path(str(path) + ".walsnap")
        self.crash_at: str | None = None
        self.state: _State | None = None
        self.recovered: Counter[str] = Counter()
        self.recover()

    def _step(self, name: str) -> None:
        if self.crash_at == name:
            raise _Crash(name)

    def recover(self) -> None:
        """Finish or roll back what a crash interrupted (see module docstring); loads the state."""
        self.state = None
        if self.state_path.exists():
            try:
                self.state = msgspec.json.decode(self.state_path.read_bytes(), type=_State)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("sync: %s: unreadable WAL state (%s): the next snapshot replaces the replica",
                            self.path, exc)
        if self.state is not None and self.state.snapshot_pending:
            if self.snap_path.exists():
                os.replace(self.snap_path, self.path)
                _fsync_dir(self.path.parent)
                self.recovered["snapshot_finished"] += 1
            self.state.snapshot_pending = False
            _write_durable(self.state_path, msgspec.json.encode(self.state))
        self.snap_path.unlink(missing_ok=True)
        if self.undo_path.exists():
            self._roll_back()

    def _roll_back(self) -> None:
        raw = self.undo_path.read_bytes()
        try:
            if blake3.blake3(raw[:-32]).digest() != raw[-32:]:
                raise msgspec.DecodeError("hash")
            undo = msgspec.msgpack.decode(raw[:-32], type=_Undo)
        except (msgspec.DecodeError, msgspec.ValidationError):
            # renamed in only once complete: a bad record is a damaged disk; the replica is then unknown
            log.error("sync: %s: undo record damaged; the replica is dropped until the next snapshot", self.path)
            self.state = None
            self.state_path.unlink(missing_ok=True)
            self.undo_path.unlink()
            return
        if self.state is not None and self.state.seq >= undo.target_seq:
            self.recovered["undo_dropped"] += 1  # the segment was applied whole
            self._cut_to(self.state)  # maybe not cut yet
        else:
            ps = undo.page_size
            with open(self.path, "r+b") as fh:
                for pgno, old in undo.pages:
                    if old:
                        os.pwrite(fh.fileno(), old, (pgno - 1) * ps)
                fh.truncate(undo.old_size)
                os.fsync(fh.fileno())
            self.recovered["rolled_back"] += 1
        self.undo_path.unlink()
        _fsync_dir(self.path.parent)

    # -- applying -------------------------------------------------------------------------------------------
    def check_order(self, h: SegmentHeader) -> None:
        """Raises ``SyncReject`` unless ``h`` applies on this replica now: ``stale_version`` (``seq`` not above
        the applied one), ``out_of_order`` (a ``frames`` segment that does not follow the applied one, or
        before any snapshot), ``bad_segment`` (another origin's, or a page size that differs from the
        replica's without a snapshot)."""
        st = self.state
        if st is not None and st.origin != h.origin:
            raise SyncReject("bad_segment", f"replica of {st.origin}, segment of {h.origin}")
        if st is not None and h.seq <= st.seq:
            raise SyncReject("stale_version", f"segment {h.seq}, replica at {st.seq}")
        if h.kind == "frames":
            if st is None or h.prev_seq != st.seq:
                raise SyncReject("out_of_order",
                                 f"segment {h.seq} follows {h.prev_seq}, replica at {st.seq if st else None}")
            if not self.path.exists():
                raise SyncReject("out_of_order", "the replica file is gone: a snapshot is needed")
            if h.page_size != st.page_size:
                raise SyncReject("bad_segment", f"page size {h.page_size}, replica's {st.page_size}")

    def apply(self, h: SegmentHeader, payload: bytes | memoryview | Path) -> None:
        """Apply an authenticated segment (:func:`~._walwire.decode_segment` checked its signature and shape).
        ``payload``: the pages' bytes, or a file holding the snapshot. Raises ``SyncReject`` (the reasons of
        :meth:`check_order`, ``bad_block_hash`` for a payload that does not match its hash); the replica is
        unchanged then."""
        self.check_order(h)
        if h.kind == "snapshot":
            self._apply_snapshot(h, payload)
        else:
            data = payload.read_bytes() if isinstance(payload, Path) else payload
            if len(data) != h.payload_bytes or blake3.blake3(data).digest() != h.payload_hash:
                raise SyncReject("bad_block_hash", f"segment {h.seq}: payload does not match its hash")
            self._apply_frames(h, memoryview(inflate_pages(h, data)))

    def _new_state(self, h: SegmentHeader, *, pending: bool = False) -> _State:
        return _State(h.origin, h.seq, h.page_size, h.db_pages, h.salts, h.frames, pending)

    def _apply_frames(self, h: SegmentHeader, data: memoryview) -> None:
        ps = h.page_size
        lock = self._lock()
        try:
            with open(self.path, "r+b") as fh:
                fd = fh.fileno()
                old_size = os.fstat(fd).st_size
                touched = h.pages if 1 in h.pages else [1, *h.pages]  # page 1's header changes in every apply
                undo = _Undo(h.seq, old_size, ps, [(p, os.pread(fd, ps, (p - 1) * ps)) for p in touched])
                body = msgspec.msgpack.encode(undo)
                _write_durable(self.undo_path, body + blake3.blake3(body).digest())
                self._step("undo")
                counter = int.from_bytes(os.pread(fd, 4, 24), "big")
                for i, pgno in enumerate(h.pages):
                    if self.crash_at == "half_pages" and i == len(h.pages) // 2:
                        raise _Crash("half_pages")
                    os.pwrite(fd, data[i * ps:(i + 1) * ps], (pgno - 1) * ps)
                if h.db_pages * ps > old_size:  # a shrink waits for the state: the undo record holds no cut page
                    fh.truncate(h.db_pages * ps)
                first = bytearray(os.pread(fd, 100, 0))
                _patch_header(first, counter + 1, h.db_pages)
                os.pwrite(fd, first, 0)
                os.fsync(fd)
            # closing the file above released the process's POSIX locks on it, SQLite's too: readers may come in
            # now, and find the new pages whole
        finally:
            if lock is not None:
                lock.close()
        self._step("pages")
        state = self._new_state(h)
        _write_durable(self.state_path, msgspec.json.encode(state))
        self.state = state
        self._step("state")
        self._cut_to(state)
        self.undo_path.unlink()

    def _cut_to(self, state: _State) -> None:
        """Cut the replica to ``state``'s size once that state is durable (a segment that shrank the database:
        the pages past its new end are no longer part of any state a rollback could need)."""
        size = state.db_pages * state.page_size
        if self.path.exists() and self.path.stat().st_size > size:
            with open(self.path, "r+b") as fh:
                fh.truncate(size)
                os.fsync(fh.fileno())

    def _lock(self) -> sqlite3.Connection | None:
        """SQLite's exclusive lock on the replica, so no reader runs while pages are written (a reader waits or
        retries, as it would for any writer). Raises ``SyncReject("busy")`` when readers hold it past
        ``lock_timeout_s``; None when the replica is not a database SQLite opens."""
        try:
            conn = sqlite3.connect(self.path, timeout=self.lock_timeout_s, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error:
            return None
        try:
            conn.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise SyncReject("busy", f"readers of {self.path.name} hold it") from None
            return None
        except sqlite3.Error:
            conn.close()
            return None
        return conn

    def _apply_snapshot(self, h: SegmentHeader, payload: bytes | memoryview | Path) -> None:
        h3 = blake3.blake3()
        with open(self.snap_path, "w+b") as out:
            if isinstance(payload, Path):
                with open(payload, "rb") as src:
                    while chunk := src.read(_COPY_BYTES):
                        h3.update(chunk)
                        out.write(chunk)
            else:
                h3.update(payload)
                out.write(payload)
            size = out.tell()
            if size != h.payload_bytes or h3.digest() != h.payload_hash:
                out.close()
                self.snap_path.unlink()
                raise SyncReject("bad_block_hash", f"snapshot {h.seq}: payload does not match its hash")
            out.flush()
            first = bytearray(os.pread(out.fileno(), 100, 0))
            if bytes(first[:16]) != SQLITE_MAGIC or int.from_bytes(first[16:18], "big") not in (h.page_size, 1):
                out.close()
                self.snap_path.unlink()
                raise SyncReject("bad_segment", f"snapshot {h.seq} is not a database of {h.page_size}-byte pages")
            old = _read_counter(self.path)
            own = int.from_bytes(first[24:28], "big")
            _patch_header(first, own if old is None else max(own, old + 1), h.db_pages)
            os.pwrite(out.fileno(), first, 0)
            os.fsync(out.fileno())
        self._step("snap_file")
        self.undo_path.unlink(missing_ok=True)  # an older segment's, already resolved by recover()
        pending = self._new_state(h, pending=True)
        _write_durable(self.state_path, msgspec.json.encode(pending))
        self.state = pending
        self._step("snap_state")
        os.replace(self.snap_path, self.path)
        _fsync_dir(self.path.parent)
        self._step("snap_rename")
        done = self._new_state(h)
        _write_durable(self.state_path, msgspec.json.encode(done))
        self.state = done


class WalReplicas:
    """The WAL replicas a durable node keeps, under ``root/<origin>/<path>``: decodes, authenticates and applies
    segments, counting refusals by reason in :attr:`refused` (``p2pnode_sync_rejected_total`` labels). A
    database larger than ``max_db_bytes`` (1 TiB) is refused (``oversized``), and one that does not fit in the
    free space less ``reserve_bytes`` (``no_space``), before a byte is written."""

    def __init__(self, root: Path, *, key_of: KeyOf, max_db_bytes: int = 1 << 40,
                 reserve_bytes: int = 64 << 20) -> None:
        self.root = Path(root)
        self.key_of = key_of
        self.max_db_bytes = max_db_bytes
        self.reserve_bytes = reserve_bytes
        self.replicas: dict[tuple[str, str], WalReplica] = {}
        self.refused: Counter[str] = Counter()
        self.applied: Counter[str] = Counter()

    def replica(self, origin: str, path: str) -> WalReplica:
        """The replica of ``origin``'s ``path`` (opened and recovered on first use)."""
        r = self.replicas.get((origin, path))
        if r is None:
            dest = self.root / origin / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            r = self.replicas[(origin, path)] = WalReplica(dest)
        return r

    def receive(self, head: bytes | memoryview, payload: bytes | memoryview | Path | None = None) -> SegmentHeader:
        """Apply one segment: ``head`` as :func:`~._walwire.encode_segment` made it, with the payload after it
        or in ``payload``. Raises ``SyncReject`` (counted in :attr:`refused`)."""
        try:
            h, used = decode_segment(head, key_of=self.key_of)
            try:
                check_rel_path(h.path)
            except PathError as exc:
                raise SyncReject("path_escape", str(exc)) from None
            if payload is None:
                payload = memoryview(head)[used:]
            self._check_room(h)
            self.replica(h.origin, h.path).apply(h, payload)
        except SyncReject as exc:
            self.refused[exc.reason] += 1
            raise
        self.applied[h.kind] += 1
        return h

    def check_room(self, h: SegmentHeader) -> None:
        """Raise unless ``h`` fits (see :meth:`_check_room`): a driver asks before it spools a large payload."""
        self._check_room(h)

    def _check_room(self, h: SegmentHeader) -> None:
        """``oversized``: a database beyond ``max_db_bytes``; ``no_space``: a snapshot (written beside the
        replica it replaces) or a grown database that does not fit in the free space less ``reserve_bytes``."""
        size = h.db_pages * h.page_size
        if size > self.max_db_bytes:
            raise SyncReject("oversized", f"a database of {size} bytes > {self.max_db_bytes}")
        self.root.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize - self.reserve_bytes
        need = size if h.kind == "snapshot" else len(h.pages) * h.page_size * 2 + max(0, size - self._held(h))
        if need > free:
            raise SyncReject("no_space", f"{need} bytes needed, {max(0, free)} free")

    def _held(self, h: SegmentHeader) -> int:
        r = self.replicas.get((h.origin, h.path))
        try:
            return r.path.stat().st_size if r is not None else 0
        except OSError:
            return 0
