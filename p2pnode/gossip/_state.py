"""ClusterState: the pure anti-entropy core (Scuttlebutt-style push-pull over signed snapshots).

Each origin's newest verified snapshot is held with the local monotonic time it arrived. ``digest()`` is
``{origin: version}``; ``delta(digest)`` the envelopes newer than a peer's digest; ``merge(envelopes, now)``
verifies and keeps what is newer. Merge is by (origin, version) only, never by wall-clock time. This is the
reconciliation of van Renesse et al., "Efficient Reconciliation and Flow Control for Anti-Entropy Protocols"
(LADIS 2008), with whole snapshots as the unit of state.

No I/O, no clock: ``now`` is monotonic seconds passed in by the driver.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..errors import RejectedMessage, RejectReason
from ..wire import DEFAULT_LIMITS, Envelope, WireLimits, open_envelope

__all__ = ["ClusterState", "MemberEntry", "MergeResult"]


@dataclass(slots=True)
class MemberEntry:
    """The newest verified snapshot of one origin. ``received_at`` is local monotonic seconds."""

    envelope: Envelope
    snapshot: dict[str, Any]
    received_at: float

    @property
    def origin(self) -> str:
        return self.envelope.origin

    @property
    def version(self) -> int:
        return self.envelope.version

    @property
    def addr(self) -> str:
        return self.snapshot.get("addr", "")

    @property
    def leaving(self) -> bool:
        return bool(self.snapshot.get("leaving", False))


@dataclass(slots=True)
class MergeResult:
    """Outcome of :meth:`ClusterState.merge`: origins whose snapshot was accepted, each rejection with its
    reason, and ``self_version_seen``: the highest version of *our own* origin seen from a peer (a signal
    that a former run of this node published higher versions; the driver must jump past it)."""

    accepted: list[str] = field(default_factory=list)
    rejected: list[RejectedMessage] = field(default_factory=list)
    self_version_seen: int | None = None


class ClusterState:
    """Newest signed snapshot per origin, with digest, delta and merge.

    ``self_id`` is this node's id; ``token`` enables token trust mode (every envelope must be endorsed).
    ``rejected`` counts every rejection by :class:`RejectReason` (merge rejections and those the driver
    reports through :meth:`count_rejection`).
    """

    def __init__(self, self_id: str, *, limits: WireLimits = DEFAULT_LIMITS, token: str | None = None) -> None:
        self.self_id = self_id
        self.limits = limits
        self.token = token
        self._entries: dict[str, MemberEntry] = {}
        self._tombstones: dict[str, int] = {}
        self.rejected: Counter[RejectReason] = Counter()
        self.verifications = 0

    # -- local state -------------------------------------------------------------------------------
    def set_local(self, envelope: Envelope, snapshot: dict[str, Any], now: float) -> None:
        """Install our own newest snapshot (already signed by the driver). Raises ``ValueError`` if it is not
        ours or not newer than the one held."""
        if envelope.origin != self.self_id:
            raise ValueError("set_local takes this node's own envelope")
        held = self._entries.get(self.self_id)
        if held is not None and envelope.version <= held.version:
            raise ValueError(f"local version {envelope.version} is not newer than {held.version}")
        self._entries[self.self_id] = MemberEntry(envelope, snapshot, now)

    # -- queries -----------------------------------------------------------------------------------
    def digest(self) -> dict[str, int]:
        """``{origin: version}`` of every snapshot held, ours included."""
        return {o: e.version for o, e in self._entries.items()}

    def get(self, origin: str) -> MemberEntry | None:
        return self._entries.get(origin)

    def entries(self) -> list[MemberEntry]:
        """All held entries, ours first, then by origin."""
        return sorted(self._entries.values(), key=lambda e: (e.origin != self.self_id, e.origin))

    def __len__(self) -> int:
        return len(self._entries)

    def delta(self, digest: dict[str, int], *, max_bytes: int | None = None) -> list[Envelope]:
        """Envelopes newer than ``digest`` (origins it lacks or holds at a lower version).

        Newest-received first, and only as many as fit in ``max_bytes`` (default: the body bound less 4 KiB
        for the message's own fields), so a large backlog drains over several rounds instead of failing.
        """
        budget = (self.limits.max_body_bytes - 4096) if max_bytes is None else max_bytes
        needed = [e for o, e in self._entries.items() if digest.get(o, -1) < e.version]
        needed.sort(key=lambda e: e.received_at, reverse=True)
        out: list[Envelope] = []
        for e in needed:
            size = e.envelope.wire_size
            if size > budget:
                continue
            out.append(e.envelope)
            budget -= size
        return out

    def forget(self, origin: str) -> None:
        """Drop ``origin`` (a reaped member) and keep a tombstone of its version, so that copies of its old
        snapshot still travelling in the cluster are rejected as stale instead of resurrecting it."""
        entry = self._entries.pop(origin, None)
        if entry is not None:
            self._tombstones[origin] = entry.version

    # -- merge -------------------------------------------------------------------------------------
    def count_rejection(self, reason: RejectReason) -> None:
        """Count a rejection found outside :meth:`merge` (e.g. a whole message that did not decode)."""
        self.rejected[reason] += 1

    def merge(self, envelopes: list[Envelope], now: float) -> MergeResult:
        """Verify and keep every envelope newer than the held version of its origin.

        A version not newer than the one held is rejected as ``stale`` before any signature check (replay
        protection, and cheap). Each rejection is counted; the rest of the batch is still merged. Our own
        origin is never overwritten from the network.
        """
        result = MergeResult()
        for env in envelopes:
            if env.origin == self.self_id:
                held = self._entries.get(self.self_id)
                if held is None or env.version > held.version:
                    seen = result.self_version_seen or 0
                    result.self_version_seen = max(seen, env.version)
                continue
            held = self._entries.get(env.origin)
            held_version = held.version if held is not None else self._tombstones.get(env.origin)
            try:
                if held_version is not None and env.version <= held_version:
                    raise RejectedMessage(RejectReason.STALE, f"{env.origin} v{env.version} <= held v{held_version}")
                self.verifications += 1
                snap = open_envelope(env, limits=self.limits, token=self.token)
            except RejectedMessage as exc:
                exc.origin = env.origin
                self.rejected[exc.reason] += 1
                result.rejected.append(exc)
                continue
            self._entries[env.origin] = MemberEntry(env, snap, now)
            result.accepted.append(env.origin)
        return result
