"""The scaling evaluation and the leader's action ledger, on virtual time (p2pnode.scheduler._scaling).

Every rule of the module docstring is checked on the pure core: min_nodes, queue-driven scale-up with its
hysteresis, the predictor's GPUs-about-to-free, max_step / max_nodes / max_hourly_cost, idle scale-down within
min_nodes and the band top, drain before removal (jobs ended, data at R), one action per cooldown, a failed
action decided again after the cooldown, and a failover that neither repeats nor loses an action.
"""

from __future__ import annotations

import pytest

from p2pnode.scheduler import catalog_from_text
from p2pnode.scheduler._predict import Prediction
from p2pnode.scheduler._scaling import (
    ClassPolicy,
    FleetNode,
    ProviderCall,
    ProviderList,
    ScalingCore,
    ScalingPolicy,
    class_shape,
    evaluate_scaling,
)
from p2pnode.snapshot import PlanPending, ScalingAction, ScalingSection

CATALOG = catalog_from_text('''
[[job]]
name = "train"
kind = "training"
config = "c1"
argv = ["true"]
[job.resources]
num_gpus = 1
vram_gib = 40

[[job]]
name = "gang"
kind = "training"
config = "c2"
argv = ["true"]
engine = "torchrun"
[job.gang]
members = 3
[job.resources]
num_gpus = 1
vram_gib = 40

[[job]]
name = "cpu"
kind = "evaluation"
config = "c3"
argv = ["true"]
[job.resources]
num_gpus = 0
''', source="test", base_dir=".")

H100 = "1xH100"


def policy(**kw) -> ScalingPolicy:
    base = dict(provider="local", classes={H100: ClassPolicy(min_nodes=3, max_nodes=6, price_per_hour=2.0)},
                cooldown_s=30.0, up_after_s=20.0, idle_timeout_s=60.0, max_step=4)
    base.update(kw)
    return ScalingPolicy(**base)


def node(i: int, *, cls: str = H100, running=(), started_by: str = "", voter: bool = False, under: int = 0,
         used: float | None = None) -> FleetNode:
    return FleetNode(node_id=f"n{i}", node_class=cls, gpus=1, gpu_used=len(running) if used is None else used,
                     running=tuple(running), started_by=started_by, voter=voter, under_replicated=under)


def static(k: int = 3, busy: bool = True) -> list[FleetNode]:
    return [node(i, voter=True, running=[("train", 10.0)] if busy else []) for i in range(k)]


def waiting(*names: str, wait_s: float = 30.0) -> list[PlanPending]:
    return [PlanPending(template=n, reason="no capacity", wait_s=wait_s) for n in names]


class FakePredictor:
    def __init__(self, p50: float, p90: float) -> None:
        self.p50, self.p90 = p50, p90

    def predict(self, template: str, node_class: str = "") -> Prediction | None:
        return Prediction(template, node_class, self.p50, self.p90, runs=10, nodes=2, source="history")


def verdict(vs, cls=H100):
    return next(v for v in vs if v.node_class == cls)


def test_class_shapes_from_names_and_members():
    assert class_shape("8xH100").gpus == 8 and class_shape("8xH100").tier == 1
    assert class_shape("1x4090").vram_gib == 24 and class_shape("cpu").gpus == 0
    assert class_shape("big-box") is None
    assert class_shape("big-box", [node(0, cls="big-box")], {"big-box": 80.0}).vram_gib == 80.0


def test_below_min_nodes_scales_up_by_the_difference():
    v = verdict(evaluate_scaling(policy(), static(1), [], CATALOG, None, 100.0))
    assert (v.verdict, v.count) == ("up", 2) and "min_nodes 3" in v.reason
    v = verdict(evaluate_scaling(policy(), static(1), [], CATALOG, None, 100.0, starting={H100: 2}))
    assert v.verdict == "hold"


