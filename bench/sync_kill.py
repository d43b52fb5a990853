"""kill -9 mid-distribution and mid-segment, seeded (issue 40's acceptance), between real agents on 127.0.0.1.

**Subscriber killed mid-distribution** (``--mode dist``): a durable agent publishes a ``sync.publish`` folder
(signed with its node key) holding either one large file (``--files 1 --mib 1024``: the acceptance's 1 GiB) or many
small ones (``--files 200``); per seed, a fresh subscriber pinning that key joins, is killed (SIGKILL) once it holds
a seeded share (10-90 %) of the bytes, then restarted on the same data dir. Checked per seed: while it was down,
every ``<data_dir>/published/<name>`` that exists is a link to a complete, verified version, byte-identical to the
source (nothing corrupt, nothing half-fetched switched in); after the restart every copy completes, byte-identical,
no partial file is left, and each name's floor is the published version (nothing applied out of order).

**Sender killed mid-segment** (``--mode wal``): an ephemeral agent ships a live WAL-mode database (prefilled to
``--db-mib``, a writer committing transactions of 10 rows of 300 bytes and one of larger rows to make segments
long) to a durable agent by ``POST /sync/wal``; per seed, the sender is killed (SIGKILL) inside a segment's body:
the durable agent spools a segment over 17 MiB (``max_request_bytes``) to ``.sync/walin/`` while it arrives, and
the kill comes a seeded 0-50 ms after such a file appears (at a seeded 0.2-4 s when none does within 60 s); then
it is restarted. A monitor samples the replica
every 0.1 s. Checked per seed: every sample passes ``quick_check``, its rows are ids 1..n with n a multiple of 10 (a
transaction boundary) and n never goes down (nothing applied out of order); after the restart the replica reaches
the source's row count and passes ``integrity_check``. How many kills landed inside a segment's body is read from
the receiver's counters (``disconnected`` / ``malformed`` bodies).

    python bench/sync_kill.py --mode dist --files 1 --mib 1024 --seeds 20
    python bench/sync_kill.py --mode dist --files 200 --seeds 20
    python bench/sync_kill.py --mode wal --seeds 20
    python bench/sync_kill.py --mode dist --files 20 --seeds 2 --json     # small (the suite runs these)

Exit 1 when any seed fails a check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))
from agents import AgentProc, free_port, wait_until  # noqa: E402

MiB = 2**20
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SYNC_INTERVAL_S": "0.5"}


def _same(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(8 * MiB), fb.read(8 * MiB)
            if x != y:
                return False
            if not x:
                return True


def _write(path: Path, size: int, rng: random.Random) -> None:
    """Written aside and renamed in, its mtime in the past (settled), as a job would."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        left = size
        while left:
            n = min(left, 8 * MiB)
            fh.write(rng.randbytes(n))
            left -= n
    old = time.time() - 60
    os.utime(tmp, (old, old))
    os.replace(tmp, path)


