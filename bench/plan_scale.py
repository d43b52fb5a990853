"""Plans past the snapshot (issue 15): three real agents with 64 fake A100s each, filled with 1,536 one-eighth-GPU
``sleep`` jobs, beside the same three agents with a plan of 10 assignments, measured in the same run: gossip
bytes per node and second (the plan is not in it: about the same), plan and running-list fetch bytes, the largest
own snapshot, leaders and terms. Exits 1 unless every job runs, one leader leads throughout and no snapshot passes
its bound (the acceptance of issue 15; the suite runs the same at 3 x 8 GPUs).

    python bench/plan_scale.py               # about 2 minutes
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from scale import fill  # noqa: E402


def main() -> int:
    rows = []
    for instances in (10, 1536):
        with tempfile.TemporaryDirectory(prefix="p2pnode-plan-scale-") as tmp:
            rows.append((instances, fill(Path(tmp), gpus=64, instances=instances, window_s=20.0)))
    print("3 agents x 64 fake A100s; gossip measured over 20 s once every job runs")
    print(f"{'plan':>6} {'running':>8} {'fill s':>7} {'leaders':>7} {'terms':>5} {'snapshot max':>12} "
          f"{'gossip KiB/s/node':>17} {'fetch KiB/s/node':>16}")
    for _n, r in rows:
        print(f"{r.assignments:>6} {r.running:>8} {r.fill_s:>7.1f} {len(r.leaders):>7} {len(r.terms):>5} "
              f"{r.max_snapshot_bytes:>12} {r.gossip_bytes_per_node_s / 1024:>17.1f} "
              f"{r.fetch_bytes_per_node_s / 1024:>16.1f}")
    small, big = rows[0][1], rows[1][1]
    ratio = big.gossip_bytes_per_node_s / small.gossip_bytes_per_node_s
    size = big.max_snapshot_bytes / small.max_snapshot_bytes
    print(f"gossip per node, 1,536 vs 10 assignments: {ratio:.2f}x; largest snapshot {size:.2f}x "
          f"(bound {big.snapshot_bound})")
    failed = [f"{n} jobs: {why}" for n, r in rows for ok, why in (
        (r.running >= n and r.assignments >= n, f"{r.running} of {n} running, {r.assignments} assigned"),
        (len(r.leaders) == 1, f"leaders {sorted(r.leaders)}"),
        (r.max_snapshot_bytes <= r.snapshot_bound and not r.plans_omitted and not r.unpublishable,
         f"snapshot {r.max_snapshot_bytes} B, plans omitted {r.plans_omitted}, unpublishable {r.unpublishable}"))
        if not ok]
    for f in failed:
        print(f"FAILED: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