def test_queue_scales_up_only_after_up_after_s():
    early = verdict(evaluate_scaling(policy(), static(), waiting("train", wait_s=5.0), CATALOG, None, 100.0))
    assert early.verdict == "hold"
    v = verdict(evaluate_scaling(policy(), static(), waiting("train", "gang"), CATALOG, None, 100.0))
    assert v.verdict == "up" and v.count == 3 and "gangs" in v.reason  # 1 + 3 members, capped by max_nodes 6
    assert v.queued == 2


def test_max_step_max_nodes_and_cost_cap():
    v = verdict(evaluate_scaling(policy(max_step=1), static(), waiting("gang"), CATALOG, None, 0.0))
    assert v.count == 1
    v = verdict(evaluate_scaling(policy(), static(6), waiting("train"), CATALOG, None, 0.0))
    assert v.verdict == "hold" and "max_nodes" in v.reason
    v = verdict(evaluate_scaling(policy(max_hourly_cost=9.0), static(), waiting("gang"), CATALOG, None, 0.0))
    assert (v.verdict, v.count) == ("up", 1)  # 3 x 2.0 running + 1 x 2.0 <= 9.0


def test_work_predicted_to_end_soon_holds_the_scale_up():
    fleet = static()
    v = verdict(evaluate_scaling(policy(), fleet, waiting("train"), CATALOG, FakePredictor(25.0, 40.0), 0.0))
    assert v.verdict == "hold" and "predicted to free" in v.reason  # 25 - 10 elapsed <= 20 s
    v = verdict(evaluate_scaling(policy(), fleet, waiting("train"), CATALOG, FakePredictor(600.0, 900.0), 0.0))
    assert v.verdict == "up"


def test_work_no_class_can_run_is_no_demand():
    v = verdict(evaluate_scaling(policy(classes={"1x3060": ClassPolicy(0, 4)}), static(), waiting("train"),
                                 CATALOG, None, 0.0), "1x3060")
    assert v.verdict == "hold" and v.queued == 0  # 40 GiB does not fit a 12 GiB GPU (and tier 3 trains nothing)


def test_no_voter_tag_holds_everything():
    fleet = [node(i) for i in range(3)]
    v = verdict(evaluate_scaling(policy(), fleet, waiting("train"), CATALOG, None, 0.0))
    assert v.verdict == "hold" and "voter" in v.reason


def idle_extra(*ids: int) -> list[FleetNode]:
    return [FleetNode(node_id=f"n{i}", node_class=H100, gpus=1, started_by="1-1", idle_since=0.0) for i in ids]


def test_idle_provider_nodes_scale_down_within_min_nodes_and_band():
    fleet = static() + idle_extra(10, 11)
    v = verdict(evaluate_scaling(policy(), fleet, [], CATALOG, None, 30.0))
    assert v.verdict == "hold"  # idle 30 s < 60 s
    # 3 of 5 GPUs busy: removing one idle node leaves 3/4 = 75 % (in the band), a second 3/3: one is kept
    v = verdict(evaluate_scaling(policy(), fleet, [], CATALOG, None, 61.0))
    assert (v.verdict, v.nodes) == ("down", ["n10"])
    quiet = static(busy=False) + idle_extra(10, 11)
    v = verdict(evaluate_scaling(policy(), quiet, [], CATALOG, None, 61.0))
    assert (v.verdict, sorted(v.nodes)) == ("down", ["n10", "n11"])
    # the static voters are never candidates, and min_nodes holds
    v = verdict(evaluate_scaling(policy(classes={H100: ClassPolicy(4, 6)}), quiet, [], CATALOG, None, 61.0))
    assert v.nodes == ["n10"]
    v = verdict(evaluate_scaling(policy(classes={H100: ClassPolicy(5, 6)}), quiet, [], CATALOG, None, 61.0))
    assert v.verdict == "hold" and "min_nodes 5" in v.reason


def step_until(core: ScalingCore, fleet, pending, wall, **kw):
    return core.step(fleet, pending, CATALOG, kw.get("predictor"), wall)


