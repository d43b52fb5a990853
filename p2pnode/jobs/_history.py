"""Job history: every run recorded in SQLite (``<data_dir>/jobs.db``). Driver-level I/O, no trio.

Table ``runs``: job id, template, config, kind, node, term, start and end (wall-clock seconds), exit status,
peak RSS in bytes, and the stop reason. :meth:`JobHistory.duration_stats` gives the mean and variance of run
time per template for the planner.

Rows are read back through one typed decoder (:class:`_Run`, the bounded types of :mod:`p2pnode.snapshot`): a row
with a bad value (a control character in an id, a 400-digit term, text where a number belongs, a BLOB) is left out
of every view, logged and counted once (``jobs.db``: ``bad_entry``, :mod:`p2pnode.statefiles`); durations are
computed from numeric, finite, ordered times only.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from ..snapshot import ByteCount, Counter, Short, SmallInt, Str, WallSeconds
from ..statefiles import decode_entry, file_name, report_for
from ._ledger import open_db

__all__ = ["JobHistory"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    job_id TEXT PRIMARY KEY,
    template TEXT NOT NULL,
    config TEXT NOT NULL,
    kind TEXT NOT NULL,
    node_id TEXT NOT NULL,
    term INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    exit_status INTEGER,
    peak_rss_bytes INTEGER,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS runs_template ON runs (template);
"""


class _Run(msgspec.Struct, frozen=True):
    """One history row as read back (see the module docstring)."""

    job_id: Str
    template: Str
    config: Str
    kind: Short
    node_id: Str
    term: Counter
    started_at: WallSeconds
    ended_at: WallSeconds | None = None
    exit_status: SmallInt | None = None
    peak_rss_bytes: ByteCount | None = None
    reason: Annotated[str, Meta(max_length=4096)] | None = None


_COLUMNS = _Run.__struct_fields__


class JobHistory:
    """Thread-safe (one connection, a lock): the runner calls it from trio's thread and worker threads."""

    def __init__(self, path: Path) -> None:
        self.report = report_for(Path(path).parent)
        self.file = file_name(Path(path).parent, Path(path))
        # WAL, synchronous=NORMAL: survives a crash of the agent, as the ledger; a file that is no history
        # database is moved aside and a new one started (counted ``malformed``)
        self._con = open_db(Path(path), _SCHEMA, f"SELECT {', '.join(_COLUMNS)} FROM runs LIMIT 0",
                            report=self.report, file=self.file)
        self._lock = threading.Lock()

    def started(self, *, job_id: str, template: str, config: str, kind: str, node_id: str, term: int,
                at: float, keep: bool = False) -> None:
        """Record that a job started (its id, template, config, kind, node, plan term, Unix start time); with
        ``keep`` a run already recorded under ``job_id`` stays as it is (a re-adopted job)."""
        verb = "INSERT OR IGNORE" if keep else "INSERT OR REPLACE"
        with self._lock:
            self._con.execute(
                f"{verb} INTO runs (job_id, template, config, kind, node_id, term, started_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", (job_id, template, config, kind, node_id, term, at))

    def ended(self, job_id: str, *, at: float, exit_status: int | None, peak_rss_bytes: int, reason: str) -> None:
        """Record how a job ended: Unix time, exit status (None: killed by a signal), peak RSS in bytes, reason."""
        with self._lock:
            self._con.execute(
                "UPDATE runs SET ended_at = ?, exit_status = ?, peak_rss_bytes = ?, reason = ? WHERE job_id = ?",
                (at, exit_status, peak_rss_bytes, reason, job_id))

    def recent(self, n: int = 50) -> list[dict[str, Any]]:
        """The ``n`` newest runs, newest first, as dicts."""
        try:
            with self._lock:
                rows = self._con.execute(f"SELECT rowid, {', '.join(_COLUMNS)} FROM runs ORDER BY started_at DESC "
                                         "LIMIT ?", (n,)).fetchall()
        except sqlite3.DatabaseError as exc:  # a page corrupted under a readable header
            self.report.drop(self.file, "malformed", f"unreadable ({exc}): no history shown")
            return []
        out = []
        for rowid, *row in rows:
            d = dict(zip(_COLUMNS, row))
            try:
                decode_entry(d, _Run)
            except ValueError as exc:  # counted once per row (the report remembers it)
                self.report.drop(self.file, "bad_entry", f"run {str(row[0])[:80]!r} (row {rowid}): {exc}; left out")
                continue
            out.append(d)
        return out

    def all_runs(self) -> list[dict[str, Any]]:
        """Every run recorded, oldest first, as dicts."""
        return self.recent(10**9)

    def duration_stats(self) -> dict[str, tuple[float, float, int]]:
        """``{template: (mean_s, variance_s2, runs)}`` over finished runs (numeric, finite, ordered times only)."""
        try:
            with self._lock:
                rows = self._con.execute(
                    "SELECT template, AVG(ended_at - started_at), "
                    "AVG((ended_at - started_at) * (ended_at - started_at)), COUNT(*) "
                    "FROM runs WHERE typeof(ended_at) IN ('real', 'integer') AND typeof(started_at) IN ('real', "
                    "'integer') AND ended_at >= started_at AND ended_at - started_at < 1e9 AND typeof(template) = "
                    "'text' GROUP BY template").fetchall()
        except sqlite3.DatabaseError:
            return {}  # counted by recent()
        return {t: (m, max(0.0, sq - m * m), c) for t, m, sq, c in rows}

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._con.close()
