"""The leader's gang table (issue 39, item 5): one record per gang id with an explicit state, and ONE transition table.

Modelled on :mod:`p2pnode.node._table` (h11's ``_state.py``): every legal step of a gang's life is a row of
:data:`TRANSITIONS`, ``(gang state, event type) -> next state``, and every step of one of its members a row of
:data:`MEMBER_TRANSITIONS`; an event with no row (from the gang's state, or from the member's) is a
:class:`TransitionError` the table counts (by ``(state, event)``) and keeps among its newest errors, and nothing
changes. Pure and sans-IO: ``now`` (monotonic seconds, the leader's clock) is passed in. The life of a gang::

    unknown --Placed--> placing --MemberStarted--> starting --AllStarted--> running
    unknown --Adopted--> placing               (found running without a record: a plan without a gang table)
    placing/starting/running --RankZeroDone--> completing(deadline = now + grace) --GraceExpired--> ended(complete)
    placing/starting/running/completing --AllDone--> ended(complete)        (every member exited 0)
    placing/starting/running --MemberFailed--> ended(member_gone)   (exited otherwise, refused, or gone)
    placing/starting/running --MemberLost--> ended(member_down)     (its node declared dead)
    placing/starting/running/completing --Disagreed--> ended(disagree)  (members disagree on its size or ranks)
    placing/starting/running/completing --Stopped--> ended(stopped)     (the plan stopped it: preempted, ...)

An elastic gang (issue 41, item 4; ``min_size`` > 0: torchrun ``--nnodes MIN:MAX``) has ``size`` ranks, those given
no member ``vacant``; a member of it that fails or is lost, when it is not rank 0 (the rendezvous host) and at least
``min_size`` members are held without it, is :class:`ElasticMemberFailed` or :class:`ElasticMemberLost` (the table
applies it in place of the plain event, :func:`_elastic_loss`) and the gang keeps its state; else the gang ends as
above, the reason saying why. A rank without a member gets a new one from the plan (:class:`MemberJoined`,
``vacant | failed | lost -> assigned``; the gang keeps its state)::

    placing/starting/running --ElasticMemberFailed | ElasticMemberLost | MemberJoined--> (the same state)

A completing gang (rank 0 exited 0: the job is done) keeps its grace whatever its other members do; a member's own
step (``assigned -> running -> done | failed | lost``) is recorded in every gang state that has a row for its event.
:data:`AllStarted` and :data:`AllDone` are applied by the table itself after a member's step, when every member
runs (or is done), or is done.

The table decides; the planner feeds it (:func:`observe`: members' believed running and ended reports, refusals,
dead nodes; :meth:`GangTable.planned`: the plan's new gangs and its stops) and stops every running member of an
ended gang (:meth:`GangTable.ended_reasons`, :attr:`p2pnode.scheduler.ClusterView.gang_ends`). The table is
carried across a failover in the plan (:class:`p2pnode.snapshot.PlanGang`, :meth:`GangTable.to_plan`), and a new
leader seeds its table from its predecessor's plan (:meth:`GangTable.seed`), believing an entry only where it agrees
with that plan's assignments: nothing is derived from job ids (a gang's id is its rank-0 member's job id, by
definition, :class:`p2pnode.snapshot.GangSlot`; no other member's id is computed).

Bounded: at most ``max_gangs`` live records (:data:`MAX_GANGS`; a gang beyond them is refused and counted, then
found running without a record: adopted, and ended as any gang that lost a member) and the newest ``max_ended``
ended ones (:data:`MAX_ENDED`), at most :data:`MAX_RANKS` members each.
"""

from __future__ import annotations

import copy
import math
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Set
from typing import Final

import msgspec

