"""The job catalog: templates of work, parsed from TOML and validated with every error's location. Pure.

A plan never carries a command: it names a template and parameter values the template declares, and the node
renders the argv from its own copy of the catalog (nothing from the network is executed). The catalog's
:attr:`Catalog.digest` travels in snapshots so that a node with another catalog is flagged.

Format (see ``docs/catalog.md`` and ``deploy/examples/catalog.toml``)::

    [quotas]                      # shares of tier-1 GPU time per config (glob patterns allowed)
    "hexagonal_4p" = 0.25
    "hex8_*" = 0.10

    [mix]                         # target shares of GPU time per kind
    selfplay = 0.6
    training = 0.3
    evaluation = 0.1

    [policy]                      # the fleet's placement rules; every table optional
    vram_floors_gib = { "hexagonal*" = 32, "hex8*" = 8 }   # GiB per GPU at least, by config (exact or glob)
    tiers = { training = [1, 2], selfplay = [3, 2, 1] }    # tiers a kind's GPU work may use, preferred first
    cpu_tiers = { rollout = [4] }                          # tiers a kind's CPU-only work may use (default 4, 3, 2, 1)
    priorities = { training = "high" }                     # guard priority of a kind's work
    stable = ["training"]                                  # kinds that want durable nodes (the default)

    [[job]]
    name = "selfplay-hex8_2p"
    kind = "selfplay"             # selfplay | training | evaluation | any other word
    config = "hex8_2p"
    argv = ["python", "-m", "demo.selfplay", "--config", "{config}", "--games", "{games}"]
    priority = 50                 # 1-100
    preemptible = true
    autonomous = true             # may run without a leader
    exclusive = false             # fenced by the node's lease (every kind = "training" job is)
    max_concurrency = 4           # instances at once, cluster-wide (0: only by `p2pnode jobs run`)
    max_runtime_s = 3600
    env = ["PATH", "HOME"]        # the only variables passed through
    [job.params.games]
    type = "int"                  # int | float | str | bool
    default = 200
    min = 1
    max = 100000
    [job.resources]               # Ray's vocabulary
    num_gpus = 0.5                # fractions share a GPU by VRAM accounting
    vram_gib = 6                  # per GPU
    num_cpus = 2
    memory_gib = 4
    disk_gib = 1
    custom = { "nvlink" = 1 }
    [job.placement]
    strategy = "spread"           # pack | spread | strict_pack | strict_spread
    affinity = [{ tag = "provider=runpod", hard = false }]
    colocation_group = "hex8"

A gang (issue 26: work larger than one machine) asks for several members, each with the template's
``[job.resources]``, placed all-or-nothing and run by an engine users already have::

    [[job]]
    name = "ddp-hex8_2p"
    kind = "training"
    config = "hex8_2p"
    engine = "torchrun"           # process (the default) | torchrun | ray
    argv = ["{catalog_dir}/ddp_train.py", "--config", "{config}"]
    [job.gang]
    members = 3                   # 2-64, or "2:4" (elastic, torchrun only); the default strategy is strict_spread
    same = ["provider"]           # tag keys every member shares the value of (tags "provider=...")

A template whose job saves checkpoints says where (issue 41; :mod:`._checkpointspec`)::

    [job.checkpoint]
    dir = "checkpoints/{config}"  # relative to the sync root
    signal = "SIGUSR1"            # optional
    grace_s = 60                  # optional
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..errors import P2PNodeError
from ..guardcore import OperationPriority
from ._cataloggang import MAX_GANG_MEMBERS, parse_gang
from ._checkpointspec import CHECKPOINT_SIGNALS, CheckpointSpec, checkpoint_globs, parse_checkpoint
from ._templates import (
    _PLACEHOLDER,
    BUILTIN_PLACEHOLDERS,
    Affinity,
    Gang,
    JobTemplate,
    Param,
    Placement,
    ResourceRequest,
)

__all__ = [
    "catalog_from_text",
    "CHECKPOINT_SIGNALS",
    "CheckpointSpec",
    "checkpoint_globs",
    "ALL_TIERS",
    "ENGINES",
    "MAX_GANG_MEMBERS",
    "Gang",
    "CPU_TIERS",
    "KINDS",
    "PRIORITY_NAMES",
    "STABLE_KINDS",
    "STRATEGIES",
    "Affinity",
    "Catalog",
    "CatalogError",
    "JobTemplate",
    "Param",
    "Placement",
    "Policy",
    "ResourceRequest",
    "load_catalog",
    "parse_catalog",
]

KINDS = ("selfplay", "training", "evaluation")
ENGINES = ("process", "torchrun", "ray")
"""What runs a template's instance (Nomad's task drivers): ``process`` its argv as is; ``torchrun`` its argv under
``python -m torch.distributed.run`` with a static rendezvous (an elastic gang: a c10d one); ``ray`` a Ray cluster
over the gang's members, the argv as its driver on rank 0 (:mod:`p2pnode.node._engines`)."""
STRATEGIES = ("pack", "spread", "strict_pack", "strict_spread")
DEFAULT_MIX = {"selfplay": 0.6, "training": 0.3, "evaluation": 0.1}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ALL_TIERS: tuple[int, ...] = (1, 2, 3, 4)
"""Every node tier (:func:`p2pnode.scheduler.node_tier`), biggest GPUs first: a kind without a ``[policy] tiers``
entry may use all of them, in this order."""
CPU_TIERS: tuple[int, ...] = (4, 3, 2, 1)
"""The tiers CPU-only work (``num_gpus = 0``) may use when its kind has no ``[policy] cpu_tiers`` entry: every
tier, GPU-less and small-GPU nodes (tier 4) first and the biggest GPU boxes last, so the CPUs of GPU boxes stay
for their GPU jobs' data loaders while other nodes have room. A kind's ``[policy] tiers`` are about GPUs and do not
keep its CPU-only templates off a node."""
PRIORITY_NAMES: dict[str, OperationPriority] = {p.name.lower(): p for p in OperationPriority}
"""``[policy] priorities`` values: ``background``, ``low``, ``normal``, ``high``, ``critical``."""
MAX_VRAM_FLOOR_GIB = 4096.0
STABLE_KINDS: tuple[str, ...] = ("training",)
"""``[policy] stable`` when absent: the kinds whose work wants durable nodes (see :class:`Policy`)."""
MAX_STABLE_KINDS = 64


