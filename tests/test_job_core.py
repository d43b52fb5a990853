"""The job core's fencing rules in virtual time (:class:`p2pnode.node.JobCore`): terms, the orphan grace, the
re-adoption grace, duplicate training, the settle and the hold of a new leader, load shedding, acting
on a plan once, the spawn limit, final refusals and autonomous work. No process, no socket, no clock: ``now`` is
a number, and every wait is read from ``next_deadline()``."""

from __future__ import annotations

import math

import pytest

from p2pnode.gossip import MemberState
from p2pnode.guardcore import Overload, Pressure
from p2pnode.node import (
    Fetch,
    JobCore,
    JobInputs,
    Leadership,
    LocalJob,
    MemberJobs,
    PublishPlan,
    Quarantine,
    Refuse,
    StartJob,
    StopJob,
)
from p2pnode.node._jobio import OfferSample
from p2pnode.node._jobs import HOLD_S, whole_version
from p2pnode.node._plandist import part_version
from p2pnode.scheduler import STABLE_RESERVE_INTERVALS, GpuView, NodeView, parse_catalog
from p2pnode.snapshot import JobReport, PlanJob, PlanSection, plan_digest, plan_ref

CATALOG = parse_catalog({
    "policy": {"priorities": {"evaluation": "critical", "training": "high"}},
    "job": [
        {"name": "train", "kind": "training", "config": "c", "argv": ["x"], "max_concurrency": 1,
         "resources": {"num_gpus": 1, "vram_gib": 8}},
        {"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"], "max_concurrency": 8, "autonomous": True,
         "resources": {"num_gpus": 1, "vram_gib": 8}},
        {"name": "ev", "kind": "evaluation", "config": "c", "argv": ["x"], "max_concurrency": 0,
         "resources": {"num_gpus": 1, "vram_gib": 8}},
    ],
})
GRACE = 30.0


def view(nid: str, gpus: int = 4, offer: int = 4) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, 80.0) for i in range(gpus)), offer=offer)


def member(nid: str, *, running=(), state=MemberState.ALIVE, since=0.0, plan=None, refused=(), offer=4,
           gpus=4) -> MemberJobs:
    live = state in (MemberState.ALIVE, MemberState.SUSPECT)
    return MemberJobs(nid, state, since, view(nid, gpus, offer) if live else None, tuple(running), "",
                      frozenset(refused), offer, plan=plan_ref(plan) if plan is not None else None)


def report(job_id: str, template: str = "sp", gpus=(0,), term: int = 1) -> JobReport:
    return JobReport(job_id=job_id, template=template, gpus=list(gpus), gpu_fraction=1.0, vram_gib=8.0, term=term)


def core(nid: str = "a", **kw) -> JobCore:
    args = {"interval_s": 5.0, "adopt_grace_s": GRACE, "orphan_grace_s": 60.0, "settle_s": 2.0, "dwell_s": 10.0,
            "spawns_per_minute": 600.0}
    return JobCore(nid, CATALOG, **(args | kw))


def inputs(lsh: Leadership, members, running=None, **kw) -> JobInputs:
    return JobInputs(lsh, list(members), running or {}, **kw)


def lead(leader: str, term: int = 1, **kw) -> Leadership:
    return Leadership(leader, term, kw.pop("highest", term), False, kw.pop("by_term", {term: leader}))


def plan_of(term: int, seq: int, jobs: list[PlanJob], stops=()) -> PlanSection:
    return PlanSection(term=term, seq=seq, digest=plan_digest(jobs, list(stops)), at=0.0, assignments=jobs,
                       stops=list(stops))


def pjob(job_id: str, node: str, template: str = "sp", gpu: int = 0, term: int = 1) -> PlanJob:
    return PlanJob(job_id=job_id, node=node, template=template, gpus=[gpu], gpu_fraction=1.0, vram_gib=8.0,
                   term=term)


def drive(c: JobCore, inp: JobInputs, now: float) -> list:
    """Step ``c`` at ``now`` as a driver does at a wake: one step (the offers are computed inside it)."""
    return c.step(inp, now)


def of(effects, kind):
    return [e for e in effects if isinstance(e, kind)]


def local(job_id: str, template: str = "sp", *, started=0.0, adopted=False, kind=None, stopping=False) -> LocalJob:
    return LocalJob(job_id, template, kind or CATALOG.templates[template].kind, (0,), 1.0, 8.0, started, 1,
                    adopted, stopping)


# -- fencing by term ----------------------------------------------------------------------------------------------
def test_a_node_acts_only_on_the_plan_of_the_current_leaders_term():
    c = core("b")
    p = plan_of(1, 1, [pjob("1-1", "b")])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    stale = lead("a", 1, highest=2)  # a higher term was seen: the term-1 plan is fenced off
    assert not of(drive(c, inputs(stale, [member("b"), member("a", plan=p)]), 0.0), StartJob)
    ok = lead("a", 1)
    starts = of(drive(c, inputs(ok, [member("b"), member("a", plan=p)]), 1.0), StartJob)
    assert [s.job.job_id for s in starts] == ["1-1"] and starts[0].term == 1


