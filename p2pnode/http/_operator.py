"""Operator routes (issue 16): cordon, drain, one-off runs, job stop, job logs. State-changing routes take a signed
request in token mode as ``POST /signals`` does (a cluster token's HMAC, ``x-p2pnode-auth``; 401 otherwise) and are
open in open mode (a trusted LAN); bodies are small JSON, bounded and validated.

* ``POST /operator/cordon`` ``{"cordon": bool}``: (un)cordon this node; uncordon also ends a drain.
* ``POST /operator/drain`` ``{"deadline_s": seconds}``: cordon, and stop preemptible work after the deadline.
* ``POST /jobs/run`` ``{"template", "params"?, "node"?, "tag"?}``: a one-off run kept on this node until a leader
  places it (``run-<id>``); 422 for an unknown template, undeclared or ill-typed parameters.
* ``POST /jobs/stop`` ``{"job_id"}``: stop a job running here, or withdraw a one-off request (``run-<id>``) this
  node keeps and no leader placed yet (404 when neither; 503 when the stop intent could not be kept, a full disk).
* ``GET /jobs/runs?id=<id>`` (``<id>`` or ``run-<id>``): the outcome record of a one-off run requested through this
  node (:class:`p2pnode.node._runs.RunRecord`: ``state``, ``node``, ``exit_code``, ``signal``, ``rule``,
  ``reason``) with ``exit_status``, what ``p2pnode jobs run --wait`` exits with (null while not final); 400 for an
  id that is not one, 404 for one unknown here. A read: behind the read token like the other views.
* ``GET /jobs/logs?job_id=&offset=``: up to 1 MiB of a job's log from ``offset`` (bytes); ``x-log-size`` gives
  the file's size, for ``--follow``, and ``x-log-node`` the node that ran the job. A job that did not run here is
  looked for among the replicas of other nodes' job archives held here (a durable node; issue 41): its log's
  archived tail.
* ``GET /jobs/history?n=``: this node's newest runs and the replicated records of other nodes' ended runs held
  here, merged (:mod:`._history_route`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._lazy import lazy_module
from ..errors import RejectedMessage
from ..inputs import (
    CordonBody,
    DrainBody,
    InputError,
    LogsQuery,
    RunBody,
    RunQuery,
    StopBody,
    decode_json,
    decode_query,
)
from ..node._operator import InvalidIntent, RunPlaced
from ..node._runs import exit_status_of_record
from ._history_route import history_route
from ._requests import auth_refusal, no_catalog, read_bounded, refused_body
from ._surfaces import NodeSurface, OperatorSurface, SyncSurface, TrustSurface

if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = lazy_module("sqlite3")

T = TypeVar("T")

__all__ = ["operator_routes"]

MAX_BODY = 8192
LOG_CHUNK = 2**20


def _bad(detail: str, status: int = 400) -> Response:
    return JSONResponse({"error": "malformed" if status == 400 else "rejected", "detail": detail},
                        status_code=status)


async def _body_of(request: Request, kind: type[T], jobs: OperatorSurface | None,
                   trust: TrustSurface) -> tuple[T, OperatorSurface] | Response:
    """The request's body decoded as ``kind`` (:mod:`p2pnode.inputs`) and the operator surface, or the response
    refusing it: 413/408 for a body too large or too slow, 401 unauthenticated, 404 without a catalog, 400 for a
    body that is not a JSON object of ``kind``'s fields within their bounds."""
    try:
        body = await read_bounded(request, MAX_BODY)
    except RejectedMessage as exc:
        return refused_body(exc)
    if (refusal := auth_refusal(trust, request, body)) is not None:
        return refusal
    if jobs is None:
        return no_catalog()
    try:
        return decode_json(body, kind), jobs
    except InputError as exc:
        return JSONResponse({"error": "malformed", "detail": exc.detail}, status_code=400)


