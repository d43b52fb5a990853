"""Request authentication without a secret on the wire: an HMAC or a node-key signature over the request and the
node that receives it, bounded against replay. Pure.

A signed request (token mode: every state-changing route, and every view when ``agent.read_token`` is set; open
mode: the voter roll, and signed reads) carries one header::

    x-p2pnode-auth: v2 <key id> <receiver node id> <unix seconds> <nonce, 32 hex> <mac, 64 hex>
    x-p2pnode-auth: k2 <signer node id> <receiver node id> <unix seconds> <nonce, 32 hex> <signature, 128 hex>

``v2``: ``mac = HMAC-SHA256(request_key, "p2pnode-request-v2\\n" || message)`` with ``request_key =
HMAC-SHA256(token, "p2pnode-request-key-v1")`` for the keyring token named by the key id. ``k2``: an Ed25519
signature of ``"p2pnode-request-k2\\n" || message`` by the key in the signer's data dir (readable only by the
agent's user: the file's permission is the access rule), verified with the public key from the signer's signed
snapshot. In both::

    message = METHOD "\\n" receiver "\\n" PATH[?QUERY] "\\n" seconds "\\n" nonce "\\n" || SHA-256(body)

The receiver accepts a request when its header decodes (:func:`decode_header`), the key id is in its keyring (or
the signer may sign that request), the time is within ``window_s`` of its own clock, the MAC or signature matches
(constant-time compare), the **receiver named is this node** and the nonce was not seen within the window.
Each refusal has its counted reason (:data:`REASONS`): a changed method, path, query or body is ``bad_mac``; a
request captured on its way to one node and replayed to another is ``wrong_receiver`` (checked after the MAC, so
the counter proves a genuinely signed request reached the wrong node); the same request sent twice to its
receiver is ``replayed``; an old or future time ``expired``. The signer learns the receiver's node id from its
``GET /healthz`` (always open) or, between members, from the receiver's signed snapshot.

**Unbound schemes.** ``v1``/``k1`` (``<scheme> <id> <seconds> <nonce> <mac>``, contexts ``"p2pnode-request-v1\\n"``
and ``"p2pnode-request-k1\\n"``, the message without the receiver line) are what agents before receiver binding
sent: one captured request works on every node that shares the token. They are refused (``unbound``) unless the
verifier is built with ``accept_unbound`` (``agent.accept_unbound_requests``, for a rolling upgrade); each one
accepted then is logged and counted (:attr:`RequestVerifier.unbound`).

**Decoding.** The header is decoded here and nowhere else, strictly: ASCII only, single spaces, the scheme, ids
of 1-64 lower-case letters and digits, the time as 1-12 ASCII digits, the nonce as 32 lower-case hex digits, the
MAC (64) or signature (128) as lower-case hex of exactly that length, at most :data:`MAX_HEADER_CHARS` in all.
Anything else (a superscript digit, a control character, a 400-digit time) is ``malformed``: a 401, never a 5xx.

Why an HMAC rather than TLS or node-key signatures for token mode: the CLI may run on an operator's laptop with
nothing but the token (a node key exists only on nodes), TLS needs certificates distributed and rotated (a CA is
future work), and an HMAC keeps plain ``curl`` reads working where reads are open. The token never travels;
what does travel (key id, MAC) lets an eavesdropper test a guess of the token offline, exactly as the
endorsements in every snapshot already do: brute force only.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from .errors import PeerError
from .identity import Identity, verify_signature

__all__ = [
    "AUTH_HEADER",
    "BOUND_SCHEMES",
    "MAX_HEADER_CHARS",
    "REASONS",
    "AuthHeader",
    "RequestAuthError",
    "RequestVerifier",
    "decode_header",
    "receiver_id",
    "sign_request",
    "sign_request_with_key",
]

log = logging.getLogger(__name__)

AUTH_HEADER = "x-p2pnode-auth"
REASONS = ("missing", "malformed", "unbound", "unknown_key", "expired", "bad_mac", "wrong_receiver", "replayed")
"""Counted reasons for refusing a request's authentication, in the order they are checked."""
BOUND_SCHEMES = ("v2", "k2")
"""Schemes whose message names the receiving node: the only ones accepted by default."""
_UNBOUND_OF = {"v2": "v1", "k2": "k1"}
MAX_HEADER_CHARS = 320
"""Longest header value decoded (a ``k2`` header is at most 2 + 64 + 64 + 12 + 32 + 128 + 5 = 307 characters)."""

