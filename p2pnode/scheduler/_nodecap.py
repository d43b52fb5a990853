"""One node's free GPU capacity while a plan is made (issue 38): the planner's side of the one capacity model
(:mod:`._gpucap`). Pure; a plan builds one :class:`NodeCap` per node and mutates it as it places work.

* **Usable VRAM.** Each GPU may be committed up to its usable VRAM (:func:`._gpucap.usable_vram_gib`: its memory
  times the guard's ``gpu_max_percent``, 19.2 of a 24 GiB RTX 4090), never more; the guard measures the memory
  every process really uses separately and marks a GPU over that limit ``full`` (no new work on it).
* **Remainders go to the job.** A placement whose GPU would keep a remainder (fraction and VRAM) that no GPU
  template of the catalog that may use the node and may still get an instance could take (:attr:`NodeCap.remnant`,
  each one's fraction and floor, ``max(vram_gib, its config's vram floor)``; judged when the placement is chosen,
  and once more when it is made among the templates below their ``max_concurrency``, :meth:`NodeCap.grow`) gives
  that remainder to the job it places: its fraction and VRAM grow to the GPU's whole remaining share, so the GPU is
  committed to its usable VRAM (two 0.25-GPU selfplays at the 8 GiB floor hold 8 + 11.2 of a 4090's 19.2 usable GiB,
  instead of 16 with 3.2 "free" that nothing fits). A whole-GPU job is given all the usable VRAM of its GPUs. The
  job learns its share from ``P2PNODE_GPU_FRACTION`` and ``P2PNODE_VRAM_GIB`` (:mod:`p2pnode.jobs._runner`) and can
  size itself by it.
* **Stranded GPU time** (:meth:`NodeCap.strand`): what a placement on a fresh GPU gives beyond what the job asked
  (a remainder given to it; the rest of a GPU other work partly holds is not stranded by the job that fills it),
  or a fraction it leaves free that no template waiting in this plan fits (:attr:`NodeCap.waiting`):
  the planner scores it down and makes such a placement last (``_Planning.place_best_first``).
* **Offers as fractions.** A node's GPU offer counts jobs; a fractional job placed on a GPU idle when the plan
  started (:attr:`NodeCap.fresh`) spends one offer for that GPU, and further fractional jobs on the same GPU in
  the same plan (:attr:`NodeCap.opened`) spend none: a free GPU is offered as the fractions that fit it, so
  half-GPU jobs fill an empty 8-GPU box in one plan instead of 8, 4, 2, ... GPUs over successive plans.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..guardcore import MIN_PRIORITY
from ._catalog import JobTemplate
from ._gpucap import EPS, MAX_VRAM_GIB, usable_vram_gib

__all__ = ["NodeCap", "Remnant", "fits_any", "least_shapes"]

Remnant = tuple[float, float, frozenset[str]]
"""A fractional GPU template's shape as a remainder sees it: ``(num_gpus, VRAM GiB per GPU with its floor, the hard
tags it needs)``."""


def fits_any(shapes: tuple[Remnant, ...], tags: frozenset[str], frac: float, vram: float) -> bool:
    """Whether one of ``shapes`` fits a GPU remainder of ``frac`` and ``vram`` GiB on a node with ``tags``."""
    return any(f <= frac + EPS and v <= vram + EPS and hard <= tags for f, v, hard in shapes)


def least_shapes(shapes: list[Remnant]) -> tuple[Remnant, ...]:
    """``shapes`` without those another one dominates (asks no more of either and needs no tag it lacks): what
    :func:`fits_any` needs to look at."""
    out: list[Remnant] = []
    for s in sorted(set(shapes), key=lambda s: (s[0], s[1], len(s[2]), sorted(s[2]))):
        if not any(o[0] <= s[0] + EPS and o[1] <= s[1] + EPS and o[2] <= s[2] for o in out):
            out.append(s)
    return tuple(out)


class NodeCap:
    """Mutable free capacity of one node during planning (module docstring). ``tier``: the node's tier."""

    __slots__ = ("view", "tier", "offer_left", "cpu_offer_left", "frac_free", "vram_free", "templates", "groups",
                 "jobs", "best_vram", "best_frac", "whole_free", "whole_vram", "min_priority", "cpus", "memory",
                 "custom", "free_sum", "ngpus", "accounts", "version", "usable", "fresh", "opened", "open_room",
                 "remnant", "waiting", "stale")

    def __init__(self, v: Any, tier: int, *, refresh: bool = True) -> None:  # v: a NodeView (._plan imports this)
        """``refresh=False``: the summaries (:meth:`_refresh`) are left to :meth:`start_plan` (a plan accounts what
        runs first: one pass over the GPUs per node instead of two or three)."""
        self.view = v
        self.tier = tier
        self.offer_left: int = v.offer
        self.cpu_offer_left: int = v.cpu_offer
        frac_free: dict[int, float] = {}
        usable: dict[int, float] = {}
        ratio = v.vram_limit_ratio
        for g in v.gpus:
            frac_free[g.index] = 0.0 if g.full or g.kept else 1.0  # no new work
            usable[g.index] = usable_vram_gib(g.vram_gib, ratio)
        self.frac_free, self.usable = frac_free, usable
        self.vram_free = dict(usable)
        self.templates: dict[str, int] = defaultdict(int)
        self.groups: set[str] = set()
        self.jobs = 0
        self.min_priority: int = MIN_PRIORITY[max(0, min(4, v.level))]
        self.cpus: float = v.cpus
        self.memory: float = v.memory_gib
        self.custom: dict[str, float] = dict(v.custom)
        self.ngpus = max(1, len(self.frac_free))
        self.accounts: bool = v.cpus > 0 or v.memory_gib > 0
        self.version = 0
        """Bumped on every change of the node's free capacity: a candidate scored earlier is re-scored."""
        self.fresh: frozenset[int] = frozenset()
        """GPUs with nothing on them once what runs is accounted (:meth:`start_plan`)."""
        self.opened: set[int] = set()
        """Fresh GPUs this plan placed a fractional job on (that job spent the GPU's one offer)."""
        self.open_room = 0
        """Opened GPUs with a fraction still free: fractional work fits there without an offer."""
        self.remnant: tuple[Remnant, ...] = ()
        """The catalog's fractional GPU templates that may use this node's tier (:func:`least_shapes`)."""
        self.waiting: tuple[Remnant, ...] = ()
        """The same, of the templates waiting in this plan."""
        self.stale = True
        """Whether capacity changed since the summaries were computed (:meth:`take` with ``refresh=False``)."""
        if refresh:
            self._refresh()

    def start_plan(self) -> None:
        """Once what runs is accounted: the GPUs with nothing on them are fresh (each is one offer's worth), and the
        summaries are brought up to date if they are stale."""
        if self.stale:
            self.fresh = frozenset(self._refresh())
        else:
            self.fresh = frozenset(i for i, f in self.frac_free.items() if f >= 1.0 - EPS)

    def use(self, t: JobTemplate, sign: float = 1.0, extra_gib: float = 0.0) -> None:
        """Account (or, with ``sign=-1``, release) a template's CPUs, memory and custom resources; ``extra_gib``:
        memory it is predicted to hold beyond its declared ``memory_gib``."""
        r = t.resources
        self.cpus -= sign * r.num_cpus
        self.memory -= sign * (r.memory_gib + extra_gib)
        for name, amount in r.custom:
            self.custom[name] = self.custom.get(name, 0.0) - sign * amount

    def _refresh(self) -> list[int]:
        """Summaries that let most nodes be rejected without looking at their GPUs (one pass over the GPUs); returns
        the whole free GPUs (:meth:`start_plan`'s fresh ones)."""
        best_vram = best_frac = whole_vram = free_sum = 0.0
        whole: list[int] = []
        vram_free = self.vram_free
        for i, f in self.frac_free.items():
            free_sum += f
            if f > best_frac:
                best_frac = f
            if f > EPS:
                v = vram_free[i]
                if v > best_vram:
                    best_vram = v
                if f >= 1.0 - EPS:
                    whole.append(i)
                    if v > whole_vram:
                        whole_vram = v
        self.best_vram, self.best_frac, self.whole_free, self.whole_vram = best_vram, best_frac, len(whole), whole_vram
        self.free_sum = free_sum
        opened = self.opened
        self.open_room = sum(1 for i in opened if self.frac_free[i] > EPS and vram_free[i] > EPS) if opened else 0
        self.stale = False
        return whole

    def take(self, gpus: tuple[int, ...], fraction: float, vram: float, *, refresh: bool = True) -> None:
        """Take (negative values: give back) ``fraction`` and ``vram`` GiB of each of ``gpus``."""
        self.version += 1
        for i in gpus:
            if i in self.frac_free:
                self.frac_free[i] -= fraction
                self.vram_free[i] -= vram
        if refresh:
            self._refresh()
        else:
            self.stale = True

    def charge(self, gpus: tuple[int, ...], fractional: bool) -> int:
        """Spend the offer a placement on ``gpus`` costs (``fractional``: the job asked less than one GPU) and
        return it: 0 on a GPU this plan opened, else 1 (a fresh GPU is opened by it)."""
        i = gpus[0] if fractional and len(gpus) == 1 else None
        if i is not None and i in self.opened:
            return 0
        self.offer_left -= 1
        if i is not None and i in self.fresh:
            self.opened.add(i)
            self.open_room = sum(1 for k in self.opened if self.frac_free[k] > EPS and self.vram_free[k] > EPS)
        return 1

    def refund(self, gpus: tuple[int, ...], fractional: bool) -> int:
        """The inverse of :meth:`charge` for a placement of this plan whose capacity was given back (:meth:`take`
        with negative values): give back the offer it costs and return it. On a GPU this plan opened, 1 when the
        GPU is left empty (it is fresh again: the next fraction there opens it anew), else 0 (the GPU's one offer
        stays spent while work of this plan is on it, whichever of its jobs spent it); elsewhere 1."""
        i = gpus[0] if fractional and len(gpus) == 1 else None
        if i is not None and i in self.opened:
            if self.frac_free[i] < 1.0 - EPS:
                return 0
            self.opened.discard(i)
            self.open_room = sum(1 for k in self.opened if self.frac_free[k] > EPS and self.vram_free[k] > EPS)
        self.offer_left += 1
        return 1

    def offers(self, num_gpus: float) -> bool:
        """Whether this node still offers GPU work of ``num_gpus`` per job: an offer left, or (a fraction) an
        opened GPU with room."""
        return self.offer_left > 0 or (num_gpus < 1.0 and self.open_room > 0)

    def has_room(self) -> bool:
        """Some GPU room left (a whole GPU, or a fraction with VRAM)."""
        return self.whole_free > 0 or self.best_vram > 0

    def could_fit(self, num_gpus: float, vram: float) -> bool:
        """Cheap necessary condition for :meth:`fit`."""
        if num_gpus <= 0:
            return True
        if num_gpus < 1:
            return self.best_vram + EPS >= vram and self.best_frac + EPS >= num_gpus
        return self.whole_free >= int(num_gpus) and self.whole_vram + EPS >= vram

    def fit(self, num_gpus: float, vram: float, *,
            offered: bool = False) -> tuple[tuple[int, ...], float, float] | None:
        """``(GPU indices, fraction of each, VRAM GiB of each)`` granted to a request, or None. Fractions go to the
        fullest GPU that still fits (best fit keeps whole GPUs free) and are given the GPU's remainder when no
        template could use it (:meth:`share`); whole GPUs must be entirely free and are given all their usable
        VRAM. What is given beyond the request is at most :data:`p2pnode.scheduler._gpucap.MAX_VRAM_GIB` GiB (the
        plan wire's bound holds whatever size a member claims). ``offered``: only where the node's offers allow
        it (its offers spent: a fraction on a GPU this plan opened, nothing for whole GPUs)."""
        if num_gpus <= 0:
            return (), 0.0, 0.0
        vram_free = self.vram_free
        spent = offered and self.offer_left <= 0
        if num_gpus < 1:
            only = self.opened if spent else None
            best, best_f = None, 2.0
            for i, f in self.frac_free.items():
                if f + EPS >= num_gpus and f < best_f and vram_free[i] + EPS >= vram and (only is None or i in only):
                    best, best_f = i, f
            if best is None:
                return None
            frac, granted = self.share(best, num_gpus, vram)
            return (best,), frac, granted
        if spent:
            return None
        free = [i for i, f in self.frac_free.items() if f >= 1.0 - EPS and vram_free[i] + EPS >= vram]
        k = int(num_gpus)
        if len(free) < k:
            return None
        gpus = tuple(sorted(free)[:k])
        return gpus, 1.0, max(vram, min(MAX_VRAM_GIB, *(vram_free[i] for i in gpus)))

    def share(self, i: int, num_gpus: float, vram: float) -> tuple[float, float]:
        """``(fraction, VRAM GiB)`` a fractional job asking ``num_gpus`` and ``vram`` is given on GPU ``i``: what
        it asks, or the GPU's whole remaining share when the remainder is no fraction at all or one that no
        template of the catalog that may use this node fits (:attr:`remnant`)."""
        left_f = self.frac_free[i] - num_gpus
        if left_f <= EPS or not fits_any(self.remnant, self.view.tags, left_f, self.vram_free[i] - vram):
            return max(num_gpus, self.frac_free[i]), max(vram, min(self.vram_free[i], MAX_VRAM_GIB))
        return num_gpus, vram

    def grow(self, fit: tuple[tuple[int, ...], float, float], live: tuple[Remnant, ...]) -> tuple:
        """``fit`` (a fractional job's one GPU, fraction and VRAM, from :meth:`fit`) given the GPU's whole remaining
        share when no template that may still get an instance (``live``: those below their ``max_concurrency``)
        fits what it would leave: the planner chose the placement as before, and the job gets what nothing else
        could use (a 4090 committed to its usable 19.2 GiB, not 8, when every template that fits 24 GiB is at its
        cap). Whole-GPU fits and fits that leave nothing are returned as they are."""
        gpus, frac, vram = fit
        if len(gpus) != 1 or frac >= 1.0 - EPS:
            return fit
        i = gpus[0]
        left_f = self.frac_free[i] - frac
        if left_f <= EPS or fits_any(live, self.view.tags, left_f, self.vram_free[i] - vram):
            return fit
        return gpus, frac + left_f, max(vram, min(self.vram_free[i], MAX_VRAM_GIB))

    def strand(self, fit: tuple[tuple[int, ...], float, float], num_gpus: float) -> float:
        """GPU fraction a placement ``fit`` (from :meth:`fit`) of a job asking ``num_gpus`` strands: given to it
        beyond what it asked on a fresh GPU (a remainder no template could use), or left free with no template
        waiting in this plan that fits it (:attr:`waiting`). 0 for whole GPUs, and 0 for the rest a job is given on
        a GPU other work already partly holds: filling a hole commits the GPU to its usable VRAM, and placing the
        job elsewhere would leave that rest idle all the same (fractions are bin-packed:
        :data:`._planshape.HOLE_COST`)."""
        gpus, frac, vram = fit
        if len(gpus) != 1 or num_gpus >= 1.0:
            return 0.0
        i = gpus[0]
        extra = frac - num_gpus
        if extra > EPS:
            return extra if self.frac_free[i] >= 1.0 - EPS else 0.0
        left = self.frac_free[i] - frac
        if left > EPS and not fits_any(self.waiting, self.view.tags, left, self.vram_free[i] - vram):
            return left
        return 0.0