class CatalogError(P2PNodeError):
    """The catalog is invalid; ``errors`` lists every problem as ``"<where>: <what>"``."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__(f"{len(errors)} error(s) in the catalog:\n  " + "\n  ".join(errors))


def _by_pattern(table: dict[str, float], config: str, default: float) -> float:
    """``table[config]`` if present, else the value of the first glob (file order) matching ``config``."""
    if config in table:
        return table[config]
    return next((v for k, v in table.items() if fnmatch.fnmatchcase(config, k)), default)


class Policy(msgspec.Struct, frozen=True):
    """The fleet's placement rules from ``[policy]``; each one is neutral when absent.

    ``vram_floors_gib``: config name or glob -> the VRAM (GiB per GPU) a GPU job of that config is given at least
    (no floor when no pattern matches). ``tiers``: kind -> node tiers its GPU work may use, preferred first
    (absent kinds: :data:`ALL_TIERS`). ``priorities``: kind -> the guard priority of its work, which decides what a
    degraded node still admits (absent kinds: ``NORMAL``). ``cpu_tiers``: kind -> node tiers its CPU-only work
    (``num_gpus = 0``) may use, preferred first (absent kinds: :data:`CPU_TIERS`, every tier). ``stable``: the
    kinds whose work wants stable nodes (default :data:`STABLE_KINDS`, training; ``[]``: none): the planner places
    it on a durable node (one not tagged ``ephemeral``) of its tiers whenever one fits it, by preemption there if
    need be, before any ephemeral node, and a node starting without a leader keeps room for it
    (:mod:`p2pnode.scheduler._plan`, "Stable kinds").
    """

    vram_floors_gib: dict[str, float] = msgspec.field(default_factory=dict)
    tiers: dict[str, tuple[int, ...]] = msgspec.field(default_factory=dict)
    priorities: dict[str, OperationPriority] = msgspec.field(default_factory=dict)
    cpu_tiers: dict[str, tuple[int, ...]] = msgspec.field(default_factory=dict)
    stable: tuple[str, ...] = STABLE_KINDS


@dataclass(frozen=True)
class Catalog:
    """Templates by name, quotas (config pattern -> share of tier-1 GPU time), kind mix targets, the placement
    :class:`Policy`, and a digest of the whole document."""

    templates: dict[str, JobTemplate]
    quotas: dict[str, float]
    mix: dict[str, float]
    digest: str
    base_dir: str = "."
    """Directory of the catalog file (``{catalog_dir}``)."""
    policy: Policy = field(default_factory=Policy)
    """``[policy]``: VRAM floors, tiers and priorities (see :class:`Policy`)."""
    _memo: dict[tuple[str, str], float] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Glob lookups already made (the planner asks for the same configs on every placement)."""

    def quota_for(self, config: str) -> float:
        """The quota share of ``config``: an exact key first, else the first matching glob, else 0."""
        key = ("quota", config)
        if key not in self._memo:
            self._memo[key] = _by_pattern(self.quotas, config, 0.0)
        return self._memo[key]

    def vram_floor_gib(self, config: str) -> float:
        """VRAM per GPU (GiB) a GPU job of ``config`` is given at least: an exact ``[policy] vram_floors_gib``
        key first, else the first matching glob in file order, else 0 (no floor)."""
        key = ("floor", config)
        if key not in self._memo:
            self._memo[key] = _by_pattern(self.policy.vram_floors_gib, config, 0.0)
        return self._memo[key]

    def tiers_for(self, kind: str) -> tuple[int, ...]:
        """Node tiers (1-4) that GPU work of ``kind`` may use, preferred first; :data:`ALL_TIERS` when not
        listed."""
        return self.policy.tiers.get(kind, ALL_TIERS)

    def tiers_of(self, t: JobTemplate) -> tuple[int, ...]:
        """Node tiers (1-4) that ``t`` may use, preferred first: its kind's :meth:`tiers_for` when it asks for a
        GPU; when CPU-only (``num_gpus = 0``), its kind's ``[policy] cpu_tiers``, else :data:`CPU_TIERS` (every
        tier, nodes without big GPUs first)."""
        if t.resources.num_gpus > 0:
            return self.tiers_for(t.kind)
        return self.policy.cpu_tiers.get(t.kind, CPU_TIERS)

    def priority_of(self, kind: str) -> OperationPriority:
        """Guard priority of ``kind``'s work (what a node's degradation level admits); ``NORMAL`` when not listed."""
        return self.policy.priorities.get(kind, OperationPriority.NORMAL)

    def is_stable(self, kind: str) -> bool:
        """Whether ``kind``'s work wants durable nodes (``[policy] stable``, default :data:`STABLE_KINDS`)."""
        return kind in self.policy.stable

    @property
    def configs(self) -> list[str]:
        """Every config some template serves, sorted."""
        return sorted({t.config for t in self.templates.values()})


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _policy(raw: Any, where: str, errors: list[str]) -> Policy:
    """Validate ``[policy]`` (see :class:`Policy`), appending ``"<where>.<key>.<entry>: what"`` to ``errors``."""
    if not isinstance(raw, dict):
        errors.append(f"{where}: must be a table")
        return Policy()
    known = ("vram_floors_gib", "tiers", "priorities", "cpu_tiers")
    for k in raw:
        if k not in known and k != "stable":
            errors.append(f"{where}.{k}: unknown key (known: {', '.join(known)}, stable)")
    floors: dict[str, float] = {}
    tiers: dict[str, tuple[int, ...]] = {}
    cpu_tiers: dict[str, tuple[int, ...]] = {}
    priorities: dict[str, OperationPriority] = {}
    tables = {k: raw.get(k, {}) for k in known}
    for k, table in tables.items():
        if not isinstance(table, dict):
            errors.append(f"{where}.{k}: must be a table, e.g. {k} = {{ name = ... }}")
            tables[k] = {}
    for pattern, v in tables["vram_floors_gib"].items():
        if not _num(v) or not 0 <= v <= MAX_VRAM_FLOOR_GIB:
            errors.append(f"{where}.vram_floors_gib.{pattern}: GiB between 0 and {MAX_VRAM_FLOOR_GIB:g}")
        else:
            floors[str(pattern)] = float(v)
    for key, into in (("tiers", tiers), ("cpu_tiers", cpu_tiers)):
        for kind, v in tables[key].items():
            if not (isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
                    and all(x in ALL_TIERS for x in v) and len(set(v)) == len(v)):
                errors.append(f"{where}.{key}.{kind}: a non-empty list of distinct tiers 1-4, preferred first")
            else:
                into[str(kind)] = tuple(v)
    for kind, v in tables["priorities"].items():
        if not (isinstance(v, str) and v in PRIORITY_NAMES):
            errors.append(f"{where}.priorities.{kind}: one of {', '.join(PRIORITY_NAMES)}")
        else:
            priorities[str(kind)] = PRIORITY_NAMES[v]
    stable = raw.get("stable", list(STABLE_KINDS))
    if not (isinstance(stable, list) and len(stable) <= MAX_STABLE_KINDS
            and all(isinstance(k, str) and _NAME.match(k) for k in stable) and len(set(stable)) == len(stable)):
        errors.append(f"{where}.stable: a list of at most {MAX_STABLE_KINDS} distinct kinds, e.g. stable = "
                      "[\"training\"] ([]: no kind prefers durable nodes)")
        stable = list(STABLE_KINDS)
    return Policy(floors, tiers, priorities, cpu_tiers, tuple(sorted(stable)))


