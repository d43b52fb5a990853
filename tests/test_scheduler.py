"""Scheduler core: catalog validation, signals, bounded factors, quotas and mix, placement rules, preemption, PID."""

from collections import defaultdict

import msgspec
import pytest

from p2pnode.guardcore import OperationPriority
from p2pnode.scheduler import (
    ALL_TIERS,
    CLOCK_MAX,
    CapacityController,
    CatalogError,
    ClusterView,
    FactorWeights,
    GpuView,
    NodeView,
    RunningJob,
    SchedulerState,
    SignalError,
    Signals,
    SignalStamp,
    factors,
    merge_signals,
    merge_stamped,
    next_clock,
    node_tier,
    parse_catalog,
    plan,
    plan_violations,
    score,
    validate_signals,
)


def job(name, kind="selfplay", config="hex8_2p", **kw):
    d = {"name": name, "kind": kind, "config": config, "argv": ["python", "run.py", "{config}"],
         "resources": kw.pop("resources", {"num_gpus": 1, "vram_gib": 8})}
    d.update(kw)
    return d


SEED003 = {
    "vram_floors_gib": {"hexagonal*": 32, "square19*": 16, "square8*": 8, "hex8*": 8},
    "tiers": {"training": [1, 2], "selfplay": [3, 2, 1], "evaluation": [2, 1]},
    "priorities": {"training": "high", "evaluation": "high"},
}
"""The demo catalogs' ``[policy]`` (deploy/examples): the rules the placement tests below exercise."""


def catalog(*jobs, quotas=None, mix=None, policy=SEED003):
    doc = {"job": list(jobs)}
    if quotas is not None:
        doc["quotas"] = quotas
    if mix is not None:
        doc["mix"] = mix
    if policy is not None:
        doc["policy"] = policy
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


# -- the catalog's [policy] ---------------------------------------------------------------------------
def test_policy_accessors_and_neutral_defaults():
    c = catalog(job("a"))
    assert c.vram_floor_gib("hexagonal_2p") == 32.0 and c.vram_floor_gib("hex8_2p") == 8.0
    assert c.vram_floor_gib("chess") == 0.0
    assert c.tiers_for("training") == (1, 2) and c.tiers_for("custom") == ALL_TIERS == (1, 2, 3, 4)
    assert c.priority_of("evaluation") is OperationPriority.HIGH
    assert c.priority_of("selfplay") is OperationPriority.NORMAL
    bare = catalog(job("a"), policy=None)  # a fleet that is not playing board games
    assert bare.vram_floor_gib("hexagonal_2p") == 0.0
    assert bare.tiers_for("training") == ALL_TIERS and bare.priority_of("training") is OperationPriority.NORMAL
    exact = catalog(job("a"), policy={"vram_floors_gib": {"hex*": 4, "hex8_2p": 12}})
    assert exact.vram_floor_gib("hex8_2p") == 12.0 and exact.vram_floor_gib("hex8_3p") == 4.0  # exact key first
    assert exact.digest != bare.digest


def test_policy_errors_are_named():
    with pytest.raises(CatalogError) as info:
        catalog(job("a"), policy={"vram_floors_gib": {"hex*": -1, "sq*": "big"}, "tiers": {"training": [0, 2],
                "selfplay": [], "evaluation": [1, 1], "other": "1"}, "priorities": {"training": "urgent"},
                "colour": 1})
    errs = "\n".join(info.value.errors)
    for needle in ("[policy].colour: unknown key", "[policy].vram_floors_gib.hex*: GiB between 0",
                   "[policy].vram_floors_gib.sq*", "[policy].tiers.training: a non-empty list of distinct tiers 1-4",
                   "[policy].tiers.selfplay", "[policy].tiers.evaluation", "[policy].tiers.other",
                   "[policy].priorities.training: one of background, low, normal, high, critical"):
        assert needle in errs, needle
    with pytest.raises(CatalogError, match=r"\[policy\].tiers: must be a table"):
        catalog(job("a"), policy={"tiers": [1, 2]})
    with pytest.raises(CatalogError, match="duplicate template name 'a'"):
        catalog(job("a"), job("a"))


