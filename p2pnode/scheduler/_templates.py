"""A template of work and its parts (pure): :class:`JobTemplate` with its typed :class:`Param` values, its
:class:`ResourceRequest` (Ray's vocabulary), :class:`Placement` (strategy, tag :class:`Affinity`, colocation) and
:class:`Gang`, and how a node renders its argv (:meth:`JobTemplate.render_argv`). Parsed and validated from the
catalog's ``[[job]]`` tables by :mod:`._catalog` (the format is in its docstring), which re-exports every name here.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from ..snapshot import ParamValue
from ._checkpointspec import CheckpointSpec

__all__ = ["BUILTIN_PLACEHOLDERS", "Affinity", "Gang", "JobTemplate", "Param", "Placement", "ResourceRequest"]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
BUILTIN_PLACEHOLDERS = {"python": "python3", "catalog_dir": "."}
"""Placeholders every node fills from its own installation (see :meth:`JobTemplate.render_argv`)."""


class Param(msgspec.Struct, frozen=True):
    """A typed template parameter; ``choices`` (str) or ``min``/``max`` (numbers) bound its values."""

    name: str
    type: str
    default: Any = None
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()

    def check(self, value: Any) -> Any:
        """``value`` coerced to the declared type; ``ValueError`` when it does not fit. A value must first be one
        every boundary accepts (:data:`p2pnode.snapshot.ParamValue`: text without control characters, at most
        256 characters; integers within +-2^53; finite numbers): a parameter a route accepts is then one the
        plan, the operator file and every node's decoder accept too."""
        try:
            value = msgspec.convert(value, ParamValue, strict=True)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{self.name}: {exc}") from None
        if self.type == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{self.name}: expected a bool")
            return value
        if self.type in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{self.name}: expected a number")
            if self.type == "int" and not float(value).is_integer():
                raise ValueError(f"{self.name}: expected an integer")
            v = int(value) if self.type == "int" else float(value)
            below = self.min is not None and v < self.min
            if not math.isfinite(v) or below or (self.max is not None and v > self.max):
                raise ValueError(f"{self.name}: {v} outside [{self.min}, {self.max}]")
            return v
        if not isinstance(value, str):
            raise ValueError(f"{self.name}: expected a string of at most 256 characters")
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.name}: {value!r} not one of {', '.join(self.choices)}")
        return value


class ResourceRequest(msgspec.Struct, frozen=True):
    """Per instance: GPUs (fractions share one GPU), VRAM per GPU (GiB), CPUs, memory and disk (GiB), custom."""

    num_gpus: float = 0.0
    vram_gib: float = 0.0
    num_cpus: float = 1.0
    memory_gib: float = 1.0
    disk_gib: float = 0.0
    custom: tuple[tuple[str, float], ...] = ()


class Affinity(msgspec.Struct, frozen=True):
    """A placement preference for nodes carrying ``tag``; ``hard`` makes it a requirement."""

    tag: str
    hard: bool = False


class Placement(msgspec.Struct, frozen=True):
    """How a template's instances are laid out: ``strategy`` (one of :data:`STRATEGIES`), tag ``affinity`` and an
    optional ``colocation_group`` (instances of a group prefer nodes already running one of its members)."""

    strategy: str = "spread"
    affinity: tuple[Affinity, ...] = ()
    colocation_group: str | None = None


class Gang(msgspec.Struct, frozen=True):
    """``[job.gang]``: ``members`` instances placed together, all or none (Ray's placement groups), each on a node
    whose tags carry the same value for every key in ``same`` (``provider`` for tags ``provider=...``).
    ``min_members`` (issue 41, item 4; 0: the gang is static, ``members`` or none) makes an elastic gang
    (``members = "MIN:MAX"``, torchrun only): placed with ``min_members`` to ``members`` members, it goes on while
    at least ``min_members`` run (and the rendezvous host, rank 0), and gets a member back when a node frees."""

    members: int
    same: tuple[str, ...] = ()
    min_members: int = 0

    @property
    def minimum(self) -> int:
        """The fewest members the gang runs with: ``min_members`` when elastic, else ``members``."""
        return self.min_members or self.members

    @property
    def elastic(self) -> bool:
        return 0 < self.min_members < self.members


class JobTemplate(msgspec.Struct, frozen=True):
    """One kind of work for one config (:mod:`._catalog`, its format). ``engine`` (one of :data:`ENGINES`) runs it;
    ``gang``: several members placed together (None: one instance is one process on one node)."""

    name: str
    kind: str
    config: str
    argv: tuple[str, ...]
    params: tuple[Param, ...] = ()
    resources: ResourceRequest = msgspec.field(default_factory=ResourceRequest)
    priority: int = 50
    preemptible: bool = True
    autonomous: bool = False
    max_concurrency: int = 1
    max_runtime_s: float = 3600.0
    env: tuple[str, ...] = ()
    checkpoint: CheckpointSpec | None = None
    """``[job.checkpoint]`` (issue 41): where the job writes checkpoints (:mod:`._checkpointspec`); None: none."""
    placement: Placement = msgspec.field(default_factory=Placement)
    engine: str = "process"
    gang: Gang | None = None
    exclusive: bool = False
    """Fenced by this node's lease (issue 42): it runs only while the node hears a quorum of voters; with
    ``kind = "training"`` it always is (see :attr:`fenced`)."""

    @property
    def fenced(self) -> bool:
        """Whether the lease fences this template's jobs: ``exclusive`` or a training (one per config)."""
        return self.exclusive or self.kind == "training"

    @property
    def members(self) -> int:
        """Members of one instance: the gang's, else 1."""
        return self.gang.members if self.gang is not None else 1

    def param_values(self, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """Defaults overlaid with ``given``; ``ValueError`` for an undeclared or ill-typed parameter."""
        declared = {p.name: p for p in self.params}
        out = {p.name: p.default for p in self.params}
        for k, v in (given or {}).items():
            if k not in declared:
                raise ValueError(f"{self.name}: parameter {k!r} is not declared")
            out[k] = declared[k].check(v)
        return out

    def render_argv(self, given: dict[str, Any] | None = None, builtins: dict[str, str] | None = None) -> list[str]:
        """The command to run: ``{param}`` and ``{config}`` replaced by checked values, and the node's own
        built-ins (``{python}``: the agent's interpreter, ``{catalog_dir}``: the catalog file's directory)."""
        values = {**BUILTIN_PLACEHOLDERS, **(builtins or {}), "config": self.config, **self.param_values(given)}
        return [_PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), a) for a in self.argv]
