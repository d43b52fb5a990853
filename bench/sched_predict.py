"""The scheduling simulation without and with predictions, side by side (issue 27): one seed, the same fleet,
catalog and workload, planned once without a predictor and once with the fleet's predictor built from the runs
that ended (see p2pnode/sim/_sched.py, ``run_scheduling_predict``, and docs/capacity.md, "Planner").

    python bench/sched_predict.py                 # 1,000 nodes x 200 configs, 1 h, seeds 1-3 (a few minutes)
    python bench/sched_predict.py --nodes 150 --configs 24 --duration 1800 --seeds 1
    python bench/sched_predict.py --workload exponential   # memoryless run times: history predicts no end

Acceptance: utilization per tier and quota error no worse with predictions, running time lost to preemption lower.
"Useful" utilization is every GPU's utilization less the busy time of work a preemption threw away (it is run
again, so without that correction a planner that preempts more reads busier for the same work done).
"""

from __future__ import annotations

import argparse
import json

from p2pnode.sim._sched import run_scheduling_predict


def _row(seed: int, name: str, r: dict) -> str:
    u = " / ".join(f"{r['util_by_tier'][t]['mean_util_percent']:.1f}" for t in sorted(r["util_by_tier"]))
    a = " / ".join(f"{v:.1f}" for _, v in sorted(r["util_all_by_tier"].items()))
    g = " / ".join(f"{v:.1f}" for _, v in sorted(r["useful_util_by_tier"].items()))
    w = r["wait_s"]["single"]
    b = r["predictor_build_ms"]
    build = f"{b['median']:.0f} / {b['max']:.0f} ms" if b else "-"
    return (f"| {seed} | {name} | {u} % | {a} % | {g} % | {r['util_all_fleet']:.2f} / {r['useful_util_fleet']:.2f} % | "
            f"{r['quota_error_mean']:.4f} | {r['preempted']} | "
            f"{r['preemption_lost_s']:,.0f} s | {r['preemption_lost_gpu_s']:,.0f} | {r['waits_for_predicted_end']} | "
            f"{w['p50']:.0f} / {w['p99']:.0f} s | {r['longest_wait_s']:.0f} s | {r['plan_ms']['median']:.1f} / "
            f"{r['plan_ms']['p99']:.1f} ms | {build} | {r['violation_count']} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--configs", type=int, default=200)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--workload", choices=("varied", "exponential"), default="varied")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    seeds = range(ns.first_seed, ns.first_seed + ns.seeds)
    runs = {s: run_scheduling_predict(ns.nodes, ns.configs, duration_s=ns.duration, seed=s, workload=ns.workload)
            for s in seeds}
    if ns.json:
        print(json.dumps(runs, indent=2, default=str))
        return 0
    print(f"{ns.nodes} nodes x {ns.configs} configs, {ns.duration:g} s of 10 s plans, {ns.workload} run times, "
          "leader failover at half time")
    print("| seed | predictions | util by tier (while work waits) | util by tier (every GPU) | "
          "useful util by tier (every GPU, less work preempted) | fleet util / useful | quota error | "
          "preempted | time lost to preemption | GPU-s lost | waits for a predicted end | wait p50 / p99 | "
          "longest wait | plan median / p99 | predictor build median / max | violations |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s, pair in runs.items():
        for name, r in pair.items():
            print(_row(s, name, r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
