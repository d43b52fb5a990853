"""Proof of possession against real agents (issue 37, attack 3): fake durable members that copy a file's size and
root from the origin's open ``GET /sync/manifest`` into their receipts are challenged, fail, stop counting, and the
file still goes to the real durable node; a real durable node that lost a replica fails the next challenge and gets
the file again before the origin's disk manager deletes it."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import msgspec
import pytest
from agents import AgentProc, free_port, wait_until
from attack import Attacker
from roles import Trust

pytestmark = pytest.mark.slow

LOCAL = {"P2PNODE_GOSSIP_PROFILE": "local-test"}


def put(e, rel, size, age_s):
    """A settled sealed file in ``e``'s sync root (written aside, renamed in), last modified ``age_s`` ago."""
    dest = e.data_dir / "data" / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp"
    tmp.write_bytes(os.urandom(size))
    old = time.time() - age_s
    os.utime(tmp, (old, old))
    os.replace(tmp, dest)
    return dest


def sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def node_id(p):
    if not hasattr(p, "node_id"):
        p.node_id = p.status()["node"]["id"]
    return p.node_id


def sync_files(p):
    return {f["path"]: f for f in p.get("/sync/status")["files"]}


class FakeHolder:
    """A fake durable member: an :class:`Attacker` identity gossiping snapshots tagged ``durable`` whose receipts copy
    every file of the victim's ``GET /sync/manifest``, and a small listener on its advertised address that answers
    challenges wrongly (``mode="wrong"``: made-up proofs) or never (``mode="silent"``)."""

    def __init__(self, mode: str, victim: AgentProc, token: str | None = None) -> None:
        self.mode, self.victim = mode, victim
        self.attacker = Attacker(token=token)
        self.challenges = self.pushes = 0
        self.stop = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                fake.pushes += self.path == "/sync/push"
                if self.path != "/sync/challenge":
                    self.send_response(404)
                    self.end_headers()
                    return
                fake.challenges += 1
                if fake.mode == "silent":
                    fake.stop.wait(60)  # holds the connection: the origin times out
                    return
                n = len(msgspec.msgpack.decode(body)["blocks"])
                out = msgspec.msgpack.encode({"status": "present", "proofs": [os.urandom(32) for _ in range(n)]})
                self.send_response(200)
                self.send_header("content-type", "application/msgpack")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self.threads = [threading.Thread(target=self.server.serve_forever, daemon=True),
                        threading.Thread(target=self._gossip, daemon=True)]
        for t in self.threads:
            t.start()

    def _receipts(self):
        listing = httpx.get(self.victim.url + "/sync/manifest", timeout=5, trust_env=False).json()["files"]
        return [[f["path"], f["size"], bytes.fromhex(f["root"])] for f in listing]

    def _gossip(self):
        victim_id = node_id(self.victim)
        while not self.stop.is_set():
            try:
                snap = self.attacker.snapshot(addr=self.addr, tags=["durable"],
                                              sync={"receipts": {victim_id: self._receipts()}})
                self.attacker.post(self.victim.url, [self.attacker.envelope(snap)])
            except httpx.HTTPError:
                pass
            self.stop.wait(0.25)

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        for t in self.threads:
            t.join(10)


@pytest.fixture
def small_fs(tmp_path):
    from fs import SmallFs

    fs = SmallFs(tmp_path / "efs", size_mib=64)
    yield fs
    fs.close()


