"""CPU work is first-class (issue 24 item 2): templates with ``num_gpus = 0`` are placed against CPUs, memory and
the nodes' CPU offers, GPU-less and GPU-busy nodes included; the GPU and CPU offers never leak into each other;
a waiting CPU template says what it lacks. Pure planner and offer tests, the job core's autonomous path, the
snapshot field and the node's own CPU offer from its sample and snapshot."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

from p2pnode.gossip import MemberState
from p2pnode.guardcore import GuardLimits
from p2pnode.node import JobCore, JobInputs, Leadership, LocalJob, MemberJobs, StartJob, node_view_of
from p2pnode.resources import ResourceSample
from p2pnode.scheduler import (
    CPU_TIERS,
    CatalogError,
    ClusterView,
    GpuView,
    NodeView,
    RunningJob,
    cpu_offer,
    node_tier,
    parse_catalog,
    plan,
    plan_violations,
)
from p2pnode.snapshot import JobsSection, OperatorSection, Resources, Snapshot

GIB = 2**30
POLICY = {"tiers": {"training": [1, 2], "selfplay": [3, 2, 1]}}
"""The demo catalogs' GPU tiers: selfplay never on tier 4, which is where GPU-less nodes are."""


def job(name, *, kind="selfplay", max_concurrency=1, **resources):
    return {"name": name, "kind": kind, "config": "c", "argv": ["x"], "max_concurrency": max_concurrency,
            "resources": resources}


def catalog(*jobs, policy=POLICY):
    return parse_catalog({"job": list(jobs), "policy": policy})


def gpu_less(nid, *, cpus=8.0, memory=32.0, cpu_offer=16, offer=0):
    return NodeView(nid, (), offer=offer, cpus=cpus, memory_gib=memory, cpu_offer=cpu_offer)


def gpu_box(nid, *, vram=80.0, gpus=1, offer=0, cpus=16.0, memory=64.0, cpu_offer=16):
    return NodeView(nid, tuple(GpuView(i, vram) for i in range(gpus)), offer=offer, cpus=cpus, memory_gib=memory,
                    cpu_offer=cpu_offer)


def placed(p):
    out: dict[str, list[str]] = {}
    for a in p.assignments:
        out.setdefault(a.template, []).append(a.node_id)
    return {k: sorted(v) for k, v in out.items()}


def planned(nodes, c, running=()):
    v = ClusterView({n.node_id: n for n in nodes}, tuple(running))
    p = plan(v, c, {}, 0.0, term=1)
    assert plan_violations(v, c, p, term=1) == []
    return p


# -- the planner ------------------------------------------------------------------------------------------------
def test_gpu_less_and_gpu_busy_nodes_take_cpu_work_up_to_their_cpus_and_memory():
    # The GPU box is in its utilization band (GPU offer 0); the GPU-less node has no GPU offer at all. Its tier
    # (4) is not among selfplay's GPU tiers: CPU work goes there anyway. 2 CPUs and 4 GiB each: 4 fit the GPU-less
    # node by its 8 CPUs, 3 the GPU box by its 12 GiB.
    c = catalog(job("loader", num_gpus=0, num_cpus=2, memory_gib=4, max_concurrency=20))
    nodes = [gpu_less("cpu"), gpu_box("busy", memory=12.0)]
    assert node_tier(nodes[0]) == 4 and node_tier(nodes[1]) == 1
    p = planned(nodes, c)
    assert placed(p) == {"loader": ["busy"] * 3 + ["cpu"] * 4}
    assert all(a.gpus == () and a.gpu_fraction == 0.0 for a in p.assignments)
    (waiting,) = p.pending
    assert "GPU" not in waiting.reason and ("CPUs" in waiting.reason or "memory" in waiting.reason), waiting


def test_gpu_work_never_takes_a_cpu_offer_and_cpu_work_never_a_gpu_offer():
    c = catalog(job("sp", num_gpus=1, vram_gib=8, max_concurrency=5),
                job("loader", num_gpus=0, num_cpus=1, memory_gib=1, max_concurrency=5))
    # CPU offers only: the GPU template waits although the GPUs are free.
    p = planned([gpu_box("n", gpus=4, offer=0, cpu_offer=5)], c)
    assert placed(p) == {"loader": ["n"] * 5}
    assert {x.template: x.reason for x in p.pending} == {
        "sp": "no node in tiers 3/2/1 takes it: 1 offer no GPU work (in their GPU utilization band or cordoned)"}
    # GPU offers only: the CPU template waits although the CPUs are free.
    p = planned([gpu_box("n", gpus=4, offer=4, cpu_offer=0)], c)
    assert placed(p) == {"sp": ["n"] * 4}
    reasons = {x.template: x.reason for x in p.pending}
    assert reasons["loader"].startswith("no capacity offered for CPU work"), reasons
    # Both: each kind takes its own offers and no more (one GPU job, two CPU jobs).
    p = planned([gpu_box("n", gpus=4, offer=1, cpu_offer=2)], c)
    assert placed(p) == {"sp": ["n"], "loader": ["n", "n"]}


