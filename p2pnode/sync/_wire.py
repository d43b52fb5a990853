"""Sync requests on the wire: the ``POST /sync/push`` body and its Ed25519 request signature.

Body: a 4-byte big-endian header length ``N``, ``N`` bytes of msgpack header, then the blocks' bytes back to
back in header order (raw, so 8 MiB of blocks is one copy, not a msgpack round trip)::

    {"files": [{"path": str, "size": int, "block_size": int, "hashes": bytes, "root": bytes, "seq": int,
                "cls": "sealed" | "append" | "sqlite", "commit": bool, "blocks": [[index, length], ...]}, ...]}

The lengths must add up to the rest of the body exactly (``malformed`` otherwise). Headers (a push's and a block
stream's) are decoded by msgspec into the bounded structs below, the same bytes as ever on the wire; peers'
replies (the push reply, data-channel frames) by :mod:`p2pnode.inputs` (:func:`~p2pnode.inputs.decode_push_reply`,
:func:`~p2pnode.inputs.decode_channel_frame`).

Headers: ``X-P2PNode-Origin`` (node id), ``X-P2PNode-Time`` (Unix seconds), ``X-P2PNode-Signature`` (base64
Ed25519 signature by the origin's key over ``p2pnode-sync-v1``, the method, the path, the origin, the time and
the BLAKE3 of the body's length prefix and header, newline-separated; the blocks are bound by the manifest
hashes in that header and verified one by one). The receiver accepts a request only from a member it holds a verified
snapshot of (its key comes from there), within ``max_clock_skew_s`` of its own clock; a replay inside that window
can only rewrite blocks with the bytes their manifest already fixes. It checks all that the headers prove
(:func:`precheck_headers`) before reading a byte of the body, and the signature (:meth:`PushAuth.verify`) as soon
as the length prefix and header have arrived, before the blocks.

The reply is msgpack ``{"files": [{"path", "status", "need", ...}]}`` (see :meth:`ReplicaStore.apply`), with
status 200 when every item was accepted, or the first rejection's 4xx/507 otherwise (the body still lists every
item so the sender keeps the progress made).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

import blake3
import msgpack
import msgspec
from msgspec import Meta, Raw, Struct

from ..identity import Identity, verify_signature
from ..inputs import BlockIndex, unix_seconds
from ..snapshot import COUNTER_MAX, ByteCount, NodeId
from ..synccore import BLOCK_HASH_BYTES, Manifest
from ._refuse import SyncReject

__all__ = ["CLASSES", "PUSH_PATH", "KeyOf", "PushAuth", "PushItem", "decode_push", "decode_stream_header",
           "encode_frame", "encode_push", "encode_reply", "encode_stream_header", "header_part_length",
           "precheck_headers", "sign_headers", "stream_header_length", "verify_headers"]

T = TypeVar("T")

CLASSES = ("sealed", "append", "sqlite")
PUSH_PATH = "/sync/push"
"""The route pushes go to (part of what a request signature covers)."""
MAX_FILES_PER_REQUEST = 4096
ORIGIN_HEADER = "x-p2pnode-origin"
TIME_HEADER = "x-p2pnode-time"
SIG_HEADER = "x-p2pnode-signature"

KeyOf = Callable[[str], bytes | None]
"""``key_of(origin)``: the member's Ed25519 public key (32 bytes) from its verified snapshot, or None when the
origin is not a member this node accepts pushes from."""


class PushItem(msgspec.Struct):
    """One file in a push request or a block stream: its ``path`` (relative, POSIX), ``manifest``, sequence
    number ``seq`` (grows with each version the origin offers), ``blocks`` ``[(index, bytes)]``, whether to
    ``commit`` once every block is present, and its class ``cls`` (one of :data:`CLASSES`)."""

    path: str
    manifest: Manifest
    seq: int
    blocks: list[tuple[int, bytes | memoryview]] = msgspec.field(default_factory=list)
    commit: bool = True
    cls: str = "sealed"
    prehashed: set[int] = msgspec.field(default_factory=set)
    """Indices of ``blocks`` already checked against ``manifest`` (by :meth:`ReplicaStore.prehash`, outside the
    per-origin lock, so hashing one request overlaps with writing the previous one)."""


def _header_part(body: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
    """The part of a push body the signature covers: the length prefix and the msgpack header (manifests with
    their block hashes). The blocks after it are bound by those hashes, each checked on arrival, so a block
    corrupted in flight costs that block (``bad_block_hash``), not the whole request."""
    if len(body) >= 4:
        n = int.from_bytes(body[:4], "big")
        if n <= len(body) - 4:
            return memoryview(body)[: 4 + n]
    return body


def _signed_bytes(method: str, path: str, origin: str, ts: str, body: bytes | bytearray | memoryview) -> bytes:
    digest = blake3.blake3(_header_part(body)).hexdigest()
    return "\n".join(("p2pnode-sync-v1", method.upper(), path, origin, ts, digest)).encode()


def sign_headers(identity: Identity, method: str, path: str, body: bytes, *,
                 now: float | None = None) -> dict[str, str]:
    """The three auth headers (``x-p2pnode-origin``, ``-time``, ``-signature``) for a request of ``identity``'s
    node; ``now``: Unix seconds (default: the wall clock)."""
    ts = f"{time.time() if now is None else now:.3f}"
    sig = identity.sign(_signed_bytes(method, path, identity.node_id, ts, body))
    return {ORIGIN_HEADER: identity.node_id, TIME_HEADER: ts, SIG_HEADER: base64.b64encode(sig).decode()}


class PushAuth(msgspec.Struct, frozen=True):
    """What the headers of a push claim, checked as far as headers allow (:func:`precheck_headers`): the sender
    is a member whose key we hold, its time is within the skew window, the signature is well formed. The
    signature itself covers the body's header part and is checked by :meth:`verify` once that part arrived."""

    origin: str
    ts: str
    sig: bytes
    key: bytes

    def verify(self, method: str, path: str, body: bytes | bytearray | memoryview) -> str:
        """The authenticated origin, given the body or any prefix of it that holds the complete length prefix
        and header (the part the signature covers). Raises ``SyncReject("bad_signature")``."""
        if not verify_signature(self.key, self.sig, _signed_bytes(method, path, self.origin, self.ts, body)):
            raise SyncReject("bad_signature", f"signature does not verify for {self.origin!r}")
        return self.origin


