"""The job table of one node (issue 39): one record per job id with an explicit state, and ONE transition table.

Modelled on h11's ``_state.py``: every legal step of a job's life is a row of :data:`TRANSITIONS`,
``(state, event type) -> next state``; an event with no row from the record's current state is a
:class:`TransitionError` that the table counts (by ``(state, event)``) and keeps among its newest errors, and the
record is left unchanged: never a silent no-op, never an exception. Pure and sans-IO: ``now`` (monotonic seconds,
this run's clock) is passed in.

States, stop rules and outcomes are the vocabulary of :mod:`p2pnode.node._jobstate`; two more states hold no
record: :data:`UNKNOWN` (a job id the table never heard of, or forgot) and :data:`REMEMBERED` (an id known only
from an earlier run's history, from a start the driver made itself, or a finished record past the bound: it ran
here, so it is never started again, but whether it still runs is not known). Their rows in :data:`TRANSITIONS`
are the only rules for ids without a record. The life of a job::

    unknown --Assigned--> assigned --Waiting--> waiting --StartAsked--> starting --Started--> running
    assigned/waiting --FetchAsked--> fetching --FetchProgress--> fetching --StartAsked--> starting
                                   (its config's newest checkpoint fetched first, issue 41; the start resumes from it)
    fetching --Refused--> refused, fetching --Withdrawn--> unknown   (as from assigned: the fetch is abandoned)
    unknown/remembered --Adopted--> running        (a job found running: re-adopted after a restart)
    remembered --Exited--> ended                   (a job of an earlier run found ended: lost while the agent was down)
    assigned/waiting --Refused--> refused          (admission refused it: final for that id)
    assigned/waiting --Withdrawn--> unknown        (no longer asked for before it started: the record is dropped)
    unknown/remembered --RestoredRunning--> running     (an earlier run's record read back from the ledger:
    unknown/remembered --RestoredStopping--> stopping    its starting or running job, its stop under way with
    unknown/remembered --RestoredEnded--> ended          its rule, its end with its outcome, its refusal; the
    unknown/remembered --RestoredRefused--> refused      driver then reconciles it with re-adoption)
    starting --StartFailed--> ended (start_failed)
    starting/running --StopAsked--> stopping --Exited--> ended (stopped)
    starting/running --Exited--> ended (completed, failed or lost)

A ``fetching`` record, like an assigned or waiting one, is never written to the ledger: after a restart the plan
gives the job again and the fetch resumes from the blocks already verified on disk.

Bounded: live records (assigned to stopping) are as many as the node's work; finished records (ended, refused)
are kept for the newest ``max_history`` (:data:`MAX_HISTORY`, 4,096) ids; an older finished id, like an id known
only from history (:meth:`JobTable.remember`), is kept as an id alone (``remembered``) for the newest ``max_ids``
(:data:`MAX_IDS`, 65,536) such ids. A refused, ended or remembered id is final (an :class:`Assigned` for it is an
error) only while kept: a stale plan that still holds an id after 65,536 later ids finished or were remembered here
could start it again (plans name their jobs by term and sequence, so none lives that long).

Durable: a table whose driver calls :meth:`JobTable.track` notes every job id whose state changed
(:meth:`JobTable.take_changes`); the driver writes those ids' records (or their absence) to the job ledger after
each transition (:mod:`p2pnode.jobs._records`) and a restarted node reads them back as ``Restored*`` events.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Set
from typing import Final, TypeAlias, TypeVar

import msgspec

from ..snapshot import GangSlot
from ._jobstate import EndOutcome, JobState, StopRule

__all__ = ["FINAL_STATES", "LIVE_STATES", "MAX_ERRORS_KEPT", "MAX_HISTORY", "MAX_IDS", "RAN_STATES", "REMEMBERED",
           "TRANSITIONS", "UNKNOWN",
           "Adopted", "Assigned", "Event", "Exited", "FetchAsked", "FetchProgress", "JobRecord", "JobTable", "RanView",
           "Refused", "Restored",
           "RestoredEnded", "RestoredRefused", "RestoredRunning", "RestoredStopping", "StartAsked", "StartFailed",
           "Started", "StopAsked", "TransitionError", "Waiting", "Withdrawn", "outcome_of", "restored_event"]

MAX_HISTORY = 4096
"""Finished records kept (the oldest out first, then kept as an id alone: :data:`MAX_IDS`)."""
MAX_IDS = 16 * MAX_HISTORY
"""Ids kept without a record (``remembered``: from history, or finished records past :data:`MAX_HISTORY`), the
oldest out first: such an id stays final while kept."""
_S = TypeVar("_S")
MAX_ERRORS_KEPT = 32
"""The newest transition errors kept for display (all of them are counted)."""
MAX_REASON_CHARS = 500
UNKNOWN: Final = "unknown"
"""The state of a job id the table holds no record of (never seen, withdrawn, or forgotten past the bound)."""
REMEMBERED: Final = "remembered"
"""The state of a job id that ran here, known without a record (an earlier run's history, a start the driver made
itself, or a finished record past :data:`MAX_HISTORY`): never started again; adopted if found running."""
LIVE_STATES: frozenset[str] = frozenset({"assigned", "waiting", "fetching", "starting", "running", "stopping"})
FINAL_STATES: frozenset[str] = frozenset({"ended", "refused"})
RAN_STATES: frozenset[str] = frozenset({"starting", "running", "stopping", "ended", "refused", REMEMBERED})
"""States of a job id a stale plan must never start again (it was started or refused here)."""


# -- the record ---------------------------------------------------------------------------------------------------
class JobRecord(msgspec.Struct, frozen=True):
    """One job id's life on this node. ``rule`` and ``reason``: the stop rule and its words once stopping (the
    reason also holds a waiting, refusal or start-failure reason); ``outcome``, ``status`` (exit status) and
    ``signal`` once ended; ``assigned_at``, ``started_at``, ``ended_at``: monotonic seconds of this run's clock
    (None: not yet); ``started_wall``: the Unix seconds of its start as the executor reported them (None: not known;
    what this node's running list reports, :meth:`p2pnode.node.LocalJob.report`); ``adopted``: found running after
    an agent restart; ``memory_gib`` and ``vram_peak_gib``: the predicted figures its plan placed it by (None and
    0: none; :class:`p2pnode.snapshot.PlanJob`), what admission holds for it while it runs (not kept in the ledger:
    a record restored after a restart has none)."""

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
    started_wall: float | None = None
    memory_gib: float | None = None
    vram_peak_gib: float = 0.0
    fetch_bytes: int = 0
    """Bytes of its checkpoint fetched so far (``fetching``; kept once started: what the fetch brought)."""
    fetch_total_bytes: int = 0
    """Bytes of the checkpoint it fetches first (0: none fetched)."""


# -- events -------------------------------------------------------------------------------------------------------
class Assigned(msgspec.Struct, frozen=True):
    """A plan (or an autonomous choice) gave ``job_id`` to this node: its template, kind, GPUs and term, and the
    predicted figures the plan placed it by (:class:`p2pnode.snapshot.PlanJob` ``memory_gib``, ``vram_peak_gib``)."""

    job_id: str
    template: str = ""
    kind: str = ""
    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 1.0
    vram_gib: float = 0.0
    term: int = 0
    gang: GangSlot | None = None
    memory_gib: float | None = None
    vram_peak_gib: float = 0.0


class Waiting(msgspec.Struct, frozen=True):
    """Admission holds ``job_id`` back (the spawn-rate limit, or a victim still in its stop grace): ``reason``."""

    job_id: str
    reason: str = ""


class FetchAsked(msgspec.Struct, frozen=True):
    """The core fetches ``job_id``'s config's newest checkpoint (``total_bytes``, ``have_bytes`` of it already on
    disk) before starting it (issue 41): ``reason`` says which checkpoint."""

    job_id: str
    total_bytes: int = 0
    have_bytes: int = 0
    reason: str = ""


class FetchProgress(msgspec.Struct, frozen=True):
    """``done_bytes`` of ``job_id``'s checkpoint are on disk (of ``total_bytes``, 0: as its :class:`FetchAsked`
    said: the driver learns the size only once it chose the checkpoint)."""

    job_id: str
    done_bytes: int = 0
    total_bytes: int = 0


class StartAsked(msgspec.Struct, frozen=True):
    """The core asked the executor to start ``job_id`` (a :class:`p2pnode.node.StartJob`)."""

    job_id: str


class Started(msgspec.Struct, frozen=True):
    """The executor reports ``job_id``'s process (``pid`` when it knows it), started at ``started_wall`` (Unix
    seconds as it observed them; 0.0: not known)."""

    job_id: str
    pid: int | None = None
    started_wall: float = 0.0


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
    started_wall: float = 0.0
    """Unix seconds of its start as the executor observed it (0.0: not known)."""
    pid: int | None = None


class Withdrawn(msgspec.Struct, frozen=True):
    """``job_id`` is no longer asked of this node before it started (the plan dropped it): its record goes."""

    job_id: str


class Restored(msgspec.Struct, frozen=True):
    """An earlier run's ``record`` of ``job_id``, read back from the job ledger at start (its times already on this
    run's monotonic clock). One event type per state it is restored in (the table's rows name the type):
    :class:`RestoredRunning` (it was starting or running: the driver then re-adopts its process, or it ends
    ``lost``), :class:`RestoredStopping` (a stop rule had asked it to stop: the stop is carried out again with that
    rule), :class:`RestoredEnded`, :class:`RestoredRefused` (final: the history and the ``ran`` view)."""

    job_id: str
    record: JobRecord


class RestoredRunning(Restored, frozen=True):
    """See :class:`Restored`."""


class RestoredStopping(Restored, frozen=True):
    """See :class:`Restored`."""


class RestoredEnded(Restored, frozen=True):
    """See :class:`Restored`."""


class RestoredRefused(Restored, frozen=True):
    """See :class:`Restored`."""


_RESTORED: dict[str, type[Restored]] = {"starting": RestoredRunning, "running": RestoredRunning,
                                        "stopping": RestoredStopping, "ended": RestoredEnded,
                                        "refused": RestoredRefused}


def restored_event(r: JobRecord) -> Restored | None:
    """The event that restores an earlier run's record ``r``: None for an assigned or waiting one (never started:
    the plan gives it again and admission decides afresh)."""
    kind = _RESTORED.get(r.state)
    return kind(r.job_id, r) if kind is not None else None


Event: TypeAlias = (Assigned | Waiting | StartAsked | Started | StartFailed | StopAsked | Exited | Refused | Adopted
                    | Withdrawn | Restored | FetchAsked | FetchProgress)


TRANSITIONS: dict[tuple[str, type], str] = {
    (UNKNOWN, Assigned): "assigned",
    (UNKNOWN, Adopted): "running",
    (REMEMBERED, Adopted): "running",
    (REMEMBERED, Exited): "ended",
    ("assigned", Waiting): "waiting",
    ("assigned", StartAsked): "starting",
    ("assigned", Refused): "refused",
    ("assigned", Withdrawn): UNKNOWN,
    ("waiting", Waiting): "waiting",
    ("waiting", StartAsked): "starting",
    ("waiting", Refused): "refused",
    ("waiting", Withdrawn): UNKNOWN,
    ("assigned", FetchAsked): "fetching",
    ("waiting", FetchAsked): "fetching",
    ("fetching", FetchProgress): "fetching",
    ("fetching", StartAsked): "starting",
    ("fetching", Refused): "refused",
    ("fetching", Withdrawn): UNKNOWN,
    ("starting", Started): "running",
    ("starting", StartFailed): "ended",
    ("starting", StopAsked): "stopping",
    ("starting", Exited): "ended",
    ("running", StopAsked): "stopping",
    ("running", Exited): "ended",
    ("stopping", Exited): "ended",
    (UNKNOWN, RestoredRunning): "running",
    (REMEMBERED, RestoredRunning): "running",
    (UNKNOWN, RestoredStopping): "stopping",
    (REMEMBERED, RestoredStopping): "stopping",
    (UNKNOWN, RestoredEnded): "ended",
    (REMEMBERED, RestoredEnded): "ended",
    (UNKNOWN, RestoredRefused): "refused",
    (REMEMBERED, RestoredRefused): "refused",
}
"""The one transition table: ``(state, event type) -> next state`` (:data:`UNKNOWN`: the record is dropped). From
:data:`UNKNOWN` or :data:`REMEMBERED` (no record) an event's row makes a new record from the event."""


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
        return msgspec.structs.replace(new, pid=ev.pid, started_at=now, started_wall=ev.started_wall or None,
                                       reason="")
    if isinstance(ev, StartAsked):
        return msgspec.structs.replace(new, reason="")
    if isinstance(ev, FetchAsked):
        total = max(0, ev.total_bytes)
        return msgspec.structs.replace(new, reason=ev.reason[:MAX_REASON_CHARS], fetch_total_bytes=total,
                                       fetch_bytes=min(max(0, ev.have_bytes), total))
    if isinstance(ev, FetchProgress):
        total = max(0, ev.total_bytes) or r.fetch_total_bytes
        return msgspec.structs.replace(new, fetch_total_bytes=total,
                                       fetch_bytes=min(max(r.fetch_bytes, ev.done_bytes), total))
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


