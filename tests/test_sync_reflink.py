"""Versions in place on the receiver (issue 40, item 2): a new version shares the replica's unchanged blocks by
reflink where the file system allows, copies them elsewhere; block sizes and a replica's block hashes survive a
restart.

The XFS tests need root, loop devices and ``mkfs.xfs`` (``.ci/run`` installs ``xfsprogs``); without them they
skip, saying why. The 1 GiB run is ``bench/sync_reflink.py``.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

import cowfs
import pytest
from cowfs import Version

from p2pnode.statefiles import report_for
from p2pnode.sync import PushItem, ReplicaStore
from p2pnode.sync import _index as index_mod
from p2pnode.sync import _partial as partial_mod
from p2pnode.sync._blocksizes import BLOCK_SIZES_FILE, BlockSizeBook
from p2pnode.sync._reflink import clone_block_bytes, clone_file, clone_range
from p2pnode.sync._source import LocalFiles
from p2pnode.sync._store import FREE_SPACE_MARGIN_BYTES
from p2pnode.synccore import Manifest, hash_block
from p2pnode.synccore import _manifest as manifest_mod

MiB = 2**20
METADATA_BYTES = 256 * 1024
"""Writes allowed beside the change: the partial's state file, the replica index, the replica's block hashes."""


def _loop_fs(kind: str, tmp_path_factory):
    why = cowfs.why_no_loop_fs(kind)
    if why is not None:
        pytest.skip(f"no loop-mounted {kind} here: {why}")
    try:
        with cowfs.loop_fs(kind, tmp_path_factory.mktemp(kind)) as mnt:
            yield mnt
    except cowfs.LoopFsError as exc:
        pytest.skip(f"no loop-mounted {kind} here: {exc}")


@pytest.fixture(scope="module")
def xfs(tmp_path_factory):
    yield from _loop_fs("xfs", tmp_path_factory)


@pytest.fixture(scope="module")
def ext4(tmp_path_factory):
    yield from _loop_fs("ext4", tmp_path_factory)


def _grown_and_changed(base: int) -> list[Version]:
    """A file of ``base`` bytes, then grown by 1 MiB, then with 1 MiB in its middle changed."""
    return [Version(1, base), Version(1, base + MiB), Version(1, base + MiB, (base // MiB // 2,))]


def test_on_xfs_a_grown_or_changed_version_writes_only_the_change(xfs):
    base = 256 * MiB + 777  # its last block is short: growing rewrites it
    versions = _grown_and_changed(base)
    v1, grown, changed = cowfs.receive_versions(xfs / "grow", versions)
    assert [r["status"] for r in (v1, grown, changed)] == ["committed"] * 3
    print(f"\nreflink on XFS, {base / MiB:.0f} MiB: grown by 1 MiB wrote {grown['write_bytes'] / MiB:.2f} MiB, 1 MiB "
          f"changed wrote {changed['write_bytes'] / MiB:.2f} MiB (the first version {v1['write_bytes'] / MiB:.0f} "
          "MiB)", file=sys.stderr)
    bs = grown["block_size"]
    assert grown["need_bytes"] == MiB + 777  # the new MiB and the old short block
    assert grown["cloned"] == base - 777 and grown["copied"] == 0  # every full block shared, none copied
    assert grown["write_bytes"] <= 2 * MiB + METADATA_BYTES
    assert changed["need_blocks"] == MiB // bs and changed["cloned"] == grown["size"] - MiB
    assert changed["write_bytes"] <= 2 * MiB + METADATA_BYTES
    assert cowfs.check_replica(cowfs.replica_path(xfs / "grow"), versions[-1])


@pytest.mark.parametrize("where", ["ext4", "tmp"])
def test_without_reflink_the_copy_gives_the_same_bytes(where, request, tmp_path):
    root = request.getfixturevalue("ext4") / "copy" if where == "ext4" else tmp_path
    base = 64 * MiB + 777
    versions = _grown_and_changed(base)
    v1, grown, changed = cowfs.receive_versions(root, versions)
    assert [r["status"] for r in (v1, grown, changed)] == ["committed"] * 3
    assert grown["cloned"] + grown["copied"] == base - 777  # every full block carried, one way or the other
    assert changed["cloned"] + changed["copied"] == grown["size"] - MiB
    if where == "ext4":  # ext4 cannot share blocks: each carried block is copied, so written
        assert grown["cloned"] == 0 and grown["write_bytes"] >= base - 777
    assert cowfs.check_replica(cowfs.replica_path(root), versions[-1])


def test_clone_range_shares_aligned_ranges_and_refuses_the_rest(xfs, tmp_path):
    d = xfs / "unit"
    d.mkdir()
    data = os.urandom(3 * MiB + 100)
    (d / "src").write_bytes(data)
    src = os.open(d / "src", os.O_RDONLY)
    dst = os.open(d / "dst", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        bs = clone_block_bytes(dst)
        os.ftruncate(dst, len(data))
        assert clone_range(src, bs, dst, 3 * bs, 2 * bs)  # aligned: shared
        assert os.pread(dst, 2 * bs, 3 * bs) == data[bs:3 * bs]
        assert not clone_range(src, 1, dst, 0, bs)  # an unaligned offset is not tried
        assert not clone_range(src, 0, dst, 0, bs + 1)  # an unaligned length short of the source's end
        assert os.pread(dst, bs, 0) == bytes(bs)  # nothing was written by the refusals
        assert clone_range(src, MiB, dst, MiB, len(data) - MiB)  # an unaligned length up to both ends of file
        assert os.pread(dst, len(data) - MiB, MiB) == data[MiB:]
        assert clone_file(src, dst) and os.pread(dst, len(data) + 1, 0) == data
        bad = os.open(d / "src", os.O_RDONLY)
        os.close(bad)
        with pytest.raises(OSError):  # not "cannot clone": a real error is raised, never a silent fallback
            clone_range(bad, 0, dst, 0, bs)
    finally:
        os.close(src)
        os.close(dst)
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT, 0o644)  # another file system: EXDEV
    src = os.open(d / "src", os.O_RDONLY)
    try:
        os.ftruncate(other, len(data))
        assert not clone_range(src, 0, other, 0, MiB) and not clone_file(src, other)
    finally:
        os.close(src)
        os.close(other)


def test_on_ext4_clone_is_refused_and_nothing_written(ext4):
    d = ext4 / "unit"
    d.mkdir()
    (d / "src").write_bytes(os.urandom(MiB))
    src = os.open(d / "src", os.O_RDONLY)
    dst = os.open(d / "dst", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(dst, MiB)
        assert not clone_range(src, 0, dst, 0, MiB) and not clone_file(src, dst)
        assert os.pread(dst, MiB, 0) == bytes(MiB)
    finally:
        os.close(src)
        os.close(dst)


@pytest.mark.parametrize("kind", ["xfs", "ext4"])
def test_a_new_version_asks_for_free_space_only_for_what_it_does_not_share(kind, request):
    d = request.getfixturevalue(kind) / "space"
    free = [2**40]
    store = ReplicaStore(d, free_bytes=lambda: free[0])
    assert store.clones is (kind == "xfs")  # probed at start
    v1 = os.urandom(32 * MiB + 5)
    assert _push(store, v1, 1)["status"] == "committed"
    free[0] = FREE_SPACE_MARGIN_BYTES + 2 * MiB  # room for the change and the margin, not for a second copy
    r = _push(store, v1 + os.urandom(MiB), 2)
    if kind == "xfs":
        assert r["status"] == "committed" and store.bytes_cloned == 32 * MiB
    else:
        assert r["status"] == "rejected" and r["reason"] == "no_space"
    assert not list(d.glob(".sync/incoming/.clone-probe-*"))  # the probe's files are gone


def test_a_resumed_partial_file_s_clones_are_not_counted_twice(xfs):
    d = xfs / "resume-space"
    free = [2**40]
    v1 = os.urandom(32 * MiB)
    assert _push(ReplicaStore(d, free_bytes=lambda: free[0]), v1, 1)["status"] == "committed"
    v2 = v1 + os.urandom(8 * MiB)
    m2 = _manifest(v2, 128 * 1024)
    assert ReplicaStore(d).apply("o1", PushItem("big.bin", m2, 2, []))["status"] == "need"  # cloned, then a restart
    free[0] = FREE_SPACE_MARGIN_BYTES + 4 * MiB  # less than the 8 MiB still to come
    r = ReplicaStore(d, free_bytes=lambda: free[0]).apply("o1", PushItem("big.bin", m2, 2, []))
    assert r["status"] == "rejected" and r["reason"] == "no_space"
    free[0] = FREE_SPACE_MARGIN_BYTES + 9 * MiB
    assert _push(ReplicaStore(d, free_bytes=lambda: free[0]), v2, 2)["status"] == "committed"


def test_a_partial_file_s_clones_do_not_count_as_room_for_a_version_that_changes_them(xfs):
    d = xfs / "cow-space"
    free = [2**40]
    store = ReplicaStore(d, free_bytes=lambda: free[0])
    v1 = os.urandom(32 * MiB)
    assert _push(store, v1, 1)["status"] == "committed"
    v2 = v1 + os.urandom(MiB)
    assert store.apply("o1", PushItem("big.bin", _manifest(v2, BS), 2, []))["status"] == "need"  # 32 MiB cloned
    assert store.bytes_cloned == 32 * MiB
    v3 = os.urandom(24 * MiB) + v2[24 * MiB:]  # the cloned first 24 MiB change: each write copies (CoW)
    free[0] = FREE_SPACE_MARGIN_BYTES + 12 * MiB  # the partial file allocates 32 MiB, but shares them
    r = store.apply("o1", PushItem("big.bin", _manifest(v3, BS), 3, []))
    assert r["status"] == "rejected" and r["reason"] == "no_space" and r["http_status"] == 507
    free[0] = FREE_SPACE_MARGIN_BYTES + 25 * MiB + BS  # 24 MiB changed, 1 MiB never sent: 25 MiB, once
    assert _push(store, v3, 3)["status"] == "committed"
    assert (d / "replicas/o1/big.bin").read_bytes() == v3


def test_a_block_size_clones_cannot_follow_asks_for_the_whole_file(xfs):
    d = xfs / "small-blocks"
    free = [2**40]
    store = ReplicaStore(d, free_bytes=lambda: free[0])
    bs = store.clone_bytes // 2  # a power of two, but not a multiple of the file system block
    v1 = os.urandom(4 * MiB)
    assert _push(store, v1, 1, bs)["status"] == "committed"
    free[0] = FREE_SPACE_MARGIN_BYTES + 2 * MiB  # room for the change, not for a copy of the replica
    r = _push(store, v1 + os.urandom(MiB), 2, bs)
    assert r["status"] == "rejected" and r["reason"] == "no_space"
    free[0] = FREE_SPACE_MARGIN_BYTES + 6 * MiB
    assert _push(store, v1 + os.urandom(MiB), 2, bs)["status"] == "committed"


def test_a_block_size_not_a_power_of_two_is_a_bad_manifest(tmp_path):
    v = os.urandom(300_000)
    m = _manifest(v, 100_000)
    assert not m.is_consistent() and _manifest(v, 64 * 1024).is_consistent()
    r = ReplicaStore(tmp_path).apply("o1", PushItem("big.bin", m, 1, [(0, v[:100_000])]))
    assert r["status"] == "rejected" and r["reason"] == "bad_manifest"


def _fill(mnt, leave_bytes: int):
    """A file taking all but about ``leave_bytes`` of ``mnt``'s free space (allocated, not written)."""
    filler = mnt / "filler"
    with open(filler, "wb") as fh:
        size = 0
        while True:
            os.fsync(fh.fileno())
            st = os.statvfs(mnt)
            free = st.f_bavail * st.f_frsize
            if free <= leave_bytes + MiB:
                return filler
            os.posix_fallocate(fh.fileno(), size, free - leave_bytes)
            size += free - leave_bytes


