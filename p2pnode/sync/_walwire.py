"""A live database's WAL segments on the wire: a signed header, then the pages (or a whole snapshot).

A **segment** moves a replica from one transaction boundary of its source to a later one:

* ``frames``: the pages the source's write-ahead log changed since the previous segment, each page once as of
  the segment's last commit (:func:`p2pnode.synccore.collapse_frames`), and the database size after it;
* ``snapshot``: the whole database at one commit (at start, after a reset of the log that lost frames, after a
  change of page size, on a schedule).

Bytes: a 4-byte big-endian header length ``N``, ``N`` bytes of msgpack header (:class:`SegmentHeader`), the
origin's 64-byte Ed25519 signature over ``p2pnode-walseg-v1\\n`` + those ``N`` bytes, then the payload
(``payload_bytes`` bytes: the pages in header order, or the snapshot), bound by its BLAKE3 in the signed header.
A ``frames`` payload may be deflated (``encoding = "zlib"``, level 1, sent only when smaller: the free space of
pages and their headers compress, about 0.83× for 300-byte random records); it must inflate to exactly
``len(pages) × page_size`` bytes, and the receiver inflates no further than that.
Segments are ordered by ``seq`` (the origin's persistent sync sequence, so it grows across restarts): a
``frames`` segment names the ``prev_seq`` it follows and applies only on the replica that segment left; a
``snapshot`` applies over any older replica. So a replayed, reordered or gapped segment is refused
(``stale_version``, ``out_of_order``), never applied.
"""

from __future__ import annotations

import zlib
from typing import Annotated, Literal

import blake3
import msgspec
from msgspec import Meta, Struct

from ..identity import Identity, verify_signature
from ..snapshot import COUNTER_MAX, NodeId
from ._refuse import SyncReject
from ._wire import KeyOf

__all__ = ["MAX_SEGMENT_HEADER_BYTES", "MAX_SEGMENT_PAGES", "SEGMENT_TAG", "SegmentHeader", "decode_segment",
           "deflate_pages", "encode_segment", "inflate_pages", "payload_hash"]

SEGMENT_TAG = b"p2pnode-walseg-v1\n"
MAX_SEGMENT_HEADER_BYTES = 1 << 20
MAX_SEGMENT_PAGES = 1 << 16
"""Most pages one ``frames`` segment carries (256 MiB of 4 KiB pages); a sender with more sends a snapshot."""
SIGNATURE_BYTES = 64
_U32 = Annotated[int, Meta(ge=0, le=0xFFFFFFFF)]


class SegmentHeader(Struct, frozen=True):
    """What a segment claims (see module docstring). ``pages``: the page numbers of a ``frames`` segment, in
    payload order (empty for a snapshot); ``db_pages``: the database size in pages after it; ``salts`` and
    ``frames``: the source's WAL position it brings the replica to (for logs and status; the order is ``seq``);
    ``sent_at``: the origin's Unix seconds."""

    origin: NodeId
    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    kind: Literal["frames", "snapshot"]
    seq: Annotated[int, Meta(ge=1, le=COUNTER_MAX)]
    prev_seq: Annotated[int, Meta(ge=0, le=COUNTER_MAX)]
    page_size: Annotated[int, Meta(ge=512, le=65536)]
    db_pages: Annotated[int, Meta(ge=1, le=2**32 - 2)]
    pages: Annotated[list[Annotated[int, Meta(ge=1, le=2**32 - 2)]], Meta(max_length=MAX_SEGMENT_PAGES)]
    payload_bytes: Annotated[int, Meta(ge=0, le=2**62)]
    payload_hash: Annotated[bytes, Meta(min_length=32, max_length=32)]
    salts: tuple[_U32, _U32]
    frames: _U32
    sent_at: Annotated[float, Meta(ge=0.0, le=1e11)]
    encoding: Literal["raw", "zlib"] = "raw"


