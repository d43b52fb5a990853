"""The job ledger: every job process this node runs, recorded in ``<data_dir>/jobs/ledger.db`` (SQLite, WAL,
``synchronous=NORMAL``) before the job is reported started, and removed once its end is in the history.

``NORMAL``, not ``FULL``: in WAL mode a committed row survives a crash or ``kill -9`` of the agent (it is in the
WAL file, which the next open replays); only a crash of the operating system can lose the last commits, and that
kills every job process with it, so there is nothing left to re-adopt. It saves two fsyncs per job start, which
at hundreds of starts a second held the agent's event loop.

A row is written twice: first as an *intent* (no pid yet) just before the process is spawned, then with the
wrapper's pid and process start time (``/proc/<pid>/stat`` field 22, clock ticks since boot) right after. The
start time is what makes a pid an identity: a restarted agent re-adopts a row only when a process with that pid
*and* that start time is alive, so a recycled pid is never mistaken for a job. An intent row whose agent died
before the pid was recorded is matched by the wrapper's command line, which names the job's exit file.

Every job runs under a tiny shell wrapper (see :data:`WRAPPER`) that writes the job's exit code to
``<data_dir>/jobs/<job_id>.exit`` (tmp + rename), so a job that ended while the agent was down still has a true
exit status. Driver-level I/O (files, /proc), no trio.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WRAPPER", "JobLedger", "LedgerEntry", "exit_status_of", "find_wrapper", "process_alive",
           "process_start_ticks", "safe_name"]

WRAPPER = """f=$1; shift
"$@" & c=$!
trap : TERM INT HUP
while :; do wait "$c"; s=$?; kill -0 "$c" 2>/dev/null || break; done
printf '%s\\n' "$s" > "$f.tmp" && mv -f "$f.tmp" "$f"
exit "$s"
"""
"""The per-job supervisor: ``sh -c WRAPPER p2pnode-job EXIT_FILE ARGV...``. It runs the job as its child (the
job gets default signal dispositions: the trap is set after the fork), survives the SIGTERM a stop sends to the
whole process group (``wait`` is re-entered until the job is really gone) and records the job's exit code
(``128 + n`` when signal ``n`` killed it) atomically. Not a Python interpreter: a few hundred KiB per job."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    job_id TEXT PRIMARY KEY,
    pid INTEGER,
    start_ticks INTEGER,
    template TEXT NOT NULL,
    config TEXT NOT NULL,
    kind TEXT NOT NULL,
    gpus TEXT NOT NULL,
    gpu_fraction REAL NOT NULL,
    vram_gib REAL NOT NULL,
    term INTEGER NOT NULL,
    started_at REAL NOT NULL,
    log_path TEXT NOT NULL,
    exit_path TEXT NOT NULL,
    cgroup TEXT NOT NULL,
    memory_limit_gib REAL NOT NULL
);
"""
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(job_id: str) -> str:
    """``job_id`` as a file or cgroup name (anything but letters, digits, ``.``, ``_`` and ``-`` becomes ``_``)."""
    name = _SAFE.sub("_", job_id)[:200]
    return "_" + name if name.startswith(".") or not name else name


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerEntry:
    """One job process: its id, the wrapper's pid and start time (ticks since boot; both None in an intent row),
    template, config, kind, GPUs, GPU fraction, VRAM GiB per GPU, plan term, Unix start time, log file, exit
    file, memory cgroup directory ('' when none) and memory limit in GiB (0: none)."""

    job_id: str
    pid: int | None
    start_ticks: int | None
    template: str
    config: str
    kind: str
    gpus: tuple[int, ...]
    gpu_fraction: float
    vram_gib: float
    term: int
    started_at: float
    log_path: str
    exit_path: str
    cgroup: str = ""
    memory_limit_gib: float = 0.0


class JobLedger:
    """The durable list of this node's job processes (thread-safe: one connection, a lock)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._con = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("PRAGMA synchronous=NORMAL")
        self._con.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def put(self, e: LedgerEntry) -> None:
        """Record ``e`` (replacing the row of its job id), committed before returning (durable against a crash of
        the agent; see the module docstring)."""
        with self._lock:
            self._con.execute(
                "INSERT OR REPLACE INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (e.job_id, e.pid, e.start_ticks, e.template, e.config, e.kind, json.dumps(list(e.gpus)),
                 e.gpu_fraction, e.vram_gib, e.term, e.started_at, e.log_path, e.exit_path, e.cgroup,
                 e.memory_limit_gib))

    def remove(self, job_id: str) -> None:
        """Forget ``job_id`` (its end is in the history)."""
        with self._lock:
            self._con.execute("DELETE FROM ledger WHERE job_id = ?", (job_id,))

    def entries(self) -> list[LedgerEntry]:
        """Every job recorded, oldest first."""
        with self._lock:
            rows = self._con.execute(
                "SELECT job_id, pid, start_ticks, template, config, kind, gpus, gpu_fraction, vram_gib, term, "
                "started_at, log_path, exit_path, cgroup, memory_limit_gib FROM ledger ORDER BY started_at").fetchall()
        out = []
        for r in rows:
            try:
                gpus = tuple(int(g) for g in json.loads(r[6]))
            except (ValueError, TypeError):
                gpus = ()
            out.append(LedgerEntry(job_id=r[0], pid=r[1], start_ticks=r[2], template=r[3], config=r[4], kind=r[5],
                                   gpus=gpus, gpu_fraction=r[7], vram_gib=r[8], term=r[9], started_at=r[10],
                                   log_path=r[11], exit_path=r[12], cgroup=r[13], memory_limit_gib=r[14]))
        return out

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._con.close()


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (index 0 is field 3, the state); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); None if gone."""
    f = _stat_fields(pid)
    try:
        return int(f[19]) if f else None
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether the process ``pid`` that started at ``start_ticks`` still runs (not a zombie; a pid reused by a
    later process does not count)."""
    f = _stat_fields(pid)
    if not f or f[0] in ("Z", "X", "x"):
        return False
    try:
        return start_ticks is None or int(f[19]) == start_ticks
    except (IndexError, ValueError):
        return False


def exit_status_of(path: str | Path) -> int | None:
    """The status the wrapper recorded in exit file ``path``, as :mod:`subprocess` reports it: the exit code, or
    ``-n`` when signal ``n`` killed the job (the shell's ``128 + n``); None when there is no such file."""
    try:
        text = Path(path).read_text().strip()
        code = int(text)
    except (OSError, ValueError):
        return None
    return -(code - 128) if 128 < code < 128 + 65 else code


def find_wrapper(exit_path: str) -> tuple[int, int] | None:
    """``(pid, start ticks)`` of a live wrapper whose command line names ``exit_path`` (an intent row's process,
    spawned before its agent died), or None."""
    needle = exit_path.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if needle in args[:6]:
            pid = int(name)
            ticks = process_start_ticks(pid)
            if ticks is not None and process_alive(pid, ticks):
                return pid, ticks
    return None
