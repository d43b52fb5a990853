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

The same file holds the node's job table (its records, :mod:`._records`) and the operator's stop intents, each in
a table of its own.

Rows are read back through one typed decoder (:class:`_Row`, with the bounded types of :mod:`p2pnode.snapshot`,
then checked as the :class:`~p2pnode.snapshot.JobReport` the job will be published as): a row with a bad value (a
job id the snapshot refuses, a control character, a term of 400 digits, a NaN, text where a number belongs) is
skipped, logged and counted (``jobs/ledger.db``: ``bad_entry``, :mod:`p2pnode.statefiles`), never re-adopted and
never a crash of re-adoption; its process, if any, is left alone. :meth:`JobLedger.put` refuses (``ValueError``)
an entry the reader would skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta

from .._lazy import lazy_module
from ..snapshot import Counter, GangSlot, GpuIndex, JobReport, PathStr, Short, Str, WallSeconds
from ..statefiles import StateFileReport, decimal, decode_entry, file_name, load_json, report_for

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

__all__ = ["LEASE_WRAPPER", "WRAPPER", "JobLedger", "LedgerEntry", "exit_status_of", "find_wrapper", "open_db",
           "process_alive", "process_start_ticks", "safe_name", "session_leftovers"]

WRAPPER = """f=$1; shift
"$@" & c=$!
trap : TERM INT HUP USR1 USR2
while :; do wait "$c"; s=$?; kill -0 "$c" 2>/dev/null || break; done
printf '%s\\n' "$s" > "$f.tmp" && mv -f "$f.tmp" "$f"
exit "$s"
"""
"""The per-job supervisor: ``sh -c WRAPPER p2pnode-job EXIT_FILE ARGV...``. It runs the job as its child (the job gets
default signal dispositions: the trap is set after the fork), survives the SIGTERM a stop sends to the whole process
group and a checkpoint signal (SIGUSR1, SIGUSR2: issue 41, a warning before a stop): ``wait`` is re-entered until the
job is really gone. It records the job's exit code (``128 + n`` when signal ``n`` killed it) atomically. Not a Python
interpreter: a few hundred KiB per job."""

