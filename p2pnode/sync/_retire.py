"""Retiring replicas (blocking I/O; :mod:`._retention` decides which): a replica deleted so that a ``kill -9``
at any point leaves a consistent store, and the sightings of files missing from their origin's listing, kept
across restarts.

A retired replica is first renamed into ``<data_dir>/.sync/trash/`` and the directories fsynced (the replica is
either in place or gone), then its record is dropped from the index (persisted: the receipt is withdrawn), then the
file is unlinked; whatever a crash leaves in the trash is removed at the next start, and an index record whose file
is gone is dropped when the index loads. ``.sync/retention.json`` keeps when each file was first seen missing
from its origin's listing (the "D days after it was deleted" of the policy counts from there).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .._files import atomic_write_bytes
from ._index import ReplicaIndex
from ._partial import partial_key

__all__ = ["Retirement"]

log = logging.getLogger(__name__)


class Retirement:
    """Retirement of the replicas in ``held`` under ``data_dir`` (see module docstring). Counters: ``retired``
    (replicas), ``retired_bytes``; ``unlisted_since``: ``{(origin, path): wall s first seen unlisted}``."""

    def __init__(self, held: ReplicaIndex, data_dir: Path) -> None:
        self.held = held
        self.trash = Path(data_dir) / ".sync" / "trash"
        self.retention_file = Path(data_dir) / ".sync" / "retention.json"
        self.retired = 0
        self.retired_bytes = 0
        self.unlisted_since: dict[tuple[str, str], float] = {}
        self._empty_trash()
        self._load()

    def _empty_trash(self) -> None:
        """Remove what a retirement cut short by a crash left in ``.sync/trash/`` (never a replica in place)."""
        self.trash.mkdir(parents=True, exist_ok=True)
        for p in self.trash.iterdir():
            try:
                p.unlink()
            except OSError as exc:
                log.warning("sync: cannot empty %s: %s", p, exc)

    def _load(self) -> None:
        try:
            raw = json.loads(self.retention_file.read_text())
            self.unlisted_since = {(str(o), str(p)): float(t) for o, p, t in raw.get("unlisted_since", [])}
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("sync: unreadable %s (%s): unlisted files count from now", self.retention_file, exc)
            self.unlisted_since = {}

    def note_unlisted(self, since: dict[tuple[str, str], float]) -> None:
        """Keep ``since`` (``{(origin, path): wall s first seen unlisted}``, from
        :func:`~._retention.note_unlisted`) and persist it when it changed (atomic write)."""
        if since == self.unlisted_since:
            return
        self.unlisted_since = dict(since)
        rows = sorted([o, p, t] for (o, p), t in since.items())
        atomic_write_bytes(self.retention_file, json.dumps({"unlisted_since": rows}).encode())

    def retire(self, origin: str, path: str, root: bytes) -> int:
        """Delete the replica of ``origin``'s ``path`` if it still is the version ``root`` (the caller holds the
        origin's lock; blocking). Crash-safe (see module docstring): rename into the trash and fsync, drop the
        record from the index (persisted: the receipt is withdrawn), unlink, remove the folders left empty.
        Returns the bytes freed; 0 when the replica is gone or is another version by now. Raises ``OSError``."""
        key = (origin, path)
        rec = self.held.records.get(key)
        if rec is None or rec["root"] != root.hex():
            return 0
        src = self.held.replica_path(origin, path)
        dest = self.trash / f"{partial_key(f'{origin}/{path}')}.{rec['seq']}"
        try:
            os.replace(src, dest)
        except FileNotFoundError:
            pass
        else:
            for d in (src.parent, self.trash):
                dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        self.held.remove(origin, path)
        self.unlisted_since.pop(key, None)
        dest.unlink(missing_ok=True)
        top = self.held.replicas / origin
        d = src.parent
        while d != top and top in d.parents:
            try:
                d.rmdir()
            except OSError:
                break
            d = d.parent
        self.retired += 1
        self.retired_bytes += rec["size"]
        log.info("sync: retired the replica of %s:%s (%d bytes)", origin, path, rec["size"])
        return int(rec["size"])