def test_a_part_not_held_is_fetched_and_acted_on_when_it_arrives():
    c = core("b")
    p = plan_of(1, 1, [pjob("1-1", "b")])
    inp = inputs(lead("a"), [member("b"), member("a", plan=p)])
    effects = drive(c, inp, 0.0)
    assert of(effects, Fetch) == [Fetch(("part", "a"), part_version(plan_ref(p)), "a", plan_ref(p))]
    assert not of(drive(c, inp, 0.5), Fetch)  # asked once, not at every step
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    assert [s.job.job_id for s in of(drive(c, inp, 1.0), StartJob)] == ["1-1"]


def test_a_plan_of_a_member_not_elected_in_its_term_is_never_carried_over():
    c = core("a", settle_s=0.0)
    fake = plan_of(1, 9, [pjob("1-7", "z", template="train")])
    lsh = Leadership("a", 2, 2, False, {1: "x", 2: "a"})  # z claims term 1, where x was elected
    effects = drive(c, inputs(lsh, [member("a"), member("z", plan=fake)]), 0.0)
    (pub,) = of(effects, PublishPlan)
    assert all(j.job_id != "1-7" for j in pub.section.assignments) and not of(effects, Fetch)


# -- a plan is acted on once; the spawn limit and the adoption grace are deadlines ---------------------------------
def test_a_plan_is_acted_on_once_and_the_spawn_limit_sets_the_next_deadline():
    c = core("b", spawns_per_minute=2.0, interval_s=300.0)  # two tokens, then one every 30 s
    p = plan_of(1, 1, [pjob(f"1-{i}", "b", gpu=i) for i in range(4)])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    inp = inputs(lead("a"), [member("b"), member("a", plan=p)])
    first = of(drive(c, inp, 0.0), StartJob)
    assert len(first) == 2
    assert c.next_deadline() == pytest.approx(30.0)
    assert not drive(c, inp, 1.0)  # the same plan: not again
    later = of(drive(c, inp, 30.0), StartJob)
    assert [s.job.job_id for s in later] == ["1-2"]


def test_the_spawn_rate_scales_with_the_node_and_a_held_start_says_why_and_when():
    c = core("b", spawns_per_minute=None, spawns_per_minute_per_gpu=1.0, spawns_per_minute_per_cpu=0.0)
    p = plan_of(1, 1, [pjob(f"1-{i}", "b", gpu=i % 4) for i in range(14)])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    big = NodeView("b", tuple(GpuView(i, 80.0) for i in range(12)), offer=12)  # 12 a minute: 12 at once
    inp = inputs(lead("a"), [MemberJobs("b", MemberState.ALIVE, 0.0, big), member("a", plan=p)])
    assert len(of(drive(c, inp, 0.0), StartJob)) == 12
    assert [w[0] for w in c.waiting] == ["1-12", "1-13"]
    assert "spawn-rate limit of 12 jobs a minute on this node" in c.waiting[0][2]
    assert "next start in 5.0 s" in c.waiting[0][2] and c.next_deadline() == pytest.approx(5.0)
    assert [s.job.job_id for s in of(drive(c, inp, 5.0), StartJob)] == ["1-12"]
    assert [w[0] for w in c.waiting] == ["1-13"]
    small = core("b", spawns_per_minute=None, spawns_per_minute_per_gpu=1.0, spawns_per_minute_per_cpu=0.0)
    p1 = plan_of(1, 1, [pjob(f"1-{i}", "b", gpu=0) for i in range(14)])  # one GPU: every job on GPU 0
    small.fetched(("part", "a"), part_version(plan_ref(p1)), p1)
    inp = inputs(lead("a"), [member("b", gpus=1), member("a", plan=p1)])
    assert len(of(drive(small, inp, 0.0), StartJob)) == 10  # never below the floor of 10 a minute


def test_held_starts_are_forgotten_when_the_plan_is_fenced_and_token_times_never_spin():
    c = core("b", spawns_per_minute=None, spawns_per_minute_per_gpu=18.0, spawns_per_minute_per_cpu=0.0)
    p = plan_of(1, 1, [pjob(f"1-{i}", "b", gpu=i % 4) for i in range(200)])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    ms = [MemberJobs("b", MemberState.ALIVE, 0.0, NodeView("b", tuple(GpuView(i, 80.0) for i in range(8)))),
          member("a", plan=p)]
    now = 1000.0
    started = len(of(drive(c, inputs(lead("a"), ms), now), StartJob))
    assert started == 144  # the burst: 18 a minute per GPU
    t0 = now
    for _ in range(60):  # then one per token (every 60/144 s), each at the core's own deadline, never spinning
        assert c.next_deadline() > now
        now = c.next_deadline()
        started += len(of(drive(c, inputs(lead("a"), ms), now), StartJob))
    assert started == 144 + int((now - t0) * 144 / 60 + 1e-6) and c.waiting_gpu_jobs == 200 - started
    drive(c, inputs(lead("a", 1, highest=2), ms), now)  # fenced: nothing of that plan will start here
    assert c.waiting == () and c.waiting_gpu_jobs == 0


