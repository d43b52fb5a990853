"""Sync requests on the wire: the ``POST /sync/push`` body and its Ed25519 request signature.

Body: a 4-byte big-endian header length ``N``, ``N`` bytes of msgpack header, then the blocks' bytes back to
back in header order (raw, so 8 MiB of blocks is one copy, not a msgpack round trip)::

    {"files": [{"path": str, "size": int, "block_size": int, "hashes": bytes, "root": bytes, "seq": int,
                "cls": "sealed" | "append" | "sqlite", "commit": bool, "blocks": [[index, length], ...]}, ...]}

The lengths must add up to the rest of the body exactly (``malformed`` otherwise).

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
from dataclasses import dataclass, field
from typing import Any

import blake3
import msgpack

from ..identity import Identity, verify_signature
from ..inputs import unix_seconds
from ._manifest import BLOCK_HASH_BYTES, Manifest
from ._refuse import SyncReject

__all__ = ["CLASSES", "PUSH_PATH", "KeyOf", "PushAuth", "PushItem", "decode_frame_body", "decode_push", "decode_reply",
           "decode_stream_header", "encode_frame", "encode_push", "encode_reply", "encode_stream_header",
           "header_part_length", "precheck_headers", "sign_headers", "stream_header_length", "verify_headers"]

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


@dataclass(slots=True)
class PushItem:
    """One file in a push request or a block stream: its ``path`` (relative, POSIX), ``manifest``, sequence
    number ``seq`` (grows with each version the origin offers), ``blocks`` ``[(index, bytes)]``, whether to
    ``commit`` once every block is present, and its class ``cls`` (one of :data:`CLASSES`)."""

    path: str
    manifest: Manifest
    seq: int
    blocks: list[tuple[int, bytes | memoryview]] = field(default_factory=list)
    commit: bool = True
    cls: str = "sealed"
    prehashed: set[int] = field(default_factory=set)
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


@dataclass(frozen=True, slots=True)
class PushAuth:
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


def decode_push(body: bytes | bytearray) -> list[PushItem]:
    """Parse and shape-check a push body. Raises ``SyncReject("malformed")`` with what was wrong; manifest
    consistency, paths and block hashes are checked later per item (:meth:`ReplicaStore.apply`). Blocks are
    memoryviews into ``body`` (no copy)."""
    if len(body) < 4:
        raise SyncReject("malformed", "body shorter than its header length")
    n = int.from_bytes(body[:4], "big")
    if n > len(body) - 4:
        raise SyncReject("malformed", f"header length {n} exceeds the body")
    try:
        raw = msgpack.unpackb(body[4 : 4 + n], raw=False, strict_map_key=True, max_bin_len=n, max_str_len=4096,
                              max_array_len=1 << 20, max_map_len=64)
    except Exception as exc:  # msgpack raises several types for bad input; all are the sender's fault
        raise SyncReject("malformed", f"{exc.__class__.__name__}: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("files"), list):
        raise SyncReject("malformed", "header must be a map with a 'files' list")
    if len(raw["files"]) > MAX_FILES_PER_REQUEST:
        raise SyncReject("malformed", f"more than {MAX_FILES_PER_REQUEST} files in one request")
    view = memoryview(body)
    pos = 4 + n
    out = []
    for f in raw["files"]:
        item = _parse_item(f)
        blocks = f.get("blocks", [])
        if not _int_pairs(blocks):
            raise SyncReject("malformed", "blocks must be [[index, length], ...]")
        for index, length in blocks:
            if pos + length > len(body):
                raise SyncReject("malformed", "block lengths exceed the body")
            item.blocks.append((index, view[pos : pos + length]))
            pos += length
        out.append(item)
    if pos != len(body):
        raise SyncReject("malformed", f"{len(body) - pos} bytes after the last block")
    return out


def _int_pairs(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in b)
        and b[1] >= 0 for b in v)


def _parse_item(f: Any) -> PushItem:
    """A file item of a push header or a stream header (manifest, seq, class, commit), without its blocks.
    Raises ``SyncReject("malformed")``."""
    if not isinstance(f, dict):
        raise SyncReject("malformed", "a file item is not a map")
    try:
        path, size, bs, hashes, root, seq = f["path"], f["size"], f["block_size"], f["hashes"], f["root"], f["seq"]
    except KeyError as exc:
        raise SyncReject("malformed", f"file item lacks {exc}") from None
    if not (isinstance(path, str) and all(isinstance(v, int) and not isinstance(v, bool) for v in (size, bs, seq))
            and isinstance(hashes, bytes) and isinstance(root, bytes) and len(root) == BLOCK_HASH_BYTES
            and size >= 0 and bs > 0 and seq >= 0):
        raise SyncReject("malformed", "file item fields have the wrong types")
    cls = f.get("cls", "sealed")
    if cls not in CLASSES:
        raise SyncReject("malformed", f"unknown class {cls!r}")
    return PushItem(path, Manifest(size, bs, hashes, root), seq, [], bool(f.get("commit", True)), cls)


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
    try:
        raw = msgpack.unpackb(header, raw=False, strict_map_key=True, max_bin_len=len(header), max_str_len=4096,
                              max_array_len=1 << 20, max_map_len=64)
    except Exception as exc:  # msgpack raises several types for bad input; all are the sender's fault
        raise SyncReject("malformed", f"{exc.__class__.__name__}: {exc}") from None
    if not isinstance(raw, dict):
        raise SyncReject("malformed", "stream header must be a map")
    origin, sent, runs = raw.get("origin"), raw.get("time"), raw.get("runs")
    if not (isinstance(origin, str) and 0 < len(origin) <= 64 and isinstance(sent, (int, float))
            and not isinstance(sent, bool) and len(signature) == SIGNATURE_BYTES):
        raise SyncReject("bad_signature", "missing or malformed origin, time or signature")
    _check_origin(origin, float(sent), signature, b"p2pnode-sync-stream-v1\n" + header, key_of=key_of, now=now,
                  max_skew_s=max_skew_s)
    item = _parse_item(raw.get("file"))
    if runs is None or not _int_pairs(runs):
        raise SyncReject("malformed", "runs must be [[first block, count], ...]")
    end = 0
    blocks = item.manifest.blocks if item.manifest.is_consistent() else 0
    for first, count in runs:
        if first < end or count < 1 or first + count > blocks:
            raise SyncReject("block_out_of_range", f"run {first}+{count} of {blocks} blocks (ascending, disjoint)")
        end = first + count
    return origin, item, [(a, b) for a, b in runs]


def encode_frame(obj: Any) -> bytes:
    """A reply on the data channel: 4-byte big-endian length, then msgpack."""
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def decode_frame_body(body: bytes) -> dict[str, Any]:
    """The map of a frame (its length already read and bounded by :data:`MAX_FRAME`). Raises ``ValueError``."""
    try:
        raw = msgpack.unpackb(body, raw=False, max_bin_len=1 << 20, max_str_len=1 << 16, max_array_len=1 << 22)
    except Exception as exc:
        raise ValueError(f"undecodable frame: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("frame is not a map")
    return raw


def encode_reply(results: list[dict[str, Any]]) -> bytes:
    """A push reply body: msgpack ``{"files": results}`` (each result as :meth:`ReplicaStore.apply` returns it)."""
    return msgpack.packb({"files": results}, use_bin_type=True)


def decode_reply(body: bytes) -> list[dict[str, Any]]:
    """The per-file results of a push reply. Raises ``ValueError`` when the reply is not one."""
    try:
        raw = msgpack.unpackb(body, raw=False, max_bin_len=1 << 20, max_str_len=1 << 16, max_array_len=1 << 22)
    except Exception as exc:
        raise ValueError(f"undecodable sync reply: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("files"), list):
        raise ValueError("sync reply is not {files: [...]}")
    return [r for r in raw["files"] if isinstance(r, dict) and isinstance(r.get("path"), str)]