def test_cpu_work_goes_to_gpu_less_nodes_first_then_to_the_idlest_cpus():
    c = catalog(job("loader", num_gpus=0, num_cpus=1, memory_gib=1))
    assert placed(planned([gpu_box("big"), gpu_less("small")], c)) == {"loader": ["small"]}
    # Within tier 4 too: a GPU-less node before a node with a small GPU.
    assert placed(planned([gpu_box("tiny", vram=6.0), gpu_less("small")], c)) == {"loader": ["small"]}
    # The GPU-less node offers no CPU work (its CPU is above the warn level, say): the GPU box's CPUs take it.
    assert placed(planned([gpu_box("big"), gpu_less("small", cpu_offer=0)], c)) == {"loader": ["big"]}
    # Spread: of two GPU-less nodes, the one whose CPUs are idle.
    hog = catalog(job("loader", num_gpus=0, num_cpus=1, memory_gib=1),
                  job("hog", num_gpus=0, num_cpus=6, memory_gib=1))
    running = [RunningJob("r1", "hog", "a")]
    assert placed(planned([gpu_less("a"), gpu_less("b")], hog, running))["loader"] == ["b"]


def test_a_waiting_cpu_template_says_what_it_lacks():
    c = catalog(job("wide", num_gpus=0, num_cpus=4, memory_gib=8))
    # CPUs held by a running job: the reason names the CPUs, never a GPU.
    hog = catalog(job("wide", num_gpus=0, num_cpus=4, memory_gib=8), job("hog", num_gpus=0, num_cpus=6))
    p = planned([gpu_less("a")], hog, [RunningJob("r1", "hog", "a")])
    assert [(x.template, x.reason) for x in p.pending] == [("wide", "nodes offering CPU work lack 4 free CPUs")]
    # Memory held.
    hog_mem = catalog(job("wide", num_gpus=0, num_cpus=4, memory_gib=8), job("hog", num_gpus=0, memory_gib=6))
    p = planned([gpu_less("a", memory=10.0)], hog_mem, [RunningJob("r1", "hog", "a")])
    assert [x.reason for x in p.pending] == ["nodes offering CPU work lack 8 GiB of free memory"]
    # No CPU offer anywhere (GPU offers do not count).
    p = planned([gpu_less("a", cpu_offer=0), gpu_box("b", offer=4, cpu_offer=0)], c)
    assert p.pending[0].reason.startswith("no capacity offered for CPU work (every node's CPU offer is used")
    # More than any node has.
    p = planned([gpu_less("a"), gpu_box("b")], catalog(job("huge", num_gpus=0, num_cpus=1000)))
    assert p.pending[0].reason == "unsatisfiable: asks 1000 CPUs, the largest node has 16"
    for x in p.pending:
        assert "GPU with" not in x.reason


def test_cpu_tiers_of_the_kinds_policy_and_hard_affinities_restrict_cpu_work():
    c = catalog(job("loader", num_gpus=0), policy={**POLICY, "cpu_tiers": {"selfplay": [1]}})
    assert c.tiers_of(c.templates["loader"]) == (1,)
    assert placed(planned([gpu_box("big"), gpu_less("small")], c)) == {"loader": ["big"]}
    p = planned([gpu_less("small")], c)
    assert p.pending[0].reason == "unsatisfiable: selfplay may use tiers 1, no node is in them"
    free = catalog(job("loader", num_gpus=0), job("sp", num_gpus=1, vram_gib=8))
    assert free.tiers_of(free.templates["loader"]) == CPU_TIERS == (4, 3, 2, 1)
    assert free.tiers_of(free.templates["sp"]) == (3, 2, 1)  # GPU work keeps its kind's tiers
    pinned = catalog({**job("loader", num_gpus=0), "placement": {"affinity": [{"tag": "fast", "hard": True}]}})
    fast = NodeView("fast", (GpuView(0, 80.0),), frozenset({"fast"}), cpus=8, memory_gib=8, cpu_offer=4)
    assert placed(planned([gpu_less("small"), fast], pinned)) == {"loader": ["fast"]}
    with pytest.raises(CatalogError, match=r"\[policy\]\.cpu_tiers\.selfplay: a non-empty list of distinct tiers"):
        catalog(job("loader", num_gpus=0), policy={"cpu_tiers": {"selfplay": [5]}})