def test_a_job_the_plan_does_not_hold_stops_after_the_adoption_grace_an_adopted_one_after_acting_began():
    c = core("b", interval_s=300.0)
    p = plan_of(1, 1, [])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    running = {"old": local("old", started=-100.0), "back": local("back", started=-100.0, adopted=True),
               "new": local("new", started=95.0)}
    inp = inputs(lead("a"), [member("b"), member("a", plan=p)], running)
    stops = of(drive(c, inp, 100.0), StopJob)
    assert [s.job_id for s in stops] == ["old"]  # ran past the grace; the re-adopted one counts from now
    assert c.next_deadline() == pytest.approx(95.0 + GRACE)
    running["old"] = local("old", started=-100.0, stopping=True)
    assert [s.job_id for s in of(drive(c, inp, 95.0 + GRACE), StopJob)] == ["new"]
    running["new"] = local("new", started=95.0, stopping=True)  # the driver carried the stop out
    assert [s.job_id for s in of(drive(c, inp, 100.0 + GRACE), StopJob)] == ["back"]


def test_a_refusal_is_final_for_its_job_id():
    c = core("b")
    p = plan_of(1, 1, [pjob("1-1", "b")])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    no = inputs(lead("a"), [member("b"), member("a", plan=p)], refuse_new="disk full")
    assert of(drive(c, no, 0.0), Refuse) == [Refuse("1-1", "sp", "disk full")]
    yes = inputs(lead("a"), [member("b"), member("a", plan=p)], cordoned=False)
    assert not of(drive(c, yes, 1.0), StartJob) and not of(drive(c, yes, 100.0), Refuse)


def test_a_cordoned_node_refuses_and_an_open_breaker_refuses():
    c = core("b", breaker_failures=1, breaker_cooldown_s=60.0)
    p = plan_of(1, 1, [pjob("1-1", "b"), pjob("1-2", "b", gpu=1)])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    c.job_exited("x", True, 0.0)  # one failure opens the breaker
    effects = drive(c, inputs(lead("a"), [member("b"), member("a", plan=p)]), 1.0)
    assert all("circuit breaker open" in r.reason for r in of(effects, Refuse)) and len(of(effects, Refuse)) == 2


# -- load shedding (kubelet's node-pressure eviction) -------------------------------------------------------------
SHED = parse_catalog({
    "policy": {"priorities": {"evaluation": "low", "training": "high"}},
    "job": [
        {"name": "train", "kind": "training", "config": "c", "argv": ["x"],
         "resources": {"num_gpus": 1, "vram_gib": 8}},
        {"name": "sp_hi", "kind": "selfplay", "config": "c", "argv": ["x"], "priority": 80},
        {"name": "sp_lo", "kind": "selfplay", "config": "c", "argv": ["x"], "priority": 20},
        {"name": "ev", "kind": "evaluation", "config": "c", "argv": ["x"], "priority": 90},
    ],
})


def shed_core(**kw) -> JobCore:
    return JobCore("b", SHED, **({"interval_s": 300.0, "dwell_s": 10.0} | kw))


def shed_jobs() -> dict[str, LocalJob]:
    """A training job and three selfplay-like jobs: ``ev`` (kind at LOW guard priority), ``sp_lo2`` and ``sp_lo1``
    (selfplay, template priority 20; ``sp_lo2`` started last), ``sp_hi`` (selfplay, template priority 80)."""
    def j(job_id, template, started):
        return LocalJob(job_id, template, SHED.templates[template].kind, started_at=started)

    return {"train": j("train", "train", 0.0), "sp_hi": j("sp_hi", "sp_hi", 1.0), "sp_lo1": j("sp_lo1", "sp_lo", 2.0),
            "sp_lo2": j("sp_lo2", "sp_lo", 3.0), "ev": j("ev", "ev", 4.0)}


def cpu(at: float, used: float = 98.0) -> Pressure:
    return Pressure((Overload("cpu", used, 80.0),), at)


def mem(at: float, used: float = 93.0) -> Pressure:
    return Pressure((Overload("memory", used, 80.0),), at)


def shed_step(c: JobCore, running: dict[str, LocalJob], pressure: Pressure, now: float) -> list[StopJob]:
    """Step ``c`` without a leader (nothing else to do) and carry out its stops: a stopped job is ``stopping``."""
    stops = of(drive(c, inputs(Leadership(None, None, 0, True, {}), [member("b")], running, pressure=pressure),
                     now), StopJob)
    for s in stops:
        running[s.job_id] = LocalJob(**{**{f: getattr(running[s.job_id], f) for f in LocalJob.__slots__},
                                        "stopping": True})
    return stops


def test_cpu_pressure_sheds_one_job_at_a_time_lowest_priority_first_and_never_training():
    c, running = shed_core(), shed_jobs()
    assert not shed_step(c, running, cpu(0.0), 0.0)  # one saturated sample stops nothing
    assert c.next_deadline() == pytest.approx(10.0)
    assert not shed_step(c, running, Pressure((), 5.0), 5.0)  # a spike that passed
    assert not shed_step(c, running, cpu(6.0), 6.0)  # the dwell starts again
    assert not shed_step(c, running, cpu(6.0), 15.9)
    order = []
    (first,) = shed_step(c, running, cpu(6.0), 16.0)
    order.append(first.job_id)
    assert "load shed: CPU at 98 % >= its limit 80 % for 10 s" in first.reason and "LOW" in first.reason
    now = 16.0
    while True:
        assert not shed_step(c, running, cpu(now), now + 1)  # still running (stopping): nothing more
        assert c.next_deadline() > now + 1  # no deadline: the job's exit and the next sample are news
        del running[order[-1]]  # it left
        assert not shed_step(c, running, cpu(now + 1.5), now + 2)  # a sample from before it left: wait
        assert not shed_step(c, running, cpu(now + 3), now + 3)  # the first after: it may average the job in
        now += 5.0
        stops = shed_step(c, running, cpu(now), now)  # a second sample after it left, still over: the next
        if not stops:
            break
        (s,) = stops
        order.append(s.job_id)
    assert order == ["ev", "sp_lo2", "sp_lo1", "sp_hi"]  # guard priority, template priority, newest first
    assert set(running) == {"train"}  # CPU pressure never stops training-priority work
    assert not shed_step(c, running, cpu(now + 100), now + 100)


