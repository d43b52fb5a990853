"""Stable kinds (``[policy] stable``, training by default) on seed 003's fleet as the operator ran it: a durable
1xH200, an ephemeral 8xA100 (RunPod spot) and an ephemeral 8xRTX 4090 (Vast.ai), the example catalog. Pure planner
calls: the training goes to the durable box when it fits there, by preemption there if need be, and to a spot box
only when no durable box could take it."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pnode.scheduler import (
    STABLE_KINDS,
    CatalogError,
    ClusterView,
    GpuView,
    NodeView,
    Prediction,
    RunningJob,
    Signals,
    leaderless_cap,
    leaderless_catalog,
    load_catalog,
    node_tier,
    parse_catalog,
    plan,
    plan_violations,
    reserve_for_stable,
    stable_need,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "examples" / "catalog.toml"
CAT = load_catalog(EXAMPLE)
TRAININGS = {n for n, t in CAT.templates.items() if t.kind == "training"}


def box(nid: str, n: int, vram: float, *, ephemeral: bool, cost: float, offer: int | None = None) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, vram) for i in range(n)),
                    frozenset({"ephemeral" if ephemeral else "durable", f"provider={nid.split('-')[0]}"}), cost,
                    ephemeral, n if offer is None else offer, vram_limit_ratio=0.8)


H200 = box("nebius-h200", 1, 141.0, ephemeral=False, cost=3.5)
A100 = box("runpod-a100x8", 8, 80.0, ephemeral=True, cost=11.0)
RTX = box("vast-4090x8", 8, 24.0, ephemeral=True, cost=3.2)


def view(*nodes: NodeView, running=()) -> ClusterView:
    return ClusterView({n.node_id: n for n in nodes}, tuple(running))


def trainings_on(p) -> dict[str, str]:
    return {a.template: a.node_id for a in p.assignments if a.template in TRAININGS}


def test_the_example_catalog_marks_training_stable_and_the_default_is_training():
    assert CAT.policy.stable == ("training",) == STABLE_KINDS
    assert CAT.is_stable("training") and not CAT.is_stable("selfplay")
    job = {"name": "t", "kind": "training", "config": "c", "argv": ["x"]}
    assert parse_catalog({"job": [job]}).policy.stable == ("training",)  # no [policy]: training
    assert parse_catalog({"job": [job], "policy": {"tiers": {"training": [1]}}}).is_stable("training")
    none = parse_catalog({"job": [job], "policy": {"stable": []}})
    assert not none.is_stable("training")
    both = parse_catalog({"job": [job], "policy": {"stable": ["training", "evaluation"]}})
    assert both.is_stable("evaluation") and both.is_stable("training")


@pytest.mark.parametrize("bad", ["training", ["training", "training"], [1], ["bad kind!"], {"training": True}])
def test_a_bad_stable_list_is_named(bad):
    job = {"name": "t", "kind": "training", "config": "c", "argv": ["x"]}
    with pytest.raises(CatalogError) as info:
        parse_catalog({"job": [job], "policy": {"stable": bad}})
    assert any("[policy].stable: a list of at most 64 distinct kinds" in e for e in info.value.errors)


def test_an_empty_seed003_fleet_puts_a_training_on_the_durable_h200():
    p = plan(view(H200, A100, RTX), CAT, {}, 0.0, term=1)
    on = trainings_on(p)
    assert list(on.values()).count(H200.node_id) == 1, on  # one GPU: one training, and it is there
    assert [a.template for a in p.assignments if a.node_id == H200.node_id][0] in TRAININGS
    assert not plan_violations(view(H200, A100, RTX), CAT, p)


def test_a_training_preempts_selfplay_on_the_durable_box_rather_than_take_a_free_spot_gpu():
    sp = RunningJob("0-a1", "selfplay-hexagonal_2p", H200.node_id, (0,), 1.0, 32.0)
    h200 = box("nebius-h200", 1, 141.0, ephemeral=False, cost=3.5, offer=0)  # busy: it offers nothing
    v = view(h200, A100, RTX, running=[sp])
    p = plan(v, CAT, {}, 0.0, term=1)
    on = trainings_on(p)
    assert [s.job_id for s in p.stops] == ["0-a1"] and "preempted by train-" in p.stops[0].reason
    assert list(on.values()).count(h200.node_id) == 1, on
    assert all(a.node_id != h200.node_id or a.template in TRAININGS for a in p.assignments)


def test_a_durable_box_of_a_lower_tier_beats_a_spot_box_of_the_first_tier():
    a6000 = box("home-a6000", 1, 48.0, ephemeral=False, cost=0.0)  # tier 2: square19 (40 GiB) and hex8 fit
    p = plan(view(a6000, A100), CAT, {}, 0.0, term=1)
    assert trainings_on(p).get("train-hexagonal_2p") == A100.node_id  # 64 GiB: the A6000 cannot take it
    assert trainings_on(p)["train-hex8_2p"] == a6000.node_id
    # The evaluation the plan had put there first (tier 2 is its first tier, and it scored higher) goes to the A100.
    assert [a.node_id for a in p.assignments if a.template == "eval-hex8_2p"] == [A100.node_id]
    assert not p.stops and not plan_violations(view(a6000, A100), CAT, p)


def test_work_placed_earlier_in_the_same_plan_gives_the_durable_box_back_to_training():
    jobs = [{"name": "train-b", "kind": "training", "config": "b", "argv": ["x"], "priority": 70,
             "resources": {"num_gpus": 1, "vram_gib": 16}},
            {"name": "sp-a", "kind": "selfplay", "config": "a", "argv": ["x"], "priority": 50, "max_concurrency": 1,
             "resources": {"num_gpus": 1, "vram_gib": 16}}]
    tiers = {"training": [1], "selfplay": [1]}
    signals = {"a": Signals(config="a", curriculum_weight=2.0, elo_velocity=100.0, data_age_s=36000.0, quality=1.0)}
    # Without the stable policy: the selfplay scores first and takes the cheaper durable box; training the spot box.
    free = parse_catalog({"policy": {"tiers": tiers, "stable": []}, "job": jobs})
    p = plan(view(H200, A100), free, signals, 0.0, term=1)
    assert [(a.template, a.node_id) for a in p.assignments] == [("sp-a", H200.node_id), ("train-b", A100.node_id)]
    # With it, the training takes that placement back (nothing ran yet) and the selfplay goes to the spot box.
    cat = parse_catalog({"policy": {"tiers": tiers}, "job": jobs})
    p = plan(view(H200, A100), cat, signals, 0.0, term=1)
    # (the training is assigned first, then the selfplay placed again: it cannot go back to the room it freed)
    assert [(a.job_id, a.template, a.node_id) for a in p.assignments] == [("1-2", "train-b", H200.node_id),
                                                                        ("1-3", "sp-a", A100.node_id)]
    assert not p.pending and not p.stops and not plan_violations(view(H200, A100), cat, p)
    # With no other node to take it (a spot box of tier 3), it waits for the next plan and says why.
    small = box("vast-4090", 1, 24.0, ephemeral=True, cost=0.3)
    p = plan(view(H200, small), cat, signals, 0.0, term=1)
    assert [(a.template, a.node_id) for a in p.assignments] == [("train-b", H200.node_id)]
    assert next(x.reason for x in p.pending if x.template == "sp-a").startswith(
        f"its placement on {H200.node_id} went to train-b")


def test_without_a_durable_box_training_goes_to_the_spot_boxes():
    p = plan(view(A100, RTX), CAT, {}, 0.0, term=1)
    on = trainings_on(p)
    assert set(on) == TRAININGS and set(on.values()) <= {A100.node_id, RTX.node_id}
    assert not p.stops


def test_a_durable_box_too_small_or_of_another_tier_attracts_no_training_and_no_preemption():
    small = box("home-4090", 1, 24.0, ephemeral=False, cost=0.0)  # tier 3: training uses tiers 1 and 2
    sp = RunningJob("0-s1", "selfplay-hex8_2p", small.node_id, (0,), 0.25, 8.0)
    p = plan(view(small, A100, running=[sp]), CAT, {}, 0.0, term=1)
    assert small.node_id not in trainings_on(p).values() and not p.stops
    assert set(trainings_on(p).values()) == {A100.node_id}
    l40 = box("home-l40", 1, 46.0, ephemeral=False, cost=0.0, offer=0)  # tier 2, 36.8 GiB usable: no 40/64 GiB
    sp2 = RunningJob("0-s2", "selfplay-hexagonal_2p", l40.node_id, (0,), 1.0, 32.0)
    p = plan(view(l40, A100, running=[sp2]), CAT, {}, 0.0, term=1)
    on = trainings_on(p)
    assert on["train-hexagonal_2p"] == on["train-square19_2p"] == A100.node_id
    # hex8 (16 GiB) fits the L40 once its selfplay goes: that one preemption, for hex8 only
    assert on["train-hex8_2p"] == l40.node_id and [s.job_id for s in p.stops] == ["0-s2"]


def test_a_training_does_not_preempt_work_too_close_in_priority_on_the_durable_box():
    cat = parse_catalog({"policy": {"tiers": {"training": [1]}}, "job": [
        {"name": "train", "kind": "training", "config": "c", "argv": ["x"], "priority": 55,
         "resources": {"num_gpus": 1, "vram_gib": 16}},
        {"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"], "priority": 50,
         "resources": {"num_gpus": 1, "vram_gib": 16}}]})
    h200 = box("nebius-h200", 1, 141.0, ephemeral=False, cost=3.5, offer=0)
    p = plan(view(h200, A100, running=[RunningJob("0-a1", "sp", h200.node_id, (0,), 1.0, 16.0)]), cat, {}, 0.0,
             term=1)
    assert not p.stops and trainings_on_any(p) == {"train": A100.node_id}  # 5 points: no preemption


def test_with_predictions_a_training_does_not_throw_away_work_that_ends_soon_on_the_durable_box():
    wall = 1_700_000_000.0
    cat = parse_catalog({"policy": {"tiers": {"training": [1]}}, "job": [
        {"name": "train", "kind": "training", "config": "c", "argv": ["x"], "priority": 70,
         "resources": {"num_gpus": 1, "vram_gib": 16}},
        {"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"], "priority": 50,
         "resources": {"num_gpus": 1, "vram_gib": 16}}]})
    h200 = box("nebius-h200", 1, 141.0, ephemeral=False, cost=3.5, offer=0)
    running = (RunningJob("0-a1", "sp", h200.node_id, (0,), 1.0, 16.0, wall - 100.0),)

    class Predictor:
        def __init__(self, p50: float) -> None:
            self.p50 = p50

        def predict(self, template: str, node_class: str = "") -> Prediction:
            return Prediction(template, "", self.p50, 2 * self.p50, None, None, runs=40, nodes=3, source="history")

    def placed(p50: float):
        v = ClusterView({n.node_id: n for n in (h200, A100)}, running, predictor=Predictor(p50), wall=wall)
        p = plan(v, cat, {}, 0.0, term=1)
        return trainings_on_any(p), [s.job_id for s in p.stops]

    assert placed(150.0) == ({"train": A100.node_id}, [])  # the selfplay ends in ~50 s: the spot box, no preemption
    assert placed(3000.0) == ({"train": h200.node_id}, ["0-a1"])  # ~2,900 s: preempted for the durable box


def trainings_on_any(p) -> dict[str, str]:
    return {a.template: a.node_id for a in p.assignments if a.template == "train"}


def test_with_no_stable_kind_training_is_placed_by_score_alone():
    doc_policy = {"tiers": {"training": [1]}, "stable": []}
    cat = parse_catalog({"policy": doc_policy, "job": [
        {"name": "train", "kind": "training", "config": "c", "argv": ["x"], "priority": 80,
         "resources": {"num_gpus": 1, "vram_gib": 16}},
        {"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"], "priority": 50,
         "resources": {"num_gpus": 1, "vram_gib": 16}}]})
    h200 = box("nebius-h200", 1, 141.0, ephemeral=False, cost=3.5, offer=0)
    p = plan(view(h200, A100, running=[RunningJob("0-a1", "sp", h200.node_id, (0,), 1.0, 16.0)]), cat, {}, 0.0,
             term=1)
    assert not p.stops and trainings_on_any(p) == {"train": A100.node_id}


def test_many_spot_boxes_do_not_hide_the_one_durable_box():
    """The search looks at durable nodes first, not at 8 random candidates of a tier of 300 spot boxes."""
    spots = [box(f"runpod-a100-{i:03d}", 1, 80.0, ephemeral=True, cost=1.6) for i in range(300)]
    cat = parse_catalog({"policy": {"tiers": {"training": [1]}}, "job": [
        {"name": f"train-{c}", "kind": "training", "config": c, "argv": ["x"],
         "resources": {"num_gpus": 1, "vram_gib": 16}} for c in ("a", "b")]})
    for seed in range(5):
        p = plan(view(*spots, H200), cat, {}, 0.0, term=1, seed=seed)
        assert [a.node_id for a in p.assignments].count(H200.node_id) == 1


def test_a_gang_of_a_stable_kind_puts_its_members_on_durable_boxes_first():
    cat = parse_catalog({"job": [
        {"name": "ddp", "kind": "training", "config": "c", "argv": ["x"], "engine": "torchrun",
         "resources": {"num_gpus": 1, "vram_gib": 16}, "gang": {"members": 2}}]})
    durable = [NodeView(f"d{i}", (GpuView(0, 80.0),), frozenset(), 0.0, False, 1, host=f"10.0.0.{i}",
                        engines=frozenset({"process", "torchrun"})) for i in range(2)]
    spot = [NodeView(f"e{i}", (GpuView(0, 80.0),), frozenset({"ephemeral"}), 0.0, True, 1, host=f"10.0.1.{i}",
                     engines=frozenset({"process", "torchrun"})) for i in range(4)]
    p = plan(view(*spot, *durable), cat, {}, 0.0, term=1)
    assert sorted(a.node_id for a in p.assignments) == ["d0", "d1"]


# -- a durable node without a leader keeps room for training -------------------------------------------------------
def test_a_durable_node_keeps_the_gpus_of_the_largest_training_it_could_take():
    assert stable_need(H200, CAT) == (1, 64.0)  # train-hexagonal_2p: one GPU, 64 GiB
    kept = reserve_for_stable(H200, CAT)
    assert [(g.kept, g.full) for g in kept.gpus] == [(True, False)]
    assert reserve_for_stable(A100, CAT) is A100 and reserve_for_stable(RTX, CAT) is RTX  # ephemeral: nothing kept
    eight = box("home-a100x8", 8, 80.0, ephemeral=False, cost=0.0)
    busy = [RunningJob("x", "selfplay-hexagonal_2p", eight.node_id, (0,), 1.0, 32.0)]
    assert [g.index for g in reserve_for_stable(eight, CAT, busy).gpus if g.kept] == [1]  # a free one, not 0
    small = box("home-4090", 1, 24.0, ephemeral=False, cost=0.0)  # tier 3: no training may use it
    assert stable_need(small, CAT) is None and reserve_for_stable(small, CAT) is small
    l40 = box("home-l40", 1, 46.0, ephemeral=False, cost=0.0)  # 36.8 GiB usable: only hex8's 16 GiB fits
    assert stable_need(l40, CAT) == (1, 16.0)


# Review F8-F10: the reserve bounded.
def _cat(training: dict, sp_gpus: float = 0.5) -> object:
    return parse_catalog({"job": [
        {"name": "tr", "kind": "training", "config": "c", "argv": ["x"]} | training,
        {"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"], "autonomous": True,
         "max_concurrency": 16, "resources": {"num_gpus": sp_gpus, "vram_gib": 8}}]})


def test_a_training_that_is_itself_autonomous_keeps_nothing_so_a_lone_durable_box_runs_it():
    c = _cat({"autonomous": True, "resources": {"num_gpus": 1, "vram_gib": 40}})
    me = NodeView("solo", (GpuView(0, 80),), offer=1, vram_limit_ratio=0.8)
    assert stable_need(me, c) is None and reserve_for_stable(me, c) is me
    p = plan(ClusterView({"solo": reserve_for_stable(me, c)}), c, {}, 0.0, term=0, autonomous_only=True)
    assert p.assignments, p.pending


def test_an_eight_gpu_training_keeps_one_gpu_and_the_other_seven_work():
    c = _cat({"resources": {"num_gpus": 8, "vram_gib": 40}}, sp_gpus=1)
    me = NodeView("a100x8", tuple(GpuView(i, 80) for i in range(8)), offer=8, vram_limit_ratio=0.8)
    kept = reserve_for_stable(me, c)
    assert [g.index for g in kept.gpus if g.kept] == [0]
    p = plan(ClusterView({"a100x8": kept}), c, {}, 0.0, term=0, autonomous_only=True)
    assert sorted(a.gpus[0] for a in p.assignments) == list(range(1, 8))


def test_a_fractional_training_keeps_at_most_one_gpu():
    c = _cat({"resources": {"num_gpus": 0.5, "vram_gib": 20}})
    me = NodeView("d", tuple(GpuView(i, 80) for i in range(2)), offer=2, vram_limit_ratio=0.8)
    assert stable_need(me, c) == (1, 20.0)
    assert [g.kept for g in reserve_for_stable(me, c).gpus] == [True, False]


def test_nothing_is_kept_outside_a_mixed_fleet_or_beside_a_running_training():
    c = _cat({"resources": {"num_gpus": 1, "vram_gib": 40}})
    me = NodeView("d", tuple(GpuView(i, 80) for i in range(2)), offer=2, vram_limit_ratio=0.8)
    assert reserve_for_stable(me, c, mixed=False) is me
    training = [RunningJob("t1", "tr", "d", (1,), 1.0, 64.0)]
    assert reserve_for_stable(me, c, training) is me
    selfplay = [RunningJob("s1", "sp", "d", (1,), 0.5, 8.0)]
    assert [g.kept for g in reserve_for_stable(me, c, selfplay).gpus] == [True, False]


def test_the_kept_gpu_is_chosen_by_the_clamped_usable_vram():
    """Review F10: a limit ratio above 1 counts as 1 (usable_vram_gib): a 50 GiB GPU cannot take 64 GiB."""
    c = _cat({"resources": {"num_gpus": 1, "vram_gib": 64}})
    me = NodeView("d", (GpuView(0, 50), GpuView(1, 80)), offer=2, vram_limit_ratio=1.5)
    assert [g.index for g in reserve_for_stable(me, c).gpus if g.kept] == [1]


def test_a_kept_gpu_has_its_own_pending_reason():
    """Review F9: a kept GPU is not one over the guard's measured memory limit."""
    c = parse_catalog({"job": [
        {"name": "tr", "kind": "training", "config": "c", "argv": ["x"], "resources": {"num_gpus": 1, "vram_gib": 40}},
        {"name": "big", "kind": "selfplay", "config": "c", "argv": ["x"], "autonomous": True,
         "resources": {"num_gpus": 1, "vram_gib": 40}}]})
    me = NodeView("d", (GpuView(0, 80),), offer=1, vram_limit_ratio=0.8)
    p = plan(ClusterView({"d": reserve_for_stable(me, c)}), c, {}, 0.0, term=0, autonomous_only=True)
    assert not p.assignments
    (why,) = [x.reason for x in p.pending if x.template == "big"]
    assert "kept free for a training of a stable kind until a leader places it" in why, why
    assert "measured GPU memory limit" not in why, why
    full = NodeView("d", (GpuView(0, 80, full=True),), offer=1, vram_limit_ratio=0.8)
    (why,) = [x.reason for x in plan(ClusterView({"d": full}), c, {}, 0.0, term=0, autonomous_only=True).pending
              if x.template == "big"]
    assert "measured GPU memory limit" in why, why


