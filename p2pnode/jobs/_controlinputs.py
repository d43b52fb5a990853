"""Job control's inputs to its core (:class:`p2pnode.jobs._control.JobControl`, whose mixin this is): what this node
knows now as :class:`p2pnode.node.JobInputs` (the election view, each member's job state, cached per snapshot, this
node's own, the jobs its runner runs, the guard's admission values)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..certs import certified_class
from ..errors import DATA_ERRORS
from ..guardcore import OperationPriority, Pressure, assess, pressure_of
from ..node import (
    JobInputs,
    Leadership,
    LocalJob,
    Member,
    MemberJobs,
    node_view_of,
)
from ..node._goodput import own_checkpoints
from ..node._lease import AckLog, takeover_after_s
from ..node._plans import busy_gpus_of
from ..scheduler import node_class_of
from ..snapshot import Snapshot
from ._admission import admission_inputs
from ._leasefile import template_lead_s


def _below_r(snap: Snapshot) -> int:
    """Files ``snap``'s node pushes that are below the replication factor: its ``sync.under_replicated``; a node
    that reports files but not that count counts as one (unknown is not "at R"), one that pushes nothing 0."""
    sync = snap.sync
    if sync.under_replicated is not None:
        return sync.under_replicated
    return 1 if sync.files else 0


class ControlInputs:
    """The core's inputs (mixin of :class:`p2pnode.jobs._control.JobControl`: it uses the driver's attributes,
    set in its ``__init__``)."""

    if TYPE_CHECKING:  # the driver's attributes this part uses (set in JobControl.__init__)
        from collections import deque

        from ..node import JobCore, NodeCore
        from ..snapshot import EndedJob, Refusal, ScalingSection
        from ._capacity import NodeOffer
        from ._leasefile import LeaseKeeper
        from ._operator import OperatorControl
        from ._runner import JobRunner

        ctx: Any
        core: JobCore
        node_core: NodeCore
        guard: Any
        limits: Any
        operator: OperatorControl
        runner: JobRunner
        lease: LeaseKeeper | None
        resume: Any
        stops: Any
        ack_log: AckLog | None
        capacity: NodeOffer
        refused: deque[Refusal]
        ended: deque[EndedJob]
        _members: dict[str, tuple[Any, Any, float, MemberJobs]]
        _pressure: tuple[Any, Pressure]

        @property
        def offer(self) -> int: ...
        @property
        def cpu_offer(self) -> int: ...
        def newest_signals(self) -> dict[str, Any]: ...
        def scaling_section(self) -> ScalingSection: ...
        def _want_catalog(self, members: list[Member]) -> None: ...

    def _member_jobs(self, m: Member) -> MemberJobs:
        """``m``'s job state for the core (cached per snapshot and state: a step costs nothing per member whose
        snapshot did not change)."""
        mm = self.node_core.membership.members.get(m.origin)
        since = mm.state_since if mm is not None else -1e18
        hit = self._members.get(m.origin)
        if hit is not None and hit[0] is m.snapshot and hit[1] is m.state and hit[2] == since:
            return hit[3]
        # when this snapshot was first held here (issue 42: a report of acks reads as at least as recent)
        seen_at = hit[3].seen_at if hit is not None and hit[0] is m.snapshot else self.ctx.now()
        snap, g = m.snapshot, self.limits
        live = m.state in (m.state.ALIVE, m.state.SUSPECT)
        view = node_view_of(snap, disk_max_percent=g.disk_max_percent, vram_limit_ratio=g.gpu_max_percent / 100.0,
                            memory_limit_ratio=g.memory_max_percent / 100.0, addr=m.addr) if live else None
        js = snap.jobs
        mj = MemberJobs(m.origin, m.state, since, view, tuple(js.running) if js.running_inline else None,
                        js.running_digest, frozenset(r.job_id for r in js.refused), js.offer, snap.operator,
                        snap.plan, js.cpu_offer, frozenset(e.job_id for e in js.ended if e.ok),
                        frozenset(e.job_id for e in js.ended),
                        node_class=js.node_class or node_class_of(g.name for g in snap.resources.gpus),
                        scaling=snap.scaling,
                        under_replicated=_below_r(snap), usage_digest=js.usage_digest, busy_gpus=busy_gpus_of(snap),
                        acks=js.acks, acks_horizon_ms=js.acks_horizon_ms, seen_at=seen_at, term_seen=js.term_seen,
                        noticed=js.notice_deadline_ms is not None)
        self._members[m.origin] = (m.snapshot, m.state, since, mj)
        return mj

    def _own(self, m: Member, level: int) -> MemberJobs:
        g = self.limits
        view = node_view_of(m.snapshot, disk_max_percent=g.disk_max_percent,
                            vram_limit_ratio=g.gpu_max_percent / 100.0, offer=self.offer, level=level,
                            memory_limit_ratio=g.memory_max_percent / 100.0, cpu_offer=self.cpu_offer)
        return MemberJobs(m.origin, m.state, 0.0, view, None, "", frozenset(r.job_id for r in self.refused),
                          self.offer, self.operator.section, m.snapshot.plan, self.cpu_offer,
                          frozenset(e.job_id for e in self.ended if e.ok), frozenset(e.job_id for e in self.ended),
                          node_class=node_class_of(g.name for g in m.snapshot.resources.gpus),
                          scaling=self.scaling_section(),
                          under_replicated=_below_r(m.snapshot), noticed=self._noticed(), **self._own_acks())

    def _noticed(self) -> bool:
        """Whether this node's interruption probe gave a notice or the agent stops (issue 41): it offers and admits
        no new work."""
        return self.stops.noticed

    def _own_acks(self) -> dict[str, Any]:
        """This node's own report of the direct acks it gave, as of now, those within the leader's takeover bound
        (issue 42; none without probes or without a lease)."""
        log, now = self.ack_log, self.ctx.now()
        if log is None or self.core.lease_s <= 0:
            return {"seen_at": now}
        acks, horizon = log.report(now, takeover_after_s(self.core.lease_s))
        return {"acks": acks, "acks_horizon_ms": horizon, "seen_at": now}

    def inputs(self) -> JobInputs:
        """What this node knows now, for :meth:`p2pnode.node.JobCore.step`."""
        ctx, nc = self.ctx, self.node_core
        level = ctx.degradation_level
        members = []
        current = ctx.members()
        self._want_catalog(current)
        # scaling counts a member toward a class by its provider's answers or by a certificate of a pinned
        # operator key, never by its own claim (issue 37): the certified classes of the members held now
        self.core.certified_class = {m.origin: c[0] for m in current if (c := certified_class(m.roles)) is not None}
        for m in current:
            try:
                members.append(self._own(m, level) if m.origin == ctx.node_id else self._member_jobs(m))
            except DATA_ERRORS as exc:  # a decoder gap: this member is set aside, the step carries on
                if m.origin == ctx.node_id:
                    raise
                ctx.quarantine(m.origin, "job state", exc)
        if len(self._members) > 2 * len(members) + 64:
            held = {m.origin for m in members}
            self._members = {k: v for k, v in self._members.items() if k in held}
        v = nc.view
        return JobInputs(Leadership(v.leader, v.term, nc.election.highest_term, nc.holding, nc.leaders_by_term),
                         members, self.local_jobs(), wall=time.time(), signals=self.newest_signals(), level=level,
                         offer=self.offer, cpu_offer=self.cpu_offer,
                         cordoned=self.operator.section.cordoned or self._noticed(),
                         leaving=ctx.leaving, pressure=self._pressure_now(), sample=self.capacity.sample(),
                         fenced_refused=self._fenced_refused(),
                         resumes=self.resume.resumes(lambda k: self.core.table.state(k) == "fetching"),
                         own_checkpoints=own_checkpoints(ctx.node_id, {m.origin: m.snapshot.sync.checkpoints
                                                                       for m in ctx.members(live=True)}),
                         **admission_inputs(self.guard, me.snapshot if (me := ctx.member(ctx.node_id)) else None,
                                            self.limits))  # issue 39: admission's inputs are values

    def _fenced_refused(self) -> str:
        """Why fenced work (trainings, ``exclusive`` templates) may not start here now: the lease is not held for
        the longest stop lead of the catalog's fenced templates (:func:`p2pnode.jobs._leasefile.template_lead_s`,
        the stop rule's): a job admitted here is not asked to stop at once."""
        lease = self.lease
        lead = max((template_lead_s(t, self.runner.grace_s) for t in self.runner.templates.values() if t.fenced),
                   default=lease.lease.stop_lead_s if lease is not None else 0.0)
        if lease is None or lease.expires_at() - lead > self.ctx.now():
            return ""
        return "lease not held: no quorum of voters acked this node lately"

    def local_jobs(self) -> dict[str, LocalJob]:
        """The jobs the runner runs here, as the core sees them (its inputs) and as this node's running list reports
        them (:meth:`LocalJob.report`): ``started_wall`` the runner's wall-clock start (its ledger's)."""
        return {k: LocalJob(k, j.template.name, j.template.kind, j.gpus, j.gpu_fraction, j.vram_gib, j.started_mono,
                            j.term, j.adopted, j.stopping is not None, j.gang, j.template.resources,
                            config=j.template.config, started_wall=j.started_at,
                            pid=j.proc.pid if j.proc is not None else None)
                for k, j in self.runner.jobs.items()}

    def admits(self, kind: str, priority: OperationPriority | int) -> tuple[bool, str]:
        """The guard's admission of work of ``kind`` and ``priority`` on this node now."""
        return self.guard.admits(kind, priority) if self.guard is not None else (True, "")

    def _pressure_now(self) -> Pressure:
        """The node's pressures in its newest sample, as the guard assessed it (CPU over ``guard.cpu_window_s``:
        one saturated second sheds nothing), stamped with when this driver first saw that sample (it is woken by
        every sample): the core sheds load again only on a sample taken after its last stop."""
        s = self.ctx.last_sample
        if s is not None and s is not self._pressure[0]:
            g = self.guard
            # The guard's assessment of this sample (CPU over its window) where it has one; else the sample alone.
            a = g.assessment if g is not None and g.sample is s else assess(s.to_wire(), self.limits)
            self._pressure = (s, pressure_of(a, self.ctx.now()))
        return self._pressure[1]
