"""The probe wire: SWIM's Ping, PingReq, Ack and Nack as small MAC-authenticated packets. Pure (times passed in).

A packet is the msgpack array ``[key_id, body, mac]``: ``body`` is one message (a msgspec tagged array: seq,
sender, receiver, its fields, the sender's wall-clock ``ts_ms``, for requests a 16-byte ``pad``, and last, in pings
and acks, the sender's highest election ``term``: a trailing field, absent from older agents' packets and ignored
by them), ``mac`` the
first 16 bytes of keyed BLAKE3 over ``"p2pnode-probe-v1" || key_id || body`` under the **pair key** of sender
and receiver. At most :data:`MAX_PACKET_BYTES`; a reply is never larger than the request it answers (the pad
covers an incarnation that grew; the codec holds the size of every request it opened and seals a reply only
within it), so a forged source address buys no amplification.

**Pair key** (:class:`ProbeKeys`): both nodes' Ed25519 identities converted to X25519 (RFC 7748 birational map;
the private scalar is the first half of SHA-512 of the Ed25519 seed, as libsodium's
``crypto_sign_ed25519_sk_to_curve25519``), one Diffie-Hellman, then ``BLAKE3.derive_key("p2pnode 2026 probe pair
key v1", shared || sorted ids || token)``. In **token mode** ``token`` is a keyring token (the packet's
``key_id`` names which; we send under the primary, accept any installed one), so only holders of a cluster token
*and* the two private keys can compute it; in **open mode** (no keyring) ``token`` is empty and ``key_id`` is
``""``: the key still binds the two identities, so nobody but the two nodes can forge a probe between them (the
peer's public key is the one in its signed snapshot; a sender whose snapshot we do not hold is ``unknown_sender``).
Keys are cached per (peer, key id), bounded.

Inbound order (cheapest first; every refusal counted in :attr:`ProbeCodec.rejected` by reason):
``rate_limited`` (per source address, before any work: :class:`TokenBuckets`), ``oversized``, ``malformed``
(not the typed packet), ``wrong_receiver`` (names another node: a probe captured on its way to one node is
worth nothing at another), ``unknown_sender`` / ``unknown_key`` (no pair key), ``bad_mac``, ``stale`` (``ts_ms``
outside ±``window_ms`` of our wall clock), ``replay`` (a (sender, kind, seq) already accepted within the window).
"""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Annotated

import blake3
import msgspec

from .._ed25519 import SigningKey
from .._ed25519 import x25519 as _x25519
from ..keyring import Keyring
from ..snapshot import COUNTER_MAX
from ._probe import Ack, Nack, Ping, PingReq
from ._ratelimit import TokenBuckets

__all__ = ["MAX_PACKET_BYTES", "PROBE_REJECT_REASONS", "ProbeCodec", "ProbeKeys", "ed25519_to_x25519_public"]

MAX_PACKET_BYTES = 512
"""No probe packet is larger (ids are 16 characters; a ping is about 90 bytes)."""
MAC_BYTES = 16
PAD_BYTES = 16
_CONTEXT = b"p2pnode-probe-v1"
_KDF_CONTEXT = "p2pnode 2026 probe pair key v1"
PROBE_REJECT_REASONS = ("rate_limited", "oversized", "malformed", "wrong_receiver", "unknown_sender",
                        "unknown_key", "bad_mac", "stale", "replay", "reply_too_large", "unsolicited_reply")

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
_Seq = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_Inc = Annotated[int, msgspec.Meta(ge=0, le=COUNTER_MAX)]
_Ts = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_Pad = Annotated[bytes, msgspec.Meta(max_length=64)]


class _WPing(msgspec.Struct, array_like=True, frozen=True, tag=1):
    seq: _Seq
    sender: _Id
    to: _Id
    incarnation: _Inc
    suspected: bool
    ts_ms: _Ts
    pad: _Pad = b""
    term: _Inc = 0  # the sender's highest term (0 from agents before it: trailing, so both decode each other)


class _WPingReq(msgspec.Struct, array_like=True, frozen=True, tag=2):
    seq: _Seq
    sender: _Id
    to: _Id
    target: _Id
    incarnation: _Inc
    ts_ms: _Ts
    pad: _Pad = b""


class _WAck(msgspec.Struct, array_like=True, frozen=True, tag=3):
    seq: _Seq
    sender: _Id
    to: _Id
    incarnation: _Inc
    node: _Id | None
    ts_ms: _Ts
    term: _Inc = 0


class _WNack(msgspec.Struct, array_like=True, frozen=True, tag=4):
    seq: _Seq
    sender: _Id
    to: _Id
    ts_ms: _Ts


class _Packet(msgspec.Struct, array_like=True, frozen=True):
    key_id: Annotated[str, msgspec.Meta(max_length=16)]
    body: Annotated[bytes, msgspec.Meta(max_length=MAX_PACKET_BYTES)]
    mac: Annotated[bytes, msgspec.Meta(min_length=MAC_BYTES, max_length=MAC_BYTES)]


