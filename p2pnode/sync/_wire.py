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
can only rewrite blocks with the bytes their manifest already fixes.

The reply is msgpack ``{"files": [{"path", "status", "need", ...}]}`` (see :meth:`ReplicaStore.apply`), with
status 200 when every item was accepted, or the first rejection's 4xx/507 otherwise (the body still lists every
item so the sender keeps the progress made).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import blake3
import msgpack

from ..identity import Identity, verify_signature
from ._manifest import BLOCK_HASH_BYTES, Manifest
from ._store import PushItem, SyncReject

__all__ = ["CLASSES", "decode_push", "decode_reply", "encode_push", "encode_reply", "sign_headers", "verify_headers"]

CLASSES = ("sealed", "append", "sqlite")
MAX_FILES_PER_REQUEST = 4096
ORIGIN_HEADER = "x-p2pnode-origin"
TIME_HEADER = "x-p2pnode-time"
SIG_HEADER = "x-p2pnode-signature"


def _header_part(body: bytes) -> bytes | memoryview:
    """The part of a push body the signature covers: the length prefix and the msgpack header (manifests with
    their block hashes). The blocks after it are bound by those hashes, each checked on arrival, so a block
    corrupted in flight costs that block (``bad_block_hash``), not the whole request."""
    if len(body) >= 4:
        n = int.from_bytes(body[:4], "big")
        if n <= len(body) - 4:
            return memoryview(body)[: 4 + n]
    return body


def _signed_bytes(method: str, path: str, origin: str, ts: str, body: bytes) -> bytes:
    digest = blake3.blake3(_header_part(body)).hexdigest()
    return "\n".join(("p2pnode-sync-v1", method.upper(), path, origin, ts, digest)).encode()


def sign_headers(identity: Identity, method: str, path: str, body: bytes, *, now: float | None = None) -> dict[str, str]:
    """The three auth headers for a request of ``identity``'s node."""
    ts = f"{time.time() if now is None else now:.3f}"
    sig = identity.sign(_signed_bytes(method, path, identity.node_id, ts, body))
    return {ORIGIN_HEADER: identity.node_id, TIME_HEADER: ts, SIG_HEADER: base64.b64encode(sig).decode()}


def verify_headers(headers: Any, method: str, path: str, body: bytes, *, key_of, now: float, max_skew_s: float) -> str:
    """The authenticated origin of a request. ``key_of(origin)`` returns the member's public key (bytes) or None
    when it is not a member. Raises :class:`SyncReject` (``not_member``, ``bad_signature``)."""
    origin = headers.get(ORIGIN_HEADER, "")
    ts = headers.get(TIME_HEADER, "")
    sig_b64 = headers.get(SIG_HEADER, "")
    if not origin or not ts or not sig_b64 or len(origin) > 64 or len(ts) > 32 or len(sig_b64) > 128:
        raise SyncReject("bad_signature", "missing or oversized auth headers")
    key = key_of(origin)
    if key is None:
        raise SyncReject("not_member", f"{origin!r} is not a member of this cluster")
    try:
        sent = float(ts)
        sig = base64.b64decode(sig_b64, validate=True)
    except ValueError:
        raise SyncReject("bad_signature", "unparseable time or signature") from None
    if abs(now - sent) > max_skew_s:
        raise SyncReject("bad_signature", f"request time {sent:.0f} is {now - sent:+.0f} s from ours")
    if not verify_signature(key, sig, _signed_bytes(method, path, origin, ts, body)):
        raise SyncReject("bad_signature", f"signature does not verify for {origin!r}")
    return origin


def encode_push(items: list[PushItem]) -> bytes:
    """The body of a push request (see module docstring)."""
    header = msgpack.packb({"files": [
        {"path": it.path, "size": it.manifest.size, "block_size": it.manifest.block_size, "hashes": it.manifest.hashes,
         "root": it.manifest.root, "seq": it.seq, "cls": it.cls, "commit": it.commit,
         "blocks": [[i, len(d)] for i, d in it.blocks]}
        for it in items
    ]}, use_bin_type=True)
    return b"".join([len(header).to_bytes(4, "big"), header, *(d for it in items for _, d in it.blocks)])


def decode_push(body: bytes) -> list[PushItem]:
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
        blocks = f.get("blocks", [])
        if not isinstance(blocks, list) or not all(
            isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in b)
            and b[1] >= 0 for b in blocks
        ):
            raise SyncReject("malformed", "blocks must be [[index, length], ...]")
        data = []
        for index, length in blocks:
            if pos + length > len(body):
                raise SyncReject("malformed", "block lengths exceed the body")
            data.append((index, view[pos : pos + length]))
            pos += length
        out.append(PushItem(path, Manifest(size, bs, hashes, root), seq, data, bool(f.get("commit", True)), cls))
    if pos != len(body):
        raise SyncReject("malformed", f"{len(body) - pos} bytes after the last block")
    return out


def encode_reply(results: list[dict[str, Any]]) -> bytes:
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