def precheck_headers(headers: Any, *, key_of: KeyOf, now: float, max_skew_s: float) -> PushAuth:
    """Check everything about a push that its headers alone decide, before any body byte is read: the three auth
    headers are present and bounded, the origin is a member whose key ``key_of(origin)`` returns (else None),
    the time (Unix seconds) is within ``max_skew_s`` of ``now``, the signature is 64 bytes of base64. Raises
    :class:`SyncReject` (``bad_signature``, ``not_member``)."""
    origin = headers.get(ORIGIN_HEADER, "")
    ts = headers.get(TIME_HEADER, "")
    sig_b64 = headers.get(SIG_HEADER, "")
    if not origin or not ts or not sig_b64 or len(origin) > 64 or len(ts) > 32 or len(sig_b64) > 128:
        raise SyncReject("bad_signature", "missing or oversized auth headers")
    sent = unix_seconds(ts)  # the one decoder of header text: ASCII digits only
    try:
        sig = base64.b64decode(sig_b64, validate=True)
    except ValueError:
        sig = b""
    if sent is None or not sig:
        raise SyncReject("bad_signature", "unparseable time or signature")
    if len(sig) != SIGNATURE_BYTES:
        raise SyncReject("bad_signature", f"signature of {len(sig)} bytes, not {SIGNATURE_BYTES}")
    key = _check_member(origin, sent, key_of=key_of, now=now, max_skew_s=max_skew_s)
    return PushAuth(origin, ts, sig, key)


def verify_headers(headers: Any, method: str, path: str, body: bytes, *, key_of: KeyOf, now: float,
                   max_skew_s: float) -> str:
    """The authenticated origin of a request (:func:`precheck_headers`, then the signature over the body's
    header part). ``key_of(origin)`` returns the member's public key (bytes) or None when it is not a member.
    Raises :class:`SyncReject` (``not_member``, ``bad_signature``)."""
    return precheck_headers(headers, key_of=key_of, now=now, max_skew_s=max_skew_s).verify(method, path, body)


def _check_member(origin: str, sent: float, *, key_of: KeyOf, now: float, max_skew_s: float) -> bytes:
    """The member's key; raises ``SyncReject`` (``not_member``, ``bad_signature`` for a time out of skew)."""
    key = key_of(origin)
    if key is None:
        raise SyncReject("not_member", f"{origin!r} is not a member of this cluster")
    if not abs(now - sent) <= max_skew_s:
        raise SyncReject("bad_signature", f"request time {sent:.0f} is {now - sent:+.0f} s from ours")
    return key


def _check_origin(origin: str, sent: float, sig: bytes, signed: bytes, *, key_of: KeyOf, now: float,
                  max_skew_s: float) -> str:
    key = _check_member(origin, sent, key_of=key_of, now=now, max_skew_s=max_skew_s)
    if not verify_signature(key, sig, signed):
        raise SyncReject("bad_signature", f"signature does not verify for {origin!r}")
    return origin


