"""Scheduler core: catalog validation, signals, bounded factors, quotas and mix, placement rules, preemption, PID."""

import dataclasses

import pytest

from p2pnode.scheduler import (
    CapacityController,
    CatalogError,
    ClusterView,
    FactorWeights,
    GpuView,
    NodeView,
    RunningJob,
    SchedulerConfig,
    SchedulerState,
    SignalError,
    Signals,
    factors,
    node_tier,
    parse_catalog,
    plan,
    score,
    validate_signals,
)


def job(name, kind="selfplay", config="hex8_2p", **kw):
    d = {"name": name, "kind": kind, "config": config, "argv": ["python", "run.py", "{config}"],
         "resources": kw.pop("resources", {"num_gpus": 1, "vram_gib": 8})}
    d.update(kw)
    return d


def catalog(*jobs, quotas=None, mix=None):
    doc = {"job": list(jobs)}
    if quotas is not None:
        doc["quotas"] = quotas
    if mix is not None:
        doc["mix"] = mix
    return parse_catalog(doc)


def node(nid, *vram, offer=8, tags=(), level=0, ephemeral=False, cost=0.0, disk=10.0):
    return NodeView(nid, tuple(GpuView(i, v) for i, v in enumerate(vram)), frozenset(tags), cost, ephemeral, offer,
                    level, disk)


def view(*nodes, running=()):
    return ClusterView({n.node_id: n for n in nodes}, tuple(running))


# -- catalog and signals ------------------------------------------------------------------------------
def test_catalog_reports_every_error_with_its_location():
    with pytest.raises(CatalogError) as info:
        parse_catalog({"job": [
            {"name": "ok", "kind": "selfplay", "config": "hex8_2p", "argv": ["x", "{games}"],
             "params": {"games": {"type": "int", "default": 0, "min": 1}}},
            {"name": "bad name!", "kind": "training", "config": "c", "argv": [], "priority": 500,
             "resources": {"num_gpus": 1.5, "vram": 3}, "placement": {"strategy": "scatter"}, "colour": 1},
        ], "quotas": {"a": 0.7, "b": 0.6}, "mix": {"selfplay": 0.5}})
    errs = "\n".join(info.value.errors)
    for needle in ("job[0] (ok).params.games.default: games: 0 outside", "job[1] (bad name!).name",
                   "job[1] (bad name!).argv: required", "job[1] (bad name!).priority: an integer 1-100",
                   "resources.vram: unknown key", "num_gpus: above 1 it must be whole",
                   "placement.strategy: one of pack", "job[1] (bad name!).colour: unknown key",
                   "[quotas] shares add up to 1.30", "[mix] shares add up to 0.50"):
        assert needle in errs, needle


def test_argv_renders_only_declared_typed_params():
    c = catalog(job("sp", argv=["python", "sp.py", "--config", "{config}", "--games", "{games}"],
                    params={"games": {"type": "int", "default": 100, "min": 1, "max": 1000}}))
    t = c.templates["sp"]
    assert t.render_argv({"games": 7}) == ["python", "sp.py", "--config", "hex8_2p", "--games", "7"]
    with pytest.raises(ValueError):
        t.render_argv({"games": "7; rm -rf /"})
    with pytest.raises(ValueError):
        t.render_argv({"shell": "x"})
    with pytest.raises(CatalogError, match="placeholder {nope}"):
        catalog(job("x", argv=["{nope}"]))


def test_quota_globs_and_digest():
    c = catalog(job("a"), quotas={"hexagonal_4p": 0.25, "hex8_*": 0.1})
    assert c.quota_for("hex8_2p") == 0.1 and c.quota_for("hexagonal_4p") == 0.25 and c.quota_for("sq") == 0.0
    assert c.digest == catalog(job("a"), quotas={"hexagonal_4p": 0.25, "hex8_*": 0.1}).digest
    assert c.digest != catalog(job("b"), quotas={"hexagonal_4p": 0.25, "hex8_*": 0.1}).digest