def _new_record(ev: Event, state: str, now: float) -> JobRecord:
    """A record made from ``ev`` for an id with none, moved to ``state`` (a row from unknown or remembered)."""
    if isinstance(ev, Restored):
        return msgspec.structs.replace(ev.record, job_id=ev.job_id, state=state)
    if isinstance(ev, Assigned):
        r = JobRecord(ev.job_id, "assigned", ev.template, ev.kind, tuple(ev.gpus), ev.gpu_fraction, ev.vram_gib,
                      ev.term, ev.gang, assigned_at=now, memory_gib=ev.memory_gib, vram_peak_gib=ev.vram_peak_gib)
    elif isinstance(ev, Adopted):
        r = JobRecord(ev.job_id, "running", ev.template, ev.kind, tuple(ev.gpus), ev.gpu_fraction, ev.vram_gib,
                      ev.term, ev.gang, pid=ev.pid, started_at=ev.started_at, adopted=ev.adopted,
                      started_wall=ev.started_wall or None)
    else:  # what it was before is not known: taken as running (an exit is then completed, failed or lost)
        return _next_record(JobRecord(ev.job_id, "running"), ev, state, now)
    return r if r.state == state else msgspec.structs.replace(r, state=state)


# -- the table ----------------------------------------------------------------------------------------------------
class JobTable:
    """Every job id this node knows, one :class:`JobRecord` each (see the module docstring).

    ``transitions``: the table to follow (:data:`TRANSITIONS`; a test passes a mutated copy); ``max_history``:
    finished records kept; ``max_ids``: ids kept without a record; ``history``: job ids an earlier run of this
    node ran (from its run history, whether ended or not: :data:`REMEMBERED`)."""

    def __init__(self, *, transitions: dict[tuple[str, type], str] | None = None, max_history: int = MAX_HISTORY,
                 max_ids: int = MAX_IDS, history: Iterable[str] = ()) -> None:
        self.transitions = TRANSITIONS if transitions is None else transitions
        self.max_history = max(1, max_history)
        self.max_ids = max(1, max_ids)
        self._live: dict[str, JobRecord] = {}
        self._done: dict[str, JobRecord] = {}  # finished records, oldest first
        self._ids: dict[str, None] = {}  # ids kept without a record (remembered), oldest first
        self.errors: Counter[tuple[str, str]] = Counter()
        """Transition errors counted by ``(state, event type name)``."""
        self.recent_errors: deque[TransitionError] = deque(maxlen=MAX_ERRORS_KEPT)
        self._changed: dict[str, None] | None = None  # ids whose state changed (None: not tracked)
        self.listener: Callable[[str, JobRecord, Event, float], None] | None = None
        """Told of every transition made: ``(state before, record after, event, now)`` (the goodput book,
        :mod:`p2pnode.node._goodput`; for a :class:`Withdrawn`, the record dropped)."""
        for job_id in history:
            self.remember(job_id)

    # -- reading -------------------------------------------------------------------------------
    def get(self, job_id: str) -> JobRecord | None:
        """The record of ``job_id`` (None: none, or an id kept alone: :data:`REMEMBERED`)."""
        r = self._live.get(job_id)
        return r if r is not None else self._done.get(job_id)

    def state(self, job_id: str) -> str:
        """The state of ``job_id``: a :data:`p2pnode.node._jobstate.JobState`, :data:`REMEMBERED` (an id kept
        without a record) or :data:`UNKNOWN`."""
        r = self._live.get(job_id)
        if r is None:
            r = self._done.get(job_id)
        if r is not None:
            return r.state
        return REMEMBERED if job_id in self._ids else UNKNOWN

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
        return list(itertools.islice(reversed(self._done.values()), max(0, n)))

    def __len__(self) -> int:
        return len(self._live) + len(self._done) + len(self._ids)

    def ids(self) -> list[str]:
        """Every job id the table knows: remembered ones, then finished records, oldest first; then live ones."""
        return [*self._ids, *self._done, *self._live]

    def next_deadline(self) -> float:
        """The table itself waits for nothing (the core's stop rules and admission have the deadlines, covered by
        ``tests/test_job_core.py``'s random deadline test): ``inf``."""
        return math.inf

    # -- durability ----------------------------------------------------------------------------
    def track(self) -> None:
        """From now on note every job id whose state changes (:meth:`take_changes`): the driver that persists the
        table calls it (the changes are kept until taken, so a table nobody persists does not track)."""
        if self._changed is None:
            self._changed = {}

    def take_changes(self) -> list[str]:
        """The job ids whose state changed since the last call, in the order they first changed (each id's record
        now: :meth:`get`, or :meth:`state` :data:`REMEMBERED` or :data:`UNKNOWN`: no record to keep); [] when not
        tracked."""
        if not self._changed:
            return []
        out, self._changed = list(self._changed), {}
        return out

    def _touch(self, job_id: str) -> None:
        if self._changed is not None:
            self._changed.pop(job_id, None)  # the newest change last: a remembered id's order is its last change's
            self._changed[job_id] = None

    # -- changing ------------------------------------------------------------------------------
    def remember(self, job_id: str) -> None:
        """``job_id`` ran here (an earlier run's history, or a start the driver made itself): :data:`REMEMBERED`
        (never started again; adopted when found running) unless the table holds a record of it; an assigned or
        waiting (or fetching) record is asked to start (:class:`StartAsked`, at its assignment's time)."""
        r = self._live.get(job_id)
        if r is not None and r.state in ("assigned", "waiting", "fetching"):
            self.apply(StartAsked(job_id), r.assigned_at or 0.0)
        elif r is None and job_id not in self._done:
            self._remember(job_id)

    def apply(self, ev: Event, now: float) -> JobRecord | TransitionError:
        """Apply ``ev`` at ``now``: the record after it (for a :class:`Withdrawn`, the record dropped), or a
        :class:`TransitionError` (counted in :attr:`errors`, kept in :attr:`recent_errors`) when the table has no
        transition for it from the job's state; then nothing changes."""
        job_id = ev.job_id
        state = self.state(job_id)
        nxt = self.transitions.get((state, type(ev)))
        if nxt is None:
            err = TransitionError(job_id, state, type(ev).__name__, now)
            self.errors[(state, err.event)] += 1
            self.recent_errors.append(err)
            return err
        old = self.get(job_id)
        self._touch(job_id)
        self._live.pop(job_id, None)
        self._done.pop(job_id, None)
        self._ids.pop(job_id, None)
        if nxt in (UNKNOWN, REMEMBERED):  # the record is dropped (remembered: kept as an id alone)
            if nxt == REMEMBERED:
                self._remember(job_id)
            gone = old if old is not None else JobRecord(job_id, "ended")
            if self.listener is not None:
                self.listener(state, gone, ev, now)
            return gone
        rec = _new_record(ev, nxt, now) if old is None else _next_record(old, ev, nxt, now)
        if self.listener is not None:
            self.listener(state, rec, ev, now)
        if nxt in FINAL_STATES:
            self._done[job_id] = rec
            while len(self._done) > self.max_history:  # the oldest finished record: kept as an id alone
                oldest = next(iter(self._done))
                del self._done[oldest]
                self._remember(oldest)
        else:
            self._live[job_id] = rec
        return rec

    def _remember(self, job_id: str) -> None:
        self._touch(job_id)
        self._ids.pop(job_id, None)
        self._ids[job_id] = None
        while len(self._ids) > self.max_ids:
            oldest = next(iter(self._ids))
            del self._ids[oldest]
            self._touch(oldest)


class RanView(Set[str]):
    """The job ids a stale plan must never start again (``JobCore.ran``), a read-only set (a
    :class:`collections.abc.Set`: ``in``, iteration, ``len``, comparisons and set operations) viewing ``table``
    (:meth:`JobTable.ran`); ``add`` remembers an id the driver started itself (:meth:`JobTable.remember`)."""

    def __init__(self, table: JobTable) -> None:
        self.table = table

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self.table.ran(job_id)

    def add(self, job_id: str) -> None:
        self.table.remember(job_id)

    def __iter__(self) -> Iterator[str]:
        return iter([j for j in self.table.ids() if self.table.ran(j)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"RanView({sorted(self)!r})"

    @classmethod
    def _from_iterable(cls, it: Iterable[_S]) -> frozenset[_S]:
        """Set operations (``|``, ``-``, ``&``, ``^``) make a plain frozenset, not a view."""
        return frozenset(it)
