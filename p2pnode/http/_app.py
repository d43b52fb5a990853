"""The agent's HTTP surface (Starlette, served by hypercorn inside the agent's trio nursery).

Routes: ``GET /healthz``, ``GET /status``, ``GET /members`` (``?limit=&after=`` pages; both with an ``ETag``, 304 on
``If-None-Match``: :mod:`._viewcache`), ``GET /metrics`` (Prometheus text),
``GET /events`` (recent events of this node and of every member), ``GET /guard`` (assessment, level, admission),
``GET /jobs`` (running, pending with reasons, refused with reasons, recent history), ``GET /plan`` (the whole plan;
``?node=``, ``?format=msgpack``, ``?inputs=1``: the facts of it, :mod:`p2pnode.node._planinputs`), ``GET /plan/part``
(a node's signed part), ``GET /jobs/running`` (msgpack), ``GET /jobs/usage``, ``GET /jobs/predict`` (predictions),
``POST /signals`` (JSON or msgpack; 400 malformed, 413 oversized, 422 invalid or unknown config; in token trust
mode it, ``POST /sync/trigger`` and ``POST /voters`` need an ``x-p2pnode-auth`` header (:mod:`p2pnode.reqauth`),
else 401 naming the counted reason; with ``agent.read_token`` set the views need it or the read token),
``POST /voters`` (the operator edits the voter roll; token mode: as ``/signals``), the operator routes of
:mod:`._operator` (``POST /operator/cordon``, ``/operator/drain``, ``/jobs/run``, ``/jobs/stop``, ``GET /jobs/logs``
and ``/jobs/history``), ``POST /gossip`` (msgpack; see :mod:`p2pnode.gossip._protocol` for statuses), ``POST /probe``
(a SWIM probe packet over HTTP, the fallback of UDP: :mod:`._probe_route`), ``GET /sync/status``,
``GET /sync/manifest`` (this node's manifests, hashes in hex; ``?path=`` for one file), ``GET /sync/receipts?origin=``
(msgpack ``[[path, size, root], ...]``: every replica this durable node holds for that origin), ``POST /sync/trigger``
(run a sync pass now), ``POST /sync/push`` (signed msgpack from a member; see :mod:`p2pnode.sync._wire`),
``POST /sync/wal`` (a live database's signed WAL segment from a member; :mod:`p2pnode.sync._walship`),
``POST /sync/challenge`` (a signed proof-of-possession challenge from a file's origin; :mod:`p2pnode.sync._possess`);
``POST /sync/publish`` (a file to publish, signed by a pinned operator key), ``POST /sync/dist/publication`` and
``POST /sync/dist/blocks`` (a member's signed request for a published file's manifest or blocks;
:mod:`p2pnode.sync._distribute`);
``GET /`` and ``GET /ui`` (the dashboard page, its assets under ``/ui/``), ``GET /ui/state`` (what the page shows,
one JSON view), ``GET /ui/series`` (cluster GPU utilization and job counts, the last 15 minutes): see :mod:`._ui`.

The app never sees the agent: :func:`create_app` takes the node's :class:`._surfaces.HttpSurfaces` and builds one
group of routes per subsystem, each from the surfaces it uses (views, jobs and plans, the operator, the voter
roll, sync, the dashboard), behind two middlewares (client gone, read token) and the bare gossip route.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import msgpack
import msgspec
import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import RejectedMessage
from ..inputs import (
    InputError,
    ManifestQuery,
    MembersQuery,
    PartQuery,
    PlanQuery,
    PredictQuery,
    ReceiptsQuery,
    RunningQuery,
    UsageQuery,
    VotersBody,
    decode_json,
    decode_query,
)
from ..node import NodeCore
from ..reqauth import AUTH_HEADER
from ..scheduler import SignalError, decode_signal_body
from ..scheduler._signed import MAX_SIGNED_BYTES
from ..snapshot import UsageDoc
from ..sync import MAX_CHALLENGE_BODY
from . import _views as views
from ._checkpoint_route import CHECKPOINT_PATHS
from ._checkpoint_route import checkpoint_routes as _checkpoint_routes
from ._dist_route import dist_routes
from ._gossip_route import GossipEndpoint, serve_gossip
from ._operator import operator_routes
from ._probe_route import serve_probe
from ._registry import LazyRegistry, exposition
from ._requests import (
    auth_refusal,
    input_refusal,
    no_catalog,
    read_bounded,
    refused_body,
    request_target,
)
from ._requests import json_view as _view
from ._surfaces import HttpSurfaces, NodeSurface, SyncSurface, TrustSurface
from ._ui import STATIC_PATHS, ui_routes
from ._viewcache import MemberRows, cached_reply

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = ["create_app"]

PLAN_WAIT_S = 1.0
"""How long ``GET /plan`` and ``GET /jobs`` wait for the leader's whole plan, seconds (within their clients'
timeouts)."""


class _ReadGuard:
    """ASGI middleware, when ``agent.read_token`` is set: every ``GET``/``HEAD`` but ``/healthz`` and the peer
    route ``/sync/receipts`` (and the checkpoint routes, which always authenticate their reader themselves:
    :mod:`._checkpoint_route`) needs ``Authorization: Bearer <read_token>`` (compared as bytes, in constant time) or a
    valid ``x-p2pnode-auth`` header signed for this node: a cluster token's HMAC, or in open mode the key of this
    node or of a voter on the roll; a member's own key only on the peer routes it needs (:meth:`_member_may`).
    Else 401 naming the reason (counted in ``reads_refused``, and by reason in ``request_auth``). The dashboard's
    static files (no cluster data) load without it; its data (``/ui/state``, ``/ui/series``) needs it."""

    EXEMPT = frozenset({"/healthz", "/sync/receipts"}) | STATIC_PATHS | CHECKPOINT_PATHS

    def __init__(self, app: ASGIApp, node: NodeSurface, core: NodeCore, trust: TrustSurface) -> None:
        self.app = app
        self.node = node
        self.core = core
        self.trust = trust

    def _member_may(self, request: Request) -> Callable[[str], bool]:
        """Which member's own signature may read this route (a predicate on its node id): ``GET /jobs/running``,
        ``GET /jobs/usage`` and ``GET /catalog/signed`` any member's (a leader collects running lists and usage
        summaries, members fetch a pushed catalog);
        ``GET /plan/part?node=ID`` only ``ID``'s, the one ``node`` parameter (a member fetches its own part);
        ``GET /plan?format=msgpack`` only the leader's this node sees elected (it carries its predecessor's plan
        over); nothing else."""
        path = request.scope["path"]
        if path in ("/jobs/running", "/jobs/usage", "/catalog/signed"):
            return lambda node_id: True
        if path == "/plan/part":
            nodes = request.query_params.getlist("node")
            return lambda node_id: nodes == [node_id]
        if path == "/plan" and request.query_params.getlist("format") == ["msgpack"]:
            leader = self.core.view.leader
            return lambda node_id: leader is not None and node_id == leader
        return lambda node_id: False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = self.node.config.agent.read_token
        read = scope["type"] == "http" and scope["method"] in ("GET", "HEAD")
        if token and read and scope["path"] not in self.EXEMPT:
            request = Request(scope)
            # Header values arrive as bytes (Starlette decodes them as latin-1: encoding back is exact): compare
            # bytes, never a str with non-ASCII characters (compare_digest raises TypeError on those).
            bearer = request.headers.get("authorization", "").encode("latin-1")
            ok = hmac.compare_digest(bearer, b"Bearer " + token.encode("utf-8"))
            reason = "bad_read_token" if bearer else "missing"
            if not ok and request.headers.get(AUTH_HEADER):
                refused = self.trust.authenticate_read(request.headers.get(AUTH_HEADER), scope["method"],
                                                       request_target(request), member_may=self._member_may(request))
                ok, reason = refused is None, refused or ""
            if not ok:
                self.trust.read_refusals += 1
                await JSONResponse({"error": "unauthorized", "reason": reason,
                                    "detail": "reads need 'Authorization: Bearer <read token>' (agent.read_token) "
                                    "or a request signed for this node with a cluster token (token mode) or a "
                                    "voter's node key (open mode)"},
                                   status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _ClientGoneGuard:
    """ASGI middleware: a reply to a client that already hung up is dropped and counted, never a traceback.

    hypercorn 0.18 closes the socket of a client that hung up without holding its send lock, so a reply written
    then fails with ``trio.BusyResourceError``; early refusals (429, 503, 413 sent before a hostile upload is
    read) hit it routinely."""

    def __init__(self, app: ASGIApp, on_gone: Callable[[], None]) -> None:
        self.app = app
        self.on_gone = on_gone

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = False

        async def guarded(message: Message) -> None:
            nonlocal gone
            if gone:
                return
            try:
                await send(message)
            except trio.BusyResourceError:
                gone = True
                self.on_gone()

        await self.app(scope, receive, guarded)


class _PushReply(Response):
    """The answer to ``POST /sync/push`` (msgpack), unless the client is gone: hypercorn 0.18 closes the socket of a
    client that hung up without holding its send lock, so a reply written then fails with
    ``trio.BusyResourceError`` (a refusal sent while a hostile upload is still arriving hits it); that is counted
    with ``on_gone``. Status 0: nobody to answer, nothing is sent."""

    def __init__(self, content: bytes, *, status_code: int, on_gone: Callable[[], None],
                 headers: Mapping[str, str] | None = None, media_type: str | None = None) -> None:
        super().__init__(content, status_code=status_code, headers=headers, media_type=media_type)
        self.on_gone = on_gone

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.status_code == 0:
            return
        try:
            await super().__call__(scope, receive, send)
        except trio.BusyResourceError:
            self.on_gone()


# -- the route groups, one per subsystem ------------------------------------------------------------------------------
def _view_routes(s: HttpSurfaces, registry: CollectorRegistry | LazyRegistry) -> list[Route]:
    """``/healthz``, ``/status``, ``/members``, ``/metrics`` (``registry``), ``/events``, ``/guard``."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "node_id": s.node.node_id})

    rows = MemberRows(views.member_row)

    async def status(request: Request) -> Response:
        """``GET /status``: :func:`._views.status_sections` and every member's cached row; tagged by the rows'
        generation and a digest of the other sections (:mod:`._viewcache`)."""
        rows.refresh(s)
        sections = msgspec.json.encode(views.status_sections(s, rows))
        return cached_reply(request, lambda: sections[:-1] + b',"members":' + rows.joined() + b"}",
                            rows.etag(sections), s.counters)

    async def members(request: Request) -> Response:
        """``GET /members[?limit=N&after=ID]``: the members in id order, a page of at most ``limit`` after the id
        ``after`` (``next``: the ``after`` of the next page, null on the last); 400 on a bad query, counted."""
        try:
            q = decode_query(request.query_params.multi_items(), MembersQuery)
        except InputError as exc:
            refused = s.counters.queries_refused
            refused[exc.reason] = refused.get(exc.reason, 0) + 1
            return input_refusal(exc)
        rows.refresh(s)

        def body() -> bytes:
            page, nxt = rows.page(q.after, q.limit)
            return b'{"members":' + page + b',"next":' + msgspec.json.encode(nxt) + b"}"

        return cached_reply(request, body, rows.etag(str(q.limit), q.after or ""), s.counters)

    async def metrics(request: Request) -> Response:
        body, media = exposition(registry)
        return Response(body, media_type=media)

    async def events(request: Request) -> Response:
        return _view(views.events_view(s))

    async def guard(request: Request) -> Response:
        return _view(s.guard.view())

    return [Route("/healthz", healthz), Route("/status", status), Route("/members", members),
            Route("/metrics", metrics), Route("/events", events), Route("/guard", guard)]