def _job(raw: Any, where: str, errors: list[str]) -> JobTemplate | None:
    """The template of one ``[[job]]`` table, or None with every error in it appended to ``errors`` (in the
    order of the fields: names, params, argv, resources, scheduling fields, env, placement)."""
    if not isinstance(raw, dict):
        errors.append(f"{where}: must be a table")
        return None
    known = {"name", "kind", "config", "argv", "params", "resources", "priority", "preemptible", "autonomous",
             "max_concurrency", "max_runtime_s", "env", "placement", "engine", "gang", "exclusive"}
    for k in raw:
        if k not in known:
            errors.append(f"{where}.{k}: unknown key (known: {', '.join(sorted(known))})")
    n0 = len(errors)
    name, kind, config, argv = raw.get("name"), raw.get("kind"), raw.get("config"), raw.get("argv")
    if not (isinstance(name, str) and _NAME.match(name)):
        errors.append(f"{where}.name: required, 1-64 of letters, digits, '_', '.', '-'")
    if not (isinstance(kind, str) and _NAME.match(kind)):
        errors.append(f"{where}.kind: required (selfplay, training, evaluation or another word)")
    if not (isinstance(config, str) and _NAME.match(config)):
        errors.append(f"{where}.config: required, e.g. \"hex8_2p\"")
    params = _job_params(raw.get("params") or {}, where, errors)
    _check_argv(argv, params, where, errors)
    resources = _job_resources(raw.get("resources") or {}, where, errors)
    prio = raw.get("priority", 50)
    if not (isinstance(prio, int) and not isinstance(prio, bool) and 1 <= prio <= 100):
        errors.append(f"{where}.priority: an integer 1-100")
    for k in ("preemptible", "autonomous", "exclusive"):
        if k in raw and not isinstance(raw[k], bool):
            errors.append(f"{where}.{k}: must be true or false")
    mc = raw.get("max_concurrency", 1)
    if not (isinstance(mc, int) and not isinstance(mc, bool) and 0 <= mc <= 10000):
        errors.append(f"{where}.max_concurrency: an integer 0-10000 (0: only run on demand, `p2pnode jobs run`)")
    rt = raw.get("max_runtime_s", 3600.0)
    if not _num(rt) or rt <= 0:
        errors.append(f"{where}.max_runtime_s: a positive number of seconds")
    env = raw.get("env", [])
    if not (isinstance(env, list) and all(isinstance(e, str) and _ENV.match(e) for e in env)):
        errors.append(f"{where}.env: a list of variable names")
        env = []
    engine = raw.get("engine", "process")
    # (the catalog's own string object, not the TOML parser's: msgspec leaves a field out of an encoding only when
    # it *is* the default, and a plan's digest must survive a decode and re-encode on every node)
    if engine not in ENGINES:
        errors.append(f"{where}.engine: one of {', '.join(ENGINES)}")
    gang = parse_gang(raw["gang"], where, engine if isinstance(engine, str) else "", errors) if "gang" in raw else None
    pl = raw.get("placement") or {}
    if gang is not None and isinstance(pl, dict) and "strategy" not in pl:
        pl = {**pl, "strategy": "strict_spread"}  # a gang's members go one per node unless told otherwise
    placement = _job_placement(pl, where, errors)
    if gang is None and engine in ("torchrun", "ray"):
        errors.append(f"{where}.engine: {engine} runs a gang: add [job.gang] members = 2 or more")
    if gang is not None and raw.get("autonomous", False) is True:
        errors.append(f"{where}.autonomous: a gang is placed by the leader only (members on several nodes)")
    if len(errors) > n0 or resources is None or not (isinstance(name, str) and isinstance(kind, str)
                                                      and isinstance(config, str) and isinstance(argv, list)):
        return None  # (every error is listed; the isinstance checks repeat the ones above for the type checker)
    return JobTemplate(
        name=name, kind=kind, config=config, argv=tuple(argv), params=tuple(params), resources=resources,
        priority=prio, preemptible=raw.get("preemptible", True), autonomous=raw.get("autonomous", False),
        max_concurrency=mc, max_runtime_s=float(rt), env=tuple(env), placement=placement,
        engine=ENGINES[ENGINES.index(engine)] if engine in ENGINES else "process", gang=gang,
        exclusive=raw.get("exclusive", False),
    )


