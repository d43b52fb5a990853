"""A stable kind's durable-first search and take-back (pure): part of step 3 of :func:`p2pnode.scheduler.plan`.

Stable kinds (issue 38; ``[policy] stable``, training by default, :meth:`~p2pnode.scheduler.Catalog.is_stable`): in a
fleet with both durable nodes and ephemeral ones (``NodeView.ephemeral``, the ``ephemeral`` tag), an instance of a
stable kind goes, in this order, to (a) the best durable node of its tiers that fits it (its own window over pools
of only durable nodes, so a tier of 1,000 spot boxes does not hide the one durable box); (b) a durable node of its
tiers where taking back assignments this plan made makes room (single jobs of preemptible, non-stable templates
at least ``preemption_gap`` lower, as few as it takes, within the node's offers: nothing ran yet; once the stable
instance is assigned they go to other nodes at once, or wait), else where preempting one running job makes room
(step 4's rule and order; with predictions not when a job there whose end makes room is predicted to end within
``preempt_wait_s``), else several (fractions sharing the GPUs it needs; none on a GPU it does not take); (c) the
usual search over every node, where an ephemeral node scores ``STABLE_COST`` (more than every tier step) lower,
then steps 4-5. So a durable node of any of the kind's tiers beats every ephemeral node; tiers order the durable
nodes, then the ephemeral ones. Each step
costs what the usual search does (windows, O(1) scorings per placement); a shape for which (b) found nothing does
not try it again in the plan. A fleet of only durable (or only ephemeral) nodes is planned as before.
"""

from __future__ import annotations

from collections import defaultdict

from ._catalog import JobTemplate
from ._nodecap import NodeCap as _Node
from ._planpreempt import _Preempting
from ._planshape import (
    _GPU_WHY,
    _blocker,
    _Shape,
)
from ._planview import (
    Assignment,
    RunningJob,
    Stop,
)