@pytest.mark.parametrize("mode", ["open", "operator-key"])
def test_fake_durable_receipts_never_count_the_file_goes_to_the_real_durable_node_and_nothing_is_deleted(
        tmp_path, small_fs, capsys, mode):
    """Attack 3: R=2, two fakes claim every file of the ephemeral node (size and root copied from its manifest), its
    disk is at 80 % (the disk manager runs every second). Open mode: the fakes count as durable members, are
    challenged, fail (wrong proofs, no answer), stop counting: nothing is deleted; a real durable node that joins
    gets every file, passes its challenges; still nothing is deleted (only fakes claim the second replica). With an
    operator key pinned (token mode, the fakes hold the token but no certificate): the fakes are not durable at all,
    their receipts never count, nothing is deleted before the certified durable node holds and proves every file."""
    trust = Trust(mode)
    env = {**LOCAL, "P2PNODE_SYNC_INTERVAL_S": "0.5", "P2PNODE_GUARD_CHECK_INTERVAL": "1",
           "P2PNODE_SYNC_REPLICATION_FACTOR": "2", "P2PNODE_SYNC_CHALLENGE_TIMEOUT_S": "2", **trust.env()}
    pinned = trust.key is not None
    durable_port = free_port()
    e = AgentProc(small_fs.path / "agent", free_port(), "--no-mdns", "--tag", "ephemeral",
                  "--join", f"127.0.0.1:{durable_port}", env=env)
    procs, fakes = [e], []
    try:
        e.start()
        e.wait_ready()
        digests = {}
        for k in range(6):
            p = put(e, f"cfg/shard{k}.npz", 4 * 2**20, 3600 - k * 60)
            digests[f"cfg/shard{k}.npz"] = sha(p)
        wait_until(lambda: len(sync_files(e)) == 6, 30, what="the six files hashed")
        small_fs.fill_to(80)
        fakes = [FakeHolder("wrong", e, trust.token), FakeHolder("silent", e, trust.token)]
        fake_ids = {f.attacker.node_id for f in fakes}

        def fakes_failed():
            files = sync_files(e)
            return all(files[p]["holders"].get(fid, {}).get("state") == "failed" for p in digests for fid in fake_ids)

        def fakes_not_durable():
            rows = {m["id"]: m for m in e.get("/members")["members"]}
            return all(fid in rows and "durable" in rows[fid].get("roles_refused", []) for fid in fake_ids)

        if pinned:
            wait_until(fakes_not_durable, 60, what="both fakes' durable claims refused (no certificate)")
            t_failed = time.time()
            st = e.get("/sync/status")
            assert st["durable_members"] == 0 and st["durable_counting"] == []
            assert all(f["replicas"] == 0 and f["confirmed_by"] == [] for f in st["files"])
            assert all(f.challenges == 0 for f in fakes)  # not counted, so never even asked
        else:
            wait_until(fakes_failed, 60, what="both fakes failed their challenges for every file")
            t_failed = time.time()
            st = e.get("/sync/status")
            assert st["durable_members"] == 2 and set(st["durable_counting"]) <= fake_ids  # they are members...
            assert all(f["replicas"] == 0 and f["confirmed_by"] == [] for f in st["files"])  # ...not counted
            reasons = {h["reason"] for f in st["files"] for fid, h in f["holders"].items()}
            assert reasons <= {"wrong_hash", "timeout"} and "wrong_hash" in reasons, reasons
            failed = st["challenges"]["failed"]
            assert failed["wrong_hash"] >= 6 and failed["timeout"] + failed["wrong_hash"] >= 12, failed
            assert all(f.challenges >= 6 for f in fakes)
        wait_until(lambda: (e.get("/guard").get("last_cleanup") or {}).get("at", 0) > t_failed + 2, 30,
                   what="a disk-manager pass after the fakes failed")
        assert {p: sha(e.data_dir / "data" / p) for p in digests} == digests  # nothing deleted
        assert small_fs.usage_percent() > 75

        trust.certify(tmp_path / "durable", ("durable",))
        d = AgentProc(tmp_path / "durable", durable_port, "--no-mdns", "--tag", "durable", env=env).start()
        procs.append(d)
        d.wait_ready()
        d_id = node_id(d)

        def d_verified():
            files = sync_files(e)
            return all(files[p]["holders"].get(d_id, {}).get("state") == "verified" for p in digests)

        rep = d.data_dir / "replicas" / node_id(e)
        if pinned:  # R is capped by the one certified durable member: the origin may delete once it proved each file
            def d_holds():
                return all((rep / p).exists() and sha(rep / p) == digests[p] for p in digests)

            wait_until(d_holds, 90, what="every file pushed to the certified durable node")
            for p, digest in digests.items():  # kept, or deleted only with an intact, proven replica on the real node
                assert not (e.data_dir / "data" / p).exists() or sha(e.data_dir / "data" / p) == digest
            assert [f.pushes for f in fakes] == [0, 0] and [f.challenges for f in fakes] == [0, 0]
            served = d.get("/sync/status")["challenges"]["served"]
            deleted = [p for p in digests if not (e.data_dir / "data" / p).exists()]
            assert served >= len(deleted), (deleted, served)  # each delete follows a challenge of that file passed
            with capsys.disabled():
                print(f"\n[proof of possession, attack 3, operator key] fakes never counted, never asked; 6 files "
                      f"on the certified durable node, {served} challenges served by it", file=sys.stderr)
            return
        wait_until(d_verified, 90, what="every file pushed to the real durable node and its challenges passed")
        assert {p: sha(rep / p) for p in digests} == digests
        files = sync_files(e)
        assert all(f["confirmed_by"] == [d_id] and f["replicas"] == 1 and f["r"] == 2 for f in files.values())
        t_real = time.time()
        wait_until(lambda: (e.get("/guard").get("last_cleanup") or {}).get("at", 0) > t_real + 2, 30,
                   what="a disk-manager pass with the real replica in")
        assert {p: sha(e.data_dir / "data" / p) for p in digests} == digests  # one real replica of R=2: kept
        wait_until(fakes_failed, 60, what="the fakes still failed")  # (asked again if one was briefly dead)
        assert [f.pushes for f in fakes] == [0, 0]  # no file data ever went to a fake
        metrics = httpx.get(e.url + "/metrics", timeout=5, trust_env=False).text
        assert 'p2pnode_sync_challenges_failed_total{reason="wrong_hash"}' in metrics
        import subprocess

        out = subprocess.run([sys.executable, "-m", "p2pnode", "sync", "status", "--url", e.url], capture_output=True,
                             text=True, timeout=60).stdout
        assert "not counted" in out and "wrong_hash" in out and "challenges sent" in out, out
        served = d.get("/sync/status")["challenges"]["served"]
        assert served >= 6
        with capsys.disabled():
            print(f"\n[proof of possession, attack 3] fakes failed {dict(failed)} (challenges seen by the fakes: "
                  f"{[f.challenges for f in fakes]}); 6 files pushed to the real durable node, {served} challenges "
                  f"served by it; nothing deleted at {small_fs.usage_percent():.0f} % disk", file=sys.stderr)
    finally:
        for f in fakes:
            f.close()
        for p in procs:
            p.kill()


