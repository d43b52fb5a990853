"""Pushed catalogs on this node (driver): the persisted copy read back at start, one pushed by the operator
(``POST /catalog``), one fetched from a member that advertises a newer version. What is accepted is decided by
:class:`p2pnode.scheduler.CatalogBook`; here only bytes move (the file, the fetch) and the adopted catalog is handed
to the agent, which reloads it without a restart.

The persisted copy is ``<data_dir>/catalog.signed.json``, written atomically; one that does not decode, verify or
validate at start is dropped, counted, and the node starts on its own catalog file. Beside it,
``<data_dir>/catalog.floor.json`` keeps the highest version ever adopted (:class:`p2pnode.scheduler.CatalogFloor`):
a catalog below it is never adopted, the persisted copy at start included (a stale file put back); a floor file
that does not decode is dropped and counted (``/status`` ``state_files``).

Which member to fetch from, and what is held against a member whose reply was not what it advertised, is
:class:`p2pnode.scheduler.CatalogSources` (issue 37, attack 1); here the fetch is checked (the served version must
be the advertised one) and its outcome handed back to it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
import trio

from .._files import atomic_write_bytes
from ..errors import RejectedMessage, RejectReason
from ..scheduler import (
    Catalog,
    CatalogBook,
    CatalogFloor,
    CatalogRefused,
    CatalogSources,
    SignedCatalog,
    decode_signed,
    encode_signed,
)
from ..scheduler._catalog_sources import FETCH_PARALLEL
from ..statefiles import decode_entry, read_json_file, report_for
from ._fetch import Want

__all__ = ["CatalogPush", "FLOOR", "Fetched", "KIND", "PERSISTED"]

log = logging.getLogger(__name__)

PERSISTED = "catalog.signed.json"
FLOOR = "catalog.floor.json"
PATH = "/catalog/signed"
KIND = "catalog"
"""The fetcher's keys of catalog fetches are ``(KIND, member)``: up to :data:`FETCH_PARALLEL` at once, from the
members :class:`CatalogSources` ranks first."""
FETCH_DEADLINE_S = 3.0
"""A catalog fetch (at most 512 KiB) ends within this many seconds, or counts ``too_slow`` against the member: a
member that trickles its reply holds back a new version by this much, once per skip."""
_SETTLED = ("older", "below_floor")
"""Refusals of a reply that was what its member advertised: a newer catalog won the race, nothing held against it."""


class Fetched(msgspec.Struct, frozen=True):
    """A signed catalog fetched and checked, and the member ``origin`` that served it."""

    origin: str
    doc: SignedCatalog


class CatalogPush:
    """See the module docstring. ``on_adopt(catalog)`` reloads the agent on a newly adopted catalog; ``clock``:
    monotonic seconds (trio's, as the rest of the agent)."""

    def __init__(self, book: CatalogBook, data_dir: Path, on_adopt: Callable[[Catalog], None], *,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.book = book
        self.data_dir = data_dir
        self.path = data_dir / PERSISTED
        self.floor_path = data_dir / FLOOR
        self.on_adopt = on_adopt
        self.clock = clock
        self.sources: dict[str, int] = {"push": 0, "fetch": 0, "restore": 0}
        self.members = CatalogSources()
        self._persisted_floor = 0
        self._refusals: dict[str, tuple[str, int]] = {}  # member -> (reason, served version) of its last reply

    def _read_floor(self) -> int:
        """The persisted floor, 0 when there is none; a file that does not decode is dropped and counted."""
        report = report_for(self.data_dir)
        raw = read_json_file(self.floor_path, file=FLOOR, report=report)
        if raw is None:
            return 0
        try:
            floor: CatalogFloor = decode_entry(raw, CatalogFloor)
        except ValueError as exc:
            report.drop(FLOOR, "bad_entry", f"{exc}: ignored")
            return 0
        return floor.version

    def _persist_floor(self) -> None:
        """Write the floor when it rose since it was last written. A failure is logged: the persisted catalog,
        written first, carries the same version, and the floor is written again at the next adoption."""
        if self.book.floor <= self._persisted_floor:
            return
        try:
            atomic_write_bytes(self.floor_path, msgspec.json.encode(CatalogFloor(self.book.floor)), mode=0o600)
        except OSError as exc:
            log.error("catalog floor %d not persisted to %s: %s", self.book.floor, self.floor_path, exc)
            return
        self._persisted_floor = self.book.floor

    def restore(self) -> Catalog | None:
        """The catalog of the persisted copy, adopted again (at start), or None: none, not opted in, or unusable
        (dropped and counted: below the persisted floor too)."""
        if not self.book.accepts:
            return None
        self.book.floor = self._persisted_floor = self._read_floor()
        if not self.path.exists():
            return None
        try:
            doc = decode_signed(self.path.read_bytes()[:2 * 2**20])
            catalog = self.book.check(doc, restore=True)
        except (OSError, CatalogRefused) as exc:
            log.error("pushed catalog %s not used (%s): starting on this node's own catalog", self.path, exc)
            return None
        self.book.adopt(doc)
        self._persist_floor()
        self.sources["restore"] += 1
        log.info("pushed catalog version %d (signed by %s) restored from %s", doc.version, doc.signer, self.path)
        return catalog

    def offer(self, doc: SignedCatalog, source: str) -> Catalog:
        """Adopt ``doc`` (pushed or fetched): checked, persisted, then handed to the agent. Raises
        :class:`CatalogRefused` (counted) and ``OSError`` when it cannot be persisted (not adopted then)."""
        catalog = self.book.check(doc)
        atomic_write_bytes(self.path, encode_signed(doc), mode=0o600)
        self.book.adopt(doc)
        self._persist_floor()
        self.sources[source] += 1
        log.warning("adopted pushed catalog version %d (signed by %s, %d templates, via %s)", doc.version,
                    doc.signer, len(catalog.templates), source)
        self.on_adopt(catalog)
        return catalog

    def signed(self) -> bytes | None:
        """The held signed catalog's JSON (``GET /catalog/signed``), or None."""
        return encode_signed(self.book.held) if self.book.held is not None else None

    def wanted(self, versions: Iterable[tuple[str, int]]) -> list[Want]:
        """From ``(member, catalog_version)`` of the live members, fetches from the first :data:`FETCH_PARALLEL`
        members :class:`CatalogSources` ranks (advertised above ours and the floor, not skipped; those that never
        failed first), each under the key ``(KIND, member)``: the first reply that verifies is adopted. Empty: not
        opted in, nothing newer, every holder skipped (the caller drops the catalog keys it no longer wants)."""
        if not self.book.accepts:
            return []
        now = self.clock()
        self.members.advertised(versions, now)
        return [Want((KIND, origin), f"{version}@{origin}", origin, PATH,
                     functools.partial(self._check_fetched, origin, version), deadline_s=FETCH_DEADLINE_S)
                for origin, version in self.members.candidates(self.book.version, self.book.floor,
                                                               now)[:FETCH_PARALLEL]]

    def _check_fetched(self, origin: str, advertised: int, body: bytes) -> Fetched:
        """A signed catalog fetched from ``origin``, decoded and checked: its signed version must be the one
        ``origin`` ``advertised`` (not adopted: :meth:`fetched` does). Raises :class:`RejectedMessage` so that the
        fetcher counts it; the catalog's own reason is kept for :meth:`fetch_failed`."""
        served = 0
        try:
            try:
                doc = decode_signed(body)
            except CatalogRefused as exc:
                self.book.count(exc)
                raise
            served = doc.version
            self.book.check(doc, advertised=advertised)
        except CatalogRefused as exc:
            self._refusals[origin] = (exc.reason, served)
            reason = {"malformed": RejectReason.MALFORMED, "bad_signature": RejectReason.BAD_SIGNATURE,
                      "unknown_signer": RejectReason.WRONG_KEY, "older": RejectReason.STALE,
                      "below_floor": RejectReason.STALE, "version_mismatch": RejectReason.MISMATCH}.get(
                exc.reason, RejectReason.BAD_TYPE)
            raise RejectedMessage(reason, f"catalog {exc}") from None
        return Fetched(origin, doc)

    def fetched(self, f: Fetched) -> None:
        """A checked catalog from a member: adopted (:meth:`offer`) and credited to it. A newer one adopted in the
        meantime (counted ``older``) holds nothing against it; ``OSError`` (not persisted) is logged."""
        try:
            self.offer(f.doc, "fetch")
        except CatalogRefused as exc:
            log.info("fetched catalog not adopted: %s", exc)
            self.members.settled(f.origin, exc.reason, f.doc.version, self.clock())
            return
        except OSError as exc:
            log.error("fetched catalog version %d not adopted: cannot persist it: %s", f.doc.version, exc)
            self.members.settled(f.origin, "not_persisted", f.doc.version, self.clock())
            return
        self.members.adopted(f.origin, f.doc.version, self.clock())

    def fetch_failed(self, origin: str, reason: str) -> None:
        """A fetch from ``origin`` failed for the fetcher's ``reason`` (``unreachable``, ``http_404``,
        ``too_slow``...; the catalog's own refusal when the reply was checked): ``origin`` is skipped for a
        while, unless its reply was what it advertised and only lost a race (``older``)."""
        why, served = self._refusals.pop(origin, (reason, 0))
        now = self.clock()
        if why in _SETTLED:
            self.members.settled(origin, why, served, now)
            return
        until = self.members.failed(origin, why, now, served=served)
        log.warning("catalog fetch from %s refused (%s, served version %d): skipped for %.1f s", origin, why,
                    served, until - now)

    def view(self) -> dict[str, Any]:
        """For ``/status`` ``catalog``: whether pushed catalogs are accepted, the version held and its signer, the
        floor, how many were adopted by source, refusals by reason and the last one, and ``sources``: per member
        its advertised version and, for members tried, the result, the version served and ``skipped_for_s``
        (:meth:`p2pnode.scheduler.CatalogSources.view`; ``skipped_until`` added: Unix seconds), with failures by
        reason."""
        held = self.book.held
        now, wall = self.clock(), time.time()
        sources = self.members.view(now)
        for m in sources["members"].values():
            m["skipped_until"] = round(wall + m["skipped_for_s"], 1) if m["skipped_for_s"] else None
        return {"accepts_pushed": self.book.accepts, "version": self.book.version, "floor": self.book.floor,
                "signer": held.signer if held is not None else None, "adopted": dict(self.sources),
                "refused": {k: v for k, v in self.book.refused.items() if v}, "last_refusal": self.book.last_refusal,
                "sources": sources}