def test_one_action_per_cooldown_and_the_ledger():
    core = ScalingCore(policy())
    core.lead(5, [], -1000.0)
    fleet = static()
    [call] = core.step(fleet, waiting("train"), CATALOG, None, 1000.0)
    assert isinstance(call, ProviderCall) and call.action.op == "up" and call.action.count == 1
    assert call.action.id.startswith("5-1") and call.action.state == "requested"
    assert core.step(fleet, waiting("train"), CATALOG, None, 1001.0) == []  # in flight
    core.result(call.action.id, "", 1002.0)
    assert core.ledger[-1].state == "done"
    # the node has not joined: it counts as starting, so the same demand asks for nothing more
    assert core.step(fleet, waiting("train"), CATALOG, None, 1040.0) == []
    assert verdict(core.verdicts).verdict == "hold" and "starting" in verdict(core.verdicts).reason
    # more demand: still nothing within the cooldown, then one action
    assert core.step(fleet, waiting("train", "gang"), CATALOG, None, 1020.0) == []
    [call2] = core.step(fleet, waiting("train", "gang"), CATALOG, None, 1031.0)
    assert call2.action.id != call.action.id and call2.action.count == 2  # 4 wanted, 1 starting, max 6 - 4
    sec = core.section("d", "")
    assert [a.id for a in sec.ledger] == [call.action.id, call2.action.id] and sec.term == 5


def test_a_failed_action_is_counted_and_tried_again_under_its_id_after_the_cooldown():
    core = ScalingCore(policy())
    core.lead(1, [], -1000.0)
    [c1] = core.step(static(), waiting("train"), CATALOG, None, 0.0)
    core.result(c1.action.id, "exit status 3: quota exceeded", 1.0)
    assert core.failures == 1 and core.ledger[-1].state == "failed" and "quota" in core.ledger[-1].error
    assert core.outcomes[(H100, "up", "failed")] == 1
    assert core.step(static(), waiting("train"), CATALOG, None, 10.0) == []
    [c2] = core.step(static(), waiting("train"), CATALOG, None, 31.0)
    # tried again under the same id: a call that failed or hung may have started machines
    assert c2.action.id == c1.action.id and c2.action.tries == 2 and c2.action.state == "requested"
    assert [a.id for a in core.ledger] == [c1.action.id]


def test_scale_down_drains_first_then_removes():
    core = ScalingCore(policy(cooldown_s=0.0))
    core.lead(2, [], -1000.0)
    extra = node(10, started_by="1-1")
    fleet = static(busy=False) + [extra]
    assert core.step(fleet, [], CATALOG, None, 0.0) == []  # idle timer starts
    assert core.step(fleet, [], CATALOG, None, 61.0) == []  # chosen: draining, nothing removed yet
    assert "n10" in core.draining
    held = static(busy=False) + [node(10, started_by="1-1", under=2)]  # data not at R yet
    assert core.step(held, [], CATALOG, None, 62.0) == []
    [call] = core.step(fleet, [], CATALOG, None, 63.0)
    assert call.action.op == "down" and call.action.nodes == ["n10"]
    core.result(call.action.id, "", 64.0)
    assert "n10" not in core.draining


def test_waiting_work_cancels_a_drain():
    core = ScalingCore(policy(cooldown_s=0.0))
    core.lead(2, [], -1000.0)
    fleet = static(busy=False) + [node(10, started_by="1-1")]
    core.step(fleet, [], CATALOG, None, 0.0)
    core.step(fleet, [], CATALOG, None, 61.0)
    assert "n10" in core.draining
    core.step(fleet, waiting("train"), CATALOG, None, 62.0)
    assert "n10" not in core.draining