LEASE_WRAPPER = """f=$1; l=$2; lead=$3; g=$4; k=$5; shift 5
B=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)
"$@" & c=$!
trap : TERM INT HUP USR1 USR2
(
  trap '' TERM INT HUP USR1 USR2
  trap 'kill -KILL $p 2>/dev/null; exit 0' ALRM
  while :; do
    b=; e=; { read -r b e < "$l"; } 2>/dev/null
    [ -n "$B" ] && [ "$b" = "$B" ] || e=0
    case $e in ''|0?*|*[!0-9]*|?????????????*) e=0;; esac
    read -r u r < /proc/uptime; u=${u%%.*}
    d=$((e - lead - u))
    [ "$d" -le 0 ] && break
    sleep "$d" & p=$!; wait "$p"
  done
  kill -0 "$c" 2>/dev/null || exit 0
  : > "$f.lease"
  kill -TERM "-$$" 2>/dev/null
  sleep "$g" & p=$!; wait "$p"
  kill -KILL "$c" 2>/dev/null
) & w=$!
while :; do wait "$c"; s=$?; kill -0 "$c" 2>/dev/null || break; done
kill -ALRM "$w" 2>/dev/null
printf '%s\\n' "$s" > "$f.tmp" && mv -f "$f.tmp" "$f"
[ -n "$k" ] && [ -e "$f.lease" ] && { echo 1 > "$k/cgroup.kill"; } 2>/dev/null
exit "$s"
"""
"""The per-job supervisor of a job the node's lease fences (issue 42): ``sh -c LEASE_WRAPPER p2pnode-job EXIT_FILE
LEASE_FILE LEAD_S GRACE_S CGROUP ARGV...``. As :data:`WRAPPER`, and a watchdog: it sleeps until the lease's expiry
written in ``LEASE_FILE`` (``BOOT_ID EXPIRY``: whole seconds of ``CLOCK_BOOTTIME``, the clock of ``/proc/uptime``,
:mod:`p2pnode.jobs._leasefile`; no step of the wall clock moves it) less ``LEAD_S``, reads the file again (the agent
renews it), and once that time has passed with no renewal (the agent is dead, hung, or cut off) marks
``EXIT_FILE.lease``, sends SIGTERM to the job's process group and SIGKILL to the job ``GRACE_S`` later: the job ends by
the lease's expiry though its agent is gone. A missing or unreadable file, another boot's id, or an expiry that is not
1-12 digits without a leading zero (the shell would read it as octal) counts as expired. When the watchdog ended the job
and ``CGROUP`` names the job's cgroup v2 directory ("" none), the wrapper, once the job is gone and its exit recorded,
writes ``1`` to its ``cgroup.kill`` (Linux 5.14 and later): processes of the job that left its process group
(``setsid``, a daemonizing launcher) end too, and so does the wrapper. Without a cgroup v2 such processes outlive the
fence (docs/jobs.md#leases). The watchdog ignores the group's SIGTERM and checkpoint signals (SIGUSR1, SIGUSR2) and ends
with the job (the wrapper sends it SIGALRM). The agent, alive, asks the same stop itself at the same time (rule
``lease_expired``). The wrapper traps the group's signals before it forks the watchdog (with a lease already run out
at the start, the watchdog's SIGTERM came before the trap: the wrapper died with the job's exit unrecorded)."""

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
    memory_limit_gib REAL NOT NULL,
    gang TEXT NOT NULL DEFAULT ''
);
"""
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(job_id: str) -> str:
    """``job_id`` as a file or cgroup name (anything but letters, digits, ``.``, ``_`` and ``-`` becomes ``_``)."""
    name = _SAFE.sub("_", job_id)[:200]
    return "_" + name if name.startswith(".") or not name else name


class LedgerEntry(msgspec.Struct, frozen=True, kw_only=True):
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
    gang: GangSlot | None = None
    """The member's place in its gang (issue 26): a re-adopted member is reported with it, so its gang holds."""


def _connect(path: Path, schema: str, probe: str) -> sqlite3.Connection:
    con = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")  # see the module docstring
        con.executescript(schema)
        con.execute(probe).fetchall()
    except sqlite3.DatabaseError:
        con.close()
        raise
    return con


def open_db(path: Path, schema: str, probe: str, *, report: StateFileReport, file: str) -> sqlite3.Connection:
    """A connection to the SQLite state file ``path`` (WAL, ``synchronous=NORMAL``, ``schema`` created, ``probe``
    run). A file that is no database of that schema (garbage, a table with other columns) is moved aside to
    ``<name>.corrupt-<ns>`` (with its ``-wal`` and ``-shm``), counted ``malformed`` and a new one started: the agent
    never stops for it. Raises ``sqlite3.Error`` only when the new one cannot be made either (``OSError`` for the
    file system)."""
    try:
        return _connect(path, schema, probe)
    except sqlite3.DatabaseError as exc:
        aside = path.with_name(f"{path.name}.corrupt-{time.time_ns()}")
        for suffix in ("-wal", "-shm", ""):
            try:
                os.replace(f"{path}{suffix}", f"{aside}{suffix}")
            except FileNotFoundError:
                pass
        report.drop(file, "malformed", f"not a database of this agent ({exc}): moved aside to {aside.name}, a new "
                                       "one started")
    return _connect(path, schema, probe)


class _Row(msgspec.Struct, frozen=True):
    """One ledger row as read back (see the module docstring)."""

    job_id: Str
    pid: Annotated[int, Meta(ge=1, le=2**31)] | None
    start_ticks: Counter | None
    template: Str
    config: Str
    kind: Short
    gpus: Annotated[list[GpuIndex], Meta(max_length=64)]
    gpu_fraction: Annotated[float, Meta(ge=0.0, le=64.0)]
    vram_gib: Annotated[float, Meta(ge=0.0, le=1e6)]
    term: Counter
    started_at: WallSeconds
    log_path: PathStr
    exit_path: PathStr
    cgroup: PathStr
    memory_limit_gib: Annotated[float, Meta(ge=0.0, le=1e6)]
    gang: GangSlot | None = None