def test_a_durable_node_that_lost_a_replica_fails_the_next_challenge_and_gets_the_file_again_before_any_delete(
        tmp_path, small_fs, capsys):
    """R=1, one real durable node. Its replica is deleted under it after it passed; the origin's disk then passes
    its warning level: the disk manager's pass challenges it first (the pass is older than the window), it answers
    ``absent`` and withdraws the receipt, the file is pushed to it again, passes, and only then is the origin's copy
    deleted."""
    env = {**LOCAL, "P2PNODE_SYNC_INTERVAL_S": "0.5", "P2PNODE_GUARD_CHECK_INTERVAL": "1",
           "P2PNODE_SYNC_REPLICATION_FACTOR": "1", "P2PNODE_SYNC_CHALLENGE_TIMEOUT_S": "5",
           "P2PNODE_SYNC_CHALLENGE_WINDOW_S": "3"}
    d = AgentProc(tmp_path / "durable", free_port(), "--no-mdns", "--tag", "durable", env=env).start()
    procs = [d]
    try:
        d.wait_ready()
        e = AgentProc(small_fs.path / "agent", free_port(), "--no-mdns", "--tag", "ephemeral",
                      "--join", f"127.0.0.1:{d.port}", env=env)
        procs.append(e)
        e.start()
        e.wait_ready()
        src = put(e, "cfg/ckpt.npz", 12 * 2**20, 3600)
        digest = sha(src)
        d_id = node_id(d)
        holder = lambda: sync_files(e).get("cfg/ckpt.npz", {}).get("holders", {}).get(d_id, {})  # noqa: E731
        wait_until(lambda: holder().get("state") == "verified", 60, what="the replica committed and verified")
        rep = d.data_dir / "replicas" / node_id(e) / "cfg" / "ckpt.npz"
        assert sha(rep) == digest
        rep.unlink()  # lost under the durable node (a disk replaced, a hand)
        wait_until(lambda: (holder().get("passed_s_ago") or 0) > 3, 30, what="the pass older than the window")
        small_fs.fill_to(80)
        wait_until(lambda: not src.exists(), 90, what="the origin's copy deleted by the disk manager")
        assert sha(rep) == digest  # pushed again before the delete: the only copy left is whole
        st = e.get("/sync/status")
        assert st["challenges"]["failed"]["absent"] >= 1, st["challenges"]
        dst = d.get("/sync/status")
        assert dst["challenges"]["withdrawn"] == 1 and dst["received"]["commits"] == 2, dst["challenges"]
        cleanup = e.get("/guard")["last_cleanup"]
        assert {x["rule"] for x in cleanup["deletions"]} <= {"replicated"}
        with capsys.disabled():
            print(f"\n[proof of possession, lost replica] challenges {st['challenges']['sent']} sent, failed "
                  f"{ {k: v for k, v in st['challenges']['failed'].items() if v} }; the durable node withdrew the "
                  f"receipt, took the file again (2 commits), then the origin deleted its copy", file=sys.stderr)
    finally:
        for p in procs:
            p.kill()


