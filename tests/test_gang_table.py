"""The leader's gang table (issue 39, item 5) in virtual time: the lifecycle (placing, starting, running, completing
with its grace, ended with its cause), every cause, events with no transition counted and changing nothing, the
bounds, a mutation run over the transition table; the planner's feed; and the table carried across a failover in
the plan: a new leader given only its predecessor's plan keeps a gang whose rank 1 finished, without any job-id
arithmetic, and a hostile plan's gang entry stops nothing."""

import math

import msgspec
import pytest
from test_gangs import _running, cat, gang_job, node

from p2pnode.errors import RejectedMessage
from p2pnode.node._gangs import (
    MAX_RANKS,
    TRANSITIONS,
    UNKNOWN,
    Adopted,
    AllDone,
    AllStarted,
    Disagreed,
    ElasticMemberFailed,
    ElasticMemberLost,
    GangMember,
    GangTable,
    GraceExpired,
    MemberDone,
    MemberFailed,
    MemberJoined,
    MemberLost,
    MemberStarted,
    Placed,
    RankZeroDone,
    Stopped,
    TransitionError,
    observe,
)
from p2pnode.node._plandist import open_whole
from p2pnode.node._plans import MemberPlanInput, Planner
from p2pnode.snapshot import GangSlot, JobReport, PlanGang, PlanGangMember, PlanSection, plan_digest, plan_ref


def placed(gid="7-1", size=3, nodes=("n1", "n2", "n3")):
    return Placed(gid, "ddp", size, tuple(GangMember(r, f"7-{1 + r}", n) for r, n in enumerate(nodes)))


def elastic(gid="7-1", size=3, low=2, nodes=("n1", "n2", "n3")):
    """An elastic gang of ``low:size`` placed on ``nodes`` (ranks 0.., the rest vacant)."""
    members = tuple(GangMember(r, f"7-{1 + r}", n) for r, n in enumerate(nodes))
    return Placed(gid, "ddp", size, members + tuple(GangMember(r, state="vacant") for r in range(len(nodes), size)),
                  min_size=low)


def started(t, now=1.0, ranks=(0, 1, 2), gid="7-1"):
    for r in ranks:
        t.apply(MemberStarted(gid, r), now)


# -- the lifecycle ------------------------------------------------------------------------------------------------
def test_placing_starting_running_then_completing_with_its_grace_then_complete():
    t = GangTable(grace_s=30.0)
    assert t.next_deadline() == math.inf and t.state("7-1") == UNKNOWN
    assert t.apply(placed(), 0.0).state == "placing"
    assert t.apply(MemberStarted("7-1", 1), 1.0).state == "starting"
    t.apply(MemberStarted("7-1", 0), 2.0)
    r = t.apply(MemberStarted("7-1", 2), 3.0)  # every member runs: the table moves it on by itself
    assert r.state == "running" and r.since == 3.0 and {m.state for m in r.members} == {"running"}
    r = t.apply(RankZeroDone("7-1"), 10.0)
    assert r.state == "completing" and r.deadline == 40.0 and t.next_deadline() == 40.0
    r = t.apply(MemberFailed("7-1", 1, "gang 7-1 ended: member rank 1 failed"), 12.0)
    assert r.state == "completing" and r.members[1].state == "failed"  # a straggler in the grace: still completing
    assert t.expire(39.9) == [] and t.state("7-1") == "completing"
    (r,) = t.expire(40.0)
    assert (r.state, r.cause) == ("ended", "complete") and r.reason == "gang 7-1 complete: rank 0 ended 30 s ago"
    assert t.next_deadline() == math.inf and t.ends == {"complete": 1} and t.ended_reasons() == {"7-1": r.reason}
    assert not t.errors


def test_every_member_done_completes_it_at_once():
    t = GangTable(grace_s=30.0)
    t.apply(placed(), 0.0)
    started(t)
    assert t.apply(MemberDone("7-1", 1), 5.0).state == "running"
    assert t.apply(MemberDone("7-1", 2), 6.0).state == "running"
    r = t.apply(RankZeroDone("7-1"), 7.0)  # completing, then every member done: complete, no grace to wait
    assert (r.state, r.cause, r.deadline) == ("ended", "complete", None) and "every member" in r.reason
    assert t.ends == {"complete": 1} and not t.errors


