"""Gangs (issue 26) in the pure planner and the engine commands: all-or-nothing placement, one job for quotas and
max_concurrency, rank 0 the strongest, port blocks, engines, and the lifecycle rules (the planner stops every member
of a gang the leader's gang table ended, rank 0 done completes it, preemption takes a whole gang)."""

import pytest

from p2pnode.node._engines import engine_command, gang_env, ray_ports
from p2pnode.scheduler import (
    CatalogError,
    ClusterView,
    GpuView,
    NodeView,
    RunningJob,
    SchedulerConfig,
    parse_catalog,
    plan,
    plan_violations,
)
from p2pnode.snapshot import GangSlot


def gang_job(name="ddp", members=3, engine="torchrun", kind="training", **kw):
    d = {"name": name, "kind": kind, "config": kw.pop("config", "hex8_2p"), "engine": engine,
         "argv": ["{catalog_dir}/ddp.py"], "gang": {"members": members, **kw.pop("gang", {})},
         "resources": kw.pop("resources", {"num_gpus": 1, "vram_gib": 16})}
    d.update(kw)
    return d


def node(nid, gpus=1, vram=80.0, power=2000.0, engines=("process", "torchrun"), offer=4, tags=(), host=None):
    return NodeView(nid, tuple(GpuView(i, vram) for i in range(gpus)), frozenset(tags), offer=offer, cpu_offer=4,
                    cpus=16, memory_gib=64, host=host if host is not None else f"10.0.0.{nid[-1]}",
                    engines=frozenset(engines), power=power)


def cat(*jobs):
    return parse_catalog({"job": list(jobs)})


def run(view, c, **kw):
    return plan(view, c, {}, 100.0, term=7, **kw)


def test_a_gang_is_placed_whole_one_member_per_node_rank_0_the_strongest():
    c = cat(gang_job())
    view = ClusterView({"n1": node("n1", power=624), "n2": node("n2", power=2500), "n3": node("n3", power=2000)})
    p = run(view, c)
    assert len(p.assignments) == 3 and not p.pending
    by_rank = sorted(p.assignments, key=lambda a: a.gang.rank)
    assert [a.node_id for a in by_rank] == ["n2", "n3", "n1"]  # H200 first: rank 0 is the rendezvous
    gid = by_rank[0].job_id
    assert {a.gang.id for a in p.assignments} == {gid} and {a.gang.size for a in p.assignments} == {3}
    assert all(a.gang.master == "10.0.0.2" and a.gang.master_port == by_rank[0].gang.port_base for a in by_rank)
    assert [a.job_id for a in by_rank] == ["7-1", "7-2", "7-3"]  # ids in rank order, the gang's is rank 0's
    assert all(a.gang.engine == "torchrun" and 29400 <= a.gang.port_base <= 30399 for a in by_rank)
    assert plan_violations(view, c, p) == []


def test_all_or_nothing_and_the_reasons_it_waits():
    c = cat(gang_job(members=4))
    three = {f"n{i}": node(f"n{i}") for i in range(1, 4)}
    p = run(ClusterView(three), c)
    assert not p.assignments
    assert p.pending[0].reason.startswith("unsatisfiable: gang of 4 needs 4 nodes"), p.pending[0].reason
    c3 = cat(gang_job(members=3))
    busy = dict(three, n3=node("n3", offer=0))  # one node offers nothing now: no partial gang
    p = run(ClusterView(busy), c3)
    assert not p.assignments and "gang of 3 needs 3 nodes that can take a member now: 2 can" in p.pending[0].reason
    ray = cat(gang_job(engine="ray"))
    p = run(ClusterView(three), ray)
    assert not p.assignments and p.pending[0].reason.startswith("unsatisfiable: no node has engine ray")


def test_a_node_without_the_engine_never_gets_a_member():
    c = cat(gang_job(members=3))
    nodes = {f"n{i}": node(f"n{i}") for i in range(1, 4)}
    nodes["n0"] = node("n0", power=9999, engines=("process",))  # the strongest, but no torch there
    p = run(ClusterView(nodes), c)
    assert len(p.assignments) == 3 and "n0" not in {a.node_id for a in p.assignments}


