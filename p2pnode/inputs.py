"""Typed inputs that are not snapshots: the one decoder of every HTTP request body, query string and header the
agent's routes read. Pure (msgspec only).

Each route names its input as a struct below and decodes it here, with the bounded types of
:mod:`p2pnode.snapshot` (:data:`~p2pnode.snapshot.NodeId`, :data:`~p2pnode.snapshot.JobId`,
:data:`~p2pnode.snapshot.ParamMap`, ...), so a value a route accepts is always one the snapshot, the state files
and every consumer accept: ASCII digits only, no control characters, integers bounded before any conversion,
finite numbers in range, capped strings and lists, unknown fields refused. Past this module no route code calls
``int()``, ``float()`` or ``isdigit()`` on request text (``tests/test_lint.py`` checks it).

Peers' replies to this node's sync requests are decoded here too, each by its one decoder into bounded structs
(:func:`decode_push_reply`, :func:`decode_channel_frame`, :func:`decode_receipts`, :func:`decode_listing`); a
reply they refuse raises :class:`p2pnode.errors.SyncReplyRejected` (``reply_malformed``, ``reply_invalid``,
``reply_oversized``), which the asker counts as a peer's error and gets on with its work.

Errors: :class:`InputError` (a :class:`p2pnode.errors.PeerError`) with ``reason`` ``malformed`` (not JSON or
msgpack, a duplicate query parameter, a header of the wrong shape) or ``invalid`` (well-formed, but a field is
missing, of the wrong type or out of its bounds; ``detail`` names the field, e.g. ``$.deadline_s``) and the HTTP
``status`` to answer (400, or 422 where the route documents it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from .errors import PeerError, SyncReplyRejected
from .snapshot import ByteCount, JobId, NodeId, ParamMap, PathStr, Receipt, Str, Tag

__all__ = [
    "warm_type_info",
    "BlockRefusal",
    "CheckpointFileQuery",
    "CheckpointQuery",
    "ChannelFrame",
    "CordonBody",
    "DrainBody",
    "EmptyQuery",
    "HistoryQuery",
    "InputError",
    "MAX_MEMBERS_PAGE",
    "MembersQuery",
    "LogsQuery",
    "RunQuery",
    "ManifestQuery",
    "PartQuery",
    "PlanQuery",
    "PredictQuery",
    "RunningQuery",
    "UsageQuery",
    "ReceiptsQuery",
    "MAX_DRAIN_S",
    "RunBody",
    "SeriesQuery",
    "StopBody",
    "VotersBody",
    "content_length",
    "if_none_match",
    "decimal",
    "unix_seconds",
    "MAX_SYNC_REPLY_BYTES",
    "PushReply",
    "PushResult",
    "check_push_results",
    "decode_channel_frame",
    "decode_json",
    "decode_listing",
    "decode_push_reply",
    "decode_receipts",
    "decode_msgpack",
    "decode_query",
]

T = TypeVar("T")

MAX_DRAIN_S = 30 * 86400.0
"""The longest drain deadline an operator may set, seconds (30 days)."""
_CONTENT_LENGTH = re.compile(r"^[0-9]{1,19}\Z")  # ASCII digits: 19 is below 2^63, never an overflow
_DIGITS = re.compile(r"^[0-9]+\Z")
_SECONDS = re.compile(r"^[0-9]{1,11}(?:\.[0-9]{1,9})?\Z")


class InputError(PeerError):
    """A request's body, query or header was refused: ``reason`` (``malformed`` or ``invalid``, a counter label),
    ``detail`` (what was wrong, naming the field), ``status`` (the HTTP status to answer)."""

    def __init__(self, reason: str, detail: str, status: int = 400) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.status = status


class _In(Struct, frozen=True, forbid_unknown_fields=True):
    """Base of request inputs: immutable, unknown fields refused (a typo is an error, not a silent default)."""


class CordonBody(_In, frozen=True):
    """``POST /operator/cordon``: ``{"cordon": true|false}``."""

    cordon: bool


class DrainBody(_In, frozen=True):
    """``POST /operator/drain``: ``{"deadline_s": seconds}``, 0 to 30 days (finite)."""

    deadline_s: Annotated[float, Meta(ge=0.0, le=MAX_DRAIN_S)] = 0.0


class RunBody(_In, frozen=True):
    """``POST /jobs/run``: one instance of ``template`` with ``params`` (checked again against the template's
    declared parameters), on ``node`` or a node tagged ``tag`` (empty: anywhere)."""

    template: Str
    params: ParamMap = {}
    node: Annotated[str, Meta(max_length=64, pattern=r"^[a-z0-9]*\Z")] = ""
    tag: Tag = ""


class StopBody(_In, frozen=True):
    """``POST /jobs/stop``: ``{"job_id": ID}``."""

    job_id: JobId


class VotersBody(_In, frozen=True):
    """``POST /voters``: ``{"node_id": ID, "action": "remove"|"admit"|"eligible"|"ineligible"|"unmark"}``. ``ID``
    has the shape of a node id (lower-case base32, :func:`p2pnode.identity.node_id_for`): a typo admitted to the
    roll would raise the quorum. ``eligible`` / ``ineligible`` mark who may lead, ``unmark`` takes the mark back
    (:func:`p2pnode.election.is_eligible`)."""

    node_id: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[a-z2-7]+\Z")]
    action: Literal["remove", "admit", "eligible", "ineligible", "unmark"]


class RunQuery(_In, frozen=True):
    """``GET /jobs/runs?id=ID``: a one-off run's id (``<id>`` or its job id ``run-<id>``)."""

    id: Annotated[str, Meta(min_length=1, max_length=68, pattern=r"^(run-)?[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")]