# -- a subscriber killed mid-distribution ------------------------------------------------------------------------
class DistRig:
    """One publisher agent, a ``sync.publish`` folder of ``files`` (name -> bytes), served at ``rate`` bytes/s."""

    def __init__(self, work: Path, files: dict[str, int], rate: int) -> None:
        self.work = work
        self.outbox = work / "outbox"
        self.outbox.mkdir(parents=True)
        rng = random.Random(0)
        for name, size in files.items():
            _write(self.outbox / name, size, rng)
        self.files = files
        self.total = sum(files.values())
        self.pub = AgentProc(work / "pub", free_port(), "--no-mdns", "--tag", "durable", env={
            **ENV, "P2PNODE_SYNC_PUBLISH": str(self.outbox), "P2PNODE_SYNC_PUBLISH_TO": "training",
            "P2PNODE_SYNC_SETTLE_S": "0", "P2PNODE_SYNC_PUBLISH_MAX_BYTES_PER_S": str(rate)})

    def start(self, timeout_s: float) -> None:
        self.pub.start()
        self.pub.wait_ready()

        def published() -> bool:
            view = self.pub.get("/sync/status", timeout=10)["distribution"]
            return len(view["files"]) == len(self.files)

        wait_until(published, timeout_s, interval=0.5, what="every file published", retry_on=(Exception,))
        view = self.pub.get("/sync/status", timeout=10)["distribution"]
        self.pinned = view["publisher_key"]
        self.versions = {f["name"]: f["version"] for f in view["files"]}

    def close(self) -> None:
        self.pub.kill()

    def _held(self, sub: AgentProc) -> int:
        view = sub.get("/sync/status", timeout=10)["distribution"]
        return int(sum(f["size"] * f["blocks_held"] / max(1, f["blocks"]) for f in view["files"]))

    def check_links(self, sub: AgentProc) -> tuple[int, int]:
        """(complete copies, corrupt ones) at ``<data_dir>/published`` (a link to a verified version, identical)."""
        folder = sub.data_dir / "published"
        good = bad = 0
        for p in folder.iterdir() if folder.exists() else []:
            if p.name.startswith("."):
                continue
            target = os.readlink(p) if p.is_symlink() else ""
            ok = (target == f".versions/{p.name}@{self.versions.get(p.name)}"
                  and _same(p, self.outbox / p.name))
            good, bad = (good + 1, bad) if ok else (good, bad + 1)
        return good, bad

    def run_seed(self, seed: int, timeout_s: float) -> dict[str, Any]:
        rng = random.Random(seed)
        share = rng.uniform(0.1, 0.9)
        sub = AgentProc(self.work / f"sub{seed}", free_port(), "--no-mdns", "--tag", "training", "--join",
                        f"127.0.0.1:{self.pub.port}", env={**ENV, "P2PNODE_SYNC_PUBLISHERS": self.pinned})
        t0 = time.monotonic()
        rec: dict[str, Any] = {"seed": seed, "kill_at_share": round(share, 3)}
        try:
            sub.start()
            sub.wait_ready()
            held = wait_until(lambda: (h := self._held(sub)) >= share * self.total and h, timeout_s, interval=0.05,
                              what=f"{share:.0%} of the bytes held", retry_on=(Exception,))
            sub.kill()  # SIGKILL
            rec["verified_before_kill"] = round(held / self.total, 3)
            rec["complete_bytes_at_kill"] = round(self._held_offline(sub) / self.total, 3)
            rec["complete_at_kill"], rec["corrupt_at_kill"] = self.check_links(sub)
            sub.start()
            sub.wait_ready()
            wait_until(lambda: self.check_links(sub)[0] == len(self.files), timeout_s, interval=0.25,
                       what="every copy complete after the restart", retry_on=(Exception,))
            good, bad = self.check_links(sub)
            fetched = sum(sub.get("/sync/status", timeout=10)["distribution"]["bytes_fetched"].values())
            rec["fetched_after_restart"] = round(fetched / self.total, 3)  # the verified blocks were not fetched again
            partial = list((sub.data_dir / ".sync" / "dist" / "partial").iterdir())
            rec.update(complete=good, corrupt=bad, partial_left=len(partial), seconds=round(time.monotonic() - t0, 2))
            rec["ok"] = (rec["corrupt_at_kill"] == 0 and bad == 0 and good == len(self.files) and not partial
                         and rec["complete_at_kill"] < len(self.files))
        except AssertionError as exc:
            rec.update(ok=False, error=str(exc)[:300])
        finally:
            sub.kill()
            shutil.rmtree(sub.data_dir, ignore_errors=True)
        return rec

    def _held_offline(self, sub: AgentProc) -> int:
        """Bytes of complete versions on disk after the kill (the share verified in partial files is not read)."""
        folder = sub.data_dir / "published" / ".versions"
        return sum(p.stat().st_size for p in folder.iterdir()) if folder.exists() else 0


