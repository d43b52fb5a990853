"""Property-based: over random fleets, catalogs (with and without a ``[policy]``) and signals, plans never break
an invariant; the Lamport merge of signals does not depend on the order candidates arrive in."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pnode.scheduler import (
    ClusterView,
    GpuView,
    NodeView,
    RunningJob,
    Signals,
    merge_signals,
    parse_catalog,
    plan,
    plan_violations,
)

CONFIGS = ["hex8_2p", "square8_3p", "square19_2p", "hexagonal_4p", "other_1"]
VRAMS = [8, 12, 16, 24, 32, 48, 80, 141]

node_st = st.builds(
    lambda i, gpus, offer, level, eph, cost, disk, tags, cpus, mem, cpu_offer: NodeView(
        f"n{i}", tuple(GpuView(k, v) for k, v in enumerate(gpus)), frozenset(tags), cost, eph, offer, level, disk,
        cpus=cpus, memory_gib=mem, cpu_offer=cpu_offer),
    st.integers(0, 10**6),
    st.lists(st.sampled_from(VRAMS), min_size=0, max_size=8),
    st.integers(0, 6), st.integers(0, 4), st.booleans(), st.floats(0, 3), st.floats(0, 90),
    st.sets(st.sampled_from(["provider=runpod", "fast", "voter"]), max_size=2),
    st.sampled_from([0.0, 4.0, 16.0, 64.0]), st.sampled_from([0.0, 8.0, 32.0, 256.0]), st.integers(0, 6),
)

job_st = st.fixed_dictionaries({
    "kind": st.sampled_from(["selfplay", "training", "evaluation", "custom"]),  # KINDS
    "config": st.sampled_from(CONFIGS),
    "priority": st.integers(1, 100),
    "preemptible": st.booleans(),
    "max_concurrency": st.integers(1, 6),
    "resources": st.fixed_dictionaries({
        "num_gpus": st.sampled_from([0, 0.25, 0.5, 1, 2]),
        "vram_gib": st.sampled_from([1, 4, 8, 20, 40]),
        "num_cpus": st.sampled_from([0.5, 2, 8]),
        "memory_gib": st.sampled_from([1, 4, 16]),
    }),
    "placement": st.fixed_dictionaries({
        "strategy": st.sampled_from(["pack", "spread", "strict_pack", "strict_spread"]),
        "affinity": st.lists(st.fixed_dictionaries({"tag": st.sampled_from(["fast", "provider=runpod"]),
                                                    "hard": st.booleans()}), max_size=1),
    }),
})

signal_st = st.builds(Signals, st.sampled_from(CONFIGS), st.floats(0, 5), st.floats(-100, 100), st.floats(0, 10**6),
                      st.floats(0, 1), st.integers(0, 10**6))


KINDS = ["selfplay", "training", "evaluation", "custom"]
policy_st = st.one_of(
    st.none(),
    st.just({
        "vram_floors_gib": {"hexagonal*": 32, "square19*": 16, "square8*": 8, "hex8*": 8},
        "tiers": {"training": [1, 2], "selfplay": [3, 2, 1], "evaluation": [2, 1]},
        "priorities": {"training": "high", "evaluation": "high"},
    }),
    st.fixed_dictionaries({
        "vram_floors_gib": st.dictionaries(st.sampled_from(["hex*", "square19_2p", "*", "other_?"]),
                                           st.sampled_from([0, 4, 8, 16, 48]), max_size=3),
        "tiers": st.dictionaries(st.sampled_from(KINDS), st.permutations([1, 2, 3, 4]).flatmap(
            lambda p: st.integers(1, 4).map(lambda k: p[:k])), max_size=4),
        "priorities": st.dictionaries(st.sampled_from(KINDS),
                                      st.sampled_from(["background", "low", "normal", "high", "critical"]), max_size=4),
        "cpu_tiers": st.dictionaries(st.sampled_from(KINDS), st.permutations([1, 2, 3, 4]).flatmap(
            lambda p: st.integers(1, 4).map(lambda k: p[:k])), max_size=2),
        "stable": st.lists(st.sampled_from(KINDS), unique=True, max_size=3),  # issue 38: durable nodes first
    }),
)


def _catalog(jobs, policy=None):
    docs = []
    for i, j in enumerate(jobs):
        d = dict(j, name=f"t{i}", argv=["run", "{config}"])
        if d["resources"]["num_gpus"] == 0:
            d["resources"] = dict(d["resources"], num_gpus=0, vram_gib=0)
        docs.append(d)
    return parse_catalog({"job": docs} if policy is None else {"job": docs, "policy": policy})


def _check(view, catalog, p, term):
    assert plan_violations(view, catalog, p, term=term) == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(node_st, min_size=1, max_size=12, unique_by=lambda n: n.node_id),
       st.lists(job_st, min_size=1, max_size=10), st.lists(signal_st, max_size=5), st.integers(0, 1000), policy_st)
def test_plans_never_break_an_invariant(nodes, jobs, signals, seed, policy):
    catalog = _catalog(jobs, policy)
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


candidate_st = st.tuples(st.sampled_from(CONFIGS[:3]), st.integers(1, 6), st.sampled_from(["a", "b", "c"]),
                         signal_st)


@settings(max_examples=200, deadline=None)
@given(st.lists(candidate_st, max_size=12), st.randoms(use_true_random=False))
def test_signal_merge_is_order_independent_and_picks_the_highest_stamp(candidates, rnd):
    merged = merge_signals(candidates)
    shuffled = list(candidates)
    rnd.shuffle(shuffled)
    assert merge_signals(shuffled) == merged
    assert merge_signals(candidates + candidates) == merged  # idempotent
    for config, s in merged.items():
        top = max((clock, origin) for c, clock, origin, _ in candidates if c == config)
        assert any(c == config and (clock, origin) == top and sig == s for c, clock, origin, sig in candidates)


# -- issue 38 review: stable kinds on mixed durable/ephemeral fleets with fractional work --------------------------

@st.composite
def _mixed_fleet(draw):
    """2-5 nodes of 1-3 GPUs, the first durable, at least one ephemeral; usable-VRAM ratios, full GPUs, offers of
    0-2 (few offers: a fraction that opened a GPU spent one)."""
    nodes = []
    k = draw(st.integers(2, 5))
    for i in range(k):
        ng = draw(st.integers(1, 3))
        vram = draw(st.sampled_from([16, 24, 48, 80]))
        gpus = tuple(GpuView(j, vram, draw(st.booleans()) and draw(st.booleans())) for j in range(ng))
        eph = i == k - 1 or (i > 0 and draw(st.booleans()))
        nodes.append(NodeView(f"n{i}", gpus, frozenset(), draw(st.floats(0, 5)), eph, draw(st.integers(0, 2)),
                              vram_limit_ratio=draw(st.sampled_from([0.5, 0.8, 1.0]))))
    return nodes


_mixed_job_st = st.fixed_dictionaries({
    "kind": st.sampled_from(["selfplay", "training", "evaluation"]),
    "config": st.sampled_from(CONFIGS[:3]),
    "priority": st.integers(1, 100),
    "preemptible": st.booleans(),
    "max_concurrency": st.integers(1, 8),
    "resources": st.fixed_dictionaries({"num_gpus": st.sampled_from([0.25, 0.34, 0.5, 1, 2]),
                                        "vram_gib": st.sampled_from([4, 8, 12, 20, 40])}),
})


def _mixed_checks(view, catalog, p, term):
    """plan_violations, and: each job stopped once and known, each preemption frees room on a node the plan places
    work on, each assignment given at least what it asked."""
    _check(view, catalog, p, term)
    ids = [s.job_id for s in p.stops]
    assert len(ids) == len(set(ids)) and set(ids) <= {r.job_id for r in view.running}
    placed = {a.node_id for a in p.assignments}
    assert all(s.node_id in placed for s in p.stops if s.reason.startswith("preempted"))
    for a in p.assignments:
        r = catalog.templates[a.template].resources
        assert a.gpu_fraction + 1e-9 >= min(1.0, r.num_gpus) and a.vram_gib + 1e-9 >= r.vram_gib


_sp_st = st.fixed_dictionaries({"kind": st.just("selfplay"), "config": st.sampled_from(CONFIGS[:3]),
                                "priority": st.integers(1, 40), "preemptible": st.just(True),
                                "max_concurrency": st.integers(1, 8),
                                "resources": st.fixed_dictionaries({"num_gpus": st.sampled_from([0.25, 0.5]),
                                                                    "vram_gib": st.sampled_from([4, 8])})})
_tr_st = st.fixed_dictionaries({"kind": st.just("training"), "config": st.sampled_from(CONFIGS[:3]),
                                "priority": st.integers(50, 100), "preemptible": st.booleans(),
                                "max_concurrency": st.just(1),
                                "resources": st.fixed_dictionaries({"num_gpus": st.sampled_from([0.5, 1]),
                                                                    "vram_gib": st.sampled_from([8, 20, 40])})})


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(_mixed_fleet(), _sp_st, _tr_st, st.lists(_mixed_job_st, max_size=4), st.booleans(), st.integers(0, 99))
def test_stable_training_meets_this_plans_fractions_on_durable_nodes(nodes, sp, tr, jobs, hot, seed):
    """Selfplay scores first (hot signals) so trainings (stable) meet this plan's fractional placements on durable
    nodes (taking them back) and, next round, running ones (preempting several): no crash, no invariant broken."""
    catalog = _catalog([sp, tr, *jobs], {"stable": ["training"]})
    sig = {c: Signals(c, 2.0 if hot else 0.5, 1e6, 1e9, 1.0, 1) for c in CONFIGS[:3]}
    for t in catalog.templates.values():
        if t.kind == "training":
            sig[t.config] = Signals(t.config, 0.0, 0.0, 0.0, 0.0, 1)
    view = ClusterView({n.node_id: n for n in nodes})
    p = plan(view, catalog, sig, 0.0, term=3, seed=seed)
    _mixed_checks(view, catalog, p, 3)
    running = tuple(RunningJob(a.job_id, a.template, a.node_id, a.gpus, a.gpu_fraction, a.vram_gib, 0.0, 3)
                    for a in p.assignments)
    view2 = ClusterView({n.node_id: n for n in nodes}, running)
    for t in catalog.templates.values():  # the trainings now score first: they preempt the selfplay placed above
        sig[t.config] = Signals(t.config, 2.0, 1e6, 1e9, 1.0, 1) if t.kind == "training" else sig[t.config]
    p2 = plan(view2, catalog, sig, 60.0, term=4, seed=seed + 1)
    _mixed_checks(view2, catalog, p2, 4)