def _job_params(raw: Any, where: str, errors: list[str]) -> list[Param]:
    """A template's ``params`` tables: type, bounds, choices and a default that passes them."""
    params: list[Param] = []
    for pname, p in raw.items():
        pw = f"{where}.params.{pname}"
        if not isinstance(p, dict) or p.get("type") not in ("int", "float", "str", "bool"):
            errors.append(f"{pw}.type: must be int, float, str or bool")
            continue
        lo, hi, choices = p.get("min"), p.get("max"), p.get("choices", [])
        if (lo is not None and not _num(lo)) or (hi is not None and not _num(hi)):
            errors.append(f"{pw}: min and max must be numbers")
            continue
        if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
            errors.append(f"{pw}.choices: must be a list of strings")
            continue
        param = Param(pname, p["type"], p.get("default"), lo, hi, tuple(choices))
        if param.default is None:
            errors.append(f"{pw}.default: required")
        else:
            try:
                param = Param(pname, p["type"], param.check(param.default), lo, hi, tuple(choices))
            except ValueError as exc:
                errors.append(f"{pw}.default: {exc}")
        params.append(param)
    return params


def _check_argv(argv: Any, params: list[Param], where: str, errors: list[str]) -> None:
    """A template's ``argv``: a non-empty list of strings whose ``{placeholders}`` are declared."""
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        errors.append(f"{where}.argv: required, a non-empty list of strings")
        return
    declared = {p.name for p in params} | {"config"} | set(BUILTIN_PLACEHOLDERS)
    for i, a in enumerate(argv):
        for ph in _PLACEHOLDER.findall(a):
            if ph not in declared:
                errors.append(f"{where}.argv[{i}]: placeholder {{{ph}}} is not a declared parameter")


