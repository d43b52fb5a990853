"""Each synced file's block size, persisted, so a restart does not re-chunk a file (blocking I/O).

A file keeps its block size while it grows, as long as the rule's choice for its new size stays within a factor
of two (:func:`p2pnode.synccore.block_size_for` with ``previous``). That memory was the last manifest, held in
memory only: after a restart a grown file could be cut at the rule's fresh choice, every block hash would change,
and the receiver would hash its whole replica again to find the unchanged ones. The choice is kept in
``.sync/blocksizes.json`` (``{"files": [{"path": p, "block_size": n}, ...]}``), written when a choice changes or a
file is added or gone (at most once per scan), and read back through one typed decoder: a bad entry (not a
power of two, out of range, a path that is not relative and normalised) is dropped and counted
(``.sync/blocksizes.json``: ``bad_entry``, :mod:`p2pnode.statefiles`); that file is then cut by the rule's choice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from .._files import atomic_write_bytes
from ..statefiles import decode_entries, read_json_file, report_for
from ..synccore import MAX_BLOCK_BYTES, PathError, check_rel_path

__all__ = ["BLOCK_SIZES_FILE", "BlockSizeBook"]

log = logging.getLogger(__name__)

BLOCK_SIZES_FILE = ".sync/blocksizes.json"
MAX_ENTRIES = 1_000_000
"""Entries read back at most (beyond: dropped and counted; those files are cut by the rule's choice)."""


class _Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One file's block size as read back."""

    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    block_size: Annotated[int, Meta(ge=1, le=MAX_BLOCK_BYTES)]


class BlockSizeBook:
    """The block size chosen for each file of a sync root (see module docstring), kept in ``state_dir``'s
    ``blocksizes.json`` (``state_dir``: the data dir's ``.sync``)."""

    def __init__(self, state_dir: Path) -> None:
        self.file = Path(state_dir) / "blocksizes.json"
        self._sizes: dict[str, int] = {}
        self._dirty = False
        report = report_for(Path(state_dir).parent)
        raw = read_json_file(self.file, file=BLOCK_SIZES_FILE, report=report)
        if raw is None:
            return
        if not isinstance(raw, dict):
            report.drop(BLOCK_SIZES_FILE, "malformed", f"expected an object, found {type(raw).__name__}: ignored")
            return
        for e in decode_entries(raw.get("files", []), _Entry, file=BLOCK_SIZES_FILE, report=report,
                                limit=MAX_ENTRIES):
            try:
                check_rel_path(e.path)
            except PathError as exc:
                report.drop(BLOCK_SIZES_FILE, "bad_entry", str(exc))
                continue
            if e.block_size & (e.block_size - 1):
                report.drop(BLOCK_SIZES_FILE, "bad_entry", f"{e.path!r}: block size {e.block_size} is not a power "
                                                           "of two")
                continue
            self._sizes[e.path] = e.block_size

    def get(self, path: str) -> int | None:
        """The block size last chosen for ``path`` (bytes), None when none is known."""
        return self._sizes.get(path)

    def note(self, path: str, block_size: int) -> None:
        """``path`` is now cut in blocks of ``block_size`` bytes (persisted by the next :meth:`save`)."""
        if self._sizes.get(path) != block_size:
            self._sizes[path] = block_size
            self._dirty = True

    def keep_only(self, paths: Iterable[str]) -> None:
        """Forget the files not in ``paths`` (gone from the sync root)."""
        keep = set(paths)
        for gone in [p for p in self._sizes if p not in keep]:
            del self._sizes[gone]
            self._dirty = True

    def save(self) -> None:
        """Write the book when it changed since the last save; a failure is logged (retried at the next save)."""
        if not self._dirty:
            return
        files = [{"path": p, "block_size": n} for p, n in sorted(self._sizes.items())]
        try:
            atomic_write_bytes(self.file, json.dumps({"files": files}).encode())
        except OSError as exc:
            log.warning("sync: could not write %s: %s", self.file, exc)
            return
        self._dirty = False


# Type information built as this module is imported (under the import lock, before any thread can use the
# classes): an agent may import it after its start-up warm-up, p2pnode.inputs.warm_type_info (msgspec builds it
# on first use, racily across threads).
for _cls in (_Entry,):
    msgspec.msgpack.Decoder(_cls)
