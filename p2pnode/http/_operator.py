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

import json
import math
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["operator_routes"]

MAX_BODY = 8192
LOG_CHUNK = 2**20
_JOB_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}\Z")
_NODE = re.compile(r"^[a-z0-9]{1,64}\Z")


def operator_routes(agent: Any, read_bounded: Any, refused_body: Any, auth_refusal: Any) -> list[Route]:
    """The routes above for ``agent`` (the app's helpers passed in: bounded body reading, refusal responses and
    request authentication)."""

    async def body_of(request: Request) -> tuple[dict | None, Response | None]:
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
            raw = json.loads(body)
        except ValueError as exc:
            return None, JSONResponse({"error": "malformed", "detail": str(exc)}, status_code=400)
        if not isinstance(raw, dict):
            return None, JSONResponse({"error": "malformed", "detail": "expected a JSON object"}, status_code=400)
        return raw, None

    def bad(detail: str, status: int = 400) -> Response:
        return JSONResponse({"error": "malformed" if status == 400 else "rejected", "detail": detail},
                            status_code=status)

    async def cordon(request: Request) -> Response:
        raw, refusal = await body_of(request)
        if refusal is not None:
            return refusal
        assert raw is not None
        on = raw.get("cordon")
        if not isinstance(on, bool):
            return bad('expected {"cordon": true|false}')
        intents = agent.jobs.operator.intents
        section = intents.cordon(on)
        agent.publish_soon()
        return JSONResponse({"node_id": agent.node_id, **intents.view(), "changed": section.cordoned == on})

    async def drain(request: Request) -> Response:
        raw, refusal = await body_of(request)
        if refusal is not None:
            return refusal
        assert raw is not None
        deadline = raw.get("deadline_s", 0)
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline) \
                or not 0 <= deadline <= 30 * 86400:
            return bad("deadline_s: seconds between 0 and 30 days")
        agent.jobs.operator.intents.drain(float(deadline), time.time())
        agent.publish_soon()
        return JSONResponse({"node_id": agent.node_id, **agent.jobs.operator.intents.view()})

    async def run(request: Request) -> Response:
        raw, refusal = await body_of(request)
        if refusal is not None:
            return refusal
        assert raw is not None
        template, params = raw.get("template"), raw.get("params", {})
        node, tag = raw.get("node", "") or "", raw.get("tag", "") or ""
        if not isinstance(template, str) or not isinstance(params, dict) or not isinstance(node, str) \
                or not isinstance(tag, str) or (node and not _NODE.match(node)) or len(tag) > 128:
            return bad('expected {"template": NAME, "params": {...}, "node": ID, "tag": TAG}')
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
        except ValueError as exc:
            return bad(str(exc), 429)
        agent.publish_soon()
        return JSONResponse({"id": req.id, "job_id": f"run-{req.id}", "node_id": agent.node_id})

    async def stop(request: Request) -> Response:
        raw, refusal = await body_of(request)
        if refusal is not None:
            return refusal
        assert raw is not None
        job_id = raw.get("job_id")
        if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
            return bad('expected {"job_id": ID}')
        if not agent.jobs.operator.stop_job(job_id):
            return JSONResponse({"error": "not_here", "detail": f"job {job_id} does not run on {agent.node_id}"},
                                status_code=404)
        return JSONResponse({"stopped": job_id, "node_id": agent.node_id})

    async def logs(request: Request) -> Response:
        job_id = request.query_params.get("job_id", "")
        offset = request.query_params.get("offset", "0")
        if not _JOB_ID.match(job_id) or not offset.isdigit():
            return bad("?job_id=<id>&offset=<bytes> are required")
        if agent.jobs is None:
            return JSONResponse({"error": "no catalog: start the agent with --catalog"}, status_code=404)
        path = agent.jobs.runner.log_path(job_id)
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                f.seek(min(int(offset), size))
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
