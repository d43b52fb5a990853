"""Views encoded once per change: each member's row of ``/members``, ``/status`` and the dashboard is encoded to
JSON when what it shows changes, and served from those bytes with an ``ETag`` until then (issue 43, item 2).

A member's row depends on its snapshot entry (:class:`p2pnode.gossip.MemberEntry`: a new object for every newer
version and every role re-check; its role check, made only when an entry is made, and its power score, a function
of its snapshot's version, come with it) and on what this node decides about it: its membership state, the
operator's eligibility marks, whether it leads and whether it votes (and this node's own power score, which its
row shows). :class:`MemberRows` keeps, per member, those
inputs (the entry by identity, the rest by value) beside the encoded row, and re-encodes only a row whose inputs
differ; its ``generation`` rises whenever the list of rows changes (a row re-encoded, a member added or
gone), so ``(boot, generation)`` names the members' bytes exactly for this process. Relative times are not in a
row: a member's ``received_at`` is the wall-clock time its snapshot arrived here (the reader subtracts it from its
own ``now``), so a row does not change while nothing happens.

Conditional requests (RFC 9110 sections 8.8.3 and 13.1.2): every cached view carries a strong ``ETag`` and
``Cache-Control: no-cache`` (a cache must ask again every time); a request whose ``If-None-Match`` lists the
current tag (weak comparison, or ``*``) gets ``304 Not Modified`` with no body. The routes run behind the read
guard (:class:`p2pnode.http._app._ReadGuard`), so a request is authenticated before its tag is compared: without
the read token a matching tag still gets 401. A malformed ``If-None-Match`` is ignored (the full answer) and
counted (``if_none_match_ignored``).
"""

from __future__ import annotations

import bisect
import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ..gossip import MemberEntry, MemberState
from ..inputs import InputError, if_none_match
from ._surfaces import HttpCounters, HttpSurfaces

__all__ = ["MemberRows", "RowBuilder", "cached_reply", "not_modified", "tag_of"]

_ENCODER = msgspec.json.Encoder()
T = TypeVar("T")


def tag_of(*parts: str | bytes) -> str:
    """A short hex digest (16 characters, BLAKE2b) of ``parts``: the varying part of an entity tag."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(p.encode("utf-8") if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def not_modified(request: Request, etag: str, counters: HttpCounters) -> bool:
    """Whether ``request``'s ``If-None-Match`` lists ``etag`` (a strong tag with its quotes) or is ``*``: the
    answer is then 304. A malformed header is ignored (False) and counted in ``counters.if_none_match_ignored``."""
    try:
        tags = if_none_match(request.headers.get("if-none-match"))
    except InputError:
        counters.if_none_match_ignored += 1
        return False
    return tags is not None and ("*" in tags or etag in tags)


def cached_reply(request: Request, body: Callable[[], bytes], etag: str, counters: HttpCounters) -> Response:
    """``body()`` (JSON) with ``etag``, or 304 without a body (``body`` not called) when the request already holds
    it."""
    headers = {"etag": etag, "cache-control": "no-cache"}
    if not_modified(request, etag, counters):
        counters.not_modified += 1
        return Response(status_code=304, headers=headers)
    return Response(body(), media_type="application/json", headers=headers)


class _Row(msgspec.Struct):
    """One member's encoded row and the inputs it was built from."""

    entry: MemberEntry
    key: tuple[Any, ...]
    data: bytes


class RowBuilder(Protocol):
    """Builds one member's row (:func:`p2pnode.http._views.member_row`)."""

    def __call__(self, s: HttpSurfaces, e: MemberEntry, state: MemberState, power_score: float, *, leader: bool,
                 voter: bool, received_at: float) -> dict[str, Any]: ...


