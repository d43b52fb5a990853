"""Load shedding of one node (kubelet's node-pressure eviction, :mod:`p2pnode.guardcore._pressure`), a part of
:class:`p2pnode.node.JobCore` with its own deadline: levels refuse new work at once (admission's), but running work
is stopped only when CPU or memory stays over its limit for ``dwell_s`` (deadline: the end of the dwell), one job
at a time, lowest priority first; the next only once the stopped job left and a sample taken after that still
shows the pressure. CPU pressure never stops training-priority work; memory pressure stops it last. Sans-IO."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from ..guardcore import SHED_RESOURCES, OperationPriority, Pressure, may_shed, shed_order
from ..scheduler import Catalog
from ._jobio import LocalJob, StopJob

__all__ = ["SAMPLES_AFTER_SHED", "Shedding"]

SAMPLES_AFTER_SHED = 2
"""Samples taken after a shed job left that must still show the pressure before the next job is shed."""
NEVER = math.inf


class Shedding:
    """The shedding rule's state: the resources over their limit and since when (the core's time when first
    seen), the job the last shed stopped until it left and :data:`SAMPLES_AFTER_SHED` samples followed."""

    def __init__(self, dwell_s: float) -> None:
        self.dwell_s = dwell_s
        self._pressed: dict[str, float] = {}  # resource over its limit -> since when (the sample's time)
        self._shed_at = NEVER  # when a pressure will have held for dwell_s (while none has yet)
        self._victim: str | None = None  # the job the last shed stopped, until a sample after it left is seen
        self._victim_gone_at: float | None = None
        self._fresh: set[float] = set()  # times of the samples taken since the victim left

    def next_deadline(self) -> float:
        """When a pressure will have held for ``dwell_s`` (monotonic seconds; ``inf``: none pending)."""
        return self._shed_at

    def step(self, p: Pressure, running: Mapping[str, LocalJob], stopping: Collection[str], catalog: Catalog,
             now: float) -> StopJob | None:
        """The stop (rule ``shed``) due at ``now`` given the newest sample's pressure ``p`` and the jobs
        ``running`` here (``stopping``: those already stopping, never shed), or None.

        A resource over its limit for ``dwell_s`` (from when this rule first saw it) stops one job, lowest
        priority first; the next one only after that job left and :data:`SAMPLES_AFTER_SHED` samples taken since
        (the first may still average in the job's last moments: CPU percent is measured over the interval before
        a sample) still show the pressure. One saturated sample (often the jobs' own load) stops nothing."""
        for r in SHED_RESOURCES:
            if p.of(r) is None:
                self._pressed.pop(r, None)
            elif r not in self._pressed:
                self._pressed[r] = now
        self._shed_at = NEVER
        if not self._pressed:
            self._victim = None
            return None
        if self._victim is not None:  # wait for the last one to leave, then for a sample taken after it left
            if self._victim in running:
                return None
            if self._victim_gone_at is None:
                self._victim_gone_at = now
            if p.at > self._victim_gone_at:
                self._fresh.add(p.at)
            if len(self._fresh) < SAMPLES_AFTER_SHED:
                return None
            self._victim = None
        for r in SHED_RESOURCES:
            since = self._pressed.get(r)
            if since is None:
                continue
            if now - since < self.dwell_s:
                self._shed_at = min(self._shed_at, since + self.dwell_s)
                continue
            stop = shed_one(running, stopping, catalog, r, now - since, p)
            if stop is not None:
                self._victim, self._victim_gone_at, self._fresh = stop.job_id, None, set()
                return stop
        return None


def shed_one(running: Mapping[str, LocalJob], stopping: Collection[str], catalog: Catalog, resource: str,
             held_s: float, p: Pressure) -> StopJob | None:
    """The stop of the first job pressure on ``resource`` (held ``held_s`` seconds) may shed
    (:func:`p2pnode.guardcore.shed_order`), if any."""
    prio, templates = catalog.priority_of, catalog.templates
    training = prio("training")
    jobs = [(j.job_id, int(prio(j.kind)), getattr(templates.get(j.template), "priority", 0), j.started_at)
            for j in running.values() if j.job_id not in stopping and may_shed(resource, prio(j.kind),
                                                                             training_priority=training)]
    order = shed_order(jobs)
    if not order:
        return None
    job = running[order[0]]
    kind_prio = OperationPriority(int(prio(job.kind))).name
    spared = " (training-priority work is not stopped for CPU)" if resource == "cpu" else ""
    return StopJob(job.job_id, rule="shed",
                   reason=f"load shed: {p.of(resource)} for {held_s:.0f} s; stopping the lowest-priority job "
                          f"first ({job.kind}, {kind_prio}), one at a time{spared}")
