"""Scaling decisions: when the fleet should add or remove machines, per node class. Pure (no I/O, no clock).

Seed 004's ``evaluate_scaling``, held to the bar of Ray's autoscaler (node types with ``min_workers`` and
``max_workers``, pending demand scales up, nodes idle for ``idle_timeout`` scale down), Nomad Autoscaler
(policies, one cooldown) and Kubernetes' cluster autoscaler (only what can be drained goes). The leader runs
:class:`ScalingCore` from its job core (:class:`p2pnode.node.JobCore`) on every plan; the job control driver
carries out the :class:`ProviderCall` effects through the provider plugin.

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

**Actions** (:class:`ScalingCore`): at most one per ``cooldown_s`` (wall-clock seconds, replicated with the
ledger: a new leader honours its predecessor's cooldown, and acts only once its view settled,
:data:`SETTLE_S`), a scale-up before a removal, each under an idempotency id ``"<term>-<n>-<ms>"``, recorded
``requested`` in the ledger and published in the leader's snapshot (:class:`p2pnode.snapshot.ScalingSection`),
with a gossip exchange to up to three voters started, before the provider is called (the exchange may still be
under way when the call begins). A scale-down first **drains**: the nodes go into ``draining`` (the
planner places nothing new there) and the provider is asked to remove them only once their jobs ended and every
file they hold reached its replication factor elsewhere (``sync.under_replicated`` 0). A new leader adopts the
newest ledger it sees during its settle and reconciles every ``requested`` action through the provider's
``list()``: an action the provider carried out is marked done, one it did not is issued again under the same id
(the provider does nothing twice for one id), and nodes listed under an id no ledger names count as starting,
so a failover neither repeats nor loses an action (:meth:`ScalingCore.lead`). Scaling holds while no member is
tagged ``voter`` (every member would vote: adding nodes would change the quorum).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Literal, Protocol

import msgspec

from ..resources import GPU_MODELS
from ..resources._power import match_model
from ..snapshot import SCALING_FOR_TEMPLATES_MAX, PlanPending, ScalingAction, ScalingSection, ScalingVerdict
from ._catalog import Catalog, JobTemplate
from ._gpucap import MAX_VRAM_GIB, fits_gpu, instances_per_gpu, usable_vram_gib
from ._planview import _tier_of
from ._predict import Prediction

__all__ = ["BAND_TOP", "BOOT_GRACE_S", "LIST_RETRY_S", "MAX_REFUSED_CLAIMS", "SCALING_CLAIM_REASONS",
           "UNVERIFIED_HOLD_S", "ClassPolicy", "FleetNode", "ProviderCall", "ProviderList", "RefusedClaim",
           "ScalingCore", "ScalingPolicy", "class_shape", "class_takes", "counted_fleet", "evaluate_scaling",
           "one_line"]

BAND_TOP = 0.80
"""The utilization band's top (seed 003's 60-80 %): a scale-down keeps a class's GPU utilization at or below it."""
BAND_BOTTOM = 0.60
SETTLE_S = 30.0
"""A new leader takes no action for this long (or its cooldown, if shorter; seconds): members still joining its
view would count as missing (a start-up's nodes below ``min_nodes``)."""
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


COUNTED_STATES = ("starting", "running")
"""States of a provider's node that count toward its class (a ``stopping`` or ``stopped`` one does not)."""


SCALING_CLAIM_REASONS = ("class_unbacked", "started_by_unbacked")
"""Why a member's claim counts toward no class (:func:`counted_fleet`): ``started_by_unbacked``, it names a
request id under which no slot is left for it (no such scale-up, its nodes all named or taken, or this leader saw
the member before it issued the request); ``class_unbacked``, it claims a configured class that neither the
provider nor a certificate backs."""