@pytest.mark.parametrize("ev, cause", [
    (MemberFailed("7-1", 2, "gang 7-1 ended: member rank 2 ended, failed or was refused"), "member_gone"),
    (MemberLost("7-1", 2, "gang 7-1 ended: member rank 2 on node n3 is down"), "member_down"),
    (Disagreed("7-1", "gang 7-1 ended: its members disagree"), "disagree"),
    (Stopped("7-1", "preempted by x"), "stopped"),
])
@pytest.mark.parametrize("prefix", ["placing", "starting", "running"])
def test_each_cause_ends_the_gang_from_every_live_state_with_the_reason_its_stops_carry(ev, cause, prefix):
    t = GangTable()
    t.apply(placed(), 0.0)
    started(t, ranks={"placing": (), "starting": (0,), "running": (0, 1, 2)}[prefix])
    assert t.state("7-1") == prefix
    r = t.apply(ev, 9.0)
    assert (r.state, r.cause, r.reason, r.since) == ("ended", cause, ev.reason, 9.0)
    assert t.ends == {cause: 1} and t.ended_reasons() == {"7-1": ev.reason} and not list(t.live())


def test_events_with_no_transition_are_counted_and_change_nothing():
    t = GangTable()
    assert isinstance(t.apply(MemberStarted("9-9", 0), 0.0), TransitionError)  # no such gang
    t.apply(placed(), 0.0)
    started(t, ranks=(0,))
    before = t.get("7-1")
    assert before.state == "starting"
    bad = [placed(),  # placed twice
           MemberStarted("7-1", 0),  # already running (the member's table)
           MemberStarted("7-1", 5),  # no rank 5
           GraceExpired("7-1")]  # not completing
    for ev in bad:
        err = t.apply(ev, 5.0)
        assert isinstance(err, TransitionError) and str(err).startswith("gang ")
        assert t.get("7-1") == before
    started(t, ranks=(1, 2))
    running = t.get("7-1")
    assert isinstance(t.apply(AllStarted("7-1"), 6.0), TransitionError) and t.get("7-1") == running  # running already
    t.apply(MemberFailed("7-1", 0, "x"), 6.0)
    ended = t.get("7-1")
    assert isinstance(t.apply(RankZeroDone("7-1"), 7.0), TransitionError)  # ended: nothing moves it
    assert t.get("7-1") == ended and t.ends == {"member_gone": 1}
    assert t.errors == {(UNKNOWN, "MemberStarted"): 1, ("starting", "Placed"): 1,
                        ("member running", "MemberStarted"): 1, ("member unknown", "MemberStarted"): 1,
                        ("starting", "GraceExpired"): 1,
                        ("running", "AllStarted"): 1, ("ended", "RankZeroDone"): 1}
    assert len(t.recent_errors) == 7


def test_bounded_gangs_ranks_and_ended_records():
    t = GangTable(max_gangs=2, max_ended=2)
    for i in range(3):
        t.apply(placed(gid=f"7-{10 * i + 1}"), 0.0)
    assert [r.gang_id for r in t.live()] == ["7-1", "7-11"] and t.refused == {"full": 1}
    assert isinstance(t.apply(Placed("8-1", "ddp", 2, (GangMember(1, "8-2"), GangMember(0, "8-1"))), 0.0),
                      TransitionError) and t.refused["bad_members"] == 1  # ranks out of order
    too_big = Placed("8-1", "ddp", MAX_RANKS + 1, tuple(GangMember(r) for r in range(MAX_RANKS + 1)))
    assert isinstance(t.apply(too_big, 0.0), TransitionError) and t.refused["bad_members"] == 2
    for i in range(4):
        gid = f"9-{i}"
        t = t if i else GangTable(max_ended=2)
        t.apply(placed(gid=gid), 0.0)
        t.apply(Stopped(gid, "x"), 1.0)
    assert [r.gang_id for r in t.ended()] == ["9-3", "9-2"] and t.ends == {"stopped": 4}


