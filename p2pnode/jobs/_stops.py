"""The driver of a node's stop rules (:class:`p2pnode.node._stoprules.StopRules`): it hands the rules what the
runner observed (the jobs it runs, each memory sample it reports) and the operator's inputs (the drain, the jobs
the operator asked to stop), and passes the rules' :class:`~p2pnode.node.StopJob` effects to the one executor it
is given (:meth:`p2pnode.jobs._control.JobControl.apply`). It decides nothing and stops nothing itself.

It also keeps the warning before a stop (issue 41, item 3: :class:`p2pnode.node._ckwarn.CheckpointWarnings`): the
executor passes every stop through :meth:`StopDriver.gate` (stop now, or send the checkpoint signal and hold it),
and each :meth:`StopDriver.step` (or :meth:`StopDriver.release`) lists the held jobs' checkpoint dirs, reads where
checkpoints are replicated (:class:`p2pnode.jobs._ckconfirm.ReplicaView`) and passes the stops released (a new
complete checkpoint a durable replica holds, or the deadline) to the executor. While a stop is held the dirs are
listed every :data:`p2pnode.jobs._ckwarn.LIST_EVERY_S` (:meth:`StopDriver.next_deadline`).

A clean agent stop (SIGTERM, SIGINT) begins with :meth:`StopDriver.begin_close`: it bounds the holds of the stops
to come (:meth:`CheckpointWarnings.hold_bound`, each job's checkpoint ``grace_s``, at most
``scheduler.max_close_hold_s``), says when the node is gone in the snapshot (the notice fields, reason
:data:`CLOSE_REASON`: the leader treats the node as cordoned, voters do not elect it) and hands the agent its
deadline; :meth:`StopDriver.cut` (a second signal) releases every held stop at once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable
from typing import Any

import trio

from ..node import StopJob
from ..node._ckwarn import CheckpointWarnings, ReplicaNews, SignalJob
from ..node._notice import Notice
from ..node._stoprules import MemorySample, RuleInputs, RuleJob, StopRules
from ._ckwarn import LIST_EVERY_S, list_dir, warn_spec
from ._leasefile import template_lead_s
from ._noticeprobe import NoticeProbe
from ._runner import JobRunner, RunningProcess

__all__ = ["CLOSE_REASON", "StopDriver", "rule_job"]

log = logging.getLogger(__name__)

CLOSE_REASON = "agent stop"
"""The notice reason a node stopping cleanly publishes (``jobs.notice_reason``)."""


def rule_job(j: RunningProcess, grace_s: float = 0.0) -> RuleJob:
    """The job ``j`` of the runner as the stop rules see it (``grace_s``: the runner's stop grace, part of a fenced
    job's stop lead, :func:`p2pnode.jobs._leasefile.template_lead_s`)."""
    t = j.template
    return RuleJob(j.job_id, t.name, t.kind, t.preemptible, j.began_mono, t.max_runtime_s, j.memory_limit_gib,
                   j.limit_source, j.adopted, j.stopping is not None, j.stop_rule or "", t.fenced,
                   template_lead_s(t, grace_s))


class StopDriver:
    """Feeds ``rules`` from ``runner`` and passes their effects to ``execute`` (a list of effects in order)."""

    def __init__(self, runner: JobRunner, execute: Callable[[list[Any]], None],
                 rules: StopRules | None = None, replicas: Callable[[], ReplicaNews] = ReplicaNews,
                 notices: NoticeProbe | None = None) -> None:
        self.runner = runner
        self.execute = execute
        self.rules = rules if rules is not None else StopRules()
        self.warnings = CheckpointWarnings()
        self.replicas = replicas
        """Where checkpoints are replicated now (:class:`p2pnode.jobs._ckconfirm.ReplicaView`; default: no durable
        member known, a held stop ends at the local checkpoint)."""
        self.closing = False
        """The agent stops (:meth:`hold_out` began): the job core is no longer stepped, nothing new starts; the
        agent keeps publishing and syncing (not yet leaving) so a durable replica can confirm the held checkpoints."""
        self.notices = notices
        """This node's interruption probe (:class:`p2pnode.jobs._noticeprobe.NoticeProbe`; None: none): its
        notice stops the fenced jobs (rule ``notice``) and bounds every held stop's deadline."""
        self._listed_at = float("-inf")
        self.close_until = math.inf
        """No held stop outlasts it (monotonic seconds; :meth:`begin_close`)."""
        self.close_notice: Notice | None = None
        """When the node is gone by its own clean stop (:meth:`begin_close`), published as a notice."""
        self._held_changed = trio.Event()  # set when a held stop is released or its job ends (hold_out wakes)

    def step(self, now: float, *, draining: bool = False, drain_deadline: float = float("inf"),
             operator_stops: Collection[str] = (), lease_expires_at: float = float("inf")) -> None:
        """Step the rules at ``now`` (monotonic seconds) over the jobs the runner runs, the catalog's templates
        (the runner's), the drain, ``operator_stops`` and the expiry of the node's lease; carry out their stops."""
        grace = self.runner.grace_s
        n = self.notices.core.notice if self.notices is not None else None
        inp = RuleInputs(tuple(rule_job(j, grace) for j in self.runner.jobs.values()),
                         frozenset(self.runner.templates), draining, drain_deadline, frozenset(operator_stops),
                         lease_expires_at, *((n.at, n.reason) if n is not None else ()))
        effects = self.rules.step(inp, now)
        if effects:
            self.execute(effects)
        self.release(now)

    async def run_notices(self, news: Callable[[], None]) -> None:
        """Run the interruption probe (:meth:`NoticeProbe.run`; none: return at once), ``news`` at each change."""
        if self.notices is not None:
            await self.notices.run(news)

    def gate(self, effects: list[Any], now: float) -> list[Any]:
        """The executor's ``effects`` at ``now``, each stop replaced by what :meth:`CheckpointWarnings.stop` says:
        itself (carry it out), a ``SignalJob`` (send the job its checkpoint signal; the stop is held) or nothing
        (held already). Other effects pass unchanged."""
        out: list[Any] = []
        for e in effects:
            if not isinstance(e, StopJob):
                out.append(e)
                continue
            job = self.runner.jobs.get(e.job_id)
            spec = warn_spec(job, self.runner.grace_s) if job is not None and not job.ended else None
            for x in self.warnings.stop(e, spec, now, self.notice_at, self.close_until):
                if isinstance(x, SignalJob):
                    log.info("job %s: %s before its stop (%s)", x.job_id, x.signal, x.rule)
                out.append(x)
        return out

    @property
    def notice_at(self) -> float:
        """When this node is gone by its interruption probe's notice (monotonic seconds; ``inf``: none)."""
        return self.notices.at if self.notices is not None else math.inf

    @property
    def noticed(self) -> bool:
        """Whether this node is gone soon: its probe gave a notice, or it stops (:meth:`begin_close`)."""
        return self.close_notice is not None or (self.notices is not None and self.notices.core.notice is not None)

    def notice_fields(self) -> dict[str, Any]:
        """The notice fields of the ``jobs`` section (:class:`p2pnode.snapshot.JobsSection`): the probe's, or the
        clean stop's when it ends first (none: ``{}``)."""
        probe = self.notices.section_fields() if self.notices is not None else {}
        c = self.close_notice
        if c is None or (probe and self.notice_at <= c.at):
            return probe
        return {"notice_deadline_ms": max(0, min(2**53, int(c.wall_at * 1000))), "notice_reason": c.reason}

    def begin_close(self, now: float, wall: float, leave_s: float, cap_s: float) -> float:
        """A clean agent stop begins at ``now`` (``wall``: the same instant in Unix seconds): the deadline of the
        holds its stops may have (:meth:`CheckpointWarnings.hold_bound` over the runner's jobs with ``on_agent_stop
        = "stop"``, ``now`` otherwise; at most ``cap_s`` seconds from ``now``, ``scheduler.max_close_hold_s``), kept
        as :attr:`close_until`; the notice published is that plus ``leave_s``. Idempotent: a second call keeps the
        first bound. Returns the bound."""
        if self.close_notice is None:
            jobs = self.runner.jobs.values() if self.runner.on_agent_stop == "stop" else ()
            specs = [(j.job_id, warn_spec(j, self.runner.grace_s)) for j in jobs if j.stopping is None and not j.ended]
            self.close_until = self.warnings.hold_bound(specs, now, self.notice_at, cap_s)
            self.close_notice = Notice(self.close_until + leave_s, wall + self.close_until - now + leave_s,
                                       CLOSE_REASON)
        self.closing = True
        return self.close_until

    def cut(self, now: float) -> None:
        """Release every held stop at ``now`` and hold none after (a second signal: the agent stops at once)."""
        self.close_until = min(self.close_until, now)
        out = self.warnings.cut(now)
        if out:
            self.execute(out)
        self._held_changed.set()

    async def hold_out(self, now: Callable[[], float]) -> None:
        """Wait until no stop is held (each is released at its deadline at most), listing the held jobs' dirs every
        :data:`LIST_EVERY_S` (a clean agent stop: the drive loop steps the stop rules only, :attr:`closing`). It
        sleeps until the earlier of the next listing and the next held deadline, and wakes at once when a stop is
        released elsewhere (the drive loop at a durable member's news, :meth:`cut`) or a held job ends."""
        self.closing = True
        self.release(now())
        while self.warnings.held:
            self._held_changed = trio.Event()
            with trio.move_on_at(min(self.warnings.next_deadline(), self._listed_at + LIST_EVERY_S)):
                await self._held_changed.wait()
            self.release(now())

    def release(self, now: float) -> None:
        """List the held jobs' checkpoint dirs and read where checkpoints are replicated; pass the stops released (a
        new checkpoint a durable replica holds, or a local one with no durable member; the deadline) on."""
        if not self.warnings.held:
            return
        self._listed_at = now
        before = len(self.warnings.held)
        out: list[Any] = self.warnings.replicas(self.replicas())  # first: a listing judged on old news (none yet:
        for job_id in list(self.warnings.held):  # no durable member) would release at the local entry
            job = self.runner.jobs.get(job_id)
            out += self.warnings.listed(job_id, list_dir(job.checkpoint_dir if job is not None else ""))
        out += self.warnings.step(now)
        if out:
            self.execute(out)
        if len(self.warnings.held) < before:
            self._held_changed.set()

    def sampled(self, job: RunningProcess, sample: MemorySample) -> None:
        """The runner's ``on_sample``: the memory rule on ``job``'s newest sample; its stop carried out at once."""
        effects = self.rules.sampled(rule_job(job, self.runner.grace_s), sample)
        if effects:
            self.execute(effects)

    def ended(self, job_ids: Iterable[str]) -> None:
        """Jobs that ended: the rules and the held stops forget them."""
        job_ids = tuple(job_ids)
        self.rules.forget(job_ids)
        self.warnings.forget(job_ids)
        self._held_changed.set()

    def next_deadline(self) -> float:
        """When :meth:`step` must run again at the latest: the rules' :meth:`StopRules.next_deadline`, a held stop's
        deadline, and the next listing of a held job's dir."""
        held = self.warnings.next_deadline()
        listing = self._listed_at + LIST_EVERY_S if self.warnings.held else float("inf")
        return min(self.rules.next_deadline(), held, listing)