from ..scheduler import Assignment, RunningJob
from ..snapshot import MAX_PLAN_GANGS, PlanGang, PlanGangMember, PlanSection
from ._gangevents import (
    _GONE,
    _MEMBER_EVENTS,
    GANG_CAUSES,
    GANG_STATES,
    MEMBER_STATES,
    Adopted,
    AllDone,
    AllStarted,
    Disagreed,
    ElasticMemberFailed,
    ElasticMemberLost,
    GangCause,
    GangEvent,
    GangMember,
    GangState,
    GraceExpired,
    MemberDone,
    MemberFailed,
    MemberJoined,
    MemberLost,
    MemberStarted,
    MemberState,
    Placed,
    RankZeroDone,
    Stopped,
)

__all__ = ["GANG_CAUSES", "GANG_STATES", "LIVE", "MAX_ENDED", "MAX_GANGS", "MAX_RANKS", "MEMBER_STATES",
           "MEMBER_TRANSITIONS", "TRANSITIONS", "UNKNOWN", "Adopted", "AllDone", "AllStarted", "Disagreed",
           "ElasticMemberFailed", "ElasticMemberLost", "GangCause", "GangEvent", "GangMember", "GangRecord",
           "GangState", "GangTable", "GraceExpired", "MemberDone", "MemberFailed", "MemberJoined", "MemberLost",
           "MemberStarted", "MemberState", "Placed", "RankZeroDone", "Stopped", "TransitionError", "observe",
           "placed_from"]

LIVE: frozenset[str] = frozenset({"placing", "starting", "running", "completing"})
UNKNOWN: Final = "unknown"
"""The state of a gang id the table holds no record of."""
MAX_GANGS = 3840
"""Live gang records at most (a live gang has at least two members: more than a fleet of 1,000 x 8 GPUs holds)."""
MAX_ENDED = 256
"""Ended gang records kept (the oldest out first): for the operator's view, and to stop members still reported."""
MAX_RANKS = 64
"""Members of one gang at most (:class:`p2pnode.snapshot.GangSlot` ``size``)."""
MAX_ERRORS_KEPT = 32
MAX_REASON_CHARS = 500


TRANSITIONS: dict[tuple[str, type], str] = {
    (UNKNOWN, Placed): "placing",
    (UNKNOWN, Adopted): "placing",
    ("placing", MemberStarted): "starting",
    ("starting", MemberStarted): "starting",
    ("running", MemberStarted): "running",  # (an elastic gang's member that joined)
    ("completing", MemberStarted): "completing",
    ("placing", AllStarted): "running",
    ("starting", AllStarted): "running",
    ("placing", MemberDone): "placing",
    ("starting", MemberDone): "starting",
    ("running", MemberDone): "running",
    ("completing", MemberDone): "completing",
    ("placing", RankZeroDone): "completing",
    ("starting", RankZeroDone): "completing",
    ("running", RankZeroDone): "completing",
    ("placing", AllDone): "ended",
    ("starting", AllDone): "ended",
    ("running", AllDone): "ended",
    ("completing", AllDone): "ended",
    ("placing", MemberFailed): "ended",
    ("starting", MemberFailed): "ended",
    ("running", MemberFailed): "ended",
    ("completing", MemberFailed): "completing",
    ("placing", MemberLost): "ended",
    ("starting", MemberLost): "ended",
    ("running", MemberLost): "ended",
    ("completing", MemberLost): "completing",
    ("placing", Disagreed): "ended",
    ("starting", Disagreed): "ended",
    ("running", Disagreed): "ended",
    ("completing", Disagreed): "ended",
    ("placing", Stopped): "ended",
    ("starting", Stopped): "ended",
    ("running", Stopped): "ended",
    ("completing", Stopped): "ended",
    ("completing", GraceExpired): "ended",
    # elastic gangs (issue 41, item 4): a member above the minimum, not rank 0, goes; a new one takes a free rank
    ("placing", ElasticMemberFailed): "placing",
    ("starting", ElasticMemberFailed): "starting",
    ("running", ElasticMemberFailed): "running",
    ("placing", ElasticMemberLost): "placing",
    ("starting", ElasticMemberLost): "starting",
    ("running", ElasticMemberLost): "running",
    ("placing", MemberJoined): "placing",
    ("starting", MemberJoined): "starting",
    ("running", MemberJoined): "running",
}
"""The one transition table of a gang: ``(state, event type) -> next state`` (see the module docstring)."""

