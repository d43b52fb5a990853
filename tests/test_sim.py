"""The simulator: reproducible, within Serf's estimate, and the election's safety under random partitions."""

import json
from pathlib import Path

import pytest

from p2pnode.cli import main
from p2pnode.gossip._membership import MemberState
from p2pnode.sim import ClusterSim, profile, run_partitions, serf_fraction, serf_rounds_to, simulate_spread


def test_serf_estimate_matches_the_issue_figures():
    assert serf_rounds_to(1000, 3, 0.0, 0.999) == 10
    assert serf_rounds_to(1000, 3, 0.5, 0.999) == 19
    assert serf_fraction(1000, 3, 0.0, 10) >= 0.999 > serf_fraction(1000, 3, 0.0, 9)
    assert serf_rounds_to(1000, 3, 0.0, 1.0) is None


@pytest.mark.parametrize("loss, bound", [(0.0, 10), (0.5, 19)])
def test_spread_at_1000_within_serf_estimate(loss, bound):
    for seed in range(5):
        r = simulate_spread(1000, fanout=3, loss=loss, seed=seed)
        assert r.rounds[0.999] is not None and r.rounds[0.999] <= bound
        assert r.rounds[0.5] <= r.rounds[0.99] <= r.rounds[0.999] <= r.rounds[1.0]


def test_same_seed_same_figures():
    a = simulate_spread(500, loss=0.3, seed=42)
    b = simulate_spread(500, loss=0.3, seed=42)
    assert a.curve == b.curve and a.messages == b.messages
    assert simulate_spread(500, loss=0.3, seed=43).curve != a.curve

    def cluster_run(seed):
        sim = ClusterSim(20, seed=seed, loss=0.1)
        sim.run_until(15.0)
        sim.kill(3)
        sim.run_until(45.0)
        states = [sorted((x.node_id, x.state.value, x.incarnation, x.version) for x in m.members.values())
                  for m in sim.memberships]
        return states, sim.counters.messages, sim.counters.verifications, sim.leader_views()

    assert cluster_run(5) == cluster_run(5)


def test_cluster_agrees_on_strongest_and_fails_over():
    sim = ClusterSim(30, seed=2)
    while sim.agreed_leader() is None:
        sim.round()
        assert sim.now < 30
    leader = sim.agreed_leader()
    assert leader == sim.strongest(list(range(30)))
    sim.kill(sim.index[leader])
    t_kill = sim.now
    while not sim.all_see(sim.index[leader], MemberState.DEAD):
        sim.round()
        assert sim.now < t_kill + 60
    survivors = [i for i in range(30) if sim.running[i]]
    while sim.agreed_leader() in (None, leader):
        sim.round()
        assert sim.now < t_kill + 90
    assert sim.agreed_leader() == sim.strongest(survivors)
    assert max(len(v) for v in sim.counters.leaders_per_term.values()) == 1
    assert sim.counters.false_suspicions == 0


def test_restart_brings_a_new_incarnation_and_the_lead_back():
    sim = ClusterSim(10, seed=4)
    sim.run_until(10.0)
    top = sim.index[sim.agreed_leader()]
    sim.kill(top)
    sim.run_until(60.0)
    assert sim.agreed_leader() != sim.ids[top]
    sim.restart(top)  # a stronger node (re)joins: handover, with no observer leaderless for long
    gaps = [0] * 10
    worst = 0
    for _ in range(10):
        sim.round()
        for i, (leader, _) in sim.leader_views().items():
            gaps[i] = gaps[i] + 1 if leader is None else 0
            worst = max(worst, gaps[i])
    assert worst <= 2, f"an observer was leaderless for {worst} rounds during the handover"
    assert sim.agreed_leader() == sim.ids[top]
    assert all(sim.memberships[i].members[sim.ids[top]].incarnation == 2 for i in range(10) if i != top)


def test_twenty_random_partitions_never_two_leaders_and_always_heal():
    r = run_partitions(20, 9, fanout=3, loss=0.0, latency_s=0.001, cfg=profile("lan", 1.0), seed=11)
    assert r["violations"] == {"two_leaders_in_a_term": 0, "leader_on_minority": 0, "not_healed": 0}
    assert r["heal_s_max"] is not None


def test_partitions_under_loss_stay_safe():
    r = run_partitions(20, 9, fanout=3, loss=0.2, latency_s=0.005, cfg=profile("lan", 1.0), seed=12)
    assert r["violations"]["two_leaders_in_a_term"] == 0 and r["violations"]["leader_on_minority"] == 0