def test_on_xfs_a_disk_that_fills_mid_version_refuses_no_space_over_http_and_stream(xfs):
    d = xfs / "full"
    store = ReplicaStore(d, free_bytes=lambda: 2**40)  # the check lets it in: the disk fills under it
    v1 = os.urandom(16 * MiB)
    assert _push(store, v1, 1)["status"] == "committed"
    v2 = os.urandom(12 * MiB) + v1[12 * MiB:]
    m2 = _manifest(v2, BS)
    filler = _fill(xfs, 4 * MiB)
    try:
        r = store.apply("o1", PushItem("big.bin", m2, 2, [(i, v2[i * BS:(i + 1) * BS]) for i in range(m2.blocks)]))
        assert r["status"] == "rejected" and r["reason"] == "no_space" and r["http_status"] == 507
        assert store.rejected["no_space"] == 1
        t = store.open_stream("o1", PushItem("big.bin", m2, 2))
        runs = [(0, m2.blocks)]
        a, b = socket.socketpair()
        a.setblocking(False)
        feeder = threading.Thread(target=lambda: b.sendall(v2))
        feeder.start()
        try:
            bad = store.receive_stream(t, runs, a.fileno(), timeout_s=60.0)
        finally:
            feeder.join(60)
            drained = not feeder.is_alive()  # the whole stream was read (the part that did not fit, dropped)
            a.close()  # a sender still blocked gets EPIPE
            b.close()
            feeder.join()
        out = store.finish_stream(t, True, bad)
        assert bad[0].reason == "no_space" and out["http_status"] == 507 and store.rejected["no_space"] == 2
        assert drained and out["status"] == "need" and out["need"]
    finally:
        filler.unlink()
    assert _push(store, v2, 2)["status"] == "committed"  # room again: the blocks still needed, then the commit
    assert (d / "replicas/o1/big.bin").read_bytes() == v2