def test_memory_pressure_stops_training_last_and_pressure_that_clears_stops_no_more():
    c, running = shed_core(), shed_jobs()
    for name in ("sp_hi", "sp_lo1", "sp_lo2", "ev"):
        del running[name]
    running["sp"] = LocalJob("sp", "sp_lo", "selfplay", started_at=5.0)
    assert not shed_step(c, running, mem(0.0), 0.0)
    assert [s.job_id for s in shed_step(c, running, mem(0.0), 10.0)] == ["sp"]
    del running["sp"]
    assert not shed_step(c, running, mem(12.0), 12.0)  # seen gone now: the samples must come after
    assert not shed_step(c, running, mem(13.0), 13.0)  # the first sample after: not yet
    (s,) = shed_step(c, running, mem(14.0), 14.0)
    assert s.job_id == "train" and "memory at 93 % >= its limit 80 %" in s.reason
    c2, running2 = shed_core(), shed_jobs()
    assert [s.job_id for s in shed_step(c2, running2, mem(0.0), 0.0) + shed_step(c2, running2, mem(0.0), 10.0)] == [
        "ev"]
    del running2["ev"]
    assert not shed_step(c2, running2, Pressure((), 12.0), 12.0)  # relieved: nothing more is stopped
    assert not shed_step(c2, running2, mem(13.0), 13.0)  # back: a new dwell first
    assert c2.next_deadline() == pytest.approx(23.0)


def test_critical_work_is_never_shed():
    cat = parse_catalog({"policy": {"priorities": {"evaluation": "critical"}},
                         "job": [{"name": "ev", "kind": "evaluation", "config": "c", "argv": ["x"]}]})
    c = JobCore("b", cat, interval_s=300.0, dwell_s=0.0)
    running = {"ev": LocalJob("ev", "ev", "evaluation")}
    assert not shed_step(c, running, mem(0.0), 0.0) and not shed_step(c, running, mem(1.0), 1.0)


def test_level_4_refuses_new_work_at_once():
    c = core("b")
    p = plan_of(1, 1, [pjob("1-1", "b")])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    from p2pnode.guardcore import GuardLimits, admission, assess, level_reasons

    a = assess({"cpu_percent": 5.0, "mem_percent": 97.0, "disk_percent": 1.0, "gpus": []}, GuardLimits())
    why = "; ".join(level_reasons(a, 4, GuardLimits()))
    inp = inputs(lead("a"), [member("b"), member("a", plan=p)], level=4, level_why=why)
    (r,) = of(drive(c, inp, 0.0), Refuse)
    # the core's decision from the values is the guard's own (same verdict, same words)
    ok, guard_why = admission(a, 4, GuardLimits(), kind="selfplay", priority=CATALOG.priority_of("selfplay"))
    assert r.job_id == "1-1" and not ok and r.reason == guard_why


# -- leading: settle, hold, orphan grace, duplicate training --------------------------------------------------------
def test_a_new_leader_settles_then_holds_for_its_predecessors_plan_and_carries_it_over():
    prev = plan_of(1, 4, [pjob("1-1", "b", template="train")])
    c = core("a", interval_s=300.0)
    lsh = Leadership("a", 2, 2, False, {1: "x", 2: "a"})
    ms = [member("a"), member("b"), member("x", plan=prev)]  # x lost the lead (a stronger node came), alive
    assert not of(drive(c, inputs(lsh, ms), 0.0), PublishPlan)
    assert c.my_plan is None and c.next_deadline() == pytest.approx(2.0)  # settling two gossip rounds
    effects = drive(c, inputs(lsh, ms), 2.0)
    assert Fetch(("whole", "x"), whole_version(plan_ref(prev)), "x", plan_ref(prev)) in effects
    assert c.my_plan is None and c.next_deadline() == pytest.approx(2.0 + HOLD_S)
    c.fetched(("whole", "x"), whole_version(plan_ref(prev)), prev)
    (pub,) = of(drive(c, inputs(lsh, ms), 3.0), PublishPlan)
    trains = [j for j in pub.section.assignments if j.template == "train"]
    assert [j.job_id for j in trains] == ["1-1"]  # carried over, not placed a second time


def test_a_leader_plans_without_a_lost_predecessor_plan_after_the_hold():
    prev = plan_of(1, 4, [pjob("1-1", "b", template="train")])
    c = core("a", settle_s=0.0)
    lsh = Leadership("a", 2, 2, False, {1: "x", 2: "a"})
    ms = [member("a"), member("b"), member("x", plan=prev)]  # alive, and never answers
    assert not of(drive(c, inputs(lsh, ms), 0.0), PublishPlan)
    assert not of(drive(c, inputs(lsh, ms), HOLD_S - 0.1), PublishPlan)
    assert of(drive(c, inputs(lsh, ms), HOLD_S), PublishPlan)


