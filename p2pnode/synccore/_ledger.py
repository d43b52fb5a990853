"""Replica accounting (pure): signed receipts -> confirmations, rendezvous targets, what may be deleted.

A durable node that holds a replica confirms ``(origin, path, size, root)`` in its own signed snapshot (a
*receipt*). The origin counts, for each of its files, the distinct durable members, not dead and not left, whose
snapshot confirms the file's **current** size and root: an HTTP reply alone never counts, a receipt for an older
version does not count, and a member that died stops counting until it is back.

Targets come from rendezvous (highest-random-weight) hashing (Thaler and Ravishankar, 1998): every durable member
gets the score ``BLAKE3(member || 0 || origin/path)`` for a file and the file lives on the highest-scoring
members. The ranking of the other members does not change when one joins or leaves, so a dead target moves only
its own files, each to the next member in that file's ranking; a new member takes over nothing already confirmed.

The replication factor R is capped by the number of durable members (never below 1): with one durable member a
file is safe on it; with none, nothing is ever deletable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import blake3
import msgspec

__all__ = ["Receipt", "ReceiptIndex", "deletable", "effective_r", "may_delete", "plan_targets", "rendezvous_rank"]


class Receipt(msgspec.Struct, frozen=True):
    """``holder`` confirms it holds ``origin``'s ``path`` at ``size`` bytes and manifest ``root`` (32 bytes)."""

    holder: str
    origin: str
    path: str
    size: int
    root: bytes


def rendezvous_rank(key: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` ordered by rendezvous score for ``key``, best first (ties, which need a hash collision, by id)."""
    k = key.encode()

    def score(n: str) -> tuple[bytes, str]:
        return blake3.blake3(n.encode() + b"\x00" + k).digest(length=8), n

    return sorted(set(nodes), key=score, reverse=True)


def effective_r(r: int, durable_members: int) -> int:
    """R capped by the number of durable members, at least 1."""
    return max(1, min(r, durable_members))


class ReceiptIndex:
    """Receipts for one origin's files, from the snapshots of the durable members that count.

    ``receipts``: ``{holder: {path: (size, root)}}`` as read from each holder's newest snapshot (only receipts for
    this origin). ``durable``: the durable members that count (alive or suspect, not dead or left); receipts of
    any other holder are ignored.
    """

    def __init__(self, receipts: Mapping[str, Mapping[str, tuple[int, bytes]]], durable: Iterable[str]) -> None:
        self.durable = frozenset(durable)
        self._by_path: dict[str, dict[str, tuple[int, bytes]]] = {}
        for holder, files in receipts.items():
            if holder not in self.durable:
                continue
            for path, version in files.items():
                self._by_path.setdefault(path, {})[holder] = version

    def confirmed_by(self, path: str, size: int, root: bytes) -> frozenset[str]:
        """Durable members whose receipt matches ``(size, root)`` exactly."""
        return frozenset(h for h, v in self._by_path.get(path, {}).items() if v == (size, root))

    def holders(self, path: str) -> frozenset[str]:
        """Durable members with a receipt for any version of ``path`` (a partial delta base)."""
        return frozenset(self._by_path.get(path, {}))


def may_delete(confirmations: int, r: int, durable_members: int) -> bool:
    """True when ``confirmations`` distinct durable members confirm the current version and that reaches R
    (capped by ``durable_members``, at least 1)."""
    return durable_members > 0 and confirmations >= effective_r(r, durable_members)


def deletable(files: Mapping[str, tuple[int, bytes]], index: ReceiptIndex, *, r: int, durable_members: int) -> set[str]:
    """The paths of ``files`` (``{path: (size, root)}``, their current versions) that :func:`may_delete` allows:
    what the disk manager's ``replicated`` class may take."""
    return {p for p, (size, root) in files.items()
            if may_delete(len(index.confirmed_by(p, size, root)), r, durable_members)}


def plan_targets(
    key: str,
    *,
    confirmed: frozenset[str],
    candidates: Iterable[str],
    r: int,
    durable_members: int,
    refusing: frozenset[str] = frozenset(),
) -> list[str]:
    """The members to push ``key``'s current version to now: the best-ranked candidates (rendezvous order) that
    have not confirmed it and are not refusing (backpressure), as many as are missing to reach R. ``candidates``:
    durable members reachable now (alive or suspect, not self)."""
    missing = effective_r(r, durable_members) - len(confirmed)
    if missing <= 0:
        return []
    out = []
    for node in rendezvous_rank(key, candidates):
        if node in confirmed or node in refusing:
            continue
        out.append(node)
        if len(out) == missing:
            break
    return out