def test_the_autonomous_plan_on_a_kept_view_leaves_the_training_room():
    eight = box("home-a100x8", 8, 80.0, ephemeral=False, cost=0.0)
    kept = reserve_for_stable(eight, CAT)
    p = plan(view(kept), CAT, {}, 0.0, term=0, autonomous_only=True)
    assert p.assignments and all(a.gpus != (0,) for a in p.assignments)  # GPU 0 stays free
    leader = plan(view(eight, running=[RunningJob(f"a{i}", a.template, eight.node_id, a.gpus, a.gpu_fraction,
                                                  a.vram_gib) for i, a in enumerate(p.assignments)]),
                  CAT, {}, 1.0, term=1)
    assert trainings_on(leader).get("train-hexagonal_2p") == eight.node_id  # on the GPU kept free: no stop for it
    assert not [s for s in leader.stops if "train-hexagonal_2p" in s.reason], leader.stops


def test_a_training_stops_every_fractional_job_that_shares_the_durable_gpu_it_needs():
    # Issue 38: fractional jobs share a GPU (the capacity model gives the remainder to the last), so no single stop
    # frees the H200's one GPU: the plan stops all of them there rather than put the training on a spot box.
    h200 = box("nebius-h200", 1, 141.0, ephemeral=False, cost=3.5, offer=0)
    running = [RunningJob("0-a1", "selfplay-square19_2p", h200.node_id, (0,), 0.5, 16.0),
               RunningJob("0-a2", "selfplay-hex8_2p", h200.node_id, (0,), 0.5, 96.8)]
    p = plan(view(h200, A100, RTX, running=running), CAT, {}, 0.0, term=1)
    assert sorted(s.job_id for s in p.stops) == ["0-a1", "0-a2"], p.stops
    assert all("2 jobs make room on a durable node" in s.reason for s in p.stops)
    assert list(trainings_on(p).values()).count(h200.node_id) == 1
    # With the stop of one job enough, only that one is stopped.
    one = [RunningJob("0-a1", "selfplay-hexagonal_2p", h200.node_id, (0,), 1.0, 112.8)]
    p1 = plan(view(h200, A100, RTX, running=one), CAT, {}, 0.0, term=1)
    assert [s.job_id for s in p1.stops] == ["0-a1"]