MEMBER_TRANSITIONS: dict[tuple[str, type], str] = {
    ("assigned", MemberStarted): "running",
    ("assigned", MemberDone): "done",
    ("running", MemberDone): "done",
    ("assigned", RankZeroDone): "done",
    ("running", RankZeroDone): "done",
    ("assigned", MemberFailed): "failed",
    ("running", MemberFailed): "failed",
    ("assigned", MemberLost): "lost",
    ("running", MemberLost): "lost",
    ("assigned", ElasticMemberFailed): "failed",
    ("running", ElasticMemberFailed): "failed",
    ("assigned", ElasticMemberLost): "lost",
    ("running", ElasticMemberLost): "lost",
    ("vacant", MemberJoined): "assigned",
    ("failed", MemberJoined): "assigned",
    ("lost", MemberJoined): "assigned",
}
"""A member's steps: ``(member state, event type) -> next member state``."""

CAUSE_OF: dict[type, GangCause] = {AllDone: "complete", GraceExpired: "complete", MemberFailed: "member_gone",
                                   MemberLost: "member_down", Disagreed: "disagree", Stopped: "stopped"}
"""The cause a gang ended with, by the event that ended it."""


class GangRecord(msgspec.Struct, frozen=True):
    """One gang's life on the leader: ``state``, its ``members`` (rank order), the ``cause`` and ``reason`` once
    ended, the ``deadline`` of a completing gang's grace (monotonic s), ``since``: when it entered its state;
    ``adopted``: found running without a record; ``carried``: seeded from a predecessor's plan; ``min_size``: an
    elastic gang's fewest members (0: static, every member or none)."""

    gang_id: str
    template: str
    size: int
    members: tuple[GangMember, ...]
    state: GangState = "placing"
    cause: GangCause | None = None
    reason: str = ""
    deadline: float | None = None
    since: float = 0.0
    adopted: bool = False
    carried: bool = False
    min_size: int = 0

    def member(self, rank: int) -> GangMember | None:
        return self.members[rank] if 0 <= rank < len(self.members) else None

    @property
    def elastic(self) -> bool:
        return 0 < self.min_size < self.size

    def holds(self) -> int:
        """Members held: assigned, running or done (an elastic gang's ``vacant``, ``failed``, ``lost`` ranks not)."""
        return sum(m.state not in _GONE for m in self.members)


class TransitionError(msgspec.Struct, frozen=True):
    """``event`` (its type's name) has no transition from ``state`` (the gang's, or ``member <state>``) for gang
    ``gang_id``: nothing changed."""

    gang_id: str
    state: str
    event: str
    at: float = 0.0

    def __str__(self) -> str:
        return f"gang {self.gang_id}: no transition for {self.event} from {self.state}"


def _ranks_ok(size: int, members: tuple[GangMember, ...] | list[PlanGangMember]) -> bool:
    """Whether ``members`` are ranks 0..size-1 in order, at most :data:`MAX_RANKS`."""
    return 1 <= size <= MAX_RANKS and [m.rank for m in members] == list(range(size))