def _drive(transitions, steps):
    """The outcome of ``steps`` (events) on a table following ``transitions``."""
    t = GangTable(grace_s=30.0, transitions=transitions)
    for i, ev in enumerate(steps):
        t.apply(ev, float(i))
    r = t.get("7-1")
    members = tuple(m.state for m in r.members) if r else ()
    return t.state("7-1"), r.cause if r else None, members, sum(t.errors.values())


def _row_scenarios():
    """For every row of :data:`TRANSITIONS`, events that reach its state and then send its event."""
    prefix = {UNKNOWN: [], "placing": [placed()], "starting": [placed(), MemberStarted("7-1", 0)],
              "running": [placed(), *(MemberStarted("7-1", r) for r in range(3))],
              "completing": [placed(), MemberStarted("7-1", 0), RankZeroDone("7-1")]}
    full = {"placing": [elastic()], "starting": [elastic(), MemberStarted("7-1", 0)],
            "running": [elastic(), *(MemberStarted("7-1", r) for r in range(3))]}  # an elastic 2:3 gang of 3
    two = {"placing": [elastic(nodes=("n1", "n2"))], "starting": [elastic(nodes=("n1", "n2")), MemberStarted("7-1", 0)],
           "running": [elastic(nodes=("n1", "n2")), *(MemberStarted("7-1", r) for r in range(2))]}  # rank 2 vacant
    elastic_rows = {ElasticMemberFailed: (full, MemberFailed("7-1", 2)), ElasticMemberLost: (full, MemberLost(
        "7-1", 2)), MemberJoined: (two, MemberJoined("7-1", 2, "7-9", "n4"))}
    event = {Placed: placed(), Adopted: Adopted("7-1", "ddp", 3, placed().members), MemberStarted: MemberStarted(
        "7-1", 1), AllStarted: AllStarted("7-1"), MemberDone: MemberDone("7-1", 2), RankZeroDone: RankZeroDone("7-1"),
        AllDone: AllDone("7-1"), MemberFailed: MemberFailed("7-1", 2), MemberLost: MemberLost("7-1", 2),
        Disagreed: Disagreed("7-1"), Stopped: Stopped("7-1"), GraceExpired: GraceExpired("7-1")}
    out = {row: [*prefix[row[0]], event[row[1]]] if row[1] not in elastic_rows else
           [*elastic_rows[row[1]][0][row[0]], elastic_rows[row[1]][1]] for row in TRANSITIONS}
    out[("running", MemberStarted)] = [*two["running"], MemberJoined("7-1", 2, "7-9", "n4"), MemberStarted("7-1", 2)]
    return out


def test_a_mutation_run_deleting_or_redirecting_any_row_changes_an_outcome():
    scenarios = _row_scenarios()
    assert set(scenarios) == set(TRANSITIONS)  # every row is driven
    real = {row: _drive(TRANSITIONS, steps) for row, steps in scenarios.items()}
    assert all(out[3] == 0 for out in real.values())  # no errors with the real table
    for row, target in TRANSITIONS.items():
        deleted = {k: v for k, v in TRANSITIONS.items() if k != row}
        assert _drive(deleted, scenarios[row]) != real[row], f"deleting {row} went unnoticed"
        other = "running" if target != "running" else "completing"
        redirected = {**TRANSITIONS, row: other}
        assert _drive(redirected, scenarios[row]) != real[row], f"redirecting {row} went unnoticed"