@pytest.mark.parametrize("carried_out", [True, False])
def test_failover_neither_repeats_nor_loses_an_action(carried_out):
    old = ScalingCore(policy())
    old.lead(3, [], -1000.0)
    [call] = old.step(static(), waiting("gang"), CATALOG, None, 100.0)
    published = old.section("d", "")  # the leader dies with the action requested
    new = ScalingCore(policy())
    new.lead(4, [("old", published), ("n1", ScalingSection())], 100.5, leaders_by_term={3: "old"})
    assert [a.id for a in new.ledger] == [call.action.id] and new.last_action_at == 100.0
    [ask] = new.step(static(), waiting("gang"), CATALOG, None, 101.0)
    assert isinstance(ask, ProviderList)
    assert new.step(static(), waiting("gang"), CATALOG, None, 101.5) == []  # listing: nothing else meanwhile
    listing = [(call.action.id, f"x{i}", "starting", H100) for i in range(call.action.count)] if carried_out else []
    assert new.listed(listing, "", 102.0) == []  # the re-issue, if any, comes from the next step
    if carried_out:
        assert new.ledger[0].state == "done"
        assert new.step(static(), waiting("gang"), CATALOG, None, 102.5) == []
    else:  # issued again under the same id: the provider does nothing twice for one id
        [again] = new.step(static(), waiting("gang"), CATALOG, None, 102.5)
        assert again.action.id == call.action.id and again.action.tries == 2
        new.result(call.action.id, "", 103.0)
    # either way the nodes asked for count as starting: no second scale-up for the same demand
    assert new.step(static(), waiting("gang"), CATALOG, None, 200.0) == []
    assert verdict(new.verdicts).verdict == "hold"


def test_a_node_not_leading_acts_on_nothing():
    core = ScalingCore(policy())
    assert core.step(static(1), [], CATALOG, None, 0.0) == []
    core.lead(1, [], -1000.0)
    assert core.step(static(1), [], CATALOG, None, 0.0)
    core.resign()
    assert core.step(static(1), [], CATALOG, None, 1000.0) == []
    # its ledger keeps travelling under the term it led, for the next leader to adopt (and its cooldown)
    sec = core.section("d", "")
    assert sec.term == 1 and len(sec.ledger) == 1 and sec.last_action_at == 0.0 and sec.verdicts == []
    nxt = ScalingCore(policy())
    nxt.lead(2, [("a", sec)], 10.0, leaders_by_term={1: "a"})
    assert [a.id for a in nxt.ledger] == [a.id for a in sec.ledger]


def test_a_removal_issued_again_only_for_nodes_that_may_still_go():
    old = ScalingCore(policy(cooldown_s=0.0))
    old.lead(3, [], -1000.0)
    fleet = static(busy=False) + idle_extra(10, 11)
    old.step(fleet, [], CATALOG, None, 0.0)
    assert old.step(fleet, [], CATALOG, None, 61.0) == []  # idle: chosen, drained
    [call] = old.step(fleet, [], CATALOG, None, 61.5)  # then removed
    assert call.action.op == "down" and sorted(call.action.nodes) == ["n10", "n11"]
    new = ScalingCore(policy(cooldown_s=0.0))
    new.lead(4, [("old", old.section("d", ""))], 62.0, leaders_by_term={3: "old"})
    assert new.draining.keys() >= {"n10", "n11"}  # adopted before the new term's first plan
    new.step(fleet, [], CATALOG, None, 62.0)
    new.listed([], "", 62.5)
    busy = static(busy=False) + [FleetNode(node_id="n10", node_class=H100, gpus=1, gpu_used=1.0, started_by="1-1",
                                           running=(("train", 1.0),))] + idle_extra(11)
    [again] = new.step(busy, [], CATALOG, None, 63.0)
    assert again.action.id == call.action.id and again.action.nodes == ["n11"]  # n10 took work: drained anew
    assert "n10" in new.draining


