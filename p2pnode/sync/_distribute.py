"""Distribution's driver: files published on a durable node reach every subscribed node, block by block from any
member that holds them, each block checked against the publisher's signed manifest (docs/sync.md, distribution).

The rules are the pure core's (:mod:`p2pnode.synccore._distribute`: which publications a node accepts, which
holder it asks for which block, which previous versions may go); this module moves the bytes:

- **Publishing**: :meth:`Distributor.publish` takes a signed :class:`~p2pnode.synccore.Publication` and the file,
  copies the file aside (:mod:`._distfiles`), checks the copy against the manifest and holds it; the node's
  snapshot then lists it (``sync.published``). A ``sync.publish`` folder is published the same way, signed with
  the node's key, each file once settled.
- **Serving** (:mod:`._distserve`; ``POST /sync/dist/publication|blocks|list``): requests signed by a member's key
  (:func:`~._wire.sign_headers`, as pushes are), for a root this node holds from an accepted or its own
  publication, blocks it has; at most ``publish_serve_streams`` at once (503 ``busy`` beyond), paced by
  ``publish_max_bytes_per_s``. A node with ``serve_published = false`` serves nothing and says so in its snapshot.
- **Fetching**: every pass, peers' ``sync.published`` entries (paged by :mod:`._distlisting` past 64) addressed
  to this node's tags with a version above its floor are fetched as a publication from the member that lists it
  (each in its own task, :data:`MAX_CONSIDERING` at once; a refusal remembered for that member only), checked
  (:class:`PublicationBook`: pinned key, signature, manifest, version, free disk less the guard's reserve and what
  the fetches under way still write), persisted with the new floor, then fetched block by block into a partial
  file (:class:`FetchPlan` says from whom), each block checked before it is written; when all are in, the file is
  fsynced, renamed to its version, and ``<subscribe_dir>/<name>`` switched to it by rename; ``MODEL_UPDATED`` is
  emitted. Previous versions go when no job of this node that started while they were current still runs
  (:class:`VersionKeeper`, from the node's own ``jobs`` section).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import Counter, deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import trio

from ..config import SyncConfig
from ..errors import SyncReplyRejected
from ..snapshot import HeldPublication, JobsSection
from ..synccore import (
    FetchBlocks,
    FetchPlan,
    FetchPolicy,
    HolderHealth,
    Manifest,
    Publication,
    PublicationBook,
    PublicationRefused,
    VersionKeeper,
    block_size_for,
    decode_publication,
    hash_file,
    sign_publication,
)
from ._blocks import read_reply
from ._distfiles import DistFiles, Holding
from ._distlisting import DISCOVERY_TIMEOUT_S, Listings, MemberBackoff
from ._distserve import (
    BLOCKS_PATH,
    LIST_PATH,
    MAX_PUBLISH_BODY,
    PUBLICATION_PATH,
    PUBLISH_REQUEST,
    SERVE_REFUSALS,
    BlocksRequest,
    BlockStream,
    DistServer,
    PubRequest,
    Refused,
    decode_request,
)
from ._distview import distribution_view
from ._wire import sign_headers

if TYPE_CHECKING:
    from ..node import NodeContext

__all__ = ["BLOCKS_PATH", "Distributor", "LIST_PATH", "MAX_PUBLISH_BODY", "PUBLICATION_PATH", "SERVE_REFUSALS"]

log = logging.getLogger(__name__)

MAX_CONSIDERING = 8
"""Publications fetched and checked at once (one per name), each in its own task: one slow member never holds up
the others' entries."""
MAX_CONSIDERING_PER_MEMBER = 4
"""Of those, asked of one member at most; members' entries are taken in turn, so a member listing many entries
that hang or are forged holds half the slots at most, and the others' entries are asked in the same pass."""
HOSTILE_REFUSALS = frozenset({"malformed", "bad_name", "bad_signature", "bad_manifest"})
"""Refusals of a publication a member served that an honest member never causes (it checked the same rules before
listing it): the member backs off (:class:`~._distlisting.MemberBackoff`) as if it had not answered, so forged
entries cost a few requests per backoff, not one per entry."""
MAX_FETCHING = 4
"""Publications whose blocks are fetched at once (the others accepted wait their turn, their partial files open):
with ``fetch_max_streams`` per fetch, the requests under way stay within the shared HTTP client's 64 connections,
and a member claiming every block of many publications and never answering holds ``fetch_streams_per_holder`` x 4
of them at most."""
HOLDERS_REFRESH_S = 0.5
"""A fetch reads what members hold (their listings' bitmaps) again this long after the last read at the soonest,
not after every request (a read walks every member's entries; a snapshot changes about once a gossip interval)."""
CONNECT_TIMEOUT_S = 5.0
BUSY_BACKOFF_S = 0.2
"""A holder that answered 503 ``busy`` is asked again after this many seconds (other holders meanwhile)."""
MAX_REMEMBERED = 4096
"""Refused publications remembered (not asked again) at most; beyond, the memory is cleared."""