# -- the planner's feed -------------------------------------------------------------------------------------------
def test_the_feed_from_what_runs_ends_completes_or_keeps_a_gang():
    whole = _running()
    t = GangTable(grace_s=30.0)
    observe(t, whole, {r.job_id for r in whole}, set(), set(), set(), 100.0)  # found running without a record
    g = t.get("7-1")
    assert g.adopted and g.state == "running" and [m.job_id for m in g.members] == ["7-1", "7-2", "7-3"]
    partial = _running(nodes=("n1", "n3"), ranks=(0, 2))
    finishing = GangTable()
    observe(finishing, whole, set(), set(), set(), set(), 100.0)
    observe(finishing, partial, {"7-1", "7-3"}, {"7-2"}, set(), set(), 101.0)  # rank 1 exited 0: it holds
    assert finishing.state("7-1") == "running" and finishing.get("7-1").members[1].state == "done"
    gone = GangTable()
    observe(gone, whole, set(), set(), set(), set(), 100.0)
    observe(gone, partial, set(), set(), set(), set(), 101.0)  # rank 1 neither runs nor ended with status 0
    assert gone.get("7-1").cause == "member_gone" and "member rank 1 ended, failed or was refused" in gone.get(
        "7-1").reason
    down = GangTable()
    observe(down, whole, set(), set(), set(), {"n2"}, 100.0)
    assert down.get("7-1").cause == "member_down" and "on node n2 is down" in down.get("7-1").reason
    failed = GangTable()
    observe(failed, whole, set(), set(), {"7-3"}, set(), 100.0)
    assert failed.get("7-1").cause == "member_gone"
    ending = GangTable(grace_s=30.0)  # a new leader: rank 0 (the gang's id) exited 0, ranks 1 and 2 run
    ranks12 = _running(nodes=("n2", "n3"), ranks=(1, 2))
    observe(ending, ranks12, {"7-2", "7-3"}, {"7-1"}, set(), set(), 100.0)
    assert ending.state("7-1") == "completing" and ending.next_deadline() == 130.0
    observe(ending, ranks12, {"7-2", "7-3"}, set(), set(), set(), 129.0)
    assert ending.state("7-1") == "completing"
    observe(ending, ranks12, {"7-2", "7-3"}, set(), set(), set(), 130.0)
    assert ending.get("7-1").cause == "complete"
    odd = whole + (_running(size=2, nodes=("n3",), ranks=(1,))[0]._replace(job_id="9-9"),)
    for order in (odd, odd[::-1]):  # members disagree on the gang, whatever order they are seen in
        t = GangTable()
        observe(t, whole, set(), set(), set(), set(), 99.0)
        observe(t, order, set(), set(), set(), set(), 100.0)
        assert t.get("7-1").cause == "disagree", order


# -- carried across a failover ------------------------------------------------------------------------------------
def _report(j):
    return JobReport(job_id=j.job_id, template=j.template, gpus=list(j.gpus), gpu_fraction=j.gpu_fraction,
                     vram_gib=j.vram_gib, term=j.term, gang=j.gang)


def _member(n, jobs=(), **kw):
    return MemberPlanInput(n, node(n, power=3000 - int(n[1:])), tuple(_report(j) for j in jobs), **kw)


def _renamed(p: PlanSection, names: dict[str, str]) -> PlanSection:
    """``p`` with its job ids (and gang ids) renamed by ``names``, digest recomputed: ids with no arithmetic."""
    def slot(g):
        return msgspec.structs.replace(g, id=names[g.id]) if g is not None else None
    jobs = [msgspec.structs.replace(j, job_id=names[j.job_id], gang=slot(j.gang)) for j in p.assignments]
    gangs = [msgspec.structs.replace(g, id=names[g.id], members=[msgspec.structs.replace(
        m, job_id=names.get(m.job_id, m.job_id)) for m in g.members]) for g in p.gangs]
    return msgspec.structs.replace(p, assignments=jobs, gangs=gangs, digest=plan_digest(jobs, p.stops, gangs))


def _gang_with_rank_1_done(*, running_only=False):
    """A leader (term 7) places a gang of 3 on n1..n3, its members run, rank 1 exits 0: that leader's newest plan
    (rank 1 no longer assigned, the gang running), renamed so that its job ids follow no arithmetic.
    ``running_only``: the plan before rank 1 ended (every member runs)."""
    planner = Planner(cat(gang_job()))
    first = planner.lead(7, [_member(f"n{i}") for i in (1, 2, 3)], None, {}, 100.0, 1e9).section
    by_rank = {j.gang.rank: j for j in first.assignments}
    second = planner.lead(7, [_member(j.node, [j]) for j in first.assignments], first, {}, 105.0, 1e9).section
    assert [(g.state, [m.state for m in g.members]) for g in second.gangs] == [("running", ["running"] * 3)]
    names = {by_rank[0].job_id: "g-alpha", by_rank[1].job_id: "q-17", by_rank[2].job_id: "b-3"}
    if running_only:
        return _renamed(second, names), planner.catalog
    r1 = by_rank[1]
    members = [_member(by_rank[0].node, [by_rank[0]]), _member(r1.node, ended_ok=frozenset({r1.job_id}),
                                                               ended=frozenset({r1.job_id})),
               _member(by_rank[2].node, [by_rank[2]])]
    third = planner.lead(7, members, second, {}, 110.0, 1e9).section
    assert not third.stops and r1.job_id not in {j.job_id for j in third.assignments}
    assert [m.state for m in third.gangs[0].members] == ["running", "done", "running"]
    return _renamed(third, names), planner.catalog


