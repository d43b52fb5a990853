"""The sending side's view of its data: which files to sync, their class and current manifest (blocking I/O).

Files are matched by globs relative to the sync root (``**`` spans directories, ``*`` and ``?`` do not; hidden
files and directories, and symlinks, are skipped). Each file is classed:

* ``sqlite``: starts with the SQLite header. Never read while live: when the database (or its ``-wal``) changed,
  a consistent copy is taken with SQLite's online backup API into a staging file under ``.sync/staging/`` and
  switched to rollback journaling (so a replica opens read-only without a ``-shm``); the manifest and the blocks
  sent are the staging copy's, so only the pages that changed since the last copy travel. Each version gets its
  own staging file and the previous one is removed: a transfer reads the version its manifest describes or fails.
  A database its write-ahead log already ships to R current targets is copied only as often as
  :attr:`LocalFiles.backup_gate` allows (``sync.wal_backup_interval_s``); meanwhile its version (and signature)
  stays the last copy's, so it never counts as replicated as of its live state.
* ``append``: matches an ``append_globs`` pattern; grows only at the end, so a longer file re-hashes only its tail.
* ``sealed``: anything else; synced once unchanged for ``settle_s`` seconds (a file written and renamed into place
  qualifies after the settle time; one still being written waits).

Files under a template's ``[job.checkpoint] dir`` are matched whatever the globs say
(:meth:`LocalFiles.set_checkpoint_globs`, issue 41), and known by the config they belong to; so are the ended
jobs' logs and records under ``p2pnode-jobs/`` (:mod:`p2pnode.synccore._jobarchive`, issue 41 item 5).

A new manifest root gets the next value of a persistent sequence number, so a receiver never replaces a replica
with an older version (``stale_version``). Each file's block size is persisted (:mod:`._blocksizes`): a restart
does not re-chunk a grown file.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import blake3
import msgspec

from .._lazy import lazy_module
from ..identity import PersistentCounter
from ..synccore import (
    MIN_BLOCK_BYTES,
    SQLITE_MAGIC,
    SQLITE_MIN_BLOCK_BYTES,
    Manifest,
    PathError,
    archived_job,
    block_size_for,
    check_rel_path,
    hash_file,
)
from ._blocksizes import BlockSizeBook

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

__all__ = ["BackupGate", "LocalFile", "LocalFiles", "glob_regex"]

log = logging.getLogger(__name__)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over relative POSIX paths as a regex: ``**/`` matches any number of directories, ``*`` and ``?``
    stay inside one component, ``[...]`` is a character class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            j = pattern.index("]", i + 1)
            out.append("[" + pattern[i + 1 : j].replace("\\", "\\\\") + "]")
            i = j + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


class LocalFile(msgspec.Struct):
    """One file to sync. ``path`` is relative to the sync root; ``read_path`` is what blocks are read from (the
    staging copy for SQLite); ``signature`` identifies the source state the manifest describes; ``seen_at`` is
    the wall-clock time this version was first seen (for replication lag)."""

    path: str
    cls: str
    read_path: Path
    manifest: Manifest
    seq: int
    signature: tuple[int, ...]
    seen_at: float


class BackupGate(Protocol):
    """What the scan asks before copying a changed database again (:class:`~._walship.WalShipper`); both are called
    from the scan's worker thread."""

    def backup_due(self, rel: str) -> bool: ...
    def backup_taken(self, rel: str) -> None: ...


def _wal_mode(p: Path) -> bool:
    """The database's header says WAL mode (bytes 18-19, the read and write versions, are 2; SQLite's file format):
    a database switched out of it is copied at once, before a WAL pass notices."""
    with open(p, "rb") as fh:
        head = fh.read(20)
    return len(head) == 20 and head[18] == 2 and head[19] == 2


