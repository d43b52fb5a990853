"""Node pressure: which node resources are over their limit now, and which running job goes first when load is
shed. Pure.

The rule is kubelet's node-pressure eviction (Kubernetes, "Node-pressure Eviction"): when a resource stays over
its limit for a grace period, the node stops one workload at a time, lowest priority first, looks again, and
stops another only while the pressure holds. Here:

* the pressures are CPU and memory at or above ``cpu_max_percent`` / ``memory_max_percent`` (:func:`pressure_of`;
  disk is the disk manager's, and a full GPU only refuses new work on that GPU);
* the order (:func:`shed_order`) is the guard priority of the job's kind (the catalog's ``policy.priorities``),
  then the template's ``priority``, then the most recently started first (it has the least work to lose), then
  the job id;
* what each pressure may stop (:func:`may_shed`): CPU pressure never stops work at or above the training
  priority (a CPU spike slows training, it does not endanger the node: GPU boxes whose data loaders use every
  core are the normal case), memory pressure stops anything below CRITICAL, training last (the order does that);
  CRITICAL work (data sync, health checks) is never shed.

The job core (:class:`p2pnode.node.JobCore`) holds the grace period (the guard's ``dwell_s``) and the
one-at-a-time cadence.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from ._assess import Assessment, OperationPriority

__all__ = ["SHED_RESOURCES", "Overload", "Pressure", "may_shed", "pressure_of", "shed_order"]

SHED_RESOURCES = ("memory", "cpu")
"""The resources whose pressure sheds running work, the most dangerous first (the order pressures are acted on)."""


class Overload(msgspec.Struct, frozen=True):
    """One node resource at or above its limit: ``resource`` (``cpu`` or ``memory``), ``used_percent`` and
    ``max_percent`` (0-100)."""

    resource: str
    used_percent: float
    max_percent: float
    label: str = ""
    """How the assessment named the figure (``CPU (10 s mean)``: over the CPU window); empty: the resource."""

    def __str__(self) -> str:
        label = self.label or ("CPU" if self.resource == "cpu" else self.resource)
        if self.resource == "memory":
            label = label[:1].lower() + label[1:]  # "memory at 95 %", "memory (3 s mean) at 85 %"
        return f"{label} at {self.used_percent:.0f} % >= its limit {self.max_percent:g} %"


class Pressure(msgspec.Struct, frozen=True):
    """The node's pressures in the sample taken at ``at`` (monotonic seconds): one :class:`Overload` per resource
    over its limit, in :data:`SHED_RESOURCES` order. ``at`` tells a fresh sample from the one a shed was decided
    on (-inf: no sample yet)."""

    over: tuple[Overload, ...] = ()
    at: float = float("-inf")

    def of(self, resource: str) -> Overload | None:
        """The overload of ``resource``, or None when it is under its limit."""
        return next((o for o in self.over if o.resource == resource), None)


def pressure_of(a: Assessment | None, at: float) -> Pressure:
    """The pressures of assessment ``a`` (:func:`p2pnode.guardcore.assess`) of the sample taken at ``at``
    (monotonic s): CPU and memory at or above their max limits, at the figures ``a`` assessed (the CPU window's
    mean where ``a`` was made with the guard's windows). No assessment: no pressure."""
    if a is None:
        return Pressure((), at)
    loads = {x.name: x for x in a.loads}
    over = tuple(Overload(r, loads[r].used_percent, loads[r].max_percent, loads[r].label) for r in SHED_RESOURCES
                 if r in loads and loads[r].max_percent > 0 and loads[r].used_percent >= loads[r].max_percent)
    return Pressure(over, at)


def may_shed(resource: str, priority: OperationPriority | int, *, training_priority: OperationPriority | int) -> bool:
    """Whether pressure on ``resource`` may stop a job of guard ``priority``: never CRITICAL work; under CPU
    pressure nothing at or above ``training_priority`` (the catalog's priority of kind ``training``)."""
    if int(priority) >= int(OperationPriority.CRITICAL):
        return False
    if resource == "cpu":
        return int(priority) < int(training_priority)
    return True


def shed_order(jobs: Iterable[tuple[str, int, int, float]]) -> list[str]:
    """Job ids in the order load is shed: ``jobs`` are ``(job_id, guard_priority, template_priority,
    started_at)``; lowest guard priority first, then lowest template priority, then the most recently started
    (``started_at`` in any one clock), then the job id."""
    return [j[0] for j in sorted(jobs, key=lambda j: (j[1], j[2], -j[3], j[0]))]
