"""The archive of ended jobs on a node that pushes (issue 41, item 5): each ended run's log tail and history record
written under the sync root, so sync carries them to durable replicas like data and a vanished node's jobs can
still be read (:mod:`p2pnode.synccore._jobarchive` gives the layout, the record and the rules). Blocking file I/O:
the job driver calls :meth:`JobArchive.catch_up` in a worker thread after a job ends and at start.

It reconciles: every ended run among the history's newest :data:`SCAN_RUNS` whose record is not in the archive
folder (as listed at the first pass, then as this object wrote and deleted it: a file the disk manager removed
later, once replicated, is not written again before a restart) is written (its log's last ``log_bytes`` first,
then its record, each aside and renamed in), unless the bounds would take it out at once (``max_bytes`` and
``max_runs``: the oldest ends go first, :func:`~p2pnode.synccore.prune_archive`), and the files of the runs past
the bounds are deleted. A run ended while the agent was down is archived at the next start. Files the agent
cannot write are counted (``errors``) and tried again at the next job's end; nothing here stops the agent.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .._files import atomic_write_bytes
from ..synccore import ARCHIVE_DIR, MAX_RUN_BYTES, ArchivedRun, archive_paths, archived_job, encode_run, prune_archive

__all__ = ["MAX_RUNS_KEPT", "SCAN_RUNS", "JobArchive"]

log = logging.getLogger(__name__)

SCAN_RUNS = 256
"""The newest runs of the history each pass looks at."""
MAX_RUNS_KEPT = 2000
"""Runs the archive holds at most, whatever their size: each is two synced files, and a node's sync listing (its
manifests, the durable nodes' receipts) grows with them."""


class JobArchive:
    """Ended runs' logs and records under ``root``/``p2pnode-jobs``: ``logs_dir`` holds the node's job logs
    (``<job id>.log``), ``log_bytes`` the tail kept of each (bytes), ``max_bytes`` the folder's bound (bytes, 0:
    none), ``max_runs`` the most runs it holds (0: no bound). Counters: ``written`` (runs archived), ``pruned``
    (runs deleted for the bounds), ``errors``."""

    def __init__(self, *, root: Path, logs_dir: Path, log_bytes: int, max_bytes: int,
                 max_runs: int = MAX_RUNS_KEPT) -> None:
        self.root = Path(root)
        self.dir = self.root / ARCHIVE_DIR
        self.logs_dir = Path(logs_dir)
        self.log_bytes = max(0, log_bytes)
        self.max_bytes = max(0, max_bytes)
        self.max_runs = max(0, max_runs)
        self.written = 0
        self.pruned = 0
        self.errors = 0
        self._known: dict[str, tuple[float, int]] | None = None  # job id -> (ended at, bytes): the folder's records

    def catch_up(self, runs: Sequence[Mapping[str, Any]]) -> int:
        """Archive the ended runs of ``runs`` (history rows, :meth:`p2pnode.jobs._history.JobHistory.recent`) not
        archived yet, then hold the folder within its bound. Returns how many runs were written."""
        if self._known is None:
            self._known = self._held()
        held = self._known if self._known is not None else {}
        todo: dict[str, tuple[Mapping[str, Any], int]] = {}
        for r in runs[:SCAN_RUNS]:
            job_id = r.get("job_id")
            if r.get("ended_at") is None or not isinstance(job_id, str) or job_id in held or job_id in todo:
                continue
            try:
                archive_paths(job_id)
            except ValueError:
                continue
            todo[job_id] = (r, self._log_size(job_id))
        entries = [(j, at, size) for j, (at, size) in held.items()]
        entries += [(j, float(r["ended_at"]), min(size, self.log_bytes) + 512)  # (a record: a few hundred bytes)
                    for j, (r, size) in todo.items()]
        out = set(prune_archive(entries, max_bytes=self.max_bytes, max_runs=self.max_runs))
        written = 0
        for job_id, (r, _) in sorted(todo.items(), key=lambda kv: float(kv[1][0]["ended_at"])):
            if job_id not in out and self._write(job_id, r):
                written += 1
                held[job_id] = (float(r["ended_at"]), self._files_size(job_id))
        for job_id in out & held.keys():
            if self._delete(job_id):
                del held[job_id]
        return written

    # -- the folder ---------------------------------------------------------------------------------
    def _held(self) -> dict[str, tuple[float, int]] | None:
        """``{job id: (ended at, bytes of its files)}`` of the records in the folder (a record that does not decode
        counts as ended at 0: the first to go); None when the folder cannot be listed (listed again next pass)."""
        out: dict[str, tuple[float, int]] = {}
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return out
        except OSError as exc:
            self._failed(f"cannot list {self.dir}: {exc}")
            return None
        for name in names:
            found = archived_job(f"{ARCHIVE_DIR}/{name}")
            if found is None or found[1] != "run":
                continue
            job_id = found[0]
            ended, size = 0.0, 0
            try:
                with open(self.dir / name, "rb") as f:
                    data = f.read(MAX_RUN_BYTES + 1)
                size = self._files_size(job_id)
                ended = msgspec.msgpack.decode(data, type=ArchivedRun).ended_at or 0.0
            except (OSError, msgspec.MsgspecError):
                pass
            out[job_id] = (ended, size)
        return out

    def _files_size(self, job_id: str) -> int:
        return self._size(self.dir / f"{job_id}.log") + self._size(self.dir / f"{job_id}.run")

    def _log_size(self, job_id: str) -> int:
        return self._size(self.logs_dir / f"{job_id}.log")

    @staticmethod
    def _size(path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:
            return 0

    def _write(self, job_id: str, row: Mapping[str, Any]) -> bool:
        """Write the log tail, then the record (the record last: a run is archived once its record is there)."""
        log_rel, run_rel = archive_paths(job_id)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            size, tail = self._tail(self.logs_dir / f"{job_id}.log")
            if tail is not None:
                atomic_write_bytes(self.root / log_rel, tail)
            fields = {k: row[k] for k in ArchivedRun.__struct_fields__ if k in row}
            run = msgspec.convert({**fields, "log_bytes": size, "log_kept_bytes": min(size, self.log_bytes)},
                                  ArchivedRun)
            atomic_write_bytes(self.root / run_rel, encode_run(run))
        except (OSError, msgspec.ValidationError) as exc:
            self._failed(f"cannot archive job {job_id}: {exc}")
            return False
        self.written += 1
        return True

    def _tail(self, path: Path) -> tuple[int, bytes | None]:
        """``(size of the log, what is kept of it)``; ``(0, None)`` when the job left no log."""
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                keep = min(size, self.log_bytes)
                f.seek(size - keep)
                data = f.read(keep)
        except FileNotFoundError:
            return 0, None
        if keep < size:
            data = (f"[p2pnode: the first {size - keep} bytes of this log are left out; its last {keep} bytes "
                    "follow]\n").encode() + data
        return size, data

    def _delete(self, job_id: str) -> bool:
        for rel in reversed(archive_paths(job_id)):  # the record first: no record without its log
            try:
                (self.root / rel).unlink(missing_ok=True)
            except OSError as exc:
                self._failed(f"cannot delete {rel}: {exc}")
                return False
        self.pruned += 1
        return True

    def _failed(self, what: str) -> None:
        self.errors += 1
        log.warning("job archive: %s", what)
