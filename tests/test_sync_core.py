"""Sync cores: manifests, paths, globs, rendezvous targets, receipts, the replica store and every bad input."""

import os
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pnode.guardcore import FileInfo, GuardLimits, plan_cleanup
from p2pnode.identity import Identity
from p2pnode.sync import (
    LocalFiles,
    PushItem,
    ReplicaStore,
    SyncReject,
    decode_push,
    encode_push,
    glob_regex,
    sign_headers,
    verify_headers,
)
from p2pnode.synccore import (
    Manifest,
    PathError,
    ReceiptIndex,
    block_size_for,
    changed_blocks,
    check_rel_path,
    deletable,
    hash_file,
    may_delete,
    plan_targets,
    rendezvous_rank,
)

KiB, MiB, GiB = 1024, 2**20, 2**30


def test_block_size_follows_syncthing_and_keeps_its_size_while_growing():
    assert block_size_for(10 * KiB) == 128 * KiB
    assert block_size_for(250 * MiB) == 128 * KiB  # 2,000 blocks of 128 KiB = 250 MiB
    assert block_size_for(GiB) == MiB
    assert block_size_for(100 * GiB) == 16 * MiB
    assert block_size_for(10 * KiB, floor=16 * KiB) == 16 * KiB
    # a file growing past a boundary keeps its block size while the new choice is within 2x
    assert block_size_for(300 * MiB, previous=128 * KiB) == 128 * KiB
    assert block_size_for(2 * GiB, previous=128 * KiB) == 2 * MiB


def test_append_changes_only_tail_blocks_and_prefix_hash_equals_full_hash(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(os.urandom(1_000_000))
    m1 = hash_file(p, block_size=128 * KiB)
    with open(p, "ab") as fh:
        fh.write(os.urandom(300_000))
    full = hash_file(p, block_size=128 * KiB)
    incremental = hash_file(p, block_size=128 * KiB, prefix=m1)
    assert incremental == full and full.is_consistent()
    # 1,000,000 bytes = 7 full blocks + a partial 8th: the partial one and the new ones change, nothing else
    assert changed_blocks(m1, full) == list(range(7, full.blocks))
    assert changed_blocks(None, full) == list(range(full.blocks))


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b", "a\x00b", "", "a/",
                                 "x" * 256, "a/\nb"])
def test_bad_paths_are_rejected(bad):
    with pytest.raises(PathError):
        check_rel_path(bad)


def test_good_paths_and_globs():
    assert check_rel_path("cfg/games.db") == "cfg/games.db"
    g = glob_regex("**/*.db")
    assert g.match("a.db") and g.match("x/y/a.db") and not g.match("a.db-wal") and not g.match("a.dbx")
    one = glob_regex("*.npz")
    assert one.match("s.npz") and not one.match("x/s.npz")


def test_rendezvous_moves_only_the_dead_members_keys():
    nodes = [f"n{i}" for i in range(8)]
    keys = [f"origin/file{i}" for i in range(500)]
    before = {k: rendezvous_rank(k, nodes)[:2] for k in keys}
    after = {k: rendezvous_rank(k, [n for n in nodes if n != "n3"])[:2] for k in keys}
    for k in keys:
        if "n3" not in before[k]:
            assert after[k] == before[k]
        else:  # the survivor stays; the next in the ranking takes the dead one's place
            survivor = [n for n in before[k] if n != "n3"][0]
            assert survivor in after[k] and after[k][1] == [n for n in rendezvous_rank(k, nodes) if n != "n3"][1]
    # load spreads: every node is a first choice for some keys
    assert {before[k][0] for k in keys} == set(nodes)