def test_signals_validator():
    s = validate_signals({"config": "hex8_2p", "elo_velocity": -3, "quality": 0.8, "game_count": 10})
    assert s == Signals("hex8_2p", elo_velocity=-3.0, quality=0.8, game_count=10)
    with pytest.raises(SignalError) as info:
        validate_signals({"config": "x y", "quality": 2, "data_age_s": float("nan"), "bogus": 1})
    assert len(info.value.reasons) == 4


# -- weights ------------------------------------------------------------------------------------------
def test_each_factor_is_bounded_and_no_factor_swamps():
    extreme = factors(priority=100, signals=Signals("c", curriculum_weight=100, elo_velocity=10000, data_age_s=1e9,
                                                   quality=1), wait_s=1e9, starvation_cap_s=1800, quota_share=0.5,
                      quota_used=0.0, mix_target=0.6, mix_used=0.0)
    assert all(0.0 <= getattr(extreme, f.name) <= 1.0 for f in dataclasses.fields(extreme))
    assert score(extreme) == pytest.approx(1.0)
    low = factors(priority=1, signals=Signals("c", curriculum_weight=0, elo_velocity=-50, data_age_s=0, quality=0),
                  wait_s=0, starvation_cap_s=1800, quota_share=0.1, quota_used=0.5, mix_target=0.1, mix_used=0.9)
    assert 0.0 <= score(low) <= 0.01
    # A starving template gains at most the starvation weight over an identical fresh one.
    w = FactorWeights()
    base = dict(priority=50, signals=Signals("c"), starvation_cap_s=1800, quota_share=0.1, quota_used=0.1,
                mix_target=0.6, mix_used=0.6)
    gain = score(factors(wait_s=10**9, **base)) - score(factors(wait_s=0, **base))
    assert gain == pytest.approx(w.starvation / sum(vars(w).values()))


def test_starvation_ages_linearly_to_the_cap():
    base = dict(priority=50, signals=Signals("c"), starvation_cap_s=1800, quota_share=0, quota_used=0,
                mix_target=0, mix_used=0)
    assert [factors(wait_s=w, **base).starvation for w in (0, 900, 1800, 3600)] == [0.0, 0.5, 1.0, 1.0]


def test_quota_and_mix_accounting_steer_the_plan():
    c = catalog(job("sp-a", config="hex8_2p", max_concurrency=4), job("sp-b", config="square8_2p", max_concurrency=4),
                quotas={"hex8_2p": 0.5, "square8_2p": 0.5})
    v = view(node("n1", 80, 80, 80, 80, offer=2), running=[
        RunningJob("r1", "sp-a", "n1", (0,), 1.0, 8.0), RunningJob("r2", "sp-a", "n1", (1,), 1.0, 8.0)])
    p = plan(v, c, {}, 0.0, term=1)
    assert [a.template for a in p.assignments] == ["sp-b", "sp-b"]  # hex8 already holds its tier-1 share


# -- placement ----------------------------------------------------------------------------------------
def test_tiers_from_vram():
    assert [node_tier(node("x", *v)) for v in [(80,), (24,) * 8, (48,), (32, 32), (24,), (12,), (6,), ()]] == \
        [1, 1, 2, 2, 3, 3, 4, 4]


def test_hexagonal_never_on_a_24_gb_card():
    c = catalog(job("sp-hex", config="hexagonal_2p", resources={"num_gpus": 1, "vram_gib": 4}, max_concurrency=5))
    p = plan(view(node("r4090", 24, 24), node("l40s", 48)), c, {}, 0.0, term=1)
    assert [a.node_id for a in p.assignments] == ["l40s"]
    assert p.assignments[0].vram_gib == 32.0
    assert p.pending and "32 GiB" in p.pending[0].reason


