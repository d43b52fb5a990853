"""The job archive (issue 41, item 5): the pure rules (:mod:`p2pnode.synccore._jobarchive`), the writer on the node
that ran the jobs (:class:`p2pnode.jobs._archive.JobArchive`, over a real job history and log files), the reader
on a durable node (:class:`p2pnode.sync._jobreplicas.ArchivedJobs`, over a real replica store fed by pushes) and
the source's matcher (the archive syncs whatever ``sync.globs`` says). Agents: tests/test_jobarchive_agents.py."""

from __future__ import annotations

import os
import time

import msgspec
import pytest

from p2pnode.jobs._archive import JobArchive
from p2pnode.jobs._history import JobHistory
from p2pnode.sync import PushItem, ReplicaStore
from p2pnode.sync._jobreplicas import ArchivedJobs
from p2pnode.sync._source import LocalFiles
from p2pnode.synccore import (
    ARCHIVE_DIR,
    MAX_RUN_BYTES,
    ArchivedRun,
    Manifest,
    archive_paths,
    archived_job,
    decode_run,
    encode_run,
    hash_block,
    merge_runs,
    prune_archive,
)


def _run(job_id: str = "7-1", **kw) -> ArchivedRun:
    base = dict(job_id=job_id, template="t", config="c", kind="selfplay", node_id="writer", term=7,
                started_at=100.0, ended_at=160.0, exit_status=3, reason="failed with status 3", outcome="failed")
    return ArchivedRun(**{**base, **kw})


# -- the pure rules ------------------------------------------------------------------------------------------------
def test_paths_come_from_job_ids_only():
    assert archive_paths("run-ab12") == (f"{ARCHIVE_DIR}/run-ab12.log", f"{ARCHIVE_DIR}/run-ab12.run")
    for bad in ("../x", "a/b", "", ".hidden", "x" * 200, "a\nb"):
        with pytest.raises(ValueError):
            archive_paths(bad)
    assert archived_job(f"{ARCHIVE_DIR}/7-1.run") == ("7-1", "run")
    assert archived_job(f"{ARCHIVE_DIR}/7-1.log") == ("7-1", "log")
    for other in (f"{ARCHIVE_DIR}/7-1.txt", f"{ARCHIVE_DIR}/sub/7-1.run", "7-1.run", f"x/{ARCHIVE_DIR}/7-1.run",
                  f"{ARCHIVE_DIR}/.7-1.run.tmp.1", f"{ARCHIVE_DIR}/-x.run"):
        assert archived_job(other) is None, other


def test_a_record_is_decoded_bounded_and_its_node_is_the_origin():
    data = encode_run(_run())
    got = decode_run(data, job_id="7-1", origin="origin-node")
    assert got.node_id == "origin-node" and got.exit_status == 3 and got.reason == "failed with status 3"
    for data, job_id, reason in [
        (b"\x00" * (MAX_RUN_BYTES + 1), None, "oversized"),
        (b"not msgpack \xc1", None, "malformed"),
        (msgspec.msgpack.encode({"job_id": "7-1"}), None, "malformed"),  # fields missing
        (msgspec.msgpack.encode({**msgspec.structs.asdict(_run()), "term": 2**64 - 1}), None, "malformed"),
        (msgspec.msgpack.encode({**msgspec.structs.asdict(_run()), "template": "a\x00b"}), None, "malformed"),
        (encode_run(_run("7-2")), "7-1", "mismatch"),
    ]:
        with pytest.raises(ValueError, match=f"^{reason}"):
            decode_run(data, job_id=job_id)


def test_prune_takes_the_oldest_ends_first_until_the_bound_holds():
    entries = [("c", 30.0, 40), ("a", 10.0, 40), ("b", 20.0, 40)]
    assert prune_archive(entries, max_bytes=120) == []
    assert prune_archive(entries, max_bytes=100) == ["a"]
    assert prune_archive(entries, max_bytes=40) == ["a", "b"]
    assert prune_archive(entries, max_bytes=0) == []  # no bound
    assert prune_archive(entries, max_bytes=0, max_runs=2) == ["a"]
    assert prune_archive(entries, max_bytes=100, max_runs=1) == ["a", "b"]


