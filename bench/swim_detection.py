"""SWIM detection of a killed node by the real probe + membership cores, beside memberlist's end-to-end bound.

    python bench/swim_detection.py                      # N = 5, 100 (seconds); add 1000 for minutes
    python bench/swim_detection.py --nodes 100 1000 --loss 0.1 --seeds 3 --json
    python bench/swim_detection.py --nodes 1000 --no-push   # news by the gossip rounds only (before issue 42)

For each N and seed (p2pnode.sim._swim.detection): one node is killed after 5 s of warm-up; printed are the first
and the last survivor to mark it suspect and dead (seconds after the kill), memberlist's end-to-end bound for that
N (p2pnode.sim._swim.memberlist_bound: first probe + failed probe + minimum suspicion timeout + the dead message's
spread over 200 ms gossip rounds) and the part of it after the first suspicion, false suspicions of live nodes, and
per node per second: probe packets and bytes, gossip exchanges (news pushes apart), snapshot versions verified.
Heartbeats are modelled (observed ceil(log4 N) gossip rounds after they are published); news versions (accusations,
refutations) travel by the modelled exchanges: rounds and, unless --no-push, the agent's news pushes.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from p2pnode.sim._swim import detection


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[5, 100])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--no-push", action="store_true", help="news by the gossip rounds only")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    rows = []
    for n in ns.nodes:
        for seed in range(ns.first_seed, ns.first_seed + ns.seeds):
            t0 = time.perf_counter()
            r = detection(n, seed=seed, loss=ns.loss, push=not ns.no_push)
            r["wall_s"] = round(time.perf_counter() - t0, 1)
            r["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            rows.append(r)
            if not ns.json:
                p = r["memberlist_parts"]
                after = p["suspicion_s"] + p["dissemination_s"]
                print(f"N={n:>5} seed={seed} loss={ns.loss:.0%} push={'off' if ns.no_push else 'on'}: suspect "
                      f"{r['suspect_first_s']:.1f}-{r['suspect_all_s']:.1f} s, dead {r['dead_first_s']:.1f}-"
                      f"{r['dead_all_s']:.1f} s (memberlist bound {r['memberlist_formula_s']:.1f} s; after the first "
                      f"suspicion ours {r['dead_all_s'] - r['suspect_first_s']:.1f} s, memberlist's {after:.1f} s); "
                      f"false suspicions {r['false_suspicions']}; per node/s: {r['packets_per_node_s']:.2f} probe "
                      f"packets ({r['probe_bytes_per_node_s']:.0f} B), {r['exchanges_per_node_s']:.2f} exchanges "
                      f"({r['push_exchanges_per_node_s']:.2f} pushes), {r['verifications_per_node_s']:.1f} "
                      f"verifications; wall {r['wall_s']} s", flush=True)
    if ns.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
