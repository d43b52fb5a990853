"""Scaling counts from the provider, not from a member's word (issue 37, item 5), with plain values: a member counts
toward a class only when the provider's own answers name it (its scale_up answer, its list()) or a certificate
gives it the class; fakes claiming the class hold off nothing, and cannot grow the count past what the provider
started."""

from __future__ import annotations

from test_scaling import CATALOG, H100, policy, verdict, waiting

from p2pnode.scheduler._scaling import ClassPolicy, FleetNode, ProviderCall, ProviderList, ScalingCore, counted_fleet
from p2pnode.snapshot import ScalingAction


def member(nid: str, cls: str = H100, started_by: str = "", voter: bool = False, busy: bool = False) -> FleetNode:
    return FleetNode(node_id=nid, node_class=cls, gpus=1, gpu_used=1.0 if busy else 0.0, started_by=started_by,
                     voter=voter, running=(("train", 5.0),) if busy else ())


def voters() -> list[FleetNode]:
    """Three hand-started voters without a class of their own (``cpu``; not certified)."""
    return [member(f"v{i}", cls="cpu", voter=True, busy=True) for i in range(3)]


def fakes(k: int = 2, **kw) -> list[FleetNode]:
    return [member(f"fake{i}", **kw) for i in range(k)]


def up(rid: str, count: int, state: str = "done") -> ScalingAction:
    return ScalingAction(id=rid, op="up", node_class=H100, term=1, at=0.0, count=count, state=state)


def test_a_claimed_class_counts_for_nothing():
    out = counted_fleet(voters() + fakes(), {}, None, [], {})
    assert [n.node_class for n in out] == ["", "", "", "", ""]
    assert [n.reported_class for n in out] == ["cpu", "cpu", "cpu", H100, H100]  # kept for predictions
    certified = counted_fleet(voters(), {}, None, [], {"v0": H100})
    assert [n.node_class for n in certified] == [H100, "", ""]


def test_the_providers_answer_names_the_nodes_that_count():
    named = {"p0": ("1-1", "running", H100), "p1": ("1-1", "starting", ""), "gone": ("1-1", "stopped", H100)}
    fleet = [member("p0", cls="cpu"), member("p1"), member("gone"), *fakes(started_by="1-1")]
    out = {n.node_id: n for n in counted_fleet(fleet, named, None, [up("1-1", 3)], {})}
    assert out["p0"].node_class == H100 and out["p0"].started_by == "1-1"  # the provider's class, not the claim
    assert out["p1"].node_class == H100  # no class in the answer: the action's
    assert out["gone"].node_class == "" and out["gone"].started_by == ""  # stopped: no longer counts
    # three started, two named: one more member may count by its started_by claim (a provider that names late)
    assert sorted(n for n, x in out.items() if x.node_class and n.startswith("fake")) == ["fake0"]
    assert out["fake1"].node_class == "" and out["fake1"].started_by == ""


def test_claims_of_a_listed_request_count_only_up_to_its_unnamed_nodes():
    listing = {"9-1": [("", "running", H100), ("q1", "running", H100)]}
    fleet = fakes(3, started_by="9-1") + [member("q1")]
    out = {n.node_id: n.node_class for n in counted_fleet(fleet, {"q1": ("9-1", "running", H100)}, listing, [], {})}
    assert out == {"fake0": H100, "fake1": "", "fake2": "", "q1": H100}


def test_fakes_claiming_the_class_do_not_hold_off_min_nodes():
    core = ScalingCore(policy(cooldown_s=0.0, max_step=2, classes={H100: ClassPolicy(2, 4)}))
    core.lead(1, [], -1000.0)
    fleet = voters() + fakes()
    assert core.step(fleet, [], CATALOG, None, 0.0) == []  # trusting the fleet (the core alone): at min_nodes
    assert verdict(core.verdicts).verdict == "hold"
    assert core.step(fleet, [], CATALOG, None, 1.0, certified_class={}) == [ProviderList()]  # each term: list first
    core.listed([], "", 1.0)
    [call] = core.step(fleet, [], CATALOG, None, 1.0, certified_class={})
    assert isinstance(call, ProviderCall) and call.action.op == "up" and call.action.count == 2
    # the provider answers with the node ids it started: once they join they count, the fakes still do not
    rid = call.action.id
    core.result(rid, "", 2.0, [(rid, "p0", "starting", H100), (rid, "p1", "starting", H100)])
    joined = fleet + [member("p0", started_by=rid), member("p1", started_by=rid)]
    assert core.step(joined, [], CATALOG, None, 3.0, certified_class={}) == []
    v = verdict(core.verdicts)
    assert v.verdict == "hold" and v.nodes_now == 2, v


def test_fakes_claiming_free_gpus_of_the_class_do_not_absorb_waiting_work():
    core = ScalingCore(policy(cooldown_s=0.0, classes={H100: ClassPolicy(0, 4)}))
    core.lead(1, [], -1000.0)
    fleet = voters() + fakes()  # idle, one free "H100" each
    assert core.step(fleet, waiting("train"), CATALOG, None, 0.0) == []  # trusted: 2 GPUs free hold it
    core.listed([], "", 0.5)
    [call] = core.step(fleet, waiting("train"), CATALOG, None, 1.0, certified_class={})
    assert call.action.op == "up" and call.action.count == 1


