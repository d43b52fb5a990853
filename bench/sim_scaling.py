"""Gossip and failure-detection figures at N = 100, 1,000 and 10,000, beside Serf's closed-form estimate.

    python bench/sim_scaling.py            # about 2 minutes on 2 cores
    python bench/sim_scaling.py --json

For each N: rounds for a fresh update to reach 50 / 99 / 99.9 / 100 % of nodes (push-pull, loss 0 % and
50 %) next to Serf's estimate for the same N and fanout; then, from a cluster of the real membership and
election cores (N = 100 and 1,000), the time until every live member marks a kill -9'd leader dead, the time
to agree on the next leader, and per-node messages, bytes and signature verifications per second. At N =
10,000 the cluster run would need N² member records (about 20 GB); its detection bound and verification rate
are computed from the same formulas the cores use (marked "formula"), and its spread is simulated.
"""

from __future__ import annotations

import argparse
import json
import time

from p2pnode.gossip import PROFILES, publish_interval_s, suspect_after_s, suspicion_timeout_s
from p2pnode.sim import profile, run_cluster, run_spread


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ns = ap.parse_args()
    cfg = profile("lan", 1.0)
    rows = []
    for n in (100, 1000, 10000):
        row: dict = {"n": n}
        for loss in (0.0, 0.5):
            row[f"spread_loss_{int(loss * 100)}"] = run_spread(n, fanout=3, loss=loss, interval_s=1.0, seed=ns.seed)
        if n <= 1000:
            row["cluster"] = run_cluster(n, fanout=3, loss=0.0, latency_s=0.001, cfg=cfg, seed=ns.seed)
        else:
            lan = PROFILES["lan"]
            row["cluster"] = {
                "formula": True,
                "killed_leader_dead_everywhere_s": suspect_after_s(n, lan) + suspicion_timeout_s(n, 3, lan),
                "publish_interval_s": publish_interval_s(n, lan),
                "verifications_per_node_per_s": n / publish_interval_s(n, lan),
            }
        rows.append(row)
    if ns.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("Spread of a fresh update (rounds to 50/99/99.9/100 %; Serf's estimate for 50/99/99.9 %)")
    for r in rows:
        for key in ("spread_loss_0", "spread_loss_50"):
            s = r[key]
            sim = "/".join(str(v) for v in s["rounds"].values())
            serf = "/".join(str(v) for k, v in s["serf_estimate_rounds"].items() if v is not None)
            ratio = s["rounds"]["99.9%"] / s["serf_estimate_rounds"]["99.9%"]
            print(f"  N={r['n']:>6} loss {s['loss']:>4.0%}: simulated {sim:<12} Serf {serf:<10} "
                  f"99.9 % ratio sim/Serf {ratio:.2f}  (wall {s['wall_s']} s)")
    print("\nFailure detection and per-node rates (LAN profile, fanout 3, 1 s interval)")
    for r in rows:
        c = r["cluster"]
        if c.get("formula"):
            print(f"  N={r['n']:>6}: kill -9 -> dead everywhere <= {c['killed_leader_dead_everywhere_s']:.0f} s "
                  f"(formula, 3 confirmations); heartbeat every {c['publish_interval_s']:.0f} s; "
                  f"verifications/node/s {c['verifications_per_node_per_s']:.0f} (formula)")
            continue
        rt = c["rates_steady"]
        print(f"  N={r['n']:>6}: agree {c['agree_on_leader_s']:.0f} s; kill -9 of the leader -> dead everywhere "
              f"{c['killed_leader_dead_everywhere_s']:.0f} s, next leader {c['new_leader_agreed_s']:.0f} s; "
              f"per node/s: {rt['messages_per_node_per_s']:.1f} msgs, {rt['bytes_per_node_per_s'] / 1024:.0f} KiB, "
              f"{rt['verifications_per_node_per_s']:.1f} verifications; leaders/term max {c['max_leaders_per_term']} "
              f"(wall {c['wall_s']} s)")
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"\ntotal wall {time.perf_counter() - t0:.1f} s")
    raise SystemExit(rc)