def _sig(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class LocalFiles:
    """Tracks the files under ``root`` matched by ``globs`` (see module docstring)."""

    def __init__(self, root: Path, *, globs: tuple[str, ...], append_globs: tuple[str, ...], state_dir: Path,
                 settle_s: float) -> None:
        self.root = Path(root)
        self.patterns = [glob_regex(g) for g in globs]
        self.append_patterns = [glob_regex(g) for g in append_globs]
        self.staging = Path(state_dir) / "staging"
        self.staging.mkdir(parents=True, exist_ok=True)
        for stale in self.staging.iterdir():  # copies of an earlier run: re-made on the first scan
            if stale.is_file():
                stale.unlink(missing_ok=True)
        self.seq = PersistentCounter(Path(state_dir) / "sync.seq", block=1000)
        self.block_sizes = BlockSizeBook(state_dir)  # each file's block size, kept across restarts
        self.settle_s = settle_s
        self.files: dict[str, LocalFile] = {}
        self.errors: dict[str, str] = {}
        self.backups = 0
        self.backups_deferred = 0
        """Changed databases left uncopied by a scan because :attr:`backup_gate` said not yet."""
        self.backup_gate: BackupGate | None = None
        """Asked before a changed, already tracked database is copied again (the WAL shipper: rarely while its log
        reaches R current targets); None: every change is copied."""
        self.checkpoint_patterns: tuple[tuple[str, re.Pattern[str]], ...] = ()
        """``(config, pattern)`` of the catalog's checkpoint dirs (:meth:`set_checkpoint_globs`): matched files
        are synced whatever ``globs`` says (issue 41)."""

    def set_checkpoint_globs(self, globs: tuple[tuple[str, str], ...]) -> None:
        """Sync the files under each template's checkpoint dir too: ``(config, glob)`` pairs from
        :func:`p2pnode.scheduler.checkpoint_globs` (replaced whole when a catalog is adopted)."""
        self.checkpoint_patterns = tuple((config, glob_regex(g)) for config, g in globs)

    def checkpoint_config(self, path: str) -> str | None:
        """The config whose checkpoint dir holds ``path`` (relative to the root), or None."""
        return next((config for config, p in self.checkpoint_patterns if p.match(path)), None)

    def live_signature(self, path: str) -> tuple[int, ...] | None:
        """The current signature of the source file (for SQLite: the database and its ``-wal``), or None."""
        p = self.root / path
        try:
            st = p.lstat()
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        sig = _sig(st)
        try:
            wal = os.lstat(str(p) + "-wal")
            sig += (wal.st_size, wal.st_mtime_ns)
        except OSError:
            pass
        return sig

    def _walk(self) -> list[str]:
        out: list[str] = []
        if not self.root.is_dir():
            return out
        for dirpath, dirs, names in os.walk(self.root):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in names:
                if name.startswith(".") or name.endswith(("-wal", "-shm", "-journal")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
                if any(p.match(rel) for p in self.patterns) or self.checkpoint_config(rel) is not None \
                        or archived_job(rel) is not None:
                    out.append(rel)
        return sorted(out)

    def scan(self, now: float) -> dict[str, LocalFile]:
        """Re-examine every matched file (blocking: stats, hashes changed files, backs up changed databases).
        ``now`` is wall-clock seconds. Returns the tracked files by path; files that vanished are dropped."""
        seen = set()
        for rel in self._walk():
            try:
                check_rel_path(rel)
            except PathError:
                continue
            seen.add(rel)
            try:
                self._update(rel, now)
                self.errors.pop(rel, None)
            except (OSError, ValueError, sqlite3.Error) as exc:
                self.errors[rel] = f"{exc.__class__.__name__}: {exc}"
                log.warning("sync: cannot examine %s: %s", rel, exc)
        for gone in set(self.files) - seen:
            f = self.files.pop(gone)
            if f.cls == "sqlite":
                f.read_path.unlink(missing_ok=True)  # its staging copy
        self.block_sizes.keep_only(seen)
        self.block_sizes.save()
        return self.files

    def _classify(self, p: Path, rel: str) -> str:
        with open(p, "rb") as fh:
            if fh.read(16) == SQLITE_MAGIC:
                return "sqlite"
        return "append" if any(a.match(rel) for a in self.append_patterns) else "sealed"

    def _update(self, rel: str, now: float) -> None:
        p = self.root / rel
        st = p.lstat()
        if not stat.S_ISREG(st.st_mode):
            return
        old = self.files.get(rel)
        sig = self.live_signature(rel)
        if sig is None or (old is not None and old.signature == sig):
            return
        cls = self._classify(p, rel)
        if cls == "sealed" and now - st.st_mtime < self.settle_s:
            return  # still being written, maybe
        prev = old.manifest if old is not None else None
        previous = prev.block_size if prev is not None else self.block_sizes.get(rel)  # kept across a restart
        gate = self.backup_gate
        if cls == "sqlite" and gate is not None and old is not None and old.cls == "sqlite" and old.signature \
                and _wal_mode(p) and not gate.backup_due(rel):
            self.backups_deferred += 1
            return  # its signature stays the old one: not replicated as of now, re-examined next scan
        if cls == "sqlite":
            read_path = self._backup(p, rel)
            if gate is not None:
                gate.backup_taken(rel)
            if old is not None and old.read_path != read_path:
                # one staging copy per version: a transfer that already opened the old one keeps reading it, and
                # one that has not fails to open it (and retries with the new manifest) instead of sending bytes
                # of another version
                old.read_path.unlink(missing_ok=True)
            size = read_path.stat().st_size
            bs = block_size_for(size, floor=SQLITE_MIN_BLOCK_BYTES, previous=previous)
            m = hash_file(read_path, block_size=bs)
        else:
            read_path = p
            bs = block_size_for(st.st_size, floor=MIN_BLOCK_BYTES, previous=previous)
            prefix = None
            if cls == "append" and old is not None and old.signature[0] == st.st_ino and prev is not None \
                    and prev.size <= st.st_size:
                prefix = prev
            m = hash_file(p, block_size=bs, size=st.st_size, prefix=prefix)
            if self.live_signature(rel) != sig:
                return  # changed while hashing: next pass
        self.block_sizes.note(rel, m.block_size)
        if old is not None and prev is not None and prev.root == m.root:
            old.signature = sig
            old.read_path = read_path  # the same bytes (a new staging copy for SQLite)
            return
        self.files[rel] = LocalFile(rel, cls, read_path, m, self.seq.next(), sig, now)

    def _backup(self, p: Path, rel: str) -> Path:
        """A consistent copy of the live database ``p`` in the staging folder (online backup API)."""
        key = blake3.blake3(rel.encode("utf-8", "surrogateescape")).hexdigest(length=16)
        dest = self.staging / f"{key}.{self.backups}.db"
        tmp = self.staging / f"{key}.tmp"
        tmp.unlink(missing_ok=True)
        src = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=10)
        try:
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)
                dst.execute("PRAGMA journal_mode=DELETE")
            finally:
                dst.close()
        finally:
            src.close()
        os.replace(tmp, dest)
        self.backups += 1
        return dest

    def mark_stale(self, path: str) -> None:
        """The file's blocks no longer match its manifest (changed under us): re-examine it next scan."""
        f = self.files.get(path)
        if f is not None:
            f.signature = ()


# Type information built as this module is imported (under the import lock, before any thread can use the
# classes): an agent may import it after its start-up warm-up, p2pnode.inputs.warm_type_info (msgspec builds it
# on first use, racily across threads).
for _cls in (LocalFile,):
    msgspec.msgpack.Decoder(_cls)