class HistoryQuery(_In, frozen=True):
    """``GET /jobs/history?n=RUNS``: the newest 1-1000 runs (default 50)."""

    n: Annotated[int, Meta(ge=1, le=1000)] = 50


class LogsQuery(_In, frozen=True):
    """``GET /jobs/logs?job_id=ID&offset=BYTES``."""

    job_id: JobId
    offset: ByteCount = 0


class PlanQuery(_In, frozen=True):
    """``GET /plan?node=ID&format=json|msgpack&digest=HEX&inputs=0|1``."""

    node: Annotated[str, Meta(max_length=64, pattern=r"^[a-z0-9]*\Z")] = ""
    format: Literal["json", "msgpack"] = "json"
    digest: Annotated[str, Meta(max_length=64, pattern=r"^[0-9a-f]*\Z")] = ""
    inputs: Literal[0, 1] = 0
    """``1``: add the facts the served plan was computed from (``inputs``: null where this node did not make it).
    JSON only: with ``format=msgpack`` it is refused (400), not ignored."""


class PartQuery(_In, frozen=True):
    """``GET /plan/part?node=ID&digest=HEX``."""

    node: NodeId
    digest: Annotated[str, Meta(max_length=64, pattern=r"^[0-9a-f]*\Z")] = ""


class CheckpointQuery(_In, frozen=True):
    """``GET /sync/checkpoint?digest=HEX``: the signed checkpoint whose body hashes to ``digest`` (32 hex)."""

    digest: Annotated[str, Meta(min_length=32, max_length=32, pattern=r"^[0-9a-f]{32}\Z")]


class CheckpointFileQuery(_In, frozen=True):
    """``GET /sync/checkpoint/file?digest=HEX&file=N&offset=BYTES[&part=hashes]``: file ``file`` of checkpoint
    ``digest``, from byte ``offset`` (a resumed fetch) to its end; ``part=hashes``: its block hashes instead (32
    bytes a block, which the reader checks against the signed manifest root, then each block against)."""

    digest: Annotated[str, Meta(min_length=32, max_length=32, pattern=r"^[0-9a-f]{32}\Z")]
    file: Annotated[int, Meta(ge=0, le=4095)] = 0
    offset: Annotated[int, Meta(ge=0, le=2**44)] = 0
    part: Literal["bytes", "hashes"] = "bytes"


class RunningQuery(_In, frozen=True):
    """``GET /jobs/running?digest=HEX`` (empty: the current list)."""

    digest: Annotated[str, Meta(max_length=64, pattern=r"^[0-9a-f]*\Z")] = ""