def test_plan_targets_fills_up_to_r_skipping_refusing_members():
    ranked = rendezvous_rank("o/f", ["a", "b", "c"])
    assert plan_targets("o/f", confirmed=frozenset(), candidates=["a", "b", "c"], r=2, durable_members=3) == ranked[:2]
    assert plan_targets("o/f", confirmed=frozenset({ranked[0]}), candidates=["a", "b", "c"], r=2,
                        durable_members=3) == [ranked[1]]
    assert plan_targets("o/f", confirmed=frozenset(), candidates=["a", "b", "c"], r=2, durable_members=3,
                        refusing=frozenset({ranked[0]})) == ranked[1:3]
    assert plan_targets("o/f", confirmed=frozenset({"a", "b"}), candidates=["a", "b", "c"], r=2,
                        durable_members=3) == []
    # R is capped by the durable members
    assert plan_targets("o/f", confirmed=frozenset({"a"}), candidates=["a"], r=2, durable_members=1) == []


# -- receipts and the cleaner: property test -------------------------------------------------------------------

DURABLE = ("d1", "d2", "d3")
event = st.one_of(
    st.tuples(st.just("receipt"), st.sampled_from(DURABLE + ("eph",)), st.sampled_from(["current", "old"])),
    st.tuples(st.just("change"), st.just(""), st.just("")),
    st.tuples(st.just("die"), st.sampled_from(DURABLE), st.just("")),
    st.tuples(st.just("revive"), st.sampled_from(DURABLE), st.just("")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=30))
def test_cleaner_never_deletes_below_r_matching_receipts(history):
    """Three durable members, R=2: a file is deleted exactly when two distinct counting durable members confirm
    its current size and root; old versions, non-durable holders and dead members never count."""
    version = 1
    receipts: dict[str, dict[str, tuple[int, bytes]]] = {}
    dead: set[str] = set()
    limits = GuardLimits()
    for kind, who, which in history:
        if kind == "receipt":
            v = version if which == "current" else version - 1
            receipts.setdefault(who, {})["data/f.npz"] = (1000 + v, bytes([v % 256]) * 32)
        elif kind == "change":
            version += 1
        elif kind == "die":
            dead.add(who)
        else:
            dead.discard(who)
        counting = [d for d in DURABLE if d not in dead]
        index = ReceiptIndex(receipts, counting)
        current = (1000 + version, bytes([version % 256]) * 32)
        ok = deletable({"data/f.npz": current}, index, r=2, durable_members=len(DURABLE))
        plan = plan_cleanup([FileInfo("data/f.npz", 1000 + version, 0.0)], used_bytes=95, total_bytes=100,
                            limits=limits, now=1e9, replicated=lambda p, ok=ok: p in ok)
        deleted = any(d.path == "data/f.npz" for d in plan.deletions)
        matching = {h for h in counting if receipts.get(h, {}).get("data/f.npz") == current}
        assert deleted == (len(matching) >= 2), (history, matching)
        assert not deleted or may_delete(len(matching), 2, 3)


def test_deletes_only_after_the_second_receipt():
    cur = (10, b"\x01" * 32)
    idx1 = ReceiptIndex({"d1": {"f": cur}}, DURABLE)
    idx2 = ReceiptIndex({"d1": {"f": cur}, "d2": {"f": cur}}, DURABLE)
    assert deletable({"f": cur}, idx1, r=2, durable_members=3) == set()
    assert deletable({"f": cur}, idx2, r=2, durable_members=3) == {"f"}
    assert deletable({"f": cur}, ReceiptIndex({}, ()), r=2, durable_members=0) == set()


# -- the replica store ------------------------------------------------------------------------------------------

def _items(data: bytes, path="cfg/shard.npz", seq=1, bs=128 * KiB):
    m = hash_file_bytes(data, bs)
    return m, [(i, data[i * bs:(i + 1) * bs]) for i in range(m.blocks)]


def hash_file_bytes(data: bytes, bs: int) -> Manifest:
    from p2pnode.synccore import hash_block

    hashes = b"".join(hash_block(data[i:i + bs]) for i in range(0, len(data), bs))
    return Manifest.build(len(data), bs, hashes)


