"""The job table of one node (issue 39): one record per job id with an explicit state, and ONE transition table.

Modelled on h11's ``_state.py``: every legal step of a job's life is a row of :data:`TRANSITIONS`,
``(state, event type) -> next state``; an event with no row from the record's current state is a
:class:`TransitionError` that the table counts (by ``(state, event)``) and keeps among its newest errors, and the
record is left unchanged: never a silent no-op, never an exception. Pure and sans-IO: ``now`` (monotonic seconds,
this run's clock) is passed in.

States, stop rules and outcomes are the vocabulary of :mod:`p2pnode.node._jobstate`; :data:`UNKNOWN` names the
state of a job id the table holds no record of. The life of a job::

    unknown --Assigned--> assigned --Waiting--> waiting --StartAsked--> starting --Started--> running
    unknown --Adopted--> running                   (a job found running: re-adopted after a restart)
    assigned/waiting --Refused--> refused          (admission refused it: final for that id)
    assigned/waiting --Withdrawn--> unknown        (no longer asked for before it started: the record is dropped)
    starting --StartFailed--> ended (start_failed)
    starting/running --StopAsked--> stopping --Exited--> ended (stopped)
    starting/running --Exited--> ended (completed, failed or lost)

Bounded: live records (assigned to stopping) are as many as the node's work; finished ones (ended, refused) are
kept for the newest ``max_history`` ids, together with ids known only from an earlier run's history
(:meth:`JobTable.remember`). A refused or ended id stays final while remembered: an :class:`Assigned` for it is an
error.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import Final, TypeAlias

import msgspec

from ..snapshot import GangSlot
from ._jobstate import EndOutcome, JobState, StopRule

__all__ = ["FINAL_STATES", "LIVE_STATES", "MAX_ERRORS_KEPT", "MAX_HISTORY", "RAN_STATES", "TRANSITIONS", "UNKNOWN",
           "Adopted", "Assigned", "Event", "Exited", "JobRecord", "JobTable", "RanView", "Refused", "StartAsked",
           "StartFailed", "Started", "StopAsked", "TransitionError", "Waiting", "Withdrawn", "outcome_of"]

MAX_HISTORY = 4096
"""Finished records (and ids known from history) kept, newest first out last: a refused or ended id stays final
while it is among them."""
MAX_ERRORS_KEPT = 32
"""The newest transition errors kept for display (all of them are counted)."""
MAX_REASON_CHARS = 500
UNKNOWN: Final = "unknown"
"""The state of a job id the table holds no record of (never seen, withdrawn, or forgotten past the bound)."""
LIVE_STATES: frozenset[str] = frozenset({"assigned", "waiting", "starting", "running", "stopping"})
FINAL_STATES: frozenset[str] = frozenset({"ended", "refused"})
RAN_STATES: frozenset[str] = frozenset({"starting", "running", "stopping", "ended", "refused"})
"""States of a job id a stale plan must never start again (it was started or refused here)."""


# -- events -------------------------------------------------------------------------------------------------------
class Assigned(msgspec.Struct, frozen=True):
    """A plan (or an autonomous choice) gave ``job_id`` to this node: its template, kind, GPUs and term."""

    job_id: str
    template: str = ""
    kind: str = ""
    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 1.0
    vram_gib: float = 0.0
    term: int = 0
    gang: GangSlot | None = None


class Waiting(msgspec.Struct, frozen=True):
    """Admission holds ``job_id`` back (the spawn-rate limit, or a victim still in its stop grace): ``reason``."""

    job_id: str
    reason: str = ""


class StartAsked(msgspec.Struct, frozen=True):
    """The core asked the executor to start ``job_id`` (a :class:`p2pnode.node.StartJob`)."""

    job_id: str


class Started(msgspec.Struct, frozen=True):
    """The executor reports ``job_id``'s process (``pid`` when it knows it)."""

    job_id: str
    pid: int | None = None


class StartFailed(msgspec.Struct, frozen=True):
    """The executor could not start ``job_id``: ``error``."""

    job_id: str
    error: str = ""


