"""A live WAL-mode database shipped by its WAL segments (issue 40's acceptance scenario), in one process.

A writer thread commits 300-byte records in transactions of 10 at 50 inserts/s into a database grown to
``--db-size`` first; a sender thread polls every ``--interval`` s (p2pnode.sync._walsend.WalSender) and hands the
signed segments to a receiver thread (p2pnode.sync._walreplica.WalReplicas) through a queue (the bytes a network
would carry). Optionally a checkpoint (TRUNCATE, by another connection) and a VACUUM on the source during the run.

Reported over the steady window (after the first snapshot; snapshots reported apart): bytes sent per byte of record
payload, sender and receiver CPU (each thread's own CPU time) as % of one core, replica lag (a commit to the apply
of the segment that carried it), snapshots by reason, the largest -wal seen; each sampled replica (between two
applies) passes integrity_check and matches the row count the writer had at that segment's position.

    python bench/sync_wal.py                              # the acceptance run: 1 GiB, 5 minutes
    python bench/sync_wal.py --db-size 100M --seconds 60  # a quick one
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import queue
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from p2pnode.identity import Identity  # noqa: E402
from p2pnode.sync._walreplica import WalReplicas  # noqa: E402
from p2pnode.sync._walsend import WalSender  # noqa: E402

RECORD = 300
TXN = 10


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def prefill(path: Path, size: int) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("CREATE TABLE fill (id INTEGER PRIMARY KEY, v BLOB)")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB, at REAL)")
    while path.stat().st_size < size:
        db.execute("BEGIN")
        db.executemany("INSERT INTO fill (v) VALUES (randomblob(?))", [(3000,)] * 2000)
        db.execute("COMMIT")
    db.execute("PRAGMA journal_mode=WAL")
    db.close()


class Run:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.src = tmp / "src" / "games.db"
        self.src.parent.mkdir()
        self.me = Identity.generate()
        counter = itertools.count(1)
        self.sender = WalSender(self.src, "games.db", self.me, next_seq=lambda: next(counter),
                                staging_dir=tmp / "staging")
        self.replicas = WalReplicas(tmp / "replicas", key_of={self.me.node_id: self.me.public_key}.get)
        self.q: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.commits: list[tuple[float, int]] = []  # (commit time, rows after it)
        self.polls: dict[int, tuple[float, int]] = {}  # seq -> (poll start, rows committed before it)
        self.applied: list[tuple[int, float]] = []
        self.bytes_frames = 0
        self.bytes_snapshot = 0
        self.cpu = {"sender": 0.0, "receiver": 0.0, "sender_snapshot": 0.0}
        self.samples = {"ok": 0, "bad": 0}
        self.max_wal = 0
        self.max_wal_steady = 0
        self.last_rows = 0
        self.payload_steady = 0  # record bytes carried by the steady frames segments (rows between their polls)
        self.errors: list[BaseException] = []
        self.steady_from = 0.0
        self.events: list[str] = []
        self.vacuum_start = 0.0
        self.vacuum_done = 0.0
        self.vacuum_closed = False
        self.bytes_vacuum = 0
        self.apart: set[int] = set()  # seqs of snapshots and of the VACUUM's segments: not in the steady figures
        self.closing = threading.Event()

    def writer(self) -> None:
        w = sqlite3.connect(self.src, isolation_level=None, timeout=0)
        w.execute(f"PRAGMA wal_autocheckpoint={self.args.autocheckpoint}")
        rows = w.execute("SELECT count(*) FROM t").fetchone()[0]
        period = TXN / self.args.rate
        t0 = time.monotonic()
        try:
            for i in itertools.count():
                if self.stop.is_set():
                    break
                w.execute("BEGIN")
                w.executemany("INSERT INTO t (v, at) VALUES (randomblob(?), ?)", [(RECORD, time.time())] * TXN)
                w.execute("COMMIT")
                rows += TXN
                self.commits.append((time.monotonic(), rows))
                el = time.monotonic() - t0
                if self.args.checkpoint_at and abs(el - self.args.checkpoint_at) < period / 2:
                    o = sqlite3.connect(self.src, isolation_level=None, timeout=5)
                    got = o.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    o.close()
                    self.events.append(f"checkpoint(TRUNCATE) at {el:.0f}s: (busy, log, done) {got}")
                if self.args.vacuum_at and abs(el - self.args.vacuum_at) < period / 2:
                    self.vacuum_start = time.monotonic()
                    w.execute("VACUUM")
                    self.vacuum_done = time.monotonic()
                    self.events.append(f"VACUUM at {el:.0f}s")
                behind = time.monotonic() - (t0 + (i + 1) * period)
                if behind > period:  # after a stall (the VACUUM) the rate stays 50/s: no burst to catch up
                    t0 += behind
                self.stop.wait(max(0.0, t0 + (i + 1) * period - time.monotonic()))  # load pacing
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)
        finally:
            self.closing.wait()  # keep the log until the last poll: a last close deletes it (a snapshot then)
            w.close()

    def sender_loop(self) -> None:
        nxt = time.monotonic()
        try:
            while not self.stop.is_set():
                start = time.monotonic()
                rows = self.commits[-1][1] if self.commits else 0
                c0 = time.thread_time()
                out = self.sender.poll(now=start) or []
                c1 = time.thread_time()
                snap = any(o.header.kind == "snapshot" for o in out)
                vac = bool(self.vacuum_start) and start >= self.vacuum_start and not self.vacuum_closed
                if self.vacuum_done and start >= self.vacuum_done:
                    self.vacuum_closed = True  # this poll carries the rest of the VACUUM; later ones are steady
                self.cpu["sender_snapshot" if snap or vac else "sender"] += c1 - c0
                carried, self.last_rows = rows - self.last_rows, rows
                for o in out:
                    self.polls[o.header.seq] = (start, rows)
                    n = len(o.head) + (o.payload.stat().st_size if isinstance(o.payload, Path) else len(o.payload))
                    if snap or vac:
                        self.apart.add(o.header.seq)
                    if snap:
                        self.bytes_snapshot += n
                    elif vac:
                        self.bytes_vacuum += n
                    elif start >= self.steady_from:
                        self.bytes_frames += n
                        self.payload_steady += carried * RECORD
                    self.q.put(o)
                try:
                    wal = os.path.getsize(str(self.src) + "-wal")
                except FileNotFoundError:
                    wal = 0
                self.max_wal = max(self.max_wal, wal)
                if not self.vacuum_start:  # after a VACUUM the file keeps its size (SQLite reuses it)
                    self.max_wal_steady = max(self.max_wal_steady, wal)
                nxt += self.args.interval
                self.stop.wait(max(0.0, nxt - time.monotonic()))
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)
        finally:
            self.q.put(None)

    def receiver_loop(self) -> None:
        sampled = 0.0
        try:
            while (o := self.q.get()) is not None:
                c0 = time.thread_time()
                h = self.replicas.receive(o.head, o.payload)
                c1 = time.thread_time()
                o.discard()
                if h.seq not in self.apart and self.polls[h.seq][0] >= self.steady_from:
                    self.cpu["receiver"] += c1 - c0
                self.applied.append((h.seq, time.monotonic()))
                if time.monotonic() - sampled >= self.args.sample_every:
                    sampled = time.monotonic()
                    self.sample(h.seq)
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)

    def sample(self, seq: int) -> None:
        path = self.replicas.root / self.me.node_id / "games.db"
        r = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            ok = r.execute("PRAGMA integrity_check").fetchone()[0] == "ok" if self.args.integrity else True
            rows = r.execute("SELECT count(*) FROM t").fetchone()[0]
        finally:
            r.close()
        poll_rows = self.polls[seq][1]
        # the segment carries every commit before its poll started, and maybe some during it
        later = [n for t, n in self.commits if t <= time.monotonic()]  # every commit before this check
        good = ok and poll_rows <= rows <= (later[-1] if later else rows) and rows % TXN == 0
        self.samples["ok" if good else "bad"] += 1
        if not good:
            print(f"BAD SAMPLE seq {seq}: integrity {'ok' if ok else 'FAILED'}, rows {rows}, committed before the "
                  f"poll {poll_rows}, before this check {later[-1] if later else None}", flush=True)


def lags(run: Run) -> tuple[list[float], list[float]]:
    """Each commit's lag (its commit to the apply of the segment that carried it): all of them in the window,
    and the steady ones: not carried by a snapshot or the VACUUM's segments, nor made from such a segment's poll
    to one interval after its apply (they wait for it)."""
    applied = {seq: t for seq, t in run.applied}
    polls = sorted((p[0], seq) for seq, p in run.polls.items() if seq in applied)
    apart = [(run.polls[seq][0], applied[seq] + run.args.interval) for seq in run.apart if seq in applied]
    if run.vacuum_start:
        apart.append((run.vacuum_start, max([b for _, b in apart], default=run.vacuum_start)))
    every, steady = [], []
    j = 0
    for t, _ in list(run.commits):
        while j < len(polls) and polls[j][0] < t:
            j += 1
        if j < len(polls) and t >= run.steady_from:
            lag = applied[polls[j][1]] - t
            every.append(lag)
            if polls[j][1] not in run.apart and not any(a <= t <= b for a, b in apart):
                steady.append(lag)
    return every, steady


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db-size", default="1G", help="grow the source to this size first (e.g. 100M, 1G)")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--rate", type=float, default=50.0, help="records per second")
    ap.add_argument("--interval", type=float, default=5.0, help="sender poll interval (s; sync.interval_s is 5)")
    ap.add_argument("--autocheckpoint", type=int, default=1000, help="the writer's wal_autocheckpoint (pages)")
    ap.add_argument("--checkpoint-at", type=float, default=0.0, help="TRUNCATE checkpoint at this second (0: no)")
    ap.add_argument("--vacuum-at", type=float, default=0.0, help="VACUUM at this second (0: none)")
    ap.add_argument("--sample-every", type=float, default=10.0, help="check the replica every this many s")
    ap.add_argument("--no-integrity", dest="integrity", action="store_false",
                    help="sample row counts only (integrity_check reads the whole replica)")
    ap.add_argument("--dir", default=None, help="work folder (default: a temp dir, removed after)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms %(message)s")
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        run = Run(args, Path(d))
        t = time.monotonic()
        prefill(run.src, _size(args.db_size))
        print(f"prefill {run.src.stat().st_size / 2**20:.0f} MiB in {time.monotonic() - t:.1f} s", flush=True)
        st = threading.Thread(target=run.sender_loop)
        rt = threading.Thread(target=run.receiver_loop)
        rt.start()
        st.start()
        while not run.applied:  # the first snapshot
            if run.errors or not st.is_alive():
                break
            run.stop.wait(0.05)
        run.steady_from = time.monotonic()
        wt = threading.Thread(target=run.writer)
        wt.start()
        run.stop.wait(args.seconds)
        run.stop.set()
        st.join()
        rt.join()
        # the last commits: one more poll after the writer stopped
        final = time.monotonic()
        for o in run.sender.poll(now=final) or []:
            run.polls[o.header.seq] = (final, run.commits[-1][1] if run.commits else 0)
            run.replicas.receive(o.head, o.payload)
            o.discard()
        run.closing.set()
        wt.join()
        if run.errors:
            print("ERRORS:", run.errors)
        run.sample(run.sender.last_seq)
        window = time.monotonic() - run.steady_from
        payload = (run.commits[-1][1] if run.commits else 0) * RECORD
        lg_all, lg = lags(run)
        s = run.sender.stats
        print(f"window {window:.0f} s, {len(run.commits)} transactions, {payload / 1e6:.2f} MB of record payload")
        print(f"bytes sent per payload byte (steady): {run.bytes_frames / max(1, run.payload_steady):.3f}  "
              f"({run.bytes_frames / 1e6:.2f} MB for {run.payload_steady / 1e6:.2f} MB of records; "
              f"{s['segments']} frames segments in all)")
        if run.bytes_vacuum:
            print(f"the VACUUM's frames segment: {run.bytes_vacuum / 2**20:.1f} MiB (apart)")
        print(f"snapshots: {s['snapshots']} ({run.bytes_snapshot / 2**20:.0f} MiB), by reason: "
              f"{ {k: v for k, v in s.items() if k.startswith('snapshot:')} }; resets that lost nothing: "
              f"{s['resets_continued']}")
        print(f"CPU (% of one core over the window): sender {100 * run.cpu['sender'] / window:.2f} %, receiver "
              f"{100 * run.cpu['receiver'] / window:.2f} %; snapshots' sender CPU apart: "
              f"{run.cpu['sender_snapshot']:.2f} s")
        if lg:
            print(f"lag (steady): p50 {statistics.median(lg):.2f} s, max {max(lg):.2f} s (interval {args.interval} s);"
                  f" every commit: max {max(lg_all):.2f} s")
        print(f"largest -wal: {run.max_wal_steady / 2**20:.2f} MiB before the VACUUM, {run.max_wal / 2**20:.2f} MiB "
              f"in all (autocheckpoint {args.autocheckpoint} pages)")
        print(f"replica samples: {run.samples['ok']} ok, {run.samples['bad']} bad; refused: "
              f"{dict(run.replicas.refused)}; events: {run.events}")
        return 1 if run.errors or run.samples["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
