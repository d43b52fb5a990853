"""Disk manager: what may be deleted to free the data dir's file system, by priority, and the deletion itself.

Thresholds (seed 000): notice ``disk_notice_percent`` (60 %: DISK_SPACE_LOW), cleanup ``disk_warn_percent``
(65 %: a cleanup pass runs), critical ``disk_max_percent`` (70 %: training work is refused). Cleanup classes,
each oldest first:

1. ``old-log``: log files (``*.log``, ``*.log.N``, ``*.log.gz``) last modified more than ``log_retention_days`` ago;
2. ``empty-database``: SQLite databases with no row in any table (no ``-wal``/``-journal`` beside them, not
   modified for ``settle_s``);
3. ``stale-checkpoint``: checkpoints (``*.pt``, ``*.pth``, ``*.ckpt``, ``*.safetensors``) beyond the
   ``checkpoint_keep`` newest of their directory;
4. ``replicated``: data that enough durable peers have confirmed (a predicate the sync part supplies; until then
   nothing qualifies), deleted only as far as needed to go back below the notice threshold.

Classes 1-3 are garbage by these rules and all go once a pass runs. A file the scanner is unsure about (cannot
stat or open it, a database in use) is kept. :func:`plan_cleanup` is pure; :func:`scan` and :func:`execute` are
the I/O around it. Every deletion is logged; :func:`execute` re-checks size and mtime before unlinking.
"""

from __future__ import annotations

import logging
import os
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .._lazy import lazy_module
from ._limits import GuardLimits

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

__all__ = ["CleanupPlan", "Deletion", "FileInfo", "execute", "plan_cleanup", "run_cleanup", "scan"]

log = logging.getLogger(__name__)

_LOG = re.compile(r"\.log(\.\d+)?(\.gz)?$")
_CKPT = (".pt", ".pth", ".ckpt", ".safetensors")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_AGENT_FILES = {"node.key", "snapshot.version", "incarnation", "vote.json", "peers.json"}
_REPLICAS_DIR = "replicas"  # replicas kept for other nodes: never this node's to clean (see p2pnode.sync)
CLASSES = ("old-log", "empty-database", "stale-checkpoint", "replicated")


class FileInfo(msgspec.Struct, frozen=True):
    """A file under the data root: ``path`` relative to it, size in bytes, mtime in wall-clock seconds, and for
    SQLite files ``empty_db`` (True/False, or None when unsure)."""

    path: str
    size_bytes: int
    mtime: float
    empty_db: bool | None = None


class Deletion(msgspec.Struct, frozen=True):
    """One file a cleanup pass deletes: ``path`` relative to the data root, its size in bytes and mtime (wall-clock
    s), and the ``rule`` (one of :data:`CLASSES`) that selected it."""

    path: str
    size_bytes: int
    mtime: float
    rule: str
    reason: str


class CleanupPlan(msgspec.Struct, frozen=True):
    """What a pass would delete (in order), the usage before and the projected usage after, in percent."""

    deletions: tuple[Deletion, ...]
    usage_percent: float
    projected_percent: float

    def to_dict(self) -> dict:
        """JSON-ready: usage and projected usage in percent, and the deletions."""
        return {
            "usage_percent": round(self.usage_percent, 2),
            "projected_percent": round(self.projected_percent, 2),
            "deletions": [
                {"path": d.path, "size_bytes": d.size_bytes, "rule": d.rule, "reason": d.reason} for d in self.deletions
            ],
        }


def plan_cleanup(
    files: list[FileInfo],
    *,
    used_bytes: int,
    total_bytes: int,
    limits: GuardLimits,
    now: float,
    replicated: Callable[[str], bool] = lambda path: False,
    protected: Callable[[str], bool] = lambda path: False,
) -> CleanupPlan:
    """The deletions of one pass (see module docstring). ``now`` is wall-clock seconds (file mtimes are).
    ``protected(path)``: a file no rule may delete (on a node that syncs: a file of its sync root whose current
    version does not have R matching receipts yet; seed 000: never delete without backing up first)."""
    files = [f for f in files if not protected(f.path)]
    usage = 100.0 * used_bytes / total_bytes if total_bytes else 0.0
    out: list[Deletion] = []
    max_age = limits.log_retention_days * 86400.0
    for f in sorted(files, key=lambda f: f.mtime):
        if _LOG.search(f.path) and now - f.mtime > max_age:
            days = (now - f.mtime) / 86400.0
            out.append(Deletion(f.path, f.size_bytes, f.mtime, "old-log",
                                f"log file last written {days:.1f} days ago (> {limits.log_retention_days:g})"))
    for f in sorted(files, key=lambda f: f.mtime):
        if f.empty_db is True:
            out.append(Deletion(f.path, f.size_bytes, f.mtime, "empty-database", "SQLite database with no rows"))
    by_dir: dict[str, list[FileInfo]] = defaultdict(list)
    for f in files:
        if f.path.endswith(_CKPT):
            by_dir[os.path.dirname(f.path)].append(f)
    stale = []
    for d, ckpts in by_dir.items():
        ckpts.sort(key=lambda f: f.mtime, reverse=True)
        for f in ckpts[limits.checkpoint_keep :]:
            stale.append(Deletion(f.path, f.size_bytes, f.mtime, "stale-checkpoint",
                                  f"older than the {limits.checkpoint_keep} newest checkpoints in {d or '.'}"))
    out += sorted(stale, key=lambda d: d.mtime)
    freed = sum(d.size_bytes for d in out)
    taken = {d.path for d in out}
    target = total_bytes * limits.disk_notice_percent / 100.0
    for f in sorted(files, key=lambda f: f.mtime):
        if used_bytes - freed < target:
            break
        if f.path not in taken and replicated(f.path):
            out.append(Deletion(f.path, f.size_bytes, f.mtime, "replicated", "confirmed by enough durable replicas"))
            freed += f.size_bytes
    projected = 100.0 * max(0, used_bytes - freed) / total_bytes if total_bytes else 0.0
    return CleanupPlan(tuple(out), usage, projected)


