"""The agent's clean stop (a part of :class:`p2pnode.agent.Agent`, which inherits it; issue 41): SIGTERM or SIGINT
to ``p2pnode agent`` calls :meth:`_AgentClosing.stop`, and :meth:`p2pnode.agent.Agent.run` then runs
:meth:`_AgentClosing._close`.

1. **Hold** (``scheduler.on_agent_stop = "stop"``): every job is asked to stop (rule ``agent_stop``); a job with a
   checkpoint signal gets it first and its stop is held until a durable member confirms the new checkpoint, at
   most its ``[job.checkpoint] grace_s`` and ``scheduler.max_close_hold_s``
   (:meth:`p2pnode.jobs._stops.StopDriver.begin_close`). Meanwhile the node is not leaving: it gossips, publishes
   and signs snapshots and syncs (the durable member must learn of the checkpoint, and this node must read the
   durable member's confirmation), and its snapshot carries a notice (``jobs.notice_deadline_ms``, reason
   ``agent stop``) saying when it is gone: the leader treats it as cordoned (places nothing new there) and voters
   do not elect it while another member can lead (:func:`p2pnode.election.election_inputs`).
2. **Leave**: the final ``leaving`` snapshot, pushed to peers for at most ``gossip.leave_timeout_s``; the HTTP
   listener's graceful close.

:meth:`_AgentClosing.stop` returns the deadline by which :meth:`p2pnode.agent.Agent.run` returns: the holds' bound
plus :meth:`_AgentClosing.close_tail_s` (the jobs' exit after their SIGTERM: ``scheduler.stop_grace_s``, then
SIGKILL and :data:`p2pnode.jobs._runner.KILL_WAIT_S`; then the leave: ``gossip.leave_timeout_s`` +
:data:`LEAVE_MARGIN_S`), so the leave runs even after jobs that take their whole stop grace; the CLI cancels what is
left at it (a hard bound: the agent never hangs). A second call (a second signal) releases every held stop at once
and brings the deadline to the tail from then. ``kill -9`` runs none of this (jobs are left running and re-adopted
by the next start). The agent's own state is declared here for the type checker
only; nothing else imports this module.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import trio

from .node import NodeCore

if TYPE_CHECKING:
    from .config import Config
    from .drivers import GossipDriver
    from .jobs import JobControl

log = logging.getLogger("p2pnode.agent")

LEAVE_MARGIN_S = 0.8
"""Seconds the leave takes at most beyond ``gossip.leave_timeout_s`` (the final snapshot signed, the peers file
saved, the listener's graceful close: 0.5 s + 0.1 s)."""


class _AgentClosing:
    """The clean stop of one agent (see module docstring)."""

    config: Config
    core: NodeCore
    jobs: JobControl | None
    gossip: GossipDriver
    node_id: str
    _stop: trio.Event
    _stop_deadline: float = math.inf

    if TYPE_CHECKING:  # defined by the agent
        @staticmethod
        def now() -> float: ...

        @property
        def leaving(self) -> bool: ...

        def publish(self) -> None: ...
        def publish_soon(self) -> None: ...

    def stop(self, *, at_once: bool = False) -> float:
        """Ask :meth:`p2pnode.agent.Agent.run` to stop cleanly (module docstring); ``at_once`` (or a second call):
        release every held stop now. Returns the deadline (``trio.current_time()`` seconds) by which it returns:
        the holds' bound plus :meth:`close_tail_s`."""
        now = self.now()
        again = self._stop.is_set()
        tail = self.close_tail_s()
        if not again:
            until = now
            if self.jobs is not None:
                until = self.jobs.stops.begin_close(now, time.time(), tail,
                                                    self.config.scheduler.max_close_hold_s)
                self.core.leaving_soon = True  # no candidate while another member is (as each reconcile finds)
                self.publish_soon()  # the notice: cordoned by the leader
            self._stop_deadline = until + tail
            self._stop.set()
        if at_once or again:
            if self.jobs is not None:
                self.jobs.stops.cut(now)
            self._stop_deadline = min(self._stop_deadline, now + tail)
        return self._stop_deadline

    def close_tail_s(self) -> float:
        """Seconds the stop takes at most once the holds end: the jobs' exit (``scheduler.stop_grace_s`` after
        their SIGTERM, then SIGKILL and :data:`~p2pnode.jobs._runner.KILL_WAIT_S`; none when jobs are left running,
        ``on_agent_stop = "leave"``, or there is no job control) and the leave (``gossip.leave_timeout_s`` +
        :data:`LEAVE_MARGIN_S`)."""
        r = self.jobs.runner if self.jobs is not None else None
        exit_s = 0.0
        if r is not None and r.on_agent_stop == "stop":
            from .jobs._runner import KILL_WAIT_S  # loaded with the runner: a node without job control never loads it

            exit_s = r.grace_s + KILL_WAIT_S
        return exit_s + self.config.gossip.leave_timeout_s + LEAVE_MARGIN_S

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()

    async def _close(self) -> None:
        """Stop (or leave) the jobs, each hold to its bound at most, then publish the final ``leaving`` snapshot and
        push it to peers (``gossip.leave_timeout_s`` at most: the listener still serves meanwhile)."""
        log.info("agent %s leaving", self.node_id)
        if self.jobs is not None:  # the jobs first: the final snapshot reports what runs; not yet leaving, so a
            await self.jobs.shutdown()  # held stop's checkpoint is signed and replicated
        self.core.leaving = True
        self.publish()
        await self.gossip.leave()
