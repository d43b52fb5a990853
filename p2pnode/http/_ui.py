"""The dashboard every agent serves: a static page (``GET /`` and ``GET /ui``, assets under ``/ui/``, shipped in
``p2pnode/http/static``: no CDN, no build step) and the one JSON view it polls, ``GET /ui/state``.

The page polls ``/ui/state?since=T`` every 1.5 s (polling, not server-sent events: a browser's ``EventSource``
cannot send the ``Authorization`` header that ``agent.read_token`` asks for); ``since`` is the newest series point
it holds, so each answer carries only the new points of :class:`p2pnode.series.ClusterSeries`
(``GET /ui/series`` serves them all). ``/ui/state`` is this node's small, fast-changing part (counts by state,
totals, jobs, sync, events, times); the member rows, the large part, come from ``GET /members``, which the page
asks with the ``ETag`` it holds (``If-None-Match``): while nothing a row shows changed, the answer is a bodiless
304 and the page keeps its table (:mod:`._viewcache`). The static files carry no cluster data and load without
the read token; the JSON views need it like every other view (``_ReadGuard`` in :mod:`p2pnode.http._app`): the
page then shows "unauthorized" and asks for the token, which it keeps in the tab's ``sessionStorage`` and sends as a
bearer token.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..gossip import MemberState
from ..inputs import InputError, SeriesQuery, decode_query
from ..series import cluster_totals
from ..snapshot import PlanSection
from . import _views as views
from ._surfaces import HttpSurfaces, JobsSurface, SyncSurface

__all__ = ["STATIC_FILES", "STATIC_PATHS", "ui_routes", "ui_state"]

STATIC_FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
"""The page's files in ``p2pnode/http/static`` and their media types (served with ``charset=utf-8``)."""

STATIC_PATHS = frozenset({"/", "/ui", "/ui/app.js", "/ui/style.css"})
"""Routes serving those files: they hold no cluster data, so they load without the read token."""

HEADERS = {
    # The page runs only its own script and talks only to its own agent: no inline script, no other origin.
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}

MAX_RUNNING_ROWS = 200
"""Running jobs listed in ``/ui/state`` at most (every member's count is in ``running_counts``)."""
MAX_REFUSED_ROWS = 50
MAX_EVENT_ROWS = 40
MAX_SYNC_ROWS = 100
PLAN_WAIT_S = 0.3
"""How long ``/ui/state`` waits for the leader's whole plan (pending work) when it is not fetched yet, seconds."""


def _load_static() -> dict[str, bytes]:
    """The dashboard's files, read once at start from ``static/`` beside this module (a path, as
    :data:`p2pnode.jobs._launch.RAY_MEMBER`: ``importlib.resources`` would load zipfile and its readers, 0.4 MiB of
    an idle agent, for a package that is never imported from a zip)."""
    base = Path(__file__).with_name("static")
    return {name: (base / name).read_bytes() for name in STATIC_FILES}


class PlanCache:
    """The newest whole plan the page was shown. A leader replans every second or so; on a node that does not lead
    the newest plan may still be on its way, and the page then shows the previous plan of the same term
    (``jobs.plan.current`` false) rather than no pending work at all."""

    def __init__(self) -> None:
        self.doc: PlanSection | None = None


async def _jobs(s: HttpSurfaces, jobs: JobsSurface | None, cache: PlanCache | None) -> dict[str, Any] | None:
    """Running jobs (bounded), per-member counts, pending with reasons, refusals, members refusing work, recent
    runs here: from ``jobs_view`` and the newest leader plan. None without a catalog (``jobs`` None)."""
    if jobs is None:
        return None
    plan = await jobs.whole_plan(wait_s=PLAN_WAIT_S)
    current = plan is not None
    if cache is not None:
        if plan is not None:
            cache.doc = plan
        elif cache.doc is not None and cache.doc.term == s.core.view.term:
            plan = cache.doc
    jv = views.jobs_view(s, jobs, plan)
    running = jv["cluster_running"]
    return {
        "running": running[:MAX_RUNNING_ROWS],
        "running_total": sum(jv["running_counts"].values()),
        "running_counts": jv["running_counts"],
        "pending": jv["pending"],
        "plan": ({"term": plan.term, "seq": plan.seq, "jobs": len(plan.assignments), "current": current}
                 if plan is not None else None),
        "refused": sorted(jv["refused"], key=lambda r: r.get("at", 0.0), reverse=True)[:MAX_REFUSED_ROWS],
        "refusing": jv["refusing"],
        "history": jv["history"][:10],
        "breaker": jv["breaker"]["state"],
    }


