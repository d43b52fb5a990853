"""The typed snapshot: every field of a node's signed state, bounded, decoded at the wire by msgspec.

A snapshot body (msgpack) is decoded straight into :class:`Snapshot` by :func:`decode_snapshot`; a value of
the wrong type, a non-finite or out-of-range number, an over-long string or list is rejected there with
:class:`p2pnode.errors.RejectedMessage` (``bad_type``, or ``bad_schema`` for an unknown schema), so no code past
the decoder meets a wrong type, a NaN or an overflow. Unknown fields are dropped (a newer agent may add some).

Bounds (module constants):

* counters that only grow (version, incarnation, term, plan seq) are below :data:`COUNTER_MAX` = 2^53 - 1,
  far below the msgpack wire maximum (2^64): a value a peer can push us to can never overflow anything;
* byte counts are 0..2^62, percentages 0..1000 (finite), wall-clock seconds 0..1e11 (year ~5100), other
  numbers finite within +-1e15;
* node ids <= 64 chars, tags <= 128, paths <= 1024, other strings <= 256 (reasons <= 512); every list and map
  has a length cap (see each field);
* ``addr`` is a dialable ``host:port`` (:data:`ADDR_PATTERN`) or empty.

The snapshot is made of typed sections (:class:`Snapshot` lists them with their owners): each subsystem builds
its own section as a struct, the node core assembles them and encodes with :func:`encode_snapshot` (no dict walk),
and readers of a peer's snapshot get typed sections (:func:`section_of`). :func:`snapshot_dict` gives the
plain-builtins view for JSON output. Schema 2 (sections) replaced the flat schema 1 of 0.1; schema 3 moved the
plan out of the snapshot (:class:`PlanRef`) and bounded the running-job list (:class:`JobsSection`). A snapshot of
another schema is refused as ``bad_schema``.
"""

from __future__ import annotations

import functools
import operator
import re
import threading
import types
import typing
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, TypeVar, Union

import blake3
import msgspec
from msgspec import Meta, Struct

from .certs import RoleCert
from .errors import RejectedMessage, RejectReason
from .label import Label

T = TypeVar("T")

__all__ = [
    "COUNTER_MAX",
    "CheckpointRef",
    "MAX_CHECKPOINT_REFS",
    "ENGINE_NAMES",
    "EligibilityMark",
    "NodeClass",
    "SCALING_ACTIONS_MAX",
    "SCALING_FOR_TEMPLATES_MAX",
    "ScalingAction",
    "ScalingSection",
    "ScalingVerdict",
    "SketchWire",
    "UsageDoc",
    "UsageEntry",
    "EndedJob",
    "GangSlot",
    "MAX_PLAN_GANGS",
    "PlanGang",
    "PlanGangMember",
    "MARKS_MAX",
    "GpuInfo",
    "Resources",
    "JobsSection",
    "MembershipSection",
    "OperatorSection",
    "PlanRef",
    "RollSection",
    "RunRequest",
    "PlanSection",
    "SECTIONS",
    "SignalEntry",
    "Snapshot",
    "HeldPublication",
    "SyncSection",
    "convert_resources",
    "decode_snapshot",
    "encode_snapshot",
    "jobs_section",
    "plan_digest",
    "plan_ref",
    "running_digest",
    "usage_digest",
    "section_of",
    "snapshot_dict",
    "with_text_rule",
]

SCHEMA_VERSION = 3
COUNTER_MAX = 2**53 - 1
"""Upper bound of versions, incarnations, terms and plan sequence numbers accepted from the wire."""
MAX_PLAN_JOBS = 65536
"""Assignments (and stops) of one plan document, at most: 8,000 for 1,000 nodes x 8 GPUs, with room."""
MAX_PLAN_GANGS = 4096
"""Gang entries in a plan, at most (:class:`PlanGang`): the leader's live gangs and its newest ended ones."""
INLINE_RUNNING = 32
"""Running jobs a node lists in its snapshot's ``jobs`` section, at most; with more it publishes only their count
and digest (:class:`JobsSection`) and serves the list at ``GET /jobs/running``."""

Counter = Annotated[int, Meta(ge=0, le=COUNTER_MAX)]
ByteCount = Annotated[int, Meta(ge=0, le=2**62)]
Percent = Annotated[float, Meta(ge=0.0, le=1000.0)]
WallSeconds = Annotated[float, Meta(ge=0.0, le=1e11)]
Num = Annotated[float, Meta(ge=-1e15, le=1e15)]
SmallInt = Annotated[int, Meta(ge=-(2**31), le=2**31)]
GpuIndex = Annotated[int, Meta(ge=0, le=1023)]
_TEXT = r"^[^\x00-\x1f\x7f]*\Z"  # no control characters: each would cost 6 bytes in every JSON view
NodeId = Annotated[str, Meta(min_length=1, max_length=64, pattern=_TEXT)]
Tag = Annotated[str, Meta(max_length=128, pattern=_TEXT)]
Short = Annotated[str, Meta(max_length=64, pattern=_TEXT)]
Str = Annotated[str, Meta(max_length=256, pattern=_TEXT)]
GpuText = Annotated[str, Meta(max_length=96, pattern=_TEXT)]
Reason = Annotated[str, Meta(max_length=512, pattern=_TEXT)]
RuleName = Annotated[str, Meta(max_length=32, pattern=r"^[a-z_]*\Z")]
"""A stop rule's name (:data:`p2pnode.node._jobstate.StopRule`): bounded lowercase, not a closed set, so that a
rule a newer agent adds decodes here (its reader maps a name it does not know to a rule it knows)."""
PathStr = Annotated[str, Meta(max_length=1024, pattern=_TEXT)]
_CONTROL_BYTES = bytes(range(0x20)) + b"\x7f"
"""The characters :data:`_TEXT` refuses (the pattern matches a string exactly when it holds none of them)."""
_ONCE = "no control characters: checked once per snapshot by decode_snapshot"
# The types of a snapshot's header, resources, GPUs and jobs digests: those above without the pattern, whose rule
# decode_snapshot checks over all of them in one pass (_rules_ok) where msgspec would call the regex once per string
# (0.36 µs each, about 60 % of a 4-GPU snapshot's decode). Every other decoder of the classes holding them checks
# the rule as before (with_text_rule).
_NodeIdOnce = Annotated[str, Meta(min_length=1, max_length=64, description=_ONCE)]
_TagOnce = Annotated[str, Meta(max_length=128, description=_ONCE)]
_ShortOnce = Annotated[str, Meta(max_length=64, description=_ONCE)]
_ReasonOnce = Annotated[str, Meta(max_length=512, description=_ONCE)]
_PathOnce = Annotated[str, Meta(max_length=1024, description=_ONCE)]
_GpuTextOnce = Annotated[str, Meta(max_length=96, description=_ONCE)]
_WITH_RULE: dict[Any, Any] = {_NodeIdOnce: NodeId, _TagOnce: Tag, _ShortOnce: Short, _ReasonOnce: Reason,
                              _PathOnce: PathStr, _GpuTextOnce: GpuText}
