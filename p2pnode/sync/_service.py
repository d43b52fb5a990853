"""The sync driver: wires the sender, the receiver and the replication accounting to the node and runs their loops.

Roles come from tags: a node tagged ``ephemeral`` pushes its data (:class:`~._push.Pusher`, every
``sync.interval_s`` or at once on :meth:`SyncService.trigger`); a node tagged ``durable`` keeps replicas
(:class:`~._store.ReplicaStore`, fed by :class:`~._inbound.Inbound`: ``POST /sync/push`` and the data channel);
both tags: both. What peers confirm is read from their typed :class:`~p2pnode.snapshot.SyncSection` through the
:class:`~p2pnode.node.NodeContext` (:class:`~._replication.Replication`); this node's own section is
:meth:`SyncService.section`, which the node core puts into its snapshot. The service never sees the agent.

Durable nodes also run a retention pass every ``sync.retention_interval_s`` (and on :meth:`SyncService.trigger`,
and soon after a commit takes the replica folder past ``retention_cap_bytes``): it fetches what changed
(:class:`~._replication.RetentionInputs`), asks :func:`~._retention.plan_retention` what may go, and retires
those replicas one by one under their origin's lock (:meth:`~._retire.Retirement.retire`). When the folder stays
past its cap with only replicas left that may not go, new data is refused (507) and ``BACKPRESSURE_ACTIVATED``
is raised with ``cause = replica_cap`` (``BACKPRESSURE_RELEASED`` when a pass finds room again).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncIterable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ..snapshot import MAX_CHECKPOINT_REFS, SyncSection
from ..synccore import (
    ReceiptIndex,
    RetentionPlan,
    RetentionPolicy,
    effective_r,
    listing_digest,
    note_unlisted,
    plan_retention,
)
from ._bucket import TokenBucket
from ._channel import StreamServer
from ._checkpoints import CheckpointHolder, CheckpointOrigin, checkpoint_file_of, checkpoint_hashes_of
from ._ckboard import CheckpointBoard
from ._distribute import Distributor
from ._inbound import PUSH_BODY_BUDGET_BYTES, ByteBudget, Inbound
from ._possess import Challenger, ChallengeServer
from ._refuse import REJECT_REASONS
from ._replication import Replication, RetentionInputs
from ._servicecheckpoints import ServiceCheckpoints
from ._walinbound import WalInbound

if TYPE_CHECKING:
    from ..node import NodeContext
    from ._distserve import BlockStream
    from ._push import Pusher
    from ._store import ReplicaStore
    from ._walship import WalShipper

__all__ = ["PUSH_BODY_BUDGET_BYTES", "REJECT_REASONS", "ByteBudget", "SyncService", "TokenBucket"]

log = logging.getLogger(__name__)

RETENTION_FIRST_PASS_S = 60.0
"""Seconds after start before a durable node's first retention pass (at most ``retention_interval_s``): time to
hear the other durable members' receipts."""


