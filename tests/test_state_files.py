"""State files read back at start never stop the agent (issue 22, item 2): each file is decoded by one typed
decoder; a bad entry is dropped with one logged, counted reason and the rest loads. Unit tests per file with hostile
content (non-ASCII digits, 400-digit integers, NaN/Infinity, control characters, lone surrogates, wrong types,
garbage), then one real agent whose every state file is planted with hostile content while it is stopped."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from agents import AgentProc, free_port, wait_until

from p2pnode.discovery import load_peers, save_peers
from p2pnode.errors import IdentityError
from p2pnode.identity import COUNTER_MAX as IDENTITY_COUNTER_MAX
from p2pnode.identity import PersistentCounter
from p2pnode.jobs._history import JobHistory
from p2pnode.jobs._ledger import JobLedger, LedgerEntry, exit_status_of
from p2pnode.keyring import Keyring, KeyringError, key_id_of
from p2pnode.node._operator import IntentStore, InvalidIntent
from p2pnode.node._persist import load_keyring
from p2pnode.snapshot import COUNTER_MAX
from p2pnode.statefiles import decimal, decode_entries, load_json, open_report, report_for
from p2pnode.sync._index import ReplicaIndex
from p2pnode.sync._partial import partial_key, read_state
from p2pnode.sync._retire import Retirement
from p2pnode.sync._store import ReplicaStore
from p2pnode.synccore import hash_file

BIG = "9" * 400
TOKEN, TOKEN2 = "good-token-0123456789abcdef", "second-token-0123456789abcdef"


def counts(data_dir: Path, file: str) -> dict[str, int]:
    return report_for(data_dir).view().get(file, {})


@pytest.fixture
def data(tmp_path):
    open_report(tmp_path)
    return tmp_path


# -- the shared decoder ---------------------------------------------------------------------------------------
def test_load_json_turns_hostile_numbers_into_values_every_bounded_type_refuses(data):
    from p2pnode.snapshot import Counter, WallSeconds

    doc = load_json(f'[1, {BIG}, NaN, Infinity, -Infinity, 1e400, "\\ud800", "x\\ny", 2]'.encode())
    report = report_for(data)
    assert decode_entries(doc, Counter, file="f", report=report) == [1, 2]
    assert counts(data, "f") == {"bad_entry": 7}
    assert decode_entries([0.5, float("nan")], WallSeconds, file="g", report=report) == [0.5]
    for raw in (b"{", b"\xff\xfe garbage", b"[" * 100_000, b""):
        with pytest.raises(ValueError):
            load_json(raw)
    assert decode_entries({"not": "a list"}, Counter, file="h", report=report) == []
    assert counts(data, "h") == {"bad_entry": 1}


def test_decimal_takes_ascii_digits_only():
    assert decimal("42\n") == 42 and decimal(b" 7 ") == 7
    for bad in ("²", "١٢", "-1", "+1", "1_000", BIG, "", "0x10", "1.0"):
        assert decimal(bad) is None, bad
    assert decimal("300", max_value=255) is None


# -- operator.json ----------------------------------------------------------------------------------------------
def test_operator_file_keeps_good_intents_and_drops_bad_runs(data):
    good = {"id": "abc-1", "template": "once", "params": {"word": "hi", "n": 3}, "tag": "gpu"}
    bad = [
        {"id": "b-1", "template": "once", "tag": "x\ny"},  # finding 2: a tag with a newline
        {"id": "b-2", "template": "once", "params": {"n": int(BIG)}},  # a 400-digit parameter
        {"id": "b-3", "template": "once", "params": {"s": "a\nb"}},  # a str parameter with a newline
        {"id": "b-4", "template": 7},  # a wrong type
        {"id": "b-5", "template": "once", "at": "NaN-PLACEHOLDER"},
        "not an object",
    ]
    text = json.dumps({"cordoned": True, "drain_deadline": 1.0e9, "runs": [good, *bad],
                       "done_runs": ["run-ok-1", "run-\u00b2\n", 5]})
    (data / "operator.json").write_text(text.replace('"NaN-PLACEHOLDER"', "NaN"))
    store = IntentStore(data)
    s = store.section
    assert s.cordoned and s.drain_deadline == 1.0e9
    assert [r.id for r in s.runs] == ["abc-1"] and s.runs[0].params == {"word": "hi", "n": 3}
    assert s.done_runs == ["run-ok-1"]
    assert counts(data, "operator.json") == {"bad_entry": len(bad) + 2}

    # a bad header field is reset, the rest kept
    (data / "operator.json").write_text(f'{{"cordoned": "yes", "drain_deadline": {BIG}, "runs": [{json.dumps(good)}]}}')
    s = IntentStore(data).section
    assert not s.cordoned and s.drain_deadline == 0.0 and [r.id for r in s.runs] == ["abc-1"]
    assert counts(data, "operator.json")["bad_field"] == 2

    # garbage, or not an object: no intent, counted, no exception
    for garbage in (b'{"runs": [', b"\x00\xff", b"[1, 2]"):
        (data / "operator.json").write_bytes(garbage)
        assert IntentStore(data).section.runs == []
    assert counts(data, "operator.json")["malformed"] == 3


def test_operator_writer_refuses_what_the_reader_would_drop(data):
    store = IntentStore(data)
    for tag, params in (("x\ny", {}), ("ok", {"s": "a\nb"}), ("ok", {"n": 10**30}), ("ok", {"f": float("nan")})):
        with pytest.raises(InvalidIntent):
            store.add_run("once", params, "", tag, "node0123", 1000.0)
    assert store.section.runs == [] and not (data / "operator.json").exists()
    req = store.add_run("once", {"word": "hi"}, "", "gpu", "node0123", 1000.0)
    store.ran("run-\n")  # never persisted
    assert [r.id for r in IntentStore(data).section.runs] == [req.id]
    assert IntentStore(data).section.done_runs == []
    assert report_for(data).view() == {}


# -- keyring.json -----------------------------------------------------------------------------------------------
def test_keyring_drops_bad_tokens_and_keeps_the_good_ones(data):
    path = data / "keyring.json"
    path.write_text(f'{{"primary": "{key_id_of(TOKEN2)}", "tokens": ["{TOKEN}", "\\ud800{TOKEN}", "x\\ny{TOKEN}", '
                    f'" {TOKEN}", "short", 5, null, {BIG}, NaN, "{TOKEN2}"]}}')
    ring = Keyring.load(path)
    assert set(ring.tokens) == {key_id_of(TOKEN), key_id_of(TOKEN2)} and ring.primary == key_id_of(TOKEN2)
    assert counts(data, "keyring.json") == {"bad_entry": 8}

    path.write_text(f'{{"primary": "\\u00b2", "tokens": [7, "{TOKEN}"]}}')  # the primary names no usable token
    assert Keyring.load(path).primary == key_id_of(TOKEN)
    assert counts(data, "keyring.json")["bad_primary"] == 1


def test_keyring_without_a_usable_token_stops_the_agent_and_never_falls_back_to_the_configured_token(data):
    path = data / "keyring.json"
    path.write_text('{"primary": null, "tokens": ["x\\ny-0123456789abcdef", 5]}')
    with pytest.raises(KeyringError, match="no usable token"):
        load_keyring(path, TOKEN)  # the configured token may be the one the operator rotated away
    path.write_text('{"primary": "x", "tokens": [')
    with pytest.raises(KeyringError, match="unreadable keyring"):
        load_keyring(path, TOKEN)
    path.unlink()
    assert load_keyring(path, TOKEN).primary_token == TOKEN  # a missing keyring: the first start, as before


# -- job ledger and history -------------------------------------------------------------------------------------
def _entry(job_id: str, **kw) -> LedgerEntry:
    base = dict(job_id=job_id, pid=None, start_ticks=None, template="work", config="c", kind="selfplay", gpus=(0,),
                gpu_fraction=0.5, vram_gib=2.0, term=3, started_at=1000.0, log_path="/tmp/l", exit_path="/tmp/e",
                cgroup="", memory_limit_gib=0.0)
    return LedgerEntry(**{**base, **kw})


LEDGER_INSERT = "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def test_ledger_skips_and_counts_bad_rows_and_refuses_to_write_them(data):
    ledger = JobLedger(data / "jobs" / "ledger.db")
    ledger.put(_entry("3-1"))
    row = ["3-9", None, None, "work", "c", "selfplay", "[0]", 0.5, 2.0, 3, 1001.0, "/tmp/l", "/tmp/e", "", 0.0, ""]
    bad = {0: "3-\u00b2", 9: "\u00b2", 6: "[0,", 7: float("inf"), 1: BIG, 3: "a\nb", 10: "later", 2: b"\x00blob",
           15: '{"id": "3-1", "rank": 99, "size": 2, "master": "-x", "master_port": 1, "port_base": 1}'}
    for i, (col, value) in enumerate(bad.items()):
        r = list(row)
        r[0] = f"3-{10 + i}" if col else value
        r[col] = value
        ledger._con.execute(LEDGER_INSERT, r)
    ledger._con.execute(LEDGER_INSERT, ["3-\n", *row[1:]])  # a job id the snapshot refuses
    assert [e.job_id for e in ledger.entries()] == ["3-1"]
    assert counts(data, "jobs/ledger.db") == {"bad_entry": len(bad) + 1}
    for e in (_entry("3-\n"), _entry("3-2", term=COUNTER_MAX + 1), _entry("3-3", started_at=float("nan")),
              _entry("3-4", gpus=(5000,))):
        with pytest.raises(ValueError):
            ledger.put(e)
    ledger.close()


def test_a_gang_member_is_kept_in_the_ledger_and_an_older_ledger_gains_the_column(data):
    import sqlite3

    from p2pnode.snapshot import GangSlot

    old = data / "jobs" / "ledger.db"
    old.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(old)  # a ledger an agent from before gangs wrote, with a job running
    con.execute("CREATE TABLE ledger (job_id TEXT PRIMARY KEY, pid INTEGER, start_ticks INTEGER, template TEXT NOT "
                "NULL, config TEXT NOT NULL, kind TEXT NOT NULL, gpus TEXT NOT NULL, gpu_fraction REAL NOT NULL, "
                "vram_gib REAL NOT NULL, term INTEGER NOT NULL, started_at REAL NOT NULL, log_path TEXT NOT NULL, "
                "exit_path TEXT NOT NULL, cgroup TEXT NOT NULL, memory_limit_gib REAL NOT NULL)")
    con.execute("INSERT INTO ledger VALUES ('3-1', 7, 9, 'work', 'c', 'selfplay', '[0]', 0.5, 2.0, 3, 1000.0, "
                "'/tmp/l', '/tmp/e', '', 0.0)")
    con.commit()
    con.close()
    ledger = JobLedger(old)
    assert [(e.job_id, e.gang) for e in ledger.entries()] == [("3-1", None)]  # kept, not moved aside
    slot = GangSlot(id="3-2", rank=1, size=2, master="10.0.0.1", master_port=29400, port_base=29464, ports=64,
                    engine="torchrun")
    ledger.put(_entry("3-3", gang=slot))
    assert {e.job_id: e.gang for e in ledger.entries()}["3-3"] == slot
    assert counts(data, "jobs/ledger.db") == {}
    ledger.close()


def test_a_database_that_is_garbage_or_of_another_schema_is_moved_aside_and_a_new_one_started(data):
    (data / "jobs").mkdir()
    (data / "jobs" / "ledger.db").write_bytes(b"\x00garbage, not SQLite" * 100)
    con = sqlite3.connect(data / "jobs.db")
    con.execute("CREATE TABLE runs (job_id TEXT)")  # a table of another shape
    con.commit()
    con.close()
    ledger, history = JobLedger(data / "jobs" / "ledger.db"), JobHistory(data / "jobs.db")
    assert ledger.entries() == [] and history.recent() == [] and history.duration_stats() == {}
    ledger.put(_entry("3-1"))
    assert [e.job_id for e in ledger.entries()] == ["3-1"]
    assert counts(data, "jobs/ledger.db") == {"malformed": 1} and counts(data, "jobs.db") == {"malformed": 1}
    assert len(list((data / "jobs").glob("ledger.db.corrupt-*"))) == 1  # kept for the operator
    ledger.close()
    history.close()


def test_exit_files_take_ascii_digits_only(tmp_path):
    for text, want in (("0\n", 0), ("137\n", -9), ("\u00b2\n", None), ("\u0661\n", None), (BIG, None), ("", None)):
        (tmp_path / "x.exit").write_text(text)
        assert exit_status_of(tmp_path / "x.exit") == want, text


def test_history_leaves_bad_rows_out_of_every_view_and_counts_each_once(data):
    h = JobHistory(data / "jobs.db")
    h.started(job_id="3-1", template="work", config="c", kind="selfplay", node_id="n", term=3, at=1000.0)
    h.ended("3-1", at=1010.0, exit_status=0, peak_rss_bytes=1, reason="done")
    ins = ("INSERT INTO runs (job_id, template, config, kind, node_id, term, started_at, ended_at, exit_status, "
           "peak_rss_bytes, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    h._con.execute(ins, ["3-2", "work", "c", "selfplay", "n", "\u00b2", 1001.0, 1002.0, 0, 1, "x"])
    h._con.execute(ins, ["3-3", "work", "c", "selfplay", "n", 3, "soon", "later", 0, 1, "x"])
    h._con.execute(ins, ["3-4", "work", "c", "selfplay", "n", 3, 1003.0, float("inf"), 0, 1, "x"])
    h._con.execute(ins, ["3-5\n", b"blob", "c", "selfplay", "n", 3, 1004.0, None, None, None, None])
    h._con.execute(ins, ["3-6", "work", "c", "selfplay", "n", 3, 1005.0, 1006.0, BIG, 1, "x"])
    for _ in range(3):
        assert [r["job_id"] for r in h.recent()] == ["3-1"]
    assert counts(data, "jobs.db") == {"bad_entry": 5}
    # durations come from numeric, finite, ordered times only (3-1: 10 s, 3-2 and 3-6: 1 s; not 3-3, 3-4, 3-5)
    assert h.duration_stats() == {"work": (4.0, 18.0, 3)}
    h.close()


# -- peers.json -------------------------------------------------------------------------------------------------
def test_peers_file_drops_undialable_addresses(data):
    (data / "peers.json").write_text(json.dumps({"format": 1, "peers": [
        {"addr": "10.0.0.1:8770", "node_id": "abcdefgh"},
        {"addr": "host:1/path"}, {"addr": "h:\u00b2"}, {"addr": "h:99999"}, {"addr": "[::1]:9", "node_id": "x\ny"},
        {"addr": 7}, "nope", {"addr": "user@host:80"},
        {"addr": "node-b.lan:8770"},
    ]}))
    assert load_peers(data) == [("10.0.0.1:8770", "abcdefgh"), ("node-b.lan:8770", None)]
    assert counts(data, "peers.json") == {"bad_entry": 7}
    (data / "peers.json").write_bytes(b"\x00garbage")
    assert load_peers(data) == []
    assert counts(data, "peers.json")["malformed"] == 1
    save_peers(data, [("a:1", None), ("bad addr", None), ("b:2", "x\ny"), ("c:3", "n1")])
    assert load_peers(data) == [("a:1", None), ("c:3", "n1")]


# -- sync: replica index, retention, partial transfers -------------------------------------------------------------
def _replica(data: Path, origin: str, path: str, body: bytes) -> dict:
    p = data / "replicas" / origin / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(body)
    m = hash_file(p, block_size=128 * 1024)
    return {"origin": origin, "path": path, "size": m.size, "root": m.root.hex(), "block_size": m.block_size,
            "seq": 1, "mtime_ns": p.stat().st_mtime_ns, "committed_at": 1000.0}


def test_replica_index_drops_bad_records_and_keeps_the_good_ones(data):
    good = _replica(data, "origin1", "a/x.npz", b"x" * 1000)
    other = _replica(data, "origin1", "b.npz", b"y" * 10)
    bad = [
        {**other, "seq": int(BIG)}, {**other, "size": "\u00b2"}, {**other, "root": "zz"},
        {**other, "committed_at": "NAN"}, {**other, "origin": "../etc"}, {**other, "path": "../../x"},
        {**other, "path": "a\nb"}, {**other, "block_size": 0}, 7,
    ]
    (data / ".sync").mkdir()
    text = json.dumps({"replicas": [good, *bad]}).replace('"NAN"', "NaN")
    (data / ".sync" / "replicas.json").write_text(text)
    index = ReplicaIndex(data)
    assert list(index.records) == [("origin1", "a/x.npz")]
    assert index.receipts(10)["origin1"][0][:2] == ["a/x.npz", 1000] and index.held_bytes() == 1000
    assert counts(data, ".sync/replicas.json") == {"bad_entry": len(bad)}
    (data / ".sync" / "replicas.json").write_text('{"replicas": [')
    assert ReplicaIndex(data).records == {}
    assert counts(data, ".sync/replicas.json")["malformed"] == 1


def test_retention_state_drops_bad_sightings(data):
    (data / ".sync").mkdir()
    (data / ".sync" / "retention.json").write_text(
        f'{{"unlisted_since": [["o1", "a.npz", 1000.5], ["o1", "b.npz", NaN], ["o\\n", "c", 1], ["o1", "d", {BIG}], '
        '["o1", 5, 1], "x", ["o1", "e.npz", 1e400]]}')
    r = Retirement(ReplicaIndex(data), data)
    assert r.unlisted_since == {("o1", "a.npz"): 1000.5}
    assert counts(data, ".sync/retention.json") == {"bad_entry": 6}
    r.note_unlisted({("o1", "a.npz"): 1000.5, ("o\n", "x"): 1.0})  # the writer keeps only what reads back
    assert Retirement(ReplicaIndex(data), data).unlisted_since == {("o1", "a.npz"): 1000.5}


def test_partial_transfer_state_with_hostile_numbers_reserves_nothing(data):
    d = data / ".sync" / "incoming" / "origin1"
    d.mkdir(parents=True)
    cases = ['{"size": Infinity, "block_size": 131072, "hashes": ""}',
             f'{{"size": {BIG}, "block_size": 1, "hashes": ""}}',
             '{"size": "\u00b2", "block_size": 1, "hashes": ""}', '{"size": 1, "block_size": 1, "hashes": "zz"}',
             "garbage"]
    for i, text in enumerate(cases):
        (d / f"{partial_key(f'p{i}')}.json").write_text(text)
    (d / f"{partial_key('ok')}.json").write_text(f'{{"size": 10, "block_size": 131072, "hashes": "{"ab" * 32}"}}')
    assert read_state(d / f"{partial_key('ok')}.json").size == 10
    store = ReplicaStore(data)  # scans the leftovers at start: no exception, only the good one reserves space
    assert sum(store._leftover.values()) == 10
    assert counts(data, ".sync/incoming/*.json") == {"bad_entry": 4, "malformed": 1}


# -- counters -----------------------------------------------------------------------------------------------------
def test_counters_refuse_what_they_cannot_read_without_moving_backwards(tmp_path):
    assert IDENTITY_COUNTER_MAX == COUNTER_MAX
    path = tmp_path / "snapshot.version"
    for text in ("\u00b2", "\u0661\u0662", BIG, str(COUNTER_MAX), "-1", "01", "1.5", "", "garbage"):
        path.write_text(text)
        with pytest.raises(IdentityError, match="not a counter of ASCII digits"):
            PersistentCounter(path)
        assert path.read_text() == text  # never rewritten: the operator's copy to restore from
    path.write_text("41\n")
    assert PersistentCounter(path, block=10).next() == 42


def test_an_unreadable_counter_file_stops_the_agent_with_one_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "snapshot.version").write_text("\u00b2\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PNODE_")}
    r = subprocess.run([sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(data), "--port", "0",
                        "--bind", "127.0.0.1", "--no-mdns", "--log-level", "error"], capture_output=True, text=True,
                       timeout=30, env=env)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()
    assert len(last) == 1 and last[0].startswith("p2pnode: ") and "snapshot.version" in last[0], r.stderr


# -- a real agent -------------------------------------------------------------------------------------------------
CATALOG = """
[[job]]
name = "work"
kind = "selfplay"
config = "c"
max_concurrency = 1
argv = ["sleep", "600"]
[job.resources]
num_cpus = 0.1
"""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1", "P2PNODE_CPU_MAX_PERCENT": "0",
       "P2PNODE_CPU_WARN_PERCENT": "100", "P2PNODE_TRUST": "token", "P2PNODE_CLUSTER_TOKEN": TOKEN}


def _plant(data: Path, origin: str) -> None:
    """Hostile content in every state file of the stopped agent's data dir, good entries among the bad ones."""
    good_run = {"id": "keep-1", "template": "work", "params": {}, "at": 1000.0}
    (data / "operator.json").write_text(json.dumps({
        "cordoned": True, "drain_deadline": 0,
        "runs": [{"id": "xy-1", "template": "work", "tag": "x\ny"}, good_run,  # finding 2's restart half
                 {"id": "big-1", "template": "work", "params": {"n": 1}}],
        "done_runs": ["run-\u00b2\n"]}).replace('"n": 1', f'"n": {BIG}'))
    ring = json.loads((data / "keyring.json").read_text())
    ring["tokens"] += ["x\ny-0123456789abcdef", 5, None]
    (data / "keyring.json").write_text(json.dumps(ring).replace("null", "NaN"))
    (data / "peers.json").write_text(json.dumps({"format": 1, "peers": [
        {"addr": f"127.0.0.1:{free_port()}"}, {"addr": "h:\u00b2"}, {"addr": "a/b:1"}, {"addr": 5}]}))
    con = sqlite3.connect(data / "jobs" / "ledger.db")
    con.execute(LEDGER_INSERT, ["9-\u00b2", 1, 1, "work", "c", "selfplay", "[0]", 0.5, 2.0, 9, 1.0, "/l", "/e", "", 0,
                                ""])
    con.execute(LEDGER_INSERT, ["9-2", 1, 1, "work", "c", "selfplay", "[0,", 0.5, 2.0, BIG, 1.0, "/l", "/e", "", 0, ""])
    # the job table's records and the stop intents (issue 39): a NaN, an unknown state, a job id with a newline
    con.execute("INSERT INTO job_records VALUES ('9-3', 1, ?)", ['{"job_id": "9-3", "state": "ended", "term": NaN}'])
    con.execute("INSERT INTO job_records VALUES ('9-4', 2, ?)", ['{"job_id": "9-4", "state": "asleep"}'])
    con.execute("INSERT INTO stop_intents VALUES (?, 1.0)", ["9-\n5"])
    con.commit()
    con.close()
    con = sqlite3.connect(data / "jobs.db")
    con.execute("INSERT INTO runs (job_id, template, config, kind, node_id, term, started_at, ended_at, exit_status, "
                "peak_rss_bytes, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ["9-\n", "work", "c", "selfplay", origin, "\u00b2", 1.0, 2.0, 0, 1, "x"])
    con.commit()
    con.close()
    (data / ".sync" / "replicas.json").write_text('{"replicas": [{"origin": "../x", "path": "a", "size": 1}, 5]}')
    (data / ".sync" / "retention.json").write_text('{"unlisted_since": [["o", "p", NaN], ["o", "q", 1.0]]}')
    inc = data / ".sync" / "incoming" / "o1"
    inc.mkdir(parents=True, exist_ok=True)
    (inc / f"{partial_key('p')}.json").write_text('{"size": Infinity, "block_size": 1, "hashes": ""}')


def test_a_stopped_agent_with_hostile_state_files_starts_heartbeats_and_counts_the_drops(tmp_path):
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    data = tmp_path / "n0"
    p = AgentProc(data, free_port(), "--no-mdns", "--catalog", str(cat), "--tag", "durable", "--tag", "voter",
                  env=ENV).start()
    try:
        origin = p.wait_ready()["node"]["id"]
        wait_until(lambda: (data / "jobs" / "ledger.db").exists() and (data / "jobs.db").exists(), 20,
                   what="the job databases")
        assert p.stop() < 10 and p.proc.returncode == 0
        _plant(data, origin)

        p.start()
        st = p.wait_ready()
        assert st["node"]["id"] == origin
        v0 = st["node"]["version"] or 0
        wait_until(lambda: (p.status()["node"]["version"] or 0) > v0 + 2, 20, what="a rising own version")
        st = p.status()
        assert st["state_files"] == {
            "operator.json": {"bad_entry": 3},
            "keyring.json": {"bad_entry": 3},
            "peers.json": {"bad_entry": 3},
            "jobs/ledger.db": {"bad_entry": 5},
            "jobs.db": {"bad_entry": 1},
            ".sync/replicas.json": {"bad_entry": 2},
            ".sync/retention.json": {"bad_entry": 1},
            ".sync/incoming/*.json": {"bad_entry": 1},
        }, st["state_files"]
        op = st["node"]["operator"]
        assert op["cordoned"] and [r["id"] for r in op["runs"]] == ["keep-1"] and op["done_runs"] == []
        assert st["snapshot"]["operator"]["cordoned"]  # published: the section the file held decodes
        metrics = httpx.get(p.url + "/metrics", timeout=5, trust_env=False).text
        assert 'p2pnode_state_file_entries_dropped_total{file="operator.json",reason="bad_entry"} 3.0' in metrics
        log = p.log.read_text()
        assert "state file operator.json: dropped (bad_entry)" in log and "Traceback" not in log

        # restarted once more: the files are left as they are (the operator may want to look), so the same drops
        # are counted again, once each; the agent heartbeats
        p.stop()
        p.start()
        st = p.wait_ready()
        v1 = st["node"]["version"] or 0
        wait_until(lambda: (p.status()["node"]["version"] or 0) > v1, 20, what="heartbeats after the restart")
        assert p.status()["state_files"]["operator.json"] == {"bad_entry": 3}
    finally:
        p.kill()


def test_an_operator_file_holding_a_tag_with_a_newline_no_longer_stops_the_agent(tmp_path):
    """Finding 2's restart half, alone: the exact file the agent of the report could not read back."""
    data = tmp_path / "n0"
    data.mkdir()
    (data / "operator.json").write_text(json.dumps(
        {"runs": [{"id": "abcdefgh-1", "template": "work", "tag": "x\ny", "at": time.time()}]}))
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    p = AgentProc(data, free_port(), "--no-mdns", "--catalog", str(cat),
                  env={**ENV, "P2PNODE_TRUST": "open", "P2PNODE_CLUSTER_TOKEN": ""})
    p.start()
    try:
        st = p.wait_ready()
        assert st["state_files"] == {"operator.json": {"bad_entry": 1}}
        assert st["node"]["operator"]["runs"] == []
        v0 = st["node"]["version"] or 0
        wait_until(lambda: (p.status()["node"]["version"] or 0) > v0 + 1, 20, what="heartbeats")
    finally:
        p.stop()  # SIGTERM: the agent stops the job it may have started (kill -9 would leave it running)

def test_a_bad_entry_in_the_signals_file_is_dropped_and_the_rest_kept(tmp_path):
    from p2pnode.jobs._signals import SignalBook
    from p2pnode.statefiles import StateFileReport

    rep = StateFileReport()
    book = SignalBook(["a", "b"], seen_clocks=lambda: [], on_change=lambda: None, report=rep)
    f = tmp_path / "signals.json"
    f.write_bytes(b'[{"config": "a", "quality": 0.9}, {"config": "b", "game_count": 1' + b"0" * 400 + b'},'
                  b' {"config": "zz", "quality": 0.5}, {"config": "b", "quality": 2}]')
    book.watch_file(str(f))
    assert set(book.entries) == {"a"} and book.entries["a"].values["quality"] == 0.9
    assert rep.count("signals.json", "bad_entry") == 3
    g = tmp_path / "s2.json"
    g.write_text("{nope")
    book.watch_file(str(g))
    assert rep.count("s2.json", "malformed") == 1 and set(book.entries) == {"a"}
