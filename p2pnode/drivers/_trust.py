"""Trust of one node: the keyring of token mode (reloaded when ``p2pnode keys`` changes it) and the check of
signed requests (``x-p2pnode-auth``, :mod:`p2pnode.reqauth`: signed for this node, refused at any other).

* Token mode: snapshots are endorsed with the keyring's primary token and accepted with any of its tokens;
  state-changing requests carry an HMAC (``v2``) with one of them.
* Open mode: no keyring; ordinary routes are open (a trusted LAN), but operator routes (the voter roll) need a
  signature (``k2``) by the key of this node or of a voter on the roll.
* Reads, where ``agent.read_token`` protects them (:meth:`Trust.authenticate_read`): the operator views take the
  read token (checked by the caller), a keyring HMAC (token mode), or a signature by this node or a voter on the
  roll (open mode); a member's own signature only on the peer routes it needs, as the caller says with
  ``member_may`` (its own plan part, running lists).
* ``accept_unbound`` (``agent.accept_unbound_requests``): also accept the unbound ``v1``/``k1`` of agents and CLIs
  that predate receiver binding, each one logged and counted (a rolling upgrade; off by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..keyring import KEYRING_FILE, Keyring, KeyringError
from ..node._persist import load_keyring
from ..reqauth import RequestAuthError, RequestVerifier

__all__ = ["Trust"]

log = logging.getLogger(__name__)


class Trust:
    """``mode`` is ``"token"`` or ``"open"``; ``node_id`` this node's (the receiver every request must name);
    ``key_of(node_id)`` a member's public key (32 bytes) or None; ``is_voter(node_id)`` whether it is on the voter
    roll; ``accept_unbound`` see module docstring. Raises :class:`KeyringError` (token mode without a
    usable keyring)."""

    def __init__(self, mode: str, data_dir: Path, *, bootstrap_token: str, node_id: str,
                 key_of: Callable[[str], bytes | None], is_voter: Callable[[str], bool],
                 accept_unbound: bool = False) -> None:
        self.mode = mode
        self.node_id = node_id
        self.keyring_path = data_dir / KEYRING_FILE
        self.keyring: Keyring | None = load_keyring(self.keyring_path, bootstrap_token) if mode == "token" else None
        self._mtime = Keyring.mtime_ns(self.keyring_path)
        self.is_voter = is_voter
        self.request_auth = RequestVerifier(self._request_token, node_id=node_id, key_of=key_of,
                                            accept_unbound=accept_unbound, not_before=time.time())
        self.read_refusals = 0

    @property
    def primary_token(self) -> str | None:
        """The token that endorses our snapshots (None in open mode)."""
        return self.keyring.primary_token if self.keyring else None

    def _request_token(self, key_id: str) -> str | None:
        return self.keyring.token_of(key_id) if self.keyring is not None else None

    def reload(self) -> bool:
        """Reload ``keyring.json`` when it changed. Returns True when the primary changed (publish at once:
        re-endorsement without restart). A malformed or emptied file is logged and the keyring in memory kept."""
        if self.keyring is None:
            return False
        mtime = Keyring.mtime_ns(self.keyring_path)
        if mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            ring = Keyring.load(self.keyring_path)
        except KeyringError as exc:
            log.error("keeping the keyring in memory: %s", exc)
            return False
        if ring is None or not ring.tokens:
            log.error("keyring file %s is gone or empty: keeping the keyring in memory", self.keyring_path)
            return False
        old = (self.keyring.primary, set(self.keyring.tokens))
        if (ring.primary, set(ring.tokens)) == old:
            return False
        self.keyring.tokens, self.keyring.primary = ring.tokens, ring.primary
        log.warning("keyring reloaded: %d accepted token(s) %s, primary %s", len(ring.tokens), sorted(ring.tokens),
                    ring.primary)
        return ring.primary != old[0]

    def authenticate(self, header: str | None, method: str, target: str, body: bytes, *,
                     operator: bool = False) -> str | None:
        """Check a request's ``x-p2pnode-auth`` header. Returns ``None`` when accepted, else the refusal reason
        (counted in :attr:`request_auth`)."""
        if self.keyring is None and not operator:
            return None
        if self.keyring is not None:
            schemes: tuple[str, ...] = ("v2",)
            signers = None
        else:
            schemes, signers = ("k2",), (lambda n: n == self.node_id or self.is_voter(n))
        try:
            self.request_auth.verify(header, method, target, body, time.time(), schemes=schemes, signers=signers)
        except RequestAuthError as exc:
            log.info("refused a %s %s: %s", method, target, exc)
            return exc.reason
        return None

    def authenticate_read(self, header: str | None, method: str, target: str, *,
                          member_may: Callable[[str], bool] = lambda node_id: False) -> str | None:
        """A signed read (``GET``/``HEAD``) where ``agent.read_token`` protects reads: in token mode an HMAC with a
        keyring token (``v2``); in open mode a signature (``k2``) by this node's key or a voter's on the roll, or
        by a member's key for which ``member_may(node_id)`` is true (the peer routes: the caller knows which member
        may read what). Never any member's for an operator view. Returns ``None`` when accepted, else the refusal
        reason (counted in :attr:`request_auth`)."""
        if self.keyring is not None:
            return self.authenticate(header, method, target, b"")
        try:
            self.request_auth.verify(header, method, target, b"", time.time(), schemes=("k2",),
                                     signers=lambda n: n == self.node_id or self.is_voter(n) or member_may(n))
        except RequestAuthError as exc:
            log.info("refused a %s %s: %s", method, target, exc)
            return exc.reason
        return None

    def view(self) -> dict[str, Any]:
        """The trust part of ``/status``."""
        return {
            "keyring": {"primary": self.keyring.primary, "key_ids": sorted(self.keyring.tokens)}
            if self.keyring else None,
            "request_auth": {"accepted": self.request_auth.accepted, "unbound_accepted": self.request_auth.unbound,
                             "accept_unbound": self.request_auth.accept_unbound,
                             "refused": dict(self.request_auth.refused), "reads_refused": self.read_refusals},
        }