def _job_resources(res: Any, where: str, errors: list[str]) -> ResourceRequest | None:
    """A template's ``resources`` table, or None when it has an error (each appended to ``errors``)."""
    n0 = len(errors)
    rkeys = {"num_gpus", "vram_gib", "num_cpus", "memory_gib", "disk_gib", "custom"}
    for k in res:
        if k not in rkeys:
            errors.append(f"{where}.resources.{k}: unknown key (known: {', '.join(sorted(rkeys))})")
    vals = {}
    for k in ("num_gpus", "vram_gib", "num_cpus", "memory_gib", "disk_gib"):
        v = res.get(k, getattr(ResourceRequest(), k))
        if not _num(v) or v < 0:
            errors.append(f"{where}.resources.{k}: must be a non-negative number")
        vals[k] = v
    g = vals.get("num_gpus", 0)
    if _num(g) and g > 1 and not float(g).is_integer():
        errors.append(f"{where}.resources.num_gpus: above 1 it must be whole ({g})")
    if _num(g) and g > 0 and _num(vals.get("vram_gib")) and vals["vram_gib"] <= 0:
        errors.append(f"{where}.resources.vram_gib: required (> 0) when num_gpus > 0")
    custom = res.get("custom", {})
    if not isinstance(custom, dict) or not all(_num(v) and v >= 0 for v in custom.values()):
        errors.append(f"{where}.resources.custom: must map names to non-negative numbers")
    if len(errors) > n0:
        return None
    return ResourceRequest(float(vals["num_gpus"]), float(vals["vram_gib"]), float(vals["num_cpus"]),
                           float(vals["memory_gib"]), float(vals["disk_gib"]),
                           tuple(sorted((str(k), float(v)) for k, v in custom.items())))


