"""The experiments behind ``p2pnode simulate``: each returns plain dicts of figures (seconds, counts)."""

from __future__ import annotations

import random
import time
from dataclasses import replace

from ..gossip import PROFILES, MembershipConfig, MemberState
from ._cluster import ClusterSim
from ._spread import serf_fraction, simulate_spread

__all__ = ["run_cluster", "run_partitions", "run_spread", "wire_sizes"]


def wire_sizes() -> tuple[int, int]:
    """(bytes of one digest entry, bytes of one sealed snapshot of a 2-GPU node), measured by encoding the real
    thing with :mod:`p2pnode.wire`."""
    import msgpack

    from ..identity import Identity
    from ..resources import FakeGpus, parse_fake_gpus
    from ..wire import SCHEMA_VERSION, seal_snapshot

    ident = Identity.generate()
    gpus = [g.to_wire() for g in FakeGpus(parse_fake_gpus("H100,RTX 4090")).read()]
    snap = {
        "schema": SCHEMA_VERSION, "origin": ident.node_id, "version": 123456, "addr": "203.0.113.77:8770",
        "tags": ["durable", "voter"], "started_at": 1.7e9, "ts": 1.7e9, "leaving": False, "agent_version": "0.1.0",
        "trust": "open", "jobs": [], "incarnation": 3, "suspects": {}, "vote": {"candidate": ident.node_id, "term": 9},
        "resources": {"cpu_percent": 12.5, "cpu_count": 64, "load_avg": [1.0, 1.0, 1.0], "mem_total_bytes": 2**38,
                      "mem_available_bytes": 2**37, "mem_used_bytes": 2**37, "mem_percent": 50.0,
                      "disk_path": "/var/lib/p2pnode", "disk_total_bytes": 2**41, "disk_used_bytes": 2**40,
                      "disk_free_bytes": 2**40, "disk_percent": 50.0, "gpus": gpus, "gpu_source": "nvml",
                      "gpu_absent_reason": None, "power_score": 2330.0, "vram_total_bytes": 104 * 2**30},
    }
    env = seal_snapshot(ident, snap)
    entry = len(msgpack.packb({ident.node_id: 123456})) - 1
    return entry, len(msgpack.packb(env.to_wire(), use_bin_type=True))


def run_spread(n: int, *, fanout: int, loss: float, interval_s: float, seed: int) -> dict:
    """The spread experiment (see :mod:`p2pnode.sim._spread`) as a result dict."""
    t0 = time.perf_counter()
    r = simulate_spread(n, fanout=fanout, loss=loss, seed=seed)
    wall = time.perf_counter() - t0
    rounds_taken = max(1, len(r.curve) - 1)

    def q(d: dict[float, int | None]) -> dict[str, int | None]:
        return {f"{k * 100:g}%": v for k, v in d.items()}

    return {
        "n": n,
        "fanout": fanout,
        "loss": loss,
        "rounds": q(r.rounds),
        "seconds": {k: (v * interval_s if v is not None else None) for k, v in q(r.rounds).items()},
        "serf_estimate_rounds": q(r.serf),
        "serf_fraction_at_sim_rounds": {
            k: round(serf_fraction(n, fanout, loss, v), 6) for k, v in q(r.rounds).items() if v is not None
        },
        "messages_per_node_per_round": r.messages / (n * rounds_taken),
        "wall_s": round(wall, 3),
    }