def test_example_catalogs_the_simulator_and_the_doc_share_one_policy_shape():
    import tomllib
    from pathlib import Path

    from p2pnode.scheduler import load_catalog
    from p2pnode.sim._sched import POLICY

    root = Path(__file__).resolve().parent.parent
    seed003 = catalog(job("a")).policy
    assert catalog(job("a"), policy=POLICY).policy == seed003
    for path in ("deploy/examples/catalog.toml", "deploy/examples/demo/catalog.toml"):
        assert load_catalog(root / path).policy == seed003, path
    doc = (root / "docs" / "catalog.md").read_text().split("## Policy", 1)[1]
    example = tomllib.loads(doc.split("```toml\n", 1)[1].split("```", 1)[0])
    c = parse_catalog({"job": [job("a")], **example})
    assert c.vram_floor_gib("hexagonal_2p") == 32.0 and c.tiers_for("training") == (1, 2)


def test_the_planner_follows_the_catalog_policy_not_a_game():
    nodes = view(node("h100", 80), node("r3060", 12), node("gtx", 6))
    tr = job("tr", kind="training", config="square8_2p", resources={"num_gpus": 1, "vram_gib": 4})
    # Without a policy, training may use any tier and the biggest GPUs come first; no floor applies.
    p = plan(nodes, catalog(tr, policy=None), {}, 0.0, term=1)
    assert [(a.node_id, a.vram_gib) for a in p.assignments] == [("h100", 80.0)]  # a whole GPU: all its VRAM
    # A fleet's own rules: its "render" kind only on small cards, at a 5 GiB floor.
    c = catalog(job("r", kind="render", config="scene_1", resources={"num_gpus": 1, "vram_gib": 1},
                    max_concurrency=3), policy={"tiers": {"render": [4, 3]}, "vram_floors_gib": {"scene_*": 5}})
    p = plan(nodes, c, {}, 0.0, term=1)
    assert [(a.node_id, a.vram_gib) for a in p.assignments] == [("gtx", 6.0), ("r3060", 12.0)]
    c = catalog(job("r", kind="render", config="scene_1", resources={"num_gpus": 0.25, "vram_gib": 1},
                    max_concurrency=2), policy={"tiers": {"render": [4, 3]}, "vram_floors_gib": {"scene_*": 5}})
    p = plan(nodes, c, {}, 0.0, term=1)  # a fraction gets the floor while the rest of its GPU fits one more; the
    # last instance (nothing may use a remainder beside it) fills that hole and is given the GPU's rest, rather
    # than opening the 6 GiB card (fractions are bin-packed before a fresh GPU is opened)
    assert [(a.node_id, a.gpu_fraction, a.vram_gib) for a in p.assignments] == [("r3060", 0.25, 5.0),
                                                                                  ("r3060", 0.75, 7.0)]
    assert plan_violations(nodes, c, p, term=1) == []


def test_kind_priority_from_the_catalog_decides_admission_on_a_degraded_node():
    heavy = view(node("a", 24, offer=5, level=3))  # heavy: HIGH and above only
    sp = job("sp", config="misc", resources={"num_gpus": 0.1, "vram_gib": 1})
    assert not plan(heavy, catalog(sp), {}, 0.0, term=1).assignments
    vip = catalog(sp, policy={"priorities": {"selfplay": "critical"}})
    p = plan(heavy, vip, {}, 0.0, term=1)
    assert [a.template for a in p.assignments] == ["sp"]
    assert plan_violations(heavy, vip, p, term=1) == []
    assert plan_violations(heavy, catalog(sp), p, term=1) == ["1-1: selfplay on a at degradation level 3"]


def test_invariants_check_each_kinds_tiers_from_the_policy():
    c = catalog(job("tr", kind="training", config="square8_2p"))
    v = view(node("r3060", 12))
    p = plan(v, catalog(job("tr", kind="training", config="square8_2p"), policy=None), {}, 0.0, term=1)
    assert [a.node_id for a in p.assignments] == ["r3060"]
    assert plan_violations(v, c, p, term=1) == ["1-1: training on tier 3, outside its tiers (1, 2)"]