_COLUMNS = _Row.__struct_fields__
_BEFORE_GANGS = _COLUMNS[:-1]
"""The columns of a ledger written before gangs (issue 26): such a file gains the ``gang`` column in place."""


def _entry_of(row: dict) -> LedgerEntry:
    """The :class:`LedgerEntry` of one row (``gpus`` still JSON text). Raises ``ValueError`` naming what was
    wrong."""
    gpus, gang = row.get("gpus"), row.get("gang")
    row = {**row, "gpus": load_json(gpus.encode("utf-8", "surrogatepass")) if isinstance(gpus, str) else gpus,
           "gang": (load_json(gang.encode("utf-8", "surrogatepass")) if gang else None) if isinstance(gang, str)
           else gang}
    r = decode_entry(row, _Row)
    decode_entry({"job_id": r.job_id, "template": r.template, "config": r.config, "kind": r.kind, "gpus": r.gpus,
                  "gpu_fraction": r.gpu_fraction, "vram_gib": r.vram_gib, "started_at": r.started_at,
                  "term": r.term, "pid": r.pid}, JobReport)
    return LedgerEntry(job_id=r.job_id, pid=r.pid, start_ticks=r.start_ticks, template=r.template, config=r.config,
                       kind=r.kind, gpus=tuple(r.gpus), gpu_fraction=r.gpu_fraction, vram_gib=r.vram_gib,
                       term=r.term, started_at=r.started_at, log_path=r.log_path, exit_path=r.exit_path,
                       cgroup=r.cgroup, memory_limit_gib=r.memory_limit_gib, gang=r.gang)


