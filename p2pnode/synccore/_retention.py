"""Replica retention on durable nodes (pure): which replicas may go, in which order, and why; which must stay.

Inputs are plain data: the replicas held (:class:`Held`), each origin's verified listing (``{path: root}``, the
files its signed ``sync.digest`` covers; None when unknown), the other durable members that confirm each held
version (their receipts), when this node first saw each file missing from its origin's listing, the policy
(:class:`RetentionPolicy`) and the wall-clock time. The output is a :class:`RetentionPlan`.

Rules, in the order :func:`plan_retention` applies them:

1. A replica of a file its origin still lists (or whose origin's listing is unknown: an origin that vanished is
   the case sync exists for) is kept while the replica folder is within its cap.
2. A replica of a file the origin no longer lists (*unlisted*) is kept while it is among the origin's
   ``keep_versions`` newest unlisted replicas (by the origin's sequence number) or for ``keep_days`` after this
   node first saw it unlisted. Past both it is *retired*: it goes, reason ``retired``, whatever the cap.
3. Over the cap (``cap_bytes`` > 0), more replicas go, reason ``over_cap``, least needed first (unlisted, then a
   version the origin has since replaced, then the rest), oldest commit first, until the folder fits: only
   those whose exact version R other durable members confirm (R as the origins count it:
   :func:`~._ledger.effective_r` over the durable members other than the origin).

Safety, the point of this module: a replica goes only when another durable member confirms the same version
(size and root), and only members that rank **above** this node for the file count (rendezvous order of
:func:`~._ledger.rendezvous_rank`, key ``origin/path``): rule 2 needs one such member, rule 3 needs R of them.
So this node never deletes an *only copy* (no other durable member confirms the version and the origin does not
list it), and durable nodes that plan at the same moment from the same receipts never delete every copy: the
highest-ranked node that ever confirmed a version never sees a confirmation from above and keeps it. A file its
origin deleted therefore ends on one node, its highest-ranked holder, and stays there.

When the replicas that may go do not bring the folder within its cap, the plan is ``full``: the node refuses new
data (507 ``backpressure``) and raises an alert until a pass finds room.

Times are wall-clock seconds (``keep_days`` spans restarts; the first sighting is persisted by the store).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import blake3
import msgspec

from ._ledger import effective_r, rendezvous_rank

__all__ = [
    "KEEP_REASONS",
    "RETIRE_REASONS",
    "Decision",
    "Held",
    "RetentionPlan",
    "RetentionPolicy",
    "listing_digest",
    "note_unlisted",
    "outranks",
    "plan_retention",
]

RETIRE_REASONS = ("retired", "over_cap")
"""Why a replica goes: its origin deleted the file and retention passed (``retired``), or the folder is past its
cap and R higher-ranked durable members confirm the version (``over_cap``)."""
KEEP_REASONS = ("listed", "keep_versions", "keep_days", "only_copy", "highest_holder", "below_r", "fits")
"""Why a replica stays: the origin lists it (or is unknown), it is within the ``keep_versions`` / ``keep_days``
retention, it is an only copy, it is retired but no higher-ranked member confirms it (this node keeps the last
copy), over the cap fewer than R higher-ranked members confirm it, or over the cap it was not needed."""

DAY_S = 86400.0


class RetentionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The retention settings (``[sync] retention_*``). ``cap_bytes``: bytes of replicas held at most (0: no
    cap); ``keep_versions``: unlisted replicas kept per origin whatever their age (its newest by sequence
    number); ``keep_days``: days an unlisted replica is kept after it was first seen unlisted;
    ``replication_factor``: R."""

    cap_bytes: int = 0
    keep_versions: int = 0
    keep_days: float = 0.0
    replication_factor: int = 2


class Held(msgspec.Struct, frozen=True):
    """One replica held: ``origin``'s ``path`` at ``size`` bytes, manifest ``root`` (32 bytes), the origin's
    sequence number ``seq`` of that version and ``committed_at`` (wall-clock s)."""

    origin: str
    path: str
    size: int
    root: bytes
    seq: int
    committed_at: float

    @property
    def key(self) -> tuple[str, str]:
        """``(origin, path)``."""
        return self.origin, self.path