def test_a_gang_is_one_job_for_max_concurrency_and_two_gangs_get_their_own_ports():
    c = cat(gang_job(members=2, kind="selfplay", max_concurrency=2, resources={"num_gpus": 0.5, "vram_gib": 8}))
    nodes = {f"n{i}": node(f"n{i}", gpus=1) for i in range(1, 3)}
    p = run(ClusterView(nodes), c, config=SchedulerConfig(gang_ports=(30000, 30127), gang_port_block=64))
    assert len(p.assignments) == 4 and len({a.gang.id for a in p.assignments}) == 2  # 2 gangs of 2, not 4 jobs
    per_node: dict = {}
    for a in p.assignments:
        per_node.setdefault(a.node_id, []).append(a.gang.port_base)
    assert all(sorted(v) == [30000, 30064] for v in per_node.values())  # distinct blocks on a node
    full = run(ClusterView(nodes), c, config=SchedulerConfig(gang_ports=(30000, 30063), gang_port_block=64))
    assert len(full.assignments) == 2 and "no free port block" in full.pending[0].reason  # one block a node


def test_same_tag_keys_keep_a_gang_on_one_provider():
    c = cat(gang_job(members=2, gang={"same": ["provider"]}))
    nodes = {"n1": node("n1", tags=("provider=vast",), power=3000), "n2": node("n2", tags=("provider=runpod",)),
             "n3": node("n3", tags=("provider=runpod",)), "n4": node("n4")}
    p = run(ClusterView(nodes), c)
    assert {a.node_id for a in p.assignments} == {"n2", "n3"}


@pytest.mark.parametrize("strategy, want", [("strict_pack", {"n1": 3}), ("pack", {"n1": 2, "n2": 1}),
                                            ("spread", {"n1": 2, "n2": 1})])
def test_the_strategy_lays_members_out(strategy, want):
    c = cat(gang_job(members=3, kind="selfplay", placement={"strategy": strategy},
                     resources={"num_gpus": 1, "vram_gib": 16}))
    gpus = 3 if strategy == "strict_pack" else 2
    nodes = {"n1": node("n1", gpus=gpus, power=5000), "n2": node("n2", gpus=1 if strategy != "strict_pack" else 2)}
    p = run(ClusterView(nodes), c)
    got: dict = {}
    for a in p.assignments:
        got[a.node_id] = got.get(a.node_id, 0) + 1
    assert got == want, p.pending
    assert len({(a.node_id, a.gang.port_base) for a in p.assignments}) == 3  # a block per member


def _running(gid="7-1", size=3, nodes=("n1", "n2", "n3"), ranks=None):
    out = []
    for rank, n in zip(ranks if ranks is not None else range(size), nodes, strict=True):
        slot = GangSlot(id=gid, rank=rank, size=size, master="10.0.0.1", master_port=29400, port_base=29400,
                        ports=64, engine="torchrun")
        out.append(RunningJob(f"7-{1 + rank}", "ddp", n, (0,), 1.0, 16.0, 0.0, 7, None, slot))
    return tuple(out)


def test_the_planner_stops_every_running_member_of_a_gang_the_gang_table_ended_and_no_other():
    """The lifecycle rules are the gang table's (tests/test_gang_table.py); the planner stops what it ended."""
    c = cat(gang_job())
    nodes = {f"n{i}": node(f"n{i}") for i in range(1, 4)}
    whole = run(ClusterView(nodes, _running()), c)
    assert not whole.stops and not whole.assignments  # one training of the config runs: the gang
    partial = _running(nodes=("n1", "n3"), ranks=(0, 2))
    assert not run(ClusterView(nodes, partial), c).stops  # a rank missing: the table decides, not the planner
    lost = run(ClusterView(nodes, partial, {"7-1": "gang 7-1 ended: member rank 1 ended, failed or was refused"}), c)
    assert {s.job_id for s in lost.stops} == {"7-1", "7-3"} and {s.rule for s in lost.stops} == {"gang_ended"}
    assert all("member rank 1 ended, failed or was refused" in s.reason for s in lost.stops)
    assert not run(ClusterView(nodes, partial, {"5-1": "gang 5-1 ended"}), c).stops  # another gang's end
    assert plan_violations(ClusterView(nodes, partial, {"7-1": "x"}), c,
                           run(ClusterView(nodes, partial, {"7-1": "x"}), c)) == []