def test_store_assembles_verifies_and_commits_atomically(tmp_path):
    store = ReplicaStore(tmp_path)
    data = os.urandom(1_000_000)
    m, blocks = _items(data)
    r = store.apply("o1", PushItem("cfg/shard.npz", m, 1, blocks[:3]))
    assert r["status"] == "need" and r["need"] == list(range(3, m.blocks))
    assert not (tmp_path / "replicas" / "o1" / "cfg" / "shard.npz").exists()  # nothing partial in place
    r = store.apply("o1", PushItem("cfg/shard.npz", m, 1, blocks[3:]))
    assert r["status"] == "committed"
    assert (tmp_path / "replicas" / "o1" / "cfg" / "shard.npz").read_bytes() == data
    assert store.apply("o1", PushItem("cfg/shard.npz", m, 1, []))["status"] == "have"
    assert store.receipts(10) == {"o1": [["cfg/shard.npz", len(data), m.root]]}
    assert list((tmp_path / ".sync" / "incoming" / "o1").iterdir()) == []
    # the index survives a restart
    assert ReplicaStore(tmp_path).receipts(10) == store.receipts(10)


def test_corrupted_block_is_rejected_not_written_and_asked_again(tmp_path):
    store = ReplicaStore(tmp_path)
    data = os.urandom(600_000)
    m, blocks = _items(data)
    bad = bytearray(blocks[2][1])
    bad[100] ^= 0xFF
    sent = blocks[:2] + [(2, bytes(bad))] + blocks[3:]
    r = store.apply("o1", PushItem("cfg/shard.npz", m, 1, sent))
    assert r["status"] == "need" and r["need"] == [2] and r["http_status"] == 422
    assert r["rejected_blocks"][0]["reason"] == "bad_block_hash" and store.rejected["bad_block_hash"] == 1
    assert store.apply("o1", PushItem("cfg/shard.npz", m, 1, [blocks[2]]))["status"] == "committed"
    assert (tmp_path / "replicas" / "o1" / "cfg" / "shard.npz").read_bytes() == data


@pytest.mark.parametrize("path", ["../escape.npz", "/etc/escape.npz", "a/../../escape.npz"])
def test_path_traversal_is_rejected_and_nothing_written_outside(tmp_path, path):
    store = ReplicaStore(tmp_path / "node")
    m, blocks = _items(os.urandom(1000))
    r = store.apply("o1", PushItem(path, m, 1, blocks))
    assert r["status"] == "rejected" and r["reason"] == "path_escape" and r["http_status"] == 400
    assert not list(tmp_path.rglob("escape.npz"))


def test_symlink_component_is_rejected(tmp_path):
    store = ReplicaStore(tmp_path / "node")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "node" / "replicas" / "o1").mkdir(parents=True)
    os.symlink(outside, tmp_path / "node" / "replicas" / "o1" / "cfg")
    m, blocks = _items(os.urandom(1000))
    r = store.apply("o1", PushItem("cfg/x.npz", m, 1, blocks))
    assert r["status"] == "rejected" and r["reason"] == "path_escape"
    assert list(outside.iterdir()) == []


def test_out_of_range_bad_length_bad_manifest_and_stale_version(tmp_path):
    store = ReplicaStore(tmp_path)
    data = os.urandom(300_000)
    m, blocks = _items(data)
    r = store.apply("o1", PushItem("f.npz", m, 5, [(99, blocks[0][1]), (0, blocks[0][1][:10])]))
    assert [b["reason"] for b in r["rejected_blocks"]] == ["block_out_of_range", "bad_block_length"]
    forged = Manifest(m.size, m.block_size, m.hashes, b"\x00" * 32)
    assert store.apply("o1", PushItem("f.npz", forged, 5, blocks))["reason"] == "bad_manifest"
    assert store.apply("o1", PushItem("f.npz", m, 5, blocks))["status"] == "committed"
    m2, blocks2 = _items(os.urandom(300_000))
    assert store.apply("o1", PushItem("f.npz", m2, 4, blocks2))["reason"] == "stale_version"
    assert (tmp_path / "replicas" / "o1" / "f.npz").read_bytes() == data


