"""Invariants every plan must keep, checked by the simulator and the property tests. Pure."""

from __future__ import annotations

from collections import defaultdict

from ..guardcore import may_start
from ._catalog import Catalog
from ._gpucap import usable_vram_gib
from ._plan import ClusterView, Plan, RunningJob, node_tier
from ._predict import Prediction

__all__ = ["plan_violations"]


def plan_violations(view: ClusterView, catalog: Catalog, p: Plan, *, term: int | None = None) -> list[str]:
    """Every broken invariant of ``p`` on ``view`` (empty when none): at most one training job per config; no job
    on a GPU without the VRAM or whose memory is full; GPU fractions and VRAM not over-committed (VRAM up to each
    GPU's usable VRAM, :func:`._gpucap.usable_vram_gib`); no GPU work placed above a node's offer (plus what its
    preemptions free; a GPU idle in the view costs one offer however many fractional jobs the plan puts on it), no
    CPU-only work above its CPU offer; the catalog's policy (VRAM floors per config, the tiers each template may
    use, degradation admission by the kind's priority), hard affinities, strict spread, max_concurrency, training
    refused at critical disk, the plan's term on every assignment. Gangs (issue 26): a gang counts as one job
    (max_concurrency, one training per config); every gang the plan places has all its members, ranks
    0..size-1 (an elastic gang: at least its minimum, ranks 0..; members added to a running one take free ranks only);
    a running gang is stopped whole or not at all; no two gang members share a port block on a node.
    With predictions (``view.predictor``): :func:`_predicted_violations`."""
    out: list[str] = []
    stopped = {s.job_id for s in p.stops}
    live = [r for r in view.running if r.job_id not in stopped and r.template in catalog.templates]
    frac: dict[tuple[str, int], float] = defaultdict(float)
    vram: dict[tuple[str, int], float] = defaultdict(float)
    per_template: dict[str, set[str]] = defaultdict(set)
    per_node_unit: dict[tuple[str, str], int] = defaultdict(int)
    training: dict[str, set[str]] = defaultdict(set)
    for r in live:
        unit = r.gang.id if r.gang is not None else r.job_id
        for g in r.gpus:
            frac[(r.node_id, g)] += r.gpu_fraction
            vram[(r.node_id, g)] += r.vram_gib
        per_template[r.template].add(unit)
        per_node_unit[(r.node_id, r.template if r.gang is None else unit)] += 1
        if catalog.templates[r.template].kind == "training":
            training[catalog.templates[r.template].config].add(unit)
    out += _gang_violations(view, p, stopped, live)
    added = _gpu_offers_spent(view, catalog, p, live)
    added_cpu: dict[str, int] = defaultdict(int)
    for a in p.assignments:
        t = catalog.templates[a.template]
        unit = a.gang.id if a.gang is not None else a.job_id
        n = view.nodes.get(a.node_id)
        if n is None:
            out.append(f"{a.job_id}: assigned to unknown node {a.node_id}")
            continue
        if term is not None and a.term != term:
            out.append(f"{a.job_id}: term {a.term} != plan term {term}")
        if t.resources.num_gpus > 0 and a.vram_gib < catalog.vram_floor_gib(t.config):
            out.append(f"{a.job_id}: {a.vram_gib} GiB below the floor of {t.config}")
        gpu_vram = {g.index: g.vram_gib for g in n.gpus}
        full = {g.index for g in n.gpus if g.full or g.kept}
        for g in a.gpus:
            frac[(a.node_id, g)] += a.gpu_fraction
            vram[(a.node_id, g)] += a.vram_gib
            if gpu_vram.get(g, 0.0) < a.vram_gib:
                out.append(f"{a.job_id}: on GPU {g} of {a.node_id} without {a.vram_gib} GiB")
            if g in full:
                out.append(f"{a.job_id}: on GPU {g} of {a.node_id}, whose memory is over the limit or kept free")
        if node_tier(n) not in catalog.tiers_of(t):
            out.append(f"{a.job_id}: {t.kind} on tier {node_tier(n)}, outside its tiers {catalog.tiers_of(t)}")
        if t.kind == "training":
            training[t.config].add(unit)
            if n.disk_percent >= n.disk_max_percent:
                out.append(f"{a.job_id}: training on {a.node_id} at critical disk")
        if not may_start(catalog.priority_of(t.kind), n.level):
            out.append(f"{a.job_id}: {t.kind} on {a.node_id} at degradation level {n.level}")
        for aff in t.placement.affinity:
            if aff.hard and aff.tag not in n.tags:
                out.append(f"{a.job_id}: {a.node_id} lacks required tag {aff.tag}")
        per_template[a.template].add(unit)
        per_node_unit[(a.node_id, a.template if a.gang is None else unit)] += 1
        if t.placement.strategy == "strict_spread" and per_node_unit[(a.node_id, a.template if a.gang is None
                                                                      else unit)] > 1:
            out.append(f"{a.job_id}: strict_spread broken on {a.node_id}")
        if t.resources.num_gpus <= 0:
            added_cpu[a.node_id] += 1
    for key, f in frac.items():
        if f > 1.0 + 1e-6:
            out.append(f"GPU {key} shared beyond 1 ({f:.2f})")
        node = view.nodes.get(key[0])
        if node is None:
            continue  # jobs of a member dead within the orphan grace: they count, they hold no capacity here
        cap = {x.index: usable_vram_gib(x.vram_gib, node.vram_limit_ratio) for x in node.gpus}.get(key[1], 0.0)
        if vram[key] > cap + 1e-6:
            out.append(f"GPU {key} VRAM over-committed ({vram[key]:.1f} > {cap})")
    for name, units in per_template.items():
        if len(units) > catalog.templates[name].max_concurrency:
            out.append(f"{name}: {len(units)} instances > max_concurrency")
    for config, c in training.items():
        if len(c) > 1:
            out.append(f"{config}: {len(c)} training jobs")
    cpus: dict[str, float] = defaultdict(float)
    mem: dict[str, float] = defaultdict(float)
    for node_id, name in [(r.node_id, r.template) for r in live] + [(a.node_id, a.template) for a in p.assignments]:
        cpus[node_id] += catalog.templates[name].resources.num_cpus
        mem[node_id] += catalog.templates[name].resources.memory_gib
    for node_id, used in cpus.items():
        n = view.nodes.get(node_id)
        if n is not None and n.cpus > 0 and used > n.cpus + 1e-6 and any(a.node_id == node_id for a in p.assignments):
            out.append(f"{node_id}: {used:g} CPUs committed > {n.cpus:g}")
        if n is not None and n.memory_gib > 0 and mem[node_id] > n.memory_gib + 1e-6 and any(
            a.node_id == node_id for a in p.assignments
        ):
            out.append(f"{node_id}: {mem[node_id]:g} GiB memory committed > {n.memory_gib:g}")
    return out + _offer_violations(view, p, added, added_cpu) + _predicted_violations(view, catalog, p, live)


