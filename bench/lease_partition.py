"""Issue 42's lease acceptance, measured: three agents in network namespaces, a config's training on one of them,
that node's link cut for ``--hold`` seconds (2 minutes by default), once per seed. Per run: when the holder
stopped its training and when the majority side ran it again (seconds after the cut), the most trainings of the
config at once in the samples taken every 0.5 s from ``/proc`` (the namespaces share the PID namespace: one scan
sees every agent's jobs), how long after the heal one training was left, and the holder's stop rules. Prints one
JSON line per run and a summary; exits 1 when any run had two trainings at once.

Needs root and ``ip netns`` (as ``tests/test_netns_lease.py``, whose run it drives: ``partition_run``). Each run
takes about ``--hold`` + 40 s.

    sudo .venv/bin/python bench/lease_partition.py --seeds 20 --hold 120
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_netns_lease import INTERVAL_S, LEASE_S, partition_run  # noqa: E402

from p2pnode.node._lease import takeover_after_s  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="runs, seeds 1..N (default 20)")
    ap.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    ap.add_argument("--hold", type=float, default=120.0, help="seconds the partition lasts (default 120)")
    a = ap.parse_args()
    runs = []
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        with tempfile.TemporaryDirectory(prefix="lease-bench-") as d:
            try:
                r = partition_run(Path(d), hold_s=a.hold, seed=seed)
            except Exception as exc:  # one failed run is a result too: reported, the next seed runs
                r = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        r = {"seed": seed, **{k: v for k, v in r.items() if k != "twice"}, "twice": len(r.get("twice", []))}
        runs.append(r)
        print(json.dumps(r), flush=True)
    ok = [r for r in runs if "error" not in r]
    moved = [r["moved_s"] for r in ok]
    stopped = [r["holder_stopped_s"] for r in ok if r["holder_stopped_s"] is not None]
    bound = LEASE_S + INTERVAL_S + (takeover_after_s(LEASE_S) - LEASE_S)
    print(f"lease {LEASE_S:g} s, interval {INTERVAL_S:g} s, partition {a.hold:g} s: {len(ok)}/{len(runs)} runs "
          f"completed; at most {max((r['most'] for r in ok), default=0)} trainings at once "
          f"({sum(r['most'] > 1 for r in ok)} runs with two); ran again after the cut: "
          + (f"median {statistics.median(moved):.1f} s, max {max(moved):.1f} s (bound lease + interval + margin "
             f"{bound:.1f} s; {sum(m > bound for m in moved)} over); " if moved else "")
          + (f"holder stopped: median {statistics.median(stopped):.1f} s, max {max(stopped):.1f} s" if stopped
             else ""))
    return 1 if any(r["most"] > 1 for r in ok) else 0


if __name__ == "__main__":
    raise SystemExit(main())
