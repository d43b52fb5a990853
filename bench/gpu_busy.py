"""GPUs busy by default (issue 24): one agent with ``--fake-gpus 8xA100`` declaring the CPUs such a box has
(``--resource cpus=64``), a catalog of one-GPU jobs that run 30-60 s each (more work than GPUs: work always
waits), every other setting default. Measures, polling ``GET /jobs`` every 0.25 s:

* how long after the agent's HTTP API answers every GPU holds a job (the acceptance line: within 15 s);
* over the run (default 5 minutes), GPU-seconds holding a job as a share of the GPU-seconds available (the
  acceptance line: at least 90 % while work waits);
* the jobs started, the starts the spawn-rate limit held back, and the assignments the node refused (its own
  admission: GPU fraction or VRAM already committed, CPUs).

The same run with the old fixed limit (``--fixed-rate 10``: ``guard.max_spawns_per_minute = 10``, one rate for
every node) gives the baseline figure. With ``--gpus-per-job 0.5`` two jobs share each GPU (16 job slots): the
box needs about 21 starts a minute, where the old limit binds.

    python bench/gpu_busy.py                      # 5 minutes
    python bench/gpu_busy.py --seconds 120 --fixed-rate 10 --gpus-per-job 0.5 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from agents import AgentProc, free_port, wait_until  # noqa: E402

JOB = """
[[job]]
name = "selfplay-{i}"
kind = "selfplay"
config = "c{i}"
argv = ["sh", "-c", "exec sleep $((30 + $$ % 31))"]
max_concurrency = 8
[job.resources]
num_gpus = {gpus}
vram_gib = 16
num_cpus = 4
"""


def run(seconds: float, fixed_rate: float | None, gpus_per_job: float = 1.0) -> dict:
    with tempfile.TemporaryDirectory(prefix="p2pnode-busy-") as tmp:
        root = Path(tmp)
        catalog = root / "catalog.toml"
        catalog.write_text("".join(JOB.replace("{i}", str(i)).replace("{gpus}", f"{gpus_per_job:g}")
                                   for i in range(4)))
        slots = int(8 / gpus_per_job)
        env = {"P2PNODE_MAX_SPAWNS_PER_MINUTE": str(fixed_rate)} if fixed_rate is not None else {}
        agent = AgentProc(root / "a", free_port(), "--fake-gpus", "8xA100", "--resource", "cpus=64",
                          "--catalog", str(catalog), "--no-mdns", env=env).start()
        try:
            wait_until(agent.status, 30, what="the agent's API")
            t0 = time.monotonic()
            full_at = None
            held_s = avail_s = slot_s = 0.0
            slots_full_at = None
            last = t0
            rate_limited = 0
            refused: set[str] = set()
            while True:
                now = time.monotonic()
                if now - t0 >= seconds:
                    break
                try:
                    jobs = agent.get("/jobs")
                except Exception:  # noqa: BLE001 - a slow answer: count the interval at the last reading
                    jobs = None
                if jobs is not None:
                    held = {g for j in jobs["running"] for g in j["gpus"]}
                    rate_limited = jobs.get("spawns_rate_limited", 0)
                    refused |= {r["job_id"] for r in jobs.get("refused", [])}
                    if full_at is None and len(held) >= 8:
                        full_at = now - t0
                    if slots_full_at is None and len(jobs["running"]) >= slots:
                        slots_full_at = now - t0
                    dt = now - last
                    held_s += dt * len(held)
                    avail_s += dt * 8
                    slot_s += dt * min(slots, len(jobs["running"]))
                last = now
                time.sleep(0.25)
            hist = agent.get("/jobs")["history"]
        finally:
            agent.stop()
    return {"seconds": seconds, "fixed_rate": fixed_rate, "gpus_per_job": gpus_per_job,
            "every_gpu_busy_after_s": full_at, "busy_share": held_s / avail_s if avail_s else 0.0,
            "every_slot_busy_after_s": slots_full_at, "slot_share": slot_s / (avail_s / 8 * slots) if avail_s else 0.0,
            "spawns_rate_limited": rate_limited, "refused": len(refused), "history_rows": len(hist)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--fixed-rate", type=float, default=None, help="guard.max_spawns_per_minute (default: scaled)")
    ap.add_argument("--gpus-per-job", type=float, default=1.0,
                    help="GPUs per job (0.5: two jobs share a GPU, 16 job slots; default 1)")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    r = run(ns.seconds, ns.fixed_rate, ns.gpus_per_job)
    if ns.json:
        print(json.dumps(r, indent=2))
        return 0
    rule = f"fixed {ns.fixed_rate:g}/min" if ns.fixed_rate is not None else "scaled per GPU and CPU (default)"
    full = f"{r['every_gpu_busy_after_s']:.1f} s" if r["every_gpu_busy_after_s"] is not None else "never"
    slots = f"{r['every_slot_busy_after_s']:.1f} s" if r["every_slot_busy_after_s"] is not None else "never"
    print(f"8xA100, cpus=64, {ns.gpus_per_job:g} GPU per job, spawn rate {rule}: every GPU busy after {full}, "
          f"every job slot after {slots}; GPU-seconds holding a job {r['busy_share']:.1%}, slot-seconds filled "
          f"{r['slot_share']:.1%} over {ns.seconds:g} s; starts held by the rate limit {r['spawns_rate_limited']}; "
          f"assignments refused {r['refused']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