def _predicted_violations(view: ClusterView, catalog: Catalog, p: Plan, live: list[RunningJob]) -> list[str]:
    """With predictions from history: no assignment on a node that accounts memory where what runs and what the
    plan adds hold more than the node gives to jobs, each job counted at the larger of its declared memory and its
    predicted peak RSS p90 on the node's class; none on GPUs that may each commit less than its predicted peak VRAM
    p90 per GPU."""
    pred = view.predictor
    if pred is None:
        return []
    memo: dict[tuple[str, str], Prediction | None] = {}

    def history(name: str, node_class: str) -> Prediction | None:
        key = (name, node_class)
        if key not in memo:
            x = pred.predict(name, node_class)
            memo[key] = x if x is not None and x.source == "history" else None
        return memo[key]

    out: list[str] = []
    held: dict[str, float] = defaultdict(float)
    for node_id, name in [(r.node_id, r.template) for r in live] + [(a.node_id, a.template) for a in p.assignments]:
        n = view.nodes.get(node_id)
        if n is not None and n.memory_gib > 0:
            x = history(name, n.node_class)
            rss = x.rss_p90_bytes / 2**30 if x is not None and x.rss_p90_bytes is not None else 0.0
            held[node_id] += max(catalog.templates[name].resources.memory_gib, rss)
    flagged: set[str] = set()
    for a in p.assignments:
        n = view.nodes.get(a.node_id)
        if n is None:
            continue
        if n.memory_gib > 0 and held[a.node_id] > n.memory_gib + 1e-6 and a.node_id not in flagged:
            flagged.add(a.node_id)
            out.append(f"{a.node_id}: {held[a.node_id]:.1f} GiB of predicted peak memory committed > "
                       f"{n.memory_gib:g}")
        x = history(a.template, n.node_class)
        if x is not None and x.vram_p90_bytes is not None and a.gpus and n.gpus:
            per_gpu = x.vram_p90_bytes / 2**30 / len(a.gpus)
            top = max(usable_vram_gib(g.vram_gib, n.vram_limit_ratio) for g in n.gpus)
            if per_gpu > top + 1e-6:
                out.append(f"{a.job_id}: predicted peak VRAM {per_gpu:.1f} GiB per GPU > {top:g} on {a.node_id}")
    return out