def test_simulate_cli_json(capsys):
    assert main(["simulate", "--nodes", "200", "--cluster-nodes", "20", "--partition-runs", "2",
                 "--partition-nodes", "7", "--seed", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spread"]["rounds"]["99.9%"] <= out["spread"]["serf_estimate_rounds"]["99.9%"]
    assert out["cluster"]["max_leaders_per_term"] == 1
    assert set(out["cluster"]["rates_steady"]) == {"messages_per_node_per_s", "bytes_per_node_per_s",
                                                   "verifications_per_node_per_s"}
    assert main(["simulate", "--nodes", "1"]) == 2


def test_scheduling_scenario_keeps_invariants_through_a_failover():
    from p2pnode.sim import run_scheduling

    r = run_scheduling(150, 24, duration_s=900, seed=5)
    assert r["violation_count"] == 0, r["violations"]
    assert r["final_term"] == 2 and r["plans"] == 89  # one interval without a plan: the election
    assert r["longest_wait_s"] < r["starvation_cap_s"]
    # While work that fits them waits, GPUs are busy and never overloaded: whole-GPU jobs whose own load is under
    # the band (evaluation drives 55 %) keep a tier a little below it on a random fleet; seed 003's is in band.
    assert r["util_by_tier"] and all(50 <= t["mean_util_percent"] <= 85 for t in r["util_by_tier"].values())
    # Plans went through the agent's adoption and fencing: refusals were re-placed, half of the nodes ignored the
    # dead leader's plan once they saw the next term, the new leader carried the old plan over, and no config
    # ever trained twice.
    assert r["refusals"] > 0 and r["fenced"] == (150 - 1) // 2 and r["carried_over"] > 0 and r["double_training"] == 0
    # Gangs (issue 26): one config in 20 trains as a gang of 2-8; they were placed whole (an invariant of every
    # plan above) and some run.
    assert r["gang_templates"] == 24 // 20 + (24 % 20 > 10) and r["wait_s"]["gang"]["placements"] > 0
    assert r["gangs_running_at_end"] >= 1
    # Issue 38: training ([policy] stable by default) runs on durable nodes whenever one can take it (80.7 % of its
    # GPU time before, when an ephemeral node only scored 5 points lower; 100 % now).
    assert r["training_on_durable_percent"] >= 95.0
    assert run_scheduling(150, 24, duration_s=300, seed=5)["plan_ms"].keys() == {"median", "p99", "max"}


def test_simulate_cli_scheduling(capsys):
    assert main(["simulate", "--scenario", "scheduling", "--nodes", "60", "--configs", "8", "--duration", "300",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["violation_count"] == 0 and out["nodes"] == 60


def _flaky_strong_node(settle_s: float) -> tuple[int, str | None]:
    """20 nodes, node 0 the strongest (an H200 among weaker cards); for 10 minutes node 0 is killed at every
    60 s mark and restarted 30 s later. Returns the leader changes every running node agreed on in those 10
    minutes, and the leader at the end."""
    powers = [2500.0] + [2000.0 - 10 * i for i in range(1, 20)]
    sim = ClusterSim(20, seed=3, powers=powers, leader_settle_s=settle_s)
    sim.run_until(30)
    assert sim.agreed_leader() == sim.ids[0]  # no leader yet: the settle time delays nothing
    changes, last = 0, sim.agreed_leader()
    for minute in range(10):
        start = 30 + 60 * minute
        sim.kill(0)
        for t in range(1, 61):
            if t == 30:
                sim.restart(0)
            sim.run_until(start + t)
            agreed = sim.agreed_leader()
            if agreed is not None and agreed != last:
                changes, last = changes + 1, agreed
    return changes, last


def test_a_flaky_strong_node_does_not_move_leadership_each_time_it_returns():
    changes, leader = _flaky_strong_node(120.0)
    assert changes <= 2 and leader != "n00000"
    # The same run without a settle time: the H200 takes leadership back at every return.
    assert _flaky_strong_node(0.0)[0] >= 10


@pytest.mark.parametrize("scenario", ["fake_voters", "higher_term"])
def test_false_voters_never_make_two_leaders_nor_fence_the_real_one(scenario):
    """Issue 22, findings 4 and 5, on the real cores in open mode, 20 seeded runs each: five fake members tagged
    ``voter`` (refused by the closed rolls) vote for a fake node in the current term while a new node starts
    through the real voters; or a member not on the roll votes for itself one term up and goes silent."""
    from p2pnode.sim import run_false_voters

    r = run_false_voters(scenario, 20, seed=22)
    assert r["no_leader_before"] == 0 and r["two_leaders_in_a_term"] == 0, r
    assert r["not_following"] == 0 and r["fenced"] == 0 and r["fakes_on_a_roll"] == 0, r
    if scenario == "fake_voters":
        assert set(r["adoption"]) == {"adopted"}  # the new node took the real voters' roll
    else:
        assert all(before == after for before, after in r["terms"])  # the term never moved
    assert r["wall_s"] < 20


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seed_003s_inventory_holds_every_tier_in_the_band(seed):
    """Issue 24: on seed 003's own machines and boards (12 configs), while work that fits a node waits, every
    tier's GPUs average within the 60-80 % band: free GPUs are offered at once, and a half-GPU job that would
    strand the rest of a small card is placed only after whole-GPU work had its turn."""
    from p2pnode.sim import run_scheduling

    r = run_scheduling(0, 12, duration_s=1800, seed=seed, inventory="seed003")
    assert r["nodes"] == 19 and r["violation_count"] == 0, r["violations"]
    assert set(r["util_by_tier"]) == {1, 2, 3}
    assert all(t["in_band"] for t in r["util_by_tier"].values()), r["util_by_tier"]


@pytest.mark.parametrize("seed", [0, 1])
def test_seed_003s_gpus_are_committed_to_their_usable_vram(seed):
    """Issue 38 item 2: under the guard's default cap (VRAM committed up to 80 % of each GPU), a busy GPU of seed
    003's fleet holds work up to its usable VRAM, and no free share that waiting work fits stays free across a
    plan. The planner before issue 38 (de31e2f), measured by this same simulation (seeds 0-2): the generated
    catalog's busy GPUs were committed to 59-62 % of their usable VRAM (93-96 % of busy-GPU samples under 90 %,
    tier 2 at 52-58 % utilization, out of the band), the example catalog's to 72-79 % (57-78 % under 90 %; an 8x
    RTX 4090 box held 16 of 19.2 usable GiB per GPU: two 0.25-GPU selfplays at the 8 GiB floor)."""
    from p2pnode.scheduler import load_catalog
    from p2pnode.sim import run_scheduling

    r = run_scheduling(0, 12, duration_s=1800, seed=seed, inventory="seed003")
    assert r["gpu_max_percent"] == 80.0 and r["violation_count"] == 0, r["violations"]
    assert r["vram_committed_percent"] >= 99.0 and r["busy_gpus_under_90_percent"] <= 0.01, r
    # A few GPU-intervals (0.1-0.31 %): a GPU whose jobs the leader still holds as placed after a failover (the
    # adoption grace) or while its stops run; main 0.24-0.57 %. The figures above are what tell the planners apart.
    assert r["stranded_share"] <= 0.004, r
    assert all(t["in_band"] for t in r["util_by_tier"].values()), r["util_by_tier"]
    example = load_catalog(Path(__file__).resolve().parent.parent / "deploy" / "examples" / "catalog.toml")
    r = run_scheduling(0, 12, duration_s=1800, seed=seed, inventory="seed003", catalog=example)
    assert r["violation_count"] == 0, r["violations"]
    assert r["vram_committed_percent"] >= 90.0 and r["vram_committed_percent_by_tier"][1] >= 99.0, r
    assert r["stranded_gpu_samples"] == 0, r


def test_partial_digests_fail_over_heal_and_send_fewer_digest_bytes():
    """Partial digests between full push-pulls (issue 42 item 2) in the cluster model: the same failover and
    partition healing, with smaller messages once N is large enough for the digest to matter."""
    sim = ClusterSim(30, seed=2, push_pull_s=30.0, loss=0.05)
    while sim.agreed_leader() is None:
        sim.round()
        assert sim.now < 30
    leader = sim.agreed_leader()
    sim.kill(sim.index[leader])
    t_kill = sim.now
    while not sim.all_see(sim.index[leader], MemberState.DEAD):
        sim.round()
        assert sim.now < t_kill + 60
    while sim.agreed_leader() in (None, leader):
        sim.round()
        assert sim.now < t_kill + 90
    assert max(len(v) for v in sim.counters.leaders_per_term.values()) == 1
    sim.partition([set(range(0, 10))])
    sim.run_until(sim.now + 30)
    sim.heal()
    t_heal = sim.now
    while sim.agreed_leader() is None or not all(sim.V[i].min() > 0 for i in range(30) if sim.running[i]):
        sim.round()
        assert sim.now < t_heal + 60
    assert max(len(v) for v in sim.counters.leaders_per_term.values()) == 1
    rates = []
    for push_pull in (0.0, 30.0):
        big = ClusterSim(400, seed=1, push_pull_s=push_pull, snapshot_bytes=200)  # digests weigh more
        big.run_until(2.0)
        b0 = big.counters.bytes
        big.run_until(6.0)
        rates.append((big.counters.bytes - b0) / (400 * 4.0))
    assert rates[1] < 0.6 * rates[0], rates