# -- signals merged by a Lamport clock ----------------------------------------------------------------
def test_next_clock_is_one_above_the_highest_seen_for_that_config():
    seen = [("hex8_2p", 3), ("hex8_2p", 7), ("square19_2p", 40), ("hex8_2p", CLOCK_MAX + 5), ("hex8_2p", -2)]
    assert next_clock("hex8_2p", seen) == 8  # out-of-range clocks are ignored
    assert next_clock("chess", seen) == 1
    assert next_clock("x", [("x", CLOCK_MAX)]) == CLOCK_MAX  # saturates: publishable, ties go by origin


def test_merge_takes_the_highest_clock_then_origin():
    a, b = Signals("hex8_2p", quality=0.1), Signals("hex8_2p", quality=0.9)
    assert merge_signals([("hex8_2p", 4, "node-a", a), ("hex8_2p", 3, "node-z", b)]) == {"hex8_2p": a}
    tie = [("hex8_2p", 4, "node-a", a), ("hex8_2p", 4, "node-b", b)]
    assert merge_signals(tie) == merge_signals(tie[::-1]) == {"hex8_2p": b}  # same clock: larger origin
    assert merge_stamped(tie)["hex8_2p"] == (SignalStamp(4, "node-b"), b)
    assert merge_signals([("hex8_2p", 0, "a", a), ("hex8_2p", CLOCK_MAX + 1, "b", b)]) == {}
    assert merge_signals([]) == {}


def test_a_node_with_a_skewed_wall_clock_cannot_win_by_time():
    # node-z's wall clock runs a year ahead; it set quality 0.2 first. node-a saw that (clock 1) and then set 0.9.
    seen = [("hex8_2p", 1)]
    skewed = ("hex8_2p", 1, "node-z", Signals("hex8_2p", quality=0.2, data_age_s=0.0))
    newer = ("hex8_2p", next_clock("hex8_2p", seen), "node-a", Signals("hex8_2p", quality=0.9))
    assert merge_signals([skewed, newer])["hex8_2p"].quality == 0.9
    assert merge_signals([newer, skewed])["hex8_2p"].quality == 0.9


# -- weights ------------------------------------------------------------------------------------------
def test_each_factor_is_bounded_and_no_factor_swamps():
    extreme = factors(priority=100, signals=Signals("c", curriculum_weight=100, elo_velocity=10000, data_age_s=1e9,
                                                   quality=1), wait_s=1e9, starvation_cap_s=1800, quota_share=0.5,
                      quota_used=0.0, mix_target=0.6, mix_used=0.0)
    assert all(0.0 <= getattr(extreme, f.name) <= 1.0 for f in msgspec.structs.fields(extreme))
    assert score(extreme) == pytest.approx(1.0)
    low = factors(priority=1, signals=Signals("c", curriculum_weight=0, elo_velocity=-50, data_age_s=0, quality=0),
                  wait_s=0, starvation_cap_s=1800, quota_share=0.1, quota_used=0.5, mix_target=0.1, mix_used=0.9)
    assert 0.0 <= score(low) <= 0.01
    # A starving template gains at most the starvation weight over an identical fresh one.
    w = FactorWeights()
    base = dict(priority=50, signals=Signals("c"), starvation_cap_s=1800, quota_share=0.1, quota_used=0.1,
                mix_target=0.6, mix_used=0.6)
    gain = score(factors(wait_s=10**9, **base)) - score(factors(wait_s=0, **base))
    assert gain == pytest.approx(w.starvation / sum(msgspec.structs.asdict(w).values()))


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
    assert [node_tier(node("x", *v)) for v in [(80,), (80,) * 8, (24,) * 8, (48,), (32, 32), (24,), (12,), (6,),
                                               ()]] == [1, 1, 1, 2, 2, 3, 3, 4, 4]