_REQUEST_KEY_CONTEXT = b"p2pnode-request-key-v1"
_CONTEXTS = {"v1": b"p2pnode-request-v1\n", "k1": b"p2pnode-request-k1\n",
             "v2": b"p2pnode-request-v2\n", "k2": b"p2pnode-request-k2\n"}
_MAC_HEX = {"v1": 64, "v2": 64, "k1": 128, "k2": 128}
_ID = r"([a-z0-9]{1,64})"
_ID_RE = re.compile(_ID)
_HEADER = re.compile(rf"(v2|k2) {_ID} {_ID} ([0-9]{{1,12}}) ([0-9a-f]{{32}}) ([0-9a-f]{{64}}|[0-9a-f]{{128}})"
                     rf"|(v1|k1) {_ID} ([0-9]{{1,12}}) ([0-9a-f]{{32}}) ([0-9a-f]{{64}}|[0-9a-f]{{128}})")
_SHAPE = (f"{AUTH_HEADER}: v2|k2 <key id or node id> <receiver node id> <seconds, 1-12 digits> <nonce, 32 hex> "
          "<mac, 64 hex, or signature, 128 hex>")


class RequestAuthError(PeerError):
    """A request's authentication was refused: ``reason`` is one of :data:`REASONS` (a counter label),
    ``detail`` says what the client should do about it."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class AuthHeader(msgspec.Struct, frozen=True):
    """One decoded ``x-p2pnode-auth`` value: ``scheme`` (``v1``, ``v2``, ``k1``, ``k2``); ``key_id`` (a keyring
    key id for ``v*``, the signer's node id for ``k*``; 1-64 of ``[a-z0-9]``); ``receiver`` (the node id it is
    signed for; None for the unbound ``v1``/``k1``); ``ts`` (Unix seconds, 0 to 10**12 - 1); ``nonce`` (32
    lower-case hex); ``mac`` (the MAC, 32 bytes, or signature, 64 bytes)."""

    scheme: str
    key_id: str
    receiver: str | None
    ts: int
    nonce: str
    mac: bytes

    @property
    def bound(self) -> bool:
        """Whether the signed message names the receiver (``v2``, ``k2``)."""
        return self.receiver is not None


def decode_header(value: str) -> AuthHeader:
    """Decode a header value (see module docstring for the shape). Raises :class:`RequestAuthError`
    (``malformed``) for anything but the exact shape: non-ASCII, control characters, wrong field counts or lengths,
    upper-case hex, a time of more than 12 digits, a MAC of the other scheme's length."""
    if len(value) > MAX_HEADER_CHARS or not value.isascii():
        raise RequestAuthError("malformed", _SHAPE)
    m = _HEADER.fullmatch(value)
    if m is None:
        raise RequestAuthError("malformed", _SHAPE)
    if m.group(1) is not None:
        scheme, kid, receiver, ts_s, nonce, mac = m.group(1, 2, 3, 4, 5, 6)
    else:
        scheme, kid, ts_s, nonce, mac = m.group(7, 8, 9, 10, 11)
        receiver = None
    if len(mac) != _MAC_HEX[scheme]:
        raise RequestAuthError("malformed", _SHAPE)
    # ts_s is 1-12 ASCII digits (the regex above): int() cannot fail nor grow.
    return AuthHeader(scheme, kid, receiver, int(ts_s), nonce, bytes.fromhex(mac))


def receiver_id(value: object) -> str | None:
    """``value`` when it is a node id a header may name (a ``str`` of 1-64 of ``[a-z0-9]``: what a signer read
    from a receiver's ``/healthz``), else None."""
    return value if isinstance(value, str) and _ID_RE.fullmatch(value) is not None else None


