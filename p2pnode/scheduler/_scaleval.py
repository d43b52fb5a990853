"""Scaling evaluation (pure): per node class, whether the fleet should add or remove machines now, and why
(:func:`evaluate_scaling`); the policy it reads (:class:`ScalingPolicy`, :class:`ClassPolicy`), the fleet as it
sees it (:class:`FleetNode`) and what one node of a class can run (:func:`class_shape`, :func:`class_takes`). The
leader's :class:`._scaling.ScalingCore` acts on the verdicts; every public name here is re-exported by
:mod:`._scaling`.

**Evaluation** (:func:`evaluate_scaling`, a pure function of the fleet view, the plan's pending work, the
predictor and the wall-clock ``now``), per node class configured in ``[scaling.classes]``:

* **below ``min_nodes``**: up by the difference (members counted toward the class, plus nodes an action asked
  for that have not joined yet). A member counts toward a class only from the provider's own answers or a
  certificate, never from its own claim (:func:`counted_fleet`, issue 37);
* **queue**: a pending template that waited at least ``up_after_s`` (hysteresis: a burst the next plans absorb
  starts no machine) is demand for the cheapest class whose shape can run it (GPUs, *usable* VRAM per GPU: the
  GPU's memory under the guard's limit ``vram_limit_ratio``, as the planner commits it
  (:mod:`p2pnode.scheduler._gpucap`), the kind's tiers; a gang needs one node per member; a catalog template
  counts the instances it still wants, as many to a node as fit it: a fraction's instances per GPU times its
  GPUs). A class that can take none of a template's work is never bought for it, and its verdict says why
  (``1x5090: 25.6 GiB usable per GPU < 32 GiB selfplay``); a scale-up names the templates it is for
  (``for_templates``). The class's free GPUs, and those of its running work predicted to end within
  ``up_after_s`` (the predictor's median run time against each job's elapsed time), are subtracted: they make
  room without a new machine. The rest, in nodes, is the step, at most ``max_step``, ``max_nodes`` and
  ``max_hourly_cost``;
* **down**: with no demand for the class, nodes a provider started (never a voter, never a node nobody started
  through a provider) idle (no job) for ``idle_timeout_s`` are removed, longest idle first, as long as the
  class stays at ``min_nodes`` or more and its GPU utilization after the removal stays within the 60-80 % band
  top (a class over it keeps its idle nodes: the next burst lands there);
* **hold** otherwise, with the reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

import msgspec

from ..resources import GPU_MODELS
from ..resources._power import match_model
from ..snapshot import SCALING_FOR_TEMPLATES_MAX, PlanPending, ScalingVerdict
from ._catalog import Catalog, JobTemplate
from ._gpucap import MAX_VRAM_GIB, fits_gpu, instances_per_gpu, usable_vram_gib
from ._planview import _tier_of
from ._predict import Prediction

__all__ = ["BAND_TOP", "BOOT_GRACE_S", "DEFAULT_VRAM_LIMIT_RATIO", "ClassPolicy", "ClassShape", "FleetNode",
           "ScalingPolicy", "class_shape", "class_takes", "drained", "evaluate_scaling", "removable"]

BAND_TOP = 0.80
"""The utilization band's top (seed 003's 60-80 %): a scale-down keeps a class's GPU utilization at or below it."""
BAND_BOTTOM = 0.60
BOOT_GRACE_S = 600.0
"""A scale-up's nodes not joined this long after the provider answered no longer count as starting (seconds)."""
MAX_REASON = 400
DEFAULT_VRAM_LIMIT_RATIO = 0.8
"""The guard's default GPU memory limit (``[guard] gpu_max_percent = 80``) as a ratio: what a policy assumes when
the caller passes none."""
MAX_CLASS_GPUS = 1024
"""GPUs per node a class shape may have at most (a snapshot lists at most as many)."""
# MAX_VRAM_GIB (p2pnode.scheduler._gpucap): GiB per GPU a class shape taken from a member (``vram_of``) may have at
# most: a larger, negative or non-finite figure leaves the class without a shape (it holds, saying so) rather than
# buying it for any work.
MAX_FOR_TEMPLATES = SCALING_FOR_TEMPLATES_MAX
"""Templates a verdict or an action names as what it is for, at most (``ScalingVerdict.for_templates``)."""
CPU_PER_NODE = 4
"""CPU-only instances counted to one node (such work shares a node with others)."""
_CLASS = re.compile(r"([1-9][0-9]{0,3})x([A-Za-z0-9._+-]{1,32})")