class Decision(msgspec.Struct, frozen=True):
    """What the plan decided for one replica: ``held``, ``action`` (``retire`` or ``keep``), ``reason`` (one of
    :data:`RETIRE_REASONS` or :data:`KEEP_REASONS`), ``status`` of the file at its origin (``listed``,
    ``replaced``: listed at another version, ``unlisted``, ``unknown``), ``confirmed_by`` (other durable members
    confirming this version), ``above`` (those ranked above this node for the file), ``only_copy`` and
    ``unlisted_for_s`` (seconds since first seen unlisted; None when listed or unknown)."""

    held: Held
    action: str
    reason: str
    status: str
    confirmed_by: frozenset[str]
    above: frozenset[str]
    only_copy: bool
    unlisted_for_s: float | None = None

    def view(self) -> dict[str, Any]:
        """A JSON-able line for ``/sync/status`` and ``p2pnode sync gc``."""
        h = self.held
        return {"origin": h.origin, "path": h.path, "size": h.size, "root": h.root.hex(), "seq": h.seq,
                "committed_at": h.committed_at, "action": self.action, "reason": self.reason,
                "status": self.status, "confirmed_by": sorted(self.confirmed_by), "above": sorted(self.above),
                "only_copy": self.only_copy,
                "unlisted_for_s": None if self.unlisted_for_s is None else round(self.unlisted_for_s, 1)}


class RetentionPlan(msgspec.Struct, frozen=True):
    """A retention pass's decisions. ``retire``: replicas to delete, in order (retired first, then over the cap,
    least needed and oldest first); ``keep``: every other replica with its reason. ``held_bytes`` now,
    ``after_bytes`` once ``retire`` is done, ``cap_bytes`` (0: none). ``full``: past the cap even after
    ``retire`` (new data must be refused)."""

    retire: list[Decision] = msgspec.field(default_factory=list)
    keep: list[Decision] = msgspec.field(default_factory=list)
    held_bytes: int = 0
    after_bytes: int = 0
    cap_bytes: int = 0

    @property
    def full(self) -> bool:
        """True when the folder stays past its cap after every allowed retirement."""
        return self.cap_bytes > 0 and self.after_bytes > self.cap_bytes

    @property
    def only_copies(self) -> list[Decision]:
        """The replicas kept because this node holds the only copy."""
        return [d for d in self.keep if d.only_copy]

    def view(self, limit: int = 1000) -> dict[str, Any]:
        """JSON-able summary: bytes, ``full``, counts of kept replicas by reason, and at most ``limit`` lines of
        ``retire`` and of ``only_copies`` (their totals given in full)."""
        kept: dict[str, int] = {}
        for d in self.keep:
            kept[d.reason] = kept.get(d.reason, 0) + 1
        only = self.only_copies
        return {
            "held_bytes": self.held_bytes, "after_bytes": self.after_bytes, "cap_bytes": self.cap_bytes,
            "full": self.full,
            "retire_count": len(self.retire), "retire_bytes": sum(d.held.size for d in self.retire),
            "retire": [d.view() for d in self.retire[:limit]],
            "only_copy_count": len(only), "only_copy_bytes": sum(d.held.size for d in only),
            "only_copies": [d.view() for d in only[:limit]],
            "kept": dict(sorted(kept.items())),
        }


def listing_digest(files: Mapping[str, bytes]) -> str:
    """The 16-hex-character BLAKE3 digest of a listing ``{path: root (32 bytes)}``: over ``path || 0 || root`` in
    path order. A pushing origin signs it as ``sync.digest``; a listing fetched from it counts when it hashes to
    the digest in the origin's newest verified snapshot."""
    h = blake3.blake3()
    for path in sorted(files):
        h.update(path.encode() + b"\x00" + files[path])
    return h.hexdigest(length=16)


def outranks(other: str, me: str, key: str) -> bool:
    """True when ``other`` ranks above ``me`` for ``key`` (``origin/path``) in rendezvous order. A member's score
    does not depend on the others, so every node answers alike."""
    return other != me and rendezvous_rank(key, (other, me))[0] == other


def note_unlisted(
    held: Iterable[tuple[str, str]],
    listings: Mapping[str, Mapping[str, bytes] | None],
    since: Mapping[tuple[str, str], float],
    now: float,
) -> dict[tuple[str, str], float]:
    """The first sightings of unlisted files after this look at the listings: ``{(origin, path): wall s}`` for
    the ``held`` replicas whose origin's listing (known, in ``listings``) lacks their path, kept from ``since``
    or stamped ``now``; a listed path is dropped, an unknown listing keeps what ``since`` had, a replica no
    longer held is dropped."""
    out: dict[tuple[str, str], float] = {}
    for key in held:
        listing = listings.get(key[0])
        if listing is None:
            if key in since:
                out[key] = since[key]
        elif key[1] not in listing:
            out[key] = since.get(key, now)
    return out


