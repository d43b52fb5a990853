"""The node's job table and the operator's stop intents, kept in the job ledger (``<data_dir>/jobs/ledger.db``) so
that an agent restart (a ``kill -9`` included) loses neither (issue 39). Driver-level I/O, no trio.

* **Records** (table ``job_records``, schema version :data:`RECORDS_SCHEMA` in ``ledger_meta``): one row per job id of
  the core's :class:`p2pnode.node._table.JobTable` (its state, template, kind, GPUs, term, gang, stop rule and reason,
  outcome, exit status or signal, pid, and its times as wall-clock seconds), or the id alone for one ``remembered``.
  :class:`JobRecords` writes the ids whose state changed (:meth:`JobTable.take_changes`) in one transaction right
  after the driver carried out the transitions' effects (:meth:`JobRecords.flush`, called by the driver's executor and
  at each job end), ``synchronous=NORMAL`` as the process rows; the table's own bounds bound the rows (live records,
  the newest 4,096 finished ones, the newest 65,536 ids kept alone: a record leaving the table is deleted). Assigned
  and waiting records are not written (they are never restored). A row whose record would not read back is not written
  (logged).
* **Restore**: at start the rows are read back through one typed decoder (:class:`StoredRecord`, the bounded types of
  :mod:`p2pnode.snapshot`): a bad row (a NaN, a 400-digit integer, a control character, an unknown state, text where a
  number belongs, a BLOB) is skipped, logged and counted (``jobs/ledger.db``: ``bad_entry``, :mod:`p2pnode.statefiles`),
  never a crash; a table of another schema version is counted ``malformed`` and started anew, and so are all three
  tables when one has other columns (checked before anything is written: a newer agent's file after a rollback). Just
  before the runner re-adopts the ledger's processes (:meth:`JobRunner.readopt`) the records are applied to the core's
  table as ``Restored*`` events (their times mapped to this run's monotonic clock), so the re-adoption reconciles them
  through the table's transitions: a starting or running record whose process is re-adopted runs on; one whose process
  ended while the agent was down ends with the exit file's status; one with no process at all ends ``lost`` at the next
  step; a ``stopping`` record's stop is carried out again with the same rule (a starting or running one whose
  operator's stop intent is kept is restored ``stopping``, rule ``operator``: gone, it ended ``stopped``)
  (:meth:`p2pnode.node._book.JobBook.resume_stops`); ``ended`` and ``refused`` records keep the history and the ``ran``
  view, so a restarted node never starts a job id it ran. Assigned and waiting records (never started) are not restored:
  the plan gives them again. The driver's ``jobs.ended`` list (gang members and one-off runs that ended here lately,
  published for the leader and the run's requester) is refilled from the restored records.
* **Stop intents** (table ``stop_intents``): ``p2pnode jobs stop`` writes the job id before the route answers
  (:meth:`StopIntents.add`; a 503 when the ledger refuses it); a restarted agent reads them back (bad rows skipped and
  counted, at most :data:`MAX_STOP_INTENTS`) and the stop rules carry them out; an intent is removed once carried out
  (the table records the job stopping or ended) or when its job is not here to stop.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from msgspec import Meta

from .._lazy import lazy_module
from ..node._jobstate import EndOutcome, StopRule
from ..node._runs import RUN_PREFIX, ended_report
from ..node._stoprules import OPERATOR_REASON
from ..node._table import MAX_HISTORY, MAX_IDS, REMEMBERED, UNKNOWN, JobRecord, restored_event
from ..snapshot import Counter, EndedJob, GangSlot, GpuIndex, JobId, Reason, Short, SmallInt, Str, WallSeconds
from ..statefiles import decode_entry
from ._ledger import JobLedger

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

if TYPE_CHECKING:
    from ..node import JobCore
    from ._runner import JobRunner

__all__ = ["MAX_RECORD_ROWS", "MAX_STOP_INTENTS", "RECORDS_SCHEMA", "JobRecords", "StopIntents", "StoredRecord"]

log = logging.getLogger(__name__)

RECORDS_SCHEMA = 1
"""The version of the ``job_records`` table this agent writes and reads."""
MAX_LIVE_ROWS = 4096
MAX_RECORD_ROWS = MAX_IDS + MAX_HISTORY + MAX_LIVE_ROWS
"""Record rows read back at most (the table's bounds, and as many live records as a node runs jobs): the newest."""
MAX_STOP_INTENTS = 4096
"""Stop intents read back at most (one per job running here)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS ledger_meta (name TEXT PRIMARY KEY, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS job_records (job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS job_records_seq ON job_records (seq);
CREATE TABLE IF NOT EXISTS stop_intents (job_id TEXT PRIMARY KEY, at REAL NOT NULL);
INSERT OR IGNORE INTO ledger_meta (name, version) VALUES ('job_records', {RECORDS_SCHEMA});
"""
_COLUMNS = {"ledger_meta": "name, version", "job_records": "job_id, seq, record", "stop_intents": "job_id, at"}
"""The columns of each table this agent reads and writes (checked at start, :class:`_Store`)."""


class StoredRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One job record as the ledger keeps it (the decoder of ``job_records.record``, JSON): the fields of
    :class:`p2pnode.node._table.JobRecord`, bounded, with ``assigned_at``, ``started_at`` and ``ended_at`` in
    wall-clock seconds; ``state`` ``remembered`` for an id kept alone."""

    job_id: JobId
    state: Literal["assigned", "waiting", "fetching", "starting", "running", "stopping", "ended", "refused",
                   "remembered"]
    template: Str = ""
    kind: Short = ""
    gpus: Annotated[tuple[GpuIndex, ...], Meta(max_length=64)] = ()
    gpu_fraction: Annotated[float, Meta(ge=0.0, le=64.0)] = 1.0
    vram_gib: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    term: Counter = 0
    gang: GangSlot | None = None
    rule: StopRule | None = None
    reason: Reason = ""
    outcome: EndOutcome | None = None
    status: SmallInt | None = None
    signal: Annotated[int, Meta(ge=1, le=255)] | None = None
    pid: Annotated[int, Meta(ge=1, le=2**31)] | None = None
    assigned_at: WallSeconds | None = None
    started_at: WallSeconds | None = None
    ended_at: WallSeconds | None = None
    adopted: bool = False
    started_wall: WallSeconds | None = None


class _Intent(msgspec.Struct, frozen=True):
    job_id: JobId
    at: WallSeconds


_DECODER = msgspec.json.Decoder(StoredRecord)


def _decode(data: bytes) -> StoredRecord:
    """The one decoder of a ``record`` (JSON bytes). Raises ``ValueError`` naming what was wrong: not JSON (a
    ``NaN`` included), an integer past its bound, a control character, an unknown state or field, a wrong type, a
    lone surrogate (it could never be written again)."""
    try:
        s = _DECODER.decode(data)
        if not data.isascii():
            msgspec.json.encode(s)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeError, OverflowError, RecursionError) as exc:
        raise ValueError(str(exc)[:200] or type(exc).__name__) from None
    return s


def _text(s: str, n: int) -> str:
    return _CONTROL.sub(" ", s)[:n]


def _wall(mono: float | None, now_mono: float, now_wall: float) -> float | None:
    return None if mono is None else min(1e11, max(0.0, now_wall - (now_mono - mono)))


def _mono(wall: float | None, now_mono: float, now_wall: float) -> float | None:
    return None if wall is None else now_mono - (now_wall - wall)


def encode_record(r: JobRecord | None, job_id: str, now_mono: float, now_wall: float) -> bytes:
    """The ``record`` column of ``r`` (None: ``job_id`` kept alone, remembered) at ``now_mono`` / ``now_wall``.
    Raises ``ValueError`` when it would not read back (:class:`StoredRecord`)."""
    if r is None:
        data = msgspec.json.encode({"job_id": job_id, "state": REMEMBERED})
    else:
        data = msgspec.json.encode(StoredRecord(
            r.job_id, r.state, _text(r.template, 256), _text(r.kind, 64), tuple(r.gpus), r.gpu_fraction,
            r.vram_gib, r.term, r.gang, r.rule, _text(r.reason, 512), r.outcome, r.status, r.signal, r.pid,
            _wall(r.assigned_at, now_mono, now_wall), _wall(r.started_at, now_mono, now_wall),
            _wall(r.ended_at, now_mono, now_wall), r.adopted,
            None if r.started_wall is None else min(1e11, max(0.0, r.started_wall))))
    _decode(data)  # never write what the reader would skip
    return data


def record_of(s: StoredRecord, now_mono: float, now_wall: float) -> JobRecord:
    """The table's record of ``s`` (not ``remembered``), its times on this run's monotonic clock."""
    return JobRecord(s.job_id, s.state, s.template, s.kind, tuple(s.gpus), s.gpu_fraction,  # type: ignore[arg-type]
                     s.vram_gib, s.term, s.gang, s.rule, s.reason, s.outcome, s.status, s.signal, s.pid,
                     _mono(s.assigned_at, now_mono, now_wall), _mono(s.started_at, now_mono, now_wall),
                     _mono(s.ended_at, now_mono, now_wall), s.adopted, s.started_wall)


class _Store:
    """The ledger's other tables: made, their schema version checked (module docstring)."""

    def __init__(self, ledger: JobLedger) -> None:
        self.ledger = ledger
        why, drop = self._found()
        if why is not None:
            ledger.report.drop(ledger.file, "malformed", f"{why}: not restored, new tables started")
        try:
            if drop:
                with ledger.transaction() as con:
                    for table in drop:
                        con.execute(f"DROP TABLE IF EXISTS {table}")
                    if "ledger_meta" not in drop:
                        con.execute("DELETE FROM ledger_meta WHERE name = 'job_records'")
            ledger.script(_SCHEMA)
        except sqlite3.DatabaseError as exc:  # the file itself is unreadable: rows() reads nothing, writes are counted
            ledger.report.drop(ledger.file, "malformed", f"tables not made ({exc}): nothing kept in them")

    def _found(self) -> tuple[str | None, tuple[str, ...]]:
        """Why the tables found are not this agent's (None: they are, or there are none yet) and those to drop: all
        three when one is of another shape (read before anything is written: a newer agent's after a rollback),
        ``job_records`` when it is of another schema version."""
        ledger = self.ledger
        try:
            names = {r[0] for r in ledger.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for table, columns in _COLUMNS.items():
                if table in names:
                    ledger.query(f"SELECT {columns} FROM {table} LIMIT 0")
            v = ledger.query("SELECT version FROM ledger_meta WHERE name = 'job_records'") \
                if "ledger_meta" in names else []
        except sqlite3.DatabaseError as exc:
            return f"tables of another shape ({exc})", tuple(_COLUMNS)
        version = v[0][0] if v else None
        if "job_records" in names and (type(version) is not int or version != RECORDS_SCHEMA):
            return (f"job_records of schema version {version!r:.40} (this agent reads {RECORDS_SCHEMA})",
                    ("job_records",))
        return None, ()

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """The rows of ``sql``; none when the file is unreadable there (counted ``malformed``)."""
        try:
            return self.ledger.query(sql, *args)
        except sqlite3.DatabaseError as exc:  # a page corrupted under a readable header
            self.ledger.report.drop(self.ledger.file, "malformed", f"unreadable ({exc}): nothing restored from it")
            return []


class StopIntents:
    """The operator's stop intents in ``ledger`` (module docstring): :meth:`load` once, then :meth:`add` and
    :meth:`remove` committed before they return."""

    def __init__(self, ledger: JobLedger) -> None:
        self.ledger = ledger
        self.store = _Store(ledger)
        self.remove_errors = 0
        """Removals the database refused (:meth:`remove`)."""

    def load(self) -> list[str]:
        """The job ids of the intents kept, oldest first (bad rows skipped and counted; at most
        :data:`MAX_STOP_INTENTS`)."""
        out = []
        for i, (rowid, job_id, at) in enumerate(self.store.rows(
                "SELECT rowid, job_id, at FROM stop_intents ORDER BY rowid")):
            try:
                if i >= MAX_STOP_INTENTS:
                    raise ValueError(f"beyond the {MAX_STOP_INTENTS} stop intents kept at most")
                out.append(decode_entry({"job_id": job_id, "at": at}, _Intent).job_id)
            except ValueError as exc:
                self.ledger.report.drop(self.ledger.file, "bad_entry", f"stop intent {str(job_id)[:80]!r} (row "
                                                                       f"{rowid}): {exc}; not carried out")
        return out

    def add(self, job_id: str, now_wall: float) -> None:
        """Keep the intent to stop ``job_id`` (committed: it survives a ``kill -9``). Raises ``ValueError`` for a
        job id the reader would skip."""
        decode_entry({"job_id": job_id, "at": now_wall}, _Intent)
        with self.ledger.transaction() as con:
            con.execute("INSERT OR REPLACE INTO stop_intents (job_id, at) VALUES (?, ?)", (job_id, now_wall))

    def remove(self, job_id: str) -> bool:
        """Forget the intent to stop ``job_id`` (carried out, or nothing left to stop). False when the database
        refused it (a full disk, say: counted in :attr:`remove_errors`, logged): the caller keeps the intent and
        tries again at its next settling, and the job's end is never lost to it."""
        try:
            with self.ledger.transaction() as con:
                con.execute("DELETE FROM stop_intents WHERE job_id = ?", (job_id,))
        except sqlite3.Error as exc:
            self.remove_errors += 1
            log.error("stop intent of job %.80r not removed from the ledger (tried again): %s", job_id, exc)
            return False
        return True


def read_records(store: _Store) -> list[StoredRecord]:
    """Every record row of ``store``, oldest first, the newest :data:`MAX_RECORD_ROWS` (older ones deleted); bad rows
    skipped and counted (module docstring)."""
    ledger = store.ledger
    rows = store.rows("SELECT rowid, job_id, record FROM job_records ORDER BY seq DESC, rowid DESC LIMIT ?",
                      MAX_RECORD_ROWS + 1)
    if len(rows) > MAX_RECORD_ROWS:
        cut = rows.pop()
        ledger.report.drop(ledger.file, "bad_entry", f"job records beyond the newest {MAX_RECORD_ROWS}: deleted")
        with ledger.transaction() as con:
            con.execute("DELETE FROM job_records WHERE seq <= (SELECT seq FROM job_records WHERE rowid = ?)",
                        (cut[0],))
    out = []
    for rowid, job_id, record in reversed(rows):  # (about 4 us a row: 70,000 rows are read in a quarter second)
        try:
            if not isinstance(record, str):
                raise ValueError(f"record is {type(record).__name__}, not JSON text")
            s = _decode(record.encode("utf-8", "surrogatepass"))
            if s.job_id != job_id:
                raise ValueError(f"its record names job {s.job_id!r}")
            out.append(s)
        except (ValueError, UnicodeError) as exc:
            ledger.report.drop(ledger.file, "bad_entry", f"job record {str(job_id)[:80]!r} (row {rowid}): {exc}; "
                                                         "not restored")
    return out


class JobRecords:
    """Keeps ``core``'s job table in ``runner``'s ledger and ``operator``'s stop intents settled (module
    docstring); ``clock()`` is the driver's monotonic clock. Reads the rows at once (no clock needed); restores them
    into the table just before the runner's first re-adoption (:attr:`JobRunner.before_readopt`) or the first
    :meth:`flush`, whichever comes first."""

    def __init__(self, runner: JobRunner, core: JobCore, operator: Any, clock: Callable[[], float],
                 ended: deque[EndedJob] | None = None) -> None:
        self.runner = runner
        self.ended = ended
        """The driver's ``jobs.ended`` list (gang members and one-off runs that ended here lately): refilled at the
        restore from the restored records, so a requester or a leader still hears of an end the agent's restart
        came right after."""
        self.core = core
        self.operator = operator
        self.clock = clock
        self.ledger = runner.ledger
        self.store = _Store(self.ledger)
        self.pending: list[StoredRecord] | None = read_records(self.store)
        self.restored = 0
        """Records restored into the table at start."""
        self.unwritable = 0
        """Records not written because they would not read back (logged)."""
        self.write_errors = 0
        """Writes the database refused (logged)."""
        self._seq = self._max_seq() + 1
        runner.before_readopt = self.restore

    def _max_seq(self) -> int:
        rows = self.store.rows("SELECT max(seq) FROM job_records WHERE typeof(seq) = 'integer'")
        v = rows[0][0] if rows else None
        return v if type(v) is int and 0 <= v < 2**62 else 0

    def restore(self) -> None:
        """Apply the rows read at start to the core's table (once; then every change is tracked and written by
        :meth:`flush`). Assigned and waiting records (never started) are not restored and their rows go."""
        if self.pending is None:
            return
        rows, self.pending = self.pending, None
        now_mono, now_wall = self.clock(), time.time()
        table, events, dropped = self.core.table, [], []
        intents = self.operator.stop_intents
        for s in rows:
            if s.state == REMEMBERED:
                table.remember(s.job_id)
                continue
            if s.state in ("starting", "running") and s.job_id in intents:  # its stop asked before the restart
                s = msgspec.structs.replace(s, state="stopping", rule="operator", reason=OPERATOR_REASON)
            ev = restored_event(record_of(s, now_mono, now_wall))
            if ev is None:
                dropped.append(s.job_id)
            else:
                events.append(ev)
        results = self.core.book.restore(events, now_mono)
        self.restored = sum(1 for r in results if isinstance(r, JobRecord))
        if len(results) > self.restored:
            log.warning("job table: %d records of the ledger not restored (no transition from this run's state)",
                        len(results) - self.restored)
        if dropped:
            with contextlib.suppress(sqlite3.Error):  # (read again and dropped again at the next start)
                with self.ledger.transaction() as con:
                    con.executemany("DELETE FROM job_records WHERE job_id = ?", [(j,) for j in dropped])
        if self.restored:
            log.info("job table: %d records restored from the ledger", self.restored)
        self._refill_ended([r for r in results if isinstance(r, JobRecord)], now_mono, now_wall)
        table.track()

    def _refill_ended(self, records: list[JobRecord], now_mono: float, now_wall: float) -> None:
        if self.ended is None:
            return
        ends = sorted((r for r in records if r.state == "ended" and (r.gang is not None or r.job_id.startswith(
            RUN_PREFIX))), key=lambda r: r.ended_at or 0.0)
        kept = list(self.ended)
        self.ended.clear()
        for r in ends[-(self.ended.maxlen or len(ends)):]:
            status = -r.signal if r.signal is not None else r.status
            self.ended.append(ended_report(r.job_id, status, r.reason if r.outcome == "stopped" else None,
                                           _wall(r.ended_at, now_mono, now_wall) or 0.0, rule=r.rule or ""))
        self.ended.extend(kept)

    def flush(self) -> None:
        """Write the records of the job ids whose state changed since the last flush (one transaction), then
        settle the operator's stop intents."""
        self.restore()
        ids = self.core.table.take_changes()
        if ids:
            self._write(ids)
        self._settle()

    def _write(self, ids: Iterable[str]) -> None:
        table, now_mono, now_wall = self.core.table, self.clock(), time.time()
        puts, deletes = [], []
        for job_id in ids:
            state = table.state(job_id)
            if state in ("assigned", "waiting", "fetching"):  # never restored (module docstring): not written
                continue
            if state == UNKNOWN:
                deletes.append((job_id,))
                continue
            try:
                puts.append((job_id, self._seq, encode_record(table.get(job_id), job_id, now_mono, now_wall)
                             .decode()))
                self._seq += 1
            except ValueError as exc:
                self.unwritable += 1
                deletes.append((job_id,))
                log.warning("job %.80r: its record would not read back (%s): not kept in the ledger", job_id, exc)
        if not puts and not deletes:
            return
        try:
            with self.ledger.transaction() as con:
                con.executemany("INSERT OR REPLACE INTO job_records (job_id, seq, record) VALUES (?, ?, ?)", puts)
                con.executemany("DELETE FROM job_records WHERE job_id = ?", deletes)
        except sqlite3.Error as exc:  # a full disk, say: the jobs go on; these records are written at their next change
            self.write_errors += 1
            log.error("job table: %d records not kept in the ledger: %s", len(puts) + len(deletes), exc)

    def _settle(self) -> None:
        """Remove the stop intents carried out: the table records the job stopping or finished; or, once the
        runner re-adopted what it will, the job is not here to stop."""
        op = self.operator
        table = self.core.table
        for job_id in list(op.stop_intents):
            state = table.state(job_id)
            gone = self.runner.readopt_done and job_id not in self.runner.jobs and state in (UNKNOWN, REMEMBERED)
            if state in ("stopping", "ended", "refused") or gone:
                op.carried_out(job_id)
