"""The facts a plan was computed from, as ``GET /plan?inputs=1`` serves them (issue 38: a pending reason is checked
against the planner's accounting of the same plan version, not against fresher facts read from each node). Pure.

The leader keeps (:class:`KeptInputs`), for each of the plans it still serves (:data:`p2pnode.node._lead.PLANS_KEPT`),
a reference to the :class:`p2pnode.node._plans.LeadResult` the plan came from: the
:class:`p2pnode.scheduler.ClusterView` it planned on (every member's :class:`~p2pnode.scheduler.NodeView` and the jobs
it accounted as running or assigned) and the cordoned members. Nothing is computed per plan beyond keeping that
reference (the memory of as many views as plans kept: about as much as the plans themselves);
:func:`plan_inputs_doc` turns one into a bounded, typed document only when a reader asks for it.

What a member's entry says is what the planner read of it: its GPU ``offer`` (0 for a cordoned member: the planner
got it so) and ``cpu_offer``, its degradation ``level``, tags, tier, CPUs and memory it gives to jobs, the guard's
VRAM ratio (``vram_limit_ratio``: usable VRAM per GPU = VRAM x it), disk, and per GPU its VRAM, usable VRAM, ``full``
(over the guard's measured memory limit) and the VRAM and fraction the running jobs it was given hold there at the
plan's start (``committed_gib``, ``fraction``: sums over :attr:`PlanInputs.running`, every job as given, those the
plan stops included). The plan's own assignments and stops are the plan document's.
"""

from __future__ import annotations

from collections import defaultdict, deque

import msgspec

from ..scheduler import node_tier
from ..scheduler._gpucap import usable_vram_gib
from ..snapshot import PlanSection
from ._lead import PLANS_KEPT
from ._plans import LeadResult

__all__ = ["MAX_INPUT_JOBS", "MAX_INPUT_MEMBERS", "KeptInputs", "PlanInputGpu", "PlanInputJob", "PlanInputMember",
           "PlanInputs", "plan_inputs_doc"]

MAX_INPUT_MEMBERS = 2048
"""Members one inputs document lists at most (by node id; ``members_total`` says how many the plan had)."""
MAX_INPUT_JOBS = 16384
"""Running jobs one inputs document lists at most (``running_total`` says how many the plan accounted)."""


class PlanInputGpu(msgspec.Struct, frozen=True):
    """One GPU of a member as the planner was given it: ``vram_gib`` its memory, ``usable_gib`` what the planner may
    commit (VRAM x the member's ``vram_limit_ratio``), ``full`` over the guard's measured limit (no new work),
    ``committed_gib`` and ``fraction`` what the running jobs it was given hold there at the plan's start."""

    index: int
    vram_gib: float
    usable_gib: float
    full: bool
    committed_gib: float
    fraction: float


class PlanInputMember(msgspec.Struct, frozen=True):
    """One member as the planner was given it (module docstring)."""

    node: str
    tier: int
    offer: int
    cpu_offer: int
    level: int
    cordoned: bool
    ephemeral: bool
    tags: list[str]
    cpus: float
    memory_gib: float
    vram_limit_ratio: float
    disk_percent: float
    disk_max_percent: float
    waiting: int
    gpus: list[PlanInputGpu]


class PlanInputJob(msgspec.Struct, frozen=True):
    """A job the planner accounted as running or assigned (carried over) when the plan began."""

    job_id: str
    template: str
    node: str
    gpus: list[int]
    gpu_fraction: float
    vram_gib: float


class PlanInputs(msgspec.Struct, frozen=True):
    """The facts plan ``(term, seq, digest)`` was computed from (module docstring); ``offered_unknown``: members
    planned with the room their offers prove (running list unknown), ``withheld``: members given no view,
    ``held_configs``: configs whose new training waited for an unknown running list."""

    term: int
    seq: int
    digest: str
    members: list[PlanInputMember]
    running: list[PlanInputJob]
    members_total: int
    running_total: int
    offered_unknown: list[str]
    withheld: list[str]
    held_configs: list[str]


def plan_inputs_doc(r: LeadResult) -> PlanInputs:
    """The document of the facts ``r``'s plan was computed from, bounded by :data:`MAX_INPUT_MEMBERS` and
    :data:`MAX_INPUT_JOBS` (members by node id; the jobs of the members listed, in the planner's order)."""
    view = r.view
    ids = sorted(view.nodes)[:MAX_INPUT_MEMBERS]
    listed = set(ids)
    held: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    jobs: list[PlanInputJob] = []
    for j in view.running:
        if j.node_id not in listed:
            continue
        for i in j.gpus:
            h = held[(j.node_id, i)]
            h[0] += j.vram_gib
            h[1] += j.gpu_fraction
        if len(jobs) < MAX_INPUT_JOBS:
            jobs.append(PlanInputJob(j.job_id, j.template, j.node_id, list(j.gpus), j.gpu_fraction, j.vram_gib))
    members = []
    for nid in ids:
        v = view.nodes[nid]
        gpus = [PlanInputGpu(g.index, g.vram_gib, usable_vram_gib(g.vram_gib, v.vram_limit_ratio), g.full,
                             *held.get((nid, g.index), (0.0, 0.0))) for g in v.gpus]
        members.append(PlanInputMember(
            node=nid, tier=node_tier(v), offer=v.offer, cpu_offer=v.cpu_offer, level=v.level,
            cordoned=nid in r.cordoned, ephemeral=v.ephemeral, tags=sorted(v.tags), cpus=v.cpus,
            memory_gib=v.memory_gib, vram_limit_ratio=v.vram_limit_ratio, disk_percent=v.disk_percent,
            disk_max_percent=v.disk_max_percent, waiting=v.waiting, gpus=gpus))
    s = r.section
    return PlanInputs(term=s.term, seq=s.seq, digest=s.digest, members=members, running=jobs,
                      members_total=len(view.nodes), running_total=len(view.running),
                      offered_unknown=list(r.offered_unknown), withheld=list(r.withheld),
                      held_configs=list(r.held_configs))


class KeptInputs:
    """The planning rounds of the last :data:`~p2pnode.node._lead.PLANS_KEPT` plans a leader made (references)."""

    def __init__(self) -> None:
        self._kept: deque[LeadResult] = deque(maxlen=PLANS_KEPT)

    def made(self, r: LeadResult | None, section: PlanSection) -> None:
        """The leader published plan ``section``; ``r`` its newest planning round (kept when it made ``section``)."""
        if r is not None and r.section is section:
            self._kept.append(r)

    def of(self, p: PlanSection) -> PlanInputs | None:
        """The facts plan ``p`` was computed from, when one of the kept rounds made it (same term, seq and digest)."""
        r = next((r for r in reversed(self._kept) if (r.section.term, r.section.seq, r.section.digest)
                  == (p.term, p.seq, p.digest)), None)
        return plan_inputs_doc(r) if r is not None else None
