"""Job control of one node: runs its part of the acting plan (or autonomous work without a leader); while it
leads, its :class:`._leading.LeaderRole` plans.

* **Every node** acts only on the plan the node core lets it act on (:meth:`p2pnode.node.NodeCore.acting_plan`:
  the current leader's, of the current term, the fencing token), through its part fetched from the leader and
  checked against the leader's signed ref (:mod:`._fetch`): it starts the assignments its guard and its own
  accounting (:mod:`._admission`) admit (refusals and their reasons go into its ``jobs`` section) and stops what
  :func:`p2pnode.node.node_actions` says. Without a leader it starts only ``autonomous`` templates, chosen by the
  same weights on its own capacity, and stops nothing.
* **The leader** plans on demand from the scheduling loop (:func:`p2pnode.scheduler.next_plan_at`); planning,
  serving plans and reading others' plans and running lists are :mod:`._leading`'s.
* Each node's :class:`p2pnode.scheduler.CapacityController` turns its GPU utilization into the offer carried in
  its ``jobs`` section; GPUs idle past the grace period ask for work at once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Protocol

import trio

from ..errors import DATA_ERRORS
from ..guard import CircuitBreaker, OperationPriority, SpawnRateLimiter, assess, jobs_to_stop
from ..node import NodeContext, NodeCore, node_actions, node_view_of
from ..node._plandist import open_part, part_version
from ..resources import FakeGpus
from ..scheduler import Catalog, ClusterView, RunningJob, next_plan_at, plan
from ..snapshot import (
    JobReport,
    JobsSection,
    PlanJob,
    PlanRef,
    PlanSection,
    Refusal,
    jobs_section,
)
from ..statefiles import report_for
from ._admission import gpu_conflict, resource_conflict
from ._capacity import NodeOffer
from ._fetch import PlanFetcher, Want
from ._history import JobHistory
from ._leading import LeaderRole
from ._operator import OperatorControl
from ._runner import JobRunner, RunningProcess
from ._signals import SignalBook, newest_signals

__all__ = ["JobControl"]

log = logging.getLogger(__name__)
MAX_REASON_CHARS = 500


def _report(j: RunningProcess) -> JobReport:
    t = j.template
    return JobReport(job_id=j.job_id, template=t.name, config=t.config, kind=t.kind, gpus=list(j.gpus),
                     gpu_fraction=j.gpu_fraction, vram_gib=j.vram_gib, started_at=j.started_at, term=j.term,
                     pid=j.proc.pid if j.proc is not None else None)


class Admission(Protocol):
    """The guard as job control uses it (:class:`p2pnode.drivers.GuardDriver`)."""

    def admits(self, kind: str, priority: OperationPriority | int) -> tuple[bool, str]:
        """Whether work of ``kind`` and ``priority`` may start now, and why not."""
        ...

    def idle_gpus(self) -> int:
        """GPUs idle past the idle grace."""
        ...

    def gpus_full(self) -> tuple[int, ...]:
        """GPUs whose memory is at or above the GPU limit: no new work on them."""
        ...


class JobControl:
    """Job control over ``ctx`` (see module docstring); ``core`` gives the election view and plan fencing,
    ``guard`` admission and idle GPUs (None: everything admitted, nothing idle), ``fake_gpus`` the simulated
    GPUs whose load follows the jobs (``--fake-gpus``)."""

    def __init__(self, ctx: NodeContext, core: NodeCore, catalog: Catalog, *, guard: Admission | None = None,
                 fake_gpus: FakeGpus | None = None) -> None:
        self.ctx = ctx
        self.core = core
        self.catalog = catalog
        self.guard = guard
        self.settings = ctx.config.scheduler
        self.limits = ctx.config.guard
        self.history = JobHistory(ctx.data_dir / "jobs.db")
        self.runner = JobRunner(node_id=ctx.node_id, data_dir=ctx.data_dir, history=self.history,
                                grace_s=self.settings.stop_grace_s, log_max_bytes=self.settings.log_max_bytes,
                                on_change=self._changed, on_exit=self._exited,
                                memory_limit_gib=self.limits.memory_limit_gb,
                                memory_check_interval_s=self.limits.check_interval_s,
                                templates=catalog.templates, on_agent_stop=self.settings.on_agent_stop)
        g = self.limits
        self.breaker = CircuitBreaker(failures=g.breaker_failures, cooldown_s=g.breaker_cooldown_s)
        self.spawn_limit = SpawnRateLimiter(per_minute=g.max_spawns_per_minute)
        self.capacity = NodeOffer(ctx, g, idle_gpus=guard.idle_gpus if guard is not None else lambda: 0,
                                  gpus_full=guard.gpus_full if guard is not None else tuple, fake_gpus=fake_gpus)
        self.signals = SignalBook(catalog.configs, seen_clocks=self._seen_clocks, on_change=ctx.publish_soon,
                                  report=report_for(ctx.data_dir))
        self.refused: deque[Refusal] = deque(maxlen=32)
        self.local_seq = 0
        self.ran: set[str] = {r["job_id"] for r in self.history.recent(1000)}
        self._nudge = trio.Event()  # a job ended: offer (and, leading, plan) now
        self._acted = trio.Event()  # a new plan of our own: act now
        self.fetcher = PlanFetcher(ctx, sign=getattr(ctx, "peer_read_headers", None))
        self.fetcher.on_fetched = lambda key: self._acted.set() if key[0] == "part" else self._nudge.set()
        self.leading = LeaderRole(ctx, core, catalog, self.fetcher, own_running=self.running_reports,
                                  own_offer=lambda: self.offer, own_operator=lambda: self.operator.section,
                                  signals=self.newest_signals)
        self.operator = OperatorControl(ctx, self.runner, self.leading.running_of)
        self._critical_since: float | None = None  # since when the degradation level is critical (4)
        self._acting_since: float | None = None  # when this run first acted on a leader's plan (monotonic)

    # -- sections --------------------------------------------------------------------------------
    def running_reports(self) -> list[JobReport]:
        """Every job running here."""
        return [_report(j) for j in self.runner.jobs.values()]

    def section(self) -> JobsSection:
        """This node's ``jobs`` section (running jobs inline up to ``INLINE_RUNNING``, else by digest)."""
        return jobs_section(self.running_reports(), refused=list(self.refused)[-8:], offer=self.offer,
                            signals=dict(self.signals.entries), catalog_digest=self.catalog.digest)

    @property
    def offer(self) -> int:
        """Jobs this node asks for (:class:`._capacity.NodeOffer`)."""
        return self.capacity.offer

    def _changed(self) -> None:
        self.capacity.drive_fake_gpus(self.runner.jobs.values())
        if self.ctx.last_sample is not None and len(self.runner.jobs) < len(self.ctx.last_sample.gpus):
            self.update_offer()  # a job ended: offer its GPU now, not at the next scheduling interval
        self.ctx.publish_soon()

    # -- signals ---------------------------------------------------------------------------------
    def _seen_clocks(self) -> list[tuple[str, int]]:
        return [(cfg, e.clock) for m in self.ctx.members() for cfg, e in m.snapshot.jobs.signals.items()]

    def newest_signals(self) -> dict[str, Any]:
        """Newest signal per config across every member's snapshot (Lamport order, see :mod:`._signals`)."""
        return newest_signals((m.origin, m.snapshot.jobs) for m in self.ctx.members())

    def accept_signals(self, raw: Any) -> list[Any]:
        """``POST /signals``: see :meth:`SignalBook.accept` (raises :class:`p2pnode.scheduler.SignalError`)."""
        return self.signals.accept(raw)

    # -- this node's part ------------------------------------------------------------------------
    def _exited(self, job: RunningProcess, status: int | None) -> None:
        """Feed the circuit breaker (a job that failed on its own is a failure; a stopped one is neither), and
        count its GPUs as free at once: the newest sample still shows the job's load on them."""
        if job.stopping is None:
            self.breaker.record(status == 0, self.ctx.now())
        self.capacity.freed(job.gpus)
        self._nudge.set()

    def _refuse(self, job_id: str, template: str, reason: str) -> None:
        # A refusal is final: the leader re-places the work under a new id, so this id must never start here
        # later (it could otherwise run twice, e.g. a second training job of its config).
        self.ran.add(job_id)
        if not any(r.job_id == job_id for r in self.refused):
            self.refused.append(Refusal(job_id=job_id, template=template, reason=reason[:MAX_REASON_CHARS],
                                        at=time.time()))
            log.warning("refusing job %s (%s): %s", job_id, template, reason)
            self.ctx.publish_soon()

    def _admit(self, j: PlanJob) -> bool:
        t = self.catalog.templates[j.template]
        ok, reason = self.admits(t.kind, self.catalog.priority_of(t.kind))
        if ok and self.operator.section.cordoned:
            ok, reason = False, "node cordoned by the operator: no new work"
        now = self.ctx.now()
        if ok and not self.breaker.allow(now):
            ok, reason = False, (f"circuit breaker open after {self.breaker.consecutive_failures} failed jobs; "
                                 f"next try in {max(0.0, (self.breaker.reopens_at() or 0) - now):.0f} s")
        if ok:
            conflict = self._conflict(j)
            ok, reason = (False, conflict) if conflict else (True, "")
        if not ok:
            self._refuse(j.job_id, j.template, reason)
        return ok

    def _conflict(self, j: PlanJob) -> str:
        """Why the assigned GPUs or the resources ``j``'s template asks for are not free here (:mod:`._admission`),
        or ''."""
        running = self.runner.jobs.values()
        full = self.guard.gpus_full() if self.guard is not None else ()
        why = gpu_conflict(j, self.ctx.last_sample, running, gpu_max_percent=self.limits.gpu_max_percent, full=full)
        me = self.ctx.member(self.ctx.node_id)
        if not why and me is not None:
            why = resource_conflict(self.catalog.templates[j.template].resources, me.snapshot, running, self.limits)
        return why

    def admits(self, kind: str, priority: OperationPriority | int) -> tuple[bool, str]:
        """The guard's admission of work of ``kind`` and ``priority`` on this node now."""
        return self.guard.admits(kind, priority) if self.guard is not None else (True, "")

    def _start(self, j: PlanJob, term: int) -> None:
        t = self.catalog.templates[j.template]
        self.ran.add(j.job_id)
        self.operator.started(j.job_id)
        try:
            self.runner.start(job_id=j.job_id, template=t, params=dict(j.params), gpus=tuple(j.gpus),
                              gpu_fraction=j.gpu_fraction, vram_gib=j.vram_gib, term=term,
                              catalog_dir=self.catalog.base_dir)
        except (OSError, ValueError) as exc:
            self.breaker.record(False, self.ctx.now())
            self.refused.append(Refusal(job_id=j.job_id, template=t.name,
                                        reason=f"cannot start: {exc}"[:MAX_REASON_CHARS], at=time.time()))
            log.error("cannot start %s: %s", j.job_id, exc)

    def act(self) -> None:
        """Start and stop this node's jobs after the acting plan, or autonomous work without a leader."""
        ctx, core = self.ctx, self.core
        if ctx.leaving:
            return
        self.enforce_level()
        self.operator.apply()
        view = core.view
        if view.leader is None:
            if not core.holding:  # at start-up the cluster may have a leader this node has not heard yet
                self._autonomous()
            return
        if view.leader == ctx.node_id:
            acting = core.acting_plan(self.leading.my_plan)
        else:
            ref = core.acting_plan(ctx.section(view.leader, PlanRef))
            acting = self._part(view.leader, ref) if ref is not None else None
        if acting is None:
            return  # no plan of the current term yet (or our part of it is on its way): keep what runs
        now = trio.current_time()
        if self._acting_since is None:
            self._acting_since = now
        # A re-adopted job counts as started when this run first acts on a plan: the plans made before the leader
        # heard of it (while this agent was down, or before its first snapshot reached the leader) do not hold it,
        # and must not stop it before the leader had ``adopt_grace_s`` to re-plan with it.
        running = {k: max(j.started_mono, self._acting_since) if j.adopted else j.started_mono
                   for k, j in self.runner.jobs.items()}
        try:
            starts, stops = node_actions(acting, ctx.node_id, running, self.ran, self.catalog.templates, now,
                                         self.settings.adopt_grace_s)
        except DATA_ERRORS as exc:  # a decoder gap: the leader's snapshot is set aside, this loop carries on
            if view.leader != ctx.node_id:
                ctx.quarantine(view.leader, "plan adoption", exc)
            return
        for job_id, reason in stops:  # stops first: a preemption frees its GPU for the job that replaces it
            self.runner.stop(job_id, reason)
        for j in starts:
            if not self.spawn_limit.try_acquire(ctx.now()):
                break  # spawn-rate limit: the rest waits for the next pass (not a refusal)
            if self._admit(j):
                self._start(j, j.term or acting.term)

    def _part(self, leader: str, ref: PlanRef) -> PlanSection | None:
        """This node's part of ``leader``'s plan ``ref`` if held, else None (a fetch is asked for)."""
        m = self.ctx.member(leader)
        if m is None:
            return None
        key = ("part", leader)
        version = part_version(ref)
        node_id = self.ctx.node_id
        self.fetcher.want(Want(key, version, leader, f"/plan/part?node={node_id}&digest={ref.digest}",
                               lambda data, k=m.key, r=ref: open_part(data, leader_key=k, ref=r, node_id=node_id)))
        part: PlanSection | None = self.fetcher.get(key, version)
        return part

    def enforce_level(self) -> None:
        """Stop the running work this node's degradation level (after hysteresis and dwell) no longer allows: at
        critical only CRITICAL work continues (:func:`p2pnode.guard.jobs_to_stop`); the runner records each reason
        in the job history. New work is refused as soon as the node is critical, but running work is stopped only
        once critical has held for ``guard.dwell_s``: one saturated CPU sample (often the jobs' own load) must not
        kill every job on the node."""
        now = self.ctx.now()
        if self.ctx.degradation_level < 4:
            self._critical_since = None
            return
        if self._critical_since is None:
            self._critical_since = now
        if now - self._critical_since < self.limits.dwell_s:
            return
        running = [(j.job_id, self.catalog.priority_of(j.template.kind)) for j in self.runner.jobs.values()
                   if j.stopping is None]
        s = self.ctx.last_sample
        a = assess(s.to_wire(), self.limits) if running and s is not None else None
        for job_id, reason in jobs_to_stop(self.ctx.degradation_level, running, a):
            self.runner.stop(job_id, reason)

    def history_has(self, job_id: str) -> bool:
        """A job id this node already ran or refused (never started again by a stale plan)."""
        return job_id in self.ran

    def _autonomous(self) -> None:
        ctx = self.ctx
        me = ctx.member(ctx.node_id)
        if me is None or self.offer <= 0:
            return
        node = node_view_of(me.snapshot, disk_max_percent=self.limits.disk_max_percent,
                            vram_limit_ratio=self.limits.gpu_max_percent / 100.0, offer=self.offer,
                            level=ctx.degradation_level, memory_limit_ratio=self.limits.memory_max_percent / 100.0)
        running = tuple(RunningJob(j.job_id, j.template.name, ctx.node_id, j.gpus, j.gpu_fraction, j.vram_gib)
                        for j in self.runner.jobs.values())
        p = plan(ClusterView({ctx.node_id: node}, running), self.catalog, self.newest_signals(), ctx.now(), term=0,
                 autonomous_only=True, seed=self.local_seq)
        for x in p.assignments:
            if not self.spawn_limit.try_acquire(ctx.now()):
                break
            self.local_seq += 1
            j = PlanJob(job_id=f"{ctx.node_id[:8]}-a{int(time.time())}-{self.local_seq}", node=ctx.node_id,
                        template=x.template, gpus=list(x.gpus), gpu_fraction=x.gpu_fraction, vram_gib=x.vram_gib,
                        params=dict(x.params))
            if self._admit(j):
                self._start(j, 0)
        self.capacity.offer = max(0, self.offer - len(p.assignments))

    def update_offer(self) -> None:
        """The PID controller's offer from this node's GPU utilization, idle GPUs and degradation level."""
        self.capacity.update(self.runner.jobs.values())

    # -- driver ----------------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """The agent stops: this node's jobs are stopped or left running for re-adoption, after
        ``scheduler.on_agent_stop`` (:meth:`JobRunner.shutdown`); call before the final snapshot, which then
        reports what still runs."""
        await self.runner.shutdown()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The runner, the scheduling loop (every ``interval_s``) and the acting loop (every second); a job that
        ends wakes both at once (its GPU is offered, re-planned and filled without waiting for a period)."""
        async with trio.open_nursery() as n:
            await n.start(self.runner.run)
            n.start_soon(self.fetcher.run)
            n.start_soon(self._schedule_loop)
            task_status.started()
            while True:
                self.signals.watch_file(self.settings.signals_file)
                seen = self._leader_ref()
                self.act()
                with trio.move_on_after(1.0):
                    while not self._acted.is_set():  # a new plan ref of the leader: act (fetch our part) now
                        with trio.move_on_after(0.2):
                            await self._acted.wait()
                        if self._leader_ref() != seen:
                            break
                self._acted = trio.Event()

    def _leader_ref(self) -> tuple[int, int, str] | None:
        """``(term, seq, digest)`` of the plan ref of the leader this node sees, or None."""
        leader = self.core.view.leader
        ref = self.ctx.section(leader, PlanRef) if leader is not None and leader != self.ctx.node_id else None
        return (ref.term, ref.seq, ref.digest) if ref is not None else None

    def _offers(self) -> int:
        """The offers of the live members as this node sees them (a rise is capacity that appeared)."""
        return sum(m.snapshot.jobs.offer for m in self.ctx.members(live=True) if m.origin != self.ctx.node_id)

    async def _schedule_loop(self) -> None:
        """Offer every ``interval_s``; while leading, plan on demand (:func:`p2pnode.scheduler.next_plan_at`):
        every ``interval_s``, and at least :data:`p2pnode.scheduler.PLAN_MIN_GAP_S` after the last plan when
        capacity appeared (a job of ours ended, a fetched running list or a member's higher offer), when a member
        reports a running job the plan does not hold (:meth:`LeaderRole.unplanned_running`: an agent back with
        re-adopted jobs, whose duplicate training must be fenced now) or the last plan stopped at its placement
        budget with work and offers left."""
        last_plan: float | None = None
        last_offer = float("-inf")
        budget_used = False
        offers = 0
        changed_at: float | None = None  # capacity appeared since the last plan, first seen then
        running_seen: dict[str, str] = {}  # member to the running digest last checked against the plan
        while True:
            now = trio.current_time()
            view = self.core.view
            nudged = self._nudge.is_set()
            self._nudge = trio.Event()
            if nudged or now - last_offer >= self.settings.interval_s:
                self.update_offer()
                last_offer = now
                self.ctx.publish_soon()
            seen = self._offers()
            if changed_at is None and (nudged or seen > offers):
                changed_at = now
            leading = view.leader == self.ctx.node_id and view.term is not None
            if leading and changed_at is None and self.leading.unplanned_running(running_seen):
                changed_at = now
            if leading and now >= next_plan_at(last_plan, interval_s=self.settings.interval_s,
                                               capacity_changed_at=changed_at, budget_used=budget_used):
                plan_before = self.leading.my_plan
                self.leading.lead(view.term)  # type: ignore[arg-type]
                if self.leading.my_plan is not plan_before:
                    last_plan, offers, changed_at = now, seen, None
                    budget_used = self.leading.last_budget_used
                    self._acted.set()  # our own part of the new plan: act now
                    self.ctx.publish_soon()
            elif not leading:
                if view.leader is not None:
                    self.leading.my_plan = None
                last_plan, budget_used, changed_at = None, False, None
            wake = self.settings.interval_s
            if leading and last_plan is not None:
                wake = max(0.05, next_plan_at(last_plan, interval_s=self.settings.interval_s,
                                              capacity_changed_at=changed_at, budget_used=budget_used) - now)
            with trio.move_on_after(min(wake, 1.0) if leading else wake):
                await self._nudge.wait()
