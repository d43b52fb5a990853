"""Operator control end to end (issue 16): `p2pnode jobs run|stop|logs` and `p2pnode node cordon|uncordon|drain`
against three real agents on loopback; intents survive a kill -9 of the node concerned and of the leader."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from agents import AgentProc, free_port, wait_until

pytestmark = pytest.mark.slow

ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_SCHEDULER_ADOPT_GRACE_S": "4", "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100",
       "P2PNODE_MAX_SPAWNS_PER_MINUTE": "600", "P2PNODE_GUARD_DWELL_S": "3", "P2PNODE_GUARD_CHECK_INTERVAL": "1"}
CATALOG = """
[[job]]
name = "work"
kind = "selfplay"
config = "c"
max_concurrency = 6
argv = ["sleep", "600"]
[job.resources]
num_gpus = 0.5
vram_gib = 2
num_cpus = 0.1

[[job]]
name = "keep"
kind = "evaluation"
config = "c"
preemptible = false
max_concurrency = 0
argv = ["sleep", "600"]
[job.resources]
num_cpus = 0.1

[[job]]
name = "once"
kind = "evaluation"
config = "c"
max_concurrency = 0
argv = ["{python}", "-c", "import sys, time; print('hello', sys.argv[1], flush=True); time.sleep(3); print('bye')",
        "{word}"]
