"""The values a node's own admission needs from its guard and its newest snapshot, as :class:`p2pnode.node.JobInputs`
fields (issue 39: the core decides admission from values, never by calling back into its driver). The decision and
the accounting are the core's (:mod:`p2pnode.node._admit`) with the scheduler's per-node fit
(:func:`p2pnode.scheduler.node_misfit`, the function the leader's placement accounting shares). Pure.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..guardcore import Assessment, GuardLimits, OperationPriority, admission
from ..snapshot import Snapshot

__all__ = ["AdmissionGuard", "admission_inputs", "disk_room_gib", "training_refusal"]

GIB = 2**30


class AdmissionGuard(Protocol):
    """What admission reads of the guard (:class:`p2pnode.drivers.GuardDriver`)."""

    def reasons(self) -> tuple[str, ...]:
        """Why the node is at the degradation level in force, in words."""
        ...

    def gpus_full(self) -> tuple[int, ...]:
        """GPUs whose memory is at or above the GPU limit."""
        ...

    @property
    def assessment(self) -> Assessment | None:
        """The guard's newest assessment."""
        ...


def training_refusal(a: Assessment | None, limits: GuardLimits) -> str:
    """Why training may not start now ('' when it may): the guard's own disk rule (:func:`p2pnode.guardcore.
    admission` at level 0 and the highest priority, where nothing else refuses), with its words."""
    if a is None:
        return ""
    ok, why = admission(a, 0, limits, kind="training", priority=OperationPriority.CRITICAL)
    return "" if ok else why


def disk_room_gib(me: Snapshot | None, limits: GuardLimits) -> float | None:
    """GiB of disk left below the guard's disk limit (``limits.disk_max_percent``) in this node's own snapshot
    ``me``; None when its disk size is not known (disk then not counted)."""
    if me is None or me.resources.disk_total_bytes <= 0:
        return None
    res = me.resources
    return (res.disk_total_bytes * limits.disk_max_percent / 100.0 - res.disk_used_bytes) / GIB


def admission_inputs(guard: AdmissionGuard | None, me: Snapshot | None, limits: GuardLimits) -> dict[str, Any]:
    """The :class:`p2pnode.node.JobInputs` fields of admission: ``level_why``, ``training_refused``, ``full_gpus``
    and ``disk_room_gib`` (the level itself is ``JobInputs.level``). ``guard`` None: nothing refused, no GPU
    full."""
    out: dict[str, Any] = {"disk_room_gib": disk_room_gib(me, limits)}
    if guard is not None:
        out.update(level_why="; ".join(guard.reasons()), training_refused=training_refusal(guard.assessment, limits),
                   full_gpus=frozenset(guard.gpus_full()))
    return out
