"""SWIM detection of a killed node by the real probe + membership cores, beside memberlist's formula.

    python bench/swim_detection.py                      # N = 5, 100 (seconds); add 1000 for minutes
    python bench/swim_detection.py --nodes 5 100 1000 --loss 0.1 --seeds 3 --json

For each N and seed (p2pnode.sim._swim.detection): one node is killed after 5 s of warm-up; printed are the
first suspicion, the first and the last survivor to mark it dead (seconds after the kill), memberlist's
``suspicion_mult x max(1, log10 N) x interval``, false suspicions of live nodes, and probe packets per node per
second. Snapshots are modelled (observed ceil(log4 N) gossip rounds after they are published).
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
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    rows = []
    for n in ns.nodes:
        for seed in range(1, ns.seeds + 1):
            t0 = time.perf_counter()
            r = detection(n, seed=seed, loss=ns.loss)
            r["wall_s"] = round(time.perf_counter() - t0, 1)
            r["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            rows.append(r)
            if not ns.json:
                print(f"N={n:>5} seed={seed} loss={ns.loss:.0%}: suspect {r['suspect_first_s']:.1f} s, dead first "
                      f"{r['dead_first_s']:.1f} s, all {r['dead_all_s']:.1f} s (memberlist formula "
                      f"{r['memberlist_formula_s']:.1f} s); false suspicions {r['false_suspicions']}; "
                      f"{r['packets_per_node_s']:.2f} packets/node/s; wall {r['wall_s']} s", flush=True)
    if ns.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