def test_a_push_of_more_consecutive_blocks_than_iov_max_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(partial_mod, "IOV_MAX", 16)  # the real bound (1,024) at 16 KiB blocks is 16 MiB
    bs = 16 * 1024
    v = os.urandom(50 * bs + 7)
    assert _push(ReplicaStore(tmp_path), v, 1, bs)["status"] == "committed"
    assert (tmp_path / "replicas/o1/big.bin").read_bytes() == v
    v = os.urandom((partial_mod.os.sysconf("SC_IOV_MAX") + 5) * bs)  # and past the kernel's own bound
    monkeypatch.undo()
    assert _push(ReplicaStore(tmp_path), v, 2, bs)["status"] == "committed"
    assert (tmp_path / "replicas/o1/big.bin").read_bytes() == v


# -- restarts ------------------------------------------------------------------------------------------------

BS = 128 * 1024


def _manifest(data: bytes, bs: int):
    return Manifest.build(len(data), bs, b"".join(hash_block(data[i:i + bs]) for i in range(0, len(data), bs)))


def _push(store: ReplicaStore, data: bytes, seq: int, bs: int = 128 * 1024) -> dict:
    m = _manifest(data, bs)
    r = store.apply("o1", PushItem("big.bin", m, seq, []))
    if r["status"] == "need":
        r = store.apply("o1", PushItem("big.bin", m, seq, [(i, data[i * bs:(i + 1) * bs]) for i in r["need"]]))
    return r