class UsageQuery(_In, frozen=True):
    """``GET /jobs/usage?digest=HEX`` (empty: the newest summary)."""

    digest: Annotated[str, Meta(max_length=64, pattern=r"^[0-9a-f]*\Z")] = ""


class PredictQuery(_In, frozen=True):
    """``GET /jobs/predict?template=T`` (empty: every template)."""

    template: Str = ""


class ReceiptsQuery(_In, frozen=True):
    """``GET /sync/receipts?origin=ID``."""

    origin: NodeId


class ManifestQuery(_In, frozen=True):
    """``GET /sync/manifest?path=P``."""

    path: PathStr | None = None


class SeriesQuery(_In, frozen=True):
    """``GET /ui/state?since=T`` and ``/ui/series?since=T``: monotonic seconds of the newest point held."""

    since: Annotated[float, Meta(ge=-1e12, le=1e12)] | None = None


MAX_MEMBERS_PAGE = 1000
"""The most members one ``GET /members?limit=`` page holds."""


class MembersQuery(_In, frozen=True):
    """``GET /members?limit=N&after=ID``: at most ``limit`` members (1 to :data:`MAX_MEMBERS_PAGE`; absent: every
    one) whose ids sort after ``after`` (absent: from the first), in id order."""

    limit: Annotated[int, Meta(ge=1, le=MAX_MEMBERS_PAGE)] | None = None
    after: NodeId | None = None


class EmptyQuery(_In, frozen=True):
    """A route that takes no query parameters (any it is sent are ignored by :func:`decode_query`'s caller)."""


def _fail(exc: Exception) -> InputError:
    if isinstance(exc, msgspec.ValidationError):
        return InputError("invalid", str(exc))
    return InputError("malformed", str(exc))


