"""Request authentication without a secret on the wire: an HMAC over the request, bounded against replay. Pure.

A state-changing request (``POST /signals``, ``/sync/trigger``, ``/voters``; every view when reads are
protected) carries one header::

    x-p2pnode-auth: v1 <key id> <unix seconds> <nonce, 32 hex> <mac, 64 hex>

``mac = HMAC-SHA256(request_key, "p2pnode-request-v1\\n" METHOD "\\n" PATH?QUERY "\\n" seconds "\\n" nonce "\\n"
|| SHA-256(body))`` with ``request_key = HMAC-SHA256(token, "p2pnode-request-key-v1")`` for the keyring token
named by the key id. The receiver accepts it when the key id is in its keyring, the time is within ``window_s``
of its own clock, the nonce was not seen within the window, and the MAC matches (constant-time compare). A
changed method, path, query or body, an old or future time, a replayed nonce: each is refused with its counted
reason (:data:`REASONS`). The token never travels; what does travel (key id, MAC) lets an eavesdropper test a
guess of the token offline, exactly as the endorsements in every snapshot already do: brute force only.

A second scheme signs with a **node key** instead of a token (open mode has no token): ``k1 <node id> <seconds>
<nonce> <Ed25519 signature, 128 hex>`` over the same message (with ``"p2pnode-request-k1\n"`` in front), by the
key in that node's data dir (readable only by the agent's user: the file's permission is the access rule). The
receiver verifies it with the public key from that node's signed snapshot; the operator routes of open mode
(``POST /voters``) accept it only from a voter on the roll.

Why an HMAC rather than TLS or node-key signatures for token mode: the CLI may run on an operator's laptop with
nothing but the token (a node key exists only on nodes), TLS needs certificates distributed and rotated (a CA is
future work), and an HMAC keeps plain ``curl`` reads working where reads are open.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections import OrderedDict
from collections.abc import Callable

from .errors import PeerError
from .identity import Identity, verify_signature

__all__ = ["AUTH_HEADER", "REASONS", "RequestAuthError", "RequestVerifier", "sign_request", "sign_request_with_key"]

AUTH_HEADER = "x-p2pnode-auth"
REASONS = ("missing", "malformed", "unknown_key", "expired", "replayed", "bad_mac")
"""Counted reasons for refusing a request's authentication."""
_REQUEST_KEY_CONTEXT = b"p2pnode-request-key-v1"
_MAC_CONTEXT = b"p2pnode-request-v1\n"
_SIG_CONTEXT = b"p2pnode-request-k1\n"


