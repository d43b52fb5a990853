"""Wire format: signed snapshot envelopes and gossip messages, with size bounds and defensive decoding.

A **snapshot** is one node's state as a msgpack map (typed sections: :class:`p2pnode.snapshot.Snapshot`). It
travels as an **envelope** ``{origin, version, key, body, sig[, endorsement]}``: ``body`` is the exact msgpack
bytes of the snapshot, ``sig`` the Ed25519 signature over those bytes, ``key`` the 32-byte public key from
which ``origin`` is derived (:func:`p2pnode.identity.node_id_for`). ``origin`` and ``version`` are repeated
outside the body for cheap digest comparison and must equal the signed ones inside.

A **gossip message** (the body of ``POST /gossip`` and of its reply) is a msgpack map::

    {"schema": 1, "from": node_id, "addr": "host:port", "digest": {origin: version},
     "envelopes": [envelope, ...]}

A reply that rejected some of the pushed envelopes also carries ``"rejected": [{"origin", "reason"}]``. A message
whose digest is *partial* (only recently changed origins: :mod:`p2pnode.gossip._protocol`) carries
``"partial": true``; in it an absent origin means "not said", never "lacks". Without the key the digest is full,
as every message of an older agent is. A partial digest holds at most ``max_partial_digest_entries`` entries, and
so does a ``"want": [origin, ...]`` list (origins whose envelopes the sender asks for).

Every decoder here is bounded (:class:`WireLimits`) and raises only :class:`p2pnode.errors.RejectedMessage`
with a :class:`p2pnode.errors.RejectReason`; msgpack and signature-library exceptions never leak.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol, TypeGuard, Union

import msgpack
import msgspec

from .errors import RejectedMessage, RejectReason
from .identity import (
    ENDORSEMENT_BYTES,
    PUBLIC_KEY_BYTES,
    SIGNATURE_BYTES,
    Identity,
    endorsement_for,
    node_id_for,
    verify_signature,
)
from .snapshot import COUNTER_MAX, Snapshot, decode_snapshot, encode_snapshot, snapshot_dict
from .snapshot import SCHEMA_VERSION as SNAPSHOT_SCHEMA

__all__ = [
    "SCHEMA_VERSION",
    "Envelope",
    "GossipMessage",
    "WireLimits",
    "decode_gossip",
    "encode_gossip",
    "open_envelope",
    "open_envelopes",
    "seal_snapshot",
    "validate_snapshot",
]

SCHEMA_VERSION = 1
"""Schema of snapshots and gossip messages. A receiver rejects other values as ``bad_schema``."""

MAX_ID_CHARS = 64
MAX_ADDR_CHARS = 256
MAX_VERSION = COUNTER_MAX
"""Versions, incarnations and terms on the wire stay below 2^53 (:data:`p2pnode.snapshot.COUNTER_MAX`)."""


class WireLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Size bounds on network input. Bytes are raw encoded sizes.

    ``max_body_bytes`` bounds one ``POST /gossip`` body (and reply); ``max_snapshot_bytes`` one snapshot body;
    ``max_envelopes`` and ``max_digest_entries`` the container lengths in one message; ``max_partial_digest_entries``
    the digest of a message marked ``partial``.
    """

    max_body_bytes: int = 1024 * 1024
    max_snapshot_bytes: int = 64 * 1024
    max_envelopes: int = 4096
    max_digest_entries: int = 65536
    max_partial_digest_entries: int = 2048
    """Bound of a partial digest (an honest one names at most a few hundred recently changed origins)."""


DEFAULT_LIMITS = WireLimits()