def _sync(sync: SyncSurface) -> dict[str, Any]:
    """This node's files below R (with lag and bytes pending) and its replication settings; the cluster's counts
    are in each member row's ``sync``."""
    sv = sync.status_view()
    files = sv["files"]
    below = [f for f in files if f["replicas"] < f["r"]]
    return {
        "replication_factor": sv["replication_factor"],
        "r_effective": sv["r_effective"],
        "durable_members": sv["durable_members"],
        "files": len(files),
        "below_r": [{k: f[k] for k in ("path", "class", "size", "replicas", "r", "lag_s", "bytes_pending")}
                    for f in below[:MAX_SYNC_ROWS]],
        "below_r_count": len(below),
        "max_lag_s": max((f["lag_s"] for f in below), default=0.0),
    }


async def ui_state(s: HttpSurfaces, since: float | None = None,
                   plan_cache: PlanCache | None = None) -> dict[str, Any]:
    """``GET /ui/state``: everything the dashboard shows but the member rows (``GET /members``: see the module
    docstring), in one answer; series points newer than ``since`` only."""
    node, core = s.node, s.core
    cfg = node.config
    view = core.view
    live = (MemberState.ALIVE, MemberState.SUSPECT)
    live_snaps = []
    counts: dict[str, int] = {}
    for e in s.cluster.entries():
        state = core.state_of(e.origin) or MemberState.ALIVE
        counts[state.value] = counts.get(state.value, 0) + 1
        if e.origin == node.node_id or state in live:
            live_snaps.append(e.snapshot)
    series = s.series
    return {
        "now": time.time(),
        "node": {"id": node.node_id, "addr": node.addr, "agent_version": node.agent_version,
                 "uptime_s": round(time.time() - node.started_at, 1), "trust": cfg.agent.trust,
                 "read_protected": bool(cfg.agent.read_token), "level": s.guard.level},
        "cluster": {"leader": view.leader, "term": view.term, "quorum": view.quorum, "voters": view.voters,
                    "votes_for_leader": view.votes_for_leader, "members_by_state": counts,
                    "catalog_mismatch": views.catalog_mismatch(s)},
        "totals": cluster_totals(live_snaps),
        "jobs": await _jobs(s, s.jobs, plan_cache),
        "sync": _sync(s.sync),
        "events": views.events_view(s)["cluster"][:MAX_EVENT_ROWS],
        "scaling": views.scaling_status(s),
        "series": series.view(since) if series is not None else None,
    }


def _since(request: Request) -> float | None:
    """``?since=T`` (:class:`p2pnode.inputs.SeriesQuery`); None when absent or not a finite number within
    +-1e12 (the page then gets the whole series: a bad ``since`` is no error worth a refusal)."""
    try:
        return decode_query(request.query_params.multi_items(), SeriesQuery, ignore_unknown=True).since
    except InputError:
        return None


def ui_routes(s: HttpSurfaces) -> list[Route]:
    """The dashboard's routes over ``s``: the page and its assets, ``/ui/state``, ``/ui/series``."""
    files = _load_static()
    plan_cache = PlanCache()

    def static(name: str) -> Callable[[Request], Awaitable[Response]]:
        body, media = files[name], STATIC_FILES[name]

        async def serve(request: Request) -> Response:
            return Response(body, media_type=media, headers=HEADERS)

        return serve

    async def state(request: Request) -> Response:
        body = msgspec.json.encode(await ui_state(s, _since(request), plan_cache))
        return Response(body, media_type="application/json", headers={"cache-control": "no-store"})

    async def series(request: Request) -> Response:
        kept = s.series
        if kept is None:
            return JSONResponse({"error": "this agent keeps no series"}, status_code=404)
        return Response(msgspec.json.encode(kept.view(_since(request))), media_type="application/json",
                        headers={"cache-control": "no-store"})

    return [
        Route("/", static("index.html")),
        Route("/ui", static("index.html")),
        Route("/ui/app.js", static("app.js")),
        Route("/ui/style.css", static("style.css")),
        Route("/ui/state", state),
        Route("/ui/series", series),
    ]
