"""The job core's inputs and effects (:mod:`p2pnode.node._jobs`): what a driver hands :class:`p2pnode.node.JobCore`
at each step (:class:`JobInputs`, with :class:`Leadership`, :class:`MemberJobs` and the :class:`LocalJob` s running
here) and the typed effects it returns (:data:`Effect`). Plain msgspec structs, no behaviour of their own beyond
the election's plan fencing (:meth:`Leadership.acting`) and a running job's entry in this node's running list
(:meth:`LocalJob.report`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec

from ..gossip import MemberState
from ..guardcore import Pressure
from ..scheduler import NodeView, ResourceRequest, Signals
from ..snapshot import GangSlot, JobReport, OperatorSection, PlanJob, PlanRef, PlanSection, ScalingSection
from ._acting import acting_plan
from ._jobstate import StopRule

if TYPE_CHECKING:  # the scaling core loads with job control's scaling only (issue 43: an idle agent's RSS)
    from ..scheduler._scaling import ProviderCall, ProviderList

__all__ = ["CancelFetch", "Effect", "Fetch", "FetchCheckpoint", "JobInputs",
           "Leadership", "LocalJob", "MemberJobs", "OfferSample", "PublishPlan",
           "Quarantine", "Refuse", "StartJob", "StopJob", "whole_version"]


# -- inputs -------------------------------------------------------------------------------------------------------
class LocalJob(msgspec.Struct, frozen=True):
    """A job running on this node as the core sees it: ``started_at`` monotonic seconds (this run's clock),
    ``adopted`` when it survived an agent restart, ``stopping`` once a stop was asked for; ``started_wall`` the Unix
    seconds of its start as the executor observed it (its ledger's, for a re-adopted job: 0.0 not known),
    ``config`` its template's config and ``pid`` its process (None: not known). :meth:`report` is this node's one
    running-list entry for it."""

    job_id: str
    template: str
    kind: str
    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 1.0
    vram_gib: float = 0.0
    started_at: float = 0.0
    term: int = 0
    adopted: bool = False
    stopping: bool = False
    gang: GangSlot | None = None
    holds: ResourceRequest | None = None
    """The CPUs, memory, disk and custom resources it holds: its template's as it started (None: the template's
    in the core's catalog now)."""
    config: str = ""
    started_wall: float = 0.0
    pid: int | None = None

    def report(self) -> JobReport:
        """This job as this node's running list reports it: the one builder of that entry, for the snapshot's list
        (:meth:`p2pnode.jobs.JobControl.running_reports`) and the leader's view of its own node
        (:meth:`p2pnode.node._lead.Leading.running_of`), so both carry the same ``started_at``: the executor's
        wall-clock start (:attr:`started_wall`)."""
        return JobReport(job_id=self.job_id, template=self.template, config=self.config, kind=self.kind,
                         gpus=list(self.gpus), gpu_fraction=self.gpu_fraction, vram_gib=self.vram_gib,
                         started_at=self.started_wall, term=self.term, pid=self.pid, gang=self.gang)


class Leadership(msgspec.Struct, frozen=True):
    """The election as this node sees it: ``leader`` and its ``term`` (None: no leader), the ``highest_term``
    seen, whether the election is still ``holding`` at start-up, and the leader elected in each recent term."""

    leader: str | None
    term: int | None
    highest_term: int = 0
    holding: bool = False
    leaders_by_term: Mapping[int, str] = msgspec.field(default_factory=dict)

    def leads(self, node_id: str) -> bool:
        """Whether ``node_id`` leads and may act as the leader: elected in :attr:`term`, no higher term seen
        (:meth:`p2pnode.election.Election.leads`)."""
        return self.leader == node_id and self.term is not None and self.term >= self.highest_term

    def acting(self, p: Any) -> Any:
        """``p`` (a plan ref or document) if this node may act on it (:func:`acting_plan`), else None."""
        if self.leader is None:
            return None
        return acting_plan(p, leader_term=self.term, highest_term=self.highest_term)

    def newest_plan(self, plans: Iterable[tuple[str, PlanRef | None]]) -> PlanRef | None:
        """The plan ref of the highest ``(term, seq)`` among ``(origin, ref)`` whose origin was elected in that
        term; any other member's plan, whatever term it claims, is ignored."""
        best: PlanRef | None = None
        for origin, p in plans:
            if p is None or self.leaders_by_term.get(p.term) != origin:
                continue
            if best is None or (p.term, p.seq) > (best.term, best.seq):
                best = p
        return best


class MemberJobs(msgspec.Struct, frozen=True):
    """One member's job-related state, from its verified snapshot: its membership ``state`` and since when
    (monotonic seconds), its planner ``view`` (None unless alive or suspect), its running jobs when inline in
    its snapshot (None: by ``running_digest``, fetched on demand), the job ids it refused, its capacity
    ``offer`` (GPU jobs) and ``cpu_offer`` (CPU-only jobs; a rise in either brings the leader's next plan
    forward), its operator section and the plan ref it publishes."""

    origin: str
    state: MemberState
    state_since: float
    view: NodeView | None
    running: tuple[JobReport, ...] | None = ()
    running_digest: str = ""
    refused: frozenset[str] = frozenset()
    offer: int = 0
    operator: OperatorSection = msgspec.field(default_factory=OperatorSection)
    plan: PlanRef | None = None
    cpu_offer: int = 0
    ended_ok: frozenset[str] = frozenset()
    """Gang members it reports ended with status 0 lately (``jobs.ended``): a gang completing, not failing."""
    ended: frozenset[str] = frozenset()
    """Every gang member it reports ended lately (``jobs.ended``), with status 0 or not."""
    node_class: str = ""
    """Its node class (``jobs.node_class``, :func:`p2pnode.scheduler.node_class_of`)."""
    scaling: ScalingSection = msgspec.field(default_factory=ScalingSection)
    """Its ``scaling`` section: the request id that started it, its settings digest, a leader's ledger."""
    under_replicated: int = 0
    """Files it holds below the replication factor (``sync.under_replicated``): a drained node waits for 0."""
    usage_digest: str = ""
    """The digest of its run-history summary (``jobs.usage_digest``; "": none yet): the leader fetches the summary
    (``("usage", member)``) when it changes."""
    acks: Mapping[str, int] = msgspec.field(default_factory=dict)
    """Its ``jobs.acks``: member -> age in ms of the newest direct ack it gave that member, when built."""
    acks_horizon_ms: int = 0
    """Its ``jobs.acks_horizon_ms``: every ack it gave within this age is in ``acks``."""
    term_seen: int | None = None
    """Its ``jobs.term_seen``: the highest term its job control had acted with when the snapshot was built (None:
    not reported, as a member of a unit test or the simulator: not checked)."""
    seen_at: float = -math.inf
    """When this node first held the snapshot these come from (monotonic seconds; its own: now; ``-inf``: no
    report, as a member of a unit test or the simulator)."""
    noticed: bool = False
    """Its interruption probe gave a notice (``jobs.notice_deadline_ms``, issue 41): the leader treats it as
    cordoned (no new work) and re-places its training once the training stopped there."""
    busy_gpus: frozenset[int] = frozenset()
    """GPU indices its newest sample shows holding work (:func:`p2pnode.node._plans.busy_gpus_of`): while its
    running list is unknown, only its other GPUs are offered (:func:`p2pnode.node._plans.proven_room_view`)."""

    @property
    def live(self) -> bool:
        """Alive or suspect."""
        return self.state in (MemberState.ALIVE, MemberState.SUSPECT)


class OfferSample(msgspec.Struct, frozen=True):
    """What this node's offers are computed from (:mod:`p2pnode.node._offer`), as the driver sampled it: ``gpu_util``
    each GPU's ``(index, utilization percent)`` in the newest resource sample, taken at ``sampled_at`` (monotonic
    seconds, the driver's clock: a GPU a job of ours left after it counts free, as the sample still shows that
    job's load); ``idle_gpus``: GPUs the guard saw idle past its grace; ``cpus`` and ``memory_gib``: what the node
    gives to jobs (declared, else measured: :func:`p2pnode.node.node_view_of`); ``cpu_percent``: CPU use as the
    guard assesses it (over its window); ``cpu_warn_percent``: the guard's CPU warn level (100: no CPU limit)."""

    gpu_util: tuple[tuple[int, float], ...] = ()
    sampled_at: float = 0.0
    idle_gpus: int = 0
    cpus: float = 0.0
    memory_gib: float = 0.0
    cpu_percent: float = 0.0
    cpu_warn_percent: float = 100.0


class JobInputs(msgspec.Struct, frozen=True):
    """What this node knows at the moment of a :meth:`JobCore.step`: values only; the core decides admission
    from them (:mod:`p2pnode.node._admit`, with the scheduler's per-node accounting
    :func:`p2pnode.scheduler.node_misfit` and :func:`p2pnode.scheduler.misfit`).

    ``members``: every member whose snapshot is held, this node included (its view with its current offer and
    level: the capacity admission counts from). ``running``: the jobs running here (what they hold; those
    stopping make a start that needs their room wait, not fail). ``wall``: Unix seconds, only stamped on new
    assignments and in autonomous job ids. ``pressure``: the node resources over their limit in the newest sample
    (:func:`p2pnode.guardcore.pressure_of`), which shed running work. ``sample``: what this node's offers are
    computed from, inside the step (:mod:`p2pnode.node._offer`; they replace ``offer``, ``cpu_offer`` and this
    node's member view's); None: the offers are ``offer`` and ``cpu_offer`` as given (a driver with nothing to
    sample: the unit tests). ``level``: its guard's degradation level in force (0-4; admission refuses work whose
    priority it does not admit, :func:`p2pnode.guardcore.may_start`)."""

    leadership: Leadership
    members: Sequence[MemberJobs]
    running: Mapping[str, LocalJob]
    wall: float = 0.0
    signals: Mapping[str, Signals] = msgspec.field(default_factory=dict)
    level: int = 0
    offer: int = 0
    cpu_offer: int = 0
    """CPU-only jobs (``num_gpus = 0``) this node asks for; ``offer`` is its GPU jobs'."""
    cordoned: bool = False
    leaving: bool = False
    level_why: str = ""
    """Why the guard is at ``level``, in words (:func:`p2pnode.guardcore.level_reasons`): a refusal's reason."""
    training_refused: str = ""
    """Why training may not start here now ('' when it may): disk usage at or above the guard's critical limit."""
    fenced_refused: str = ""
    """Why work the node's lease fences (trainings, ``exclusive`` templates) may not start here now ('' when it may):
    the lease is not held (:mod:`p2pnode.node._lease`)."""
    refuse_new: str = ""
    """Why this node refuses every new job now, whatever its kind ('' none): a driver's own refusal."""
    refuse_jobs: Mapping[str, str] = msgspec.field(default_factory=dict)
    """Assignments (job id -> why) the driver refuses: the simulator's injected guard refusals, drawn once per
    assignment."""
    full_gpus: frozenset[int] = frozenset()
    """GPUs whose memory is at or above the guard's GPU limit in the newest sample: no new work on them."""
    disk_room_gib: float | None = None
    """GiB of disk left below the guard's disk limit in the newest sample, before what the running jobs
    declare (None: disk not counted)."""
    pressure: Pressure = msgspec.field(default_factory=Pressure)
    sample: OfferSample | None = None
    resumes: Mapping[str, str] = msgspec.field(default_factory=dict)
    """Checkpoint fetches decided (issue 41): job id -> the absolute path of the checkpoint its start resumes from
    ("" : start from nothing), for jobs the core asked a :class:`FetchCheckpoint` of; the core then starts them
    (:class:`StartJob` ``resume_from``). The driver drops an entry once its job left ``fetching``."""
    own_checkpoints: Mapping[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    """This node's own checkpoints as the live members list them (issue 41, goodput): job id -> (the newest
    sequence this node lists, the newest another member holds), :func:`p2pnode.node._goodput.own_checkpoints`."""


# -- effects ------------------------------------------------------------------------------------------------------
class StartJob(msgspec.Struct, frozen=True):
    """Start ``job`` here under ``term`` (0: autonomous). The contract with the executor: a start shows in
    :attr:`JobInputs.running` by the next step, or the executor reports its failure
    (:meth:`p2pnode.node.JobCore.start_failed` with the job id and the error); a job asked to start that is in
    neither is recorded ``start_failed`` at the next step (:meth:`p2pnode.node._book.JobBook.observe_running`)."""

    job: PlanJob
    term: int
    resume_from: str = ""
    """The checkpoint the job resumes from (an absolute path, ``P2PNODE_RESUME_FROM``; "": none), issue 41."""


class FetchCheckpoint(msgspec.Struct, frozen=True):
    """Before starting ``job`` (a leader's placement, under ``term``, of a template that declares
    ``[job.checkpoint]``), decide what it resumes from and fetch it (issue 41, item 2): the config's newest trusted
    checkpoint from its holders (:func:`p2pnode.synccore.resume_from`), or none. The job is ``fetching`` meanwhile
    (held as this node's: never started twice); the driver hands the outcome back in :attr:`JobInputs.resumes`."""

    job: PlanJob
    term: int
    config: str


class CancelFetch(msgspec.Struct, frozen=True):
    """The plan dropped ``job_id`` while its checkpoint was fetched: stop that fetch (what it verified stays on
    disk: a later fetch of the same checkpoint resumes from it)."""

    job_id: str


class StopJob(msgspec.Struct, frozen=True):
    """Stop the job ``job_id`` running here, recording ``reason`` (words for the operator) and ``rule`` (the stop
    rule's name, :data:`._jobstate.StopRule`) in its history."""

    job_id: str
    reason: str
    rule: StopRule = "plan"


class Refuse(msgspec.Struct, frozen=True):
    """This node refuses the assignment ``job_id`` (final for that id); ``reason`` goes into its snapshot."""

    job_id: str
    template: str
    reason: str


class Fetch(msgspec.Struct, frozen=True):
    """Fetch the document ``key`` at ``version`` from the member ``origin``: ``("part", leader)`` this node's part
    of ``ref``, ``("whole", leader)`` the whole plan ``ref``, ``("running", member)`` a running-job list whose
    digest is ``version``, ``("usage", member)`` a run-history summary whose digest is ``version``. Handed back
    with :meth:`JobCore.fetched` once checked."""

    key: tuple[str, str]
    version: str
    origin: str
    ref: PlanRef | None = None


class PublishPlan(msgspec.Struct, frozen=True):
    """This node (leading) made plan ``section``: publish its ref, serve it."""

    section: PlanSection


class Quarantine(msgspec.Struct, frozen=True):
    """The member ``origin``'s data broke ``where`` (a gap in a decoder): set its snapshot aside."""

    origin: str
    where: str
    error: Exception


Effect: TypeAlias = ("StartJob | StopJob | Refuse | Fetch | PublishPlan | Quarantine | ProviderCall | ProviderList"
                     " | FetchCheckpoint | CancelFetch")
"""What :meth:`JobCore.step` returns (a string: for type checkers and readers only, never tested at run time)."""


def whole_version(ref: PlanRef) -> str:
    """The version string of the whole plan ``ref`` (a part's is :func:`p2pnode.node._plandist.part_version`)."""
    return f"{ref.term}/{ref.seq}/{ref.digest}"