class Envelope(msgspec.Struct, frozen=True, omit_defaults=True):
    """One signed snapshot as carried on the wire (see module docstring). The bounds below are checked when a
    gossip message is decoded (:func:`decode_gossip`; ``body`` against :attr:`WireLimits.max_snapshot_bytes`
    there); encoded by :func:`encode_gossip` as the map :meth:`to_wire` gives (no ``endorsement`` key when None)."""

    origin: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
    version: Annotated[int, msgspec.Meta(ge=0, le=MAX_VERSION)]
    key: Annotated[bytes, msgspec.Meta(min_length=PUBLIC_KEY_BYTES, max_length=PUBLIC_KEY_BYTES)]
    body: bytes
    sig: Annotated[bytes, msgspec.Meta(min_length=SIGNATURE_BYTES, max_length=SIGNATURE_BYTES)]
    endorsement: Annotated[
        bytes, msgspec.Meta(min_length=ENDORSEMENT_BYTES, max_length=ENDORSEMENT_BYTES)
    ] | None = None

    @property
    def wire_size(self) -> int:
        """Approximate encoded size in bytes (body, key, signature, ids and framing)."""
        return len(self.body) + len(self.key) + len(self.sig) + len(self.origin) + 48 + (
            len(self.endorsement) if self.endorsement else 0
        )

    def to_wire(self) -> dict[str, Any]:
        """The envelope as a msgpack-ready map."""
        d: dict[str, Any] = {
            "origin": self.origin,
            "version": self.version,
            "key": self.key,
            "body": self.body,
            "sig": self.sig,
        }
        if self.endorsement is not None:
            d["endorsement"] = self.endorsement
        return d


class GossipMessage(msgspec.Struct, frozen=True):
    """A decoded gossip request or reply. ``bad_envelopes`` holds the per-entry rejections met while decoding
    (the rest of the batch is still usable). ``partial``: ``digest`` names only some origins (an absent one is
    unknown, not lacking); False for a full digest (every older agent's). ``want``: origins whose envelopes the
    sender asks for (a partial exchange's third message)."""

    sender: str
    addr: str
    digest: dict[str, int]
    envelopes: list[Envelope] = msgspec.field(default_factory=list)
    rejected: list[tuple[str, str]] = msgspec.field(default_factory=list)
    bad_envelopes: list[RejectedMessage] = msgspec.field(default_factory=list)
    partial: bool = False
    want: list[str] = msgspec.field(default_factory=list)


def _pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)  # msgpack ships no types
    return packed


def _unpack(data: bytes, limit: int) -> Any:
    if len(data) > limit:
        raise RejectedMessage(RejectReason.OVERSIZED, f"{len(data)} bytes > limit {limit}")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=limit,
            max_bin_len=limit,
            max_array_len=min(limit, 1 << 20),
            max_map_len=min(limit, 1 << 20),
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise RejectedMessage(RejectReason.MALFORMED, f"{exc.__class__.__name__}: {exc}") from None
    except Exception as exc:  # msgpack raises assorted errors on hostile input; never leak them
        raise RejectedMessage(RejectReason.MALFORMED, f"{exc.__class__.__name__}") from None


def _bad(detail: str) -> RejectedMessage:
    return RejectedMessage(RejectReason.BAD_TYPE, detail)


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def seal_snapshot(identity: Identity, snapshot: Snapshot | dict[str, Any], *, token: str | None = None) -> Envelope:
    """Encode and sign ``snapshot`` (a typed :class:`p2pnode.snapshot.Snapshot`, or a plain map in tests), which
    must hold ``origin`` = our node id and ``version``.

    ``token`` (token trust mode) adds the key's endorsement. Raises ``ValueError`` when the snapshot names
    another origin: that is our own misuse, not a peer's error.
    """
    origin: Any
    version: Any
    if isinstance(snapshot, Snapshot):
        origin, version, body = snapshot.origin, snapshot.version, encode_snapshot(snapshot)
    else:
        origin, version, body = snapshot.get("origin"), snapshot.get("version"), _pack(snapshot)
    if origin != identity.node_id:
        raise ValueError("snapshot origin must be this node's id")
    return Envelope(
        origin=identity.node_id,
        version=int(version),
        key=identity.public_key,
        body=body,
        sig=identity.sign(body),
        endorsement=endorsement_for(token, identity.public_key) if token else None,
    )


def validate_snapshot(snap: Any) -> dict[str, Any]:
    """Check a decoded snapshot map against the typed schema (:class:`p2pnode.snapshot.Snapshot`); return its
    bounded plain view. Raises ``RejectedMessage`` (bad_schema, bad_type, malformed)."""
    if not isinstance(snap, dict):
        raise _bad("snapshot is not a map")
    try:
        body = _pack(snap)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _bad(f"snapshot does not encode: {exc}") from None
    view: dict[str, Any] = snapshot_dict(decode_snapshot(body))  # a Snapshot's plain view is a map
    return view