def _gpu_offers_spent(view: ClusterView, catalog: Catalog, p: Plan, live: list[RunningJob]) -> dict[str, int]:
    """GPU offers ``p`` spends per node: one per GPU assignment, except that fractional jobs on a GPU idle in the
    view (nothing live on it, not full) spend one offer for the GPU, however many the plan puts there."""
    held = {(r.node_id, g) for r in live for g in r.gpus}
    opened: set[tuple[str, int]] = set()
    added: dict[str, int] = defaultdict(int)
    for a in p.assignments:
        t = catalog.templates[a.template]
        n = view.nodes.get(a.node_id)
        if t.resources.num_gpus <= 0 or n is None:
            continue
        key = (a.node_id, a.gpus[0]) if a.gpus else None
        fresh = a.gang is None and 0 < t.resources.num_gpus < 1 and len(a.gpus) == 1 and key not in held \
            and not any(g.full or g.kept for g in n.gpus if g.index == a.gpus[0])
        if not (fresh and key in opened):
            added[a.node_id] += 1
        if fresh and key is not None:
            opened.add(key)
    return added


def _offer_violations(view: ClusterView, p: Plan, added: dict[str, int], added_cpu: dict[str, int]) -> list[str]:
    """No GPU work above a node's offer (plus what its preemptions free), no CPU-only work above its CPU offer."""
    out = []
    for node_id, k in added.items():
        stops_here = sum(1 for s in p.stops if s.node_id == node_id)
        if k > view.nodes[node_id].offer + stops_here:
            out.append(f"{node_id}: {k} placements above its offer {view.nodes[node_id].offer}")
    for node_id, k in added_cpu.items():
        if k > view.nodes[node_id].cpu_offer:
            out.append(f"{node_id}: {k} CPU-only placements above its CPU offer {view.nodes[node_id].cpu_offer}")
    return out


def _held_ranks(view: ClusterView, stopped: set[str]) -> dict[str, set[int]]:
    """The ranks of each running gang held by a member the plan does not stop."""
    out: dict[str, set[int]] = defaultdict(set)
    for r in view.running:
        if r.gang is not None and r.job_id not in stopped:
            out[r.gang.id].add(r.gang.rank)
    return out


def _gang_violations(view: ClusterView, p: Plan, stopped: set[str], live: list) -> list[str]:
    """The gang invariants of :func:`plan_violations`: stopped whole or not at all, placed whole, one port block
    per member on a node."""
    out: list[str] = []
    gangs: dict[str, set[str]] = defaultdict(set)
    blocks: dict[tuple[str, int], int] = defaultdict(int)
    for r in view.running:
        if r.gang is not None:
            gangs[r.gang.id].add(r.job_id)
    for r in live:
        if r.gang is not None:
            blocks[(r.node_id, r.gang.port_base)] += 1
    for gid, ids in gangs.items():
        hit = ids & stopped
        if hit and hit != ids:
            out.append(f"gang {gid}: {len(hit)} of its {len(ids)} members stopped (a gang goes whole)")
    placed: dict[str, list[int]] = defaultdict(list)
    sizes: dict[str, tuple[int, int]] = {}
    for a in p.assignments:
        if a.gang is not None:
            placed[a.gang.id].append(a.gang.rank)
            sizes[a.gang.id] = (a.gang.min_size, a.gang.size)
            blocks[(a.node_id, a.gang.port_base)] += 1
    held = _held_ranks(view, stopped)
    for gid, ranks in placed.items():
        low, size = sizes[gid]
        if gid in gangs:  # members added to a running (elastic) gang: free ranks only
            if set(ranks) & held.get(gid, set()) or len(set(ranks)) < len(ranks):
                out.append(f"gang {gid}: ranks {sorted(ranks)} added, held {sorted(held.get(gid, ()))}")
        elif sorted(ranks) != list(range(len(ranks) if low else size)) or len(ranks) < (low or size):
            out.append(f"gang {gid}: placed ranks {sorted(ranks)} of {size} (all or nothing"
                       f"{f', at least {low}' if low else ''})")
    for (node_id, base), k in blocks.items():
        if k > 1:
            out.append(f"{node_id}: port block {base} given to {k} gang members")
    return out
