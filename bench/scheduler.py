"""Planner cost and outcome at 1,000 nodes × 200 configs, beside a plain greedy first-fit planner timed on the
same cluster views in the same run (see p2pnode/sim/_sched.py for the scenario).

    python bench/scheduler.py               # seeds 1-3, about 25 s
    python bench/scheduler.py --nodes 2000 --configs 400 --seeds 1
"""

from __future__ import annotations

import argparse
import json

from p2pnode.sim import run_scheduling


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--configs", type=int, default=200)
    ap.add_argument("--duration", type=float, default=1800.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    runs = [run_scheduling(ns.nodes, ns.configs, duration_s=ns.duration, seed=s) for s in range(1, ns.seeds + 1)]
    if ns.json:
        print(json.dumps(runs, indent=2, default=str))
        return 0
    print(f"{ns.nodes} nodes x {ns.configs} configs, {ns.duration:g} s of 10 s plans, leader failover at half time")
    print("times in ms")
    print(f"{'seed':>4} {'plan med':>9} {'plan p99':>9} {'plan max':>9} {'greedy med':>11} {'greedy p99':>11} "
          f"{'med ratio':>9}  util t1/t2/t3 %    quota err  longest wait  violations  refused  fenced  carried  "
          f"double training")
    for s, r in enumerate(runs, start=1):
        u = "/".join(f"{r['util_by_tier'][t]['mean_util_percent']:.0f}" for t in sorted(r["util_by_tier"]))
        print(f"{s:>4} {r['plan_ms']['median']:>9.1f} {r['plan_ms']['p99']:>9.1f} {r['plan_ms']['max']:>9.1f} "
              f"{r['greedy_first_fit_ms']['median']:>11.1f} {r['greedy_first_fit_ms']['p99']:>11.1f} "
              f"{r['ratio_median_vs_greedy']:>9.2f}  {u:<16} {r['quota_error_mean']:>9.4f}  "
              f"{r['longest_wait_s']:>9.0f} s  {r['violation_count']:>10}  {r['refusals']:>7}  {r['fenced']:>6}  "
              f"{r['carried_over']:>7}  {r['double_training']:>15}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