def test_training_prefers_tier1_then_tier2_and_one_per_config():
    c = catalog(job("tr", kind="training", config="square8_2p", max_concurrency=3),
                job("tr2", kind="training", config="square8_2p"))
    p = plan(view(node("h100", 80), node("l40", 48), node("r3060", 12)), c, {}, 0.0, term=7)
    assert [(a.template, a.node_id, a.term) for a in p.assignments] == [("tr", "h100", 7)]
    assert {x.template for x in p.pending} == {"tr", "tr2"}
    assert all("already runs on h100" in x.reason for x in p.pending)
    p = plan(view(node("l40", 48), node("r3060", 12)), c, {}, 0.0, term=8)
    assert [a.node_id for a in p.assignments] == ["l40"]  # tier-2 fallback, never tier 3


def test_training_avoids_ephemeral_and_selfplay_prefers_cheap():
    c = catalog(job("tr", kind="training", config="square8_2p"))
    p = plan(view(node("spot", 80, ephemeral=True), node("durable", 80)), c, {}, 0.0, term=1)
    assert p.assignments[0].node_id == "durable"
    c = catalog(job("sp", max_concurrency=1))
    p = plan(view(node("dear", 24, cost=2.0), node("cheap", 24, cost=0.3)), c, {}, 0.0, term=1)
    assert p.assignments[0].node_id == "cheap"


def test_fractional_gpus_share_by_vram():
    c = catalog(job("sp", resources={"num_gpus": 0.25, "vram_gib": 10}, max_concurrency=10))
    p = plan(view(node("h100", 80, offer=10)), c, {}, 0.0, term=1)
    assert len(p.assignments) == 4  # four quarters; VRAM would allow 8 but the fractions are used up
    assert {a.gpus for a in p.assignments} == {(0,)}
    c = catalog(job("sp", resources={"num_gpus": 0.1, "vram_gib": 30}, max_concurrency=10))
    assert len(plan(view(node("h100", 80, offer=10)), c, {}, 0.0, term=1).assignments) == 2  # VRAM bound


@pytest.mark.parametrize("strategy, expect", [("spread", {"a": 1, "b": 1, "c": 1}), ("strict_spread", {"a": 1, "b": 1, "c": 1}),
                                              ("pack", {"a": 3}), ("strict_pack", {"a": 3})])
def test_placement_strategies(strategy, expect):
    c = catalog(job("sp", config="misc", max_concurrency=3, resources={"num_gpus": 0.25, "vram_gib": 2},
                    placement={"strategy": strategy}))
    nodes = [node(n, 24, offer=4) for n in ("a", "b", "c")]
    counts = {}
    for a in plan(view(*nodes), c, {}, 0.0, term=1, seed=3).assignments:
        counts[a.node_id] = counts.get(a.node_id, 0) + 1
    if strategy in ("pack", "strict_pack"):
        assert sorted(counts.values()) == [3]
    else:
        assert counts == expect


def test_strict_spread_leaves_pending_when_nodes_run_out():
    c = catalog(job("sp", max_concurrency=3, resources={"num_gpus": 0.25, "vram_gib": 2},
                    placement={"strategy": "strict_spread"}))
    p = plan(view(node("a", 24), node("b", 24)), c, {}, 0.0, term=1)
    assert len(p.assignments) == 2 and p.pending[0].template == "sp"


def test_affinity_hard_and_soft():
    c = catalog(job("sp", placement={"affinity": [{"tag": "provider=runpod", "hard": True}]}))
    p = plan(view(node("a", 24), node("b", 24, tags={"provider=runpod"})), c, {}, 0.0, term=1)
    assert [a.node_id for a in p.assignments] == ["b"]
    p = plan(view(node("a", 24)), c, {}, 0.0, term=1)
    assert not p.assignments and "required tags provider=runpod" in p.pending[0].reason
    c = catalog(job("sp", placement={"affinity": [{"tag": "fast", "hard": False}]}))
    p = plan(view(node("a", 24), node("b", 24, tags={"fast"})), c, {}, 0.0, term=1)
    assert [a.node_id for a in p.assignments] == ["b"]


