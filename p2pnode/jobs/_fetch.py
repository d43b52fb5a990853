"""Fetching what the snapshot only names by digest: this node's part of the leader's plan, a predecessor's whole
plan, members' running-job lists (driver; the checks and the retry policy are in :mod:`p2pnode.node._plandist`).

Job control asks with :meth:`PlanFetcher.want` (a key, the digest wanted, the member to ask, the path, and the
function that checks and decodes the reply); the fetcher's loop fetches what is due, at most
:data:`CONCURRENCY` at a time, and hands each checked document to :meth:`PlanFetcher.get`'s readers. A failed or
refused fetch is counted by reason and retried with backoff; nothing unchecked is ever kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import trio

from ..errors import DATA_ERRORS, RejectedMessage
from ..node import NodeContext
from ..node._plandist import Fetches

__all__ = ["CONCURRENCY", "PlanFetcher", "Want"]

log = logging.getLogger(__name__)

CONCURRENCY = 8
"""Fetches under way at once (a leader fetching many members' running lists)."""
TIMEOUT_S = 10.0


class Want(msgspec.Struct, frozen=True):
    """A document wanted: ``key`` (e.g. ``("part", leader)``), its ``digest`` (a version string), the member
    ``origin`` that serves it at ``path``, ``open`` (bytes -> checked document; raises
    :class:`RejectedMessage`) and ``deadline_s`` (seconds the whole fetch may take, else ``too_slow``; None: only
    the per-read timeout)."""

    key: tuple[str, str]
    digest: str
    origin: str
    path: str
    open: Callable[[bytes], Any]
    deadline_s: float | None = None


class PlanFetcher:
    """The fetch driver of one node (see module docstring). ``sign(method, target, receiver)`` returns the headers
    that authenticate a peer read on the member ``receiver`` (a node id; signed for it alone)."""

    def __init__(self, ctx: NodeContext, sign: Callable[[str, str, str], dict[str, str]] | None = None) -> None:
        self.ctx = ctx
        self.sign = sign or (lambda method, target, receiver: {})
        self.fetches = Fetches()
        self.docs: dict[tuple[str, str], Any] = {}
        self._wants: dict[tuple[str, str], Want] = {}
        self._wake = trio.Event()
        self.on_fetched: Callable[[tuple[str, str], str, Any], None] = lambda key, version, doc: None
        """Called with ``(key, version, document)`` for each document fetched and checked."""
        self.on_failed: Callable[[Want, str], None] = lambda w, reason: None
        """Called with ``(want, reason)`` for each fetch that failed or was refused (the reason counted)."""
        self.bytes_fetched = 0

    def get(self, key: tuple[str, str], digest: str | None = None) -> Any:
        """The document held for ``key`` (only at ``digest`` when given), or None."""
        if digest is not None and self.fetches.held.get(key) != digest:
            return None
        return self.docs.get(key)

    def want(self, w: Want) -> None:
        """Ask for ``w`` (a no-op when it is held at that digest already); the loop wakes at once."""
        if self.fetches.held.get(w.key) == w.digest:
            return
        old = self._wants.get(w.key)
        self._wants[w.key] = w
        if old is None or old.digest != w.digest:
            self._wake.set()

    def forget(self, key: tuple[str, str]) -> None:
        """Drop ``key`` (its member is gone)."""
        self.docs.pop(key, None)
        self._wants.pop(key, None)
        self.fetches.forget(key)

    def keys(self) -> list[tuple[str, str]]:
        """Keys of every document held."""
        return list(self.docs)

    async def run(self) -> None:
        """Fetch what is wanted and due, forever: woken by :meth:`want` and by each fetch that ends, else at the
        end of the earliest retry backoff (:meth:`p2pnode.node._plandist.Fetches.next_due`)."""
        limit = trio.CapacityLimiter(CONCURRENCY)
        async with trio.open_nursery() as n:
            while True:
                self._wake = trio.Event()
                now = trio.current_time()
                for key, w in list(self._wants.items()):
                    if self.fetches.held.get(key) == w.digest:
                        del self._wants[key]
                    elif self.fetches.due(key, w.digest, now):
                        self.fetches.started(key)
                        n.start_soon(self._fetch, w, limit)
                due = self.fetches.next_due((k, w.digest) for k, w in self._wants.items())
                with trio.move_on_at(due):
                    await self._wake.wait()

    async def _fetch(self, w: Want, limit: trio.CapacityLimiter) -> None:
        try:
            await self._fetch_one(w, limit)
        finally:
            self._wake.set()  # a fetch ended: a retry may be due later, or a newer digest waits

    async def _fetch_one(self, w: Want, limit: trio.CapacityLimiter) -> None:
        try:
            async with limit:
                if w.deadline_s is None:
                    doc = await self._get(w)
                else:
                    with trio.fail_after(w.deadline_s):
                        doc = await self._get(w)
        except RejectedMessage as exc:
            self._failed(w, exc.reason.value, f"refused: {exc}")
            return
        except (httpx.HTTPError, OSError) as exc:
            self._failed(w, "unreachable", f"failed: {exc}")
            return
        except trio.TooSlowError:
            self._failed(w, "too_slow", f"not done within {w.deadline_s} s")
            return
        except _HttpStatus as exc:
            self._failed(w, f"http_{exc.status}", f"HTTP {exc.status}")
            return
        except DATA_ERRORS as exc:  # a reply that slipped past its decoder: that member is set aside, not the loop
            self._failed(w, "bad_data", f"bad data: {exc}")
            self.ctx.quarantine(w.origin, f"{w.key[0]} fetch", exc)
            return
        self.docs[w.key] = doc
        self.fetches.done(w.key, w.digest)
        cur = self._wants.get(w.key)
        if cur is not None and cur.digest == w.digest:
            del self._wants[w.key]
        self.on_fetched(w.key, w.digest, doc)

    def _failed(self, w: Want, reason: str, what: str) -> None:
        self.fetches.failed(w.key, w.digest, reason, trio.current_time())
        log.info("fetch of %s from %s %s", w.key[0], w.origin, what)
        self.on_failed(w, reason)

    async def _get(self, w: Want) -> Any:
        m = self.ctx.member(w.origin)
        client = self.ctx.client
        if m is None or not m.addr or client is None:
            raise OSError(f"{w.origin} has no address")
        t0 = time.perf_counter()
        async with client.stream("GET", f"http://{m.addr}{w.path}", headers=self.sign("GET", w.path, w.origin),
                                 timeout=TIMEOUT_S) as r:
            if r.status_code != 200:
                raise _HttpStatus(r.status_code)
            chunks, size = [], 0
            async for chunk in r.aiter_bytes():
                size += len(chunk)
                if size > 64 * 2**20:
                    raise OSError("reply over 64 MiB")
                chunks.append(chunk)
        data = b"".join(chunks)
        self.bytes_fetched += len(data)
        doc = w.open(data)
        log.debug("fetched %s from %s: %d bytes in %.3f s", w.key[0], w.origin, len(data), time.perf_counter() - t0)
        return doc

    def view(self) -> dict[str, Any]:
        """Counters for ``GET /jobs``: documents fetched, failures by reason, bytes, documents held, and per kind
        of document (``running``, ``usage``, ``part``, ``whole``, ``catalog``) those fetched and failed by reason."""
        f = self.fetches
        kinds = sorted(set(f.fetched_by_kind) | set(f.failed_by_kind))
        return {"fetched": f.fetched, "failed": dict(f.failed_by_reason), "bytes": self.bytes_fetched,
                "held": len(self.docs),
                "by_kind": {k: {"fetched": f.fetched_by_kind.get(k, 0), "failed": dict(f.failed_by_kind.get(k, {}))}
                            for k in kinds}}


class _HttpStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status
