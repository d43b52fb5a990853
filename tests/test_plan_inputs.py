"""The facts each plan was computed from, kept by the leader and served with the plan (``GET /plan?inputs=1``,
:mod:`p2pnode.node._planinputs`; issue 38: pending reasons checked against the same plan version's facts)."""

from __future__ import annotations

import httpx
import msgspec
import pytest
import trio
from test_http import app_of, demo_agent
from test_job_core import core, drive, inputs, lead, member, of, report

from p2pnode.inputs import InputError, PlanQuery, decode_query
from p2pnode.node import PublishPlan
from p2pnode.node import _planinputs as planinputs
from p2pnode.node._planinputs import ROUNDS_KEPT, KeptInputs, PlanInputs, plan_inputs_doc
from p2pnode.node._plans import MemberPlanInput, Planner
from p2pnode.scheduler import GpuView, NodeView, parse_catalog


def test_each_served_plan_keeps_the_facts_it_was_computed_from():
    """The second plan's inputs are what the leader planned on then (b's reported jobs hold b's GPUs, offers as
    the members gave them), not what it knows later; an old plan's inputs go with the plan."""
    c = core("a", settle_s=0.0)
    kept = KeptInputs()

    def step(inp, now):
        before = c.my_plan
        effects = drive(c, inp, now)
        if c.my_plan is not before:
            kept.made(c.last_result, c.my_plan)  # as the leader role does when it publishes the plan
        return effects

    lsh = lead("a")
    assert of(step(inputs(lsh, [member("a"), member("b")]), 1.0), PublishPlan)
    first = c.my_plan
    b_jobs = [x for x in first.assignments if x.node == "b"]
    assert b_jobs
    ms = [member("a", offer=1), member("b", offer=2, running=[report(x.job_id, gpus=x.gpus) for x in b_jobs])]
    step(inputs(lsh, ms), 7.0)
    second = c.my_plan
    assert second.seq == first.seq + 1
    doc = kept.of(second)
    assert (doc.term, doc.seq, doc.digest) == (second.term, second.seq, second.digest)
    by = {m.node: m for m in doc.members}
    assert by["a"].offer == 1 and by["b"].offer == 2 and not by["b"].cordoned
    held = {g for x in b_jobs for g in x.gpus}
    assert {g.index for g in by["b"].gpus if g.committed_gib > 0} == held
    assert all(g.usable_gib == g.vram_gib == 80.0 for g in by["b"].gpus)  # the test views' ratio: 1.0
    assert {j.job_id for j in doc.running} >= {x.job_id for x in b_jobs}
    assert doc.members_total == 2 and doc.running_total == len(doc.running)
    first_doc = kept.of(first)
    assert not first_doc.running and {m.node: m.offer for m in first_doc.members} == {"a": 4, "b": 4}
    assert kept.of(msgspec.structs.replace(second, digest="0" * 32)) is None  # the same seq, another plan
    # JSON round trip: the document is typed and bounded
    assert msgspec.json.decode(msgspec.json.encode(doc), type=PlanInputs) == doc
    # kept as long as the plan is served: ROUNDS_KEPT plans
    now = 7.0
    for _ in range(ROUNDS_KEPT):
        now += 6.0
        step(inputs(lsh, ms), now)
    assert kept.of(first) is None and kept.of(second) is None
    assert kept.of(c.my_plan).seq == c.my_plan.seq


def test_a_cordoned_member_is_planned_and_served_with_no_offer():
    catalog = parse_catalog({"job": [{"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"],
                                      "max_concurrency": 8, "resources": {"num_gpus": 1, "vram_gib": 8}}]})
    members = [MemberPlanInput(n, NodeView(n, (GpuView(0, 24.0),), offer=2, vram_limit_ratio=0.8)) for n in "ab"]
    r = Planner(catalog).lead(1, members, None, {}, 1.0, 1.0, cordoned={"b", "gone"})
    assert r.cordoned == frozenset({"b"})
    doc = plan_inputs_doc(r)
    by = {m.node: m for m in doc.members}
    assert by["b"].cordoned and by["b"].offer == 0 and not by["a"].cordoned and by["a"].offer == 2
    assert by["a"].gpus[0].usable_gib == pytest.approx(19.2) and by["a"].tier == 3
    assert {a.node for a in r.section.assignments} == {"a"}


def test_the_inputs_document_is_bounded(monkeypatch):
    monkeypatch.setattr(planinputs, "MAX_INPUT_MEMBERS", 3)
    monkeypatch.setattr(planinputs, "MAX_INPUT_JOBS", 2)
    catalog = parse_catalog({"job": [{"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"],
                                      "max_concurrency": 64, "resources": {"num_gpus": 1, "vram_gib": 8}}]})
    members = [MemberPlanInput(f"n{i}", NodeView(f"n{i}", tuple(GpuView(g, 80.0) for g in range(2)), offer=2),
                               running=tuple(report(f"j{i}-{g}", gpus=(g,)) for g in range(2)))
               for i in range(5)]
    r = Planner(catalog).lead(1, members, None, {}, 1.0, 1.0)
    doc = plan_inputs_doc(r)
    assert [m.node for m in doc.members] == ["n0", "n1", "n2"] and doc.members_total == 5
    assert len(doc.running) == 2 and doc.running_total == 10
    assert all(g.committed_gib == 8.0 and g.fraction == 1.0 for m in doc.members for g in m.gpus)  # sums: all jobs