def _jobs_routes(s: HttpSurfaces) -> list[Route]:
    """``/jobs``, ``/plan``, ``/plan/part``, ``/jobs/predict`` and ``POST /signals``, over ``s.jobs`` (404 without
    a catalog)."""
    jobs = s.jobs

    async def jobs_route(request: Request) -> Response:
        if jobs is None:
            return no_catalog()
        return _view(views.jobs_view(s, jobs, await jobs.whole_plan(wait_s=PLAN_WAIT_S)))

    async def plan_route(request: Request) -> Response:
        """``GET /plan``: the newest plan of an elected leader, whole (fetched from the leader and checked against
        its signed ref on a node that does not lead); ``?node=ID`` only that node's assignments and stops;
        ``?format=msgpack`` the leader's own document as msgpack (404 unless it leads); ``?inputs=1``: ``inputs``."""
        if jobs is None:
            return no_catalog()
        try:
            q = decode_query(request.query_params.multi_items(), PlanQuery)
        except InputError as exc:
            return input_refusal(exc)
        if q.format == "msgpack":
            if q.inputs:
                return input_refusal(InputError("invalid", "query: inputs=1 is served with format=json only"))
            data = jobs.whole_plan_bytes(q.digest or None)
            if data is None:
                return JSONResponse({"error": "this node serves no plan (it does not lead)"}, status_code=404)
            return Response(data, media_type="application/msgpack")
        ref = jobs.newest_plan()
        doc = whole = await jobs.whole_plan(wait_s=PLAN_WAIT_S)  # a view answers within its clients' timeouts
        if doc is not None and (node := q.node):
            doc = msgspec.structs.replace(doc, assignments=[j for j in doc.assignments if j.node == node],
                                          stops=[x for x in doc.stops if x.node == node], pending=[], node=node)
        facts = {"inputs": await jobs.plan_inputs_json(whole) if whole is not None else None} if q.inputs else {}
        return _view({"leader": s.core.view.leader, "term": s.core.view.term, "ref": ref, "plan": doc, **facts})

    async def plan_part(request: Request) -> Response:
        """``GET /plan/part?node=ID``: ``ID``'s part of this leader's plan, signed (msgpack; see
        :mod:`p2pnode.node._plandist`). 404 on a node that serves no plan, 400 without a node id."""
        try:
            q = decode_query(request.query_params.multi_items(), PartQuery)
        except InputError as exc:
            return input_refusal(exc)
        data = jobs.signed_part(q.node, q.digest or None) if jobs is not None else None
        if data is None:
            return JSONResponse({"error": "this node serves no plan (it does not lead)"}, status_code=404)
        return Response(data, media_type="application/msgpack")

    async def jobs_predict(request: Request) -> Response:
        """``GET /jobs/predict[?template=T]`` (JSON): the predictor's table as this node holds it, with the
        ``leader`` (node id and address; null without one) and ``partial: true`` on a node that does not lead (it
        holds only its own summary)."""
        if jobs is None:
            return no_catalog()
        try:
            q = decode_query(request.query_params.multi_items(), PredictQuery)
        except InputError as exc:
            return input_refusal(exc)
        leader = s.core.view.leader
        entry = s.cluster.get(leader) if leader is not None else None
        addr = s.node.addr if leader == s.node.node_id else entry.snapshot.addr if entry is not None else ""
        if leader != s.node.node_id and s.gossip.addr_refusal(addr) is not None:
            addr = ""  # the CLI follows it: never an address this node's dial policy refuses
        return _view({"node": s.node.node_id, "leader": {"node": leader, "addr": addr} if leader else None,
                      "partial": leader != s.node.node_id, **jobs.predictions(q.template)})

    async def signals(request: Request) -> Response:
        """``POST /signals`` (JSON or msgpack): 400 malformed, 413 oversized, 401 unauthenticated (token mode),
        404 without a catalog, 422 invalid or for a config not in the catalog."""
        try:
            body = await read_bounded(request, 256 * 1024)
        except RejectedMessage as exc:
            return refused_body(exc)
        if (refusal := auth_refusal(s.trust, request, body)) is not None:
            return refusal
        if jobs is None:
            return no_catalog()
        try:
            raw = decode_signal_body(body, msgpack="msgpack" in request.headers.get("content-type", ""))
        except InputError as exc:
            if exc.status == 422:
                return JSONResponse({"error": "rejected", "reasons": [exc.detail]}, status_code=422)
            return input_refusal(exc)
        try:
            accepted = jobs.accept_signals(raw)
        except SignalError as exc:
            return JSONResponse({"error": "rejected", "reasons": exc.reasons}, status_code=422)
        return JSONResponse({"accepted": [x.config for x in accepted]})

    return [Route("/jobs", jobs_route), Route("/plan", plan_route), Route("/plan/part", plan_part),
            Route("/jobs/predict", jobs_predict), Route("/signals", signals, methods=["POST"])]