def _survivors(p: PlanSection):
    """n1 and n3 report their members running; n2 (rank 1's node) reports nothing now (its ended list moved on)."""
    return [_member(j.node, [j]) for j in p.assignments if j.gang is not None] + [_member("n2")]


def test_a_new_leader_given_only_the_plan_keeps_a_gang_whose_rank_1_finished():
    prev, catalog = _gang_with_rank_1_done()
    assert len(prev.assignments) == 2 and open_whole(msgspec.msgpack.encode(prev), plan_ref(prev)) == prev
    fresh = Planner(catalog)
    out = fresh.lead(8, _survivors(prev), prev, {}, 500.0, 2e9).section
    assert not out.stops and not [j for j in out.assignments if j.job_id not in {"g-alpha", "b-3"}]  # nothing anew
    g = fresh.gangs.get("g-alpha")
    assert g.carried and g.state == "running" and [(m.job_id, m.state) for m in g.members] == [
        ("g-alpha", "running"), ("q-17", "done"), ("b-3", "running")]
    later = fresh.lead(8, _survivors(out), out, {}, 900.0, 2e9).section  # long after: still whole
    assert not later.stops and fresh.gangs.state("g-alpha") == "running" and not fresh.gangs.ends
    rank0 = next(j for j in later.assignments if j.job_id == "g-alpha")  # rank 0 exits 0: completing, then complete
    rest = [_member(rank0.node, ended_ok=frozenset({"g-alpha"}), ended=frozenset({"g-alpha"})),
            *(_member(j.node, [j]) for j in later.assignments if j.job_id == "b-3"), _member("n2")]
    done = fresh.lead(8, rest, later, {}, 901.0, 2e9).section
    assert not done.stops and fresh.gangs.state("g-alpha") == "completing"
    end = fresh.lead(8, rest, done, {}, 931.0, 2e9).section
    assert [(s.job_id, s.rule) for s in end.stops] == [("b-3", "gang_ended")] and fresh.gangs.ends == {"complete": 1}


def test_without_the_gang_table_the_same_plan_ends_the_gang_no_ids_are_read():
    """A predecessor that predates the table (its plan has no gangs): rank 1's end is not known, and no job-id
    arithmetic recovers it: the gang ends as one that lost a member (the rolling-upgrade fallback)."""
    prev, catalog = _gang_with_rank_1_done()
    old = msgspec.structs.replace(prev, gangs=[], digest=plan_digest(prev.assignments, prev.stops))
    fresh = Planner(catalog)
    out = fresh.lead(8, _survivors(old), old, {}, 500.0, 2e9).section
    assert {s.job_id for s in out.stops} == {"g-alpha", "b-3"} and fresh.gangs.ends == {"member_gone": 1}
    assert fresh.gangs.get("g-alpha").adopted


def _hostile(prev: PlanSection, **change) -> PlanSection:
    g = prev.gangs[0]
    members = change.pop("members", None)
    bad = msgspec.structs.replace(g, **change, **({"members": members(g.members)} if members else {}))
    return msgspec.structs.replace(prev, gangs=[bad], digest=plan_digest(prev.assignments, prev.stops, [bad]))


def _set(ms, rank, **kw):
    return [msgspec.structs.replace(m, **kw) if m.rank == rank else m for m in ms]