def decode_json(body: bytes, kind: type[T]) -> T:
    """``body`` (JSON) as a ``kind``. Raises :class:`InputError`: ``malformed`` (not JSON: NaN and Infinity
    tokens included), ``invalid`` (a field missing, unknown, of the wrong type or out of bounds)."""
    try:
        return msgspec.json.decode(body, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise _fail(exc) from None


def decode_msgpack(body: bytes, kind: type[T]) -> T:
    """``body`` (msgpack) as a ``kind``; errors as :func:`decode_json`."""
    try:
        return msgspec.msgpack.decode(body, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise _fail(exc) from None


def decode_query(items: Iterable[tuple[str, str]], kind: type[T], *, ignore_unknown: bool = False) -> T:
    """A query string's ``(name, value)`` pairs (e.g. Starlette's ``query_params.multi_items()``) as a ``kind``:
    numbers are converted from their text by msgspec (ASCII digits only: ``²`` or ``٣`` is refused, as is a
    number beyond the field's bound, however many digits it has). Raises :class:`InputError`: ``malformed`` for
    a repeated parameter, ``invalid`` for a value that does not fit its field (or, unless ``ignore_unknown``,
    an unknown parameter)."""
    fields = set(getattr(kind, "__struct_fields__", ()))
    raw: dict[str, str] = {}
    for name, value in items:
        if ignore_unknown and name not in fields:
            continue
        if name in raw:
            raise InputError("malformed", f"query parameter {name[:64]!r} given twice")
        raw[name] = value
    try:
        return msgspec.convert(raw, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise InputError("invalid", f"query: {exc}") from None


_MAX_IF_NONE_MATCH = 4096
"""The longest ``If-None-Match`` header read, characters (RFC 9110 sets no limit; ours hold one tag or a few)."""
_MAX_ENTITY_TAGS = 32
_ENTITY_TAG = re.compile(r'[ \t]*(W/)?("[\x21\x23-\x7e\x80-\xff]*")[ \t]*(,|\Z)')


def if_none_match(value: str | None) -> frozenset[str] | None:
    """An ``If-None-Match`` header (RFC 9110 section 13.1.2): None when absent; ``frozenset({"*"})`` for ``*``;
    else the entity tags it lists, each as its opaque tag with its quotes (``'"abc"'``; a weak tag's ``W/``
    dropped: the header is compared weakly, so a tag matches an ``ETag`` header's value as is). Raises
    :class:`InputError` ``malformed`` for a value longer than 4,096 characters, with more than 32 tags, none, or
    one that is not a list of quoted tags (the caller ignores such a header and answers in full)."""
    if value is None:
        return None
    if len(value) > _MAX_IF_NONE_MATCH:
        raise InputError("malformed", f"if-none-match of {len(value)} characters > {_MAX_IF_NONE_MATCH}")
    if value.strip(" \t") == "*":
        return frozenset({"*"})
    tags: set[str] = set()
    pos, end = 0, len(value)
    while pos < end:
        m = _ENTITY_TAG.match(value, pos)
        if m is None or m.end() == pos:
            raise InputError("malformed", f"if-none-match {value[:64]!r} is not a list of entity tags")
        tags.add(m.group(2))
        if len(tags) > _MAX_ENTITY_TAGS:
            raise InputError("malformed", f"if-none-match lists more than {_MAX_ENTITY_TAGS} entity tags")
        pos = m.end()
        if m.group(3) == "," and pos == end:
            raise InputError("malformed", "if-none-match ends with a comma")
    if not tags:
        raise InputError("malformed", "if-none-match lists no entity tag")
    return frozenset(tags)


def content_length(value: str | None) -> int | None:
    """A ``content-length`` header: None when absent, else its value (1-19 ASCII digits). Raises
    :class:`InputError` ``malformed`` for anything else (``²``, a sign, spaces, 20 digits or more)."""
    if value is None:
        return None
    if not _CONTENT_LENGTH.match(value):
        raise InputError("malformed", f"content-length {value[:32]!r} is not a byte count")
    return int(value)  # 1-19 ASCII digits: exact, below 2^63



def decimal(text: str, *, max_digits: int = 19) -> int | None:
    """``text`` as a non-negative integer when it is 1 to ``max_digits`` ASCII digits (no sign, space or ``²``),
    else None: for ports, kernel counters (``/proc``, cgroup files) and the like, where a caller has its own
    fallback. The default bound keeps every value below 2^63."""
    if not 0 < len(text) <= max_digits or not _DIGITS.match(text):
        return None
    return int(text)


# -- peers' replies to this node's sync requests -------------------------------------------------------------------
MAX_SYNC_REPLY_BYTES = 64 * 2**20
"""Bytes of a peer's ``POST /sync/push`` reply, ``GET /sync/receipts`` list or ``GET /sync/manifest`` listing at most
(the asker stops reading there: ``reply_oversized``)."""
MAX_RECEIPTS_REPLY = 1 << 22
"""Receipts one ``GET /sync/receipts`` reply may list."""
MAX_LISTING_FILES = 1 << 20
"""Files one ``GET /sync/manifest`` reply may list."""
MAX_PUSH_RESULTS = 4096
"""Per-file results one push reply or data-channel frame may list (a push carries at most 4,096 files)."""
MAX_NEED = 1 << 22
"""Block indices one result may ask for (and the bound of its ``rejected_count``)."""
MAX_REJECTED_BLOCKS = 1024
"""Refused blocks one result may detail (a receiver details the first 64)."""
BlockIndex = Annotated[int, Meta(ge=0, le=2**32)]
"""A block's index in a file (a manifest of 2^32 blocks would need 128 GiB of hashes)."""
_LABEL = Annotated[str, Meta(max_length=64, pattern=r"^[a-z0-9_]*\Z")]
"""A refusal reason as a receiver sends it: a counter label (:data:`p2pnode.errors.SyncRejected.REASONS`)."""
_DETAIL = Annotated[str, Meta(max_length=8192, pattern=r"^[^\x00-\x1f\x7f]*\Z")]
"""What a receiver says about a refusal (logged only): no control characters."""


class _Reply(Struct, frozen=True):
    """Base of peers' replies: immutable; unknown fields ignored (a newer peer may add some)."""


class BlockRefusal(_Reply, frozen=True):
    """One refused block of a push result: ``reason`` (a label such as ``bad_block_hash``), ``detail``."""

    reason: _LABEL
    detail: _DETAIL = ""


class PushResult(_Reply, frozen=True):
    """One file's result in a push reply or a data-channel frame (:meth:`p2pnode.sync.ReplicaStore.apply`):
    ``status`` ``have`` (the receiver holds that version), ``committed``, ``need`` (the blocks in ``need`` are
    still missing; ``rejected_blocks`` details up to 64 refused ones, ``rejected_count`` counts them all) or
    ``rejected`` (``reason``, ``detail``). ``path`` ``""`` is a refusal of the whole request."""

    path: PathStr
    status: Literal["have", "committed", "need", "rejected"]
    need: Annotated[list[BlockIndex], Meta(max_length=MAX_NEED)] = []
    reason: _LABEL = ""
    detail: _DETAIL = ""
    rejected_blocks: Annotated[list[BlockRefusal], Meta(max_length=MAX_REJECTED_BLOCKS)] = []
    rejected_count: Annotated[int, Meta(ge=0, le=MAX_NEED)] | None = None


class PushReply(_Reply, frozen=True):
    """A ``POST /sync/push`` reply: msgpack ``{"files": [result, ...]}``."""

    files: Annotated[list[PushResult], Meta(max_length=MAX_PUSH_RESULTS)]


class ChannelFrame(_Reply, frozen=True):
    """A frame a receiver sends on the data channel: ``{ok: true}`` (send the blocks), ``{ok: false, status,
    files: [result]}`` (refused, or ``have``) before the blocks, ``{status, files: [result]}`` after them."""

    ok: bool | None = None
    status: Annotated[int, Meta(ge=100, le=599)] = 200
    files: Annotated[list[PushResult], Meta(max_length=MAX_PUSH_RESULTS)] = []


class _ListedFile(Struct, frozen=True):
    """One file of a peer's ``GET /sync/manifest`` reply, as far as retention reads it (other fields ignored)."""

    path: PathStr
    root: Annotated[str, Meta(pattern=r"^[0-9a-f]{64}\Z")]


class _Listing(Struct, frozen=True):
    files: Annotated[list[_ListedFile], Meta(max_length=MAX_LISTING_FILES)]


_RECEIPTS = msgspec.msgpack.Decoder(Annotated[list[Receipt], Meta(max_length=MAX_RECEIPTS_REPLY)])
_LISTING = msgspec.json.Decoder(_Listing)
_PUSH_REPLY = msgspec.msgpack.Decoder(PushReply)
_FRAME = msgspec.msgpack.Decoder(ChannelFrame)


def _reply(decoder: msgspec.msgpack.Decoder[T] | msgspec.json.Decoder[T], body: bytes | bytearray | memoryview,
           what: str) -> T:
    """``body`` through ``decoder``; raises :class:`SyncReplyRejected` (``reply_oversized``, ``reply_malformed``,
    ``reply_invalid``) naming ``what`` and, for a bad field, its place (``$.files[0].need[3]``)."""
    if len(body) > MAX_SYNC_REPLY_BYTES:
        raise SyncReplyRejected("reply_oversized", f"{what}: {len(body)} bytes > {MAX_SYNC_REPLY_BYTES}")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise SyncReplyRejected("reply_invalid", f"{what}: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise SyncReplyRejected("reply_malformed", f"{what}: {exc}") from None
    except RecursionError:  # msgspec skips an unknown field's value recursively: nesting deeper than it goes
        raise SyncReplyRejected("reply_malformed", f"{what}: nested too deep") from None


def _refusals_name_a_reason(results: list[PushResult], what: str) -> list[PushResult]:
    """The rules a result's fields do not carry alone: a refusal names its reason."""
    for i, r in enumerate(results):
        if r.status == "rejected" and not r.reason:
            raise SyncReplyRejected("reply_invalid", f"{what}: $.files[{i}] is rejected without a reason")
    return results


def decode_push_reply(body: bytes | bytearray | memoryview) -> list[PushResult]:
    """A peer's ``POST /sync/push`` reply (msgpack ``{"files": [result, ...]}``, see :class:`PushResult`): the
    per-file results. Raises :class:`SyncReplyRejected` (``reply_malformed``, ``reply_invalid``,
    ``reply_oversized``)."""
    return _refusals_name_a_reason(_reply(_PUSH_REPLY, body, "push reply").files, "push reply")


def check_push_results(results: list[PushResult], offered: Mapping[str, int]) -> list[PushResult]:
    """``results`` (of a push reply or a data-channel frame) when each names a file that was offered (``offered``:
    path -> its block count; ``""`` refuses the whole request) and asks only for blocks inside it. Raises
    :class:`SyncReplyRejected` (``reply_invalid``): the whole reply is refused, once."""
    for i, r in enumerate(results):
        if not r.path:
            continue
        blocks = offered.get(r.path)
        if blocks is None:
            raise SyncReplyRejected("reply_invalid", f"$.files[{i}]: a result for {r.path!r}, not offered")
        if r.need and max(r.need) >= blocks:
            raise SyncReplyRejected("reply_invalid", f"$.files[{i}].need: a block beyond the {blocks} of {r.path!r}")
    return results


def decode_channel_frame(body: bytes | bytearray | memoryview) -> ChannelFrame:
    """A frame's body from a peer's data channel (its length already read and bounded), see
    :class:`ChannelFrame`. Raises :class:`SyncReplyRejected` (``reply_malformed``, ``reply_invalid``)."""
    frame = _reply(_FRAME, body, "data-channel frame")
    _refusals_name_a_reason(frame.files, "data-channel frame")
    return frame


def decode_receipts(body: bytes | bytearray | memoryview) -> list[tuple[str, int, bytes]]:
    """A peer's ``GET /sync/receipts`` reply (msgpack ``[[path, size, root], ...]``: paths of at most 1,024 characters
    without control characters, sizes 0..2^62, 32-byte roots). Raises :class:`SyncReplyRejected`
    (``reply_malformed``, ``reply_invalid``, ``reply_oversized``)."""
    return [tuple(r) for r in _reply(_RECEIPTS, body, "receipt list")]


def decode_listing(body: bytes | bytearray | memoryview) -> dict[str, bytes]:
    """A peer's ``GET /sync/manifest`` reply (JSON ``{"files": [{"path", "root" (64 hex), ...}]}``) as
    ``{path: root (32 bytes)}``. Raises :class:`SyncReplyRejected` (``reply_malformed``, ``reply_invalid``,
    ``reply_oversized``)."""
    return {f.path: bytes.fromhex(f.root) for f in _reply(_LISTING, body, "listing").files}


def unix_seconds(text: str) -> float | None:
    """``text`` as Unix seconds when it is 1-11 ASCII digits with an optional fraction of 1-9 digits (a header
    such as ``x-p2pnode-sync-time``), else None: ``float()`` would also take ``٣``, ``1_0``, ``nan`` and ``1e3``."""
    if not _SECONDS.match(text):
        return None
    return float(text)


def warm_type_info() -> tuple[int, list[str]]:
    """Build msgspec's type information of every :class:`msgspec.Struct` class loaded now, in the calling thread.
    Returns ``(built, refused)``: how many classes took it, and the names of those msgspec cannot decode (a field
    of a type it does not support, such as a runner's live process handle; they are never decoded).

    Why: msgspec (0.22) builds a Struct class's type information on the class's first decode or convert, and
    publishes it on the class before it is complete (the build runs Python code, ``typing`` evaluating
    annotations, so the GIL passes to other threads meanwhile). A second thread that decodes the same class in
    that window follows a NULL type node and the whole process dies of SIGSEGV, with no Python traceback. An
    agent died so under load: a worker thread summarised the job history (a ``convert`` to
    :class:`p2pnode.scheduler.UsageEntry`) while another thread decoded the same type for the first time
    (``bench/msgspec_first_use_race.py`` reproduces it with two threads on fresh classes). Once built, the
    information is read-only and safe from any thread. So the agent calls this once at start, in its event loop
    thread before any worker thread exists; classes defined later (a plugin's) are built on first use as before.
    """
    built, refused = 0, []
    seen: set[type] = set()
    stack: list[type] = [Struct]
    while stack:
        subclasses: list[type] = stack.pop().__subclasses__()
        for cls in subclasses:
            if cls in seen:
                continue
            seen.add(cls)
            stack.append(cls)
            try:
                msgspec.msgpack.Decoder(cls)
            except Exception:  # noqa: BLE001 - an unsupported field type, an unresolved forward reference
                refused.append(f"{cls.__module__}.{cls.__qualname__}")
            else:
                built += 1
    return built, refused
