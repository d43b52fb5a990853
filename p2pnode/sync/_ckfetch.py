"""Checkpoints, every node's side (issue 41): :class:`CheckpointBoard` knows each config's newest trusted
checkpoint and the members that hold it; :class:`CheckpointFetch` fetches one from its holders (trio drivers; the
origin's and the durable holder's sides are :mod:`._checkpoints`)."""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import trio

from ..node._ckproof import placement_prover
from ..snapshot import SyncSection
from ..synccore import (
    AssignmentBook,
    CheckpointFile,
    CheckpointRef,
    CheckpointRefused,
    CheckpointTrust,
    NewestCheckpoint,
    decode_signed_checkpoint,
    hash_file,
    newest_checkpoint,
)
from ..synccore._checkpoints import COMPLETE_MARKER, HOLDER_BACKOFF_S, MAX_CHECKPOINT_REFS, Order
from ._checkpoints import MAX_SIGNED_FETCH_BYTES

__all__ = ["CheckpointBoard", "CheckpointFetch"]

log = logging.getLogger(__name__)


# -- every node: the newest trusted checkpoint of each config ------------------------------------------------------
MAX_BOARD_FETCHES_PER_PASS = 4
MAX_TRIED = 4096


class CheckpointBoard:
    """What every node knows of the cluster's checkpoints (issue 41): per config, the newest checkpoint it trusts
    and the members that hold it (:func:`~p2pnode.synccore.newest_checkpoint`). Each pass it fetches the signed
    checkpoint of refs newer than the newest it accepted (from a member that lists it, durable holders first) and
    offers it to :attr:`trust` (:class:`~p2pnode.synccore.CheckpointTrust`: the placement by the leader-signed
    proof, checked with the key of that term's leader, ``leader_of_term``; the origin's signature; the floor).
    ``config_of_template``: the catalog's config of a template name, ``trains_template``: whether a template's
    placements prove its config's checkpoints (:func:`p2pnode.node._ckproof.trains`; both set by the agent)."""

    def __init__(self, ctx: Any, *, timeout_s: float, leader_of_term: Callable[[int], str | None],
                 sign_read: Callable[[str, str, str], dict[str, str]] | None = None) -> None:
        self.ctx = ctx
        self.timeout_s = timeout_s
        self.sign_read = sign_read or (lambda method, target, receiver: {})
        self.config_of_template: Callable[[str], str | None] = lambda name: None
        self.trains_template: Callable[[str], bool] = lambda name: False
        self.trust = CheckpointTrust(AssignmentBook(), self._key_of, prove=placement_prover(
            self._leader_key, lambda name: self.config_of_template(name), lambda name: self.trains_template(name)))
        self.leader_of_term = leader_of_term
        self.tried: dict[bytes, float] = {}
        """Digest -> when it may be tried again (fetched and refused, or not fetched: :data:`HOLDER_BACKOFF_S` later;
        a refusal may end, e.g. once this node learns who led a term). At most :data:`MAX_TRIED`."""
        self.fetch_failures = 0

    def _key_of(self, node_id: str) -> bytes | None:
        m = self.ctx.member(node_id)
        return m.key if m is not None else None

    def _leader_key(self, term: int) -> bytes | None:
        leader = self.leader_of_term(term)
        return self._key_of(leader) if leader is not None else None

    def refs_by_member(self) -> dict[str, list[CheckpointRef]]:
        """Each member's published refs (its ``sync.checkpoints``), this node's own included."""
        out: dict[str, list[CheckpointRef]] = {}
        for m in self.ctx.members(live=True):
            sec = self.ctx.section(m.origin, SyncSection)
            if sec is not None and sec.checkpoints:
                out[m.origin] = list(sec.checkpoints)
        return out

    def wanted(self, refs: Mapping[str, list[CheckpointRef]],
               now: float) -> list[tuple[CheckpointRef, list[str]]]:
        """Refs to fetch at ``now``, each with the members that list it (those not its origin first): per config,
        those newer than its newest accepted one, not tried within the backoff; newest first, at most
        :data:`MAX_BOARD_FETCHES_PER_PASS`."""
        listed: dict[bytes, tuple[CheckpointRef, list[str]]] = {}
        for member, rs in refs.items():
            for r in rs[:MAX_CHECKPOINT_REFS]:
                listed.setdefault(r.digest, (r, []))[1].append(member)
        newest: dict[str, Order] = {}
        for body in self.trust.accepted.values():
            newest[body.config] = max(newest.get(body.config, (-1, -1, -1)), body.order)
        out = [(r, sorted(ms, key=lambda m: (m == r.origin, m))) for d, (r, ms) in listed.items()
               if d not in self.trust.accepted and self.tried.get(d, -math.inf) <= now
               and r.order > newest.get(r.config, (-1, -1, -1))]
        out.sort(key=lambda x: x[0].order, reverse=True)
        return out[:MAX_BOARD_FETCHES_PER_PASS]

    async def pass_once(self) -> int:
        """One pass: fetch and offer what :meth:`wanted` names. Returns how many were accepted."""
        accepted = 0
        now = self.ctx.now()
        for ref, members in self.wanted(self.refs_by_member(), now):
            self.tried[ref.digest] = now + HOLDER_BACKOFF_S
            if len(self.tried) > MAX_TRIED:
                self.tried = {d: t for d, t in self.tried.items() if t > now}
            for member in members:
                m = self.ctx.member(member)
                if m is None or not m.addr:
                    continue
                target = f"/sync/checkpoint?digest={ref.digest.hex()}"
                try:
                    resp = await self.ctx.client.get(f"http://{m.addr}{target}", timeout=self.timeout_s,
                                                     headers=self.sign_read("GET", target, member))
                    if resp.status_code != 200 or len(resp.content) > MAX_SIGNED_FETCH_BYTES:
                        raise CheckpointRefused("malformed", f"HTTP {resp.status_code}")
                    sc, body = decode_signed_checkpoint(resp.content)
                    if sc.digest != ref.digest:
                        raise CheckpointRefused("malformed", "not the checkpoint the ref names")
                except (httpx.HTTPError, OSError, CheckpointRefused) as exc:
                    self.fetch_failures += 1
                    log.info("sync: checkpoint %s from %s not fetched: %s", ref.digest.hex(), member[:16], exc)
                    continue
                try:
                    self.trust.accept(sc, body)
                    accepted += 1
                except CheckpointRefused as exc:
                    log.warning("sync: checkpoint %s of %s refused: %s", ref.digest.hex(), body.config, exc)
                break
        return accepted

    def newest(self, config: str) -> NewestCheckpoint | None:
        """The newest trusted checkpoint of ``config`` and its holders now (:func:`newest_checkpoint`)."""
        return newest_checkpoint(config, self.refs_by_member(), self.trust)

    def view(self) -> dict[str, Any]:
        """``GET /sync/status`` ``checkpoints``: per config, the newest trusted checkpoint (job, sequence, name,
        bytes, holders), and the refusals counted by reason."""
        configs = sorted({b.config for b in self.trust.accepted.values()})
        out: dict[str, Any] = {}
        for c in configs:
            n = self.newest(c)
            if n is not None:
                out[c] = {"job_id": n.body.job_id, "seq": n.body.seq, "name": n.body.name, "origin": n.body.origin,
                          "bytes": n.body.size, "digest": n.digest.hex(), "holders": list(n.holders)}
        return {"newest": out, "refused": dict(self.trust.refused), "fetch_failures": self.fetch_failures}


