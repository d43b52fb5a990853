"""Job history: every run recorded in SQLite (``<data_dir>/jobs.db``). Driver-level I/O, no trio.

Table ``runs``: job id, template, config, kind, node, term, start and end (wall-clock seconds), exit status,
peak RSS in bytes, and the stop reason. :meth:`JobHistory.duration_stats` gives the mean and variance of run
time per template for the planner.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

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


class JobHistory:
    """Thread-safe (one connection, a lock): the runner calls it from trio's thread and worker threads."""

    def __init__(self, path: Path) -> None:
        self._con = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("PRAGMA synchronous=NORMAL")  # survives a crash of the agent (WAL), as the ledger
        self._con.executescript(_SCHEMA)
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
        with self._lock:
            cur = self._con.execute("SELECT * FROM runs ORDER BY started_at DESC LIMIT ?", (n,))
            cols = [c[0] for c in cur.description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]

    def all_runs(self) -> list[dict[str, Any]]:
        """Every run recorded, oldest first, as dicts."""
        return self.recent(10**9)

    def duration_stats(self) -> dict[str, tuple[float, float, int]]:
        """``{template: (mean_s, variance_s2, runs)}`` over finished runs."""
        with self._lock:
            rows = self._con.execute(
                "SELECT template, AVG(ended_at - started_at), "
                "AVG((ended_at - started_at) * (ended_at - started_at)), COUNT(*) "
                "FROM runs WHERE ended_at IS NOT NULL GROUP BY template").fetchall()
        return {t: (m, max(0.0, sq - m * m), c) for t, m, sq, c in rows}

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._con.close()