def test_a_leader_does_not_hold_for_the_plan_of_a_predecessor_that_is_not_alive():
    """A dead or suspect predecessor serves no plan: the new leader plans once settled (it held ``HOLD_S`` before,
    which made a partitioned training holder that also led take 4-5 s longer to be replaced). What a member may
    have started from that plan counts by its report, once it names the new term (``jobs.term_seen``)."""
    import msgspec

    prev = plan_of(1, 4, [pjob("1-1", "b", template="train")])
    for state in (MemberState.DEAD, MemberState.SUSPECT):
        c = core("a", settle_s=0.0)
        lsh = Leadership("a", 2, 2, False, {1: "x", 2: "a"})
        b = msgspec.structs.replace(member("b", running=[report("1-1", "train")]), term_seen=2)
        ms = [member("a"), b, member("x", state=state, since=0.0, plan=prev)]
        (pub,) = of(drive(c, inputs(lsh, ms), 0.0), PublishPlan)
        assert [j.job_id for j in pub.section.assignments if j.template == "train"] == ["1-1"]  # not placed again


def test_a_dead_members_jobs_count_for_the_orphan_grace_then_its_training_is_placed_again():
    c = core("a", settle_s=0.0, orphan_grace_s=60.0)
    dead = member("b", state=MemberState.DEAD, since=0.0, running=[report("1-1", "train")])
    ms = [member("a"), dead]
    (pub,) = of(drive(c, inputs(lead("a"), ms), 1.0), PublishPlan)
    assert [j.job_id for j in pub.section.assignments if j.template == "train"] == ["1-1"]
    (pub,) = of(drive(c, inputs(lead("a"), ms), 61.0), PublishPlan)
    trains = [j for j in pub.section.assignments if j.template == "train"]
    assert len(trains) == 1 and trains[0].job_id != "1-1" and trains[0].node == "a"


def test_a_second_training_reported_is_planned_at_once_and_stopped():
    c = core("a", settle_s=0.0)
    ms = [member("a", offer=0), member("b", running=[report("1-1", "train")])]
    assert of(drive(c, inputs(lead("a"), ms), 0.0), PublishPlan)
    assert c.next_deadline() == pytest.approx(5.0)
    back = member("c", running=[report("0-1", "train", term=1)])  # an agent back with its re-adopted training
    back = MemberJobs(back.origin, back.state, 0.0, back.view, back.running, "d1", frozenset(), 0)
    drive(c, inputs(lead("a"), [*ms, back]), 0.1)
    assert c.next_deadline() == pytest.approx(1.0)  # the least gap, not the interval
    (pub,) = of(drive(c, inputs(lead("a"), [*ms, back]), 1.0), PublishPlan)
    assert len([s for s in pub.section.stops if s.job_id in ("1-1", "0-1")]) == 1


def test_planning_fails_closed_on_a_members_broken_data():
    c = core("a", settle_s=0.0)

    class Broken(tuple):  # a member's data that passed its decoder and still breaks planning (a decoder gap)
        def __iter__(self):
            raise ValueError("broken")

    bad = MemberJobs("z", MemberState.ALIVE, 0.0, view("z"), Broken((report("1-1"),)), "", frozenset(), 4)
    effects = drive(c, inputs(lead("a"), [member("a"), member("b"), bad]), 0.0)
    assert [q.origin for q in of(effects, Quarantine)] == ["z"] and of(effects, PublishPlan)


# -- without a leader ---------------------------------------------------------------------------------------------
def test_autonomous_work_without_a_leader_and_none_while_the_election_holds():
    c = core("a")
    held = Leadership(None, None, 0, True, {})
    assert not of(drive(c, inputs(held, [member("a")], offer=2), 0.0), StartJob)
    free = Leadership(None, None, 0, False, {})
    starts = of(drive(c, inputs(free, [member("a")], offer=2), 1.0), StartJob)
    assert starts and all(s.job.template == "sp" and s.term == 0 for s in starts)


def test_leaderless_nodes_start_at_most_their_share_of_a_templates_max_concurrency():
    """Seed 003: six nodes starting together with no leader each planned ``max_concurrency`` on its own view (15-17
    instances of a template capped at 8 ran at once, and the first leader's plans replaced none of them until the
    surplus ended). Each node now takes its share of the cap by the GPUs of the live members it knows, and none
    once the instances other members report reach it; trainings are not autonomous and untouched."""
    free = Leadership(None, None, 0, False, {})
    members = [member("a", gpus=8, offer=8), member("b", gpus=8, offer=8), member("c", gpus=8, offer=8)]
    total = 0
    for nid in ("a", "b", "c"):
        starts = of(drive(core(nid), inputs(free, members, offer=8), 1.0), StartJob)
        assert all(s.job.template == "sp" for s in starts) and len(starts) == 3  # ceil(8 x 8/24)
        total += len(starts)
    assert total <= CATALOG.templates["sp"].max_concurrency + 2  # the cap, plus one per node at most (rounding)
    # Alone (no other member known) a node may take the whole cap: every GPU but the one it keeps for the training.
    assert len(of(drive(core("a"), inputs(free, [member("a", gpus=8, offer=8)], offer=8), 1.0), StartJob)) == 7
    # A node that hears of the cap's instances running elsewhere starts none; of 6, at most 2 more.
    busy = [member("a", gpus=8, offer=8), member("b", gpus=8, offer=8,
                                                  running=[report(f"x-{i}", gpus=(i,), term=0) for i in range(8)])]
    assert not of(drive(core("a"), inputs(free, busy, offer=8), 1.0), StartJob)
    some = [busy[0], member("b", gpus=8, offer=8, running=[report(f"x-{i}", gpus=(i,), term=0) for i in range(6)])]
    assert len(of(drive(core("a"), inputs(free, some, offer=8), 1.0), StartJob)) == 2


