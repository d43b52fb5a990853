"""Distribution's part of ``GET /sync/status`` (:meth:`._distribute.Distributor.view`): what this node holds and
fetches, who holds each publication, and its counters. Read-only; it walks the members' entries once."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from ..config import SyncConfig
from ..snapshot import HeldPublication
from ..synccore import FetchPlan, PublicationBook, publisher_text
from ._distfiles import DistFiles, Holding
from ._distlisting import Listings
from ._distserve import unbitmap

if TYPE_CHECKING:
    from ..node import NodeContext

__all__ = ["DistState", "distribution_view"]


class DistState(Protocol):
    """What the view reads of a :class:`~._distribute.Distributor`."""

    ctx: NodeContext
    cfg: SyncConfig
    files: DistFiles
    book: PublicationBook
    listings: Listings
    holdings: dict[str, Holding]
    plans: dict[str, FetchPlan]
    bytes_fetched: Counter[str]
    serve_refused: Counter[str]
    bad_blocks: Counter[str]
    fetch_failures: int
    updated: int
    passes: int

    @property
    def bytes_served(self) -> int: ...


def distribution_view(d: DistState) -> dict[str, Any]:
    """The ``distribution`` part of ``GET /sync/status``: this node's publisher key, the pinned publishers, each
    publication held or fetched (version, size, state, progress, holders and their blocks), bytes served and
    fetched, refusals by reason, blocks that failed their hash by holder (``bad_blocks``)."""
    files = []
    roots = {h.pub.root for h in d.holdings.values()}
    listed: dict[bytes, list[tuple[str, HeldPublication]]] = {}  # one walk of the members' entries, not one a file
    for m in d.ctx.members(live=True):
        for e in d.listings.entries(m.origin) if m.origin != d.ctx.node_id else []:
            if e.root in roots:
                listed.setdefault(e.root, []).append((m.origin, e))
    for name, h in sorted(d.holdings.items()):
        p = h.pub
        plan = d.plans.get(name)
        blocks = p.manifest.blocks
        have = len(plan.have) if plan is not None else (blocks if h.have is None else len(h.have))
        holders = {}
        for origin, e in listed.get(p.root, []):
            got = unbitmap(e.have, blocks)
            holders[origin] = {"blocks": blocks if got is None else len(got), "serves": e.serves}
        files.append({"name": name, "version": p.version, "size": p.size, "root": p.root.hex(), "to": p.to,
                      "publisher": p.publisher, "origin": h.origin,
                      "state": "fetching" if plan is not None else "held",
                      "blocks": blocks, "blocks_held": have, "holders": holders,
                      "in_flight": plan.in_flight if plan is not None else 0})
    return {"publisher_key": publisher_text(d.ctx.identity.public_key),
            "publishers": sorted(d.book.publishers), "subscribe_dir": str(d.files.subscribe_dir),
            "serves": d.cfg.serve_published, "files": files, "bytes_served": d.bytes_served,
            "bytes_fetched": dict(d.bytes_fetched), "refused": dict(d.book.refused),
            "serve_refused": dict(d.serve_refused), "fetch_failures": d.fetch_failures,
            "bad_blocks": dict(d.bad_blocks), "updated": d.updated, "passes": d.passes}
