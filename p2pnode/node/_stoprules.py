"""The stop rules a node applies to the jobs it runs itself (issue 39), sans-IO: no clock, no trio, ``now`` passed
in (monotonic seconds), typed :class:`~p2pnode.node._jobs.StopJob` effects out, :meth:`StopRules.next_deadline`.

The plan, adoption grace and load-shedding stops are :class:`~p2pnode.node.JobCore`'s; these are the rules that
need no plan, each named by its :data:`~p2pnode.node._jobstate.StopRule`:

* ``operator``: ``p2pnode jobs stop`` asked to stop the job (an intent, :attr:`RuleInputs.operator_stops`).
  Reason ``stopped by the operator``.
* ``memory_limit``: a memory sample the runner reports (:class:`MemorySample`, checked when it arrives,
  :meth:`StopRules.sampled`) shows the job's process-tree RSS over its limit (reason
  :func:`memory_stop_reason`); or the sample the runner takes at the job's exit (``final``) shows that its
  memory cgroup counted an OOM kill: the kernel enforced the limit, and the rule names that end (reason
  ``memory limit: killed by the kernel at its cgroup limit of L GiB (source)``), over a clean agent stop's
  (rule ``agent_stop``) too. A live job whose cgroup counted an OOM kill (a child's: a dataloader's, say) runs
  on: the kernel already enforced the limit.
* ``max_runtime``: ``now >= started_at + max_runtime_s`` (the template's). Reason ``maximum runtime reached``.
* ``lease_expired``: a job the node's lease fences (:attr:`RuleJob.fenced`: a training, or a template marked
  ``exclusive``) at or past the lease's expiry (:attr:`RuleInputs.lease_expires_at`,
  :class:`p2pnode.node._lease.Lease`, issue 42) less the job's stop lead (:attr:`RuleJob.lease_lead_s`: the stop
  grace and its checkpoint grace), so that it is gone before the lease runs out. Reason
  :data:`LEASE_REASON`.
* ``notice``: a fenced job (a training, or an ``exclusive`` template) of a node whose interruption probe gave a
  notice (:attr:`RuleInputs.notice_at`, :mod:`p2pnode.node._notice`): the machine is taken back, so the job stops
  now, after its checkpoint warning (:class:`p2pnode.node._ckwarn.CheckpointWarnings`, held at most to the
  notice's deadline less the stop grace), and the leader re-places it once it stopped. Reason
  ``interruption notice (R): node gone in N s``. Other jobs run until the machine goes.
* ``template_removed``: a re-adopted job whose template the catalog lacks when the rules first see it (a job
  started by this run keeps running when a pushed catalog drops its template: it is not started again). Reason
  ``template 'T' is no longer in the catalog``.
* ``drain``: the node drains and ``now >= drain_deadline``: its preemptible jobs stop, the rest run to their end.
  Reason ``node drained by the operator: deadline passed``.

Each job is asked to stop once: a job the rules asked, or that is stopping already (:attr:`RuleJob.stopping`:
a stop of the core's is under way), is never asked again, whatever rule would apply next (one exception: the
OOM kill at the exit of a job a clean agent stop was stopping names its end, ``memory_limit``). When several rules
apply in one step the first of the order above names the stop. State is bounded by the jobs that run: a job
that left the inputs is forgotten.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import msgspec

from ._jobs import StopJob
from ._jobstate import StopRule

__all__ = ["GIB", "LEASE_REASON", "RULE_NAMES", "MemorySample", "RuleInputs", "RuleJob", "StopRules",
           "memory_stop_reason", "oom_stop_reason"]

GIB = 2**30
RULE_NAMES: tuple[StopRule, ...] = ("operator", "memory_limit", "max_runtime", "lease_expired", "notice",
                                    "template_removed", "drain")
"""The rules of :class:`StopRules`, in their order (the first that applies names a stop)."""
NEVER = math.inf
OPERATOR_REASON = "stopped by the operator"
MAX_RUNTIME_REASON = "maximum runtime reached"
DRAIN_REASON = "node drained by the operator: deadline passed"
LEASE_REASON = "lease expired: no quorum of voters acked this node in time"


class RuleJob(msgspec.Struct, frozen=True):
    """A job running on this node as the stop rules see it: its ``template`` name and ``kind``, whether it is
    ``preemptible`` (a drain stops it), ``started_at`` (monotonic seconds on this run's clock; a re-adopted job's
    true start, its wall-clock start mapped back), its template's ``max_runtime_s`` (``inf``: none), its memory
    limit in GiB (0: none) and where the limit comes from (``limit_source``), whether it was ``adopted`` after an
    agent restart, whether it is ``stopping`` already (a stop asked by anyone) and by which rule (``stop_rule``,
    "" when not stopping)."""

    job_id: str
    template: str
    kind: str = ""
    preemptible: bool = False
    started_at: float = 0.0
    max_runtime_s: float = NEVER
    memory_limit_gib: float = 0.0
    limit_source: str = "guard.memory_limit_gb"
    adopted: bool = False
    stopping: bool = False
    stop_rule: str = ""
    fenced: bool = False
    """The node's lease fences it (a training, or its template is ``exclusive``)."""
    lease_lead_s: float = 0.0
    """How long before the lease's expiry it is asked to stop (seconds: ``stop_grace_s`` + its checkpoint grace)."""