# -- the table ----------------------------------------------------------------------------------------------------
class GangTable:
    """Every gang the leader knows, one :class:`GangRecord` each (see the module docstring). ``grace_s``: a
    completing gang's grace (``SchedulerConfig.gang_complete_grace_s``); ``transitions``: the table to follow
    (:data:`TRANSITIONS`; a test passes a mutated copy)."""

    def __init__(self, *, grace_s: float = 30.0, max_gangs: int = MAX_GANGS, max_ended: int = MAX_ENDED,
                 transitions: dict[tuple[str, type], str] | None = None) -> None:
        self.grace_s = grace_s
        self.max_gangs = max(1, max_gangs)
        self.max_ended = max(1, max_ended)
        self.transitions = TRANSITIONS if transitions is None else transitions
        self._live: dict[str, GangRecord] = {}
        self._ended: dict[str, GangRecord] = {}  # oldest first
        self.errors: Counter[tuple[str, str]] = Counter()
        """Transition errors counted by ``(state, event type name)``."""
        self.recent_errors: deque[TransitionError] = deque(maxlen=MAX_ERRORS_KEPT)
        self.ends: Counter[str] = Counter()
        """Gangs this table ended, by cause (each once)."""
        self.refused: Counter[str] = Counter()
        """Gangs not recorded, by reason: ``full`` (past ``max_gangs``), ``bad_members`` (ranks not 0..size-1)."""
        self.rejected: Counter[str] = Counter()
        """A predecessor's plan entries ignored at :meth:`seed`, by reason (see there)."""
        self.seeded = 0
        self.forgotten = 0
        """Live records dropped at :meth:`seed` (a newer plan holds no member of their gang)."""

    # -- reading -------------------------------------------------------------------------------
    def get(self, gang_id: str) -> GangRecord | None:
        r = self._live.get(gang_id)
        return r if r is not None else self._ended.get(gang_id)

    def state(self, gang_id: str) -> str:
        """The gang's :data:`GangState`, or :data:`UNKNOWN`."""
        r = self.get(gang_id)
        return r.state if r is not None else UNKNOWN

    def live(self) -> Iterator[GangRecord]:
        """Live records (placing to completing), oldest first."""
        return iter(list(self._live.values()))

    def ended(self) -> Iterator[GangRecord]:
        """Ended records kept, newest first."""
        return iter(list(reversed(self._ended.values())))

    def __len__(self) -> int:
        return len(self._live) + len(self._ended)

    def ended_reasons(self) -> dict[str, str]:
        """``{gang id: reason}`` of every ended gang kept: the planner stops any member of them still running."""
        return {gid: r.reason for gid, r in self._ended.items()}

    def next_deadline(self) -> float:
        """The earliest completing gang's grace deadline (monotonic s); ``inf`` when none completes."""
        return min((r.deadline for r in self._live.values() if r.deadline is not None), default=math.inf)

    # -- changing ------------------------------------------------------------------------------
    def checkpoint(self) -> GangTable:
        """A copy of the table (its records are frozen: its dicts and counters copied) for :meth:`rollback`: the
        planner makes an attempt's changes all or nothing (a failed planning attempt changes no gang)."""
        cp = copy.copy(self)
        cp._live, cp._ended, cp.recent_errors = dict(self._live), dict(self._ended), self.recent_errors.copy()
        cp.errors, cp.ends = self.errors.copy(), self.ends.copy()
        cp.refused, cp.rejected = self.refused.copy(), self.rejected.copy()
        return cp

    def rollback(self, cp: GangTable) -> None:
        """Put back what :meth:`checkpoint` ``cp`` holds (``cp`` is used up): every change since is undone."""
        self.__dict__.update(cp.__dict__)

    def apply(self, ev: GangEvent, now: float) -> GangRecord | TransitionError:
        """Apply ``ev`` at ``now``: the record after it, or a :class:`TransitionError` (counted in :attr:`errors`,
        kept in :attr:`recent_errors`) when the table has no row for it from the gang's state or, for a member's
        event, from that member's state (or the rank is not the gang's); then nothing changes. After a member's
        step the table applies :class:`AllDone` or :class:`AllStarted` itself when they hold."""
        gid = ev.gang_id
        old = self.get(gid)
        state = old.state if old is not None else UNKNOWN
        if old is not None and type(ev) in (MemberFailed, MemberLost):
            ev = _elastic_loss(old, ev)  # type: ignore[arg-type]
        nxt = self.transitions.get((state, type(ev)))
        if isinstance(ev, Placed) and nxt is not None:
            if not _ranks_ok(ev.size, ev.members) or not 0 <= ev.min_size < max(2, ev.size):
                self.refused["bad_members"] += 1
                return self._error(gid, state, ev, now)
            if len(self._live) >= self.max_gangs:
                self.refused["full"] += 1
                return self._error(gid, state, ev, now)
            rec = GangRecord(gid, ev.template, ev.size, ev.members, nxt, since=now,  # type: ignore[arg-type]
                             adopted=isinstance(ev, Adopted), min_size=ev.min_size)
            self._live[gid] = rec
            return rec
        if nxt is None or old is None or (isinstance(ev, MemberJoined) and not old.elastic):
            return self._error(gid, state, ev, now)
        members = old.members
        if isinstance(ev, _MEMBER_EVENTS):
            m = old.member(ev.rank)
            mnext = MEMBER_TRANSITIONS.get((m.state, type(ev))) if m is not None else None
            if m is None or mnext is None:
                return self._error(gid, f"member {m.state if m is not None else 'unknown'}", ev, now)
            new = (GangMember(ev.rank, ev.job_id, ev.node, mnext) if isinstance(ev, MemberJoined)  # type: ignore[arg-type]
                   else msgspec.structs.replace(m, state=mnext))
            members = tuple(new if x.rank == ev.rank else x for x in members)
        rec = msgspec.structs.replace(old, members=members)
        if nxt != old.state:
            rec = msgspec.structs.replace(rec, state=nxt, since=now)
            if nxt == "completing":
                rec = msgspec.structs.replace(rec, deadline=now + self.grace_s,
                                              reason=f"gang {gid} completing: rank 0 ended with status 0")
        if nxt == "ended":
            cause = CAUSE_OF.get(type(ev), "stopped")
            rec = msgspec.structs.replace(rec, cause=cause, deadline=None,
                                          reason=_end_reason(gid, ev, self.grace_s)[:MAX_REASON_CHARS])
            self._end(rec)
            return rec
        self._live[gid] = rec
        if isinstance(ev, _MEMBER_EVENTS):
            return self._settle(rec, now)
        return rec

    def _settle(self, rec: GangRecord, now: float) -> GangRecord | TransitionError:
        """After a member's step: :class:`AllDone` when every member is done, else :class:`AllStarted` when every
        member runs or is done and the gang is not running yet."""
        states = {m.state for m in rec.members}
        if rec.elastic:  # (its ranks without a member are not waited for)
            states -= _GONE
        if states == {"done"}:
            return self.apply(AllDone(rec.gang_id), now)
        if rec.state in ("placing", "starting") and states and states <= {"running", "done"}:
            return self.apply(AllStarted(rec.gang_id), now)
        return rec

    def expire(self, now: float) -> list[GangRecord]:
        """Apply :class:`GraceExpired` to every completing gang whose grace passed at ``now``; the records ended."""
        out = []
        for r in list(self._live.values()):
            if r.deadline is not None and now >= r.deadline:
                got = self.apply(GraceExpired(r.gang_id), now)
                if isinstance(got, GangRecord):
                    out.append(got)
        return out

    def _error(self, gid: str, state: str, ev: GangEvent, now: float) -> TransitionError:
        err = TransitionError(gid, state, type(ev).__name__, now)
        self.errors[(state, err.event)] += 1
        self.recent_errors.append(err)
        return err

    def _end(self, rec: GangRecord) -> None:
        self._live.pop(rec.gang_id, None)
        self._ended.pop(rec.gang_id, None)
        self._ended[rec.gang_id] = rec
        if rec.cause is not None:
            self.ends[rec.cause] += 1
        while len(self._ended) > self.max_ended:
            del self._ended[next(iter(self._ended))]

    # -- the plan: what the leader decided, and carrying the table across a failover -----------------------------
    def planned(self, placed: Iterable[Placed], stops: Iterable[tuple[str, str]], now: float) -> None:
        """The plan just made: its new gangs (``placed``) are recorded, and each live gang a stop of the plan names
        (``(gang id, reason)``: a preemption, its template removed, a duplicate training) ends as ``stopped``."""
        for ev in placed:
            rec = self._live.get(ev.gang_id)
            if rec is None:
                self.apply(ev, now)
                continue
            for m in ev.members:  # new members of a live (elastic) gang: each joins it
                if m.state != "vacant":
                    self.apply(MemberJoined(ev.gang_id, m.rank, m.job_id, m.node), now)
        for gid, reason in stops:
            if gid in self._live:
                self.apply(Stopped(gid, reason), now)

    def to_plan(self, now: float) -> list[PlanGang]:
        """The table as the plan carries it (:class:`p2pnode.snapshot.PlanGang`): the live gangs, oldest first, then
        the ended ones kept, newest first, at most :data:`p2pnode.snapshot.MAX_PLAN_GANGS`."""
        out = []
        for r in [*self._live.values(), *reversed(self._ended.values())][:MAX_PLAN_GANGS]:
            left = max(0.0, min(1e6, r.deadline - now)) if r.deadline is not None else 0.0
            out.append(PlanGang(id=r.gang_id, template=r.template[:256], size=r.size, state=r.state,
                                cause=r.cause or "", reason=r.reason[:512], grace_left_s=round(left, 3),
                                min_size=r.min_size if r.elastic else 0,
                                members=[PlanGangMember(rank=m.rank, job_id=m.job_id, node=m.node, state=m.state)
                                         for m in r.members]))
        return out

    def seed(self, plan: PlanSection, now: float) -> None:
        """Take over the gang table of ``plan``, a predecessor's (or this leader's own, before a restart), whose
        digest its signed ref vouched for. Each entry is believed only where it agrees with the same plan's
        assignments; else it is ignored and counted in :attr:`rejected` by reason: ``unknown_state`` (a state or
        cause this agent does not know), ``bad_members`` (ranks not 0..size-1), ``ended_but_assigned`` (an ended
        gang whose members the plan still holds), ``not_assigned`` (a live gang the plan holds no member of),
        ``mismatch`` (a member the plan holds under another job id, node, rank or size, or that the entry says
        ended; a member the entry says runs that the plan does not hold; a failed or lost member of a gang not
        completing; completing without rank 0 done). So an entry can keep a gang whose members ended with status
        0 running, never stop a member the plan holds: one that ends a gang names no member the plan holds. A
        believed entry replaces this table's record of that gang; a completing gang's grace restarts at ``now``
        with what was left when the plan was made (at most the grace). A live record of this table whose gang the
        plan holds no member of is dropped (counted in :attr:`forgotten`): that plan is newer than this table (an
        earlier term of this leader), and a gang it does not hold has no member the planner believes."""
        held: dict[str, dict[int, tuple[str, str, int]]] = {}
        for a in plan.assignments:
            if a.gang is not None:
                held.setdefault(a.gang.id, {})[a.gang.rank] = (a.job_id, a.node, a.gang.size)
        for gid in [gid for gid in self._live if gid not in held]:
            del self._live[gid]
            self.forgotten += 1
        for g in plan.gangs:
            why = _seed_refusal(g, held.get(g.id, {}))
            if why is not None:
                self.rejected[why] += 1
                continue
            members = tuple(GangMember(m.rank, m.job_id, m.node, m.state) for m in g.members)  # type: ignore[arg-type]
            rec = GangRecord(g.id, g.template, g.size, members, g.state, since=now, carried=True,  # type: ignore[arg-type]
                             cause=g.cause or None, reason=g.reason, min_size=g.min_size,  # type: ignore[arg-type]
                             deadline=now + min(g.grace_left_s, self.grace_s) if g.state == "completing" else None)
            self._live.pop(g.id, None)
            if g.state == "ended":
                self._ended.pop(g.id, None)
                self._ended[g.id] = rec
                while len(self._ended) > self.max_ended:
                    del self._ended[next(iter(self._ended))]
            elif len(self._live) < self.max_gangs:
                self._live[g.id] = rec
            else:
                self.rejected["full"] += 1
                continue
            self.seeded += 1