"""Each type whose :data:`_TEXT` rule :func:`decode_snapshot` checks itself -> the same type with the rule."""
Root = Annotated[bytes, Meta(min_length=32, max_length=32)]
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
ADDR_PATTERN = rf"^(?:(?:\[[0-9A-Fa-f:.]{{2,45}}\]|{_LABEL}(?:\.{_LABEL})*):{_PORT})?\Z"
"""``addr``: empty, or ``host:port`` with an ASCII DNS name (labels of 1-63 characters), an IPv4 address or a
bracketed IPv6 address, and a port 1-65535. Peers dial it (``http://{addr}/gossip``): a label the IDNA codec
refuses, a path, a user or a query in it must never reach a URL."""
Addr = Annotated[str, Meta(max_length=256, pattern=ADDR_PATTERN)]
_AddrOnce = Annotated[str, Meta(max_length=256, description="host:port or empty: checked by decode_snapshot")]
_WITH_RULE[_AddrOnce] = Addr
_ADDR_SEARCH = re.compile(ADDR_PATTERN).search
HOST_PATTERN = rf"^(?:[0-9A-Fa-f:.]{{2,45}}|{_LABEL}(?:\.{_LABEL})*)\Z"
"""A host a command line may name: an IPv4 or unbracketed IPv6 address, or an ASCII DNS name (labels of 1-63
letters, digits, ``_`` and ``-``, never a leading ``-``): no space, option or shell character can reach argv."""
Host = Annotated[str, Meta(min_length=1, max_length=253, pattern=HOST_PATTERN)]
Port = Annotated[int, Meta(ge=1, le=65535)]
EngineName = Literal["process", "torchrun", "ray"]
ENGINE_NAMES: tuple[str, ...] = ("process", "torchrun", "ray")
"""The engines a template may name (:data:`p2pnode.scheduler.ENGINES`), the only values on the wire."""
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z"
"""A job id: 1-128 ASCII letters, digits and ``_.:-``, starting with a letter or digit. The forms in use are
``<term>-<seq>`` (a leader's placement, :class:`PlanJobId`), ``run-<request id>`` (an operator's one-off run) and
``<node>-a<seconds>-<seq>`` (autonomous work); any other id of this shape is carried, never parsed."""
JobId = Annotated[str, Meta(min_length=1, max_length=128, pattern=JOB_ID_PATTERN)]
ParamInt = Annotated[int, Meta(ge=-(2**53), le=2**53)]
"""An integer template parameter: within +-2^53, so it converts to a float and back exactly."""
ParamValue = Str | ParamInt | Num | bool
"""A template parameter's value, as every boundary accepts it (HTTP body, plan, operator file, snapshot)."""
ParamMap = Annotated[dict[Short, ParamValue], Meta(max_length=64)]
_PLAN_JOB_ID = re.compile(r"^(0|[1-9][0-9]{0,15})-(0|[1-9][0-9]{0,15})\Z")


class PlanJobId(NamedTuple):
    """A leader's job id ``<term>-<seq>`` parsed: the plan's ``term`` and the ``seq`` of the placement within it,
    each 0..:data:`COUNTER_MAX`."""

    term: int
    seq: int


def plan_job_id(job_id: str) -> PlanJobId | None:
    """The :class:`PlanJobId` of ``job_id``, or None when it is not of the form ``<term>-<seq>`` (ASCII digits,
    no leading zeros, each part at most :data:`COUNTER_MAX`). The one parser of job ids: the typed structs below
    call it once when they are decoded or built (``plan_id``), and no consumer parses an id again."""
    m = _PLAN_JOB_ID.match(job_id)
    if m is None:
        return None
    term, seq = int(m.group(1)), int(m.group(2))  # ASCII digits, at most 16: exact and bounded
    return PlanJobId(term, seq) if term <= COUNTER_MAX and seq <= COUNTER_MAX else None


_COST_TAG = re.compile(r"^cost_per_hour=([0-9]{1,9}(?:\.[0-9]{1,9})?)\Z")


def cost_per_hour(tags: list[str] | frozenset[str] | tuple[str, ...]) -> float:
    """A member's hourly cost from its ``cost_per_hour=N`` tag (ASCII digits, optionally a decimal point: 0 to
    999,999,999.999999999); 0.0 when there is no such tag or it is not of that form (``nan``, ``1e999``, ``٣``)."""
    for t in tags:
        m = _COST_TAG.match(t)
        if m is not None:
            return float(m.group(1))  # ASCII digits and a point: finite, exact enough
    return 0.0


class _WithJobId:
    """Mixin of the structs that carry a ``job_id``: :attr:`plan_id`, parsed once when the struct is built."""

    plan_id: ClassVar[PlanJobId | None] = None
    """The parsed ``<term>-<seq>`` form of ``job_id`` (None for any other form); set per instance on decode."""

    def __post_init__(self) -> None:
        pid = plan_job_id(self.job_id)  # type: ignore[attr-defined]
        if pid is not None:
            self.__dict__["plan_id"] = pid


class _S(Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=False):
    """Base: immutable; defaults are left out of :func:`snapshot_dict`, unknown fields ignored."""


class GpuInfo(_S, frozen=True):
    """One GPU: ``index`` 0..1023, model ``name``, memory in bytes, utilization in percent."""

    index: GpuIndex = 0
    name: _GpuTextOnce = ""
    uuid: _GpuTextOnce = ""
    util_percent: Percent = 0.0
    mem_used_bytes: ByteCount = 0
    mem_total_bytes: ByteCount = 0
    temperature_c: Annotated[float, Meta(ge=-300.0, le=1000.0)] | None = None
    power_w: Annotated[float, Meta(ge=0.0, le=1e6)] | None = None


class Resources(_S, frozen=True):
    """The resource sample (see :class:`p2pnode.resources.ResourceSample`). ``power_score`` is informative
    only: ranking recomputes a member's power from its ``gpus`` (:func:`p2pnode.resources.power_of_gpus`)."""

    cpu_percent: Percent = 0.0
    cpu_count: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    load_avg: Annotated[list[Num], Meta(max_length=3)] = []
    mem_total_bytes: ByteCount = 0
    mem_available_bytes: ByteCount = 0
    mem_used_bytes: ByteCount = 0
    mem_percent: Percent = 0.0
    disk_path: _PathOnce = ""
    disk_total_bytes: ByteCount = 0
    disk_used_bytes: ByteCount = 0
    disk_free_bytes: ByteCount = 0
    disk_percent: Percent = 0.0
    gpus: Annotated[list[GpuInfo], Meta(max_length=128)] = []
    gpu_source: _ShortOnce = ""
    gpu_absent_reason: _ReasonOnce | None = None
    power_score: Annotated[float, Meta(ge=0.0, le=1e9)] = 0.0
    vram_total_bytes: ByteCount = 0
    declared: Annotated[dict[_ShortOnce, Annotated[float, Meta(ge=0.0, le=1e12)]], Meta(max_length=32)] = {}
    """Resources the operator declared (``agent.resources``): custom ones, and ``cpus`` / ``memory_gib``
    overriding what the node gives to jobs (:mod:`p2pnode.resources._declared`)."""


