"""Placement rate (issue 15): seconds from the leader's first plan until an empty 1,000 × 8-GPU fleet is full,
with planning on demand (1 s least gap, 5 s interval, the default per-plan cap) beside the old rule (128
placements per plan, one plan every 5 s) measured in the same run. Virtual time; plan times are wall time on
this machine (see p2pnode/sim/_sched.py, ``run_placement_rate``).

    python bench/placement_rate.py            # about 20 s
    python bench/placement_rate.py --nodes 200 --json
"""

from __future__ import annotations

import argparse
import json

from p2pnode.sim._sched import run_placement_rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--configs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    new = run_placement_rate(ns.nodes, ns.gpus, ns.configs, seed=ns.seed)
    old = run_placement_rate(ns.nodes, ns.gpus, ns.configs, seed=ns.seed, min_gap_s=None, max_assignments=128)
    if ns.json:
        print(json.dumps({"on_demand": new, "baseline_128_per_5s": old}, indent=2))
        return 0
    print(f"empty fleet of {ns.nodes} x {ns.gpus} GPUs, {ns.configs} configs; times in ms")
    print(f"{'rule':<34} {'full after':>10} {'plans':>5} {'most/plan':>9} {'plan p50':>8} {'plan p99':>8} "
          f"{'lead p50':>8} {'lead p99':>8} {'GPU share':>9} {'violations':>10}")
    rows = ((f"on demand, 1 s gap, cap {new['max_assignments']}", new), ("old: 128 per plan every 5 s", old))
    for name, r in rows:
        full = f"{r['fully_placed_s']:g} s" if r["fully_placed_s"] is not None else "never"
        print(f"{name:<34} {full:>10} {r['plans']:>5} {r['most_placements_in_a_plan']:>9} "
              f"{r['plan_ms']['median']:>8.1f} {r['plan_ms']['p99']:>8.1f} {r['lead_ms']['median']:>8.1f} "
              f"{r['lead_ms']['p99']:>8.1f} {r['placed_gpu_share']:>9.2%} {r['violation_count']:>10}")
    if new["fully_placed_s"] and old["fully_placed_s"]:
        print(f"ratio (old fill time / new): {old['fully_placed_s'] / max(1e-9, new['fully_placed_s']):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
