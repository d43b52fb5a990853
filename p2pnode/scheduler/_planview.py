"""The planner's inputs and outputs (pure): the cluster view (:class:`NodeView`, :class:`GpuView`,
:class:`RunningJob`, :class:`ClusterView`), the plan (:class:`Assignment`, :class:`Stop`, :class:`Pending`,
:class:`Plan`), the knobs and what is kept between plans (:class:`SchedulerConfig`, :class:`SchedulerState`), and
when a leader plans (:func:`plan_due`, :func:`next_plan_at`). :func:`p2pnode.scheduler.plan` turns the first into the
second (:mod:`._plan`); every name here is re-exported there and by :mod:`p2pnode.scheduler`.

Tiers (seed 003): tier 1 has a GPU with >= 80 GiB or >= 192 GiB on the node, tier 2 a GPU with >= 32 GiB,
tier 3 a GPU with >= 8 GiB; tier 4 is anything smaller (or no GPU).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Protocol

import msgspec

from ..snapshot import GangSlot, PlanJobId
from ._predict import Prediction
from ._weights import FactorWeights

__all__ = [
    "PLAN_MIN_GAP_S",
    "Assignment",
    "ClusterView",
    "GpuView",
    "NodeView",
    "Pending",
    "Plan",
    "PredictorLike",
    "RunningJob",
    "SchedulerConfig",
    "SchedulerState",
    "Stop",
    "next_plan_at",
    "node_tier",
    "plan_due",
]


class GpuView(msgspec.Struct, frozen=True):
    """One GPU of a node as the planner sees it: its ``index`` on the node, its memory in GiB, and ``full``: its
    memory is over the guard's GPU limit (measured, whoever uses it), so it takes no new work. ``kept``: a
    leaderless durable node keeps it free for a training of a stable kind (:func:`p2pnode.scheduler._stable.
    reserve_for_stable`, only in that node's own autonomous plan: never on the wire); it takes no new work."""

    index: int
    vram_gib: float
    full: bool = False
    kept: bool = False


class NodeView(msgspec.Struct, frozen=True):
    """A node as the planner sees it: GPUs, tags, provider facts, offers (GPU jobs and CPU-only jobs it accepts
    now) and guard state."""

    node_id: str
    gpus: tuple[GpuView, ...]
    tags: frozenset[str] = frozenset()
    cost_per_hour: float = 0.0
    ephemeral: bool = False
    offer: int = 0
    level: int = 0
    disk_percent: float = 0.0
    disk_max_percent: float = 70.0
    cpus: float = 0.0
    """CPUs the node gives to jobs (0: not accounted)."""
    memory_gib: float = 0.0
    """Memory the node gives to jobs, GiB (0: not accounted)."""
    custom: tuple[tuple[str, float], ...] = ()
    """Custom resources (Ray's sense), e.g. ``(("nvlink", 1.0),)``; a job requesting one needs it here."""
    vram_limit_ratio: float = 1.0
    """Share of each GPU's VRAM the planner may commit (the guard's GPU memory limit, e.g. 0.8)."""
    waiting: int = 0
    """Assignments the node accepted and holds back for its spawn-rate limit (they hold their GPUs)."""
    spawn_rate: float = 0.0
    """The node's spawn-rate limit, jobs a minute (0: not reported)."""
    cpu_offer: int = 0
    """CPU-only jobs (``num_gpus = 0``) the node accepts now (:func:`p2pnode.scheduler.cpu_offer`); ``offer`` is
    for GPU jobs only."""
    host: str = ""
    """The host peers reach the node at (its advertised address): a gang's rendezvous when it holds rank 0 ("":
    it takes no gang member)."""
    engines: frozenset[str] = frozenset({"process"})
    """The engines the node can run (:data:`p2pnode.scheduler.ENGINES`, fingerprinted by the node)."""
    power: float = 0.0
    """GPU power score (:func:`p2pnode.resources.power_of_gpus`): a gang's rank 0 is its strongest member."""
    node_class: str = ""
    """The node's class for predictions (:func:`p2pnode.scheduler.node_class_of`: GPU count and model, e.g.
    ``"8xH100"``, ``"cpu"``; "": unknown, the fleet-wide figures apply)."""


def node_tier(n: NodeView) -> int:
    """Tier 1-4 of a node (module docstring, "Tiers")."""
    return _tier_of(tuple([g.vram_gib for g in n.gpus]))


@functools.lru_cache(maxsize=4096)
def _tier_of(vram: tuple[float, ...]) -> int:
    """Tier of a node with GPUs of ``vram`` GiB each (a fleet has few distinct shapes: cached)."""
    top = max(vram, default=0.0)
    if top >= 80 or sum(vram) >= 192:
        return 1
    if top >= 32:
        return 2
    if top >= 8:
        return 3
    return 4


class RunningJob(NamedTuple):
    """A job instance running (or assigned) somewhere: which GPUs, what fraction of each, VRAM per GPU. A named
    tuple, not a frozen dataclass: the leader builds one per running job per plan (9,500 at 1,000 x 8 GPUs), and a
    tuple is built several times faster."""

    job_id: str
    template: str
    node_id: str
    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 0.0
    vram_gib: float = 0.0
    started_at: float = 0.0
    """When it started: Unix seconds stamped by the member that runs it (its runner's ``time.time()`` at the
    start, :attr:`p2pnode.snapshot.JobReport.started_at`); 0.0 unknown (assigned and not reported yet, or a
    report without it). Its elapsed time is ``ClusterView.wall - started_at``."""
    term: int = 0
    plan_id: PlanJobId | None = None
    """``job_id`` parsed when it is a leader's ``<term>-<seq>`` (from the typed snapshot, never re-parsed)."""
    gang: GangSlot | None = None
    """The member's place in its gang (None: not a gang member)."""


class PredictorLike(Protocol):
    """What the planner asks of a predictor (:class:`p2pnode.scheduler.Predictor`, or a simulation's or test's
    own): what one run of ``template`` on a node of ``node_class`` ("": any) needs, or None (nothing known). Only
    predictions with ``source == "history"`` move a plan; the declared values are the catalog's already."""

    def predict(self, template: str, node_class: str = "") -> Prediction | None: ...


class ClusterView(msgspec.Struct, frozen=True):
    """The planner's input about the fleet: every node by id, and the jobs running or assigned; with a
    ``predictor``, what runs is expected to need and when it ends (:mod:`._plan`, "Predictions")."""

    nodes: dict[str, NodeView]
    running: tuple[RunningJob, ...] = ()
    gang_ends: dict[str, str] = {}
    """Gangs the leader's gang table ended (:mod:`p2pnode.node._gangs`: a member failed, gone or down, its members
    disagree, or it completed and its grace passed), gang id -> the reason in words: every member of one still
    running is stopped (rule ``gang_ended``). The planner decides no gang's end itself."""
    predictor: PredictorLike | None = None
    """The fleet's predictions (None: none; the plan is then exactly what it was before predictions existed)."""
    wall: float = 0.0
    """Unix seconds on the leader's clock when the view was taken: a running job's elapsed time is ``wall -
    started_at`` (its member's stamp; clocks of NTP-synchronised hosts differ by far less than the horizons
    this is used for). 0.0: unknown (no job has a predicted end)."""


class Assignment(msgspec.Struct, frozen=True):
    """Start one instance of ``template`` on ``node_id``: which GPUs, the fraction of each, VRAM per GPU (GiB,
    at least the config's floor), the checked ``params``, the plan's ``term`` (fencing token) and its score;
    ``memory_gib`` and ``vram_peak_gib`` the predicted figures it was placed by (:func:`._nodefit.figures_of`;
    None and 0: the declared ones), which the plan carries to the node (:class:`p2pnode.snapshot.PlanJob`)."""

    job_id: str
    template: str
    node_id: str
    gpus: tuple[int, ...]
    gpu_fraction: float
    vram_gib: float
    params: tuple[tuple[str, Any], ...]
    term: int
    score: float
    gang: GangSlot | None = None
    memory_gib: float | None = None
    vram_peak_gib: float = 0.0


class Stop(msgspec.Struct, frozen=True):
    """Stop job ``job_id`` on ``node_id`` (``reason`` in words), letting it finish within ``grace_s`` seconds;
    ``rule``: the stop rule it records (:data:`p2pnode.node._jobstate.StopRule`): ``plan`` (a preemption, a
    duplicate training), ``template_removed`` or ``gang_ended``."""

    job_id: str
    node_id: str
    reason: str
    grace_s: float
    rule: str = "plan"


class Pending(msgspec.Struct, frozen=True):
    """A template that wants another instance and got none, ``reason`` in words; it has waited ``wait_s`` seconds."""

    template: str
    reason: str
    wait_s: float


class Plan(msgspec.Struct, frozen=True):
    """A leader's decision for ``term`` (the fencing token): start these, stop those, and why the rest wait."""

    term: int
    computed_at: float
    assignments: tuple[Assignment, ...]
    stops: tuple[Stop, ...]
    pending: tuple[Pending, ...]
    budget_used: bool = False
    """The plan stopped at :attr:`SchedulerConfig.max_assignments` with work left and offers unused: plan again
    soon (see :func:`plan_due`)."""


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Planner knobs. ``starvation_cap_s``: wait at which the starvation factor is full; ``candidates``: feasible
    nodes scored per tier (Nomad-style limit); ``preemption_gap``: priority points (Nomad: 10)."""

    weights: FactorWeights = msgspec.field(default_factory=FactorWeights)
    starvation_cap_s: float = 1800.0
    candidates: int = 8
    preemption_gap: int = 10
    grace_s: float = 30.0
    max_assignments: int = 1024
    """Placements per plan at most (the rest wait for the next plan, see :func:`plan_due`): bounds a plan's time,
    as a scheduler pass. A placement costs O(1) node scorings (each shape keeps its window of candidates), so
    1,024 placements on 1,000 nodes take about 25 ms on a slow 2-core machine (128 before issue 15)."""
    score_tolerance: float = 0.002
    """Lazy greedy: a re-scored template is placed if within this of the next stale score (scores are 0-1)."""
    gang_ports: tuple[int, int] = (29400, 30399)
    """Ports (first, last) gang members' blocks are cut from, on every node: the rendezvous, Ray's ports."""
    gang_port_block: int = 64
    """Ports per gang member (one block per member on its node; no two gangs on a node share a port)."""
    gang_complete_grace_s: float = 30.0
    """Once a gang's rank 0 ended with status 0, the members still running get this long to end by themselves
    (torchrun ranks finishing their last collective) before they are stopped (a Ray cluster's workers)."""
    preempt_wait_s: float = 120.0
    """With predictions: a template that fits nowhere waits instead of preempting when a job whose end would
    make room is predicted (its run time median on its node's class) to end within this many seconds. Longer
    waits save more running work from preemption and delay high-priority work more; 0 never waits."""
    wait_checks: int = 256
    """With predictions: predicted ends tried per waiting template, at most (each costs a fit test), when
    looking for the one that makes room (a reason's expected wait, or a wait instead of a preemption)."""


class SchedulerState(msgspec.Struct):
    """What the planner remembers between plans: since when each template has been waiting (monotonic s)."""

    pending_since: dict[str, float] = msgspec.field(default_factory=dict)
    job_seq: int = 0


PLAN_MIN_GAP_S = 1.0
"""Default least gap (seconds) between two plans of a leader planning on demand (:func:`plan_due`)."""


def plan_due(now: float, last_plan_at: float | None, *, interval_s: float, min_gap_s: float = PLAN_MIN_GAP_S,
             capacity_changed: bool = False, budget_used: bool = False) -> bool:
    """Whether the leader plans at ``now`` (monotonic s): every ``interval_s``, and on demand -- but never less
    than ``min_gap_s`` after its last plan -- when capacity appeared since that plan (``capacity_changed``: a
    job ended, a node joined, an offer rose) or that plan stopped at its placement budget with work and offers
    left (``budget_used``, :attr:`Plan.budget_used`). No plan yet (``last_plan_at`` None): at once. Equal to
    ``now >= next_plan_at(...)`` with ``capacity_changed_at=now`` when ``capacity_changed``."""
    if last_plan_at is None:
        return True
    elapsed = now - last_plan_at
    return elapsed >= interval_s or ((capacity_changed or budget_used) and elapsed >= min_gap_s)


def next_plan_at(last_plan_at: float | None, *, interval_s: float, min_gap_s: float = PLAN_MIN_GAP_S,
                 capacity_changed_at: float | None = None, budget_used: bool = False) -> float:
    """The deadline form of :func:`plan_due` (a driver sleeps until it): ``last_plan_at + interval_s``, brought
    forward to ``max(last_plan_at + min_gap_s, capacity_changed_at)`` when capacity appears at
    ``capacity_changed_at``, or to ``last_plan_at + min_gap_s`` when the last plan used its budget. No plan yet:
    ``-inf`` (now)."""
    if last_plan_at is None:
        return float("-inf")
    due = last_plan_at + interval_s
    if budget_used:
        due = min(due, last_plan_at + min_gap_s)
    if capacity_changed_at is not None:
        due = min(due, max(last_plan_at + min_gap_s, capacity_changed_at))
    return due
