"""A node with many short jobs (issue 38 item 6): two agents on loopback, a GPU-less worker declaring 96 CPUs and
96 GiB (``--resource``) and a small leader (one CPU, one fake RTX 3060: it ranks first and leads), a catalog of
CPU-only sleep jobs of 1-3 s each (``num_gpus = 0``, one CPU, up to 96 at once). The worker runs far more than
:data:`p2pnode.snapshot.INLINE_RUNNING` jobs, so its snapshot names its running list by digest only and the
leader fetches ``GET /jobs/running?digest=`` each time the digest changes -- while jobs start and end several
times a second. Measures, polling every 0.5 s:

* jobs the worker finished (completed), and jobs a second over the run;
* the worker's running jobs: the mean and the most at once (the acceptance line: at least 64);
* the leader's fetches of the worker's running list: fetched, refused ``stale`` (the hazard: every fetch refused
  while the list changes faster than its digest spreads), other failures;
* the longest stretch the worker ran fewer than 32 jobs after its first 64 (starvation);
* how far the list the leader holds is from what the worker runs: the mean of |jobs the leader's ``GET /jobs``
  shows on the worker - jobs the worker runs| per sample, and the share of samples within 8 jobs.

    python bench/many_jobs.py                    # 5 minutes
    python bench/many_jobs.py --seconds 60 --json
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

CATALOG = """
[[job]]
name = "short-{i}"
kind = "selfplay"
config = "c{i}"
argv = ["sh", "-c", "exec sleep $((1 + $$ % 3))"]
max_concurrency = 48
[job.resources]
num_gpus = 0
num_cpus = 1
memory_gib = 0.5
"""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_MAX_SPAWNS_PER_MINUTE": "6000", "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}


def start_pair(root: Path) -> tuple[AgentProc, AgentProc]:
    """The leader and the worker, both answering, the worker seen by the leader."""
    catalog = root / "catalog.toml"
    catalog.write_text("".join(CATALOG.replace("{i}", str(i)) for i in range(2)))
    ports = [free_port(), free_port()]
    leader = AgentProc(root / "leader", ports[0], "--no-mdns", "--fake-gpus", "RTX 3060", "--resource", "cpus=1",
                       "--resource", "memory_gib=1", "--catalog", str(catalog), env=ENV).start()
    worker = AgentProc(root / "worker", ports[1], "--no-mdns", "--resource", "cpus=96", "--resource",
                       "memory_gib=96", "--join", f"127.0.0.1:{ports[0]}", "--catalog", str(catalog),
                       env=ENV).start()
    return leader, worker


def running_fetches(leader: AgentProc) -> dict:
    """The leader's fetches of running lists: ``fetched`` and ``failed`` by reason."""
    f = leader.get("/jobs", timeout=10)["fetches"]
    return f.get("by_kind", {}).get("running", {"fetched": 0, "failed": f.get("failed", {})})


def measure(leader: AgentProc, worker: AgentProc, seconds: float, until_done: int = 0) -> dict:
    """Poll both agents for ``seconds`` (or until the worker finished ``until_done`` jobs, when > 0)."""
    wid = worker.wait_ready()["node"]["id"]
    leader.wait_ready()
    wait_until(lambda: leader.status()["election"]["leader"] == leader.status()["node"]["id"]
               and worker.status()["election"]["leader"] is not None, 60, what="the small node leading")
    t0 = time.monotonic()
    counts: list[int] = []
    starved_s = longest_starved = 0.0
    reached = False
    last = t0
    done = 0
    gaps: list[int] = []
    while time.monotonic() - t0 < seconds:
        n = len(worker.get("/jobs", timeout=10)["running"])
        held = sum(1 for r in leader.get("/jobs", timeout=10)["cluster_running"] if r["node_id"] == wid)
        gaps.append(abs(held - n))
        done = _finished(worker)
        now = time.monotonic()
        counts.append(n)
        reached = reached or n >= 64
        if reached and n < 32:
            starved_s += now - last
            longest_starved = max(longest_starved, starved_s)
        else:
            starved_s = 0.0
        last = now
        if until_done and done >= until_done:
            break
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    f = running_fetches(leader)
    return {"worker": wid, "seconds": round(elapsed, 1), "finished": done, "jobs_per_s": round(done / elapsed, 2),
            "running_mean": round(sum(counts) / max(1, len(counts)), 1), "running_max": max(counts, default=0),
            "fetched": f.get("fetched", 0), "failed": f.get("failed", {}),
            "held_gap_mean": round(sum(gaps) / max(1, len(gaps)), 1),
            "held_within_8": round(sum(1 for g in gaps if g <= 8) / max(1, len(gaps)), 2),
            "longest_under_32_s": round(longest_starved, 1)}


def _finished(worker: AgentProc) -> int:
    """Jobs the worker finished, from its Prometheus counter."""
    import httpx

    text = httpx.get(worker.url + "/metrics", timeout=10, trust_env=False).text
    for line in text.splitlines():
        if line.startswith("p2pnode_jobs_finished"):
            return int(float(line.split()[-1]))
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="how long to measure (default 5 minutes)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="p2pnode-many-") as tmp:
        leader, worker = start_pair(Path(tmp))
        try:
            r = measure(leader, worker, args.seconds)
        finally:
            worker.kill()
            leader.kill()
    if args.json:
        print(json.dumps(r))
        return
    print(f"{r['seconds']} s: the worker finished {r['finished']} jobs ({r['jobs_per_s']}/s), ran {r['running_mean']} "
          f"at once on average, {r['running_max']} at most; the leader fetched its running list {r['fetched']} times, "
          f"failures {r['failed']}; the leader's list {r['held_gap_mean']} jobs off on average, within 8 jobs in "
          f"{r['held_within_8']:.0%} of samples; longest stretch under 32 jobs after the first 64: "
          f"{r['longest_under_32_s']} s")


if __name__ == "__main__":
    main()