# -- taking back and preempting on a durable node (issue 38 review) ---------------------------------------------------

HOT = {"sp": Signals("sp", 2.0, 1e6, 1e9, 1.0, 1)}  # selfplay scores first: trainings meet its placements


def _sp_tr(sp_conc: int, tr_gpus: float, tr_vram: float, stable=("training",)):
    return parse_catalog({"job": [
        {"name": "sp", "kind": "selfplay", "config": "sp", "argv": ["x"], "priority": 30, "preemptible": True,
         "max_concurrency": sp_conc, "resources": {"num_gpus": 0.5, "vram_gib": 8}},
        {"name": "tr", "kind": "training", "config": "tr", "argv": ["x"], "priority": 50, "preemptible": True,
         "max_concurrency": 1, "resources": {"num_gpus": tr_gpus, "vram_gib": tr_vram}},
    ], "policy": {"stable": list(stable)}})


def _durable(ngpus: int, offer: int) -> NodeView:
    return NodeView("durable", tuple(GpuView(i, 80) for i in range(ngpus)), offer=offer, vram_limit_ratio=0.8)


SPOT = NodeView("spot", (GpuView(0, 8),), ephemeral=True, offer=1, vram_limit_ratio=0.8)


def test_a_fraction_taken_back_for_a_fractional_training_is_not_put_back_into_the_room_it_freed():
    """Selfplay fills GPU 0 of a 1-GPU durable box (offer 1); a half-GPU training takes one half back. The plan
    is made (no crash), the training runs on the durable box and nothing breaks an invariant."""
    c = _sp_tr(2, 0.5, 24)
    v = view(_durable(1, 1), SPOT)
    p = plan(v, c, HOT, 0.0, term=2)
    assert plan_violations(v, c, p, term=2) == []
    assert [(a.template, a.node_id) for a in p.assignments if a.template == "tr"] == [("tr", "durable")]
    assert sum(1 for a in p.assignments if a.template == "sp" and a.node_id == "durable") == 1