def operator_routes(jobs: OperatorSurface | None, node: NodeSurface, trust: TrustSurface,
                    sync: SyncSurface | None = None) -> list[Route]:
    """The routes above: ``jobs`` the operator's side of job control (None without a catalog: 404), ``node`` for
    its id and :meth:`NodeSurface.publish_soon` after an intent changed, ``trust`` to authenticate the requests,
    ``sync`` for the other nodes' archived logs held here (None: none)."""

    async def cordon(request: Request) -> Response:
        got = await _body_of(request, CordonBody, jobs, trust)
        if isinstance(got, Response):
            return got
        req, ops = got
        on = req.cordon
        section = ops.cordon(on)
        node.publish_soon()
        return JSONResponse({"node_id": node.node_id, **ops.operator_view(), "changed": section.cordoned == on})

    async def drain(request: Request) -> Response:
        got = await _body_of(request, DrainBody, jobs, trust)
        if isinstance(got, Response):
            return got
        req, ops = got
        ops.drain(req.deadline_s, time.time())
        node.publish_soon()
        return JSONResponse({"node_id": node.node_id, **ops.operator_view()})

    async def run(request: Request) -> Response:
        got = await _body_of(request, RunBody, jobs, trust)
        if isinstance(got, Response):
            return got
        req, ops = got
        template, params, target, tag = req.template, req.params, req.node, req.tag
        t = ops.template(template)
        if t is None:
            return _bad(f"template {template!r} is not in the catalog", 422)
        try:
            checked = t.param_values(params)
        except (ValueError, TypeError) as exc:
            return _bad(str(exc), 422)
        try:
            kept = ops.add_run(template, {k: params[k] for k in params if k in checked}, target, tag, node.node_id,
                               time.time())
        except InvalidIntent as exc:  # a value the operator file or the snapshot would refuse: never kept
            return _bad(str(exc), 422)
        except ValueError as exc:  # runs already waiting here: MAX_RUNS
            return _bad(str(exc), 429)
        node.publish_soon()
        return JSONResponse({"id": kept.id, "job_id": f"run-{kept.id}", "node_id": node.node_id})

    async def stop(request: Request) -> Response:
        got = await _body_of(request, StopBody, jobs, trust)
        if isinstance(got, Response):
            return got
        req, ops = got
        job_id = req.job_id
        try:
            stopped = ops.stop_job(job_id)
        except RunPlaced as exc:  # (a one-off placed on a node: not withdrawn; `jobs stop` tries that node next)
            return JSONResponse({"error": "placed", "detail": str(exc), "node_id": exc.node}, status_code=409)
        except sqlite3.Error as exc:  # the intent could not be kept (a full disk, say): nothing was asked
            return JSONResponse({"error": "not_kept", "detail": f"the stop intent could not be kept: {exc}"[:300],
                                 "node_id": node.node_id}, status_code=503)
        if not stopped:
            return JSONResponse({"error": "not_here", "detail": f"job {job_id} does not run on {node.node_id}"},
                                status_code=404)
        return JSONResponse({"stopped": job_id, "node_id": node.node_id})

    return [
        Route("/operator/cordon", cordon, methods=["POST"]),
        Route("/operator/drain", drain, methods=["POST"]),
        Route("/jobs/run", run, methods=["POST"]),
        Route("/jobs/stop", stop, methods=["POST"]),
        _logs_route(jobs, node, sync),
        _runs_route(jobs, node),
        history_route(jobs, node, sync),
    ]


def _runs_route(jobs: OperatorSurface | None, node: NodeSurface) -> Route:
    """``GET /jobs/runs?id=<id>``: a one-off run's outcome record (module docstring)."""

    async def run_record(request: Request) -> Response:
        try:
            run_id = decode_query(request.query_params.multi_items(), RunQuery).id.removeprefix("run-")
        except InputError as exc:
            return _bad(f"?id=<one-off run id> is required: {exc.detail}")
        if jobs is None:
            return no_catalog()
        r = jobs.run_record(run_id)
        if r is None:
            return JSONResponse({"error": "unknown_run", "detail": f"no one-off run {run_id} was requested through "
                                 f"{node.node_id}"}, status_code=404)
        return JSONResponse({**msgspec.structs.asdict(r), "final": r.final, "exit_status": exit_status_of_record(r),
                             "requested_through": node.node_id})

    return Route("/jobs/runs", run_record)


def _logs_route(jobs: OperatorSurface | None, node: NodeSurface, sync: SyncSurface | None) -> Route:
    """``GET /jobs/logs?job_id=&offset=``: up to :data:`LOG_CHUNK` bytes of a job's log from ``offset``: this node's
    own, else another node's archived one held here (``sync``)."""

    async def logs(request: Request) -> Response:
        try:
            q = decode_query(request.query_params.multi_items(), LogsQuery)
        except InputError as exc:
            return _bad(f"?job_id=<id>&offset=<bytes> are required: {exc.detail}")
        job_id = q.job_id
        places = [(node.node_id, jobs.log_path(job_id))] if jobs is not None else []
        held = sync.archived_log(job_id) if sync is not None else None  # (a validated job id, never a path)
        places += [held] if held is not None else []
        for origin, path in places:
            try:
                with open(path, "rb") as f:
                    size = f.seek(0, 2)
                    f.seek(min(q.offset, size))
                    data = f.read(LOG_CHUNK)
            except FileNotFoundError:
                continue
            return Response(data, media_type="text/plain; charset=utf-8",
                            headers={"x-log-size": str(size), "x-log-node": origin})
        if jobs is None and held is None:
            return no_catalog()
        return JSONResponse({"error": "no_log", "detail": f"no log of job {job_id} on {node.node_id}"},
                            status_code=404)

    return Route("/jobs/logs", logs)
