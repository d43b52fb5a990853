"""Preemption and predictions (pure): step 4 of :func:`p2pnode.scheduler.plan`. When nothing fits, a preemptible
running job at least ``preemption_gap`` priority points below is preempted (Nomad's rule), with ``grace_s``
(:meth:`_Preempting._preempt`); with predictions, GPU work may wait for a predicted end instead
(:meth:`_Preempting._wait_or_preempt`).

Predictions (issue 27; only with ``ClusterView.predictor``, whose figures count only from history, ``source
"history"``; without one, nothing below runs and a plan is what it was before):

* peak memory: a job holds ``max(declared memory_gib, predicted peak RSS p90)`` on a node that accounts memory
  (what runs and what is placed), and a node whose free memory is below a template's predicted RSS p90, or whose
  GPUs may each commit less than its predicted peak VRAM p90 per GPU, does not take it: the template waits with
  ``"predicted peak memory 12.3 GiB (p90 of 40 runs) exceeds the free memory of every node that fits (most 8
  GiB)"`` instead of being started into an OOM;
* predicted ends: a running job ends at its start plus its template's run time median on its node's class (its
  p90 once it ran past the median); one already past its p90, or whose start is unknown, has no predicted end.
  Clocks: ``RunningJob.started_at`` is the member's wall-clock stamp (Unix seconds, its runner's ``time.time()``),
  compared only with ``ClusterView.wall`` (the leader's Unix seconds when it took the view): ``now`` (monotonic)
  stays the clock of waiting times and gang grace;
* GPU work that no node fits waits, instead of preempting, when the soonest predicted end that makes room for it
  (its node then fits it: GPUs, memory, the node's rules) is within ``SchedulerConfig.preempt_wait_s``
  (``"waits ~40 s for 1-17 (sp-a) on n3 to end (predicted); ..."``); otherwise it preempts the eligible job
  (priority gap as above) with the least elapsed time, the least work lost (a job of unknown start last); and
  when it still waits, its reason ends with the expected wait (``"; expected wait ~300 s (1-17 on n3 predicted
  to end)"``). Each predicted end is counted on by one waiting template of the plan at most.

Predictions are asked once per template and node class per plan (memoized), predicted ends built once per plan
on the first template that fits nowhere.
"""

from __future__ import annotations

from ._catalog import JobTemplate
from ._nodecap import NodeCap as _Node
from ._plancands import _Candidates
from ._planshape import (
    _blocker,
    _Shape,
)
from ._planview import (
    RunningJob,
    Stop,
)