def test_merge_keeps_one_run_per_node_and_job_the_first_group_winning():
    own = [{"node_id": "n1", "job_id": "1-1", "started_at": 5.0, "source": "local"}]
    held = [{"node_id": "n1", "job_id": "1-1", "started_at": 5.0, "source": "replica"},
            {"node_id": "n2", "job_id": "1-1", "started_at": 9.0, "source": "replica"},
            {"node_id": "n2", "job_id": "1-2", "started_at": 1.0, "source": "replica"}]
    got = merge_runs([own, held], 10)
    assert [(r["node_id"], r["job_id"], r["source"]) for r in got] == [
        ("n2", "1-1", "replica"), ("n1", "1-1", "local"), ("n2", "1-2", "replica")]
    assert len(merge_runs([own, held], 2)) == 2


# -- the writer ----------------------------------------------------------------------------------------------------
def _history(tmp_path, runs):
    """A job history with ``runs``: (job id, started at, ended at or None, exit status)."""
    h = JobHistory(tmp_path / "jobs.db")
    for job_id, start, end, status in runs:
        h.started(job_id=job_id, template="t", config="c", kind="selfplay", node_id="me", term=1, at=start)
        if end is not None:
            h.ended(job_id, at=end, exit_status=status, peak_rss_bytes=0, reason=f"failed with status {status}",
                    outcome="failed")
    return h


def test_the_writer_archives_ended_runs_once_with_their_log_tail(tmp_path):
    logs, root = tmp_path / "logs", tmp_path / "data"
    logs.mkdir()
    (logs / "1-1.log").write_bytes(b"A" * 1000 + b"the end\n")
    (logs / "1-2.log").write_bytes(b"short\n")
    (logs / "1-3.log").write_bytes(b"still running\n")
    h = _history(tmp_path, [("1-1", 10.0, 20.0, 3), ("1-2", 11.0, 21.0, 0), ("1-3", 12.0, None, None)])
    a = JobArchive(root=root, logs_dir=logs, log_bytes=100, max_bytes=0)
    assert a.catch_up(h.recent(256)) == 2 and a.errors == 0
    d = root / ARCHIVE_DIR
    assert sorted(os.listdir(d)) == ["1-1.log", "1-1.run", "1-2.log", "1-2.run"]  # no temp file left, 1-3 runs
    tail = (d / "1-1.log").read_bytes()
    assert tail.endswith(b"A" * 92 + b"the end\n") and tail.startswith(b"[p2pnode: the first 908 bytes")
    assert (d / "1-2.log").read_bytes() == b"short\n"
    rec = decode_run((d / "1-1.run").read_bytes(), job_id="1-1")
    assert (rec.exit_status, rec.ended_at, rec.log_bytes, rec.log_kept_bytes, rec.node_id) == (3, 20.0, 1008, 100,
                                                                                               "me")
    assert a.catch_up(h.recent(256)) == 0  # idempotent
    (d / "1-2.run").unlink()  # the disk manager's doing, once replicated: not written again before a restart
    (d / "1-2.log").unlink()
    assert a.catch_up(h.recent(256)) == 0
    h.ended("1-3", at=30.0, exit_status=1, peak_rss_bytes=0, reason="failed with status 1")
    assert JobArchive(root=root, logs_dir=logs, log_bytes=100, max_bytes=0).catch_up(h.recent(256)) == 2  # restart
    assert sorted(os.listdir(d)) == ["1-1.log", "1-1.run", "1-2.log", "1-2.run", "1-3.log", "1-3.run"]
    h.close()


def test_the_writer_holds_its_bound_oldest_first_and_never_writes_what_would_go_at_once(tmp_path):
    logs, root = tmp_path / "logs", tmp_path / "data"
    logs.mkdir()
    for i in range(1, 6):
        (logs / f"1-{i}.log").write_bytes(bytes([64 + i]) * 3000)
    h = _history(tmp_path, [(f"1-{i}", 10.0 * i, 10.0 * i + 5, 1) for i in range(1, 4)])
    bound = 2 * (3000 + 600)
    a = JobArchive(root=root, logs_dir=logs, log_bytes=4000, max_bytes=bound)
    a.catch_up(h.recent(256))
    d = root / ARCHIVE_DIR
    assert sorted(os.listdir(d)) == ["1-2.log", "1-2.run", "1-3.log", "1-3.run"]  # 1-1 never written
    for i in (4, 5):
        h.started(job_id=f"1-{i}", template="t", config="c", kind="k", node_id="me", term=1, at=10.0 * i)
        h.ended(f"1-{i}", at=10.0 * i + 5, exit_status=1, peak_rss_bytes=0, reason="failed")
    assert a.catch_up(h.recent(256)) == 2 and a.pruned == 2
    assert sorted(os.listdir(d)) == ["1-4.log", "1-4.run", "1-5.log", "1-5.run"]
    assert a.catch_up(h.recent(256)) == 0  # 1-1..1-3 are older than all that is kept: not written again
    few = JobArchive(root=tmp_path / "few", logs_dir=logs, log_bytes=10, max_bytes=0, max_runs=3)
    assert few.catch_up(h.recent(256)) == 3 and sorted(os.listdir(tmp_path / "few" / ARCHIVE_DIR))[::2] == [
        "1-3.log", "1-4.log", "1-5.log"]  # the count bound: the newest three
    h.close()


