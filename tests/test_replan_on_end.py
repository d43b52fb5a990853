"""The leader re-plans when a member's job ends (issue 38, job churn), in virtual time: a member whose offer rises
since the step before (its job ended and its share is offered at once) brings the next plan forward to ``min_gap_s``
after the last one, not to the end of ``interval_s``; a flood of ends brings at most one plan per ``min_gap_s``.
No process, no socket, no clock: ``now`` is a number, and every wait is read from ``next_deadline()``. The plan
then reaches the first members it gives work at once (:class:`p2pnode.jobs._leading.LeaderRole` over a fake
context), not at their next gossip round."""

from __future__ import annotations

import pytest
from helpers import FakeContext
from test_job_core import core, drive, inputs, lead, member, of

from p2pnode.config import Config
from p2pnode.jobs._leading import PLAN_PUSH_NODES, LeaderRole
from p2pnode.node import PublishPlan
from p2pnode.snapshot import JobReport

INTERVAL_S = 300.0  # the cadence never plans within the test: every plan after the first is brought forward
MIN_GAP_S = 1.0


def _running(pub: PublishPlan, node: str) -> list[JobReport]:
    return [JobReport(job_id=a.job_id, template=a.template, gpus=list(a.gpus), gpu_fraction=a.gpu_fraction,
                      vram_gib=a.vram_gib, term=a.term) for a in pub.section.assignments if a.node == node]


def test_a_members_job_ending_brings_the_next_plan_within_the_least_gap():
    c = core("a", settle_s=0.0, interval_s=INTERVAL_S, min_gap_s=MIN_GAP_S)
    me = member("a", offer=0)
    (first,) = of(drive(c, inputs(lead("a"), [me, member("b", offer=4)]), 0.0), PublishPlan)
    running = _running(first, "b")
    assert len(running) == 4
    # b started the four (its offer spent): nothing appeared, so nothing is planned before the cadence.
    assert not of(drive(c, inputs(lead("a"), [me, member("b", running=running, offer=0)]), 2.0), PublishPlan)
    assert c.next_deadline() > 2.0 + MIN_GAP_S
    # One of b's jobs ended at 10 s: b lists three and offers its GPU again (an offer below the last plan's 4).
    left = running[1:]
    ended = inputs(lead("a"), [me, member("b", running=left, offer=1)])
    (second,) = of(drive(c, ended, 10.0), PublishPlan)
    new = [a for a in second.section.assignments if a.job_id not in {r.job_id for r in left}]
    assert [(a.node, a.gpus) for a in new] == [("b", running[0].gpus)]  # the freed GPU, in the same step


def test_a_flood_of_ends_brings_at_most_one_plan_per_least_gap():
    c = core("a", settle_s=0.0, interval_s=INTERVAL_S, min_gap_s=MIN_GAP_S)
    me = member("a", offer=0)
    (first,) = of(drive(c, inputs(lead("a"), [me, member("b", offer=4)]), 0.0), PublishPlan)
    running = _running(first, "b")
    drive(c, inputs(lead("a"), [me, member("b", running=running, offer=0)]), 0.5)
    (second,) = of(drive(c, inputs(lead("a"), [me, member("b", running=running[1:], offer=1)]), 10.0), PublishPlan)
    # Its replacement started (offer spent), then two more ended 0.2 s and 0.4 s after the plan: no plan yet ...
    drive(c, inputs(lead("a"), [me, member("b", running=running[1:], offer=0)]), 10.1)
    for now, k in ((10.2, 2), (10.4, 3)):
        assert not of(drive(c, inputs(lead("a"), [me, member("b", running=running[k:], offer=k - 1)]), now),
                      PublishPlan)
    # ... until the least gap after the last one, where one plan takes both.
    assert c.next_deadline() == pytest.approx(10.0 + MIN_GAP_S)
    (third,) = of(drive(c, inputs(lead("a"), [me, member("b", running=running[3:], offer=2)]), 11.0), PublishPlan)
    before = {a.job_id for a in second.section.assignments}
    assert sum(1 for a in third.section.assignments if a.job_id not in before) == 2  # (the first replacement is
    assert sum(1 for a in third.section.assignments if a.node == "b") == 4  # still held: its start not heard yet)


def test_an_offer_that_stays_or_falls_brings_no_plan():
    c = core("a", settle_s=0.0, interval_s=INTERVAL_S, min_gap_s=MIN_GAP_S)
    me = member("a", offer=0)
    (first,) = of(drive(c, inputs(lead("a"), [me, member("b", offer=4)]), 0.0), PublishPlan)
    running = _running(first, "b")
    for now, offer in ((1.0, 2), (2.0, 0), (3.0, 0)):  # the plan's jobs start: the offer only falls
        assert not of(drive(c, inputs(lead("a"), [me, member("b", running=running, offer=offer)]), now),
                      PublishPlan)
    assert c.next_deadline() == pytest.approx(INTERVAL_S)


