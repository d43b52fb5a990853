"""Checkpoints (issue 41): the origin's side (:class:`CheckpointOrigin`, blocking I/O, run in a worker thread by the
sync pass): the complete checkpoints of the trainings running on this node, signed and kept for members to fetch;
and the durable holder's side (:class:`CheckpointHolder`, a trio driver). Every node's board of the newest trusted
checkpoint per config, and the fetch of one, are in :mod:`._ckfetch`.

Each pass, for each job of this node that is a leader's placement of a config whose template declares a checkpoint
dir (:class:`CheckpointJob`: one training per config runs in the cluster, so the dir's new entries are that job's),
the dir is listed (entries, and each directory's non-hidden regular files, at most
:data:`~p2pnode.synccore._checkpoints.MAX_CHECKPOINT_FILES`) and handed to the pure
:class:`~p2pnode.synccore.CheckpointDetector`. An entry it finds complete waits until sync has a manifest of every
file of it at the size the listing saw (the files are synced whatever ``sync.globs`` says,
:meth:`~._source.LocalFiles.set_checkpoint_globs`); it is then described by a
:class:`~p2pnode.synccore.CheckpointBody` (config, job id, sequence, this node, entry name, each file's size, block
size and manifest root), signed with the node's key, written to ``<state_dir>/checkpoints/<digest>.ck`` (tmp file,
rename) and listed in :attr:`CheckpointOrigin.refs`, newest first, at most
:data:`~p2pnode.synccore._checkpoints.KEPT_PER_CONFIG` (3, the default ``guard.checkpoint_keep``) per config and
:data:`~p2pnode.synccore._checkpoints.MAX_CHECKPOINT_REFS` in all (older signed files are removed).

Which entries were announced, and with which job and sequence, is kept in ``<state_dir>/checkpoints.json`` per
config and dir (the newest :data:`MAX_ANNOUNCED` names each), so a restarted agent, or the next job of the config
on this node, never announces an entry twice; an entry that was already in the dir when the state was lost is
announced as the current job's. A bad state file is dropped and counted (:mod:`p2pnode.statefiles`), never a
reason not to start.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import httpx
import msgspec
import trio
from msgspec import Meta

from .._files import atomic_write_bytes
from ..node._ckproof import gang_writer
from ..snapshot import JobReport, SyncSection, plan_job_id
from ..statefiles import decode_entry, read_json_file, report_for
from ..synccore import (
    CheckpointBody,
    CheckpointDetector,
    CheckpointFile,
    CheckpointHolding,
    CheckpointRef,
    CheckpointRefused,
    CheckpointTrust,
    DirEntry,
    Manifest,
    SignedCheckpoint,
    decode_signed_checkpoint,
    encode_signed_checkpoint,
    sign_checkpoint,
)
from ..synccore._checkpoints import (
    COMPLETE_MARKER,
    KEPT_PER_CONFIG,
    MAX_CHECKPOINT_FILES,
    MAX_CHECKPOINT_REFS,
    Completed,
)

__all__ = ["MAX_ANNOUNCED", "MAX_SIGNED_FETCH_BYTES", "MAX_WAITING_PER_ORIGIN", "CheckpointHolder", "CheckpointJob",
           "CheckpointOrigin", "checkpoint_file_of", "checkpoint_writers"]

log = logging.getLogger(__name__)

MAX_ANNOUNCED = 256
"""Entry names remembered per checkpoint dir (the newest by sequence)."""
MAX_DIRS = 256
"""Checkpoint dirs remembered in the state file."""
MAX_DIRS_PER_JOB = 16
"""Dirs one job's checkpoint dir pattern may match (a template whose dir names a parameter)."""
STATE_FILE = "checkpoints.json"


class CheckpointJob(msgspec.Struct, frozen=True):
    """A job of this node whose checkpoints are announced: its ``job_id`` (a leader's placement ``<term>-<seq>``),
    ``config`` and checkpoint ``dir`` relative to the sync root (rendered, :meth:`CheckpointSpec.render_dir`)."""

    job_id: str
    config: str
    dir: str