def test_a_hole_on_the_tier1_4090_box_fills_before_a_fresh_5090_and_training_may_land_there():
    """Seed 003's table puts an 8 x RTX 4090 box (192 GB in all) in tier 1 by its total VRAM, a 5090 in tier 2.
    Selfplay prefers tiers 3, 2, 1, so a fresh GPU goes to the 5090 first; but a hole left on a 4090 when one of its
    two quarter-GPU selfplays ends fills before a fresh 5090 GPU is opened (``HOLE_COST`` is above every tier step:
    the hole's GPU is in use already). A training (tiers 1, 2) may land on the box: it is tier 1."""
    box, rtx5090 = rtx4090_box("vast4090"), NodeView("5090", (GpuView(0, 32.0),), offer=1, vram_limit_ratio=0.8)
    assert node_tier(box) == 1 and node_tier(rtx5090) == 2
    running = [RunningJob(f"r{i}-{k}", "sp", "vast4090", (i,), f, v)
               for i in range(8) for k, (f, v) in enumerate(((0.25, 8.0), (0.75, 11.2)))]
    sp = job("sp", resources={"num_gpus": 0.25, "vram_gib": 8}, max_concurrency=16)
    holed = ClusterView({"vast4090": box, "5090": rtx5090}, tuple(running[:1] + running[2:]))  # GPU 0: 0.75 free
    p = plan(holed, catalog(sp), {}, 0.0, term=1)
    assert [(a.node_id, a.gpus, a.gpu_fraction, round(a.vram_gib, 6)) for a in p.assignments] == \
        [("vast4090", (0,), 0.75, 11.2)]
    assert plan_violations(holed, catalog(sp), p, term=1) == []
    # Without a hole (GPU 0 entirely free: both its jobs ended), the fresh GPU of the kind's first tier wins.
    fresh = ClusterView({"vast4090": box, "5090": rtx5090}, tuple(running[2:]))
    p = plan(fresh, catalog({**sp, "max_concurrency": 15}), {}, 0.0, term=1)
    assert [(a.node_id, a.gpus) for a in p.assignments] == [("5090", (0,))]
    tr = job("tr", kind="training", config="square8_2p")
    p = plan(view(node("vast4090", *(24,) * 8), node("5090", 32)), catalog(tr), {}, 0.0, term=1)
    assert [(a.template, a.node_id) for a in p.assignments] == [("tr", "vast4090")]


def test_hexagonal_never_on_a_24_gb_card():
    c = catalog(job("sp-hex", config="hexagonal_2p", resources={"num_gpus": 1, "vram_gib": 4}, max_concurrency=5))
    p = plan(view(node("r4090", 24, 24), node("l40s", 48)), c, {}, 0.0, term=1)
    assert [a.node_id for a in p.assignments] == ["l40s"]
    assert p.assignments[0].vram_gib == 48.0  # at least the 32 GiB floor: the whole GPU's usable VRAM
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


@pytest.mark.parametrize("strategy, num_gpus, expect", [("spread", 1, [1, 1, 1]), ("strict_spread", 1, [1, 1, 1]),
                                                        ("pack", 1, [3]), ("strict_pack", 1, [3]),
                                                        ("spread", 0.25, [3]), ("strict_spread", 0.25, [1, 1, 1]),
                                                        ("pack", 0.25, [3]), ("strict_pack", 0.25, [3])])
def test_placement_strategies(strategy, num_gpus, expect):
    """A strategy lays out whole-GPU work across nodes. Fractions are bin-packed first (a partly held GPU before a
    fresh one), so a spread fractional template's instances share one GPU while they fit it; strict_spread is a
    hard rule and still puts one per node."""
    c = catalog(job("sp", config="misc", max_concurrency=3, resources={"num_gpus": num_gpus, "vram_gib": 2},
                    placement={"strategy": strategy}))
    nodes = [node(n, 24, 24, 24, offer=4) for n in ("a", "b", "c")]
    counts: dict[str, int] = {}
    p = plan(view(*nodes), c, {}, 0.0, term=1, seed=3)
    for a in p.assignments:
        counts[a.node_id] = counts.get(a.node_id, 0) + 1
    assert sorted(counts.values()) == expect
    if num_gpus < 1 and expect == [3]:
        assert len({a.gpus for a in p.assignments}) == 1  # one GPU holds the three quarters


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
    # A free GPU is offered as the fractions that fit it: one offer, ten tenth-GPU jobs on one GPU (issue 38).
    p = plan(view(node("a", 24, 24, 24, offer=1), node("b", 24, offer=0)), c, {}, 0.0, term=1)
    assert len(p.assignments) == 10 and {(a.node_id, a.gpus) for a in p.assignments} == {("a", (0,))}
    assert sum(a.vram_gib for a in p.assignments) == 24.0  # the last one took the VRAM no fraction is left for
    running = (RunningJob("r", "sp", "a", (0,), 0.1, 1.0),)  # a GPU in use costs one offer per job
    p = plan(ClusterView(view(node("a", 24, offer=2)).nodes, running), c, {}, 0.0, term=1)
    assert len(p.assignments) == 2
    p = plan(view(node("a", 24, offer=5, level=2)), c, {}, 0.0, term=1)  # NORMAL work at moderate: admitted
    assert len(p.assignments) == 10
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


