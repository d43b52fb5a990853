"""ClusterState: the pure anti-entropy core (Scuttlebutt-style push-pull over signed snapshots).

Each origin's newest verified snapshot is held with the local monotonic time it arrived. ``digest()`` is
``{origin: version}``; ``delta(digest)`` the envelopes newer than a peer's digest; ``merge(envelopes, now)``
verifies and keeps what is newer. Merge is by (origin, version) only, never by wall-clock time. This is the
reconciliation of van Renesse et al., "Efficient Reconciliation and Flow Control for Anti-Entropy Protocols"
(LADIS 2008), with whole snapshots as the unit of state.

A **news log** keeps, per origin, the exchange (:attr:`ClusterState.ticks`, advanced by the Gossiper once per
exchange) at which its held version last changed here; ``recent_digest(window, cap)`` is the digest of the origins
changed within the last ``window`` exchanges, newest first, at most ``cap`` (the partial digest that replaces the
full one between full push-pulls, as memberlist's retransmit limit bounds its piggybacked broadcasts).

No I/O, no clock: ``now`` is monotonic seconds passed in by the driver.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from operator import attrgetter

import msgspec

from ..certs import RoleGate, effective_tags
from ..errors import RejectedMessage, RejectReason
from ..snapshot import Snapshot
from ..wire import DEFAULT_LIMITS, Envelope, Tokens, WireLimits, endorsed, open_envelopes

__all__ = ["ClusterState", "MemberEntry", "MergeResult", "Verified", "carries_news"]


def carries_news(old: Snapshot, new: Snapshot) -> bool:
    """Whether ``new`` says more than a heartbeat over ``old`` (same origin): anything but its version, time,
    resource sample and guard summary changed (membership, vote, leaving, jobs, plan, sync, events, tags, ...).
    News is pushed at once by the exchange's third message; a bare heartbeat spreads by pull (every node pulls
    from ``fanout`` peers each round), which halves the messages of an idle cluster (SWIM piggybacks only
    membership changes in the same spirit)."""
    masked = msgspec.structs.replace(new, version=old.version, ts=old.ts, resources=old.resources, guard=old.guard)
    return masked != old


class MemberEntry(msgspec.Struct):
    """The newest verified snapshot of one origin. ``received_at`` is local monotonic seconds; ``news`` the
    newest version of this origin that carried news (see :func:`carries_news`): a peer holding an older version
    than ``news`` lacks news, not just a heartbeat."""

    envelope: Envelope
    snapshot: Snapshot
    received_at: float
    news: int = 0
    raw: Snapshot | None = None
    """The snapshot as signed when :attr:`snapshot` is its effective view (tags rewritten by the role gate:
    :meth:`ClusterState.recheck_roles`); None when they are the same."""
    roles_until: float = float("inf")
    """Wall-clock time (Unix seconds) at which the effective view must be computed again (a certificate ends)."""
    wire_size: int = 0
    """The envelope's :attr:`p2pnode.wire.Envelope.wire_size`, taken once (:meth:`ClusterState.delta` sums it
    over every entry a reply may carry)."""

    @property
    def signed(self) -> Snapshot:
        """The snapshot exactly as the member signed it (its own tags, not the effective ones)."""
        return self.raw if self.raw is not None else self.snapshot

    @property
    def origin(self) -> str:
        """The member's node id (from the envelope)."""
        return self.envelope.origin

    @property
    def version(self) -> int:
        """The snapshot version held."""
        return self.envelope.version

    @property
    def addr(self) -> str:
        """The ``host:port`` the member's signed snapshot advertises ('' when none)."""
        return self.snapshot.addr

    @property
    def leaving(self) -> bool:
        """True when the member announced that it leaves."""
        return self.snapshot.leaving


class MergeResult(msgspec.Struct):
    """Outcome of :meth:`ClusterState.merge`: origins whose snapshot was accepted, each rejection with its
    reason, and ``self_version_seen``: the highest version of *our own* origin seen from a peer (a signal
    that a former run of this node published higher versions; the driver must jump past it)."""

    accepted: list[str] = msgspec.field(default_factory=list)
    rejected: list[RejectedMessage] = msgspec.field(default_factory=list)
    self_version_seen: int | None = None


