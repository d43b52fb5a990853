"""The keeper of a node's job table (:class:`p2pnode.node._table.JobTable`), a part of
:class:`p2pnode.node.JobCore`: what the core emits (:class:`p2pnode.node.StartJob`, :class:`p2pnode.node.StopJob`,
:class:`p2pnode.node.Refuse`, the starts it holds back) and what the driver reports (exits, failed starts, the jobs
running here, the executor's own events) become table events; ended jobs feed the circuit breaker. It has no
deadline of its own (the stop rules have theirs). Sans-IO: ``now`` is passed in.

After an agent restart the driver hands it the earlier run's records read back from the job ledger
(:meth:`JobBook.restore`); a record restored ``stopping`` whose process the executor re-adopted, not stopping, is
asked to stop again with its rule and reason at the next step (:meth:`JobBook.resume_stops`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..guardcore import CircuitBreaker
from ..scheduler import Catalog
from ..snapshot import PlanJob
from ._goodput import GoodputBook, table_listener
from ._jobio import Effect, JobInputs, StopJob
from ._table import (
    REMEMBERED,
    UNKNOWN,
    Adopted,
    Assigned,
    Event,
    Exited,
    JobRecord,
    JobTable,
    Restored,
    StartAsked,
    Started,
    StartFailed,
    StopAsked,
    TransitionError,
    Waiting,
    Withdrawn,
)

__all__ = ["JobBook"]


class JobBook:
    """Keeps ``table`` (see the module docstring); ``breaker`` hears of jobs that ended on their own and of failed
    starts; ``catalog`` names a template's kind."""

    def __init__(self, table: JobTable, breaker: CircuitBreaker, catalog: Catalog) -> None:
        self.table = table
        self.breaker = breaker
        self.catalog = catalog
        self.resuming: dict[str, None] = {}
        """Job ids restored ``stopping`` whose stop is not carried out again yet (:meth:`resume_stops`)."""
        self.goodput = GoodputBook(accept=lambda c: any(t.config == c for t in self.catalog.templates.values()))
        """The goodput of this node's trainings per config (issue 41, :mod:`p2pnode.node._goodput`), fed by
        :attr:`table`'s transitions and by this node's checkpoints its members list (:meth:`observe_running`)."""
        table.listener = table_listener(self.goodput, self.training_config)

    def next_deadline(self) -> float:
        """The table's (none: ``inf``)."""
        return self.table.next_deadline()

    def job_exited(self, job_id: str, failed: bool | None, now: float, *, status: int | None = None,
                   signal: int | None = None) -> None:
        """A job of this node ended: ``failed`` True or False when it ended on its own (fed to the circuit
        breaker), None when it was stopped; its exit ``status`` or killing ``signal`` when known. (The drivers'
        entry point; :meth:`observe` with :class:`p2pnode.node._table.Exited` is the executor's.)"""
        if failed is not None:
            self.breaker.record(not failed, now)
        if status is None and failed is False:
            status = 0
        self.table.apply(Exited(job_id, status=status, signal=signal, stopped=failed is None,
                                failed=bool(failed)), now)

    def start_failed(self, now: float, job_id: str | None = None, error: str = "") -> None:
        """A :class:`StartJob` (of ``job_id`` when given) could not be carried out (the process did not start): a
        failure for the breaker. Without ``job_id`` the table learns it at the next step (a job asked to start
        that the executor does not report running)."""
        self.breaker.record(False, now)
        if job_id is not None:
            self.table.apply(StartFailed(job_id, error), now)

    def observe(self, ev: Event, now: float) -> JobRecord | TransitionError:
        """What the executor observed of a job (:mod:`p2pnode.node._table` events: :class:`Started` with its pid,
        :class:`StartFailed`, :class:`Exited` with its status or signal, :class:`StopAsked` for a stop it made on a
        rule of its own), at ``now`` (monotonic seconds). Applied to :attr:`table` (an event with no transition is
        counted there and returned as a :class:`TransitionError`); an end feeds the circuit breaker (a failure on
        its own, or a start failure; a stopped or lost job is neither)."""
        before = self.table.state(ev.job_id)
        r = self.table.apply(ev, now)
        if isinstance(r, TransitionError):
            return r
        if isinstance(ev, StartFailed):
            self.breaker.record(False, now)
        elif isinstance(ev, Exited):
            if r.outcome in ("completed", "failed") and before != "stopping":
                self.breaker.record(r.outcome == "completed", now)
        return r

    def stopping(self, inp: JobInputs) -> set[str]:
        """The jobs running here that are stopping: the table's (a stop this core asked for), and those the driver
        marks stopping (a stop the executor made on a rule of its own)."""
        return {k for k, j in inp.running.items() if j.stopping or self.table.state(k) == "stopping"}

    def observe_running(self, inp: JobInputs, now: float) -> None:
        """Bring :attr:`table` in line with the jobs the driver hands in: a job asked to start and now running is
        ``running``; one running that the table holds no record of (unknown, or remembered: an earlier run's, or a
        start the driver made itself) is adopted; a job asked to start that is not running failed to start (the
        driver reports a failure it saw with :meth:`start_failed`, its error text included); a running or stopping
        job that is gone exited (stopped, or lost)."""
        t = self.table
        self.goodput.checkpoints_seen(inp.own_checkpoints, now)
        for k, j in inp.running.items():
            s = t.state(k)
            if s == "starting":
                t.apply(Started(k, j.pid, j.started_wall), now)
            elif s in ("assigned", "waiting", "fetching"):  # started by the driver itself (an operator's run)
                t.apply(StartAsked(k), now)
                t.apply(Started(k, j.pid, j.started_wall), now)
            elif s in (UNKNOWN, REMEMBERED):
                t.apply(Adopted(k, j.template, j.kind, tuple(j.gpus), j.gpu_fraction, j.vram_gib, j.term, j.gang,
                                started_at=j.started_at, adopted=j.adopted, started_wall=j.started_wall,
                                pid=j.pid), now)
        for r in t.in_state("starting", "running", "stopping"):
            if r.job_id in inp.running:
                continue
            if r.state == "starting":
                t.apply(StartFailed(r.job_id, "the executor does not report it running by the next step (no "
                                              "start failure was reported)"), now)
            else:
                t.apply(Exited(r.job_id), now)

    def sync_waiting(self, waiting: Sequence[tuple[str, str, str]], now: float) -> None:
        """The table's waiting jobs are ``waiting``'s (``(job_id, template, reason)``, the core's ``waiting``):
        each with its reason; any other assigned or waiting job
        (no longer asked for, or held no more) is withdrawn."""
        t = self.table
        listed = set()
        for job_id, template, why in waiting:
            listed.add(job_id)
            if t.state(job_id) == UNKNOWN:
                t.apply(Assigned(job_id, template, self.kind(template)), now)
            r = t.get(job_id)
            if r is not None and (r.state == "assigned" or r.reason != why):
                t.apply(Waiting(job_id, why), now)
        for r in t.in_state("assigned", "waiting"):
            if r.job_id not in listed:
                t.apply(Withdrawn(r.job_id), now)

    def stop(self, e: StopJob, now: float, out: list[Effect]) -> None:
        """Emit ``e``, its job recorded ``stopping`` by ``e.rule`` in :attr:`table`."""
        self.table.apply(StopAsked(e.job_id, e.rule, e.reason), now)
        out.append(e)

    def training_config(self, template: str) -> str | None:
        """The config a template trains (a fenced template: ``training`` or ``exclusive``), None for other work."""
        t = self.catalog.templates.get(template)
        return t.config if t is not None and t.fenced and t.config else None

    def kind(self, template: str) -> str:
        t = self.catalog.templates.get(template)
        return t.kind if t is not None else ""

    def assigned(self, j: PlanJob, term: int, now: float) -> None:
        """``j`` is asked of this node: recorded ``assigned`` unless the table holds it."""
        if self.table.state(j.job_id) == UNKNOWN:
            self.table.apply(Assigned(j.job_id, j.template, self.kind(j.template), tuple(j.gpus), j.gpu_fraction,
                                      j.vram_gib, j.term or term, j.gang, j.memory_gib, j.vram_peak_gib), now)

    def restore(self, events: Sequence[Restored], now: float) -> list[JobRecord | TransitionError]:
        """Apply the earlier run's records (``Restored*`` events, oldest first) at ``now``: what each became (an
        event with no transition from the id's state, a record this run made already, say, is counted in the
        table and returned as a :class:`TransitionError`). Those restored ``stopping`` are resumed at the next
        step (:meth:`resume_stops`)."""
        out = []
        for ev in events:
            r = self.table.apply(ev, now)
            if not isinstance(r, TransitionError) and r.state == "stopping":
                self.resuming[r.job_id] = None
            out.append(r)
        return out

    def resume_stops(self, inp: JobInputs, now: float, out: list[Effect]) -> None:
        """The stops of records restored ``stopping`` (:meth:`restore`), carried out again with their rule and
        reason: a :class:`StopJob` in ``out`` for each such job the driver reports running and not stopping (its
        process re-adopted). One that is not running is left to :meth:`observe_running` (it ended: ``stopped``)."""
        for job_id in list(self.resuming):
            r = self.table.get(job_id)
            j = inp.running.get(job_id)
            if r is None or r.state != "stopping" or j is not None:
                del self.resuming[job_id]
            if r is not None and r.state == "stopping" and j is not None and not j.stopping:
                out.append(StopJob(job_id, r.reason, r.rule or "plan"))
