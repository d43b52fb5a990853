"""Job control's run-history summary (:class:`p2pnode.jobs._control.JobControl`, whose mixin this is): summarised
in a worker thread when a job ends, kept by digest (:data:`USAGE_KEPT`), served, and handed to the core's
predictor. In the same pass, on a node that pushes, the ended runs go to the job archive (:mod:`._archive`)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from ..snapshot import (
    UsageDoc,
    usage_digest,
)
from ._archive import SCAN_RUNS, JobArchive

USAGE_KEPT = 8
"""The usage summaries kept by digest (``GET /jobs/usage?digest=``)."""


class ControlUsage:
    """This node's usage summary (mixin of :class:`p2pnode.jobs._control.JobControl`: it uses the driver's
    attributes, set in its ``__init__``)."""

    if TYPE_CHECKING:  # the driver's attributes this part uses (set in JobControl.__init__)
        from ..node import JobCore
        from ._history import JobHistory
        from ._runner import JobRunner

        ctx: Any
        core: JobCore
        history: JobHistory
        runner: JobRunner
        usage: UsageDoc
        usage_digest: str
        usage_by_digest: dict[str, bytes]
        _usage_wanted: trio.Event

        def node_class(self) -> str: ...
        def news(self) -> None: ...

    async def _usage_loop(self) -> None:
        """Summarise this node's run history (:meth:`JobHistory.usage_doc`, in a worker thread) at start and after
        each job that ended; publish its digest (``jobs.usage_digest``) and hand it to the core's predictor."""
        while True:
            await self._usage_wanted.wait()
            self._usage_wanted = trio.Event()
            doc = await trio.to_thread.run_sync(self.history.usage_doc, self.ctx.node_id, self.node_class() or "cpu")
            if self.archive is not None:
                await trio.to_thread.run_sync(self._archive_ended)
            if self.keep_usage(doc):
                self.ctx.publish_soon()
                self.news()

    @functools.cached_property
    def archive(self) -> JobArchive | None:
        """The archive of this node's ended jobs (issue 41): only on a node that pushes its data (``sync.enabled``,
        tagged ``ephemeral``) and with ``scheduler.archive_log_bytes`` > 0; None elsewhere."""
        cfg, s = self.ctx.config, self.ctx.config.scheduler
        if not (cfg.sync.enabled and "ephemeral" in cfg.agent.tags and s.archive_log_bytes > 0):
            return None
        return JobArchive(root=self.runner.sync_root, logs_dir=self.runner.logs, log_bytes=s.archive_log_bytes,
                          max_bytes=s.archive_max_bytes)

    def _archive_ended(self) -> None:
        """Archive the runs that ended (worker thread; see :meth:`JobArchive.catch_up`)."""
        if self.archive is not None:
            self.archive.catch_up(self.history.recent(SCAN_RUNS))

    def keep_usage(self, doc: UsageDoc) -> bool:
        """Take ``doc`` as this node's summary (served, and handed to the core's predictor); keep it by digest
        among the last :data:`USAGE_KEPT`. Returns whether its digest changed (it is then to be published)."""
        self.usage = doc
        self.core.set_usage(doc)
        digest = usage_digest(doc) if doc.entries else ""
        if digest == self.usage_digest:
            return False
        self.usage_digest = digest
        if digest:
            self.usage_by_digest.pop(digest, None)
            self.usage_by_digest[digest] = msgspec.msgpack.encode(doc)
            while len(self.usage_by_digest) > USAGE_KEPT:
                del self.usage_by_digest[next(iter(self.usage_by_digest))]
        return True
