"""What a vanished node knew: its ended jobs' logs and history records, as files that sync like data (issue 41,
item 5). Pure: names, the record's one typed decoder, the writer's bound and the reader's merge; the drivers that
read and write the files are :mod:`p2pnode.jobs._archive` (the node that ran the job) and
:mod:`p2pnode.sync._jobreplicas` (a durable node holding their replicas).

Layout under the sync root of a node that pushes (``ephemeral``), synced whatever ``sync.globs`` says::

    p2pnode-jobs/<job id>.log    the last ``scheduler.archive_log_bytes`` of the job's log (a first line says how
                                 many bytes before them were left out)
    p2pnode-jobs/<job id>.run    its history record, msgpack :class:`ArchivedRun` (at most MAX_RUN_BYTES)

Both are written once, when the job's end is in the node's history (aside and renamed in: a ``sealed`` file to
sync), so a durable replica holds them under ``replicas/<origin>/p2pnode-jobs/``.

Trust: a replica is what its origin pushed, authenticated by the push's signature and verified block by block
(:mod:`p2pnode.sync`); the reader takes the node that ran a job from the replica's origin, never from the record,
and a record whose job id is not the one its file is named for is refused (``mismatch``). Everything read back goes
through :func:`decode_run`: bounded size, bounded types; a refusal is a :class:`ValueError` the reader counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from ..snapshot import ByteCount, Counter, JobId, RuleName, Short, SmallInt, Str, WallSeconds

__all__ = [
    "ARCHIVE_DIR",
    "ARCHIVE_REFUSALS",
    "MAX_RUN_BYTES",
    "ArchivedRun",
    "archive_paths",
    "archived_job",
    "decode_run",
    "encode_run",
    "merge_runs",
    "prune_archive",
]

ARCHIVE_DIR = "p2pnode-jobs"
"""The folder under the sync root (and under each origin's replica folder) that holds the archive."""
LOG_SUFFIX = ".log"
RUN_SUFFIX = ".run"
MAX_RUN_BYTES = 16384
"""A history record's file larger than this is refused unread (``oversized``)."""
ARCHIVE_REFUSALS = ("oversized", "malformed", "mismatch", "unreadable")
"""Why a replicated record was not shown: too large, not an :class:`ArchivedRun`, named for another job, or its
file could not be read (counted by the reader)."""


class ArchivedRun(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One ended run as its node recorded it (the ``runs`` table of :mod:`p2pnode.jobs._history`), and the size in
    bytes of its log when archived (``log_bytes``) and of the tail kept (``log_kept_bytes``). Times are Unix
    seconds; ``node_id`` is what the writer said, replaced on reading by the replica's origin."""

    job_id: JobId
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
    outcome: RuleName | None = None
    log_bytes: ByteCount = 0
    log_kept_bytes: ByteCount = 0


_DECODER = msgspec.msgpack.Decoder(ArchivedRun)


def archive_paths(job_id: str) -> tuple[str, str]:
    """``(log, record)`` paths of job ``job_id`` relative to the sync root (or to an origin's replica folder).
    Raises ``ValueError`` for a string that is no job id (:data:`p2pnode.snapshot.JOB_ID_PATTERN`)."""
    try:
        msgspec.convert(job_id, JobId)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a job id: {exc}") from None
    return f"{ARCHIVE_DIR}/{job_id}{LOG_SUFFIX}", f"{ARCHIVE_DIR}/{job_id}{RUN_SUFFIX}"


def archived_job(path: str) -> tuple[str, str] | None:
    """``(job id, "log" | "run")`` for an archive path relative to a root, or None for any other path."""
    folder, sep, name = path.partition("/")
    if folder != ARCHIVE_DIR or not sep:
        return None
    for suffix, what in ((LOG_SUFFIX, "log"), (RUN_SUFFIX, "run")):
        if name.endswith(suffix):
            job_id = name[: -len(suffix)]
            try:
                msgspec.convert(job_id, JobId)
            except msgspec.ValidationError:
                return None
            return job_id, what
    return None


def encode_run(run: ArchivedRun) -> bytes:
    """The record's file content (msgpack)."""
    return msgspec.msgpack.encode(run)


def decode_run(data: bytes, *, job_id: str | None = None, origin: str | None = None) -> ArchivedRun:
    """A record read back (a replica's file: outside input). ``job_id``: the id its file is named for (another
    one inside: ``mismatch``); ``origin``: the node whose replica it is, which replaces the record's ``node_id``.
    Raises ``ValueError`` whose first word is a reason of :data:`ARCHIVE_REFUSALS`."""
    if len(data) > MAX_RUN_BYTES:
        raise ValueError(f"oversized: {len(data)} bytes (at most {MAX_RUN_BYTES})")
    try:
        run = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeError, RecursionError) as exc:
        raise ValueError(f"malformed: {str(exc)[:200]}") from None
    if job_id is not None and run.job_id != job_id:
        raise ValueError(f"mismatch: the record of {run.job_id[:128]!r} in the file of {job_id!r}")
    if origin is not None and run.node_id != origin:
        run = msgspec.structs.replace(run, node_id=origin)
    return run


def prune_archive(entries: Iterable[tuple[str, float, int]], *, max_bytes: int, max_runs: int = 0) -> list[str]:
    """The job ids to delete so that the archive fits ``max_bytes`` and ``max_runs``: ``entries`` are ``(job id,
    ended at, bytes of its files)``; the oldest ends go first (ties: the smaller job id). A bound <= 0: none."""
    items = sorted(entries, key=lambda e: (e[1], e[0]))
    total, count = sum(e[2] for e in items), len(items)
    out: list[str] = []
    for job_id, _, size in items:
        if (max_bytes <= 0 or total <= max_bytes) and (max_runs <= 0 or count <= max_runs):
            break
        out.append(job_id)
        total -= size
        count -= 1
    return out


def merge_runs(groups: Iterable[Iterable[Mapping[str, Any]]], n: int) -> list[dict[str, Any]]:
    """The ``n`` newest runs (by start, newest first) of ``groups`` (dicts with at least ``job_id``, ``node_id`` and
    ``started_at``), one per ``(node_id, job_id)``: the first group that has a run wins (a node's own history before
    a replica's record of it)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for group in groups:
        for r in group:
            seen.setdefault((str(r["node_id"]), str(r["job_id"])), dict(r))
    return sorted(seen.values(), key=lambda r: (-float(r["started_at"]), str(r["job_id"])))[: max(0, n)]