def checkpoint_writers(running: Iterable[JobReport]) -> list[tuple[str, str]]:
    """``(job_id, config)`` of the jobs of this node's running list (``running``) whose checkpoint dirs are announced
    (:meth:`CheckpointOrigin.pass_for`): every job but a gang member of rank above 0 (a gang's checkpoints are its
    rank-0 member's: :func:`p2pnode.node._ckproof.gang_writer`; the files another rank writes there are synced as
    any file, never signed as a checkpoint)."""
    return [(j.job_id, j.config) for j in running if gang_writer(j.gang)]


class _Announced(msgspec.Struct, frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=255)]
    job_id: Annotated[str, Meta(min_length=1, max_length=128)]
    seq: Annotated[int, Meta(ge=1, le=2**53)]


class _DirState(msgspec.Struct, frozen=True):
    config: Annotated[str, Meta(min_length=1, max_length=64)]
    dir: Annotated[str, Meta(min_length=1, max_length=256)]
    announced: Annotated[list[_Announced], Meta(max_length=MAX_ANNOUNCED)] = []


class CheckpointOrigin:
    """The origin's side (module docstring) for the sync root ``root``: ``state_dir`` holds the state file and the
    signed checkpoints; ``node_id`` and ``sign`` (the node key's ``sign(data) -> 64 bytes``) sign them;
    ``settle_s``: how long an entry must stay unchanged (:class:`~p2pnode.synccore.CheckpointDetector`)."""

    def __init__(self, *, root: Path, state_dir: Path, node_id: str, sign: Callable[[bytes], bytes],
                 settle_s: float) -> None:
        self.root = Path(root)
        self.state_dir = Path(state_dir)
        self.signed_dir = self.state_dir / "checkpoints"
        self.signed_dir.mkdir(parents=True, exist_ok=True)
        self.node_id = node_id
        self.sign = sign
        self.settle_s = settle_s
        self.detectors: dict[tuple[str, str, str], CheckpointDetector] = {}
        """(config, dir, job id) -> its detector."""
        self.announced: dict[tuple[str, str], dict[str, tuple[str, int]]] = {}
        """(config, dir) -> entry name -> (job id, seq)."""
        self.waiting: dict[tuple[str, str, str], list[Completed]] = {}
        """Complete entries whose files sync has no manifest of yet."""
        self.refs: list[CheckpointRef] = []
        """This node's signed checkpoints, newest first (:data:`MAX_CHECKPOINT_REFS`)."""
        self.signed: dict[bytes, bytes] = {}
        """digest -> the encoded signed checkpoint, for :attr:`refs`."""
        self.refused: dict[str, int] = {}
        self.proof_of: Callable[[str], bytes] = lambda job_id: b""
        """The placement proof of a job (the agent sets it: job control's
        :meth:`~p2pnode.jobs._controlfetch.ControlFetches.placement_proof`), attached to its checkpoints."""
        self._load()

    # -- state ----------------------------------------------------------------------------------------------
    def _load(self) -> None:
        report = report_for(self.state_dir.parent)
        raw = read_json_file(self.state_dir / STATE_FILE, file=f".sync/{STATE_FILE}", report=report)
        if not isinstance(raw, list):
            return
        for i, item in enumerate(raw[:MAX_DIRS]):
            try:
                d = decode_entry(item, _DirState)
            except ValueError as exc:
                report.drop(f".sync/{STATE_FILE}", "bad_entry", f"[{i}]: {exc}")
                continue
            self.announced[(d.config, d.dir)] = {a.name: (a.job_id, a.seq) for a in d.announced}
        for p in self.signed_dir.glob("*.ck"):  # signed before a restart: listed again
            self._hold_file(p)
        self._trim()

    def _hold_file(self, p: Path) -> None:
        try:
            sc, body = decode_signed_checkpoint(p.read_bytes())
        except (OSError, CheckpointRefused):
            p.unlink(missing_ok=True)
            return
        if body.origin != self.node_id:
            p.unlink(missing_ok=True)
            return
        self._hold(sc, body)

    def _save(self) -> None:
        dirs = [_DirState(c, d, [_Announced(n, j, s) for n, (j, s) in
                                 sorted(names.items(), key=lambda kv: kv[1][1])[-MAX_ANNOUNCED:]])
                for (c, d), names in list(self.announced.items())[-MAX_DIRS:]]
        atomic_write_bytes(self.state_dir / STATE_FILE, msgspec.json.encode(dirs))

    # -- a pass ---------------------------------------------------------------------------------------------
    def scan(self, jobs: Iterable[CheckpointJob], manifests: Mapping[str, Manifest], now: float) -> list[bytes]:
        """One pass (blocking): list each job's dir, announce and sign what became complete and has manifests
        (``manifests``: sync's manifest of each file by path relative to the root); ``now``: monotonic seconds.
        Returns the digests signed in this pass."""
        out: list[bytes] = []
        changed = False
        live = set()
        for job in jobs:
            key = (job.config, job.dir, job.job_id)
            live.add(key)
            names = self.announced.setdefault((job.config, job.dir), {})
            det = self.detectors.get(key)
            if det is None:
                seqs = {n: s for n, (j, s) in names.items() if j == job.job_id}
                det = self.detectors[key] = CheckpointDetector(settle_s=self.settle_s, announced=seqs)
                for n, (j, _) in names.items():  # another job's entries: never this one's
                    if j != job.job_id:
                        det.announced.setdefault(n, 0)
            for c in det.observe(self._list(job.dir), now):
                names[c.name] = (job.job_id, c.seq)
                changed = True
                self.waiting.setdefault(key, []).append(c)
            still = []
            for c in self.waiting.get(key, []):
                digest = self._sign(job, c, manifests)
                if digest is None:
                    still.append(c)
                elif digest:
                    out.append(digest)
            self.waiting[key] = still
        for gone in set(self.detectors) - live:
            del self.detectors[gone]
            self.waiting.pop(gone, None)
        if changed:
            self._save()
        return out

    def pass_for(self, running: Iterable[tuple[str, str]], dirs: Iterable[tuple[str, str]],
                 manifests: Mapping[str, Manifest], now: float) -> list[bytes]:
        """:meth:`scan` for this node's running jobs (``(job_id, config)``; only a leader's placements are
        announced) and the catalog's checkpoint dirs (``(config, dir)``, a ``*`` standing for a parameter's value:
        the existing dirs that match, at most :data:`MAX_DIRS_PER_JOB`). Blocking."""
        by_config: dict[str, list[str]] = {}
        for config, d in dirs:
            by_config.setdefault(config, []).append(d)
        jobs: list[CheckpointJob] = []
        for job_id, config in running:
            if plan_job_id(job_id) is None:
                continue
            for d in by_config.get(config, []):
                found = [d] if "*" not in d else sorted(
                    p.relative_to(self.root).as_posix() for p in itertools.islice(self.root.glob(d), MAX_DIRS_PER_JOB)
                    if p.is_dir() and not p.is_symlink())
                jobs.extend(CheckpointJob(job_id, config, x) for x in found)
        return self.scan(jobs, manifests, now)

    def next_deadline(self) -> float | None:
        """When an entry seen but not settled settles (monotonic seconds), or None."""
        return min((d for d in (det.next_deadline() for det in self.detectors.values()) if d is not None),
                   default=None)

    def _list(self, rel: str) -> list[DirEntry]:
        base = self.root / rel
        out: list[DirEntry] = []
        try:
            it = list(os.scandir(base))
        except OSError:
            return out
        for e in it:
            if e.name.startswith("."):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out.append(DirEntry(e.name, (("", st.st_size, st.st_mtime_ns),)))
            elif stat.S_ISDIR(st.st_mode):
                files = self._files_of(Path(e.path))
                if files is not None:
                    out.append(DirEntry(e.name, files, is_dir=True,
                                        marker=os.path.lexists(os.path.join(e.path, COMPLETE_MARKER))))
        return out

    def _files_of(self, d: Path) -> tuple[tuple[str, int, int], ...] | None:
        """The non-hidden regular files under ``d`` (path relative to it, size, mtime), or None when there are more
        than :data:`MAX_CHECKPOINT_FILES` (never a checkpoint)."""
        files: list[tuple[str, int, int]] = []
        for dirpath, dirs, names in os.walk(d):
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            for n in names:
                if n.startswith("."):
                    continue
                p = os.path.join(dirpath, n)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    files.append((os.path.relpath(p, d).replace(os.sep, "/"), st.st_size, st.st_mtime_ns))
                if len(files) > MAX_CHECKPOINT_FILES:
                    return None
        return tuple(sorted(files))

    def _sign(self, job: CheckpointJob, c: Completed, manifests: Mapping[str, Manifest]) -> bytes | None:
        """The digest of ``c`` signed (b"": never signable, dropped), or None while sync lacks a manifest."""
        files = []
        for path, size in c.files:
            rel = f"{job.dir}/{c.name}" + (f"/{path}" if path else "")
            m = manifests.get(rel)
            if m is None or m.size != size:
                return None
            files.append(CheckpointFile(path, m.size, m.block_size, m.root))
        try:
            body = CheckpointBody(job.config, job.job_id, c.seq, self.node_id, job.dir, c.name, tuple(files))
            sc = sign_checkpoint(self.sign, body, self.proof_of(job.job_id))
        except (CheckpointRefused, msgspec.ValidationError) as exc:
            reason = getattr(exc, "reason", "malformed")
            self.refused[reason] = self.refused.get(reason, 0) + 1
            log.warning("checkpoint %s/%s of job %s is not announced: %s", job.dir, c.name, job.job_id, exc)
            return b""
        atomic_write_bytes(self.signed_dir / f"{sc.digest.hex()}.ck", encode_signed_checkpoint(sc))
        self._hold(sc, body)
        self._trim()
        return sc.digest

    def _hold(self, sc: SignedCheckpoint, body: CheckpointBody) -> None:
        if sc.digest in self.signed:
            return
        self.signed[sc.digest] = encode_signed_checkpoint(sc)
        self.refs.append(CheckpointRef(body.config, body.job_id, body.seq, body.origin, sc.digest))

    def _trim(self) -> None:
        """Keep the newest :data:`KEPT_PER_CONFIG` of each config, :data:`MAX_CHECKPOINT_REFS` in all."""
        self.refs.sort(key=lambda r: r.order, reverse=True)
        per: dict[str, int] = {}
        keep: list[CheckpointRef] = []
        for r in self.refs:
            per[r.config] = per.get(r.config, 0) + 1
            if per[r.config] <= KEPT_PER_CONFIG and len(keep) < MAX_CHECKPOINT_REFS:
                keep.append(r)
            else:
                self.signed.pop(r.digest, None)
                (self.signed_dir / f"{r.digest.hex()}.ck").unlink(missing_ok=True)
        self.refs = keep

    def signed_bytes(self, digest: bytes) -> bytes | None:
        """The encoded signed checkpoint ``digest`` this node holds (served to members), or None."""
        return self.signed.get(digest)


