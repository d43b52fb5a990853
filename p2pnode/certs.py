"""Roles the operator grants: signed, expiring role certificates and the roles they make effective. Pure.

A snapshot proves **who** speaks; the tags in it (``voter``, ``durable``) are only claims. Where a node pins at
least one operator key (``[agent] operator_keys``, ``ed25519:<base64>`` as ``p2pnode catalog keygen`` prints),
a member's roles count only when a :class:`RoleCert` signed by one of those keys grants them:

* ``voter``: the member's ``voter`` tag counts (voter roll admission, the election's voter set);
* ``durable``: its ``durable`` tag counts (sync sends it replicas and counts its receipts);
* ``lead``: it is eligible to lead; a member without it is treated as ``ephemeral`` is
  (:func:`p2pnode.election.is_eligible`: not voted for while an eligible member is alive);
* ``node_class`` / ``provider_id``: what a scaled node is (:func:`certified_class`).

A role counts when the member **claims** it (its tag; ``lead`` needs no tag) **and** the certificate grants it:
claims are checked, never created. A certificate is refused, and the claimed roles dropped, for one reason of
:data:`REASONS`, counted by :class:`RoleGate`. With no key pinned (open mode's default) tags count as they are
(:attr:`RoleGate.pinned` False): any member that signs a snapshot can claim any role.

The signed bytes (:func:`signing_bytes`): the domain string :data:`DOMAIN` then the msgpack encoding of
``(node, sorted roles, node_class, provider_id, issued_at, expires_at, issuer)``, so a signature is valid for
exactly one node, role set and validity window, and never for a catalog (another domain).

The effective view of a member is its snapshot with its tags rewritten (:meth:`RoleGate.apply`): role tags not
certified are removed, and :data:`UNCERTIFIED_LEAD_TAG` is added while ``lead`` is not certified. Every consumer
that reads ``"voter" in tags`` or ``"durable" in tags`` of a member held in :class:`p2pnode.gossip.ClusterState`
therefore reads the effective, certified role.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import Counter
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ._ed25519 import SigningKey, verify_signature

__all__ = [
    "CERT_FILE", "CERT_SKEW_S", "DOMAIN", "MAX_CERT_BYTES", "MAX_LIFETIME_S", "REASONS", "ROLES", "RoleCert",
    "RoleCheck", "RoleGate", "UNCERTIFIED_LEAD_TAG", "certified_class", "check_cert", "decode_cert",
    "decode_operator_key", "effective_tags", "encode_cert", "operator_key_text", "sign_cert", "signing_bytes",
]

DOMAIN = b"p2pnode role certificate v1\x00"
ROLES: tuple[str, ...] = ("voter", "durable", "lead")
"""The closed set of roles a certificate may grant."""
ROLE_TAGS = frozenset({"voter", "durable", "lead"})
UNCERTIFIED_LEAD_TAG = "lead=uncertified"
"""The tag the effective view adds to a member not certified ``lead`` (keys pinned): not eligible to lead while
an eligible member is alive (:func:`p2pnode.election.is_eligible`)."""
MAX_LIFETIME_S = 400 * 86400
"""A certificate valid for longer than this (``expires_at - issued_at``, seconds) is refused (``too_long``): a
role granted for ever could never be taken back."""
CERT_SKEW_S = 300.0
"""A certificate issued up to this many seconds after this node's wall clock still counts (clocks differ);
later: ``not_yet_valid`` until the clock gets there."""
MAX_CERT_BYTES = 4096
"""Bytes of an encoded certificate file at most (one is about 400)."""
CERT_FILE = "role.cert"
"""The node's own certificate in its data dir (JSON, :func:`encode_cert`)."""
REASONS: tuple[str, ...] = ("no_cert", "unknown_issuer", "bad_signature", "wrong_node", "expired", "not_yet_valid",
                            "too_long", "not_granted", "superseded")