# -- the WAL sender killed mid-segment -----------------------------------------------------------------------------
class Writer(threading.Thread):
    """Commits transactions of 10 rows (300 bytes each; every fifth transaction 30 KiB rows: longer segments) into
    ``path`` until stopped; :attr:`rows` is the count committed."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.rows = 0
        self.stop = threading.Event()

    def run(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        n = 0
        while not self.stop.is_set():
            size = 30 * 1024 if n % 5 == 4 else 300
            db.execute("BEGIN")
            db.executemany("INSERT INTO t (v) VALUES (randomblob(?))", [(size,)] * 10)
            db.execute("COMMIT")
            self.rows += 10
            n += 1
            self.stop.wait(0.02)  # pacing the writer
        db.close()


def prefill(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("CREATE TABLE fill (id INTEGER PRIMARY KEY, v BLOB)")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
    while path.stat().st_size < size:
        db.execute("BEGIN")
        db.executemany("INSERT INTO fill (v) VALUES (randomblob(?))", [(3000,)] * 1000)
        db.execute("COMMIT")
    db.execute("PRAGMA journal_mode=WAL")
    db.close()
    old = time.time() - 60
    os.utime(path, (old, old))


class Monitor(threading.Thread):
    """Samples the replica every 0.1 s: ``quick_check``, rows are ids 1..n, n a multiple of 10, never lower."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.samples = 0
        self.bad: list[str] = []
        self.last = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()  # samples one at a time: a read is compared with the read before it

    def sample(self) -> None:
        with self.lock:
            self._sample()

    def _sample(self) -> None:
        if not self.path.exists():
            return
        try:
            r = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5)
        except sqlite3.Error:
            return
        try:
            check = r.execute("PRAGMA quick_check").fetchone()[0]
            n, top = r.execute("SELECT count(*), coalesce(max(id), 0) FROM t").fetchone()
        except sqlite3.Error as exc:
            if "locked" not in str(exc) and "no such table" not in str(exc):
                self.bad.append(f"read: {exc}")
            return
        finally:
            r.close()
        self.samples += 1
        if check != "ok":
            self.bad.append(f"quick_check: {check}")
        if n != top or n % 10:
            self.bad.append(f"rows {n}, max id {top}: not a transaction boundary")
        if n < self.last:
            self.bad.append(f"rows went from {self.last} down to {n}: applied out of order")
        self.last = max(self.last, n)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(0.1)


class WalRig:
    """One durable agent receiving; per seed an ephemeral agent (its own data dir) shipping a live database."""

    def __init__(self, work: Path, db_mib: int) -> None:
        self.work = work
        self.db_mib = db_mib
        self.durable = AgentProc(work / "durable", free_port(), "--no-mdns", "--tag", "durable",
                                 env={**ENV, "P2PNODE_SYNC_INTERVAL_S": "1",
                                      "P2PNODE_SYNC_MAX_REQUEST_BYTES": str(17 * MiB)})

    def start(self, timeout_s: float) -> None:
        self.durable.start()
        self.durable.wait_ready()

    def close(self) -> None:
        self.durable.kill()

    def _cut(self) -> int:
        refused = self.durable.get("/sync/status", timeout=10)["received"]["refused_requests"]
        return sum(refused.get(k, 0) for k in ("disconnected", "malformed", "too_slow"))

    def run_seed(self, seed: int, timeout_s: float) -> dict[str, Any]:
        rng = random.Random(seed)
        kill_after = rng.uniform(0.2, 4.0)
        into_body = rng.uniform(0.0, 0.05)
        eph = AgentProc(self.work / f"eph{seed}", free_port(), "--no-mdns", "--tag", "ephemeral", "--join",
                        f"127.0.0.1:{self.durable.port}", env={**ENV, "P2PNODE_SYNC_INTERVAL_S": "1"})
        db = eph.data_dir / "data" / "cfg" / "live.db"
        prefill(db, self.db_mib * MiB)
        rec: dict[str, Any] = {"seed": seed}
        writer = Writer(db)
        monitor: Monitor | None = None
        t0 = time.monotonic()
        try:
            cut0 = self._cut()
            writer.start()
            eph.start()
            ident = eph.wait_ready()["node"]["id"]
            monitor = Monitor(self.durable.data_dir / "walreplicas" / ident / "cfg" / "live.db")
            monitor.start()
            spool = self.durable.data_dir / ".sync" / "walin"
            try:
                wait_until(lambda: any(f.stat().st_size > 0 for f in spool.iterdir()), 60, interval=0.005,
                           what="a segment arriving", retry_on=(OSError,))
                time.sleep(into_body)  # the seeded kill point inside the body (a time, not a synchronisation)
                rec["kill"] = f"{into_body * 1000:.0f} ms into a segment's body"
            except AssertionError:
                time.sleep(kill_after)
                rec["kill"] = f"{kill_after:.2f} s after the start"
            eph.kill()  # SIGKILL
            monitor.sample()
            rec["rows_at_kill"] = writer.rows
            rec["replica_rows_at_kill"] = monitor.last
            eph.start()
            eph.wait_ready()
            wait_until(lambda: monitor.samples >= 30, timeout_s, what="30 samples of the replica while it is written")
            writer.stop.set()
            writer.join()
            wait_until(lambda: monitor.sample() or monitor.last == writer.rows, timeout_s, interval=0.25,
                       what=f"the replica at the source's {writer.rows} rows")
            r = sqlite3.connect(f"file:{monitor.path}?mode=ro", uri=True)
            try:
                final = r.execute("PRAGMA integrity_check").fetchone()[0]
            finally:
                r.close()
            rec.update(rows=writer.rows, samples=monitor.samples, integrity=final, cut_mid_segment=self._cut() - cut0,
                       problems=monitor.bad[:5], seconds=round(time.monotonic() - t0, 2))
            rec["ok"] = final == "ok" and not monitor.bad
        except AssertionError as exc:
            rec.update(ok=False, error=str(exc)[:300], problems=monitor.bad[:5] if monitor else [])
        finally:
            writer.stop.set()
            if monitor is not None:
                monitor.stop.set()
            eph.kill()
            shutil.rmtree(eph.data_dir, ignore_errors=True)
        return rec