# -- the durable holder's side ----------------------------------------------------------------------------------
MAX_SIGNED_FETCH_BYTES = 1 << 20
"""A signed checkpoint read from a member at most (its body and placement proof are bounded below this)."""
MAX_WAITING_PER_ORIGIN = 8
"""Checkpoints of one origin a holder keeps waiting for their files at most (:attr:`CheckpointHolder.waiting`): one
origin listing many cannot take the room of the others'."""


def published_refs(ctx: Any) -> dict[str, list[CheckpointRef]]:
    """Each live member's published checkpoint refs (its signed ``sync.checkpoints``, this node's own included),
    by member id; members that list none are left out."""
    out: dict[str, list[CheckpointRef]] = {}
    for m in ctx.members(live=True):
        sec = ctx.section(m.origin, SyncSection)
        if sec is not None and sec.checkpoints:
            out[m.origin] = list(sec.checkpoints)
    return out


async def read_limited(client: httpx.AsyncClient, url: str, *, timeout_s: float, headers: Mapping[str, str],
                       limit: int) -> tuple[int, bytes]:
    """``GET url``: its status and body, read as a stream and refused past ``limit`` bytes (``OSError``, before
    more is read: review M2). Raises ``httpx.HTTPError`` too."""
    async with client.stream("GET", url, timeout=timeout_s, headers=headers) as resp:
        if resp.status_code != 200:
            return resp.status_code, b""
        buf = bytearray()
        async for chunk in resp.aiter_bytes(64 * 1024):
            buf += chunk
            if len(buf) > limit:
                raise OSError(f"more than {limit} bytes")
        return resp.status_code, bytes(buf)