def run_cluster(
    n: int, *, fanout: int, loss: float, latency_s: float, cfg: MembershipConfig, seed: int, steady_s: float = 20.0,
    push_pull_s: float = 0.0,
) -> dict:
    """Fresh cluster: time to agree on a leader; a steady phase (rates, false suspicions under ``loss``); then
    ``kill -9`` of the leader: time until every live member marks it dead and until they agree on the next.
    ``push_pull_s`` > 0: partial digests between full push-pulls of that base interval (:class:`ClusterSim`)."""
    t0 = time.perf_counter()
    voters = None if n <= 50 else list(random.Random(seed).sample(range(n), 7))
    sim = ClusterSim(n, seed=seed, fanout=fanout, loss=loss, latency_s=latency_s, cfg=cfg, voters=voters,
                     digest_entry_bytes=wire_sizes()[0], snapshot_bytes=wire_sizes()[1], push_pull_s=push_pull_s)
    limit = 600.0
    while sim.agreed_leader() is None and sim.now < limit:
        sim.round()
    agree_s = sim.now
    leader = sim.agreed_leader()
    expected = sim.strongest(list(range(n)))
    c0 = (sim.counters.messages, sim.counters.bytes, sim.counters.verifications, sim.now)
    sim.run_until(sim.now + steady_s)
    dt = sim.now - c0[3]
    rates = {
        "messages_per_node_per_s": (sim.counters.messages - c0[0]) / (n * dt),
        "bytes_per_node_per_s": (sim.counters.bytes - c0[1]) / (n * dt),
        "verifications_per_node_per_s": (sim.counters.verifications - c0[2]) / (n * dt),
    }
    false_suspicions = sim.counters.false_suspicions
    false_deaths = sim.counters.false_deaths
    victim = sim.index[leader] if leader else 0
    sim.kill(victim)
    t_kill = sim.now
    dead_s = None
    new_leader_s = None
    while sim.now < t_kill + limit and (dead_s is None or new_leader_s is None):
        sim.round()
        if dead_s is None and sim.all_see(victim, MemberState.DEAD):
            dead_s = sim.now - t_kill
        agreed = sim.agreed_leader()
        if new_leader_s is None and agreed is not None and agreed != sim.ids[victim]:
            new_leader_s = sim.now - t_kill
    return {
        "n": n,
        "push_pull_s": push_pull_s,
        "voters": "all members" if voters is None else len(voters),
        "loss": loss,
        "agree_on_leader_s": agree_s,
        "leader_is_strongest": leader == (expected if voters is None else leader),
        "rates_steady": rates,
        "false_suspicions": false_suspicions,
        "false_deaths": false_deaths,
        "steady_s": steady_s,
        "killed_leader_dead_everywhere_s": dead_s,
        "new_leader_agreed_s": new_leader_s,
        "max_leaders_per_term": max((len(v) for v in sim.counters.leaders_per_term.values()), default=0),
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def run_partitions(runs: int, n: int, *, fanout: int, loss: float, latency_s: float, cfg: MembershipConfig,
                   seed: int) -> dict:
    """``runs`` seeded random splits of an ``n``-node cluster (every member a voter; one run in three puts the
    strongest node on the smaller side). Checks: never two leaders in one term; the side without a voter
    majority has no leader once settled; after healing one leader and every member alive."""
    rng = random.Random(seed)
    violations = {"two_leaders_in_a_term": 0, "leader_on_minority": 0, "not_healed": 0}
    heal_times, majority_times = [], []
    t0 = time.perf_counter()
    for run in range(runs):
        s = rng.randrange(1 << 30)
        sim = ClusterSim(n, seed=s, fanout=fanout, loss=loss, latency_s=latency_s, cfg=cfg)
        sim.run_until(10.0)
        size = rng.randrange(1, n)
        order = sorted(range(n),
                       key=lambda i: (sim.candidates[i].power_score, sim.candidates[i].vram_bytes, sim.ids[i]))
        if run % 3 == 0:  # the strongest node and a few others are cut off
            minority = set(order[-min(size, n // 2):])
        else:
            minority = set(rng.sample(range(n), size))
        majority = set(range(n)) - minority
        small, big = (minority, majority) if len(minority) <= len(majority) else (majority, minority)
        sim.partition([small])
        t_split = sim.now
        settle = sim.now + 60.0
        big_leader_at = None
        while sim.now < settle:
            sim.round()
            if sim.now > t_split + 30.0:  # past detection: the minority must be leaderless
                if (any(leader is not None for leader, _ in sim.leader_views(sorted(small)).values())
                        and 2 * len(small) <= n):
                    violations["leader_on_minority"] += 1
                    break
            agreed = sim.agreed_leader(sorted(big))
            if big_leader_at is None and 2 * len(big) > n and agreed is not None and sim.index[agreed] in big:
                big_leader_at = sim.now - t_split
        if big_leader_at is not None:
            majority_times.append(big_leader_at)
        sim.heal()
        t_heal = sim.now
        healed = False
        while sim.now < t_heal + 120.0:
            sim.round()
            views = set(sim.leader_views().values())
            everyone_alive = all(
                all(m.state_of(sim.ids[k]) is MemberState.ALIVE for k in range(n)) for m in sim.memberships
            )
            if len(views) == 1 and next(iter(views))[0] is not None and everyone_alive:
                healed = True
                heal_times.append(sim.now - t_heal)
                break
        if not healed:
            violations["not_healed"] += 1
        if any(len(v) > 1 for v in sim.counters.leaders_per_term.values()):
            violations["two_leaders_in_a_term"] += 1
    return {
        "runs": runs,
        "n": n,
        "violations": violations,
        "majority_side_leader_s_max": max(majority_times, default=None),
        "heal_s_mean": sum(heal_times) / len(heal_times) if heal_times else None,
        "heal_s_max": max(heal_times, default=None),
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def profile(name: str, interval_s: float) -> MembershipConfig:
    """The membership profile ``name`` (``lan``, ``wan``) as a :class:`p2pnode.gossip.MembershipConfig`."""
    return replace(PROFILES[name], gossip_interval_s=interval_s)
