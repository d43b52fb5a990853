"""Operator control on this node (driver side of :mod:`p2pnode.node._operator`): the intents stored in its data
dir (cordon, drain, one-off ``jobs run`` requests), and ``jobs stop``.

A drain stops preemptible work once its deadline passed (the rest runs to its end; the node takes no new work,
as when cordoned): the stop rule ``drain`` of :class:`p2pnode.node._stoprules.StopRules` decides it from the
section's deadline, as ``operator`` decides the stops the operator asked for (:attr:`OperatorControl.stop_intents`):
this module stops nothing itself. A one-off request is forgotten once it started somewhere (or ran, or was
refused: logged), so no leader places it twice.

A stop intent is kept in the job ledger before ``p2pnode jobs stop`` is answered (:class:`._records.StopIntents`):
an agent killed before it carried the stop out carries it out after its restart; the intent is removed once the
stop is carried out (:meth:`OperatorControl.carried_out`) or its job ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from ..node import Member, NodeContext
from ..node._operator import IntentStore, run_outcome
from ..snapshot import JobReport, OperatorSection, PlanSection
from ._records import StopIntents
from ._runner import JobRunner
from ._runs import follow_runs

__all__ = ["OperatorControl"]

log = logging.getLogger(__name__)


class OperatorControl:
    """The operator's intents for node ``ctx`` (stored in its data dir) applied to ``runner``'s jobs;
    ``running_of(member)`` gives a member's running jobs (None when not known yet)."""

    def __init__(self, ctx: NodeContext, runner: JobRunner,
                 running_of: Callable[[Member], Iterable[JobReport] | None],
                 plan_of: Callable[[], PlanSection | None] = lambda: None) -> None:
        self.ctx = ctx
        self.plan_of = plan_of
        """The acting plan when this node leads (None: not known here): whose one-off run reports are believed."""
        self.runner = runner
        self.running_of = running_of
        self.intents = IntentStore(ctx.data_dir)
        self.kept_stops = StopIntents(runner.ledger)
        self.stop_intents: set[str] = set(self.kept_stops.load())
        """Jobs running here the operator asked to stop (``p2pnode jobs stop``; those an earlier run of the agent
        accepted and did not carry out, read back from the ledger): an input of the stop rules (rule
        ``operator``); a job id leaves the set once its stop is carried out (:meth:`carried_out`) or the job ended
        (:meth:`ended`)."""

    @property
    def section(self) -> OperatorSection:
        """This node's ``operator`` section (cordon, drain, one-off requests)."""
        return self.intents.section

    def apply(self) -> None:
        """Forget one-off requests that started somewhere or were refused (refusals are logged); the outcomes of
        the one-off runs requested here follow members' reports."""
        placed = self._placed()
        follow_runs(self.intents, self.ctx, self.running_of, time.time(), placed)
        runs = self.intents.section.runs
        if not runs:
            return
        running: set[str] = set()
        done: set[str] = set()
        refused: dict[str, str] = {}
        started_by: dict[str, str] = {}  # job id -> a member that runs it or whose done_runs name it
        for m in self.ctx.members():
            # (issue 39 H1: a run the acting plan assigns is started only by its node's word)
            ids = [r.job_id for r in (self.running_of(m) if m.state is not m.state.DEAD else None) or ()
                   if placed.get(r.job_id, m.origin) == m.origin]
            ran = [j for j in m.snapshot.operator.done_runs if placed.get(j, m.origin) == m.origin]
            running.update(ids)
            done.update(ran)
            for job_id in (*ids, *ran):
                started_by.setdefault(job_id, m.origin)
            refused.update((r.job_id, r.reason) for r in m.snapshot.jobs.refused)
        finished = set()
        for r in runs:
            outcome = run_outcome(r, running, done, refused)
            if outcome is not None:
                finished.add(r.id)
                log.info("one-off run %s (%s): %s", r.id, r.template, outcome)
        self.intents.finish_runs(finished, {r.id: started_by[f"run-{r.id}"] for r in runs
                                            if r.id in finished and f"run-{r.id}" in started_by})
        if finished:
            self.ctx.publish_soon()

    def _placed(self) -> dict[str, str]:
        """``run-<id>`` job id to the node the acting plan assigns it (empty: no such plan known here)."""
        p = self.plan_of()
        return {a.job_id: a.node for a in p.assignments if a.job_id.startswith("run-")} if p is not None else {}

    def started(self, job_id: str) -> None:
        """Job ``job_id`` starts here: a one-off (``run-...``) is placed once, no leader places it again."""
        if job_id.startswith("run-"):
            self.intents.ran(job_id)

    def stop_job(self, job_id: str) -> bool:
        """``p2pnode jobs stop``: ask to stop ``job_id`` if it runs here (an intent the stop rules carry out at the
        driver's next step: rule ``operator``, reason ``stopped by the operator`` in the history), or withdraw it
        if it is a one-off request (``run-<id>``) this node keeps and no leader placed yet (one that can never be
        placed, say); False when neither. Raises :class:`p2pnode.node._operator.RunPlaced` when that one-off is
        already placed on, or runs on, a node (not withdrawn). A catalog job's template may be placed again under
        a new id (desired state); a one-off is not."""
        if job_id not in self.runner.jobs:
            rid = job_id.removeprefix("run-")
            placed_on = self._placed().get(job_id) if job_id.startswith("run-") else None  # (issue 39 M2: a 409)
            if job_id.startswith("run-") and self.intents.cancel_run(rid, time.time(), placed_on):
                log.info("one-off run %s withdrawn by the operator", rid)
                self.ctx.publish_soon()
                return True
            return False
        self.started(job_id)
        if job_id not in self.stop_intents:
            self.kept_stops.add(job_id, time.time())  # committed before the route answers: survives a kill -9
            self.stop_intents.add(job_id)
        self.ctx.publish_soon()
        return True

    def carried_out(self, job_id: str) -> None:
        """The stop of ``job_id`` is carried out (its job is stopping or ended: the job table keeps that), or there
        is no such job here to stop: the intent goes, from the ledger too (kept while the ledger refuses to forget it:
        :meth:`JobRecords.flush` settles it again)."""
        if job_id in self.stop_intents and self.kept_stops.remove(job_id):  # (refused: kept, tried again)
            self.stop_intents.discard(job_id)

    def ended(self, job_id: str) -> None:
        """Job ``job_id`` ended here: no stop of it is wanted any more."""
        self.carried_out(job_id)