class RequestAuthError(PeerError):
    """A request's authentication was refused: ``reason`` is one of :data:`REASONS` (a counter label),
    ``detail`` says what the client should do about it."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def _request_key(token: str) -> bytes:
    return hmac.new(token.encode("utf-8"), _REQUEST_KEY_CONTEXT, hashlib.sha256).digest()


def _message(method: str, target: str, ts: int, nonce: str, body: bytes) -> bytes:
    return f"{method.upper()}\n{target}\n{ts}\n{nonce}\n".encode() + hashlib.sha256(body).digest()


def _mac(token: str, method: str, target: str, ts: int, nonce: str, body: bytes) -> str:
    msg = _MAC_CONTEXT + _message(method, target, ts, nonce, body)
    return hmac.new(_request_key(token), msg, hashlib.sha256).hexdigest()


def sign_request_with_key(identity: Identity, method: str, target: str, body: bytes, now: float,
                          nonce: str | None = None) -> str:
    """The ``x-p2pnode-auth`` header value signed with a node's key (``identity``: a
    :class:`p2pnode.identity.Identity`), scheme ``k1``."""
    nonce = nonce or os.urandom(16).hex()
    ts = int(now)
    sig = identity.sign(_SIG_CONTEXT + _message(method, target, ts, nonce, body))
    return f"k1 {identity.node_id} {ts} {nonce} {sig.hex()}"


def sign_request(token: str, key_id: str, method: str, target: str, body: bytes, now: float,
                 nonce: str | None = None) -> str:
    """The ``x-p2pnode-auth`` header value for a request ``method target`` (path with its query string) with
    ``body`` at wall-clock ``now`` (Unix seconds)."""
    nonce = nonce or os.urandom(16).hex()
    ts = int(now)
    return f"v1 {key_id} {ts} {nonce} {_mac(token, method, target, ts, nonce, body)}"


class RequestVerifier:
    """Checks ``x-p2pnode-auth`` headers (see module docstring). ``tokens_by_id(key_id)`` returns the keyring's
    token for a key id (or ``None``); ``window_s`` bounds clock skew and replay (default 60 s); at most
    ``max_nonces`` nonces are remembered (the oldest forgotten first; a request whose nonce was forgotten is
    older than every remembered one, hence near or past the window). ``refused[reason]`` counts refusals."""

    def __init__(self, tokens_by_id: Callable[[str], str | None], *, window_s: float = 60.0,
                 max_nonces: int = 65536, key_of: Callable[[str], bytes | None] | None = None) -> None:
        self.tokens_by_id = tokens_by_id
        self.key_of = key_of or (lambda node_id: None)
        self.window_s = window_s
        self.max_nonces = max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()
        self.refused: dict[str, int] = {r: 0 for r in REASONS}
        self.accepted = 0

    def verify(self, header: str | None, method: str, target: str, body: bytes, now: float, *,
               schemes: tuple[str, ...] = ("v1",), signers: Callable[[str], bool] | None = None) -> str:
        """Check one request at wall-clock ``now`` with one of ``schemes`` (``v1``: a keyring token's HMAC;
        ``k1``: a node key's signature, from a node for which ``signers(node_id)`` is true); return the key id
        or node id it used. Raises :class:`RequestAuthError`."""
        try:
            kid = self._verify(header, method, target, body, now, schemes, signers)
        except RequestAuthError as exc:
            self.refused[exc.reason] += 1
            raise
        self.accepted += 1
        return kid

    def _verify(self, header: str | None, method: str, target: str, body: bytes, now: float,
                schemes: tuple[str, ...], signers: Callable[[str], bool] | None) -> str:
        if not header:
            raise RequestAuthError("missing", f"send the {AUTH_HEADER} header (the p2pnode CLI does, with the "
                                   "cluster token from P2PNODE_CLUSTER_TOKEN or the node's keyring or key)")
        parts = header.split(" ")
        mac_len = {"v1": 64, "k1": 128}.get(parts[0], -1) if parts else -1
        if (len(parts) != 5 or parts[0] not in schemes or not 0 < len(parts[1]) <= 64 or not parts[2].isdigit()
                or len(parts[2]) > 12 or len(parts[3]) != 32 or len(parts[4]) != mac_len):
            raise RequestAuthError("malformed", f"{AUTH_HEADER}: {' or '.join(schemes)} <key id or node id> "
                                   "<seconds> <nonce> <mac or signature>")
        scheme, kid, ts_s, nonce, mac = parts
        ts = int(ts_s)
        if scheme == "v1":
            token = self.tokens_by_id(kid)
            if token is None:
                raise RequestAuthError("unknown_key", f"key id {kid} is not in this node's keyring")
            key = b""  # not used by v1
        else:
            token = ""  # not used by k1
            signer_key = self.key_of(kid) if signers is not None and signers(kid) else None
            if signer_key is None:
                raise RequestAuthError("unknown_key", f"node {kid} may not sign this request")
            key = signer_key
        if abs(now - ts) > self.window_s:
            raise RequestAuthError("expired", f"request time {ts} is more than {self.window_s:g} s from ours")
        if scheme == "v1":
            if not hmac.compare_digest(_mac(token, method, target, ts, nonce, body), mac):
                raise RequestAuthError("bad_mac", "the MAC does not match the method, path, time and body")
        else:
            try:
                sig = bytes.fromhex(mac)
            except ValueError:
                raise RequestAuthError("malformed", "the signature is not hex") from None
            if not verify_signature(key, sig, _SIG_CONTEXT + _message(method, target, ts, nonce, body)):
                raise RequestAuthError("bad_mac", "the signature does not match the method, path, time and body")
        self._forget(now)
        if nonce in self._seen:
            raise RequestAuthError("replayed", f"nonce {nonce} was used already")
        self._seen[nonce] = float(ts)
        while len(self._seen) > self.max_nonces:
            self._seen.popitem(last=False)
        return kid

    def _forget(self, now: float) -> None:
        while self._seen:
            nonce, ts = next(iter(self._seen.items()))
            if now - ts <= self.window_s:
                break
            self._seen.popitem(last=False)