def test_offer_and_degradation_limit_placements():
    c = catalog(job("sp", config="misc", resources={"num_gpus": 0.1, "vram_gib": 1}, max_concurrency=10))
    p = plan(view(node("a", 24, offer=2), node("b", 24, offer=0)), c, {}, 0.0, term=1)
    assert len(p.assignments) == 2 and {a.node_id for a in p.assignments} == {"a"}
    p = plan(view(node("a", 24, offer=5, level=2)), c, {}, 0.0, term=1)  # NORMAL work at moderate: admitted
    assert len(p.assignments) == 5
    p = plan(view(node("a", 24, offer=5, level=3)), c, {}, 0.0, term=1)
    assert not p.assignments and "degraded" in p.pending[0].reason
    tr = catalog(job("tr", kind="training", config="square8_2p"))
    p = plan(view(node("h", 80, disk=71.0)), tr, {}, 0.0, term=1)
    assert not p.assignments and "disk" in p.pending[0].reason


def test_preemption_needs_a_gap_of_ten():
    low = job("sp", priority=40, preemptible=True)
    high = job("ev", kind="evaluation", config="square8_2p", priority=50)
    v = view(node("l40", 48), running=[RunningJob("r1", "sp", "l40", (0,), 1.0, 8.0)])
    p = plan(v, catalog(low, high), {}, 0.0, term=1)
    assert [(s.job_id, s.grace_s) for s in p.stops] == [("r1", 30.0)]
    assert [(a.template, a.node_id) for a in p.assignments] == [("ev", "l40")]
    p = plan(v, catalog(job("sp", priority=41), high), {}, 0.0, term=1)
    assert not p.stops and not p.assignments
    p = plan(v, catalog(job("sp", priority=10, preemptible=False), high), {}, 0.0, term=1)
    assert not p.stops


def test_removed_template_is_stopped_and_waits_are_remembered():
    c = catalog(job("sp", max_concurrency=2))
    st = SchedulerState()
    v = view(node("a", 24, offer=1), running=[RunningJob("old", "gone", "a", (0,), 1.0, 8.0)])
    p = plan(v, c, {}, 10.0, term=1, state=st)
    assert [s.job_id for s in p.stops] == ["old"]
    assert [a.template for a in p.assignments] == ["sp"] and p.pending[0].wait_s == 0.0
    p = plan(view(node("a", 24, offer=0)), c, {}, 20.0, term=1, state=st)
    assert p.pending[0].wait_s == 10.0  # waiting since the plan at t=10 that could place only one
    p = plan(view(node("a", 24, offer=0)), c, {}, 50.0, term=1, state=st)
    assert p.pending[0].wait_s == 40.0


def test_autonomous_only_without_leader():
    c = catalog(job("sp", autonomous=True), job("tr", kind="training", config="square8_2p"))
    p = plan(view(node("h", 80, 80, offer=4)), c, {}, 0.0, term=0, autonomous_only=True)
    assert [a.template for a in p.assignments] == ["sp"] and not p.pending


def test_plan_is_deterministic_for_a_seed():
    c = catalog(*[job(f"sp{i}", config=f"hex8_{i}p", max_concurrency=3, resources={"num_gpus": 0.5, "vram_gib": 4})
                  for i in range(5)])
    nodes = [node(f"n{i}", 24, 24, offer=3) for i in range(6)]
    a = plan(view(*nodes), c, {}, 0.0, term=1, seed=9)
    b = plan(view(*nodes), c, {}, 0.0, term=1, seed=9)
    assert a == b


# -- PID ----------------------------------------------------------------------------------------------
def test_pid_offer_anti_windup_idle_and_backpressure():
    pid = CapacityController()
    assert pid.update(70.0, gpus=1, idle_gpus=0, level=0, now=0.0) == 0  # inside the band: hold
    assert pid.update(90.0, gpus=1, idle_gpus=0, level=0, now=1.0) == 0  # above it: nothing new
    first = pid.update(0.0, gpus=8, idle_gpus=0, level=0, now=2.0)
    assert first == round((0.1 * 60 + 0.01 * 60 + 0.05 * 60) * 8 / 10)  # PID output in jobs: ~1 per GPU per 10 points
    offers = [pid.update(10.0, gpus=1, idle_gpus=0, level=0, now=float(t)) for t in range(3, 3000)]
    assert max(offers) <= 4  # saturates at max_jobs_per_gpu per GPU
    assert pid.integral <= pid.integral_limit
    # After a long stretch below the band, reaching the band stops new work at once (no windup).
    assert pid.update(65.0, gpus=1, idle_gpus=0, level=0, now=3001.0) == 0
    assert pid.integral < pid.integral_limit
    assert pid.update(95.0, gpus=2, idle_gpus=2, level=0, now=3002.0) == 2  # idle GPUs ask at once
    assert pid.update(0.0, gpus=2, idle_gpus=2, level=2, now=3003.0) == 0  # backpressure
    assert pid.update(0.0, gpus=0, idle_gpus=0, level=0, now=3004.0) == 0  # no GPU, no GPU work