def test_a_full_gpu_gets_no_new_work_but_its_node_still_does():
    # 8 x RTX 4090, GPU 0 full (its memory over the guard's limit, e.g. a job outside p2pnode): seven one-GPU jobs
    # go to the other seven GPUs; an eighth stays pending; nothing lands on GPU 0.
    c = catalog(job("sp", max_concurrency=8, resources={"num_gpus": 1, "vram_gib": 8}), policy=None)
    gpus = tuple(GpuView(i, 24.0, full=(i == 0)) for i in range(8))
    box = NodeView("box", gpus, frozenset(), 0.0, False, 8, 0, 10.0)
    p = plan(ClusterView({"box": box}), c, {}, 0.0, term=1)
    assert sorted(g for a in p.assignments for g in a.gpus) == [1, 2, 3, 4, 5, 6, 7]
    assert plan_violations(ClusterView({"box": box}), c, p, term=1) == []
    gpu1_full = msgspec.structs.replace(box, gpus=tuple(msgspec.structs.replace(g, full=g.index == 1) for g in gpus))
    assert any("whose memory is over the limit" in v for v in plan_violations(ClusterView({"box": gpu1_full}), c, p))
    every_gpu_full = NodeView("box", tuple(GpuView(i, 24.0, full=True) for i in range(8)), frozenset(), 0.0,
                              False, 8, 0, 10.0)
    assert plan(ClusterView({"box": every_gpu_full}), c, {}, 0.0, term=1).assignments == ()


def test_a_pinned_job_names_what_the_node_carrying_its_tags_lacks():
    """Issue 24 item 5: a job pinned to node x (hard tag ``@node=x``) that x cannot take is pending for what x
    lacks, never "no node carries the required tags" (x carries them), whatever order the nodes are scanned in."""
    pin = {"affinity": [{"tag": "@node=x", "hard": True}]}
    c = catalog(job("nv", config="misc", max_concurrency=3, placement=pin,
                    resources={"num_gpus": 1, "vram_gib": 8, "custom": {"nvlink": 1}}))
    others = {f"o{i}": NodeView(f"o{i}", (GpuView(0, 80),), offer=2, custom=(("nvlink", 2.0),)) for i in range(5)}
    # x has no nvlink at all (the others have): no plan can ever place it there.
    bare = NodeView("x", (GpuView(0, 80),), tags=frozenset({"@node=x"}), offer=2)
    for seed in range(8):
        (pending,) = plan(ClusterView({**others, "x": bare}), c, {}, 0.0, term=1, seed=seed).pending
        assert pending.reason == ("unsatisfiable: node x carries the required tags @node=x but offers 0 of custom "
                                  "resource 'nvlink' (asks 1)"), seed
    # x has one nvlink, held by a running instance: pending for that, now.
    x = msgspec.structs.replace(bare, gpus=(GpuView(0, 80), GpuView(1, 80)), custom=(("nvlink", 1.0),))
    running = (RunningJob("r1", "nv", "x", (0,), 1.0, 8.0),)
    for seed in range(8):
        p = plan(ClusterView({**others, "x": x}, running), c, {}, 0.0, term=1, seed=seed)
        assert p.assignments == ()
        assert [q.reason for q in p.pending] == [
            "no node in tiers 3/2/1 takes it: node x carries the required tags @node=x but has 0 of custom resource "
            "'nvlink' free (asks 1)"], seed
    # Likewise for CPUs, and for several nodes carrying the tags.
    c = catalog(job("cpu", config="misc", placement={"affinity": [{"tag": "rack=a", "hard": True}]},
                    resources={"num_gpus": 1, "vram_gib": 8, "num_cpus": 16}))
    rack = {f"a{i}": NodeView(f"a{i}", (GpuView(0, 80),), tags=frozenset({"rack=a"}), offer=2, cpus=8)
            for i in range(2)}
    big = {"b": NodeView("b", (GpuView(0, 80),), offer=2, cpus=64)}
    (pending,) = plan(ClusterView({**rack, **big}), c, {}, 0.0, term=1).pending
    assert pending.reason == ("unsatisfiable: the 2 nodes carrying the required tags rack=a offer at most 8 CPUs "
                              "(asks 16)")
    # Without hard tags the wording is the cluster's, as before.
    c = catalog(job("nv", config="misc", resources={"num_gpus": 1, "vram_gib": 8, "custom": {"nvlink": 4}}))
    (pending,) = plan(ClusterView(others), c, {}, 0.0, term=1).pending
    assert pending.reason == "unsatisfiable: asks 4 of custom resource 'nvlink', the most any node has is 2"


