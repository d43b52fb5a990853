"""Checkpoints, every node's side (issue 41): :class:`CheckpointBoard` knows each config's newest trusted
checkpoint and the members that hold it (a trio driver; the fetch of one is :mod:`._ckfetch`)."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import trio

from ..node._ckproof import placement_prover
from ..synccore import (
    AssignmentBook,
    CheckpointRef,
    CheckpointRefused,
    CheckpointTrust,
    NewestCheckpoint,
    decode_signed_checkpoint,
    newest_checkpoint,
)
from ..synccore._checkpoints import MAX_CHECKPOINT_REFS, Order
from ..synccore._ckholding import HOLDER_BACKOFF_S
from ._checkpoints import MAX_SIGNED_FETCH_BYTES, published_refs, read_limited

__all__ = ["CheckpointBoard"]

log = logging.getLogger(__name__)


# -- every node: the newest trusted checkpoint of each config ------------------------------------------------------
MAX_BOARD_FETCHES_PER_PASS = 4
BOARD_FETCHES_PER_MEMBER = 1
"""Refs one listing member's list may put in a pass (review M3)."""
BOARD_FETCH_DEADLINE_S = 15.0
"""One signed checkpoint's fetch from one member at most (seconds), whatever the request timeout: a member that
does not answer holds the pass no longer."""
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
        self.fetches: Counter[str] = Counter()
        """What checkpoint fetches (:class:`~._ckfetch.CheckpointFetch`, its ``totals``) refused or fell back
        from, summed: ``bad_block``, ``bad_hashes``, ``cut_off``, ``unreachable``, ``channel_refused_<status>``,
        ``channel_unreachable``, ``channel_failed``, ``channel_http_fallbacks``."""
        self._turn = 0
        """Which listing member goes first in the next pass (:meth:`wanted`)."""

    def _key_of(self, node_id: str) -> bytes | None:
        m = self.ctx.member(node_id)
        return m.key if m is not None else None

    def _leader_key(self, term: int) -> bytes | None:
        leader = self.leader_of_term(term)
        return self._key_of(leader) if leader is not None else None

    def refs_by_member(self) -> dict[str, list[CheckpointRef]]:
        """Each member's published refs (its ``sync.checkpoints``), this node's own included."""
        return published_refs(self.ctx)

    def wanted(self, refs: Mapping[str, list[CheckpointRef]],
               now: float) -> list[tuple[CheckpointRef, list[str]]]:
        """Refs to fetch at ``now``, each with the members that list it (those not its origin first): per config,
        those newer than its newest accepted one, not tried within the backoff. A ref's claims are the listing
        member's word, so no member's refs may crowd out another's (review M3): the listing members take turns
        (round-robin, the first one rotating each pass), each at most :data:`BOARD_FETCHES_PER_MEMBER` a pass, each
        member's own refs ordered by (its origin is the node a plan this node verified placed that job on, newest
        first); at most :data:`MAX_BOARD_FETCHES_PER_PASS` in all."""
        listed: dict[bytes, tuple[CheckpointRef, list[str]]] = {}
        for member, rs in refs.items():
            for r in rs[:MAX_CHECKPOINT_REFS]:
                listed.setdefault(r.digest, (r, []))[1].append(member)
        newest: dict[str, Order] = {}
        for body in self.trust.accepted.values():
            newest[body.config] = max(newest.get(body.config, (-1, -1, -1)), body.order)
        per_member: dict[str, list[CheckpointRef]] = {}
        for d, (r, ms) in listed.items():
            if (d not in self.trust.accepted and self.tried.get(d, -math.inf) <= now
                    and r.order > newest.get(r.config, (-1, -1, -1))):
                for m in ms:
                    per_member.setdefault(m, []).append(r)
        for rs in per_member.values():
            rs.sort(key=lambda r: (self.trust.assignments.node_of(r.config, r.job_id) == r.origin, r.order),
                    reverse=True)
        members = sorted(per_member)
        if members:
            k = self._turn % len(members)
            members = members[k:] + members[:k]
        self._turn += 1
        out: list[tuple[CheckpointRef, list[str]]] = []
        taken: set[bytes] = set()
        for _ in range(BOARD_FETCHES_PER_MEMBER):
            for m in members:
                pick = next((r for r in per_member[m] if r.digest not in taken), None)
                if pick is not None and len(out) < MAX_BOARD_FETCHES_PER_PASS:
                    taken.add(pick.digest)
                    origin = pick.origin
                    out.append((pick, sorted(listed[pick.digest][1], key=lambda x: (x == origin, x))))
        return out

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
                    status, data = 0, b""
                    with trio.move_on_after(min(self.timeout_s, BOARD_FETCH_DEADLINE_S)):
                        status, data = await read_limited(self.ctx.client, f"http://{m.addr}{target}",
                                                          timeout_s=self.timeout_s,
                                                          headers=self.sign_read("GET", target, member),
                                                          limit=MAX_SIGNED_FETCH_BYTES)
                    if status != 200:
                        raise CheckpointRefused("malformed", f"HTTP {status}")
                    sc, body = decode_signed_checkpoint(data)
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
        bytes, holders), the refusals counted by reason, and what this node's checkpoint fetches refused or fell back
        from (:attr:`fetches`)."""
        configs = sorted({b.config for b in self.trust.accepted.values()})
        out: dict[str, Any] = {}
        for c in configs:
            n = self.newest(c)
            if n is not None:
                out[c] = {"job_id": n.body.job_id, "seq": n.body.seq, "name": n.body.name, "origin": n.body.origin,
                          "bytes": n.body.size, "digest": n.digest.hex(), "holders": list(n.holders)}
        return {"newest": out, "refused": dict(self.trust.refused), "fetch_failures": self.fetch_failures,
                "fetches": dict(sorted(self.fetches.items()))}
