"""Wire format: signed snapshot envelopes and gossip messages, with size bounds and defensive decoding.

A **snapshot** is one node's state as a msgpack map (see :func:`validate_snapshot` for required fields). It
travels as an **envelope** ``{origin, version, key, body, sig[, endorsement]}``: ``body`` is the exact msgpack
bytes of the snapshot, ``sig`` the Ed25519 signature over those bytes, ``key`` the 32-byte public key from
which ``origin`` is derived (:func:`p2pnode.identity.node_id_for`). ``origin`` and ``version`` are repeated
outside the body for cheap digest comparison and must equal the signed ones inside.

A **gossip message** (the body of ``POST /gossip`` and of its reply) is a msgpack map::

    {"schema": 1, "from": node_id, "addr": "host:port", "digest": {origin: version},
     "envelopes": [envelope, ...]}

A reply that rejected some of the pushed envelopes also carries ``"rejected": [{"origin", "reason"}]``.

Every decoder here is bounded (:class:`WireLimits`) and raises only :class:`p2pnode.errors.RejectedMessage`
with a :class:`p2pnode.errors.RejectReason`; msgpack and cryptography exceptions never leak.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any

import msgpack

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

__all__ = [
    "SCHEMA_VERSION",
    "Envelope",
    "GossipMessage",
    "WireLimits",
    "decode_gossip",
    "encode_gossip",
    "open_envelope",
    "seal_snapshot",
    "validate_snapshot",
]

SCHEMA_VERSION = 1
"""Schema of snapshots and gossip messages. A receiver rejects other values as ``bad_schema``."""

MAX_ID_CHARS = 64
MAX_ADDR_CHARS = 256
MAX_VERSION = 2**63 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class WireLimits:
    """Size bounds on network input. Bytes are raw encoded sizes.

    ``max_body_bytes`` bounds one ``POST /gossip`` body (and reply); ``max_snapshot_bytes`` one snapshot body;
    ``max_envelopes`` and ``max_digest_entries`` the container lengths in one message.
    """

    max_body_bytes: int = 1024 * 1024
    max_snapshot_bytes: int = 64 * 1024
    max_envelopes: int = 4096
    max_digest_entries: int = 65536


DEFAULT_LIMITS = WireLimits()


@dataclass(frozen=True, slots=True)
class Envelope:
    """One signed snapshot as carried on the wire (see module docstring)."""

    origin: str
    version: int
    key: bytes
    body: bytes
    sig: bytes
    endorsement: bytes | None = None

    @property
    def wire_size(self) -> int:
        """Approximate encoded size in bytes (body, key, signature, ids and framing)."""
        return len(self.body) + len(self.key) + len(self.sig) + len(self.origin) + 48 + (
            len(self.endorsement) if self.endorsement else 0
        )

    def to_wire(self) -> dict[str, Any]:
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


@dataclass(frozen=True, slots=True)
class GossipMessage:
    """A decoded gossip request or reply. ``bad_envelopes`` holds the per-entry rejections met while decoding
    (the rest of the batch is still usable)."""

    sender: str
    addr: str
    digest: dict[str, int]
    envelopes: list[Envelope] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    bad_envelopes: list[RejectedMessage] = field(default_factory=list)


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def seal_snapshot(identity: Identity, snapshot: dict[str, Any], *, token: str | None = None) -> Envelope:
    """Encode and sign ``snapshot`` (which must hold ``origin`` = our node id and ``version``).

    ``token`` (token trust mode) adds the key's endorsement. Raises ``ValueError`` when the snapshot names
    another origin: that is our own misuse, not a peer's error.
    """
    if snapshot.get("origin") != identity.node_id:
        raise ValueError("snapshot origin must be this node's id")
    body = _pack(snapshot)
    return Envelope(
        origin=identity.node_id,
        version=int(snapshot["version"]),
        key=identity.public_key,
        body=body,
        sig=identity.sign(body),
        endorsement=endorsement_for(token, identity.public_key) if token else None,
    )


def validate_snapshot(snap: Any) -> dict[str, Any]:
    """Check the shape of a decoded snapshot; return it. Raises ``RejectedMessage`` (bad_schema, bad_type).

    Required: ``schema`` (== :data:`SCHEMA_VERSION`), ``origin`` (str), ``version`` (int >= 0), ``addr`` (str),
    ``tags`` (list of str), ``resources`` (map), ``leaving`` (bool). Membership and election fields, when present:
    ``incarnation`` (int >= 0), ``suspects`` ({node id: incarnation}), ``vote`` (``None`` or {candidate, term}).
    """
    if not isinstance(snap, dict):
        raise _bad("snapshot is not a map")
    if snap.get("schema") != SCHEMA_VERSION:
        raise RejectedMessage(RejectReason.BAD_SCHEMA, f"snapshot schema {snap.get('schema')!r}")
    checks = (
        ("origin", lambda v: isinstance(v, str) and 0 < len(v) <= MAX_ID_CHARS),
        ("version", lambda v: _is_int(v) and 0 <= v <= MAX_VERSION),
        ("addr", lambda v: isinstance(v, str) and len(v) <= MAX_ADDR_CHARS),
        ("tags", lambda v: isinstance(v, list) and len(v) <= 64 and all(isinstance(t, str) and len(t) <= 128 for t in v)),
        ("resources", lambda v: isinstance(v, dict)),
        ("leaving", lambda v: isinstance(v, bool)),
    )
    for key, ok in checks:
        if key not in snap or not ok(snap[key]):
            raise _bad(f"snapshot field {key!r} missing or of the wrong type")
    inc = snap.get("incarnation", 0)
    if not (_is_int(inc) and 0 <= inc <= MAX_VERSION):
        raise _bad("snapshot field 'incarnation' is not a non-negative integer")
    suspects = snap.get("suspects", {})
    if not (isinstance(suspects, dict) and len(suspects) <= 4096 and all(
        isinstance(k, str) and len(k) <= MAX_ID_CHARS and _is_int(v) and v >= 0 for k, v in suspects.items()
    )):
        raise _bad("snapshot field 'suspects' must map node ids to incarnations")
    vote = snap.get("vote")
    if vote is not None and not (
        isinstance(vote, dict)
        and isinstance(vote.get("candidate"), str)
        and len(vote["candidate"]) <= MAX_ID_CHARS
        and _is_int(vote.get("term"))
        and 0 <= vote["term"] <= MAX_VERSION
    ):
        raise _bad("snapshot field 'vote' must be {candidate, term}")
    digest = snap.get("catalog_digest", "")
    if not (isinstance(digest, str) and len(digest) <= 64):
        raise _bad("snapshot field 'catalog_digest' must be a short string")
    jobs = snap.get("jobs", [])
    if not (isinstance(jobs, list) and len(jobs) <= 512 and all(
        isinstance(j, dict) and isinstance(j.get("job_id"), str) and isinstance(j.get("template"), str) for j in jobs
    )):
        raise _bad("snapshot field 'jobs' must be a list of at most 512 {job_id, template, ...}")
    plan = snap.get("plan")
    if plan is not None and not (
        isinstance(plan, dict) and _is_int(plan.get("term")) and isinstance(plan.get("jobs"), list)
        and len(plan["jobs"]) <= 4096 and all(isinstance(j, dict) and isinstance(j.get("job_id"), str)
                                              and isinstance(j.get("node"), str) for j in plan["jobs"])
    ):
        raise _bad("snapshot field 'plan' must be {term, jobs: [{job_id, node, ...}]}")
    if not _is_int(snap.get("offer", 0)) or not isinstance(snap.get("signals", {}), dict) \
            or not isinstance(snap.get("refused", []), list):
        raise _bad("snapshot fields 'offer', 'signals', 'refused' have the wrong type")
    guard = snap.get("guard", {})
    if not isinstance(guard, dict) or not _is_int(guard.get("level", 0)):
        raise _bad("snapshot field 'guard' must be a map with an integer level")
    events = snap.get("events", [])
    if not (isinstance(events, list) and len(events) <= 64 and all(
        isinstance(e, dict) and isinstance(e.get("name"), str) for e in events
    )):
        raise _bad("snapshot field 'events' must be a list of at most 64 events")
    _check_sync(snap.get("sync", {}))
    res = snap["resources"]
    for key in ("cpu_percent", "mem_percent", "disk_percent", "power_score"):
        if key in res and not _is_num(res[key]):
            raise _bad(f"resources.{key} is not a number")
    gpus = res.get("gpus", [])
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise _bad("resources.gpus is not a list of maps")
    return snap


MAX_RECEIPTS = 1024


def _check_sync(sync: Any) -> None:
    """``sync``: ``{receipts: {origin: [[path, size, root(32 bytes)], ...]}, receipt_digests: {origin: hex},
    digest, files, bytes, data_port, ...}``."""
    if not isinstance(sync, dict):
        raise _bad("snapshot field 'sync' must be a map")
    receipts = sync.get("receipts", {})
    if not isinstance(receipts, dict) or len(receipts) > MAX_RECEIPTS:
        raise _bad("sync.receipts must map origins to receipt lists")
    n = 0
    for origin, recs in receipts.items():
        if not (isinstance(origin, str) and len(origin) <= MAX_ID_CHARS and isinstance(recs, list)):
            raise _bad("sync.receipts must map origins to receipt lists")
        for r in recs:
            n += 1
            if not (isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and len(r[0]) <= 1024
                    and _is_int(r[1]) and r[1] >= 0 and isinstance(r[2], bytes) and len(r[2]) == 32):
                raise _bad("a sync receipt must be [path, size, root (32 bytes)]")
    if n > MAX_RECEIPTS:
        raise _bad(f"more than {MAX_RECEIPTS} sync receipts")
    for key in ("files", "bytes", "under_replicated"):
        if key in sync and not (_is_int(sync[key]) and sync[key] >= 0):
            raise _bad(f"sync.{key} must be a non-negative integer")
    digests = sync.get("receipt_digests", {})
    if not (isinstance(digests, dict) and len(digests) <= MAX_RECEIPTS and all(
            isinstance(k, str) and len(k) <= MAX_ID_CHARS and isinstance(v, str) and len(v) <= 32
            for k, v in digests.items())):
        raise _bad("sync.receipt_digests must map origins to short digests")
    if "data_port" in sync and not (_is_int(sync["data_port"]) and 0 < sync["data_port"] <= 65535):
        raise _bad("sync.data_port must be a port number")
    if not isinstance(sync.get("digest", ""), str) or len(sync.get("digest", "")) > 64:
        raise _bad("sync.digest must be a short string")


def open_envelope(env: Envelope, *, limits: WireLimits = DEFAULT_LIMITS, token: str | None = None) -> dict[str, Any]:
    """Verify ``env`` and return its decoded, validated snapshot.

    Order (cheapest first): size -> key derives origin -> endorsement (token mode) -> Ed25519 signature over
    the body bytes -> decode -> schema/types -> origin/version inside equal those outside. Raises
    ``RejectedMessage`` with reason oversized, wrong_key, unendorsed, bad_signature, malformed, bad_schema,
    bad_type or mismatch.
    """
    if len(env.body) > limits.max_snapshot_bytes:
        raise RejectedMessage(RejectReason.OVERSIZED, f"snapshot of {len(env.body)} bytes > {limits.max_snapshot_bytes}")
    if node_id_for(env.key) != env.origin:
        raise RejectedMessage(RejectReason.WRONG_KEY, f"key does not derive origin {env.origin}")
    if token is not None:
        expected = endorsement_for(token, env.key)
        if env.endorsement is None or not hmac.compare_digest(expected, env.endorsement):
            raise RejectedMessage(RejectReason.UNENDORSED, f"{env.origin} is not endorsed by the cluster token")
    if not verify_signature(env.key, env.sig, env.body):
        raise RejectedMessage(RejectReason.BAD_SIGNATURE, f"signature of {env.origin} v{env.version}")
    snap = validate_snapshot(_unpack(env.body, limits.max_snapshot_bytes))
    if snap["origin"] != env.origin or snap["version"] != env.version:
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
) -> bytes:
    """Encode a gossip message (request or reply) to msgpack bytes. ``rejected`` lists ``(origin, reason)``
    of pushed envelopes a reply refused."""
    msg: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "from": sender,
        "addr": addr,
        "digest": digest,
        "envelopes": [e.to_wire() for e in envelopes],
    }
    if rejected:
        msg["rejected"] = [{"origin": o, "reason": r} for o, r in rejected]
    return _pack(msg)


def decode_gossip(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> GossipMessage:
    """Decode a gossip message. Raises ``RejectedMessage`` (oversized, malformed, bad_schema, bad_type) when the
    message as a whole is unusable; a bad single envelope only lands in ``bad_envelopes``.

    Envelope signatures are *not* checked here; :meth:`p2pnode.gossip.ClusterState.merge` does that.
    """
    msg = _unpack(data, limits.max_body_bytes)
    if not isinstance(msg, dict):
        raise _bad("message is not a map")
    if msg.get("schema") != SCHEMA_VERSION:
        raise RejectedMessage(RejectReason.BAD_SCHEMA, f"message schema {msg.get('schema')!r}")
    sender, addr, digest, envs = msg.get("from"), msg.get("addr", ""), msg.get("digest", {}), msg.get("envelopes", [])
    rejected_raw = msg.get("rejected", [])
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
    if not isinstance(digest, dict) or len(digest) > limits.max_digest_entries:
        raise _bad("'digest' must be a map of at most %d entries" % limits.max_digest_entries)
    for k, v in digest.items():
        if not (isinstance(k, str) and len(k) <= MAX_ID_CHARS and _is_int(v) and 0 <= v <= MAX_VERSION):
            raise _bad("'digest' must map node ids to versions")
    if not isinstance(envs, list) or len(envs) > limits.max_envelopes:
        raise _bad("'envelopes' must be a list of at most %d entries" % limits.max_envelopes)
    out: list[Envelope] = []
    bad: list[RejectedMessage] = []
    for raw in envs:
        try:
            out.append(_decode_envelope(raw, limits))
        except RejectedMessage as exc:
            origin = raw.get("origin") if isinstance(raw, dict) else None
            exc.origin = origin[:MAX_ID_CHARS] if isinstance(origin, str) else ""
            bad.append(exc)
    return GossipMessage(sender, addr, dict(digest), out, rejected, bad)
