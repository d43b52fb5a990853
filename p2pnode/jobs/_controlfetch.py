"""Job control's fetches (:class:`p2pnode.jobs._control.JobControl`, whose mixin this is): a member's running list
(inline, or fetched at its signed digest), the documents the core asks for (:class:`p2pnode.node.Fetch`: plan parts,
whole plans, running lists, usage summaries) with the path and check that fit their kind, and the newest catalog
live members advertise. What is fetched goes to the core (or the catalog book)."""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ..node import (
    Fetch,
    Member,
)
from ..node._plandist import open_part, open_running, open_whole
from ..scheduler import open_usage
from ..snapshot import JobReport, PlanSection
from ..synccore._checkpoints import MAX_PROOF_BYTES
from ._catalogs import KIND as CATALOG_KIND
from ._catalogs import Fetched
from ._fetch import Want

MAX_PROOFS = 64
"""Placement proofs kept (the newest jobs')."""


class ControlFetches:
    """Fetches of plan parts, running lists, usage summaries and catalogs (mixin of
    :class:`p2pnode.jobs._control.JobControl`: it uses the driver's attributes, set in its ``__init__``)."""

    if TYPE_CHECKING:  # the driver's attributes this part uses (set in JobControl.__init__)
        from ..node import JobCore
        from ..snapshot import JobReport
        from ._catalogs import CatalogPush
        from ._fetch import PlanFetcher
        from ._leading import LeaderRole

        ctx: Any
        core: JobCore
        catalogs: CatalogPush | None
        fetcher: PlanFetcher
        leading: LeaderRole
        _catalog_keys: set[tuple[str, str]]
        placement_proofs: dict[str, bytes]

        def apply(self, effects: list[Any]) -> None: ...
        def news(self) -> None: ...
        def running_reports(self) -> list[JobReport]: ...

    def _open_part_keeping_proof(self, data: bytes, **kw: Any) -> PlanSection:
        """:func:`open_part`, keeping the sealed part as the **placement proof** of each job it places here in its
        own term (issue 41: attached to the job's checkpoints, :func:`p2pnode.node._plandist.open_proof`), the
        newest :data:`MAX_PROOFS` jobs'. Raises as :func:`open_part`."""
        part = open_part(data, **kw)
        if len(data) <= MAX_PROOF_BYTES:
            for j in part.assignments:
                if j.plan_id is not None and j.plan_id.term == part.term and j.job_id not in self.placement_proofs:
                    self.placement_proofs[j.job_id] = data
            while len(self.placement_proofs) > MAX_PROOFS:
                del self.placement_proofs[next(iter(self.placement_proofs))]
        return part

    def placement_proof(self, job_id: str) -> bytes:
        """The sealed plan part that placed ``job_id`` here (b"": none kept). Thread-safe (one dict read)."""
        return self.placement_proofs.get(job_id, b"")

    def running_of(self, m: Member) -> list[JobReport] | None:
        """``m``'s running jobs: this node's own, inline in its snapshot, or the list fetched at its signed digest
        (an older one while the new one is on its way; a fetch is asked for); None when never fetched."""
        if m.origin == self.ctx.node_id:
            return self.running_reports()
        js = m.snapshot.jobs
        if js.running_inline:
            return list(js.running)
        key = ("running", m.origin)
        if self.core.held(key, js.running_digest) is None:
            self.apply([Fetch(key, js.running_digest, m.origin)])
        held = self.core.held(key)
        return list(held) if held is not None else None

    def _fetched(self, key: tuple[str, str], version: str, doc: Any) -> None:
        if key[0] == CATALOG_KIND:
            self._catalog_fetched(doc)
            return
        self.core.fetched(key, version, doc)
        self.leading.fetched.set()
        self.leading.fetched = trio.Event()
        self.news()

    def _catalog_fetched(self, doc: Fetched) -> None:
        if self.catalogs is not None:
            self.catalogs.fetched(doc)

    def _fetch_failed(self, w: Want, reason: str) -> None:
        """A catalog fetch failed: that member is skipped for a while and the next holder is asked at once (a
        member that lies about its version costs one fetch among :data:`p2pnode.scheduler._catalog_sources.
        FETCH_PARALLEL` under way, and ranks behind every holder that never failed: it never freezes a version)."""
        if w.key[0] != CATALOG_KIND or self.catalogs is None:
            return
        self.catalogs.fetch_failed(w.origin, reason)
        self._want_catalog(self.ctx.members())

    def _want_catalog(self, members: list[Member]) -> None:
        """Fetch the newest catalog live members advertise above ours, from the members
        :class:`p2pnode.scheduler.CatalogSources` ranks first, several at once (opted-in nodes); the catalog
        fetches no longer wanted are dropped."""
        if self.catalogs is None or not self.catalogs.book.accepts:
            return
        wants = self.catalogs.wanted((m.origin, m.snapshot.jobs.catalog_version) for m in members
                                     if m.origin != self.ctx.node_id and m.state is m.state.ALIVE)
        keys = {w.key for w in wants}
        for key in self._catalog_keys - keys:
            self.fetcher.forget(key)
        for w in wants:
            self.fetcher.want(w)
        self._catalog_keys = keys

    def _fetch(self, f: Fetch) -> None:
        """Ask the fetcher for ``f`` (the path and the check that fits the kind of document)."""
        kind, origin = f.key
        node_id = self.ctx.node_id
        check: Callable[[bytes], Any]
        if kind == "running":
            path = f"/jobs/running?digest={urllib.parse.quote(f.version, safe='')}"  # (a peer's text: quoted)
            check = functools.partial(open_running, digest=f.version)
        elif kind == "usage":
            path = f"/jobs/usage?digest={urllib.parse.quote(f.version, safe='')}"  # (a peer's text: quoted)
            check = functools.partial(open_usage, digest=f.version)
        elif kind == "whole" and f.ref is not None:
            path, check = f"/plan?format=msgpack&digest={f.ref.digest}", functools.partial(open_whole, ref=f.ref)
        elif kind == "part" and f.ref is not None:
            m = self.ctx.member(origin)
            if m is None:
                return
            path = f"/plan/part?node={node_id}&digest={f.ref.digest}"
            check = functools.partial(self._open_part_keeping_proof, leader_key=m.key, ref=f.ref, node_id=node_id)
        else:
            return
        self.fetcher.want(Want(f.key, f.version, origin, path, check))