def test_nodes_that_never_join_count_until_the_provider_no_longer_lists_them():
    core = ScalingCore(policy(max_step=2))
    core.lead(1, [], -1000.0)
    [c] = core.step(static(1), [], CATALOG, None, 0.0)
    core.result(c.action.id, "", 1.0)
    assert core.step(static(1), [], CATALOG, None, 500.0) == []  # 2 starting: nothing more
    [ask] = core.step(static(1), [], CATALOG, None, 700.0)  # past the boot grace: ask the provider
    assert isinstance(ask, ProviderList)
    core.listed([(c.action.id, "ghost0", "running", H100), (c.action.id, "ghost1", "starting", H100)], "", 701.0)
    assert core.step(static(1), [], CATALOG, None, 702.0) == []
    v = verdict(core.verdicts)
    assert v.verdict == "hold" and "never joined" in v.reason  # still counted: no machine started without end
    [ask] = core.step(static(1), [], CATALOG, None, 1400.0)
    core.listed([(c.action.id, "ghost0", "stopped", H100)], "", 1401.0)  # gone: no longer counted
    [more] = core.step(static(1), [], CATALOG, None, 1402.0)
    assert more.action.op == "up" and more.action.count == 2


def test_a_late_started_by_claim_holds_nothing():
    core = ScalingCore(policy(cooldown_s=0.0))
    core.lead(1, [], -1000.0)
    [c] = core.step(static(1), [], CATALOG, None, 0.0)
    core.result(c.action.id, "", 1.0)
    liar = FleetNode(node_id="evil", node_class="cpu", started_by=c.action.id)
    fleet = static(1) + [FleetNode(node_id=f"j{i}", node_class=H100, started_by=c.action.id, gpus=1)
                         for i in range(2)] + [liar]
    core.step(fleet, [], CATALOG, None, 5000.0)
    assert "joined as another class" not in verdict(core.verdicts).reason


def test_a_waiting_one_off_run_is_demand_for_its_template():
    run = PlanPending(template="train (run r1)", of="train", reason="no capacity", wait_s=30.0)
    v = verdict(evaluate_scaling(policy(), static(), [run], CATALOG, None, 0.0))
    assert (v.verdict, v.count, v.queued) == ("up", 1, 1)


def test_nodes_that_join_as_another_class_hold_their_class():
    core = ScalingCore(policy())
    core.lead(1, [], -1000.0)
    [c] = core.step(static(1), [], CATALOG, None, 0.0)
    core.result(c.action.id, "", 1.0)
    wrong = static(1) + [FleetNode(node_id=f"x{i}", node_class="cpu", started_by=c.action.id) for i in range(2)]
    assert core.step(wrong, [], CATALOG, None, 100.0) == []
    v = verdict(core.verdicts)
    assert v.verdict == "hold" and "joined as another class" in v.reason


def test_a_catalog_template_counts_the_instances_it_still_wants():
    many = catalog_from_text('''
[[job]]
name = "sp"
kind = "selfplay"
config = "c1"
argv = ["true"]
max_concurrency = 4
[job.resources]
num_gpus = 1
vram_gib = 8
''', source="test", base_dir=".")
    fleet = [node(i, voter=True, running=[("sp", 5.0)] if i == 0 else [("x", 5.0)]) for i in range(3)]
    v = verdict(evaluate_scaling(policy(), fleet, waiting("sp"), many, None, 0.0))
    assert (v.verdict, v.count) == ("up", 3)  # 4 wanted, 1 running: 3 nodes of one GPU each
    fleet = [node(i, voter=True, running=[("sp", 5.0)] if i == 0 else []) for i in range(3)]
    v = verdict(evaluate_scaling(policy(), fleet, waiting("sp"), many, None, 0.0))
    assert (v.verdict, v.count) == ("up", 1)  # two of the three still wanted fit the two idle GPUs


def test_a_new_leader_acts_only_once_its_view_settled():
    core = ScalingCore(policy(cooldown_s=300.0))
    core.lead(7, [], 1000.0)
    assert core.step(static(1), [], CATALOG, None, 1000.0) == []  # members may still be joining its view
    assert verdict(core.verdicts).verdict == "up"
    assert core.next_deadline(1000.0) == 1030.0  # SETTLE_S (the cooldown is longer)
    [call] = core.step(static(1), [], CATALOG, None, 1030.0)
    assert call.action.count == 2


