"""Which member a node fetches a pushed catalog from, and what each member's advertisement turned out to be worth.
Pure (no I/O; ``now`` in monotonic seconds is passed in).

A member advertises the version of the signed catalog it holds (``jobs.catalog_version`` in its signed
snapshot). The snapshot's signature proves who says so, not that it is true: a member may advertise 2^53-1 and
serve an older, genuinely signed catalog (anyone can read one at ``GET /catalog/signed``), or serve nothing at
all (issue 37, attack 1). Taken at its word, such a member rolls a fresh node back to a withdrawn catalog and
freezes the fleet: every node keeps fetching from the highest advertiser and never from the members that hold the
real newest one. The rules here:

* **Candidates** (:meth:`CatalogSources.candidates`): members advertising a version above the one held and at
  least the floor (the highest version this node verified and adopted, persisted), not skipped; ranked by their
  failures in a row (fewest first: a holder that never failed goes before every one that did, whatever the
  latter advertise), then highest advertised version, then node id. The driver fetches from the first
  :data:`FETCH_PARALLEL` at once and adopts the first reply that verifies. So ``L`` liars cost a fresh node at most
  ``ceil(L / FETCH_PARALLEL)`` rounds of failed fetches (each at most the driver's fetch deadline) before an
  honest holder is asked, however many versions they advertise: once each failed, every honest holder ranks
  before them, and their skips ending does not put them first again.
* **The reply must be what was advertised**: the driver refuses a served catalog whose signed version differs
  from the version advertised for it (``version_mismatch``), as well as one that does not decode, verify or
  validate, and an unreachable member or an HTTP error; :meth:`CatalogSources.failed` records the reason.
* **A member that failed is skipped** for ``skip_s × 2^(k-1)`` seconds, at most ``max_skip_s``, ``k`` its
  failures in a row (reset by an adoption from it), whatever it advertises meanwhile: a liar cannot escape its
  skip by advertising another number, and the next candidate is tried at once, so one liar delays a new version
  by one failed fetch, never freezes it (its failures, kept past its skip, also rank it behind the holders that
  never failed).

Results per member (:data:`RESULTS` and every refusal reason of :data:`p2pnode.scheduler.REFUSALS`): ``adopted``,
``version_mismatch``, ``unreachable``, ``http_<status>``, ``too_slow`` and the rest; :meth:`view` shows them with
each member's advertised version and how long it stays skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import msgspec

__all__ = ["CatalogSources", "FETCH_PARALLEL", "MAX_SOURCES", "MAX_VIEWED", "RESULTS", "SourceState"]

FETCH_PARALLEL = 3
"""Candidates fetched from at once (the first reply that verifies is adopted; the others settle as ``older``)."""

RESULTS = ("adopted", "version_mismatch", "unreachable", "too_slow", "bad_data")
"""Results a member's fetch can have besides the refusal reasons of a signed catalog (and ``http_<status>``)."""
MAX_SOURCES = 4096
"""Members remembered at most (skipped members that left stay until their skip ends, within this bound)."""
MAX_VIEWED = 256
"""Members shown by :meth:`CatalogSources.view` at most (those tried last)."""


class SourceState(msgspec.Struct):
    """What this node knows of one member as a catalog source: the version it ``advertised`` last, the
    ``result`` of the last fetch from it ("" never tried), the ``served`` version of that reply (0: none
    decoded), ``failures`` in a row, ``skip_until`` (monotonic seconds; 0: not skipped) and ``tried_at``."""

    advertised: int = 0
    result: str = ""
    served: int = 0
    failures: int = 0
    skip_until: float = 0.0
    tried_at: float = -math.inf