"""Why a claimed role does not count: no certificate; an issuer this node does not pin; a signature that does not
verify; a certificate of another node; past ``expires_at``; before ``issued_at`` (beyond :data:`CERT_SKEW_S`); a
lifetime over :data:`MAX_LIFETIME_S`; a valid certificate that does not grant this role; a valid certificate
issued before the newest valid one this node has seen for that node (:class:`RoleGate`: a renewed certificate
with fewer roles takes the others back, the older one cannot be shown again)."""

_KEY = r"^ed25519:[A-Za-z0-9+/]{43}=$"
_KEY_RE = re.compile(_KEY.replace("$", r"\Z"))
_TEXT = r"^[^\x00-\x1f\x7f]*\Z"
_CLASS = r"^(?:[A-Za-z0-9][A-Za-z0-9_.+-]{0,63})?\Z"
Role = Literal["voter", "durable", "lead"]
CertSeconds = Annotated[int, Meta(ge=0, le=10**11)]


class RoleCert(msgspec.Struct, frozen=True, omit_defaults=True):
    """A role certificate: ``roles`` (a subset of :data:`ROLES`) granted to ``node`` (its node id) from
    ``issued_at`` to ``expires_at`` (Unix seconds, integers), by ``issuer`` (``ed25519:<base64>``); for a node
    a provider started, its ``node_class`` (``"1xH100"``) and ``provider_id`` ("": none). ``sig``: Ed25519 over
    :func:`signing_bytes` (64 bytes; base64 in JSON). Unknown fields are ignored (a later version's snapshot
    still decodes here; the signature covers only these fields)."""

    node: Annotated[str, Meta(min_length=1, max_length=64, pattern=_TEXT)]
    roles: Annotated[list[Role], Meta(max_length=3)]
    issued_at: CertSeconds
    expires_at: CertSeconds
    issuer: Annotated[str, Meta(pattern=_KEY)]
    sig: Annotated[bytes, Meta(min_length=64, max_length=64)]
    node_class: Annotated[str, Meta(max_length=64, pattern=_CLASS)] = ""
    provider_id: Annotated[str, Meta(max_length=128, pattern=_TEXT)] = ""


_ENCODER = msgspec.msgpack.Encoder()
_JSON_DECODER = msgspec.json.Decoder(RoleCert)


def signing_bytes(node: str, roles: list[str] | tuple[str, ...], node_class: str, provider_id: str, issued_at: int,
                  expires_at: int, issuer: str) -> bytes:
    """The bytes an operator key signs for a certificate (see the module docstring)."""
    fields = (node, sorted(set(roles)), node_class, provider_id, issued_at, expires_at, issuer)
    return DOMAIN + _ENCODER.encode(fields)


def _cert_bytes(c: RoleCert) -> bytes:
    return signing_bytes(c.node, list(c.roles), c.node_class, c.provider_id, c.issued_at, c.expires_at, c.issuer)


def operator_key_text(key: SigningKey | bytes) -> str:
    """``ed25519:<base64>`` of a key's public half (a private key, or the 32 raw bytes of a public one): what
    ``operator_keys`` lists."""
    return "ed25519:" + base64.b64encode(key.public_key if isinstance(key, SigningKey) else key).decode()


def decode_operator_key(text: str) -> bytes:
    """The public key (32 raw bytes) of an ``operator_keys`` entry. Raises ``ValueError`` naming what is wrong."""
    if not isinstance(text, str) or not _KEY_RE.match(text):
        raise ValueError(f"operator key {str(text)[:60]!r}: expected ed25519:<base64 of 32 bytes>")
    try:
        return base64.b64decode(text[8:], validate=True)  # 32 bytes: the pattern allows no other length
    except binascii.Error:
        raise ValueError(f"operator key {text[:60]!r}: expected ed25519:<base64 of 32 bytes>") from None