@pytest.mark.parametrize("why, change", [
    ("ended_but_assigned", {"state": "ended", "cause": "member_gone", "reason": "gang g-alpha ended: forged"}),
    ("mismatch", {"state": "completing", "grace_left_s": 1.0, "members": lambda ms: _set(ms, 0, state="done")}),
    ("mismatch", {"state": "completing", "members": lambda ms: _set(_set(ms, 0, state="done"), 2, state="lost")}),
    ("mismatch", {"members": lambda ms: _set(ms, 2, state="failed")}),
    ("mismatch", {"members": lambda ms: _set(ms, 1, state="done")}),  # a member the plan holds said done
    ("mismatch", {"members": lambda ms: _set(ms, 0, node="n9")}),
    ("mismatch", {"members": lambda ms: _set(ms, 2, job_id="x-1")}),
    ("mismatch", {"size": 4, "members": lambda ms: [*ms, PlanGangMember(rank=3, job_id="z-1", node="n4")]}),
    ("bad_members", {"members": lambda ms: ms[::-1]}),
    ("unknown_state", {"state": "exploded"}),
    ("unknown_state", {"state": "ended"}),  # ended without a cause
    ("unknown_state", {"members": lambda ms: _set(ms, 1, state="vanished")}),
])
def test_a_hostile_plans_gang_entry_is_ignored_counted_and_stops_nothing(why, change):
    """Every member runs; the predecessor's plan (its digest recomputed: the leader's own word) says otherwise of
    the gang in ways its assignments contradict. The new leader ignores the entry, counts it, and stops no member:
    not at once, nor after any grace the entry could have set."""
    prev, catalog = _gang_with_rank_1_done(running_only=True)
    bad = _hostile(prev, **change)
    fresh = Planner(catalog)
    everyone = [_member(j.node, [j]) for j in bad.assignments]
    out = fresh.lead(8, everyone, bad, {}, 500.0, 2e9).section
    assert fresh.gangs.rejected == {why: 1} and fresh.gangs.seeded == 0
    later = fresh.lead(8, everyone, out, {}, 600.0, 2e9).section
    assert not out.stops and not later.stops and not fresh.gangs.ends
    assert fresh.gangs.state("g-alpha") == "running" and fresh.gangs.get("g-alpha").adopted
    honest = Planner(catalog)  # the same plan, untouched: its entry is believed
    honest.lead(8, everyone, prev, {}, 500.0, 2e9)
    assert honest.gangs.seeded == 1 and not honest.gangs.rejected and honest.gangs.get("g-alpha").carried


def test_the_plan_carries_the_table_bounded_typed_and_in_its_digest():
    prev, _ = _gang_with_rank_1_done()
    wire = msgspec.msgpack.encode(prev)
    assert msgspec.msgpack.decode(wire, type=PlanSection).gangs == prev.gangs
    tampered = _hostile(prev, members=lambda ms: _set(ms, 2, state="done"))
    body = msgspec.msgpack.encode(msgspec.structs.replace(tampered, digest=prev.digest))
    with pytest.raises(RejectedMessage):  # the table is the leader's word: its ref's digest covers it
        open_whole(body, plan_ref(prev))
    older = msgspec.structs.replace(prev, gangs=[], digest="")
    assert plan_digest(older.assignments, older.stops, []) == plan_digest(older.assignments, older.stops)
    assert "gangs" not in msgspec.msgpack.decode(msgspec.msgpack.encode(older))  # an older agent's plan, unchanged
    for bad in ({"id": "g", "size": 65}, {"id": "g", "members": [{"rank": 64}]}, {"id": "g", "state": "Running"},
                {"id": "g", "members": [{"rank": 0, "job_id": "bad id"}]}, {"id": "g", "reason": "x" * 513}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, PlanGang)
    assert msgspec.convert({"term": 3}, PlanSection).gangs == []  # a plan without the field: none