class CheckpointHolder:
    """A durable node's side (issue 41; the rules are :class:`~p2pnode.synccore.CheckpointHolding`'s): each pass it
    fetches ``GET /sync/checkpoint?digest=`` from the origins that list a checkpoint whose files it keeps replicas
    of, holds those it verifies whole under ``<state_dir>/held-checkpoints/`` (read back and checked again at start),
    lists them in its snapshot and serves them. ``store``: the replica store; ``trust``: the node's
    :class:`~p2pnode.synccore.CheckpointTrust` (the board's: a checkpoint is held only once trusted);
    ``sign_read(method, target,
    receiver)``: headers of a member's signed read (None: none)."""

    def __init__(self, ctx: Any, store: Any, state_dir: Path, *, timeout_s: float, trust: CheckpointTrust,
                 sign_read: Callable[[str, str, str], dict[str, str]] | None = None) -> None:
        self.ctx = ctx
        self.store = store
        self.dir = Path(state_dir) / "held-checkpoints"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self.sign_read = sign_read or (lambda method, target, receiver: {})
        self.book = CheckpointHolding(trust)
        self.pending: dict[bytes, tuple[SignedCheckpoint, CheckpointBody]] = {}
        """Held before a restart, not checkable yet (:meth:`load`)."""
        self.waiting: dict[bytes, tuple[SignedCheckpoint, CheckpointBody, CheckpointRef]] = {}
        """Fetched and trusted, but a file is not a replica here yet (``incomplete``: the origin lists a checkpoint as
        soon as it signs it, usually before its files arrive): offered again at each pass while its origin lists it
        (a pass runs when one of its files is committed here: :meth:`awaits`), not fetched again; at most
        :data:`MAX_WAITING_PER_ORIGIN` per origin and :data:`MAX_CHECKPOINT_REFS` in all. Without it the ref waited out
        the holder's 30 s backoff, and a node holding a stop for this confirmation (issue 41) its next checkpoint."""
        self._waiting_at: dict[tuple[str, str], set[bytes]] = {}  # (origin, entry path) -> digests waiting there
        self._waiting_of: dict[str, int] = {}  # origin -> entries waiting
        self.fetch_failures = 0

    def awaits(self, origin: str, path: str) -> bool:
        """Whether a checkpoint :attr:`waiting` for its files has ``origin``'s ``path`` among them (a file under its
        entry, or the entry itself): a commit of that replica may complete it. O(depth of ``path``)."""
        if not self._waiting_at:
            return False
        parts = path.split("/")
        return any((origin, "/".join(parts[:i])) in self._waiting_at for i in range(1, len(parts) + 1))

    def _wait(self, sc: SignedCheckpoint, body: CheckpointBody, ref: CheckpointRef) -> None:
        """Keep ``sc`` in :attr:`waiting` (within the caps: else it is dropped, asked again after the backoff)."""
        if (sc.digest in self.waiting or len(self.waiting) >= MAX_CHECKPOINT_REFS
                or self._waiting_of.get(body.origin, 0) >= MAX_WAITING_PER_ORIGIN):
            return
        self.waiting[sc.digest] = (sc, body, ref)
        self._waiting_at.setdefault((body.origin, f"{body.dir}/{body.name}"), set()).add(sc.digest)
        self._waiting_of[body.origin] = self._waiting_of.get(body.origin, 0) + 1

    def _unwait(self, digest: bytes) -> None:
        """Drop ``digest`` from :attr:`waiting` and its indexes."""
        _, body, _ = self.waiting.pop(digest)
        key = (body.origin, f"{body.dir}/{body.name}")
        self._waiting_at[key].discard(digest)
        if not self._waiting_at[key]:
            del self._waiting_at[key]
        self._waiting_of[body.origin] -= 1
        if not self._waiting_of[body.origin]:
            del self._waiting_of[body.origin]

    def replica(self, origin: str, path: str) -> tuple[int, bytes] | None:
        """``(size, root)`` of the replica of ``origin``'s ``path`` held here, or None."""
        r = self.store.index.get((origin, path))
        if r is None:
            return None
        try:
            return int(r["size"]), bytes.fromhex(r["root"])
        except (KeyError, TypeError, ValueError):
            return None

    def load(self) -> None:
        """Read back the checkpoints held before a restart (blocking); each is checked again (:meth:`recheck`).
        One whose placement cannot be checked yet (``unknown_placement``: who led its term is learnt from the
        cluster after a restart) or whose replicas are not all here yet stays on disk, and is offered again each
        pass; any other is removed."""
        for p in sorted(self.dir.glob("*.ck"))[: 2 * MAX_CHECKPOINT_REFS]:
            try:
                sc, body = decode_signed_checkpoint(p.read_bytes())
            except (OSError, CheckpointRefused):
                p.unlink(missing_ok=True)
                continue
            self.pending[sc.digest] = (sc, body)
        self.recheck(0.0)
        self._sync_files()

    def recheck(self, now: float) -> bool:
        """Offer the checkpoints read back at start again; True when one is held now."""
        changed = False
        for digest, (sc, body) in list(self.pending.items()):
            m = self.ctx.member(body.origin)
            why = self.book.offer(sc, body, ref=None, origin_key=m.key if m is not None else None,
                                  replica=self.replica, now=now)
            if why == "held":
                changed = True
            if why not in ("unknown_placement", "incomplete"):
                del self.pending[digest]
        return changed

    def _sync_files(self) -> None:
        keep = {d.hex() for d in self.book.held} | {d.hex() for d in self.pending}
        for p in self.dir.glob("*.ck"):
            if p.stem not in keep:
                p.unlink(missing_ok=True)

    def refs_by_member(self) -> dict[str, list[CheckpointRef]]:
        """Each live member's published checkpoint refs (its ``sync.checkpoints``)."""
        return published_refs(self.ctx)

    async def pass_once(self) -> bool:
        """One pass: drop what retention took, fetch and hold what the origins list. True when what this node
        holds changed (publish)."""
        now = self.ctx.now()
        changed = bool(self.book.refresh(self.replica)) | (self.recheck(now) if self.pending else False)
        origins = {o for o, _ in list(self.store.index)}
        refs = self.refs_by_member()
        changed |= await self._offer_waiting(refs, now)
        for ref in self.book.wanted(refs, origins.__contains__, now):
            m = self.ctx.member(ref.origin)
            if m is None or not m.addr:
                self.book.failed(ref, now)
                continue
            target = f"/sync/checkpoint?digest={ref.digest.hex()}"
            try:
                status, data = await read_limited(self.ctx.client, f"http://{m.addr}{target}",
                                                  timeout_s=self.timeout_s,
                                                  headers=self.sign_read("GET", target, ref.origin),
                                                  limit=MAX_SIGNED_FETCH_BYTES)
                if status != 200:
                    raise CheckpointRefused("malformed", f"HTTP {status}")
                sc, body = decode_signed_checkpoint(data)
            except (httpx.HTTPError, OSError, CheckpointRefused) as exc:
                self.fetch_failures += 1
                self.book.failed(ref, now)
                log.info("sync: checkpoint %s from %s not fetched: %s", ref.digest.hex(), ref.origin[:16], exc)
                continue
            why = self.book.offer(sc, body, ref=ref, origin_key=m.key, replica=self.replica, now=now)
            if why == "held":
                await trio.to_thread.run_sync(atomic_write_bytes, self.dir / f"{sc.digest.hex()}.ck",
                                              encode_signed_checkpoint(sc))
                changed = True
            elif why == "incomplete":
                self._wait(sc, body, ref)
        if changed:
            await trio.to_thread.run_sync(self._sync_files)
        return changed

    async def _offer_waiting(self, refs: Mapping[str, Iterable[CheckpointRef]], now: float) -> bool:
        """Offer again each checkpoint :attr:`waiting` for its files whose origin still lists it (the others are
        dropped); True when one is held now (its signed file written)."""
        listed = {r.digest for origin, rs in refs.items() for r in rs if r.origin == origin}
        changed = False
        for digest, (sc, body, ref) in list(self.waiting.items()):
            m = self.ctx.member(body.origin)
            if digest not in listed or m is None or digest in self.book.held:
                self._unwait(digest)
                continue
            why = self.book.offer(sc, body, ref=ref, origin_key=m.key, replica=self.replica, now=now)
            if why == "incomplete":
                continue
            self._unwait(digest)
            if why == "held":
                await trio.to_thread.run_sync(atomic_write_bytes, self.dir / f"{digest.hex()}.ck",
                                              encode_signed_checkpoint(sc))
                changed = True
        return changed

    def signed_bytes(self, digest: bytes) -> bytes | None:
        """The encoded signed checkpoint ``digest`` held here, or None."""
        held = self.book.held.get(digest)
        return encode_signed_checkpoint(held[0]) if held is not None else None


