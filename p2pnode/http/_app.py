"""The agent's HTTP surface (Starlette, served by hypercorn inside the agent's trio nursery).

Routes: ``GET /healthz``, ``GET /status``, ``GET /members``, ``GET /metrics`` (Prometheus text),
``GET /events`` (recent events of this node and of every member), ``GET /guard`` (assessment, level, admission),
``GET /jobs`` (running, pending with reasons, refused with reasons, recent history), ``GET /plan`` (the whole plan;
``?node=``, ``?format=msgpack``), ``GET /plan/part?node=`` (a node's signed part), ``GET /jobs/running`` (msgpack),
``POST /signals`` (JSON or msgpack; 400 malformed, 413 oversized, 422 invalid or unknown config; in token trust
mode it, ``POST /sync/trigger`` and ``POST /voters`` need an ``x-p2pnode-auth`` header (:mod:`p2pnode.reqauth`),
else 401 naming the counted reason; with ``agent.read_token`` set the views need it or the read token),
``POST /voters`` (the operator edits the voter roll; token mode: as ``/signals``), the operator routes of
:mod:`._operator` (``POST /operator/cordon``, ``/operator/drain``, ``/jobs/run``, ``/jobs/stop``, ``GET /jobs/logs``),
``POST /gossip`` (msgpack; see :mod:`p2pnode.gossip._protocol` for statuses), ``GET /sync/status``,
``GET /sync/manifest`` (this node's manifests, hashes in hex; ``?path=`` for one file), ``GET /sync/receipts?origin=``
(msgpack ``[[path, size, root], ...]``: every replica this durable node holds for that origin), ``POST /sync/trigger``
(run a sync pass now), ``POST /sync/push`` (signed msgpack from a member; see :mod:`p2pnode.sync._wire`);
``GET /`` and ``GET /ui`` (the dashboard page, its assets under ``/ui/``), ``GET /ui/state`` (what the page shows,
one JSON view), ``GET /ui/series`` (cluster GPU utilization and job counts, the last 15 minutes): see :mod:`._ui`.
"""

from __future__ import annotations

import hmac
from typing import Any

import msgpack
import msgspec
import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import RejectedMessage, RejectReason
from ..inputs import (
    InputError,
    ManifestQuery,
    PartQuery,
    PlanQuery,
    ReceiptsQuery,
    VotersBody,
    content_length,
    decode_json,
    decode_query,
)
from ..reqauth import AUTH_HEADER
from ..scheduler import SignalError, decode_signal_body
from . import _views as views
from ._gossip_route import serve_gossip
from ._operator import operator_routes
from ._ui import STATIC_PATHS, ui_routes

Agent = Any
"""The node the app serves (:class:`p2pnode.agent.Agent`; not imported: only the CLI imports the agent). The app
reads ``node_id``, ``config``, ``trust``, ``core``, ``gossip``, ``state``, ``jobs``, ``sync``, ``guard`` and
``metrics_registry``, and the views of :mod:`p2pnode.http._views`."""

__all__ = ["create_app"]


BODY_DEADLINE_S = 10.0
"""Default time a client has to send a whole request body, seconds (gossip: ``gossip.request_timeout_s``)."""


async def _read_bounded(request: Request, limit: int, deadline_s: float = BODY_DEADLINE_S) -> bytes:
    """The request body (at most ``limit`` bytes, within ``deadline_s`` seconds). Raises ``RejectedMessage``:
    ``OVERSIZED`` as soon as the declared or received length exceeds ``limit``; ``TOO_SLOW`` when the body is not
    complete by the deadline (a slowloris cannot hold a request slot or a file descriptor for long);
    ``MALFORMED`` when the client disconnects before the body is complete (starlette's ``ClientDisconnect``: an
    aborted upload is the client's business, counted by the caller like any bad body, never a traceback)."""
    from starlette.requests import ClientDisconnect

    try:
        declared = content_length(request.headers.get("content-length"))
    except InputError as exc:
        raise RejectedMessage(RejectReason.MALFORMED, exc.detail) from None
    if declared is not None and declared > limit:
        raise RejectedMessage(RejectReason.OVERSIZED, f"declared {declared} bytes > limit {limit}")
    chunks, size = [], 0
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