def _job_placement(pl: Any, where: str, errors: list[str]) -> Placement:
    """A template's ``placement`` table: strategy, affinities and colocation group."""
    strategy = pl.get("strategy", "spread")
    if strategy not in STRATEGIES:
        errors.append(f"{where}.placement.strategy: one of {', '.join(STRATEGIES)}")
    affinity = []
    for i, a in enumerate(pl.get("affinity", [])):
        if not (isinstance(a, dict) and isinstance(a.get("tag"), str) and isinstance(a.get("hard", False), bool)):
            errors.append(f"{where}.placement.affinity[{i}]: {{ tag = \"...\", hard = true|false }}")
            continue
        affinity.append(Affinity(a["tag"], a.get("hard", False)))
    group = pl.get("colocation_group")
    if group is not None and not (isinstance(group, str) and _NAME.match(group)):
        errors.append(f"{where}.placement.colocation_group: a name")
    return Placement(strategy, tuple(affinity), group)


def _job_with_checkpoint(raw: Any, where: str, errors: list[str]) -> JobTemplate | None:
    """:func:`_job`, plus the template's ``[job.checkpoint]`` table (issue 41, :mod:`._checkpointspec`)."""
    if not (isinstance(raw, dict) and "checkpoint" in raw):
        return _job(raw, where, errors)
    t = _job({k: v for k, v in raw.items() if k != "checkpoint"}, where, errors)
    spec = parse_checkpoint(raw["checkpoint"], where, errors, {p.name for p in t.params} if t else None)
    return msgspec.structs.replace(t, checkpoint=spec) if t is not None and spec is not None else None


