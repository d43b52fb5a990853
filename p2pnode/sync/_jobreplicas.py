"""Other nodes' ended jobs, read from the replicas a durable node holds of their job archives (issue 41, item 5;
the layout and the record: :mod:`p2pnode.synccore._jobarchive`). Blocking file I/O (the routes run it in a worker
thread).

Only committed replicas are read (the store's index: verified, renamed into place), and only when the file still
has the size its record says. The node that ran a job is the replica's origin (authenticated by its push), never
what the record claims. A job id asked for is a validated :data:`p2pnode.snapshot.JobId` turned into a path by
:func:`~p2pnode.synccore.archive_paths`, never a path from a request. A record that is not read (too large,
malformed, named for another job, unreadable) is left out and counted once per version in ``rejected``.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from ..synccore import MAX_RUN_BYTES, archive_paths, archived_job, decode_run
from ._store import ReplicaStore

__all__ = ["MAX_ARCHIVED_RUNS", "ArchivedJobs"]

log = logging.getLogger(__name__)

MAX_ARCHIVED_RUNS = 1000
"""The most replicated records one listing reads (the newest committed first)."""
_MAX_REMEMBERED = 10_000


class ArchivedJobs:
    """The job archives among ``store``'s replicas (see module docstring)."""

    def __init__(self, store: ReplicaStore) -> None:
        self.store = store
        self.rejected: Counter[str] = Counter()
        self._bad: set[tuple[str, str, str]] = set()  # (origin, path, root) counted already

    def log_of(self, job_id: str) -> tuple[str, Path] | None:
        """``(origin, file)`` of the replica of job ``job_id``'s archived log (the newest committed when several
        origins name the same job id), or None."""
        try:
            log_rel, _ = archive_paths(job_id)
        except ValueError:
            return None
        best: tuple[float, str] | None = None
        for (origin, path), rec in list(self.store.index.items()):
            if path == log_rel and (best is None or (rec["committed_at"], origin) > best):
                best = (rec["committed_at"], origin)
        return (best[1], self.store.held.replica_path(best[1], log_rel)) if best is not None else None

    def runs(self, n: int) -> list[dict[str, Any]]:
        """The records of the ``n`` newest committed replicated runs (of the :data:`MAX_ARCHIVED_RUNS` newest: those
        left out make room for older ones), as dicts of :class:`~p2pnode.synccore.ArchivedRun` with ``node_id`` its
        origin, newest start first."""
        found = []
        for (origin, path), rec in list(self.store.index.items()):
            named = archived_job(path)
            if named is not None and named[1] == "run":
                found.append((rec["committed_at"], origin, path, named[0], rec))
        found.sort(key=lambda f: (f[0], f[1], f[2]), reverse=True)
        out: list[dict[str, Any]] = []
        for _, origin, path, job_id, rec in found[:MAX_ARCHIVED_RUNS]:
            if len(out) >= n:
                break
            try:
                out.append(msgspec.structs.asdict(decode_run(self._read(origin, path, rec), job_id=job_id,
                                                             origin=origin)))
            except ValueError as exc:
                self._reject(origin, path, str(rec.get("root", "")), str(exc))
        return sorted(out, key=lambda r: (-r["started_at"], r["job_id"]))

    def _read(self, origin: str, path: str, rec: dict[str, Any]) -> bytes:
        size = rec["size"]
        if size > MAX_RUN_BYTES:
            raise ValueError(f"oversized: {size} bytes (at most {MAX_RUN_BYTES})")
        try:
            with open(self.store.held.replica_path(origin, path), "rb") as f:
                data = f.read(MAX_RUN_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"unreadable: {exc}") from None
        if len(data) != size:
            raise ValueError(f"unreadable: {len(data)} bytes where the replica's record says {size}")
        return data

    def _reject(self, origin: str, path: str, root: str, why: str) -> None:
        key = (origin, path, root)
        if key in self._bad:
            return
        if len(self._bad) >= _MAX_REMEMBERED:
            self._bad.clear()
        self._bad.add(key)
        self.rejected[why.split(":", 1)[0]] += 1
        log.warning("job archive of %s: %s left out: %s", origin[:16], path, why[:300])