def test_taking_back_a_fraction_that_spent_no_offer_does_not_lift_a_durable_box_over_its_offer():
    """2 GPUs, offer 1: the two selfplay halves share GPU 0 (one offer); a whole-GPU training needs that offer,
    so both halves are taken back (the second made no room alone), not only the one that spent nothing."""
    c = _sp_tr(2, 1, 40)
    v = view(_durable(2, 1), SPOT)
    p = plan(v, c, HOT, 0.0, term=2)
    assert plan_violations(v, c, p, term=2) == []
    assert [a.node_id for a in p.assignments if a.template == "tr"] == ["durable"]
    assert [a for a in p.assignments if a.node_id == "durable" and a.template == "sp"] == []


def test_a_training_taken_back_leaves_its_config_free_to_train():
    """With [policy] stable not listing training, a training placed earlier in the plan (its config scores first)
    is taken back for a stable evaluation and fits nowhere else: its config no longer "already runs" a training,
    so the config's smaller training takes the spot box."""
    c = parse_catalog({"job": [
        {"name": "tr", "kind": "training", "config": "c", "argv": ["x"], "priority": 10, "preemptible": True,
         "max_concurrency": 1, "resources": {"num_gpus": 1, "vram_gib": 8}},
        {"name": "tr2", "kind": "training", "config": "c", "argv": ["x"], "priority": 1, "preemptible": True,
         "max_concurrency": 1, "resources": {"num_gpus": 1, "vram_gib": 4}},
        {"name": "ev", "kind": "evaluation", "config": "e", "argv": ["x"], "priority": 90, "max_concurrency": 1,
         "resources": {"num_gpus": 1, "vram_gib": 40}}], "policy": {"stable": ["evaluation"]}})
    v = view(_durable(1, 1), SPOT)
    p = plan(v, c, {"c": Signals("c", 2.0, 1e6, 1e9, 1.0, 1), "e": Signals("e", 1.0, 0.0, 0.0, 1.0, 1)}, 0.0, term=2)
    assert plan_violations(v, c, p, term=2) == []
    assert sorted((a.template, a.node_id) for a in p.assignments) == [("ev", "durable"), ("tr2", "spot")]
    assert "went to ev" in {x.template: x.reason for x in p.pending}["tr"]