class JobReport(_WithJobId, _S, frozen=True, dict=True):
    """A job running on the member (``gpus`` indexes, ``gpu_fraction`` of each, ``vram_gib``, plan ``term``)."""

    job_id: JobId
    template: Str
    config: Str = ""
    kind: Short = ""
    gpus: Annotated[list[GpuIndex], Meta(max_length=64)] = []
    gpu_fraction: Annotated[float, Meta(ge=0.0, le=64.0)] = 0.0
    vram_gib: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    started_at: WallSeconds = 0.0
    term: Counter = 0
    pid: Annotated[int, Meta(ge=0, le=2**31)] | None = None
    gang: GangSlot | None = None


class GangSlot(_S, frozen=True):
    """A gang member's place (issue 26), set by the plan: the gang ``id`` (its rank-0 member's job id), this
    member's ``rank`` of ``size``, the ``engine`` that runs it, the rendezvous ``master`` host and
    ``master_port`` (rank 0's address and the first port of its block), and this member's own block of
    ``ports`` ports from ``port_base`` (``scheduler.gang_ports``): every field that reaches a command line is
    bounded and typed here, the plan's decoder. ``min_size`` (issue 41, item 4): an elastic gang's fewest members
    (``1 <= min_size < size``; 0: a static gang of ``size``), ``size`` then its most and ``rank`` the member's slot;
    ``master`` hosts the c10d rendezvous."""

    id: JobId
    rank: Annotated[int, Meta(ge=0, le=63)]
    size: Annotated[int, Meta(ge=1, le=64)]
    master: Host
    master_port: Port
    port_base: Port
    ports: Annotated[int, Meta(ge=1, le=1024)] = 1
    engine: EngineName = "process"
    min_size: Annotated[int, Meta(ge=0, le=63)] = 0

    def __post_init__(self) -> None:
        if self.rank >= self.size:
            raise ValueError(f"rank {self.rank} of a gang of {self.size}")
        if self.min_size >= self.size:
            raise ValueError(f"an elastic gang's minimum {self.min_size} is not below its size {self.size}")
        if self.port_base + self.ports > 65536:
            raise ValueError(f"port block {self.port_base}+{self.ports} past 65535")


class EndedJob(_S, frozen=True):
    """A gang member or a one-off run (``run-<id>``) that ended here lately: ``ok`` when it exited 0 (a gang
    completing), else it failed, was killed or stopped; the leader ends the rest of a gang whose member did not end
    ``ok``. How it ended (issue 39, for the node that requested a one-off run): ``exit_code`` (0..255) when it
    exited, ``signal`` (1..64) when a signal killed it, ``rule`` and ``reason`` when a stop rule stopped it
    (:data:`p2pnode.node._jobstate.StopRule`), or only a ``reason`` when no status was recorded. Snapshots
    without them decode with the defaults (None, "")."""

    job_id: JobId
    ok: bool = False
    at: WallSeconds = 0.0
    exit_code: Annotated[int, Meta(ge=0, le=255)] | None = None
    signal: Annotated[int, Meta(ge=1, le=64)] | None = None
    rule: Annotated[str, Meta(max_length=32, pattern=r"^[a-z_]*\Z")] = ""
    reason: Annotated[str, Meta(max_length=256, pattern=_TEXT)] = ""


class Refusal(_S, frozen=True):
    """A job the member refused, and why."""

    job_id: JobId
    template: Str = ""
    reason: Reason = ""
    at: WallSeconds = 0.0


class PlanJob(_WithJobId, _S, frozen=True, dict=True):
    """One placement of a plan: run ``template`` with ``params`` on ``node`` (GPU indexes, fraction, VRAM).

    ``memory_gib`` and ``vram_peak_gib`` are the figures the leader placed it by where its history predicts the
    template on the node's class (issue 39, item 4; :func:`p2pnode.scheduler.figures_of`): the GiB of memory one
    instance holds (the predicted peak RSS p90 when above the declared ``memory_gib``, else the declared figure) and
    the predicted peak VRAM p90 per GPU (0: none predicted). A node admits the job by them
    (:meth:`p2pnode.node._admit.Admission.need`), so a node with no run history of its own judges it as the leader
    did. Absent (None and 0, also what a plan of an older leader decodes to): the leader had no history figure, and
    the node judges by its own predictor. Bounded 0..1e6 GiB (NaN, infinite or negative does not decode). Both are
    in the plan's digest (:func:`plan_digest`) and in a part's signature."""

    job_id: JobId
    node: NodeId
    template: Str = ""
    gpus: Annotated[list[GpuIndex], Meta(max_length=64)] = []
    gpu_fraction: Annotated[float, Meta(ge=0.0, le=64.0)] = 0.0
    vram_gib: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    params: ParamMap = {}
    term: Counter = 0
    assigned_at: WallSeconds = 0.0
    gang: GangSlot | None = None
    memory_gib: Annotated[float, Meta(ge=0.0, le=1e6)] | None = None
    vram_peak_gib: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0


class PlanStop(_S, frozen=True):
    """A stop the plan orders: ``job_id`` on ``node``, why in words (e.g. a preemption), and the stop ``rule`` a
    node records for it (:data:`p2pnode.node._jobstate.StopRule`): ``plan`` (a preemption, a duplicate training;
    also what a plan of an older leader, without the field, decodes to), ``gang_ended`` or ``template_removed``."""
    job_id: JobId
    node: NodeId = "-"
    reason: Reason = ""
    rule: RuleName = "plan"


class PlanPending(_S, frozen=True):
    """A template the plan could not place, why, and how long it has waited (seconds)."""
    template: Str
    reason: Reason = ""
    wait_s: Annotated[float, Meta(ge=0.0, le=1e11)] = 0.0
    of: Str = ""
    """The catalog template a one-off run waits for (``template`` is then its label, ``"<template> (run
    <id>)"``); "" when ``template`` is the catalog template itself."""


GangStateName = Annotated[str, Meta(max_length=16, pattern=r"^[a-z_]*\Z")]
"""A gang's or a gang member's state on the wire (:mod:`p2pnode.node._gangs`): bounded lowercase, not a closed set,
so that a state a newer leader adds decodes here (the reader ignores, and counts, an entry it does not know)."""


class PlanGangMember(_S, frozen=True):
    """One rank of a :class:`PlanGang`: its ``job_id`` and ``node`` (empty when the leader never knew them: a gang
    found running without an entry) and its ``state``: ``assigned``, ``running``, ``done`` (exited 0), ``failed``
    (exited otherwise, refused, or gone) or ``lost`` (its node declared dead)."""

    rank: Annotated[int, Meta(ge=0, le=63)]
    job_id: Annotated[str, Meta(max_length=128, pattern=r"^(?:[A-Za-z0-9][A-Za-z0-9_.:-]{0,127})?\Z")] = ""
    node: Annotated[str, Meta(max_length=64, pattern=_TEXT)] = ""
    state: GangStateName = "assigned"


