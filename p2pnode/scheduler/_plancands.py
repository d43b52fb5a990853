"""Candidate nodes and their scores (pure): the search of step 3 of :func:`p2pnode.scheduler.plan`.

A node that may take an instance (VRAM floor per config, tier preference per kind and the kind's guard priority,
hard affinities, strict strategies, the node's capacity offer and degradation level) is scored
(:meth:`_Candidates._assess`) on tier rank, stranded GPU time (a fraction given beyond the job's ask on a fresh
GPU, or left free with no waiting template that fits it: :meth:`._nodecap.NodeCap.strand`; it can send work one
tier further),
provider (a stable kind's work scores an ephemeral node ``STABLE_COST`` lower, :mod:`._plantakeback`; selfplay
prefers cheap), holes (a fraction on a GPU already partly held gains ``HOLE_COST`` plus the share held: fractional
work is bin-packed, best fit first, before a fresh GPU of any of its tiers is opened; the tiers of a fractional
template are all searched unless its best so far fills a hole), strategy (pack/spread: of nodes, for whole GPUs
and for the fresh GPUs fractions open; a fraction filling a hole is not pushed away by its template's instances on
that node), soft affinity and colocation. Like Nomad's limit iterator, only up to
``candidates`` feasible nodes per tier are scored; each template shape keeps its window of scored nodes
(:class:`._planshape._Window`) between placements and re-scores only nodes whose capacity changed, so a placement
costs O(1) scorings (:meth:`_Candidates._candidates_for`). A stable kind's durable-first search has windows of its
own over pools of only durable nodes (:meth:`_Candidates._durable_pools`).
"""

from __future__ import annotations

from typing import Any

from ._catalog import JobTemplate
from ._gpucap import EPS
from ._nodecap import NodeCap as _Node
from ._planreasons import _Reasons
from ._planshape import (
    _GPU_WHY,
    GPU_BOX_COST,
    HOLE_COST,
    STABLE_COST,
    TIER_RANK_COST,
    WASTE_COST,
    _blocker,
    _offering,
    _Shape,
    _Window,
)


