"""Checkpoints that follow their training (issue 41, item 2): which entries of a job's checkpoint dir are complete,
their signed identity, whose checkpoints a node trusts, and which one is a config's newest. Pure (msgspec, blake3,
:mod:`p2pnode.identity` for signatures); no clock, no file: the driver lists the dir and hands the listing in.

**Complete.** :class:`CheckpointDetector` is fed listings of one job's checkpoint dir (:class:`DirEntry`: a file, or
a directory with its files). A hidden entry (``.name``) or one ending in ``.tmp``/``.partial`` is being written and
never counts. A directory is complete once it holds a ``.complete`` marker, and never without one (review M5: a
sharded save that pauses between files would settle with its first files only); a file once its signature (size
and mtime) is unchanged over listings at least ``settle_s`` apart: a file that appeared by an atomic rename
qualifies after the settle time, one still being written in place waits. An entry
that changes after it was announced is not announced again (a checkpoint is written once). Entries that become
complete in one listing get sequence numbers in name order.

**Identity.** A complete entry is described by a :class:`CheckpointBody` (config, the job id of the leader's
placement ``<term>-<seq>``, the checkpoint's ``seq`` within that job, the origin node, its dir, the entry's name, each
file's size, block size and manifest root, which binds every block hash), encoded with msgpack and signed by the
origin's node key: a :class:`SignedCheckpoint` ``{body, sig}``. Its :attr:`~SignedCheckpoint.digest` (BLAKE3 of the
body, 16 bytes) names it in the small :class:`CheckpointRef` a node publishes for each checkpoint it holds.

**Order.** :meth:`CheckpointBody.order` is ``(term, placement seq, seq)`` from the job id and the body, never a
file time: a later placement's first checkpoint is newer than every checkpoint of an earlier one.

**Trust.** A checkpoint is usually a pickle, and loading one runs code. :class:`AssignmentBook` records, from the
leader's signed plans a node verified, which node each ``<term>-<seq>`` placement of a config's checkpointing
template went to. A node sees only its own part of each plan, so the origin attaches the leader-signed part that
placed the job on it (the **placement proof**, :attr:`SignedCheckpoint.proof`); :class:`CheckpointTrust` has the
driver's ``prove`` check it with the key of that term's leader and records what it shows.
:class:`CheckpointTrust` accepts a checkpoint only when its job id is such a placement of its config on its
origin node and the origin's signature verifies, and only when it is not older than the config's floor (the
newest checkpoint this node resumed from, persisted by the driver): a checkpoint offered by another node, or an
older one replayed, is refused and counted (:data:`CHECKPOINT_REFUSALS`) and never fetched. Two different bodies
signed for the same ``(job id, seq)`` are a ``conflict``: neither is chosen. Only a placement of a template that
trains the config with a checkpoint proves anything (``not_training`` otherwise). A node keeps the newest
:data:`KEPT_ACCEPTED_PER_CONFIG` accepted bodies of a config (and the floor's), and its conflicts within them.

**Newest.** :func:`newest_checkpoint` takes every member's published refs and picks, per config, the newest one
whose signed body this node accepted, with the members that hold it (its verified replicas). :func:`resume_from`
says whether a node given a config's training starts at once (nothing newer than what it holds) or fetches first
(:class:`FetchCheckpoint`, with the bytes it needs, counted against free disk before the fetch).

=====================  ===========================================================================================
``malformed``          the signed checkpoint or its body does not decode (a field missing, wrong type, out of bounds)
``bad_path``           the entry name or a file's path is not a safe relative path
``bad_manifest``       a file's block size is not a power of two up to the block maximum
``not_placement``      the job id is not a leader's placement ``<term>-<seq>`` (autonomous work, a one-off run)
``unknown_placement``  no signed plan this node verified placed that job id for that config
``not_training``       the plan placed that job id for a template that does not train the config with a checkpoint
                       (a selfplay or evaluation job of the same config: its files are no checkpoint of the config)
``not_assigned``       the plan placed that job on another node than the checkpoint's origin
``bad_signature``      the origin's key is unknown, or the signature does not verify for it
``stale``              older than the config's floor (a replayed older checkpoint)
``conflict``           another body was signed for the same job id and sequence
``no_space``           its bytes (less what is already here) do not fit the free disk less the reserve
=====================  ===========================================================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated

import blake3
import msgspec
from msgspec import Meta

from ..errors import PathError, PeerError
from ..identity import verify_signature
from ..snapshot import COUNTER_MAX, MAX_CHECKPOINT_REFS, CheckpointRef, PlanJobId, plan_job_id
from ._manifest import MAX_BLOCK_BYTES, check_rel_path

__all__ = [
    "CHECKPOINT_DOMAIN",
    "CHECKPOINT_REFUSALS",
    "KEPT_PER_CONFIG",
    "COMPLETE_MARKER",
    "MAX_CHECKPOINT_FILES",
    "MAX_CHECKPOINT_REFS",
    "AssignmentBook",
    "CheckpointBody",
    "CheckpointDetector",
    "CheckpointFile",
    "CheckpointRef",
    "CheckpointRefused",
    "Completed",
    "CheckpointTrust",
    "DirEntry",
    "FetchCheckpoint",
    "NewestCheckpoint",
    "ProvedPlacement",
    "StartNow",
    "decode_signed_checkpoint",
    "encode_signed_checkpoint",
    "newest_checkpoint",
    "resume_from",
    "sign_checkpoint",
    "SignedCheckpoint",
]

CHECKPOINT_DOMAIN = b"p2pnode checkpoint v1\x00"
COMPLETE_MARKER = ".complete"
MAX_CHECKPOINT_FILES = 4096
"""Files in one checkpoint directory at most (a sharded checkpoint of a large model has hundreds)."""
MAX_SIGNED_CHECKPOINT_BYTES = 512 * 1024
MAX_PROOF_BYTES = 256 * 1024
"""A placement proof at most (a plan part of some 800 assignments); a node with a larger part attaches none."""
MAX_ASSIGNMENTS_PER_CONFIG = 32
"""Placements remembered per config (:class:`AssignmentBook`): the newest by ``(term, seq)``."""
KEPT_PER_CONFIG = 3
"""Checkpoints of one config an origin lists and a holder holds, the newest by order: the default of
``guard.checkpoint_keep`` (the disk manager keeps that many newest in a checkpoint dir; listing more would name
files it may delete)."""
MAX_FILE_BYTES = 2**44  # 16 TiB
CHECKPOINT_REFUSALS = ("malformed", "bad_path", "bad_manifest", "not_placement", "unknown_placement",
                       "not_training", "not_assigned", "bad_signature", "stale", "conflict", "no_space")
_TEMP_SUFFIXES = (".tmp", ".partial")
_ConfigName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")]
_NodeId = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]*\Z")]
_JobId = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")]
_Seq = Annotated[int, Meta(ge=1, le=COUNTER_MAX)]



class ProvedPlacement(msgspec.Struct, frozen=True):
    """One assignment a placement proof shows: ``config``, ``job_id``, the ``node`` it went to, its ``template``
    and whether that template ``trains`` (a fenced template that declares a checkpoint: only its placements prove a
    checkpoint; :func:`p2pnode.node._ckproof.trains`)."""

    config: str
    job_id: str
    node: str
    template: str
    trains: bool


Prove = Callable[[bytes, int], list[ProvedPlacement]]
"""``prove(proof, term)``: the placements a placement proof shows, checked with the key of term ``term``'s leader
(the driver's: :func:`p2pnode.node._ckproof.placement_prover`, the catalog's config and kind of each template); []
when it does not verify. Pure (a signature check), so the core stays sans-IO."""
Order = tuple[int, int, int]
"""``(term, placement seq, checkpoint seq)``: a checkpoint's place in its config's history."""


class CheckpointRefused(PeerError):
    """A checkpoint this node will not accept; ``reason`` is one of :data:`CHECKPOINT_REFUSALS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# -- detection --------------------------------------------------------------------------------------------------
class DirEntry(msgspec.Struct, frozen=True):
    """One entry of a checkpoint dir as the driver listed it: ``name``; ``files``: ``(path, size, mtime_ns)`` of
    each regular file (``path`` "" for a file entry, else relative to the directory, hidden files left out);
    ``marker``: a directory holding :data:`COMPLETE_MARKER`."""

    name: str
    files: tuple[tuple[str, int, int], ...]
    is_dir: bool = False
    marker: bool = False


class Completed(msgspec.Struct, frozen=True):
    """An entry the detector found complete, with its sequence number within the job."""

    name: str
    seq: int
    files: tuple[tuple[str, int], ...]
    """``(path, size)`` of each file, as it was when it settled."""


class CheckpointDetector:
    """Which entries of one job's checkpoint dir are complete (module docstring). ``settle_s``: seconds an entry
    must stay unchanged; ``announced``: entry name -> seq of those announced before (a re-adopted job, read back by
    the driver); the next seq is one above the highest."""

    def __init__(self, *, settle_s: float, announced: Mapping[str, int] | None = None) -> None:
        self.settle_s = settle_s
        self.announced: dict[str, int] = dict(announced or {})
        self.next_seq = max(self.announced.values(), default=0) + 1
        self._seen: dict[str, tuple[tuple[tuple[str, int, int], ...], float]] = {}
        """name -> (signature, when first seen with it) of entries not announced yet."""

    def observe(self, entries: Iterable[DirEntry], now: float) -> list[Completed]:
        """Entries complete as of this listing at ``now`` (monotonic seconds), each once, in name order."""
        out: list[Completed] = []
        present = set()
        for e in sorted(entries, key=lambda e: e.name):
            if e.name.startswith(".") or e.name.endswith(_TEMP_SUFFIXES) or e.name in self.announced:
                continue
            present.add(e.name)
            if not e.files or (e.is_dir and not e.marker):
                continue  # an empty directory, a directory without its marker (being filled), a file that vanished
            sig = tuple(sorted(e.files))
            prev = self._seen.get(e.name)
            if prev is None or prev[0] != sig:
                self._seen[e.name] = (sig, now)
                prev = self._seen[e.name]
            if e.is_dir or now - prev[1] >= self.settle_s:
                self.announced[e.name] = self.next_seq
                out.append(Completed(e.name, self.next_seq, tuple((p, size) for p, size, _ in sig)))
                self.next_seq += 1
                del self._seen[e.name]
        for gone in set(self._seen) - present:
            del self._seen[gone]
        return out

    def next_deadline(self) -> float | None:
        """When an entry seen but not settled settles, if unchanged (monotonic seconds), or None."""
        return min((t + self.settle_s for _, t in self._seen.values()), default=None)


# -- identity ---------------------------------------------------------------------------------------------------
class CheckpointFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One file of a checkpoint: ``path`` ("" for a checkpoint that is one file, else relative to its directory),
    ``size`` bytes, ``block_size`` and manifest ``root`` (:func:`~._manifest.manifest_root`: binds every block hash;
    a fetcher checks the hashes a holder sends against it, then each block against its hash)."""

    path: Annotated[str, Meta(max_length=1024)]
    size: Annotated[int, Meta(ge=0, le=MAX_FILE_BYTES)]
    block_size: Annotated[int, Meta(ge=1, le=MAX_BLOCK_BYTES)]
    root: Annotated[bytes, Meta(min_length=32, max_length=32)]


class CheckpointBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the origin signs (module docstring): ``config``; ``job_id`` of the leader's placement; ``seq`` of the
    checkpoint within that job (1, 2, ...); ``origin`` node id; ``dir``: the job's checkpoint dir relative to the
    origin's sync root; ``name`` of the entry in it (one path component); ``files``."""

    config: _ConfigName
    job_id: _JobId
    seq: _Seq
    origin: _NodeId
    dir: Annotated[str, Meta(min_length=1, max_length=256)]
    name: Annotated[str, Meta(min_length=1, max_length=255)]
    files: Annotated[tuple[CheckpointFile, ...], Meta(min_length=1, max_length=MAX_CHECKPOINT_FILES)]

    def path_of(self, f: CheckpointFile) -> str:
        """The path of ``f`` relative to the origin's sync root (what its replicas are kept under)."""
        return f"{self.dir}/{self.name}" + (f"/{f.path}" if f.path else "")

    @property
    def placement(self) -> PlanJobId | None:
        """The parsed ``<term>-<seq>`` of :attr:`job_id`, or None for any other job id."""
        return plan_job_id(self.job_id)

    @property
    def order(self) -> Order:
        """``(term, placement seq, seq)``; ``(-1, -1, seq)`` for a job id that is no placement (never accepted)."""
        p = self.placement
        return (p.term, p.seq, self.seq) if p is not None else (-1, -1, self.seq)

    @property
    def size(self) -> int:
        """Bytes of all its files."""
        return sum(f.size for f in self.files)


class SignedCheckpoint(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A :class:`CheckpointBody` as its msgpack ``body`` bytes and the origin's Ed25519 ``sig`` over
    :data:`CHECKPOINT_DOMAIN` + ``body``."""

    body: Annotated[bytes, Meta(max_length=MAX_SIGNED_CHECKPOINT_BYTES)]
    sig: Annotated[bytes, Meta(min_length=64, max_length=64)]
    proof: Annotated[bytes, Meta(max_length=MAX_PROOF_BYTES)] = b""
    """The placement proof: the leader-signed plan part that gave the origin the job (msgpack ``[body, sig]``,
    :func:`p2pnode.node._plandist.open_proof`), so that a node that never saw that part can check the placement
    (:class:`CheckpointTrust` ``prove``). Empty: the node must know the placement otherwise."""

    @property
    def digest(self) -> bytes:
        """BLAKE3 of the body, 16 bytes: the checkpoint's name in refs."""
        return blake3.blake3(self.body).digest(length=16)


def _check_body(body: CheckpointBody) -> None:
    if "/" in body.name or body.name.startswith(".") or body.name.endswith(_TEMP_SUFFIXES):
        raise CheckpointRefused("bad_path", f"entry name {body.name[:80]!r}")
    try:
        check_rel_path(body.name)
        check_rel_path(body.dir)
        if any(p.startswith(".") for p in body.dir.split("/")):
            raise PathError(f"hidden component in {body.dir!r}")
        paths = set()
        for f in body.files:
            if f.path:
                check_rel_path(f.path)
                if any(p.startswith(".") for p in f.path.split("/")):
                    raise PathError(f"hidden component in {f.path!r}")
            paths.add(f.path)
    except PathError as exc:
        raise CheckpointRefused("bad_path", str(exc)[:200]) from None
    if len(paths) != len(body.files) or ("" in paths and len(paths) > 1):
        raise CheckpointRefused("bad_path", "a path twice, or a file entry with more than one file")
    for f in body.files:
        if f.block_size & (f.block_size - 1):
            raise CheckpointRefused("bad_manifest", f"block size {f.block_size} is not a power of two")


def sign_checkpoint(sign: Callable[[bytes], bytes], body: CheckpointBody, proof: bytes = b"") -> SignedCheckpoint:
    """``body`` signed by the origin's ``sign(data) -> 64 bytes``, with its placement ``proof`` (b"": none; one over
    :data:`MAX_PROOF_BYTES` is left out). Raises :class:`CheckpointRefused` (``bad_path``, ``bad_manifest``) for a
    body no node would accept."""
    _check_body(body)
    raw = msgspec.msgpack.encode(body)
    return SignedCheckpoint(raw, bytes(sign(CHECKPOINT_DOMAIN + raw)), proof if len(proof) <= MAX_PROOF_BYTES else b"")


def encode_signed_checkpoint(sc: SignedCheckpoint) -> bytes:
    """The msgpack form (served by holders, persisted beside the replica)."""
    return msgspec.msgpack.encode(sc)


_SIGNED = msgspec.msgpack.Decoder(SignedCheckpoint)
_BODY = msgspec.msgpack.Decoder(CheckpointBody)


def decode_signed_checkpoint(data: bytes) -> tuple[SignedCheckpoint, CheckpointBody]:
    """A signed checkpoint and its body from the msgpack form, bounded; checks shape and paths, not the signature
    (:meth:`CheckpointTrust.check`). Raises :class:`CheckpointRefused` (``malformed``, ``bad_path``,
    ``bad_manifest``)."""
    if len(data) > MAX_SIGNED_CHECKPOINT_BYTES + MAX_PROOF_BYTES + 128:
        raise CheckpointRefused("malformed", f"{len(data)} bytes")
    try:
        sc = _SIGNED.decode(data)
        body = _BODY.decode(sc.body)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointRefused("malformed", str(exc)[:200]) from None
    _check_body(body)
    return sc, body


# -- trust ------------------------------------------------------------------------------------------------------
class AssignmentBook:
    """Which node the leader's signed plans placed each ``<term>-<seq>`` job of a config on, and by which template
    (module docstring): fed with the placements of training templates that declare a checkpoint (a placement proof's
    :class:`ProvedPlacement` with ``trains``). Keeps the newest :data:`MAX_ASSIGNMENTS_PER_CONFIG` per config. A job
    id that is no placement is ignored."""

    def __init__(self) -> None:
        self.placed: dict[str, dict[PlanJobId, tuple[str, str]]] = {}
        """config -> placement -> ``(node, template)``."""

    def record(self, config: str, job_id: str, node: str, template: str = "") -> None:
        """The plan placed ``job_id`` of ``config`` on ``node`` by ``template`` (the same job id keeps its first
        node: a job id is placed once)."""
        pid = plan_job_id(job_id)
        if pid is None:
            return
        book = self.placed.setdefault(config, {})
        book.setdefault(pid, (node, template))
        if len(book) > MAX_ASSIGNMENTS_PER_CONFIG:
            for old in sorted(book)[: len(book) - MAX_ASSIGNMENTS_PER_CONFIG]:
                del book[old]

    def node_of(self, config: str, job_id: str) -> str | None:
        """The node ``job_id`` of ``config`` was placed on, or None when no plan seen placed it."""
        pid = plan_job_id(job_id)
        got = self.placed.get(config, {}).get(pid) if pid is not None else None
        return got[0] if got is not None else None

    def template_of(self, config: str, job_id: str) -> str | None:
        """The template ``job_id`` of ``config`` was placed by, or None when no plan seen placed it."""
        pid = plan_job_id(job_id)
        got = self.placed.get(config, {}).get(pid) if pid is not None else None
        return got[1] if got is not None else None


KEPT_ACCEPTED_PER_CONFIG = 4
"""Accepted checkpoint bodies a node keeps per config (the newest by order; the one at the floor besides)."""
MAX_CONFLICTS_PER_CONFIG = 64


def _key_order(k: tuple[str, str, int]) -> Order:
    p = plan_job_id(k[1])
    return (p.term, p.seq, k[2]) if p is not None else (-1, -1, k[2])


class CheckpointTrust:
    """The rules for accepting a config's checkpoint (module docstring). ``assignments``: placements from signed
    plans; ``key_of``: a member's 32-byte public key by node id (None: unknown); ``floors``: the order of the newest
    checkpoint accepted or resumed from per config (persisted by the driver). :attr:`accepted` holds, per digest,
    the bodies accepted; :attr:`refused` counts refusals by reason."""

    def __init__(self, assignments: AssignmentBook, key_of: Callable[[str], bytes | None],
                 floors: Mapping[str, Order] | None = None, prove: Prove | None = None) -> None:
        self.assignments = assignments
        self.key_of = key_of
        self.prove = prove
        self.floors: dict[str, Order] = dict(floors or {})
        self.accepted: dict[bytes, CheckpointBody] = {}
        self._by_key: dict[tuple[str, str, int], bytes] = {}
        self.conflicts: set[tuple[str, str, int]] = set()
        self.refused: Counter[str] = Counter()

    def check(self, sc: SignedCheckpoint, body: CheckpointBody) -> CheckpointBody:
        """``body`` when it may be accepted, else :class:`CheckpointRefused` (counted). Order: placement,
        assignment, signature, conflict, floor, so a member that was not placed learns nothing more."""
        try:
            if body.placement is None:
                raise CheckpointRefused("not_placement", f"job {body.job_id[:40]} is not a leader's placement")
            node = self.assignments.node_of(body.config, body.job_id)
            if node is None and sc.proof and self.prove is not None:
                other = False
                for p in self.prove(sc.proof, body.placement.term):
                    if p.trains:
                        self.assignments.record(p.config, p.job_id, p.node, p.template)
                    elif p.config == body.config and p.job_id == body.job_id:
                        other = True
                node = self.assignments.node_of(body.config, body.job_id)
                if node is None and other:
                    raise CheckpointRefused("not_training", f"{body.job_id} of {body.config} is no training with "
                                                            "a checkpoint")
            if node is None:
                raise CheckpointRefused("unknown_placement", f"no signed plan placed {body.job_id} of {body.config}")
            if node != body.origin:
                raise CheckpointRefused("not_assigned", f"{body.job_id} of {body.config} was placed on {node[:20]}, "
                                                        f"not {body.origin[:20]}")
            key = self.key_of(body.origin)
            if key is None or not verify_signature(key, sc.sig, CHECKPOINT_DOMAIN + sc.body):
                raise CheckpointRefused("bad_signature", f"{body.config} {body.job_id}#{body.seq}")
            k = (body.config, body.job_id, body.seq)
            if k in self.conflicts or self._by_key.get(k, sc.digest) != sc.digest:
                self.conflicts.add(k)
                raise CheckpointRefused("conflict", f"two checkpoints signed as {body.job_id}#{body.seq}")
            floor = self.floors.get(body.config)
            if floor is not None and body.order < floor:
                raise CheckpointRefused("stale", f"{body.order} is older than {floor}")
        except CheckpointRefused as exc:
            self.refused[exc.reason] += 1
            raise
        return body

    def accept(self, sc: SignedCheckpoint, body: CheckpointBody) -> bool:
        """Check (:meth:`check`) and hold ``body`` under its digest. True when new, False when already held.
        Raises :class:`CheckpointRefused`."""
        if sc.digest in self.accepted and (body.config, body.job_id, body.seq) not in self.conflicts:
            return False
        self.check(sc, body)
        self.accepted[sc.digest] = body
        self._by_key[(body.config, body.job_id, body.seq)] = sc.digest
        self._trim(body.config)
        return True

    def _trim(self, config: str) -> None:
        """Keep :data:`KEPT_ACCEPTED_PER_CONFIG` accepted bodies of ``config`` (the newest by order) and the one at
        its floor; the conflicts of the config older than the oldest kept go too, and at most
        :data:`MAX_CONFLICTS_PER_CONFIG` stay (review M4: a placed origin minting ever newer checkpoints holds no
        more memory here). An older one dropped is never fetched again (only newer refs are asked for)."""
        mine = sorted(((b.order, d) for d, b in self.accepted.items() if b.config == config), reverse=True)
        floor = self.floors.get(config)
        for order, d in mine[KEPT_ACCEPTED_PER_CONFIG:]:
            if order != floor:
                b = self.accepted.pop(d)
                if self._by_key.get((b.config, b.job_id, b.seq)) == d:
                    del self._by_key[(b.config, b.job_id, b.seq)]
        kept = [o for o, _ in mine[:KEPT_ACCEPTED_PER_CONFIG]]
        oldest = kept[-1] if len(kept) == KEPT_ACCEPTED_PER_CONFIG else None
        mine_c = sorted(((_key_order(k), k) for k in self.conflicts if k[0] == config), reverse=True)
        for i, (order, k) in enumerate(mine_c):
            if i >= MAX_CONFLICTS_PER_CONFIG or (oldest is not None and order < oldest):
                self.conflicts.discard(k)

    def resumed(self, body: CheckpointBody) -> None:
        """This node holds ``body`` now (fetched, or its own): the config's floor rises to its order, so nothing
        older is fetched again."""
        if body.order > self.floors.get(body.config, (-1, -1, -1)):
            self.floors[body.config] = body.order


# -- newest, and what a node given the training does -------------------------------------------------------------
class NewestCheckpoint(msgspec.Struct, frozen=True):
    """A config's newest accepted checkpoint: its ``digest``, ``body`` and the members that publish it
    (``holders``, sorted)."""

    digest: bytes
    body: CheckpointBody
    holders: tuple[str, ...]


def newest_checkpoint(config: str, refs: Mapping[str, Iterable[CheckpointRef]],
                      trust: CheckpointTrust) -> NewestCheckpoint | None:
    """The newest checkpoint of ``config`` that ``trust`` accepted (by :attr:`CheckpointBody.order`, never a file
    time) among those members publish (``refs``: member -> its refs, at most :data:`MAX_CHECKPOINT_REFS` each are
    read), with the members that hold it; None when there is none. A ref is only a pointer: the body and its
    trust come from :attr:`CheckpointTrust.accepted`, whatever the ref claims."""
    holders: dict[bytes, set[str]] = {}
    for member, rs in refs.items():
        for i, r in enumerate(rs):
            if i >= MAX_CHECKPOINT_REFS:
                break
            if r.config == config:
                holders.setdefault(r.digest, set()).add(member)
    best: tuple[Order, bytes] | None = None
    for digest in holders:
        body = trust.accepted.get(digest)
        if body is None or body.config != config or (body.config, body.job_id, body.seq) in trust.conflicts:
            continue
        if best is None or (body.order, digest) > best:
            best = (body.order, digest)
    if best is None:
        return None
    return NewestCheckpoint(best[1], trust.accepted[best[1]], tuple(sorted(holders[best[1]])))


class StartNow(msgspec.Struct, frozen=True):
    """Start the job at once: ``reason`` says why no fetch (``no_checkpoint``, ``held``: the newest is here)."""

    reason: str
    resume_digest: bytes | None = None
    """The checkpoint already held here to resume from (None: start from nothing)."""


class FetchCheckpoint(msgspec.Struct, frozen=True):
    """Fetch ``newest`` from its holders first (``need_bytes`` more bytes on this disk), then start the job."""

    newest: NewestCheckpoint
    need_bytes: int


def resume_from(config: str, refs: Mapping[str, Iterable[CheckpointRef]], trust: CheckpointTrust, *, me: str,
                have_bytes: int = 0, free_bytes: int | None = None,
                reserve_bytes: int = 0) -> StartNow | FetchCheckpoint:
    """What a node given ``config``'s training does before starting it (issue 41, item 2): :class:`StartNow` when
    no accepted checkpoint exists or the newest is one this node publishes itself (``me`` among its holders), else
    :class:`FetchCheckpoint`. ``have_bytes``: bytes of it already here (a resumed fetch); ``free_bytes``: free disk
    where it lands (None: not checked), ``reserve_bytes`` what the guard keeps free. Raises
    :class:`CheckpointRefused` (``no_space``, counted) when it does not fit."""
    newest = newest_checkpoint(config, refs, trust)
    if newest is None:
        return StartNow("no_checkpoint")
    if me in newest.holders:
        return StartNow("held", newest.digest)
    need = max(0, newest.body.size - have_bytes)
    if free_bytes is not None and need > free_bytes - reserve_bytes:
        trust.refused["no_space"] += 1
        raise CheckpointRefused("no_space", f"{need} bytes, {free_bytes} free less a reserve of {reserve_bytes}")
    return FetchCheckpoint(newest, need)
