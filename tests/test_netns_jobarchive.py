"""What a vanished box knew survives it, across hosts (issue 41, acceptance line 5): three agents in network
namespaces, a durable node (the only voter) and two ephemeral ones. A one-off job pinned to the first ephemeral node
fails; once its log and history record are replicas on the durable node, that node is killed (SIGKILL of its agent,
its link cut: the box is gone). Then, asked of the other ephemeral node, ``p2pnode jobs logs ID`` shows the job's
log and ``p2pnode jobs history`` lists it. Built and removed by the test itself; every wait is on a condition."""

import json
import subprocess
import sys

import httpx
import pytest
from agents import AgentProc, wait_until
from netns import NetnsLab, require_netns
from test_jobarchive_agents import CATALOG

pytestmark = [pytest.mark.netns, pytest.mark.slow]

ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_SYNC_INTERVAL_S": "1", "P2PNODE_SYNC_SETTLE_S": "0.5", "P2PNODE_SYNC_DATA_PORT": "8771",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}


def cli(url, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "p2pnode", *args, "--url", url], capture_output=True, text=True,
                          timeout=timeout)


def get(addr, path):
    return httpx.get(f"http://{addr}:8770{path}", timeout=3, trust_env=False).json()


def test_a_failed_jobs_log_and_history_outlive_its_hosts_namespace(tmp_path):
    require_netns()
    lab = NetnsLab(3, net=4, host_link=True)
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    procs = []
    try:
        tags = [["durable", "voter"], ["ephemeral"], ["ephemeral"]]
        for i, ts in enumerate(tags):
            args = ["--no-mdns", "--catalog", str(cat), *[a for t in ts for a in ("--tag", t)]]
            args += ["--join", f"{lab.addrs[0]}:8770"] if i else []
            procs.append(AgentProc(tmp_path / f"n{i}", 8770, *args, bind=lab.addrs[i], prefix=lab.prefix_for(i),
                                   env=ENV).start())
        for p in procs:
            p.wait_ready()
        ids = [get(a, "/status")["node"]["id"] for a in lab.addrs]
        wait_until(lambda: get(lab.addrs[0], "/jobs")["leader"] == ids[0]
                   and len(get(lab.addrs[0], "/members")["members"]) == 3, 60, what="a leader and three members")

        d_url, e2_url = f"http://{lab.addrs[0]}:8770", f"http://{lab.addrs[2]}:8770"
        out = cli(d_url, "jobs", "run", "fail", "--node", ids[1][:8], "--param", "word=netns")
        assert out.returncode == 0, out.stderr
        job_id = json.loads(out.stdout)["job_id"]
        wait_until(lambda: any(r["job_id"] == job_id and r["exit_status"] == 3
                               for r in get(lab.addrs[1], "/jobs")["history"]), 60, what="the job failed on n1")
        wait_until(lambda: any(r["job_id"] == job_id for r in get(lab.addrs[0], "/jobs/history")["runs"])
                   and b"Traceback: boom" in httpx.get(f"{d_url}/jobs/logs", params={"job_id": job_id},
                                                       timeout=3, trust_env=False).content,
                   60, what="its log and record replicated on the durable node")

        procs[1].kill()  # the box is gone: its agent killed, its link cut
        lab.link(1, up=False)
        wait_until(lambda: any(m["id"] == ids[1] and m["state"] in ("suspect", "dead")
                               for m in get(lab.addrs[2], "/members")["members"]), 60, what="n1 gone for n2")

        logs = cli(e2_url, "jobs", "logs", job_id)
        assert logs.returncode == 0, logs.stderr
        assert "step 1 of netns" in logs.stdout and "Traceback: boom" in logs.stdout
        hist = cli(e2_url, "jobs", "history", "--json")
        assert hist.returncode == 0, hist.stderr
        assert [(r["node_id"], r["exit_status"], r["held_by"]) for r in json.loads(hist.stdout)
                if r["job_id"] == job_id] == [(ids[1], 3, ids[0])]
    finally:
        for p in procs:
            p.kill()
        lab.close()
