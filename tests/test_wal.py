"""The pure WAL reader (p2pnode.synccore._wal) over logs SQLite itself wrote, and over hostile bytes."""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

import pytest

from p2pnode.synccore import (
    WalFormatError,
    WalPosition,
    collapse_frames,
    frame_offset,
    parse_wal_header,
    reset_outcome,
    scan_frames,
    wal_checksum,
)


def _writer(path: Path, autocheckpoint: int = 0) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    assert db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    db.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v BLOB)")
    return db


def _insert(db: sqlite3.Connection, n: int, size: int = 300) -> None:
    db.execute("BEGIN")
    for _ in range(n):
        db.execute("INSERT INTO t (v) VALUES (randomblob(?))", (size,))
    db.execute("COMMIT")


def _scan_all(wal: bytes):
    h = parse_wal_header(wal)
    start = WalPosition.start_of(h)
    return h, scan_frames(wal[frame_offset(1, h.page_size):], start, big_endian=h.big_endian)


def test_header_and_frames_of_a_real_log(tmp_path: Path) -> None:
    db = _writer(tmp_path / "a.db")
    for _ in range(5):
        _insert(db, 10)
    wal = (tmp_path / "a.db-wal").read_bytes()
    h, scan = _scan_all(wal)
    assert h.page_size == db.execute("PRAGMA page_size").fetchone()[0]
    assert scan.frames, "SQLite wrote frames"
    assert scan.end == "eof" and scan.pending == 0
    # 1 commit for CREATE TABLE + 5 transactions
    assert sum(1 for f in scan.frames if f.commit_pages) == 6
    assert scan.db_pages == db.execute("PRAGMA page_count").fetchone()[0]
    assert scan.position.frames == len(scan.frames) == (len(wal) - 32) // (24 + h.page_size)
    db.close()


def test_resuming_from_a_position_reads_only_new_frames(tmp_path: Path) -> None:
    db = _writer(tmp_path / "a.db")
    _insert(db, 10)
    wal1 = (tmp_path / "a.db-wal").read_bytes()
    h, first = _scan_all(wal1)
    _insert(db, 10)
    _insert(db, 10)
    wal2 = (tmp_path / "a.db-wal").read_bytes()
    pos = first.position
    rest = scan_frames(wal2[frame_offset(pos.frames + 1, h.page_size):], pos, big_endian=h.big_endian)
    assert sum(1 for f in rest.frames if f.commit_pages) == 2
    assert rest.frames[0].index == pos.frames + 1
    _, whole = _scan_all(wal2)
    assert rest.position == whole.position
    db.close()


def test_collapse_keeps_the_last_version_of_each_page(tmp_path: Path) -> None:
    db = _writer(tmp_path / "a.db")
    for _ in range(20):
        _insert(db, 3)
    _, scan = _scan_all((tmp_path / "a.db-wal").read_bytes())
    pages = collapse_frames(scan.frames)
    assert len(pages) < len(scan.frames)  # page 1 and the table's leaf rewritten by many commits
    last = {}
    for f in scan.frames:
        last[f.pgno] = f.page
    assert pages == last
    # the collapsed pages over the database file give the live database
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # not needed for the check; just make the file whole
    db.close()


