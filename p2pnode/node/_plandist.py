"""Plans and running-job lists beside the snapshot: what the leader serves, what a node fetches, how both are
checked. Pure (no sockets, no trio; time passed in).

The plan does not travel in the leader's snapshot (which must stay within ``max_snapshot_bytes`` for any fleet
size): the snapshot carries a :class:`~p2pnode.snapshot.PlanRef` (term, seq, digest, counts). Then:

* **a node's part** (``GET /plan/part?node=ID``, msgpack ``[body, sig]``): the node's assignments and stops
  (:func:`part_of`), stamped with the whole plan's term, seq and digest, signed by the leader's Ed25519 key
  (:func:`seal_part`). The node accepts it (:func:`open_part`) only with a valid signature of the key of the member
  it sees elected, for itself, and of the term of that leader's signed ref, with the ref's digest or a seq at
  least the ref's: a part cannot be forged, taken from another node's or replayed from an earlier plan with other
  content (a part of an earlier seq with the same digest holds the same jobs, so a node refetches its part only when
  the plan's content changed; a later seq is the leader's newer plan of the same term, which it may serve before
  its ref reached this node). Its size depends on the node's jobs, not on the fleet.
* **the whole plan** (``GET /plan?format=msgpack``): for a new leader carrying over its predecessor's plan and
  for operators. Checked by recomputing its digest against the signed ref (:func:`open_whole`).
* **a node's running jobs** beyond :data:`~p2pnode.snapshot.INLINE_RUNNING` (``GET /jobs/running``, msgpack):
  checked against the ``running_digest`` of the node's signed snapshot (:func:`open_running`).

:class:`Fetches` decides when a node fetches (a new ref, retries with backoff) so a driver only moves the bytes.
Every decoder here is bounded and raises only :class:`p2pnode.errors.RejectedMessage`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import msgspec

from ..errors import RejectedMessage, RejectReason
from ..identity import SIGNATURE_BYTES, Identity, verify_signature
from ..snapshot import JobReport, PlanRef, PlanSection, running_digest

__all__ = ["MAX_PART_BYTES", "MAX_RUNNING_BYTES", "MAX_WHOLE_BYTES", "Fetches", "open_part", "open_proof",
           "open_running", "open_whole", "part_of", "part_version", "seal_part"]

MAX_PART_BYTES = 4 * 2**20
"""A node's signed part, at most (4,096 assignments of ~300 bytes with room)."""
MAX_WHOLE_BYTES = 64 * 2**20
"""A whole plan document, at most (65,536 assignments)."""
MAX_RUNNING_BYTES = 4 * 2**20
"""A node's running-job list, at most."""
_PART_CONTEXT = b"p2pnode plan part v1\x00"
"""Domain separation: a part signature can never be taken for a snapshot or request signature."""

_ENC = msgspec.msgpack.Encoder()
_PLAN = msgspec.msgpack.Decoder(PlanSection)
_SEALED = msgspec.msgpack.Decoder(tuple[bytes, bytes])
_RUNNING = msgspec.msgpack.Decoder(list[JobReport])


