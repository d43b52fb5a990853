"""How long `p2pnode demo` takes to show a working cluster, on a quiet machine and on a busy one, in one run.

    python bench/demo_ready.py                   # 3 quiet runs, then 3 beside 2 CPU burners
    python bench/demo_ready.py --runs 5 --burners 4 --json

Each run starts `p2pnode demo --base-port 0`, times the banner (every agent's API answers) and the moment the
first node's `/status` shows 5 alive members and a leader while `/jobs` counts running jobs, then sends SIGINT
and times the exit. The busy runs add `--burners` processes spinning on the CPU (a second test suite or a data
loader on our users' nodes does the same), so the two figures come from the same machine in one sitting.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def _spin() -> None:
    while True:
        pass


def _ready(url: str) -> bool:
    try:
        status = httpx.get(f"{url}/status", timeout=2, trust_env=False).json()
        jobs = httpx.get(f"{url}/jobs", timeout=2, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return False
    alive = [m for m in status["members"] if m["state"] == "alive"]
    return len(alive) == 5 and bool(status["election"]["leader"]) and sum(jobs["running_counts"].values()) > 0


def one_run(timeout_s: float) -> dict:
    """One demo from start to exit: seconds to the banner, to a working cluster, and from SIGINT to exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PNODE_")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo.out"
        t0 = time.monotonic()
        with open(out, "wb") as f:
            demo = subprocess.Popen([sys.executable, "-m", "p2pnode", "demo", "--base-port", "0"], stdout=f,
                                    stderr=subprocess.STDOUT, env=env)
        try:
            banner_s = ready_s = None
            url = None
            while time.monotonic() - t0 < timeout_s and demo.poll() is None:
                if url is None:
                    m = re.search(r"Dashboard:\s+(http://127\.0\.0\.1:\d+)/", out.read_text())
                    if m:
                        url, banner_s = m.group(1), time.monotonic() - t0
                elif _ready(url):
                    ready_s = time.monotonic() - t0
                    break
                time.sleep(0.2)
            t1 = time.monotonic()
            demo.send_signal(signal.SIGINT)
            code = demo.wait(60)
            return {"banner_s": banner_s, "ready_s": ready_s, "exit_s": time.monotonic() - t1, "exit_code": code}
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per condition (default 3)")
    ap.add_argument("--burners", type=int, default=2, help="CPU-spinning processes in the busy runs (default 2)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds one run may take to be ready")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    results: dict[str, list[dict]] = {"quiet": [], "busy": []}
    for _ in range(args.runs):
        results["quiet"].append(one_run(args.timeout))
    burners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    try:
        for _ in range(args.runs):
            results["busy"].append(one_run(args.timeout))
    finally:
        for b in burners:
            b.kill()
            b.join()

    summary = {}
    for cond, runs in results.items():
        ready = [r["ready_s"] for r in runs if r["ready_s"] is not None]
        summary[cond] = {
            "runs": runs,
            "ready_median_s": statistics.median(ready) if ready else None,
            "ready_max_s": max(ready) if ready else None,
            "not_ready": len(runs) - len(ready),
        }
    q, b = summary["quiet"]["ready_median_s"], summary["busy"]["ready_median_s"]
    summary["busy_over_quiet"] = (b / q) if q and b else None
    summary["cpus"] = os.cpu_count()
    summary["burners"] = args.burners
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for cond in ("quiet", "busy"):
            s = summary[cond]
            each = ", ".join(f"{r['ready_s']:.1f}" if r["ready_s"] is not None else "never" for r in s["runs"])
            banner = ", ".join(f"{r['banner_s']:.1f}" if r["banner_s"] else "-" for r in s["runs"])
            exits = ", ".join(f"{r['exit_s']:.1f}" for r in s["runs"])
            print(f"{cond:5}: ready in {each} s (median {s['ready_median_s']}); banner {banner} s; exit {exits} s")
        if summary["busy_over_quiet"]:
            print(f"busy/quiet: {summary['busy_over_quiet']:.2f}x with {args.burners} burners on "
                  f"{summary['cpus']} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
