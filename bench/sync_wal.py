"""A live WAL-mode database shipped by its WAL segments (issue 40's acceptance scenario), in one process or between
two agents (``--agents``).

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

**Between two agents** (``--agents``, root: ``ip netns``): two ``p2pnode agent`` processes in network namespaces
on one bridge, an ephemeral one holding the database (the writer is a thread of this process, writing into its
data dir) and a durable one receiving its segments (``sync.interval_s`` = ``--interval``). Measured from outside,
per one-second bin: the ephemeral agent's interface's kernel ``tx_bytes`` (everything it sends the durable one:
WAL segments, the backup path, gossip, TCP and HTTP), each agent process's CPU (``/proc/<pid>/stat`` utime +
stime, every thread), the load average; the replica's rows every 0.2 s (a read-only connection, like any reader:
the lag of each commit is the first sample showing it); every ``--sample-every`` s and once each checkpoint and
VACUUM were taken, a safe copy of the replica (inside a read transaction, which an apply waits for) checked with
``integrity_check``, its rows a transaction boundary the source reached, and its data against the source's at
that boundary (every row of both tables after the events and at the end). Steady figures leave out each
checkpoint's and VACUUM's span (from its start until the replica shows a later commit, plus one interval; a commit
shown within it waited on it); the idle agents' traffic (gossip) is measured before the writer starts and
reported apart. ``--fragment N`` deletes every Nth prefill row first, so a VACUUM moves most pages.

    python bench/sync_wal.py --agents --checkpoint-at 100 --vacuum-at 200 --sample-every 60   # the acceptance run
    python bench/sync_wal.py --agents --checkpoint-at 100 --vacuum-at 200 --sample-every 60 --fragment 3
    python bench/sync_wal.py --agents --db-size 100M --seconds 40 --checkpoint-at 10 --vacuum-at 25
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
import queue
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

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


# -- two agents (--agents) ---------------------------------------------------------------------------------------
def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, every thread (``/proc/<pid>/stat`` utime and stime)."""
    with open(f"/proc/{pid}/stat") as fh:
        raw = fh.read()
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tx_bytes(pid: int, ifname: str) -> int:
    """Bytes interface ``ifname`` of process ``pid``'s network namespace sent (kernel counter,
    ``/proc/<pid>/net/dev``)."""
    with open(f"/proc/{pid}/net/dev") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name.strip() == ifname:
                return int(rest.split()[8])
    raise KeyError(ifname)


def _agent_pid(proc: Any) -> int:
    """The agent's own pid (``ip netns exec`` execs it in place; a wrapper that forks is looked through)."""
    pid = proc.proc.pid
    for _ in range(50):
        if Path(f"/proc/{pid}/comm").read_text().strip().startswith("python"):
            return pid
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if kids:
            return int(kids[0])
        time.sleep(0.1)
    return pid


def _content_hash(db: sqlite3.Connection, rows: int, *, fill: bool) -> str:
    """BLAKE3 of the records ``t`` with id ≤ ``rows`` and, with ``fill``, of every ``fill`` row (else its count):
    two databases with the same hash hold the same data at that transaction boundary."""
    import blake3

    h = blake3.blake3()
    for row in db.execute("SELECT id, v, at FROM t WHERE id <= ? ORDER BY id", (rows,)):
        h.update(repr(row[0]).encode() + bytes(row[1]) + repr(row[2]).encode())
    if fill:
        for row in db.execute("SELECT id, v FROM fill ORDER BY id"):
            h.update(repr(row[0]).encode() + bytes(row[1]))
    else:
        h.update(repr(db.execute("SELECT count(*) FROM fill").fetchone()[0]).encode())
    return h.hexdigest()