def _spot(nid: str = "e") -> MemberJobs:
    return MemberJobs(nid, MemberState.ALIVE, 0.0, NodeView(nid, tuple(GpuView(i, 80.0) for i in range(4)),
                                                            frozenset({"ephemeral"}), ephemeral=True, offer=0),
                      (), "", frozenset(), 0)


def test_a_durable_node_without_a_leader_keeps_room_for_the_first_plans_training():
    """Seed 003: the durable box filled its GPUs with autonomous selfplay 0.6 s after its start, and no leader's plan
    ever found room for a training there. It now keeps a GPU of its catalog's largest training free."""
    free = Leadership(None, None, 0, False, {})
    c = core("a", settle_s=0.0)
    starts = of(drive(c, inputs(free, [member("a"), _spot()], offer=4), 0.6), StartJob)
    assert sorted(s.job.gpus[0] for s in starts) == [1, 2, 3] and all(s.job.template == "sp" for s in starts)
    running = tuple(report(s.job.job_id, gpus=s.job.gpus, term=0) for s in starts)
    here = {s.job.job_id: LocalJob(s.job.job_id, "sp", "selfplay", tuple(s.job.gpus), 1.0, 8.0, 0.6, 0)
            for s in starts}
    members = [member("a", running=running, offer=1), _spot()]
    assert not of(drive(c, inputs(free, members, here, offer=1), 7.0), StartJob)
    # The first leader (this node) plans: the training goes on the GPU kept free, nothing is preempted.
    (pub,) = of(drive(c, inputs(lead("a"), members, here, offer=1), 8.0), PublishPlan)
    (train,) = [j for j in pub.section.assignments if j.template == "train"]
    assert train.node == "a" and train.gpus == [0] and not pub.section.stops
    # An ephemeral node keeps nothing: its GPUs all take autonomous work.
    spot = MemberJobs("e", MemberState.ALIVE, 0.0, NodeView("e", tuple(GpuView(i, 80.0) for i in range(4)),
                                                            frozenset({"ephemeral"}), ephemeral=True, offer=4),
                      (), "", frozenset(), 4)
    starts = of(drive(core("e"), inputs(free, [spot], offer=4), 0.6), StartJob)
    assert sorted(s.job.gpus[0] for s in starts) == [0, 1, 2, 3]


def test_the_leaderless_reserve_ends_after_its_intervals_and_wakes_the_driver_for_it():
    """Review F8: the reserve had no end, so a cluster that never elects (a partition, a lost quorum) left the kept
    GPU idle for good. It lasts STABLE_RESERVE_INTERVALS intervals from the first leaderless step; its end is a
    deadline of the core, and the step at it fills the GPU."""
    free = Leadership(None, None, 0, False, {})
    c = core("a", settle_s=0.0, interval_s=5.0)
    drive(c, inputs(Leadership(None, None, 0, True, {}), [member("a"), _spot()], offer=4), 0.0)  # election held
    starts = of(drive(c, inputs(free, [member("a"), _spot()], offer=4), 2.0), StartJob)  # the first leaderless step
    assert sorted(s.job.gpus[0] for s in starts) == [1, 2, 3]
    here = {s.job.job_id: LocalJob(s.job.job_id, "sp", "selfplay", tuple(s.job.gpus), 1.0, 8.0, 2.0, 0)
            for s in starts}
    running = tuple(report(s.job.job_id, gpus=s.job.gpus, term=0) for s in starts)
    members = [member("a", running=running, offer=1), _spot()]
    end = 2.0 + STABLE_RESERVE_INTERVALS * 5.0  # off the offer's period (refreshed at 0): only the reserve wakes it
    now = 3.0  # the starts reported running: the plan's own period now runs from 3 s, also off the end
    while now < end:  # virtual time: every deadline the core reports, the GPU stays kept until the end
        assert not of(drive(c, inputs(free, members, here, offer=1), now), StartJob), now
        now = c.next_deadline()
        assert now <= end
    assert now == pytest.approx(end)
    (late,) = of(drive(c, inputs(free, members, here, offer=1), now), StartJob)
    assert late.job.gpus == [0] and late.job.template == "sp"


def test_the_reserve_is_not_kept_again_once_a_leader_was_seen():
    """After a leader's term, a node that loses it (a partition) runs autonomous work on every GPU at once."""
    c = core("a", settle_s=0.0)
    drive(c, inputs(lead("b"), [member("a"), member("b"), _spot()], offer=0), 0.0)
    free = Leadership(None, None, 1, False, {})
    starts = of(drive(c, inputs(free, [member("a"), _spot()], offer=4), 1.0), StartJob)
    assert sorted(s.job.gpus[0] for s in starts) == [0, 1, 2, 3]