def test_several_preemptions_stop_only_jobs_on_the_gpu_the_training_takes():
    """GPU 0 holds sp0 (priority 1) and sp2 (3), GPU 1 sp1 (2) and sp3 (4): the whole-GPU training takes GPU 0
    and stops sp0 and sp2 only; sp1 (lower than sp2, but on GPU 1) keeps running."""
    c = parse_catalog({"job": [
        {"name": f"sp{k}", "kind": "selfplay", "config": "sp", "argv": ["x"], "priority": k + 1,
         "preemptible": True, "max_concurrency": 1, "resources": {"num_gpus": 0.5, "vram_gib": 8}}
        for k in range(4)] + [
        {"name": "tr", "kind": "training", "config": "tr", "argv": ["x"], "priority": 50,
         "max_concurrency": 1, "resources": {"num_gpus": 1, "vram_gib": 40}}], "policy": {"stable": ["training"]}})
    running = tuple(RunningJob(f"j{k}", f"sp{k}", "durable", (k % 2,), 0.5, 32.0, 0.0, 1) for k in range(4))
    v = view(_durable(2, 1), SPOT, running=running)
    p = plan(v, c, {}, 0.0, term=2)
    assert plan_violations(v, c, p, term=2) == []
    assert [(a.node_id, a.gpus) for a in p.assignments if a.template == "tr"] == [("durable", (0,))]
    assert sorted(s.job_id for s in p.stops) == ["j0", "j2"]