def test_the_table_round_trips_through_the_plan_and_a_completing_grace_restarts_bounded():
    t = GangTable(grace_s=30.0)
    t.apply(placed(), 0.0)
    started(t, ranks=(0, 1, 2))
    t.apply(RankZeroDone("7-1"), 10.0)
    slots = {r: GangSlot(id="7-1", rank=r, size=3, master="h", master_port=29400, port_base=29400) for r in (1, 2)}
    from p2pnode.snapshot import PlanJob
    jobs = [PlanJob(job_id=f"7-{1 + r}", node=f"n{1 + r}", template="ddp", term=7, gang=slots[r]) for r in (1, 2)]
    gangs = t.to_plan(25.0)
    assert gangs[0].state == "completing" and gangs[0].grace_left_s == 15.0
    p = PlanSection(term=7, seq=3, assignments=jobs, gangs=gangs, digest=plan_digest(jobs, [], gangs))
    other = GangTable(grace_s=30.0)
    other.seed(p, 1000.0)  # another leader's clock: the grace restarts with what was left, never more than it
    g = other.get("7-1")
    assert g.carried and g.state == "completing" and g.deadline == 1015.0 and other.next_deadline() == 1015.0
    assert [m.state for m in g.members] == ["done", "running", "running"] and other.seeded == 1


def test_the_leader_plans_when_a_completing_gangs_grace_ends_not_a_whole_interval_later():
    from test_job_core import core, drive, inputs, lead, member

    c = core("a", interval_s=300.0, settle_s=0.0)
    inp = inputs(lead("a"), [member("a"), member("b")])
    drive(c, inp, 0.0)
    assert c.my_plan is not None and c.next_deadline() == pytest.approx(300.0)  # the cadence alone
    t = c.planner.gangs
    t.apply(placed(nodes=("a", "b", "b")), 0.0)
    t.apply(RankZeroDone("7-1"), 10.0)
    assert t.next_deadline() == 40.0 and c.next_deadline() == pytest.approx(40.0)  # the grace's end
    t.apply(Stopped("7-1", "x"), 11.0)
    assert c.next_deadline() == pytest.approx(300.0)


def test_a_leader_back_after_another_forgets_the_gangs_the_newer_plan_no_longer_holds():
    t = GangTable()
    t.apply(placed(), 0.0)  # led term 7 once; term 8's leader ended the gang and dropped it
    t.apply(placed(gid="7-11", nodes=("n1", "n2", "n4")), 0.0)
    slot = GangSlot(id="7-11", rank=0, size=3, master="h", master_port=29400, port_base=29400)
    from p2pnode.snapshot import PlanJob
    newer = PlanSection(term=8, seq=2, assignments=[PlanJob(job_id="7-11", node="n1", template="ddp", gang=slot)])
    t.seed(newer, 50.0)
    assert [r.gang_id for r in t.live()] == ["7-11"] and t.forgotten == 1 and not t.ends


def test_a_failed_planning_attempt_changes_no_gang_and_the_fail_closed_retry_stops_none():
    """Review of issue 39 (HIGH): the leader retries planning without each suspect member in turn; an attempt that
    leaves out an innocent member must not end that member's gang (``member_gone``) before the planner raises, or
    the attempt that succeeds stops every member of it (``gang_ended``)."""
    import types

    from p2pnode.node._lead import Leading
    from p2pnode.scheduler import plan as real_plan

    poison = {"on": False}

    def plan_fn(view, *a, **k):
        if poison["on"] and "n4" in view.nodes:  # n4's data breaks the planner (a decoder gap)
            raise ValueError("n4's data slipped past the decoder")
        return real_plan(view, *a, **k)

    planner = Planner(cat(gang_job()), plan_fn=plan_fn)
    first = planner.lead(7, [_member(f"n{i}") for i in (1, 2, 3)], None, {}, 100.0, 1e9).section
    second = planner.lead(7, [_member(j.node, [j]) for j in first.assignments], first, {}, 105.0, 1e9).section
    gid = next(j.gang.id for j in second.assignments if j.gang is not None and j.gang.rank == 0)
    assert planner.gangs.state(gid) == "running"
    before = (planner.gangs.to_plan(105.0), dict(planner.gangs.errors), planner.gangs.seeded)

    poison["on"] = True
    items = [_member(j.node, [j]) for j in second.assignments] + [_member("n4")]
    with pytest.raises(ValueError):  # without innocent n2 (its rank is gone) and with n4: the planner raises
        planner.lead(7, [m for m in items if m.node_id != "n2"], second, {}, 110.0, 1e9)
    assert (planner.gangs.to_plan(105.0), dict(planner.gangs.errors), planner.gangs.seeded) == before
    assert planner.gangs.state(gid) == "running" and not planner.gangs.ends

    core = types.SimpleNamespace(node_id="leader", planner=planner, scaling=None, predictor=None)
    op = types.SimpleNamespace(runs=[], done_runs=(), cordoned=False)
    inp = types.SimpleNamespace(
        members=[types.SimpleNamespace(origin=i.node_id, operator=op, live=True, noticed=False) for i in items],
        leadership=types.SimpleNamespace(leaders_by_term={7: "leader"}), signals={}, wall=1e9)
    lead = Leading.__new__(Leading)
    lead.core, lead.planning_errors = core, 0
    out: list = []
    r = lead._plan_failing_closed(inp, 7, items, second, None, 110.0, out)
    assert [e.origin for e in out] == ["n4"]  # the suspect alone is quarantined
    assert planner.gangs.state(gid) == "running" and not planner.gangs.ends and not r.section.stops