def parse_catalog(doc: dict[str, Any], *, source: str = "catalog") -> Catalog:
    """Build a :class:`Catalog` from a parsed TOML document. Raises :class:`CatalogError` listing every error
    as ``"<source>: job[3] (name).field: what"``."""
    errors: list[str] = []
    for k in doc:
        if k not in ("job", "quotas", "mix", "policy"):
            errors.append(f"{source}: unknown top-level key {k!r} (known: job, quotas, mix, policy)")
    jobs = doc.get("job", [])
    if not isinstance(jobs, list) or not jobs:
        errors.append(f"{source}: needs at least one [[job]]")
        jobs = []
    templates: dict[str, JobTemplate] = {}
    for i, raw in enumerate(jobs):
        label = raw.get("name") if isinstance(raw, dict) else None
        where = f"{source}: job[{i}]" + (f" ({label})" if isinstance(label, str) else "")
        t = _job_with_checkpoint(raw, where, errors)
        if t is None:
            continue
        if t.name in templates:
            errors.append(f"{where}.name: duplicate template name {t.name!r}")
        templates[t.name] = t
    quotas = doc.get("quotas", {})
    if not isinstance(quotas, dict) or not all(_num(v) and 0 <= v <= 1 for v in quotas.values()):
        errors.append(f"{source}: [quotas] values must be shares between 0 and 1")
        quotas = {}
    elif sum(quotas.values()) > 1.0 + 1e-9:
        errors.append(f"{source}: [quotas] shares add up to {sum(quotas.values()):.2f} > 1")
    mix = doc.get("mix", DEFAULT_MIX)
    if not isinstance(mix, dict) or not all(_num(v) and 0 <= v <= 1 for v in mix.values()):
        errors.append(f"{source}: [mix] values must be shares between 0 and 1")
        mix = dict(DEFAULT_MIX)
    elif abs(sum(mix.values()) - 1.0) > 1e-6:
        errors.append(f"{source}: [mix] shares add up to {sum(mix.values()):.2f}, not 1")
    policy = _policy(doc.get("policy", {}), f"{source}: [policy]", errors)
    if errors:
        raise CatalogError(errors)
    canonical = json.dumps(doc, sort_keys=True, default=str).encode()
    return Catalog(templates, {str(k): float(v) for k, v in quotas.items()}, {str(k): float(v) for k, v in mix.items()},
                   hashlib.blake2b(canonical, digest_size=16).hexdigest(), policy=policy)


_WHERE = re.compile(r"^(?P<src>.*?): job\[(?P<i>\d+)\](?: \([^)]*\))?(?P<field>(?:\.[A-Za-z0-9_\[\]]+)*):")


def _line_of(text: str, job_index: int, field: str) -> int | None:
    """Line (1-based) of ``field`` (``.resources.num_gpus``) inside the ``job_index``-th ``[[job]]`` of ``text``."""
    lines = text.splitlines()
    headers = [n for n, line in enumerate(lines) if line.strip() == "[[job]]"]
    if job_index >= len(headers):
        return None
    start = headers[job_index]
    end = headers[job_index + 1] if job_index + 1 < len(headers) else len(lines)
    parts = [p.split("[")[0] for p in field.strip(".").split(".") if p]
    if not parts:
        return start + 1
    table, key = (".".join(["job", *parts[:-1]]), parts[-1]) if len(parts) > 1 else ("job", parts[0])
    in_table = table == "job"
    for n in range(start + 1, end):
        stripped = lines[n].strip()
        if stripped.startswith("["):
            in_table = stripped.strip("[]").strip() == table
            if in_table and key == "":
                return n + 1
            continue
        if in_table and re.match(rf"{re.escape(key)}\s*=", stripped):
            return n + 1
    for n in range(start + 1, end):  # the table itself, e.g. [job.params.games]
        if lines[n].strip().strip("[]").strip() == ".".join(["job", *parts]):
            return n + 1
    return start + 1


def load_catalog(path: str | Path) -> Catalog:
    """Read and validate a catalog file. Raises :class:`CatalogError` listing every error as
    ``"<file>:<line>: job[i] (name).field: what"`` (TOML syntax errors carry the parser's line and column)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CatalogError([f"{path}: cannot read: {exc.strerror}"]) from None
    return catalog_from_text(text, source=str(path), base_dir=str(Path(path).resolve().parent))


def catalog_from_text(text: str, *, source: str, base_dir: str) -> Catalog:
    """Validate catalog ``text`` (TOML) read from ``source`` (a file name, or what a pushed catalog is called);
    ``base_dir`` is what ``{catalog_dir}`` means. Raises :class:`CatalogError` as :func:`load_catalog` does."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError([f"{source}: invalid TOML: {exc}"]) from None
    try:
        c = parse_catalog(doc, source=source)
    except CatalogError as exc:
        located = []
        for e in exc.errors:
            m = _WHERE.match(e)
            line = _line_of(text, int(m.group("i")), m.group("field")) if m else None
            located.append(f"{source}:{line}:{e[len(source) + 1:]}" if line else e)
        raise CatalogError(located) from None
    return Catalog(c.templates, c.quotas, c.mix, c.digest, base_dir, c.policy)