class MemorySample(msgspec.Struct, frozen=True):
    """What the runner measured of one job: ``rss_bytes``, the resident set of its process tree (None: a memory
    cgroup holds it, the kernel enforces its limit), and ``oom_kills``, the OOM kills its cgroup counted (0 with
    no cgroup); ``vram_bytes`` its GPUs' memory when it holds them alone (recorded, no rule reads it); ``final``:
    the sample taken at the job's exit (only that one's OOM kills name a stop: the job ended)."""

    job_id: str
    rss_bytes: int | None = None
    oom_kills: int = 0
    vram_bytes: int = 0
    final: bool = False


class RuleInputs(msgspec.Struct, frozen=True):
    """What the rules read at a step: the ``jobs`` running here, the catalog's template names (``templates``),
    the drain (``draining``, and its deadline on the monotonic clock, ``drain_deadline``) and the job ids the
    operator asked to stop (``operator_stops``)."""

    jobs: tuple[RuleJob, ...] = ()
    templates: frozenset[str] = frozenset()
    draining: bool = False
    drain_deadline: float = NEVER
    operator_stops: frozenset[str] = frozenset()
    lease_expires_at: float = NEVER
    """When the node's lease runs out (monotonic seconds; ``inf``: no lease kept, nothing fenced)."""
    notice_at: float = NEVER
    """When the node is taken back, by its interruption notice (monotonic seconds; ``inf``: no notice)."""
    notice_reason: str = ""


def memory_stop_reason(rss_bytes: int, limit_gib: float, source: str = "guard.memory_limit_gb") -> str | None:
    """Why a job whose process tree holds ``rss_bytes`` is stopped under a limit of ``limit_gib`` GiB (set by
    ``source``), or None (within it, or ``limit_gib`` 0: no limit)."""
    if limit_gib <= 0 or rss_bytes <= limit_gib * GIB:
        return None
    rss_gib = rss_bytes / GIB
    shown = f"{rss_gib:.1f}" if rss_gib >= 1 else f"{rss_gib:.3f}"
    return f"memory limit: RSS {shown} GiB > {limit_gib:g} GiB ({source})"


def oom_stop_reason(limit_gib: float, source: str) -> str:
    """The reason of a job the kernel killed at its memory cgroup's limit of ``limit_gib`` GiB (set by ``source``)."""
    return f"memory limit: killed by the kernel at its cgroup limit of {limit_gib:g} GiB ({source})"