def test_templates_that_differ_only_in_cpus_are_searched_each():
    # A 16-CPU template (placed first: higher priority) that finds no node must not keep a 1-CPU one of the same
    # kind from being placed: a shape that failed is only skipped for templates asking the same CPUs and memory.
    c = catalog({**job("wide", num_gpus=0, num_cpus=16, max_concurrency=2), "priority": 90},
                job("narrow", num_gpus=0, num_cpus=1))
    p = planned([gpu_less("x", cpus=17.0)], c, [RunningJob("r1", "wide", "x")])
    assert placed(p) == {"narrow": ["x"]}
    assert [(x.template, x.reason) for x in p.pending] == [("wide", "nodes offering CPU work lack 16 free CPUs")]


# -- the CPU offer --------------------------------------------------------------------------------------------------
def offer(**kw):
    args = {"cpus": 8.0, "memory_gib": 32.0, "held_cpus": 0.0, "held_memory_gib": 0.0, "cpu_percent": 10.0,
            "cpu_warn_percent": 70.0, "level": 0}
    return cpu_offer(**(args | kw))


def test_cpu_offer_counts_free_cpus_and_memory_and_stops_under_pressure():
    assert offer() == 8  # 8 free CPUs, 32 GiB: one 1-CPU, 1-GiB unit job per CPU
    assert offer(held_cpus=3.0) == 5
    assert offer(held_memory_gib=30.5) == 1  # memory-bound
    assert offer(held_cpus=9.0) == 0  # more held than declared: nothing, never negative
    assert offer(cpus=0.0, memory_gib=0.0) == 1024  # nothing accounted: only the cap
    assert offer(level=1) == 8 and offer(level=2) == 0 and offer(level=4) == 0  # backpressure at moderate
    assert offer(cordoned=True) == 0
    assert offer(cpu_percent=70.0) == 8 and offer(cpu_percent=70.1) == 0  # above the CPU warn level: nothing


# -- the job core: autonomous CPU work ------------------------------------------------------------------------------
def test_autonomous_cpu_work_starts_on_a_gpu_less_node_from_its_cpu_offer():
    c = parse_catalog({"job": [{**job("loader", num_gpus=0, max_concurrency=4), "autonomous": True}]})
    core = JobCore("a", c, interval_s=5.0, adopt_grace_s=30.0, orphan_grace_s=60.0, settle_s=2.0, dwell_s=10.0,
                   spawns_per_minute=600.0)
    me = MemberJobs("a", MemberState.ALIVE, 0.0, gpu_less("a", cpu_offer=3))
    free = Leadership(None, None, 0, False, {})

    def starts(now, **kw):
        return [e for e in core.step(JobInputs(free, [me], {}, **kw), now) if isinstance(e, StartJob)]

    assert not starts(0.0, offer=0, cpu_offer=0)  # neither offer: nothing
    got = starts(10.0, offer=0, cpu_offer=3)
    assert len(got) == 3 and all(s.job.gpus == [] and s.term == 0 for s in got)


# -- the snapshot and the node's view -----------------------------------------------------------------------------
def snapshot(**kw):
    return Snapshot(schema=3, origin="n1", version=1, addr="127.0.0.1:7946", tags=[], leaving=False, **kw)


def test_the_cpu_offer_travels_in_the_snapshot_and_older_snapshots_decode():
    old = msgspec.msgpack.encode({"offer": 2})
    assert msgspec.msgpack.decode(old, type=JobsSection).cpu_offer == 0
    new = msgspec.msgpack.encode(JobsSection(offer=0, cpu_offer=7))
    assert msgspec.msgpack.decode(new, type=JobsSection).cpu_offer == 7
    with pytest.raises(msgspec.ValidationError, match="cpu_offer"):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"cpu_offer": -1}), type=JobsSection)
    # A GPU-less member's view: its measured CPUs and memory, its CPU offer; none when cordoned.
    snap = snapshot(resources=Resources(cpu_count=12, mem_total_bytes=40 * GIB), jobs=JobsSection(cpu_offer=7))
    v = node_view_of(snap, disk_max_percent=70.0, vram_limit_ratio=0.8, memory_limit_ratio=0.8)
    assert (v.gpus, v.offer, v.cpu_offer, v.cpus, v.memory_gib) == ((), 0, 7, 12.0, 32.0)
    assert node_view_of(snap, disk_max_percent=70.0, vram_limit_ratio=0.8, cpu_offer=2).cpu_offer == 2
    cordoned = snapshot(resources=snap.resources, jobs=snap.jobs, operator=OperatorSection(cordoned=True))
    assert node_view_of(cordoned, disk_max_percent=70.0, vram_limit_ratio=0.8, cpu_offer=2).cpu_offer == 0