def sign_cert(key: SigningKey, node: str, roles: list[str] | tuple[str, ...], *, issued_at: int,
              expires_at: int, node_class: str = "", provider_id: str = "") -> RoleCert:
    """A certificate granting ``roles`` (each in :data:`ROLES`) to ``node``, signed with the operator's ``key``.
    Raises ``ValueError`` for an unknown role, an empty or reversed window, or a lifetime over
    :data:`MAX_LIFETIME_S`; the result passes :func:`decode_cert` (its bounds are checked here)."""
    bad = [r for r in roles if r not in ROLES]
    if bad:
        raise ValueError(f"unknown role {bad[0]!r}: one of {', '.join(ROLES)}")
    if not 0 <= issued_at < expires_at or expires_at - issued_at > MAX_LIFETIME_S:
        raise ValueError(f"validity {issued_at}..{expires_at}: must be a non-empty window of at most "
                         f"{MAX_LIFETIME_S // 86400} days")
    issuer = operator_key_text(key)
    ordered = sorted(set(roles), key=ROLES.index)
    sig = key.sign(signing_bytes(node, ordered, node_class, provider_id, issued_at, expires_at, issuer))
    cert = RoleCert(node=node, roles=ordered, issued_at=issued_at, expires_at=expires_at,  # type: ignore[arg-type]
                    issuer=issuer, sig=sig, node_class=node_class, provider_id=provider_id)
    return decode_cert(encode_cert(cert))


def encode_cert(cert: RoleCert) -> bytes:
    """The JSON form of a certificate (the ``role.cert`` file, ``p2pnode node certify``'s output)."""
    return msgspec.json.encode(cert)


def decode_cert(raw: bytes) -> RoleCert:
    """A certificate from its JSON form, bounded (:data:`MAX_CERT_BYTES`, every field typed). Raises
    ``ValueError`` naming what is wrong (never a msgspec error)."""
    if len(raw) > MAX_CERT_BYTES:
        raise ValueError(f"{len(raw)} bytes, more than {MAX_CERT_BYTES}")
    try:
        return _JSON_DECODER.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)[:200]) from None


class RoleCheck(msgspec.Struct, frozen=True):
    """One member's roles as this node counts them (:func:`check_cert`).

    ``pinned``: this node pins operator keys (else every claim counts). ``claimed``: the roles its tags claim
    (``lead`` counts as claimed by every member). ``roles``: the roles that count. ``certified``: the roles its
    certificate grants ("" reason: it is valid). ``reason``: why its certificate is refused, or ``not_granted``
    when it is valid but a claimed role is not in it; "" when every claim counts. ``refused``: claimed roles that
    do not count, ``lead`` only when the member claims a role by a tag (``voter``, ``durable``, ``lead``): a plain
    worker is not refused anything (and not counted in :attr:`RoleGate.refused`), though it is not eligible to
    lead either. ``expires_at``: the certificate's end (Unix seconds; 0: none); ``recheck_at``: when the result
    changes by time alone (the end, or the start of a certificate not yet valid; ``inf``: never).
    ``node_class``/``provider_id``: from a valid certificate ("" otherwise)."""

    pinned: bool
    claimed: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    certified: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    reason: str = ""
    expires_at: float = 0.0
    recheck_at: float = math.inf
    node_class: str = ""
    provider_id: str = ""
    issuer: str = ""


def _cert_reason(node: str, cert: RoleCert | None, keys: dict[str, bytes], wall: float) -> str:
    """Why ``cert`` does not hold for ``node`` at ``wall`` ("": it does); the signature is checked last."""
    if cert is None:
        return "no_cert"
    key = keys.get(cert.issuer)
    if key is None:
        return "unknown_issuer"
    if cert.node != node:
        return "wrong_node"
    if cert.expires_at <= cert.issued_at or cert.expires_at - cert.issued_at > MAX_LIFETIME_S:
        return "too_long"
    if not verify_signature(key, cert.sig, _cert_bytes(cert)):
        return "bad_signature"
    if wall >= cert.expires_at:
        return "expired"
    if wall + CERT_SKEW_S < cert.issued_at:
        return "not_yet_valid"
    return ""