def checkpoint_file_of(holder: CheckpointHolder | None, origin: CheckpointOrigin | None, root: Path, digest: bytes,
                       index: int) -> tuple[Path, str, int, int] | None:
    """``GET /sync/checkpoint/file``: where file ``index`` of checkpoint ``digest`` is read on this node (a replica
    held whole, or the origin's own file) as ``(base, rel, size, block_size)``: the trusted directory it lies
    beneath, its path relative to it (opened by :func:`p2pnode._files.open_beneath`, never following a symlink),
    its signed size and block size; None when this node holds no such checkpoint."""
    if holder is not None and digest in holder.book.held:
        _, body = holder.book.held[digest]
        if index < len(body.files):
            f = body.files[index]
            return holder.store.held.replicas / body.origin, body.path_of(f), f.size, f.block_size
    if origin is not None and origin.signed_bytes(digest) is not None:
        _, body = decode_signed_checkpoint(origin.signed[digest])
        if index < len(body.files):
            f = body.files[index]
            return root, body.path_of(f), f.size, f.block_size
    return None


def checkpoint_hashes_of(holder: CheckpointHolder | None, digest: bytes, index: int) -> bytes | None:
    """``GET /sync/checkpoint/file?part=hashes`` on a durable holder: the block hashes of file ``index`` of
    checkpoint ``digest`` as its replica index kept them at the replica's commit (no second hashing of the file),
    when they are of the signed size, block size and root; else None (the route hashes the file). Blocking: the
    index hashes a replica it has no manifest of. The reader checks them against the signed root and each block
    against them, so bytes spoiled on disk since the commit are refused block by block (``bad_block``)."""
    if holder is None or digest not in holder.book.held:
        return None
    _, body = holder.book.held[digest]
    if index >= len(body.files):
        return None
    f = body.files[index]
    m = holder.store.held.replica_manifest(body.origin, body.path_of(f), f.block_size)
    if m is None or m.size != f.size or m.block_size != f.block_size or m.root != f.root:
        return None
    return m.hashes