def counted_fleet(fleet: Sequence[FleetNode], named: Mapping[str, tuple[str, str, str]],
                  listing: Mapping[str, Sequence[tuple[str, str, str]]] | None, actions: Sequence[ScalingAction],
                  certified_class: Mapping[str, str], *, first_seen: Mapping[str, float] | None = None,
                  issued_at: Mapping[str, float] | None = None, classes: Collection[str] | None = None,
                  refused: dict[str, tuple[str, str]] | None = None) -> list[FleetNode]:
    """The fleet with each member's class as it counts toward ``min_nodes``, ``max_nodes``, the cost and the free
    capacity (issue 37, item 5): a signed snapshot proves who speaks, not what it claims, so a member's own
    ``jobs.node_class`` and ``started_by`` count for nothing. A member counts toward class C when

    * ``certified_class`` names C for it (a role certificate of a pinned operator key, ``p2pnode node certify
      ID --class C``), or
    * the provider named its node id (``named``: node id -> ``(request id, state, class)`` from its ``scale_up``
      answers and its newest ``list()``, state starting or running): C is the provider's class for it, else the
      class of the ledger's action under that request id; its ``started_by`` becomes that request id; or
    * its ``started_by`` claims a request id of a scale-up the ledger holds (``actions``, not failed) or the
      provider's ``listing`` shows (request id -> ``[(node id, state, class)]``), and that request still has a
      node the provider did not name: at most as many members count under a request id as the provider started
      and did not name (for a provider that learns node ids late). A provider that names every node (the
      ``local`` one does) leaves no room for such a claim. Who takes such a slot (:func:`_unnamed_slots`): never
      a member this leader saw before it issued that request (``first_seen``: node id -> wall seconds this
      leader first saw it; ``issued_at``: request id -> wall seconds this leader first issued it), then the
      member seen first, then the lowest node id (ties: members first seen at once, after a failover).

    Every other member keeps its claim in ``reported_class`` (predictions, display) and gets ``node_class`` ""
    and ``started_by`` "": it counts toward no class and is never removed by a scale-down. Its refused claim goes
    into ``refused`` (node id -> ``(reason, what it claimed)``, :data:`SCALING_CLAIM_REASONS`): a ``started_by``
    that got no slot, else a claimed class among ``classes`` (None: any class). Pure; O(fleet log fleet +
    listing)."""
    ups = {a.id: a for a in actions if a.op == "up" and a.state != "failed"}
    room = _unnamed_room(named, listing, ups)
    out: dict[str, FleetNode] = {}
    rest: list[FleetNode] = []
    for n in fleet:
        cert = certified_class.get(n.node_id, "")
        p = named.get(n.node_id)
        if p is not None and p[1] in COUNTED_STATES:
            rid, _s, cls = p
            cls = cert or cls or (ups[rid].node_class if rid in ups else "")
            out[n.node_id] = msgspec.structs.replace(n, node_class=cls, started_by=rid, reported_class=n.node_class)
        elif cert:
            out[n.node_id] = msgspec.structs.replace(n, node_class=cert, started_by="", reported_class=n.node_class)
        else:
            rest.append(n)
    given = _unnamed_slots(rest, room, first_seen or {}, issued_at or {})
    for n in rest:
        cls = given.get(n.node_id, "")
        if cls:
            out[n.node_id] = msgspec.structs.replace(n, node_class=cls, reported_class=n.node_class)
            continue
        out[n.node_id] = msgspec.structs.replace(n, node_class="", started_by="", reported_class=n.node_class)
        if refused is None:
            continue
        if n.started_by:
            refused[n.node_id] = ("started_by_unbacked", n.started_by)
        elif n.node_class and (classes is None or n.node_class in classes):
            refused[n.node_id] = ("class_unbacked", n.node_class)
    return [out[n.node_id] for n in fleet]


def _unnamed_room(named: Mapping[str, tuple[str, str, str]],
                  listing: Mapping[str, Sequence[tuple[str, str, str]]] | None,
                  ups: Mapping[str, ScalingAction]) -> dict[str, tuple[str, int]]:
    """Request id -> (class, nodes the provider started under it and did not name): from its listing's unnamed
    nodes, or the ledger's count less the nodes named under it, whichever is more."""
    named_under: dict[str, int] = {}
    for rid, state, _c in named.values():
        if state in COUNTED_STATES:
            named_under[rid] = named_under.get(rid, 0) + 1
    room: dict[str, tuple[str, int]] = {}
    for rid, listed in (listing or {}).items():
        unnamed = [c for node, state, c in listed if not node and state in COUNTED_STATES]
        if unnamed:
            room[rid] = (unnamed[0] or (ups[rid].node_class if rid in ups else ""), len(unnamed))
    for rid, a in ups.items():
        left = a.count - named_under.get(rid, 0)
        if left > room.get(rid, ("", 0))[1]:
            room[rid] = (a.node_class, left)
    return room


def _unnamed_slots(rest: Sequence[FleetNode], room: dict[str, tuple[str, int]], first_seen: Mapping[str, float],
                   issued_at: Mapping[str, float]) -> dict[str, str]:
    """Node id -> class of the members of ``rest`` that take an unnamed slot of the request their ``started_by``
    names (``room``, consumed). A node a request started cannot have been seen before the request was issued, so
    a member this leader saw before (or at the step) it issued the request gets none: a fake present all along
    cannot take the next request's slot. The others go by first sight (the real node joins within its boot time
    of the request; a fake must appear in between, one identity per request), then by node id (only members
    first seen at the same step tie: those present when this leader took over, for its predecessor's
    requests)."""
    inf = math.inf
    given: dict[str, str] = {}
    for n in sorted(rest, key=lambda x: (first_seen.get(x.node_id, -inf), x.node_id)):
        cls, left = room.get(n.started_by, ("", 0))
        if not cls or left <= 0 or first_seen.get(n.node_id, inf) <= issued_at.get(n.started_by, -inf):
            continue
        room[n.started_by] = (cls, left - 1)
        given[n.node_id] = cls
    return given


