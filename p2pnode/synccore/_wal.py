"""SQLite's write-ahead log read as bytes: header, frames, cumulative checksums, the committed prefix (pure).

The format is SQLite's (https://www.sqlite.org/fileformat2.html#walformat, section 4): a 32-byte header, then
frames of a 24-byte frame header and one page each.

* **Header** (big-endian u32s): magic ``0x377f0682`` or ``0x377f0683`` (the low bit says the checksums read words
  big-endian), format version 3007000, page size, checkpoint sequence, salt-1, salt-2, checksum-1, checksum-2 (the
  checksum of the first 24 bytes).
* **Frame header** (big-endian u32s): page number, the database size in pages after the commit for a commit frame
  (0 otherwise), salt-1, salt-2, checksum-1, checksum-2 (cumulative: over the header's first 8 bytes and the page,
  starting from the previous frame's checksum, or the WAL header's for the first frame).
* A frame is **valid** when its salts equal the header's and its checksum matches the running one; the log ends at
  the first frame that is not. Frames after the last valid **commit frame** are not committed (a transaction still
  being written, or one rolled back after it spilled): the committed prefix ends at the last commit frame.
* A **reset** (SQLite restarts the log after a checkpoint copied every frame into the database) writes a new
  header: salt-1 grows by one, salt-2 is new, the checkpoint sequence grows by one, and frames are written from the
  start again, over the old ones. The old frames past the new ones stay on disk, still valid under the old salts,
  unless the file was truncated (``journal_size_limit``, ``wal_checkpoint(TRUNCATE)``).

A :class:`WalPosition` is how far a sender has shipped: the salts of the log it read, the number of frames of it
shipped (always a commit boundary) and the running checksum after the last one, so the next read verifies its
first frame against it without re-reading the shipped ones. This is litestream's position (generation, index,
offset) with SQLite's own salts as the generation check.

Everything here is pure: functions over ``bytes`` and offsets; the drivers read the file
(:mod:`p2pnode.sync._walship`). Hostile bytes (truncated, a bad checksum, wrong salts, a page size that is not a
power of two from 512 to 65536) end the log or raise :class:`WalFormatError`, never anything else.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import msgspec

from ..errors import P2PNodeError

__all__ = [
    "WAL_FRAME_HEADER_BYTES",
    "WAL_HEADER_BYTES",
    "WalFormatError",
    "WalFrame",
    "WalHeader",
    "WalPosition",
    "WalScan",
    "collapse_frames",
    "frame_offset",
    "parse_frame_header",
    "parse_wal_header",
    "reset_outcome",
    "scan_frames",
    "scan_log",
    "wal_checksum",
]

WAL_HEADER_BYTES = 32
WAL_FRAME_HEADER_BYTES = 24
WAL_MAGIC_LE = 0x377F0682
WAL_MAGIC_BE = 0x377F0683
WAL_FORMAT_VERSION = 3007000
MIN_PAGE_BYTES = 512
MAX_PAGE_BYTES = 65536
_MASK = 0xFFFFFFFF


class WalFormatError(P2PNodeError, ValueError):
    """The bytes are not a WAL header SQLite would accept (magic, version, page size or header checksum)."""


class WalHeader(msgspec.Struct, frozen=True):
    """A parsed WAL header. ``big_endian``: the checksum reads words big-endian (magic ``0x377f0683``);
    ``page_size`` in bytes; ``checksum``: the header's own ``(s1, s2)``, the start of the frames' running sum."""

    big_endian: bool
    page_size: int
    checkpoint_seq: int
    salt1: int
    salt2: int
    checksum: tuple[int, int]

    @property
    def salts(self) -> tuple[int, int]:
        return (self.salt1, self.salt2)


class WalPosition(msgspec.Struct, frozen=True):
    """How far a log has been shipped: ``frames`` valid frames of the log whose header has ``salt1``/``salt2``
    (a commit boundary), ``checksum`` the running checksum after the last of them (the header's when 0 frames),
    ``page_size`` its page size and ``checkpoint_seq`` its header's checkpoint sequence."""

    salt1: int
    salt2: int
    frames: int
    checksum: tuple[int, int]
    page_size: int
    checkpoint_seq: int

    @classmethod
    def start_of(cls, header: WalHeader) -> WalPosition:
        """The position before the first frame of the log ``header`` begins."""
        return cls(header.salt1, header.salt2, 0, header.checksum, header.page_size, header.checkpoint_seq)

    def same_log(self, header: WalHeader) -> bool:
        return (self.salt1, self.salt2) == header.salts and self.page_size == header.page_size


class WalFrame(msgspec.Struct, frozen=True):
    """One valid frame: its 1-based ``index`` in the log, the ``pgno`` it writes, ``commit_pages`` (the database
    size in pages after this commit, 0 for a frame that does not commit) and ``page`` (``page_size`` bytes)."""

    index: int
    pgno: int
    commit_pages: int
    page: bytes


class WalScan(msgspec.Struct, frozen=True):
    """What :func:`scan_frames` found: the committed ``frames`` (up to and including the last commit frame), the
    ``position`` after them, ``db_pages`` (the database size after the last commit, 0 when nothing committed),
    ``pending`` (valid frames after the last commit: a transaction still being written) and ``end`` (why the scan
    stopped: ``eof`` (the bytes end after a whole frame), ``short`` (they end inside a frame), ``salt`` (a frame
    of another log), ``checksum``, ``bad_pgno`` (page number 0) or ``limit``)."""

    frames: list[WalFrame]
    position: WalPosition
    db_pages: int
    pending: int
    end: str


def wal_checksum(data: bytes | memoryview, s: tuple[int, int], big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes) continued from ``s`` = ``(s1, s2)``: for each
    pair of 32-bit words ``x0, x1`` (big- or little-endian by the magic), ``s1 += x0 + s2; s2 += x1 + s1``
    modulo 2^32 (fileformat2 section 4.3)."""
    n = len(data) // 4
    if n * 4 != len(data) or n % 2:
        raise ValueError("checksum input must be a multiple of 8 bytes")
    words = struct.unpack((">" if big_endian else "<") + f"{n}I", data)
    s1, s2 = s
    for i in range(0, n, 2):
        s1 = (s1 + words[i] + s2) & _MASK
        s2 = (s2 + words[i + 1] + s1) & _MASK
    return (s1, s2)


def parse_wal_header(data: bytes | memoryview) -> WalHeader:
    """The header in the first 32 bytes of ``data``. Raises :class:`WalFormatError` on a short buffer, a wrong
    magic or format version, a page size that is not a power of two in 512..65536, or a bad header checksum."""
    if len(data) < WAL_HEADER_BYTES:
        raise WalFormatError("short WAL header")
    magic, version, page_size, ckpt, salt1, salt2, c1, c2 = struct.unpack(">8I", data[:WAL_HEADER_BYTES])
    if magic not in (WAL_MAGIC_LE, WAL_MAGIC_BE):
        raise WalFormatError(f"bad WAL magic {magic:#x}")
    if version != WAL_FORMAT_VERSION:
        raise WalFormatError(f"unknown WAL format version {version}")
    if page_size == 1:
        page_size = 65536  # the header stores 65536 as 1 (fileformat2: the page size field)
    if not MIN_PAGE_BYTES <= page_size <= MAX_PAGE_BYTES or page_size & (page_size - 1):
        raise WalFormatError(f"bad WAL page size {page_size}")
    big_endian = bool(magic & 1)
    if wal_checksum(data[:24], (0, 0), big_endian) != (c1, c2):
        raise WalFormatError("bad WAL header checksum")
    return WalHeader(big_endian, page_size, ckpt, salt1, salt2, (c1, c2))


def frame_offset(index: int, page_size: int) -> int:
    """Byte offset in the log of the frame with 1-based ``index``."""
    return WAL_HEADER_BYTES + (index - 1) * (WAL_FRAME_HEADER_BYTES + page_size)


if TYPE_CHECKING:  # numpy is imported where checksums are computed: an idle agent never loads it
    import numpy as np


def parse_frame_header(data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
    """``(pgno, commit_pages, salt1, salt2, checksum1, checksum2)`` of a 24-byte frame header."""
    return struct.unpack(">6I", data[:WAL_FRAME_HEADER_BYTES])


def _powers(pairs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int]]:
    """The checksum step as a matrix: one pair ``(x0, x1)`` maps ``s`` to ``M s + (x0, x0 + x1)`` with
    ``M = [[1, 1], [1, 2]]``, so ``pairs`` pairs map ``s`` to ``M^pairs s + sum M^(pairs-1-i) (u_i, v_i)``.
    Returns the entries ``a, b, c`` of ``M^(pairs-1-i)`` for each ``i`` (uint64, reduced mod 2^32) and those
    of ``M^pairs``."""
    import numpy as np

    a, b, c = np.empty(pairs, np.uint64), np.empty(pairs, np.uint64), np.empty(pairs, np.uint64)
    x, y, z = 1, 0, 1  # M^0
    for k in range(pairs):
        a[pairs - 1 - k], b[pairs - 1 - k], c[pairs - 1 - k] = x, y, z
        x, y, z = (x + y) & _MASK, (x + 2 * y) & _MASK, (y + 2 * z) & _MASK
    return a, b, c, (x, y, z)


_POWERS: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int]]] = {}
_CHUNK_FRAMES = 1024


def _frame_sums(data: memoryview, count: int, page_size: int, big_endian: bool) -> tuple[list[int], list[int]]:
    """For each of ``count`` whole frames in ``data``: the part of its checksum that does not depend on the
    running sum (``sum M^(P-1-i) (u_i, v_i)`` over its header's first 8 bytes and its page, mod 2^32), computed
    for all frames at once with uint64 arithmetic (wrapping mod 2^64 keeps every value right mod 2^32)."""
    import numpy as np

    pairs = 1 + page_size // 8
    if pairs not in _POWERS:
        _POWERS[pairs] = _powers(pairs)
    a, b, c, _ = _POWERS[pairs]
    step = WAL_FRAME_HEADER_BYTES + page_size
    words = np.frombuffer(data, dtype=">u4" if big_endian else "<u4", count=count * step // 4)
    words = words.reshape(count, step // 4).astype(np.uint64)
    x0 = np.concatenate([words[:, 0:1], words[:, 6::2]], axis=1)
    x1 = np.concatenate([words[:, 1:2], words[:, 7::2]], axis=1)
    v = x0 + x1
    s1 = (x0 @ a + v @ b) & np.uint64(_MASK)
    s2 = (x0 @ b + v @ c) & np.uint64(_MASK)
    return s1.tolist(), s2.tolist()


def scan_frames(data: bytes | memoryview, start: WalPosition, *, big_endian: bool, base_index: int | None = None,
                max_frames: int | None = None, keep_pages: bool = True) -> WalScan:
    """Walk the valid frames of the log ``start`` belongs to, from the frame after ``start`` on. ``data`` holds
    the log's bytes from that frame's offset (``frame_offset(start.frames + 1, page_size)``) on. See
    :func:`scan_log` (the same walk over a reader)."""
    mv = memoryview(data)
    return scan_log(lambda off, n: mv[off:off + n], start, big_endian=big_endian, base_index=base_index,
                    max_frames=max_frames, keep_pages=keep_pages)


def scan_log(read: Callable[[int, int], bytes | memoryview], start: WalPosition, *, big_endian: bool,
             base_index: int | None = None, max_frames: int | None = None, keep_pages: bool = True) -> WalScan:
    """Walk the valid frames of the log ``start`` belongs to, from the frame after ``start`` on, reading them in
    pieces of 1,024 frames with ``read(offset, length)`` (offsets from that frame's start; fewer bytes at the end
    of the log), so memory holds one piece (and the pages kept). ``base_index`` overrides the index of the first
    frame (default ``start.frames + 1``). Stops at the first frame that is cut short, has other salts, a checksum
    that does not continue the running one or page number 0, or after ``max_frames`` frames (``end`` ``limit``).
    Returns the frames up to the last commit frame (with their pages unless ``keep_pages`` is false: then each
    ``page`` is empty and the caller reads it at ``frame_offset(index) + 24``) and the position after it (``start``
    itself when no commit frame was found). Checksums of a piece are computed at once (numpy), then chained."""
    ps = start.page_size
    step = WAL_FRAME_HEADER_BYTES + ps
    first = start.frames + 1 if base_index is None else base_index
    pairs = 1 + ps // 8
    if pairs not in _POWERS:
        _POWERS[pairs] = _powers(pairs)
    ma, mb, mc = _POWERS[pairs][3]
    s1, s2 = start.checksum
    salts = (start.salt1, start.salt2)
    frames: list[WalFrame] = []
    committed, position, db_pages, end, base = 0, start, 0, "", 0
    while not end:
        want = _CHUNK_FRAMES if max_frames is None else min(_CHUNK_FRAMES, max_frames - base)
        if want <= 0:
            end = "limit"
            break
        mv = memoryview(read(base * step, want * step))
        n = len(mv) // step
        if n == 0:
            end = "eof" if len(mv) == 0 else "short"
            break
        c1, c2 = _frame_sums(mv[:n * step], n, ps, big_endian)
        for k in range(n):
            off = k * step
            pgno, commit, salt1, salt2, want1, want2 = parse_frame_header(mv[off:off + WAL_FRAME_HEADER_BYTES])
            if (salt1, salt2) != salts:
                end = "salt"
                break
            if pgno == 0:
                end = "bad_pgno"
                break
            s1, s2 = (ma * s1 + mb * s2 + c1[k]) & _MASK, (mb * s1 + mc * s2 + c2[k]) & _MASK
            if (s1, s2) != (want1, want2):
                end = "checksum"
                break
            index = first + len(frames)
            page = bytes(mv[off + WAL_FRAME_HEADER_BYTES:off + step]) if keep_pages else b""
            frames.append(WalFrame(index, pgno, commit, page))
            if commit:
                committed = len(frames)
                db_pages = commit
                position = WalPosition(start.salt1, start.salt2, index, (s1, s2), ps, start.checkpoint_seq)
        base += n
        if not end and n < want:
            end = "eof" if len(mv) == n * step else "short"
    return WalScan(frames[:committed], position, db_pages, len(frames) - committed, end)


def collapse_frames(frames: Iterable[WalFrame]) -> dict[int, bytes]:
    """The last version of each page among committed ``frames`` (in log order): ``{pgno: page}``. A segment
    carries each page once, as of its last commit."""
    out: dict[int, bytes] = {}
    for f in frames:
        out[f.pgno] = f.page
    return out


def reset_outcome(position: WalPosition, header: WalHeader, *, new_frames: int, old_tail: WalScan | None,
                  tail_first_salts: tuple[int, int] | None, shrank: bool) -> str:
    """Whether frames were lost when the log was reset under a sender (the header's salts differ from
    ``position``'s). The sender shipped ``position.frames`` frames of the old log; after the reset the new log
    has ``new_frames`` valid frames, written from the start over the old ones. ``old_tail``: the scan of the
    old log from the frame after ``position`` (its bytes as still on disk, read after the new header; None when
    they could not be read); ``tail_first_salts``: the salts in the header of that frame read again after the
    scan (None when the bytes end before it); ``shrank``: the file is shorter than when ``position`` was read, or
    another file (it was truncated, or deleted and made again).

    Returns ``"continue"`` (nothing lost: the old log's committed tail is ``old_tail.frames``, then the new log
    from its start), or ``"snapshot:<why>"``: ``page_size`` (a new page size: ``VACUUM`` after ``PRAGMA
    page_size``), ``several_resets`` (salt-1 moved by more than one: SQLite adds one per reset, so a whole log
    went by unseen), ``truncated``, ``overwritten`` (the new log's frames reached the old tail, before or while
    it was read), ``cut`` (the old tail's bytes end inside a frame or a transaction: the file was cut, so the old
    log's end is unknown), ``unreadable``. A clean end of the bytes right after whole frames counts as the old
    log's end: only a truncation by ``journal_size_limit`` to a whole number of frames, above the size the
    sender last saw, would look the same (see docs/sync.md)."""
    if header.page_size != position.page_size:
        return "snapshot:page_size"
    if (header.salt1 - position.salt1) & _MASK != 1:
        return "snapshot:several_resets"
    if shrank:
        return "snapshot:truncated"
    if new_frames > position.frames or tail_first_salts == header.salts:
        return "snapshot:overwritten"
    if old_tail is None or old_tail.end == "limit":
        return "snapshot:unreadable"
    if old_tail.end == "short" or (old_tail.end == "eof" and old_tail.pending):
        return "snapshot:cut"
    return "continue"


# Type information built as this module is imported (under the import lock, before any thread can use the
# classes): an agent may import it after its start-up warm-up, p2pnode.inputs.warm_type_info (msgspec builds it
# on first use, racily across threads).
for _cls in (WalHeader, WalPosition, WalFrame, WalScan):
    msgspec.msgpack.Decoder(_cls)