def test_a_durable_node_that_knows_no_ephemeral_member_yet_still_keeps_the_gpu_for_the_bounded_time():
    """Review F8 said a durable node of a fleet with no ephemeral member should keep nothing; but a node that starts
    with its fleet has heard of a few members at most (seed 003's H200 knew only the durable seed when it filled
    its GPU, and its first training came 33 s after the leader): it keeps the GPU, and the reserve's bound
    (STABLE_RESERVE_INTERVALS, the test above) is what limits the cost."""
    free = Leadership(None, None, 0, False, {})
    starts = of(drive(core("a", settle_s=0.0), inputs(free, [member("a"), member("b")], offer=4), 0.6), StartJob)
    assert sorted(s.job.gpus[0] for s in starts) == [1, 2, 3]


def test_deadlines_are_finite_only_for_what_waits():
    c = core("b")
    drive(c, inputs(Leadership(None, None, 0, True, {}), [member("b")]), 0.0)
    assert c.next_deadline() == pytest.approx(5.0)  # the offer's period, nothing else
    assert not math.isinf(c.next_deadline())


def test_one_step_after_a_job_ended_offers_its_gpu_and_plans_and_starts_onto_it():
    # issue 39 item 6: the offer is computed inside the step, from the sample the driver hands in; no request
    # for a fresh offer, no second step. The newest sample (taken at 0) still shows the ended job's load.
    c = core("a", settle_s=0.0, interval_s=300.0)
    busy = OfferSample(gpu_util=((0, 95.0),), sampled_at=0.0, cpus=8.0, memory_gib=32.0)
    me = member("a", gpus=1, running=[report("x")])
    out = c.step(inputs(lead("a"), [me], {"x": local("x")}, sample=busy), 0.0)
    assert c.offer == 0 and not of(out, StartJob)  # its one GPU held and above the band: nothing offered
    (pub,) = of(out, PublishPlan)
    assert [j.job_id for j in pub.section.assignments] == ["x"]
    assert c.next_deadline() == pytest.approx(300.0)  # (the offers' period; the plan's cadence is no sooner)
    c.job_exited("x", False, 10.0)
    assert c.next_deadline() <= 10.0  # the exit is news: step now
    out = c.step(inputs(lead("a"), [member("a", gpus=1)], {}, sample=busy), 10.0)
    assert c.offer == 1  # the GPU the job left is offered at once, though the sample still shows its load
    (pub,) = of(out, PublishPlan)
    (start,) = of(out, StartJob)  # planned and started in this very step
    assert [(j.job_id, j.node, j.gpus) for j in pub.section.assignments] == [(start.job.job_id, "a", [0])]
    assert c.next_deadline() > 10.0


def test_the_offers_are_the_cores_own_at_every_step():
    # The offer a step computes is the one its planning sees (this node's member view) and the one the driver
    # publishes (JobCore.offer); a job that starts changes it at the next step; autonomous placements take from it.
    c = core("a", interval_s=300.0)
    idle = OfferSample(gpu_util=((0, 0.0), (1, 0.0)), sampled_at=0.0, cpus=8.0, memory_gib=32.0)
    free = Leadership(None, None, 0, False, {})
    starts = of(c.step(inputs(free, [member("a", gpus=2, offer=0)], sample=idle), 0.0), StartJob)
    assert starts and c.offer == 2 - len(starts)  # both GPUs offered; autonomous work took what it placed
    running = {s.job.job_id: LocalJob(s.job.job_id, "sp", "selfplay", tuple(s.job.gpus), 1.0, 8.0, 0.0, 0)
               for s in starts}
    more = of(c.step(inputs(free, [member("a", gpus=2)], running, sample=idle), 1.0), StartJob)
    # recomputed: the GPUs held now are not offered (the sample, taken before they started, shows them idle)
    assert c.offer == 2 - len(starts) - len(more)


# -- liveness: a step never leaves a deadline in the past (the driver would step back to back) ---------------------
def _no_deadline_in_the_past(c: JobCore, inp: JobInputs, now: float) -> list:
    out = drive(c, inp, now)
    assert c.next_deadline() > now, (now, c.next_deadline(), out)
    return out


def test_a_fenced_plan_or_a_lost_leader_leaves_no_stale_deadline():
    c = core("b", spawns_per_minute=2.0, interval_s=300.0)
    p = plan_of(1, 1, [pjob(f"1-{i}", "b", gpu=i) for i in range(4)])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    ms = [member("b"), member("a", plan=p)]
    _no_deadline_in_the_past(c, inputs(lead("a"), ms), 0.0)  # two starts, the next token in 30 s
    _no_deadline_in_the_past(c, inputs(lead("a", 1, highest=2), ms), 40.0)  # fenced: the token deadline is gone
    _no_deadline_in_the_past(c, inputs(Leadership(None, None, 2, False, {}), [member("b")], offer=0), 50.0)
    p2 = plan_of(2, 1, [pjob("2-1", "b")])
    _no_deadline_in_the_past(c, inputs(lead("a", 2), [member("b"), member("a", plan=p2)]), 60.0)  # part on its way


