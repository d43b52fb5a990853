"""What every route group shares: bounded body reads, request authentication and the standard refusals.

Bodies are read within a byte limit and a deadline (:func:`read_bounded`); a state-changing request's
``x-p2pnode-auth`` header is checked by the trust surface (:func:`auth_refusal`); refused inputs answer with their
status and ``{"error": reason, "detail": ...}``.
"""

from __future__ import annotations

import msgspec
import trio
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import JSONResponse, Response

from ..errors import RejectedMessage, RejectReason
from ..inputs import InputError, content_length
from ..reqauth import AUTH_HEADER
from ._surfaces import TrustSurface

__all__ = ["BODY_DEADLINE_S", "auth_refusal", "input_refusal", "json_view", "no_catalog", "read_bounded",
           "refused_body", "request_target"]

BODY_DEADLINE_S = 10.0
"""Default time a client has to send a whole request body, seconds (gossip: ``gossip.request_timeout_s``)."""


async def read_bounded(request: Request, limit: int, deadline_s: float = BODY_DEADLINE_S) -> bytes:
    """The request body (at most ``limit`` bytes, within ``deadline_s`` seconds). Raises ``RejectedMessage``:
    ``OVERSIZED`` as soon as the declared or received length exceeds ``limit``; ``TOO_SLOW`` when the body is not
    complete by the deadline (a slowloris cannot hold a request slot or a file descriptor for long);
    ``MALFORMED`` when the client disconnects before the body is complete (starlette's ``ClientDisconnect``: an
    aborted upload is the client's business, counted by the caller like any bad body, never a traceback)."""
    try:
        declared = content_length(request.headers.get("content-length"))
    except InputError as exc:
        raise RejectedMessage(RejectReason.MALFORMED, exc.detail) from None
    if declared is not None and declared > limit:
        raise RejectedMessage(RejectReason.OVERSIZED, f"declared {declared} bytes > limit {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        with trio.fail_after(deadline_s):
            async for chunk in request.stream():
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise RejectedMessage(RejectReason.OVERSIZED, f"body exceeds limit {limit}")
    except ClientDisconnect:
        raise RejectedMessage(RejectReason.MALFORMED, f"client disconnected after {size} body bytes") from None
    except trio.TooSlowError:
        raise RejectedMessage(RejectReason.TOO_SLOW, f"{size} body bytes in {deadline_s:g} s") from None
    return b"".join(chunks)


def refused_body(exc: RejectedMessage) -> Response:
    """The answer to a body :func:`read_bounded` refused: 413 oversized, 408 too slow, else 400."""
    status = {RejectReason.OVERSIZED: 413, RejectReason.TOO_SLOW: 408}.get(exc.reason, 400)
    return JSONResponse({"error": exc.reason.value, "detail": exc.detail}, status_code=status)


def request_target(conn: HTTPConnection) -> str:
    """The request target the MAC covers: the path, and ``?query`` when there is one."""
    url = conn.url
    return url.path + (f"?{url.query}" if url.query else "")


def auth_refusal(trust: TrustSurface, request: Request, body: bytes, *, operator: bool = False) -> Response | None:
    """In token trust mode a state-changing request must carry a valid ``x-p2pnode-auth`` header
    (:mod:`p2pnode.reqauth`: an HMAC with a keyring token over method, receiving node, path, time, nonce and body;
    no secret on the wire): a 401 response naming the counted reason when it does not, else None. Open mode:
    None, except for ``operator`` routes (the voter roll), which need a voter's signature."""
    reason = trust.authenticate(request.headers.get(AUTH_HEADER), request.method, request_target(request), body,
                                operator=operator)
    if reason is None:
        return None
    return JSONResponse({"error": "unauthenticated", "reason": reason,
                         "detail": "this request needs the x-p2pnode-auth header: in token mode signed with a "
                                   "cluster token (P2PNODE_CLUSTER_TOKEN or the node's keyring), for the voter roll "
                                   "in open mode with a voter's node key (the p2pnode CLI run as the agent's user)"},
                        status_code=401)


def input_refusal(exc: InputError) -> Response:
    """The answer to a refused request input (:class:`p2pnode.inputs.InputError`): its status, with
    ``{"error": reason, "detail": ...}``."""
    return JSONResponse({"error": exc.reason, "detail": exc.detail}, status_code=exc.status)


def no_catalog() -> Response:
    """404: the jobs routes on an agent started without a catalog."""
    return JSONResponse({"error": "no catalog: start the agent with --catalog"}, status_code=404)


def json_view(obj: object) -> Response:
    """A JSON view, encoded by msgspec (several times faster than ``json.dumps`` on a 1,000-member ``/status``).
    Views hold only what the typed snapshot decoder accepted: finite numbers, text, no bytes (hex already)."""
    return Response(msgspec.json.encode(obj), media_type="application/json")