class PlanGang(_S, frozen=True):
    """A gang's record in the leader's gang table (issue 39, item 5; :mod:`p2pnode.node._gangs`), carried in the
    plan so that a new leader knows which members already ended with status 0 without deriving it from job ids:
    the gang ``id`` (its rank-0 member's job id), ``template``, ``size``, ``state`` (``placing``, ``starting``,
    ``running``, ``completing``, ``ended``), the ``cause`` once ended (``complete``, ``member_gone``,
    ``member_down``, ``disagree``, ``stopped``) and the ``reason`` in words, the seconds left of a completing gang's
    grace when the plan was made (``grace_left_s``), and every rank (:class:`PlanGangMember`). A new leader checks
    each entry against the same plan's assignments before it believes it (:meth:`p2pnode.node._gangs.GangTable.
    seed`). ``min_size``: an elastic gang's fewest members (0: static; :class:`GangSlot`), whose ranks may also be
    ``vacant`` (no member placed), ``failed`` or ``lost`` while it runs."""

    id: JobId
    template: Str = ""
    size: Annotated[int, Meta(ge=1, le=64)] = 1
    state: GangStateName = "placing"
    cause: GangStateName = ""
    reason: Reason = ""
    grace_left_s: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    members: Annotated[list[PlanGangMember], Meta(max_length=64)] = []
    min_size: Annotated[int, Meta(ge=0, le=63)] = 0


class PlanSection(_S, frozen=True):
    """A plan document: the leader's desired state for ``term`` (the fencing token), sequence ``seq`` within the
    term, ``digest`` (hex BLAKE3 of the whole plan's encoded assignments and stops, :func:`plan_digest`), the
    ``assignments`` (every job the plan holds, carried-over ones included), the ``stops`` it orders and the
    templates left ``pending`` with their reason. ``at`` is the leader's wall-clock time, for display only.

    It is not gossiped: the leader's snapshot carries only its :class:`PlanRef`. The leader serves the whole plan
    (``node`` empty; ``GET /plan``, checked against the signed digest) and each node's part (``node`` set: that
    node's assignments and stops only, the whole plan's ``digest``; signed by the leader, see
    :mod:`p2pnode.node._plandist`)."""

    term: Counter
    seq: Counter = 0
    digest: Short = ""
    at: WallSeconds = 0.0
    assignments: Annotated[list[PlanJob], Meta(max_length=MAX_PLAN_JOBS)] = []
    stops: Annotated[list[PlanStop], Meta(max_length=MAX_PLAN_JOBS)] = []
    pending: Annotated[list[PlanPending], Meta(max_length=256)] = []
    node: Annotated[str, Meta(max_length=64, pattern=_TEXT)] = ""
    gangs: Annotated[list[PlanGang], Meta(max_length=MAX_PLAN_GANGS)] = []
    """The leader's gang table (:class:`PlanGang`; a plan of a leader that predates it decodes to none). In the
    whole plan only (not in a node's part); covered by ``digest`` when not empty (:func:`plan_digest`)."""


class PlanRef(_S, frozen=True):
    """The ``plan`` section of a leader's snapshot: which plan is current (``term``, ``seq``, ``digest`` of the
    :class:`PlanSection`) and its size (``jobs`` assignments, ``stops``, ``pending`` templates), never the plan
    itself: its size is the same for 10 or 10,000 assignments."""

    term: Counter
    seq: Counter = 0
    digest: Short = ""
    at: WallSeconds = 0.0
    jobs: Annotated[int, Meta(ge=0, le=MAX_PLAN_JOBS)] = 0
    stops: Annotated[int, Meta(ge=0, le=MAX_PLAN_JOBS)] = 0
    pending: Annotated[int, Meta(ge=0, le=256)] = 0


class GuardSummary(_S, frozen=True):
    """The ``guard`` section: degradation ``level`` 0-4 (after hysteresis), the ``raw_level`` of the newest
    assessment, its worst ``ratio`` of use to limit, the ``reasons`` (:mod:`p2pnode.guard`) and the GPUs that are
    full (``gpus_full``)."""

    level: Annotated[int, Meta(ge=0, le=4)] = 0
    raw_level: Annotated[int, Meta(ge=0, le=4)] = 0
    ratio: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    reasons: Annotated[list[Reason], Meta(max_length=16)] = []
    gpus_full: Annotated[list[GpuIndex], Meta(max_length=128)] = []
    """GPUs whose memory is over the GPU limit: the planner places nothing new on them."""


class EventEntry(_S, frozen=True):
    """A recent event of the member: ``seq``, ``name``, wall-clock ``at``, a small ``payload``."""

    name: Short
    seq: Counter = 0
    at: WallSeconds = 0.0
    payload: Annotated[
        dict[Short, Reason | int | Num | bool | None | Annotated[list[Reason], Meta(max_length=16)]],
        Meta(max_length=32),
    ] = {}


class VoteWire(_S, frozen=True):
    """The ``vote`` section: the candidate this node voted for in ``term`` (one vote per term)."""

    candidate: NodeId
    term: Counter


ROLL_MAX = 1024
"""Voters (and removed voters) a published roll lists, at most: the voter cap."""


MARKS_MAX = 64
"""Operator eligibility marks (cleared ones included) a roll holds, at most: well below the voter cap, so the
``roll`` section stays far from the snapshot bound (64 marks are about 6 KiB)."""


class EligibilityMark(_S, frozen=True):
    """One operator mark on who may lead (``p2pnode node eligible|ineligible|unmark``): ``node`` is marked
    ``state`` (``cleared``: the mark was taken back, the node's tags decide again) at ``stamp``, a hybrid logical
    clock in milliseconds (the marking node's wall clock, above every stamp it had seen). Marks converge as
    last-writer-wins registers per node (:meth:`p2pnode.election.VoterRoll.merge`)."""

    node: NodeId
    state: Literal["eligible", "ineligible", "cleared"]
    stamp: Counter


class RollSection(_S, frozen=True):
    """The ``roll`` section: the voter roll this node counts (:class:`p2pnode.election.VoterRoll`): sorted
    ``voters`` and ``removed`` node ids (at most :data:`ROLL_MAX` each), ``created_at`` (wall-clock seconds; None
    before the roll saw its first member) and ``closed`` (open mode: the bootstrap window is over, or the roll was
    adopted from peers). A node starting for the first time adopts the closed roll its operator-given peers
    publish (:meth:`p2pnode.node.NodeCore.seed_peers_answered`). ``marks``: the operator's marks on who may lead
    (:class:`EligibilityMark`, :func:`p2pnode.election.is_eligible`), sorted by node, at most :data:`MARKS_MAX`;
    every member merges the marks its voters publish. Also the format of ``voters.json``."""

    voters: Annotated[list[NodeId], Meta(max_length=ROLL_MAX)] = []
    removed: Annotated[list[NodeId], Meta(max_length=ROLL_MAX)] = []
    created_at: WallSeconds | None = None
    closed: bool = False
    marks: Annotated[list[EligibilityMark], Meta(max_length=MARKS_MAX)] = []


class MembershipSection(_S, frozen=True):
    """The ``membership`` section: this node's ``incarnation`` (SWIM refutation counter) and whom it suspects,
    ``{node_id: incarnation}`` (Lifeguard's confirmations)."""

    incarnation: Counter = 0
    suspects: Annotated[dict[NodeId, Counter], Meta(max_length=4096)] = {}


SignalValues = Annotated[dict[Short, Num], Meta(max_length=16)]


class SignalEntry(_S, frozen=True):
    """A signal this node accepted for one config: ``values`` (see :mod:`p2pnode.scheduler._signals`) stamped
    with a Lamport ``clock`` (one above the highest clock this node had seen for that config). The newest signal
    of a config cluster-wide is the one with the highest ``(clock, origin)``, never the newest wall-clock time."""

    clock: Counter
    values: SignalValues = {}


