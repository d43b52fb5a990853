"""Property-based: over random fleets, catalogs and signals, plans never break an invariant."""

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pnode.guard import may_start
from p2pnode.scheduler import (
    ClusterView,
    GpuView,
    NodeView,
    RunningJob,
    Signals,
    node_tier,
    parse_catalog,
    plan,
    vram_floor_gib,
)
from p2pnode.scheduler._plan import KIND_PRIORITY, OperationPriority

CONFIGS = ["hex8_2p", "square8_3p", "square19_2p", "hexagonal_4p", "other_1"]
VRAMS = [8, 12, 16, 24, 32, 48, 80, 141]

node_st = st.builds(
    lambda i, gpus, offer, level, eph, cost, disk, tags: NodeView(
        f"n{i}", tuple(GpuView(k, v) for k, v in enumerate(gpus)), frozenset(tags), cost, eph, offer, level, disk),
    st.integers(0, 10**6),
    st.lists(st.sampled_from(VRAMS), min_size=0, max_size=8),
    st.integers(0, 6), st.integers(0, 4), st.booleans(), st.floats(0, 3), st.floats(0, 90),
    st.sets(st.sampled_from(["provider=runpod", "fast", "voter"]), max_size=2),
)

job_st = st.fixed_dictionaries({
    "kind": st.sampled_from(["selfplay", "training", "evaluation", "custom"]),
    "config": st.sampled_from(CONFIGS),
    "priority": st.integers(1, 100),
    "preemptible": st.booleans(),
    "max_concurrency": st.integers(1, 6),
    "resources": st.fixed_dictionaries({
        "num_gpus": st.sampled_from([0, 0.25, 0.5, 1, 2]),
        "vram_gib": st.sampled_from([1, 4, 8, 20, 40]),
    }),
    "placement": st.fixed_dictionaries({
        "strategy": st.sampled_from(["pack", "spread", "strict_pack", "strict_spread"]),
        "affinity": st.lists(st.fixed_dictionaries({"tag": st.sampled_from(["fast", "provider=runpod"]),
                                                    "hard": st.booleans()}), max_size=1),
    }),
})

signal_st = st.builds(Signals, st.sampled_from(CONFIGS), st.floats(0, 5), st.floats(-100, 100), st.floats(0, 10**6),
                      st.floats(0, 1), st.integers(0, 10**6))


def _catalog(jobs):
    docs = []
    for i, j in enumerate(jobs):
        d = dict(j, name=f"t{i}", argv=["run", "{config}"])
        if d["resources"]["num_gpus"] == 0:
            d["resources"] = {"num_gpus": 0, "vram_gib": 0}
        docs.append(d)
    return parse_catalog({"job": docs})


def _check(view, catalog, p, term):
    stopped = {s.job_id for s in p.stops}
    live = [r for r in view.running if r.job_id not in stopped and r.template in catalog.templates]
    frac = defaultdict(float)
    vram = defaultdict(float)
    per_template = defaultdict(int)
    per_node_template = defaultdict(int)
    training = defaultdict(int)
    for r in live:
        for g in r.gpus:
            frac[(r.node_id, g)] += r.gpu_fraction
            vram[(r.node_id, g)] += r.vram_gib
        per_template[r.template] += 1
        per_node_template[(r.node_id, r.template)] += 1
        if catalog.templates[r.template].kind == "training":
            training[catalog.templates[r.template].config] += 1
    added = defaultdict(int)
    for a in p.assignments:
        t = catalog.templates[a.template]
        n = view.nodes[a.node_id]
        assert a.term == term
        assert a.vram_gib >= (vram_floor_gib(t.config) if t.resources.num_gpus > 0 else 0)
        gpu_vram = {g.index: g.vram_gib for g in n.gpus}
        for g in a.gpus:
            frac[(a.node_id, g)] += a.gpu_fraction
            vram[(a.node_id, g)] += a.vram_gib
            assert gpu_vram[g] >= a.vram_gib, "job on a GPU without the VRAM"
        if t.kind == "training":
            training[t.config] += 1
            assert node_tier(n) in (1, 2)
            assert n.disk_percent < n.disk_max_percent
        assert may_start(KIND_PRIORITY.get(t.kind, OperationPriority.NORMAL), n.level)
        for aff in t.placement.affinity:
            if aff.hard:
                assert aff.tag in n.tags
        per_template[a.template] += 1
        per_node_template[(a.node_id, a.template)] += 1
        if t.placement.strategy == "strict_spread":
            assert per_node_template[(a.node_id, a.template)] == 1
        added[a.node_id] += 1
    for key, f in frac.items():
        assert f <= 1.0 + 1e-6, f"GPU {key} over-shared"
        node_id, g = key
        assert vram[key] <= {x.index: x.vram_gib for x in view.nodes[node_id].gpus}[g] + 1e-6
    for name, count in per_template.items():
        assert count <= catalog.templates[name].max_concurrency
    assert all(c <= 1 for c in training.values()), "two training jobs of one config"
    for node_id, k in added.items():
        stops_here = sum(1 for s in p.stops if s.node_id == node_id)
        assert k <= max(view.nodes[node_id].offer, 1 if stops_here else 0) + stops_here, "placed above the offer"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(node_st, min_size=1, max_size=12, unique_by=lambda n: n.node_id),
       st.lists(job_st, min_size=1, max_size=10), st.lists(signal_st, max_size=5), st.integers(0, 1000))
def test_plans_never_break_an_invariant(nodes, jobs, signals, seed):
    catalog = _catalog(jobs)
    sig = {s.config: s for s in signals}
    view = ClusterView({n.node_id: n for n in nodes})
    first = plan(view, catalog, sig, 0.0, term=3, seed=seed)
    _check(view, catalog, first, 3)
    # Second round: what the first plan started now runs; offers refill; plan again on top of it.
    running = tuple(RunningJob(a.job_id, a.template, a.node_id, a.gpus, a.gpu_fraction, a.vram_gib, 0.0, a.term)
                    for a in first.assignments)
    view2 = ClusterView({n.node_id: n for n in nodes}, running)
    second = plan(view2, catalog, sig, 60.0, term=4, seed=seed + 1)
    _check(view2, catalog, second, 4)