def _seed_refusal(g: PlanGang, held: Mapping[int, tuple[str, str, int]]) -> str | None:
    """Why :meth:`GangTable.seed` ignores entry ``g`` of a plan whose assignments hold ``held`` (rank -> (job id,
    node, size)) of that gang; None: it is believed."""
    if g.state not in GANG_STATES or (g.cause and g.cause not in GANG_CAUSES) or (g.state == "ended") != bool(g.cause) \
            or any(m.state not in MEMBER_STATES for m in g.members):
        return "unknown_state"
    if not _ranks_ok(g.size, g.members) or g.min_size >= max(2, g.size):
        return "bad_members"
    if g.state == "ended":
        return "ended_but_assigned" if held else None
    if not held:
        return "not_assigned"
    for m in g.members:
        h = held.get(m.rank)
        if h is not None and (h != (m.job_id, m.node, g.size) or m.state not in ("assigned", "running")):
            return "mismatch"
        if h is None and m.state in ("assigned", "running"):
            return "mismatch"
        if m.state in _GONE and not (g.min_size and m.rank) and (m.state == "vacant" or g.state != "completing"):
            return "mismatch"  # (an elastic gang's ranks but rank 0 may hold no member)
    if g.state == "completing" and g.members[0].state != "done":
        return "mismatch"
    return None