class _TakeBack(_Preempting):
    """One plan's durable-first placement of stable kinds: assignments this plan made taken back, or running jobs
    preempted, on a durable node, and the displaced instances placed again."""

    __slots__ = ()

    def _durable_node(self, t: JobTemplate, sh: _Shape, search: bool) -> tuple[_Node | None, tuple | None,
                                                                               Stop | None, str]:
        """A stable kind's durable-first search (module docstring), as :meth:`_find_node`'s
        ``(node, fit, stop, reason)``: the best durable candidate of ``t``'s tiers (``search``: its shape may
        still find one); else a durable node where taking back one of this plan's assignments makes room
        (:meth:`_displace`: nothing ran yet); else, with predictions, nothing when a job on a durable node of its
        tiers whose end makes room is predicted to end within ``preempt_wait_s`` (no work is thrown away for it);
        else a durable node where preempting one running job makes room (the rule and order of :meth:`_preempt`);
        else no node and no reason (the other nodes are searched). A shape (and priority) that neither could place
        is not tried again in this plan."""
        if search:
            node, fit, _ = self._candidates_for(t, sh, durable=True)
            if node is not None:
                return node, fit, None, ""
        key = (sh.window, t.priority)
        if sh.num_gpus <= 0 or key in self.durable_failed:
            return None, None, None, ""
        found = self._displace(t, sh)  # nothing ran yet: nothing is lost
        if found is not None:
            return found[0], found[1], None, ""
        if self.predictor is not None:  # a job there ends soon: no work is thrown away, the other nodes are searched
            end = self._first_end(t, sh, durable=True)
            if end is not None and end[0] <= self.cfg.preempt_wait_s:
                return None, None, None, ""
        if self.durable_victims is None:
            nodes = self.nodes
            pool = self._victims_by_elapsed() if self.predictor is not None else self._victims_by_priority()
            self.durable_victims = [r for r in pool if r.node_id in nodes and not nodes[r.node_id].view.ephemeral]
        node, stop = self._preempt(t, sh, self.durable_victims, by_priority=self.predictor is None)
        if node is None:  # fractional jobs share a GPU: a whole-GPU training may need several of them stopped
            node, stop = self._preempt_several(t, sh, self.durable_victims)
        if node is None:
            if not (sh.strict_spread or sh.strict_pack):
                self.durable_failed.add(key)
            return None, None, None, ""
        return node, node.fit(sh.num_gpus, sh.vram), stop, ""

    def _displace(self, t: JobTemplate, sh: _Shape) -> tuple[_Node, tuple] | None:
        """A durable node of ``t``'s tiers where taking back assignments this plan made makes room for ``t``, and
        ``t``'s fit there: single jobs (not gang members) of preemptible templates of kinds that are not stable, at
        least ``preemption_gap`` points below ``t`` (the preemption rule; lowest priority first, the latest first),
        as few as it takes (:meth:`_make_room`: fractional jobs share a GPU, a whole-GPU training may need several
        taken back; none that made no room), judged with the offers they give back (a fraction on a GPU this plan
        opened gives the GPU's offer back only when the GPU is left empty, :meth:`_Node.refund`), so ``t`` fits
        within the node's offers. They are undone (capacity, offers, instances, shares, training and colocation
        group) and, once ``t`` is assigned, placed again (:meth:`_place_again`, from :attr:`displaced`); None when
        no node's eligible assignments make room. Nothing ran yet: no stop is needed."""
        catalog, nodes = self.catalog, self.nodes
        tiers = catalog.tiers_for(t.kind)
        limit = t.priority - self.cfg.preemption_gap
        by_node: dict[str, list[tuple[int, int, Assignment, JobTemplate]]] = defaultdict(list)
        for i, a in enumerate(self.assignments):
            n, victim = nodes[a.node_id], self.templates[a.template]
            if (a.gang is None and a.gpus and not n.view.ephemeral and n.tier in tiers and victim.preemptible
                    and victim.priority <= limit and not catalog.is_stable(victim.kind)):
                by_node[a.node_id].append((victim.priority, -i, a, victim))
        for nid, order in sorted(by_node.items(), key=lambda kv: (min(x[:2] for x in kv[1]), kv[0])):
            n = nodes[nid]
            room, offer = n.open_room, n.offer_left
            order.sort(key=lambda x: x[:2])
            jobs = [(a.gpus, a.gpu_fraction, a.vram_gib, v, self.shapes[v.name].num_gpus < 1) for _, _, a, v in order]
            made = self._make_room(t, sh, n, jobs, offered=True)
            if made is None:
                continue
            fit, taken = made
            for k in taken:
                self._undo(order[k][2], order[k][3], n)
            self.open_room += n.open_room - room
            self.granted += n.offer_left - offer  # the offers given back (``t``'s assignment spends what it needs)
            self.displaced = [order[k][3] for k in taken]
            return n, fit
        return None

    def _make_room(self, t: JobTemplate, sh: _Shape, n: _Node, jobs: list[tuple[tuple[int, ...], float, float,
                                                                             JobTemplate, bool]],
                   offered: bool) -> tuple[tuple, list[int]] | None:
        """Release ``jobs`` on ``n`` (each ``(GPUs, fraction, VRAM GiB, template, fractional)``) in their order until
        ``t`` fits there (:meth:`_fit_after`; ``offered``: the jobs are this plan's, they give back the offers they
        cost and ``t`` must fit within the node's offers), then take back each released job but the last, the
        latest first, whose release ``t`` does not need: none is released that made no room (one on a GPU ``t``
        does not use, or that gave back no offer it needs). Returns ``(t's fit, the indices of the released jobs,
        ascending)`` with those left released on ``n``; None, and ``n`` as it was, when all of them do not make
        room. O(len(jobs)) fit checks."""
        released: list[int] = []
        fit = None
        for k, job in enumerate(jobs):
            self._let_go(n, job, offered, -1.0)
            released.append(k)
            fit = self._fit_after(t, sh, n, offered)
            if fit is not None:
                break
        if fit is None:
            for k in reversed(released):
                self._let_go(n, jobs[k], offered, 1.0)
            return None
        for k in reversed(released[:-1]):  # (the last is needed: without it ``t`` did not fit)
            self._let_go(n, jobs[k], offered, 1.0)
            kept = self._fit_after(t, sh, n, offered)
            if kept is not None:
                released.remove(k)
                fit = kept
            else:
                self._let_go(n, jobs[k], offered, -1.0)
        return fit, released

    def _let_go(self, n: _Node, job: tuple[tuple[int, ...], float, float, JobTemplate, bool], offered: bool,
                sign: float) -> None:
        """Release (``sign`` -1) or take again (+1) one of :meth:`_make_room`'s jobs on ``n``: its GPU share, its
        CPUs and memory, and (``offered``) the offer it costs (:meth:`_Node.refund`, :meth:`_Node.charge`)."""
        gpus, frac, vram, v, fractional = job
        n.take(gpus, sign * frac, sign * vram)
        n.use(v, sign, self._extra_gib(v, n) if self.predictor is not None else 0.0)
        if offered:
            if sign < 0:
                n.refund(gpus, fractional)
            else:
                n.charge(gpus, fractional)

    def _fit_after(self, t: JobTemplate, sh: _Shape, n: _Node, offered: bool) -> tuple | None:
        """``t``'s fit on ``n`` as it stands (its rules, its predicted memory; ``offered``: within its offers), or
        None."""
        if _blocker(n, t, self.instances[t.name], self.catalog,
                    self._need(t, n) if sh.predicted else sh.need) is not None:
            return None
        return n.fit(sh.num_gpus, sh.vram, offered=offered)

    def _undo(self, a: Assignment, victim: JobTemplate, n: _Node) -> None:
        """Take back assignment ``a`` of ``victim`` on ``n`` (its capacity and offer were given back already,
        :meth:`_make_room`): the assignment, the instance, the node's counts and colocation group, the training
        its config runs, the GPU shares."""
        self.assignments.remove(a)
        n.templates[victim.name] -= 1
        n.jobs -= 1
        group = victim.placement.colocation_group
        if group and not any(k > 0 and self.templates[name].placement.colocation_group == group
                             for name, k in n.templates.items() if name in self.templates):
            n.groups.discard(group)
        if victim.kind == "training" and self.training_on.get(victim.config) == n.view.node_id:
            del self.training_on[victim.config]  # (the plan places a config's training only where none runs)
        self.instances[victim.name] -= 1
        if 0 < victim.resources.num_gpus < 1 and victim.name not in self.live_names:
            self._live_change(victim.name, True)
        gpu_time = a.gpu_fraction * len(a.gpus)
        self.used_total -= gpu_time
        self.kind_used[victim.kind] -= gpu_time
        if n.tier == 1:
            self.tier1_used[victim.config] -= gpu_time

    def _place_again(self, v: JobTemplate, n: _Node, t: JobTemplate) -> int:
        """Place the instance of ``v`` that :meth:`_displace` took back from ``n`` for ``t`` (``t`` assigned there
        already: ``n`` takes it only where room and offers are left) now, when a node takes it without stranding
        GPU time and the plan's budget allows; else it waits for the next plan with the reason: the node that would
        take it only by stranding GPU time, if one would, and each node's blocker, counted when the plan is made
        (:data:`._planshape._GPU_WHY`). Returns the GPU offers it spent."""
        sh = self.shapes[v.name]
        moved = f"its placement on {n.view.node_id} went to {t.name} (a stable kind keeps durable nodes first)"
        if len(self.assignments) < self.cfg.max_assignments:
            node, fit, _ = self._candidates_for(v, sh)
            if node is not None and fit is not None and node.strand(fit, sh.num_gpus) <= 0:
                return self._assign(v, sh, node, fit, self.current_score(v))
            if sh.num_gpus > 0:  # no node takes it (or only by stranding): each node's blocker at the plan's end
                by = f"; {node.view.node_id} would take it only by stranding GPU time" if node and fit else ""
                self.pending.setdefault(v.name, f"{moved}{by}; {_GPU_WHY}")
                return 0
        self.pending.setdefault(v.name, f"{moved}; placed again by the next plan")
        return 0

    def _preempt_several(self, t: JobTemplate, sh: _Shape, pool: list[RunningJob]) -> tuple[_Node | None, Stop | None]:
        """A stable kind's preemption on a durable node when no single job's stop makes room (fractional jobs share
        its GPUs): of one node's eligible jobs (``pool``'s order and rule, as :meth:`_preempt`; single jobs, not
        gang members), those released in ``pool``'s order until ``t`` fits, less every one ``t`` still fits
        without (:meth:`_make_room`: a job on a GPU ``t`` does not take keeps running). Every stop but the last is
        added to the plan here; the last is returned as :meth:`_preempt`'s. ``(None, None)`` when no node's jobs
        make room."""
        if sh.num_gpus <= 0:
            return None, None
        cfg, catalog = self.cfg, self.catalog
        tiers = catalog.tiers_for(t.kind)
        limit = t.priority - cfg.preemption_gap
        by_node: dict[str, list[RunningJob]] = defaultdict(list)
        for r in pool:
            n = self.nodes.get(r.node_id)
            if (catalog.templates[r.template].priority <= limit and r.job_id not in self.preempted and n is not None
                    and n.tier in tiers and r.gpus and r.gang is None):
                by_node[r.node_id].append(r)
        for nid in sorted(by_node):
            n, rs = self.nodes[nid], by_node[nid]
            made = self._make_room(t, sh, n, [(r.gpus, r.gpu_fraction, r.vram_gib, catalog.templates[r.template],
                                               False) for r in rs], offered=False)
            if made is None:
                continue
            stopped = [rs[k] for k in made[1]]
            stops = [Stop(x.job_id, x.node_id, f"preempted by {t.name} (priority {t.priority} vs "
                          f"{catalog.templates[x.template].priority}; {len(stopped)} jobs make room on a durable "
                          "node)", cfg.grace_s) for x in stopped]
            self.preempted.update(x.job_id for x in stopped)
            self.stops.extend(stops[:-1])
            self.granted += n.offer_left <= 0
            n.offer_left = max(n.offer_left, 1)
            return n, stops[-1]
        return None, None
