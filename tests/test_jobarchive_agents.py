"""What a vanished box knew survives it (issue 41, item 5; acceptance line 5 on loopback): a durable node (the only
voter: the leader) and an ephemeral one. A one-off job pinned to the ephemeral node fails; its log tail and history
record reach the durable node as replicas of the ephemeral node's job archive; kill -9 of the ephemeral agent; then
``p2pnode jobs logs ID`` and ``p2pnode jobs history`` against the durable node show that job, run by the vanished
node. Every wait is on a condition, with a deadline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from agents import AgentProc, free_port, wait_until

pytestmark = pytest.mark.slow

CATALOG = """
[[job]]
name = "fail"
kind = "evaluation"
config = "c"
max_concurrency = 0
argv = ["{python}", "-c",
    "import sys; print('step 1 of', sys.argv[1], flush=True); print('Traceback: boom', file=sys.stderr); sys.exit(3)",
    "{word}"]
[job.params.word]
type = "str"
default = "world"
[job.resources]
num_cpus = 0.1
"""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_SYNC_INTERVAL_S": "1", "P2PNODE_SYNC_SETTLE_S": "0.5",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}


def cli(url, *args, timeout=30):
    return subprocess.run([sys.executable, "-m", "p2pnode", *args, "--url", url], capture_output=True, text=True,
                          timeout=timeout)


def test_a_failed_jobs_log_and_history_outlive_its_ephemeral_node(tmp_path):
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    env = {**os.environ, **ENV}
    d = AgentProc(tmp_path / "durable", free_port(), "--no-mdns", "--catalog", str(cat), "--tag", "durable",
                  "--tag", "voter", env=env).start()
    procs = [d]
    try:
        d.wait_ready()
        e = AgentProc(tmp_path / "eph", free_port(), "--no-mdns", "--catalog", str(cat), "--tag", "ephemeral",
                      "--join", f"127.0.0.1:{d.port}", env=env).start()
        procs.append(e)
        e.wait_ready()
        eid, did = e.status()["node"]["id"], d.status()["node"]["id"]
        wait_until(lambda: d.get("/jobs")["leader"] == did and len(d.get("/members")["members"]) == 2, 60,
                   what="the durable node leading a cluster of two")

        out = cli(d.url, "jobs", "run", "fail", "--node", eid[:8], "--param", "word=archive")
        assert out.returncode == 0, (out.stdout, out.stderr)
        job_id = json.loads(out.stdout)["job_id"]
        wait_until(lambda: any(r["job_id"] == job_id and r["exit_status"] == 3 for r in e.get("/jobs")["history"]),
                   60, what="the run failed on the ephemeral node")

        def replicated():
            h = d.get("/jobs/history?n=50")
            runs = [r for r in h["runs"] if r["job_id"] == job_id]
            log = httpx.get(f"{d.url}/jobs/logs", params={"job_id": job_id, "offset": 0}, timeout=5,
                            trust_env=False)
            return runs and log.status_code == 200 and b"Traceback: boom" in log.content and (runs[0], log)

        run, log = wait_until(replicated, 60, interval=0.5, what="the job's log and record on the durable node")
        assert (run["node_id"], run["source"], run["exit_status"], run["outcome"]) == (eid, "replica", 3, "failed")
        assert log.headers["x-log-node"] == eid and b"step 1 of archive" in log.content
        mine = e.get("/jobs/history")
        assert mine["archive"]["written"] >= 1 and mine["archive"]["errors"] == 0 and mine["runs"][0]["source"] == \
            "local"
        assert d.get("/jobs/history")["archive"] is None  # a durable node keeps no archive of its own

        e.kill()  # kill -9 of the ephemeral agent (its job ended already)
        procs.remove(e)
        wait_until(lambda: any(m["id"] == eid and m["state"] in ("suspect", "dead")
                               for m in d.get("/members")["members"]), 60, what="the ephemeral node gone")
        logs = cli(d.url, "jobs", "logs", job_id)
        assert logs.returncode == 0, logs.stderr
        assert "step 1 of archive" in logs.stdout and "Traceback: boom" in logs.stdout
        hist = cli(d.url, "jobs", "history", "--json")
        assert hist.returncode == 0, hist.stderr
        mine = [r for r in json.loads(hist.stdout) if r["job_id"] == job_id]
        assert [(r["node_id"], r["exit_status"], r["source"], r["held_by"]) for r in mine] == [
            (eid, 3, "replica", did)]
        table = cli(d.url, "jobs", "history")
        assert table.returncode == 0 and job_id in table.stdout and "replica on" in table.stdout, table.stdout
    finally:
        for p in procs:
            p.kill()