def header_part_length(prefix: bytes | bytearray | memoryview, limit: int) -> int:
    """The length of the signed part of a push body (4-byte length prefix plus msgpack header), from its first
    4 bytes. Raises ``SyncReject("malformed")`` when the header alone would exceed ``limit`` bytes."""
    n = int.from_bytes(prefix[:4], "big")
    if 4 + n > limit:
        raise SyncReject("malformed", f"header length {n} exceeds the request bound {limit}")
    return 4 + n


def encode_push(items: list[PushItem]) -> bytes:
    """The body of a push request (see module docstring)."""
    header = msgpack.packb({"files": [{**_item_fields(it), "blocks": [[i, len(d)] for i, d in it.blocks]}
                                      for it in items]}, use_bin_type=True)
    return b"".join([len(header).to_bytes(4, "big"), header, *(d for it in items for _, d in it.blocks)])


class _File(Struct, frozen=True):
    """A file item of a push header or a stream header: manifest, sequence number, class, commit flag (unknown
    fields ignored). The path is only bounded here: the store checks it as a replica path (``path_escape``), the
    manifest's consistency (``bad_manifest``) and each block against it."""

    path: Annotated[str, Meta(max_length=4096)]
    size: ByteCount
    block_size: Annotated[int, Meta(ge=1, le=2**31)]
    hashes: bytes
    root: Annotated[bytes, Meta(min_length=BLOCK_HASH_BYTES, max_length=BLOCK_HASH_BYTES)]
    seq: Annotated[int, Meta(ge=0, le=COUNTER_MAX)]
    cls: Literal["sealed", "append", "sqlite"] = "sealed"
    commit: bool = True

    def item(self) -> PushItem:
        return PushItem(self.path, Manifest(self.size, self.block_size, self.hashes, self.root), self.seq, [],
                        self.commit, self.cls)


class _PushFile(_File, frozen=True):
    """A push header's file item with its blocks ``[[index, length], ...]`` (their bytes follow the header)."""

    blocks: Annotated[list[tuple[BlockIndex, Annotated[int, Meta(ge=0, le=2**31)]]], Meta(max_length=1 << 20)] = []


class _PushHeader(Struct, frozen=True):
    files: Annotated[list[_PushFile], Meta(max_length=MAX_FILES_PER_REQUEST)]


class _StreamHeader(Struct, frozen=True):
    """A block stream's header, its parts decoded in turn: ``origin`` and ``time`` before the signature is
    checked (``bad_signature`` when they do not decode), ``file`` and ``runs`` after it (``malformed``)."""

    origin: Raw = Raw()
    time: Raw = Raw()
    file: Raw = Raw()
    runs: Raw = Raw()


_Runs = Annotated[list[tuple[BlockIndex, Annotated[int, Meta(ge=0, le=2**32)]]], Meta(max_length=1 << 20)]
_PUSH_HEADER = msgspec.msgpack.Decoder(_PushHeader)
_STREAM_HEADER = msgspec.msgpack.Decoder(_StreamHeader)
_ORIGIN = msgspec.msgpack.Decoder(NodeId)
_TIME = msgspec.msgpack.Decoder(Annotated[float, Meta(ge=0.0, le=1e11)])  # Unix seconds, finite
_FILE = msgspec.msgpack.Decoder(_File)
_RUNS = msgspec.msgpack.Decoder(_Runs)


def _decode(decoder: msgspec.msgpack.Decoder[T], data: bytes | memoryview, what: str, reason: str = "malformed") -> T:
    """``data`` through ``decoder``; raises ``SyncReject(reason)`` naming ``what`` and the bad field."""
    try:
        return decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise SyncReject(reason, f"{what}: {exc}") from None
    except RecursionError:  # an unknown field's value nested deeper than msgspec skips
        raise SyncReject(reason, f"{what}: nested too deep") from None


def decode_push(body: bytes | bytearray) -> list[PushItem]:
    """Parse and shape-check a push body. Raises ``SyncReject("malformed")`` with what was wrong; manifest
    consistency, paths and block hashes are checked later per item (:meth:`ReplicaStore.apply`). Blocks are
    memoryviews into ``body`` (no copy)."""
    if len(body) < 4:
        raise SyncReject("malformed", "body shorter than its header length")
    n = int.from_bytes(body[:4], "big")
    if n > len(body) - 4:
        raise SyncReject("malformed", f"header length {n} exceeds the body")
    view = memoryview(body)
    header = _decode(_PUSH_HEADER, view[4 : 4 + n], "push header")
    pos = 4 + n
    out = []
    for f in header.files:
        item = f.item()
        for index, length in f.blocks:
            if pos + length > len(body):
                raise SyncReject("malformed", "block lengths exceed the body")
            item.blocks.append((index, view[pos : pos + length]))
            pos += length
        out.append(item)
    if pos != len(body):
        raise SyncReject("malformed", f"{len(body) - pos} bytes after the last block")
    return out


