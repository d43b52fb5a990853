"""The agent's catalog (a part of :class:`p2pnode.agent.Agent`, which inherits it): a pushed catalog adopted
without a restart, ``POST /catalog`` and ``GET /catalog/signed``. The agent's own state is declared here for the
type checker only; nothing else imports this module.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .drivers import GuardDriver, Trust
from .jobs import CatalogPush
from .jobs._ckconfirm import own_checkpoints
from .node._ckproof import trains
from .scheduler import Catalog, CatalogRefused, checkpoint_globs, decode_signed

if TYPE_CHECKING:
    from .jobs import JobControl
    from .node import NodeCore
    from .sync import SyncService

log = logging.getLogger("p2pnode.agent")


class _AgentCatalog:
    """A pushed catalog's adoption, and the catalog routes, of one agent."""

    node_id: str
    catalog: Catalog | None
    catalog_push: CatalogPush
    guard: GuardDriver
    jobs: JobControl | None
    sync: SyncService
    core: NodeCore
    trust: Trust

    if TYPE_CHECKING:  # defined by the agent
        def publish_soon(self) -> None: ...

    def _wire_checkpoints(self) -> None:
        """Checkpoints (issue 41): sync sends the catalog's checkpoint dirs, and signs checkpoints with the
        placement proofs job control keeps."""
        templates = self.catalog.templates if self.catalog else {}
        self.sync.set_checkpoint_globs(checkpoint_globs(templates))
        if self.sync.checkpoints is not None and self.jobs is not None:
            self.sync.checkpoints.proof_of = self.jobs.placement_proof
            origin = self.sync.checkpoints  # a held stop waits for a durable replica of this node's checkpoint
            self.jobs.stops.replicas.own = lambda: own_checkpoints(origin)
        trust = self.trust  # checkpoint reads on the data channel: the HTTP route's check (any member may read)
        self.sync.inbound.read_auth = lambda header, method, target: trust.authenticate_read(
            header, method, target, member_may=lambda node_id: True)
        board = self.sync.checkpoint_board
        board.leader_of_term = self.core.leaders_by_term.get
        board.config_of_template = lambda name: t.config if (t := templates.get(name)) is not None else None
        board.trains_template = lambda name: (t := templates.get(name)) is not None and trains(t)
        if self.jobs is not None and self.jobs.resume.board is not board:  # what a placed training resumes from
            from .sync._ckfetch import CheckpointFetch  # a resume's fetch: with job control only (issue 43)

            resume = self.jobs.resume
            resume.set_board(board)  # (its floors persisted: a replayed older checkpoint is refused after a restart)
            resume.sync_root = self.sync.root
            resume.fetch = lambda newest, dest, progress: CheckpointFetch(
                board.ctx, newest, dest, timeout_s=board.timeout_s, sign_read=board.sign_read,
                progress=progress, totals=board.fetches).run()

    def set_catalog(self, catalog: Catalog) -> None:
        """Run on ``catalog`` (a pushed catalog just adopted: :class:`p2pnode.jobs._catalogs.CatalogPush`), without a
        restart: job control, the guard's priorities and kinds, the views."""
        self.catalog = catalog
        self.guard.priority_of = catalog.priority_of
        kinds = sorted(t.kind for t in catalog.templates.values())
        self.guard.kinds = tuple(dict.fromkeys((*self.guard.kinds, *kinds)))
        self._wire_checkpoints()
        if self.jobs is not None:
            self.jobs.set_catalog(catalog)
        else:
            log.warning("a pushed catalog was adopted, but this agent started without one and runs no job control: "
                        "restart it to run the catalog's jobs")
        self.publish_soon()

    def push_catalog(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /catalog``: a signed catalog from the operator (:func:`p2pnode.scheduler.decode_signed`), adopted
        when this node accepts it. Returns the HTTP status and the answer: 200 adopted; 403 not accepted here, an
        unknown signer or a bad signature; 409 not newer than the one held, or below the floor; 400 malformed; 422
        the catalog does not validate; 500 when it cannot be persisted (not adopted)."""
        try:
            try:
                doc = decode_signed(body)
            except CatalogRefused as exc:
                self.catalog_push.book.count(exc)
                raise
            self.catalog_push.offer(doc, "push")
        except CatalogRefused as exc:
            status = {"malformed": 400, "older": 409, "below_floor": 409, "invalid_catalog": 422}.get(exc.reason, 403)
            return status, {"error": exc.reason, "detail": exc.detail, "version": self.catalog_push.book.version}
        except OSError as exc:
            return 500, {"error": "not_persisted", "detail": str(exc)[:200], "version": self.catalog_push.book.version}
        return 200, {"adopted": doc.version, "version": doc.version, "node_id": self.node_id}

    def signed_catalog(self) -> bytes | None:
        """``GET /catalog/signed``: the signed catalog this node holds (JSON), or None."""
        return self.catalog_push.signed()
