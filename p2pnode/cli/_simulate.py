"""``p2pnode simulate`` (the real cores on a simulated network, one process) and ``p2pnode demo`` (real agents on
this machine): a cluster without a fleet."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..config import DEFAULT_PORT

__all__ = ["add_demo_parser", "add_simulate_parser"]


def add_demo_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="a 5-node cluster on this machine (fake GPUs, the demo catalog) until Ctrl-C",
                       description="Start a cluster on 127.0.0.1: agents with fake GPUs (H200, H100, A100, RTX 4090, "
                       "RTX 3060), the demo catalog, two durable nodes and one ephemeral, mDNS off (joined by "
                       "address). Prints the dashboard URL and what to try; Ctrl-C stops every agent and job and "
                       "removes the temporary data. P2PNODE_* settings of the shell are not passed to the agents.")
    p.add_argument("--nodes", type=int, default=5, help="agents to start (default 5)")
    p.add_argument("--base-port", dest="base_port", type=int, default=DEFAULT_PORT,
                   help=f"HTTP port of the first agent, the others follow, then each agent's data-channel port "
                        f"(default {DEFAULT_PORT}: 8770-8774 and 8775-8779 for 5 nodes; 0 = any free ports)")
    p.add_argument("--keep", action="store_true", help="keep the data dirs and logs on exit")
    p.add_argument("--gossip-profile", choices=["lan", "wan", "local-test"],
                   default=os.environ.get("P2PNODE_GOSSIP_PROFILE", "lan"),
                   help="failure-detection timings (default $P2PNODE_GOSSIP_PROFILE or lan; a killed node is "
                        "dead after about 10 s with lan, 4 s with local-test)")
    p.add_argument("--scaling", action="store_true",
                   help="the leader scales with the local provider: up to 2 extra RTX 3060 agents for waiting work, "
                        "removed once idle (the first three nodes are voters)")
    p.set_defaults(func=_cmd_demo)


def add_simulate_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="simulate a cluster of the real membership and election cores",
                       description="Deterministic simulation (same seed, same figures): spread of a fresh update "
                       "beside Serf's estimate, leader agreement, kill -9 detection, false suspicions under loss, "
                       "per-node message/byte/verification rates, and partition safety runs; with --scenario "
                       "scheduling, the planner and every node's job core and stop rules: stops by rule, refusals "
                       "by reason, drains and job-table transition errors.")
    p.add_argument("--scenario", choices=["gossip", "scheduling", "scaling", "goodput"], default="gossip",
                   help="gossip: spread, failure detection, election (default); scheduling: the planner on a "
                   "seed-003-shaped fleet with a failover; scaling: the leader's scaling decisions over a bursty "
                   "day with a simulated provider, with and without hysteresis (--duration, default 6 h); goodput: "
                   "trainings on nodes that die after seeded lifetimes by class, goodput with and without resuming "
                   "from checkpoints (--lifetimes, --checkpoint-interval; --duration, default 24 h)")
    p.add_argument("--nodes", type=int, default=1000, help="N: spread experiment or scheduling fleet (default 1000)")
    p.add_argument("--configs", type=int, default=None,
                   help="scheduling: configs in the catalog (default 200; 12 with --inventory seed003)")
    p.add_argument("--inventory", choices=["random", "seed003"], default="random",
                   help="scheduling: the fleet: random (--nodes nodes drawn from seed 003's mix, default) or "
                        "seed003 (seed 003's own 19 machines and its coordinator; --nodes ignored)")
    p.add_argument("--catalog", default=None, metavar="PATH",
                   help="scheduling: a job catalog (TOML) instead of the generated one of --configs configs, e.g. "
                        "deploy/examples/catalog.toml")
    p.add_argument("--gpu-max-percent", type=float, default=80.0,
                   help="scheduling: every node's [guard] gpu_max_percent: VRAM is committed up to it (default 80)")
    p.add_argument("--duration", type=float, default=1800.0, help="scheduling: simulated seconds (default 1800)")
    p.add_argument("--lifetimes", default="", metavar="CLASS=S,...",
                   help="goodput: mean node lifetime per class, seconds, exponential, 'inf' never (default "
                        "ephemeral=3600,durable=inf)")
    p.add_argument("--checkpoint-interval", dest="checkpoint_interval", type=float, default=60.0, metavar="S",
                   help="goodput: a training writes a checkpoint every S seconds (default 60)")
    p.add_argument("--sync-lag", dest="sync_lag", type=float, default=5.0, metavar="S",
                   help="goodput: seconds until a durable replica confirms a checkpoint (default 5)")
    p.add_argument("--fetch-time", dest="fetch_time", type=float, default=30.0, metavar="S",
                   help="goodput: seconds to fetch a checkpoint before a resumed start (default 30)")
    p.add_argument("--detect-time", dest="detect_time", type=float, default=45.0, metavar="S",
                   help="goodput: seconds from a node's death to its training placed again (detection, "
                        "orphan_grace_s, one plan; default 45)")
    p.add_argument("--drains", type=int, default=0, metavar="N",
                   help="scheduling: N nodes (never the first leader) start to drain at seeded times in 10-80 %% of "
                        "the run: cordoned, their preemptible jobs stopped at the drain deadline (default 0)")
    p.add_argument("--drain-deadline", type=float, default=300.0, metavar="S",
                   help="scheduling: seconds from a drain's start to its deadline (default 300)")
    p.add_argument("--max-runtime", type=float, default=None, metavar="S",
                   help="scheduling: every template's max_runtime_s (default: the catalog's own, 3600 s in the "
                        "generated one)")
    p.add_argument("--memory-over", type=float, default=0.0, metavar="P",
                   help="scheduling: the share (0-1) of started jobs whose memory goes over their limit at a "
                        "seeded time in their run, stopped by the memory rule (default 0)")
    p.add_argument("--operator-stops", type=int, default=0, metavar="N",
                   help="scheduling: N times at seeded times the operator stops one running job drawn at random "
                        "(default 0)")
    p.add_argument("--cluster-nodes", type=int,
                   help="N for the cluster experiments (default: --nodes; skipped above 10000)")
    p.add_argument("--fanout", type=int, default=3)
    p.add_argument("--push-pull-interval", type=float, default=0.0, metavar="S",
                   help="cluster experiments: partial digests between full push-pulls of this base interval, "
                        "seconds (gossip.push_pull_interval_s; default 0: every message carries the full digest)")
    p.add_argument("--interval", type=float, default=1.0, help="gossip interval, seconds (default 1)")
    p.add_argument("--loss", type=float, default=0.0, help="probability that a message is lost (default 0)")
    p.add_argument("--latency-ms", type=float, default=1.0, help="one-way message latency (default 1 ms)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gossip-profile", choices=["lan", "wan", "local-test"], default="lan")
    p.add_argument("--partition-runs", type=int, default=20, help="random partition runs (default 20; 0 skips)")
    p.add_argument("--partition-nodes", type=int, default=15, help="cluster size in partition runs (default 15)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.set_defaults(func=_cmd_simulate)


def _cmd_simulate(ns: argparse.Namespace) -> int:
    from ..sim import format_report, simulate

    if ns.nodes < 2 or ns.fanout < 1 or not 0.0 <= ns.loss < 1.0 or ns.interval <= 0:
        print("p2pnode simulate: need --nodes >= 2, --fanout >= 1, 0 <= --loss < 1, --interval > 0", file=sys.stderr)
        return 2
    if ns.scenario == "scaling":
        from ..sim import compare_autoscale, format_autoscale_report

        duration = ns.duration if ns.duration != 1800.0 else 6 * 3600.0
        r = compare_autoscale(seed=ns.seed, duration_s=duration)
        if ns.json:
            json.dump(r, sys.stdout, indent=2)
            print()
        else:
            print(format_autoscale_report(r))
        return 0
    if ns.scenario == "goodput":
        return _cmd_goodput(ns)
    if ns.scenario == "scheduling":
        from ..scheduler import CatalogError, load_catalog
        from ..sim import StopsConfig, format_scheduling_report, run_scheduling

        configs = ns.configs if ns.configs is not None else 12 if ns.inventory == "seed003" else 200
        try:
            catalog = load_catalog(ns.catalog) if ns.catalog else None
        except (OSError, CatalogError) as e:
            print(f"p2pnode simulate: --catalog {ns.catalog}: {e}", file=sys.stderr)
            return 2
        if not 0 < ns.gpu_max_percent <= 100:
            print("p2pnode simulate: need 0 < --gpu-max-percent <= 100", file=sys.stderr)
            return 2
        if min(ns.drains, ns.operator_stops, ns.drain_deadline) < 0 or not 0.0 <= ns.memory_over <= 1.0 or (
                ns.max_runtime is not None and ns.max_runtime <= 0):
            print("p2pnode simulate: need --drains, --operator-stops and --drain-deadline >= 0, "
                  "0 <= --memory-over <= 1, --max-runtime > 0", file=sys.stderr)
            return 2
        stops = StopsConfig(drains=ns.drains, drain_deadline_s=ns.drain_deadline, max_runtime_s=ns.max_runtime,
                            memory_over=ns.memory_over, operator_stops=ns.operator_stops)
        r = run_scheduling(ns.nodes, configs, duration_s=ns.duration, seed=ns.seed, inventory=ns.inventory,
                           gpu_max_percent=ns.gpu_max_percent, catalog=catalog, stops=stops)
        if ns.json:
            json.dump(r, sys.stdout, indent=2, default=str)
            print()
        else:
            print(format_scheduling_report(r))
        return 0 if r["violation_count"] == 0 and r["transition_errors"] == 0 else 1
    result = simulate(
        nodes=ns.nodes, fanout=ns.fanout, interval_s=ns.interval, loss=ns.loss, latency_ms=ns.latency_ms,
        seed=ns.seed, gossip_profile=ns.gossip_profile, cluster_nodes=ns.cluster_nodes,
        partition_runs=ns.partition_runs, partition_nodes=ns.partition_nodes,
        push_pull_s=ns.push_pull_interval,
    )
    if ns.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(format_report(result))
    return 0


def _cmd_goodput(ns: argparse.Namespace) -> int:
    from ..sim import format_goodput_report, parse_lifetimes, simulate_goodput

    try:
        lifetimes = parse_lifetimes(ns.lifetimes)
    except ValueError as e:
        print(f"p2pnode simulate: --lifetimes: {e}", file=sys.stderr)
        return 2
    times = (ns.checkpoint_interval, ns.sync_lag, ns.fetch_time, ns.detect_time)
    if ns.checkpoint_interval <= 0 or min(times) < 0 or (ns.configs is not None and ns.configs < 1):
        print("p2pnode simulate: need --checkpoint-interval > 0, --sync-lag, --fetch-time, --detect-time >= 0, "
              "--configs >= 1", file=sys.stderr)
        return 2
    r = simulate_goodput(seed=ns.seed, inventory=ns.inventory, nodes=ns.nodes, configs=ns.configs,
                         lifetimes=lifetimes, duration_s=ns.duration if ns.duration != 1800.0 else 24 * 3600.0,
                         checkpoint_interval_s=ns.checkpoint_interval, sync_lag_s=ns.sync_lag,
                         fetch_s=ns.fetch_time, detect_s=ns.detect_time)
    if ns.json:
        json.dump(r, sys.stdout, indent=2, default=str)
        print()
    else:
        print(format_goodput_report(r))
    return 0


def _cmd_demo(ns: argparse.Namespace) -> int:
    """A cluster of agents on this machine until Ctrl-C (see :mod:`p2pnode._demo`)."""
    from .._demo import run_demo

    return run_demo(nodes=ns.nodes, base_port=ns.base_port, keep=ns.keep, gossip_profile=ns.gossip_profile,
                    scaling=ns.scaling)