def _peer_doc_routes(s: HttpSurfaces) -> list[Route]:
    """``/jobs/running`` and ``/jobs/usage``: the documents a node's signed snapshot names by digest, for peers
    (an empty list, and an empty summary, without a catalog)."""
    jobs = s.jobs

    async def jobs_running(request: Request) -> Response:
        """``GET /jobs/running[?digest=HEX]``: every job running here (msgpack list of
        :class:`p2pnode.snapshot.JobReport`, checked by the reader against the ``running_digest`` of this node's
        signed snapshot): the list of ``digest`` while this node keeps it (the lists of its last few snapshots),
        else the current one. 400 on a digest that is not hex, a repeated parameter or an unknown one."""
        try:
            q = decode_query(request.query_params.multi_items(), RunningQuery)
        except InputError as exc:
            return input_refusal(exc)
        data = jobs.running_msgpack(q.digest) if jobs is not None else msgspec.msgpack.encode([])
        return Response(data, media_type="application/msgpack")

    async def jobs_usage(request: Request) -> Response:
        """``GET /jobs/usage[?digest=HEX]``: this node's run-history summary (msgpack
        :class:`p2pnode.snapshot.UsageDoc`, checked by the reader against the ``usage_digest`` of this node's
        signed snapshot): the one of ``digest`` while this node keeps it (its last few), else the newest. 400 on a
        digest that is not hex, a repeated parameter or an unknown one."""
        try:
            q = decode_query(request.query_params.multi_items(), UsageQuery)
        except InputError as exc:
            return input_refusal(exc)
        if jobs is None:
            return Response(msgspec.msgpack.encode(UsageDoc(node=s.node.node_id)), media_type="application/msgpack")
        data = jobs.usage_msgpack(q.digest)
        return Response(data, media_type="application/msgpack")

    return [Route("/jobs/running", jobs_running), Route("/jobs/usage", jobs_usage)]