def _check_sync(sync: Any) -> None:
    """Check a ``sync`` section alone (see :class:`p2pnode.snapshot.SyncSection`). Raises ``RejectedMessage``."""
    if not isinstance(sync, dict):
        raise _bad("snapshot field 'sync' must be a map")
    validate_snapshot({"schema": SNAPSHOT_SCHEMA, "origin": "x", "version": 0, "addr": "", "tags": [],
                       "resources": {}, "leaving": False, "sync": sync})


Tokens = Union[str, Sequence[str], "SupportsAccepted"]
"""Accepted cluster tokens: one token, several, or a :class:`p2pnode.keyring.Keyring` (read at each check, so a
rotated keyring takes effect at once)."""


class SupportsAccepted(Protocol):
    """Anything that lists the accepted tokens (a :class:`p2pnode.keyring.Keyring`)."""
    def accepted(self) -> list[str]:
        """The tokens accepted now."""
        ...


def _accepted(tokens: Tokens) -> Sequence[str]:
    if isinstance(tokens, str):
        return (tokens,)
    if hasattr(tokens, "accepted"):
        return tokens.accepted()
    return tokens


def endorsed(env: Envelope, tokens: Tokens) -> bool:
    """Whether ``env``'s key carries the endorsement of one of ``tokens`` (constant-time compares; HMACs, no
    signature check)."""
    if env.endorsement is None:
        return False
    return any(hmac.compare_digest(endorsement_for(t, env.key), env.endorsement) for t in _accepted(tokens))


def open_envelope(env: Envelope, *, limits: WireLimits = DEFAULT_LIMITS, token: Tokens | None = None) -> Snapshot:
    """Verify ``env`` and return its decoded, validated, typed snapshot.

    Order (cheapest first): size -> key derives origin -> endorsement (token mode) -> Ed25519 signature over
    the body bytes -> decode -> schema/types -> origin/version inside equal those outside. Raises
    ``RejectedMessage`` with reason oversized, wrong_key, unendorsed, bad_signature, malformed, bad_schema,
    bad_type or mismatch.
    """
    _precheck(env, limits, token)
    if not verify_signature(env.key, env.sig, env.body):
        raise _bad_signature(env)
    return _opened(env)


def open_envelopes(envs: Sequence[Envelope], *, limits: WireLimits = DEFAULT_LIMITS,
                   token: Tokens | None = None) -> list[Snapshot | RejectedMessage]:
    """:func:`open_envelope` of each of ``envs``: per envelope its snapshot or the ``RejectedMessage`` it raised
    (the same checks in the same order per envelope). Done in stages over the batch: the cheap checks of every
    envelope, then every signature in one loop, then every decode, so the signature checks run back to back as
    raw verification does (with Python's work between them each cost about 5 % more: caches)."""
    out: list[Any] = []
    signed: list[int] = []
    for i, env in enumerate(envs):
        try:
            _precheck(env, limits, token)
        except RejectedMessage as exc:
            out.append(exc)
            continue
        out.append(None)
        signed.append(i)
    valid: list[int] = []
    for i in signed:
        env = envs[i]
        if verify_signature(env.key, env.sig, env.body):
            valid.append(i)
        else:
            out[i] = _bad_signature(env)
    for i in valid:
        try:
            out[i] = _opened(envs[i])
        except RejectedMessage as exc:
            out[i] = exc
    return out


def _precheck(env: Envelope, limits: WireLimits, token: Tokens | None) -> None:
    """The checks of :func:`open_envelope` before the signature's."""
    if len(env.body) > limits.max_snapshot_bytes:
        raise RejectedMessage(RejectReason.OVERSIZED,
                              f"snapshot of {len(env.body)} bytes > {limits.max_snapshot_bytes}")
    if node_id_for(env.key) != env.origin:
        raise RejectedMessage(RejectReason.WRONG_KEY, f"key does not derive origin {env.origin}")
    if token is not None and not endorsed(env, token):
        raise RejectedMessage(RejectReason.UNENDORSED, f"{env.origin} is not endorsed by an accepted cluster token")