def test_a_leader_moving_to_the_next_term_settles_without_spinning():
    c = core("a", settle_s=2.0, interval_s=5.0)
    ms = [member("a"), member("b")]
    for t in (0.0, 2.0):
        _no_deadline_in_the_past(c, inputs(lead("a", 1), ms), t)
    assert c.my_plan is not None and c.my_plan.term == 1
    _no_deadline_in_the_past(c, inputs(Leadership("a", 2, 2, False, {1: "a", 2: "a"}), ms), 7.5)
    assert c.my_plan.term == 1 and c.next_deadline() == pytest.approx(9.5)  # the settle, not the stale cadence
    (pub,) = of(_no_deadline_in_the_past(c, inputs(Leadership("a", 2, 2, False, {1: "a", 2: "a"}), ms), 9.5),
                PublishPlan)
    assert pub.section.term == 2


def test_a_planning_error_with_no_one_to_blame_is_retried_after_the_least_gap():
    c = core("a", settle_s=0.0, plan_fn=lambda *a, **k: (_ for _ in ()).throw(ValueError("a bug of ours")))
    _no_deadline_in_the_past(c, inputs(lead("a"), [member("a")]), 0.0)
    assert c.planning_errors == 1 and c.next_deadline() == pytest.approx(1.0)
    _no_deadline_in_the_past(c, inputs(lead("a"), [member("a")]), 0.5)
    assert c.planning_errors == 1


def test_autonomous_work_is_tried_again_after_a_refusal():
    c = core("a", interval_s=5.0)
    free = Leadership(None, None, 0, False, {})
    no = inputs(free, [member("a")], offer=1, refuse_new="busy")
    assert of(_no_deadline_in_the_past(c, no, 0.0), Refuse)
    yes = inputs(free, [member("a")], offer=1)
    assert not of(_no_deadline_in_the_past(c, yes, 1.0), StartJob)  # within the interval: the same round
    assert of(_no_deadline_in_the_past(c, yes, 5.0), StartJob)


@pytest.mark.parametrize("seed", range(30))
def test_random_steps_never_leave_a_deadline_in_the_past(seed):
    import random

    rng = random.Random(seed)
    c = core("a", spawns_per_minute=rng.choice([1.0, 6.0, 600.0]), settle_s=rng.choice([0.0, 2.0]))
    plans = {t: plan_of(t, 1, [pjob(f"{t}-{i}", rng.choice("ab"), gpu=i) for i in range(3)]) for t in (1, 2, 3)}
    now = 0.0
    for _ in range(60):
        now += rng.choice([0.001, 0.3, 1.0, 7.0, 40.0])
        term = rng.choice([1, 2, 3])
        leader = rng.choice(["a", "b", None])
        lsh = Leadership(leader, term if leader else None, term + rng.choice([0, 0, 1]), rng.random() < 0.2,
                         {t: rng.choice("ab") for t in (1, 2, 3)})
        if rng.random() < 0.3:
            p = plans[term]
            c.fetched(("part", "b"), part_version(plan_ref(p)), p)
        if rng.random() < 0.1:
            c.job_exited("x", rng.choice([True, False, None]), now)
        running = {f"r{i}": local(f"r{i}", started=now - rng.choice([0.0, 10.0, 100.0]), adopted=rng.random() < 0.3)
                   for i in range(rng.randrange(3))}
        ms = [member("a", offer=rng.choice([0, 2])), member("b", plan=plans[term] if rng.random() < 0.7 else None),
              member("d", state=MemberState.DEAD, since=now - 5)]
        pressure = rng.choice([Pressure(), cpu(now - rng.choice([0.0, 20.0])), mem(now)])
        inp = inputs(lsh, ms, running, level=rng.choice([0, 0, 4]), offer=rng.choice([0, 2]),
                     cordoned=rng.random() < 0.1, pressure=pressure)
        _no_deadline_in_the_past(c, inp, now)


# -- scaling's view of the fleet ---------------------------------------------------------------------------------
def test_scalings_fleet_counts_a_placement_not_started_yet_as_work():
    """A node given work in the plan that also picks nodes for a drain is not idle in the scaling evaluation's
    view: it may be drained, never removed while that job starts."""
    c = core("a", settle_s=0.0)
    lsh = lead("a")
    inp = inputs(lsh, [member("a"), member("b")])
    assert of(drive(c, inp, 1.0), PublishPlan)
    assert c.my_plan is not None and c.last_result is not None
    b_jobs = [a for a in c.my_plan.assignments if a.node == "b"]
    assert b_jobs and not c.last_result.view.running  # placed, none running yet
    fleet = {n.node_id: n for n in c.fleet(inp, c.last_result.view)}
    assert fleet["b"].running == tuple(("sp", 0.0) for _ in b_jobs)
    assert fleet["b"].gpu_used == sum(len(a.gpus) * a.gpu_fraction for a in b_jobs)
    # once they run, each job counts once (the plan's entry for a running job is not added again)
    ms = [member("a"), member("b", running=[report(a.job_id, gpus=a.gpus) for a in b_jobs])]
    drive(c, inputs(lsh, ms), 7.0)  # the next plan, on its cadence
    assert c.last_result.view.running
    assert len({n.node_id: n for n in c.fleet(inputs(lsh, ms), c.last_result.view)}["b"].running) == len(b_jobs)