class AgentRun:
    """Two ``p2pnode agent`` processes in network namespaces: ``n0`` (ephemeral) holds the live database that the
    writer (a thread of this process) commits to, ``n1`` (durable) receives its segments. Measured from outside:
    ``n0``'s interface's kernel ``tx_bytes`` (everything the sender sends: WAL segments, the backup path, gossip,
    TCP), each agent's CPU from ``/proc/<pid>/stat``, the replica's row count every 0.2 s (lag), safe copies of the
    replica (integrity_check, rows, content against the source)."""

    def __init__(self, args: argparse.Namespace, work: Path, lab: Any) -> None:
        from agents import AgentProc

        self.args, self.work, self.lab = args, work, lab
        self.db = work / "n0" / "data" / "games.db"
        env = {"P2PNODE_SYNC_INTERVAL_S": str(args.interval)}
        addr1 = lab.addrs[1]
        self.eph = AgentProc(work / "n0", 8770, "--no-mdns", "--tag", "ephemeral", "--join", f"{addr1}:8770",
                             bind=lab.addrs[0], prefix=lab.prefix_for(0), env=env)
        self.dur = AgentProc(work / "n1", 8770, "--no-mdns", "--tag", "durable", bind=addr1,
                             prefix=lab.prefix_for(1), env=env)
        self.ifname = f"{lab.prefix}h0"
        self.replica: Path | None = None
        self.idle = (0.0, 0.0, 0.0)  # before the writer starts: n0's bytes/s sent, each agent's CPU s/s
        self.stop = threading.Event()  # the writer stops committing
        self.done = threading.Event()  # the sampler, monitor and checker stop
        self.release = threading.Event()  # the writer closes its connection (after the agents stopped)
        self.commits: list[tuple[float, int]] = []
        self.bins: list[tuple[float, int, float, float, float, int]] = []  # t, tx, cpu n0, cpu n1, load1, -wal
        self.obs: list[tuple[float, int, int]] = []  # t, replica inode, rows
        self.events: list[tuple[str, float, float, int]] = []  # name, start, end, rows committed at its end
        self.samples: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []
        self.writer_started = 0.0
        self.writer_started_wall = 0.0
        self.writer_stopped = 0.0

    # -- agents ----------------------------------------------------------------------------------------------
    def status(self, i: int, path: str = "/sync/status") -> dict[str, Any]:
        import json

        out = self.lab.sh(self.lab.names[i], sys.executable, "-c",
                          "import json,urllib.request as u;print(json.dumps(json.load(u.urlopen("
                          f"'http://{self.lab.addrs[i]}:8770{path}',timeout=10))))")
        return json.loads(out.stdout)

    def start(self) -> None:
        from agents import wait_until

        t = time.monotonic()
        self.db.parent.mkdir(parents=True)
        prefill(self.db, _size(self.args.db_size))
        if self.args.fragment:  # free pages spread through the file: a VACUUM then moves most pages
            db = sqlite3.connect(self.db, isolation_level=None)
            db.execute("DELETE FROM fill WHERE id % ? = 0", (self.args.fragment,))
            db.close()
        print(f"prefill {self.db.stat().st_size / 2**20:.0f} MiB in {time.monotonic() - t:.1f} s"
              f"{f', every {self.args.fragment}th fill row deleted' if self.args.fragment else ''}", flush=True)
        self.dur.start()
        self.eph.start()
        self.pids = (_agent_pid(self.eph), _agent_pid(self.dur))
        t = time.monotonic()

        def settled() -> bool:
            files = self.status(0)["files"]
            return bool(files) and files[0]["replicas"] >= 1 and files[0].get("carried_by") == "wal"

        wait_until(settled, 900, interval=1.0, what="the first snapshot and backup copy confirmed",
                   retry_on=(Exception,))
        self.replica = next((self.work / "n1" / "walreplicas").glob("*/games.db"))
        pid = self.pids[0]

        def quiet() -> bool:  # nothing but gossip for 5 s: the first transfers are over
            a = _tx_bytes(pid, self.ifname)
            time.sleep(5.0)
            return _tx_bytes(pid, self.ifname) - a < 100_000

        wait_until(quiet, 300, interval=0.0, what="the first transfers over")
        a, c0, c1, t0 = _tx_bytes(pid, self.ifname), _cpu_s(pid), _cpu_s(self.pids[1]), time.monotonic()
        time.sleep(self.args.idle_s)  # the agents idle (no commits): what gossip and keep-alives cost alone
        dt = time.monotonic() - t0
        self.idle = ((_tx_bytes(pid, self.ifname) - a) / dt, (_cpu_s(pid) - c0) / dt,
                     (_cpu_s(self.pids[1]) - c1) / dt)
        print(f"agents up, first snapshot and backup copy confirmed in {time.monotonic() - t:.1f} s", flush=True)

    # -- threads ---------------------------------------------------------------------------------------------
    def writer(self) -> None:
        w = sqlite3.connect(self.db, isolation_level=None, timeout=0)
        try:
            w.execute(f"PRAGMA wal_autocheckpoint={self.args.autocheckpoint}")
            rows = w.execute("SELECT count(*) FROM t").fetchone()[0]
            period = TXN / self.args.rate
            t0 = self.writer_started = time.monotonic()
            self.writer_started_wall = time.time()
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
                    a = time.monotonic()
                    o = sqlite3.connect(self.db, isolation_level=None, timeout=5)
                    got = o.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    o.close()
                    self.events.append((f"checkpoint(TRUNCATE) {got}", a, time.monotonic(), rows))
                if self.args.vacuum_at and abs(el - self.args.vacuum_at) < period / 2:
                    a = time.monotonic()
                    w.execute("VACUUM")
                    self.events.append(("VACUUM", a, time.monotonic(), rows))
                behind = time.monotonic() - (t0 + (i + 1) * period)
                if behind > period:  # after a stall (the VACUUM) the rate stays 50/s: no burst to catch up
                    t0 += behind
                self.stop.wait(max(0.0, t0 + (i + 1) * period - time.monotonic()))
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)
        finally:
            self.writer_stopped = time.monotonic()
            self.release.wait()  # closing the last connection deletes the log: a snapshot the run does not measure
            w.close()

    def sampler(self) -> None:
        s, r = self.pids
        wal = Path(str(self.db) + "-wal")
        while not self.done.is_set():
            try:
                size = wal.stat().st_size
            except FileNotFoundError:
                size = 0
            with open("/proc/loadavg") as fh:
                load = float(fh.read().split()[0])
            self.bins.append((time.monotonic(), _tx_bytes(s, self.ifname), _cpu_s(s), _cpu_s(r), load, size))
            self.done.wait(1.0)

    def read_rows(self) -> tuple[int, int] | None:
        """(inode, rows) of the replica, read like any reader (a read-only connection; it waits on an apply)."""
        assert self.replica is not None
        try:
            ino = self.replica.stat().st_ino
            r = sqlite3.connect(f"file:{self.replica}?mode=ro", uri=True, timeout=10)
            try:
                rows = r.execute("SELECT coalesce(max(id), 0) FROM t").fetchone()[0]
            finally:
                r.close()
            return (ino, rows) if self.replica.stat().st_ino == ino else None
        except (OSError, sqlite3.Error):
            return None

    def monitor(self) -> None:
        while not self.done.is_set():
            got = self.read_rows()
            if got is not None:
                self.obs.append((time.monotonic(), *got))
            self.done.wait(0.2)

    def safe_copy(self, dest: Path) -> float:
        """Copy the replica inside a read transaction (SQLite's shared lock: an apply waits for it, as for any
        reader; a snapshot is renamed in beside it): a database at one transaction boundary. Seconds held."""
        assert self.replica is not None
        for _ in range(20):
            fd = os.open(self.replica, os.O_RDONLY)
            conn = None
            try:
                conn = sqlite3.connect(f"file:{self.replica}?mode=ro", uri=True, timeout=30)
                conn.execute("BEGIN")
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                if os.stat(self.replica).st_ino != os.fstat(fd).st_ino:
                    continue  # a snapshot was renamed in meanwhile: copy that one
                t = time.monotonic()
                size = os.fstat(fd).st_size
                with open(dest, "wb") as out:
                    done = 0
                    while done < size:
                        n = os.copy_file_range(fd, out.fileno(), size - done, done, done)
                        if n == 0:
                            break
                        done += n
                held = time.monotonic() - t
                conn.execute("COMMIT")
                return held
            finally:
                if conn is not None:
                    conn.close()
                os.close(fd)  # after the connection: closing a file drops this process's POSIX locks on it
        raise RuntimeError("the replica kept changing under the copy")

    def check(self, why: str, *, full: bool) -> None:
        """One sampled replica: a safe copy, ``integrity_check``, its rows a transaction boundary the source
        reached, and its data the source's at that boundary (``full``: every ``fill`` row compared too)."""
        dest = self.work / "sample.db"
        t = time.monotonic()
        held = self.safe_copy(dest)
        committed = self.commits[-1][1] if self.commits else 0
        try:
            c = sqlite3.connect(f"file:{dest}?mode=ro", uri=True)
            try:
                ok = c.execute("PRAGMA integrity_check").fetchone()[0]
                n, top = c.execute("SELECT count(*), coalesce(max(id), 0) FROM t").fetchone()
                mine = _content_hash(c, n, fill=full)
            finally:
                c.close()
            s = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
            try:
                theirs = _content_hash(s, n, fill=full)
            finally:
                s.close()
        finally:
            dest.unlink(missing_ok=True)
        good = ok == "ok" and n == top and n % TXN == 0 and n <= committed and mine == theirs
        rec = {"why": why, "at_s": round(t - self.writer_started, 1), "integrity": ok, "rows": n,
               "source_rows_at_copy": committed, "same_data": mine == theirs, "full": full,
               "lock_held_s": round(held, 2), "ok": good}
        self.samples.append(rec)
        print(f"sample: {rec}", flush=True)

    def checker(self) -> None:
        nxt = time.monotonic() + self.args.sample_every
        checked: set[int] = set()
        try:
            while not self.done.is_set():
                for k, (name, _a, b, rows) in enumerate(list(self.events)):
                    if k not in checked and self._caught_up(b, rows + TXN):
                        checked.add(k)
                        self.check(f"after {name.split()[0]}", full=True)
                if time.monotonic() >= nxt:
                    self.check("periodic", full=False)
                    nxt = time.monotonic() + self.args.sample_every
                self.done.wait(1.0)
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)

    def _caught_up(self, since: float, rows: int) -> bool:
        """The replica showed ``rows`` or more after ``since`` (the event's end): it has taken the event."""
        return any(t >= since and n >= rows for t, _, n in list(self.obs))

    # -- the figures -----------------------------------------------------------------------------------------
    def apart_ranges(self) -> list[tuple[str, float, float]]:
        """Each checkpoint's and VACUUM's span: from its start until the replica holds a commit made after its
        end, plus one interval (what the event cost: its snapshot or its large segment)."""
        out = []
        for name, a, b, rows in self.events:
            end = next((t for t, _, n in self.obs if t >= b and n > rows), self.obs[-1][0] if self.obs else b)
            out.append((name, a, end + self.args.interval))
        return out

    def figures(self) -> dict[str, Any]:
        apart = self.apart_ranges()
        lo, hi = self.writer_started, self.writer_stopped + self.args.interval + 1.0

        def steady(a: float, b: float) -> bool:
            return a >= lo and b <= hi and not any(a < y and b > x for _, x, y in apart)

        f: dict[str, float] = Counter()
        for (a, tx0, s0, r0, _, _), (b, tx1, s1, r1, _, _) in itertools.pairwise(self.bins):
            key = "steady_" if steady(a, b) else ("apart_" if a >= lo and b <= hi else "")
            if not key:
                continue
            for k in (key, "window_"):
                f[k + "s"] += b - a
                f[k + "tx"] += tx1 - tx0
                f[k + "cpu0"] += s1 - s0
                f[k + "cpu1"] += r1 - r0
        spans = [(a, b) for a, b in itertools.pairwise([t for t, *_ in self.bins]) if steady(a, b)]
        for (_, ia, na), (t, ib, nb) in itertools.pairwise(self.obs):
            if ia == ib and nb > na and any(x <= t < y for x, y in spans):
                f["steady_payload"] += (nb - na) * RECORD
        snaps = [t for (_, ia, _), (t, ib, _) in itertools.pairwise(self.obs) if ia != ib]
        f["snapshots_seen_apart"] = sum(1 for t in snaps if any(x <= t <= y for _, x, y in apart))
        f["snapshots_seen_steady"] = len(snaps) - f["snapshots_seen_apart"]
        lag_all, lag_steady = [], []
        j = 0
        for t, rows in self.commits:
            while j < len(self.obs) and (self.obs[j][0] < t or self.obs[j][2] < rows):
                j += 1
            if j == len(self.obs):
                break
            lag = self.obs[j][0] - t
            lag_all.append(lag)
            shown = self.obs[j][0]  # a commit shown within an event's span waited on it (made before or during it)
            if not any(x <= t <= y or x <= shown <= y for _, x, y in apart):
                lag_steady.append(lag)
        f["lag_steady_p50"] = statistics.median(lag_steady) if lag_steady else float("nan")
        f["lag_steady_max"] = max(lag_steady, default=float("nan"))
        f["lag_all_max"] = max(lag_all, default=float("nan"))
        f["lag_commits"] = len(lag_all)
        win = [b for b in self.bins if lo <= b[0] <= hi]
        f["load_mean"] = statistics.mean(b[4] for b in win) if win else float("nan")
        f["load_max"] = max((b[4] for b in win), default=float("nan"))
        first_vac = min((a for name, a, _, _ in self.events if name == "VACUUM"), default=math.inf)
        f["wal_max_before_vacuum"] = max((b[5] for b in self.bins if b[0] < first_vac), default=0)
        f["wal_max"] = max((b[5] for b in self.bins), default=0)
        return dict(f)

    def report(self, before: dict[str, Any], after: dict[str, Any], recv: dict[str, Any]) -> bool:
        f = self.figures()
        payload = (self.commits[-1][1] - self.commits[0][1] + TXN) * RECORD if self.commits else 0
        ws, wa = before["wal"]["sent"] or {}, after["wal"]["sent"] or {}
        d = {k: wa.get(k, 0) - ws.get(k, 0) for k in ("frames_bytes", "snapshot_bytes", "segments", "snapshots")}
        push = after["sent"]["bytes"] - before["sent"]["bytes"]
        per = wa.get("files", {}).get("games.db", {})
        a = self.args
        spans = [(n.split()[0], round(x - self.writer_started, 1), round(y - self.writer_started, 1))
                 for n, x, y in self.apart_ranges()]
        print(f"window {f['window_s']:.0f} s ({len(self.commits)} transactions, {payload / 1e6:.2f} MB of records); "
              f"steady {f['steady_s']:.0f} s; apart (checkpoint, VACUUM): "
              f"{spans}")
        print(f"bytes n0 sent (its interface's kernel tx_bytes: WAL segments, backup path, gossip, TCP/HTTP), steady: "
              f"{f['steady_tx'] / 1e6:.2f} MB for {f['steady_payload'] / 1e6:.2f} MB of records applied = "
              f"{f['steady_tx'] / max(1, f['steady_payload']):.3f} per record byte")
        print(f"  whole window: {f['window_tx'] / 1e6:.1f} MB sent; agent counters over it: WAL frames "
              f"{d['frames_bytes'] / 1e6:.2f} MB in {d['segments']} segments, WAL snapshots "
              f"{d['snapshot_bytes'] / 2**20:.0f} MiB ({d['snapshots']}), backup path {push / 1e6:.2f} MB; "
              f"(window tx - snapshots) / all records = {(f['window_tx'] - d['snapshot_bytes']) / max(1, payload):.3f}"
              f"; WAL frames bytes / all records = {d['frames_bytes'] / max(1, payload):.3f}")
        idle_tx = self.idle[0] * f["steady_s"]
        print(f"  of which idle traffic (gossip, keep-alives: {self.idle[0]:.0f} B/s measured for {a.idle_s:.0f} s "
              f"before the writer started) about {idle_tx / 1e6:.2f} MB; without it "
              f"{(f['steady_tx'] - idle_tx) / max(1, f['steady_payload']):.3f} per record byte")
        print(f"CPU (whole agent process, /proc utime+stime, % of one core), steady: sender "
              f"{100 * f['steady_cpu0'] / f['steady_s']:.2f} %, receiver "
              f"{100 * f['steady_cpu1'] / f['steady_s']:.2f} %;"
              f" whole window: sender {100 * f['window_cpu0'] / f['window_s']:.2f} %, receiver "
              f"{100 * f['window_cpu1'] / f['window_s']:.2f} %; idle before the writer: sender "
              f"{100 * self.idle[1]:.2f} %, receiver {100 * self.idle[2]:.2f} %")
        print(f"lag (commit to the replica showing it, 0.2 s sampling), steady: p50 {f['lag_steady_p50']:.2f} s, max "
              f"{f['lag_steady_max']:.2f} s (2 intervals: {2 * a.interval:.0f} s); every commit: max "
              f"{f['lag_all_max']:.2f} s")
        print(f"snapshots: by reason {({k: v for k, v in per.items() if k.startswith('snapshot:')})}; replica "
              f"renamed in (seen) during the events {f['snapshots_seen_apart']}, outside them "
              f"{f['snapshots_seen_steady']}; resets that lost nothing {per.get('resets_continued', 0)}; receiver "
              f"refused {recv['wal']['received']['refused']}; backup copies "
              f"{after['sent']['sqlite_backups'] - before['sent']['sqlite_backups']} (deferred "
              f"{after['sent']['sqlite_backups_deferred'] - before['sent']['sqlite_backups_deferred']})")
        print(f"largest -wal {f['wal_max_before_vacuum'] / 2**20:.2f} MiB before the VACUUM, {f['wal_max'] / 2**20:.0f}"
              f" MiB in all; load average (1 min) over the window: mean {f['load_mean']:.2f}, max {f['load_max']:.2f}")
        renamed = [round(t - self.writer_started, 1) for (_, ia, _), (t, ib, _) in itertools.pairwise(self.obs)
                   if ia != ib]
        print(f"replica renamed in (a snapshot applied) at {renamed} s after the writer started (wall "
              f"{time.strftime('%H:%M:%S', time.localtime(self.writer_started_wall))})")
        bad = [s for s in self.samples if not s["ok"]]
        print(f"replica samples: {len(self.samples) - len(bad)} ok, {len(bad)} bad; events {self.events}")
        return not bad and not self.errors and f["snapshots_seen_steady"] == 0