def _elastic_loss(rec: GangRecord, ev: MemberFailed | MemberLost) -> GangEvent:
    """``ev`` as the table applies it to ``rec``: an elastic gang goes on without a member (the event becomes
    :class:`ElasticMemberFailed` or :class:`ElasticMemberLost`) when it is not rank 0, the rendezvous host, and at
    least ``min_size`` members are held without it; else ``ev`` ends the gang, its reason saying why."""
    m = rec.member(ev.rank)
    if not rec.elastic or m is None or m.state in _GONE:
        return ev
    left = rec.holds() - 1
    if ev.rank != 0 and left >= rec.min_size:
        return (ElasticMemberFailed if isinstance(ev, MemberFailed) else ElasticMemberLost)(ev.gang_id, ev.rank,
                                                                                            ev.reason)
    why = "rank 0 hosts the rendezvous" if ev.rank == 0 else f"{left} members left, below the minimum {rec.min_size}"
    return msgspec.structs.replace(ev, reason=f"{ev.reason} ({why})" if ev.reason else "")


def _end_reason(gid: str, ev: GangEvent, grace_s: float) -> str:
    """The words of gang ``gid``'s end on ``ev`` (each stop of a member carries them)."""
    if isinstance(ev, GraceExpired):
        return f"gang {gid} complete: rank 0 ended {grace_s:g} s ago"
    if isinstance(ev, AllDone):
        return f"gang {gid} complete: every member ended with status 0"
    if isinstance(ev, (MemberFailed, MemberLost, Disagreed, Stopped)) and ev.reason:
        return ev.reason
    return f"gang {gid} ended"