def test_a_member_that_never_led_cannot_plant_actions():
    forged = ScalingSection(term=9, last_action_at=50.0, ledger=[ScalingAction(
        id="9-1-1", op="down", node_class=H100, term=9, at=50.0, count=2, nodes=["n0", "n1"])], draining=["n0"])
    core = ScalingCore(policy())
    core.lead(10, [("mallory", forged)], 100.0, leaders_by_term={9: "n2"})
    assert core.ledger == [] and core.draining == {} and core.last_action_at < 0
    # even from the leader of its term, an action beyond the policy is dropped, and a drained voter stays
    huge = ScalingSection(term=9, ledger=[ScalingAction(id="9-2-1", op="up", node_class=H100, term=9, at=50.0,
                                                        count=500)], draining=["n0"])
    core = ScalingCore(policy(cooldown_s=0.0))
    core.lead(10, [("n2", huge)], 100.0, leaders_by_term={9: "n2"})
    assert core.ledger == []
    assert core.step(static(busy=False), [], CATALOG, None, 200.0) == [ProviderList()]  # a failover: list first
    core.listed([], "", 200.5)
    assert core.step(static(busy=False), [], CATALOG, None, 201.0) == []  # n0 is a voter: never removed


def test_a_providers_error_with_control_characters_keeps_the_section_valid():
    """A provider's message goes into the replicated ledger on one line: a newline in it would make the leader's
    whole scaling section fail its own wire type (and the ledger would travel no more)."""
    import msgspec

    core = ScalingCore(policy())
    core.lead(1, [], -1000.0)
    [c] = core.step(static(), waiting("train"), CATALOG, None, 0.0)
    core.result(c.action.id, "quota exceeded\n{\"code\": 429}\x1b[0m\t" + "x" * 2000, 1.0)
    sec = core.section("d", "")
    back = msgspec.json.decode(msgspec.json.encode(sec), type=ScalingSection)  # the wire type's own checks
    assert back.ledger[0].state == "failed" and back.ledger[0].error.startswith("quota exceeded {")
    assert len(back.ledger[0].error) <= 400


def test_a_predecessors_section_that_arrives_during_the_settle_is_merged():
    """The new leader first holds an older section of its predecessor; the newer one, with the action it
    requested last, arrives 9 s later, within the settle: merged, listed, and not issued a second time."""
    old = ScalingCore(policy())
    old.lead(3, [], -1000.0)
    early = old.section("d", "")  # before its action
    [call] = old.step(static(), waiting("gang"), CATALOG, None, 100.0)
    late = old.section("d", "")
    new = ScalingCore(policy())
    lbt = {3: "old"}
    new.lead(4, [("old", early)], 101.0, leaders_by_term=lbt)
    assert new.step(static(), waiting("gang"), CATALOG, None, 101.0) == [ProviderList()]  # a failover: list
    new.lead(4, [("old", late)], 110.0, leaders_by_term=lbt)  # the newer section, within the settle
    assert [a.id for a in new.ledger] == [call.action.id] and new.last_action_at == 100.0
    new.listed([], "", 110.5)  # the answer to the list asked before the merge: asked again
    assert new.step(static(), waiting("gang"), CATALOG, None, 111.0) == [ProviderList()]
    new.listed([(call.action.id, f"x{i}", "starting", H100) for i in range(call.action.count)], "", 112.0)
    assert new.ledger[0].state == "done"
    for t in (131.0, 140.0, 200.0):  # past the settle and the cooldown: the nodes count as starting
        assert new.step(static(), waiting("gang"), CATALOG, None, t) == []