class PredictorLike(Protocol):
    """What the scaling evaluation asks of a predictor (:class:`p2pnode.scheduler.Predictor`)."""

    def predict(self, template: str, node_class: str = "") -> Prediction | None: ...


class ClassPolicy(msgspec.Struct, frozen=True):
    """One configured node class: ``min_nodes``-``max_nodes`` and ``price_per_hour``."""

    min_nodes: int = 0
    max_nodes: int = 0
    price_per_hour: float = 0.0


class ScalingPolicy(msgspec.Struct, frozen=True):
    """The ``[scaling]`` table as the evaluation uses it (see :class:`p2pnode.config.ScalingSettings`)."""

    provider: str = ""
    classes: Mapping[str, ClassPolicy] = {}
    cooldown_s: float = 300.0
    up_after_s: float = 60.0
    idle_timeout_s: float = 300.0
    max_step: int = 4
    max_hourly_cost: float = 0.0
    vram_limit_ratio: float = DEFAULT_VRAM_LIMIT_RATIO
    """The guard's GPU memory limit the leader applies to members (``gpu_max_percent / 100``, 0-1): a class's
    usable VRAM per GPU is its VRAM times this (:func:`p2pnode.scheduler._gpucap.usable_vram_gib`), as the
    planner commits it. Passed in by the driver (:func:`p2pnode.jobs._scaling.scaling_policy`)."""


class FleetNode(msgspec.Struct, frozen=True):
    """A member as the scaling evaluation sees it: its ``node_class``, GPUs (``gpus``; ``gpu_used``: the GPUs its
    jobs hold, fractions summed), its running jobs as ``(template, elapsed seconds)``, the request id of the
    provider action that started it (``started_by``, "": none), whether it is a ``voter``, since when it runs no
    job (``idle_since``, wall seconds; None: busy), the files it holds below the replication factor and whether it
    is ``draining``."""

    node_id: str
    node_class: str
    gpus: int = 0
    gpu_used: float = 0.0
    running: tuple[tuple[str, float], ...] = ()
    started_by: str = ""
    voter: bool = False
    idle_since: float | None = None
    under_replicated: int = 0
    draining: bool = False
    durable: bool = False
    """Tagged ``durable``: it keeps other nodes' replicas, so it is never removed."""
    vram_gib: float = 0.0
    """VRAM of its smallest GPU (GiB; 0: no GPU, or not known): the shape of a class named otherwise than
    ``<n>x<MODEL>`` (:func:`class_shape`)."""
    reported_class: str = ""
    """The class the member claims (``jobs.node_class``) when ``node_class`` is the counted one
    (:func:`counted_fleet`); "": the same as ``node_class``. Used for predictions and the misjoin check, never
    for counting."""


class ClassShape(msgspec.Struct, frozen=True):
    """What one node of a class offers: ``gpus`` of ``vram_gib`` each, and its ``tier`` (1-4)."""

    gpus: int
    vram_gib: float
    tier: int


