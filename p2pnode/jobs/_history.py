"""Job history: every run recorded in SQLite (``<data_dir>/jobs.db``). Driver-level I/O, no trio.

Table ``runs``: job id, template, config, kind, node, term, start and end (wall-clock seconds), exit status,
peak RSS in bytes, the stop reason, the node's class when the run started (:func:`p2pnode.scheduler.node_class_of`),
peak VRAM in bytes where the runner measured it (NULL otherwise), the stop ``rule`` that ended it (a
:data:`p2pnode.node._jobstate.StopRule` name; NULL when no rule stopped it) and its ``outcome`` (a
:data:`p2pnode.node._jobstate.EndOutcome`: ``completed``, ``failed``, ``stopped``, ``lost``). A file written before
the last four columns existed gains them in place (its old rows keep NULL: their class is taken as the node's class
now; no rule or outcome is shown for them).
:meth:`JobHistory.usage_doc` summarises the completed runs for the fleet's predictor
(:func:`p2pnode.scheduler.summarize`); :meth:`JobHistory.duration_stats` gives the mean and variance of run time
per template.

Rows are read back through one typed decoder (:class:`_Run`, the bounded types of :mod:`p2pnode.snapshot`): a row
with a bad value (a control character in an id, a 400-digit term, text where a number belongs, a BLOB) is left out
of every view, logged and counted once (``jobs.db``: ``bad_entry``, :mod:`p2pnode.statefiles`); durations are
computed from numeric, finite, ordered times only.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta

from .._lazy import lazy_module
from ..scheduler import RunRecord, summarize
from ..snapshot import ByteCount, Counter, RuleName, Short, SmallInt, Str, UsageDoc, WallSeconds
from ..statefiles import decode_entry, file_name, report_for
from ._ledger import open_db

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

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
    reason TEXT,
    node_class TEXT,
    peak_vram_bytes INTEGER,
    rule TEXT,
    outcome TEXT
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
    node_class: Short | None = None
    peak_vram_bytes: ByteCount | None = None
    rule: RuleName | None = None
    outcome: RuleName | None = None  # an EndOutcome: a bounded lowercase name, as a rule


_COLUMNS = _Run.__struct_fields__
_ADDED = {"node_class": "TEXT", "peak_vram_bytes": "INTEGER", "rule": "TEXT", "outcome": "TEXT"}
"""Columns a history written by an older agent lacks: added in place at open."""
MAX_SUMMARY_RUNS = 100_000
"""The newest runs :meth:`JobHistory.usage_doc` reads at most."""


class JobHistory:
    """Thread-safe (one connection, a lock): the runner calls it from trio's thread and worker threads."""

    def __init__(self, path: Path) -> None:
        self.report = report_for(Path(path).parent)
        self.file = file_name(Path(path).parent, Path(path))
        # WAL, synchronous=NORMAL: survives a crash of the agent, as the ledger; a file that is no history
        # database is moved aside and a new one started (counted ``malformed``)
        old = [c for c in _COLUMNS if c not in _ADDED]
        self._con = open_db(Path(path), _SCHEMA, f"SELECT {', '.join(old)} FROM runs LIMIT 0",
                            report=self.report, file=self.file)
        have = {r[1] for r in self._con.execute("PRAGMA table_info(runs)")}
        for column, kind in _ADDED.items():
            if column not in have:  # an older agent's file
                self._con.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
        self._lock = threading.Lock()

    def started(self, *, job_id: str, template: str, config: str, kind: str, node_id: str, term: int,
                at: float, keep: bool = False, node_class: str | None = None) -> None:
        """Record that a job started (its id, template, config, kind, node, plan term, Unix start time, the node's
        class: None unknown); with ``keep`` a run already recorded under ``job_id`` stays as it is (a re-adopted
        job)."""
        verb = "INSERT OR IGNORE" if keep else "INSERT OR REPLACE"
        with self._lock:
            self._con.execute(
                f"{verb} INTO runs (job_id, template, config, kind, node_id, term, started_at, node_class) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (job_id, template, config, kind, node_id, term, at, node_class))

    def ended(self, job_id: str, *, at: float, exit_status: int | None, peak_rss_bytes: int, reason: str,
              peak_vram_bytes: int | None = None, rule: str | None = None, outcome: str | None = None) -> None:
        """Record how a job ended: Unix time, exit status (None: killed by a signal), peak RSS in bytes, reason,
        peak VRAM in bytes (None: not measured), the stop rule that ended it (None: none did) and its outcome
        (None: not known)."""
        with self._lock:
            self._con.execute(
                "UPDATE runs SET ended_at = ?, exit_status = ?, peak_rss_bytes = ?, reason = ?, peak_vram_bytes = ?, "
                "rule = ?, outcome = ? WHERE job_id = ?",
                (at, exit_status, peak_rss_bytes, reason, peak_vram_bytes or None, rule or None, outcome or None,
                 job_id))

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

    def usage_doc(self, node_id: str, node_class: str) -> UsageDoc:
        """This node's run-history summary (:func:`p2pnode.scheduler.summarize`) over its completed runs (exit
        status 0, ordered times; stopped, failed and lost runs say nothing of a job's length and are left out), the
        newest :data:`MAX_SUMMARY_RUNS`, read through the typed row decoder (a bad row is left out and counted).
        A run recorded without a class (an older agent's) counts as ``node_class``, the node's class now."""
        runs = []
        for r in self.recent(MAX_SUMMARY_RUNS):
            end, start = r["ended_at"], r["started_at"]
            if r["exit_status"] != 0 or end is None or end < start:
                continue
            runs.append(RunRecord(r["template"], r["node_class"] or node_class, end - start,
                                  r["peak_rss_bytes"] or None, r["peak_vram_bytes"] or None))
        return summarize(node_id, runs)

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