def test_the_inputs_flag_is_decoded_strictly():
    assert decode_query([("inputs", "1")], PlanQuery).inputs == 1
    assert decode_query([("inputs", "0")], PlanQuery).inputs == 0
    for bad in ("yes", "true", "false", "2", "01", "", "1 "):  # one spelling per value, as documented
        with pytest.raises(InputError):
            decode_query([("inputs", bad)], PlanQuery)


async def test_plan_route_serves_inputs_null_where_it_made_no_plan(tmp_path):
    a = demo_agent(tmp_path)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        got = (await c.get("/plan?inputs=1")).json()
        assert got["plan"] is None and got["inputs"] is None
        assert "inputs" not in (await c.get("/plan")).json()
        assert (await c.get("/plan?inputs=maybe")).status_code == 400
        # JSON only: asked with the msgpack document it is refused, not silently dropped
        refused = await c.get("/plan?format=msgpack&inputs=1")
        assert refused.status_code == 400 and "format=json only" in refused.json()["detail"]
    await trio.lowlevel.checkpoint()


async def test_repeated_inputs_requests_build_the_document_once_off_the_event_loop(tmp_path, monkeypatch):
    """Review of issue 38 (HIGH): each ``GET /plan?inputs=1`` built the document on the event loop (about 0.3 s at
    2,000 members x 8 GPUs and 16,000 jobs, probes/mem_inputs.py), so a client repeating it stalled the leader's
    gossip and probes for as long as it kept asking. Now a plan's document is built once, in a worker thread, and
    served from its bytes while the plan is served."""
    import threading

    a = demo_agent(tmp_path)
    catalog = parse_catalog({"job": [{"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"],
                                      "max_concurrency": 8, "resources": {"num_gpus": 1, "vram_gib": 8}}]})
    members = [MemberPlanInput(n, NodeView(n, (GpuView(0, 24.0), GpuView(1, 24.0)), offer=1),
                               running=(report(f"{n}-1", gpus=(1,)),)) for n in "ab"]
    r = Planner(catalog).lead(1, members, None, {}, 1.0, 1.0)
    role = a.jobs.leading
    role.core.my_plan = r.section
    role._inputs.made(r, r.section)  # as published() keeps it when the core made the plan

    async def whole_plan(wait_s: float = 3.0):
        return r.section

    monkeypatch.setattr(role, "whole_plan", whole_plan)
    built = []
    real = planinputs.plan_inputs_doc

    def counted(x):
        built.append(threading.get_ident())
        return real(x)

    monkeypatch.setattr(planinputs, "plan_inputs_doc", counted)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        got = [(await c.get("/plan?inputs=1")).json() for _ in range(3)]
    assert len(built) == 1 and built[0] != threading.get_ident()  # once, not on the event loop's thread
    want = msgspec.json.decode(msgspec.json.encode(real(r)))
    assert all(g["inputs"] == want for g in got) and want["digest"] == r.section.digest
    assert {m["node"] for m in want["members"]} == {"a", "b"}


def test_jobs_on_members_given_no_view_are_served_as_the_planner_counted_them():
    """Review of issue 38 (MEDIUM): the jobs of a member the plan gave no view (dead within the orphan grace, or its
    running list unknown past the grace) count for the planner (instances, trainings) but were left out of
    ``running`` while ``running_total`` counted them: the document contradicted docs/protocol.md, and the bench's
    checker, seeing it as cut at its bounds, dropped every such plan. They are listed now."""
    catalog = parse_catalog({"job": [{"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"],
                                      "max_concurrency": 4, "resources": {"num_gpus": 1, "vram_gib": 8}}]})
    members = [MemberPlanInput("a", NodeView("a", (GpuView(0, 80.0), GpuView(1, 80.0)), offer=2),
                               running=(report("1-1", gpus=(0,)),)),
               MemberPlanInput("b", None, running=(report("1-2", gpus=(0,)), report("1-3", gpus=(1,))), dead=True)]
    r = Planner(catalog).lead(1, members, None, {}, 1.0, 1.0)
    assert [a.job_id for a in r.section.assignments if a.node == "a"] == ["1-1", "1-4"]  # 3 counted of 4: one new
    doc = plan_inputs_doc(r)
    assert [m.node for m in doc.members] == ["a"] and doc.members_total == 1
    assert sorted(j.job_id for j in doc.running) == ["1-1", "1-2", "1-3"] and doc.running_total == 3
    assert [(g.index, g.committed_gib) for g in doc.members[0].gpus] == [(0, 8.0), (1, 0.0)]