def test_a_duplicate_training_stopped_already_is_not_preempted_again():
    """Two trainings of one config run (a re-adopted job): the older term's is stopped as a duplicate; an
    evaluation then needs the whole GPU: the kept one is preempted, the duplicate is not stopped twice (its share
    is given back once)."""
    c = parse_catalog({"job": [
        {"name": "tr", "kind": "training", "config": "c", "argv": ["x"], "priority": 10, "preemptible": True,
         "resources": {"num_gpus": 0.5, "vram_gib": 8}},
        {"name": "ev", "kind": "evaluation", "config": "e", "argv": ["x"], "priority": 90,
         "resources": {"num_gpus": 1, "vram_gib": 8}}], "policy": {"stable": []}})
    running = (RunningJob("2-1", "tr", "d", (0,), 0.5, 8.0, 0.0, 2),
               RunningJob("1-1", "tr", "d", (0,), 0.5, 8.0, 0.0, 1))
    v = view(NodeView("d", (GpuView(0, 80),), offer=1, vram_limit_ratio=0.8), running=running)
    p = plan(v, c, {}, 0.0, term=3)
    ids = [s.job_id for s in p.stops]
    assert sorted(ids) == ["1-1", "2-1"]
    assert plan_violations(v, c, p, term=3) == []


def test_leaderless_cap_is_the_nodes_share_and_never_above_what_others_leave():
    assert leaderless_cap(8, 8, 17, 0) == 4  # ceil(8 x 8/17)
    assert leaderless_cap(8, 1, 17, 0) == 1
    assert leaderless_cap(8, 8, 8, 0) == 8  # alone: the whole cap
    assert leaderless_cap(8, 8, 0, 0) == 8  # nothing known to share with
    assert leaderless_cap(8, 8, 16, 7) == 1 and leaderless_cap(8, 8, 16, 9) == 0
    assert leaderless_cap(8, 0, 16, 0) == 0