def test_a_stranding_placement_waits_its_turn_and_no_template_is_lost():
    """Issue 24: half-GPU jobs that take a card's VRAM (20 of 24 GiB) strand its other half, so they are placed
    after other work; when the offers run out meanwhile, every template is either placed or pending with a
    reason (none vanishes from the plan)."""
    def half(name):
        return {"name": name, "kind": "selfplay", "config": name, "argv": ["x"], "max_concurrency": 1,
                "resources": {"num_gpus": 0.5, "vram_gib": 20}}

    cat = parse_catalog({"job": [half("a"), half("b"), half("c")]})
    nodes = {"n": NodeView("n", tuple(GpuView(i, 24.0) for i in range(3)), offer=2)}
    p = plan(ClusterView(nodes), cat, {}, 0.0, term=1)
    placed, waiting = {a.template for a in p.assignments}, {q.template for q in p.pending}
    assert len(placed) == 2 and placed | waiting == {"a", "b", "c"} and not placed & waiting
    (w,) = p.pending
    assert w.reason == "no node in tiers 1/2/3/4 takes it: 1 spent their GPU offers in this plan", w.reason
    whole = parse_catalog({"job": [half("s"), {"name": "w", "kind": "selfplay", "config": "w", "argv": ["x"],
                                               "max_concurrency": 1, "resources": {"num_gpus": 1, "vram_gib": 8}}]})
    one = {"n": NodeView("n", (GpuView(0, 24.0),), offer=1)}
    # The stranding half scores as high, but the whole-GPU job takes the card (65 % where the half drives 32 %).
    assert [a.template for a in plan(ClusterView(one), whole, {}, 0.0, term=1).assignments] == ["w"]


# -- one GPU capacity model (issue 38) -----------------------------------------------------------------------------
def rtx4090_box(nid="vast", gpus=8, offer=8):
    """An 8x RTX 4090 box as its agent publishes it: 24 GiB per GPU, VRAM committed up to the guard's 80 %."""
    return NodeView(nid, tuple(GpuView(i, 24.0) for i in range(gpus)), offer=offer, vram_limit_ratio=0.8)