def sample(cpu_percent=10.0, cpu_count=8, gpus=()):
    return ResourceSample(cpu_percent=cpu_percent, cpu_count=cpu_count, load_avg=(0.0, 0.0, 0.0),
                          mem_total_bytes=64 * GIB, mem_available_bytes=60 * GIB, mem_used_bytes=4 * GIB,
                          mem_percent=6.0, disk_path="/", disk_total_bytes=100 * GIB, disk_used_bytes=10 * GIB,
                          disk_free_bytes=90 * GIB, disk_percent=10.0, gpus=tuple(gpus))


def _sampled(ctx):
    from p2pnode.jobs._capacity import NodeOffer

    return NodeOffer(ctx, GuardLimits(), idle_gpus=lambda: 0).sample()  # type: ignore[arg-type]


def test_a_gpu_less_node_offers_cpu_work_by_what_its_jobs_leave_and_no_gpu_work():
    from p2pnode.node._offer import gpu_offer, node_cpu_offer
    from p2pnode.scheduler import CapacityController

    snap = snapshot(resources=Resources(cpu_count=8, mem_total_bytes=64 * GIB, declared={"cpus": 6.0}))
    ctx = SimpleNamespace(node_id="n1", last_sample=sample(), degradation_level=0, now=lambda: 1.0,
                          member=lambda origin: SimpleNamespace(snapshot=snap) if origin == "n1" else None)
    cat = parse_catalog({"job": [job("loader", num_gpus=0, num_cpus=2, memory_gib=4)]})
    jobs = [LocalJob("l1", "loader", "selfplay", ()),
            LocalJob("l2", "loader", "selfplay", (), stopping=True)]  # a stopping job holds nothing
    s = _sampled(ctx)
    assert gpu_offer(CapacityController(), s, jobs, full=(), freed=(), level=0, now=1.0) == 0  # no GPU work
    assert node_cpu_offer(s, jobs, cat, level=0, cordoned=False) == 4  # 6 declared CPUs, 2 held
    ctx.last_sample = sample(cpu_percent=95.0)
    assert node_cpu_offer(_sampled(ctx), jobs, cat, level=0, cordoned=False) == 0  # above the CPU warn level (70 %)
    ctx.last_sample = sample()
    assert node_cpu_offer(_sampled(ctx), jobs, cat, level=2, cordoned=False) == 0
    assert node_cpu_offer(_sampled(ctx), jobs, cat, level=0, cordoned=True) == 0


def test_a_node_whose_gpus_are_busy_offers_no_gpu_work_and_its_spare_cpus_for_cpu_work():
    from p2pnode.node._offer import gpu_offer, node_cpu_offer
    from p2pnode.resources import GpuReading
    from p2pnode.scheduler import CapacityController

    busy = [GpuReading(i, "H100", f"GPU-{i}", 100.0, 40 * GIB, 80 * GIB, None, None) for i in range(2)]
    snap = snapshot(resources=Resources(cpu_count=32, mem_total_bytes=64 * GIB))
    ctx = SimpleNamespace(node_id="n1", last_sample=sample(cpu_count=32, gpus=busy), degradation_level=0,
                          now=lambda: 1.0, member=lambda origin: SimpleNamespace(snapshot=snap))
    cat = parse_catalog({"job": [job("sp", num_gpus=1, vram_gib=8, num_cpus=4, memory_gib=8)]})
    jobs = [LocalJob(f"s{i}", "sp", "selfplay", (i,)) for i in range(2)]
    s = _sampled(ctx)
    assert s.gpu_util == ((0, 100.0), (1, 100.0))
    assert gpu_offer(CapacityController(), s, jobs, full=(), freed=(), level=0, now=1.0) == 0  # held, above band
    # 32 CPUs, 51.2 GiB for jobs (the guard's 80 % memory limit); the two GPU jobs hold 8 CPUs and 16 GiB.
    assert node_cpu_offer(s, jobs, cat, level=0, cordoned=False) == 24
    # a GPU a job of ours left after the sample was taken is offered at once (the sample still shows its load)
    assert gpu_offer(CapacityController(), s, jobs[:1], full=(), freed=(1,), level=0, now=1.0) == 1