class _Candidates(_Reasons):
    """The candidate pools and windows of one plan, and a node's score for a template."""

    __slots__ = ()

    def _candidates_for(self, t: JobTemplate, sh: _Shape, *,
                        durable: bool = False) -> tuple[_Node | None, tuple | None, str]:
        """The best of up to ``cfg.candidates`` feasible nodes per tier (preferred tiers first). Each template
        keeps its window of scored nodes between placements: only nodes whose capacity changed since are
        re-scored, and the scan of a tier's pool resumes where it stopped (capacity only shrinks within a plan,
        so a node found unfit stays unfit), which makes a placement cost O(1) scorings instead of O(candidates).
        Templates of one shape (:attr:`_Shape.window`) share a window. Strict strategies depend on the
        template's other instances and are searched afresh. ``durable``: only the durable nodes of each tier
        (a stable kind's first search: its own window over pools of durable nodes; no reason when none fits)."""
        tiers, vram, gpu = sh.tiers, sh.vram, sh.num_gpus > 0
        wkey = (sh.window, "durable") if durable else sh.window
        w = self.windows.get(wkey)
        if w is None or sh.strict_spread or sh.strict_pack:
            w = self.windows[wkey] = _Window()
        spread = not sh.pack
        fraction = 0.0 < sh.num_gpus < 1.0
        hole_max = HOLE_COST + 1.0 if fraction else 0.0  # the most a hole adds to a score (_assess)
        name = t.name
        pools = self._durable_pools(gpu) if durable else self.gpu_pools if gpu else self.cpu_pools
        tier_max_vram, candidates, epochs = self.tier_max_vram, self.cfg.candidates, self.epochs
        entries = w.entries = self._rescored(w, t, sh)
        best, best_score = None, 0.0
        for rank, tier in enumerate(tiers):
            pool = pools.get(tier)
            if not pool or tier_max_vram.get(tier, 0.0) + 1e-9 < vram:
                continue
            have = sum(1 for e in entries if e[2] == rank)
            ekey = (gpu, tier, "durable") if durable else (gpu, tier)
            if have < candidates and (w.left.get(tier) or w.epoch.get(tier) != epochs[ekey]):
                self._scan(w, entries, have, pool, gpu, rank, tier, t, sh, ekey)  # (a finished scan adds nothing)
            for e in entries:
                if e[2] == rank:  # spread: fewer of the template's instances, unless the fraction fills a hole
                    sc = e[3] - e[0].templates.get(name, 0) if spread and not (
                        fraction and e[0].frac_free[e[4][0][0]] < 1.0 - EPS) else e[3]
                    if best is None or sc > best_score:
                        best, best_score = e, sc
            # A later tier can only win by avoiding stranded GPU time worth more than a tier step, or (a fraction)
            # by a hole to fill (a stable kind's ephemeral best is compared with later ephemeral nodes: the durable
            # ones were searched first).
            if best is not None and best_score > -(rank + 1) * TIER_RANK_COST + hole_max - (
                    STABLE_COST if sh.stable and best[0].view.ephemeral else 0.0):
                break
        if best is None:
            if durable:
                return None, None, ""
            if gpu and not w.reason.startswith("predicted peak"):  # every node's blocker, not the last one seen,
                return None, None, _GPU_WHY  # counted when the plan is made (result())
            return None, None, w.reason or self._no_node_reason(t, sh)
        return best[0], best[4], ""

    def _assess(self, n: _Node, rank: int, t: JobTemplate, sh: _Shape) -> tuple[float, tuple] | str | None:
        """``(score, fit)`` of ``n`` for ``t``, or why not (a reason, or None when it simply does not fit)."""
        num_gpus, vram = sh.num_gpus, sh.vram
        if not (n.offers(num_gpus) if num_gpus > 0 else n.cpu_offer_left > 0) or not n.could_fit(num_gpus, vram):
            return None
        if sh.prio < n.min_priority:
            return f"nodes that fit are degraded (level {n.view.level} refuses {sh.prio_name} work)"
        if sh.checks or n.accounts or sh.predicted:  # else no rule of _blocker nor resource could refuse it
            need = self._need(t, n) if sh.predicted else sh.need
            blocked = _blocker(n, t, self.instances[t.name], self.catalog, need)
            if blocked:
                if not isinstance(blocked, str):  # only the predicted figures misfit
                    return self._predicted_why(n, t, blocked)
                return blocked if blocked != "strategy" else None
        fit = n.fit(num_gpus, vram, offered=True)
        if fit is None:
            return None
        v = n.view
        key = 0.0 - rank * TIER_RANK_COST
        if num_gpus > 0:
            used = 1.0 - n.free_sum / n.ngpus
            if num_gpus < 1.0:  # bin-pack fractions: a partly held GPU first, the fullest that fits (best fit)
                held = 1.0 - n.frac_free[fit[0][0]]
                key += HOLE_COST + held if held > EPS else 0.0
        else:  # CPU work: the share of the node's CPUs in use; GPU-less nodes first within a tier
            used = 1.0 - n.cpus / v.cpus if v.cpus > 0 else 0.0
            key -= GPU_BOX_COST if v.gpus else 0.0
        key -= WASTE_COST * n.strand(fit, num_gpus)  # GPU time it strands (given beyond its ask, or left unusable)
        key -= STABLE_COST if sh.stable and v.ephemeral else 0.0
        key += -(v.cost_per_hour / 10.0 if sh.selfplay else 0.0)
        key += used if sh.pack else -used  # spread also subtracts the template's instances here (at selection)
        key += sum(1.0 for tag in sh.soft if tag in v.tags)
        key += 1.0 if sh.group in n.groups else 0.0
        return key, fit

    def _durable_pools(self, gpu: bool) -> dict[int, list[_Node]]:
        """Per tier, the durable nodes of the GPU pools (``gpu``) or of the CPU pools (built once per plan)."""
        pools = self.durable_pools.get(gpu)
        if pools is None:
            every = self.gpu_pools if gpu else self.cpu_pools
            pools = self.durable_pools[gpu] = {k: [n for n in v if not n.view.ephemeral] for k, v in every.items()}
        return pools

    def _rescored(self, w: _Window, t: JobTemplate, sh: _Shape) -> list[list[Any]]:
        """The window's entries (``[node, version, rank, score, fit]``), those whose node changed since they were
        scored scored again, and those no longer feasible dropped (the last reason kept in ``w.reason``)."""
        assess = self._assess
        entries = []
        for e in w.entries:
            n = e[0]
            if n.version != e[1]:
                r = assess(n, e[2], t, sh)
                if not isinstance(r, tuple):
                    if r is not None:
                        w.reason = r
                    continue
                e[1], e[3], e[4] = n.version, r[0], r[1]
            entries.append(e)
        return entries

    def _scan(self, w: _Window, entries: list[list[Any]], have: int, pool: list[_Node], gpu: bool, rank: int,
              tier: int, t: JobTemplate, sh: _Shape, ekey: tuple | None = None) -> None:
        """Add feasible nodes of ``tier``'s pool to ``entries`` (``have`` of them of this tier) until the tier has
        ``cfg.candidates``, resuming the window's scan where it stopped (from a random start, afresh after the pool
        was compacted), and compact the pool when half of what was passed over has no offer or GPU room left.
        ``ekey``: the pool's key in ``epochs`` (default ``(gpu, tier)``)."""
        candidates, epochs, assess = self.cfg.candidates, self.epochs, self._assess
        size = len(pool)
        ekey = ekey or (gpu, tier)
        epoch = epochs[ekey]
        if w.epoch.get(tier) != epoch:  # first scan, or the pool was compacted: start anew
            w.epoch[tier], w.pos[tier], w.left[tier] = epoch, self.rng.randrange(size), size
        k, left = w.pos[tier], w.left[tier]
        known = [e[0] for e in entries]
        dead = 0
        while left > 0 and have < candidates:
            n = pool[k]
            k = k + 1 if k + 1 < size else 0
            left -= 1
            if not _offering(n, gpu):
                dead += 1
                continue
            r = assess(n, rank, t, sh)
            if isinstance(r, tuple):
                if n not in known:
                    entries.append([n, n.version, rank, r[0], r[1]])
                    have += 1
            elif r is not None:
                w.reason = r
        w.pos[tier], w.left[tier] = k, left
        if dead * 2 > size:
            pool[:] = [x for x in pool if _offering(x, gpu)]
            epochs[ekey] += 1