_KIND: dict[type, int] = {_WPing: 1, _WPingReq: 2, _WAck: 3, _WNack: 4}
_PACKET = msgspec.msgpack.Decoder(_Packet)
_BODY = msgspec.msgpack.Decoder(_WPing | _WPingReq | _WAck | _WNack)
_ENC = msgspec.msgpack.Encoder()

_P = 2**255 - 19


def ed25519_to_x25519_public(ed_public: bytes) -> bytes | None:
    """The X25519 (Montgomery ``u``) form of a 32-byte Ed25519 public key: ``u = (1 + y) / (1 − y) mod p``
    (RFC 7748 section 4.1). ``None`` for an encoding that is not a usable point."""
    if len(ed_public) != 32:
        return None
    y = int.from_bytes(ed_public, "little") & ((1 << 255) - 1)
    if y >= _P or (1 - y) % _P == 0:
        return None
    u = (1 + y) * pow((1 - y) % _P, _P - 2, _P) % _P
    return u.to_bytes(32, "little")


def _x25519_private(key: SigningKey) -> bytes:
    """The X25519 scalar of an Ed25519 key: the first half of SHA-512 of its seed (X25519 clamps it)."""
    return hashlib.sha512(key.seed).digest()[:32]


class ProbeKeys:
    """Pair keys for probe MACs (see module docstring). ``public_key_of(node_id)`` returns the peer's Ed25519
    public key from its held, verified snapshot (``None``: not a member we hold); ``keyring`` is read at each new
    key (``None``: open mode)."""

    def __init__(self, self_id: str, private_key: SigningKey, public_key_of: Callable[[str], bytes | None],
                 keyring: Callable[[], Keyring | None] = lambda: None, *, max_cached: int = 4096) -> None:
        self.self_id = self_id
        self._x = _x25519_private(private_key)
        self.public_key_of = public_key_of
        self.keyring = keyring
        self.max_cached = max_cached
        self._cache: OrderedDict[tuple[str, str, bytes], bytes] = OrderedDict()

    def send_key_id(self) -> str:
        """The key id this node sends under: the keyring's primary, or ``""`` in open mode."""
        ring = self.keyring()
        return (ring.primary or "") if ring is not None else ""

    def key(self, peer: str, key_id: str) -> bytes | None:
        """The pair key with ``peer`` under ``key_id``; ``None`` when the peer's public key is not held, the key id
        is not in our keyring (or is not ``""`` in open mode), or the peer's key is not a usable point."""
        ring = self.keyring()
        if ring is None:
            if key_id:
                return None
            token = b""
        else:
            t = ring.token_of(key_id)
            if t is None:
                return None
            token = t.encode("utf-8")
        pub = self.public_key_of(peer)
        if pub is None:
            return None
        cache_key = (peer, key_id, pub)
        hit = self._cache.get(cache_key)
        if hit is not None:
            self._cache.move_to_end(cache_key)
            return hit
        xpub = ed25519_to_x25519_public(pub)
        if xpub is None:
            return None
        shared = _x25519(self._x, xpub)
        if shared is None:  # a low-order point: all-zero shared secret
            return None
        a, b = sorted((self.self_id, peer))
        material = shared + a.encode() + b"\0" + b.encode() + b"\0" + token
        k = blake3.blake3(material, derive_key_context=_KDF_CONTEXT).digest()
        self._cache[cache_key] = k
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return k


def _mac(key: bytes, key_id: str, body: bytes) -> bytes:
    return blake3.blake3(_CONTEXT + key_id.encode() + b"\0" + body, key=key).digest(MAC_BYTES)


