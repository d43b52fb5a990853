"""How often the backup path copies a database its write-ahead log already ships (pure; issue 40 item 1).

A live SQLite database in WAL mode reaches its durable targets twice: by its log's segments (``POST /sync/wal``,
fresh, about one interval behind) and by the backup path (an online-backup copy synced by blocks, whose receipts
alone count for deletion, proof of possession and retention). While R targets hold the log's last segment, a
backup copy every interval buys nothing but bytes, so it is taken every ``wal_backup_interval_s`` instead; at once
again when the log stops carrying the database.

The sender's standing per database is a :class:`WalStanding`: the last segment shipped, each target's applied
position (``seq``) with the time it answered, the time of the last pass that read the log and left every target
at that segment, and the time shipping last fell back (not in WAL mode, an unreadable log, a target that refused
or could not be reached). :func:`current_targets` names the targets that hold the last segment within
``window_s``; :func:`backup_due` is the one rule the backup path asks before it copies.

Safety is unchanged by construction: a deferred copy leaves the backup path's version (and its signature of the
live file) where it was, so the replicated predicate (receipts of the *live* version) stays False for the
database, and nothing on the ephemeral side may delete it; a WAL position is never a receipt.
"""

from __future__ import annotations

import msgspec

__all__ = ["MIN_CURRENT_WINDOW_S", "TargetPosition", "WalStanding", "backup_due", "current_targets", "current_window_s"]

MIN_CURRENT_WINDOW_S = 15.0
"""A target counts as current for at least this long after its last answer (or the last pass that left it at the
last segment), so a WAL pass slowed by a loaded host does not bring back a copy per interval at a short interval.
A target that refuses or cannot be reached is a fallback at once, whatever the window."""


def current_window_s(interval_s: float) -> float:
    """How long a target stays current without news: three sync intervals, at least :data:`MIN_CURRENT_WINDOW_S`."""
    return max(3 * interval_s, MIN_CURRENT_WINDOW_S)


class TargetPosition(msgspec.Struct):
    """A target's last answer for one database: the segment ``seq`` it applied, at ``answered_at`` (monotonic s)."""

    seq: int
    answered_at: float


class WalStanding(msgspec.Struct):
    """The sender's view of one database shipped by its log (see module docstring). Times are monotonic seconds.

    ``last_seq``: the last segment shipped (0: none yet); ``r``: the replication factor its targets were chosen
    for (effective R); ``targets``: the targets of the last pass; ``positions``: each target's last applied
    answer; ``passed_at``: the last pass that read the log and left every target of ``targets`` at ``last_seq``
    (None: none yet); ``fallback_at``: the last time shipping fell back (None: never); ``fallback``: why
    (``not_wal``, ``error``, ``refused:<reason>``, ``failed``); ``pass_started_at``: when the WAL pass under way
    began (None: none under way; see :func:`current_targets`)."""

    last_seq: int = 0
    r: int = 0
    targets: tuple[str, ...] = ()
    positions: dict[str, TargetPosition] = msgspec.field(default_factory=dict)
    passed_at: float | None = None
    fallback_at: float | None = None
    fallback: str = ""
    pass_started_at: float | None = None


def current_targets(s: WalStanding, now: float, window_s: float) -> list[str]:
    """The targets of the last pass that hold the last segment shipped and were seen within ``window_s``: each
    answered that segment within the window, or the last pass (within the window) found nothing new to send and
    left them there. Sorted. While a WAL pass is under way (``pass_started_at``) the window is measured up to its
    start, not ``now``: a pass slowed by a large segment (a ``VACUUM``'s snapshot on its way, a resync's read of
    the database) does not age its targets out, else the backup path would copy the whole database again beside
    that snapshot (measured, 1 GiB database with free pages: a ``VACUUM`` cost a 720 MB snapshot and a 724 MB
    backup copy). A refusal or an unreachable target is a fallback at once, whatever the window."""
    if s.last_seq <= 0:
        return []
    ref = now if s.pass_started_at is None else min(now, s.pass_started_at)
    passed = s.passed_at is not None and ref - s.passed_at <= window_s
    out = []
    for t in s.targets:
        p = s.positions.get(t)
        if p is not None and p.seq == s.last_seq and (passed or ref - p.answered_at <= window_s):
            out.append(t)
    return sorted(out)


def backup_due(s: WalStanding | None, *, now: float, last_backup_at: float | None, backup_interval_s: float,
               window_s: float) -> bool:
    """True when the backup path should take its online-backup copy of a changed database now.

    Every interval as before (True) when ``backup_interval_s <= 0``, when the database is not shipped by its log
    (``s`` None), when no copy was taken yet (``last_backup_at`` None), when shipping fell back since the last copy
    (``fallback_at >= last_backup_at``: not in WAL mode, an unreadable log, a target refusing or unreachable), or
    when fewer than ``s.r`` targets are current (:func:`current_targets`; ``r <= 0`` counts as never enough).
    Otherwise only once ``backup_interval_s`` went by since the last copy. ``now``/``last_backup_at``: monotonic s."""
    if backup_interval_s <= 0 or s is None or last_backup_at is None:
        return True
    if s.fallback_at is not None and s.fallback_at >= last_backup_at:
        return True
    if s.r <= 0 or len(current_targets(s, now, window_s)) < s.r:
        return True
    return now - last_backup_at >= backup_interval_s


# Type information built as this module is imported (under the import lock, before any thread can use the
# classes): an agent may import it after its start-up warm-up, p2pnode.inputs.warm_type_info (msgspec builds it
# on first use, racily across threads).
for _cls in (TargetPosition, WalStanding):
    msgspec.msgpack.Decoder(_cls)
