"""The facts a plan was computed from, as ``GET /plan?inputs=1`` serves them (issue 38: a pending reason is checked
against the planner's accounting of the same plan version, not against fresher facts read from each node). Pure.

The leader keeps (:class:`KeptInputs`), for its last :data:`ROUNDS_KEPT` plans (only the newest is served),
a reference to the :class:`p2pnode.node._plans.LeadResult` the plan came from: the
:class:`p2pnode.scheduler.ClusterView` it planned on (every member's :class:`~p2pnode.scheduler.NodeView` and the jobs
it accounted as running or assigned) and the cordoned members. Nothing is computed per plan beyond keeping that
reference (the memory of two views: 3 to 7 MiB a plan at
2,000 members x 8 GPUs and 16,000 jobs); :func:`plan_inputs_doc` turns one into a bounded, typed document only when a
reader asks for it, and the JSON of the newest one asked for is kept (:meth:`KeptInputs.encoded`): building it takes
about 0.3 s at that size, so the leader builds it once per plan, off its event loop
(:meth:`p2pnode.jobs._leading.LeaderRole.plan_inputs_json`), however often it is asked for.

What a member's entry says is what the planner read of it: its GPU ``offer`` (0 for a cordoned member: the planner
got it so) and ``cpu_offer``, its degradation ``level``, tags, tier, CPUs and memory it gives to jobs, the guard's
VRAM ratio (``vram_limit_ratio``: usable VRAM per GPU = VRAM x it), disk, and per GPU its VRAM, usable VRAM, ``full``
(over the guard's measured memory limit) and the VRAM and fraction the running jobs it was given hold there at the
plan's start (``committed_gib``, ``fraction``: sums over :attr:`PlanInputs.running`, every job as given, those the
plan stops included). ``running`` lists the jobs of members the plan gave no view too (dead within the orphan grace,
or withheld): they count for the planner (instances, trainings) though they hold no listed GPU. The plan's own
assignments and stops are the plan document's.
"""

from __future__ import annotations

import gc
from collections import defaultdict, deque

import msgspec

from ..scheduler import node_tier
from ..scheduler._gpucap import usable_vram_gib
from ..snapshot import PlanSection
from ._plans import LeadResult

__all__ = ["MAX_INPUT_JOBS", "MAX_INPUT_MEMBERS", "ROUNDS_KEPT", "KeptInputs", "PlanInputGpu", "PlanInputJob",
           "PlanInputMember", "PlanInputs", "plan_inputs_doc", "plan_inputs_json"]

ROUNDS_KEPT = 2
"""Planning rounds kept: only the plan the leader's published ref names is served, so the newest and the one before
(a read in flight while the next plan is published); each round at 2,000 members holds 3-7 MiB."""
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
    planned with the room their offers prove (running list unknown), ``withheld``: members given no view (both at
    most :data:`MAX_INPUT_MEMBERS`, by node id), ``held_configs``: configs whose new training waited for an unknown
    running list."""

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
    :data:`MAX_INPUT_JOBS` (members by node id; the jobs of the members listed and of those given no view, in the
    planner's order: only the jobs of members cut at the bound are left out)."""
    view = r.view
    ids = sorted(view.nodes)[:MAX_INPUT_MEMBERS]
    listed = set(ids)
    held: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    jobs: list[PlanInputJob] = []
    for j in view.running:
        if j.node_id not in listed and j.node_id in view.nodes:
            continue  # a member cut at the bound
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
                      offered_unknown=list(r.offered_unknown[:MAX_INPUT_MEMBERS]),
                      withheld=list(r.withheld[:MAX_INPUT_MEMBERS]), held_configs=list(r.held_configs))


def plan_inputs_json(r: LeadResult) -> bytes:
    """:func:`plan_inputs_doc` of ``r``, encoded as JSON (what ``GET /plan?inputs=1`` serves as ``inputs``). Reads
    only ``r``, which nothing changes once the planner returned it: safe in a worker thread. The cyclic garbage
    collector is paused meanwhile, as while planning (:meth:`p2pnode.node._plans.Planner.lead`): the document is
    tens of thousands of acyclic objects, and a full collection their allocation triggers walks every kept round
    holding the interpreter lock (measured at 2,000 members, in a worker thread: the event loop stalled up to 0.6 to
    1.2 s with it, 70 to 90 ms without; ``bench/plan_inputs_cost.py``)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return msgspec.json.encode(plan_inputs_doc(r))
    finally:
        if enabled:
            gc.enable()


class KeptInputs:
    """The planning rounds of the last :data:`ROUNDS_KEPT` plans a leader made (references), and
    the JSON of the newest document built from one of them (:meth:`encoded`)."""

    def __init__(self) -> None:
        self._kept: deque[LeadResult] = deque(maxlen=ROUNDS_KEPT)
        self._encoded: tuple[tuple[int, int, str], bytes] | None = None

    def made(self, r: LeadResult | None, section: PlanSection) -> None:
        """The leader published plan ``section``; ``r`` its newest planning round (kept when it made ``section``).
        The JSON kept of a round no longer kept goes with it."""
        if r is not None and r.section is section:
            self._kept.append(r)
        if self._encoded is not None and self.round_of_key(self._encoded[0]) is None:
            self._encoded = None

    def round_of_key(self, key: tuple[int, int, str]) -> LeadResult | None:
        """The kept round that made plan ``key`` (term, seq, digest), or None."""
        return next((r for r in reversed(self._kept) if (r.section.term, r.section.seq, r.section.digest) == key),
                    None)

    def round_of(self, p: PlanSection) -> LeadResult | None:
        """The kept round that made plan ``p`` (same term, seq and digest), or None."""
        return self.round_of_key((p.term, p.seq, p.digest))

    def of(self, p: PlanSection) -> PlanInputs | None:
        """The facts plan ``p`` was computed from, when one of the kept rounds made it (same term, seq and digest)."""
        r = self.round_of(p)
        return plan_inputs_doc(r) if r is not None else None

    def encoded(self, p: PlanSection) -> bytes | None:
        """The JSON of plan ``p``'s document when it was built already (:meth:`keep_encoded`), else None."""
        e = self._encoded
        return e[1] if e is not None and e[0] == (p.term, p.seq, p.digest) else None

    def keep_encoded(self, p: PlanSection, data: bytes) -> None:
        """Keep ``data``, the JSON of plan ``p``'s document (:func:`plan_inputs_json`), in place of any other (one is
        kept: readers ask for the plan served, the newest), while ``p``'s round is kept."""
        if self.round_of(p) is not None:
            self._encoded = ((p.term, p.seq, p.digest), data)