class SyncService(ServiceCheckpoints):
    """Sync for one node (see module docstring), built from a :class:`~p2pnode.node.NodeContext` (its
    ``config.sync`` and ``config.agent.tags``, identity, data dir, members and their sync sections, client,
    ``publish_to``, ``emit_event``, ``last_sample`` and ``config.guard.disk_max_percent``). Its parts:
    ``source`` (this node's files, pushers), ``store`` (replicas, durable nodes), ``pusher``, ``inbound``,
    ``replication``. Counters feed ``/sync/status`` and ``/metrics``."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.cfg = cfg = ctx.config.sync
        tags = set(ctx.config.agent.tags)
        self.pushes = cfg.enabled and "ephemeral" in tags
        self.keeps = cfg.enabled and "durable" in tags
        state_dir = ctx.data_dir / ".sync"
        state_dir.mkdir(parents=True, exist_ok=True)
        self.root = Path(cfg.root).absolute() if cfg.root else ctx.data_dir / "data"
        if self.keeps:  # a durable node's parts, imported there only (issue 43: an idle agent's RSS)
            from ._jobreplicas import ArchivedJobs
            from ._store import ReplicaStore
        if self.pushes:  # an ephemeral node's
            from ._push import Pusher
            from ._source import LocalFiles
        self.store = ReplicaStore(ctx.data_dir) if self.keeps else None
        self.source = (
            LocalFiles(self.root, globs=cfg.globs, append_globs=cfg.append_globs, state_dir=state_dir,
                       settle_s=cfg.settle_s)
            if self.pushes else None
        )
        self.rejected: Counter[str] = Counter()  # requests refused before reaching the store
        self.replication = Replication(ctx, cfg, self.root, self.source, self.count_rejection)
        self.pusher = (Pusher(ctx, cfg, self.source, self.replication, self.count_rejection)
                       if self.source is not None else None)
        self.inbound = Inbound(ctx, cfg, self.store, self.rejected)
        self.wal: WalShipper | None = None
        """Live WAL-mode databases by their segments, after each push pass (:mod:`._walship`)."""
        if self.source is not None:
            from ._walship import WalShipper  # the sender, its WalSender: on a node that pushes only (issue 43)

            self.wal = WalShipper(ctx, cfg, self.source, state_dir)
        if self.source is not None and self.wal is not None:
            self.source.backup_gate = self.wal  # its backup copies are rare while its log reaches R targets
        self._wal_busy = False  # a WAL pass is under way (in the background: one at a time)
        self.wal_in = WalInbound(ctx, cfg, self.inbound)
        """``POST /sync/wal``: segments applied into WAL replicas (durable nodes)."""
        self.challenger = (Challenger(ctx, cfg, self.source, self.replication, self._push_soon)
                           if self.source is not None else None)
        """Proof of possession, the origin's side: challenges the holders it counts (:mod:`._possess`)."""
        self.challenges = ChallengeServer(ctx, cfg, self.store, self.inbound.key_of, self.inbound.lock_of,
                                          self.count_rejection)
        """Proof of possession, the holder's side: ``POST /sync/challenge``."""
        self.public_ports: Mapping[int, int] = {}
        """The marketplace provider's port mapping, internal -> public (:class:`p2pnode.config.ProviderNat`; the
        agent sets it): what :attr:`advertised_data_port` publishes when ``sync.advertise_data_port`` is 0."""
        self.inbound.on_over_cap = self._wake_retention
        self.inbound.on_commit = self.replicas_committed  # a checkpoint may have all its files now
        self.inbound.checkpoint_file = self.checkpoint_file  # checkpoint reads on the data channel (._ckchannel)
        self.retention_inputs = RetentionInputs(ctx, cfg, self.count_rejection)
        self.retention_passes = 0
        self.last_retention: dict[str, Any] | None = None  # what the newest retention pass did
        self.checkpoints = (CheckpointOrigin(root=self.root, state_dir=state_dir, node_id=ctx.node_id,
                                             sign=ctx.identity.sign, settle_s=cfg.settle_s)
                            if self.source is not None else None)
        """The checkpoints of the trainings running here, signed for members (issue 41, :mod:`._checkpoints`)."""
        self.checkpoint_board = CheckpointBoard(ctx, timeout_s=cfg.request_timeout_s, leader_of_term=lambda t: None,
                                                sign_read=getattr(ctx, "peer_read_headers", None))
        """The newest trusted checkpoint of each config, and its holders (issue 41; the agent sets its
        ``leader_of_term``, ``config_of_template`` and ``trains_template``)."""
        self.checkpoint_holder = (CheckpointHolder(ctx, self.store, state_dir, timeout_s=cfg.request_timeout_s,
                                                   trust=self.checkpoint_board.trust,
                                                   sign_read=getattr(ctx, "peer_read_headers", None))
                                  if self.store is not None else None)
        """The checkpoints this durable node holds whole (issue 41, :class:`~._checkpoints.CheckpointHolder`; held
        only once the board's trust accepts them)."""
        self.checkpoint_dirs: tuple[tuple[str, str], ...] = ()
        """``(config, dir)`` of the catalog's checkpoint dirs (``*``: a parameter's value)."""
        self.archived = ArchivedJobs(self.store) if self.store is not None else None
        """Other nodes' ended jobs among the replicas held here (issue 41, item 5; :mod:`._jobreplicas`)."""
        self.distributor = Distributor(ctx, cfg) if cfg.enabled else None
        """Published files, durable to subscribers (:mod:`._distribute`)."""
        self._trigger = trio.Event()
        self._retention_wanted = trio.Event()
        self._checkpoints_wanted = trio.Event()
        self._ck_listed: dict[str, tuple[bytes, ...]] = {}  # member -> the checkpoint digests it listed last
        self.checkpoint_passes = 0

    # -- the driver ------------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled: the partial-file expiry and the data channel (durable nodes), then
        ``task_status.started()``, then the push loop (pushers). Transfers run in this nursery."""
        async with trio.open_nursery() as n:
            if self.pusher is not None:
                self.pusher.nursery = n
            if self.cfg.enabled:
                n.start_soon(self._checkpoints_loop)
            if self.store is not None:
                n.start_soon(self._expire_loop, self.store)
                n.start_soon(self._retention_loop, self.store)
                if self.cfg.data_port >= 0:
                    await n.start(self.inbound.serve_channel)
            task_status.started()
            if self.distributor is not None:
                n.start_soon(self.distributor.run)
            if self.challenger is not None:
                n.start_soon(self.challenger.run)
            if self.pusher is not None:
                await self._push_loop(self.pusher)

    async def _expire_loop(self, store: ReplicaStore) -> None:
        while True:
            await trio.to_thread.run_sync(store.expire_partials, self.cfg.partial_ttl_s, time.time())
            await trio.sleep(min(3600.0, self.cfg.partial_ttl_s / 4))

    async def _retention_loop(self, store: ReplicaStore) -> None:
        # the first pass waits a little for the peers' snapshots (fewer receipts known only means fewer deletions)
        first = min(self.cfg.retention_interval_s, RETENTION_FIRST_PASS_S)
        with trio.move_on_after(first):
            await self._retention_wanted.wait()
        while True:
            self._retention_wanted = trio.Event()
            try:
                await self.retention_pass()
            except (OSError, httpx.HTTPError) as exc:
                log.warning("sync: retention pass failed: %s", exc)
            except Exception:  # a bug here must not take the agent down; nothing is deleted after it
                log.exception("sync: retention pass failed unexpectedly; retrying next interval")
            with trio.move_on_after(self.cfg.retention_interval_s):
                await self._retention_wanted.wait()

    def set_checkpoint_globs(self, globs: tuple[tuple[str, str], ...]) -> None:
        """Sync the files under the catalog's checkpoint dirs whatever ``sync.globs`` says (issue 41):
        ``(config, glob)`` from :func:`p2pnode.scheduler.checkpoint_globs`; nothing on a node that does not push."""
        if self.source is not None:
            self.source.set_checkpoint_globs(globs)
        self.checkpoint_dirs = tuple((c, g.removesuffix("/**")) for c, g in globs)

    def checkpoint_bytes(self, digest: bytes) -> bytes | None:
        """``GET /sync/checkpoint``: the signed checkpoint ``digest`` this node signed or holds (msgpack), or None."""
        own = self.checkpoints.signed_bytes(digest) if self.checkpoints is not None else None
        if own is None and self.checkpoint_holder is not None:
            own = self.checkpoint_holder.signed_bytes(digest)
        return own

    def archived_log(self, job_id: str) -> tuple[str, Path] | None:
        """``(origin, file)`` of another node's archived log of job ``job_id`` held here, or None."""
        return self.archived.log_of(job_id) if self.archived is not None else None

    async def archived_runs(self, n: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """The ``n`` newest replicated job records held here (``node_id``: their origin), and the records left out
        so far by reason."""
        if self.archived is None:
            return [], {}
        runs = await trio.to_thread.run_sync(self.archived.runs, n)
        return runs, dict(self.archived.rejected)

    def checkpoint_file(self, digest: bytes, index: int) -> tuple[Path, str, int, int] | None:
        """``GET /sync/checkpoint/file``: see :func:`~._checkpoints.checkpoint_file_of`."""
        return checkpoint_file_of(self.checkpoint_holder, self.checkpoints, self.root, digest, index)

    def checkpoint_hashes(self, digest: bytes, index: int) -> bytes | None:
        """``GET /sync/checkpoint/file?part=hashes`` (blocking): see :func:`~._checkpoints.checkpoint_hashes_of`."""
        return checkpoint_hashes_of(self.checkpoint_holder, digest, index)

    def _wake_retention(self) -> None:
        self._retention_wanted.set()

    def retention_policy(self) -> RetentionPolicy:
        """The retention settings of ``[sync]``."""
        c = self.cfg
        return RetentionPolicy(cap_bytes=c.retention_cap_bytes, keep_versions=c.retention_keep_versions,
                               keep_days=c.retention_keep_days, replication_factor=c.replication_factor)

    def retention_plan(self, now: float | None = None) -> RetentionPlan:
        """What a retention pass would retire now, from what is held here (snapshots, lists fetched by the last
        pass): see :func:`~._retention.plan_retention`. ``now``: wall-clock s (default: the clock). Raises
        ``AssertionError`` on a node that keeps no replicas."""
        return self._plan(time.time() if now is None else now)[0]

    def _plan(self, now: float) -> tuple[RetentionPlan, dict[tuple[str, str], float]]:
        """The plan at ``now`` (wall s) and the first sightings of unlisted files it counted from."""
        store = self.store
        assert store is not None, "this node keeps no replicas (tag it durable)"
        inp = self.retention_inputs
        held = store.held_replicas()
        listings = inp.listings({h.origin for h in held}, held)
        since = note_unlisted([h.key for h in held], listings, store.retirement.unlisted_since, now)
        known, _ = inp.durable()
        plan = plan_retention(held, me=self.ctx.node_id, policy=self.retention_policy(), listings=listings,
                              confirmed_by=inp.confirmations(held), durable=known, unlisted_since=since, now=now)
        return plan, since

    async def retention_pass(self, *, dry_run: bool = False) -> RetentionPlan:
        """One retention pass now (durable nodes): refresh the inputs, plan, and (unless ``dry_run``) note the
        files first seen unlisted, retire the plan's replicas under their origin's lock (each re-checked: one
        replaced by a newer version meanwhile stays), publish the withdrawn receipts, and set or clear the
        refusal of new data (with its event). Returns the plan. Raises ``OSError`` from the store."""
        store = self.store
        assert store is not None, "this node keeps no replicas (tag it durable)"
        await self.retention_inputs.refresh(store.held_replicas())
        now = time.time()
        plan, since = self._plan(now)
        if dry_run:
            return plan
        await trio.to_thread.run_sync(store.retirement.note_unlisted, since)
        done, freed = [], 0
        for d in plan.retire:
            h = d.held
            async with self.inbound.lock_of(h.origin):
                n = await trio.to_thread.run_sync(store.retire, h.origin, h.path, h.root)
            if n:
                done.append(d)
                freed += n
        if done:
            self.ctx.publish_soon()  # the receipts of what went leave this node's snapshot
        self.retention_passes += 1
        self.last_retention = {"at": now, "retired": [d.view() for d in done[:1000]], "retired_count": len(done),
                               "freed_bytes": freed, "skipped": len(plan.retire) - len(done),
                               "only_copy_count": len(plan.only_copies), "full": plan.full}
        self._set_full(plan)
        if done or plan.full:
            log.info("sync: retention pass retired %d replicas (%d bytes); %d bytes held of a cap of %d%s", len(done),
                     freed, store.held_bytes(), plan.cap_bytes, "; full: refusing new data" if plan.full else "")
        return plan

    def _set_full(self, plan: RetentionPlan) -> None:
        """Refuse new data while ``plan`` is full, with the edge-triggered alert."""
        was = self.inbound.cap_full is not None
        only = plan.only_copies
        payload: dict[str, Any] = {"cause": "replica_cap", "held_bytes": plan.after_bytes, "cap_bytes": plan.cap_bytes,
                                   "only_copies": len(only), "only_copy_bytes": sum(d.held.size for d in only)}
        if plan.full:
            self.inbound.cap_full = (
                f"replica folder past its cap ({plan.after_bytes} > {plan.cap_bytes} bytes) and nothing more may go: "
                f"{len(only)} replicas ({payload['only_copy_bytes']} bytes) are only copies, the rest below R "
                "elsewhere")
            if not was:
                log.warning("sync: %s; refusing new data (507)", self.inbound.cap_full)
                self.ctx.emit_event("BACKPRESSURE_ACTIVATED", payload)
        elif was:
            self.inbound.cap_full = None
            log.info("sync: the replica folder is within its cap again; accepting new data")
            self.ctx.emit_event("BACKPRESSURE_RELEASED", payload)

    async def _push_loop(self, pusher: Pusher) -> None:
        while True:
            try:
                await pusher.pass_once()
                await self._checkpoint_pass()
            except (OSError, httpx.HTTPError) as exc:
                log.warning("sync pass failed: %s", exc)
            except Exception:  # a sync bug must not take the agent (membership, jobs) down with it
                log.exception("sync pass failed unexpectedly; retrying next interval")
            if pusher.nursery is not None and not self._wal_busy:  # a slow target never holds up the next pass
                self._wal_busy = True
                pusher.nursery.start_soon(self._ship_wal, pusher)
            elif pusher.nursery is None:
                await self._ship_wal(pusher)
            if self.challenger is not None:
                self.challenger.wake()  # receipts may have changed: new ones are checked soon
            with trio.move_on_at(self._next_push_at()):
                await self._trigger.wait()
            self._trigger = trio.Event()

    async def _ship_wal(self, pusher: Pusher) -> None:
        """The WAL segments of this node's live databases to their durable targets (:mod:`._walship`)."""
        try:
            if self.wal is not None:
                _, known, counting = self.replication.receipt_index()
                await self.wal.pass_once(pusher._dialable(counting), known, frozenset(pusher.refusing))
        except Exception:  # a bug here must not take the agent down; the backup path carries the databases
            log.exception("sync: WAL shipping failed unexpectedly; retrying next interval")
        finally:
            self._wal_busy = False

    def _push_soon(self) -> None:
        """A holder failed a challenge: run a push pass now (the file goes to the next durable target)."""
        self._trigger.set()

    def trigger(self) -> None:
        """Run a pass now (``POST /sync/trigger``, ``p2pnode sync push``, ``p2pnode sync gc``): a push pass on a
        node that pushes, a retention pass on a node that keeps replicas."""
        self._trigger.set()
        self._retention_wanted.set()
        if self.distributor is not None:
            self.distributor.wake()

    async def pass_once(self) -> None:
        """One push pass now (see :mod:`._push`), in the caller's task. Raises ``AssertionError`` on a node that
        does not push."""
        assert self.pusher is not None, "this node does not push (tag it ephemeral)"
        await self.pusher.pass_once()

    # -- what the node and the HTTP routes use ---------------------------------------------------------
    async def receive_push(self, headers: Any, content_length: str | None,
                           chunks: AsyncIterable[bytes]) -> tuple[int, bytes]:
        """``POST /sync/push``: (HTTP status, msgpack reply); see :meth:`Inbound.receive_push`."""
        return await self.inbound.receive_push(headers, content_length, chunks)

    async def receive_wal(self, headers: Any, content_length: str | None,
                          chunks: AsyncIterable[bytes]) -> tuple[int, bytes]:
        """``POST /sync/wal``: (HTTP status, msgpack answer); see :meth:`~._walship.WalInbound.receive`."""
        return await self.wal_in.receive(headers, content_length, chunks)

    async def serve_distribution(self, path: str, headers: Any, body: bytes) -> tuple[int, bytes | BlockStream]:
        """``POST /sync/dist/publication`` and ``POST /sync/dist/blocks``: (HTTP status, msgpack or the blocks as a
        :class:`~._distserve.BlockStream` the caller closes once the reply ended); see
        :meth:`~._distribute.Distributor.serve`. 404 when sync is off."""
        if self.distributor is None:
            return 404, b""
        return await self.distributor.serve(path, headers, body)

    async def publish_file(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /sync/publish``: see :meth:`~._distribute.Distributor.publish_request`."""
        if self.distributor is None:
            return 404, {"error": "sync is off"}
        return await self.distributor.publish_request(body)

    async def answer_challenge(self, headers: Any, body: bytes) -> tuple[int, bytes]:
        """``POST /sync/challenge``: (HTTP status, msgpack answer); see :class:`~._possess.ChallengeServer`."""
        return await self.challenges.answer(headers, body)

    async def verify_before_delete(self) -> None:
        """Before a disk-manager pass: challenge the holders counted toward R of the files that may go, and wait
        for their answers (:meth:`~._possess.Challenger.verify_before_delete`). Nothing on a node that does not
        push. Never raises for a holder's fault (each outcome is counted)."""
        if self.challenger is not None:
            await self.challenger.verify_before_delete()

    def count_rejection(self, reason: str) -> None:
        """Count refused sync input that never reached the store (one of :data:`REJECT_REASONS`)."""
        self.rejected[reason] += 1

    def rejected_total(self) -> Counter[str]:
        """Every refusal counted by this node, by reason: before the store and in it."""
        c: Counter[str] = Counter(self.rejected)
        if self.store is not None:
            c.update(self.store.rejected)
        return c

    def receipt_index(self) -> tuple[ReceiptIndex, int, set[str]]:
        """Receipts for this node's files, the number of durable members known, and those counting now."""
        return self.replication.receipt_index()

    def replicated_predicate(self) -> Callable[[str], bool]:
        """For the disk manager; see :meth:`Replication.replicated_predicate`."""
        return self.replication.replicated_predicate()

    def protected_predicate(self) -> Callable[[str], bool]:
        """For the disk manager; see :meth:`Replication.protected_predicate`."""
        return self.replication.protected_predicate()

    @property
    def backpressure_backoff_s(self) -> float:
        """Seconds a sender waits after a 507 (the ``retry-after`` of a 507 answer)."""
        return self.cfg.backpressure_backoff_s

    @property
    def data_port(self) -> int | None:
        """The data channel's bound port (durable nodes serving it), else None."""
        return self.inbound.data_port

    @data_port.setter
    def data_port(self, port: int | None) -> None:
        """Advertise another port (tests: a port nobody listens on)."""
        self.inbound.data_port = port

    @property
    def advertised_data_port(self) -> int | None:
        """The data channel's port as peers dial it (with this node's advertised host): ``sync.advertise_data_port``,
        else the public port the provider maps the bound one to, else the bound port; None without a channel."""
        bound = self.data_port
        if not bound:
            return None
        return self.cfg.advertise_data_port or self.public_ports.get(bound) or bound

    @property
    def channel(self) -> StreamServer | None:
        """The data channel's server (counters ``streams``, ``stream_bytes``), None while it is off."""
        return self.inbound.channel

    @property
    def body_budget(self) -> ByteBudget:
        """The reservation of push bodies held at once (``used``, ``peak``, ``capacity`` in bytes)."""
        return self.inbound.body_budget

    @property
    def bytes_sent(self) -> int:
        """Bytes sent in push requests and block streams."""
        return self.pusher.bytes_sent if self.pusher is not None else 0

    @property
    def blocks_resent(self) -> int:
        """Blocks targets refused (bad hash, length, range): they are sent again."""
        return self.pusher.blocks_resent if self.pusher is not None else 0

    @property
    def streams_sent(self) -> int:
        """Block streams sent on data channels."""
        return self.pusher.blocks.streams_sent if self.pusher is not None else 0

    @property
    def channel_fallbacks(self) -> int:
        """Transfers sent over HTTP because the target's data channel was unreachable or busy."""
        return self.pusher.blocks.channel_fallbacks if self.pusher is not None else 0

    @property
    def push_rejected(self) -> Counter[str]:
        """Refusals by targets of this node's pushes, by reason."""
        return self.pusher.push_rejected if self.pusher is not None else Counter()

    @property
    def receipt_fetches(self) -> int:
        """Full receipt lists fetched that matched their signed digest."""
        return self.replication.receipt_fetches

    # -- this node's section and views -----------------------------------------------------------------
    def section(self) -> SyncSection:
        """This node's :class:`SyncSection` for its snapshot: receipts (the newest, at most ``max_receipts`` and
        24 KiB), the digests of the full receipt lists and the data port (durable nodes); a digest of the
        manifests, the file count, their bytes and how many are below R (pushers). Empty on other nodes."""
        kw: dict[str, Any] = {}
        if self.store is not None:
            kw["receipts"] = {o: [(r[0], r[1], r[2]) for r in rs]
                              for o, rs in self.store.receipts(self.cfg.max_receipts).items()}
            kw["receipt_digests"] = self.store.receipt_digests()
            if self.advertised_data_port:
                kw["data_port"] = self.advertised_data_port
        if self.source is not None:
            files = list(self.source.files.values())
            kw.update(digest=listing_digest({f.path: f.manifest.root for f in files}), files=len(files),
                      bytes=sum(f.manifest.size for f in files),
                      under_replicated=len(self.replication.below))
        if self.distributor is not None and self.distributor.holdings:
            kw.update(self.distributor.section_fields())
        refs = [*(self.checkpoints.refs if self.checkpoints is not None else []),
                *(self.checkpoint_holder.book.refs if self.checkpoint_holder is not None else [])]
        if refs:
            kw["checkpoints"] = sorted(refs, key=lambda r: r.order, reverse=True)[:MAX_CHECKPOINT_REFS]
        return SyncSection(**kw)

    def status_view(self) -> dict[str, Any]:
        """``GET /sync/status``: role, R, each file (class, size, replicas confirmed of R, lag, bytes pending),
        counters; and for durable nodes, the replicas held and transfers under way."""
        now, mono = time.time(), time.monotonic()
        index, known, counting = self.replication.receipt_index()
        r_eff = effective_r(self.cfg.replication_factor, known)
        p = self.pusher
        files = []
        if self.source is not None and p is not None:
            since = self.replication.unconfirmed_since
            for f in sorted(self.source.files.values(), key=lambda f: f.path):
                m = f.manifest
                confirmed = self.replication.counted(index, f.path, m.size, m.root)
                done = len(confirmed) >= r_eff and known > 0
                prog = p.progress.get(f.path)
                left = prog[1] - prog[0] if prog else f.manifest.size
                files.append({
                    "path": f.path, "class": f.cls, "size": f.manifest.size, "seq": f.seq,
                    "root": f.manifest.root.hex(), "replicas": len(confirmed), "r": r_eff,
                    "confirmed_by": sorted(confirmed), "targets": p.file_view.get(f.path, {}).get("targets", []),
                    "lag_s": 0.0 if done else round(max(0.0, now - since.get(f.path, f.seen_at)), 3),
                    "bytes_pending": 0 if done else left * max(1, r_eff - len(confirmed)),
                    "progress": {"sent": prog[0], "total": prog[1]} if prog else None,
                    "holders": self.replication.book.view(f.path, m.size, m.root, mono),
                    **({"carried_by": self.wal.carried_by(f.path)} if f.cls == "sqlite" and self.wal else {}),
                })
        return {
            "node_id": self.ctx.node_id,
            "pushes": self.pushes,
            "keeps": self.keeps,
            "root": str(self.root),
            "replication_factor": self.cfg.replication_factor,
            "checkpoints": self.checkpoint_board.view(),
            "r_effective": r_eff,
            "durable_members": known,
            "durable_counting": sorted(counting),
            "refusing": sorted(p.refusing) if p is not None else [],
            "data_port": self.data_port,
            "advertised_data_port": self.advertised_data_port,
            "files": files,
            "errors": dict(self.source.errors) if self.source else {},
            "sent": {"passes": p.passes if p else 0, "requests": p.requests if p else 0,
                     "request_failures": p.request_failures if p else 0, "bytes": self.bytes_sent,
                     "blocks": p.blocks_sent if p else 0, "blocks_resent": self.blocks_resent,
                     "streams": self.streams_sent, "channel_fallbacks": self.channel_fallbacks,
                     "receipt_fetches": self.replication.receipt_fetches,
                     "receipt_fetch_failures": self.replication.receipt_fetch_failures,
                     "rejected_by_targets": dict(sorted(self.push_rejected.items())),
                     "sqlite_backups": self.source.backups if self.source else 0,
                     "sqlite_backups_deferred": self.source.backups_deferred if self.source else 0},
            "received": {**(self.store.view() if self.store else {}),
                         **({"streams": self.channel.streams} if self.channel else {}),
                         "refused_requests": dict(sorted(self.rejected.items()))},
            "retention": self.retention_view() if self.store is not None else None,
            "wal": {"sent": self.wal.view() if self.wal is not None else None,
                    "received": self.wal_in.view() if self.store is not None else None},
            "challenges": {**(self.challenger.view() if self.challenger is not None else {}),
                           "served": self.challenges.served, "served_absent": self.challenges.absent,
                           "withdrawn": self.challenges.withdrawn},
            "distribution": self.distributor.view() if self.distributor is not None else None,
        }

    def retention_view(self) -> dict[str, Any]:
        """The ``retention`` part of ``GET /sync/status`` (durable nodes): the settings, passes, what the newest pass
        retired, whether new data is refused (``full``, ``refused``: refusals counted by reason, ``replica_cap``)
        and the plan a pass would follow now (``plan``: what would go and why, the only copies kept)."""
        inp = self.retention_inputs
        c = self.cfg
        return {
            "cap_bytes": c.retention_cap_bytes, "keep_versions": c.retention_keep_versions,
            "keep_days": c.retention_keep_days, "interval_s": c.retention_interval_s,
            "passes": self.retention_passes, "full": self.inbound.cap_full is not None,
            "full_detail": self.inbound.cap_full, "refused": dict(sorted(self.inbound.cap_refusals.items())),
            "listing_fetches": inp.listing_fetches, "listing_mismatches": inp.listing_mismatches,
            "receipt_fetches": inp.receipt_fetches, "fetch_failures": inp.fetch_failures,
            "last_pass": self.last_retention,
            "plan": self.retention_plan().view(),
        }
