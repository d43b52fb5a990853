"""The vocabulary of a job's life on one node (issue 39), shared by the job table, the stop rules, the runner's
events and the history: the states a job id passes through, the rule that stopped it, and how it ended.

* :data:`JobState`: ``assigned`` (a plan or an autonomous choice gave it to this node), ``waiting`` (admitted,
  held back by the spawn-rate limit), ``fetching`` (its config's newest checkpoint is being fetched to this node
  before it starts: issue 41, :mod:`p2pnode.synccore._checkpoints`), ``starting`` (a start was asked of the
  executor), ``running`` (the executor reported its process), ``stopping`` (a stop rule asked it to stop; the
  reason is kept), ``ended`` (its process exited; the outcome is kept), ``refused`` (admission refused it; final
  for that job id).
* :data:`StopRule`: the name of the rule of the core that stopped a job; every stop has exactly one.
* :data:`EndOutcome`: ``completed`` (exit status 0 on its own), ``failed`` (non-zero status or a signal on its own),
  ``stopped`` (a stop rule asked it to stop), ``start_failed`` (the executor could not start it), ``lost`` (its
  process vanished without a status, e.g. after an agent restart).
"""

from __future__ import annotations

from typing import Literal, TypeAlias, get_args

__all__ = ["END_OUTCOMES", "JOB_STATES", "PLAN_RULES", "STOP_RULES", "EndOutcome", "JobState", "StopRule",
           "exit_outcome", "plan_rule"]

JobState: TypeAlias = Literal["assigned", "waiting", "fetching", "starting", "running", "stopping", "ended",
                              "refused"]
StopRule: TypeAlias = Literal[
    "plan",              # the acting plan no longer holds it (or a duplicate training fenced by the plan)
    "adoption",          # re-adopted after a restart, not in the plan once the adoption grace passed
    "shed",              # load shedding: CPU or memory over its limit for the dwell
    "drain",             # the node drains and the drain deadline passed (preemptible work)
    "max_runtime",       # the template's max_runtime_s elapsed
    "memory_limit",      # the job's memory passed its limit (sampled, or the kernel's cgroup OOM kill)
    "operator",          # `p2pnode jobs stop`
    "template_removed",  # its template left the catalog
    "gang_ended",        # another member of its gang ended
    "agent_stop",        # the agent stops cleanly with on_agent_stop = "stop"
    "lease_expired",     # the node's lease on its fenced (exclusive) work ran out: no quorum of voters heard
    "notice",            # the node's interruption probe said the machine is taken back (issue 41): fenced work
]
EndOutcome: TypeAlias = Literal["completed", "failed", "stopped", "start_failed", "lost"]

JOB_STATES: tuple[str, ...] = get_args(JobState)
STOP_RULES: tuple[str, ...] = get_args(StopRule)
END_OUTCOMES: tuple[str, ...] = get_args(EndOutcome)
PLAN_RULES: tuple[StopRule, ...] = ("plan", "template_removed", "gang_ended")
"""The rules a leader's plan may name on a stop (:class:`p2pnode.snapshot.PlanStop` ``rule``)."""


def plan_rule(name: str) -> StopRule:
    """The stop rule a node records for a plan's stop that names ``name``: one of :data:`PLAN_RULES`, else
    ``plan`` (a rule a newer leader added, or one no plan may order, such as ``operator``)."""
    return next((r for r in PLAN_RULES if r == name), "plan")


def exit_outcome(status: int | None, *, stopped: bool) -> EndOutcome:
    """How a process that ended with ``status`` (its exit status, negative for a signal, None when none was
    recorded) ended, for the history: ``stopped`` when a stop rule asked it to stop, else ``completed`` (0),
    ``failed`` (another status or a signal) or ``lost`` (no status)."""
    if stopped:
        return "stopped"
    if status is None:
        return "lost"
    return "completed" if status == 0 else "failed"