# -- what the planner observed ------------------------------------------------------------------------------------
def placed_from(assignments: Iterable[Assignment]) -> list[Placed]:
    """The :class:`Placed` events of a plan's new ``assignments`` (its gangs' members, grouped by gang id)."""
    gangs: dict[str, list[Assignment]] = {}
    for a in assignments:
        if a.gang is not None:
            gangs.setdefault(a.gang.id, []).append(a)
    out = []
    for gid, xs in gangs.items():
        xs.sort(key=lambda a: a.gang.rank if a.gang is not None else 0)
        size = max(a.gang.size for a in xs if a.gang is not None)
        low = max(a.gang.min_size for a in xs if a.gang is not None)
        members = tuple(GangMember(a.gang.rank, a.job_id, a.node_id) for a in xs if a.gang is not None)
        if low:  # an elastic gang: the ranks it was not given are vacant
            got = {m.rank: m for m in members}
            members = tuple(got.get(k, GangMember(k, state="vacant")) for k in range(size))
        out.append(Placed(gid, xs[0].template, size, members, min_size=low))
    return out


def observe(table: GangTable, running: Iterable[RunningJob], reported: Set[str], ended_ok: Set[str],
            failed: Set[str], down: Set[str], now: float) -> None:
    """Feed ``table`` what the leader believes at ``now`` (one plan's inputs), one event per change:

    ``running``: every job running or assigned and counted (members' believed reports, and the carried plan's
    assignments within the adoption grace), of which gang members count; ``reported``: the job ids members report
    running; ``ended_ok``: job ids reported ended with status 0; ``failed``: job ids reported ended otherwise, or
    refused; ``down``: nodes declared dead. A running gang the table holds no record of is :class:`Adopted`. Then,
    per live gang: members that disagree with the record (:class:`Disagreed`); members done (:class:`RankZeroDone`
    for rank 0, else :class:`MemberDone`); members on a dead node (:class:`MemberLost`); members reported failed,
    or neither running, assigned nor done (:class:`MemberFailed`); members newly reported running
    (:class:`MemberStarted`); last, completing gangs whose grace passed (:meth:`GangTable.expire`)."""
    by_gang: dict[str, list[RunningJob]] = {}
    for r in running:
        if r.gang is not None:
            by_gang.setdefault(r.gang.id, []).append(r)
    for gid, seen in by_gang.items():
        if table.state(gid) == UNKNOWN:
            size = max(r.gang.size for r in seen if r.gang is not None)
            low = max(r.gang.min_size for r in seen if r.gang is not None)
            ranks = {r.gang.rank: (r.job_id, r.node_id) for r in seen if r.gang is not None}
            members = tuple(GangMember(k, *ranks[k]) if k in ranks else  # (an elastic gang's other ranks: vacant)
                            GangMember(k, gid if k == 0 else "", "", "vacant" if low and k else "assigned")
                            for k in range(size))
            table.apply(Adopted(gid, seen[0].template, size, members, min_size=low), now)
    for rec in table.live():
        _observe_gang(table, rec, by_gang.get(rec.gang_id, []), reported, ended_ok, failed, down, now)
    table.expire(now)