def _decode(decoder: msgspec.msgpack.Decoder[Any], data: bytes, limit: int, what: str) -> Any:
    if len(data) > limit:
        raise RejectedMessage(RejectReason.OVERSIZED, f"{what}: {len(data)} bytes > {limit}")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise RejectedMessage(RejectReason.BAD_TYPE, f"{what}: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RejectedMessage(RejectReason.MALFORMED, f"{what}: {exc}") from None


def _matches(p: PlanSection, ref: PlanRef) -> bool:
    """``p`` is the plan ``ref`` names (a seq up to it with the same content), or a later plan of the same term:
    the leader plans faster than its ref spreads, and a later plan of the term it was elected in is its newest
    will, not a replay. An earlier plan with other content is refused."""
    return p.term == ref.term and (p.seq >= ref.seq or p.digest == ref.digest)


def part_version(ref: PlanRef) -> str:
    """The version of a node's part of plan ``ref``: its term and digest (a new seq with the same content is the
    same part)."""
    return f"{ref.term}/{ref.digest}"


def part_of(p: PlanSection, node_id: str) -> PlanSection:
    """``node_id``'s part of the whole plan ``p``: its assignments and stops, the whole plan's term, seq, digest
    and time, no pending list."""
    return PlanSection(term=p.term, seq=p.seq, digest=p.digest, at=p.at, node=node_id,
                       assignments=[j for j in p.assignments if j.node == node_id],
                       stops=[s for s in p.stops if s.node == node_id])


def seal_part(identity: Identity, part: PlanSection) -> bytes:
    """The signed part: msgpack ``[body, sig]``, ``sig`` the leader's Ed25519 signature over a context string
    and ``body`` (the msgpack part)."""
    body = _ENC.encode(part)
    return _ENC.encode((body, identity.sign(_PART_CONTEXT + body)))


def open_part(data: bytes, *, leader_key: bytes, ref: PlanRef, node_id: str) -> PlanSection:
    """Check and decode a signed part fetched from the leader (see module docstring). ``leader_key``: the 32-byte
    public key of the member this node sees elected; ``ref``: that leader's current plan ref.

    Raises :class:`RejectedMessage`: ``oversized``, ``malformed``, ``bad_type``, ``bad_signature`` (not signed
    by ``leader_key``), ``stale`` (another term, an earlier seq with other content, or another node's part)."""
    body, sig = _decode(_SEALED, data, MAX_PART_BYTES, "plan part")
    if len(sig) != SIGNATURE_BYTES or not verify_signature(leader_key, sig, _PART_CONTEXT + body):
        raise RejectedMessage(RejectReason.BAD_SIGNATURE, "plan part not signed by the leader")
    part: PlanSection = _decode(_PLAN, body, MAX_PART_BYTES, "plan part")
    if not _matches(part, ref) or part.node != node_id:
        raise RejectedMessage(RejectReason.STALE, f"plan part of term {part.term} seq {part.seq} for "
                              f"{part.node!r}; the leader's ref is term {ref.term} seq {ref.seq}")
    if any(j.node != node_id for j in part.assignments) or any(s.node != node_id for s in part.stops):
        raise RejectedMessage(RejectReason.BAD_TYPE, "plan part holds another node's jobs")
    return part


def open_proof(data: bytes, *, leader_key: bytes, max_bytes: int = MAX_PART_BYTES) -> PlanSection:
    """A signed part as a **placement proof** (issue 41): the part a node received, attached to what it signs later
    (a checkpoint), shows a third node that the leader whose key is ``leader_key`` placed those jobs on that node
    in the part's term. Checks the signature and that every job is the part's node's; not against a current ref
    (the proof outlives its plan). ``max_bytes``: a bound below :data:`MAX_PART_BYTES` where the proof travels
    in a smaller message. Raises :class:`RejectedMessage` as :func:`open_part`."""
    body, sig = _decode(_SEALED, data, max_bytes, "placement proof")
    if len(sig) != SIGNATURE_BYTES or not verify_signature(leader_key, sig, _PART_CONTEXT + body):
        raise RejectedMessage(RejectReason.BAD_SIGNATURE, "placement proof not signed by that term's leader")
    part: PlanSection = _decode(_PLAN, body, max_bytes, "placement proof")
    if not part.node or any(j.node != part.node for j in part.assignments):
        raise RejectedMessage(RejectReason.BAD_TYPE, "placement proof holds another node's jobs")
    return part


def open_whole(data: bytes, ref: PlanRef) -> PlanSection:
    """Decode a whole plan fetched from its leader and check it against ``ref`` (the leader's signed ref): its
    term, seq and digest, and the digest recomputed over its assignments, stops and gang table. Raises
    :class:`RejectedMessage` (``oversized``, ``malformed``, ``bad_type``, ``stale``, ``bad_signature`` when the
    content does not hash to the signed digest)."""
    from ..snapshot import plan_digest

    p: PlanSection = _decode(_PLAN, data, MAX_WHOLE_BYTES, "plan")
    if (p.term, p.digest) != (ref.term, ref.digest) or p.node:
        raise RejectedMessage(RejectReason.STALE, f"plan of term {p.term} seq {p.seq}; ref term {ref.term} seq "
                              f"{ref.seq}")
    if plan_digest(p.assignments, p.stops, p.gangs) != ref.digest:
        raise RejectedMessage(RejectReason.BAD_SIGNATURE, "plan content does not match the signed digest")
    return p


def open_running(data: bytes, digest: str) -> list[JobReport]:
    """Decode a node's running-job list and check it against the ``running_digest`` of its signed snapshot.
    Raises :class:`RejectedMessage` (``oversized``, ``malformed``, ``bad_type``, ``stale`` when it hashes to
    another digest: the node's list changed since, or it is not what the node signed)."""
    running: list[JobReport] = _decode(_RUNNING, data, MAX_RUNNING_BYTES, "running jobs")
    if running_digest(running) != digest:
        raise RejectedMessage(RejectReason.STALE, "running jobs do not match the signed digest")
    return running


def _kind(key: object) -> str:
    """The kind of document ``key`` names: its first item when a tuple (``("running", origin)``), else itself."""
    return str(key[0]) if isinstance(key, tuple) and key else str(key)


class Fetches(msgspec.Struct):
    """When to fetch a document named by a digest, per source (sans-IO; times are monotonic seconds).

    :meth:`due` says whether ``key`` (e.g. ``(leader, "part")``) should be fetched for ``digest`` now: when it is
    not the digest already held and no fetch of it failed within the backoff (``retry_s`` doubling up to
    ``max_retry_s``). The driver calls :meth:`started`, then :meth:`done` or :meth:`failed`. Counters:
    ``fetched``, ``failed_by_reason``, and per kind of document (the first item of a tuple key, e.g. ``"running"``)
    ``fetched_by_kind`` and ``failed_by_kind`` (kind -> reason -> count)."""

    retry_s: float = 0.5
    max_retry_s: float = 10.0
    held: dict[object, str] = msgspec.field(default_factory=dict)
    _busy: set[object] = msgspec.field(default_factory=set)
    # key -> (digest, until, next)
    _backoff: dict[object, tuple[str, float, float]] = msgspec.field(default_factory=dict)
    fetched: int = 0
    failed_by_reason: dict[str, int] = msgspec.field(default_factory=dict)
    fetched_by_kind: dict[str, int] = msgspec.field(default_factory=dict)
    failed_by_kind: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)

    def due(self, key: object, digest: str, now: float) -> bool:
        """Whether to fetch ``key`` at ``digest`` now."""
        if not digest or self.held.get(key) == digest or key in self._busy:
            return False
        b = self._backoff.get(key)
        return b is None or b[0] != digest or now >= b[1]

    def started(self, key: object) -> None:
        """A fetch of ``key`` is under way (no second one until it ends)."""
        self._busy.add(key)

    def done(self, key: object, digest: str) -> None:
        """``key`` at ``digest`` is held now."""
        self._busy.discard(key)
        self._backoff.pop(key, None)
        self.held[key] = digest
        self.fetched += 1
        kind = _kind(key)
        self.fetched_by_kind[kind] = self.fetched_by_kind.get(kind, 0) + 1

    def failed(self, key: object, digest: str, reason: str, now: float) -> None:
        """A fetch of ``key`` at ``digest`` failed (``reason`` counted): retried after the backoff."""
        self._busy.discard(key)
        self.failed_by_reason[reason] = self.failed_by_reason.get(reason, 0) + 1
        by = self.failed_by_kind.setdefault(_kind(key), {})
        by[reason] = by.get(reason, 0) + 1
        prev = self._backoff.get(key)
        wait = min(self.max_retry_s, prev[2] * 2) if prev is not None and prev[0] == digest else self.retry_s
        self._backoff[key] = (digest, now + wait, wait)

    def next_due(self, wants: Iterable[tuple[object, str]]) -> float:
        """When the earliest of ``wants`` (``(key, digest)`` not held, not under way) may be fetched (monotonic
        seconds: the end of its backoff; ``-inf`` when one is due now, ``inf`` when none waits)."""
        due = math.inf
        for key, digest in wants:
            if not digest or self.held.get(key) == digest or key in self._busy:
                continue
            b = self._backoff.get(key)
            due = min(due, b[1] if b is not None and b[0] == digest else -math.inf)
        return due

    def forget(self, key: object) -> None:
        """Drop what is held for ``key`` (its source left)."""
        self.held.pop(key, None)
        self._backoff.pop(key, None)
