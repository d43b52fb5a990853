"""``GET /jobs/history?n=RUNS`` (issue 41, item 5): this node's newest runs (``source: "local"``) and, on a durable
node, the records of other nodes' ended runs among the replicas of their job archives held here (``source:
"replica"``, ``node_id`` the replica's origin: :mod:`p2pnode.sync._jobreplicas`), merged: one run per node and job
id, a node's own record first, newest start first, at most ``n`` (1-1000, default 50). Answers
``{node_id, runs, replicated, rejected, archive}``: ``replicated`` the replicated records read, ``rejected`` those
left out so far by reason (:data:`p2pnode.synccore.ARCHIVE_REFUSALS`), ``archive`` this node's own archive for
durable replicas (``written``, ``pruned``, ``errors``, ``dir``; null where it keeps none). A read: behind the read
token like the other views. ``p2pnode jobs history`` merges this answer from every live member."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..inputs import HistoryQuery, InputError, decode_query
from ..synccore import merge_runs
from ._requests import json_view
from ._surfaces import NodeSurface, OperatorSurface, SyncSurface

__all__ = ["history_route"]


def history_route(jobs: OperatorSurface | None, node: NodeSurface, sync: SyncSurface | None) -> Route:
    """The route above: ``jobs`` this node's job control (None: no catalog, no runs of its own), ``sync`` the
    replicas held here (None: none)."""

    async def history(request: Request) -> Response:
        try:
            n = decode_query(request.query_params.multi_items(), HistoryQuery).n
        except InputError as exc:
            return JSONResponse({"error": "malformed", "detail": f"?n=<1-1000> expected: {exc.detail}"},
                                status_code=400)
        own = [{**r, "source": "local"} for r in jobs.history(n)] if jobs is not None else []
        held, rejected = await sync.archived_runs(n) if sync is not None else ([], {})
        runs = merge_runs([own, [{**r, "source": "replica"} for r in held]], n)
        return json_view({"node_id": node.node_id, "runs": runs, "replicated": len(held), "rejected": rejected,
                          "archive": jobs.archive_view() if jobs is not None else None})

    return Route("/jobs/history", history)