class CatalogSources:
    """See the module docstring. ``skip_s``: the first skip after a failure (seconds), doubling up to
    ``max_skip_s``. Counters: :attr:`refused` (failures by reason, every member), :attr:`adopted_from`."""

    def __init__(self, *, skip_s: float = 2.0, max_skip_s: float = 120.0) -> None:
        self.skip_s = skip_s
        self.max_skip_s = max_skip_s
        self.members: dict[str, SourceState] = {}
        self.refused: dict[str, int] = {}
        self.adopted_from = 0

    def advertised(self, versions: Iterable[tuple[str, int]], now: float) -> None:
        """The ``(member, advertised catalog version)`` of the live members now. A member no longer listed is
        forgotten unless it is still skipped (so leaving and coming back does not clear its skip)."""
        seen = set()
        for origin, version in versions:
            seen.add(origin)
            s = self.members.get(origin)
            if s is None:
                if len(self.members) >= MAX_SOURCES:
                    continue
                s = self.members[origin] = SourceState()
            s.advertised = version
        for origin in [o for o, s in self.members.items() if o not in seen and s.skip_until <= now]:
            del self.members[origin]

    def candidates(self, held: int, floor: int, now: float) -> list[tuple[str, int]]:
        """``(member, advertised)`` that may serve a catalog this node would adopt, best first: advertised above
        ``held`` and at least ``floor``, not skipped at ``now``; fewest failures in a row first, then highest
        advertised version, then node id (the module docstring)."""
        out = [(s.failures, -s.advertised, o) for o, s in self.members.items()
               if s.advertised > held and s.advertised >= floor and s.skip_until <= now]
        out.sort()
        return [(o, -negv) for _f, negv, o in out]

    def choose(self, held: int, floor: int, now: float) -> tuple[str, int] | None:
        """The member to fetch from now and the version it advertised (the first of :meth:`candidates`), or
        None (nothing newer advertised, or every holder skipped)."""
        c = self.candidates(held, floor, now)
        return c[0] if c else None

    def started(self, origin: str, now: float) -> None:
        """A fetch from ``origin`` began."""
        s = self.members.get(origin)
        if s is not None:
            s.tried_at = now

    def failed(self, origin: str, reason: str, now: float, *, served: int = 0) -> float:
        """A fetch from ``origin`` failed for ``reason`` (counted), having served version ``served`` (0: none
        decoded). Returns the monotonic time until which ``origin`` is skipped."""
        self.refused[reason] = self.refused.get(reason, 0) + 1
        s = self.members.get(origin)
        if s is None:
            if len(self.members) >= MAX_SOURCES:
                return now
            s = self.members[origin] = SourceState()
        s.failures += 1
        s.result, s.served, s.tried_at = reason, served, now
        s.skip_until = now + min(self.max_skip_s, self.skip_s * 2.0 ** min(s.failures - 1, 32))
        return s.skip_until

    def adopted(self, origin: str, version: int, now: float) -> None:
        """The catalog fetched from ``origin`` (its ``version``) was adopted: its failures are forgotten."""
        self.adopted_from += 1
        s = self.members.get(origin)
        if s is not None:
            s.failures, s.skip_until = 0, 0.0
            s.result, s.served, s.tried_at = "adopted", version, now

    def settled(self, origin: str, result: str, version: int, now: float) -> None:
        """A reply from ``origin`` that was what it advertised but not adopted (``result``, e.g. ``older``: a
        newer one won the race): noted, not held against it, and its failures in a row end (it answered truly, so
        an old ``too_slow`` no longer ranks it behind liars that failed once)."""
        s = self.members.get(origin)
        if s is not None:
            s.result, s.served, s.tried_at = result, version, now
            s.failures, s.skip_until = 0, 0.0

    def next_deadline(self, held: int, floor: int) -> float:
        """When a skipped member that would be a candidate may be tried again (monotonic seconds; ``inf`` when
        none waits)."""
        return min((s.skip_until for s in self.members.values()
                    if s.advertised > held and s.advertised >= floor and s.skip_until > 0), default=math.inf)

    def view(self, now: float) -> dict[str, Any]:
        """``{"members": {id: {advertised, result, served, failures, skipped_for_s}}, "refused": {reason: n},
        "adopted_from": n}`` for the members tried (the :data:`MAX_VIEWED` tried last; every member's advertised
        version is in its snapshot); ``skipped_for_s`` is seconds from ``now`` (0: not skipped)."""
        tried = sorted((s.tried_at, o) for o, s in self.members.items() if s.result)[-MAX_VIEWED:]
        return {"members": {o: {"advertised": s.advertised, "result": s.result, "served": s.served,
                                "failures": s.failures,
                                "skipped_for_s": round(max(0.0, s.skip_until - now), 1)}
                            for o, s in sorted((o, self.members[o]) for _, o in tried)},
                "refused": dict(self.refused), "adopted_from": self.adopted_from}
