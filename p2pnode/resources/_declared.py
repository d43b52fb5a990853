"""Resources the operator declares for a node (Ray's ``--resources``, ``--num-cpus``, ``--memory``). Pure.

``NAME=AMOUNT`` specs (``--resource nvlink=1``, ``[agent.resources] nvlink = 1``): a custom resource a job can
request (``resources.custom`` in the catalog) and the planner and the node's admission count. Two names are not
custom: ``cpus`` (CPUs the node gives to jobs; default: its CPU count) and ``memory_gib`` (memory it gives to jobs,
GiB; default: its total memory times the guard's memory limit).
"""

from __future__ import annotations

import math
import re

__all__ = ["MAX_DECLARED", "RESERVED", "parse_resources"]

MAX_DECLARED = 32
"""Declared resources per node, at most (each travels in every snapshot)."""
RESERVED = frozenset({"cpus", "memory_gib"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")


def parse_resources(specs: tuple[str, ...] | list[str]) -> dict[str, float]:
    """``{"nvlink": 1.0, ...}`` from ``NAME=AMOUNT`` specs. Raises ``ValueError`` naming the bad spec: a name
    that is not an identifier of 1-64 characters, an amount that is not a finite number in 0..1e12, a name
    given twice, more than :data:`MAX_DECLARED` names."""
    out: dict[str, float] = {}
    for spec in specs:
        name, sep, amount = spec.partition("=")
        name = name.strip()
        if not sep or not _NAME.match(name):
            raise ValueError(f"resource {spec!r}: expected NAME=AMOUNT with NAME like nvlink or gpu_mem_fast")
        try:
            value = float(amount)
        except ValueError:
            raise ValueError(f"resource {spec!r}: {amount.strip()!r} is not a number") from None
        if not math.isfinite(value) or not 0 <= value <= 1e12:
            raise ValueError(f"resource {spec!r}: the amount must be a finite number between 0 and 1e12")
        if name in out:
            raise ValueError(f"resource {name!r} is declared twice")
        out[name] = value
    if len(out) > MAX_DECLARED:
        raise ValueError(f"{len(out)} resources declared; at most {MAX_DECLARED}")
    return out
