"""Operator routes (issue 16): cordon, drain, one-off runs, job stop, job logs. State-changing routes take a signed
request in token mode as ``POST /signals`` does (a cluster token's HMAC, ``x-p2pnode-auth``; 401 otherwise) and are
open in open mode (a trusted LAN); bodies are small JSON, bounded and validated.

* ``POST /operator/cordon`` ``{"cordon": bool}``: (un)cordon this node; uncordon also ends a drain.
* ``POST /operator/drain`` ``{"deadline_s": seconds}``: cordon, and stop preemptible work after the deadline.
* ``POST /jobs/run`` ``{"template", "params"?, "node"?, "tag"?}``: a one-off run kept on this node until a leader
  places it (``run-<id>``); 422 for an unknown template, undeclared or ill-typed parameters.
* ``POST /jobs/stop`` ``{"job_id"}``: stop a job running here (404 when it does not run here).
* ``GET /jobs/logs?job_id=&offset=``: up to 1 MiB of a job's log from ``offset`` (bytes); ``x-log-size`` gives
  the file's size, for ``--follow``.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..inputs import (
    CordonBody,
    DrainBody,
    InputError,
    LogsQuery,
    RunBody,
    StopBody,
    decode_json,
    decode_query,
)
from ..node._operator import InvalidIntent

T = TypeVar("T")

__all__ = ["operator_routes"]

MAX_BODY = 8192
LOG_CHUNK = 2**20


def operator_routes(agent: Any, read_bounded: Any, refused_body: Any, auth_refusal: Any) -> list[Route]:
    """The routes above for ``agent`` (the app's helpers passed in: bounded body reading, refusal responses and
    request authentication)."""

    async def body_of(request: Request, kind: type[T]) -> tuple[T | None, Response | None]:
        """The request's body decoded as ``kind`` (:mod:`p2pnode.inputs`), or the response refusing it: 413/408
        for a body too large or too slow, 401 unauthenticated, 404 without a catalog, 400 for a body that is not
        a JSON object of ``kind``'s fields within their bounds."""
        from ..errors import RejectedMessage

        try:
            body = await read_bounded(request, MAX_BODY)
        except RejectedMessage as exc:
            return None, refused_body(exc)
        if (refusal := auth_refusal(agent, request, body)) is not None:
            return None, refusal
        if agent.jobs is None:
            return None, JSONResponse({"error": "no catalog: start the agent with --catalog"}, status_code=404)
        try:
            return decode_json(body, kind), None
        except InputError as exc:
            return None, JSONResponse({"error": "malformed", "detail": exc.detail}, status_code=400)

    def bad(detail: str, status: int = 400) -> Response:
        return JSONResponse({"error": "malformed" if status == 400 else "rejected", "detail": detail},
                            status_code=status)

    async def cordon(request: Request) -> Response:
        req, refusal = await body_of(request, CordonBody)
        if req is None:
            return refusal
        on = req.cordon
        intents = agent.jobs.operator.intents
        section = intents.cordon(on)
        agent.publish_soon()
        return JSONResponse({"node_id": agent.node_id, **intents.view(), "changed": section.cordoned == on})

    async def drain(request: Request) -> Response:
        req, refusal = await body_of(request, DrainBody)
        if req is None:
            return refusal
        agent.jobs.operator.intents.drain(req.deadline_s, time.time())
        agent.publish_soon()
        return JSONResponse({"node_id": agent.node_id, **agent.jobs.operator.intents.view()})

    async def run(request: Request) -> Response:
        req, refusal = await body_of(request, RunBody)
        if req is None:
            return refusal
        template, params, node, tag = req.template, req.params, req.node, req.tag
        t = agent.jobs.catalog.templates.get(template)
        if t is None:
            return bad(f"template {template!r} is not in the catalog", 422)
        try:
            checked = t.param_values(params)
        except (ValueError, TypeError) as exc:
            return bad(str(exc), 422)
        try:
            req = agent.jobs.operator.intents.add_run(template, {k: params[k] for k in params if k in checked}, node,
                                                      tag, agent.node_id, time.time())
        except InvalidIntent as exc:  # a value the operator file or the snapshot would refuse: never kept
            return bad(str(exc), 422)
        except ValueError as exc:  # runs already waiting here: MAX_RUNS
            return bad(str(exc), 429)
        agent.publish_soon()
        return JSONResponse({"id": req.id, "job_id": f"run-{req.id}", "node_id": agent.node_id})

    async def stop(request: Request) -> Response:
        req, refusal = await body_of(request, StopBody)
        if req is None:
            return refusal
        job_id = req.job_id
        if not agent.jobs.operator.stop_job(job_id):
            return JSONResponse({"error": "not_here", "detail": f"job {job_id} does not run on {agent.node_id}"},
                                status_code=404)
        return JSONResponse({"stopped": job_id, "node_id": agent.node_id})

    async def logs(request: Request) -> Response:
        try:
            q = decode_query(request.query_params.multi_items(), LogsQuery)
        except InputError as exc:
            return bad(f"?job_id=<id>&offset=<bytes> are required: {exc.detail}")
        job_id = q.job_id
        if agent.jobs is None:
            return JSONResponse({"error": "no catalog: start the agent with --catalog"}, status_code=404)
        path = agent.jobs.runner.log_path(job_id)
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                f.seek(min(q.offset, size))
                data = f.read(LOG_CHUNK)
        except FileNotFoundError:
            return JSONResponse({"error": "no_log", "detail": f"no log of job {job_id} on {agent.node_id}"},
                                status_code=404)
        return Response(data, media_type="text/plain; charset=utf-8", headers={"x-log-size": str(size)})

    return [
        Route("/operator/cordon", cordon, methods=["POST"]),
        Route("/operator/drain", drain, methods=["POST"]),
        Route("/jobs/run", run, methods=["POST"]),
        Route("/jobs/stop", stop, methods=["POST"]),
        Route("/jobs/logs", logs),
    ]
