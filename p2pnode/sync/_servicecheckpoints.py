"""The checkpoint passes of :class:`~._service.SyncService` (issue 41; a part it inherits, kept apart for the module
size bound): announcing this node's own complete checkpoints after a push pass, and the pass that holds (durable
nodes) and learns (every node) the members' checkpoints, woken by news rather than a timer."""

from __future__ import annotations

import logging
from typing import Any

import trio

from ..snapshot import MAX_CHECKPOINT_REFS, JobsSection, SyncSection
from ._checkpoints import checkpoint_writers

__all__ = ["CHECKPOINT_FALLBACK_S", "CHECKPOINT_PASS_GAP_S", "MIN_SETTLE_WAKE_S", "ServiceCheckpoints"]

log = logging.getLogger("p2pnode.sync._service")

CHECKPOINT_FALLBACK_S = 30.0
"""The checkpoint pass runs at least this often (seconds; or ``sync.interval_s`` when longer) with no news: a
holder's backoff after a failed fetch (:data:`~p2pnode.synccore._checkpoints.HOLDER_BACKOFF_S`) ends."""
MIN_SETTLE_WAKE_S = 0.5
CHECKPOINT_PASS_GAP_S = 0.3
"""Seconds from the start of one checkpoint pass to the next at least: the news of a burst (replicas committed one
after another, members' snapshots) is taken by one pass (each scans the held book and the waiting checkpoints)."""


class ServiceCheckpoints:
    """The checkpoint passes of the sync service (module docstring); the state it uses is the service's."""

    ctx: Any
    cfg: Any
    source: Any
    checkpoints: Any
    checkpoint_holder: Any
    checkpoint_board: Any
    checkpoint_dirs: tuple[tuple[str, str], ...]
    checkpoint_passes: int
    _checkpoints_wanted: trio.Event
    _ck_listed: dict[str, tuple[bytes, ...]]

    def checkpoint_news(self) -> None:
        """Members' snapshots brought news: the checkpoint pass runs now when the checkpoints the live members list
        (their ``sync.checkpoints``) differ from those listed at the last call (:meth:`_checkpoints_loop`)."""
        listed: dict[str, tuple[bytes, ...]] = {}
        for m in self.ctx.members(live=True):
            sec = self.ctx.section(m.origin, SyncSection)
            if sec is not None and sec.checkpoints:
                listed[m.origin] = tuple(r.digest for r in sec.checkpoints[:MAX_CHECKPOINT_REFS])
        if listed != self._ck_listed:
            self._ck_listed = listed
            self._checkpoints_wanted.set()

    def replicas_committed(self, origin: str, paths: tuple[str, ...]) -> None:
        """Replicas of ``origin``'s ``paths`` were committed here: the checkpoint pass runs when a checkpoint waiting
        for its files has one of them (:meth:`~._checkpoints.CheckpointHolder.awaits`); other commits wake nothing."""
        h = self.checkpoint_holder
        if h is not None and any(h.awaits(origin, p) for p in paths):
            self._checkpoints_wanted.set()

    async def _checkpoints_loop(self) -> None:
        """Issue 41: a durable node holds the checkpoints whose replicas are all here; every node learns the newest
        trusted checkpoint of each config (:class:`~._ckboard.CheckpointBoard`). Woken by news, not a timer: a
        member's snapshot listing other checkpoints (:meth:`checkpoint_news`), a push pass that ended (this node's
        own new checkpoints), replicas received (a holder's files arriving); else at the slow fallback
        :data:`CHECKPOINT_FALLBACK_S` (a holder's backoff after a failed fetch, a refusal that may end)."""
        holder = self.checkpoint_holder
        if holder is not None:
            await trio.to_thread.run_sync(holder.load)
        while True:
            self._checkpoints_wanted = trio.Event()
            started = trio.current_time()
            try:
                if holder is not None and await holder.pass_once():
                    self.ctx.publish_soon()
                await self.checkpoint_board.pass_once()
            except Exception:  # a bug here must not take the agent down
                log.exception("sync: checkpoint pass failed unexpectedly; retrying at the next news")
            self.checkpoint_passes += 1
            with trio.move_on_after(max(CHECKPOINT_FALLBACK_S, self.cfg.interval_s)):
                await self._checkpoints_wanted.wait()
            await trio.sleep_until(started + CHECKPOINT_PASS_GAP_S)  # news meanwhile: taken by the next pass

    async def _checkpoint_pass(self) -> None:
        """After a push pass: announce the complete checkpoints of this node's running trainings (a gang's: its rank-0
        member's, :func:`~._checkpoints.checkpoint_writers`; :meth:`~._checkpoints.CheckpointOrigin.pass_for`, in a
        worker thread); publish when one was signed."""
        origin, source = self.checkpoints, self.source
        if origin is None or source is None or not self.checkpoint_dirs:
            return
        jobs = self.ctx.section(self.ctx.node_id, JobsSection)
        running = checkpoint_writers(jobs.running if jobs is not None else [])  # a gang: rank 0's only
        manifests = {p: f.manifest for p, f in source.files.items()}
        signed = await trio.to_thread.run_sync(origin.pass_for, running, self.checkpoint_dirs, manifests,
                                               trio.current_time())
        if signed:
            log.info("sync: %d new checkpoint(s) signed", len(signed))
            self.ctx.publish_soon()
            self._checkpoints_wanted.set()  # news for this node's own board

    def _next_push_at(self) -> float:
        """When the next push pass is due (trio's clock): ``sync.interval_s`` from now, or sooner when an entry of a
        checkpoint dir settles (:meth:`~._checkpoints.CheckpointOrigin.next_deadline`: it is signed at once, not an
        interval later), at least :data:`MIN_SETTLE_WAKE_S` from now."""
        now = trio.current_time()
        at = now + self.cfg.interval_s
        settles = self.checkpoints.next_deadline() if self.checkpoints is not None else None
        return at if settles is None else min(at, max(settles, now + MIN_SETTLE_WAKE_S))