def check_cert(node: str, tags: list[str] | tuple[str, ...], cert: RoleCert | None,
               keys: dict[str, bytes], wall: float, *, reason: str | None = None) -> RoleCheck:
    """The roles of member ``node`` (its snapshot's ``tags`` and ``cert``) that count on a node pinning ``keys``
    (``{"ed25519:...": key}``; empty: every claim counts) at wall-clock ``wall`` (Unix seconds). ``reason``: the
    certificate's refusal reason if already known (:meth:`RoleGate` caches signature checks)."""
    claimed = tuple(r for r in ROLES if r in tags or r == "lead")
    if not keys:
        return RoleCheck(pinned=False, claimed=claimed, roles=claimed)
    why = _cert_reason(node, cert, keys, wall) if reason is None else reason
    valid = cert is not None and not why
    certified = tuple(cert.roles) if valid and cert is not None else ()
    roles = tuple(r for r in claimed if r in certified)
    tagged = any(t in ROLE_TAGS for t in tags)  # a claim by a tag: a plain worker is refused nothing
    refused = tuple(r for r in claimed if r not in certified and (r != "lead" or tagged))
    recheck = math.inf
    if cert is not None and why in ("", "not_yet_valid"):
        recheck = cert.expires_at if not why else cert.issued_at - CERT_SKEW_S
    return RoleCheck(pinned=True, claimed=claimed, roles=roles, certified=certified, refused=refused,
                     reason=why or ("not_granted" if refused else ""), recheck_at=recheck,
                     expires_at=float(cert.expires_at) if cert is not None else 0.0,
                     node_class=cert.node_class if valid and cert is not None else "",
                     provider_id=cert.provider_id if valid and cert is not None else "",
                     issuer=cert.issuer if cert is not None else "")


_OPEN_CHECKS: dict[tuple[bool, bool], RoleCheck] = {
    (voter, durable): check_cert("", ("voter",) * voter + ("durable",) * durable, None, {}, 0.0)
    for voter in (False, True) for durable in (False, True)
}
""":func:`check_cert` with no key pinned, by whether the tags claim ``voter`` and ``durable`` (all it depends on:
``lead`` is claimed by every member); shared by :meth:`RoleGate.check` (a :class:`RoleCheck` is immutable)."""
assert set(ROLES) == {"voter", "durable", "lead"}, "_OPEN_CHECKS covers these roles"


def effective_tags(tags: list[str] | tuple[str, ...], check: RoleCheck) -> list[str]:
    """``tags`` as they count (:class:`RoleCheck`): unchanged when no key is pinned; else role tags not
    certified removed, and :data:`UNCERTIFIED_LEAD_TAG` present exactly when ``lead`` is not certified."""
    if not check.pinned:
        return list(tags)
    out = [t for t in tags if t != UNCERTIFIED_LEAD_TAG and (t not in ROLE_TAGS or t in check.roles)]
    if "lead" not in check.roles:
        out.append(UNCERTIFIED_LEAD_TAG)
    return out


def certified_class(check: RoleCheck | None) -> tuple[str, str] | None:
    """``(node_class, provider_id)`` a valid certificate gives a member, or None (no key pinned, no valid
    certificate, or one that names no class). ``check``: :attr:`p2pnode.node.Member.roles` (what
    ``NodeContext.members()`` hands every subsystem), or :meth:`RoleGate.check_of`."""
    if check is None or not check.pinned or not check.node_class:
        return None
    return (check.node_class, check.provider_id)