def test_nodes_started_under_an_id_no_ledger_names_count_as_starting():
    """A leader that died between its provider call and its ledger spreading: the next one lists the provider
    (a predecessor's section was seen) and counts the nodes under the unknown id as starting, until they join."""
    old = ScalingCore(policy())
    old.lead(3, [], -1000.0)
    stale = old.section("d", "")  # its last section that spread: no action yet
    new = ScalingCore(policy(max_step=4))
    new.lead(4, [("old", stale)], 200.0, leaders_by_term={3: "old"})
    assert new.step(static(), waiting("gang"), CATALOG, None, 200.0) == [ProviderList()]
    new.listed([("3-1-150000", "", "starting", H100)] * 3, "", 200.5)
    assert new.step(static(), waiting("gang"), CATALOG, None, 240.0) == []  # 3 starting: the gang's 3 covered
    assert verdict(new.verdicts).verdict == "hold"
    joined = static() + [node(10 + i, started_by="3-1-150000", running=[("gang", 5.0)]) for i in range(3)]
    assert new.step(joined, [], CATALOG, None, 260.0) == []  # joined: no longer starting, no demand left


def test_a_ledger_under_an_unknown_term_holds_every_action_for_a_bounded_time():
    old = ScalingCore(policy())
    old.lead(3, [], -1000.0)
    old.step(static(), waiting("gang"), CATALOG, None, 100.0)
    sec = old.section("d", "")
    new = ScalingCore(policy())
    new.lead(5, [("x", sec)], 200.0, leaders_by_term={4: "y"})  # term 3's leader unknown here
    assert new.ledger == []  # not adopted (anyone could have planted it) ...
    assert new.step(static(1), waiting("gang"), CATALOG, None, 200.0) == [ProviderList()]  # a failover: list
    new.listed([], "", 200.5)
    for t in (231.0, 500.0):  # ... and nothing done while it may be the dead leader's
        new.lead(5, [("x", sec)], t, leaders_by_term={4: "y"})
        assert new.step(static(1), waiting("gang"), CATALOG, None, t) == []
        assert "whose leader this node does not know" in verdict(new.verdicts).reason
    assert new.next_deadline(500.0) == 800.0
    new.lead(5, [("x", sec)], 801.0, leaders_by_term={4: "y"})
    [call] = new.step(static(1), waiting("gang"), CATALOG, None, 801.0)  # bounded: it acts again
    assert call.action.op == "up"


def test_a_failing_list_is_asked_again_with_a_backoff_not_in_a_loop():
    old = ScalingCore(policy())
    old.lead(3, [], -1000.0)
    old.step(static(), waiting("gang"), CATALOG, None, 100.0)
    new = ScalingCore(policy(cooldown_s=60.0))
    new.lead(4, [("old", old.section("d", ""))], 200.0, leaders_by_term={3: "old"})
    asked = []
    t = 200.0
    while t < 400.0:
        effects = new.step(static(), [], CATALOG, None, t)
        if effects == [ProviderList()]:
            asked.append(t)
            new.listed(None, "exit status 1", t)
        t += 0.5
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert gaps[:4] == [5.0, 10.0, 20.0, 40.0] and max(gaps) == 60.0  # doubling up to the cooldown
    assert new.failures == len(asked) and new.next_deadline(t) <= asked[-1] + 60.0


def test_a_removal_is_done_when_its_nodes_are_listed_stopped_under_the_request_that_started_them():
    old = ScalingCore(policy(cooldown_s=0.0))
    old.lead(3, [], -1000.0)
    fleet = static(busy=False) + idle_extra(10)
    old.step(fleet, [], CATALOG, None, 0.0)
    old.step(fleet, [], CATALOG, None, 61.0)
    [call] = old.step(fleet, [], CATALOG, None, 61.5)
    new = ScalingCore(policy(cooldown_s=0.0))
    new.lead(4, [("old", old.section("d", ""))], 62.0, leaders_by_term={3: "old"})
    assert new.step(static(busy=False), [], CATALOG, None, 62.0) == [ProviderList()]
    new.listed([("1-1", "n10", "stopped", H100)], "", 62.5)  # listed under the scale-up that started it
    assert new.ledger[-1].id == call.action.id and new.ledger[-1].state == "done"
    assert new.step(static(busy=False), [], CATALOG, None, 63.0) == []  # not issued again