def _protected(unlisted_by_origin: Mapping[str, list[Held]], ages: Mapping[tuple[str, str], float | None],
               policy: RetentionPolicy) -> dict[tuple[str, str], str]:
    """The unlisted replicas still within retention, each with its reason: the newest ``keep_versions`` of each
    origin (``keep_versions``), and those unlisted for less than ``keep_days`` (``keep_days``); ``ages``: how long
    each has been unlisted (wall s)."""
    protected: dict[tuple[str, str], str] = {}
    for group in unlisted_by_origin.values():
        newest = sorted(group, key=lambda h: (h.seq, h.committed_at), reverse=True)
        for i, h in enumerate(newest):
            age = ages[h.key] or 0.0
            if i < policy.keep_versions:
                protected[h.key] = "keep_versions"
            elif age < policy.keep_days * DAY_S:
                protected[h.key] = "keep_days"
    return protected


def plan_retention(
    held: Iterable[Held],
    *,
    me: str,
    policy: RetentionPolicy,
    listings: Mapping[str, Mapping[str, bytes] | None],
    confirmed_by: Mapping[tuple[str, str], frozenset[str]],
    durable: Iterable[str],
    unlisted_since: Mapping[tuple[str, str], float],
    now: float,
) -> RetentionPlan:
    """Decide what goes (see module docstring).

    ``held``: the replicas of this node (``me``). ``listings``: ``{origin: {path: root}}`` verified against the
    origin's signed digest, None (or absent) when unknown. ``confirmed_by``: ``{(origin, path): members}``, the
    other durable members whose receipts match the held version exactly (this node is ignored if present).
    ``durable``: every durable member known (not left; this node included), for R. ``unlisted_since``: first
    sightings (:func:`note_unlisted`), wall s. ``now``: wall-clock seconds. Returns a :class:`RetentionPlan`.
    """
    items = sorted(held, key=lambda h: h.key)
    known = frozenset(durable) | {me}
    total = sum(h.size for h in items)
    info: dict[tuple[str, str], tuple[str, frozenset[str], frozenset[str], bool, float | None]] = {}
    unlisted_by_origin: dict[str, list[Held]] = {}
    for h in items:
        listing = listings.get(h.origin)
        if listing is None:
            status = "unknown"
        elif h.path not in listing:
            status = "unlisted"
            unlisted_by_origin.setdefault(h.origin, []).append(h)
        else:
            status = "listed" if listing[h.path] == h.root else "replaced"
        others = frozenset(confirmed_by.get(h.key, frozenset())) - {me}
        key = f"{h.origin}/{h.path}"
        above = frozenset(o for o in others if outranks(o, me, key))
        only = not others and status != "listed"
        age = now - unlisted_since.get(h.key, now) if status == "unlisted" else None
        info[h.key] = (status, others, above, only, age)

    protected = _protected(unlisted_by_origin, {k: v[4] for k, v in info.items()}, policy)

    def decision(h: Held, action: str, reason: str) -> Decision:
        status, others, above, only, age = info[h.key]
        return Decision(h, action, reason, status, others, above, only, age)

    retire: list[Decision] = []
    rest: list[Held] = []
    for h in items:
        status, _, above, only, _ = info[h.key]
        if status == "unlisted" and h.key not in protected and above and not only:
            retire.append(decision(h, "retire", "retired"))
        else:
            rest.append(h)
    retire.sort(key=lambda d: (d.held.committed_at, d.held.key))
    after = total - sum(d.held.size for d in retire)

    over: set[tuple[str, str]] = set()
    if policy.cap_bytes > 0 and after > policy.cap_bytes:
        need_order = {"unlisted": 0, "replaced": 1, "listed": 2, "unknown": 2}
        eligible = []
        for h in rest:
            status, _, above, only, _ = info[h.key]
            r = effective_r(policy.replication_factor, len(known - {h.origin}))
            if not only and len(above) >= r:
                eligible.append(h)
        eligible.sort(key=lambda h: (need_order[info[h.key][0]], h.committed_at, h.key))
        for h in eligible:
            if after <= policy.cap_bytes:
                break
            retire.append(decision(h, "retire", "over_cap"))
            over.add(h.key)
            after -= h.size

    keep: list[Decision] = []
    capped = policy.cap_bytes > 0 and total - sum(d.held.size for d in retire if d.reason == "retired") \
        > policy.cap_bytes
    for h in rest:
        if h.key in over:
            continue
        status, _, above, only, _ = info[h.key]
        if only:
            reason = "only_copy"
        elif status == "unlisted" and h.key in protected:
            reason = protected[h.key]
        elif status == "unlisted":
            reason = "highest_holder"
        elif capped:
            r = effective_r(policy.replication_factor, len(known - {h.origin}))
            reason = "below_r" if len(above) < r else "fits"
        else:
            reason = "listed"
        keep.append(decision(h, "keep", reason))
    return RetentionPlan(retire=retire, keep=keep, held_bytes=total, after_bytes=after, cap_bytes=policy.cap_bytes)