[job.params.word]
type = "str"
default = "world"
[job.resources]
num_cpus = 0.1
"""


def cli(url, *args, timeout=30):
    return subprocess.run([sys.executable, "-m", "p2pnode", *args, "--url", url], capture_output=True, text=True,
                          timeout=timeout)


def running(p):
    return {j["job_id"]: j for j in p.get("/jobs")["running"]}


def history(p):
    return {r["job_id"]: r for r in p.get("/jobs")["history"]}


def wait_plans(p, n, timeout=30):
    """Until the leader ``p`` knows of has published ``n`` plans after now (a new term: ``n`` after the first of it
    ``p`` sees), each a chance to place work anywhere: what an absence of new work is checked against, not a
    fixed sleep."""
    first: dict[int, int] = {}

    def made():
        ref = p.get("/plan", timeout=10).get("ref")
        if not ref:
            return False
        first.setdefault(ref["term"], ref["seq"])
        return ref["seq"] >= first[ref["term"]] + n

    wait_until(made, timeout, what=f"{n} more plans of the leader")


def kill_jobs_of(data_dirs):
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cwd = os.readlink(d / "cwd")
        except OSError:
            continue
        if any(cwd.startswith(str(x)) for x in data_dirs):
            try:
                os.kill(int(d.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_run_stop_logs_cordon_drain_and_intents_survive_kill_9(tmp_path):
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    ports = [free_port() for _ in range(3)]
    gpus = ["H100", "A100", "2xRTX 4090"]

    def agent(i):
        args = ["--no-mdns", "--fake-gpus", gpus[i], "--catalog", str(cat), "--tag", f"n{i}"]
        if i:
            args += ["--join", f"127.0.0.1:{ports[0]}"]
        return AgentProc(tmp_path / f"n{i}", ports[i], *args, env=ENV).start()

    procs = [agent(i) for i in range(3)]
    try:
        for p in procs:
            p.wait_ready()
        ids = [p.status()["node"]["id"] for p in procs]
        a, b, c = procs
        # Work on b and c, which the test stops and cordons (the six half-GPU jobs fit on b and c alone: a node
        # whose first samples were busy may get none, rightly)
        wait_until(lambda: running(b) and running(c), 40, what="work on b and c")

        # jobs run: pinned to c, through the leader's plan; its log from any node, followed to the end
        out = cli(a.url, "jobs", "run", "once", "--node", ids[2][:6], "--param", "word=operator")
        assert out.returncode == 0, out.stderr
        job_id = __import__("json").loads(out.stdout)["job_id"]
        assert f"{job_id} started on {ids[2]}" in out.stderr, out.stderr  # the CLI followed it until it started
        wait_until(lambda: job_id in running(c) or job_id in history(c), 20, what=f"{job_id} on the pinned node")
        wait_until(lambda: "hello operator" in cli(b.url, "jobs", "logs", job_id).stdout, 10, what="the log")
        follow = subprocess.Popen([sys.executable, "-m", "p2pnode", "jobs", "logs", job_id, "--follow", "--url",
                                   b.url], stdout=subprocess.PIPE, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(follow.stdout.readline, "")), daemon=True)
        reader.start()
        wait_until(lambda: history(c).get(job_id, {}).get("ended_at"), 20, what=f"{job_id} ends")
        # followed to the end: the last line arrives through --follow (a busy machine may take seconds to start
        # the CLI), then Ctrl-C ends the follow
        wait_until(lambda: "bye" in "".join(lines), 30, what="the followed log's last line")
        follow.send_signal(signal.SIGINT)
        follow.wait(timeout=10)
        reader.join(timeout=10)
        followed = "".join(lines)
        assert "hello operator" in followed and "bye" in followed, followed
        assert not any(p.status()["node"]["operator"]["runs"] for p in procs)  # the request is done with

        # jobs stop: from a's CLI, on whichever node runs it
        victim = next(iter(running(b)))
        out = cli(a.url, "jobs", "stop", victim)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: "stopped by the operator" in (history(b).get(victim, {}).get("reason") or ""), 15,
                   what="the stop reason in b's history")

        # cordon b: what runs goes on, nothing new starts there; survives kill -9 of b and of the leader
        assert cli(a.url, "node", "cordon", ids[1][:6]).returncode == 0
        before = set(running(b))
        wait_plans(a, 3)
        assert set(running(b)) <= before
        leader = a.status()["election"]["leader"]
        # no node carries the tag: the CLI says it can never be placed (exit 1); the request stays, pending
        pending_req = cli(c.url, "jobs", "run", "once", "--tag", "nowhere")
        assert pending_req.returncode == 1, pending_req.stderr
        assert "cannot be placed: unsatisfiable" in pending_req.stderr and "it stays requested" in pending_req.stderr
        b_pids = [j["pid"] for j in running(b).values()]
        b.stop(signal.SIGKILL)
        for pid in b_pids:
            os.kill(pid, signal.SIGKILL)
        procs[1] = b = agent(1)
        b.wait_ready()
        li = ids.index(leader)
        if li != 1:
            procs[li].stop(signal.SIGKILL)
            procs[li] = agent(li)
            procs[li].wait_ready()
        c.stop(signal.SIGKILL)  # the node that keeps the pending run
        procs[2] = c = agent(2)
        c.wait_ready()
        assert b.status()["node"]["operator"]["cordoned"] is True
        wait_until(lambda: "cordoned" in cli(a.url, "status").stdout, 10, what="p2pnode status shows the cordon")
        assert [r["tag"] for r in c.status()["node"]["operator"]["runs"]] == ["nowhere"]
        wait_until(lambda: all(p.status()["election"]["leader"] for p in procs), 30, what="a leader again")
        wait_plans(a, 3)
        assert not running(b), "a cordoned node took new work after the restarts"

        def run_pending():
            return any("(run " in x["template"] for p in procs for x in p.get("/jobs")["pending"])

        wait_until(run_pending, 20, what="the one-off run pending (no node tagged 'nowhere')")

        # drain c at once: its preemptible work stops; then it takes nothing until uncordoned
        wait_until(lambda: running(c), 30, what="work on c again")
        assert cli(a.url, "node", "drain", ids[2][:6], "--deadline", "0s").returncode == 0
        wait_until(lambda: not running(c), 20, what="c drained")
        assert all("drained" in (r["reason"] or "") for r in history(c).values()
                   if r["template"] == "work" and r["ended_at"] and r["started_at"] > time.time() - 25)
        c.stop(signal.SIGKILL)  # the drain survives a kill -9 of the drained node
        procs[2] = c = agent(2)
        c.wait_ready()
        st = c.status()["node"]["operator"]
        assert st["cordoned"] and st["draining"]
        wait_plans(a, 3)
        assert not running(c)
        assert cli(a.url, "node", "uncordon", ids[2][:6]).returncode == 0
        wait_until(lambda: running(c), 30, what="c takes work again")
        members = {m["id"]: m for m in a.get("/members")["members"]}
        assert members[ids[1]]["cordoned"] and not members[ids[2]]["cordoned"]
    finally:
        for p in procs:
            p.kill()
        kill_jobs_of([p.data_dir for p in procs])