def test_a_4090_is_committed_to_its_usable_vram_and_the_job_learns_its_share():
    """Item 2: two 0.25-GPU selfplays at the 8 GiB floor held 16 of a 4090's 19.2 usable GiB and left 3.2 that no
    job fits. Now the second is given the rest (0.75 of the GPU, 11.2 GiB): every GPU is committed to its usable
    VRAM, and an empty box is filled in one plan for its 8 offers (one per free GPU, whatever fits it)."""
    c = catalog(job("sp", resources={"num_gpus": 0.25, "vram_gib": 4}, max_concurrency=16))
    p = plan(ClusterView({"vast": rtx4090_box()}), c, {}, 0.0, term=1)
    assert len(p.assignments) == 16 and not p.pending and plan_violations(
        ClusterView({"vast": rtx4090_box()}), c, p, term=1) == []
    per_gpu = defaultdict(list)
    for a in p.assignments:
        per_gpu[a.gpus].append((a.gpu_fraction, round(a.vram_gib, 6)))
    assert all(sorted(x) == [(0.25, 8.0), (0.75, 11.2)] for x in per_gpu.values()) and len(per_gpu) == 8, per_gpu
    # A remainder a template that may still get an instance fits stays free for it: a 2 GiB quarter fits 0.5 and
    # 3.2 GiB. One at its max_concurrency does not hold it (the rest goes to the last sp: 0.75, 11.2 GiB).
    busy = rtx4090_box("busy", gpus=1, offer=0)  # runs one tiny job
    view = ClusterView({"vast": rtx4090_box(gpus=1), "busy": busy},
                       (RunningJob("t", "tiny", "busy", (0,), 0.25, 2.0),))
    for tiny_cap, second in ((2, (0.25, 8.0)), (1, (0.75, 11.2))):
        c2 = catalog(job("sp", resources={"num_gpus": 0.25, "vram_gib": 4}, max_concurrency=2),
                     job("tiny", config="misc", resources={"num_gpus": 0.25, "vram_gib": 2},
                         max_concurrency=tiny_cap))
        p = plan(view, c2, {}, 0.0, term=1)
        got = [(a.template, a.gpu_fraction, round(a.vram_gib, 6)) for a in p.assignments]
        assert got[:2] == [("sp", 0.25, 8.0), ("sp", *second)], (tiny_cap, got)


def test_a_fractional_jobs_end_leaves_a_hole_that_its_replacement_fills():
    """Seed 003's churn: on a 4090 box every GPU holds two quarter-GPU selfplays (8 + 11.2 GiB); one ends and
    leaves a hole of 0.75 GPU and 11.2 GiB next to its sibling. A second box is empty and spread's node terms (fewer
    of the template's instances, a less used node) favour it, but the replacement fills the hole and is given the
    GPU's rest, not a fresh GPU of the empty box (fractions are bin-packed before a fresh GPU is opened)."""
    busy, empty = rtx4090_box("busy", offer=1), rtx4090_box("empty", offer=8)
    running = [RunningJob(f"r{i}-{k}", "sp", "busy", (i,), f, v)
               for i in range(8) for k, (f, v) in enumerate(((0.25, 8.0), (0.75, 11.2)))]
    del running[1]  # GPU 0's second job ended: its sibling holds 0.25 and 8 GiB
    sp = job("sp", resources={"num_gpus": 0.25, "vram_gib": 8}, max_concurrency=16)
    c = catalog(sp)
    v = ClusterView({"busy": busy, "empty": empty}, tuple(running))
    p = plan(v, c, {}, 0.0, term=1)
    assert [(a.node_id, a.gpus, a.gpu_fraction, round(a.vram_gib, 6)) for a in p.assignments] == \
        [("busy", (0,), 0.75, 11.2)]
    assert plan_violations(v, c, p, term=1) == []
    # With room for more instances the replacement still goes into the hole (at the floor, its rest left for the
    # next), and the instances beyond it open fresh GPUs of the empty box.
    c = catalog({**sp, "max_concurrency": 18})
    p = plan(v, c, {}, 0.0, term=1)
    got = [(a.node_id, a.gpus) for a in p.assignments]
    assert got[0] == ("busy", (0,)) and len(got) == 3 and all(nid == "empty" for nid, _ in got[1:]), got
    assert plan_violations(v, c, p, term=1) == []