def _voter_routes(node: NodeSurface, core: NodeCore, trust: TrustSurface) -> list[Route]:
    """``POST /voters``: the operator edits this node's voter roll."""

    async def voters(request: Request) -> Response:
        """``POST /voters`` ``{"node_id": ID, "action": "remove"|"admit"|"eligible"|"ineligible"|"unmark"}``: the
        operator edits this node's voter roll (``p2pnode node remove|admit|eligible|ineligible|unmark``). 400
        malformed, 413 oversized, 401 without a voter's signature (open mode) or the token (token mode). A roll
        holds at most 64 eligibility marks: a new one past them forgets the oldest (``forgotten`` in the answer)."""
        try:
            body = await read_bounded(request, 4096)
        except RejectedMessage as exc:
            return refused_body(exc)
        if (refusal := auth_refusal(trust, request, body, operator=True)) is not None:
            return refusal
        try:
            req = decode_json(body, VotersBody)
        except InputError as exc:
            return input_refusal(exc)
        if req.action in ("eligible", "ineligible", "unmark"):
            changed = node.change_eligibility(req.node_id, "cleared" if req.action == "unmark" else req.action)
        else:
            changed = node.change_voter(req.node_id, admit=req.action == "admit")
        roll = core.roll
        return JSONResponse({"node_id": node.node_id, "changed": changed, "voters": sorted(roll.members),
                             "eligible": sorted(roll.eligible), "ineligible": sorted(roll.ineligible),
                             "forgotten": [m.node for m in roll.forgotten]
                             if changed and req.action in ("eligible", "ineligible", "unmark") else []})

    return [Route("/voters", voters, methods=["POST"])]


