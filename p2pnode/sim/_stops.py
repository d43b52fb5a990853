"""The node's own stop rules in the scheduling simulation (issue 39): each simulated node drives a
:class:`p2pnode.node._stoprules.StopRules` beside its :class:`p2pnode.node.JobCore`, as the agent's
:class:`p2pnode.jobs._stops.StopDriver` does, in virtual time.

* **Drains** (``drains``): that many nodes (never the first leader), drawn with their start times from the stop
  rules' own seeded generator, start to drain at a virtual time in the middle 10-80 % of the run, with a
  deadline ``drain_deadline_s`` later. A draining node is cordoned (its core refuses new assignments, its offer is
  0); at the deadline the rules stop its preemptible jobs (rule ``drain``); the others run to their end. Reported:
  nodes drained, jobs the drain stopped, nodes emptied and their time to empty.
* **Maximum runtime** (``max_runtime_s``): every template's ``max_runtime_s`` (None: the catalog's own; the
  generated catalog's default is 3,600 s, beyond most runs of a 30-minute simulation).
* **Operator stops** (``operator_stops``): at that many seeded times the operator asks to stop one running job
  drawn at random (``p2pnode jobs stop``; rule ``operator``).
* **Memory limit** (``memory_over``): that share of the jobs started (drawn per start) goes over its memory limit
  (the template's ``memory_gib``) at a time drawn uniformly within its run: the runner's sample
  (:class:`~p2pnode.node._stoprules.MemorySample`) shows RSS 1.5 times the limit and the rules stop it.

Nothing here reads a clock or consumes the scenario's own random numbers (a separate generator, seeded from the
seed): with no drains, no memory overruns and the catalog's runtimes, the scenario's figures are the same as
without it.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import msgspec

from ..node._stoprules import GIB, MemorySample, RuleInputs, RuleJob, StopRules
from ..scheduler import Catalog

__all__ = ["SimStops", "StopsConfig"]


class StopsConfig(msgspec.Struct, frozen=True):
    """What the simulation schedules beside the plan (module docstring): ``drains`` (nodes), ``drain_deadline_s``
    (seconds from a drain's start to its deadline), ``max_runtime_s`` (None: each template's own) and
    ``memory_over`` (the share of started jobs that go over their memory limit, 0-1), ``operator_stops`` (how
    many times, at seeded times, the operator stops one running job drawn at random)."""

    drains: int = 0
    drain_deadline_s: float = 300.0
    max_runtime_s: float | None = None
    memory_over: float = 0.0
    operator_stops: int = 0


class SimStops:
    """The stop rules of every simulated node, their drains and memory overruns (module docstring)."""

    def __init__(self, cfg: StopsConfig, catalog: Catalog, *, seed: int) -> None:
        self.cfg = cfg
        self.catalog = catalog
        self.rng = random.Random(seed * 104729 + 39)
        self.rules: dict[str, StopRules] = {}
        self.dirty: set[str] = set()  # nodes whose jobs changed since their rules last stepped
        self.drain_at: dict[str, float] = {}  # node -> when its drain starts (scheduled)
        self.drained: dict[str, float] = {}  # node -> when its drain started
        self.emptied: dict[str, float] = {}  # node -> seconds from its drain's start to its last job's end
        self.over_at: dict[str, float] = {}  # job id -> when its memory goes over its limit
        self.stopped_by_drain = 0
        self.operator_at: list[float] = []  # when the operator stops a job (scheduled, sorted)
        self.operator: dict[str, set[str]] = {}  # node -> job ids the operator asked to stop

    def schedule_drains(self, nodes: list[str], duration_s: float) -> None:
        """Draw :attr:`StopsConfig.drains` of ``nodes`` and when each starts to drain."""
        picked = self.rng.sample(sorted(nodes), min(self.cfg.drains, len(nodes)))
        for nid in picked:
            self.drain_at[nid] = self.rng.uniform(0.1, 0.8) * duration_s
        self.operator_at = sorted(self.rng.uniform(0.1, 0.9) * duration_s for _ in range(self.cfg.operator_stops))

    def draining(self, nid: str) -> bool:
        return nid in self.drained

    def started(self, nid: str, job_id: str, t: float, ends_at: float) -> None:
        """A job started on ``nid`` at ``t`` and would end by itself at ``ends_at``: maybe it overruns memory."""
        self.dirty.add(nid)
        if self.cfg.memory_over > 0 and self.rng.random() < self.cfg.memory_over:
            self.over_at[job_id] = self.rng.uniform(t, ends_at)

    def rule_job(self, job: Any) -> RuleJob:
        """Simulated job ``job`` (:class:`p2pnode.sim._sched._Job`) as the rules see it."""
        tpl = self.catalog.templates.get(job.template)
        if tpl is None:
            return RuleJob(job.job_id, job.template, started_at=job.started_at)
        mr = self.cfg.max_runtime_s if self.cfg.max_runtime_s is not None else tpl.max_runtime_s
        return RuleJob(job.job_id, tpl.name, tpl.kind, tpl.preemptible, job.started_at,
                       mr if mr and mr > 0 else math.inf, tpl.resources.memory_gib, "template memory_gib")

    def step(self, t: float, on_node: dict[str, dict[str, Any]]) -> dict[str, list]:
        """Drains that start now, memory samples due and the rules of each node that is due; the stops to carry
        out, per node."""
        for nid, at in list(self.drain_at.items()):
            if at <= t:
                del self.drain_at[nid]
                self.drained[nid] = t
                self.dirty.add(nid)
        for nid, began in self.drained.items():
            if nid not in self.emptied and not on_node.get(nid):
                self.emptied[nid] = t - began
        while self.operator_at and self.operator_at[0] <= t:
            self.operator_at.pop(0)
            running = sorted((nid, jid) for nid, jobs in on_node.items() for jid in jobs)
            if running:
                nid, jid = self.rng.choice(running)
                self.operator.setdefault(nid, set()).add(jid)
                self.dirty.add(nid)
        out: dict[str, list] = {}
        for jid in [j for j, at in self.over_at.items() if at <= t]:
            del self.over_at[jid]
            for nid, jobs in on_node.items():  # (few: a share of the jobs started)
                job = jobs.get(jid)
                if job is not None:
                    rj = self.rule_job(job)
                    rss = int(max(rj.memory_limit_gib, 1.0) * 1.5 * GIB)
                    out.setdefault(nid, []).extend(self.rules_of(nid).sampled(rj, MemorySample(jid, rss)))
                    break
        for nid, jobs in on_node.items():
            rules = self.rules.get(nid)
            if not jobs or (nid not in self.dirty and (rules is None or rules.next_deadline() > t)):
                continue
            self.dirty.discard(nid)
            start = self.drained.get(nid)
            inp = RuleInputs(tuple(self.rule_job(j) for j in jobs.values()), frozenset(self.catalog.templates),
                             start is not None, start + self.cfg.drain_deadline_s if start is not None else math.inf,
                             frozenset(self.operator.get(nid, ())))
            stops = self.rules_of(nid).step(inp, t)
            self.stopped_by_drain += sum(1 for s in stops if s.rule == "drain")
            if stops:
                out.setdefault(nid, []).extend(stops)
        return out

    def rules_of(self, nid: str) -> StopRules:
        r = self.rules.get(nid)
        if r is None:
            r = self.rules[nid] = StopRules()
        return r

    def ended(self, job_id: str) -> None:
        self.over_at.pop(job_id, None)
        for asked in self.operator.values():
            asked.discard(job_id)

    def report(self) -> dict[str, Any]:
        """The drains: nodes drained, jobs the drain stopped, nodes emptied and their time to empty (seconds)."""
        times = sorted(self.emptied.values())
        return {"nodes_drained": len(self.drained), "jobs_stopped_by_drain": self.stopped_by_drain,
                "nodes_emptied": len(times), "drain_deadline_s": self.cfg.drain_deadline_s,
                "time_to_empty_s": {"median": round(statistics.median(times), 1), "max": round(times[-1], 1)}
                if times else None}