class ProbeCodec:
    """Seals outbound probe messages and opens inbound packets (see module docstring for the checks).

    ``window_ms``: accepted clock skew and replay memory; ``rate_per_s``/``burst``: packets per source address;
    ``max_seen``: accepted (sender, seq) pairs remembered (when full, the oldest is forgotten and packets no newer
    than it are refused as ``stale``, so a forgotten pair can never be replayed)."""

    def __init__(self, keys: ProbeKeys, *, window_ms: int = 30_000, rate_per_s: float = 50.0, burst: float = 100.0,
                 max_sources: int = 4096, max_seen: int = 65_536) -> None:
        self.keys = keys
        self.self_id = keys.self_id
        self.window_ms = window_ms
        self.buckets = TokenBuckets(rate_per_s=rate_per_s, burst=burst, max_keys=max_sources)
        self.max_seen = max_seen
        self._seen: OrderedDict[tuple[str, int, int], int] = OrderedDict()  # (sender, kind, seq) -> ts_ms
        self._floor_ms = 0
        self.rejected: Counter[str] = Counter()
        self.accepted = 0
        self._requests: OrderedDict[tuple[str, int], int] = OrderedDict()
        """Pings and ping-reqs opened and not yet answered: (sender, seq) -> packet bytes, the most a reply may
        take (bounded: the oldest go first)."""
        self.max_requests = 4096

    # -- outbound ----------------------------------------------------------------------------------------------
    def seal(self, msg: Ping | PingReq | Ack | Nack, wall_ms: int) -> bytes | None:
        """The packet for ``msg`` (sent at wall-clock ``wall_ms``); ``None`` when no pair key with the receiver
        exists (counted ``unknown_sender``). An :class:`Ack` or :class:`Nack` answers the request ``(msg.to,
        msg.seq)`` this codec opened: it is sealed only if it is no larger than that request's packet
        (``reply_too_large``) and the request was opened here (``unsolicited_reply``); each request is answered
        once."""
        body = _ENC.encode(self._wire(msg, wall_ms))
        limit = None
        if isinstance(msg, Ack | Nack):
            limit = self._requests.pop((msg.to, msg.seq), None)
            if limit is None:
                self.rejected["unsolicited_reply"] += 1
                return None
        kid = self.keys.send_key_id()
        key = self.keys.key(msg.to, kid)
        if key is None:
            self.rejected["unknown_sender"] += 1
            return None
        packet = _ENC.encode(_Packet(kid, body, _mac(key, kid, body)))
        if limit is not None and len(packet) > limit:
            self.rejected["reply_too_large"] += 1
            return None
        return packet

    @staticmethod
    def _wire(msg: Ping | PingReq | Ack | Nack, ts: int) -> _WPing | _WPingReq | _WAck | _WNack:
        pad = bytes(PAD_BYTES)
        if isinstance(msg, Ping):
            return _WPing(msg.seq, msg.sender, msg.to, msg.incarnation, msg.suspected, ts, pad, msg.term)
        if isinstance(msg, PingReq):
            return _WPingReq(msg.seq, msg.sender, msg.to, msg.target, msg.incarnation, ts, pad)
        if isinstance(msg, Ack):
            return _WAck(msg.seq, msg.sender, msg.to, msg.incarnation, msg.node, ts, msg.term)
        return _WNack(msg.seq, msg.sender, msg.to, ts)

    # -- inbound -----------------------------------------------------------------------------------------------
    def _refuse(self, reason: str) -> Ping | PingReq | Ack | Nack | None:
        """Count a refusal; returns ``None`` (what :meth:`open` answers)."""
        self.rejected[reason] += 1
        return None

    def open(self, data: bytes, source: str, now: float, wall_ms: int) -> Ping | PingReq | Ack | Nack | None:
        """The message in packet ``data`` from address ``source`` (host, or host:port), or ``None`` (refused and
        counted; never raises for bad input). ``now``: monotonic seconds (rate limit); ``wall_ms``: our wall clock
        in milliseconds (freshness)."""
        if not self.buckets.take(source, 1.0, now):
            return self._refuse("rate_limited")
        if len(data) > MAX_PACKET_BYTES:
            return self._refuse("oversized")
        try:
            packet = _PACKET.decode(data)
            w = _BODY.decode(packet.body)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):  # ValueError: not UTF-8
            return self._refuse("malformed")
        if w.to != self.self_id:
            return self._refuse("wrong_receiver")
        if self.keys.public_key_of(w.sender) is None:
            return self._refuse("unknown_sender")
        key = self.keys.key(w.sender, packet.key_id)
        if key is None:
            return self._refuse("unknown_key")
        if not hmac.compare_digest(_mac(key, packet.key_id, packet.body), packet.mac):
            return self._refuse("bad_mac")
        if abs(w.ts_ms - wall_ms) > self.window_ms or w.ts_ms <= self._floor_ms:
            return self._refuse("stale")
        seen_key = (w.sender, _KIND[type(w)], w.seq)  # an ack answers a ping with the ping's seq: kinds apart
        if seen_key in self._seen:
            return self._refuse("replay")
        self._remember(seen_key, w.ts_ms, wall_ms)
        self.accepted += 1
        if isinstance(w, _WPing | _WPingReq):
            self._requests[(w.sender, w.seq)] = len(data)
            while len(self._requests) > self.max_requests:
                self._requests.popitem(last=False)
        if isinstance(w, _WPing):
            return Ping(w.seq, w.sender, w.to, w.incarnation, w.suspected, w.term)
        if isinstance(w, _WPingReq):
            return PingReq(w.seq, w.sender, w.to, w.target, w.incarnation)
        if isinstance(w, _WAck):
            return Ack(w.seq, w.sender, w.to, w.incarnation, w.node, w.term)
        return Nack(w.seq, w.sender, w.to)

    def _remember(self, key: tuple[str, int, int], ts_ms: int, wall_ms: int) -> None:
        seen = self._seen
        seen[key] = ts_ms
        # Pairs older than the window are refused by time alone: forget them (oldest first, in arrival order).
        while seen:
            oldest_ts = next(iter(seen.values()))
            full = len(seen) > self.max_seen
            if not full and oldest_ts >= wall_ms - self.window_ms:
                break
            seen.popitem(last=False)
            if full:  # forgotten inside the window: nothing at or before its time is accepted any more
                self._floor_ms = max(self._floor_ms, oldest_ts)
