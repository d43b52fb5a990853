"""Gossip bytes per node per second with full digests and with partial digests (issue 42 item 2), in the cluster
simulator (real membership, election and node cores; the byte layer modelled with the real wire sizes).

    python bench/gossip_digests.py                          # N = 100, 1000 (minutes)
    python bench/gossip_digests.py --nodes 100 1000 2000 --push-pull 0 30 --json

For each N and push-pull base interval (0: every message carries the full digest, as before; 30: partial digests
between full push-pulls, memberlist's default) p2pnode.sim.run_cluster runs a fresh cluster to a leader, 20 s of
steady state (messages, bytes and signature verifications per node per second, false suspicions), then kills
the leader (dead everywhere, next leader agreed, seconds after the kill).
"""

from __future__ import annotations

import argparse
import json
import time

from p2pnode.sim import profile, run_cluster


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--push-pull", type=float, nargs="+", default=[0.0, 30.0])
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    cfg = profile("lan", 1.0)
    if not ns.json:
        print(f"{'N':>6} {'push-pull s':>11} {'msgs/node/s':>11} {'bytes/node/s':>13} {'verif/node/s':>12} "
              f"{'dead all s':>10} {'new leader s':>12} {'false susp':>10} {'wall s':>7}")
    for n in ns.nodes:
        for pp in ns.push_pull:
            t0 = time.perf_counter()
            r = run_cluster(n, fanout=3, loss=ns.loss, latency_s=0.001, cfg=cfg, seed=ns.seed, push_pull_s=pp)
            wall = time.perf_counter() - t0
            rates = r["rates_steady"]
            if ns.json:
                print(json.dumps({**r, "wall_s": round(wall, 1)}), flush=True)
                continue
            print(f"{n:>6} {pp:>11g} {rates['messages_per_node_per_s']:>11.2f} {rates['bytes_per_node_per_s']:>13,.0f} "
                  f"{rates['verifications_per_node_per_s']:>12.1f} {r['killed_leader_dead_everywhere_s']!s:>10} "
                  f"{r['new_leader_agreed_s']!s:>12} {r['false_suspicions']:>10} {wall:>7.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