def test_an_offer_flapping_brings_one_early_plan_not_one_per_least_gap():
    """Review of issue 39: a member whose offer flaps 1, 0, 1, 0 (a controller dithering at a rounding edge) brought
    a plan every ``min_gap_s``: each 0 -> 1 was a rise over the step before. Its 1 was seen before the last plan:
    no rise (one early plan in all), while an offer above it (a job ending) still is news."""
    c = core("a", settle_s=0.0, interval_s=INTERVAL_S, min_gap_s=MIN_GAP_S)
    plans, k, now = [], 0, 0.0
    while now < 60.0:  # one step each 0.5 s
        inp = inputs(lead("a"), [member("a", offer=0), member("b", offer=k % 2)])
        plans += [now] * len(of(drive(c, inp, now), PublishPlan))
        now, k = now + 0.5, k + 1
    assert plans == [0.0, 1.0]  # the first plan, and the one the first 0 -> 1 brought forward (60 before the fix)
    assert c.next_deadline() >= INTERVAL_S  # the cadence alone
    assert of(drive(c, inputs(lead("a"), [member("a", offer=0), member("b", offer=2)]), 60.0), PublishPlan)


# -- the plan reaches the members it gives work without waiting for a gossip round ----------------------------------
def _leader_role(nodes: int):
    ctx = FakeContext(Config())
    me = ctx.node_id
    c = core(me, settle_s=0.0, interval_s=INTERVAL_S, min_gap_s=MIN_GAP_S)
    others = [f"n{i}" for i in range(nodes)]
    ms = [member(me, offer=0), *(member(o, offer=1, gpus=1) for o in others)]
    (pub,) = of(drive(c, inputs(lead(me), ms), 0.0), PublishPlan)
    return ctx, LeaderRole(ctx, c, lambda: None, lambda effects: None), pub, others


def test_a_new_plan_is_pushed_at_once_to_the_first_members_it_gives_work():
    ctx, role, pub, others = _leader_role(2)
    role.published(pub.section)
    assert sorted(ctx.published_to) == others and ctx.published == 0  # both hear of it now, not in a round
    assert ctx.versions_pushed == 1  # one snapshot version for both (review of issue 39: one per node before)
    ctx, role, pub, others = _leader_role(PLAN_PUSH_NODES + 3)
    role.published(pub.section)
    given = list(dict.fromkeys(a.node for a in pub.section.assignments))
    assert len(given) == PLAN_PUSH_NODES + 3
    assert ctx.published_to == given[:PLAN_PUSH_NODES] and ctx.versions_pushed == 1  # bounded: the rest by gossip


def test_a_plan_that_gives_no_one_work_is_published_by_gossip_alone():
    ctx, role, pub, _ = _leader_role(0)
    role.published(pub.section)
    assert ctx.published_to == [] and ctx.published == 1 and ctx.versions_pushed == 0


def test_the_agent_publishes_once_and_gossips_with_each_node_it_pushes_to(tmp_path):
    """Review of issue 39: the push signed one snapshot version per node; now one version, then an exchange with
    each known, dialable node (none known: published within the gap, as any change)."""
    from types import SimpleNamespace

    from p2pnode.agent import Agent
    from p2pnode.config import load_config

    agent = Agent(load_config(None, overrides={"agent": {"data_dir": str(tmp_path / "d"), "bind": "127.0.0.1"},
                                               "discovery": {"mdns": False}}))
    entries = {"n1": SimpleNamespace(addr="10.0.0.1:8770"), "n2": SimpleNamespace(addr="10.0.0.2:8770")}
    agent.state = SimpleNamespace(get=entries.get)  # type: ignore[assignment]
    published, exchanged, soon = [], [], []
    agent.publish = lambda: published.append(1)  # type: ignore[method-assign]
    agent.publish_soon = lambda: soon.append(1)  # type: ignore[method-assign]
    agent.gossip.nursery = object()  # type: ignore[assignment]
    agent.gossip.exchange_soon = exchanged.append  # type: ignore[method-assign]
    agent.publish_to("n1", "gone", "n2")
    assert published == [1] and exchanged == ["10.0.0.1:8770", "10.0.0.2:8770"] and not soon
    agent.publish_to("gone")
    assert published == [1] and soon == [1]
    entries["n3"] = SimpleNamespace(addr="127.0.0.1:9003")  # loopback: refused by the dial policy, as before
    agent.publish_to("n3")
    assert published == [1] and soon == [1, 1]
