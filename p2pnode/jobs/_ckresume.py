"""The checkpoint a training resumes from (issue 41, item 2): the driver of the job core's
:class:`p2pnode.node.FetchCheckpoint` and :class:`p2pnode.node.CancelFetch` effects.

For each job the core holds ``fetching``, one trio task: it refreshes the node's checkpoint board (one pass: the
newest refs members publish, each signed checkpoint checked by :class:`p2pnode.synccore.CheckpointTrust`), asks
:func:`p2pnode.synccore.resume_from` what to do, and

* ``no_checkpoint`` (no trusted checkpoint of the config is known): the job starts at once, from nothing;
* ``held`` (this node publishes the newest itself: it ran the job before): it resumes from its own copy in the
  sync root (``<root>/<dir>/<name>``) when that is there, else from nothing;
* a fetch: the checkpoint's files come from its holders (the agent's ``fetch``, :class:`p2pnode.sync.CheckpointFetch`:
  each file verified against its signed root, resumed from what is on disk, the next holder on a bad one) into
  ``<data_dir>/resume/<config>/`` (outside the job's checkpoint dir, which sync sends), the bytes reported to the
  job table (:class:`p2pnode.node._table.FetchProgress`, shown by ``/jobs`` ``fetching_checkpoints``); the config's
  trust floor rises to it and is persisted (below); older entries of that folder are removed;
* no holder gave it whole (unreachable, or every copy bad): tried again after 1, 2, 4 ... s (at most 30 s between)
  until the template's ``checkpoint.grace_s`` from the first try has passed, then the job starts from nothing,
  logged and counted ``checkpoint_unavailable``: a known checkpoint is worth a short wait, not a training that
  never runs;
* it does not fit the free disk (``no_space``): the job starts from nothing, logged and counted.

The decisions of one config's jobs on this node run one at a time (a per-config lock): two members of a gang on one
node (``strict_pack``, a multi-GPU node) would otherwise fetch the same checkpoint into the same ``.partial`` folder
at once. The second finds the checkpoint the first fetched still in place and resumes from that copy (counted
``shared``), with no second transfer.

The outcome (the path, "" for none) is kept in :attr:`CheckpointResume.results` and handed to the core
(:attr:`p2pnode.node.JobInputs.resumes`), which starts the job with it; the driver is woken (``news``). A cancelled
fetch (the plan dropped the job) leaves its verified bytes on disk: a later fetch of that checkpoint resumes.
While it fetches, the job is in this node's running list (:meth:`CheckpointResume.reports`, no pid): the leader
counts it as this node's, so the config's training is not placed again elsewhere during a long fetch.

**Floors.** :attr:`p2pnode.synccore.CheckpointTrust.floors` (per config, the order of the newest checkpoint this
node resumed from) is written to ``<data_dir>/checkpoint_floors.json`` (tmp file, rename) after each resume and read
back at start through one msgspec decoder (:class:`_Floors`, bounded); an unreadable file is logged and counted
(``floors_unreadable``), and the node starts with no floor. So an older checkpoint replayed after a restart is
refused (``stale``).
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec
import trio
from msgspec import Meta

from .._files import atomic_write_bytes
from ..node import CancelFetch, FetchCheckpoint
from ..node._table import FetchProgress
from ..snapshot import JobReport
from ..synccore import CheckpointRefused, NewestCheckpoint, resume_from
from ..synccore._checkpoints import StartNow

__all__ = ["FLOORS_FILE", "MAX_FLOORS", "CheckpointResume"]

log = logging.getLogger(__name__)

FLOORS_FILE = "checkpoint_floors.json"
MAX_FLOORS = 4096
"""Configs whose floor is kept (the file's bound)."""
DEFAULT_GRACE_S = 60.0
"""How long a known checkpoint is tried when the template is not known (its ``checkpoint.grace_s`` is)."""
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
_SAFE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")

_Int = Annotated[int, Meta(ge=-1, le=2**53)]


class _Floors(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``checkpoint_floors.json``: config -> ``[term, placement seq, seq]``."""

    floors: Annotated[dict[Annotated[str, Meta(min_length=1, max_length=256)], tuple[_Int, _Int, _Int]],
                      Meta(max_length=MAX_FLOORS)] = {}


_DECODE_FLOORS = msgspec.json.Decoder(_Floors)

Fetcher = Callable[[NewestCheckpoint, Path, Callable[[int, int], None]], Awaitable[Path]]
"""The agent's fetch of a checkpoint into a folder, reporting ``(done_bytes, total_bytes)``; its path. Raises
``OSError`` when no holder gave it whole."""


class CheckpointResume:
    """The resume decisions and fetches of node ``node_id`` (module docstring). ``data_dir``: the node's state dir;
    ``news``: wake job control; ``observe``: the core's :meth:`p2pnode.node.JobCore.observe` (fetch progress);
    ``now``: monotonic seconds. The agent sets :attr:`board` (the node's checkpoint board), :attr:`fetch` and
    :attr:`sync_root`; until then every fetch decides ``no_checkpoint``."""

    def __init__(self, *, node_id: str, data_dir: Path, news: Callable[[], None],
                 observe: Callable[[Any, float], Any], now: Callable[[], float]) -> None:
        self.node_id = node_id
        self.dest = Path(data_dir) / "resume"
        self.floors_path = Path(data_dir) / FLOORS_FILE
        self.news = news
        self.observe = observe
        self.now = now
        self.board: Any = None
        self.fetch: Fetcher | None = None
        self.sync_root: Path | None = None
        self.results: dict[str, str] = {}
        """Job id -> the checkpoint path it resumes from ("" none): what the core's :attr:`JobInputs.resumes` gets."""
        self.counts: Counter[str] = Counter()
        """Outcomes: ``resumed``, ``shared`` (fetched already for another job of the config: a gang member on the
        same node), ``held``, ``no_checkpoint``, ``checkpoint_unavailable``, ``no_space``, ``cancelled``,
        ``floors_unreadable``."""
        self._scopes: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self._queued: list[tuple[FetchCheckpoint, float]] = []
        self._locks: dict[str, trio.Lock] = {}
        """Config -> the lock its decisions take (module docstring); dropped when free."""
        self._fetched: dict[str, tuple[bytes, Path]] = {}
        """Config -> (digest, path) of the checkpoint fetched last (what a second job of the config shares)."""

    # -- floors ---------------------------------------------------------------------------------------------
    def load_floors(self) -> dict[str, tuple[int, int, int]]:
        """The floors persisted (none when the file is missing; counted ``floors_unreadable`` when it is bad)."""
        try:
            data = self.floors_path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self.counts["floors_unreadable"] += 1
            log.warning("checkpoint floors not read (%s): starting with none", exc)
            return {}
        try:
            return dict(_DECODE_FLOORS.decode(data).floors)
        except msgspec.DecodeError as exc:  # (a ValidationError too: a field out of bounds)
            self.counts["floors_unreadable"] += 1
            log.warning("checkpoint floors unreadable (%s): starting with none", exc)
            return {}

    def set_board(self, board: Any) -> None:
        """Use ``board`` (its ``trust``, ``refs_by_member()``, ``pass_once()``); its trust's floors rise to those
        persisted."""
        self.board = board
        floors = board.trust.floors
        for config, order in self.load_floors().items():
            if order > floors.get(config, (-1, -1, -1)):
                floors[config] = order

    def _save_floors(self, floors: Mapping[str, tuple[int, int, int]]) -> None:
        newest = dict(sorted(floors.items(), key=lambda kv: kv[1], reverse=True)[:MAX_FLOORS])
        atomic_write_bytes(self.floors_path, msgspec.json.encode(_Floors(newest)))

    # -- effects --------------------------------------------------------------------------------------------
    def apply(self, e: FetchCheckpoint | CancelFetch, templates: Mapping[str, Any] | None = None) -> None:
        """Start the decision and fetch of ``e.job`` (a :class:`FetchCheckpoint`; a known checkpoint is tried for
        its template's ``checkpoint.grace_s``, from ``templates``), or cancel one (:class:`CancelFetch`)."""
        if isinstance(e, CancelFetch):
            scope = self._scopes.pop(e.job_id, None)
            if scope is not None:
                scope.cancel()
                self.counts["cancelled"] += 1
            self.results.pop(e.job_id, None)
            self._queued = [q for q in self._queued if q[0].job.job_id != e.job_id]
            return
        if e.job.job_id in self._scopes or e.job.job_id in self.results:
            return
        t = (templates or {}).get(e.job.template)
        grace_s = t.checkpoint.grace_s if t is not None and t.checkpoint is not None else DEFAULT_GRACE_S
        self._start(e, grace_s)

    def _start(self, e: FetchCheckpoint, grace_s: float) -> None:
        if self._nursery is None:
            self._queued.append((e, grace_s))
            return
        scope = trio.CancelScope()
        self._scopes[e.job.job_id] = scope
        self._nursery.start_soon(self._resume, e, grace_s, scope)

    def resumes(self, fetching: Callable[[str], bool]) -> dict[str, str]:
        """The outcomes for the core (:attr:`JobInputs.resumes`); those of jobs no longer ``fetching`` (started,
        refused, withdrawn) are dropped."""
        for job_id in [k for k in self.results if not fetching(k)]:
            del self.results[job_id]
        return dict(self.results)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the fetch tasks until cancelled."""
        async with trio.open_nursery() as n:
            self._nursery = n
            for e, grace_s in self._queued:
                self._start(e, grace_s)
            self._queued = []
            task_status.started()
            await trio.sleep_forever()

    async def _resume(self, e: FetchCheckpoint, grace_s: float, scope: trio.CancelScope) -> None:
        job_id = e.job.job_id
        path = ""
        with scope:
            lock = self._locks.setdefault(e.config, trio.Lock())
            try:
                async with lock:
                    path = await self._decide_and_fetch(e, grace_s)
            except Exception:  # a bug here must not take job control down: the job starts from nothing
                log.exception("checkpoint of %s: the resume failed unexpectedly; starting it from nothing", job_id)
        if not lock.locked() and not lock.statistics().tasks_waiting and self._locks.get(e.config) is lock:
            del self._locks[e.config]
        if self._scopes.get(job_id) is scope:
            del self._scopes[job_id]
            if not scope.cancelled_caught:
                self.results[job_id] = path
                self.news()

    async def _decide_and_fetch(self, e: FetchCheckpoint, grace_s: float) -> str:
        """The path ``e.job`` resumes from ("" none), per the module docstring."""
        board, fetch, job_id = self.board, self.fetch, e.job.job_id
        if board is None or fetch is None:
            self.counts["no_checkpoint"] += 1
            return ""
        deadline = self.now() + grace_s
        delay = RETRY_FIRST_S
        dest = self.dest / (e.config if _SAFE.match(e.config) else e.config.encode().hex()[:64])
        await trio.to_thread.run_sync(functools.partial(dest.mkdir, parents=True, exist_ok=True))

        def progress(done: int, total: int) -> None:
            self.observe(FetchProgress(job_id, done, total), self.now())

        while True:
            await board.pass_once()  # the newest refs published, each offered to the trust first
            try:
                free = (await trio.to_thread.run_sync(shutil.disk_usage, dest)).free
                d = resume_from(e.config, board.refs_by_member(), board.trust, me=self.node_id, free_bytes=free)
            except CheckpointRefused as exc:
                self.counts[exc.reason] += 1
                log.warning("checkpoint of %s for %s: %s; starting it from nothing", e.config, job_id, exc)
                return ""
            if isinstance(d, StartNow):
                return await self._held(e, d)
            total = d.newest.body.size
            shared = self._fetched.get(e.config)
            if shared is not None and shared[0] == d.newest.digest and await trio.to_thread.run_sync(
                    shared[1].exists):
                self.counts["shared"] += 1
                log.info("job %s resumes from checkpoint %s #%d of %s, fetched here already", job_id,
                         d.newest.body.job_id, d.newest.body.seq, e.config)
                return str(shared[1])
            progress(0, total)
            try:
                got = await fetch(d.newest, dest, progress)
            except OSError as exc:
                if self.now() + delay > deadline:
                    self.counts["checkpoint_unavailable"] += 1
                    log.warning("checkpoint_unavailable: %s #%d of %s not fetched within %.0f s (%s); starting %s "
                                "from nothing", d.newest.body.job_id, d.newest.body.seq, e.config, grace_s, exc,
                                job_id)
                    return ""
                log.info("checkpoint of %s for %s not fetched (%s): again in %.0f s", e.config, job_id, exc, delay)
                await trio.sleep(delay)  # a deadline: the holders may answer again
                delay = min(2 * delay, RETRY_MAX_S)
                continue
            board.trust.resumed(d.newest.body)
            self._fetched[e.config] = (d.newest.digest, Path(got))
            floors = dict(board.trust.floors)
            await trio.to_thread.run_sync(self._settle, dest, got, floors)
            self.counts["resumed"] += 1
            log.info("job %s resumes from checkpoint %s #%d of %s (%d bytes)", job_id, d.newest.body.job_id,
                     d.newest.body.seq, e.config, total)
            return str(got)

    async def _held(self, e: FetchCheckpoint, d: StartNow) -> str:
        """No fetch: no checkpoint (""), or the newest is this node's own (its path in the sync root when there)."""
        if d.resume_digest is None or self.board is None:
            self.counts["no_checkpoint"] += 1
            return ""
        self.counts["held"] += 1
        body = self.board.trust.accepted.get(d.resume_digest)
        if body is None or self.sync_root is None:
            return ""
        p = self.sync_root / body.dir / body.name
        return str(p) if await trio.to_thread.run_sync(p.exists) else ""

    def _settle(self, dest: Path, got: Path, floors: Mapping[str, tuple[int, int, int]]) -> None:
        """Blocking: persist the floors, and keep only ``got`` (and partial fetches) in ``dest``."""
        try:
            self._save_floors(floors)
        except OSError as exc:
            log.warning("checkpoint floors not persisted: %s", exc)
        for p in dest.iterdir():
            if p != got and p.name != ".partial":
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    def reports(self, table: Any, catalog: Any) -> list[JobReport]:
        """The jobs ``table`` holds ``fetching``, as this node's running list reports them (no pid, no start yet):
        the leader counts them as this node's while they fetch, however long the fetch takes (an assignment not
        reported is counted for the adoption grace only, then its training would be placed again elsewhere)."""
        out = []
        for r in table.in_state("fetching"):
            t = catalog.templates.get(r.template)
            out.append(JobReport(job_id=r.job_id, template=r.template, config=t.config if t is not None else "",
                                 kind=r.kind, gpus=list(r.gpus), gpu_fraction=r.gpu_fraction, vram_gib=r.vram_gib,
                                 term=r.term, gang=r.gang))
        return out

    def view(self) -> dict[str, Any]:
        """Counts by outcome, and the fetches under way (for ``/jobs``)."""
        return {"counts": dict(self.counts), "fetching": sorted(self._scopes),
                "floors": 0 if self.board is None else len(self.board.trust.floors)}