def _item_fields(it: PushItem) -> dict[str, Any]:
    m = it.manifest
    return {"path": it.path, "size": m.size, "block_size": m.block_size, "hashes": m.hashes, "root": m.root,
            "seq": it.seq, "cls": it.cls, "commit": it.commit}


# -- the block stream (data channel) ------------------------------------------------------------------------
STREAM_MAGIC = b"P2B1"
STREAM_PREFIX_BYTES = 8
"""Magic and a 4-byte big-endian header length, read before anything else."""
MAX_STREAM_HEADER = 2**20
"""Largest stream header accepted (a manifest of 32,768 blocks; 2,000 is the usual maximum)."""
SIGNATURE_BYTES = 64
MAX_FRAME = 2**20
"""Largest framed reply (ready or result) either side reads."""


def encode_stream_header(identity: Identity, item: PushItem, runs: list[tuple[int, int]], *,
                         now: float | None = None) -> bytes:
    """The opening of a block stream: ``P2B1``, the header length ``N`` (4 bytes, big-endian), ``N`` bytes of
    msgpack ``{origin, time, file: {manifest...}, runs: [[first block, count], ...]}``, then the origin's
    64-byte Ed25519 signature over ``p2pnode-sync-stream-v1\n`` + those ``N`` bytes. The blocks of ``runs``
    follow raw, in order; each is bound by its hash in the signed manifest."""
    header = msgpack.packb({"origin": identity.node_id, "time": time.time() if now is None else now,
                            "file": _item_fields(item), "runs": [list(r) for r in runs]}, use_bin_type=True)
    return b"".join([STREAM_MAGIC, len(header).to_bytes(4, "big"), header,
                     identity.sign(b"p2pnode-sync-stream-v1\n" + header)])


def stream_header_length(prefix: bytes) -> int:
    """The header length from the first :data:`STREAM_PREFIX_BYTES` bytes. Raises ``SyncReject`` (``malformed``
    for a wrong magic, ``oversized`` beyond :data:`MAX_STREAM_HEADER`)."""
    if len(prefix) != STREAM_PREFIX_BYTES or prefix[:4] != STREAM_MAGIC:
        raise SyncReject("malformed", "not a p2pnode block stream")
    n = int.from_bytes(prefix[4:], "big")
    if n > MAX_STREAM_HEADER:
        raise SyncReject("oversized", f"stream header of {n} bytes > {MAX_STREAM_HEADER}")
    return n


def decode_stream_header(header: bytes, signature: bytes, *, key_of: KeyOf, now: float,
                         max_skew_s: float) -> tuple[str, PushItem, list[tuple[int, int]]]:
    """Authenticate and parse a stream header: ``(origin, item, runs)``. Runs are checked against the manifest:
    in range, ascending and disjoint, so the stream that follows is at most the file's size. Raises
    :class:`SyncReject` (``malformed``, ``not_member``, ``bad_signature``, ``block_out_of_range``)."""
    h = _decode(_STREAM_HEADER, header, "stream header")
    if len(signature) != SIGNATURE_BYTES:
        raise SyncReject("bad_signature", f"signature of {len(signature)} bytes, not {SIGNATURE_BYTES}")
    origin = _decode(_ORIGIN, h.origin, "stream header origin", "bad_signature")
    sent = _decode(_TIME, h.time, "stream header time", "bad_signature")
    _check_origin(origin, sent, signature, b"p2pnode-sync-stream-v1\n" + header, key_of=key_of, now=now,
                  max_skew_s=max_skew_s)
    item = _decode(_FILE, h.file, "stream header file").item()
    runs = _decode(_RUNS, h.runs, "stream header runs")
    end = 0
    blocks = item.manifest.blocks if item.manifest.is_consistent() else 0
    for first, count in runs:
        if first < end or count < 1 or first + count > blocks:
            raise SyncReject("block_out_of_range", f"run {first}+{count} of {blocks} blocks (ascending, disjoint)")
        end = first + count
    return origin, item, list(runs)


def encode_frame(obj: Any) -> bytes:
    """A reply on the data channel: 4-byte big-endian length, then msgpack."""
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def encode_reply(results: list[dict[str, Any]]) -> bytes:
    """A push reply body: msgpack ``{"files": results}`` (each result as :meth:`ReplicaStore.apply` returns it)."""
    return msgpack.packb({"files": results}, use_bin_type=True)
