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

:func:`snapshot_dict` gives the plain-builtins view of a typed snapshot (dicts and lists, bytes kept as bytes,
defaults left out), which the subsystems that still read dicts consume; it contains only what the decoder
accepted. The wire layout is unchanged (schema 1): a node builds its snapshot as a dict and
:func:`decode_snapshot` accepts exactly what :mod:`p2pnode.agent` publishes (checked at every publication).
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec
from msgspec import Meta, Struct

from .errors import RejectedMessage, RejectReason

__all__ = [
    "COUNTER_MAX",
    "GpuInfo",
    "Resources",
    "Snapshot",
    "decode_snapshot",
    "snapshot_dict",
]

SCHEMA_VERSION = 1
COUNTER_MAX = 2**53 - 1
"""Upper bound of versions, incarnations, terms and plan sequence numbers accepted from the wire."""

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
PathStr = Annotated[str, Meta(max_length=1024, pattern=_TEXT)]
Scalar = Union[str, int, float, bool, None]
Root = Annotated[bytes, Meta(min_length=32, max_length=32)]
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
ADDR_PATTERN = rf"^(?:(?:\[[0-9A-Fa-f:.]{{2,45}}\]|{_LABEL}(?:\.{_LABEL})*):{_PORT})?\Z"
"""``addr``: empty, or ``host:port`` with an ASCII DNS name (labels of 1-63 characters), an IPv4 address or a
bracketed IPv6 address, and a port 1-65535. Peers dial it (``http://{addr}/gossip``): a label the IDNA codec
refuses, a path, a user or a query in it must never reach a URL."""
Addr = Annotated[str, Meta(max_length=256, pattern=ADDR_PATTERN)]


class _S(Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=False):
    """Base: immutable; defaults are left out of :func:`snapshot_dict`, unknown fields ignored."""


class GpuInfo(_S):
    """One GPU: ``index`` 0..1023, model ``name``, memory in bytes, utilization in percent."""

    index: GpuIndex = 0
    name: GpuText = ""
    uuid: GpuText = ""
    util_percent: Percent = 0.0
    mem_used_bytes: ByteCount = 0
    mem_total_bytes: ByteCount = 0
    temperature_c: Annotated[float, Meta(ge=-300.0, le=1000.0)] | None = None
    power_w: Annotated[float, Meta(ge=0.0, le=1e6)] | None = None


class Resources(_S):
    """The resource sample (see :class:`p2pnode.resources.ResourceSample`). ``power_score`` is informative
    only: ranking recomputes a member's power from its ``gpus`` (:func:`p2pnode.resources.power_of_gpus`)."""

    cpu_percent: Percent = 0.0
    cpu_count: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    load_avg: Annotated[list[Num], Meta(max_length=3)] = []
    mem_total_bytes: ByteCount = 0
    mem_available_bytes: ByteCount = 0
    mem_used_bytes: ByteCount = 0
    mem_percent: Percent = 0.0
    disk_path: PathStr = ""
    disk_total_bytes: ByteCount = 0
    disk_used_bytes: ByteCount = 0
    disk_free_bytes: ByteCount = 0
    disk_percent: Percent = 0.0
    gpus: Annotated[list[GpuInfo], Meta(max_length=32)] = []
    gpu_source: Short = ""
    gpu_absent_reason: Reason | None = None
    power_score: Annotated[float, Meta(ge=0.0, le=1e9)] = 0.0
    vram_total_bytes: ByteCount = 0


class JobReport(_S):
    """A job running on the member (``gpus`` indexes, ``gpu_fraction`` of each, ``vram_gib``, plan ``term``)."""

    job_id: Str
    template: Str
    config: Str = ""
    kind: Short = ""
    gpus: Annotated[list[GpuIndex], Meta(max_length=64)] = []
    gpu_fraction: Annotated[float, Meta(ge=0.0, le=64.0)] = 0.0
    vram_gib: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    started_at: WallSeconds = 0.0
    term: Counter = 0
    pid: Annotated[int, Meta(ge=0, le=2**31)] | None = None


class Refusal(_S):
    """A job the member refused, and why."""

    job_id: Str
    template: Str = ""
    reason: Reason = ""
    at: WallSeconds = 0.0


class PlanJob(_S):
    """One placement of a plan: run ``template`` with ``params`` on ``node`` (GPU indexes, fraction, VRAM)."""

    job_id: Str
    node: NodeId
    template: Str = ""
    gpus: Annotated[list[GpuIndex], Meta(max_length=64)] = []
    gpu_fraction: Annotated[float, Meta(ge=0.0, le=64.0)] = 0.0
    vram_gib: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    params: Annotated[dict[Short, Union[Str, int, Num, bool]], Meta(max_length=64)] = {}
    term: Counter = 0
    assigned_at: WallSeconds = 0.0


class PlanStop(_S):
    job_id: Str
    node: NodeId = "-"
    reason: Reason = ""


