"""Issue 39, item 5: ``p2pnode jobs run T --wait`` on three real agents (loopback) learns how its run ended, from
the node that requested it (``GET /jobs/runs?id=<id>``): it exits 0 for a job that exits 0, 3 for one that exits 3,
125 with the leader's reason for one that cannot be placed within ``--wait-timeout`` (the run still waits), 125
with "stopped by the operator" when ``jobs stop run-<id>`` cancels a waiting run, and 125 with "node lost" when the
node running it is killed with SIGKILL. The runs are requested through ``a`` and pinned by tag to ``b`` or ``c``
(a request pinned with ``--node`` is kept by that node, which here must not be the one that dies).
Waits are on conditions, each with a deadline."""

import json
import subprocess
import sys

import pytest
from agents import AgentProc, free_port, wait_until
from test_operator import kill_jobs_of

pytestmark = pytest.mark.slow

ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_SCHEDULER_ADOPT_GRACE_S": "4", "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100",
       "P2PNODE_MAX_SPAWNS_PER_MINUTE": "600"}
CATALOG = """
[[job]]
name = "rc"
kind = "evaluation"
config = "c"
max_concurrency = 0
argv = ["{python}", "-c", "import sys, time; time.sleep(float(sys.argv[2])); sys.exit(int(sys.argv[1]))",
        "{code}", "{seconds}"]
[job.params.code]
type = "int"
default = 0
[job.params.seconds]
type = "float"
default = 0.0
[job.resources]
num_cpus = 0.1
"""


def run_cmd(url, *args):
    return [sys.executable, "-m", "p2pnode", "jobs", "run", "rc", *args, "--url", url]


def cli(url, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "p2pnode", *args, "--url", url], capture_output=True, text=True,
                          timeout=timeout)


def outcome(p, run_id):
    return p.get(f"/jobs/runs?id={run_id}")


def test_jobs_run_wait_exits_with_the_outcome(tmp_path):
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    ports = [free_port() for _ in range(3)]
    gpus = ["H100", "A100", "A100"]

    def agent(i):
        args = ["--no-mdns", "--fake-gpus", gpus[i], "--catalog", str(cat), "--tag", f"n{i}"]
        if i:
            args += ["--join", f"127.0.0.1:{ports[0]}"]
        return AgentProc(tmp_path / f"n{i}", ports[i], *args, env=ENV).start()

    procs = [agent(i) for i in range(3)]
    waiters: list[subprocess.Popen] = []
    try:
        for p in procs:
            p.wait_ready()
        a, b, c = procs
        wait_until(lambda: all(len(p.status()["members"]) == 3 and p.status()["election"]["leader"] for p in procs),
                   40, what="three members and a leader")
        # A run that is cancelled while it waits, and one whose node dies: their waits run beside the rest
        cancelled = subprocess.Popen(run_cmd(a.url, "--tag", "nowhere", "--wait"), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        doomed = subprocess.Popen(run_cmd(a.url, "--tag", "n2", "--param", "seconds=600", "--wait", "--json"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        waiters += [cancelled, doomed]

        # jobs stop run-<id> cancels a waiting run: its --wait ends with that reason; kill -9 of the node running a
        # waited-for run: "node lost". Both become final only after the UNSEEN_GRACE_S grace (30 s, fixed): the two
        # graces run side by side, and beside the runs below. c is killed once the three agents agree on a leader
        # other than c (a, the strongest, takes the lead), so that the runs below need no new election
        cancel_id = json.loads(cancelled.stdout.readline())["job_id"]
        doomed_id = wait_until(lambda: _running_run(a, c), 30, what="the long run on c")
        wait_until(lambda: outcome(a, doomed_id)["state"] == "running", 30, what="the long run running on c")
        cid = c.status()["node"]["id"]
        wait_until(lambda: (ls := {p.status()["election"]["leader"] for p in procs}) and len(ls) == 1 and
                   None not in ls and cid not in ls, 40, what="one leader, other than c, named by all three")
        assert cli(a.url, "jobs", "stop", cancel_id).returncode == 0
        c.kill()
        kill_jobs_of([c.data_dir])

        # exit 0 -> 0, exit 3 -> 3 (both run on b)
        ok = subprocess.run(run_cmd(a.url, "--tag", "n1", "--wait", "--wait-timeout", "40"), capture_output=True,
                            text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
        ok_id = json.loads(ok.stdout.splitlines()[0])["id"]
        assert outcome(a, ok_id)["state"] == "exited" and outcome(a, ok_id)["exit_code"] == 0
        three = subprocess.run(run_cmd(a.url, "--tag", "n1", "--param", "code=3", "--wait", "--wait-timeout", "40"),
                               capture_output=True, text=True, timeout=60)
        assert three.returncode == 3, three.stderr
        assert "exited with status 3 on " + b.status()["node"]["id"] in three.stderr

        # cannot be placed: 125 with the leader's reason after --wait-timeout; the run still waits
        never = subprocess.run(run_cmd(a.url, "--tag", "nowhere-else", "--wait", "--wait-timeout", "4"),
                               capture_output=True, text=True, timeout=60)
        assert never.returncode == 125, never.stderr
        never_id = json.loads(never.stdout.splitlines()[0])["job_id"]
        assert f"{never_id} could not be placed within 4 s: " in never.stderr and "it still waits" in never.stderr
        assert outcome(a, never_id).get("state") == "waiting", outcome(a, never_id)
        assert outcome(a, "nosuch-1").get("error") == "unknown_run"
        assert outcome(a, "bad%20id").get("error") == "malformed"

        # the two waits started above end as they should
        assert cancelled.wait(timeout=30 + 45) == 125  # (withdrawn: final after the UNSEEN_GRACE_S grace)
        assert "stopped by the operator (rule operator)" in cancelled.stderr.read()
        assert not any(r["id"] == cancel_id.removeprefix("run-") for r in a.status()["node"]["operator"]["runs"])
        assert doomed.wait(timeout=45 + 30) == 125  # (death: lost after the UNSEEN_GRACE_S grace)
        record = json.loads(doomed.stdout.read())
        assert record["state"] == "lost" and record["reason"].startswith("node lost: "), record
        assert "node lost" in doomed.stderr.read()
    finally:
        for w in waiters:
            if w.poll() is None:
                w.kill()
        for p in procs:
            p.kill()
        kill_jobs_of([p.data_dir for p in procs])


def _running_run(a, c):
    """The id of the run the cluster sees running on ``c`` (requested through ``a``)."""
    cid = c.status()["node"]["id"]
    return next((j["job_id"].removeprefix("run-") for j in a.get("/jobs").get("cluster_running", [])
                 if j["job_id"].startswith("run-") and j["node_id"] == cid), None)