def _request_key(token: str) -> bytes:
    return hmac.new(token.encode("utf-8"), _REQUEST_KEY_CONTEXT, hashlib.sha256).digest()


def _message(scheme: str, receiver: str | None, method: str, target: str, ts: int, nonce: str, body: bytes) -> bytes:
    to = "" if receiver is None else f"{receiver}\n"
    return (_CONTEXTS[scheme] + f"{method.upper()}\n{to}{target}\n{ts}\n{nonce}\n".encode()
            + hashlib.sha256(body).digest())


def sign_request_with_key(identity: Identity, method: str, target: str, body: bytes, now: float, *,
                          receiver: str | None, nonce: str | None = None) -> str:
    """The ``x-p2pnode-auth`` header value signed with a node's key (``identity``: a
    :class:`p2pnode.identity.Identity`) for the node ``receiver`` (its node id): scheme ``k2``. ``receiver=None``
    signs the unbound ``k1`` (only for an agent that predates receiver binding: every node accepts it)."""
    nonce = nonce or os.urandom(16).hex()
    ts = int(now)
    scheme = "k1" if receiver is None else "k2"
    sig = identity.sign(_message(scheme, receiver, method, target, ts, nonce, body))
    to = "" if receiver is None else f" {receiver}"
    return f"{scheme} {identity.node_id}{to} {ts} {nonce} {sig.hex()}"


def sign_request(token: str, key_id: str, method: str, target: str, body: bytes, now: float, *,
                 receiver: str | None, nonce: str | None = None) -> str:
    """The ``x-p2pnode-auth`` header value for a request ``method target`` (path with its query string) with
    ``body`` at wall-clock ``now`` (Unix seconds) to the node ``receiver`` (its node id, from its ``/healthz``):
    scheme ``v2``. ``receiver=None`` signs the unbound ``v1`` (only for an agent that predates receiver
    binding)."""
    nonce = nonce or os.urandom(16).hex()
    ts = int(now)
    scheme = "v1" if receiver is None else "v2"
    mac = hmac.new(_request_key(token), _message(scheme, receiver, method, target, ts, nonce, body),
                   hashlib.sha256).hexdigest()
    to = "" if receiver is None else f" {receiver}"
    return f"{scheme} {key_id}{to} {ts} {nonce} {mac}"


