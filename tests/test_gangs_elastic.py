"""Elastic gangs (issue 41, item 4) in the pure parts: ``[job.gang] members = "MIN:MAX"`` in the catalog (torchrun
only), torchrun's elastic command line (``--nnodes MIN:MAX``, a c10d rendezvous at rank 0, ``--max-restarts``), the
planner placing MIN to MAX members and giving a running gang's free ranks new members, and the leader's gang table
in virtual time: a member lost above the minimum leaves the gang running, the rendezvous host's loss or too few
members end it, a new member joins a free rank, and the table is carried across a failover with its lost members."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gangs import cat, gang_job, node, run

from p2pnode.node._engines import TORCHRUN_MAX_RESTARTS, engine_command, gang_env
from p2pnode.node._gangs import (
    LIVE,
    GangMember,
    GangTable,
    MemberDone,
    MemberFailed,
    MemberJoined,
    MemberLost,
    MemberStarted,
    Placed,
    TransitionError,
    observe,
    placed_from,
)
from p2pnode.scheduler import CatalogError, ClusterView, RunningJob, parse_catalog, plan_violations
from p2pnode.snapshot import GangSlot, PlanJob, PlanSection, plan_digest


# -- the catalog --------------------------------------------------------------------------------------------------
def test_members_min_max_makes_an_elastic_torchrun_gang_and_an_integer_stays_static():
    g = cat(gang_job(members="2:4")).templates["ddp"].gang
    assert (g.min_members, g.members, g.minimum, g.elastic) == (2, 4, 2, True)
    g = cat(gang_job(members=3)).templates["ddp"].gang
    assert (g.min_members, g.members, g.minimum, g.elastic) == (0, 3, 3, False)
    g = cat(gang_job(members="3:3", engine="ray")).templates["ddp"].gang  # N:N is the static gang of N
    assert (g.min_members, g.members, g.elastic) == (0, 3, False)
    assert cat(gang_job(members="1:2")).templates["ddp"].gang.minimum == 1


@pytest.mark.parametrize(("members", "engine", "words"), [
    ("2:4", "ray", "runs under engine = \"torchrun\" only"),
    ("2:4", "process", "runs under engine = \"torchrun\" only"),
    ("0:3", "torchrun", "needs 1 <= MIN <= MAX"),
    ("4:2", "torchrun", "needs 1 <= MIN <= MAX"),
    ("2:65", "torchrun", "MAX 2-64"),
    ("02:4", "torchrun", "needs 1 <= MIN <= MAX"),
    ("1:1", "torchrun", "MAX 2-64"),
    ("two:4", "torchrun", "or \"MIN:MAX\""),
    (" 2:4", "torchrun", "or \"MIN:MAX\""),
    ("2:4\n", "torchrun", "or \"MIN:MAX\""),
    (1, "torchrun", "an integer 2-64"),
    (True, "torchrun", "an integer 2-64"),
])
def test_a_bad_or_misplaced_min_max_is_refused_with_the_rule(members, engine, words):
    with pytest.raises(CatalogError) as e:
        parse_catalog({"job": [gang_job(members=members, engine=engine)]})
    assert words in str(e.value) and "gang.members" in str(e.value), str(e.value)


# -- the command line ---------------------------------------------------------------------------------------------
def _slot(rank=0, low=2, size=3):
    return GangSlot(id="7-1", rank=rank, size=size, master="10.0.0.1", master_port=29400,
                    port_base=29400 + 64 * rank, ports=64, engine="torchrun", min_size=low)


def test_torchrun_runs_an_elastic_member_with_a_c10d_rendezvous_at_rank_0():
    for rank, host in ((0, "1"), (2, "0")):
        argv, env = engine_command("torchrun", ["train.py"], python="/py", slot=_slot(rank), num_gpus=2,
                                   num_cpus=1, memory_gib=1, own_host="10.0.0.9", ray_member="rm.py")
        assert argv == ["/py", "-m", "torch.distributed.run", "--nnodes", "2:3", "--nproc-per-node", "2",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "7-1",
                        "--rdzv-conf", f"is_host={host}", "--local-addr", "10.0.0.9",
                        "--max-restarts", str(TORCHRUN_MAX_RESTARTS), "train.py"]
        assert env["NNODES"] == "2:3" and env["P2PNODE_GANG_MIN"] == "2" and "NODE_RANK" not in env
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # a store per round (tests/test_elastic_torchrun.py)
        assert env["P2PNODE_GANG_RANK"] == str(rank) and env["MASTER_ADDR"] == "10.0.0.1"
    v6 = GangSlot(id="7-1", rank=1, size=3, master="fd00::1", master_port=29400, port_base=29464, ports=64,
                  engine="torchrun", min_size=1)
    argv, _ = engine_command("torchrun", [], python="/py", slot=v6, num_gpus=0, num_cpus=1, memory_gib=1,
                             own_host="fd00::2", ray_member="rm.py")
    assert argv[argv.index("--rdzv-endpoint") + 1] == "[fd00::1]:29400"
    static = gang_env(_slot(1, low=0), "torchrun")  # a static gang keeps its node rank
    assert static["NODE_RANK"] == "1" and static["NNODES"] == "3" and "P2PNODE_GANG_MIN" not in static
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in static
    with pytest.raises(ValueError):
        _slot(0, low=3, size=3)  # the minimum is below the size


# -- the planner --------------------------------------------------------------------------------------------------
def _nodes(k, **kw):
    return {f"n{i}": node(f"n{i}", power=3000.0 - i, **kw) for i in range(1, k + 1)}


def test_an_elastic_gang_is_placed_with_its_most_members_it_can_and_at_least_its_minimum():
    c = cat(gang_job(members="2:3"))
    full = run(ClusterView(_nodes(3)), c)
    assert sorted(a.gang.rank for a in full.assignments) == [0, 1, 2]
    assert {(a.gang.size, a.gang.min_size) for a in full.assignments} == {(3, 2)}
    assert plan_violations(ClusterView(_nodes(3)), c, full) == []
    two = run(ClusterView(_nodes(2)), c)  # two nodes: the gang starts with two members, rank 2 left vacant
    assert sorted(a.gang.rank for a in two.assignments) == [0, 1] and {a.gang.size for a in two.assignments} == {3}
    assert {a.gang.master for a in two.assignments} == {"10.0.0.1"}  # rank 0 the strongest: the rendezvous
    assert plan_violations(ClusterView(_nodes(2)), c, two) == []
    one = run(ClusterView(_nodes(1)), c)
    assert not one.assignments and "unsatisfiable: gang of 2 needs 2 nodes" in one.pending[0].reason
    busy = dict(_nodes(2), n2=node("n2", offer=0), n3=node("n3", offer=0))
    waits = run(ClusterView(busy), c)
    assert not waits.assignments and "gang of 2:3 needs 2 nodes that can take a member now: 1 can" in \
        waits.pending[0].reason, waits.pending[0].reason
    static = run(ClusterView(_nodes(2)), cat(gang_job(members=3)))
    assert not static.assignments  # a static gang: all or nothing


def _members(ranks, nodes, low=2, size=3, gid="7-1"):
    return tuple(RunningJob(f"7-{1 + r}", "ddp", n, (0,), 1.0, 16.0, 0.0, 7, None, GangSlot(
        id=gid, rank=r, size=size, master="10.0.0.1", master_port=29400, port_base=29400, ports=64,
        engine="torchrun", min_size=low)) for r, n in zip(ranks, nodes, strict=True))


def test_a_running_elastic_gang_gets_a_member_back_on_a_free_node():
    c = cat(gang_job(members="2:3"))
    nodes = _nodes(3)
    two = _members((0, 1), ("n1", "n2"))  # rank 2's member is gone; n3 is free
    p = run(ClusterView(nodes, two), c)
    [a] = p.assignments
    assert a.node_id == "n3" and a.job_id == "7-1" and a.gang.id == "7-1" and a.gang.rank == 2
    assert (a.gang.size, a.gang.min_size, a.gang.master, a.gang.master_port) == (3, 2, "10.0.0.1", 29400)
    assert a.gang.port_base == 29400  # n3 holds no block: its first
    assert not p.stops and plan_violations(ClusterView(nodes, two), c, p) == []
    assert not run(ClusterView(_nodes(2), two), c).assignments  # no free node: it runs with two
    roomy = _nodes(2, gpus=2)  # room for a second member on n1 and n2: strict_spread puts none there
    assert not run(ClusterView(roomy, two), c).assignments
    roomy["n3"] = node("n3", gpus=2)
    [a] = run(ClusterView(roomy, two), c).assignments
    assert a.node_id == "n3"
    spread = cat(gang_job(members="2:4", placement={"strategy": "spread"}))
    three = run(ClusterView(dict(_nodes(2, gpus=2), n3=node("n3", gpus=2)), _members((0, 1), ("n1", "n2"), size=4)),
                spread)
    assert [(a.node_id, a.gang.rank) for a in three.assignments][0] == ("n3", 2) and len(three.assignments) == 2
    assert not run(ClusterView(nodes, _members((0, 1, 2), ("n1", "n2", "n3"))), c).assignments  # whole
    assert not run(ClusterView(nodes, _members((1, 2), ("n2", "n3"))), c).assignments  # no rendezvous host
    ended = run(ClusterView(nodes, two, {"7-1": "gang 7-1 ended"}), c)
    assert {s.job_id for s in ended.stops} == {"7-1", "7-2"}  # ended: stopped, and placed again whole, none joins
    assert sorted(a.gang.rank for a in ended.assignments) == [0, 1, 2]
    static = run(ClusterView(nodes, _members((0, 1), ("n1", "n2"), low=0)), cat(gang_job(members=3)))
    assert not static.assignments  # a static gang with a rank missing: the table ends it, nothing joins


def test_a_member_added_takes_each_free_rank_once_and_keeps_the_same_tag():
    c = cat(gang_job(members="2:4", gang={"same": ["provider"]}))
    nodes = {**{f"n{i}": node(f"n{i}", tags=("provider=a",)) for i in (1, 2, 3)}, "n4": node("n4", tags=(
        "provider=b",))}
    two = _members((0, 2), ("n1", "n2"), size=4)
    p = run(ClusterView(nodes, two), c)
    [a] = p.assignments  # ranks 1 and 3 are free; only n3 shares the provider
    assert a.node_id == "n3" and a.gang.rank == 1 and plan_violations(ClusterView(nodes, two), c, p) == []


# -- the gang table -----------------------------------------------------------------------------------------------
def _fed(table, running, now, *, down=(), failed=(), ended_ok=()):
    observe(table, running, {r.job_id for r in running}, set(ended_ok), set(failed), set(down), now)


def test_losing_a_member_above_the_minimum_keeps_the_gang_and_a_new_member_joins_its_rank():
    t = GangTable()
    whole = _members((0, 1, 2), ("n1", "n2", "n3"))
    t.planned(placed_from(_assignments(whole)), [], 0.0)
    _fed(t, whole, 1.0)
    assert t.state("7-1") == "running" and t.get("7-1").min_size == 2
    _fed(t, whole, 2.0, down={"n3"})  # rank 2's node is declared dead: the gang goes on with two
    g = t.get("7-1")
    assert g.state == "running" and [m.state for m in g.members] == ["running", "running", "lost"]
    assert not t.ends and not t.ended_reasons()
    _fed(t, whole[:2], 3.0)  # its job no longer counted: nothing more happens
    assert t.state("7-1") == "running" and sum(t.errors.values()) == 0
    new = RunningJob("8-5", "ddp", "n4", (0,), 1.0, 16.0, 0.0, 8, None, GangSlot(
        id="7-1", rank=2, size=3, master="10.0.0.1", master_port=29400, port_base=29400, ports=64,
        engine="torchrun", min_size=2))
    t.planned(placed_from(_assignments([new])), [], 4.0)  # the plan gave rank 2 to a new member on n4
    g = t.get("7-1")
    assert g.state == "running" and g.members[2].job_id == "8-5" and g.members[2].node == "n4"
    assert g.members[2].state == "assigned"
    _fed(t, (*whole[:2], new), 5.0)
    assert [m.state for m in t.get("7-1").members] == ["running"] * 3 and sum(t.errors.values()) == 0
    _fed(t, (*whole[:2], new), 6.0, failed={"8-5"})  # a member that fails (its node alive) goes the same way
    assert t.state("7-1") == "running" and t.get("7-1").members[2].state == "failed"


def test_the_rendezvous_host_lost_or_too_few_members_end_an_elastic_gang():
    whole = _members((0, 1, 2), ("n1", "n2", "n3"))
    t = GangTable()
    _fed(t, whole, 1.0)  # (adopted: found running)
    _fed(t, whole, 2.0, down={"n1"})
    g = t.get("7-1")
    assert g.state == "ended" and g.cause == "member_down" and "rank 0 hosts the rendezvous" in g.reason, g.reason
    t = GangTable()
    _fed(t, whole, 1.0)
    _fed(t, whole, 2.0, down={"n2", "n3"})  # two lost at once: the first goes, the second leaves one of 2
    g = t.get("7-1")
    assert g.state == "ended" and g.cause == "member_down" and "1 members left, below the minimum 2" in g.reason
    assert t.ends == {"member_down": 1}
    t = GangTable()
    _fed(t, whole[:2], 1.0)  # adopted with rank 2 vacant (no member reports it): it runs with two
    assert t.state("7-1") == "running" and t.get("7-1").members[2].state == "vacant"
    _fed(t, whole[:2], 2.0, failed={"7-2"})
    assert t.get("7-1").cause == "member_gone" and "below the minimum 2" in t.get("7-1").reason


def test_a_member_joins_only_a_free_rank_of_an_elastic_gang():
    t = GangTable()
    whole = _members((0, 1, 2), ("n1", "n2", "n3"))
    _fed(t, whole, 1.0)
    assert isinstance(t.apply(MemberJoined("7-1", 1, "8-1", "n4"), 2.0), TransitionError)  # rank 1 is held
    static = _members((0, 1, 2), ("n1", "n2", "n3"), low=0, gid="7-9")
    _fed(t, static, 1.0)
    assert isinstance(t.apply(MemberJoined("7-9", 1, "8-1", "n4"), 2.0), TransitionError)  # not elastic
    assert t.errors == {("member running", "MemberJoined"): 1, ("running", "MemberJoined"): 1}
    assert isinstance(t.apply(MemberStarted("7-1", 1), 3.0), TransitionError)  # (already running)


def _assignments(running):
    from p2pnode.scheduler import Assignment
    return [Assignment(job_id=r.job_id, template=r.template, node_id=r.node_id, gpus=r.gpus, gpu_fraction=1.0,
                       vram_gib=16.0, params=(), term=r.term, score=0.0, gang=r.gang) for r in running]


def test_the_table_is_carried_with_its_lost_members_and_a_static_gang_is_not_believed_with_one():
    t = GangTable()
    whole = _members((0, 1, 2), ("n1", "n2", "n3"))
    _fed(t, whole, 1.0)
    _fed(t, whole, 2.0, down={"n3"})
    _fed(t, whole[:2], 3.0)
    gangs = t.to_plan(3.0)
    assert gangs[0].min_size == 2 and [m.state for m in gangs[0].members] == ["running", "running", "lost"]
    jobs = [PlanJob(job_id=r.job_id, node=r.node_id, template="ddp", gang=r.gang) for r in whole[:2]]
    plan = PlanSection(term=8, seq=1, digest=plan_digest(jobs, []), assignments=jobs, gangs=gangs)
    heir = GangTable()
    heir.seed(plan, 10.0)
    g = heir.get("7-1")
    assert heir.seeded == 1 and g.state == "running" and g.min_size == 2 and g.members[2].state == "lost"
    _fed(heir, whole[:2], 11.0)
    assert heir.state("7-1") == "running" and sum(heir.errors.values()) == 0
    forged = [msgspec_replace(gangs[0], min_size=0)]  # the same entry as a static gang's: a lost member ends it
    other = GangTable()
    other.seed(PlanSection(term=8, seq=1, digest=plan.digest, assignments=jobs, gangs=forged), 10.0)
    assert other.rejected == {"mismatch": 1}


def msgspec_replace(x, **kw):
    import msgspec
    return msgspec.structs.replace(x, **kw)


_STEPS = st.lists(st.tuples(st.sampled_from(["start", "lose", "fail", "join", "done"]), st.integers(0, 3)),
                  max_size=40)


@settings(max_examples=300, deadline=None)
@given(low=st.integers(1, 3), placed=st.integers(1, 4), steps=_STEPS)
def test_any_run_of_losses_and_joins_keeps_a_live_elastic_gang_above_its_minimum_with_its_rendezvous(
        low, placed, steps):
    """Whatever members of an elastic ``low:4`` gang start, are lost, fail, join or finish, in any order: a gang
    that is not ended (nor completing) holds at least ``low`` members and rank 0 holds one; it ended for a loss only
    when that loss was rank 0's or left fewer than ``low``; a rank is never held by two job ids; nothing the table
    refuses changes it."""
    placed = max(placed, low)
    t = GangTable()
    members = tuple(GangMember(r, f"7-{1 + r}", f"n{r}") if r < placed else GangMember(r, state="vacant")
                    for r in range(4))
    t.apply(Placed("7-1", "ddp", 4, members, min_size=low), 0.0)
    seq = 10
    for i, (what, rank) in enumerate(steps):
        before = t.get("7-1")
        seq += 1
        ev = {"start": MemberStarted("7-1", rank), "lose": MemberLost("7-1", rank), "fail": MemberFailed("7-1", rank),
              "join": MemberJoined("7-1", rank, f"7-{seq}", f"n{seq}"),
              "done": MemberDone("7-1", rank) if rank else MemberStarted("7-1", 0)}[what]
        got = t.apply(ev, float(i + 1))
        after = t.get("7-1")
        if isinstance(got, TransitionError):
            assert after == before
            continue
        if after.state in ("placing", "starting", "running"):
            assert after.holds() >= low and after.members[0].state in ("assigned", "running"), after
        if after.state == "ended" and what in ("lose", "fail") and before.state in ("placing", "starting", "running"):
            assert rank == 0 or before.holds() - 1 < low, (before, after)
        held = [m.job_id for m in after.members if m.state not in ("vacant", "failed", "lost")]
        assert len(held) == len(set(held))
        if after.state not in LIVE:
            break