class StopAsked(msgspec.Struct, frozen=True):
    """A stop rule asked ``job_id`` to stop (a :class:`p2pnode.node.StopJob`): the ``rule`` and its ``reason``."""

    job_id: str
    rule: StopRule
    reason: str = ""


class Exited(msgspec.Struct, frozen=True):
    """``job_id``'s process is gone: its exit ``status`` or the ``signal`` that killed it when known (both None:
    it vanished without one). ``stopped``: the executor stopped it on a rule of its own (not through the core);
    ``failed``: the executor says it failed though no status is known."""

    job_id: str
    status: int | None = None
    signal: int | None = None
    stopped: bool = False
    failed: bool = False


class Refused(msgspec.Struct, frozen=True):
    """Admission refused ``job_id`` (final for that id): ``reason``."""

    job_id: str
    reason: str = ""


class Adopted(msgspec.Struct, frozen=True):
    """A job found running that the table holds no record of (re-adopted after an agent restart, or started by the
    executor on its own): what it runs, since ``started_at`` (monotonic seconds, this run's clock)."""

    job_id: str
    template: str = ""
    kind: str = ""
    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 1.0
    vram_gib: float = 0.0
    term: int = 0
    gang: GangSlot | None = None
    started_at: float = 0.0
    adopted: bool = True


class Withdrawn(msgspec.Struct, frozen=True):
    """``job_id`` is no longer asked of this node before it started (the plan dropped it): its record goes."""

    job_id: str


Event: TypeAlias = (Assigned | Waiting | StartAsked | Started | StartFailed | StopAsked | Exited | Refused | Adopted
                    | Withdrawn)

TRANSITIONS: dict[tuple[str, type], str] = {
    (UNKNOWN, Assigned): "assigned",
    (UNKNOWN, Adopted): "running",
    ("assigned", Waiting): "waiting",
    ("assigned", StartAsked): "starting",
    ("assigned", Refused): "refused",
    ("assigned", Withdrawn): UNKNOWN,
    ("waiting", Waiting): "waiting",
    ("waiting", StartAsked): "starting",
    ("waiting", Refused): "refused",
    ("waiting", Withdrawn): UNKNOWN,
    ("starting", Started): "running",
    ("starting", StartFailed): "ended",
    ("starting", StopAsked): "stopping",
    ("starting", Exited): "ended",
    ("running", StopAsked): "stopping",
    ("running", Exited): "ended",
    ("stopping", Exited): "ended",
}
"""The one transition table: ``(state, event type) -> next state`` (:data:`UNKNOWN`: the record is dropped)."""


# -- records ------------------------------------------------------------------------------------------------------
class JobRecord(msgspec.Struct, frozen=True):
    """One job id's life on this node. ``rule`` and ``reason``: the stop rule and its words once stopping (the
    reason also holds a waiting, refusal or start-failure reason); ``outcome``, ``status`` (exit status) and
    ``signal`` once ended; ``assigned_at``, ``started_at``, ``ended_at``: monotonic seconds of this run's clock
    (None: not yet); ``adopted``: found running after an agent restart."""

    job_id: str
    state: JobState = "assigned"
    template: str = ""
    kind: str = ""
    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 1.0
    vram_gib: float = 0.0
    term: int = 0
    gang: GangSlot | None = None
    rule: StopRule | None = None
    reason: str = ""
    outcome: EndOutcome | None = None
    status: int | None = None
    signal: int | None = None
    pid: int | None = None
    assigned_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    adopted: bool = False


class TransitionError(msgspec.Struct, frozen=True):
    """``event`` (its type's name) has no transition from ``state`` for ``job_id``: nothing changed."""

    job_id: str
    state: str
    event: str
    at: float = 0.0

    def __str__(self) -> str:
        return f"job {self.job_id}: no transition for {self.event} from {self.state}"