class Verified(msgspec.Struct):
    """Outcome of :meth:`ClusterState.verify`: the envelopes that passed with their decoded snapshots, the
    rejections so far, and how many signatures were checked."""

    opened: list[tuple[Envelope, Snapshot]] = msgspec.field(default_factory=list)
    rejected: list[RejectedMessage] = msgspec.field(default_factory=list)
    verifications: int = 0


class ClusterState:
    """Newest signed snapshot per origin, with digest, delta and merge.

    ``self_id`` is this node's id; ``token`` enables token trust mode (every envelope must be endorsed by one of
    the accepted tokens: a string, a list, or a :class:`p2pnode.keyring.Keyring` read at each check).
    ``rejected`` counts every rejection by :class:`RejectReason` (merge rejections and those the driver
    reports through :meth:`count_rejection`). At most ``max_members`` origins are held (this node included;
    new ones beyond are rejected as ``member_cap`` before any signature check), and one :meth:`merge` checks
    at most ``max_verifications`` signatures (the rest: ``over_budget``).

    ``roles``: the role gate (:class:`p2pnode.certs.RoleGate`): every snapshot held, ours included, is kept as
    its effective view (:attr:`MemberEntry.snapshot`: tags rewritten to the roles that count; the signed one in
    :attr:`MemberEntry.signed`), so every consumer reads certified roles. Certificates are judged at
    :attr:`roles_wall`, the wall-clock time the driver last gave :meth:`recheck_roles`.
    """

    def __init__(
        self,
        self_id: str,
        *,
        limits: WireLimits = DEFAULT_LIMITS,
        token: Tokens | None = None,
        max_members: int = 1024,
        max_verifications: int = 256,
        roles: RoleGate | None = None,
        roles_wall: float = 0.0,
    ) -> None:
        self.self_id = self_id
        self.roles = roles
        self.roles_wall = roles_wall
        self.max_members = max_members
        self.max_verifications = max_verifications
        self.limits = limits
        self.token = token
        self._entries: dict[str, MemberEntry] = {}
        self._versions: dict[str, int] = {}  # origin -> held version, in the order of _entries (digest: a copy)
        self._tombstones: dict[str, int] = {}
        self.rejected: Counter[RejectReason] = Counter()
        self.verifications = 0
        self.quarantines = 0
        self.quarantined: dict[str, str] = {}
        self.ticks = 0
        """Exchanges this node took part in (the news log's clock; :meth:`advance`)."""
        self._changed: dict[str, int] = {}  # origin -> tick of its last change here; insertion order = recency
        self.news_at = float("-inf")
        """When news (:func:`carries_news`: ours or a peer's, a new origin included) was last installed here
        (monotonic seconds passed in; quiet rounds: :mod:`p2pnode.gossip._idle`)."""

    # -- local state -------------------------------------------------------------------------------
    def set_local(self, envelope: Envelope, snapshot: Snapshot, now: float) -> None:
        """Install our own newest snapshot (already signed by the driver). Raises ``ValueError`` if it is not
        ours or not newer than the one held."""
        if envelope.origin != self.self_id:
            raise ValueError("set_local takes this node's own envelope")
        held = self._entries.get(self.self_id)
        if held is not None and envelope.version <= held.version:
            raise ValueError(f"local version {envelope.version} is not newer than {held.version}")
        if held is None or carries_news(held.signed, snapshot):
            self.news_at = now
        self._entries[self.self_id] = self._entry(envelope, snapshot, now, envelope.version)
        self._versions[self.self_id] = envelope.version
        self._log_change(self.self_id)

    # -- news log ----------------------------------------------------------------------------------
    def _log_change(self, origin: str) -> None:
        self._changed.pop(origin, None)
        self._changed[origin] = self.ticks

    def advance(self) -> int:
        """One more exchange (the news log's clock); returns the new :attr:`ticks`."""
        self.ticks += 1
        return self.ticks

    def recent_digest(self, window: int, cap: int) -> dict[str, int]:
        """``{origin: version}`` of the held origins whose version changed here within the last ``window``
        exchanges (``ticks - window`` or later), newest change first, at most ``cap`` entries. Costs O(entries
        returned), not O(members)."""
        out: dict[str, int] = {}
        floor = self.ticks - window
        for origin, tick in reversed(self._changed.items()):
            if tick < floor or len(out) >= cap:
                break
            entry = self._entries.get(origin)
            if entry is not None:
                out[origin] = entry.version
        return out

    def versions_of(self, origins: Iterable[str]) -> dict[str, int]:
        """``{origin: held version}`` for each of ``origins``, 0 for one not held (a partial digest's "lacks")."""
        return {o: (e.version if (e := self._entries.get(o)) is not None else 0) for o in origins}

    def _entry(self, envelope: Envelope, snapshot: Snapshot, now: float, news: int) -> MemberEntry:
        """An entry holding the effective view of ``snapshot`` (the role gate's, when there is one)."""
        gate = self.roles
        size = envelope.wire_size
        if gate is None:
            return MemberEntry(envelope, snapshot, now, news, wire_size=size)
        check = gate.check(envelope.origin, snapshot.tags, snapshot.cert, self.roles_wall)
        if not check.pinned and isinstance(snapshot.tags, list):  # no key pinned: the view is the snapshot
            return MemberEntry(envelope, snapshot, now, news, roles_until=check.recheck_at, wire_size=size)
        tags = effective_tags(snapshot.tags, check)
        if tags == snapshot.tags:
            return MemberEntry(envelope, snapshot, now, news, roles_until=check.recheck_at, wire_size=size)
        view = msgspec.structs.replace(snapshot, tags=tags)
        return MemberEntry(envelope, view, now, news, raw=snapshot, roles_until=check.recheck_at, wire_size=size)

    def recheck_roles(self, wall: float) -> list[str]:
        """Set :attr:`roles_wall` to ``wall`` (Unix seconds, as the driver's clock reads it now) and recompute the
        effective view of every held snapshot whose certificate's validity changed by then (expired, or became
        valid), without waiting for its next version. The clock is taken as it is each time: after a step
        backwards (a clock that ran ahead, set right) every view is recomputed, so one step forward never leaves
        certificates looking expired until real time catches up. Returns the origins whose view changed."""
        back = wall < self.roles_wall
        self.roles_wall = wall
        changed = []
        for origin, e in list(self._entries.items()):
            if back or e.roles_until <= wall:
                new = self._entry(e.envelope, e.signed, e.received_at, e.news)
                self._entries[origin] = new
                if new.snapshot.tags != e.snapshot.tags:
                    changed.append(origin)
        return changed

    # -- queries -----------------------------------------------------------------------------------
    def digest(self) -> dict[str, int]:
        """``{origin: version}`` of every snapshot held, ours included (a new map)."""
        return self._versions.copy()

    def get(self, origin: str) -> MemberEntry | None:
        """The entry held for ``origin``, or None."""
        return self._entries.get(origin)

    def entries(self) -> list[MemberEntry]:
        """All held entries, ours first, then by origin."""
        return sorted(self._entries.values(), key=lambda e: (e.origin != self.self_id, e.origin))

    def unordered(self) -> list[MemberEntry]:
        """All held entries in no particular order (:meth:`entries` without its sort)."""
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def delta(self, digest: dict[str, int], *, max_bytes: int | None = None, news_only: bool = False,
              named_only: bool = False) -> list[Envelope]:
        """Envelopes newer than ``digest`` (origins it lacks or holds at a lower version); with ``news_only``,
        only those of origins it lacks or whose news it lacks (a newer heartbeat alone is left to its own pull);
        with ``named_only`` (a partial digest), only origins ``digest`` names (an absent one is unknown, not
        lacking; costs O(len(digest))).

        Newest-received first, and only as many as fit in ``max_bytes`` (default: the body bound less 4 KiB
        for the message's own fields), so a large backlog drains over several rounds instead of failing.
        """
        budget = (self.limits.max_body_bytes - 4096) if max_bytes is None else max_bytes
        if named_only:
            got = ((self._entries.get(o), v) for o, v in digest.items())
            needed = [e for e, v in got if e is not None and v < (e.news if news_only else e.envelope.version)]
        elif news_only:
            needed = [e for o, e in self._entries.items() if digest.get(o, -1) < e.news]
        else:
            entries, held = self._entries, digest.get
            needed = [entries[o] for o, v in self._versions.items() if held(o, -1) < v]
        needed.sort(key=_RECEIVED_AT, reverse=True)
        out: list[Envelope] = []
        for e in needed:
            size = e.wire_size
            if size > budget:
                continue
            out.append(e.envelope)
            budget -= size
        return out

    def forget(self, origin: str) -> None:
        """Drop ``origin`` (a reaped member) and keep a tombstone of its version, so that copies of its old
        snapshot still travelling in the cluster are rejected as stale instead of resurrecting it."""
        entry = self._entries.pop(origin, None)
        self._versions.pop(origin, None)
        self._changed.pop(origin, None)
        if self.roles is not None:
            self.roles.forget(origin)
        if entry is not None:
            self._tombstones[origin] = entry.version
            while len(self._tombstones) > 4 * self.max_members:  # bounded: the oldest tombstone goes first
                del self._tombstones[next(iter(self._tombstones))]

    def quarantine(self, origin: str, reason: str) -> bool:
        """Drop ``origin``'s snapshot because a consumer could not use it (a decoder gap: every accepted value
        should be safe). Its version becomes a tombstone, so that snapshot is not taken back by anti-entropy; a
        newer version is accepted again. Counted per origin in ``quarantined`` (origin -> last reason).
        Returns True when a snapshot was dropped. Never called for our own origin."""
        if origin == self.self_id:
            return False
        entry = self._entries.pop(origin, None)
        if entry is None:
            return False
        self._versions.pop(origin, None)
        self._changed.pop(origin, None)
        self._tombstones[origin] = entry.version
        self.quarantines += 1
        if origin not in self.quarantined and len(self.quarantined) >= self.max_members:
            del self.quarantined[next(iter(self.quarantined))]
        self.quarantined[origin] = reason[:256]
        return True

    # -- merge -------------------------------------------------------------------------------------
    def count_rejection(self, reason: RejectReason) -> None:
        """Count a rejection found outside :meth:`merge` (e.g. a whole message that did not decode)."""
        self.rejected[reason] += 1

    def verify(self, envelopes: list[Envelope], *, max_verifications: int | None = None) -> Verified:
        """Phase 1 of a merge: check ``envelopes`` without changing any state (safe to run in a worker thread
        while the driver's own thread reads and installs; it only reads held versions).

        Cheapest first, so a flood costs little: per origin only the highest version in the batch is kept
        (older copies: ``duplicate``); a version not newer than the one held (or a reaped member's tombstone)
        is ``stale``; a new origin while ``max_members`` are held is ``member_cap``; beyond
        ``max_verifications`` signature checks (default :attr:`max_verifications`) the rest is ``over_budget``
        (anti-entropy sends it again in a later round). Only then is the Ed25519 signature verified and the
        body decoded (:func:`p2pnode.wire.open_envelope`; the batch's signatures together:
        :func:`p2pnode.wire.open_envelopes`). An envelope with our own id is verified like any other; if it is not
        ours (wrong key or signature) it is an ``impersonation``.
        """
        budget = self.max_verifications if max_verifications is None else max_verifications
        newest: dict[str, Envelope] = {}
        out = Verified()
        for env in envelopes:
            prev = newest.get(env.origin)
            if prev is None or env.version > prev.version:
                if prev is not None:
                    out.rejected.append(RejectedMessage(RejectReason.DUPLICATE, f"{env.origin} v{prev.version}",
                                                        origin=env.origin))
                newest[env.origin] = env
            else:
                out.rejected.append(RejectedMessage(RejectReason.DUPLICATE, f"{env.origin} v{env.version}",
                                                    origin=env.origin))
        # The signature checks of a batch run together (p2pnode.wire.open_envelopes); an envelope's outcome is
        # the one checking them one by one gives: a new origin is refused member_cap only after the new origins
        # before it were opened (their failures free their places), so the batch is opened first when that matters.
        order: list[RejectedMessage | int] = []  # per envelope past the duplicates: its refusal, or its place in batch
        batch: list[Envelope] = []
        batch_new: list[bool] = []  # per envelope of the batch: a new origin (it takes a place once opened)
        opened: list[Snapshot | RejectedMessage] = []
        held_count = len(self._entries)
        pending_new = 0  # new origins in the batch not opened yet
        versions, tombstones = self._versions, self._tombstones
        for env in newest.values():
            held_version = versions.get(env.origin)
            new = held_version is None and env.origin != self.self_id
            if held_version is None:
                held_version = tombstones.get(env.origin)
            if new and pending_new and held_count + pending_new >= self.max_members:
                held_count += self._open(batch, batch_new, opened)
                pending_new = 0
            try:
                if held_version is not None and env.version <= held_version:
                    raise RejectedMessage(RejectReason.STALE, f"{env.origin} v{env.version} <= held v{held_version}")
                if new and held_count >= self.max_members:
                    raise RejectedMessage(RejectReason.MEMBER_CAP, f"{env.origin}: {held_count} members held")
                if self.token is not None and not endorsed(env, self.token):  # cheap: before the budget
                    raise RejectedMessage(RejectReason.UNENDORSED, f"{env.origin} is not endorsed by the cluster token")
                if budget <= 0:
                    raise RejectedMessage(RejectReason.OVER_BUDGET, f"{env.origin} v{env.version}")
            except RejectedMessage as exc:
                order.append(self._refusal(env, exc))
                continue
            budget -= 1
            out.verifications += 1
            order.append(len(batch))
            batch.append(env)
            batch_new.append(new)
            pending_new += new
        self._open(batch, batch_new, opened)
        for item in order:
            if isinstance(item, RejectedMessage):
                out.rejected.append(item)
                continue
            env, result = batch[item], opened[item]
            if isinstance(result, RejectedMessage):
                out.rejected.append(self._refusal(env, result))
            else:
                out.opened.append((env, result))
        return out

    def _open(self, batch: list[Envelope], batch_new: list[bool], opened: list[Snapshot | RejectedMessage]) -> int:
        """Open the envelopes of ``batch`` not opened yet (appended to ``opened``); the new origins among them
        that opened (each takes a place below ``max_members``)."""
        start = len(opened)
        opened.extend(open_envelopes(batch[start:], limits=self.limits, token=self.token))
        return sum(1 for new, r in zip(batch_new[start:], opened[start:], strict=True)
                   if new and not isinstance(r, RejectedMessage))

    def _refusal(self, env: Envelope, exc: RejectedMessage) -> RejectedMessage:
        """``exc`` as counted for ``env``: named by its origin; a forgery of our own origin is an impersonation."""
        if env.origin == self.self_id and exc.reason in _FORGERY:
            exc = RejectedMessage(RejectReason.IMPERSONATION, f"not signed by this node: {exc}")
        exc.origin = env.origin
        return exc

    def install(self, verified: Verified, now: float) -> MergeResult:
        """Phase 2 of a merge: keep each verified snapshot that is still newer than the one held (another
        merge may have installed a newer one since :meth:`verify`), count every rejection, and report the
        highest authenticated version of our own origin seen (a former run of this node published it)."""
        result = MergeResult(rejected=list(verified.rejected))
        self.verifications += verified.verifications
        for env, snap in verified.opened:
            if env.origin == self.self_id:
                held = self._entries.get(self.self_id)
                if held is None or env.version > held.version:
                    result.self_version_seen = max(result.self_version_seen or 0, env.version)
                continue
            held = self._entries.get(env.origin)
            held_version = held.version if held is not None else self._tombstones.get(env.origin)
            if held_version is not None and env.version <= held_version:
                result.rejected.append(RejectedMessage(RejectReason.STALE, f"{env.origin} v{env.version}",
                                                       origin=env.origin))
                continue
            if held is None and len(self._entries) >= self.max_members:
                result.rejected.append(RejectedMessage(RejectReason.MEMBER_CAP, env.origin, origin=env.origin))
                continue
            news = env.version if held is None or carries_news(held.signed, snap) else held.news
            if news == env.version:
                self.news_at = now
            self._entries[env.origin] = self._entry(env, snap, now, news)
            self._versions[env.origin] = env.version
            self._tombstones.pop(env.origin, None)
            self._log_change(env.origin)
            result.accepted.append(env.origin)
        for exc in result.rejected:
            self.rejected[exc.reason] += 1
        return result

    def merge(self, envelopes: list[Envelope], now: float, *, max_verifications: int | None = None) -> MergeResult:
        """Verify and keep every envelope newer than the held version of its origin: :meth:`verify` then
        :meth:`install` (see both for the order of checks and the rejection reasons). Each rejection is
        counted; the rest of the batch is still merged. Our own origin is never overwritten from the network.
        """
        return self.install(self.verify(envelopes, max_verifications=max_verifications), now)


_RECEIVED_AT = attrgetter("received_at")
_FORGERY = (RejectReason.WRONG_KEY, RejectReason.BAD_SIGNATURE, RejectReason.UNENDORSED, RejectReason.MISMATCH)