def test_resume_after_restart_keeps_blocks_on_disk_and_appends_send_only_the_tail(tmp_path):
    data = os.urandom(2_000_000)
    m, blocks = _items(data)
    store = ReplicaStore(tmp_path)
    store.apply("o1", PushItem("g.jsonl", m, 1, blocks[:9]))
    # "kill -9": a fresh store on the same dir finds the 9 verified blocks on disk
    store = ReplicaStore(tmp_path)
    r = store.apply("o1", PushItem("g.jsonl", m, 1, []))
    assert r["need"] == list(range(9, m.blocks)) and store.blocks_carried == 9
    assert store.apply("o1", PushItem("g.jsonl", m, 1, blocks[9:]))["status"] == "committed"
    # an append: the replica's blocks are carried over, only the tail is needed
    data2 = data + os.urandom(50_000)
    m2, blocks2 = _items(data2)
    r = store.apply("o1", PushItem("g.jsonl", m2, 2, []))
    assert r["need"] == changed_blocks(m, m2) == [m.blocks - 1]
    assert store.apply("o1", PushItem("g.jsonl", m2, 2, [blocks2[-1]]))["status"] == "committed"
    assert (tmp_path / "replicas" / "o1" / "g.jsonl").read_bytes() == data2


def test_push_body_round_trip_and_malformed_bodies():
    data = os.urandom(300_000)
    m, blocks = _items(data)
    body = encode_push([PushItem("a/b.npz", m, 3, blocks[:2], True, "sealed")])
    (it,) = decode_push(body)
    assert it.path == "a/b.npz" and it.manifest == m and it.seq == 3
    assert [(i, bytes(d)) for i, d in it.blocks] == blocks[:2]
    for bad in (b"", b"\x00\x00\x00\x09abc", body[:-1], body + b"x", b"\x00\x00\x00\x01\xc1"):
        with pytest.raises(SyncReject) as exc:
            decode_push(bad)
        assert exc.value.reason == "malformed"


def test_request_signatures():
    me, other = Identity.generate(), Identity.generate()
    m, blocks = _items(os.urandom(1000))
    body = encode_push([PushItem("a.npz", m, 1, blocks)])
    h = sign_headers(me, "POST", "/sync/push", body, now=1000.0)
    keys = {me.node_id: me.public_key}
    assert verify_headers(h, "POST", "/sync/push", body, key_of=keys.get, now=1001.0, max_skew_s=300) == me.node_id
    # the signature covers the header (manifests, so the block hashes); blocks are checked against those hashes
    tampered = bytearray(body)
    tampered[10] ^= 1
    cases = [
        (h, bytes(tampered), keys, 1001.0, "bad_signature"),  # tampered header
        (h, body, {}, 1001.0, "not_member"),
        (h, body, keys, 2000.0, "bad_signature"),  # outside the clock-skew window
        (sign_headers(other, "POST", "/sync/push", body, now=1000.0) | {"x-p2pnode-origin": me.node_id}, body, keys,
         1001.0, "bad_signature"),  # signed by someone else
    ]
    for headers, b, k, now, reason in cases:
        with pytest.raises(SyncReject) as exc:
            verify_headers(headers, "POST", "/sync/push", b, key_of=k.get, now=now, max_skew_s=300)
        assert exc.value.reason == reason