def _refused_body(exc: RejectedMessage) -> Response:
    status = {RejectReason.OVERSIZED: 413, RejectReason.TOO_SLOW: 408}.get(exc.reason, 400)
    return JSONResponse({"error": exc.reason.value, "detail": exc.detail}, status_code=status)


def _target(scope_or_request) -> str:
    """The request target the MAC covers: the path, and ``?query`` when there is one."""
    url = scope_or_request.url
    return url.path + (f"?{url.query}" if url.query else "")


def _auth_refusal(agent: Agent, request: Request, body: bytes, *, operator: bool = False) -> Response | None:
    """In token trust mode a state-changing request must carry a valid ``x-p2pnode-auth`` header
    (:mod:`p2pnode.reqauth`: an HMAC with a keyring token over method, receiving node, path, time, nonce and body;
    no secret on the wire): a 401 response naming the counted reason when it does not, else None. Open mode:
    always None."""
    reason = agent.trust.authenticate(request.headers.get(AUTH_HEADER), request.method, _target(request), body,
                                operator=operator)
    if reason is None:
        return None
    return JSONResponse({"error": "unauthenticated", "reason": reason,
                         "detail": "this request needs the x-p2pnode-auth header: in token mode signed with a "
                                   "cluster token (P2PNODE_CLUSTER_TOKEN or the node's keyring), for the voter roll "
                                   "in open mode with a voter's node key (the p2pnode CLI run as the agent's user)"},
                        status_code=401)


