"""The checkpoint routes (issue 41): ``GET /sync/checkpoint`` (a signed checkpoint) and ``GET /sync/checkpoint/file``
(a file of one, from an offset), read by members (:mod:`p2pnode.sync._checkpoints`)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..inputs import CheckpointFileQuery, CheckpointQuery, InputError, decode_query
from ._requests import input_refusal
from ._surfaces import SyncSurface

__all__ = ["checkpoint_routes"]


def checkpoint_routes(sync: SyncSurface) -> list[Route]:
    """Checkpoints (issue 41): ``GET /sync/checkpoint``."""

    async def sync_checkpoint(request: Request) -> Response:
        """``GET /sync/checkpoint?digest=HEX``: a signed checkpoint this node holds (msgpack
        :class:`p2pnode.synccore.SignedCheckpoint`, checked by the reader: signature, placement, digest); 404 when
        it holds none of that digest, 400 on a digest that is not 32 hex digits."""
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
        signed manifest root. 404 when it holds no such file, 400 on a bad query."""
        try:
            q = decode_query(request.query_params.multi_items(), CheckpointFileQuery)
        except InputError as exc:
            return input_refusal(exc)
        found = sync.checkpoint_file(bytes.fromhex(q.digest), q.file)
        if found is None or q.offset > found[1]:
            return JSONResponse({"error": "no such checkpoint file here"}, status_code=404)
        path, size = found

        async def chunks() -> AsyncIterator[bytes]:
            with await trio.to_thread.run_sync(open, path, "rb") as fh:
                fh.seek(q.offset)
                left = size - q.offset
                while left > 0:
                    data = await trio.to_thread.run_sync(fh.read, min(left, 1 << 20))
                    if not data:
                        return  # shorter than signed (replaced meanwhile): the reader sees it
                    left -= len(data)
                    yield data

        try:
            await trio.to_thread.run_sync(os.stat, path)
        except OSError:
            return JSONResponse({"error": "no such checkpoint file here"}, status_code=404)
        return StreamingResponse(chunks(), media_type="application/octet-stream")

    return [Route("/sync/checkpoint", sync_checkpoint), Route("/sync/checkpoint/file", sync_checkpoint_file)]