def test_a_merged_ledger_longer_than_the_ledger_does_not_list_the_provider_at_every_step():
    """The predecessor's 16 actions and this leader's own: the oldest fall out of the 16 kept. Merging the same
    section again must not bring them back (and ask the provider again) at every step: each version of a
    section is merged once."""
    old = ScalingCore(policy())
    old.lead(4, [], -1000.0)
    old.ledger = [ScalingAction(id=f"4-{i}-1", op="up", node_class=H100, term=4, at=float(i), count=1, state="done",
                                updated=float(i)) for i in range(16)]
    sec = old.section("d", "")
    new = ScalingCore(policy(cooldown_s=0.0))
    lbt = {4: "w"}
    new.lead(6, [("w", sec)], 1000.0, leaders_by_term=lbt)
    assert new.step(static(1), [], CATALOG, None, 1000.0) == [ProviderList()]
    new.listed([], "", 1000.5)
    new.lead(6, [("w", sec)], 1031.0, leaders_by_term=lbt)
    [up] = new.step(static(1), [], CATALOG, None, 1031.0)  # below min_nodes: its own action
    assert up.action.id.startswith("6-")
    for t in (1032.0, 1033.0, 1034.0):
        new.lead(6, [("w", sec)], t, leaders_by_term=lbt)
        assert not any(isinstance(e, ProviderList) for e in new.step(static(1), [], CATALOG, None, t))
    assert up.action.id in {a.id for a in new.ledger}


def test_a_list_that_fails_after_a_late_merge_is_asked_again_and_the_action_reconciled():
    old = ScalingCore(policy())
    old.lead(3, [], -1000.0)
    [call] = old.step(static(), waiting("gang"), CATALOG, None, 100.0)
    late = old.section("d", "")
    new = ScalingCore(policy())
    new.check_due = True  # a never-joined check was due: its list goes out first
    new.lead(4, [], 101.0, leaders_by_term={3: "old"})
    assert new.step(static(), [], CATALOG, None, 101.0) == [ProviderList()]
    new.lead(4, [("old", late)], 110.0, leaders_by_term={3: "old"})  # merged while that list is under way
    new.listed(None, "exit status 1", 111.0)
    assert new.step(static(), [], CATALOG, None, 112.0) == []  # the backoff
    assert new.step(static(), [], CATALOG, None, 116.0) == [ProviderList()]  # asked again
    new.listed([(call.action.id, f"x{i}", "running", H100) for i in range(call.action.count)], "", 117.0)
    assert [(a.id, a.state) for a in new.ledger] == [(call.action.id, "done")]


def test_nodes_under_an_unknown_id_keep_counting_when_a_later_list_fails():
    old = ScalingCore(policy())
    old.lead(3, [], -1000.0)
    stale = old.section("d", "")
    new = ScalingCore(policy(max_step=4))
    new.lead(4, [("old", stale)], 200.0, leaders_by_term={3: "old"})
    new.step(static(), waiting("gang"), CATALOG, None, 200.0)
    new.listed([("3-1-150000", "", "starting", H100)] * 3, "", 200.5)
    assert new.step(static(), waiting("gang"), CATALOG, None, 240.0) == []
    [ask] = new.step(static(), waiting("gang"), CATALOG, None, 801.0)  # the check after the boot grace
    assert isinstance(ask, ProviderList)
    new.listed(None, "timeout", 802.0)
    for t in (803.0, 820.0):  # still counted (the newest listing shows them): no duplicate scale-up
        effects = new.step(static(), waiting("gang"), CATALOG, None, t)
        assert not any(isinstance(e, ProviderCall) for e in effects)