class PlanPending(_S):
    template: Str
    reason: Reason = ""
    wait_s: Annotated[float, Meta(ge=0.0, le=1e11)] = 0.0


class Plan(_S):
    """The leader's plan for ``term`` (the fencing token), sequence ``seq`` within the term."""

    term: Counter
    jobs: Annotated[list[PlanJob], Meta(max_length=4096)]
    seq: Counter = 0
    at: WallSeconds = 0.0
    stops: Annotated[list[PlanStop], Meta(max_length=4096)] = []
    pending: Annotated[list[PlanPending], Meta(max_length=256)] = []


class GuardSummary(_S):
    level: Annotated[int, Meta(ge=0, le=4)] = 0
    raw_level: Annotated[int, Meta(ge=0, le=4)] = 0
    ratio: Annotated[float, Meta(ge=0.0, le=1e6)] = 0.0
    reasons: Annotated[list[Reason], Meta(max_length=16)] = []


class EventEntry(_S):
    """A recent event of the member: ``seq``, ``name``, wall-clock ``at``, a small ``payload``."""

    name: Short
    seq: Counter = 0
    at: WallSeconds = 0.0
    payload: Annotated[
        dict[Short, Union[Reason, int, Num, bool, None, Annotated[list[Reason], Meta(max_length=16)]]],
        Meta(max_length=32),
    ] = {}


class VoteWire(_S):
    candidate: NodeId
    term: Counter


Receipt = tuple[PathStr, ByteCount, Root]


class SyncSection(_S):
    """Sync summary: receipts and their digests (durable nodes), the data port, manifest totals (pushers)."""

    receipts: Annotated[dict[NodeId, Annotated[list[Receipt], Meta(max_length=1024)]], Meta(max_length=1024)] = {}
    receipt_digests: Annotated[dict[NodeId, Annotated[str, Meta(max_length=32)]], Meta(max_length=1024)] = {}
    data_port: Annotated[int, Meta(ge=1, le=65535)] | None = None
    digest: Short = ""
    files: Annotated[int, Meta(ge=0, le=2**40)] | None = None
    bytes: ByteCount | None = None
    under_replicated: Annotated[int, Meta(ge=0, le=2**40)] | None = None


SignalValues = Annotated[dict[Short, Num], Meta(max_length=16)]


class Snapshot(_S):
    """One node's signed state (schema 1). Required: ``schema``, ``origin``, ``version``, ``addr``, ``tags``,
    ``resources``, ``leaving``; everything else has a default."""

    schema: int
    origin: NodeId
    version: Counter
    addr: Addr
    tags: Annotated[list[Tag], Meta(max_length=64)]
    resources: Resources
    leaving: bool
    started_at: WallSeconds = 0.0
    ts: WallSeconds = 0.0
    agent_version: Short = ""
    trust: Short = ""
    incarnation: Counter = 0
    suspects: Annotated[dict[NodeId, Counter], Meta(max_length=4096)] = {}
    vote: VoteWire | None = None
    catalog_digest: Short = ""
    jobs: Annotated[list[JobReport], Meta(max_length=512)] = []
    refused: Annotated[list[Refusal], Meta(max_length=64)] = []
    offer: Annotated[int, Meta(ge=0, le=1_000_000)] = 0
    signals: Annotated[dict[Short, SignalValues], Meta(max_length=256)] = {}
    plan: Plan | None = None
    guard: GuardSummary = GuardSummary()
    events: Annotated[list[EventEntry], Meta(max_length=64)] = []
    sync: SyncSection = SyncSection()


_DECODER = msgspec.msgpack.Decoder(Snapshot)
MAX_RECEIPTS = 1024


def decode_snapshot(body: bytes) -> Snapshot:
    """Decode and bound-check a snapshot body (msgpack bytes).

    Raises :class:`RejectedMessage`: ``malformed`` (not msgpack), ``bad_schema`` (schema other than 1),
    ``bad_type`` (a field missing, of the wrong type or out of its bounds; the detail names the field path).
    """
    try:
        snap = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        if "$.schema" in str(exc):
            raise RejectedMessage(RejectReason.BAD_SCHEMA, str(exc)) from None
        raise RejectedMessage(RejectReason.BAD_TYPE, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise RejectedMessage(RejectReason.MALFORMED, str(exc)) from None
    if snap.schema != SCHEMA_VERSION:
        raise RejectedMessage(RejectReason.BAD_SCHEMA, f"snapshot schema {snap.schema!r}")
    n = sum(len(v) for v in snap.sync.receipts.values())
    if n > MAX_RECEIPTS:
        raise RejectedMessage(RejectReason.BAD_TYPE, f"more than {MAX_RECEIPTS} sync receipts")
    return snap


def snapshot_dict(snap: Snapshot) -> dict[str, Any]:
    """The plain view of ``snap``: dicts, lists and scalars (bytes kept), defaults left out, except the
    required fields and the sections every reader expects (``resources``, ``tags``)."""
    return msgspec.to_builtins(snap, builtin_types=(bytes,))