def run(mode: str, seeds: list[int], *, files: int = 1, mib: int = 1024, db_mib: int = 64, rate: int = 0,
        timeout_s: float = 600.0, work: Path | None = None) -> dict[str, Any]:
    """Run ``seeds`` of ``mode`` (``dist`` or ``wal``); the summary and each seed's record."""
    with contextlib.ExitStack() as stack:
        if work is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="p2pnode-kill-")))
        rig: DistRig | WalRig
        if mode == "dist":
            if files == 1:
                sizes = {"model.safetensors": mib * MiB + 777}
            else:
                rng = random.Random(1)
                sizes = {f"shard-{i:03d}.bin": rng.randint(4 * 1024, max(8 * 1024, mib * MiB // files * 2))
                         for i in range(files)}
            rig = DistRig(work, sizes, rate)
        else:
            rig = WalRig(work, db_mib)
        try:
            rig.start(timeout_s)
            records = []
            for s in seeds:
                rec = rig.run_seed(s, timeout_s)
                records.append(rec)
                print(json.dumps(rec), file=sys.stderr, flush=True)
        finally:
            rig.close()
    ok = sum(1 for r in records if r.get("ok"))
    out: dict[str, Any] = {"mode": mode, "seeds": len(records), "ok": ok, "records": records}
    if mode == "dist":
        out.update(files=files, bytes=rig.total, corrupt=sum(r.get("corrupt_at_kill", 0) + r.get("corrupt", 0)
                                                              for r in records))
    else:
        out.update(db_mib=db_mib, cut_mid_segment=sum(1 for r in records if r.get("cut_mid_segment", 0) > 0),
                   samples=sum(r.get("samples", 0) for r in records))
    secs = [r["seconds"] for r in records if "seconds" in r]
    out["seconds_median"] = sorted(secs)[len(secs) // 2] if secs else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("dist", "wal"), default="dist")
    ap.add_argument("--seeds", type=int, default=20, help="seeded runs (seeds FIRST..FIRST+N-1; default 20)")
    ap.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    ap.add_argument("--files", type=int, default=1, help="dist: published files (1: one of --mib; default 1)")
    ap.add_argument("--mib", type=int, default=1024, help="dist: MiB in all (default 1024)")
    ap.add_argument("--rate", type=int, default=0, help="dist: the publisher's bytes/s (0: unpaced)")
    ap.add_argument("--db-mib", type=int, default=64, help="wal: the database's size before the run (default 64)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per wait (default 600)")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    res = run(ns.mode, list(range(ns.first, ns.first + ns.seeds)), files=ns.files, mib=ns.mib, db_mib=ns.db_mib,
              rate=ns.rate, timeout_s=ns.timeout)
    if ns.json:
        print(json.dumps(res, indent=2))
    elif ns.mode == "dist":
        print(f"subscriber kill -9 mid-distribution, {res['files']} file(s), {res['bytes'] / MiB:.0f} MiB: "
              f"{res['ok']}/{res['seeds']} seeds ok (nothing corrupt at the kill, every copy complete and identical "
              f"after the restart); corrupt copies {res['corrupt']}; median seed {res['seconds_median']} s")
    else:
        print(f"WAL sender kill -9 mid-segment, {ns.db_mib} MiB database: {res['ok']}/{res['seeds']} seeds ok "
              f"({res['samples']} replica samples, every one at a transaction boundary and never behind the one "
              f"before; the replica complete after the restart); kills inside a segment's body "
              f"{res['cut_mid_segment']}/{res['seeds']}; median seed {res['seconds_median']} s")
    return 0 if res["ok"] == res["seeds"] else 1


if __name__ == "__main__":
    sys.exit(main())