class JobsSection(_S, frozen=True):
    """The ``jobs`` section: the jobs ``running`` here, recent ``refused`` placements with their reason, the
    capacity ``offer`` (GPU jobs this node asks for, from its PID controller), the ``cpu_offer`` (CPU-only jobs,
    ``num_gpus = 0``, it asks for, from its free CPUs and memory: :func:`p2pnode.scheduler.cpu_offer`; absent in
    snapshots of older agents, which then get no CPU-only work), the GPU assignments it accepted and holds back
    for its spawn-rate limit (``waiting``) and that limit (``spawn_rate``, jobs a minute), the ``signals`` it
    accepted per config and the digest of its catalog (members with another catalog are reported, not trusted to
    agree).

    ``running_count`` and ``running_digest`` (:func:`running_digest`) always describe every running job; the list
    itself is inline only up to :data:`INLINE_RUNNING` jobs. Beyond that ``running`` is empty and the list is
    served by the node (``GET /jobs/running``), checked against this signed digest by whoever fetches it: the
    section stays bounded whatever the node runs."""

    running: Annotated[list[JobReport], Meta(max_length=INLINE_RUNNING)] = []
    refused: Annotated[list[Refusal], Meta(max_length=64)] = []
    offer: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    cpu_offer: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    waiting: Annotated[int, Meta(ge=0, le=MAX_PLAN_JOBS)] = 0
    spawn_rate: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    signals: Annotated[dict[Short, SignalEntry], Meta(max_length=256)] = {}
    catalog_digest: _ShortOnce = ""
    catalog_version: Counter = 0
    running_count: Annotated[int, Meta(ge=0, le=MAX_PLAN_JOBS)] = 0
    running_digest: _ShortOnce = ""
    engines: Annotated[list[EngineName], Meta(max_length=8)] = []
    ended: Annotated[list[EndedJob], Meta(max_length=16)] = []
    usage_digest: _ShortOnce = ""
    """:func:`usage_digest` of this node's run-history summary (:class:`UsageDoc`, served at ``GET /jobs/usage``,
    fetched on change by the leader, like a running list); "": no finished run yet."""
    node_class: _ShortOnce = ""
    """This node's class for capacity planning (:func:`p2pnode.scheduler.node_class_of`: GPU count and model,
    ``"2xH100"``, or ``"cpu"``)."""
    acks: Annotated[dict[_NodeIdOnce, Annotated[int, Meta(ge=0, le=2**53)]], Meta(max_length=64)] = {}
    """The direct acks this node gave (issue 42's lease): member -> age in ms of the newest, when this snapshot was
    built (:class:`p2pnode.node._lease.AckLog`, at most ``MAX_ACK_REPORTS``); the leader's bound on a silent
    holder's last sign of life (:func:`p2pnode.node._lease.last_sign`)."""
    acks_horizon_ms: Annotated[int, Meta(ge=0, le=2**53)] = 0
    """Every ack this node gave within this age (ms) is in ``acks``."""
    term_seen: Counter = 0
    """The highest election term this node's job control had acted with when the snapshot was built: from then on
    it starts nothing of an older term's plan (:func:`p2pnode.node._plans.acting_plan`), and every job it started
    from one is in ``running``. A leader of term T counts a member's running list as complete only when this is
    at least T (:attr:`p2pnode.node._plans.MemberPlanInput.behind`); 0: no term seen yet, or an older agent."""
    notice_deadline_ms: Annotated[int, Meta(ge=0, le=2**53)] | None = None
    """This node's interruption notice (issue 41, :mod:`p2pnode.node._notice`): when the platform takes it back
    (Unix ms, the node's clock). The leader places no new work on it and re-places its training once the training
    stopped there. None (absent, as in snapshots of older agents): no notice."""
    notice_reason: Annotated[str, Meta(max_length=64, pattern=r"^[A-Za-z0-9 _.:/\-]*\Z")] = ""
    """Why, as the node's probe said (``spot``, ``preempted``)."""

    @property
    def running_inline(self) -> bool:
        """Whether ``running`` lists every running job (else fetch the list by its digest)."""
        return len(self.running) == self.running_count


Receipt = tuple[PathStr, ByteCount, Root]


class HeldPublication(_S, frozen=True):
    """A published file this node holds or is fetching (``p2pnode.synccore.Publication``): its ``name``,
    ``version``, manifest ``root`` and target tag ``to``; ``have``: a bitmap of the blocks it holds (bit ``i % 8`` of
    byte ``i // 8``; empty: all of them); ``serves``: it serves them to members (false behind NAT); ``origin``: it
    published it."""

    name: Annotated[str, Meta(min_length=1, max_length=255)]
    version: Annotated[int, Meta(ge=1, le=2**53)]
    root: Annotated[bytes, Meta(min_length=32, max_length=32)]
    to: Tag = ""
    have: Annotated[bytes, Meta(max_length=8192)] = b""
    serves: bool = True
    origin: bool = False
    """This node published it (subscribers ask it last: the publisher serves what no one else holds yet)."""


class CheckpointRef(_S, frozen=True):
    """A checkpoint a member holds whole and verified, or signed itself (issue 41,
    :mod:`p2pnode.synccore._checkpoints`): its ``config``, the ``job_id`` of the placement that wrote it, its ``seq``
    in that job, its ``origin`` node and the ``digest`` of its signed body (BLAKE3, 16 bytes). Only a pointer: the
    signed body is fetched from a holder and checked, never trusted from the ref."""

    config: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")]
    job_id: JobId
    seq: Annotated[int, Meta(ge=1, le=COUNTER_MAX)]
    origin: NodeId
    digest: Annotated[bytes, Meta(min_length=16, max_length=16)]

    @property
    def order(self) -> tuple[int, int, int]:
        """``(term, placement seq, seq)`` (:attr:`p2pnode.synccore.CheckpointBody.order`); ``(-1, -1, seq)`` for
        a job id that is no placement."""
        p = plan_job_id(self.job_id)
        return (p.term, p.seq, self.seq) if p is not None else (-1, -1, self.seq)


MAX_CHECKPOINT_REFS = 64
"""Checkpoint refs one member publishes at most (``sync.checkpoints``)."""


class SyncSection(_S, frozen=True):
    """Sync summary: receipts and their digests (durable nodes), the data port, manifest totals (pushers)."""

    receipts: Annotated[dict[NodeId, Annotated[list[Receipt], Meta(max_length=1024)]], Meta(max_length=1024)] = {}
    receipt_digests: Annotated[dict[NodeId, Annotated[str, Meta(max_length=32)]], Meta(max_length=1024)] = {}
    data_port: Annotated[int, Meta(ge=1, le=65535)] | None = None
    digest: Short = ""
    files: Annotated[int, Meta(ge=0, le=2**40)] | None = None
    bytes: ByteCount | None = None
    under_replicated: Annotated[int, Meta(ge=0, le=2**40)] | None = None
    published: Annotated[list[HeldPublication], Meta(max_length=64)] = []
    """Published files this node holds or is fetching (distribution, durable to subscribers): the first 64 by name."""
    published_total: Annotated[int, Meta(ge=0, le=2**20)] | None = None
    """How many it holds in all, when more than ``published`` lists (members page the rest from
    ``POST /sync/dist/list``)."""
    published_digest: Short = ""
    """A digest of the whole listing when it is paged (members list it again when it changes)."""
    checkpoints: Annotated[list[CheckpointRef], Meta(max_length=MAX_CHECKPOINT_REFS)] = []
    """Checkpoints this node signed or holds whole (issue 41), newest first."""


