"""Job control of one node: the driver of its :class:`p2pnode.node.JobCore` (every job decision is the core's).

The driver only moves bytes, waits and spawns: it hands the core what the node knows (the election view, the
members' job state, the jobs its runner runs, the guard's admission) whenever news arrives (a member's snapshot,
a fetched plan part or running list, a job that ended, a level change, an operator intent) or the core's
:meth:`~p2pnode.node.JobCore.next_deadline` passes, and carries out the effects the core returns: start or stop
a process (:class:`._runner.JobRunner`), record a refusal in the ``jobs`` section, fetch a document
(:class:`._fetch.PlanFetcher`), publish and serve a plan (:class:`._leading.LeaderRole`), quarantine a member whose
data broke a rule. The capacity offers are the core's, computed in its step from what this driver samples
(:class:`._capacity.NodeOffer`); the snapshot publishes them. No loop here runs on a fixed period; the
signals file is watched by its own stat timer.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import time
from collections import Counter, deque
from collections.abc import Set
from pathlib import Path
from typing import Any, Protocol

import msgspec
import psutil
import trio

from ..guardcore import Assessment, OperationPriority, Pressure
from ..node import (
    CancelFetch,
    Fetch,
    FetchCheckpoint,
    JobCore,
    MemberJobs,
    NodeContext,
    NodeCore,
    PublishPlan,
    Quarantine,
    Refuse,
    StartJob,
    StopJob,
)
from ..node._ckwarn import SignalJob
from ..node._jobs import HOLD_S
from ..node._lease import AckLog
from ..node._plans import host_of
from ..node._runs import ended_report
from ..node._table import Assigned, StopAsked
from ..node._table import StartAsked as TableStartAsked
from ..resources import FakeGpus, ResourceSample
from ..scheduler import CapacityController, Catalog, SchedulerConfig, node_class_of, plan
from ..scheduler._scaling import ProviderCall, ProviderList, ScalingCore
from ..snapshot import (
    ENGINE_NAMES,
    INLINE_RUNNING,
    EndedJob,
    JobReport,
    JobsSection,
    PlanJob,
    Refusal,
    UsageDoc,
    jobs_section,
    running_digest,
)
from ..statefiles import report_for
from ._capacity import NodeOffer
from ._catalogs import CatalogPush
from ._ckconfirm import ReplicaView
from ._ckresume import CheckpointResume
from ._controlfetch import ControlFetches
from ._controlinputs import ControlInputs
from ._controlscaling import ControlScaling
from ._controlusage import USAGE_KEPT, ControlUsage
from ._engines_probe import probe_engines
from ._fetch import PlanFetcher
from ._history import JobHistory
from ._leading import LeaderRole
from ._leasefile import LEASE_FILE, LeaseKeeper
from ._noticeprobe import NoticeProbe
from ._operator import OperatorControl
from ._records import JobRecords
from ._runner import SHUTDOWN_REASON, JobRunner, RunningProcess
from ._scaling import ScalingDriver, scaling_policy
from ._signals import SignalBook, newest_signals
from ._stops import StopDriver
from ._tablelog import TransitionLog

__all__ = ["USAGE_KEPT", "JobControl"]

log = logging.getLogger(__name__)
MAX_REASON_CHARS = 500
"""Run-history summaries kept by digest, encoded (see :attr:`JobControl.usage_by_digest`): a few KiB each for a
node with a few dozen templates; at most 8 x 8 MiB (:data:`p2pnode.scheduler.MAX_USAGE_BYTES`, what a reader
takes) however many."""
RUNNING_KEPT = 16
"""Running-job lists kept by digest, encoded (see :attr:`JobControl.running_by_digest`): the lists this node named
in its last 16 snapshots beyond :data:`p2pnode.snapshot.INLINE_RUNNING` jobs. A leader fetches the digest it saw
signed; a node whose jobs start and end faster than a digest spreads (one snapshot per
``gossip.min_publish_interval_s``, 0.5-2 s) still serves it for 16 publications. At most
:data:`RUNNING_KEPT_BYTES` in all."""
RUNNING_KEPT_BYTES = 32 * 2**20
"""The kept running lists together, at most (a list is ~150 bytes a job: 16 lists of 4,096 jobs stay below)."""


class Admission(Protocol):
    """The guard as job control uses it (:class:`p2pnode.drivers.GuardDriver`)."""

    def admits(self, kind: str, priority: OperationPriority | int) -> tuple[bool, str]:
        """Whether work of ``kind`` and ``priority`` may start now, and why not."""
        ...

    def reasons(self) -> tuple[str, ...]:
        """Why the node is at the degradation level in force, in words (a refusal's reason)."""
        ...

    def idle_gpus(self) -> int:
        """GPUs idle past the idle grace."""
        ...

    def gpus_full(self) -> tuple[int, ...]:
        """GPUs whose memory is at or above the GPU limit: no new work on them."""
        ...

    def cpu_percent(self) -> float | None:
        """CPU use as the guard assesses it (its window's mean), percent; None before the first sample."""
        ...

    @property
    def sample(self) -> ResourceSample | None:
        """The newest sample the guard assessed."""
        ...

    @property
    def assessment(self) -> Assessment | None:
        """The guard's newest assessment (CPU and memory over their windows)."""
        ...


class JobControl(ControlFetches, ControlInputs, ControlScaling, ControlUsage):
    """The job-control driver of node ``ctx`` (see module docstring); ``core`` gives the election view, ``guard``
    admission and idle GPUs (None: everything admitted, nothing idle), ``fake_gpus`` the simulated GPUs whose
    load follows the jobs (``--fake-gpus``)."""

    def __init__(self, ctx: NodeContext, core: NodeCore, catalog: Catalog, *, guard: Admission | None = None,
                 fake_gpus: FakeGpus | None = None) -> None:
        self.ctx = ctx
        self.node_core = core
        self.catalog = catalog
        self.guard = guard
        self.settings = s = ctx.config.scheduler
        self.limits = g = ctx.config.guard
        self.history = JobHistory(ctx.data_dir / "jobs.db")
        self.runner = JobRunner(node_id=ctx.node_id, data_dir=ctx.data_dir, history=self.history,
                                grace_s=s.stop_grace_s, log_max_bytes=s.log_max_bytes,
                                on_change=self._changed, on_exit=self._exited,
                                memory_limit_gib=g.memory_limit_gb, memory_check_interval_s=g.check_interval_s,
                                templates=catalog.templates, on_agent_stop=s.on_agent_stop,
                                gpu_uuids=self._gpu_uuids, node_class=self.node_class,
                                gpu_memory_used=self._gpu_memory_used, on_sample=self._sampled,
                                sync_root=(Path(ctx.config.sync.root).absolute() if ctx.config.sync.root
                                           else ctx.data_dir / "data"))
        self.lease = (LeaseKeeper(node_id=ctx.node_id, path=self.runner.jobs_dir / LEASE_FILE, lease_s=s.lease_s,
                                  stop_grace_s=s.stop_grace_s, min_voters=ctx.config.election.min_voters,
                                  voters=lambda: core.election.voters, now=ctx.now)
                      if s.lease_s > 0 and ctx.config.gossip.probes else None)
        # the node's lease on its fenced work (issue 42; None: none kept), renewed by the probe driver
        if self.lease is not None:
            self.runner.lease_file = self.lease.path
        self.ack_log: AckLog | None = None  # the direct acks this node gave (issue 42): the probe driver's
        self.stops = StopDriver(self.runner, self.apply, replicas=ReplicaView(ctx), notices=NoticeProbe(ctx))
        """The node's own stop rules (:class:`p2pnode.node._stoprules.StopRules`), fed from the runner's
        observations and the operator's intents, stepped beside the core; their stops go through :meth:`apply`."""
        self.core = JobCore(ctx.node_id, catalog, interval_s=s.interval_s, adopt_grace_s=s.adopt_grace_s,
                            orphan_grace_s=s.orphan_grace_s, lease_s=s.lease_s if ctx.config.gossip.probes else 0.0,
                            settle_s=2 * ctx.config.membership().gossip_interval_s,
                            dwell_s=g.dwell_s, spawns_per_minute=g.max_spawns_per_minute,
                            spawns_per_minute_per_gpu=g.spawns_per_minute_per_gpu,
                            spawns_per_minute_per_cpu=g.spawns_per_minute_per_cpu,
                            breaker_failures=g.breaker_failures, breaker_cooldown_s=g.breaker_cooldown_s,
                            ran={r["job_id"] for r in self.history.recent(1000)},  # ended or not: remembered
                            plan_fn=functools.partial(plan, config=SchedulerConfig(
                                gang_ports=s.gang_port_range(), gang_port_block=s.gang_port_block)),
                            pid=CapacityController.for_host(g, mem_total_bytes=psutil.virtual_memory().total))
        self.resume = CheckpointResume(node_id=ctx.node_id, data_dir=ctx.data_dir, news=self.news,
                                       observe=self.core.observe, now=ctx.now)  # issue 41: what a training resumes from
        self.core.fetch_checkpoints = True
        self.capacity = NodeOffer(ctx, g, idle_gpus=guard.idle_gpus if guard is not None else lambda: 0,
                                  fake_gpus=fake_gpus, cpu_percent=guard.cpu_percent if guard is not None else None)
        self.signals = SignalBook(catalog.configs, seen_clocks=self._seen_clocks, on_change=ctx.publish_soon,
                                  report=report_for(ctx.data_dir))
        self.placement_proofs: dict[str, bytes] = {}
        """Job id -> the sealed plan part that placed it here (:meth:`placement_proof`, issue 41)."""
        self.refused: deque[Refusal] = deque(maxlen=32)
        self.table_log = TransitionLog()
        """Writes a rate-limited warning for the job table's transition errors (:mod:`._tablelog`)."""
        self.ended: deque[EndedJob] = deque(maxlen=16)
        """Gang members that ended here lately, and whether with status 0 (the leader ends a failed gang)."""
        self.ended_by_kind: Counter[tuple[str, str]] = Counter()
        """Jobs that ended here on their own since start, ``(kind, outcome)`` -> count: ``completed`` (exit status
        0) or ``failed`` (any other status, or lost while the agent was down); stopped jobs are neither."""
        self.engines: tuple[str, ...] = ("process",)  # those this node runs (._engines_probe.probe_engines)
        self.fetcher = PlanFetcher(ctx, sign=getattr(ctx, "peer_read_headers", None))
        self.fetcher.on_fetched = self._fetched
        self.fetcher.on_failed = self._fetch_failed
        self.leading = LeaderRole(ctx, self.core, self.inputs, self.apply)
        self.operator = OperatorControl(  # (issue 39 H1: the plan it leads with, whose one-off placements it trusts)
            ctx, self.runner, self.running_of,
            lambda: self.node_core.acting_plan(self.core.my_plan) if self.node_core.is_leader() else None)
        self.records = JobRecords(self.runner, self.core, self.operator, ctx.now, self.ended)  # the table, kept
        self._wake = trio.Event()
        self._members: dict[str, tuple[Any, Any, float, MemberJobs]] = {}  # origin -> (snapshot, state, since, ...)
        self._signals_cache: tuple[tuple[int, ...], dict[str, Any]] | None = None
        self._pressure: tuple[Any, Pressure] = (None, Pressure())  # (the sample, its pressures at its arrival)
        self.catalogs: CatalogPush | None = None
        self._catalog_keys: set[tuple[str, str]] = set()
        self.usage = UsageDoc(node=ctx.node_id)
        """This node's run-history summary (:meth:`JobHistory.usage_doc`), served at ``GET /jobs/usage``;
        recomputed in a worker thread when a job ends (:meth:`_usage_loop`), not on every snapshot."""
        self.usage_digest = ""
        self.usage_by_digest: dict[str, bytes] = {}
        """The last :data:`USAGE_KEPT` summaries by digest, msgpack-encoded, newest last: a reader asks for the
        digest it saw in the signed snapshot, and a node whose jobs end faster than gossip and a fetch take still
        serves it."""
        self.running_by_digest: dict[str, bytes] = {}
        """The running lists this node named by digest in its last :data:`RUNNING_KEPT` snapshots, msgpack-encoded,
        newest last (:meth:`keep_running`): ``GET /jobs/running?digest=`` serves the one a reader saw signed."""
        self._usage_wanted = trio.Event()
        self._usage_wanted.set()
        self._class_of: tuple[tuple[str, ...], str] = ((), "")
        """Pushed catalogs (the agent sets it): fetched here from a member that advertises a newer version."""
        sc = ctx.config.scaling
        self.scaling_digest = sc.digest()
        if sc.classes:
            self.core.scaling = ScalingCore(scaling_policy(  # the ratio planned with: a class judged as it is used
                sc, vram_limit_ratio=self.limits.gpu_max_percent / 100.0))
        self.scaler = ScalingDriver(sc, self._load_provider, result=self.core.scaling_result,
                                    listed=self.core.scaling_listed, apply=self.apply, news=self.news)
        self.scaler.check()  # an unknown provider stops the agent at start, naming those installed

    def set_catalog(self, catalog: Catalog) -> None:
        """Run on ``catalog`` from now on (a pushed one adopted): templates for new starts, the core's planning,
        the signals' configs. Jobs that run go on; a template the new catalog lacks is no longer started."""
        self.catalog = catalog
        self.runner.templates = catalog.templates
        self.core.set_catalog(catalog)
        self.signals.known = set(catalog.configs)
        self.ctx.publish_soon()
        self.news()

    def node_class(self) -> str:
        """This node's class (:func:`p2pnode.scheduler.node_class_of` of the GPU names in its newest sample; ""
        before the first), cached per set of names."""
        s = self.ctx.last_sample
        if s is None:
            return ""
        names = tuple(g.name for g in s.gpus)
        if names != self._class_of[0] or not self._class_of[1]:
            self._class_of = (names, node_class_of(names))
        return self._class_of[1]

    def _gpu_memory_used(self) -> dict[int, int]:
        """The memory used on each GPU index in the node's newest sample, bytes (the runner's per-job VRAM)."""
        s = self.ctx.last_sample
        return {g.index: g.mem_used_bytes for g in s.gpus} if s is not None else {}

    def _gpu_uuids(self) -> dict[int, str]:
        """The NVML UUID of each GPU index in the node's newest resource sample (none before the first), by which
        the runner hands a job its GPUs."""
        s = self.ctx.last_sample
        return {g.index: g.uuid for g in s.gpus if g.uuid} if s is not None else {}

    # -- what the HTTP views and metrics read ----------------------------------------------------
    @property
    def breaker(self) -> Any:
        """The circuit breaker over failed jobs (:class:`p2pnode.guardcore.CircuitBreaker`)."""
        return self.core.breaker

    @property
    def spawn_limit(self) -> Any:
        """The spawn-rate limit (:class:`p2pnode.guardcore.SpawnRateLimiter`)."""
        return self.core.spawn_limit

    @property
    def ran(self) -> Set[str]:
        """Job ids this node already ran or refused (never started again by a stale plan)."""
        return self.core.ran

    def running_reports(self) -> list[JobReport]:
        """Every job running here (:meth:`p2pnode.node.LocalJob.report`), those fetching a checkpoint (issue 41) too."""
        return [j.report() for j in self.local_jobs().values()] + self.resume.reports(self.core.table, self.catalog)

    def section(self) -> JobsSection:
        """This node's ``jobs`` section (running jobs inline up to ``INLINE_RUNNING``, else by digest: kept, below)."""
        reports = self.running_reports()
        if len(reports) > INLINE_RUNNING:
            self.keep_running(reports)
        return jobs_section(reports, refused=list(self.refused)[-8:], offer=self.offer, term_seen=self.core.term_seen,
                            cpu_offer=self.cpu_offer, signals=dict(self.signals.entries),
                            catalog_digest=self.catalog.digest,
                            catalog_version=self.catalogs.book.version if self.catalogs is not None else 0,
                            waiting=self.core.waiting_gpu_jobs,
                            spawn_rate=round(self.core.spawn_limit.per_minute, 3), engines=list(self.engines),
                            ended=list(self.ended), usage_digest=self.usage_digest, node_class=self.node_class(),
                            **{k: v for k, v in self._own_acks().items() if k != "seen_at"})

    @property
    def offer(self) -> int:
        """GPU jobs this node asks for (the core's, :attr:`p2pnode.node.JobCore.offer`)."""
        return self.core.offer

    @property
    def cpu_offer(self) -> int:
        """CPU-only jobs this node asks for (the core's, :attr:`p2pnode.node.JobCore.cpu_offer`)."""
        return self.core.cpu_offer

    # -- signals ---------------------------------------------------------------------------------
    def _seen_clocks(self) -> list[tuple[str, int]]:
        return [(cfg, e.clock) for m in self.ctx.members() for cfg, e in m.snapshot.jobs.signals.items()]

    def newest_signals(self) -> dict[str, Any]:
        """Newest signal per config across every member's snapshot (Lamport order, see :mod:`._signals`); merged
        again only when a member's ``jobs`` section changed (a step costs nothing per member otherwise)."""
        members = self.ctx.members()
        key = tuple(id(m.snapshot.jobs) for m in members)
        if self._signals_cache is None or self._signals_cache[0] != key:
            self._signals_cache = (key, newest_signals((m.origin, m.snapshot.jobs) for m in members))
        return self._signals_cache[1]

    def accept_signals(self, raw: Any) -> list[Any]:
        """``POST /signals``: see :meth:`SignalBook.accept` (raises :class:`p2pnode.scheduler.SignalError`)."""
        accepted = self.signals.accept(raw)
        self.news()
        return accepted

    # -- news ------------------------------------------------------------------------------------
    def news(self) -> None:
        """Something the core reads may have changed (a member's snapshot, the election view, a sample, an
        operator intent): step the core now."""
        self._wake.set()

    def forget(self, origin: str) -> None:
        """``origin`` was reaped from the membership: drop what was fetched from it and cached for it."""
        self.core.forget(origin)
        for kind in ("part", "whole", "running", "usage"):
            self.fetcher.forget((kind, origin))
        self._members.pop(origin, None)

    def _changed(self) -> None:
        self.capacity.drive_fake_gpus(self.runner.jobs.values(), self.catalog.vram_floor_gib)
        self.ctx.publish_soon()  # (the offers follow at the step this news brings: the jobs running here changed)
        self.news()

    def _sampled(self, job: RunningProcess, sample: Any) -> None:
        """The runner measured ``job``'s memory: the memory rule checks it now (:meth:`StopDriver.sampled`)."""
        self.stops.sampled(job, sample)

    def _exited(self, job: RunningProcess, status: int | None) -> None:
        """A job ended: the core feeds its breaker (one that failed on its own is a failure; a stopped one is
        neither) and offers its GPUs at its next step (the newest sample still shows the job's load on them); the
        stop rules and the operator's stop intents forget it."""
        self.stops.ended((job.job_id,))
        self.core.job_exited(job.job_id, None if job.stopping is not None else status != 0, self.ctx.now(),
                             status=status if status is None or status >= 0 else None,
                             signal=-status if status is not None and status < 0 else None)  # -N: signal N
        self.operator.ended(job.job_id)  # (after the end is recorded: nothing of the ledger's can lose it)
        if job.stopping is None:
            self.ended_by_kind[(job.template.kind, "completed" if status == 0 else "failed")] += 1
        if job.gang is not None or job.job_id.startswith("run-"):  # issue 39: a one-off run's outcome too
            self.ended.append(ended_report(job.job_id, status, job.stopping, time.time(), rule=job.stop_rule or ""))
            self.ctx.publish_soon()
        self.records.flush()
        self._usage_wanted.set()  # its run is in the history now: summarised again
        self.news()

    # -- the core's inputs -----------------------------------------------------------------------
    # -- the step and its effects ----------------------------------------------------------------
    def step(self) -> None:
        """Step the stop rules, apply the operator's intents, step the core, and carry out their effects. While the
        agent leaves only the stop rules (a ``p2pnode jobs stop`` then is carried out still): nothing new starts."""
        section = self.operator.section
        self.stops.step(self.ctx.now(), draining=bool(section.drain_deadline), drain_deadline=self._drain_at(),
                        operator_stops=self.operator.stop_intents,
                        lease_expires_at=self.lease.expires_at() if self.lease is not None else math.inf)
        if self.ctx.leaving or self.stops.closing:  # (the agent stops: its held stops run out first)
            return
        self.operator.apply()
        core, errors = self.core, self.core.planning_errors
        before = (core.waiting_gpu_jobs, self.offer, self.cpu_offer, core.term_seen)
        self.apply(core.step(self.inputs(), self.ctx.now()))  # the offers computed inside (issue 39)
        self.table_log.check(core.table, self.ctx.now())  # transition errors: a rate-limited warning
        if (core.waiting_gpu_jobs, self.offer, self.cpu_offer, core.term_seen) != before:
            self.ctx.publish_soon()  # new offers; a spawn-rate limit holds work back; a new term (its leader waits)
        if self.core.planned_without:
            log.warning("planning term %s without %s after %.0f s", self.node_core.view.term,
                        self.core.planned_without, HOLD_S)
            self.core.planned_without = ""
        if self.core.planning_errors > errors:
            e = self.core.last_planning_error
            log.error("planning failed, no member to blame (skipped; a bug of ours): %s: %s",
                      e.__class__.__name__, e, exc_info=e if self.core.planning_errors == 1 else None)

    def apply(self, effects: list[Any]) -> None:
        """Carry out the effects of the core and of the stop rules, in order: the one executor of this node's jobs
        (the only caller of the runner's ``start`` and ``stop``: ``tests/test_executor_lint.py``)."""
        ctx = self.ctx
        for e in self.stops.gate(effects, ctx.now()):  # a stop that can wait: its checkpoint signal first
            if isinstance(e, StopJob):
                if self.core.table.state(e.job_id) in ("starting", "running"):  # a stop rule's: the table records it
                    self.core.observe(StopAsked(e.job_id, e.rule, e.reason), ctx.now())
                self.runner.stop(e.job_id, e.reason, e.rule)
            elif isinstance(e, SignalJob):  # a checkpoint signal before a held stop (issue 41 item 3)
                self.runner.signal_job(e.job_id, e.signal)
            elif isinstance(e, StartJob):
                t = self.catalog.templates[e.job.template]
                self.operator.started(e.job.job_id)
                try:
                    self.runner.start(**self._start_args(e.job, e.term, t), resume_from=e.resume_from)
                except (OSError, ValueError) as exc:
                    self._start_failed(e.job, t, exc)
            elif isinstance(e, Refuse):
                self.refused.append(Refusal(job_id=e.job_id, template=e.template, reason=e.reason, at=time.time()))
                log.warning("refusing job %s (%s): %s", e.job_id, e.template, e.reason)
                ctx.publish_soon()
            elif isinstance(e, Fetch):
                self._fetch(e)
            elif isinstance(e, (FetchCheckpoint, CancelFetch)):
                self.resume.apply(e, self.catalog.templates)
            elif isinstance(e, PublishPlan):
                self.leading.published(e.section)
            elif isinstance(e, Quarantine):
                ctx.quarantine(e.origin, e.where, e.error)
            elif isinstance(e, ProviderCall):
                self._spread_ledger()
                self.scaler.submit(e)
            elif isinstance(e, ProviderList):
                self.scaler.submit(e)
        self.records.flush()  # the table's transitions, and the stop intents carried out, kept in the ledger

    def admit(self, j: PlanJob) -> bool:
        """The core's admission of ``j`` here now (:meth:`p2pnode.node.JobCore.admit`); a refusal: ``jobs`` section."""
        out: list[Any] = []
        ok = self.core.admit(self.inputs(), j, self.ctx.now(), out)
        self.apply(out)
        return ok

    def start(self, j: PlanJob, term: int) -> None:
        """Start ``j`` under ``term`` (the :class:`p2pnode.node.StartJob` effect): a process that cannot start is
        a failure for the circuit breaker and a refusal in the ``jobs`` section."""
        now, t = self.ctx.now(), self.catalog.templates.get(j.template)
        if self.core.table.state(j.job_id) == "unknown":  # a start the driver makes itself: the table records it
            self.core.observe(Assigned(j.job_id, j.template, t.kind if t else "", tuple(j.gpus), j.gpu_fraction,
                                       j.vram_gib, term, j.gang, j.memory_gib, j.vram_peak_gib), now)
            self.core.observe(TableStartAsked(j.job_id), now)
        self.core.table.remember(j.job_id)  # (ran: never started again)
        self.apply([StartJob(j, term)])

    def _start_args(self, j: PlanJob, term: int, t: Any) -> dict[str, Any]:
        """The runner's start arguments for ``j`` (template ``t``) under ``term``."""
        return dict(job_id=j.job_id, template=t, params=dict(j.params), gpus=tuple(j.gpus),
                    gpu_fraction=j.gpu_fraction, vram_gib=j.vram_gib, term=term, catalog_dir=self.catalog.base_dir,
                    gang=j.gang, python=self.ctx.config.jobs.python_for(t.engine, sys.executable),
                    own_host=host_of(getattr(self.ctx, "addr", "") or ""))

    def _start_failed(self, j: PlanJob, t: Any, exc: Exception) -> None:
        """``j``'s process could not start: a failure for the circuit breaker and a refusal in the ``jobs`` section."""
        self.core.start_failed(self.ctx.now(), j.job_id, f"cannot start: {exc}")
        self.refused.append(Refusal(job_id=j.job_id, template=t.name, reason=f"cannot start: {exc}"[:MAX_REASON_CHARS],
                                    at=time.time()))
        log.error("cannot start %s: %s", j.job_id, exc)

    # -- driver ----------------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """The agent stops: this node's jobs are stopped (``scheduler.on_agent_stop = "stop"``: each asked through
        :meth:`apply`, rule ``agent_stop``, then waited for) or left running for re-adoption (:meth:`JobRunner.
        shutdown`); call before the final snapshot, which then reports what still runs."""
        if self.runner.on_agent_stop == "stop":
            self.apply([StopJob(k, SHUTDOWN_REASON, "agent_stop") for k, j in self.runner.jobs.items()
                        if j.stopping is None and not j.ended])
            await self.stops.hold_out(self.ctx.now)  # stops held for a checkpoint: each to its deadline at most
        await self.runner.shutdown()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The runner, the fetcher, the signals file's watch, and the core: stepped at each piece of news
        (:meth:`news`) and at its next deadline, never on a fixed period."""
        async with trio.open_nursery() as n:
            await n.start(self.runner.run)
            await n.start(self.resume.run)
            n.start_soon(self._probe_engines)
            for task in (self.fetcher.run, self.scaler.run, self._usage_loop,
                         functools.partial(self.stops.run_notices, self.news)):  # the interruption probe (issue 41)
                n.start_soon(task)
            n.start_soon(self.signals.watch, self.settings.signals_file, self.news)
            await n.start(self.drive)
            task_status.started()

    async def drive(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """:meth:`run`'s loop: :meth:`step` at each piece of news (:meth:`news`) and when the next deadline passes,
        the core's or the stop rules' (leaving: the stop rules' only; nothing new starts, the agent stops the jobs
        in :meth:`shutdown`). Forever (cancel it)."""
        task_status.started()
        while True:
            self._wake = trio.Event()
            self.step()
            core_at = math.inf if self.ctx.leaving or self.stops.closing else self.core.next_deadline()
            with trio.move_on_at(min(core_at, self.stops.next_deadline())):
                await self._wake.wait()

    def keep_running(self, reports: list[JobReport]) -> str:
        """Keep ``reports`` (this node's running list, as published) by its digest among the last
        :data:`RUNNING_KEPT` (and :data:`RUNNING_KEPT_BYTES`); returns the digest."""
        data = msgspec.msgpack.encode(reports)
        digest = running_digest(reports)
        kept = self.running_by_digest
        kept.pop(digest, None)
        kept[digest] = data
        total = sum(len(v) for v in kept.values())
        while len(kept) > 1 and (len(kept) > RUNNING_KEPT or total > RUNNING_KEPT_BYTES):
            total -= len(kept.pop(next(iter(kept))))
        return digest

    def running_msgpack(self, digest: str = "") -> bytes:
        """This node's running list, msgpack (``GET /jobs/running``): the one named by ``digest`` while it is among
        those kept (:meth:`keep_running`), else the current one (the reader checks it against the digest it asked
        for, and counts a mismatch ``stale``)."""
        kept = self.running_by_digest.get(digest) if digest else None
        return kept if kept is not None else msgspec.msgpack.encode(self.running_reports())

    async def _probe_engines(self) -> None:
        """Fingerprint the engines once at start, in a worker thread (importing torch takes seconds), then
        publish them (``jobs.engines`` in the snapshot)."""
        jobs = self.ctx.config.jobs
        found = await trio.to_thread.run_sync(
            functools.partial(probe_engines, {e: jobs.python_for(e, sys.executable) for e in ENGINE_NAMES}),
            abandon_on_cancel=True)
        self.engines = tuple(found)
        log.info("engines: %s", ", ".join(f"{e} ({why})" for e, why in found.items()))
        self.ctx.publish_soon()
        self.news()