def outcome_of(state: str, ev: Exited | StartFailed) -> EndOutcome:
    """How a job in ``state`` ended on ``ev``: ``start_failed``; ``stopped`` when a stop was asked (by the core,
    or by the executor on its own); ``completed`` on status 0; ``failed`` on another status, a signal or the
    executor's word; ``lost`` when it vanished without any."""
    if isinstance(ev, StartFailed):
        return "start_failed"
    if state == "stopping" or ev.stopped:
        return "stopped"
    if ev.failed or ev.signal is not None or (ev.status is not None and ev.status != 0):
        return "failed"
    return "completed" if ev.status == 0 else "lost"


def _next_record(r: JobRecord, ev: Event, state: str, now: float) -> JobRecord:
    """``r`` after ``ev`` moved it to ``state`` (a live or final state) at ``now``."""
    new = msgspec.structs.replace(r, state=state)
    if isinstance(ev, Waiting):
        return msgspec.structs.replace(new, reason=ev.reason[:MAX_REASON_CHARS])
    if isinstance(ev, Started):
        return msgspec.structs.replace(new, pid=ev.pid, started_at=now, reason="")
    if isinstance(ev, StartAsked):
        return msgspec.structs.replace(new, reason="")
    if isinstance(ev, StopAsked):
        return msgspec.structs.replace(new, rule=ev.rule, reason=ev.reason[:MAX_REASON_CHARS])
    if isinstance(ev, Refused):
        return msgspec.structs.replace(new, reason=ev.reason[:MAX_REASON_CHARS], ended_at=now)
    if isinstance(ev, StartFailed):
        return msgspec.structs.replace(new, reason=ev.error[:MAX_REASON_CHARS], outcome=outcome_of(r.state, ev),
                                       ended_at=now)
    if isinstance(ev, Exited):
        return msgspec.structs.replace(new, outcome=outcome_of(r.state, ev), status=ev.status, signal=ev.signal,
                                       ended_at=now)
    return new


def _new_record(ev: Assigned | Adopted, now: float) -> JobRecord:
    if isinstance(ev, Assigned):
        return JobRecord(ev.job_id, "assigned", ev.template, ev.kind, tuple(ev.gpus), ev.gpu_fraction, ev.vram_gib,
                         ev.term, ev.gang, assigned_at=now)
    return JobRecord(ev.job_id, "running", ev.template, ev.kind, tuple(ev.gpus), ev.gpu_fraction, ev.vram_gib,
                     ev.term, ev.gang, started_at=ev.started_at, adopted=ev.adopted)