def test_a_failed_planning_attempt_restarts_no_members_grace():
    """A member whose running list is unknown keeps the time it was first planned so: an attempt that left it out
    and failed does not restart its grace."""
    poison = {"on": False}

    def plan_fn(view, *a, **k):
        if poison["on"]:
            raise ValueError("a member's data slipped past the decoder")
        from p2pnode.scheduler import plan as real_plan
        return real_plan(view, *a, **k)

    planner = Planner(cat(gang_job()), plan_fn=plan_fn)
    planner.lead(7, [_member("n1"), _member("n2", running_known=False)], None, {}, 100.0, 1e9)
    assert planner.unknown_since == {"n2": 100.0}
    poison["on"] = True
    with pytest.raises(ValueError):
        planner.lead(7, [_member("n1")], None, {}, 110.0, 1e9)
    assert planner.unknown_since == {"n2": 100.0}


def test_a_leader_restarted_within_its_term_issues_no_id_of_an_ended_gang_again():
    """Review of issue 39: a leader restarted within its term (its sequence lost) continued above the running jobs'
    ids only; the carried plan's ended gang keeps its id, which then named the new gang: its members were stopped
    as ``gang_ended``. New ids continue above every id of the term the carried plan names."""
    def busy(n, jobs=(), **kw):
        return MemberPlanInput(n, node(n, offer=0), tuple(_report(j) for j in jobs), **kw)

    c = cat(gang_job())
    a = Planner(c)
    p1 = a.lead(7, [_member(f"n{i}") for i in (1, 2, 3)], None, {}, 100.0, 1e9).section
    by_rank = {j.gang.rank: j for j in p1.assignments}
    r1 = by_rank[1]  # ranks 0 and 2 run, rank 1 failed: the gang ends, its members are stopped, then gone
    p2 = a.lead(7, [busy(by_rank[0].node, [by_rank[0]]), busy(r1.node, ended=frozenset({r1.job_id})),
                    busy(by_rank[2].node, [by_rank[2]])], p1, {}, 105.0, 1e9).section
    p3 = a.lead(7, [busy(f"n{i}") for i in (1, 2, 3)], p2, {}, 110.0, 1e9).section
    assert not p3.assignments and [(g.id, g.state) for g in p3.gangs] == [(by_rank[0].job_id, "ended")]

    b = Planner(c)  # the same leader restarted within term 7; nothing runs
    p4 = b.lead(7, [_member(f"n{i}") for i in (1, 2, 3)], p3, {}, 200.0, 2e9).section
    assert len(p4.assignments) == 3 and not {j.job_id for j in p4.assignments} & {j.job_id for j in p1.assignments}
    assert not b.gangs.errors
    p5 = b.lead(7, [_member(j.node, [j]) for j in p4.assignments], p4, {}, 205.0, 2e9).section
    assert not p5.stops and sorted(j.job_id for j in p5.assignments) == sorted(j.job_id for j in p4.assignments)