class StopRules:
    """The node's own stop rules (module docstring). :meth:`step` at each step of the driver and when
    :meth:`next_deadline` passes; :meth:`sampled` when the runner reports a memory sample. ``counts``: the stops
    asked so far, by rule."""

    def __init__(self) -> None:
        self.asked: dict[str, StopRule] = {}
        """Job id -> the rule that asked it to stop (while it still runs)."""
        self.counts: Counter[str] = Counter()
        self._seen: set[str] = set()
        self._deadline = NEVER

    def _ask(self, job: RuleJob, rule: StopRule, reason: str, out: list[StopJob]) -> None:
        self.asked[job.job_id] = rule
        self.counts[rule] += 1
        out.append(StopJob(job.job_id, reason, rule))

    def _first_rule(self, job: RuleJob, inp: RuleInputs, first_sight: bool,
                    now: float) -> tuple[StopRule, str] | None:
        """The first rule that stops ``job`` now, with its reason, or None."""
        if job.job_id in inp.operator_stops:
            return "operator", OPERATOR_REASON
        if now >= job.started_at + job.max_runtime_s:
            return "max_runtime", MAX_RUNTIME_REASON
        if job.fenced and now >= inp.lease_expires_at - job.lease_lead_s:
            return "lease_expired", LEASE_REASON
        if job.fenced and inp.notice_at < NEVER:
            left = max(0.0, inp.notice_at - now)
            return "notice", f"interruption notice ({inp.notice_reason or 'interruption'}): node gone in {left:.0f} s"
        if first_sight and job.adopted and job.template not in inp.templates:
            return "template_removed", f"template {job.template!r} is no longer in the catalog"
        if inp.draining and job.preemptible and now >= inp.drain_deadline:
            return "drain", DRAIN_REASON
        return None

    def step(self, inp: RuleInputs, now: float) -> list[StopJob]:
        """The stops the rules ask for at ``now`` (monotonic seconds), in the order of ``inp.jobs``."""
        out: list[StopJob] = []
        running = {j.job_id for j in inp.jobs}
        self.asked = {k: v for k, v in self.asked.items() if k in running}
        deadline = NEVER
        drain_waits = False
        for job in inp.jobs:
            first_sight = job.job_id not in self._seen
            self._seen.add(job.job_id)
            if job.stopping or job.job_id in self.asked:
                continue
            hit = self._first_rule(job, inp, first_sight, now)
            if hit is not None:
                self._ask(job, hit[0], hit[1], out)
                continue
            deadline = min(deadline, job.started_at + job.max_runtime_s,
                           inp.lease_expires_at - job.lease_lead_s if job.fenced else NEVER)
            drain_waits = drain_waits or (inp.draining and job.preemptible)
        self._seen &= running
        self._deadline = min(deadline, inp.drain_deadline if drain_waits else NEVER)
        return out

    def sampled(self, job: RuleJob, sample: MemorySample) -> list[StopJob]:
        """The memory rule for ``job`` on its newest ``sample``: a stop when its RSS is over its limit, or when the
        sample is its exit's (``final``) and the kernel OOM-killed in its cgroup (naming that end, over a clean
        agent stop's); nothing when the rules asked it already, or it is stopping for another reason."""
        if job.job_id in self.asked:
            return []
        oom = sample.final and sample.oom_kills > 0
        if job.stopping and not (oom and job.stop_rule == "agent_stop"):
            return []
        if oom:
            reason: str | None = oom_stop_reason(job.memory_limit_gib, job.limit_source)
        elif sample.rss_bytes is not None and not sample.final:
            reason = memory_stop_reason(sample.rss_bytes, job.memory_limit_gib, job.limit_source)
        else:
            reason = None
        out: list[StopJob] = []
        if reason is not None:
            self._ask(job, "memory_limit", reason, out)
        return out

    def next_deadline(self) -> float:
        """When :meth:`step` must run again at the latest with no news (monotonic seconds; ``inf``: never): the
        earliest maximum-runtime expiry of a job not yet asked to stop, the lease's stop time while a fenced job
        runs, and the drain deadline while a
        preemptible job waits for it. Never earlier than the last step's ``now``: what was due then was asked."""
        return self._deadline

    def forget(self, job_ids: Iterable[str]) -> None:
        """Jobs that ended: their stop is done (bounded state; :meth:`step` forgets them too)."""
        for k in job_ids:
            self.asked.pop(k, None)
            self._seen.discard(k)