def run_agents(args: argparse.Namespace) -> int:
    """The two-agent run (see :class:`AgentRun`); exit 1 on a bad sample, an error or a snapshot outside the
    events."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from agents import wait_until
    from netns import NetnsLab

    lab = NetnsLab(2, net=40)
    ok = False
    try:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="p2pnode-walagents-") as d:
            run = AgentRun(args, Path(d), lab)
            wt = threading.Thread(target=run.writer)
            threads = [threading.Thread(target=x) for x in (run.sampler, run.monitor, run.checker)]
            try:
                run.start()
                before = run.status(0)
                for t in threads:
                    t.start()
                wait_until(lambda: len(run.bins) >= 2 and run.obs, 30, interval=0.1, what="the first samples")
                wt.start()
                run.stop.wait(args.seconds)
                run.stop.set()
                wait_until(lambda: run.writer_stopped, 120, interval=0.1, what="the writer stopped")
                last = run.commits[-1][1]
                wait_until(lambda: run.obs[-1][2] >= last, 300, interval=0.2, what="the replica at the last commit")
                wait_until(lambda: run.bins[-1][0] >= run.writer_stopped + args.interval + 1.0, 60, interval=0.2,
                           what="the window's last sample")
                run.done.set()
                for t in threads:
                    t.join()
                after, recv = run.status(0), run.status(1)
                run.check("final", full=True)
                ok = run.report(before, after, recv)
            finally:
                run.done.set()
                run.stop.set()
                run.eph.stop()
                run.dur.stop()
                run.release.set()
                for t in [wt, *threads]:
                    if t.is_alive() or t.ident is not None:
                        t.join()
                if run.errors:
                    print("ERRORS:", run.errors)
                for p in (run.eph, run.dur):
                    if p.log.exists():
                        tail = p.log.read_text(errors="replace").splitlines()
                        warn = [x for x in tail if "WARNING" in x or "ERROR" in x or "snapshot" in x]
                        print(f"{p.data_dir.name} log ({len(tail)} lines), snapshots/warnings: {warn[-12:]}")
    finally:
        lab.close()
    return 0 if ok else 1


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
    ap.add_argument("--fragment", type=int, default=0,
                    help="--agents: delete every Nth prefill row first, so a VACUUM moves most pages (0: none)")
    ap.add_argument("--idle-s", type=float, default=20.0, help="--agents: seconds the idle agents are measured")
    ap.add_argument("--agents", action="store_true",
                    help="two `p2pnode agent` processes in network namespaces (root) instead of one process")
    args = ap.parse_args()
    if args.agents:
        return run_agents(args)
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