def test_local_files_classes_sqlite_backup_and_settle(tmp_path):
    root = tmp_path / "data"
    (root / "cfg").mkdir(parents=True)
    con = sqlite3.connect(root / "cfg" / "games.db")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE g (id INTEGER PRIMARY KEY, moves BLOB)")
    con.executemany("INSERT INTO g (moves) VALUES (?)", [(os.urandom(200),) for _ in range(200)])
    con.commit()
    (root / "cfg" / "log.jsonl").write_text('{"a": 1}\n')
    (root / "cfg" / "fresh.npz").write_bytes(b"x" * 100)
    (root / "cfg" / ".hidden.npz").write_bytes(b"x")
    lf = LocalFiles(root, globs=("**/*.db", "**/*.npz", "**/*.jsonl"), append_globs=("**/*.jsonl",),
                    state_dir=tmp_path / ".sync", settle_s=60.0)
    files = lf.scan(now=os.stat(root / "cfg" / "fresh.npz").st_mtime + 1)
    assert {p: f.cls for p, f in files.items()} == {"cfg/games.db": "sqlite", "cfg/log.jsonl": "append"}
    db = files["cfg/games.db"]
    assert db.read_path != root / "cfg" / "games.db" and db.manifest.block_size == 16 * KiB
    copy = sqlite3.connect(f"file:{db.read_path}?mode=ro", uri=True)
    assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert copy.execute("SELECT count(*) FROM g").fetchone() == (200,)
    copy.close()
    seq = db.seq
    con.execute("INSERT INTO g (moves) VALUES (?)", (os.urandom(200),))
    con.commit()
    files = lf.scan(now=1e12)
    assert files["cfg/games.db"].seq > seq and "cfg/fresh.npz" in files  # settled now
    changed = changed_blocks(db.manifest, files["cfg/games.db"].manifest)
    assert 0 < len(changed) <= 3  # one row: the page it lands on and the header page, not the database
    # one staging copy per version: the old one is gone (a transfer that had not opened it fails instead of
    # sending the new version's bytes under the old manifest), the new one matches the new manifest
    new = files["cfg/games.db"]
    assert not db.read_path.exists() and new.read_path != db.read_path
    assert hash_file(new.read_path, block_size=new.manifest.block_size) == new.manifest
    assert sorted(p.name for p in (tmp_path / ".sync" / "staging").iterdir()) == [new.read_path.name]
    con.close()
    # a restart starts from a clean staging folder
    LocalFiles(root, globs=("**/*.db",), append_globs=(), state_dir=tmp_path / ".sync", settle_s=60.0)
    assert list((tmp_path / ".sync" / "staging").iterdir()) == []


def test_receipts_fit_the_snapshot_and_stale_partials_expire(tmp_path):
    store = ReplicaStore(tmp_path)
    for k in range(80):
        path = f"{'d' * 200}/{k:03d}-{'f' * 200}.npz"
        m, blocks = _items(os.urandom(100))
        assert store.apply("o1", PushItem(path, m, k + 1, blocks))["status"] == "committed"
    rec = store.receipts(256)["o1"]
    assert 40 < len(rec) < 80 and sum(len(r[0]) + 48 for r in rec) <= 24 * 1024
    assert rec[0][0].startswith("d" * 200 + "/079")  # newest first
    m, blocks = _items(os.urandom(400_000))
    store.apply("o2", PushItem("p.npz", m, 1, blocks[:1]))
    assert store.expire_partials(3600, now=__import__("time").time()) == 0
    assert store.expire_partials(3600, now=__import__("time").time() + 7200) == 1
    assert not list((tmp_path / ".sync" / "incoming").rglob("*.part"))
    # the origin offers again: it starts over
    assert store.apply("o2", PushItem("p.npz", m, 1, []))["need"] == list(range(m.blocks))


def test_token_bucket_paces_to_the_rate_with_one_request_of_burst():
    from p2pnode.sync import TokenBucket

    b = TokenBucket(rate=10 * MiB, burst=MiB)
    assert b.take(MiB, now=0.0) == 0.0  # the burst
    wait = b.take(MiB, now=0.0)
    assert wait == pytest.approx(0.1)  # 1 MiB more at 10 MiB/s
    assert b.take(MiB, now=0.1 + wait) == pytest.approx(0.0, abs=1e-9)
    assert TokenBucket(rate=0, burst=MiB).take(100 * MiB, now=0.0) == 0.0  # no cap
