"""Gossiper: the push-pull exchange over ``POST /gossip``, as a pure object around ClusterState and PeerBook.

One exchange, initiated by A toward B (the trio driver moves the bytes):

1. A -> B: A's digest and A's own newest envelope (almost always news to B, so it travels at once).
2. B merges, replies with the envelopes A lacks (B's delta for A's digest) and B's digest.
3. A merges; if B's digest lacks envelopes A holds, A pushes that delta in a second request (B's reply to it
   is merged too, but triggers no third request).

**Partial digests** (``push_pull_interval_s`` > 0; memberlist's split between piggybacked broadcasts and a slow
TCP push-pull): a digest of every member costs about 22 bytes per member in each message, so between *full*
exchanges a message carries a **recent digest** instead (``"partial": true``): only the origins whose version
changed here within the last :func:`retransmit_window` exchanges (``retransmit_mult × ceil(log10(N + 1))``,
memberlist's retransmit limit), newest first, at most ``max_recent`` (older news waits for the next full
exchange). In a partial digest an absent origin is *unknown*, never "lacks". The exchange becomes:

1. A -> B: A's recent digest (A's own origin always named; A's own envelope attached only when it changed within
   the window).
2. B replies with the envelopes of origins A named at a version older than B's, and a partial digest: B's recent
   entries that A did not name, and B's version of each origin A named at a newer version than B holds (0: B
   holds none). Origins A named at B's own version are left out: nothing to do for them.
3. A pushes every envelope B's digest shows B lacks (heartbeats too: no full digest pulls them in between), and
   lists in ``want`` the origins B's digest shows newer, with an empty partial digest; B's reply carries the
   wanted envelopes and an empty digest (a partial request that names no origin gets none back).

A *full* exchange (both digests whole, as an older agent always sends) is made with one peer when
:func:`push_pull_interval` has passed since the last (memberlist's ``PushPullInterval`` with its
``pushPullScale``), on this node's first exchange, with a peer whose last exchange failed (it may have
restarted and lost its state), and always with a peer that answered a partial digest with a full one (an older
agent: it read every missing origin as lacking; one such exchange is the cost, then it gets full digests). A full
request is answered with a full digest, a partial one with a partial one. A lying peer's digest only changes
which signed envelopes it is sent: every envelope is still verified on merge.

HTTP status of a reply: 200 when every pushed envelope was accepted; 409 when some were refused only as
stale, duplicate or over budget (a replay, two peers pushing the same update, more signatures than one
message may cost us); 422 when any was refused for another reason (bad
signature, wrong key, ...). 409/422 replies still carry the full gossip reply: the rest of the batch was used.
A message that cannot be used at all gets 400 (malformed), 413 (oversized) or 422 (bad type or schema) with a
JSON error body. Every rejection is counted in ``state.rejected`` by reason.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable

import msgspec

from ..errors import RejectedMessage, RejectReason
from ..wire import GossipMessage, decode_gossip, encode_gossip
from ._peers import PeerBook
from ._state import ClusterState, MemberEntry, MergeResult, Verified

__all__ = ["GossipReply", "Gossiper", "Prepared", "STATUS_FOR_REASON", "push_pull_interval", "retransmit_window"]

MAX_REJECTED_IN_REPLY = 256  # a reply lists at most this many refusals (all are counted)
MAX_RECENT = 256
"""Most origins one recent digest names (memberlist bounds piggybacked broadcasts by the packet size)."""
RETRANSMIT_MULT = 4
"""memberlist's ``RetransmitMult`` (LAN default 4)."""
PUSH_PULL_SCALE_THRESHOLD = 32
"""memberlist's ``pushPullScaleThreshold``: the full push-pull interval grows above this many members."""
_MAX_TRACKED_ADDRS = 4096  # bound of the per-address sets below (old agents, failed peers, partial requests)


def retransmit_window(n: int, mult: int = RETRANSMIT_MULT) -> int:
    """Exchanges during which a change is named in this node's recent digests: ``mult × ceil(log10(n + 1))``
    (memberlist ``retransmitLimit``), at least 1."""
    return max(1, mult * math.ceil(math.log10(max(n, 1) + 1)))