def _bad_signature(env: Envelope) -> RejectedMessage:
    return RejectedMessage(RejectReason.BAD_SIGNATURE, f"signature of {env.origin} v{env.version}")


def _opened(env: Envelope) -> Snapshot:
    """The checks of :func:`open_envelope` after the signature's: decode, schema and types, origin/version."""
    snap = decode_snapshot(env.body)
    if snap.origin != env.origin or snap.version != env.version:
        raise RejectedMessage(RejectReason.MISMATCH, "envelope origin/version differ from the signed snapshot")
    return snap


def _decode_envelope(raw: Any, limits: WireLimits) -> Envelope:
    if not isinstance(raw, dict):
        raise _bad("envelope is not a map")
    origin, version, key, body, sig = (raw.get(k) for k in ("origin", "version", "key", "body", "sig"))
    endorsement = raw.get("endorsement")
    if not (isinstance(origin, str) and 0 < len(origin) <= MAX_ID_CHARS):
        raise _bad("envelope origin")
    if not (_is_int(version) and 0 <= version <= MAX_VERSION):
        raise _bad(f"envelope version of {origin}")
    if not (isinstance(key, bytes) and len(key) == PUBLIC_KEY_BYTES):
        raise _bad(f"envelope key of {origin}")
    if not (isinstance(sig, bytes) and len(sig) == SIGNATURE_BYTES):
        raise _bad(f"envelope sig of {origin}")
    if not isinstance(body, bytes):
        raise _bad(f"envelope body of {origin}")
    if len(body) > limits.max_snapshot_bytes:
        raise RejectedMessage(RejectReason.OVERSIZED, f"snapshot of {origin}: {len(body)} bytes")
    if endorsement is not None and not (isinstance(endorsement, bytes) and len(endorsement) == ENDORSEMENT_BYTES):
        raise _bad(f"envelope endorsement of {origin}")
    return Envelope(origin, version, key, body, sig, endorsement)


def encode_gossip(
    sender: str,
    addr: str,
    digest: dict[str, int],
    envelopes: list[Envelope],
    *,
    rejected: list[tuple[str, str]] | None = None,
    partial: bool = False,
    want: list[str] | None = None,
) -> bytes:
    """Encode a gossip message (request or reply) to msgpack bytes. ``rejected`` lists ``(origin, reason)``
    of pushed envelopes a reply refused; ``partial`` marks ``digest`` as naming only some origins (the key is
    left out of a full digest's message, which is byte for byte an older agent's); ``want`` lists origins whose
    envelopes the sender asks for."""
    msg: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "from": sender,
        "addr": addr,
        "digest": digest,
        "envelopes": envelopes,  # each the map Envelope.to_wire gives, encoded in C
    }
    if rejected:
        msg["rejected"] = [{"origin": o, "reason": r} for o, r in rejected]
    if partial:
        msg["partial"] = True
    if want:
        msg["want"] = want
    return _ENCODER.encode(msg)


class _WireRejected(msgspec.Struct, frozen=True):
    origin: str
    reason: str


class _WireGossip(msgspec.Struct, frozen=True):
    schema: Literal[1]
    sender: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)] = msgspec.field(name="from")
    addr: Annotated[str, msgspec.Meta(max_length=MAX_ADDR_CHARS)] = ""
    digest: dict[
        Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)], Annotated[int, msgspec.Meta(ge=0, le=MAX_VERSION)]
    ] = {}
    envelopes: list[Envelope] = []
    rejected: list[_WireRejected] = []
    partial: bool = False
    want: list[Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]] = []


_GOSSIP_DECODER = msgspec.msgpack.Decoder(_WireGossip)
_ENCODER = msgspec.msgpack.Encoder()