_DECODER = msgspec.msgpack.Decoder(SegmentHeader)
_ENCODER = msgspec.msgpack.Encoder()


def encode_segment(identity: Identity, header: SegmentHeader) -> bytes:
    """The signed head of a segment (length, header, signature); the payload follows it on the wire."""
    if header.origin != identity.node_id:
        raise ValueError("a segment is signed by its origin")
    body = _ENCODER.encode(header)
    return len(body).to_bytes(4, "big") + body + identity.sign(SEGMENT_TAG + body)


def decode_segment(head: bytes | memoryview, *, key_of: KeyOf) -> tuple[SegmentHeader, int]:
    """Authenticate and parse a segment's head: ``(header, bytes consumed)`` (the payload starts there). Raises
    :class:`SyncReject`: ``malformed`` (lengths, fields), ``oversized`` (a header beyond 1 MiB), ``not_member``
    (an origin whose key this node does not hold), ``bad_signature``, ``bad_segment`` (a payload length that
    does not fit the kind: pages × page size, or the database size for a snapshot)."""
    mv = memoryview(head)
    if len(mv) < 4:
        raise SyncReject("malformed", "segment shorter than its length prefix")
    n = int.from_bytes(mv[:4], "big")
    if n > MAX_SEGMENT_HEADER_BYTES:
        raise SyncReject("oversized", f"segment header of {n} bytes")
    if len(mv) < 4 + n + SIGNATURE_BYTES:
        raise SyncReject("malformed", "segment shorter than its header and signature")
    body = bytes(mv[4:4 + n])
    sig = bytes(mv[4 + n:4 + n + SIGNATURE_BYTES])
    try:
        h = _DECODER.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise SyncReject("malformed", f"segment header: {exc}") from None
    key = key_of(h.origin)
    if key is None:
        raise SyncReject("not_member", f"no key for {h.origin!r}")
    if not verify_signature(key, sig, SEGMENT_TAG + body):
        raise SyncReject("bad_signature", f"segment signature does not verify for {h.origin!r}")
    want = h.db_pages * h.page_size if h.kind == "snapshot" else len(h.pages) * h.page_size
    deflated = h.encoding == "zlib" and h.kind == "frames" and h.payload_bytes < want
    if (h.payload_bytes != want and not deflated) or (h.kind == "snapshot" and (h.pages or h.prev_seq
                                                                                 or h.encoding != "raw")):
        raise SyncReject("bad_segment", f"{h.kind} payload of {h.payload_bytes} bytes, expected {want}")
    if h.kind == "frames" and (h.prev_seq >= h.seq or len(set(h.pages)) != len(h.pages)
                               or any(p > h.db_pages for p in h.pages)):
        raise SyncReject("bad_segment", "frames segment: prev_seq, repeated pages or pages past the database")
    return h, 4 + n + SIGNATURE_BYTES


def inflate_pages(h: SegmentHeader, data: bytes | memoryview) -> bytes | memoryview:
    """The pages of a ``frames`` segment whose payload matched its hash: ``data`` itself when raw, else inflated
    to exactly ``len(pages) × page_size`` bytes (no further). Raises ``SyncReject("bad_segment")``."""
    if h.encoding == "raw":
        return data
    want = len(h.pages) * h.page_size
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, want)
    except zlib.error as exc:
        raise SyncReject("bad_segment", f"segment {h.seq}: {exc}") from None
    if len(out) != want or not d.eof or d.unconsumed_tail:
        raise SyncReject("bad_segment", f"segment {h.seq}: inflates to other than {want} bytes")
    return out


def deflate_pages(data: bytes) -> bytes | None:
    """``data`` deflated (zlib level 1), or None when that is not smaller."""
    out = zlib.compress(data, 1)
    return out if len(out) < len(data) else None


def payload_hash(data: bytes | memoryview) -> bytes:
    """BLAKE3-256 of a payload (what ``payload_hash`` in the header holds)."""
    return blake3.blake3(data).digest()