def _sync_routes(sync: SyncSurface, trust: TrustSurface) -> list[Route]:
    """``/sync/status``, ``/sync/manifest``, ``/sync/receipts``, ``POST /sync/trigger``, ``POST /sync/push``,
    ``POST /sync/wal``, ``POST /sync/challenge``, ``POST /sync/publish`` and ``POST /sync/dist/publication|blocks``."""

    async def sync_status(request: Request) -> Response:
        return _view(sync.status_view())

    async def sync_manifest(request: Request) -> Response:
        src = sync.source
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
        store = sync.store
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
            body = await read_bounded(request, 4096)
        except RejectedMessage as exc:
            return refused_body(exc)
        if (refusal := auth_refusal(trust, request, body)) is not None:
            return refusal
        sync.trigger()
        return JSONResponse({"triggered": sync.pushes})

    async def sync_push(request: Request) -> Response:
        """Headers are checked and a body budget reserved before the body is read (see
        :meth:`SyncService.receive_push`); 507 and 503 answers carry ``retry-after`` (seconds). A client gone
        mid-body is counted (``disconnected``) and gets no answer; one gone while its answer is written is
        counted the same way, never logged as a traceback."""

        def gone() -> None:
            sync.count_rejection("disconnected")

        try:
            status, reply = await sync.receive_push(request.headers, request.headers.get("content-length"),
                                                    request.stream())
        except ClientDisconnect:
            gone()
            return _PushReply(b"", status_code=0, on_gone=gone)  # nobody to answer
        retry = {507: sync.backpressure_backoff_s, 503: 1.0}.get(status)
        headers = {"retry-after": str(max(1, int(retry)))} if retry is not None else None
        return _PushReply(reply, status_code=status, on_gone=gone, headers=headers, media_type="application/msgpack")

    async def sync_wal(request: Request) -> Response:
        """A live database's WAL segment from a member (signed like a push; :mod:`p2pnode.sync._walship`)."""

        def gone() -> None:
            sync.count_rejection("disconnected")

        try:
            status, reply = await sync.receive_wal(request.headers, request.headers.get("content-length"),
                                                   request.stream())
        except ClientDisconnect:
            gone()
            return _PushReply(b"", status_code=0, on_gone=gone)
        retry = {507: sync.backpressure_backoff_s, 503: 1.0}.get(status)
        headers = {"retry-after": str(max(1, int(retry)))} if retry is not None else None
        return _PushReply(reply, status_code=status, on_gone=gone, headers=headers, media_type="application/msgpack")

    async def sync_challenge(request: Request) -> Response:
        """A proof-of-possession challenge from a file's origin (signed, naming this node; see
        :mod:`p2pnode.sync._possess`): 200 with the answer, else the refusal counted by its reason."""
        try:
            body = await read_bounded(request, MAX_CHALLENGE_BODY)
        except RejectedMessage as exc:
            sync.count_rejection(exc.reason.value if exc.reason.value in ("oversized", "too_slow") else "malformed")
            return refused_body(exc)
        status, reply = await sync.answer_challenge(request.headers, body)
        return Response(reply, status_code=status, media_type="application/msgpack")

    return [Route("/sync/status", sync_status), Route("/sync/manifest", sync_manifest),
            Route("/sync/receipts", sync_receipts), *_checkpoint_routes(sync, trust),
            Route("/sync/trigger", sync_trigger, methods=["POST"]),
            Route("/sync/push", sync_push, methods=["POST"]), Route("/sync/wal", sync_wal, methods=["POST"]),
            Route("/sync/challenge", sync_challenge, methods=["POST"]), *dist_routes(sync, trust)]