def push_pull_interval(n: int, base_s: float) -> float:
    """Seconds between full push-pull exchanges in a cluster of ``n`` members: ``base_s`` up to
    :data:`PUSH_PULL_SCALE_THRESHOLD` members, then ``base_s × (ceil(log2 n − log2 32) + 1)`` (memberlist
    ``pushPullScale``: 30 s at 32, 180 s at 1,000, 210 s at 2,000), so full digests cost each node O(N / interval)
    bytes per second, nearly flat in N."""
    if n <= PUSH_PULL_SCALE_THRESHOLD:
        return base_s
    return base_s * (math.ceil(math.log2(n) - math.log2(PUSH_PULL_SCALE_THRESHOLD)) + 1)

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
    snapshot accepted from a peer (the agent feeds membership with it). ``push_pull_interval_s``: the base interval
    of full exchanges (see the module docstring; 0, the default: every message carries the full digest, as
    before); ``retransmit_mult`` and ``max_recent`` size the recent digests. ``idle_fanout`` (default: ``fanout``)
    is the peers a quiet round contacts (:mod:`p2pnode.gossip._idle`).
    """

    def __init__(
        self,
        state: ClusterState,
        peers: PeerBook,
        *,
        self_addr: str,
        fanout: int,
        rng: random.Random,
        idle_fanout: int | None = None,
        on_accepted: Callable[[MemberEntry, float], None] | None = None,
        push_pull_interval_s: float = 0.0,
        retransmit_mult: int = RETRANSMIT_MULT,
        max_recent: int = MAX_RECENT,
    ) -> None:
        self.on_accepted = on_accepted
        self.push_pull_interval_s = push_pull_interval_s
        self.retransmit_mult = retransmit_mult
        self.max_recent = max_recent
        self.next_full_at: float | None = None
        """Monotonic time of the next full exchange this node initiates (None: at its first)."""
        self._legacy: dict[str, None] = {}  # addresses that answered a partial digest with a full one
        self._failed: dict[str, None] = {}  # addresses whose last exchange failed
        self._partial_sent: dict[str, None] = {}  # addresses with a partial request in flight
        self._periodic_addr: str | None = None  # the peer of the periodic full exchange in flight
        self.full_exchanges = 0
        self.partial_exchanges = 0
        self.state = state
        self.peers = peers
        self.self_addr = self_addr
        self.fanout = fanout
        if idle_fanout is not None and idle_fanout < 1:
            raise ValueError(f"idle_fanout must be at least 1, not {idle_fanout}")  # 0: a quiet round pulls nothing
        self.idle_fanout = fanout if idle_fanout is None else min(fanout, idle_fanout)
        self.quiet_rounds = 0
        """Rounds that contacted ``idle_fanout`` peers (:meth:`choose_targets` with ``quiet``)."""
        self.failed_at = float("-inf")
        """When a contact last failed (:meth:`on_failure`; monotonic seconds passed in): a lossy network keeps
        rounds ``fanout`` wide for a while (:func:`p2pnode.gossip.quiet_round`)."""
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

    @property
    def partial_enabled(self) -> bool:
        """Whether this node sends partial digests between full exchanges (``push_pull_interval_s`` > 0)."""
        return self.push_pull_interval_s > 0

    def window(self) -> int:
        """The current :func:`retransmit_window` (exchanges) for the members held."""
        return retransmit_window(len(self.state), self.retransmit_mult)

    def recent_digest(self) -> tuple[dict[str, int], bool]:
        """This node's recent digest: origins changed within :meth:`window` exchanges (at most ``max_recent``),
        our own origin always named; and whether our own origin changed within the window."""
        digest = self.state.recent_digest(self.window(), self.max_recent)
        own_recent = self.state.self_id in digest
        own = self.state.get(self.state.self_id)
        if own is not None:
            digest.setdefault(own.origin, own.version)
        return digest, own_recent

    @staticmethod
    def _track(book: dict[str, None], addr: str) -> None:
        book.pop(addr, None)
        book[addr] = None
        if len(book) > _MAX_TRACKED_ADDRS:
            del book[next(iter(book))]

    def full_due(self, addr: str, now: float) -> bool:
        """Whether the exchange with ``addr`` starting at ``now`` must be full (see the module docstring)."""
        if not self.partial_enabled or addr in self._legacy or addr in self._failed:
            return True
        return self.next_full_at is None or now >= self.next_full_at

    # -- initiator side ----------------------------------------------------------------------------
    def choose_targets(self, now: float, *, quiet: bool = False) -> list[str]:
        """The addresses to contact this round: ``fanout`` random due peers, ``idle_fanout`` in a ``quiet`` round
        (:func:`p2pnode.gossip._idle.quiet_round`)."""
        if quiet and self.idle_fanout < self.fanout:
            self.quiet_rounds += 1
            return self.peers.choose(self.idle_fanout, now, self.rng)
        return self.peers.choose(self.fanout, now, self.rng)

    def open_request(self, addr: str | None = None, now: float | None = None) -> bytes:
        """Step 1 toward ``addr`` at ``now``: our full digest and our own newest envelope, or (partial digests on,
        no full exchange due: :meth:`full_due`) our recent digest and our own envelope if it changed lately.
        Without ``addr`` and ``now``: always full. Advances the news log's clock."""
        self.state.advance()
        if addr is None or now is None or self.full_due(addr, now):
            if addr is not None and now is not None and self.partial_enabled:
                self._partial_sent.pop(addr, None)
                if self.next_full_at is None or now >= self.next_full_at:  # the periodic one: due again if it fails
                    self.next_full_at = now + push_pull_interval(len(self.state), self.push_pull_interval_s)
                    self._periodic_addr = addr
            self.full_exchanges += 1
            return encode_gossip(self.state.self_id, self.self_addr, self.state.digest(), self._own_envelopes())
        digest, own_recent = self.recent_digest()
        self._track(self._partial_sent, addr)
        self.partial_exchanges += 1
        envelopes = self._own_envelopes() if own_recent else []
        return encode_gossip(self.state.self_id, self.self_addr, digest, envelopes, partial=True)

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
        self._failed.pop(addr, None)
        if addr == self._periodic_addr:
            self._periodic_addr = None
        if addr in self._partial_sent:
            del self._partial_sent[addr]
            if not msg.partial:  # an older agent: it took our partial digest for a full one
                self._track(self._legacy, addr)
        if not push:
            return None
        if msg.partial:
            return self._partial_push(msg.digest)
        missing = self.state.delta(msg.digest, news_only=True)  # heartbeats alone spread by pull
        if not missing:
            return None
        return encode_gossip(self.state.self_id, self.self_addr, self.state.digest(), missing)

    def _partial_push(self, named: dict[str, int]) -> bytes | None:
        """Step 3 after a partial reply: push every envelope the peer's digest shows it lacks, and ``want`` the
        origins it holds newer; ``None`` when neither."""
        missing = self.state.delta(named, named_only=True)
        want = [o for o, v in self.state.versions_of(named).items() if v < named[o]]
        if not missing and not want:
            return None
        return encode_gossip(self.state.self_id, self.self_addr, {}, missing, partial=True, want=want)

    def _partial_reply(self, msg: GossipMessage, known: dict[str, int]) -> tuple[dict[str, int], list]:
        """Step 2 (or the answer to step 3) for a partial request: the digest and envelopes (module docstring)."""
        asked = dict.fromkeys(msg.want, -1) | known if msg.want else known
        envelopes = self.state.delta(asked, named_only=True)
        if not msg.digest:
            return {}, envelopes
        recent, _ = self.recent_digest()
        digest = {o: v for o, v in recent.items() if o not in msg.digest}
        room = self.state.limits.max_partial_digest_entries - len(digest)
        for o, v in self.state.versions_of(msg.digest).items():
            if room <= 0:
                break
            if v < msg.digest[o]:
                digest[o] = v
                room -= 1
        return digest, envelopes

    def on_reply(self, addr: str, status: int, content_type: str, body: bytes, now: float, *,
                 push: bool = True) -> bytes | None:
        """Step 3: merge a reply from ``addr``. Returns the follow-up push message, or ``None`` when the peer
        lacks nothing (or ``push`` is false). A transport failure is reported with :meth:`on_failure` instead.
        Equivalent to :meth:`finish_reply` of :meth:`verify_reply` (the driver may run the first in a thread).
        """
        return self.finish_reply(addr, self.verify_reply(status, content_type, body), now, push=push)

    def on_failure(self, addr: str, now: float) -> None:
        """A contact with ``addr`` failed (connection, timeout or unusable reply): back off; the next exchange
        with it is full."""
        self.exchanges_failed += 1
        self.failed_at = max(self.failed_at, now)
        self._partial_sent.pop(addr, None)
        if addr == self._periodic_addr:  # the periodic full exchange did not happen (a dead peer): the next is full
            self.next_full_at = now
            self._periodic_addr = None
        self._track(self._failed, addr)
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
        self.state.advance()
        known = dict(msg.digest)  # the sender holds what it pushed, whether or not we accepted it
        for env in msg.envelopes:
            if known.get(env.origin, -1) < env.version:
                known[env.origin] = env.version
        if msg.partial:
            digest, envelopes = self._partial_reply(msg, known)
        else:
            digest, envelopes = self.state.digest(), self.state.delta(known)
        reply = encode_gossip(
            self.state.self_id,
            self.self_addr,
            digest,
            envelopes,
            rejected=[(r.origin or "", r.reason.value) for r in result.rejected[:MAX_REJECTED_IN_REPLY]],
            partial=msg.partial,
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
