"""Pushed catalogs on this node (driver): the persisted copy read back at start, one pushed by the operator
(``POST /catalog``), one fetched from a member that advertises a newer version. What is accepted is decided by
:class:`p2pnode.scheduler.CatalogBook`; here only bytes move (the file, the fetch) and the adopted catalog is handed
to the agent, which reloads it without a restart.

The persisted copy is ``<data_dir>/catalog.signed.json``, written atomically; one that does not decode, verify or
validate at start is dropped, counted, and the node starts on its own catalog file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .._files import atomic_write_bytes
from ..errors import RejectedMessage, RejectReason
from ..scheduler import Catalog, CatalogBook, CatalogRefused, SignedCatalog, decode_signed, encode_signed
from ._fetch import Want

__all__ = ["CatalogPush", "PERSISTED"]

log = logging.getLogger(__name__)

PERSISTED = "catalog.signed.json"
PATH = "/catalog/signed"


class CatalogPush:
    """See the module docstring. ``on_adopt(catalog)`` reloads the agent on a newly adopted catalog."""

    def __init__(self, book: CatalogBook, data_dir: Path, on_adopt: Callable[[Catalog], None]) -> None:
        self.book = book
        self.path = data_dir / PERSISTED
        self.on_adopt = on_adopt
        self.sources: dict[str, int] = {"push": 0, "fetch": 0, "restore": 0}

    def restore(self) -> Catalog | None:
        """The catalog of the persisted copy, adopted again (at start), or None: none, not opted in, or unusable
        (dropped and counted)."""
        if not self.book.accepts or not self.path.exists():
            return None
        try:
            doc = decode_signed(self.path.read_bytes()[:2 * 2**20])
            catalog = self.book.check(doc, restore=True)
        except (OSError, CatalogRefused) as exc:
            log.error("pushed catalog %s not used (%s): starting on this node's own catalog", self.path, exc)
            return None
        self.book.adopt(doc)
        self.sources["restore"] += 1
        log.info("pushed catalog version %d (signed by %s) restored from %s", doc.version, doc.signer, self.path)
        return catalog

    def offer(self, doc: SignedCatalog, source: str) -> Catalog:
        """Adopt ``doc`` (pushed or fetched): checked, persisted, then handed to the agent. Raises
        :class:`CatalogRefused` (counted) and ``OSError`` when it cannot be persisted (not adopted then)."""
        catalog = self.book.check(doc)
        atomic_write_bytes(self.path, encode_signed(doc), mode=0o600)
        self.book.adopt(doc)
        self.sources[source] += 1
        log.warning("adopted pushed catalog version %d (signed by %s, %d templates, via %s)", doc.version,
                    doc.signer, len(catalog.templates), source)
        self.on_adopt(catalog)
        return catalog

    def signed(self) -> bytes | None:
        """The held signed catalog's JSON (``GET /catalog/signed``), or None."""
        return encode_signed(self.book.held) if self.book.held is not None else None

    def wanted(self, versions: Iterable[tuple[str, int]]) -> Want | None:
        """From ``(member, catalog_version)`` of the members, a fetch of the newest version above ours from one
        member that advertises it, or None (not opted in, nothing newer)."""
        if not self.book.accepts:
            return None
        best = max(versions, key=lambda mv: (mv[1], mv[0]), default=None)
        if best is None or best[1] <= self.book.version:
            return None
        origin, version = best
        return Want(("catalog", origin), str(version), origin, PATH, self._check_fetched)

    def _check_fetched(self, body: bytes) -> SignedCatalog:
        """A fetched signed catalog, decoded and checked (not adopted: :meth:`offer` does). Raises
        :class:`RejectedMessage` so that the fetcher counts it and backs off."""
        try:
            try:
                doc = decode_signed(body)
            except CatalogRefused as exc:
                self.book.count(exc)
                raise
            self.book.check(doc)
        except CatalogRefused as exc:
            reason = {"malformed": RejectReason.MALFORMED, "bad_signature": RejectReason.BAD_SIGNATURE,
                      "unknown_signer": RejectReason.WRONG_KEY, "older": RejectReason.STALE}.get(
                exc.reason, RejectReason.BAD_TYPE)
            raise RejectedMessage(reason, f"catalog {exc}") from None
        return doc

    def view(self) -> dict[str, Any]:
        """For ``/status`` ``catalog``: whether pushed catalogs are accepted, the version held and its signer, how
        many were adopted by source, refusals by reason and the last one."""
        held = self.book.held
        return {"accepts_pushed": self.book.accepts, "version": self.book.version,
                "signer": held.signer if held is not None else None, "adopted": dict(self.sources),
                "refused": {k: v for k, v in self.book.refused.items() if v}, "last_refusal": self.book.last_refusal}