def test_a_fake_claiming_a_recent_scale_up_with_another_class_holds_nothing():
    core = ScalingCore(policy(cooldown_s=0.0, max_step=2, classes={H100: ClassPolicy(2, 4)}))
    core.lead(1, [], -1000.0)
    core.listed([], "", 0.0)
    [call] = core.step(voters(), [], CATALOG, None, 0.0, certified_class={})
    rid = call.action.id
    core.result(rid, "", 1.0, [(rid, "p0", "starting", H100), (rid, "p1", "starting", H100)])
    liar = member("evil", cls="cpu", started_by=rid)
    core.step(voters() + [liar], [], CATALOG, None, 2.0, certified_class={})
    assert "joined as another class" not in verdict(core.verdicts).reason
    wrong = voters() + [member("p0", cls="cpu", started_by=rid)]  # a node the provider named, as another class
    core.step(wrong, [], CATALOG, None, 3.0, certified_class={})
    assert "joined as another class" in verdict(core.verdicts).reason


def test_a_listing_replaces_what_the_provider_named():
    core = ScalingCore(policy())
    core.result("x", "", 0.0, [("1-1", "p0", "running", H100)])
    assert core.named == {"p0": ("1-1", "running", H100)}
    core.listed([("1-1", "p1", "running", H100)], "", 1.0)
    assert core.named == {"p1": ("1-1", "running", H100)}
    core.result("y", "quota", 2.0, [("2-1", "p2", "running", H100)])  # a failed call names nothing
    assert "p2" not in core.named


def test_a_new_leader_lists_first_and_counts_what_the_provider_started_under_any_term():
    core = ScalingCore(policy(cooldown_s=0.0, max_step=2, classes={H100: ClassPolicy(2, 4)}))
    core.lead(7, [], -1000.0)
    fleet = voters() + [member("p0", started_by="3-1-5"), member("p1", started_by="3-1-5")] + fakes()
    assert core.step(fleet, [], CATALOG, None, 0.0, certified_class={}) == [ProviderList()]
    assert core.step(fleet, [], CATALOG, None, 0.5, certified_class={}) == []  # under way
    core.listed([("3-1-5", "p0", "running", H100), ("3-1-5", "p1", "running", H100)], "", 1.0)
    assert core.step(fleet, [], CATALOG, None, 2.0, certified_class={}) == []
    assert verdict(core.verdicts).nodes_now == 2  # the provider's two, not the fakes


def test_unbacked_class_and_started_by_claims_are_refused_and_counted_per_member():
    """Issue 37, attack 5: refused and counted, by reason and by member (``/status`` ``scaling``)."""
    refused: dict[str, tuple[str, str]] = {}
    fleet = voters() + fakes() + [member("grinder", cls="cpu", started_by="1-1"), member("box", cls="2xA100")]
    counted_fleet(fleet, {}, None, [], {}, classes={H100, "cpu"}, refused=refused)
    assert refused == {"v0": ("class_unbacked", "cpu"), "v1": ("class_unbacked", "cpu"),
                       "v2": ("class_unbacked", "cpu"), "fake0": ("class_unbacked", H100),
                       "fake1": ("class_unbacked", H100), "grinder": ("started_by_unbacked", "1-1")}
    # ("box" claims a class no [scaling.classes] names: nothing to refuse.) A backed member is never refused:
    refused.clear()
    counted_fleet(fakes(), {"fake0": ("1-1", "running", H100)}, None, [], {"fake1": H100}, classes={H100},
                  refused=refused)
    assert refused == {}

    core = ScalingCore(policy(cooldown_s=0.0, max_step=2, classes={H100: ClassPolicy(2, 4)}))
    core.lead(1, [], -1000.0)
    core.listed([], "", 0.0)
    for t in (1.0, 2.0):
        core.step(voters() + fakes(), [], CATALOG, None, t, certified_class={})
    assert core.claims_refused == {"class_unbacked": 4}  # two fakes, two steps (cpu is no class here)
    view = core.refused_view()
    assert [(e["member"], e["reason"], e["claimed"], e["count"], e["first_at"], e["last_at"]) for e in view] == [
        ("fake1", "class_unbacked", H100, 2, 1.0, 2.0), ("fake0", "class_unbacked", H100, 2, 1.0, 2.0)]
    many = [member(f"f{i:03d}") for i in range(200)]
    core.step(voters() + many, [], CATALOG, None, 3.0, certified_class={})
    assert len(core.refused_view()) == 64 and core.refused_view()[0]["member"] == "f199"  # bounded, newest kept
    assert core.claims_refused["class_unbacked"] == 204


def test_an_unnamed_slot_goes_to_no_member_seen_before_the_request_then_by_first_sight():
    """A provider that names no node: its request's slot is not the lowest node id's. A fake present before the
    leader issued the request (a ground low id included) cannot take it; of those seen after, the first seen."""
    core = ScalingCore(policy(cooldown_s=0.0, max_step=1, classes={H100: ClassPolicy(1, 4)}))
    core.lead(1, [], -1000.0)
    core.listed([], "", 0.0)
    fleet = voters() + [member("0000", cls="cpu")]  # a fake, there all along, with a ground low node id
    [call] = core.step(fleet, [], CATALOG, None, 1.0, certified_class={})
    rid = call.action.id
    core.result(rid, "", 2.0, [(rid, "", "starting", H100)])  # started, not named
    real, late = member("zzreal", started_by=rid), member("00late", started_by=rid)
    grinder = member("0000", cls="cpu", started_by=rid)  # now claims the request
    core.step([*voters(), grinder, real], [], CATALOG, None, 3.0, certified_class={})
    assert verdict(core.verdicts).nodes_now == 1
    assert {e["member"]: e["reason"] for e in core.refused_view()}["0000"] == "started_by_unbacked"
    core.step([*voters(), grinder, real, late], [], CATALOG, None, 4.0, certified_class={})  # seen after the real
    assert core.refused_view()[0]["member"] in ("0000", "00late")
    assert {e["member"] for e in core.refused_view() if e["last_at"] == 4.0} == {"0000", "00late"}
    assert verdict(core.verdicts).nodes_now == 1
