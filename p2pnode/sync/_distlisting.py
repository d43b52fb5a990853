"""Reading other members' published listings (:mod:`._distribute`'s discovery): a member's snapshot lists its
first 64 publications by name; when it holds more (``published_total``), the rest are paged from
``POST /sync/dist/list`` whenever its ``published_digest`` changes (once per ``sync.interval_s`` at most).
Discovery requests are bounded (:data:`DISCOVERY_TIMEOUT_S`), and a member whose request failed backs off
(:class:`MemberBackoff`), so one member that never answers costs one bounded wait per backoff, not one per entry
per pass.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import httpx
import msgspec
import trio

from ..errors import SyncReplyRejected
from ..snapshot import HeldPublication, SyncSection
from ..synccore import FetchPlan
from ._distserve import LIST_PATH, LIST_REPLY, ListRequest, unbitmap

if TYPE_CHECKING:
    from ..node import NodeContext

__all__ = ["DISCOVERY_TIMEOUT_S", "Listings", "MAX_LISTED", "MEMBER_BACKOFF_S", "MemberBackoff"]

log = logging.getLogger(__name__)

MAX_LISTED = 1024
"""Entries read from one member's listing at most."""
MAX_LIST_REPLY = 2**20
DISCOVERY_TIMEOUT_S = 10.0
"""A member's answer to a listing or publication request within this many seconds (or ``sync.request_timeout_s``
when shorter), else it counts as failed and the member backs off (:data:`MEMBER_BACKOFF_S`)."""
MEMBER_BACKOFF_S = (2.0, 300.0)
"""A member whose discovery request failed is not asked again for 2 s, doubling per failure in a row up to 300 s."""

Post = Callable[[str, str, bytes, int, float], Awaitable[bytes]]
"""``post(member, path, body, reply limit, timeout_s) -> reply``: a signed request to a member."""


class MemberBackoff:
    """Members whose discovery requests failed: asked again after 2 s, doubling per failure in a row (trio time)."""

    def __init__(self) -> None:
        self.failing: dict[str, tuple[float, int]] = {}  # member -> (asked again after, failures in a row)

    def ok(self, node: str, now: float) -> bool:
        """``node`` may be asked now."""
        return self.failing.get(node, (0.0, 0))[0] <= now

    def failed(self, node: str, now: float) -> None:
        """A request to ``node`` failed (unreachable, timed out, an unreadable answer)."""
        _, n = self.failing.get(node, (0.0, 0))
        lo, hi = MEMBER_BACKOFF_S
        self.failing[node] = (now + min(hi, lo * 2.0 ** min(n, 16)), n + 1)

    def answered(self, node: str) -> None:
        """``node`` answered: its streak ends."""
        self.failing.pop(node, None)


class Listings:
    """The paged listings read from members: member -> (the digest it was read at, its entries)."""

    def __init__(self, ctx: NodeContext, post: Post, backoff: MemberBackoff, timeout_s: float, *,
                 min_interval_s: float = 0.0) -> None:
        self.ctx, self.post, self.backoff, self.timeout_s = ctx, post, backoff, timeout_s
        self.min_interval_s = min_interval_s
        """A member's listing is read again this long after the last read at the soonest (``sync.interval_s``:
        passes run sooner when a slot frees, and a subscriber's digest changes with every block it verifies)."""
        self.by_member: dict[str, tuple[str, list[HeldPublication]]] = {}
        self.read_at: dict[str, float] = {}  # member -> when its listing was last read (trio time)
        self.failures = 0

    def entries(self, node_id: str) -> list[HeldPublication]:
        """What ``node_id`` lists: its paged listing when it has one, else its snapshot's entries."""
        listed = self.by_member.get(node_id)
        if listed is not None:
            return listed[1]
        sec = self.ctx.section(node_id, SyncSection)
        return sec.published if sec is not None else []

    def tell_holders(self, plan: FetchPlan, bits: dict[str, bytes]) -> None:
        """Tell ``plan`` what each live member holds of its publication (members that list it and serve); a
        member's bitmap is decoded only when it changed (``bits``: the last one seen per member, the caller's)."""
        seen = set()
        for m in self.ctx.members(live=True):
            if m.origin == self.ctx.node_id:
                continue
            for e in self.entries(m.origin):
                if e.root == plan.pub.root and e.serves:
                    if bits.get(m.origin) != e.have or m.origin not in plan.holders:
                        plan.holder_has(m.origin, unbitmap(e.have, plan.pub.manifest.blocks))
                        bits[m.origin] = e.have
                    seen.add(m.origin)
        for h in [h for h in plan.holders if h not in seen]:
            plan.holder_gone(h)

    async def refresh(self) -> None:
        """List again, page by page, the members whose snapshot says their listing is paged and changed (each
        member within the timeout, all at once; members backing off are passed over)."""
        now = trio.current_time()
        want: list[tuple[str, str]] = []
        live = set()
        for m in self.ctx.members(live=True):
            if m.origin == self.ctx.node_id:
                continue
            live.add(m.origin)
            sec = self.ctx.section(m.origin, SyncSection)
            if sec is None or not sec.published_total or sec.published_total <= len(sec.published):
                self.by_member.pop(m.origin, None)
                continue
            cached = self.by_member.get(m.origin)
            if ((cached is None or cached[0] != sec.published_digest) and self.backoff.ok(m.origin, now)
                    and now >= self.read_at.get(m.origin, -self.min_interval_s) + self.min_interval_s):
                want.append((m.origin, sec.published_digest))
                self.read_at[m.origin] = now
        for node in [n for n in self.by_member if n not in live]:
            del self.by_member[node]
        for node in [n for n in self.read_at if n not in live]:
            del self.read_at[node]
        if want:
            async with trio.open_nursery() as n:
                for node, digest in want:
                    n.start_soon(self._list_member, node, digest)

    async def _list_member(self, node: str, digest: str) -> None:
        entries: list[HeldPublication] = []
        after = ""
        try:
            with trio.fail_after(self.timeout_s):
                while len(entries) < MAX_LISTED:
                    raw = await self.post(node, LIST_PATH, msgspec.msgpack.encode(ListRequest(after)),
                                          MAX_LIST_REPLY, self.timeout_s)
                    try:
                        page = LIST_REPLY.decode(raw)
                    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as exc:
                        raise SyncReplyRejected(f"listing of {node}: {str(exc)[:120]}") from None
                    for e in page.entries:  # strictly ascending names: a member cannot make this loop
                        if e.name > after:
                            entries.append(e)
                            after = e.name
                    if not page.more or not page.entries or entries[-1:] != page.entries[-1:]:
                        break
        except (httpx.HTTPError, OSError, SyncReplyRejected, trio.TooSlowError) as exc:
            self.backoff.failed(node, trio.current_time())
            self.failures += 1
            log.info("sync: the published listing of %s not read: %s", node, exc)
            return
        self.backoff.answered(node)
        self.by_member[node] = (digest, entries[:MAX_LISTED])
