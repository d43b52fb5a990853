"""The events of the leader's gang table (:mod:`p2pnode.node._gangs`, where the transition table and the rules
are): what the planner observed of a gang and its members, as typed values. Pure data."""

from __future__ import annotations

from typing import Literal, TypeAlias, get_args

import msgspec

__all__ = ["GANG_CAUSES", "GANG_STATES", "MEMBER_STATES", "Adopted", "AllDone", "AllStarted", "Disagreed",
           "ElasticMemberFailed", "ElasticMemberLost", "GangCause", "GangEvent", "GangMember", "GangState",
           "GraceExpired", "MemberDone", "MemberFailed", "MemberJoined", "MemberLost", "MemberStarted",
           "MemberState", "Placed", "RankZeroDone", "Stopped"]

GangState: TypeAlias = Literal["placing", "starting", "running", "completing", "ended"]
MemberState: TypeAlias = Literal["assigned", "running", "done", "failed", "lost", "vacant"]
GangCause: TypeAlias = Literal["complete", "member_gone", "member_down", "disagree", "stopped"]
GANG_STATES: tuple[str, ...] = get_args(GangState)
MEMBER_STATES: tuple[str, ...] = get_args(MemberState)
GANG_CAUSES: tuple[str, ...] = get_args(GangCause)


# -- events -------------------------------------------------------------------------------------------------------
class GangMember(msgspec.Struct, frozen=True):
    """One rank of a gang: its ``job_id`` and ``node`` ("" when not known: a rank of a gang found running that no
    member reports) and its :data:`MemberState`."""

    rank: int
    job_id: str = ""
    node: str = ""
    state: MemberState = "assigned"


class Placed(msgspec.Struct, frozen=True):
    """The plan placed gang ``gang_id`` (of ``template``): every rank of ``size`` (``members``, rank order).
    ``min_size``: an elastic gang's fewest members (0: static), whose ranks not placed are ``vacant``."""

    gang_id: str
    template: str
    size: int
    members: tuple[GangMember, ...]
    min_size: int = 0


class Adopted(Placed, frozen=True):
    """Members of gang ``gang_id`` run (or are assigned in the carried plan) and the table holds no record of it: a
    predecessor's plan without a gang table, none at all, or a record past the bound. ``members``: every rank, those
    no member reports with ``job_id`` "" (rank 0's is the gang id)."""


class MemberStarted(msgspec.Struct, frozen=True):
    """A member reports rank ``rank`` running."""

    gang_id: str
    rank: int


class MemberDone(msgspec.Struct, frozen=True):
    """Rank ``rank`` (not 0: :class:`RankZeroDone`) exited with status 0."""

    gang_id: str
    rank: int


class RankZeroDone(msgspec.Struct, frozen=True):
    """Rank 0 exited with status 0: the gang's job is done (a Ray cluster's workers go with its driver)."""

    gang_id: str
    rank: int = 0


class MemberFailed(msgspec.Struct, frozen=True):
    """Rank ``rank`` exited otherwise, was killed, refused, or is gone (no longer reported, nor in the plan)."""

    gang_id: str
    rank: int
    reason: str = ""


class MemberLost(msgspec.Struct, frozen=True):
    """Rank ``rank``'s node is declared dead."""

    gang_id: str
    rank: int
    reason: str = ""


class ElasticMemberFailed(MemberFailed, frozen=True):
    """:class:`MemberFailed` of an elastic gang that goes on without it: not rank 0 (the rendezvous host), and at
    least ``min_size`` members left (applied by the table in place of :class:`MemberFailed`)."""


class ElasticMemberLost(MemberLost, frozen=True):
    """:class:`MemberLost` of an elastic gang that goes on without it (as :class:`ElasticMemberFailed`)."""


class MemberJoined(msgspec.Struct, frozen=True):
    """The plan gave rank ``rank`` of elastic gang ``gang_id``, vacant or whose member failed or was lost, to a new
    member: job ``job_id`` on ``node``, joining the gang's rendezvous."""

    gang_id: str
    rank: int
    job_id: str
    node: str


class AllStarted(msgspec.Struct, frozen=True):
    """Every member runs or is done (applied by the table itself)."""

    gang_id: str


class AllDone(msgspec.Struct, frozen=True):
    """Every member exited with status 0 (applied by the table itself)."""

    gang_id: str


class Disagreed(msgspec.Struct, frozen=True):
    """Members disagree on the gang (a size, a rank twice, another job id for a rank)."""

    gang_id: str
    reason: str = ""


class Stopped(msgspec.Struct, frozen=True):
    """The plan stopped the gang's members (a preemption, its template removed, a duplicate training): ``reason``."""

    gang_id: str
    reason: str = ""


class GraceExpired(msgspec.Struct, frozen=True):
    """A completing gang's grace passed (applied by :meth:`GangTable.expire`)."""

    gang_id: str


GangEvent: TypeAlias = (Placed | Adopted | MemberStarted | MemberDone | RankZeroDone | MemberFailed | MemberLost
                        | ElasticMemberFailed | ElasticMemberLost | MemberJoined | AllStarted | AllDone | Disagreed
                        | Stopped | GraceExpired)
_MEMBER_EVENTS = (MemberStarted, MemberDone, RankZeroDone, MemberFailed, MemberLost, MemberJoined)
_GONE: frozenset[str] = frozenset({"vacant", "failed", "lost"})
"""Member states of an elastic gang's ranks that hold no member (the rank can be given to a new one)."""
