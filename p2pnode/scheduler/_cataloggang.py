"""A template's ``[job.gang]`` table (issue 26; elastic gangs: issue 41, item 4), parsed for :mod:`._catalog`.

``members`` is an integer 2-:data:`MAX_GANG_MEMBERS` (a static gang: that many members, all or none), or the string
``"MIN:MAX"`` (1 <= MIN <= MAX, 2 <= MAX <= :data:`MAX_GANG_MEMBERS`): an elastic gang, placed with MIN to MAX
members, run by torchrun with ``--nnodes=MIN:MAX`` and a c10d rendezvous (:mod:`p2pnode.node._engines`); only the
``torchrun`` engine can run one (a Ray cluster or a ``process`` gang has no rendezvous that takes members as they
come), so ``MIN:MAX`` with MIN < MAX is refused for ``ray`` and ``process``. ``"N:N"`` is the static gang of N.
``same``: at most 8 distinct tag keys every member shares the value of.
"""

from __future__ import annotations

import re
from typing import Any

from ._templates import Gang

__all__ = ["MAX_GANG_MEMBERS", "parse_gang"]

MAX_GANG_MEMBERS = 64
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_RANGE = re.compile(r"^([0-9]{1,2}):([0-9]{1,2})\Z")
_NUMBER = {str(i): i for i in range(MAX_GANG_MEMBERS + 1)}
"""The numbers ``MIN`` and ``MAX`` may be, by their text (no parse of text: "07" is none of them)."""


def _members(raw: Any, where: str, engine: str, errors: list[str]) -> tuple[int, int] | None:
    """``(min members, members)`` of ``members`` (min 0: static), or None with the error appended."""
    if isinstance(raw, int) and not isinstance(raw, bool) and 2 <= raw <= MAX_GANG_MEMBERS:
        return 0, raw
    m = _RANGE.match(raw) if isinstance(raw, str) else None
    if m is None:
        errors.append(f"{where}.gang.members: required, an integer 2-{MAX_GANG_MEMBERS}, or \"MIN:MAX\" (an elastic "
                      "torchrun gang, e.g. \"2:4\")")
        return None
    lo, hi = _NUMBER.get(m.group(1), -1), _NUMBER.get(m.group(2), -1)
    if not (1 <= lo <= hi and 2 <= hi <= MAX_GANG_MEMBERS):
        errors.append(f"{where}.gang.members: \"MIN:MAX\" needs 1 <= MIN <= MAX and MAX 2-{MAX_GANG_MEMBERS}, "
                      f"got \"{raw}\"")
        return None
    if lo < hi and engine != "torchrun":
        errors.append(f"{where}.gang.members: an elastic gang (\"{raw}\") runs under engine = \"torchrun\" only "
                      f"(its c10d rendezvous takes members as they come); engine {engine} needs an integer")
        return None
    return (lo if lo < hi else 0), hi


def parse_gang(raw: Any, where: str, engine: str, errors: list[str]) -> Gang | None:
    """A template's ``gang`` table (see the module docstring) for a template of ``engine``, or None with every error
    appended to ``errors``."""
    if not isinstance(raw, dict):
        errors.append(f"{where}.gang: must be a table, e.g. [job.gang] members = 3")
        return None
    for k in raw:
        if k not in ("members", "same"):
            errors.append(f"{where}.gang.{k}: unknown key (known: members, same)")
    got = _members(raw.get("members"), where, engine, errors)
    if got is None:
        return None
    same = raw.get("same", [])
    if not (isinstance(same, list) and len(same) <= 8 and all(isinstance(k, str) and _KEY.match(k) for k in same)
            and len(set(same)) == len(same)):
        errors.append(f"{where}.gang.same: a list of at most 8 distinct tag keys, e.g. [\"provider\"]")
        return None
    return Gang(got[1], tuple(same), min_members=got[0])