# -- the fetch: a checkpoint's files from its holders ------------------------------------------------------------
FETCH_CHUNK_BYTES = 1 << 20


class CheckpointFetch:
    """Fetches one trusted checkpoint (``newest``: its body and holders) into ``dest_dir`` (issue 41, item 3's
    transfer; the decision and the job's start are not wired yet). Each file is read from a holder
    (``GET /sync/checkpoint/file``) into ``<dest_dir>/.partial/<digest>/<index>``, resumed from the bytes already
    there, then hashed with its block size: kept only when its manifest root is the one the signed body names (every
    block hash is bound by it), else removed and read from the next holder (counted in :attr:`refused`). When all
    are in, they are renamed to ``<dest_dir>/<entry name>`` (a directory entry gets its ``.complete`` marker).
    ``progress(done_bytes, total_bytes)`` is called as bytes arrive."""

    def __init__(self, ctx: Any, newest: NewestCheckpoint, dest_dir: Path, *, timeout_s: float,
                 sign_read: Callable[[str, str, str], dict[str, str]] | None = None,
                 progress: Callable[[int, int], None] = lambda done, total: None) -> None:
        self.ctx = ctx
        self.newest = newest
        self.dest_dir = Path(dest_dir)
        self.partial = self.dest_dir / ".partial" / newest.digest.hex()
        self.timeout_s = timeout_s
        self.sign_read = sign_read or (lambda method, target, receiver: {})
        self.progress = progress
        self.refused: Counter[str] = Counter()
        self.bytes_fetched = 0

    async def run(self) -> Path:
        """Fetch every file, then put the checkpoint in place; its path. Raises ``OSError`` when no holder gave a
        file that verifies."""
        body = self.newest.body
        await trio.to_thread.run_sync(functools.partial(self.partial.mkdir, parents=True, exist_ok=True))
        total = body.size
        done_before = 0
        for i, f in enumerate(body.files):
            part = self.partial / str(i)
            await self._fetch_file(i, f, part, total, done_before)
            done_before += f.size
        return await trio.to_thread.run_sync(self._place)

    async def _fetch_file(self, index: int, f: CheckpointFile, part: Path, total: int, done_before: int) -> None:
        for holder in self.newest.holders:
            m = self.ctx.member(holder)
            if m is None or not m.addr:
                continue
            try:
                await self._read_from(m.addr, holder, index, f, part, total, done_before)
            except (httpx.HTTPError, OSError) as exc:
                self.refused["unreachable"] += 1
                log.info("sync: checkpoint file %d from %s: %s", index, holder[:16], exc)
                continue
            if await trio.to_thread.run_sync(self._verifies, part, f):
                return
            self.refused["bad_root"] += 1
            log.warning("sync: checkpoint file %d from %s does not match its signed root: fetched again elsewhere",
                        index, holder[:16])
            part.unlink(missing_ok=True)
        raise OSError(f"no holder of checkpoint {self.newest.digest.hex()} gave file {index} whole")

    async def _read_from(self, addr: str, holder: str, index: int, f: CheckpointFile, part: Path, total: int,
                         done_before: int) -> None:
        have = part.stat().st_size if part.exists() else 0
        if have > f.size:
            part.unlink()
            have = 0
        if have == f.size:
            return
        target = f"/sync/checkpoint/file?digest={self.newest.digest.hex()}&file={index}&offset={have}"
        async with self.ctx.client.stream("GET", f"http://{addr}{target}", timeout=self.timeout_s,
                                          headers=self.sign_read("GET", target, holder)) as resp:
            if resp.status_code != 200:
                raise OSError(f"HTTP {resp.status_code}")
            with open(part, "ab") as out:
                async for chunk in resp.aiter_bytes(FETCH_CHUNK_BYTES):
                    if have + len(chunk) > f.size:
                        raise OSError("more bytes than the signed size")
                    await trio.to_thread.run_sync(out.write, chunk)
                    have += len(chunk)
                    self.bytes_fetched += len(chunk)
                    self.progress(done_before + have, total)
                await trio.to_thread.run_sync(os.fsync, out.fileno())
        if have != f.size:
            raise OSError(f"{have} of {f.size} bytes")

    @staticmethod
    def _verifies(part: Path, f: CheckpointFile) -> bool:
        try:
            return hash_file(part, block_size=f.block_size).root == f.root
        except OSError:
            return False

    def _place(self) -> Path:
        body = self.newest.body
        dest = self.dest_dir / body.name
        if len(body.files) == 1 and body.files[0].path == "":
            os.replace(self.partial / "0", dest)
        else:
            tmp = self.dest_dir / f".{body.name}.placing"
            shutil.rmtree(tmp, ignore_errors=True)
            for i, f in enumerate(body.files):
                p = tmp / f.path
                p.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.partial / str(i), p)
            (tmp / COMPLETE_MARKER).write_bytes(b"")
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
        shutil.rmtree(self.partial, ignore_errors=True)
        return dest