class _Preempting(_Candidates):
    """One plan's preemptions: the eligible jobs by priority or by elapsed time, and the predicted ends a waiting
    template counts on."""

    __slots__ = ()

    def _preempt(self, t: JobTemplate, sh: _Shape, pool: list[RunningJob], *,
                 by_priority: bool) -> tuple[_Node | None, Stop | None]:
        """Step 4: a node where stopping one preemptible job of ``pool`` at least ``preemption_gap`` points lower
        than ``t`` makes it fit, and the stop (``t``'s tiers, the node's rules, its predicted memory). The first
        such job of ``pool`` is stopped: ``by_priority`` (sorted by priority: the scan ends at the first job not
        low enough) or, with predictions, least elapsed first (:meth:`_by_elapsed`)."""
        if sh.num_gpus <= 0:
            return None, None
        cfg, catalog = self.cfg, self.catalog
        tiers = catalog.tiers_for(t.kind)
        limit = t.priority - cfg.preemption_gap
        for r in pool:
            victim = catalog.templates[r.template]
            if victim.priority > limit:
                if by_priority:
                    break  # the pool is sorted by priority: no lower one is left
                continue
            n = self.nodes.get(r.node_id)
            if r.job_id in self.preempted or n is None or n.tier not in tiers or not r.gpus:
                continue
            if self._fits_without(t, sh, n, r, keep=True):
                self.preempted.add(r.job_id)
                self.granted += n.offer_left <= 0  # the offer the stop frees (place_best_first counts it)
                n.offer_left = max(n.offer_left, 1)
                why = f"preempted by {t.name} (priority {t.priority} vs {victim.priority}"
                elapsed = self._elapsed(r)
                if not by_priority:
                    why += (f"; it ran {elapsed:.0f} s, the least of the jobs whose stop makes room"
                            if elapsed is not None else "; no job whose stop makes room has a known start")
                return n, Stop(r.job_id, r.node_id, why + ")", cfg.grace_s)
        return None, None

    def _fits_without(self, t: JobTemplate, sh: _Shape, n: _Node, r: RunningJob, *, keep: bool = False) -> bool:
        """Whether ``t`` fits on ``n`` once running job ``r`` there is gone (its GPUs, VRAM, CPUs, memory; the
        node's rules; ``t``'s predicted memory). ``keep``: when it fits, leave ``r`` released (it is stopped)."""
        victim = self.catalog.templates[r.template]
        extra = self._extra_gib(victim, n) if self.predictor is not None else 0.0
        n.take(r.gpus, -r.gpu_fraction, -r.vram_gib, refresh=False)  # as if it stopped (fit reads no summary)
        n.use(victim, -1.0, extra)
        ok = (_blocker(n, t, self.instances[t.name], self.catalog,
                       self._need(t, n) if sh.predicted else sh.need) is None
              and n.fit(sh.num_gpus, sh.vram) is not None)
        if not (ok and keep):
            n.take(r.gpus, r.gpu_fraction, r.vram_gib)
            n.use(victim, 1.0, extra)
        else:
            n._refresh()
        return ok

    def _victims_by_priority(self) -> list[RunningJob]:
        """The preemptible running jobs, lowest priority first (built once per plan)."""
        if self.preemptible_pool is None:
            templates = self.templates
            self.preemptible_pool = sorted(
                (r for r in self.view.running if r.template in templates and templates[r.template].preemptible),
                key=lambda r: templates[r.template].priority,
            )
        return self.preemptible_pool

    def _victims_by_elapsed(self) -> list[RunningJob]:
        """The preemptible running jobs, least elapsed first, those of unknown start last (built once per plan):
        with predictions, the least work lost."""
        if self.by_elapsed is None:
            templates = self.templates
            pool = [r for r in self.view.running if r.template in templates and templates[r.template].preemptible]

            def key(r: RunningJob) -> tuple[bool, float, int]:
                e = self._elapsed(r)
                return e is None, e or 0.0, templates[r.template].priority

            self.by_elapsed = sorted(pool, key=key)
        return self.by_elapsed

    def _predicted_ends(self) -> list[tuple[float, RunningJob]]:
        """``(seconds until its predicted end, job)`` of every running job with one, soonest first (built once
        per plan): its start plus its template's run time median on its node's class, from history (its p90 once
        it ran past the median: its end is not "now"); a job already past its p90 has no predicted end (it is not
        "about to end"), nor one whose start is unknown."""
        if self.ends is not None:
            return self.ends
        ends = []
        stopped = {s.job_id for s in self.stops}
        for r in self.view.running:
            n = self.nodes.get(r.node_id)
            elapsed = self._elapsed(r)
            if n is None or elapsed is None or r.job_id in stopped or r.template not in self.templates:
                continue
            p = self._predict(r.template, n.view.node_class)
            if p is None or elapsed > p.runtime_p90_s:
                continue
            ends.append((p.runtime_p50_s - elapsed if elapsed <= p.runtime_p50_s else p.runtime_p90_s - elapsed, r))
        ends.sort(key=lambda e: (e[0], e[1].job_id))
        self.ends = ends
        return ends

    def _first_end(self, t: JobTemplate, sh: _Shape, durable: bool = False) -> tuple[float, RunningJob] | None:
        """The soonest predicted end (:meth:`_predicted_ends`) after which ``t`` fits on the job's node, among
        those no other waiting template counts on and not preempted, trying at most ``cfg.wait_checks``. Templates
        of one shape (strict strategies apart) resume the scan where the last one stopped: an end that did not make
        room for the shape, or that another template counts on, is not tried again in this plan."""
        key = sh.window if not (sh.strict_spread or sh.strict_pack) else (t.name,)
        key = (key, "durable") if durable else key  # ``durable``: only jobs on durable nodes (a stable kind)
        ends = self._predicted_ends()
        i = self.end_scan.get(key, 0)
        if i < 0:
            return None
        checks = self.cfg.wait_checks
        while i < len(ends):
            rem, r = ends[i]
            i += 1
            if r.job_id in self.claimed or r.job_id in self.preempted:
                continue
            n = self.nodes[r.node_id]
            if n.tier not in sh.tiers or (durable and n.view.ephemeral):
                continue
            checks -= 1
            if checks < 0:
                break
            if self._fits_without(t, sh, n, r):
                self.end_scan[key] = i - 1  # (claimed by the caller if counted on: skipped next time)
                return rem, r
        self.end_scan[key] = -1
        return None

    def _wait_or_preempt(self, t: JobTemplate, sh: _Shape, reason: str) -> tuple[_Node | None, tuple | None,
                                                                                Stop | None, str]:
        """With predictions, GPU work no node fits now: when the soonest predicted end that makes room for it
        (:meth:`_first_end`) is within ``cfg.preempt_wait_s``, it waits for that job (nothing is preempted); else
        the eligible job with the least elapsed time is preempted (:meth:`_preempt`); else it waits, its reason
        giving the expected wait when an end is predicted. The end it waits for is not counted on by another
        template of this plan. Returns :meth:`_find_node`'s ``(node, fit, stop, reason)``."""
        end = self._first_end(t, sh)
        if end is not None and end[0] <= self.cfg.preempt_wait_s:
            self.claimed.add(end[1].job_id)
            r = end[1]
            return None, None, None, (f"waits ~{end[0]:.0f} s for {r.job_id} ({r.template}) on {r.node_id} to end "
                                      f"(predicted); {reason}")
        node, stop = self._preempt(t, sh, self._victims_by_elapsed(), by_priority=False)
        if node is not None:
            return node, node.fit(sh.num_gpus, sh.vram), stop, reason
        if end is not None:
            self.claimed.add(end[1].job_id)
            r = end[1]
            reason += f"; expected wait ~{end[0]:.0f} s ({r.job_id} on {r.node_id} predicted to end)"
        return None, None, None, reason