def test_replaying_collapsed_frames_rebuilds_the_database(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    db = _writer(src)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    base = src.read_bytes()  # the database before any frame
    for _ in range(30):
        _insert(db, 10)
    wal = (tmp_path / "a.db-wal").read_bytes()
    h, scan = _scan_all(wal)
    out = bytearray(base)
    for pgno, page in collapse_frames(scan.frames).items():
        off = (pgno - 1) * h.page_size
        if len(out) < off + h.page_size:
            out.extend(b"\0" * (off + h.page_size - len(out)))
        out[off:off + h.page_size] = page
    del out[scan.db_pages * h.page_size:]
    out[18:20] = b"\x01\x01"  # rollback journaling, as a replica is kept
    rep = tmp_path / "rep.db"
    rep.write_bytes(bytes(out))
    r = sqlite3.connect(rep)
    assert r.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert r.execute("SELECT count(*) FROM t").fetchone()[0] == 300
    r.close()
    db.close()


def test_uncommitted_frames_are_pending_not_shipped(tmp_path: Path) -> None:
    db = _writer(tmp_path / "a.db")
    db.execute("PRAGMA cache_size=2")  # a big transaction spills frames before its commit
    _insert(db, 5)
    db.execute("BEGIN")
    for _ in range(400):
        db.execute("INSERT INTO t (v) VALUES (randomblob(3000))")
    wal = (tmp_path / "a.db-wal").read_bytes()
    _, scan = _scan_all(wal)
    assert scan.pending > 0
    assert scan.frames[-1].commit_pages
    db.execute("ROLLBACK")
    db.close()


def test_hostile_bytes(tmp_path: Path) -> None:
    db = _writer(tmp_path / "a.db")
    for _ in range(4):
        _insert(db, 10)
    wal = bytearray((tmp_path / "a.db-wal").read_bytes())
    db.close()
    h, whole = _scan_all(bytes(wal))
    step = 24 + h.page_size
    # truncated header / truncated frame
    with pytest.raises(WalFormatError):
        parse_wal_header(bytes(wal[:31]))
    _, cut = _scan_all(bytes(wal[: 32 + step * (len(whole.frames) - 1) + 100]))
    assert cut.end == "short" and len(cut.frames) < len(whole.frames)
    # bad magic, version, page size, header checksum
    for off, value in ((0, 0x12345678), (4, 3007001), (8, 1000), (8, 1 << 20), (24, 0)):
        bad = bytearray(wal)
        struct.pack_into(">I", bad, off, value)
        with pytest.raises(WalFormatError):
            parse_wal_header(bytes(bad))
    # a flipped byte in the second frame's page: the log ends before it
    bad = bytearray(wal)
    bad[32 + step + 24 + 7] ^= 0xFF
    _, s = _scan_all(bytes(bad))
    assert s.end == "checksum" and all(f.index < 2 for f in s.frames)
    # wrong salt in frame 3
    bad = bytearray(wal)
    struct.pack_into(">I", bad, 32 + 2 * step + 8, h.salt1 + 1)
    _, s = _scan_all(bytes(bad))
    assert s.end == "salt" and all(f.index < 3 for f in s.frames)
    # page number 0
    bad = bytearray(wal)
    struct.pack_into(">I", bad, 32, 0)
    _, s = _scan_all(bytes(bad))
    assert s.end == "bad_pgno" and not s.frames
    # garbage after the header
    _, s = _scan_all(bytes(wal[:32]) + b"\xff" * (step * 3))
    assert not s.frames and s.end in ("salt", "checksum")
    # a position with the wrong checksum continues nothing
    pos = whole.position
    wrong = WalPosition(pos.salt1, pos.salt2, 1, (1, 2), pos.page_size, pos.checkpoint_seq)
    s = scan_frames(bytes(wal[frame_offset(2, h.page_size):]), wrong, big_endian=h.big_endian)
    assert not s.frames and s.end == "checksum"


def test_checksum_both_endiannesses() -> None:
    data = bytes(range(16))
    le = wal_checksum(data, (0, 0), False)
    be = wal_checksum(data, (0, 0), True)
    assert le != be
    x = struct.unpack(">4I", data)
    s1 = x[0]
    s2 = x[1] + s1
    s1 = (s1 + x[2] + s2) & 0xFFFFFFFF
    s2 = (s2 + x[3] + s1) & 0xFFFFFFFF
    assert be == (s1, s2)
    with pytest.raises(ValueError):
        wal_checksum(b"123", (0, 0), False)


def _reset_case(tmp_path: Path, *, writes_after_ship: int, writes_after_reset: int):
    """A log shipped to a position, then maybe more commits, then a checkpoint and a reset: what the sender sees."""
    db = _writer(tmp_path / "a.db")
    for _ in range(20):
        _insert(db, 10)
    walp = tmp_path / "a.db-wal"
    wal = walp.read_bytes()
    h, shipped = _scan_all(wal)
    size_then = len(wal)
    for _ in range(writes_after_ship):
        _insert(db, 10)
    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    for _ in range(writes_after_reset):
        _insert(db, 1)
    now = walp.read_bytes()
    db.close()
    return shipped.position, h, now, size_then


def _outcome(pos: WalPosition, now: bytes, size_then: int) -> tuple[str, object]:
    h2 = parse_wal_header(now)
    new = scan_frames(now[32:], WalPosition.start_of(h2), big_endian=h2.big_endian)
    off = frame_offset(pos.frames + 1, pos.page_size)
    tail = scan_frames(now[off:], pos, big_endian=h2.big_endian)
    first = struct.unpack(">II", now[off + 8:off + 16]) if len(now) >= off + 24 else None
    return reset_outcome(pos, h2, new_frames=new.position.frames, old_tail=tail, tail_first_salts=first,
                         shrank=len(now) < size_then), tail


def test_reset_after_everything_shipped_loses_nothing(tmp_path: Path) -> None:
    pos, h, now, size_then = _reset_case(tmp_path, writes_after_ship=0, writes_after_reset=2)
    assert parse_wal_header(now).salt1 == h.salt1 + 1
    outcome, tail = _outcome(pos, now, size_then)
    assert outcome == "continue" and not tail.frames


def test_reset_with_an_unshipped_tail_recovers_it(tmp_path: Path) -> None:
    pos, _, now, size_then = _reset_case(tmp_path, writes_after_ship=3, writes_after_reset=2)
    outcome, tail = _outcome(pos, now, size_then)
    assert outcome == "continue"
    assert sum(1 for f in tail.frames if f.commit_pages) == 3


def test_reset_whose_new_log_overwrote_the_tail_needs_a_snapshot(tmp_path: Path) -> None:
    pos, _, now, size_then = _reset_case(tmp_path, writes_after_ship=2, writes_after_reset=200)
    outcome, _ = _outcome(pos, now, size_then)
    assert outcome == "snapshot:overwritten"


def test_truncated_log_needs_a_snapshot(tmp_path: Path) -> None:
    db = _writer(tmp_path / "a.db")
    for _ in range(20):
        _insert(db, 10)
    walp = tmp_path / "a.db-wal"
    wal = walp.read_bytes()
    _, shipped = _scan_all(wal)
    _insert(db, 10)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _insert(db, 1)
    now = walp.read_bytes()
    db.close()
    outcome, _ = _outcome(shipped.position, now, len(wal))
    assert outcome in ("snapshot:truncated", "snapshot:overwritten")


def test_page_size_and_several_resets(tmp_path: Path) -> None:
    db = _writer(tmp_path / "a.db")
    _insert(db, 10)
    wal = (tmp_path / "a.db-wal").read_bytes()
    h, scan = _scan_all(wal)
    pos = scan.position
    other = WalPosition(pos.salt1 - 2, pos.salt2, pos.frames, pos.checksum, pos.page_size, pos.checkpoint_seq)
    assert reset_outcome(other, h, new_frames=0, old_tail=None, tail_first_salts=None,
                         shrank=False) == "snapshot:several_resets"
    big = WalPosition(pos.salt1 - 1, pos.salt2, pos.frames, pos.checksum, 8192, pos.checkpoint_seq)
    assert reset_outcome(big, h, new_frames=0, old_tail=None, tail_first_salts=None,
                         shrank=False) == "snapshot:page_size"
    db.close()


def _synthetic_log(big_endian: bool, pages: list[tuple[int, int, bytes]], page_size: int = 1024) -> bytes:
    """A log written by the format's rules (as a big-endian machine would write one), checksums by the reference
    :func:`wal_checksum`."""
    magic = 0x377F0683 if big_endian else 0x377F0682
    head = struct.pack(">6I", magic, 3007000, page_size, 7, 0x11111111, 0x22222222)
    s = wal_checksum(head, (0, 0), big_endian)
    out = [head + struct.pack(">2I", *s)]
    for pgno, commit, page in pages:
        fh = struct.pack(">4I", pgno, commit, 0x11111111, 0x22222222)
        s = wal_checksum(fh[:8], s, big_endian)
        s = wal_checksum(page, s, big_endian)
        out.append(fh + struct.pack(">2I", *s) + page)
    return b"".join(out)


@pytest.mark.parametrize("big_endian", [False, True])
def test_vectorised_checksums_match_the_reference_in_both_byte_orders(big_endian: bool) -> None:
    import random
    rnd = random.Random(7)
    pages = [(rnd.randrange(1, 50), 0 if i % 3 else 50, rnd.randbytes(1024)) for i in range(2500)]
    wal = _synthetic_log(big_endian, pages)
    h = parse_wal_header(wal)
    assert h.big_endian is big_endian and h.page_size == 1024
    scan = scan_frames(wal[32:], WalPosition.start_of(h), big_endian=big_endian)
    assert scan.end == "eof" and len(scan.frames) == 2500 and scan.pending == 0
    assert [f.page for f in scan.frames] == [p for _, _, p in pages]
    # read with the other byte order, the first frame's checksum does not continue
    other = scan_frames(wal[32:], WalPosition.start_of(h), big_endian=not big_endian)
    assert not other.frames and other.end == "checksum"


def test_mutated_logs_end_early_and_never_raise_anything_else(tmp_path: Path) -> None:
    """300 seeded mutations of a real log (bytes flipped, cut, spliced): the header parses or raises
    WalFormatError, and the committed frames found are always a prefix of the real ones, byte for byte."""
    import random
    db = _writer(tmp_path / "a.db")
    for _ in range(6):
        _insert(db, 10)
    wal = (tmp_path / "a.db-wal").read_bytes()
    db.close()
    h, real = _scan_all(wal)
    rnd = random.Random(40)
    for _ in range(300):
        bad = bytearray(wal)
        kind = rnd.randrange(3)
        if kind == 0:
            for _ in range(rnd.randrange(1, 4)):
                bad[rnd.randrange(len(bad))] ^= 1 << rnd.randrange(8)
        elif kind == 1:
            del bad[rnd.randrange(len(bad)):]
        else:
            i, j = sorted(rnd.randrange(len(bad)) for _ in range(2))
            bad[i:j] = rnd.randbytes(j - i)
        try:
            hh = parse_wal_header(bytes(bad))
        except WalFormatError:
            continue
        scan = scan_frames(bytes(bad[32:]), WalPosition.start_of(hh), big_endian=hh.big_endian)
        assert len(scan.frames) <= len(real.frames)
        assert all(f == g for f, g in zip(scan.frames, real.frames, strict=False))