class RunRequest(_S, frozen=True):
    """An operator's ``p2pnode jobs run``: one instance of ``template`` with ``params``, on ``node`` or a node
    tagged ``tag`` (or anywhere), requested at wall-clock ``at``; its job id is ``run-<id>``."""

    id: Short
    template: Str
    params: ParamMap = {}
    node: Annotated[str, Meta(max_length=64, pattern=_TEXT)] = ""
    tag: Tag = ""
    at: WallSeconds = 0.0


class OperatorSection(_S, frozen=True):
    """The ``operator`` section: the operator's intents that concern this node, kept in its data dir
    (``operator.json``) so they survive an agent restart and a leader failover: ``cordoned`` (no new work),
    ``drain_deadline`` (wall-clock seconds: preemptible work stops then, the rest is waited for; 0: not draining),
    the one-off ``runs`` requested through this node and not yet started, and ``done_runs``: one-off job ids that
    ran here (started, then ended or stopped), so no leader places them again."""

    cordoned: bool = False
    drain_deadline: WallSeconds = 0.0
    runs: Annotated[list[RunRequest], Meta(max_length=16)] = []
    done_runs: Annotated[list[JobId], Meta(max_length=64)] = []


# -- capacity: run-history summaries and scaling (issue 27) ------------------------------------------------------
SKETCH_BINS_MAX = 1024
"""Bins a :class:`SketchWire` may carry (a summary stays bounded whatever values a member reports)."""
SketchKey = Annotated[int, Meta(ge=-100_000, le=100_000)]
NodeClass = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}\Z")]
"""A node class: GPU count and model (``"8xH100"``), ``"cpu"``, or an operator's name in ``[scaling.classes]``."""


class SketchWire(_S, frozen=True):
    """A relative-error quantile sketch (DDSketch, Masson et al., VLDB 2019) on the wire: ``count`` values,
    their ``sum``, and the counts of the contiguous bins from key ``offset`` (bin ``k`` holds values in
    ``(gamma^(k-1), gamma^k]``, ``gamma`` fixed by :data:`p2pnode.scheduler.SKETCH_RELATIVE_ACCURACY`). Only
    positive values are sketched. Decode it with :func:`p2pnode.scheduler.sketch_from_wire`."""

    count: Annotated[float, Meta(ge=0.0, le=1e12)] = 0.0
    sum: Annotated[float, Meta(ge=0.0, le=1e30)] = 0.0
    offset: SketchKey = 0
    bins: Annotated[list[Annotated[float, Meta(ge=0.0, le=1e12)]], Meta(max_length=SKETCH_BINS_MAX)] = []


class UsageEntry(_S, frozen=True):
    """One template's finished runs on one node of ``node_class``: how many (``runs``), and sketches of run time
    (seconds), peak RSS (bytes) and peak VRAM (bytes, where NVML reported it; None otherwise)."""

    template: Str
    node_class: NodeClass
    runs: Counter
    runtime_s: SketchWire = SketchWire()
    peak_rss_bytes: SketchWire | None = None
    peak_vram_bytes: SketchWire | None = None


class UsageDoc(_S, frozen=True):
    """A node's run-history summary (served at ``GET /jobs/usage``, named in its snapshot by
    :func:`usage_digest`): one :class:`UsageEntry` per template and node class, the most-run first."""

    node: NodeId
    entries: Annotated[list[UsageEntry], Meta(max_length=256)] = []


def usage_digest(doc: UsageDoc) -> str:
    """Hex BLAKE3 (128 bits) of the msgpack encoding of ``doc`` (see :class:`UsageDoc`)."""
    return blake3.blake3(_ENCODER.encode(doc)).hexdigest(16)


SCALING_ACTIONS_MAX = 16
SCALING_FOR_TEMPLATES_MAX = 8
"""Templates a scaling verdict or action names as what it is for, at most."""
ScalingOp = Literal["up", "down"]
ScalingState = Literal["requested", "done", "failed"]


class ScalingAction(_S, frozen=True):
    """One scaling action of the fleet's leaders: ``op`` ``up`` (``count`` nodes of ``node_class``) or ``down``
    (the provider's ``nodes``), under idempotency id ``id`` (``"<term>-<n>-<ms>"``: a provider given an id again
    does nothing twice), decided in ``term`` at wall-clock ``at``; ``state`` ``requested`` until the provider
    answered (``done``) or failed (``failed``, ``error``; ``tries`` so far). It is part of the leader's
    replicated state: a new leader reconciles what it finds ``requested`` through the provider's ``list()``."""

    id: Short
    op: ScalingOp
    node_class: NodeClass
    term: Counter
    at: WallSeconds
    count: Annotated[int, Meta(ge=0, le=1000)] = 0
    nodes: Annotated[list[NodeId], Meta(max_length=64)] = []
    state: ScalingState = "requested"
    reason: Reason = ""
    error: Reason = ""
    tries: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    updated: WallSeconds = 0.0
    for_templates: Annotated[list[Short], Meta(max_length=SCALING_FOR_TEMPLATES_MAX)] = []
    """A scale-up: the waiting templates it is for (at most 8; empty for ``min_nodes``)."""


class ScalingVerdict(_S, frozen=True):
    """The leader's newest evaluation for one node class: ``verdict`` ``up`` (by ``count``), ``down`` (these
    ``nodes``) or ``hold``, with its ``reason``; ``nodes_now`` members of the class, ``queued`` jobs waiting for
    it, ``utilization`` of its GPUs (0-1; None: no GPUs)."""

    node_class: NodeClass
    verdict: Literal["up", "down", "hold"]
    reason: Reason = ""
    count: Annotated[int, Meta(ge=0, le=1000)] = 0
    nodes: Annotated[list[NodeId], Meta(max_length=64)] = []
    nodes_now: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    queued: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    utilization: Annotated[float, Meta(ge=0.0, le=10.0)] | None = None
    for_templates: Annotated[list[Short], Meta(max_length=SCALING_FOR_TEMPLATES_MAX)] = []
    """The waiting templates the class is the cheapest to take (at most 8): what a scale-up of it is for."""


class ScalingSection(_S, frozen=True):
    """The ``scaling`` section. Every node: the digest of its ``[scaling]`` table (``settings_digest``; nodes that
    may lead must agree) and, for a node a provider started, the request id that started it (``started_by``).
    The leader: its ``provider``, its action ``ledger`` (newest :data:`SCALING_ACTIONS_MAX`, replicated: a new
    leader carries it over), the wall-clock time of the last action (``last_action_at``, the cooldown's start),
    the nodes it drains before removing them (``draining``) and its newest ``verdicts`` per node class."""

    settings_digest: Short = ""
    started_by: Short = ""
    provider: Short = ""
    ledger: Annotated[list[ScalingAction], Meta(max_length=SCALING_ACTIONS_MAX)] = []
    last_action_at: WallSeconds = 0.0
    draining: Annotated[list[NodeId], Meta(max_length=64)] = []
    verdicts: Annotated[list[ScalingVerdict], Meta(max_length=32)] = []
    term: Counter = 0