def test_placement_avoids_stranding_gpu_time():
    # square19 selfplay: half a GPU with a 16 GiB floor. On a 16 GiB card it would strand the other half.
    c = catalog(job("sp", config="square19_2p", resources={"num_gpus": 0.5, "vram_gib": 4}, max_concurrency=2))
    p = plan(view(node("r4060ti", 16), node("l40s", 48)), c, {}, 0.0, term=1)
    assert [a.node_id for a in p.assignments] == ["l40s", "l40s"]


def test_cpu_memory_and_custom_resources_are_accounted():
    c = catalog(job("sp", config="misc", max_concurrency=10,
                    resources={"num_gpus": 0.1, "vram_gib": 1, "num_cpus": 4, "memory_gib": 8}))
    n = NodeView("a", (GpuView(0, 80),), offer=10, cpus=10, memory_gib=64)
    p = plan(ClusterView({"a": n}), c, {}, 0.0, term=1)
    assert len(p.assignments) == 2 and "free CPUs" in p.pending[0].reason  # 10 CPUs hold two 4-CPU jobs
    c = catalog(job("nv", config="misc", resources={"num_gpus": 1, "vram_gib": 8, "custom": {"nvlink": 1}}))
    plain = NodeView("plain", (GpuView(0, 80),), offer=2)
    linked = NodeView("linked", (GpuView(0, 80),), offer=2, custom=(("nvlink", 1.0),))
    p = plan(ClusterView({"plain": plain, "linked": linked}), c, {}, 0.0, term=1)
    assert [a.node_id for a in p.assignments] == ["linked"]


def test_mix_deficit_favours_the_kind_below_its_target():
    c = catalog(job("sp", config="c1", max_concurrency=3, resources={"num_gpus": 1, "vram_gib": 8}),
                job("ev", kind="evaluation", config="c2", max_concurrency=3, resources={"num_gpus": 1, "vram_gib": 8}),
                mix={"selfplay": 0.5, "evaluation": 0.5})
    running = [RunningJob(f"r{i}", "sp", "n", (i,), 1.0, 8.0) for i in range(2)]
    p = plan(view(node("n", 48, 48, 48, offer=1), running=running), c, {}, 0.0, term=1)
    assert [a.template for a in p.assignments] == ["ev"]  # selfplay holds all GPU time; evaluation is below target


def test_catalog_file_errors_name_file_line_and_field(tmp_path):
    from p2pnode.scheduler import load_catalog

    f = tmp_path / "c.toml"
    f.write_text('[[job]]\nname = "ok"\nkind = "selfplay"\nconfig = "c"\nargv = ["x"]\n\n'
                 '[[job]]\nname = "broken"\nkind = "training"\nconfig = "c"\nargv = ["run"]\npriority = 500\n'
                 '[job.resources]\nnum_gpus = 1.5\nvram_gib = 8\n')
    with pytest.raises(CatalogError) as info:
        load_catalog(f)
    assert f"{f}:12: job[1] (broken).priority: an integer 1-100" in info.value.errors
    assert f"{f}:14: job[1] (broken).resources.num_gpus: above 1 it must be whole (1.5)" in info.value.errors
    f.write_text("[[job]\nname=")
    with pytest.raises(CatalogError, match="invalid TOML.*line 1"):
        load_catalog(f)