class Distributor:
    """Distribution for one node (module docstring). Counters: ``bytes_served``, ``bytes_fetched`` (by holder),
    ``serve_refused``, ``fetch_failures``, ``bad_blocks`` (by holder: blocks that did not match their hash)."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig) -> None:
        self.ctx = ctx
        self.cfg = cfg
        sub = Path(cfg.subscribe_dir).absolute() if cfg.subscribe_dir else ctx.data_dir / "published"
        self.files = DistFiles(ctx.data_dir / ".sync" / "dist", sub)
        self.book = PublicationBook(cfg.publishers)
        self.keeper = VersionKeeper()
        self.holdings: dict[str, Holding] = {}  # name -> the newest version held or fetched here
        self.plans: dict[str, FetchPlan] = {}  # name -> fetch under way
        self._save_lock = trio.Lock()
        self.tags = frozenset(ctx.config.agent.tags)
        self.server = DistServer(ctx, cfg, self.files, self.holdings, self.book)
        self.serve_refused = self.server.serve_refused
        self.damaged = self.server.damaged  # names whose file failed a read: served no more until re-verified
        self.backoff = MemberBackoff()
        self.listings = Listings(ctx, self._post, self.backoff, min(DISCOVERY_TIMEOUT_S, cfg.request_timeout_s),
                                 min_interval_s=cfg.interval_s)
        self.policy = FetchPolicy(streams_per_holder=cfg.fetch_streams_per_holder, max_streams=cfg.fetch_max_streams)
        self.health = HolderHealth()  # holders backing off, shared by every fetch (one timeout counts in all)
        self._fetch_slots = trio.Semaphore(MAX_FETCHING)
        self.bytes_fetched: Counter[str] = Counter()
        self.fetch_failures = 0
        self.bad_blocks: Counter[str] = Counter()  # holder -> blocks from it that did not match their hash
        self.updated = 0
        self.passes = 0
        self.skipped: set[tuple[str, str, int, bytes]] = set()  # (holder, name, version, root) refused: not again
        self._considering: dict[str, str] = {}  # name -> the member its publication is being fetched from
        self._more_wanted = False  # the last pass left wanted entries for want of a slot
        self._relinked: list[Publication] = []  # verified versions whose link load() switched (announced by run)
        self._short_of_space: set[tuple[str, int, bytes]] = set()  # refused no_space (logged once, asked again)
        self._scanned: dict[str, tuple[int, int]] = {}  # the publish folder: name -> (size, mtime_ns) published
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None

    # -- start, loop ---------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Read back the floors and held publications (blocking): complete versions are held and served again,
        incomplete ones resume on the next pass."""
        self.files.prepare()
        floors, pubs = self.files.load_state()
        for name, version in self.files.floors_on_disk().items():  # a lost state file loses no floor
            floors[name] = max(floors.get(name, 0), version)
        self.book.floors.update(floors)
        for pub in pubs:
            own = self.files.published_path(pub)
            done = self.files.version_path(pub)
            if own.exists():
                self.holdings[pub.name] = Holding(pub, own, None, origin=True)
                continue
            if not self._still_trusted(pub):
                continue  # its key no longer pinned, or no longer addressed here: not served, fetched or switched
            if done.exists():
                self.holdings[pub.name] = Holding(pub, done, None)
                self.book.current[pub.name] = pub
                if self.files.relink(pub):  # killed between its rename and its switch: switched in now
                    self._relinked.append(pub)
                # current since before this start: a job re-adopted after the restart may have started under it
                self.keeper.switched(pub.name, pub.version, 0.0)
            else:  # partly fetched, or accepted (its floor saved) just before a kill, its partial file not made yet
                self.book.current[pub.name] = pub
                self.holdings[pub.name] = Holding(pub, self.files.partial_path(pub), set())
        now = time.time()
        for name, version in self.files.leftovers([h.pub for h in self.holdings.values()]):
            self.keeper.kept(name, version, 0.0, now)  # a job older than this start may still read it

    def _still_trusted(self, pub: Publication) -> bool:
        """A publication read back at start passes today's checks: its publisher still pinned in ``sync.publishers``,
        its signature, its tag still this node's (a key removed before a restart is obeyed no longer; refusals
        counted as at intake)."""
        if not self._for_me(pub.to):
            return False
        try:
            self.book.check(pub, restoring=True)
        except PublicationRefused as exc:
            log.warning("sync: held publication %s v%d dropped at start: %s", pub.name, pub.version, exc)
            return False
        return True

    async def run(self) -> None:
        """Load the state, then a pass every ``sync.interval_s`` (or at once on :meth:`wake`) until cancelled;
        fetches run in this task's nursery."""
        await trio.to_thread.run_sync(self.load)
        for pub in self._relinked:
            self._switched_in(pub, self.files.version_path(pub))
        async with trio.open_nursery() as n:
            self._nursery = n
            while True:
                try:
                    await self.pass_once()
                except (OSError, httpx.HTTPError) as exc:
                    log.warning("sync: distribution pass failed: %s", exc)
                with trio.move_on_after(self.cfg.interval_s):
                    await self._wake.wait()
                self._wake = trio.Event()

    def wake(self) -> None:
        """Run a pass now (a peer's snapshot may list a new publication)."""
        self._wake.set()

    async def pass_once(self) -> None:
        """Publish the ``sync.publish`` folder's new files, start fetches of new publications addressed here, and
        remove previous versions no running job started under."""
        if self.cfg.publish:
            await self._scan_publish_folder()
        for name, h in list(self.holdings.items()):
            if (h.have is not None and name not in self.plans and name not in self._considering
                    and self._nursery is not None):
                try:
                    await self._start_fetch(h.pub)  # resumed after a restart
                except OSError as exc:  # one publication's files never stop the others'
                    log.warning("sync: cannot resume %s v%d: %s", h.pub.name, h.pub.version, exc)
        for name in list(self.damaged):
            await self._reverify(name)
        await self._discover()
        jobs = self.ctx.section(self.ctx.node_id, JobsSection)
        if jobs is not None and not jobs.running_inline:
            self.passes += 1  # the running list is not inline (more than INLINE_RUNNING jobs): remove nothing
            return
        for name, version in self.keeper.removable([j.started_at for j in jobs.running] if jobs else []):
            await trio.to_thread.run_sync(self.files.remove_version, name, version)
        self.passes += 1

    async def _reverify(self, name: str) -> None:
        """A read of ``name``'s file failed while serving it: hash it again; whole, it is served again; damaged, a
        fetched copy is fetched again into a partial file (committed over the damaged one), a published one stays
        refused (logged: nothing here can mend it)."""
        h = self.holdings.get(name)
        if h is None or h.have is not None:
            self.damaged.discard(name)
            return
        try:
            m = await trio.to_thread.run_sync(_hash, h.path, h.pub.block_size)
            whole = m.root == h.pub.root
        except OSError:
            whole = False
        if whole:
            self.damaged.discard(name)
            return
        if h.origin:
            log.error("sync: published %s v%d is damaged on disk; not served", h.pub.name, h.pub.version)
            return
        log.warning("sync: %s v%d is damaged on disk; fetching it again", h.pub.name, h.pub.version)
        self.damaged.discard(name)
        self.holdings[name] = Holding(h.pub, self.files.partial_path(h.pub), set())
        if self._nursery is not None:
            await self._start_fetch(h.pub)

    # -- publishing ----------------------------------------------------------------------------------------------
    async def publish(self, src: Path, pub: Publication) -> None:
        """Hold ``pub`` as published by this node, its bytes copied from ``src`` and checked against its manifest.
        Raises :class:`PublicationRefused` (a bad name, ``stale_version``: not above what this node published or
        holds for that name), ``ValueError`` (the file does not match), ``OSError``."""
        held = self.holdings.get(pub.name)
        if pub.version <= max(self.book.floors.get(pub.name, 0), held.pub.version if held else 0):
            raise PublicationRefused("stale_version", f"{pub.name!r} v{pub.version} is not above the one held")
        path = await trio.to_thread.run_sync(self.files.store_published, src, pub)
        old = self.holdings.get(pub.name)
        self.holdings[pub.name] = Holding(pub, path, None, origin=True)
        self.book.floors[pub.name] = pub.version
        await self._save()
        if old is not None and old.origin:
            await trio.to_thread.run_sync(lambda: old.path.unlink(missing_ok=True))
        log.info("sync: published %s v%d (%d bytes) to %s", pub.name, pub.version, pub.size,
                 f"tag:{pub.to}" if pub.to else "every subscriber")
        self.ctx.publish_soon()

    async def publish_request(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /sync/publish`` (``p2pnode sync publish``): msgpack ``{path, publication}``, the publication signed
        by an operator key this node pins itself (``sync.publishers``: the signature is what lets a request make
        this node read ``path`` and serve it). (HTTP status, JSON answer): 200 published; 400 malformed; 403 a
        refused publication (its reason); 409 not above the version held; 422 the file does not match."""
        try:
            req = decode_request(PUBLISH_REQUEST, body)
            pub = decode_publication(req.publication)
            if pub.publisher not in self.book.publishers:
                raise PublicationRefused("unpinned", f"{pub.publisher[:60]} is not in this node's sync.publishers")
            self.book.check(pub, restoring=True)  # name, signature, manifest (the version: below)
            await self.publish(Path(req.path), pub)
        except Refused as exc:
            return 400, {"error": exc.reason, "detail": str(exc)}
        except PublicationRefused as exc:
            return (409 if exc.reason == "stale_version" else 403), {"error": exc.reason, "detail": exc.detail}
        except (OSError, ValueError) as exc:
            return 422, {"error": "unreadable", "detail": str(exc)[:300]}
        return 200, {"published": pub.name, "version": pub.version, "size": pub.size, "root": pub.root.hex(),
                     "to": pub.to}

    async def _scan_publish_folder(self) -> None:
        root = Path(self.cfg.publish)
        now = time.time()
        try:
            entries = sorted(root.iterdir())
        except OSError:
            return
        for p in entries:
            try:
                st = p.stat()
            except OSError:
                continue
            name = p.name
            if name.startswith(".") or not p.is_file() or now - st.st_mtime < self.cfg.settle_s:
                continue
            if self._scanned.get(name) == (st.st_size, st.st_mtime_ns):
                continue
            try:
                bs = block_size_for(st.st_size)
                m = await trio.to_thread.run_sync(_hash, p, bs)
                held = self.holdings.get(name)
                if held is not None and held.pub.root == m.root:
                    self._scanned[name] = (st.st_size, st.st_mtime_ns)
                    continue
                version = max(int(now), self.book.floors.get(name, 0) + 1)
                ident = self.ctx.identity
                pub = sign_publication(ident.sign, ident.public_key, name, version, m, self.cfg.publish_to)
                await self.publish(p, pub)
                self._scanned[name] = (st.st_size, st.st_mtime_ns)
            except (OSError, ValueError, PublicationRefused) as exc:
                log.warning("sync: cannot publish %s: %s", p, exc)

    async def _save(self) -> None:
        """Write the floors and held publications; one write at a time (two threads replacing one file through
        the same temporary name race)."""
        async with self._save_lock:
            pubs = [h.pub for h in self.holdings.values()]
            floors = dict(self.book.floors)
            await trio.to_thread.run_sync(self.files.save_state, floors, pubs)

    # -- serving (DistServer) -------------------------------------------------------------------------------
    async def serve(self, path: str, headers: Any, body: bytes) -> tuple[int, bytes | BlockStream]:
        """``POST /sync/dist/publication|blocks|list``: see :meth:`~._distserve.DistServer.serve`."""
        return await self.server.serve(path, headers, body)

    def key_of(self, origin: str) -> bytes | None:
        """A member's key (not this node, not dead or left): only members are served."""
        return self.server.key_of(origin)

    def section_entries(self) -> list[HeldPublication]:
        """The first page of what this node lists (:meth:`~._distserve.DistServer.section_entries`)."""
        return self.server.section_entries()

    def section_fields(self) -> dict[str, Any]:
        """The ``sync`` section's fields of distribution (:meth:`~._distserve.DistServer.section_fields`)."""
        return self.server.section_fields()

    @property
    def bytes_served(self) -> int:
        """Block bytes served to members."""
        return self.server.bytes_served

    # -- fetching ------------------------------------------------------------------------------------------------
    def _for_me(self, to: str) -> bool:
        return not to or to in self.tags

    def _wanted(self, holder: str, e: HeldPublication) -> bool:
        if not (e.serves and self._for_me(e.to)) or (holder, e.name, e.version, e.root) in self.skipped:
            return False
        held = self.holdings.get(e.name)
        return (e.name not in self._considering and e.version > self.book.floors.get(e.name, 0)
                and (held is None or held.pub.version < e.version))

    async def _discover(self) -> None:
        """Start checking the new publications members list (each in its own task, :data:`MAX_CONSIDERING` at
        once, one per name, :data:`MAX_CONSIDERING_PER_MEMBER` per member); members take turns, one entry each, and
        members backing off after a failure are passed over."""
        await self.listings.refresh()
        now = trio.current_time()
        turns = deque((m.origin, iter(self._sec(m.origin))) for m in self.ctx.members(live=True)
                      if m.origin != self.ctx.node_id and self.backoff.ok(m.origin, now))
        capped = False
        while turns and len(self._considering) < MAX_CONSIDERING:
            holder, entries = turns.popleft()
            if not self.backoff.ok(holder, trio.current_time()):
                continue
            if Counter(self._considering.values())[holder] >= MAX_CONSIDERING_PER_MEMBER:
                capped = True
                continue
            e = next((e for e in entries if self._wanted(holder, e)), None)
            if e is None:
                continue  # nothing more wanted from this member
            turns.append((holder, entries))
            self._considering[e.name] = holder
            if self._nursery is None:
                await self._consider_guarded(holder, e)
            else:
                self._nursery.start_soon(self._consider_guarded, holder, e)
        self._more_wanted = capped or bool(turns)  # entries left for want of a slot: a freed slot runs a pass

    async def _consider_guarded(self, holder: str, e: HeldPublication) -> None:
        """:meth:`_consider`, whose failures are logged and counted: one bad entry never stops discovery."""
        try:
            await self._consider(holder, e)
        except (OSError, httpx.HTTPError, SyncReplyRejected, trio.TooSlowError, ValueError) as exc:
            self.fetch_failures += 1
            log.warning("sync: publication %s v%d from %s: %s", e.name[:80], e.version, holder, exc)
        finally:
            self._considering.pop(e.name, None)
            if self._more_wanted:
                self.wake()  # the slot is free and more entries wait: the next pass now, not an interval later

    async def _consider(self, holder: str, e: HeldPublication) -> None:
        """Fetch ``e``'s publication from ``holder``, check it, and start its fetch. A refusal is remembered for
        that holder only (another member may serve the same publication untampered)."""
        body = msgspec.msgpack.encode(PubRequest(e.root, e.name))
        try:
            try:
                raw = await self._post(holder, PUBLICATION_PATH, body, 2**22, self.listings.timeout_s)
            except (httpx.HTTPError, OSError, SyncReplyRejected, trio.TooSlowError):
                self.backoff.failed(holder, trio.current_time())
                raise
            pub = decode_publication(raw)
            if pub.root != e.root or pub.name != e.name or pub.version != e.version or not self._for_me(pub.to):
                raise PublicationRefused("malformed", "the publication is not the one the holder lists")
            usage = await trio.to_thread.run_sync(shutil.disk_usage, self.files.subscribe_dir)
            # the guard's disk percent is used / (used + free) (psutil's); what it keeps free is the rest of its limit
            reserve = int((usage.used + usage.free) * (100.0 - self.ctx.config.guard.disk_max_percent) / 100.0)
            # partial files are sparse: what the fetches under way will still write is not free for this one
            free = usage.free - self._pending_bytes(but=pub.name)
            self.book.accept(pub, free_bytes=free, reserve_bytes=reserve)
            self.backoff.answered(holder)
        except PublicationRefused as exc:
            if exc.reason in HOSTILE_REFUSALS:  # forged or not what it listed: it backs off, its streak grows
                self.backoff.failed(holder, trio.current_time())
            else:
                self.backoff.answered(holder)
            key = (e.name, e.version, e.root)
            if len(self.skipped) >= MAX_REMEMBERED or len(self._short_of_space) >= MAX_REMEMBERED:
                self.skipped.clear()  # a member listing endless bad entries costs requests, never memory
                self._short_of_space.clear()
            if exc.reason != "no_space":  # the others do not change: not asked of this holder again
                self.skipped.add((holder, *key))
            elif key in self._short_of_space:
                return
            self._short_of_space.add(key)
            log.warning("sync: publication %s v%d from %s refused: %s", e.name[:80], e.version, holder, exc)
            return
        except (httpx.HTTPError, OSError, SyncReplyRejected, trio.TooSlowError) as exc:
            self.fetch_failures += 1
            log.info("sync: publication %s v%d not fetched from %s: %s", e.name[:80], e.version, holder, exc)
            return
        old = self.holdings.get(pub.name)
        self.holdings[pub.name] = Holding(pub, self.files.partial_path(pub), set())  # counted as pending at once
        if old is not None and old.have is not None:  # an older fetch under way: superseded
            self.plans.pop(pub.name, None)
            await trio.to_thread.run_sync(self.files.drop_partial, old.pub)
        await self._save()
        await self._start_fetch(pub)

    def _pending_bytes(self, but: str = "") -> int:
        """Bytes the fetches accepted here (but not ``but``'s) still have to write."""
        out = 0
        for name, h in self.holdings.items():
            if h.have is not None and name != but:
                m = h.pub.manifest
                out += m.size - sum(m.block_len(i) for i in h.have)
        return out

    async def _start_fetch(self, pub: Publication) -> None:
        assert self._nursery is not None
        fd, have = await trio.to_thread.run_sync(self.files.open_partial, pub)
        origin = next((m.origin for m in self.ctx.members(live=True) if any(
            e.root == pub.root and e.origin for e in (self._sec(m.origin)))), "")
        plan = FetchPlan(pub, me=self.ctx.node_id, publisher=origin, policy=self.policy, have=have,
                         health=self.health)
        self.plans[pub.name] = plan
        self.holdings[pub.name].have = plan.have  # one set: what is verified is served at once
        self._nursery.start_soon(self._fetch, plan, fd)

    def _sec(self, node_id: str) -> list[HeldPublication]:
        """What ``node_id`` lists (its paged listing when it has one, else its snapshot's entries)."""
        return self.listings.entries(node_id)

    async def _fetch(self, plan: FetchPlan, fd: int) -> None:
        """Fetch every block of ``plan``'s publication, then commit and switch (module docstring)."""
        pub = plan.pub
        try:
            wake = [trio.Event()]  # the current one: a request that ends sets whichever the loop waits on
            bits: dict[str, bytes] = {}
            refreshed = -HOLDERS_REFRESH_S
            async with self._fetch_slots, trio.open_nursery() as n:  # MAX_FETCHING publications at once
                while not plan.done and self.plans.get(pub.name) is plan:
                    now = trio.current_time()
                    if now >= refreshed + HOLDERS_REFRESH_S or not plan.holders:
                        self.listings.tell_holders(plan, bits)  # O(members x entries): not once per request
                        refreshed = now
                    plan.on_timer(now)
                    wake[0] = trio.Event()
                    for req in plan.next_requests(now):
                        n.start_soon(self._get, plan, req, fd, wake)
                    dl = plan.next_deadline()
                    wait = self.cfg.interval_s if dl is None else max(0.01, min(self.cfg.interval_s, dl - now))
                    with trio.move_on_after(wait):
                        await wake[0].wait()
            if self.plans.get(pub.name) is not plan:
                return
            path = await trio.to_thread.run_sync(self.files.commit, fd, pub)
        except OSError as exc:
            log.warning("sync: fetching %s v%d failed: %s", pub.name, pub.version, exc)
            self.plans.pop(pub.name, None)
            return
        finally:
            _close(fd)  # committed, or superseded, failed or cancelled (the partial file stays for a resume)
        self.plans.pop(pub.name, None)
        self.holdings[pub.name] = Holding(pub, path, None)
        self.keeper.switched(pub.name, pub.version, time.time())
        try:
            await self._save()
        except OSError as exc:  # the version is switched in; its floor is saved at the next save
            log.warning("sync: saving the distribution state after %s v%d failed: %s", pub.name, pub.version, exc)
        self._switched_in(pub, path)

    def _switched_in(self, pub: Publication, path: Path) -> None:
        """``MODEL_UPDATED`` for ``pub``, whose version ``path`` the link now names; counted in ``updated``."""
        self.updated += 1
        self.ctx.emit_event("MODEL_UPDATED", {"name": pub.name, "version": pub.version, "size": pub.size,
                                              "path": str(self.files.link_path(pub.name)), "file": str(path),
                                              "root": pub.root.hex(), "publisher": pub.publisher})
        self.ctx.publish_soon()
        log.info("sync: %s v%d verified and switched in (%d bytes)", pub.name, pub.version, pub.size)

    async def _get(self, plan: FetchPlan, req: FetchBlocks, fd: int, wake: list[trio.Event]) -> None:
        pub = plan.pub
        limit = sum(pub.manifest.block_len(i) for i in req.indices)
        body = msgspec.msgpack.encode(BlocksRequest(pub.root, list(req.indices)))
        failed = False
        backoff: float | None = None
        try:
            raw = await self._post(req.holder, BLOCKS_PATH, body, limit)
            pos = 0
            for i in req.indices:
                n = pub.manifest.block_len(i)
                ok = len(raw) >= pos + n and await trio.to_thread.run_sync(
                    self.files.write_block, fd, pub, i, memoryview(raw)[pos : pos + n])
                if ok:
                    plan.block_verified(i, req.holder)
                    self.bytes_fetched[req.holder] += n
                else:  # tampered, or cut short: that holder is asked for this publication no more
                    plan.block_failed(i, req.holder, trio.current_time())
                    self.bad_blocks[req.holder] += 1
                pos += n
            self.ctx.publish_soon()
        except (httpx.HTTPError, OSError, SyncReplyRejected, trio.TooSlowError) as exc:
            failed = True
            if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 503:
                backoff = BUSY_BACKOFF_S  # all its serving slots taken: ask it again soon, others meanwhile
            else:
                self.fetch_failures += 1
            log.debug("sync: blocks of %s from %s: %s", pub.name, req.holder, exc)
        finally:
            plan.request_ended(req, trio.current_time(), failed=failed, backoff_s=backoff)
            wake[0].set()

    async def _post(self, holder: str, path: str, body: bytes, limit: int, timeout_s: float | None = None) -> bytes:
        m = self.ctx.member(holder)
        if m is None or not m.addr:
            raise OSError(f"{holder} has no address")
        client = self.ctx.client
        assert client is not None
        t = self.policy.request_timeout_s if timeout_s is None else timeout_s
        with trio.fail_after(t):
            async with client.stream("POST", f"http://{m.addr}{path}", content=body,
                                     headers=sign_headers(self.ctx.identity, "POST", path, body),
                                     timeout=httpx.Timeout(t, connect=CONNECT_TIMEOUT_S)) as resp:
                return await read_reply(resp, limit, path)

    # -- views ---------------------------------------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """The ``distribution`` part of ``GET /sync/status`` (:func:`~._distview.distribution_view`)."""
        return distribution_view(self)


def _hash(path: Path, block_size: int) -> Manifest:
    return hash_file(path, block_size=block_size)


def _close(fd: int) -> None:
    os.close(fd)