def test_stranding_is_judged_by_the_waiting_templates_floors():
    """Item 2: a remainder no waiting template fits (its floor, not a fixed 8 GiB) is not left free. On a GPU other
    work partly holds, the job that fills the hole is given that rest (fractions are bin-packed: the GPU is then
    committed to its usable VRAM, where a fresh GPU would leave the hole idle); with a template waiting that fits
    the rest, the job takes only its ask and the rest goes to that template. (On fresh GPUs, a placement whose rest
    nothing waiting fits goes elsewhere when another node fits: test_the_planner_follows_the_catalog_policy.)"""
    used = NodeView("used", (GpuView(0, 24.0),), offer=2, vram_limit_ratio=0.8)  # 0.5 and 7.2 GiB free
    fresh = NodeView("fresh", (GpuView(0, 24.0),), offer=2, vram_limit_ratio=0.8)
    running = (RunningJob("r", "other", "used", (0,), 0.5, 12.0),)
    other = job("other", config="misc", resources={"num_gpus": 0.5, "vram_gib": 12}, max_concurrency=1)
    a = job("a", config="misc", resources={"num_gpus": 0.25, "vram_gib": 6}, max_concurrency=1,
            placement={"strategy": "pack"})
    p = plan(ClusterView({"used": used, "fresh": fresh}, running), catalog(other, a), {}, 0.0, term=1)
    got = [(x.template, x.node_id, x.gpu_fraction, round(x.vram_gib, 6)) for x in p.assignments]
    assert got == [("a", "used", 0.5, 7.2)]  # not 0.25 and 1.2 GiB left free that nothing fits; "fresh" stays free
    w = job("w", config="misc", resources={"num_gpus": 0.25, "vram_gib": 1}, max_concurrency=1)
    p = plan(ClusterView({"used": used, "fresh": fresh}, running), catalog(other, a, w), {}, 0.0, term=1)
    got = {x.template: (x.node_id, x.gpu_fraction, round(x.vram_gib, 6)) for x in p.assignments}
    assert got["a"] == ("used", 0.25, 6.0)  # w (1 GiB) fits the rest there
    assert got["w"] == ("used", 0.25, 1.2)  # and fills it


# -- review F5: a member claiming a huge GPU --------------------------------------------------------------------------
def test_a_member_claiming_a_huge_gpu_gets_a_plan_every_reader_decodes():
    """A snapshot may claim up to 2**62 bytes of one GPU; a whole-GPU job is given the GPU's usable VRAM, and a
    PlanJob takes at most 1e6 GiB: the view clamps the GPU to MAX_VRAM_GIB and the planner grants no more."""
    from p2pnode.node import node_view_of
    from p2pnode.scheduler._gpucap import MAX_VRAM_GIB
    from p2pnode.snapshot import GpuInfo, PlanJob, PlanSection, Resources, Snapshot

    huge = 2**62
    c = parse_catalog({"job": [
        {"name": "sp", "kind": "selfplay", "config": "sp", "argv": ["x"],
         "resources": {"num_gpus": 1, "vram_gib": 8}},
        {"name": "fr", "kind": "selfplay", "config": "fr", "argv": ["x"],
         "resources": {"num_gpus": 0.5, "vram_gib": 8}},
    ]})
    snap = Snapshot(schema=3, origin="liar", version=1, addr="127.0.0.1:7946", tags=[], leaving=False,
                    resources=Resources(gpus=[GpuInfo(index=0, mem_total_bytes=huge),
                                              GpuInfo(index=1, mem_total_bytes=huge)]))
    v = node_view_of(snap, disk_max_percent=70.0, vram_limit_ratio=0.8, offer=2)
    assert [g.vram_gib for g in v.gpus] == [MAX_VRAM_GIB, MAX_VRAM_GIB]
    # The planner alone (a view not built from a snapshot, e.g. the simulator's) grants within the bound too.
    raw = NodeView("liar", (GpuView(0, huge / 2**30), GpuView(1, huge / 2**30)), offer=2, vram_limit_ratio=1.0)
    for node in (v, raw):
        p = plan(ClusterView({"liar": node}), c, {}, 0.0, term=1)
        assert {a.template for a in p.assignments} == {"sp", "fr"}, p.pending
        assert all(a.vram_gib <= MAX_VRAM_GIB for a in p.assignments)
        jobs = [PlanJob(job_id=a.job_id, node=a.node_id, template=a.template, gpus=list(a.gpus),
                        gpu_fraction=a.gpu_fraction, vram_gib=a.vram_gib, term=1) for a in p.assignments]
        data = msgspec.msgpack.encode(PlanSection(term=1, seq=1, assignments=jobs))
        assert len(msgspec.msgpack.decode(data, type=PlanSection).assignments) == len(jobs)