def _catalog_routes(node: NodeSurface) -> list[Route]:
    """``POST /catalog`` (the operator pushes a signed catalog) and ``GET /catalog/signed`` (members fetch it)."""

    async def push(request: Request) -> Response:
        """``POST /catalog``: a signed catalog (:class:`p2pnode.scheduler.SignedCatalog`, JSON), authenticated by
        its own signature with an operator key this node pins (``catalog.signers``). 200 adopted; 400 malformed;
        403 not accepted here, unknown signer, bad signature; 409 not newer; 413 oversized; 422 invalid catalog."""
        try:
            body = await read_bounded(request, MAX_SIGNED_BYTES)
        except RejectedMessage as exc:
            return refused_body(exc)
        status, answer = node.push_catalog(body)
        return JSONResponse(answer, status_code=status)

    async def signed(request: Request) -> Response:
        doc = node.signed_catalog()
        if doc is None:
            return JSONResponse({"error": "no pushed catalog held here"}, status_code=404)
        return Response(doc, media_type="application/json")

    return [Route("/catalog", push, methods=["POST"]), Route("/catalog/signed", signed)]


# -- the app ---------------------------------------------------------------------------------------------------------
def create_app(s: HttpSurfaces, registry: CollectorRegistry | LazyRegistry) -> ASGIApp:
    """The ASGI app over the node's surfaces ``s`` (``registry``: what ``GET /metrics`` exposes,
    :func:`p2pnode.http.make_registry`, or a :class:`p2pnode.http.LazyRegistry` that makes it at the first scrape):
    ``POST /gossip`` served bare (:mod:`._gossip_route`), every other route by Starlette with the client-gone and
    read-token middleware."""
    framework = Starlette(
        routes=[
            *_view_routes(s, registry),
            *_jobs_routes(s),
            *_peer_doc_routes(s),
            *operator_routes(s.jobs, s.node, s.trust, s.sync),
            *_voter_routes(s.node, s.core, s.trust),
            *_catalog_routes(s.node),
            *_sync_routes(s.sync, s.trust),
            *ui_routes(s),
        ],
        middleware=[Middleware(_ClientGoneGuard, on_gone=s.counters.client_gone),
                    Middleware(_ReadGuard, node=s.node, core=s.core, trust=s.trust)],
    )
    probe = (functools.partial(serve_probe, s.probes, s.counters, s.node.config.gossip.request_timeout_s)
             if s.probes is not None else None)
    return _with_gossip_route(framework, GossipEndpoint.of(s), s.counters.client_gone, probe)


def _with_gossip_route(framework: ASGIApp, endpoint: GossipEndpoint, on_gone: Callable[[], None],
                       probe: ASGIApp | None = None) -> ASGIApp:
    """``framework`` behind the hot routes: ``POST /gossip`` goes to :func:`serve_gossip` and ``POST /probe`` to
    ``probe`` (:func:`._probe_route.serve_probe`: MAC-authenticated, so no read token; None: probes are off and
    ``/probe`` is the framework's, an unknown path) without the framework's routing and middleware; any other
    method on either gets a 405."""
    paths = ("/gossip", "/probe") if probe is not None else ("/gossip",)
    # The 405 goes through the client-gone guard as the framework's replies do (a client that hung up first).
    not_post = _ClientGoneGuard(JSONResponse({"error": "method not allowed"}, status_code=405,
                                             headers={"allow": "POST"}), on_gone=on_gone)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in paths:  # bare, without the framework
            if scope["method"] == "POST" and scope["path"] == "/gossip":
                await serve_gossip(endpoint, scope, receive, send)
            elif scope["method"] == "POST" and probe is not None:
                await probe(scope, receive, send)
            else:
                await not_post(scope, receive, send)
            return
        await framework(scope, receive, send)

    return app