class MemberRows:
    """Every member's row (``build``: :func:`p2pnode.http._views.member_row`) encoded once per change, in id order.

    :meth:`refresh` walks the members (a few lookups each, no encoding unless a row's inputs changed) and returns
    the generation; :meth:`page` and :meth:`joined` serve the bytes. ``boot`` is random per process, so a tag
    from before a restart never matches."""

    def __init__(self, build: RowBuilder) -> None:
        self.build = build
        self.boot = secrets.token_hex(4)
        self.generation = 0
        self.encoded = 0
        """Rows encoded since start (a row's inputs changed, or it is new)."""
        self._rows: dict[str, _Row] = {}
        self._ids: list[str] = []
        self._data: list[bytes] = []
        self._joined: bytes | None = None
        self._held: list[tuple[MemberEntry, MemberState]] = []
        self._memo: dict[str, tuple[int, Any, Any]] = {}

    def refresh(self, s: HttpSurfaces) -> int:
        """Re-encode the rows whose inputs changed since the last call; the generation (raised on any change)."""
        node_id, core = s.node.node_id, s.core
        leader, voters = core.view.leader, core.roll.members
        eligible, ineligible = core.roll.eligible, core.roll.ineligible
        own_score = core.candidate.power_score  # ours (and a member's without election info) may move alone
        now, wall = s.node.now(), time.time()
        old, rows = self._rows, {}
        changed = False
        for e in s.cluster.unordered():
            origin = e.origin
            key = (core.state_of(origin) or MemberState.ALIVE, origin in eligible, origin in ineligible,
                   origin == leader, origin in voters, own_score)
            row = old.get(origin)
            if row is None or row.entry is not e or row.key != key:
                info = core.info(origin) if origin != node_id else None
                data = _ENCODER.encode(self.build(
                    s, e, key[0], info.candidate.power_score if info else own_score,
                    leader=key[3], voter=key[4], received_at=round(wall - max(0.0, now - e.received_at), 3)))
                row = _Row(e, key, data)
                self.encoded += 1
                changed = True
            rows[origin] = row
        self._rows = rows
        if changed or len(rows) != len(old):  # same count and nothing new: the same members
            self.generation += 1
            self._ids = sorted(rows)
            self._data = [rows[i].data for i in self._ids]
            self._joined = None
            self._held = [(r.entry, r.key[0]) for r in rows.values()]
        return self.generation

    def held(self) -> list[tuple[MemberEntry, MemberState]]:
        """Every member's entry and state as of the last :meth:`refresh` (in no particular order)."""
        return self._held

    def memo(self, name: str, key: Any, compute: Callable[[list[tuple[MemberEntry, MemberState]]], T]) -> T:
        """``compute(self.held())``, computed again only when the generation or ``key`` (what else it reads,
        compared by value) changed since the last call for ``name``: a view derived from the rows alone."""
        kept = self._memo.get(name)
        if kept is not None and kept[0] == self.generation and kept[1] == key:
            return kept[2]
        value = compute(self._held)
        self._memo[name] = (self.generation, key, value)
        return value

    def joined(self) -> bytes:
        """Every row as one JSON array (members in id order)."""
        if self._joined is None:
            self._joined = b"[" + b",".join(self._data) + b"]"
        return self._joined

    def page(self, after: str | None, limit: int | None) -> tuple[bytes, str | None]:
        """The JSON array of at most ``limit`` rows (None: all) whose ids sort after ``after`` (None: from the
        first), and the id to ask ``after`` next (None: no more)."""
        if after is None and limit is None:
            return self.joined(), None
        start = bisect.bisect_right(self._ids, after) if after is not None else 0
        stop = len(self._ids) if limit is None else min(len(self._ids), start + limit)
        nxt = self._ids[stop - 1] if stop < len(self._ids) and stop > start else None
        return b"[" + b",".join(self._data[start:stop]) + b"]", nxt

    def etag(self, *parts: str | bytes) -> str:
        """A strong entity tag for a view of the current rows (and ``parts``, what else the view holds)."""
        return f'"{self.boot}-{self.generation}' + (f'-{tag_of(*parts)}"' if parts else '"')