class Snapshot(_S, frozen=True):
    """One node's signed state (schema 3): a header (``origin``, ``version``, ``addr``, ``tags``, ``leaving``,
    start time, agent version, trust mode, ``label``) and one section per subsystem, each written by its owner only:

    ========== ============================ ==========================================
    section    type                         owner
    ========== ============================ ==========================================
    resources  :class:`Resources`           the resource sampler
    membership :class:`MembershipSection`   the node core (membership)
    vote       :class:`VoteWire` or None    the node core (election)
    jobs       :class:`JobsSection`         the job control
    plan       :class:`PlanRef` or None     the job control, while this node leads
    sync       :class:`SyncSection`         the sync service
    guard      :class:`GuardSummary`        the guard driver
    events     list of :class:`EventEntry`  the guard's event log
    operator   :class:`OperatorSection`     the job control (the operator's intents for this node)
    roll       :class:`RollSection` or None the node core (the voter roll it counts)
    scaling    :class:`ScalingSection`      the job control (settings digest; the leader's scaling ledger)
    ========== ============================ ==========================================

    Required: ``schema``, ``origin``, ``version``, ``addr``, ``tags``, ``leaving``; every section has a default.
    Read a peer's section through :meth:`p2pnode.node.NodeContext.section`."""

    schema: int
    origin: _NodeIdOnce
    version: Counter
    addr: _AddrOnce
    tags: Annotated[list[_TagOnce], Meta(max_length=64)]
    leaving: bool
    started_at: WallSeconds = 0.0
    ts: WallSeconds = 0.0
    agent_version: _ShortOnce = ""
    trust: _ShortOnce = ""
    label: Label = Label()
    """The name an operator knows this node by, its provider and instance id (:mod:`p2pnode.label`): shown only."""
    resources: Resources = Resources()
    membership: MembershipSection = MembershipSection()
    vote: VoteWire | None = None
    jobs: JobsSection = JobsSection()
    plan: PlanRef | None = None
    sync: SyncSection = SyncSection()
    guard: GuardSummary = GuardSummary()
    events: Annotated[list[EventEntry], Meta(max_length=64)] = []
    operator: OperatorSection = OperatorSection()
    roll: RollSection | None = None
    scaling: ScalingSection = ScalingSection()
    cert: RoleCert | None = None
    """The operator's role certificate of this node (:mod:`p2pnode.certs`), or None: its ``voter`` and ``durable``
    tags and its eligibility to lead count on a member that pins operator keys only when it grants them."""


SECTIONS: dict[type, str] = {
    Resources: "resources",
    MembershipSection: "membership",
    VoteWire: "vote",
    JobsSection: "jobs",
    PlanRef: "plan",
    SyncSection: "sync",
    GuardSummary: "guard",
    OperatorSection: "operator",
    RollSection: "roll",
    ScalingSection: "scaling",
}
"""Section type -> attribute of :class:`Snapshot` (for typed accessors)."""


def section_of(snap: Snapshot, kind: type[T]) -> T | None:
    """The section ``kind`` of ``snap`` (None for an absent optional section). Raises ``KeyError`` for a type
    that is not a section."""
    section: T | None = getattr(snap, SECTIONS[kind])
    return section


def plan_digest(assignments: list[PlanJob], stops: list[PlanStop], gangs: list[PlanGang] | tuple[()] = ()) -> str:
    """Hex BLAKE3 (128 bits) of the msgpack encoding of ``assignments``, ``stops`` and, when there are any, the
    ``gangs`` entries: two plans with the same digest hold the same desired state and the same gang table. A stop's
    ``rule`` (a label for the history) is left out, so an agent that predates it computes the same digest of a
    whole plan (:func:`p2pnode.node._plandist.open_whole`); a node's part is signed over its bytes, its rules
    included. The gang table is in the digest (it decides which members of a gang already ended with status 0, so
    it must be the leader's word, which only the signed ref's digest vouches for): without gangs the digest is what
    an agent that predates the table computes; with gangs such an agent refuses the whole plan as not matching its
    ref, as it refuses any plan it cannot check, and plans without it after its hold. An assignment's predicted
    figures (:class:`PlanJob` ``memory_gib``, ``vram_peak_gib``) are in the digest the same way, being left out of
    the encoding when absent: they decide what a node admits, so only the leader may state them, also in a whole
    plan a new leader carries over. A plan whose assignments have none hashes as before; one with figures (any plan
    of a leader with run history) an agent that predates them refuses whole, as above (a node's part it still
    accepts: its signature is over its bytes, and it ignores the fields)."""
    plain = [s if s.rule == "plan" else msgspec.structs.replace(s, rule="plan") for s in stops]
    doc = (assignments, plain, gangs) if gangs else (assignments, plain)
    return blake3.blake3(_ENCODER.encode(doc)).hexdigest(16)


def plan_ref(p: PlanSection) -> PlanRef:
    """The snapshot's reference to plan document ``p``."""
    return PlanRef(term=p.term, seq=p.seq, digest=p.digest, at=p.at, jobs=len(p.assignments), stops=len(p.stops),
                   pending=len(p.pending))


def running_digest(running: list[JobReport]) -> str:
    """Hex BLAKE3 (128 bits) of the msgpack encoding of a node's running jobs (see :class:`JobsSection`)."""
    return blake3.blake3(_ENCODER.encode(running)).hexdigest(16)


def jobs_section(running: list[JobReport], **kw: Any) -> JobsSection:
    """A :class:`JobsSection` for ``running`` (inline when at most :data:`INLINE_RUNNING` jobs, else by digest)
    and the other fields ``kw``."""
    inline = running if len(running) <= INLINE_RUNNING else []
    return JobsSection(running=inline, running_count=len(running), running_digest=running_digest(running), **kw)


def encode_snapshot(snap: Snapshot) -> bytes:
    """The msgpack body of ``snap`` (defaults left out). No bound is checked here: check with
    :func:`decode_snapshot` (what every peer does) before publishing."""
    return _ENCODER.encode(snap)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Snapshot)


def with_text_rule(tp: Any) -> Any:
    """``tp`` with every text rule :func:`decode_snapshot` checks itself put back into its types: the same type
    (``Annotated``, ``list``, ``dict``, unions, and the classes :class:`GpuInfo`, :class:`Resources`,
    :class:`JobsSection` and :class:`Snapshot` by twins that carry the ``pattern``), for a decoder of a section or
    a resource sample that must refuse what msgspec refused before (their values are checked, not kept: decode
    into ``tp`` itself for use)."""
    if isinstance(tp, type):
        return _TWINS.get(tp, tp)
    try:
        strict = _WITH_RULE.get(tp)
    except TypeError:  # an unhashable type argument
        strict = None
    if strict is not None:
        return strict
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if not args or origin is Literal:
        return tp
    if origin is Annotated:
        return Annotated[(with_text_rule(args[0]), *tp.__metadata__)]
    if origin in (Union, types.UnionType):
        return functools.reduce(operator.or_, (with_text_rule(a) for a in args))
    return origin[tuple(with_text_rule(a) for a in args)]


