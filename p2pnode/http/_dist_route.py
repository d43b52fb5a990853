"""Distribution's routes (issue 40): ``POST /sync/dist/publication|blocks|list`` (members fetch publications and
their blocks, :mod:`p2pnode.sync._distserve`) and ``POST /sync/publish`` (the operator publishes a file)."""

from __future__ import annotations

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from ..errors import RejectedMessage
from ..sync import BLOCKS_PATH, LIST_PATH, MAX_PUBLISH_BODY, PUBLICATION_PATH, BlockStream
from ._requests import auth_refusal, read_bounded, refused_body
from ._surfaces import SyncSurface, TrustSurface

__all__ = ["dist_routes"]


class _BlocksReply(StreamingResponse):
    """Blocks streamed a piece at a time (:class:`p2pnode.sync.BlockStream`), with a Content-Length (the fetcher's
    HTTP stack parses no chunk headers); the stream's serving slot is released and its file closed when the
    response ends, whichever way (sent, the client gone, cancelled, a client too slow to take a piece within
    :meth:`~p2pnode.sync.BlockStream.send_timeout_s`: the reply is cut, counted ``too_slow``)."""

    def __init__(self, reply: BlockStream) -> None:
        super().__init__(reply.chunks(), media_type="application/octet-stream",
                         headers={"content-length": str(reply.length)})
        self.reply = reply

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def timed(message: Message) -> None:
            with trio.fail_after(self.reply.send_timeout_s(len(message.get("body", b"")))):
                await send(message)

        try:
            await super().__call__(scope, receive, timed)
        except trio.TooSlowError:
            self.reply.cut_slow()
        finally:
            self.reply.close()
            with trio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]  # its file, not at GC


def dist_routes(sync: SyncSurface, trust: TrustSurface) -> list[Route]:
    """Distribution: ``POST /sync/publish`` and ``POST /sync/dist/publication|blocks|list``."""

    async def sync_dist(request: Request) -> Response:
        """A member asks for a publication or its blocks (signed like a push; :mod:`p2pnode.sync._distribute`)."""
        try:
            body = await read_bounded(request, 4096)
        except RejectedMessage as exc:
            return refused_body(exc)
        status, reply = await sync.serve_distribution(request.url.path, request.headers, body)
        if isinstance(reply, bytes):
            return Response(reply, status_code=status, media_type="application/octet-stream")
        return _BlocksReply(reply)

    async def sync_publish(request: Request) -> Response:
        """``p2pnode sync publish``: a publication signed by an operator key this node pins, and the file's path."""
        try:
            body = await read_bounded(request, MAX_PUBLISH_BODY)
        except RejectedMessage as exc:
            return refused_body(exc)
        if (refusal := auth_refusal(trust, request, body)) is not None:
            return refusal
        status, answer = await sync.publish_file(body)
        return JSONResponse(answer, status_code=status)

    return [Route(PUBLICATION_PATH, sync_dist, methods=["POST"]), Route(BLOCKS_PATH, sync_dist, methods=["POST"]),
            Route(LIST_PATH, sync_dist, methods=["POST"]), Route("/sync/publish", sync_publish, methods=["POST"])]