def _decode_gossip_fast(data: bytes, limits: WireLimits) -> GossipMessage | None:
    """The common case in C (msgspec): a message whose every field and envelope is well formed. ``None`` when
    anything is off; the caller then takes the slow path, which says exactly what and keeps the good envelopes."""
    try:
        m = _GOSSIP_DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    if (len(m.envelopes) > limits.max_envelopes or len(m.digest) > _digest_bound(m.partial, limits)
            or len(m.rejected) > limits.max_envelopes or len(m.want) > limits.max_partial_digest_entries
            or any(len(e.body) > limits.max_snapshot_bytes for e in m.envelopes)):
        return None
    rejected = [(r.origin[:MAX_ID_CHARS], r.reason[:32]) for r in m.rejected]
    return GossipMessage(m.sender, m.addr, m.digest, m.envelopes, rejected, [], m.partial, m.want)


def _digest_bound(partial: bool, limits: WireLimits) -> int:
    return min(limits.max_partial_digest_entries, limits.max_digest_entries) if partial else limits.max_digest_entries


def decode_gossip(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> GossipMessage:
    """Decode a gossip message. Raises ``RejectedMessage`` (oversized, malformed, bad_schema, bad_type) when the
    message as a whole is unusable; a bad single envelope only lands in ``bad_envelopes``.

    Envelope signatures are *not* checked here; :meth:`p2pnode.gossip.ClusterState.merge` does that. A well-formed
    message is decoded by msgspec in C (about 1 ms for 4,096 envelopes); any other takes the field-by-field path.
    """
    if len(data) > limits.max_body_bytes:
        raise RejectedMessage(RejectReason.OVERSIZED, f"{len(data)} bytes > limit {limits.max_body_bytes}")
    fast = _decode_gossip_fast(data, limits)
    if fast is not None:
        return fast
    msg = _unpack(data, limits.max_body_bytes)
    if not isinstance(msg, dict):
        raise _bad("message is not a map")
    if msg.get("schema") != SCHEMA_VERSION:
        raise RejectedMessage(RejectReason.BAD_SCHEMA, f"message schema {msg.get('schema')!r}")
    sender, addr, digest, envs = msg.get("from"), msg.get("addr", ""), msg.get("digest", {}), msg.get("envelopes", [])
    rejected_raw, partial = msg.get("rejected", []), msg.get("partial", False)
    if not isinstance(partial, bool):
        raise _bad("'partial' must be a boolean")
    want = msg.get("want", [])
    if not (isinstance(want, list) and len(want) <= limits.max_partial_digest_entries
            and all(isinstance(o, str) and 0 < len(o) <= MAX_ID_CHARS for o in want)):
        raise _bad(f"'want' must be a list of at most {limits.max_partial_digest_entries} node ids")
    if not (isinstance(sender, str) and 0 < len(sender) <= MAX_ID_CHARS):
        raise _bad("'from' must be a node id string")
    if not (isinstance(addr, str) and len(addr) <= MAX_ADDR_CHARS):
        raise _bad("'addr' must be a host:port string")
    if not isinstance(rejected_raw, list) or len(rejected_raw) > limits.max_envelopes:
        raise _bad("'rejected' must be a list")
    rejected: list[tuple[str, str]] = []
    for r in rejected_raw:
        if not (isinstance(r, dict) and isinstance(r.get("origin"), str) and isinstance(r.get("reason"), str)):
            raise _bad("'rejected' entries must be {origin, reason} maps")
        rejected.append((r["origin"][:MAX_ID_CHARS], r["reason"][:32]))
    bound = _digest_bound(partial, limits)
    if not isinstance(digest, dict) or len(digest) > bound:
        raise _bad(f"'digest' must be a map of at most {bound} entries")
    for k, v in digest.items():
        if not (isinstance(k, str) and len(k) <= MAX_ID_CHARS and _is_int(v) and 0 <= v <= MAX_VERSION):
            raise _bad("'digest' must map node ids to versions")
    if not isinstance(envs, list) or len(envs) > limits.max_envelopes:
        raise _bad(f"'envelopes' must be a list of at most {limits.max_envelopes} entries")
    out: list[Envelope] = []
    bad: list[RejectedMessage] = []
    for raw in envs:
        try:
            out.append(_decode_envelope(raw, limits))
        except RejectedMessage as exc:
            origin = raw.get("origin") if isinstance(raw, dict) else None
            exc.origin = origin[:MAX_ID_CHARS] if isinstance(origin, str) else ""
            bad.append(exc)
    return GossipMessage(sender, addr, dict(digest), out, rejected, bad, partial, want)
