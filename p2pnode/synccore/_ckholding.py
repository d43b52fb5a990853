"""Checkpoints a durable node holds whole (issue 41): which signed checkpoints to fetch from their origins, which to
hold (trusted by :class:`~._checkpoints.CheckpointTrust`, every file a replica here) and which to keep. Pure: the
driver (:class:`p2pnode.sync._checkpoints.CheckpointHolder`) fetches and reads its replica index."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from ..identity import verify_signature
from ._checkpoints import (
    CHECKPOINT_DOMAIN,
    KEPT_PER_CONFIG,
    MAX_CHECKPOINT_REFS,
    CheckpointBody,
    CheckpointRef,
    CheckpointRefused,
    CheckpointTrust,
    SignedCheckpoint,
)

__all__ = ["HOLDER_BACKOFF_S", "MAX_HELD_PER_ORIGIN", "CheckpointHolding"]

HOLDER_BACKOFF_S = 30.0
"""A checkpoint a holder could not take (not fetched, or its replicas not all here yet) is asked again after this."""
MAX_FETCHES_PER_PASS = 4
MAX_HELD_PER_ORIGIN = 16
"""Checkpoints one origin's may take of the :data:`MAX_CHECKPOINT_REFS` a holder holds (a trusted trainer of many
configs fills no more)."""


class CheckpointHolding:
    """The checkpoints a durable node holds whole (issue 41): it fetches the signed checkpoint its origin lists, and
    holds it (then lists it in its own snapshot, and serves it) once ``trust`` accepts it
    (:meth:`CheckpointTrust.accept`: the placement proof shows its job id is a training of its config placed on its
    origin, the origin's signature verifies, no conflict, not under the floor) and every file of it is a replica
    here of the same size and manifest root. Pure: the driver fetches and reads its replica index. Only trusted
    checkpoints are held, so only they are ranked: at most :data:`KEPT_PER_CONFIG` per config, at most
    :data:`MAX_HELD_PER_ORIGIN` per origin and :data:`MAX_CHECKPOINT_REFS` in all, each config's newest before any
    config's second newest (review H4: a member that signs bodies for configs it was never placed on evicts
    nothing)."""

    def __init__(self, trust: CheckpointTrust) -> None:
        self.trust = trust
        self.held: dict[bytes, tuple[SignedCheckpoint, CheckpointBody]] = {}
        self.retry_at: dict[bytes, float] = {}
        self.refused: Counter[str] = Counter()

    def wanted(self, refs: Mapping[str, Iterable[CheckpointRef]], has_origin: Callable[[str], bool],
               now: float) -> list[CheckpointRef]:
        """What to fetch now (from each ref's origin): refs a member lists for itself (``refs``: member -> its
        refs) whose origin has replicas here (``has_origin``), not held, not tried within :data:`HOLDER_BACKOFF_S`;
        newest first, at most :data:`MAX_FETCHES_PER_PASS`."""
        out = []
        for member, rs in refs.items():
            for i, r in enumerate(rs):
                if i >= MAX_CHECKPOINT_REFS:
                    break
                if (r.origin == member and r.digest not in self.held and self.retry_at.get(r.digest, 0.0) <= now
                        and has_origin(member)):
                    out.append(r)
        out.sort(key=lambda r: r.order, reverse=True)
        return out[:MAX_FETCHES_PER_PASS]

    def failed(self, ref: CheckpointRef, now: float) -> None:
        """The fetch of ``ref`` failed: asked again after the backoff."""
        self.retry_at[ref.digest] = now + HOLDER_BACKOFF_S
        self._bound()

    def offer(self, sc: SignedCheckpoint, body: CheckpointBody, *, ref: CheckpointRef | None,
              replica: Callable[[str, str], tuple[int, bytes] | None], now: float,
              origin_key: bytes | None = None) -> str:
        """Take a fetched signed checkpoint: ``held``, or why not (counted): ``malformed`` (not what ``ref``
        names), ``bad_signature`` (against ``origin_key`` when given), a :data:`CHECKPOINT_REFUSALS` reason of
        :attr:`trust`, ``incomplete`` (a file is not a replica here at that size and root yet), ``evicted`` (trusted
        but ranked out at once); all but ``held`` are asked again after the backoff. ``replica(origin, path)``:
        ``(size, root)`` of the replica held, or None. ``ref`` None: a checkpoint read back at start (its digest is
        its own)."""
        why = ""
        if ref is not None and (sc.digest != ref.digest or body.origin != ref.origin or body.config != ref.config
                                or body.job_id != ref.job_id or body.seq != ref.seq):
            why = "malformed"
        elif origin_key is not None and not verify_signature(origin_key, sc.sig, CHECKPOINT_DOMAIN + sc.body):
            why = "bad_signature"
        else:
            try:
                self.trust.accept(sc, body)
            except CheckpointRefused as exc:
                why = exc.reason
        if not why and not self._complete(body, replica):
            why = "incomplete"
        if not why:
            self.held[sc.digest] = (sc, body)
            if sc.digest in self._trim():
                why = "evicted"
        if why:
            self.refused[why] += 1
            self.retry_at[sc.digest] = now + HOLDER_BACKOFF_S
            self._bound()
            return why
        self.retry_at.pop(sc.digest, None)
        return "held"

    @staticmethod
    def _complete(body: CheckpointBody, replica: Callable[[str, str], tuple[int, bytes] | None]) -> bool:
        return all(replica(body.origin, body.path_of(f)) == (f.size, f.root) for f in body.files)

    def refresh(self, replica: Callable[[str, str], tuple[int, bytes] | None]) -> list[bytes]:
        """Drop the checkpoints whose replicas are not all here any more (retired, replaced); their digests."""
        gone = [d for d, (_, body) in self.held.items() if not self._complete(body, replica)]
        for d in gone:
            del self.held[d]
        return gone

    @property
    def refs(self) -> list[CheckpointRef]:
        """What this node lists in its snapshot: a ref per checkpoint held, newest first."""
        return sorted((CheckpointRef(b.config, b.job_id, b.seq, b.origin, d) for d, (_, b) in self.held.items()),
                      key=lambda r: r.order, reverse=True)

    def _trim(self) -> list[bytes]:
        """Keep :data:`KEPT_PER_CONFIG` per config, :data:`MAX_HELD_PER_ORIGIN` per origin and
        :data:`MAX_CHECKPOINT_REFS` in all, ranked by (place within its config, newest first): the digests
        dropped."""
        per: Counter[str] = Counter()
        ranked = []
        for r in self.refs:
            per[r.config] += 1
            ranked.append((per[r.config], tuple(-x for x in r.order), r))
        ranked.sort(key=lambda x: (x[0], x[1]))
        by_origin: Counter[str] = Counter()
        kept = 0
        dropped = []
        for rank, _, r in ranked:
            if rank > KEPT_PER_CONFIG or by_origin[r.origin] >= MAX_HELD_PER_ORIGIN or kept >= MAX_CHECKPOINT_REFS:
                del self.held[r.digest]
                dropped.append(r.digest)
            else:
                by_origin[r.origin] += 1
                kept += 1
        return dropped

    def _bound(self) -> None:
        if len(self.retry_at) > 4 * MAX_CHECKPOINT_REFS:
            for d in sorted(self.retry_at, key=self.retry_at.__getitem__)[: len(self.retry_at) // 2]:
                del self.retry_at[d]
