"""Why work waits (pure): step 5 of :func:`p2pnode.scheduler.plan`. Every unplaced template is left with the reason; a
GPU template's reason is counted when the plan is made (:meth:`_Reasons._gpu_reason`): every node of its tiers by
the first check it fails (no offer: band, cordon or degraded; offers spent by this plan; its level; its CPUs or
memory; its GPUs: the guard's cap, measured-full GPUs, or held by jobs), the cause of most nodes first, then nodes
outside its tiers that would take it and a floor that rules nodes out. A template no node could take even when
empty waits as ``"unsatisfiable: ..."`` (:func:`_unsatisfiable`, :func:`_gang_unsatisfiable`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ..guardcore import BACKPRESSURE_LEVEL
from ._catalog import JobTemplate
from ._gpucap import EPS, usable_vram_gib
from ._nodecap import NodeCap as _Node
from ._planshape import (
    _GPU_WHY,
    _NO_OFFER_CPU,
    _blocker,
    _fits_empty,
    _same_values,
    _Shape,
)
from ._planstate import _PlanState
from ._planview import (
    ClusterView,
    NodeView,
    node_tier,
)


class _Reasons(_PlanState):
    """The pending reasons of one plan: what keeps a template off each node, counted by cause."""

    __slots__ = ()

    def _held_by_spawn_limits(self) -> str:
        """'' unless nodes hold assignments back for their spawn-rate limit (their GPUs stay assigned): then which,
        how many, and when the biggest backlog is started at its rate."""
        held = sorted((n.view for n in self.nodes.values() if n.view.waiting > 0 and n.view.gpus),
                      key=lambda v: -v.waiting)
        if not held:
            return ""
        v = held[0]
        total = sum(x.waiting for x in held)
        when = (f", all started within {60.0 * v.waiting / v.spawn_rate:.0f} s" if v.spawn_rate >= 0.01
                else "")  # a member's absurd rate is not worth a 300-digit figure
        others = f" and {len(held) - 1} more nodes" if len(held) > 1 else ""
        return (f"{total} assigned jobs wait for their node's spawn-rate limit (node {v.node_id}: {v.waiting} at "
                f"{v.spawn_rate:g} a minute{when}{others})")

    def _gpu_cause(self, n: _Node, t: JobTemplate, sh: _Shape) -> str | None:
        """What keeps GPU template ``t`` off node ``n`` now, the first of these checks that fails: ``"small"`` (fewer
        GPUs than it asks have its VRAM usable even empty: no offer or free GPU would make room), then the order a
        placement meets them: ``"degraded"`` / ``"band"`` (the node offered no GPU work: at the backpressure level,
        or in its GPU utilization band or cordoned), ``"offers"`` (it offered some, this plan spent them, and no
        GPU the plan opened fits it), ``"level"`` (its degradation level refuses the kind's priority),
        ``"strategy"`` (hard tags it lacks, a strict strategy: no cause), ``"other:<why>"`` (CPUs, memory, custom
        resources, disk, predicted memory), then its GPUs: ``"cap"`` (a GPU has the fraction and the VRAM free by
        its raw memory, not under the guard's cap: usable VRAM), ``"full"`` (a GPU that could take it is over the
        guard's measured memory limit), ``"committed"`` (no GPU with the fraction and VRAM free: the jobs on it
        hold them); None: it fits."""
        v, num_gpus, vram = n.view, sh.num_gpus, sh.vram
        k = 1 if num_gpus < 1 else int(num_gpus)
        if sum(1 for x in n.usable.values() if x + EPS >= vram) < k:  # even empty: whatever else holds it
            return "small"
        if v.offer <= 0:
            return "degraded" if v.level >= BACKPRESSURE_LEVEL else "band"
        if n.offer_left <= 0 and n.fit(num_gpus, vram, offered=True) is None:  # nor a GPU this plan opened
            return "offers"
        if sh.prio < n.min_priority:
            return "level"
        blocked = _blocker(n, t, self.instances[t.name], self.catalog, self._need(t, n) if sh.predicted else sh.need)
        if blocked:
            if not isinstance(blocked, str):
                return "other:" + self._predicted_why(n, t, blocked)
            return "strategy" if blocked == "strategy" else "other:" + blocked
        if n.fit(num_gpus, vram) is not None:
            return None
        need = min(1.0, num_gpus)
        room = [i for i, f in n.frac_free.items() if f + EPS >= need]
        raw = {g.index: g.vram_gib - (n.usable[g.index] - n.vram_free[g.index]) for g in v.gpus}
        if sum(1 for i in room if raw[i] + EPS >= vram) >= k:
            return "cap"
        if any(g.kept and n.usable[g.index] + EPS >= vram for g in v.gpus):
            return "kept"
        if any(g.full and n.usable[g.index] + EPS >= vram for g in v.gpus):
            return "full"
        return "committed"

    def _gpu_reason(self, t: JobTemplate, sh: _Shape) -> str:
        """Why GPU template ``t`` found no node: every node of its tiers (carrying its hard tags) counted by what
        keeps it off (:meth:`_gpu_cause`), the cause of most nodes first, e.g. ``"no node in tiers 3/2/1 takes it:
        16 have a GPU with 0.25 of it and 8 GiB free by raw memory but not under the guard's cap (VRAM is committed
        up to 80 % of each GPU, gpu_max_percent); 2 offer no GPU work (in their GPU utilization band or
        cordoned)"``; then the nodes outside its tiers that would take it, and the config's VRAM floor when it is
        what rules out nodes that would fit what the template asks."""
        asked = t.resources.vram_gib
        key = (sh.window, sh.tiers, sh.prio, asked, t.kind == "training",
               t.name if sh.strict_spread or sh.strict_pack or sh.predicted else "")
        memo = self.why_memo.get(key)
        if memo is None:
            memo = self.why_memo[key] = self._count_causes(t, sh)
        counts, outside, by_floor, ratio = memo
        tiers = "/".join(map(str, sh.tiers))
        k = max(1, int(sh.num_gpus))
        gpus = f"a GPU with {sh.num_gpus:g} of it and" if sh.num_gpus < 1 else f"{k} free GPU{'s' * (k > 1)} with"
        words = {
            "cap": f"have {gpus} {sh.vram:g} GiB free by raw memory but not under the guard's cap (VRAM is "
                   f"committed up to {ratio * 100:g} % of each GPU, gpu_max_percent)",
            "small": (f"have no GPU with {sh.vram:g} GiB usable even when empty" if k == 1 else
                      f"have fewer than {k} GPUs with {sh.vram:g} GiB usable even when empty")
                     + f" ({ratio * 100:g} % of each GPU's memory, gpu_max_percent)",
            "band": "offer no GPU work (in their GPU utilization band or cordoned)",
            "degraded": f"offer no GPU work (degraded: level {BACKPRESSURE_LEVEL} or more)",
            "offers": "spent their GPU offers in this plan",
            "level": f"are degraded (their level refuses {sh.prio_name} work)",
            "kept": "have GPUs that could take it kept free for a training of a stable kind until a leader places it",
            "full": "have GPUs that could take it over the guard's measured GPU memory limit",
            "committed": (f"have no GPU with {sh.num_gpus:g} of it and {sh.vram:g} GiB free" if sh.num_gpus < 1
                          else f"have no free GPU with {sh.vram:g} GiB" if k == 1
                          else f"have fewer than {k} free GPUs with {sh.vram:g} GiB") + " (held by their jobs)",
        }
        order = list(words)
        causes = sorted((c for c in counts if c != "strategy"),
                        key=lambda c: (-counts[c], order.index(c) if c in order else len(order), c))
        parts = [f"{counts[c]} {words[c]}" if c in words else c[6:] if c.startswith("other:node ")
                 else f"{c[6:]} ({counts[c]} node{'s' * (counts[c] > 1)})" for c in causes]
        if not parts:
            parts = [f"its placement ({t.placement.strategy}, required tags) rules out every node that fits"
                     if counts else "no node there has a GPU"]
        if outside:
            parts.append(f"{outside} node{'s' * (outside > 1)} outside tiers {tiers} would take it ({t.kind} may "
                         f"use tiers {tiers} only)")
        if by_floor:
            parts.append(f"the VRAM floor of {t.config} ({sh.vram:g} GiB per GPU; it asks {asked:g}) rules out "
                         f"{by_floor} of them")
        return f"no node in tiers {tiers} takes it: " + "; ".join(parts)

    def _count_causes(self, t: JobTemplate, sh: _Shape) -> tuple[dict[str, int], int, int, float]:
        """For :meth:`_gpu_reason`: nodes of ``t``'s tiers (with its hard tags) by cause (:meth:`_gpu_cause`), the
        nodes outside its tiers that would take it, those of its tiers that would fit what it asks below its
        config's floor, and the guard's cap (a ratio) of a node held by it."""
        counts: dict[str, int] = defaultdict(int)
        hard = set(sh.hard)
        outside = by_floor = 0
        ratio = 1.0
        asked = t.resources.vram_gib
        for n in self.nodes.values():
            if not n.view.gpus or not hard <= n.view.tags:
                continue
            cause = self._gpu_cause(n, t, sh)
            if n.tier not in sh.tiers:
                outside += cause is None
                continue
            if cause is None:
                continue  # room that appeared after it was looked for (a preemption's): not what blocked it
            counts[cause] += 1
            if cause in ("cap", "small"):
                ratio = n.view.vram_limit_ratio
            if cause in ("cap", "committed") and asked + EPS < sh.vram:
                by_floor += n.fit(sh.num_gpus, asked) is not None
        return counts, outside, by_floor, ratio

    def _no_node_reason(self, t: JobTemplate, sh: _Shape) -> str:
        """Why no candidate was found for ``t`` when no node gave a reason of its own: for GPU work, every node's
        blocker (:data:`_GPU_WHY`, counted when the plan is made); for CPU-only work, no CPU offer left (anywhere,
        or in its tiers), else no node with the CPUs and memory it asks free."""
        tiers = "/".join(map(str, sh.tiers))
        if sh.num_gpus > 0:
            return _GPU_WHY
        offering = [n for n in self.nodes.values() if n.cpu_offer_left > 0]
        if not offering:
            return _NO_OFFER_CPU
        if not any(n.tier in sh.tiers for n in offering):
            return f"no node in tiers {tiers} offers CPU work now (the nodes that do are in other tiers)"
        r = t.resources
        return f"no node has {r.num_cpus:g} free CPUs and {r.memory_gib:g} GiB of free memory"


def _unsatisfiable(t: JobTemplate, sh: _Shape, view: ClusterView, memo: dict[tuple, str | None]) -> str | None:
    """``"unsatisfiable: ..."`` when no node of ``view`` could take one instance of ``t`` even with nothing
    running (GPU count and VRAM per GPU within the node's VRAM limit, CPUs and memory where the node accounts
    them, custom resources, hard tags, the kind's tiers), else None. Memoized per request in ``memo``; the
    scan stops at the first node that fits, so only an unsatisfiable request costs a pass over the view."""
    r = t.resources
    k = int(r.num_gpus) if r.num_gpus >= 1 else (1 if r.num_gpus > 0 else 0)
    key = (sh.tiers, sh.hard, k, sh.vram, r.num_cpus, r.memory_gib, r.custom)
    if key in memo:
        return memo[key]
    if not view.nodes:
        memo[key] = None
        return None
    hard = set(sh.hard)

    def gpus_ok(n: NodeView) -> bool:
        return k == 0 or sum(1 for g in n.gpus if usable_vram_gib(g.vram_gib, n.vram_limit_ratio) + EPS >= sh.vram) >= k

    def cpus_ok(n: NodeView) -> bool:
        return n.cpus <= 0 or n.cpus + 1e-9 >= r.num_cpus

    def memory_ok(n: NodeView) -> bool:
        return n.memory_gib <= 0 or n.memory_gib + 1e-9 >= r.memory_gib

    def custom_ok(n: NodeView) -> bool:
        have = dict(n.custom)
        return all(have.get(name, 0.0) + 1e-9 >= amount for name, amount in r.custom)

    for n in view.nodes.values():
        if (node_tier(n) in sh.tiers and hard <= n.tags and gpus_ok(n) and cpus_ok(n) and memory_ok(n)
                and custom_ok(n)):
            memo[key] = None
            return None
    # Nothing fits: name the first request that no node meets on its own. With hard tags only the nodes carrying
    # them could take it: what those lack is the cause (a node without the tags is none), named with the node.
    pool = [n for n in view.nodes.values() if node_tier(n) in sh.tiers]
    tagged = [n for n in pool if hard <= n.tags]
    tags = ", ".join(sh.hard)

    def lacks(one: str, many: str, what: str) -> str:
        """What the nodes carrying the required tags lack: ``node x carries the required tags @node=x but offers
        0 of custom resource 'nvlink' (asks 1)``, or ``the 3 nodes carrying ... offer at most ...``."""
        if len(tagged) == 1:
            return f"node {tagged[0].node_id} carries the required tags {tags} but {one} {what}"
        return f"the {len(tagged)} nodes carrying the required tags {tags} {many} {what}"

    why: str
    if not pool:
        why = f"{t.kind} may use tiers {'/'.join(map(str, sh.tiers))}, no node is in them"
    elif not tagged:
        why = f"no node in tiers {'/'.join(map(str, sh.tiers))} carries the required tags {tags}"
    elif not any(len(n.gpus) >= k for n in tagged):
        most_gpus = max(len(n.gpus) for n in tagged)
        why = (lacks("has", "have at most", f"{most_gpus} GPUs (asks {k})") if hard
               else f"asks {k} GPUs, the largest node has {most_gpus}")
    elif not any(gpus_ok(n) for n in tagged):
        top = max((usable_vram_gib(g.vram_gib, n.vram_limit_ratio) for n in tagged for g in n.gpus), default=0.0)
        asks = f"asks {k} GPU{'s' if k > 1 else ''} with {sh.vram:g} GiB each"
        if k == 1 or top + 1e-9 < sh.vram:
            why = (lacks("can commit", "can commit at most", f"{top:g} GiB on one GPU ({asks})") if hard
                   else f"{asks}, the most any node can commit on one GPU is {top:g} GiB")
        else:
            why = (lacks("has too few such GPUs", "have too few such GPUs", f"({asks})") if hard
                   else f"{asks}, no node has that many")
    elif not any(cpus_ok(n) for n in tagged):
        most_cpus = max(n.cpus for n in tagged)
        why = (lacks("offers", "offer at most", f"{most_cpus:g} CPUs (asks {r.num_cpus:g})") if hard
               else f"asks {r.num_cpus:g} CPUs, the largest node has {most_cpus:g}")
    elif not any(memory_ok(n) for n in tagged):
        most_mem = max(n.memory_gib for n in tagged)
        why = (lacks("offers", "offer at most", f"{most_mem:g} GiB of memory (asks {r.memory_gib:g})") if hard
               else f"asks {r.memory_gib:g} GiB of memory, the largest node has {most_mem:g} GiB")
    elif not any(custom_ok(n) for n in tagged):
        missing = [(name, amount) for name, amount in r.custom
                   if not any(dict(n.custom).get(name, 0.0) + 1e-9 >= amount for n in tagged)]
        name, amount = missing[0] if missing else r.custom[0]
        most = max((dict(n.custom).get(name, 0.0) for n in tagged), default=0.0)
        if hard:
            why = lacks("offers", "offer at most", f"{most:g} of custom resource {name!r} (asks {amount:g})")
        else:
            why = (f"asks {amount:g} of custom resource {name!r}, "
                   + (f"the most any node has is {most:g}" if most > 0 else "no node has it"))
    else:
        why = ("no single node meets every request at once (GPUs, VRAM, CPUs, memory, custom resources"
               + (f") among the nodes carrying the required tags {tags}" if hard else ", tags)"))
    memo[key] = "unsatisfiable: " + why
    return memo[key]


def _gang_unsatisfiable(t: JobTemplate, sh: _Shape, nodes: Iterable[_Node], has_ports: bool) -> str | None:
    """``"unsatisfiable: ..."`` when no set of the view's nodes (``nodes``: the plan's, with their tiers) could ever
    hold gang ``t``: no port range, no node with its engine, or (one member per node: ``strict_spread``) fewer
    nodes able to take a member even when empty, with the same ``same`` tag values, than it has members."""
    assert t.gang is not None
    m = t.gang.minimum  # (an elastic gang: it can start with its minimum)
    if not has_ports:
        return "unsatisfiable: scheduler.gang_ports holds no port block for gang members"
    tiers, hard = sh.tiers, set(sh.hard)
    pool = [n.view for n in nodes if n.tier in tiers and hard <= n.view.tags]
    if not any(t.engine in n.engines for n in pool):
        return f"unsatisfiable: no node has engine {t.engine} (a node runs it where its engine interpreter imports it)"
    if t.placement.strategy != "strict_spread":
        return None
    able = [n for n in pool if t.engine in n.engines and n.host and _fits_empty(t, sh, n)]
    counts: dict[tuple[str, ...], int] = defaultdict(int)
    for n in able:
        key = _same_values(n.tags, t.gang.same)
        if key is not None:
            counts[key] += 1
    best = max(counts.values(), default=0)
    if best >= m:
        return None
    same = f" sharing {', '.join(t.gang.same)}" if t.gang.same else ""
    return (f"unsatisfiable: gang of {m} needs {m} nodes (strict_spread: one member per node) that can each take a "
            f"member with engine {t.engine}{same}; the fleet has {best}")