class JobLedger:
    """The durable list of this node's job processes (thread-safe: one connection, a lock)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.report = report_for(path.parent.parent)  # <data_dir>/jobs/ledger.db
        self.file = file_name(path.parent.parent, path)
        self._con = open_db(path, _SCHEMA, f"SELECT {', '.join(_BEFORE_GANGS)} FROM ledger LIMIT 0",
                            report=self.report, file=self.file)
        if "gang" not in {r[1] for r in self._con.execute("PRAGMA table_info(ledger)")}:
            self._con.execute("ALTER TABLE ledger ADD COLUMN gang TEXT NOT NULL DEFAULT ''")  # an older agent's
        self._lock = threading.Lock()

    def put(self, e: LedgerEntry) -> None:
        """Record ``e`` (replacing the row of its job id), committed before returning (durable against a crash of
        the agent; see the module docstring). Raises ``ValueError`` for an entry :meth:`entries` would skip."""
        _entry_of({"job_id": e.job_id, "pid": e.pid, "start_ticks": e.start_ticks, "template": e.template,
                   "config": e.config, "kind": e.kind, "gpus": list(e.gpus), "gpu_fraction": e.gpu_fraction,
                   "vram_gib": e.vram_gib, "term": e.term, "started_at": e.started_at, "log_path": e.log_path,
                   "exit_path": e.exit_path, "cgroup": e.cgroup, "memory_limit_gib": e.memory_limit_gib,
                   "gang": e.gang})
        gang = msgspec.json.encode(e.gang).decode() if e.gang is not None else ""
        with self._lock:
            self._con.execute(
                f"INSERT OR REPLACE INTO ledger ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                (e.job_id, e.pid, e.start_ticks, e.template, e.config, e.kind, json.dumps(list(e.gpus)),
                 e.gpu_fraction, e.vram_gib, e.term, e.started_at, e.log_path, e.exit_path, e.cgroup,
                 e.memory_limit_gib, gang))

    def remove(self, job_id: str) -> None:
        """Forget ``job_id`` (its end is in the history)."""
        with self._lock:
            self._con.execute("DELETE FROM ledger WHERE job_id = ?", (job_id,))

    def entries(self) -> list[LedgerEntry]:
        """Every job recorded, oldest first; a row with a bad value is skipped and counted (module docstring)."""
        try:
            with self._lock:
                rows = self._con.execute(
                    f"SELECT rowid, {', '.join(_COLUMNS)} FROM ledger ORDER BY rowid").fetchall()
        except sqlite3.DatabaseError as exc:  # a page corrupted under a readable header
            self.report.drop(self.file, "malformed", f"unreadable ({exc}): no job re-adopted")
            return []
        out = []
        for rowid, *r in rows:
            try:
                out.append(_entry_of(dict(zip(_COLUMNS, r))))
            except ValueError as exc:  # counted once per row (the report remembers it)
                self.report.drop(self.file, "bad_entry", f"job {str(r[0])[:80]!r} (row {rowid}): {exc}; not "
                                                         "re-adopted")
        out.sort(key=lambda e: e.started_at)
        return out

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """The rows of one statement on the ledger's connection (under its lock). Raises ``sqlite3.Error``."""
        with self._lock:
            return self._con.execute(sql, args).fetchall()

    def script(self, sql: str) -> None:
        """Run the statements ``sql`` (a schema) on the ledger's connection. Raises ``sqlite3.Error``."""
        with self._lock:
            self._con.executescript(sql)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The ledger's connection inside one transaction, under its lock: committed when the block ends, rolled
        back when it raises (for the other tables of ``ledger.db``: the job table's records and the operator's
        stop intents, :mod:`._records`)."""
        with self._lock:
            self._con.execute("BEGIN")
            try:
                yield self._con
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")

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
    return decimal(f[19]) if f and len(f) > 19 else None


def session_leftovers(sid: int, since_ticks: int) -> list[int]:
    """Processes still in session ``sid`` once its leader, a job's wrapper that started at ``since_ticks`` (clock
    ticks since boot), is gone: what the job left behind when its main process ended (a torchrun worker whose
    launcher was killed, a shell's background child). The kernel frees a pid only when no process uses it as a
    session id any more, so while such processes live the number names our session; if a live process has the
    pid ``sid`` itself, the number was reused by a new session (ours has no leader): none are ours."""
    lead = _stat_fields(sid)
    if lead and (len(lead) <= 19 or decimal(lead[19]) != since_ticks):
        return []  # a process with the number that is not our wrapper (alive or a zombie): it was reused
    out: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        pid = decimal(name)  # /proc's own names: ASCII digits are the process ids, the rest is not
        if pid is None:
            continue
        f = _stat_fields(pid)
        if f and len(f) > 19 and decimal(f[3]) == sid and (decimal(f[19]) or 0) >= since_ticks \
                and f[0] not in ("Z", "X", "x"):
            out.append(pid)
    return out


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether the process ``pid`` that started at ``start_ticks`` still runs (not a zombie; a pid reused by a
    later process does not count)."""
    f = _stat_fields(pid)
    if not f or f[0] in ("Z", "X", "x"):
        return False
    return start_ticks is None or (len(f) > 19 and decimal(f[19]) == start_ticks)


def exit_status_of(path: str | Path) -> int | None:
    """The status the wrapper recorded in exit file ``path``, as :mod:`subprocess` reports it: the exit code, or
    ``-n`` when signal ``n`` killed the job (the shell's ``128 + n``); None when there is no such file."""
    try:
        code = decimal(Path(path).read_bytes()[:32], max_value=255)  # the shell writes 0..255
    except OSError:
        return None
    if code is None:
        return None
    return -(code - 128) if 128 < code < 128 + 65 else code


def find_wrapper(exit_path: str) -> tuple[int, int] | None:
    """``(pid, start ticks)`` of a live wrapper whose command line names ``exit_path`` (an intent row's process,
    spawned before its agent died), or None."""
    needle = exit_path.encode()
    for name in os.listdir("/proc"):
        pid = decimal(name, max_value=2**31)
        if pid is None:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if needle in args[:6]:
            ticks = process_start_ticks(pid)
            if ticks is not None and process_alive(pid, ticks):
                return pid, ticks
    return None