def _twin(cls: type[Struct]) -> type[Struct]:
    """A struct like ``cls`` (fields, defaults, options of :class:`_S`) whose field types have the text rule
    back (:func:`with_text_rule`): what msgspec decoded before the rule was left to :func:`decode_snapshot`."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields: list[Any] = []
    for f in msgspec.structs.fields(cls):
        tp = with_text_rule(hints[f.name])
        if f.default is not msgspec.NODEFAULT:
            fields.append((f.name, tp, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, tp, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, tp))
    return msgspec.defstruct(f"{cls.__name__}WithTextRule", fields, module=__name__, frozen=True,
                             omit_defaults=True, forbid_unknown_fields=False)


_TWINS: dict[type, type] = {}
for _cls in (GpuInfo, Resources, JobsSection, Snapshot):  # inner first: a twin's fields name the inner twins
    _TWINS[_cls] = _twin(_cls)
_STRICT_DECODER: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(_TWINS[Snapshot])


def convert_resources(sample: Any) -> Resources:
    """``msgspec.convert(sample, Resources)`` with every bound of :class:`Resources`, its text rule included (a GPU
    name with a control character is refused). Raises ``msgspec.ValidationError`` as that did."""
    msgspec.convert(sample, _TWINS[Resources])
    resources: Resources = msgspec.convert(sample, Resources)
    return resources


def _rules_ok(s: Snapshot) -> bool:
    """Whether every string of ``s`` whose rule msgspec left to us (:data:`_WITH_RULE`) keeps it: ``addr``
    :data:`ADDR_PATTERN` (one regex call, none when empty), the others :data:`_TEXT`, checked over them all at once:
    in UTF-8 the bytes 0x00-0x1f and 0x7f stand only for those characters (every byte of a longer sequence is 0x80 or
    above), so the text has none of them exactly when deleting them from its encoding deletes nothing (0.3 µs for
    200 characters, a third of one regex search over them). ``tests/test_snapshot_text_rule.py`` finds every such
    field by its type and checks that a control character in it is caught here."""
    r, j = s.resources, s.jobs
    t = (s.origin + s.agent_version + s.trust + r.disk_path + r.gpu_source + j.catalog_digest + j.running_digest
         + j.usage_digest + j.node_class)
    for g in r.gpus:
        t += g.name + g.uuid
    if s.tags:
        t += "".join(s.tags)
    if r.declared:
        t += "".join(r.declared)
    if j.acks:
        t += "".join(j.acks)
    if r.gpu_absent_reason is not None:
        t += r.gpu_absent_reason
    encoded = t.encode("utf-8", "surrogatepass")
    return len(encoded.translate(None, _CONTROL_BYTES)) == len(encoded) and (
        not s.addr or _ADDR_SEARCH(s.addr) is not None)


class _SchemaOnly(Struct):
    schema: Any = None


_SCHEMA_DECODER = msgspec.msgpack.Decoder(_SchemaOnly)


def _schema_of(body: bytes) -> Any:
    """The ``schema`` field of a snapshot body that failed the full decoder (None when unreadable)."""
    try:
        return _SCHEMA_DECODER.decode(body).schema
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
MAX_RECEIPTS = 1024
_DECODE_ERRORS = (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError)


def decode_snapshot(body: bytes) -> Snapshot:
    """Decode and bound-check a snapshot body (msgpack bytes).

    Raises :class:`RejectedMessage`: ``malformed`` (not msgpack), ``bad_schema`` (schema other than 3),
    ``bad_type`` (a field missing, of the wrong type or out of its bounds; the detail names the field path).

    The no-control-character rule of the header's, resources', GPUs' and jobs digests' strings is checked in one
    pass (:func:`_rules_ok`, with ``addr``'s host:port rule), not per string by msgspec, and trusted for a body that is
    exactly the encoding of what it decodes to (an agent's: no repeated key, whose first value msgspec would drop
    unchecked, no unknown field, nothing after it), so every string checked is every string the body holds. Any
    other body, and any that fails, is decoded again by the twin types that carry the rules (:func:`with_text_rule`):
    the verdict, reason and detail are always those of the decoder with the rules in every type (the first fault in
    the body's order), as before; only the cost differs (an agent of a later version, with fields this one does not
    know, pays both decodes).
    """
    try:
        snap: Snapshot | None = _DECODER.decode(body)
    except _DECODE_ERRORS:
        snap = None
    if snap is None or not _rules_ok(snap) or not _is_encoding_of(snap, body):
        _decode_with_rule(body)  # raises what the decoder with the rule in every type raised
        if snap is None:  # not reached: the twin types accept a subset of what these accept
            raise RejectedMessage(RejectReason.MALFORMED, "snapshot decoded by the twin types only")
    if snap.schema != SCHEMA_VERSION:
        raise RejectedMessage(RejectReason.BAD_SCHEMA, f"snapshot schema {snap.schema!r}")
    receipts = snap.sync.receipts
    if receipts and sum(len(v) for v in receipts.values()) > MAX_RECEIPTS:
        raise RejectedMessage(RejectReason.BAD_TYPE, f"more than {MAX_RECEIPTS} sync receipts")
    return snap


_LOCAL = threading.local()  # per thread (intake verifies in worker threads): a buffer _is_encoding_of reuses


def _is_encoding_of(snap: Snapshot, body: bytes) -> bool:
    """Whether ``body`` is exactly ``encode_snapshot(snap)`` (encoded into this thread's buffer: no new bytes)."""
    buf: bytearray
    try:
        buf = _LOCAL.buf
    except AttributeError:
        buf = _LOCAL.buf = bytearray(4096)
    _ENCODER.encode_into(snap, buf)
    return buf == body


def _decode_with_rule(body: bytes) -> None:
    """Decode ``body`` with the text rule in every type (:data:`_TWINS`); raise its fault as
    :func:`decode_snapshot` reports it (``RejectedMessage``), or return when there is none."""
    try:
        _STRICT_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        # A snapshot of another schema fails on some field of ours first: say what it is, not where it broke.
        if "$.schema" in str(exc) or _schema_of(body) != SCHEMA_VERSION:
            raise RejectedMessage(RejectReason.BAD_SCHEMA, str(exc)) from None
        raise RejectedMessage(RejectReason.BAD_TYPE, str(exc)) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:  # text not UTF-8; nesting deeper
        # than msgspec skips an unknown field's value (a signed body a member made on purpose)
        raise RejectedMessage(RejectReason.MALFORMED, str(exc)) from None


def snapshot_dict(obj: Any, *, hex_bytes: bool = False, defaults: bool = False) -> Any:
    """The plain view of a snapshot or a section: dicts, lists and scalars. Fields at their default are left out
    (as on the wire) unless ``defaults``; bytes (sync receipt roots) stay bytes, or become hex strings with
    ``hex_bytes`` (for JSON views)."""
    out = _full(obj) if defaults else msgspec.to_builtins(obj, builtin_types=(bytes,))
    return _hexed(out) if hex_bytes else out


def _full(obj: Any) -> Any:
    if isinstance(obj, Struct):
        return {f: _full(getattr(obj, f)) for f in obj.__struct_fields__}
    if isinstance(obj, dict):
        return {k: _full(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_full(v) for v in obj]
    return obj


def _hexed(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, dict):
        return {k: _hexed(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_hexed(v) for v in obj]
    return obj