class RequestVerifier:
    """Checks ``x-p2pnode-auth`` headers for the node ``node_id`` (see module docstring). ``tokens_by_id(key_id)``
    returns the keyring's token for a key id (or ``None``); ``key_of(node_id)`` a member's public key (32 bytes) or
    ``None``; ``window_s`` bounds clock skew and replay (default 60 s); at most ``max_nonces`` nonces are remembered
    (the oldest forgotten first; a request whose nonce was forgotten is older than every remembered one, hence near
    or past the window); ``accept_unbound`` accepts ``v1``/``k1`` (rolling upgrades). ``not_before`` (Unix seconds,
    the agent's start): a request signed in an earlier second is refused as ``replayed``, since the nonces a previous
    run of this node saw are not kept (a request captured before a restart is worth nothing after it; a client whose
    clock lags ours is refused for that long after a restart). ``refused[reason]`` counts refusals, ``accepted``
    acceptances, ``unbound`` the acceptances of an unbound scheme."""

    def __init__(self, tokens_by_id: Callable[[str], str | None], *, node_id: str, window_s: float = 60.0,
                 max_nonces: int = 65536, key_of: Callable[[str], bytes | None] | None = None,
                 accept_unbound: bool = False, not_before: float = 0.0) -> None:
        self.tokens_by_id = tokens_by_id
        self.not_before = not_before
        self.node_id = node_id
        self.key_of = key_of or (lambda node_id: None)
        self.window_s = window_s
        self.max_nonces = max_nonces
        self.accept_unbound = accept_unbound
        self._seen: OrderedDict[str, float] = OrderedDict()
        self.refused: dict[str, int] = {r: 0 for r in REASONS}
        self.accepted = 0
        self.unbound = 0

    def verify(self, header: str | None, method: str, target: str, body: bytes, now: float, *,
               schemes: tuple[str, ...] = ("v2",), signers: Callable[[str], bool] | None = None) -> str:
        """Check one request at wall-clock ``now`` with one of ``schemes`` (``v2``: a keyring token's HMAC;
        ``k2``: a node key's signature, from a node for which ``signers(node_id)`` is true; with ``accept_unbound``
        also ``v1`` where ``v2`` is allowed and ``k1`` where ``k2`` is); return the key id or node id it used.
        Raises :class:`RequestAuthError` (counted in :attr:`refused`)."""
        try:
            h = self._verify(header, method, target, body, now, schemes, signers)
        except RequestAuthError as exc:
            self.refused[exc.reason] += 1
            raise
        self.accepted += 1
        if not h.bound:
            self.unbound += 1
            log.warning("accepted an unbound %s request (%s %s, signer %s): agent.accept_unbound_requests is on; "
                        "upgrade the client and turn it off", h.scheme, method, target, h.key_id)
        return h.key_id

    def _verify(self, header: str | None, method: str, target: str, body: bytes, now: float,
                schemes: tuple[str, ...], signers: Callable[[str], bool] | None) -> AuthHeader:
        if not header:
            raise RequestAuthError("missing", f"send the {AUTH_HEADER} header (the p2pnode CLI does, with the "
                                   "cluster token from P2PNODE_CLUSTER_TOKEN or the node's keyring or key)")
        h = decode_header(header)
        bound_scheme = h.scheme if h.bound else next(b for b, u in _UNBOUND_OF.items() if u == h.scheme)
        if bound_scheme not in schemes:
            raise RequestAuthError("malformed", f"this request needs {AUTH_HEADER} scheme {' or '.join(schemes)}")
        if not h.bound and not self.accept_unbound:
            raise RequestAuthError("unbound", f"scheme {h.scheme} does not name the receiving node: sign with "
                                   f"{bound_scheme} (upgrade the p2pnode CLI or agent)")
        token, key = "", b""
        if h.scheme[0] == "v":
            found = self.tokens_by_id(h.key_id)
            if found is None:
                raise RequestAuthError("unknown_key", f"key id {h.key_id} is not in this node's keyring")
            token = found
        else:
            signer_key = self.key_of(h.key_id) if signers is not None and signers(h.key_id) else None
            if signer_key is None:
                raise RequestAuthError("unknown_key", f"node {h.key_id} may not sign this request")
            key = signer_key
        if abs(now - h.ts) > self.window_s:
            raise RequestAuthError("expired", f"request time {h.ts} is more than {self.window_s:g} s from ours")
        msg = _message(h.scheme, h.receiver, method, target, h.ts, h.nonce, body)
        if h.scheme[0] == "v":
            if not hmac.compare_digest(hmac.new(_request_key(token), msg, hashlib.sha256).digest(), h.mac):
                raise RequestAuthError("bad_mac", "the MAC does not match the method, path, time and body")
        elif not verify_signature(key, h.mac, msg):
            raise RequestAuthError("bad_mac", "the signature does not match the method, path, time and body")
        if h.receiver is not None and h.receiver != self.node_id:
            raise RequestAuthError("wrong_receiver", f"signed for node {h.receiver}, this is node {self.node_id} "
                                   "(a request captured on its way to another node, or a client that asked the "
                                   "wrong /healthz)")
        self._forget(now)
        if h.nonce in self._seen:
            raise RequestAuthError("replayed", f"nonce {h.nonce} was used already")
        if h.ts < int(self.not_before):
            raise RequestAuthError("replayed", f"request time {h.ts} is before this agent started "
                                   f"({int(self.not_before)}): its nonce may have been used with the previous run")
        self._seen[h.nonce] = float(h.ts)
        while len(self._seen) > self.max_nonces:
            self._seen.popitem(last=False)
        return h

    def _forget(self, now: float) -> None:
        while self._seen:
            nonce, ts = next(iter(self._seen.items()))
            if now - ts <= self.window_s:
                break
            self._seen.popitem(last=False)
