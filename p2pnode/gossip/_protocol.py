"""Gossiper: the push-pull exchange over ``POST /gossip``, as a pure object around ClusterState and PeerBook.

One exchange, initiated by A toward B (the trio driver moves the bytes):

1. A -> B: A's digest and A's own newest envelope (almost always news to B, so it travels at once).
2. B merges, replies with the envelopes A lacks (B's delta for A's digest) and B's digest.
3. A merges; if B's digest lacks envelopes A holds, A pushes that delta in a second request (B's reply to it
   is merged too, but triggers no third request).

HTTP status of a reply: 200 when every pushed envelope was accepted; 409 when some were refused only as
stale, duplicate or over budget (a replay, two peers pushing the same update, more signatures than one
message may cost us); 422 when any was refused for another reason (bad
signature, wrong key, ...). 409/422 replies still carry the full gossip reply: the rest of the batch was used.
A message that cannot be used at all gets 400 (malformed), 413 (oversized) or 422 (bad type or schema) with a
JSON error body. Every rejection is counted in ``state.rejected`` by reason.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import msgspec

from ..errors import RejectedMessage, RejectReason
from ..wire import GossipMessage, decode_gossip, encode_gossip
from ._peers import PeerBook
from ._state import ClusterState, MemberEntry, MergeResult, Verified

__all__ = ["GossipReply", "Gossiper", "Prepared", "STATUS_FOR_REASON"]

MAX_REJECTED_IN_REPLY = 256  # a reply lists at most this many refusals (all are counted)

MSGPACK = "application/msgpack"

STATUS_FOR_REASON = {
    RejectReason.OVERSIZED: 413,
    RejectReason.TOO_SLOW: 408,
    RejectReason.MALFORMED: 400,
    RejectReason.BAD_TYPE: 422,
    RejectReason.BAD_SCHEMA: 422,
}


_BENIGN = (RejectReason.STALE, RejectReason.DUPLICATE, RejectReason.OVER_BUDGET)
"""Refusals that say nothing bad of the sender (a replay, a race, a batch above our budget): status 409."""


class Prepared(msgspec.Struct, frozen=True):
    """A gossip message decoded and verified (phase 1), ready to install (phase 2); or the ``error`` that
    makes the whole message unusable."""

    msg: GossipMessage | None
    verified: Verified | None
    error: RejectedMessage | None = None


class GossipReply(msgspec.Struct, frozen=True):
    """What the HTTP layer sends back: ``status``, ``body`` bytes and their ``content_type``."""

    status: int
    body: bytes
    content_type: str = MSGPACK


class Gossiper:
    """Push-pull anti-entropy between this node and its peers (see module docstring).

    ``self_addr`` is the ``host:port`` this node advertises. ``on_accepted(entry, now)`` is called for every
    snapshot accepted from a peer (the agent feeds membership with it).
    """

    def __init__(
        self,
        state: ClusterState,
        peers: PeerBook,
        *,
        self_addr: str,
        fanout: int,
        rng: random.Random,
        on_accepted: Callable[[MemberEntry, float], None] | None = None,
    ) -> None:
        self.on_accepted = on_accepted
        self.state = state
        self.peers = peers
        self.self_addr = self_addr
        self.fanout = fanout
        self.rng = rng
        self.exchanges_ok = 0
        self.exchanges_failed = 0
        self.last_self_version_seen: int | None = None

    # -- helpers -----------------------------------------------------------------------------------
    def _learn(self, result: MergeResult) -> None:
        for origin in result.accepted:
            entry = self.state.get(origin)
            if entry is None:
                continue
            if entry.addr:
                self.peers.add(entry.addr, "gossip", node_id=origin, advertised=True)
            self.peers.mark_left(origin, entry.leaving)
            if self.on_accepted is not None:
                self.on_accepted(entry, entry.received_at)
        if result.self_version_seen is not None:
            self.last_self_version_seen = max(self.last_self_version_seen or 0, result.self_version_seen)

    def _verify(self, msg: GossipMessage, max_verifications: int | None = None) -> Verified:
        verified = self.state.verify(msg.envelopes, max_verifications=max_verifications)
        verified.rejected[:0] = msg.bad_envelopes
        return verified

    def _install(self, verified: Verified, now: float) -> MergeResult:
        result = self.state.install(verified, now)
        self._learn(result)
        return result

    def _own_envelopes(self) -> list:
        own = self.state.get(self.state.self_id)
        return [own.envelope] if own is not None else []

    # -- initiator side ----------------------------------------------------------------------------
    def choose_targets(self, now: float) -> list[str]:
        """The addresses to contact this round (``fanout`` random due peers)."""
        return self.peers.choose(self.fanout, now, self.rng)

    def open_request(self) -> bytes:
        """Step 1: our digest and our own newest envelope."""
        return encode_gossip(self.state.self_id, self.self_addr, self.state.digest(), self._own_envelopes())

    def leave_request(self) -> bytes:
        """The message sent on clean shutdown: our final (``leaving``) snapshot with our full digest, so the
        reply carries only what we lack (usually nothing)."""
        return self.open_request()

    def verify_reply(self, status: int, content_type: str, body: bytes) -> Prepared | None:
        """Phase 1 of :meth:`on_reply` (decode and verify; changes no state, may run in a worker thread).
        ``None`` when the reply is unusable as a whole."""
        if status not in (200, 409, 422) or not content_type.startswith(MSGPACK):
            return None
        try:
            msg = decode_gossip(body, self.state.limits)
        except RejectedMessage as exc:
            return Prepared(None, None, exc)
        return Prepared(msg, self._verify(msg))

    def finish_reply(self, addr: str, prepared: Prepared | None, now: float, *, push: bool = True) -> bytes | None:
        """Phase 2 of :meth:`on_reply`: install what :meth:`verify_reply` verified; the follow-up push or ``None``."""
        if prepared is None or prepared.msg is None or prepared.verified is None:
            if prepared is not None and prepared.error is not None:
                self.state.count_rejection(prepared.error.reason)
            self.on_failure(addr, now)
            return None
        msg = prepared.msg
        self._install(prepared.verified, now)
        # The reply's sender names itself; an address is tied to that id only once we hold the id's signed
        # snapshot (an unauthenticated claim never re-labels an address).
        known = self.state.get(msg.sender) is not None and msg.sender != self.state.self_id
        self.peers.report(addr, True, now, node_id=msg.sender if known else None)
        self.exchanges_ok += 1
        if not push:
            return None
        missing = self.state.delta(msg.digest, news_only=True)  # heartbeats alone spread by pull
        if not missing:
            return None
        return encode_gossip(self.state.self_id, self.self_addr, self.state.digest(), missing)

    def on_reply(self, addr: str, status: int, content_type: str, body: bytes, now: float, *,
                 push: bool = True) -> bytes | None:
        """Step 3: merge a reply from ``addr``. Returns the follow-up push message, or ``None`` when the peer
        lacks nothing (or ``push`` is false). A transport failure is reported with :meth:`on_failure` instead.
        Equivalent to :meth:`finish_reply` of :meth:`verify_reply` (the driver may run the first in a thread).
        """
        return self.finish_reply(addr, self.verify_reply(status, content_type, body), now, push=push)

    def on_failure(self, addr: str, now: float) -> None:
        """A contact with ``addr`` failed (connection, timeout or unusable reply): back off."""
        self.exchanges_failed += 1
        self.peers.report(addr, False, now)

    # -- receiver side -----------------------------------------------------------------------------
    def verify_request(self, body: bytes, max_verifications: int | None = None) -> Prepared:
        """Phase 1 of :meth:`handle`: decode an inbound ``POST /gossip`` body and verify its envelopes (at most
        ``max_verifications`` signatures; default the state's per-message budget). Changes no state (the driver
        may run it in a worker thread, so signature checks never stall its event loop)."""
        try:
            msg = decode_gossip(body, self.state.limits)
        except RejectedMessage as exc:
            return Prepared(None, None, exc)
        return Prepared(msg, self._verify(msg, max_verifications))

    def finish_request(self, prepared: Prepared, now: float) -> GossipReply:
        """Phase 2 of :meth:`handle`: install what was verified and build the reply.

        The sender's stated ``addr`` is never trusted: the peer book learns an address only from an accepted,
        signed snapshot (:meth:`_learn`), so unauthenticated messages cannot fill it."""
        msg = prepared.msg
        if msg is None or prepared.verified is None:
            assert prepared.error is not None
            self.state.count_rejection(prepared.error.reason)
            return self.error_reply(prepared.error)
        result = self._install(prepared.verified, now)
        known = dict(msg.digest)  # the sender holds what it pushed, whether or not we accepted it
        for env in msg.envelopes:
            known[env.origin] = max(known.get(env.origin, -1), env.version)
        reply = encode_gossip(
            self.state.self_id,
            self.self_addr,
            self.state.digest(),
            self.state.delta(known),
            rejected=[(r.origin or "", r.reason.value) for r in result.rejected[:MAX_REJECTED_IN_REPLY]],
        )
        if not result.rejected:
            status = 200
        elif all(r.reason in _BENIGN for r in result.rejected):
            status = 409
        else:
            status = 422
        return GossipReply(status, reply)

    def handle(self, body: bytes, now: float, *, remote_host: str | None = None) -> GossipReply:
        """Step 2: answer an inbound ``POST /gossip`` body. Never raises for bad input. Equivalent to
        :meth:`finish_request` of :meth:`verify_request` (``remote_host`` is kept for callers; unused)."""
        return self.finish_request(self.verify_request(body), now)

    @staticmethod
    def error_reply(exc: RejectedMessage) -> GossipReply:
        """JSON error body for a message rejected as a whole."""
        body = json.dumps({"error": exc.reason.value, "detail": exc.detail}).encode()
        return GossipReply(STATUS_FOR_REASON.get(exc.reason, 400), body, "application/json")
