"""What the election reads of a member, cached per snapshot version. Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..election import Candidate, MemberInfo, Vote
from ..errors import DATA_ERRORS
from ..resources import rank_of_gpus
from ..snapshot import Snapshot

__all__ = ["MemberInfoCache", "member_info"]


class _Entry(Protocol):
    @property
    def origin(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def snapshot(self) -> Snapshot: ...


def member_info(origin: str, snap: Snapshot) -> MemberInfo:
    """Rank (power score and VRAM bytes from the reported GPU models with the known table, never the member's
    own score), vote, tags of ``snap`` and whether it is gone soon (a notice in its ``jobs`` section)."""
    score, vram = rank_of_gpus((g.name, g.mem_total_bytes) for g in snap.resources.gpus)
    v = snap.vote
    return MemberInfo(Candidate(origin, score, vram), Vote(v.candidate, v.term) if v else None, tuple(snap.tags),
                      leaving_soon=snap.jobs.notice_deadline_ms is not None)


class MemberInfoCache:
    """:func:`member_info` per origin, recomputed only for a new snapshot version (the election asks for every
    member at every reconcile; ``/status`` for every member's power score)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, MemberInfo]] = {}

    def get(self, entry: _Entry | None, quarantine: Callable[[str, str, Exception], None]) -> MemberInfo | None:
        """The info of ``entry`` (None for no entry). A snapshot that still breaks ranking (a gap in the
        decoder's bounds) is handed to ``quarantine(origin, "election", exc)`` and gives None."""
        if entry is None:
            return None
        cached = self._cache.get(entry.origin)
        if cached is not None and cached[0] == entry.version:
            return cached[1]
        try:
            info = member_info(entry.origin, entry.snapshot)
        except DATA_ERRORS as exc:
            quarantine(entry.origin, "election", exc)
            return None
        self._cache[entry.origin] = (entry.version, info)
        return info

    def forget(self, origin: str) -> None:
        """Drop ``origin`` (reaped)."""
        self._cache.pop(origin, None)