def test_the_nodes_own_admission_never_refuses_cpu_work_for_a_gpu():
    from p2pnode.scheduler import Holding, node_misfit

    loader = Holding(cpus=4.0, memory_gib=8.0)
    # No GPU on the node, or every GPU full: nothing to say about GPUs for a job that holds none.
    assert node_misfit(NodeView("n1", ()), [], loader) == ""
    two = NodeView("n1", (GpuView(0, 80.0, full=True), GpuView(1, 80.0)), cpus=6.0, memory_gib=32.0)
    assert node_misfit(two, [], loader, full=(0, 1)) == ""
    assert node_misfit(two, [loader], loader) == "asks 4 CPUs; 2 of 6 are free here"


def test_gpu_work_waiting_behind_a_spawn_rate_backlog_says_so_first():
    """Issue 24: GPUs held by assignments a node has not started yet (its spawn-rate limit) are the first cause
    of GPU work waiting, not "no GPU free"; the reason says which node, how many, and when they are all started."""
    c = catalog(job("sp", num_gpus=1, vram_gib=8, max_concurrency=4))
    n = NodeView("n", (GpuView(0, 80.0),), offer=2, cpus=16.0, memory_gib=64.0, waiting=3, spawn_rate=10.0)
    held = RunningJob("1-1", "sp", "n", (0,), 1.0, 8.0)  # assigned, not started: it holds GPU 0
    p = plan(ClusterView({"n": n}, (held,)), c, {}, 0.0, term=1)
    (w,) = p.pending
    assert w.reason.startswith("3 assigned jobs wait for their node's spawn-rate limit (node n: 3 at 10 a minute, "
                               "all started within 18 s); "), w.reason
    idle = plan(ClusterView({"n": NodeView("n", (GpuView(0, 80.0),), offer=2, cpus=16.0, memory_gib=64.0)},
                            (held,)), c, {}, 0.0, term=1)
    assert "spawn-rate" not in idle.pending[0].reason  # no backlog: the GPU reason alone


def test_p2pnode_jobs_shows_starts_held_by_the_spawn_rate_limit_with_their_reason():
    """Issue 24: a start the spawn-rate limit holds back is shown by ``p2pnode jobs`` with its reason and when the
    next start comes (it is not a refusal)."""
    import io

    from rich.console import Console

    from p2pnode.cli._jobs import _jobs_renderable

    why = ("waiting to start: spawn-rate limit of 12 jobs a minute on this node (guard.spawns_per_minute_per_gpu "
           "/ _per_cpu); next start in 5.0 s")
    data = {"node_id": "n", "leader": "n", "term": 1, "offer": 0, "running": [], "cluster_running": [],
            "pending": [], "refused": [], "history": [], "waiting": [{"job_id": "1-13", "template": "sp",
                                                                       "reason": why}]}
    out = io.StringIO()
    Console(file=out, width=300).print(_jobs_renderable(data))
    text = out.getvalue()
    assert "assigned here, waiting to start" in text and "1-13" in text and "next start in 5.0 s" in text


@pytest.mark.parametrize("field, bad", [
    ("waiting", "-1"), ("waiting", "1" * 400), ("waiting", '"3"'), ("waiting", "1.5"), ("waiting", '"\u0663"'),
    ("spawn_rate", "NaN"), ("spawn_rate", "Infinity"), ("spawn_rate", "-0.1"), ("spawn_rate", "1e7"),
    ("spawn_rate", '"60"'), ("cpu_offer", "1" * 400), ("cpu_offer", "true"),
])
def test_a_members_spawn_backlog_fields_are_bounded_by_the_snapshot_decoder(field, bad):
    """Issue 24's new ``jobs`` fields as a hostile member would sign them (JSON literals): a wrong type, a
    non-ASCII digit, a 400-digit number, NaN, infinity or an out-of-range value never gets past the typed
    decoder (the member is quarantined, not believed)."""
    body = f'{{"offer": 1, "{field}": {bad}}}'.encode()
    with pytest.raises((msgspec.ValidationError, msgspec.DecodeError)):
        msgspec.json.decode(body, type=JobsSection)
    assert msgspec.json.decode(f'{{"offer": 1, "{field}": 3}}'.encode(), type=JobsSection)  # a sane value decodes