# -- the table ----------------------------------------------------------------------------------------------------
class JobTable:
    """Every job id this node knows, one :class:`JobRecord` each (see the module docstring).

    ``transitions``: the table to follow (:data:`TRANSITIONS`; a test passes a mutated copy); ``max_history``:
    finished records and history ids kept; ``history``: job ids an earlier run of this node ran (from its run
    history: final, with no record)."""

    def __init__(self, *, transitions: dict[tuple[str, type], str] | None = None, max_history: int = MAX_HISTORY,
                 history: Iterable[str] = ()) -> None:
        self.transitions = TRANSITIONS if transitions is None else transitions
        self.max_history = max(1, max_history)
        self._live: dict[str, JobRecord] = {}
        self._done: dict[str, JobRecord | None] = {}  # finished records (None: an id from history), oldest first
        self.errors: Counter[tuple[str, str]] = Counter()
        """Transition errors counted by ``(state, event type name)``."""
        self.recent_errors: deque[TransitionError] = deque(maxlen=MAX_ERRORS_KEPT)
        for job_id in history:
            self.remember(job_id)

    # -- reading -------------------------------------------------------------------------------
    def get(self, job_id: str) -> JobRecord | None:
        """The record of ``job_id`` (None: none, or known only from history)."""
        r = self._live.get(job_id)
        return r if r is not None else self._done.get(job_id)

    def state(self, job_id: str) -> str:
        """The state of ``job_id``: a :data:`p2pnode.node._jobstate.JobState`, or :data:`UNKNOWN`; an id known only
        from history is ``ended``."""
        r = self._live.get(job_id)
        if r is not None:
            return r.state
        if job_id in self._done:
            d = self._done[job_id]
            return d.state if d is not None else "ended"
        return UNKNOWN

    def ran(self, job_id: str) -> bool:
        """Whether ``job_id`` was started or refused here (a stale plan must never start it again)."""
        return self.state(job_id) in RAN_STATES

    def live(self) -> Iterator[JobRecord]:
        """The records of jobs not finished (assigned to stopping), oldest first."""
        return iter(list(self._live.values()))

    def in_state(self, *states: str) -> list[JobRecord]:
        """The live records in one of ``states``."""
        return [r for r in self._live.values() if r.state in states]

    def history(self, n: int = 50) -> list[JobRecord]:
        """The newest ``n`` finished records (ended or refused), newest first."""
        out: list[JobRecord] = []
        for r in reversed(self._done.values()):
            if r is not None:
                out.append(r)
                if len(out) >= n:
                    break
        return out

    def __len__(self) -> int:
        return len(self._live) + len(self._done)

    def ids(self) -> list[str]:
        """Every job id the table knows (records and history ids): finished ones oldest first, then live ones."""
        return [*self._done, *self._live]

    def next_deadline(self) -> float:
        """The table itself waits for nothing (its rules have deadlines): ``inf``."""
        return math.inf

    # -- changing ------------------------------------------------------------------------------
    def remember(self, job_id: str) -> None:
        """``job_id`` ran here (an earlier run's history, or a start the driver made itself): final, with no
        record, unless the table holds one; an assigned or waiting record is asked to start (:class:`StartAsked`,
        at its assignment's time)."""
        r = self._live.get(job_id)
        if r is not None and r.state in ("assigned", "waiting"):
            self.apply(StartAsked(job_id), r.assigned_at or 0.0)
        elif r is None and job_id not in self._done:
            self._keep(job_id, None)

    def apply(self, ev: Event, now: float) -> JobRecord | TransitionError:
        """Apply ``ev`` at ``now``: the record after it (for a :class:`Withdrawn`, the record dropped), or a
        :class:`TransitionError` (counted in :attr:`errors`, kept in :attr:`recent_errors`) when the table has no
        transition for it from the job's state; then nothing changes."""
        job_id = ev.job_id
        state = self.state(job_id)  # (an id known from history only is ended: final)
        nxt = self.transitions.get((state, type(ev)))
        old = self.get(job_id)
        if nxt is None or (old is None and not isinstance(ev, (Assigned, Adopted))):
            err = TransitionError(job_id, state, type(ev).__name__, now)
            self.errors[(state, err.event)] += 1
            self.recent_errors.append(err)
            return err
        if old is None:
            assert isinstance(ev, (Assigned, Adopted))
            rec = _new_record(ev, now)
            rec = rec if rec.state == nxt else msgspec.structs.replace(rec, state=nxt)
        elif nxt == UNKNOWN:
            del self._live[job_id]
            return old
        else:
            rec = _next_record(old, ev, nxt, now)
        if nxt == UNKNOWN:
            return rec
        if nxt in FINAL_STATES:
            self._live.pop(job_id, None)
            self._keep(job_id, rec)
        else:
            self._done.pop(job_id, None)
            self._live[job_id] = rec
        return rec

    def _keep(self, job_id: str, rec: JobRecord | None) -> None:
        self._done.pop(job_id, None)
        self._done[job_id] = rec
        while len(self._done) > self.max_history:
            del self._done[next(iter(self._done))]


class RanView(set[str]):
    """The job ids a stale plan must never start again, as the set the drivers knew (``JobCore.ran``): a view of
    ``table`` (:meth:`JobTable.ran`); ``add`` remembers an id the driver started itself (:meth:`JobTable.remember`).
    Only ``in``, ``add``, iteration and ``len`` read the table."""

    def __init__(self, table: JobTable) -> None:
        super().__init__()
        self.table = table

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self.table.ran(job_id)

    def add(self, job_id: str) -> None:
        self.table.remember(job_id)

    def __iter__(self) -> Iterator[str]:
        return iter([j for j in self.table.ids() if self.table.ran(j)])

    def __len__(self) -> int:
        return sum(1 for _ in self)