def test_the_source_syncs_the_archive_whatever_the_globs_say(tmp_path):
    root = tmp_path / "data"
    (root / ARCHIVE_DIR).mkdir(parents=True)
    (root / ARCHIVE_DIR / "1-1.run").write_bytes(encode_run(_run("1-1")))
    (root / ARCHIVE_DIR / "1-1.log").write_bytes(b"log\n")
    (root / ARCHIVE_DIR / ".1-2.run.tmp.9").write_bytes(b"half")  # a write under way
    (root / ARCHIVE_DIR / "notes.txt").write_bytes(b"x")
    (root / "a.npz").write_bytes(b"x")
    old = time.time() - 60
    for p in root.rglob("*"):
        os.utime(p, (old, old))
    files = LocalFiles(root, globs=("*.npz",), append_globs=(), state_dir=tmp_path / ".sync", settle_s=1.0)
    assert sorted(files.scan(time.time())) == ["a.npz", f"{ARCHIVE_DIR}/1-1.log", f"{ARCHIVE_DIR}/1-1.run"]


# -- the reader ----------------------------------------------------------------------------------------------------
def _push(store: ReplicaStore, origin: str, path: str, data: bytes, seq: int = 1) -> None:
    bs = 128 * 1024
    m = Manifest.build(len(data), bs, b"".join(hash_block(data[i:i + bs]) for i in range(0, len(data), bs)))
    blocks = [(i, data[i * bs:(i + 1) * bs]) for i in range(m.blocks)]
    assert store.apply(origin, PushItem(path, m, seq, blocks))["status"] == "committed"


def test_the_reader_shows_committed_replicas_with_their_origin_and_counts_garbage(tmp_path):
    store = ReplicaStore(tmp_path)
    a = ArchivedJobs(store)
    _push(store, "eph1", f"{ARCHIVE_DIR}/5-1.run", encode_run(_run("5-1", node_id="liar", started_at=50.0)))
    _push(store, "eph1", f"{ARCHIVE_DIR}/5-1.log", b"Traceback: boom\n")
    _push(store, "eph2", f"{ARCHIVE_DIR}/5-2.run", encode_run(_run("5-2", started_at=60.0)))
    _push(store, "eph2", f"{ARCHIVE_DIR}/5-3.run", b"garbage \xc1")
    _push(store, "eph2", f"{ARCHIVE_DIR}/5-4.run", encode_run(_run("9-9")))  # named for another job
    _push(store, "eph2", "data/5-5.run", encode_run(_run("5-5")))  # not the archive
    runs = a.runs(50)
    assert [(r["node_id"], r["job_id"]) for r in runs] == [("eph2", "5-2"), ("eph1", "5-1")]
    assert dict(a.rejected) == {"malformed": 1, "mismatch": 1}
    a.runs(50)
    assert dict(a.rejected) == {"malformed": 1, "mismatch": 1}  # counted once per version
    assert a.log_of("5-1") == ("eph1", tmp_path / "replicas" / "eph1" / ARCHIVE_DIR / "5-1.log")
    assert a.log_of("5-1")[1].read_bytes() == b"Traceback: boom\n"
    assert a.log_of("5-2") is None and a.log_of("../../etc/passwd") is None
    assert len(a.runs(1)) == 1
    # a replica changed on disk under its record is not read
    (tmp_path / "replicas" / "eph2" / ARCHIVE_DIR / "5-2.run").write_bytes(b"x")
    assert [r["job_id"] for r in a.runs(50)] == ["5-1"] and a.rejected["unreadable"] == 1