# -- actions ----------------------------------------------------------------------------------------------------
class ProviderCall(msgspec.Struct, frozen=True):
    """Carry out ``action`` through the provider (scale_up or scale_down under ``action.id``); hand the outcome
    back with :meth:`ScalingCore.result`."""

    action: ScalingAction


class ProviderList(msgspec.Struct, frozen=True):
    """Ask the provider for its nodes (``list()``), to reconcile the ledger; hand them back with
    :meth:`ScalingCore.listed`."""


Listed = Sequence[tuple[str, str, str, str]]
"""A provider's nodes as ``(request_id, node_id, state, node_class)``; state ``starting``, ``running``,
``stopping`` or ``stopped``; node_id and node_class ``""`` where the provider does not know them."""
LIST_RETRY_S = (5.0, 300.0)
"""A failed ``list()`` is asked again after the first figure (seconds), doubling up to the second (or the
cooldown, if shorter): a provider that cannot list is not called in a loop."""
UNVERIFIED_HOLD_S = BOOT_GRACE_S
"""A new leader holds every action while a member shows a ledger under an earlier term whose leader it does not
know (it can neither adopt nor discard it: adopting would let any member plant actions, discarding could repeat
the dead leader's), for at most this long after it began to lead (seconds)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
MAX_NAMED = 4096
"""Provider-named nodes a leader keeps (a provider's listing holds at most as many)."""
MAX_REFUSED_CLAIMS = 64
"""Members whose refused claims a leader names at most (:attr:`ScalingCore.refused_claims`; the one seen longest
ago goes first). Totals by reason are kept apart and never shrink."""


class RefusedClaim(msgspec.Struct):
    """A member's claim that counts toward no class (:func:`counted_fleet`): ``member`` (node id), ``reason`` (one
    of :data:`SCALING_CLAIM_REASONS`), what it ``claimed`` (a class or a request id), ``count``: scaling steps
    that refused it, ``first_at`` / ``last_at``: wall seconds of the first and last of them."""

    member: str
    reason: str
    claimed: str
    count: int = 0
    first_at: float = 0.0
    last_at: float = 0.0


def one_line(text: str, limit: int = MAX_REASON) -> str:
    """``text`` on one line (each run of control characters, newlines included, one space), at most ``limit``
    characters: what a provider says goes into the replicated ledger, whose wire type forbids control
    characters (one such error would make the leader's whole ``scaling`` section invalid)."""
    text = _CONTROL.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ScalingCore(msgspec.Struct):
    """The leader's scaling state (see the module docstring): the ``ledger`` of actions, the cooldown's start
    ``last_action_at`` (wall seconds), the nodes ``draining`` (-> wall time the drain began), the newest
    ``verdicts``, and the reconciliation in progress. ``term``: the term this node leads (0: not leading)."""

    policy: ScalingPolicy
    ledger: list[ScalingAction] = msgspec.field(default_factory=list)
    last_action_at: float = -math.inf
    draining: dict[str, float] = msgspec.field(default_factory=dict)
    verdicts: list[ScalingVerdict] = msgspec.field(default_factory=list)
    term: int = 0
    led_term: int = 0
    """The last term this node led (its ledger keeps travelling under it after it stops leading)."""
    seq: int = 0
    led_since: float = -math.inf
    reconciled: bool = True
    listing: bool = False
    in_flight: str = ""
    reissue: list[str] = msgspec.field(default_factory=list)
    """Ids of ``requested`` actions the reconciliation found not carried out: issued again, one at a time."""
    provider_nodes: dict[str, list[tuple[str, str, str]]] | None = None
    """The provider's newest ``list()``: request id -> ``[(node_id, state, node_class)]`` (None: not asked yet)."""
    named: dict[str, tuple[str, str, str]] = msgspec.field(default_factory=dict)
    """Nodes the provider named by node id, from its ``scale_up`` answers and its newest ``list()``: node id ->
    ``(request id, state, node class)`` (:func:`counted_fleet`; at most :data:`MAX_NAMED`)."""
    listed_at: float = -math.inf
    list_retry_at: float = -math.inf
    """After a failed ``list()``: not asked again before this wall time (:data:`LIST_RETRY_S`)."""
    list_backoff: float = 0.0
    relist: bool = False
    """A ledger adopted while a ``list()`` was under way changed: ask again once it answers."""
    adopted: tuple[object, ...] | None = None
    """The version of the predecessor's section merged last (each version is merged once)."""
    unverified: str = ""
    """Why every action holds (:data:`UNVERIFIED_HOLD_S`): a ledger under a term whose leader is unknown."""
    check_due: bool = False
    joined: dict[str, set[str]] = msgspec.field(default_factory=dict)
    """Scale-up id -> the nodes seen joined under it (a node removed later still joined: it is not starting)."""
    stuck: dict[str, str] = msgspec.field(default_factory=dict)
    """Class -> why it holds: nodes a scale-up started that never joined (the provider still lists them)."""
    idle_since: dict[str, float] = msgspec.field(default_factory=dict)
    failures: int = 0
    outcomes: dict[tuple[str, str, str], int] = msgspec.field(default_factory=dict)
    """``(node_class, op, outcome)`` -> actions counted (outcome ``done`` or ``failed``)."""
    first_seen: dict[str, float] = msgspec.field(default_factory=dict)
    """Member -> wall seconds this node, leading, first saw it (forgotten once it is gone from the fleet)."""
    issued_at: dict[str, float] = msgspec.field(default_factory=dict)
    """Scale-up request id -> wall seconds this node first issued it (ids in the ledger only)."""
    claims_refused: dict[str, int] = msgspec.field(default_factory=dict)
    """Reason -> members' claims refused, once per scaling step that refused them (:data:`SCALING_CLAIM_REASONS`)."""
    refused_claims: dict[str, RefusedClaim] = msgspec.field(default_factory=dict)
    """Member -> its newest refused claim (at most :data:`MAX_REFUSED_CLAIMS`, in the order of last sight)."""

    def section(self, settings_digest: str, started_by: str) -> ScalingSection:
        """This node's ``scaling`` section: once it has led, its ledger, cooldown start and drain list under the
        last term it led (they keep travelling after it stops leading, for the next leader to adopt), and while
        it leads its verdicts."""
        if not self.led_term:
            return ScalingSection(settings_digest=settings_digest, started_by=started_by)
        return ScalingSection(settings_digest=settings_digest, started_by=started_by, provider=self.policy.provider,
                              ledger=self.ledger[-16:], last_action_at=max(0.0, self.last_action_at),
                              draining=sorted(self.draining)[:64], verdicts=self.verdicts[:32] if self.term else [],
                              term=self.led_term)

    def lead(self, term: int, sections: Sequence[tuple[str, ScalingSection]], wall: float, *,
             leaders_by_term: Mapping[int, str] | None = None) -> None:
        """This node leads ``term`` since ``wall`` (seconds), called at each of its steps: adopt the newest ledger
        among ``sections`` (``(origin, section)`` of the members, this node's own included) whose origin was
        elected in the term it names (``leaders_by_term``; None: trust every section, for tests of this core
        alone): a member that never led cannot plant actions. Sections are read again at every step until the
        settle (:data:`SETTLE_S`) ends, so a predecessor's newer section that arrives late is still merged.
        Adopted actions are kept only for a configured class and within its ``max_nodes`` (:meth:`_sane`). After
        a failover (a predecessor's section was seen) the provider is listed before acting: ``requested`` actions
        are reconciled, and nodes under request ids no ledger names (a leader that died before its ledger
        spread) count as starting. While a section names an earlier term whose leader is unknown here, nothing
        is done (:data:`UNVERIFIED_HOLD_S`). No new action before the settle (or the cooldown) passed."""
        if term != self.term:
            self.term, self.led_term, self.seq, self.led_since = term, term, 0, wall
            self.in_flight, self.reissue, self.provider_nodes, self.listing = "", [], None, False
            self.list_retry_at, self.list_backoff, self.relist, self.adopted = -math.inf, 0.0, False, None
            self.reconciled = True
        elif wall - self.led_since >= max(self._settle(), UNVERIFIED_HOLD_S if self.unverified else 0.0):
            return  # (while a ledger cannot be verified, sections are read until the hold ends)
        elected = [sec for origin, sec in sections if sec.term and sec.term < term
                   and (leaders_by_term is None or leaders_by_term.get(sec.term) == origin)]
        unknown = sorted({sec.term for _o, sec in sections if sec.term and sec.term < term and sec.ledger
                          and leaders_by_term is not None and sec.term not in leaders_by_term})
        best = max(elected, key=lambda s: (s.term, s.last_action_at), default=None)
        self.unverified = ""
        if unknown and (best is None or unknown[-1] > best.term):
            self.unverified = (f"a member shows a scaling ledger of term {unknown[-1]}, whose leader this node does "
                               f"not know: holding up to {UNVERIFIED_HOLD_S:.0f} s")
        if best is not None and self._adopt(best, wall) or self.unverified and self.provider_nodes is None:
            self._relist()

    def _adopt(self, best: ScalingSection, wall: float) -> bool:
        """Merge ``best`` (a predecessor's section) into this node's ledger, cooldown and drain list, once per
        version of it; whether an action of it is now in the ledger that was not, or not in that state."""
        mark = (best.term, best.last_action_at, tuple((a.id, a.updated) for a in best.ledger), tuple(best.draining))
        if mark == self.adopted:
            return False
        self.adopted = mark
        mine = {a.id: a for a in self.ledger}
        fresh = set()
        for a in best.ledger:
            if self._sane(a) and (a.id not in mine or a.updated > mine[a.id].updated):
                mine[a.id] = a
                fresh.add(a.id)
        self.ledger = sorted(mine.values(), key=lambda a: (a.at, a.id))[-16:]
        if 0 < best.last_action_at <= wall + 600.0:  # a stamp far ahead of this clock would stop scaling
            self.last_action_at = max(self.last_action_at, best.last_action_at)
        for n in best.draining:
            self.draining.setdefault(n, wall)
        return any(a.id in fresh for a in self.ledger) or self.provider_nodes is None

    def _relist(self) -> None:
        """List the provider before acting (a failover, or a ledger merged since the last list): at once, or
        again once the list under way answers (whether it succeeds or fails)."""
        if not self.policy.provider:
            return
        self.reconciled = False
        if self.listing:
            self.relist = True

    def _sane(self, a: ScalingAction) -> bool:
        """Whether an adopted action fits this node's policy: a configured class, at most its ``max_nodes``."""
        cp = self.policy.classes.get(a.node_class)
        return cp is not None and a.count <= cp.max_nodes and len(a.nodes) <= cp.max_nodes

    def resign(self) -> None:
        """This node no longer leads: it keeps its ledger (a later term adopts the newest), acts on nothing."""
        self.term, self.in_flight, self.listing = 0, "", False

    def step(self, fleet: Sequence[FleetNode], pending: Sequence[PlanPending], catalog: Catalog,
             predictor: PredictorLike | None, wall: float, *, vram_of: Mapping[str, float] | None = None,
             certified_class: Mapping[str, str] | None = None) -> list[ProviderCall | ProviderList]:
        """Evaluate and act (leader only): the effects to carry out. ``fleet`` as the members report themselves;
        ``certified_class``: node id -> the class a certificate of a pinned operator key gives it (the agent
        passes one, empty until certificates exist): each member then counts toward the class
        :func:`counted_fleet` gives it, never the one it claims. None (tests of this core alone): the fleet's
        classes and ``started_by`` are taken as given. When counting, a leader lists the provider before its
        term's first action (its nodes, started under any term, count from that listing on)."""
        if not self.term:
            return []
        counting = certified_class is not None
        if certified_class is not None:
            self._track_seen(fleet, wall)
            refused: dict[str, tuple[str, str]] = {}
            fleet = counted_fleet(fleet, self.named, self.provider_nodes, self.ledger, certified_class,
                                  first_seen=self.first_seen, issued_at=self.issued_at,
                                  classes=self.policy.classes, refused=refused)
            self._refused(refused, wall)
        self._track_idle(fleet, wall)
        if self.listing:
            return []
        if counting and self.provider_nodes is None and self.policy.provider:
            self.reconciled = False  # what the provider started counts only once it said so: list first, each term
        if not self.reconciled and self.policy.provider:
            if wall < self.list_retry_at:
                return []
            self.listing = True
            return [ProviderList()]
        starting = self._starting(fleet, wall)
        self.verdicts = evaluate_scaling(self.policy, [self._mark(n) for n in fleet], pending, catalog, predictor,
                                         wall, starting=starting, vram_of=vram_of)
        self._hold_misjoined(fleet, wall, named_only=counting)
        out: list[ProviderCall | ProviderList] = []
        self._undrain(fleet)
        drained = self._drained(fleet)
        if not self.policy.provider or self.in_flight:
            return out
        if self.unverified and wall - self.led_since < UNVERIFIED_HOLD_S:
            self.verdicts = [msgspec.structs.replace(v, verdict="hold", count=0, nodes=[], reason=self.unverified)
                             if v.verdict != "hold" else v for v in self.verdicts]
            return out
        again = self._reissue(fleet, wall)
        if again is not None:
            return [again]
        if self.check_due and wall - self.listed_at >= BOOT_GRACE_S and wall >= self.list_retry_at:  # never joined
            self.listing, self.check_due = True, False
            return [ProviderList()]
        if wall - self.last_action_at < self.policy.cooldown_s or wall - self.led_since < self._settle():
            return out
        for v in self.verdicts:  # waiting work first: a scale-up takes the cooldown's one action before a removal
            if v.verdict == "up":
                return [self._act("up", v.node_class, v.count, [], v.reason, wall, for_templates=v.for_templates)]
        for v in self.verdicts:
            if v.verdict == "down":
                for n in v.nodes:
                    self.draining.setdefault(n, wall)
        if drained:
            return [self._act("down", drained[0][1], 0, drained[0][0], "drained: jobs ended, data at R", wall)]
        return out

    def _reissue(self, fleet: Sequence[FleetNode], wall: float) -> ProviderCall | None:
        """The next action the reconciliation found not carried out, issued again under its own id; a removal
        only for the nodes that may still go (:func:`drained`: a new leader's plan may have given one work),
        the others drained anew."""
        present = {n.node_id: n for n in fleet}
        while self.reissue:
            aid = self.reissue.pop(0)
            i = next((i for i, a in enumerate(self.ledger) if a.id == aid and a.state == "requested"), None)
            if i is None:
                continue
            a = self.ledger[i]
            if a.op == "down":
                keep = [n for n in a.nodes if n not in present or drained(present[n])]
                for n in a.nodes:
                    if n not in keep:
                        self.draining.setdefault(n, wall)
                if not keep:
                    self.ledger[i] = msgspec.structs.replace(a, state="failed", updated=wall,
                                                             error="its nodes took work again: drained anew")
                    continue
                a = self.ledger[i] = msgspec.structs.replace(a, nodes=keep, count=len(keep))
            self.in_flight = a.id
            return ProviderCall(a)
        return None

    def _settle(self) -> float:
        return min(self.policy.cooldown_s, SETTLE_S)

    def next_deadline(self, wall: float) -> float:
        """Wall-clock seconds at which :meth:`step` has news to act on without new input (``inf``: none)."""
        if not self.term or not self.policy.provider:
            return math.inf
        due = [self.last_action_at + self.policy.cooldown_s, self.led_since + self._settle(), self.list_retry_at]
        due += [s + self.policy.idle_timeout_s for s in self.idle_since.values()]
        if self.unverified:
            due.append(self.led_since + UNVERIFIED_HOLD_S)
        later = [d for d in due if d > wall]
        return min(later, default=math.inf)

    def _mark(self, n: FleetNode) -> FleetNode:
        idle = self.idle_since.get(n.node_id)
        if idle == n.idle_since and (n.node_id in self.draining) == n.draining:
            return n
        return msgspec.structs.replace(n, idle_since=idle, draining=n.node_id in self.draining)

    def _track_seen(self, fleet: Sequence[FleetNode], wall: float) -> None:
        """When this node first saw each member (:func:`_unnamed_slots`); a member gone from the fleet is
        forgotten (back later, it is seen anew: only later than a request it might claim)."""
        present = {n.node_id for n in fleet}
        for n in fleet:
            self.first_seen.setdefault(n.node_id, wall)
        for k in [k for k in self.first_seen if k not in present]:
            del self.first_seen[k]
        ids = {a.id for a in self.ledger}
        for k in [k for k in self.issued_at if k not in ids]:
            del self.issued_at[k]

    def _refused(self, refused: Mapping[str, tuple[str, str]], wall: float) -> None:
        """Count the claims :func:`counted_fleet` refused this step, by reason and by member (bounded)."""
        for member, (reason, claimed) in refused.items():
            self.claims_refused[reason] = self.claims_refused.get(reason, 0) + 1
            e = self.refused_claims.pop(member, None)  # re-inserted: the dict's order is the order of last sight
            if e is None or e.reason != reason or e.claimed != claimed:
                e = RefusedClaim(member, reason, claimed[:MAX_REASON], first_at=wall)
            e.count += 1
            e.last_at = wall
            self.refused_claims[member] = e
            while len(self.refused_claims) > MAX_REFUSED_CLAIMS:
                del self.refused_claims[next(iter(self.refused_claims))]

    def refused_view(self) -> list[dict[str, object]]:
        """The members' refused claims, most recently seen first, as plain maps (``/status`` ``scaling``)."""
        return [msgspec.structs.asdict(e) for e in reversed(self.refused_claims.values())]

    def _track_idle(self, fleet: Sequence[FleetNode], wall: float) -> None:
        """Since when each member runs no job (on this leader's clock: a new leader starts the timers anew)."""
        seen = set()
        for n in fleet:
            seen.add(n.node_id)
            if n.running:
                self.idle_since.pop(n.node_id, None)
            else:
                self.idle_since.setdefault(n.node_id, wall)
        for k in [k for k in self.idle_since if k not in seen]:
            del self.idle_since[k]

    def _starting(self, fleet: Sequence[FleetNode], wall: float) -> dict[str, int]:
        """Nodes per class that scale-ups asked for and that have not joined. Past :data:`BOOT_GRACE_S` after the
        provider answered, they are checked through ``list()`` (again every :data:`BOOT_GRACE_S` while any stay):
        those it still lists (starting or running) keep counting against ``max_nodes`` and the cost, and hold
        their class (:attr:`stuck`); those it does not list (or a provider without a listing) no longer count."""
        ups = {a.id for a in self.ledger if a.op == "up"}
        for n in fleet:
            if n.started_by in ups:
                self.joined.setdefault(n.started_by, set()).add(n.node_id)
        self.joined = {k: v for k, v in self.joined.items() if k in ups}
        members = {n.node_id for n in fleet}
        out: dict[str, int] = {}
        self.stuck = {}
        for a in self.ledger:
            left = a.count - len(self.joined.get(a.id, ()))
            if a.op != "up" or a.state == "failed" or left <= 0:
                continue
            if a.state == "done" and wall - a.updated > BOOT_GRACE_S:
                listed = (self.provider_nodes.get(a.id, []) if self.provider_nodes is not None
                          and self.listed_at >= a.updated + BOOT_GRACE_S else None)  # [] : no longer listed
                if listed is None:
                    self.check_due = True  # counted until the provider says
                else:
                    left = min(left, sum(1 for node, state, _c in listed if state in ("starting", "running")
                                         and node not in members))
                    if left > 0:
                        self.check_due = True  # asked again every BOOT_GRACE_S while they stay
                        self.stuck[a.node_class] = (f"{left} node{'s' if left != 1 else ''} of action {a.id} never "
                                                    f"joined within {BOOT_GRACE_S:.0f} s though the provider lists "
                                                    "them: they count against max_nodes; check the provider")
            if left > 0:
                out[a.node_class] = out.get(a.node_class, 0) + left
        if self.provider_nodes:
            self._unknown_starting(fleet, out)
        return out

    def _unknown_starting(self, fleet: Sequence[FleetNode], out: dict[str, int]) -> None:
        """Add to ``out`` the nodes the provider's newest listing shows (starting or running) under request ids no
        ledger entry names, less those that joined (members by node id, or by ``started_by`` that id): a leader
        that died between its provider call and its ledger spreading started them, or their entry aged out of
        the ledger. They count as starting for their class until they join, or a later listing (asked every
        :data:`BOOT_GRACE_S` while they count) no longer shows them."""
        known = {a.id for a in self.ledger}
        members = {n.node_id for n in fleet}
        for rid, listed in (self.provider_nodes or {}).items():
            if rid in known:
                continue
            ids = {node for node, _s, _c in listed if node}
            alive = [cls for node, state, cls in listed if state in ("starting", "running") and node not in members]
            cls = next((c for c in alive if c in self.policy.classes), "")
            # members that joined under the id but are listed without their node id (the provider never learnt it)
            left = len(alive) - sum(1 for n in fleet if n.started_by == rid and n.node_id not in ids)
            if cls and left > 0:
                out[cls] = out.get(cls, 0) + left
                self.check_due = True

    def _hold_misjoined(self, fleet: Sequence[FleetNode], wall: float, *, named_only: bool = False) -> None:
        """A class holds while a scale-up of it started nodes that joined as another class (a provider configured
        wrong: nodes that cannot run the class's work would be started without end), for the boot grace after
        that action (a member claiming a ``started_by`` later holds nothing), and while nodes it started never
        joined (:attr:`stuck`). ``named_only``: only members whose node id the provider named are looked at (a
        member's own claims hold nothing)."""
        recent = {a.id: a.node_class for a in self.ledger if a.op == "up" and wall - a.updated <= BOOT_GRACE_S}
        why = dict(self.stuck)
        wrong: dict[str, list[str]] = {}
        for n in fleet:
            cls = recent.get(n.started_by)
            joined_as = n.reported_class or n.node_class
            if cls is not None and joined_as != cls and (not named_only or n.node_id in self.named):
                wrong.setdefault(cls, []).append(f"{n.node_id} as {joined_as}")
        for cls, nodes in wrong.items():
            why[cls] = (f"nodes started for {cls} joined as another class ({', '.join(nodes[:3])}): check the "
                        "provider's node settings")
        if why:
            self.verdicts = [v if v.node_class not in why else msgspec.structs.replace(
                v, verdict="hold", count=0, nodes=[], reason=why[v.node_class][:MAX_REASON]) for v in self.verdicts]

    def _undrain(self, fleet: Sequence[FleetNode]) -> None:
        """A draining node whose class has waiting work again is kept (its drain is cancelled); one that left is
        forgotten."""
        present = {n.node_id: n for n in fleet}
        wanted = {v.node_class for v in self.verdicts if v.queued}
        for node in list(self.draining):
            n = present.get(node)
            if n is None and not any(node in a.nodes and a.state == "requested" for a in self.ledger):
                del self.draining[node]
            elif n is not None and n.node_class in wanted:
                del self.draining[node]

    def _drained(self, fleet: Sequence[FleetNode]) -> list[tuple[list[str], str]]:
        """Draining nodes ready to go (no job, nothing below R), grouped per class: ``[(nodes, class)]``."""
        ready: dict[str, list[str]] = {}
        removing = {n for a in self.ledger if a.op == "down" and a.state == "requested" for n in a.nodes}
        for n in fleet:  # (an adopted drain list is checked again: only what may go, goes)
            if n.node_id in self.draining and drained(n) and n.node_id not in removing:
                ready.setdefault(n.node_class, []).append(n.node_id)
        return [(sorted(v)[:64], c) for c, v in sorted(ready.items())]

    def _act(self, op: Literal["up", "down"], cls: str, count: int, nodes: list[str], reason: str,
             wall: float, *, for_templates: Sequence[str] = ()) -> ProviderCall:
        """Record and issue an action (a scale-up names the templates it is for, ``for_templates``). When the
        class's newest action of ``op`` failed, the same need is tried again under that action's id (a call that
        failed or hung may have started machines: the provider does nothing twice for one id); otherwise under a
        new id ``"<term>-<n>-<ms>"``."""
        newest = next((i for i in range(len(self.ledger) - 1, -1, -1)
                       if self.ledger[i].node_class == cls and self.ledger[i].op == op), None)
        count = count if op == "up" else len(nodes)
        if newest is not None and self.ledger[newest].state == "failed":
            old = self.ledger.pop(newest)
            a = msgspec.structs.replace(old, state="requested", count=count, nodes=nodes, at=wall, updated=wall,
                                        reason=reason[:MAX_REASON], error="", tries=old.tries + 1,
                                        for_templates=list(for_templates)[:MAX_FOR_TEMPLATES])
        else:
            self.seq += 1
            a = ScalingAction(id=f"{self.term}-{self.seq}-{int(wall * 1000) % 10**9}", op=op, node_class=cls,
                              term=self.term, at=wall, count=count, nodes=nodes, reason=reason[:MAX_REASON], tries=1,
                              updated=wall, for_templates=list(for_templates)[:MAX_FOR_TEMPLATES])
            self.issued_at[a.id] = wall  # a retry under the same id keeps its first issue (_unnamed_slots)
        self.ledger = [*self.ledger, a][-16:]
        self.last_action_at = wall
        self.in_flight = a.id
        return ProviderCall(a)

    def result(self, action_id: str, error: str, wall: float, nodes: Listed | None = None) -> None:
        """The provider answered ``action_id``: ``error`` "" (done) or why it failed (counted; if the need
        remains after the cooldown, the action is tried again under the same id: :meth:`_act`). ``nodes``: what
        the provider answered, as ``(request_id, node_id, state, node_class)``: the nodes it names by node id
        count toward their class from now on (:func:`counted_fleet`)."""
        if self.in_flight == action_id:
            self.in_flight = ""
        if not error:
            self._name(nodes or ())
        for i, a in enumerate(self.ledger):
            if a.id == action_id and a.state == "requested":
                state: Literal["done", "failed"] = "failed" if error else "done"
                self.ledger[i] = msgspec.structs.replace(a, state=state, error=one_line(error), updated=wall)
                key = (a.node_class, a.op, state)
                self.outcomes[key] = self.outcomes.get(key, 0) + 1
                if error:
                    self.failures += 1
                elif a.op == "down":
                    for n in a.nodes:
                        self.draining.pop(n, None)

    def _name(self, nodes: Listed) -> None:
        """Record the nodes a provider's answer names by node id (at most :data:`MAX_NAMED` kept)."""
        for request_id, node_id, state, node_class in nodes:
            if node_id and (node_id in self.named or len(self.named) < MAX_NAMED):
                self.named[node_id] = (request_id, state, node_class)

    def listed(self, nodes: Listed | None, error: str, wall: float) -> list[ProviderCall]:
        """The provider's ``list()`` (None with ``error`` when it failed: asked again, whatever it was for, after
        the backoff :data:`LIST_RETRY_S`): kept for the never-joined check (:meth:`_starting`); ``requested``
        actions it carried out are done; the others are queued to be issued again under their own id, one at a
        time, by :meth:`step` (which checks a removal's nodes against the fleet first). Returns no effect
        itself."""
        self.listing = False
        if nodes is None:
            self.failures += 1
            self.relist = False
            if self.reconciled:  # the never-joined check's list: due again after the backoff
                self.check_due = True
            self.list_backoff = min(max(LIST_RETRY_S[0], 2.0 * self.list_backoff), LIST_RETRY_S[1],
                                    max(LIST_RETRY_S[0], self.policy.cooldown_s))
            self.list_retry_at = wall + self.list_backoff
            return []
        self.list_backoff, self.list_retry_at = 0.0, -math.inf
        by_request: dict[str, list[tuple[str, str, str]]] = {}
        for request_id, node_id, state, node_class in nodes:
            by_request.setdefault(request_id, []).append((node_id, state, node_class))
        self.provider_nodes, self.listed_at = by_request, wall
        self.named = {}  # the listing is the provider's whole truth: what it no longer lists counts no more
        self._name(nodes)
        node_state = {node: state for node, state, _c in (x for xs in by_request.values() for x in xs) if node}
        for i, a in enumerate(self.ledger):
            if a.state != "requested":
                continue
            seen = by_request.get(a.id, [])
            # a removal is done when each of its nodes is listed stopping or stopped, whatever request it is listed
            # under (a provider lists a node under the request that started it); one not listed is issued again
            if a.op == "up" and len(seen) >= a.count or a.op == "down" and a.nodes and all(
                    node_state.get(n) in ("stopping", "stopped") for n in a.nodes):
                self.ledger[i] = msgspec.structs.replace(a, state="done", updated=wall)
            else:
                self.ledger[i] = msgspec.structs.replace(a, tries=a.tries + 1, updated=wall)
                if a.id not in self.reissue:
                    self.reissue.append(a.id)
        self.reconciled = not self.relist
        self.relist = False
        return []
