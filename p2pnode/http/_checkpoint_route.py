"""The checkpoint routes (issue 41): ``GET /sync/checkpoint`` (a signed checkpoint) and ``GET /sync/checkpoint/file``
(a file of one, from an offset), read by members (:mod:`p2pnode.sync._checkpoints`).

Both need a member-signed request (``x-p2pnode-auth``, :mod:`p2pnode.reqauth`: a cluster token's HMAC in token mode,
a member's node key in open mode) whatever ``agent.read_token`` says: a checkpoint is a member's data, and its digest
is public in ``/sync/status``. The file is opened without following a symlink on any component
(:func:`p2pnode._files.open_beneath`) and served only when it is a regular file of the signed size."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .._files import open_beneath
from ..inputs import CheckpointFileQuery, CheckpointQuery, InputError, decode_query
from ..reqauth import AUTH_HEADER
from ..synccore import hash_file
from ._requests import input_refusal, request_target
from ._surfaces import SyncSurface, TrustSurface

__all__ = ["CHECKPOINT_PATHS", "checkpoint_routes"]

HASH_CACHE = 8
"""Files whose block hashes the route remembers (a fetcher asks for them once per holder it reads from)."""
READ_BYTES = 4 << 20
"""Bytes of a checkpoint file read (one thread hop) and handed to the HTTP server at a time."""
CHECKPOINT_PATHS = frozenset({"/sync/checkpoint", "/sync/checkpoint/file"})
"""The routes that authenticate their reader themselves (the read guard lets them through to do it once: a signed
request's nonce is spent on its first check)."""


def checkpoint_routes(sync: SyncSurface, trust: TrustSurface) -> list[Route]:
    """Checkpoints (issue 41): ``GET /sync/checkpoint`` and ``GET /sync/checkpoint/file``."""

    cache: dict[tuple[str, int], bytes] = {}

    def _hashes(key: tuple[str, int], fd: int, size: int, block_size: int) -> bytes:
        """The block hashes of the open file ``fd`` (blocking), the newest :data:`HASH_CACHE` remembered."""
        if key in cache:
            return cache[key]
        got = hash_file(f"/proc/self/fd/{fd}", block_size=block_size, size=size).hashes
        cache[key] = got
        while len(cache) > HASH_CACHE:
            del cache[next(iter(cache))]
        return got

    def refused(request: Request) -> Response | None:
        reason = trust.authenticate_read(request.headers.get(AUTH_HEADER), request.method, request_target(request),
                                         member_may=lambda node_id: True)
        if reason is None:
            return None
        trust.read_refusals += 1
        return JSONResponse({"error": "unauthorized", "reason": reason,
                             "detail": "checkpoint reads need a member-signed request (x-p2pnode-auth)"},
                            status_code=401)

    async def sync_checkpoint(request: Request) -> Response:
        """``GET /sync/checkpoint?digest=HEX``: a signed checkpoint this node holds (msgpack
        :class:`p2pnode.synccore.SignedCheckpoint`, checked by the reader: signature, placement, digest); 401
        unless member-signed, 404 when it holds none of that digest, 400 on a digest that is not 32 hex digits."""
        if (refusal := refused(request)) is not None:
            return refusal
        try:
            q = decode_query(request.query_params.multi_items(), CheckpointQuery)
        except InputError as exc:
            return input_refusal(exc)
        data = sync.checkpoint_bytes(bytes.fromhex(q.digest))
        if data is None:
            return JSONResponse({"error": "no such checkpoint here"}, status_code=404)
        return Response(data, media_type="application/msgpack")

    async def sync_checkpoint_file(request: Request) -> Response:
        """``GET /sync/checkpoint/file?digest=HEX&file=N&offset=BYTES``: the bytes of file ``N`` of a checkpoint
        this node holds whole (or signed), from ``offset`` to its signed size; the reader checks them against the
        signed manifest; with ``part=hashes`` the file's block hashes (32 bytes a block, which the reader checks
        against the signed root before it reads a block). 401 unless member-signed; 404 when it holds no such file,
        or the file is a symlink (on any component), not a regular file, or not of its signed size; 400 on a bad
        query."""
        if (refusal := refused(request)) is not None:
            return refusal
        try:
            q = decode_query(request.query_params.multi_items(), CheckpointFileQuery)
        except InputError as exc:
            return input_refusal(exc)
        found = sync.checkpoint_file(bytes.fromhex(q.digest), q.file)
        if found is None or q.offset > found[2]:
            return JSONResponse({"error": "no such checkpoint file here"}, status_code=404)
        base, rel, size, block_size = found
        try:
            fd = await trio.to_thread.run_sync(lambda: open_beneath(base, rel, size=size))
        except OSError:
            return JSONResponse({"error": "no such checkpoint file here"}, status_code=404)
        if q.part == "hashes":
            try:
                hashes = (await trio.to_thread.run_sync(sync.checkpoint_hashes, bytes.fromhex(q.digest), q.file)
                          or await trio.to_thread.run_sync(_hashes, (q.digest, q.file), fd, size, block_size))
            except (OSError, ValueError):
                return JSONResponse({"error": "no such checkpoint file here"}, status_code=404)
            finally:
                os.close(fd)
            return Response(hashes, media_type="application/octet-stream")

        async def chunks() -> AsyncIterator[bytes]:
            try:
                offset, left = q.offset, size - q.offset
                while left > 0:
                    data = await trio.to_thread.run_sync(os.pread, fd, min(left, READ_BYTES), offset)
                    if not data:
                        return  # shorter than signed (truncated meanwhile): the reply ends short, the reader sees it
                    left -= len(data)
                    offset += len(data)
                    yield data
            finally:
                os.close(fd)

        # Content-Length, not chunked framing: the reader's HTTP stack parses no chunk headers
        return StreamingResponse(chunks(), media_type="application/octet-stream",
                                 headers={"content-length": str(size - q.offset)})

    return [Route("/sync/checkpoint", sync_checkpoint), Route("/sync/checkpoint/file", sync_checkpoint_file)]