def test_leaderless_catalog_lowers_only_autonomous_caps_by_the_gpus_of_members_in_their_tiers():
    """Seed 003's fleet with the example catalog: the 8xA100 box knowing the H200 and the 8x4090 box shares each
    autonomous selfplay's cap by the GPUs of the members whose tier the template may use; trainings (not
    autonomous: one per config cluster-wide, the leader's rule) keep their caps."""
    cat = leaderless_catalog(CAT, A100, [H200, RTX])
    for name, t in CAT.templates.items():
        got = cat.templates[name]
        if not t.autonomous or t.max_concurrency <= 0:
            assert got is t
            continue
        tiers = CAT.tiers_of(t)
        gpus = {v.node_id: len(v.gpus) for v in (A100, H200, RTX) if node_tier(v) in tiers}
        want = -(-t.max_concurrency * gpus.get(A100.node_id, 0) // max(1, sum(gpus.values())))
        assert got.max_concurrency == min(t.max_concurrency, want), name
    assert any(cat.templates[n].max_concurrency < t.max_concurrency for n, t in CAT.templates.items())
    assert cat.digest == CAT.digest
    # Instances the other members report count against the cap: with the cap running elsewhere, none here.
    hex8 = CAT.templates["selfplay-hex8_2p"]
    full = leaderless_catalog(CAT, A100, [H200, RTX], ["selfplay-hex8_2p"] * hex8.max_concurrency)
    assert full.templates["selfplay-hex8_2p"].max_concurrency == 0
    assert leaderless_catalog(CAT, A100, []) is CAT  # alone: nothing lowered


def test_a_leaders_plan_stops_the_youngest_instances_over_a_templates_max_concurrency():
    """Seed 003: nodes without a leader (the 8x4090 box knowing no other GPU member at its first step) ran 13
    ``selfplay-hex8_2p`` against a cap of 8, and no end was replaced until the surplus ended by itself (60-90 s).
    The leader's plan stops the surplus, youngest first (least work lost), naming the rule; the older ones and a
    duplicate training's own rule are untouched, and a node's own leaderless plan (term 0) stops nothing."""
    hex8 = "selfplay-hex8_2p"
    cap = CAT.templates[hex8].max_concurrency
    rtx = box("vast-4090x8", 8, 24.0, ephemeral=True, cost=3.2, offer=0)
    a100 = box("runpod-a100x8", 8, 80.0, ephemeral=True, cost=11.0, offer=0)
    running = [RunningJob(f"rtx-a{i}", hex8, rtx.node_id, (i,), 0.25, 4.8, started_at=100.0 + i, term=0)
               for i in range(8)]
    running += [RunningJob(f"a100-a{i}", hex8, a100.node_id, (i,), 0.25, 16.0, started_at=101.5 + i, term=0)
                for i in range(5)]
    running.append(RunningJob("1-1", "train-hex8_2p", a100.node_id, (7,), 1.0, 64.0, started_at=50.0, term=1))
    v = view(H200, a100, rtx, running=running)
    p = plan(v, CAT, {}, 0.0, term=1)
    over = sorted(s.job_id for s in p.stops if s.reason.startswith("over max_concurrency"))
    youngest = sorted(r.job_id for r in sorted(running[:13], key=lambda r: r.started_at)[cap:])
    assert over == youngest and len(over) == 13 - cap
    assert "13 instances of selfplay-hex8_2p run, its cap is 8" in next(s.reason for s in p.stops
                                                                        if s.job_id == over[0])
    assert "1-1" not in {s.job_id for s in p.stops}
    assert not [a for a in p.assignments if a.template == hex8]  # at its cap once the surplus stops
    # The node's own leaderless plan (term 0) accounts all it runs and stops nothing.
    own = [r for r in running if r.node_id == rtx.node_id]
    assert not plan(ClusterView({rtx.node_id: rtx}, tuple(own)), CAT, {}, 0.0, term=0, autonomous_only=True).stops


def test_the_surplus_stopped_frees_whole_gpus_before_the_youngest():
    """Stopping a surplus where it leaves a GPU part-held makes a hole only the capped template fits: of 10
    ``selfplay-hex8_2p`` (cap 8) the two sharing GPU 1 stop (it is free whole), not the youngest, which shares
    GPU 0 with a ``selfplay-square19_2p`` that stays; among instances alone on their GPUs the youngest stop."""
    hex8, sq19, sq8 = "selfplay-hex8_2p", "selfplay-square19_2p", "selfplay-square8_2p"
    rtx = box("vast-4090x8", 8, 24.0, ephemeral=True, cost=3.2, offer=0)
    a100 = box("runpod-a100x8", 8, 80.0, ephemeral=True, cost=11.0, offer=0)
    running = [RunningJob("young", hex8, rtx.node_id, (0,), 0.25, 8.0, started_at=200.0),
               RunningJob("sq", sq19, rtx.node_id, (0,), 0.5, 11.2, started_at=10.0),
               RunningJob("old-1", hex8, rtx.node_id, (1,), 0.25, 8.0, started_at=20.0),
               RunningJob("old-2", hex8, rtx.node_id, (1,), 0.25, 11.2, started_at=30.0),
               RunningJob("a", hex8, a100.node_id, (0,), 0.25, 16.0, started_at=150.0),
               RunningJob("a-sq", sq8, a100.node_id, (0,), 0.75, 48.0, started_at=150.0)]
    for i in range(2, 8):
        running += [RunningJob(f"h{i}", hex8, rtx.node_id, (i,), 0.25, 8.0, started_at=100.0 + i),
                    RunningJob(f"s{i}", sq8, rtx.node_id, (i,), 0.25, 11.2, started_at=100.0 + i)]
    p = plan(view(H200, a100, rtx, running=running), CAT, {}, 0.0, term=1)
    assert sorted(s.job_id for s in p.stops) == ["old-1", "old-2"]
    assert all(s.reason.startswith("over max_concurrency: 10 instances") for s in p.stops)
    alike = [RunningJob(f"y{i}", hex8, rtx.node_id, (i % 8,), 0.25, 9.6, started_at=float(i)) for i in range(10)]
    p = plan(view(H200, A100, rtx, running=alike), CAT, {}, 0.0, term=1)
    assert sorted(s.job_id for s in p.stops) == ["y6", "y7"]