def test_a_fake_copying_each_receipt_of_a_live_database_is_challenged_fails_and_the_real_durable_node_gets_it(
        tmp_path, capsys):
    """Finding 1 against real agents: a SQLite database written every 0.2 s gets a new version every sync pass
    (0.5 s), and a fake durable member copies each new receipt within 0.25 s. The challenge schedule and the failure
    belong to the file and the holder, not to a version: the fake is challenged about 2 s after its first claim,
    fails, and counts for no later version; with R=1 the file then goes to the real durable node that joins."""
    import sqlite3

    env = {**LOCAL, "P2PNODE_SYNC_INTERVAL_S": "0.5", "P2PNODE_SYNC_REPLICATION_FACTOR": "1",
           "P2PNODE_SYNC_CHALLENGE_TIMEOUT_S": "2"}
    durable_port = free_port()
    e = AgentProc(tmp_path / "eph", free_port(), "--no-mdns", "--tag", "ephemeral",
                  "--join", f"127.0.0.1:{durable_port}", env=env)
    procs, fake, stop = [e], None, threading.Event()
    writes = [0]

    def write():
        con = sqlite3.connect(db)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE IF NOT EXISTS games (id INTEGER PRIMARY KEY, moves BLOB)")
        while not stop.is_set():
            con.execute("INSERT INTO games (moves) VALUES (?)", (os.urandom(300),))
            con.commit()
            writes[0] += 1
            stop.wait(0.2)
        con.close()

    writer = threading.Thread(target=write, daemon=True)
    try:
        e.start()
        e.wait_ready()
        db = e.data_dir / "data" / "cfg" / "games.db"
        db.parent.mkdir(parents=True)
        writer.start()
        wait_until(lambda: "cfg/games.db" in sync_files(e), 30, what="the live database hashed")
        seq0 = sync_files(e)["cfg/games.db"]["seq"]
        fake = FakeHolder("wrong", e)

        def fake_failed():
            return e.get("/sync/status")["challenges"]["failed"]["wrong_hash"] >= 1

        wait_until(fake_failed, 60, what="the fake challenged and failed despite a new version every pass")
        st = e.get("/sync/status")
        versions = sync_files(e)["cfg/games.db"]["seq"] - seq0
        assert versions >= 3, versions  # the database did change under the fake's claims
        t_failed, pushes_before = time.time(), fake.pushes  # (open mode: a durable member, pushed to until it failed)
        wait_until(lambda: time.time() > t_failed + 3, 10, what="a few more versions")
        f = sync_files(e)["cfg/games.db"]
        assert fake.attacker.node_id not in f["confirmed_by"] and f["replicas"] == 0  # it counts for no later one
        d = AgentProc(tmp_path / "durable", durable_port, "--no-mdns", "--tag", "durable", env=env).start()
        procs.append(d)
        d.wait_ready()
        rep = d.data_dir / "replicas" / node_id(e) / "cfg" / "games.db"
        wait_until(rep.exists, 60, what="the live database pushed to the real durable node despite the fake")
        assert fake.pushes == pushes_before and st["challenges"]["failed"]["wrong_hash"] == 1, st["challenges"]
        assert e.get("/sync/status")["challenges"]["failed"]["wrong_hash"] == 1  # failed once, not asked again
        with capsys.disabled():
            print(f"\n[proof of possession, live database] {versions} versions while the fake copied receipts; it "
                  f"was challenged {fake.challenges} time(s), failed, counted for no later version; the real durable "
                  f"node got the database ({writes[0]} writes)", file=sys.stderr)
    finally:
        stop.set()
        if fake is not None:
            fake.close()
        for p in procs:
            p.kill()