class RoleGate:
    """The roles that count for every member this node holds (see the module docstring).

    ``keys``: the pinned operator keys (``ed25519:<base64>``; raises ``ValueError`` for a bad one). Per member it
    keeps the newest :class:`RoleCheck` (:meth:`check_of`, at most ``max_members``) and caches the signature
    check of its certificate (one Ed25519 verification per new certificate, not per snapshot version).
    :attr:`refused` counts, by reason (:data:`REASONS`), each member whose result changed to a refusal (a new
    certificate refused, one that expired): once per change, not per snapshot version.

    Renewal takes roles back: per node it keeps a **floor**, the ``issued_at`` of the newest certificate seen for
    it that verifies (pinned issuer, that node, signature; expired or not). A certificate issued before the floor
    is refused ``superseded``, so a node cannot go on showing an older, still unexpired certificate with more
    roles once the operator issued it a new one. Floors are kept for at most ``4 * max_members`` nodes (the
    oldest set first forgotten), across :meth:`forget`, in memory (:meth:`floors` / :meth:`restore_floors` let
    a driver persist them). An operator who must take a role back from a node that will not show a newer
    certificate lets the old one expire: hence short lifetimes (days) renewed by a timer."""

    def __init__(self, keys: tuple[str, ...] = (), *, max_members: int = 1024) -> None:
        self.keys = {k: decode_operator_key(k) for k in keys}
        self.max_members = max_members
        self.refused: Counter[str] = Counter({r: 0 for r in REASONS})
        self._checks: dict[str, RoleCheck] = {}
        self._verified: dict[str, tuple[RoleCert, str]] = {}  # node -> (cert, reason apart from time)
        self._floor: dict[str, int] = {}  # node -> issued_at of the newest verified certificate seen
        self.floors_changed = 0
        """Raised each time a floor rises (a driver persists :meth:`floors` when it moved)."""

    @property
    def pinned(self) -> bool:
        """Whether this node pins operator keys (roles count only when certified)."""
        return bool(self.keys)

    def check(self, node: str, tags: list[str] | tuple[str, ...], cert: RoleCert | None, wall: float) -> RoleCheck:
        """:func:`check_cert` for member ``node``, remembered (:meth:`check_of`) and counted when it changed."""
        if not self.keys:  # every claim counts: one of four results, none refused (nothing to count)
            result = _OPEN_CHECKS["voter" in tags, "durable" in tags]
            if node not in self._checks and len(self._checks) >= self.max_members:
                del self._checks[next(iter(self._checks))]
            self._checks[node] = result
            return result
        reason: str | None = None
        if self.keys and cert is not None:
            held = self._verified.get(node)
            if held is None or held[0] != cert:
                base = _cert_reason(node, cert, self.keys, cert.issued_at)  # everything but the clock
                if len(self._verified) >= self.max_members and node not in self._verified:
                    del self._verified[next(iter(self._verified))]
                self._verified[node] = held = (cert, base)
                if not base:
                    self._raise_floor(node, cert.issued_at)
            reason = held[1] or ("superseded" if cert.issued_at < self._floor.get(node, 0) else
                                 "expired" if wall >= cert.expires_at else
                                 "not_yet_valid" if wall + CERT_SKEW_S < cert.issued_at else "")
        result = check_cert(node, tags, cert, self.keys, wall, reason=reason)
        before = self._checks.get(node)
        if before is None and len(self._checks) >= self.max_members:
            del self._checks[next(iter(self._checks))]
        self._checks[node] = result
        if result.reason and result.refused and (before is None or before.reason != result.reason
                                                 or before.refused != result.refused):
            self.refused[result.reason] += 1
        return result

    def _raise_floor(self, node: str, issued_at: int) -> None:
        """Raise ``node``'s floor to ``issued_at`` (see the class docstring); bounded, oldest set first out."""
        if issued_at <= self._floor.get(node, -1):
            return
        self._floor.pop(node, None)
        self._floor[node] = issued_at
        self.floors_changed += 1
        while len(self._floor) > 4 * self.max_members:
            del self._floor[next(iter(self._floor))]

    def floors(self) -> dict[str, int]:
        """``{node id: issued_at}`` of the newest verified certificate seen per node (Unix seconds)."""
        return dict(self._floor)

    def restore_floors(self, floors: dict[str, int]) -> None:
        """Take floors a driver persisted (:meth:`floors`, decoded by a bounded type); never lowers one."""
        for node, issued_at in floors.items():
            self._raise_floor(node, issued_at)

    def check_of(self, node: str) -> RoleCheck | None:
        """The newest :class:`RoleCheck` of ``node`` (None: none made yet)."""
        return self._checks.get(node)

    def forget(self, node: str) -> None:
        """Drop what is kept of ``node`` (a reaped member)."""
        self._checks.pop(node, None)
        self._verified.pop(node, None)