def test_preemption_takes_a_whole_gang():
    low = gang_job(name="low", kind="selfplay", members=2, priority=10, config="c1")
    high = {"name": "high", "kind": "selfplay", "config": "c2", "argv": ["x"], "priority": 90,
            "resources": {"num_gpus": 1, "vram_gib": 16}}
    c = cat(low, high)
    nodes = {f"n{i}": node(f"n{i}") for i in range(1, 3)}
    running = _running(gid="7-1", size=2, nodes=("n1", "n2"))
    running = tuple(r._replace(template="low") for r in running)
    p = run(ClusterView(nodes, running), c)
    assert {s.job_id for s in p.stops} == {"7-1", "7-2"}  # one member preempted: both go
    assert [a.template for a in p.assignments] == ["high"]


def test_the_catalog_checks_gangs_with_locations():
    solo = {"name": "e", "kind": "selfplay", "config": "c", "engine": "ray", "argv": ["x"]}
    with pytest.raises(CatalogError) as e:
        parse_catalog({"job": [gang_job(members=65), gang_job(name="b", engine="mpi"),
                               gang_job(name="c", gang={"same": "provider"}),
                               gang_job(name="d", autonomous=True), solo]})
    text = "\n".join(e.value.errors)
    assert "gang.members: required, an integer 2-64" in text and "engine: one of process, torchrun, ray" in text
    assert "gang.same: a list" in text and "a gang is placed by the leader only" in text
    assert "job[4] (e).engine: ray runs a gang" in text


def test_port_blocks_never_overlap_whatever_block_size_gave_them_and_slots_are_bounded():
    import msgspec

    c = cat(gang_job(members=2, kind="selfplay", max_concurrency=2, resources={"num_gpus": 0.5, "vram_gib": 8}))
    nodes = {f"n{i}": node(f"n{i}", gpus=2) for i in range(1, 3)}
    old = tuple(r._replace(template="ddp") for r in _running(gid="5-1", size=2, nodes=("n1", "n2")))
    old = tuple(r._replace(gang=msgspec.structs.replace(r.gang, port_base=29400, ports=128)) for r in old)
    p = run(ClusterView(nodes, old), c, config=SchedulerConfig(gang_ports=(29400, 29783), gang_port_block=64))
    assert p.assignments and all(a.gang.port_base >= 29528 for a in p.assignments)  # past 29400-29527 in use
    for bad in ({"rank": 3, "size": 2}, {"port_base": 65500, "ports": 64}):
        doc = {"id": "1-1", "rank": 0, "size": 2, "master": "h", "master_port": 1, "port_base": 1, **bad}
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(doc, GangSlot)


def test_a_new_leader_knows_a_completing_gang_from_the_members_ended_lists():
    from p2pnode.node._plans import MemberPlanInput, Planner
    from p2pnode.snapshot import JobReport

    c = cat(gang_job())
    running = _running(nodes=("n2", "n3"), ranks=(1, 2))  # rank 0 (job 7-1) exited 0 under the old leader
    reports = {r.node_id: (JobReport(job_id=r.job_id, template="ddp", gpus=[0], gpu_fraction=1.0, vram_gib=16.0,
                                     term=7, gang=r.gang),) for r in running}
    members = [MemberPlanInput("n1", node("n1"), (), ended_ok=frozenset({"7-1"}), ended=frozenset({"7-1"})),
               *(MemberPlanInput(n, node(n), reports[n]) for n in ("n2", "n3"))]
    planner = Planner(c)
    first = planner.lead(8, members, None, {}, 100.0, 1e9)
    assert not first.section.stops  # finishing ranks get the grace (rank 0's job id is the gang's id)
    g = planner.gangs.get("7-1")
    assert g.state == "completing" and g.deadline == 130.0 and [m.state for m in g.members] == [
        "done", "running", "running"] and g.adopted
    later = planner.lead(8, members, first.section, {}, 131.0, 1e9)
    assert {s.job_id for s in later.section.stops} == {"7-2", "7-3"} and "complete" in later.section.stops[0].reason