def test_after_a_restart_the_replica_s_block_hashes_are_read_back_not_hashed_again(tmp_path, monkeypatch):
    hashed: list[str] = []
    real = index_mod.hash_file
    monkeypatch.setattr(index_mod, "hash_file", lambda p, **kw: (hashed.append(str(p)), real(p, **kw))[1])
    v1 = os.urandom(index_mod.PERSIST_MANIFEST_BYTES + 100)
    assert _push(ReplicaStore(tmp_path), v1, 1)["status"] == "committed"
    store = ReplicaStore(tmp_path)  # a restart
    v2 = v1 + os.urandom(300_000)
    assert _push(store, v2, 2)["status"] == "committed"
    assert hashed == [] and store.blocks_carried == len(v1) // (128 * 1024)  # the kept hashes, checked by the root
    assert (tmp_path / "replicas/o1/big.bin").read_bytes() == v2
    # kept hashes that do not match the record's root are dropped, counted, and the replica is hashed instead
    kept = next((tmp_path / ".sync/manifests/o1").iterdir())
    raw = bytearray(kept.read_bytes())
    raw[5] ^= 1
    kept.write_bytes(bytes(raw))
    store = ReplicaStore(tmp_path)
    v3 = v2 + os.urandom(1000)
    assert _push(store, v3, 3)["status"] == "committed"
    assert len(hashed) == 1 and store.blocks_carried == len(v2) // (128 * 1024)
    assert report_for(tmp_path).count(".sync/manifests", "bad_entry") == 1
    assert (tmp_path / "replicas/o1/big.bin").read_bytes() == v3
    store.retire("o1", "big.bin", _manifest(v3, 128 * 1024).root)
    assert not any((tmp_path / ".sync/manifests/o1").iterdir())  # retired: its hashes go too
    assert _push(store, v3, 4)["status"] == "committed" and any((tmp_path / ".sync/manifests/o1").iterdir())
    (tmp_path / "replicas/o1/big.bin").unlink()  # gone while the node is down
    ReplicaStore(tmp_path)
    assert not any((tmp_path / ".sync/manifests/o1").iterdir())  # hashes no record names are removed at start