def class_shape(name: str, members: Sequence[FleetNode] = (), vram_of: Mapping[str, float] | None = None
                ) -> ClassShape | None:
    """The shape of class ``name``: ``"cpu"`` has no GPU; ``"<n>x<MODEL>"`` has ``n`` GPUs of the power table's
    model (its VRAM); otherwise ``vram_of[name]`` (GiB per GPU), else the smallest ``vram_gib`` of the class's
    ``members``, with the fewest GPUs of them (a node of the class may be the smallest seen). None: unknown (no
    member, no parseable name, or the figures out of bounds: VRAM not finite, not positive or above
    :data:`MAX_VRAM_GIB`, GPUs above :data:`MAX_CLASS_GPUS`): the class holds, never bought on such figures."""
    if name == "cpu":
        return ClassShape(0, 0.0, 4)
    m = _CLASS.fullmatch(name)
    model = match_model(m.group(2)) if m is not None else None
    if m is not None and model is not None and model in GPU_MODELS:
        n, vram = msgspec.json.decode(m.group(1), type=int), model.vram_gib  # ASCII digits, at most 4
        return ClassShape(n, vram, _tier_of((vram,) * n))
    own = [x for x in members if x.node_class == name]
    if not own:
        return None
    gpus = min(x.gpus for x in own)
    if vram_of is not None and name in vram_of:
        vram = vram_of[name]
    else:
        vram = min((x.vram_gib for x in own), key=lambda v: (v == v, v))  # (a NaN first: it fails the check below)
    if not (isinstance(vram, (int, float)) and math.isfinite(vram) and 0.0 < vram <= MAX_VRAM_GIB
            and 0 <= gpus <= MAX_CLASS_GPUS):
        return None
    vram = vram * 1.0  # an int from a caller: the shape holds GiB as a float
    return ClassShape(gpus, vram, _tier_of((vram,) * gpus))


def class_takes(t: JobTemplate, shape: ClassShape, catalog: Catalog, vram_limit_ratio: float) -> tuple[int, str]:
    """How many instances of ``t`` one empty node of ``shape`` holds under the guard's limit ``vram_limit_ratio``
    (the planner's accounting, :mod:`p2pnode.scheduler._gpucap`), and, when none, why (``"25.6 GiB usable per
    GPU < 32 GiB selfplay"``). GPU work: the GPU count, the template's tiers, its VRAM per GPU (the catalog's
    floor included) against the usable VRAM; a fraction fits :func:`~p2pnode.scheduler._gpucap.instances_per_gpu`
    instances on each GPU, whole GPUs ``gpus // ceil(num_gpus)`` to a node. CPU-only work:
    :data:`CPU_PER_NODE` to a node."""
    r = t.resources
    if r.num_gpus <= 0:
        return CPU_PER_NODE, ""
    whole = math.ceil(r.num_gpus - 1e-9)
    if shape.gpus == 0:
        return 0, f"no GPU for {t.name}"
    if whole > shape.gpus:
        return 0, f"{shape.gpus} GPU{'s' if shape.gpus != 1 else ''} per node < {whole} {t.name}"
    tiers = catalog.tiers_of(t)
    if shape.tier not in tiers:
        return 0, f"tier {shape.tier} not among {t.name}'s tiers {', '.join(map(str, tiers))}"
    need = max(r.vram_gib, catalog.vram_floor_gib(t.config))
    usable = usable_vram_gib(shape.vram_gib, vram_limit_ratio)
    if not fits_gpu(usable, need):
        return 0, f"{usable:.1f} GiB usable per GPU < {need:g} GiB {t.name}"
    if r.num_gpus < 1.0 - 1e-9:
        return instances_per_gpu(usable, r.num_gpus, need) * shape.gpus, ""
    return shape.gpus // whole, ""


class _Demand(msgspec.Struct):
    """Waiting work for one class: in ``nodes``, ``jobs`` (pending entries) of which ``gangs``, the longest wait,
    the distinct ``templates`` it is for (first waited first) and the cheaper classes ``passed`` over for it, with
    why (``"1x5090: 25.6 GiB usable per GPU < 32 GiB selfplay"``)."""

    nodes: float = 0.0
    jobs: int = 0
    gangs: int = 0
    longest_s: float = 0.0
    templates: list[str] = msgspec.field(default_factory=list)
    passed: list[str] = msgspec.field(default_factory=list)

    def describe(self) -> str:
        names = ", ".join(self.templates[:3]) + (", ..." if len(self.templates) > 3 else "")
        return (f"{self.jobs} template{'s' if self.jobs != 1 else ''} waited up to {self.longest_s:.0f} s ({names})"
                + (f", {self.gangs} of them gangs" if self.gangs else "")
                + (f"; not {'; '.join(self.passed)}" if self.passed else ""))