def _observe_gang(table: GangTable, rec: GangRecord, seen: list[RunningJob], reported: Set[str],
                  ended_ok: Set[str], failed: Set[str], down: Set[str], now: float) -> None:
    """:func:`observe` for one live gang ``rec`` whose members ``seen`` run or are assigned."""
    gid = rec.gang_id
    ranks = [r.gang.rank if r.gang is not None else -1 for r in seen]
    if any(r.gang is None or r.gang.size != rec.size for r in seen) or len(set(ranks)) < len(ranks) or any(
            (m := rec.member(k)) is None or m.job_id != r.job_id for r, k in zip(seen, ranks, strict=True)):
        table.apply(Disagreed(gid, f"gang {gid} ended: its members disagree on its size or ranks; the gang is "
                                   "placed again"), now)
        return
    where = {r.job_id: r.node_id for r in seen}
    live = [m for m in rec.members if m.state in ("assigned", "running")]
    done = {m.rank for m in live if m.job_id and m.job_id in ended_ok}
    evs: list[GangEvent] = [RankZeroDone(gid) if m.rank == 0 else MemberDone(gid, m.rank)
                            for m in live if m.rank in done]
    for m in live:
        if m.rank in done:
            continue
        node = where.get(m.job_id) if m.job_id else None
        if node is not None and node in down:
            evs.append(MemberLost(gid, m.rank, f"gang {gid} ended: member rank {m.rank} on node {node} is down; the "
                                              "gang is placed again"))
        elif node is None or m.job_id in failed:
            evs.append(MemberFailed(gid, m.rank, f"gang {gid} ended: member rank {m.rank} ended, failed or was "
                                                 "refused; the gang is placed again"))
        elif m.state == "assigned" and m.job_id in reported:
            evs.append(MemberStarted(gid, m.rank))
    order: dict[type, int] = {RankZeroDone: 0, MemberDone: 0, MemberLost: 1, MemberFailed: 2, MemberStarted: 3}
    for ev in sorted(evs, key=lambda e: order[type(e)]):
        if table.state(gid) not in LIVE:
            return
        table.apply(ev, now)