def test_a_small_replica_keeps_no_hashes(tmp_path):
    assert _push(ReplicaStore(tmp_path), os.urandom(300_000), 1)["status"] == "committed"
    assert not (tmp_path / ".sync/manifests").exists()


def test_a_grown_file_keeps_its_block_size_across_a_restart(tmp_path, monkeypatch):
    monkeypatch.setattr(manifest_mod, "DESIRED_BLOCKS_PER_FILE", 8)  # the rule's thresholds at 1 MiB, not 250 MiB
    root = tmp_path / "data"
    root.mkdir()
    f = root / "a.bin"
    f.write_bytes(os.urandom(MiB))

    def scan():
        lf = LocalFiles(root, globs=("*.bin",), append_globs=("*.bin",), state_dir=tmp_path / ".sync", settle_s=0)
        return lf, lf.scan(now=2e9)["a.bin"].manifest

    lf, m1 = scan()
    assert m1.block_size == 128 * 1024
    with open(f, "ab") as fh:
        fh.write(os.urandom(MiB // 2))
    assert manifest_mod.block_size_for(f.stat().st_size) == 256 * 1024  # the rule's fresh choice
    assert lf.scan(now=2e9)["a.bin"].manifest.block_size == 128 * 1024  # kept while growing (in memory)
    _, m2 = scan()  # a restart: kept too, from .sync/blocksizes.json
    assert m2.block_size == 128 * 1024 and m2.hashes[:len(m1.hashes)] == m1.hashes
    f.unlink()
    lf.scan(now=2e9)
    assert BlockSizeBook(tmp_path / ".sync").get("a.bin") is None  # gone: forgotten


def test_bad_block_size_entries_are_dropped_and_counted(tmp_path):
    state = tmp_path / ".sync"
    state.mkdir()
    (state / "blocksizes.json").write_text(
        '{"files": [{"path": "a.bin", "block_size": 262144}, {"path": "b.bin", "block_size": 3000},'
        ' {"path": "../c", "block_size": 131072}, {"path": "d", "block_size": 1e300}, "x"]}')
    book = BlockSizeBook(state)
    assert book.get("a.bin") == 262144 and book.get("b.bin") is None and book.get("../c") is None
    assert report_for(tmp_path).count(BLOCK_SIZES_FILE, "bad_entry") == 4
    (state / "blocksizes.json").write_text("[1, 2")
    assert BlockSizeBook(state).get("a.bin") is None
    assert report_for(tmp_path).count(BLOCK_SIZES_FILE, "malformed") == 1


# -- .sync/manifests holds only our files: links are removed, never followed; junk neither crashes nor hangs -----

def _big(tmp_path, seq: int = 1) -> tuple[ReplicaStore, bytes]:
    store = ReplicaStore(tmp_path)
    v = os.urandom(index_mod.PERSIST_MANIFEST_BYTES)
    assert _push(store, v, seq)["status"] == "committed"
    return store, v


def test_symlinks_under_manifests_are_removed_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("x")
    data = tmp_path / "data"
    (data / ".sync/manifests").mkdir(parents=True)
    os.symlink(victim, data / ".sync/manifests/evil-origin")
    os.symlink(victim / "precious.txt", data / ".sync/manifests/evil-key")
    ReplicaStore(data)
    assert [p.name for p in victim.iterdir()] == ["precious.txt"]  # nothing deleted through the link
    assert not (data / ".sync/manifests/evil-origin").is_symlink() and not (data / ".sync/manifests/evil-key").exists()
    assert report_for(data).count(".sync/manifests", "bad_entry") == 2
    # .sync/manifests (or <origin>) a symlink made while the node runs: the hashes are not written through it
    store = ReplicaStore(data)
    (data / ".sync/manifests").rmdir()
    os.symlink(victim, data / ".sync/manifests")
    v = os.urandom(index_mod.PERSIST_MANIFEST_BYTES)
    assert _push(store, v, 1)["status"] == "committed"
    assert [p.name for p in victim.iterdir()] == ["precious.txt"]
    (data / ".sync/manifests").unlink()
    (data / ".sync/manifests").mkdir()
    os.symlink(victim, data / ".sync/manifests/o1")
    assert _push(store, v + b"x", 2)["status"] == "committed"
    assert [p.name for p in victim.iterdir()] == ["precious.txt"]
    ReplicaStore(data)  # a restart removes the link itself
    assert (victim / "precious.txt").exists() and not (data / ".sync/manifests/o1").exists()


def test_junk_under_manifests_neither_crashes_a_push_or_a_retirement_nor_hangs_one(tmp_path):
    from p2pnode.sync._partial import partial_key

    # <origin> a regular file, the replica gone: the push takes it again (no NotADirectoryError)
    store, v = _big(tmp_path / "a")
    kept = tmp_path / "a/.sync/manifests/o1"
    for f in kept.iterdir():
        f.unlink()
    kept.rmdir()
    kept.write_text("junk")
    (tmp_path / "a/replicas/o1/big.bin").unlink()
    assert _push(store, v, 1)["status"] == "committed"
    # <key> a directory: the retirement completes and the index on disk forgets the replica
    store, v = _big(tmp_path / "b")
    key = tmp_path / "b/.sync/manifests/o1" / partial_key("big.bin")
    key.unlink()
    key.mkdir()
    assert store.retire("o1", "big.bin", _manifest(v, BS).root) == len(v)
    assert "big.bin" not in (tmp_path / "b/.sync/replicas.json").read_text()
    # <key> a FIFO made after the start: the first version does not block on it (dropped, counted, hashed)
    _, v = _big(tmp_path / "c")
    store = ReplicaStore(tmp_path / "c")
    key = tmp_path / "c/.sync/manifests/o1" / partial_key("big.bin")
    key.unlink()
    os.mkfifo(key)
    out: list[dict] = []
    th = threading.Thread(target=lambda: out.append(_push(store, v + b"x", 2)), daemon=True)
    th.start()
    th.join(60)
    if th.is_alive():  # release it before failing, so the test process does not hang
        os.close(os.open(key, os.O_WRONLY | os.O_NONBLOCK))
        th.join(60)
        pytest.fail("a FIFO among the kept hashes blocked a push")
    assert out[0]["status"] == "committed"
    assert report_for(tmp_path / "c").count(".sync/manifests", "bad_entry") == 1