def test_engine_commands_and_the_gang_environment():
    slot = GangSlot(id="7-1", rank=1, size=3, master="10.0.0.2", master_port=29400, port_base=29464, ports=64,
                    engine="torchrun")
    argv, env = engine_command("torchrun", ["/c/ddp.py", "--x"], python="/e/bin/python", slot=slot, num_gpus=2,
                               num_cpus=4, memory_gib=8, own_host="10.0.0.3", ray_member="/rm.py")
    assert argv == ["/e/bin/python", "-m", "torch.distributed.run", "--nnodes", "3", "--node-rank", "1",
                    "--nproc-per-node", "2", "--master-addr", "10.0.0.2", "--master-port", "29400", "/c/ddp.py",
                    "--x"]
    assert env == {"P2PNODE_GANG_ID": "7-1", "P2PNODE_GANG_RANK": "1", "P2PNODE_GANG_SIZE": "3",
                   "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29400", "NNODES": "3", "NODE_RANK": "1"}
    assert gang_env(slot, "process")["WORLD_SIZE"] == "3"
    argv, _ = engine_command("torchrun", ["/c/ddp.py"], python="p", slot=slot, num_gpus=0, num_cpus=1,
                             memory_gib=1, own_host="h", ray_member="/rm.py")
    assert argv[argv.index("--nproc-per-node") + 1] == "1"  # no GPU: one process
    ports = ray_ports(slot)
    assert all(29464 <= p < 29464 + 64 for p in ports.values()) and ports["port"] == 29464
    argv, _ = engine_command("ray", ["/c/drv.py"], python="p", slot=slot, num_gpus=1, num_cpus=2.5, memory_gib=1,
                             own_host="10.0.0.3", ray_member="/rm.py", custom=(("nvlink", 1.0),))
    assert argv[argv.index("--resources") + 1] == '{"nvlink": 1.0}'
    assert argv[argv.index("--head-port") + 1] == "29400"  # every member dials rank 0's port, not its own
    assert argv[:2] == ["p", "/rm.py"] and argv[-2:] == ["--", "/c/drv.py"] and "--node-ip-address" not in argv
    assert argv[argv.index("--host") + 1] == "10.0.0.3" and argv[argv.index("--num-cpus") + 1] == "2"
    with pytest.raises(ValueError):
        engine_command("mpi", ["x"], python="p", slot=None, num_gpus=0, num_cpus=1, memory_gib=1, own_host="",
                       ray_member="")


def test_a_gang_plan_hashes_the_same_after_a_decode_on_another_node():
    """The plan's digest is recomputed by every node over what it decoded: an engine string from the TOML parser
    (equal to the default, not the default object) was encoded where the decoded copy leaves it out."""
    import msgspec

    from p2pnode.scheduler import catalog_from_text
    from p2pnode.snapshot import PlanJob, PlanSection, plan_digest

    c = catalog_from_text('[[job]]\nname = "g"\nkind = "selfplay"\nconfig = "c"\nengine = "process"\nargv = ["x"]\n'
                          '[job.gang]\nmembers = 2\n[job.resources]\nnum_gpus = 0\n', source="t", base_dir=".")
    p = run(ClusterView({f"n{i}": node(f"n{i}") for i in range(1, 3)}), c)
    jobs = [PlanJob(job_id=a.job_id, node=a.node_id, template=a.template, term=7, gang=a.gang) for a in p.assignments]
    section = PlanSection(term=7, digest=plan_digest(jobs, []), assignments=jobs)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(section), type=PlanSection)
    assert len(jobs) == 2 and plan_digest(back.assignments, back.stops) == section.digest


def test_a_member_whose_port_is_taken_refuses_and_a_node_without_torch_has_no_torchrun(tmp_path):
    """The runner's check before a member starts (its start fails: a refusal, and the gang is placed again), and
    the engines fingerprint: this suite's interpreter has no torch nor ray, so only ``process`` is found; an
    interpreter that does not exist or prints nonsense is no engine either."""
    import socket
    import sys

    from p2pnode.jobs._engines_probe import probe_engines
    from p2pnode.jobs._runner import check_ports_free

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        slot = GangSlot(id="7-1", rank=0, size=2, master="127.0.0.1", master_port=port, port_base=port)
        with pytest.raises(OSError, match=f"port {port} of gang 7-1's block is taken"):
            check_ports_free(slot, "127.0.0.1")
    check_ports_free(slot, "127.0.0.1")  # free again
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'not a version; rm -rf /'\n")
    fake.chmod(0o755)
    found = probe_engines({"torchrun": sys.executable, "ray": str(fake)}, timeout_s=60)
    assert list(found) == ["process"]
    assert list(probe_engines({"torchrun": str(tmp_path / "missing")})) == ["process"]