MAX_INSTANCES = 64
"""Instances of one pending template counted as demand at most (a template wanting 10,000 asks no more)."""
MAX_WHY = 3
"""Reasons a class could not take waiting work kept per class (and cheaper classes named per demand), at most."""


def _note(into: list[str], text: str) -> None:
    if text not in into and len(into) < MAX_WHY:
        into.append(text)


def _demand(policy: ScalingPolicy, shapes: Mapping[str, ClassShape], pending: Sequence[PlanPending],
            catalog: Catalog, running: Mapping[str, int]) -> tuple[dict[str, _Demand], dict[str, list[str]]]:
    """Waiting work (pending ``up_after_s`` or longer) per class: the cheapest configured class that can run it
    (:func:`class_takes` under ``policy.vram_limit_ratio``), in nodes of that class (instances over the instances
    one node holds; a gang one node per member). A catalog template counts the instances it still wants
    (``max_concurrency`` less those ``running``, at least one, at most :data:`MAX_INSTANCES`; a gang's in
    members); a one-off run (``of`` set) counts one. Also returns, per class, why it could not take waiting work
    (at most :data:`MAX_WHY` each): such a class is never bought for it."""
    out: dict[str, _Demand] = {}
    rejected: dict[str, list[str]] = {}
    order = sorted(shapes, key=lambda c: (policy.classes[c].price_per_hour, c))
    for p in pending:
        t = catalog.templates.get(p.of or p.template)
        if t is None or p.wait_s < policy.up_after_s:
            continue
        cls, per_node, passed = None, 0, []
        for c in order:
            per_node, why = class_takes(t, shapes[c], catalog, policy.vram_limit_ratio)
            if per_node > 0:
                cls = c
                break
            _note(rejected.setdefault(c, []), why)
            passed.append(f"{c}: {why}")
        if cls is None:
            continue
        members = max(1, t.members)
        instances = 1 if p.of else min(MAX_INSTANCES, max(1, t.max_concurrency - running.get(t.name, 0) // members))
        d = out.setdefault(cls, _Demand())
        d.nodes += float(t.members) * instances if t.gang is not None else instances / per_node
        d.jobs += 1
        d.gangs += t.gang is not None
        d.longest_s = max(d.longest_s, p.wait_s)
        if t.name not in d.templates and len(d.templates) < MAX_FOR_TEMPLATES:
            d.templates.append(t.name)
        for x in passed:
            _note(d.passed, x)
    return out, rejected


def _ending_soon(members: Sequence[FleetNode], predictor: PredictorLike | None, horizon_s: float,
                 catalog: Catalog) -> float:
    """GPUs of the class's running jobs predicted (median run time, from history) to end within ``horizon_s``."""
    if predictor is None:
        return 0.0
    freed = 0.0
    for n in members:
        for template, elapsed in n.running:
            p = predictor.predict(template, n.reported_class or n.node_class)
            t = catalog.templates.get(template)
            if p is None or p.source != "history" or t is None or elapsed > p.runtime_p90_s:
                continue
            if p.runtime_p50_s - elapsed <= horizon_s:
                freed += t.resources.num_gpus
    return freed


def evaluate_scaling(policy: ScalingPolicy, fleet: Sequence[FleetNode], pending: Sequence[PlanPending],
                     catalog: Catalog, predictor: PredictorLike | None, now: float, *,
                     starting: Mapping[str, int] | None = None, vram_of: Mapping[str, float] | None = None
                     ) -> list[ScalingVerdict]:
    """One verdict per configured class (see the module docstring). ``fleet``: the live members (draining ones
    included); ``pending``: the newest plan's pending templates; ``starting``: nodes per class a scale-up asked
    for that have not joined; ``vram_of``: GiB per GPU of classes named otherwise than ``<n>x<MODEL>``;
    ``now``: wall-clock seconds. A class it cannot shape gets ``hold`` with the reason; it never raises."""
    starting = starting or {}
    shapes = {c: s for c in policy.classes if (s := class_shape(c, fleet, vram_of)) is not None}
    running: dict[str, int] = {}
    for n in fleet:
        for template, _elapsed in n.running:
            running[template] = running.get(template, 0) + 1
    demand, rejected = _demand(policy, shapes, pending, catalog, running)
    voters = any(n.voter for n in fleet)
    cost = sum(policy.classes[n.node_class].price_per_hour for n in fleet if n.node_class in policy.classes)
    cost += sum(policy.classes[c].price_per_hour * k for c, k in starting.items() if c in policy.classes)
    out = []
    for cls, cp in sorted(policy.classes.items()):
        e = _ClassEval(policy, cls, cp, [n for n in fleet if n.node_class == cls], starting.get(cls, 0), cost,
                       now, demand.get(cls), rejected.get(cls, []))
        v = e.verdict(shapes.get(cls), voters, catalog, predictor)
        if v.verdict == "up":
            cost += cp.price_per_hour * v.count
        out.append(v)
    return out


class _ClassEval:
    """The evaluation of one class (see :func:`evaluate_scaling`)."""

    def __init__(self, policy: ScalingPolicy, cls: str, cp: ClassPolicy, members: list[FleetNode], starting: int,
                 cost: float, now: float, demand: _Demand | None, rejected: Sequence[str] = ()) -> None:
        self.policy, self.cls, self.cp, self.members, self.starting = policy, cls, cp, members, starting
        self.cost, self.now, self.demand = cost, now, demand
        self.cannot = "; ".join(rejected)
        """Why the class cannot take some of the waiting work (it is never bought for that work): said when no
        waiting work is for it (:meth:`no_work`); a scale-up's reason names the cheaper classes passed over instead."""
        gpus = sum(n.gpus for n in members)
        self.util = min(10.0, sum(n.gpu_used for n in members) / gpus) if gpus else None
        self.have = len(members) + starting

    def make(self, verdict: Literal["up", "down", "hold"], reason: str, count: int = 0,
             nodes: Sequence[str] = ()) -> ScalingVerdict:
        return ScalingVerdict(node_class=self.cls, verdict=verdict, reason=reason[:MAX_REASON], count=count,
                              nodes=list(nodes)[:64], nodes_now=len(self.members),
                              queued=self.demand.jobs if self.demand else 0, utilization=self.util,
                              for_templates=self.demand.templates[:MAX_FOR_TEMPLATES] if self.demand else [])

    def verdict(self, shape: ClassShape | None, voters: bool, catalog: Catalog,
                predictor: PredictorLike | None) -> ScalingVerdict:
        if not voters:
            return self.make("hold", "no member is tagged voter: every member votes, so a node added or removed "
                                     "would change the quorum (tag the durable voters)")
        if shape is None:
            return self.make("hold", f"class {self.cls} has no known shape: name it <count>x<GPU model> or 'cpu', "
                                     "or let one member of it join")
        cp = self.cp
        if self.have < cp.min_nodes:
            k = self.afford(min(cp.min_nodes - self.have, self.policy.max_step))
            if k > 0:
                return self.make("up", f"{self.have} nodes (starting included) < min_nodes {cp.min_nodes}", k)
            return self.make("hold", f"below min_nodes {cp.min_nodes}; max_hourly_cost "
                                     f"{self.policy.max_hourly_cost:g} reached")
        if self.demand is not None:
            return self.up(shape, self.demand, catalog, predictor)
        return self.down()

    def afford(self, k: int) -> int:
        """``k`` reduced so the fleet's hourly cost stays within ``max_hourly_cost`` (0: no cap)."""
        price, cap = self.cp.price_per_hour, self.policy.max_hourly_cost
        if cap <= 0 or price <= 0:
            return max(0, k)
        return max(0, min(k, math.floor((cap - self.cost) / price + 1e-9)))

    def up(self, shape: ClassShape, d: _Demand, catalog: Catalog, predictor: PredictorLike | None) -> ScalingVerdict:
        """Scale-up for waiting demand ``d``, less the GPUs predicted to free within ``up_after_s``."""
        freed = _ending_soon(self.members, predictor, self.policy.up_after_s, catalog)
        idle = sum(max(0.0, n.gpus - n.gpu_used) for n in self.members if not n.draining)
        need = d.nodes - ((freed + idle) / shape.gpus if shape.gpus else 0.0)
        what = d.describe()
        if need <= 1e-9 and freed + idle > 0:
            return self.make("hold", f"{what}; {idle:g} GPUs free now"
                             + (f", {freed:g} predicted to free within {self.policy.up_after_s:.0f} s" if freed else "")
                             + " (placement, not capacity, holds it)")
        if need <= self.starting + 1e-9:
            return self.make("hold", f"{what}; {self.starting} node{'s' if self.starting != 1 else ''} starting")
        k = min(math.ceil(need - self.starting - 1e-9), self.policy.max_step, self.cp.max_nodes - self.have)
        if k <= 0:
            return self.make("hold", f"{what}; at max_nodes {self.cp.max_nodes}")
        k = self.afford(k)
        if k <= 0:
            return self.make("hold", f"{what}; max_hourly_cost {self.policy.max_hourly_cost:g} reached")
        return self.make("up", what, k)

    def down(self) -> ScalingVerdict:
        """Scale-down of nodes a provider started, idle ``idle_timeout_s``, within ``min_nodes`` and the band."""
        timeout = self.policy.idle_timeout_s
        idle = sorted((n for n in self.members if removable(n) and not n.draining and not n.running
                       and n.idle_since is not None and self.now - n.idle_since >= timeout),
                      key=lambda n: (n.idle_since or 0.0, n.node_id))
        if not idle:
            band = "" if self.util is None else f", GPU utilization {self.util:.0%}"
            return self.make("hold", f"{self.no_work()}{band}; no node a provider started idle for {timeout:.0f} s")
        gpus = sum(n.gpus for n in self.members)
        used = sum(n.gpu_used for n in self.members)
        chosen: list[str] = []
        for n in idle:
            left = gpus - n.gpus
            over_band = used > 0 and (left <= 0 or used / left > BAND_TOP)
            if len(self.members) - len(chosen) - 1 < self.cp.min_nodes or over_band:
                break
            gpus = left
            chosen.append(n.node_id)
        if not chosen:
            return self.make("hold", f"{len(idle)} idle node{'s' if len(idle) != 1 else ''} kept: min_nodes "
                                     f"{self.cp.min_nodes} or the {BAND_TOP:.0%} utilization band top")
        return self.make("down", f"idle for {timeout:.0f} s or more, {self.no_work()}", len(chosen), chosen)

    def no_work(self) -> str:
        """``no waiting work``, or, when the class cannot take what waits, that and why."""
        return f"no waiting work it can take ({self.cannot})" if self.cannot else "no waiting work"


def removable(n: FleetNode) -> bool:
    """Whether ``n`` may ever be scaled down: a provider started it (``started_by``), and it is neither a voter nor
    durable (it keeps other nodes' replicas)."""
    return bool(n.started_by) and not n.voter and not n.durable


def drained(n: FleetNode) -> bool:
    """Whether ``n`` may go now: removable, no job, every file it pushes at R elsewhere."""
    return removable(n) and not n.running and n.under_replicated == 0