class _ReadGuard:
    """ASGI middleware, when ``agent.read_token`` is set: every ``GET``/``HEAD`` but ``/healthz`` and the peer
    route ``/sync/receipts`` needs ``Authorization: Bearer <read_token>`` (compared as bytes, in constant time) or a
    valid ``x-p2pnode-auth`` header signed for this node: a cluster token's HMAC, or in open mode the key of this
    node or of a voter on the roll; a member's own key only on the peer routes it needs (:meth:`_member_may`).
    Else 401 naming the reason (counted in ``reads_refused``, and by reason in ``request_auth``). The dashboard's
    static files (no cluster data) load without it; its data (``/ui/state``, ``/ui/series``) needs it."""

    EXEMPT = frozenset({"/healthz", "/sync/receipts"}) | STATIC_PATHS

    def __init__(self, app, agent: Agent) -> None:
        self.app = app
        self.agent = agent

    def _member_may(self, request: Request):
        """Which member's own signature may read this route (a predicate on its node id): ``GET /jobs/running``
        any member's (a leader collects running lists); ``GET /plan/part?node=ID`` only ``ID``'s, the one ``node``
        parameter (a member fetches its own part); ``GET /plan?format=msgpack`` only the leader's this node sees
        elected (it carries its predecessor's plan over); nothing else."""
        path = request.scope["path"]
        if path == "/jobs/running":
            return lambda node_id: True
        if path == "/plan/part":
            nodes = request.query_params.getlist("node")
            return lambda node_id: nodes == [node_id]
        if path == "/plan" and request.query_params.getlist("format") == ["msgpack"]:
            leader = self.agent.core.view.leader
            return lambda node_id: leader is not None and node_id == leader
        return lambda node_id: False

    async def __call__(self, scope, receive, send) -> None:
        token = self.agent.config.agent.read_token
        read = scope["type"] == "http" and scope["method"] in ("GET", "HEAD")
        if token and read and scope["path"] not in self.EXEMPT:
            request = Request(scope)
            # Header values arrive as bytes (Starlette decodes them as latin-1: encoding back is exact): compare
            # bytes, never a str with non-ASCII characters (compare_digest raises TypeError on those).
            bearer = request.headers.get("authorization", "").encode("latin-1")
            ok = hmac.compare_digest(bearer, b"Bearer " + token.encode("utf-8"))
            reason = "bad_read_token" if bearer else "missing"
            if not ok and request.headers.get(AUTH_HEADER):
                refused = self.agent.trust.authenticate_read(request.headers.get(AUTH_HEADER), scope["method"],
                                                             _target(request), member_may=self._member_may(request))
                ok, reason = refused is None, refused or ""
            if not ok:
                self.agent.trust.read_refusals += 1
                await JSONResponse({"error": "unauthorized", "reason": reason,
                                    "detail": "reads need 'Authorization: Bearer <read token>' (agent.read_token) "
                                    "or a request signed for this node with a cluster token (token mode) or a "
                                    "voter's node key (open mode)"},
                                   status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def input_refusal(exc: InputError) -> Response:
    """The answer to a refused request input (:class:`p2pnode.inputs.InputError`): its status, with
    ``{"error": reason, "detail": ...}``."""
    return JSONResponse({"error": exc.reason, "detail": exc.detail}, status_code=exc.status)


def _view(obj: object) -> Response:
    """A JSON view, encoded by msgspec (several times faster than ``json.dumps`` on a 1,000-member ``/status``).
    Views hold only what the typed snapshot decoder accepted: finite numbers, text, no bytes (hex already)."""
    return Response(msgspec.json.encode(obj), media_type="application/json")


class _ClientGoneGuard:
    """ASGI middleware: a reply to a client that already hung up is dropped and counted, never a traceback.

    hypercorn 0.18 closes the socket of a client that hung up without holding its send lock, so a reply written
    then fails with ``trio.BusyResourceError``; early refusals (429, 503, 413 sent before a hostile upload is
    read) hit it routinely."""

    def __init__(self, app, on_gone) -> None:
        self.app = app
        self.on_gone = on_gone

    async def __call__(self, scope, receive, send) -> None:
        gone = False

        async def guarded(message) -> None:
            nonlocal gone
            if gone:
                return
            try:
                await send(message)
            except trio.BusyResourceError:
                gone = True
                self.on_gone()

        await self.app(scope, receive, guarded)


def create_app(agent: Agent) -> Any:
    """The ASGI app for ``agent``: ``POST /gossip`` served bare (:mod:`._gossip_route`), every other route by
    Starlette with the client-gone and read-token middleware."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "node_id": agent.node_id})

    async def status(request: Request) -> Response:
        return _view(views.status_view(agent))

    async def members(request: Request) -> Response:
        return _view({"members": views.members_view(agent)})

    async def events(request: Request) -> Response:
        return _view(views.events_view(agent))

    async def guard(request: Request) -> Response:
        return _view(agent.guard.view())

    async def jobs(request: Request) -> Response:
        if agent.jobs is None:
            return JSONResponse({"error": "no catalog: start the agent with --catalog"}, status_code=404)
        return _view(views.jobs_view(agent, await agent.jobs.leading.whole_plan(wait_s=1.0)))

    async def plan_route(request: Request) -> Response:
        """``GET /plan``: the newest plan of an elected leader, whole (fetched from the leader and checked against
        its signed ref on a node that does not lead); ``?node=ID`` only that node's assignments and stops;
        ``?format=msgpack`` the leader's own plan document as msgpack (404 on a node that does not lead)."""
        if agent.jobs is None:
            return JSONResponse({"error": "no catalog: start the agent with --catalog"}, status_code=404)
        try:
            q = decode_query(request.query_params.multi_items(), PlanQuery)
        except InputError as exc:
            return input_refusal(exc)
        if q.format == "msgpack":
            data = agent.jobs.leading.whole_plan_bytes(q.digest or None)
            if data is None:
                return JSONResponse({"error": "this node serves no plan (it does not lead)"}, status_code=404)
            return Response(data, media_type="application/msgpack")
        ref = agent.jobs.leading.newest_plan()
        doc = await agent.jobs.leading.whole_plan(wait_s=1.0)  # a view answers within its clients' timeouts
        node = q.node
        if doc is not None and node:
            doc = msgspec.structs.replace(doc, assignments=[j for j in doc.assignments if j.node == node],
                                          stops=[s for s in doc.stops if s.node == node], pending=[], node=node)
        return _view({"leader": agent.core.view.leader, "term": agent.core.view.term, "ref": ref,
                      "plan": doc})

    async def plan_part(request: Request) -> Response:
        """``GET /plan/part?node=ID``: ``ID``'s part of this leader's plan, signed (msgpack; see
        :mod:`p2pnode.node._plandist`). 404 on a node that serves no plan, 400 without a node id."""
        try:
            q = decode_query(request.query_params.multi_items(), PartQuery)
        except InputError as exc:
            return input_refusal(exc)
        jobs = agent.jobs
        data = jobs.leading.signed_part(q.node, q.digest or None) if jobs is not None else None
        if data is None:
            return JSONResponse({"error": "this node serves no plan (it does not lead)"}, status_code=404)
        return Response(data, media_type="application/msgpack")

    async def jobs_running(request: Request) -> Response:
        """``GET /jobs/running``: every job running here (msgpack list, checked by the reader against the
        ``running_digest`` of this node's signed snapshot)."""
        reports = agent.jobs.running_reports() if agent.jobs is not None else []
        return Response(msgspec.msgpack.encode(reports), media_type="application/msgpack")

    async def signals(request: Request) -> Response:
        try:
            body = await _read_bounded(request, 256 * 1024)
        except RejectedMessage as exc:
            return _refused_body(exc)
        if (refusal := _auth_refusal(agent, request, body)) is not None:
            return refusal
        if agent.jobs is None:
            return JSONResponse({"error": "no catalog: start the agent with --catalog"}, status_code=404)
        try:
            raw = decode_signal_body(body, msgpack="msgpack" in request.headers.get("content-type", ""))
        except InputError as exc:
            if exc.status == 422:
                return JSONResponse({"error": "rejected", "reasons": [exc.detail]}, status_code=422)
            return input_refusal(exc)
        try:
            accepted = agent.jobs.accept_signals(raw)
        except SignalError as exc:
            return JSONResponse({"error": "rejected", "reasons": exc.reasons}, status_code=422)
        return JSONResponse({"accepted": [s.config for s in accepted]})

    async def voters(request: Request) -> Response:
        """``POST /voters`` ``{"node_id": ID, "action": "remove"|"admit"}``: the operator edits this node's voter
        roll (``p2pnode node remove|admit``). 400 malformed, 413 oversized, 401 in token mode without the token."""
        try:
            body = await _read_bounded(request, 4096)
        except RejectedMessage as exc:
            return _refused_body(exc)
        if (refusal := _auth_refusal(agent, request, body, operator=True)) is not None:
            return refusal
        try:
            req = decode_json(body, VotersBody)
        except InputError as exc:
            return input_refusal(exc)
        changed = agent.change_voter(req.node_id, admit=req.action == "admit")
        return JSONResponse({"node_id": agent.node_id, "changed": changed, "voters": sorted(agent.core.roll.members)})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(agent.metrics_registry), media_type=CONTENT_TYPE_LATEST)

    async def sync_status(request: Request) -> Response:
        return _view(agent.sync.status_view())

    async def sync_manifest(request: Request) -> Response:
        src = agent.sync.source
        if src is None:
            return JSONResponse({"error": "this node does not push (tag it ephemeral)"}, status_code=404)
        try:
            want = decode_query(request.query_params.multi_items(), ManifestQuery).path
        except InputError as exc:
            return input_refusal(exc)
        files = [f for f in src.files.values() if want is None or f.path == want]
        if want is not None and not files:
            return JSONResponse({"error": f"no synced file {want!r}"}, status_code=404)
        return JSONResponse({"files": [
            {"path": f.path, "class": f.cls, "seq": f.seq, "size": f.manifest.size,
             "block_size": f.manifest.block_size, "root": f.manifest.root.hex(), "hashes": f.manifest.hashes.hex()}
            for f in sorted(files, key=lambda f: f.path)
        ]})

    async def sync_receipts(request: Request) -> Response:
        store = agent.sync.store
        if store is None:
            return JSONResponse({"error": "this node keeps no replicas (tag it durable)"}, status_code=404)
        try:
            origin = decode_query(request.query_params.multi_items(), ReceiptsQuery).origin
        except InputError as exc:
            return input_refusal(exc)
        receipts = await trio.to_thread.run_sync(store.receipts_for, origin)
        return Response(msgpack.packb(receipts, use_bin_type=True), media_type="application/msgpack")

    async def sync_trigger(request: Request) -> Response:
        try:
            body = await _read_bounded(request, 4096)
        except RejectedMessage as exc:
            return _refused_body(exc)
        if (refusal := _auth_refusal(agent, request, body)) is not None:
            return refusal
        agent.sync.trigger()
        return JSONResponse({"triggered": agent.sync.pushes})

    async def sync_push(request: Request) -> Response:
        """Headers are checked and a body budget reserved before the body is read (see
        :meth:`SyncService.receive_push`); 507 and 503 answers carry ``retry-after`` (seconds). A client gone
        mid-body is counted (``disconnected``) and gets no answer; one gone while its answer is written is
        counted the same way, never logged as a traceback."""
        from starlette.requests import ClientDisconnect

        class Reply(Response):
            async def __call__(self, scope, receive, send) -> None:
                """Send the reply, unless the client is gone: hypercorn 0.18 closes the socket of a client that
                hung up without holding its send lock, so a reply written then fails with
                ``trio.BusyResourceError`` (a refusal sent while a hostile upload is still arriving hits it)."""
                if self.status_code == 0:
                    return
                try:
                    await super().__call__(scope, receive, send)
                except trio.BusyResourceError:
                    agent.sync.count_rejection("disconnected")

        try:
            status, reply = await agent.sync.receive_push(request.headers, request.headers.get("content-length"),
                                                          request.stream())
        except ClientDisconnect:
            agent.sync.count_rejection("disconnected")
            return Reply(b"", status_code=0)  # nobody to answer
        retry = {507: agent.config.sync.backpressure_backoff_s, 503: 1.0}.get(status)
        headers = {"retry-after": str(max(1, int(retry)))} if retry is not None else None
        return Reply(reply, status_code=status, media_type="application/msgpack", headers=headers)

    framework = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/status", status),
            Route("/members", members),
            Route("/metrics", metrics),
            Route("/events", events),
            Route("/guard", guard),
            Route("/jobs", jobs),
            Route("/plan", plan_route),
            Route("/plan/part", plan_part),
            *operator_routes(agent, _read_bounded, _refused_body, _auth_refusal),
            Route("/jobs/running", jobs_running),
            Route("/signals", signals, methods=["POST"]),
            Route("/voters", voters, methods=["POST"]),
            Route("/sync/status", sync_status),
            Route("/sync/manifest", sync_manifest),
            Route("/sync/receipts", sync_receipts),
            Route("/sync/trigger", sync_trigger, methods=["POST"]),
            Route("/sync/push", sync_push, methods=["POST"]),
            *ui_routes(agent),
        ],
        middleware=[Middleware(_ClientGoneGuard, on_gone=views.client_gone_counter(agent)),
                    Middleware(_ReadGuard, agent=agent)],
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/gossip":  # the hot route, without the framework
            if scope["method"] == "POST":
                await serve_gossip(agent, scope, receive, send)
            else:
                await not_post(scope, receive, send)
            return
        await framework(scope, receive, send)

    # The 405 goes through the client-gone guard as the framework's replies do (a client that hung up first).
    not_post = _ClientGoneGuard(JSONResponse({"error": "method not allowed"}, status_code=405,
                                             headers={"allow": "POST"}), on_gone=views.client_gone_counter(agent))
    return app
