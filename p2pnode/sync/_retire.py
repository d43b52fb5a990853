"""Retiring replicas (blocking I/O; :mod:`._retention` decides which): a replica deleted so that a ``kill -9``
at any point leaves a consistent store, and the sightings of files missing from their origin's listing, kept
across restarts.

A retired replica is first renamed into ``<data_dir>/.sync/trash/`` and the directories fsynced (the replica is
either in place or gone), then its record is dropped from the index (persisted: the receipt is withdrawn), then the
file is unlinked; whatever a crash leaves in the trash is removed at the next start, and an index record whose file
is gone is dropped when the index loads. ``.sync/retention.json`` keeps when each file was first seen missing
from its origin's listing (the "D days after it was deleted" of the policy counts from there); a bad row of it is
dropped, logged and counted (``.sync/retention.json``: ``bad_entry``, :mod:`p2pnode.statefiles`): that file's
sighting counts from now, which only keeps a replica longer.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated

from msgspec import Meta

from .._files import atomic_write_bytes
from ..snapshot import NodeId, WallSeconds
from ..statefiles import decode_entries, decode_entry, read_json_file, report_for
from ._index import ReplicaIndex
from ._partial import partial_key

__all__ = ["Retirement"]

log = logging.getLogger(__name__)


RETENTION_FILE = ".sync/retention.json"
_Sighting = tuple[NodeId, Annotated[str, Meta(min_length=1, max_length=4096)], WallSeconds]
"""One row of the retention file: ``[origin, path, wall s first seen unlisted]``."""


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
        report = report_for(self.trash.parent.parent)
        raw = read_json_file(self.retention_file, file=RETENTION_FILE, report=report)
        if raw is None:
            return
        if not isinstance(raw, dict):
            report.drop(RETENTION_FILE, "malformed", "expected an object: unlisted files count from now")
            return
        rows = decode_entries(raw.get("unlisted_since", []), _Sighting, file=RETENTION_FILE, report=report)
        self.unlisted_since = {(o, p): t for o, p, t in rows}

    def note_unlisted(self, since: dict[tuple[str, str], float]) -> None:
        """Keep ``since`` (``{(origin, path): wall s first seen unlisted}``, from
        :func:`~._retention.note_unlisted`) and persist it when it changed (atomic write)."""
        if since == self.unlisted_since:
            return
        rows = []
        for (o, p), t in since.items():
            try:
                rows.append(list(decode_entry([o, p, t], _Sighting)))
            except ValueError as exc:  # never persisted: the file must read back
                log.error("sync: sighting of %r:%r not kept: %s", str(o)[:64], str(p)[:200], exc)
        self.unlisted_since = {(o, p): t for o, p, t in rows}
        rows.sort()
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
        size: int = rec["size"]  # a decoded record (ByteCount)
        return size
