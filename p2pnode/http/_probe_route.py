"""``POST /probe``: the stream fallback of SWIM probes (memberlist's TCP ping), served bare like ``POST /gossip``.

A member whose UDP probe got no ack sends the same sealed ping here (:mod:`p2pnode.gossip._probewire`). The body
is read within :data:`~p2pnode.gossip.MAX_PROBE_PACKET_BYTES` (a larger declared or received body: 413) and
``gossip.request_timeout_s`` (408; a client gone mid-body: 400), each refusal counted in the codec's refusals by
reason (``oversized``, ``too_slow``, ``malformed``); then the probe driver opens it (rate limit per source host, MAC,
receiver, freshness, replay: :meth:`p2pnode.drivers._gossip_probe.ProbeDriver.handle_stream`) and the answer is
``200 application/octet-stream`` with the sealed ack (never larger than the request), or ``204`` when there is
none (refused and counted, or nothing to answer). With ``gossip.probes`` off there is no such
route (404, as any unknown path).
"""

from __future__ import annotations

import json

from starlette.types import Receive, Scope, Send

from ..errors import RejectedMessage, RejectReason
from ..gossip import MAX_PROBE_PACKET_BYTES
from ..inputs import InputError, content_length
from ._gossip_route import _read_body, _reply
from ._surfaces import HttpCounters, ProbeSurface

__all__ = ["serve_probe"]


async def serve_probe(probes: ProbeSurface, counters: HttpCounters, timeout_s: float,
                      scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one ``POST /probe`` (see module docstring); ``timeout_s``: the body's deadline, seconds."""
    header: str | None = None
    chunked = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            header = value.decode("latin-1")
        elif name == b"transfer-encoding":
            chunked = True
    client = scope.get("client")
    host = client[0] if client else ""
    try:
        try:
            declared = None if chunked else content_length(header)
        except InputError as exc:
            raise RejectedMessage(RejectReason.MALFORMED, exc.detail) from None
        body = await _read_body(receive, declared, MAX_PROBE_PACKET_BYTES, timeout_s)
    except RejectedMessage as exc:
        probes.codec.rejected[exc.reason.value] += 1
        status = {"oversized": 413, "too_slow": 408}.get(exc.reason.value, 400)
        detail = json.dumps({"error": exc.reason.value, "detail": str(exc)}).encode()
        await _reply(counters, send, status, detail, "application/json")
        return
    reply = probes.handle_stream(body, host)
    if reply is None:
        await _reply(counters, send, 204, b"", "application/octet-stream")
        return
    await _reply(counters, send, 200, reply, "application/octet-stream")