def _sqlite_empty(path: Path) -> bool | None:
    """True/False for a quiet SQLite database; None when unsure (in use, unreadable, not SQLite)."""
    for suffix in ("-wal", "-journal", "-shm"):
        if Path(str(path) + suffix).exists():
            return None
    try:
        with open(path, "rb") as fh:
            if fh.read(16) != _SQLITE_MAGIC:
                return None
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for t in tables:
                if con.execute(f'SELECT 1 FROM "{t.replace(chr(34), chr(34) * 2)}" LIMIT 1').fetchone():
                    return False
            return True
        finally:
            con.close()
    except (OSError, sqlite3.Error):
        return None


def scan(root: Path, *, now: float, settle_s: float = 600.0) -> list[FileInfo]:
    """Every regular file under ``root`` (symlinks not followed; the agent's own files, hidden folders and
    ``replicas/``, the copies this node keeps for others, skipped). SQLite files (by header) quiet for
    ``settle_s`` seconds get ``empty_db``."""
    out = []
    root = Path(root)
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (Path(dirpath) == root and d == _REPLICAS_DIR)]
        for name in names:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if rel in _AGENT_FILES or name.startswith("."):
                continue
            try:
                st = p.lstat()
            except OSError:
                continue
            if not p.is_file() or p.is_symlink():
                continue
            empty = None
            if st.st_size >= 16 and now - st.st_mtime >= settle_s:
                try:
                    with open(p, "rb") as fh:
                        if fh.read(16) == _SQLITE_MAGIC:
                            empty = _sqlite_empty(p)
                except OSError:
                    pass
            out.append(FileInfo(rel, st.st_size, st.st_mtime, empty))
    return out


def execute(plan: CleanupPlan, root: Path, *, dry_run: bool) -> list[Deletion]:
    """Delete the plan's files under ``root`` (or, with ``dry_run``, only log what would go). A file whose size
    or mtime changed since the scan is kept. Returns the deletions done (or that a dry run would do)."""
    done = []
    for d in plan.deletions:
        p = Path(root) / d.path
        try:
            st = p.lstat()
        except OSError:
            continue
        if st.st_size != d.size_bytes or st.st_mtime != d.mtime:
            log.info("disk manager: keeping %s (changed since the scan)", d.path)
            continue
        if dry_run:
            log.info("disk manager (dry run): would delete %s (%d bytes): %s", d.path, d.size_bytes, d.reason)
        else:
            try:
                p.unlink()
            except OSError as exc:
                log.warning("disk manager: cannot delete %s: %s", d.path, exc)
                continue
            log.warning("disk manager: deleted %s (%d bytes, %s): %s", d.path, d.size_bytes, d.rule, d.reason)
        done.append(d)
    return done


def run_cleanup(root: Path, limits: GuardLimits, *, dry_run: bool, now: float | None = None,
                replicated: Callable[[str], bool] = lambda path: False,
                protected: Callable[[str], bool] = lambda path: False) -> dict:
    """One disk-manager pass over ``root``: scan, plan against the file system's usage, execute (or dry-run).
    ``replicated(path)``: the sync part's answer to "is this file's current version confirmed by R durable
    replicas" (see :meth:`p2pnode.sync.SyncService.replicated`); ``protected(path)``: never deleted (see
    :func:`plan_cleanup`). Returns the plan, what was done and the bytes
    freed (blocking I/O; from trio, run it in a thread)."""
    import time

    now = time.time() if now is None else now
    files = scan(root, now=now)
    st = os.statvfs(root)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    total = used + st.f_bavail * st.f_frsize  # as df and psutil count: blocks reserved for root excluded
    plan = plan_cleanup(files, used_bytes=used, total_bytes=total, limits=limits, now=now, replicated=replicated,
                        protected=protected)
    done = execute(plan, root, dry_run=dry_run)
    return {"at": now, "dry_run": dry_run, **plan.to_dict(), "done": [d.path for d in done],
            "freed_bytes": sum(d.size_bytes for d in done)}
