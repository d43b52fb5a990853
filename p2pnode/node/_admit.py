"""Admission and starts, a part of :class:`p2pnode.node.JobCore`: the spawn-rate limit, scaled with the node's GPUs
and CPUs (:func:`p2pnode.guardcore.spawn_rate_per_minute`; a start it holds back waits, with its reason in
:attr:`p2pnode.node.JobCore.waiting`, deadline: the next token), the guard's admission of the template's kind and
priority, the operator's cordon, the circuit breaker and GPU/resource conflicts (a refusal is final for that job
id: the leader re-places the work under a new id); and, without a leader, the choice of ``autonomous`` work
(with the leaderless reserve of a GPU for the first plan's training). The state it reads and writes (the limit,
the waiting starts, the act's deadline) is the core's. Sans-IO: ``now`` is passed in.

Admission decides from :class:`JobInputs` values alone (no callbacks into the driver): the guard's level in force
and its reasons (:func:`guard_refusal`), and the GPU/resource fit by the scheduler's own per-node accounting
(:func:`p2pnode.scheduler.node_misfit`, whose resource check :func:`p2pnode.scheduler.misfit` the leader's
placement calls too) of this node's view against the jobs running here, each job's figures chosen by
:func:`p2pnode.scheduler.need_of`: those the leader's plan placed it by (:class:`p2pnode.snapshot.PlanJob`
``memory_gib``, ``vram_peak_gib``; for a job running here, those it was admitted with, kept in its table record),
so a node with no run history of its own admits as the leader placed; where the plan carries none (the leader had
no history figure, or predates the fields), after an agent restart, and for leaderless work, the predicted peak
memory and peak VRAM per GPU where this node's own predictor has history for the template on its class, else the
declared figures.
A start whose room only jobs being stopped hold waits for their exit instead (:meth:`Admission.stop_wait`).

A leader's placement of a template that declares ``[job.checkpoint]`` (issue 41, item 2; only where the core's
``fetch_checkpoints`` is on, the agent's job control; every member of a gang too, each fetching for itself, so
every rank starts with the same ``resume_from``) is not started at once once admitted: it
is recorded ``fetching`` and a :class:`FetchCheckpoint` asks the driver to decide what it resumes from and fetch
it; while it fetches, the job is this node's (each later act skips it: no second start, no second token), and when
the driver hands the outcome back (:attr:`JobInputs.resumes`) it is admitted again (the level, the lease, the
GPUs may have changed meanwhile) and started with ``resume_from``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from ..guardcore import (
    LEVEL_NAMES,
    CircuitBreaker,
    OperationPriority,
    SpawnRateLimiter,
    may_start,
    spawn_rate_per_minute,
)
from ..scheduler import (
    Catalog,
    ClusterView,
    Figures,
    GpuView,
    Holding,
    NodeView,
    Plan,
    Predictor,
    ResourceRequest,
    RunningJob,
    leaderless_catalog,
    need_of,
    node_misfit,
    reserve_for_stable,
)
from ..scheduler._gpucap import MAX_VRAM_GIB
from ..scheduler._stable import STABLE_RESERVE_INTERVALS
from ..snapshot import PlanJob
from ._book import JobBook
from ._jobio import Effect, FetchCheckpoint, JobInputs, LocalJob, Refuse, StartJob, StopJob
from ._offer import Offers
from ._table import FetchAsked, JobTable, Refused, StartAsked, TransitionError

__all__ = ["Admission", "guard_refusal", "planned_figures"]

MAX_REASON_CHARS = 500
NEVER = math.inf


def planned_figures(memory_gib: float | None, vram_peak_gib: float) -> Figures | None:
    """The :class:`p2pnode.scheduler.Figures` a plan's entry (or the table record made from it) carries, or None
    where it carries none (``memory_gib`` None: the leader had no history figure, or predates the fields)."""
    return None if memory_gib is None else Figures(memory_gib, vram_peak_gib)


def guard_refusal(inp: JobInputs, kind: str, priority: OperationPriority | int, job_id: str = "") -> str:
    """Why the guard refuses new work of ``kind`` and ``priority`` (the assignment ``job_id``) now ('' when it
    admits it), from ``inp``'s values: the driver's own refusal (``refuse_new``, ``refuse_jobs``), training while
    the disk is at or above critical (``training_refused``), and a priority the level in force does not admit
    (:func:`p2pnode.guardcore.may_start`, with ``level_why``), as :func:`p2pnode.guardcore.admission` words them."""
    if inp.refuse_new:
        return inp.refuse_new
    if job_id in inp.refuse_jobs:
        return inp.refuse_jobs[job_id]
    if kind == "training" and inp.training_refused:
        return inp.training_refused
    if not may_start(priority, inp.level):
        level = max(0, min(4, inp.level))
        return (f"{OperationPriority(int(priority)).name} work refused at degradation level {level} "
                f"({LEVEL_NAMES[level]}): {inp.level_why}")
    return ""


class _Core(Protocol):
    """What admission reads and writes of :class:`p2pnode.node.JobCore`."""

    node_id: str
    catalog: Catalog
    interval_s: float
    spawns_per_minute: float | None
    spawns_per_minute_per_gpu: float
    spawns_per_minute_per_cpu: float
    spawn_limit: SpawnRateLimiter
    waiting: tuple[tuple[str, str, str], ...]
    waiting_gpu_jobs: int
    book: JobBook
    breaker: CircuitBreaker
    table: JobTable
    predictor: Predictor
    offers: Offers
    local_seq: int
    _acted: tuple[Any, ...] | None
    _act_at: float
    _reserve_until: float | None
    fetch_checkpoints: bool

    def plan_fn(self, *args: Any, **kw: Any) -> Plan: ...


class Admission:
    """Admission and starts for ``core`` (see the module docstring)."""

    def __init__(self, core: _Core) -> None:
        self.core = core

    def spawn_rate(self, gpus: int, cpus: float) -> float:
        """The spawn-rate limit (jobs per minute) of this node with ``gpus`` GPUs and ``cpus`` CPUs for jobs."""
        c = self.core
        return spawn_rate_per_minute(gpus=gpus, cpus=cpus, fixed=c.spawns_per_minute,
                                     per_gpu=c.spawns_per_minute_per_gpu, per_cpu=c.spawns_per_minute_per_cpu)

    def start_all(self, inp: JobInputs, starts: Sequence[PlanJob], term: int, now: float,
                  out: list[Effect]) -> int:
        """Admit and start ``starts`` in order while the spawn-rate limit allows (the rest waits for the next
        token, listed in the core's ``waiting`` with when it comes: not a refusal). Returns how many were let through
        the limit."""
        c = self.core
        me = next((m.view for m in inp.members if m.origin == c.node_id and m.view is not None), None)
        limit = c.spawn_limit
        if me is not None:
            limit.per_minute = self.spawn_rate(len(me.gpus), me.cpus)
        n = 0
        c.waiting, c.waiting_gpu_jobs = (), 0
        held: list[tuple[str, str, str]] = []
        stopping = frozenset(c.book.stopping(inp))
        # issue 39 (finding 2): the stops emitted in this same step count as stopping too (as before the table)
        stopping |= {e.job_id for e in out if isinstance(e, StopJob)}
        for i, j in enumerate(starts):
            if c.table.state(j.job_id) == "fetching":  # issue 41: held as this node's while its checkpoint comes
                self.resume(inp, j, term, now, out)
                continue
            why_held = self.stop_wait(inp, j, stopping) if stopping else ""
            if why_held:  # a preempted job still in its stop grace: not a refusal, the start follows its exit
                held.append((j.job_id, j.template, why_held[:MAX_REASON_CHARS]))
                continue
            if not limit.try_acquire(now):
                at = limit.next_token_at(now)  # strictly later: the driver must not spin
                c._act_at = min(c._act_at, at)
                setting = ("guard.max_spawns_per_minute" if c.spawns_per_minute is not None
                           else "guard.spawns_per_minute_per_gpu / _per_cpu")
                why = (f"waiting to start: spawn-rate limit of {limit.per_minute:g} jobs a minute on this node "
                       f"({setting}); next start in {at - now:.1f} s")
                rest = [x for x in starts[i:] if not (stopping and self.stop_wait(inp, x, stopping))]
                c.waiting = tuple((x.job_id, x.template, why) for x in rest)
                c.waiting_gpu_jobs = sum(1 for x in rest if x.gpus)
                break
            n += 1
            if self.admit(inp, j, now, out, term=term):
                t = c.catalog.templates[j.template]
                if c.fetch_checkpoints and (j.term or term) > 0 and t.checkpoint is not None:
                    c.table.apply(FetchAsked(j.job_id, reason=f"fetching the newest checkpoint of {t.config}"), now)
                    out.append(FetchCheckpoint(j, j.term or term, t.config))
                else:
                    c.table.apply(StartAsked(j.job_id), now)
                    out.append(StartJob(j, j.term or term))
        c.waiting += tuple(held)
        return n

    def resume(self, inp: JobInputs, j: PlanJob, term: int, now: float, out: list[Effect]) -> None:
        """``j`` is ``fetching`` (a :class:`FetchCheckpoint` was emitted): nothing while the driver has not decided;
        once it has (``inp.resumes[j.job_id]``: the checkpoint's path, "" for none), admitted again and started
        with it (no spawn token: it took one when its fetch began)."""
        path = inp.resumes.get(j.job_id)
        if path is None:
            return
        if self.admit(inp, j, now, out, term=term):
            self.core.table.apply(StartAsked(j.job_id), now)
            out.append(StartJob(j, j.term or term, resume_from=path))

    def admit(self, inp: JobInputs, j: PlanJob, now: float, out: list[Effect], *, term: int = 0) -> bool:
        """Whether ``j`` may start here now: the guard's admission of its kind and priority, the lease (fenced work),
        the operator's cordon, the circuit breaker and the GPU/resource conflicts, in that order; a refusal (final for
        that job id: the table's ``refused``) is a :class:`Refuse` in ``out``. ``j`` is recorded ``assigned`` (under
        ``term``) unless the table holds it."""
        c = self.core
        c.book.assigned(j, term, now)
        t = c.catalog.templates[j.template]
        reason = guard_refusal(inp, t.kind, c.catalog.priority_of(t.kind), j.job_id)
        ok = not reason
        if ok and inp.fenced_refused and t.fenced:
            ok, reason = False, inp.fenced_refused
        if ok and inp.cordoned:
            ok, reason = False, "node cordoned (by the operator, or an interruption notice): no new work"
        if ok and not c.breaker.allow(now):
            ok, reason = False, (f"circuit breaker open after {c.breaker.consecutive_failures} failed jobs; "
                                 f"next try in {max(0.0, (c.breaker.reopens_at() or 0) - now):.0f} s")
        if ok:
            conflict = self.conflict(inp, j)
            ok, reason = (False, conflict) if conflict else (True, "")
        if not ok:
            # A refusal is final: the leader re-places the work under a new id, so this id must never start here
            # later (it could otherwise run twice, e.g. a second training job of its config).
            r = c.table.apply(Refused(j.job_id, reason), now)
            if not (isinstance(r, TransitionError) and r.state == "refused"):  # each refusal reported once
                out.append(Refuse(j.job_id, j.template, reason[:MAX_REASON_CHARS]))
        return ok

    def holding(self, j: LocalJob, node_class: str) -> Holding:
        """What the running job ``j`` holds here (:meth:`need`, with the figures it was admitted with where its table
        record keeps them; only its GPUs when its template is unknown)."""
        r = j.holds
        if r is None:
            t = self.core.catalog.templates.get(j.template)
            r = t.resources if t is not None else None
        if r is None:
            return Holding(j.gpus, j.gpu_fraction, j.vram_gib)
        rec = self.core.table.get(j.job_id)
        planned = None if rec is None else planned_figures(rec.memory_gib, rec.vram_peak_gib)
        return self.need(j.template, r, node_class, j.gpus, j.gpu_fraction, j.vram_gib, planned)

    def need(self, template: str, r: ResourceRequest, node_class: str, gpus: Sequence[int] = (),
             gpu_fraction: float = 0.0, vram_gib: float = 0.0, planned: Figures | None = None) -> Holding:
        """What one instance of ``template`` (resources ``r``) on ``gpus`` holds on this node (class ``node_class``):
        :func:`p2pnode.scheduler.need_of` with the figures the leader's plan placed it by (``planned``,
        :func:`planned_figures`), else with this node's own prediction for it (the choice between declared and
        predicted figures, made there once)."""
        if planned is not None:
            return need_of(r, None, tuple(gpus), gpu_fraction, vram_gib, planned=planned)
        return need_of(r, self.core.predictor.predict(template, node_class), tuple(gpus), gpu_fraction, vram_gib)

    def conflict(self, inp: JobInputs, j: PlanJob, *, without: frozenset[str] = frozenset()) -> str:
        """Why the GPUs assigned to ``j`` or the resources its template asks for are not free here ('' when they
        are), by :func:`p2pnode.scheduler.node_misfit` (whose resource check, :func:`p2pnode.scheduler.misfit`, is
        the leader's placement's own) on this node's own view (none published yet: the GPUs named by ``j`` and the
        jobs here, their fractions counted, nothing else) against the jobs running here; those the driver marks
        ``stopping`` do not count (their grace overlaps the job that replaces them); ``without``: as if those had
        exited."""
        c = self.core
        me = next((m.view for m in inp.members if m.origin == c.node_id and m.view is not None), None)
        if me is None:  # not published yet: the GPUs the job and the jobs here name, fractions checked, VRAM not
            named = {*j.gpus, *(g for x in inp.running.values() for g in x.gpus)}
            me = NodeView(c.node_id, tuple(GpuView(i, MAX_VRAM_GIB) for i in sorted(named) if 0 <= i < 4096))
        view = me
        held = [self.holding(x, view.node_class) for k, x in inp.running.items()
                if k not in without and not x.stopping]
        t = c.catalog.templates.get(j.template)
        if t is None:
            want = Holding(tuple(j.gpus), j.gpu_fraction, j.vram_gib)
        else:
            want = self.need(t.name, t.resources, view.node_class, j.gpus, j.gpu_fraction, j.vram_gib,
                             planned_figures(j.memory_gib, j.vram_peak_gib))
        return node_misfit(view, held, want, full=inp.full_gpus, disk_room_gib=inp.disk_room_gib)

    def stop_wait(self, inp: JobInputs, j: PlanJob, stopping: frozenset[str]) -> str:
        """Why ``j`` must wait for the jobs ``stopping`` (ids this node is stopping, already or in this very step)
        to exit ('' when it need not): its GPUs or resources are held only by them (a preemption's victim in its
        grace). Such a start waits (listed in the core's ``waiting``) instead of being refused: the victim's exit
        is news, and the start follows."""
        if not self.conflict(inp, j) or self.conflict(inp, j, without=stopping):
            return ""
        return f"waiting to start: {', '.join(sorted(stopping)[:3])} being stopped here hold what it needs"

    def autonomous(self, inp: JobInputs, now: float, out: list[Effect]) -> None:
        """Without a leader: ``autonomous`` templates, each up to this node's share of its ``max_concurrency``
        (:func:`p2pnode.scheduler.leaderless_catalog`: by the live members known and the instances they report),
        chosen by the same weights on this node's own capacity, less
        the GPU a durable node keeps for its catalog's stable kinds (:func:`p2pnode.scheduler.reserve_for_stable`)
        while some member known is ephemeral, before any leader was seen and for ``STABLE_RESERVE_INTERVALS``
        intervals from the first leaderless step (its end is a deadline: :meth:`next_deadline`)."""
        c = self.core
        me = next((m for m in inp.members if m.origin == c.node_id), None)
        if me is None or me.view is None or (inp.offer <= 0 and inp.cpu_offer <= 0):
            c._acted, c._act_at, c.waiting = None, NEVER, ()
            return
        if c._reserve_until is None:
            c._reserve_until = now + STABLE_RESERVE_INTERVALS * c.interval_s
        reserving = now < c._reserve_until
        looked_at = ("autonomous", inp.offer, inp.cpu_offer, frozenset(inp.running), inp.level, inp.cordoned,
                     reserving)
        if looked_at == c._acted and now < c._act_at:
            return
        # Again at the latest in one interval: what else the round read (the node's view, the signals, the
        # guard's admission) may change with no news of its own; and when the reserve ends.
        c._acted = looked_at
        c._act_at = min(now + c.interval_s, c._reserve_until) if reserving else now + c.interval_s
        running = tuple(RunningJob(j.job_id, j.template, c.node_id, j.gpus, j.gpu_fraction, j.vram_gib)
                        for j in inp.running.values())
        # A durable node keeps free a GPU the largest training (a stable kind) it could take needs: the first
        # leader's plan places it here (p2pnode.scheduler._stable), for a bounded time. Whether the fleet has
        # ephemeral members (where the planner puts durable nodes first) is not known this early: a node that
        # starts with the fleet has heard of a few members at most (seed 003's H200 knew only the durable seed and
        # filled its GPU 0.6 s after its start), so the bound, not the members it knows, limits the cost.
        mine = reserve_for_stable(me.view, c.catalog, running) if reserving else me.view
        # max_concurrency is cluster-wide: this node's share of it, by the live members it knows and the instances
        # they report (p2pnode.scheduler._stable.leaderless_catalog).
        others = [m for m in inp.members if m.origin != c.node_id and m.live and m.view is not None]
        catalog = leaderless_catalog(c.catalog, me.view, (m.view for m in others if m.view is not None),
                                     (j.template for m in others for j in m.running or ()))
        # With this node's predictor: its plan chooses by the figures its admission checks (need_of, misfit).
        p = c.plan_fn(ClusterView({c.node_id: mine}, running, predictor=c.predictor), catalog, dict(inp.signals),
                      now, term=0, autonomous_only=True, seed=c.local_seq)
        jobs = []
        for x in p.assignments:
            c.local_seq += 1
            jobs.append(PlanJob(job_id=f"{c.node_id[:8]}-a{int(inp.wall)}-{c.local_seq}", node=c.node_id,
                                template=x.template, gpus=list(x.gpus), gpu_fraction=x.gpu_fraction,
                                vram_gib=x.vram_gib, params=dict(x.params), memory_gib=x.memory_gib,
                                vram_peak_gib=x.vram_peak_gib))
        self.start_all(inp, jobs, 0, now, out)
        if p.assignments:
            cpu = sum(1 for x in p.assignments if not x.gpus)
            c.offers.used(len(p.assignments) - cpu, cpu)
