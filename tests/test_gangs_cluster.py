"""Gangs on real agents (issue 26), with the ``process`` engine: a gang of 3 placed one member per node with the
gang's environment, a member killed with SIGKILL ends the gang on every member, and the gang is placed again.
(torchrun and Ray on real engines: tests/test_netns_gangs.py.)"""

import contextlib
import os
import signal
import time

import httpx
import pytest
from agents import AgentProc, free_port, wait_until

pytestmark = pytest.mark.slow

CATALOG = """[[job]]
name = "gang-echo"
kind = "selfplay"
config = "g1"
engine = "process"
argv = ["sh", "-c", "env | grep -E '^(P2PNODE_GANG_|MASTER_|NNODES|NODE_RANK|RANK|WORLD_SIZE)' | sort; exec sleep 300"]
max_concurrency = 1
[job.gang]
members = 3
[job.resources]
num_gpus = 0
num_cpus = 0.1
memory_gib = 0.1
"""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1", "P2PNODE_LOG_LEVEL": "info",
       "P2PNODE_SCHEDULER_GANG_PORTS": "31000-31191"}


def _members(agents):
    """Every gang member running anywhere, as (agent index, report)."""
    return [(i, j) for i, a in enumerate(agents) for j in a.get("/jobs")["running"] if j.get("gang")]


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def test_a_process_gang_runs_whole_and_ends_whole_when_a_member_is_killed(tmp_path):
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    ports = [free_port() for _ in range(3)]
    agents = []
    for i, port in enumerate(ports):
        args = ["--no-mdns", "--catalog", str(catalog)] + (["--join", f"127.0.0.1:{ports[0]}"] if i else [])
        agents.append(AgentProc(tmp_path / f"n{i}", port, *args, env=ENV).start())
    try:
        for a in agents:
            a.wait_ready()

        def whole():
            ms = _members(agents)
            ids = {j["gang"]["id"] for _, j in ms}
            return len(ms) == 3 and len(ids) == 1 and ms

        ms = wait_until(whole, 60, interval=0.5, what="a gang of 3 running")
        assert sorted(j["gang"]["rank"] for _, j in ms) == [0, 1, 2]
        assert len({i for i, _ in ms}) == 3  # strict_spread: one member per node
        gid = ms[0][1]["gang"]["id"]
        rank0 = next(j for _, j in ms if j["gang"]["rank"] == 0)
        assert gid == rank0["job_id"] and all(j["gang"]["master_port"] == rank0["gang"]["port_base"] for _, j in ms)
        assert all(31000 <= j["gang"]["port_base"] < 31192 for _, j in ms)
        view = wait_until(lambda: [g for g in agents[0].get("/jobs")["gangs"] if g["id"] == gid and g["whole"]], 20,
                          what="the gang whole in /jobs gangs")[0]
        assert view["engine"] == "process" and view["size"] == 3 and [m["rank"] for m in view["members"]] == [0, 1, 2]
        assert view["rendezvous"] == f"127.0.0.1:{rank0['gang']['master_port']}"

        def logged(i, job_id):
            r = httpx.get(f"{agents[i].url}/jobs/logs", params={"job_id": job_id, "offset": 0}, timeout=5,
                          trust_env=False)
            return r.status_code == 200 and "P2PNODE_GANG_SIZE=3" in r.text and r.text

        for i, j in ms:
            text = wait_until(lambda i=i, j=j: logged(i, j["job_id"]), 20, what="the member's environment logged")
            r = j["gang"]["rank"]
            for line in (f"P2PNODE_GANG_ID={gid}", f"P2PNODE_GANG_RANK={r}", f"NODE_RANK={r}", f"RANK={r}",
                         "WORLD_SIZE=3", "NNODES=3", "MASTER_ADDR=127.0.0.1",
                         f"MASTER_PORT={rank0['gang']['master_port']}"):
                assert line in text, (line, text)

        import subprocess
        import sys

        out = subprocess.run([sys.executable, "-m", "p2pnode", "jobs", "logs", gid, "--rank", "2", "--url",
                              agents[0].url], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "P2PNODE_GANG_RANK=2" in out.stdout, out.stdout + out.stderr
        shown = subprocess.run([sys.executable, "-m", "p2pnode", "jobs", "--url", agents[0].url], capture_output=True,
                               text=True, timeout=30, env={**__import__("os").environ, "COLUMNS": "200"}).stdout
        assert f"{gid} rank 0/3 process" in shown and f"{gid} rank 2/3" in shown, shown

        # SIGKILL of rank 1's process: the gang ends on every member, then a new gang is placed.
        i1, j1 = next((i, j) for i, j in ms if j["gang"]["rank"] == 1)
        victims = _children(j1["pid"])
        assert victims, "the member's process under its wrapper"
        t0 = time.monotonic()
        os.kill(victims[0], signal.SIGKILL)
        wait_until(lambda: not any(j["gang"]["id"] == gid for _, j in _members(agents)), 30, interval=0.25,
                   what="the old gang gone from every member")
        ended_in = time.monotonic() - t0
        again = wait_until(whole, 60, interval=0.5, what="the gang placed again")
        assert {j["gang"]["id"] for _, j in again} != {gid}
        history = [h for a in agents for h in a.get("/jobs")["history"] if h.get("job_id") in
                   {j["job_id"] for _, j in ms}]
        reasons = " | ".join(str(h.get("reason")) for h in history)
        assert f"gang {gid} ended: member rank 1" in reasons, reasons
        ended_by = sorted((h.get("rule") or "", h.get("outcome")) for h in history if h.get("ended_at"))
        assert ended_by == [("", "failed"), ("gang_ended", "stopped"), ("gang_ended", "stopped")], history
        ends = [a.get("/jobs")["gang_ends"] for a in agents]
        assert sum(e.get("member_gone", 0) for e in ends) == 1, ends  # counted once, by the leader
        metrics = "".join(httpx.get(f"{a.url}/metrics", timeout=5, trust_env=False).text for a in agents)
        assert 'p2pnode_gangs_ended_total{cause="member_gone"} 1.0' in metrics
        print(f"[gang] SIGKILL of rank 1 -> the gang ended on every member in {ended_in:.1f} s")
    finally:
        for a in agents:
            a.stop()


FAILOVER_CATALOG = """[[job]]
name = "gang-hold"
kind = "selfplay"
config = "g2"
engine = "process"
argv = ["sleep", "300"]
max_concurrency = 1
[job.gang]
members = 3
[job.placement]
affinity = [{ tag = "gangbox", hard = true }]
[job.resources]
num_gpus = 0
num_cpus = 0.1
memory_gib = 0.1
"""


def test_a_leader_failover_carries_a_running_gang_over(tmp_path):
    """The leader (the H200, no member of the gang: only nodes tagged gangbox take one) is killed with SIGKILL: a
    new leader is elected among the members' nodes, its plans carry the gang over, and no member is stopped."""
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(FAILOVER_CATALOG)
    ports = [free_port() for _ in range(4)]
    agents = []
    wrappers: list[int] = []
    for i, port in enumerate(ports):
        args = ["--no-mdns", "--catalog", str(catalog)] + (["--join", f"127.0.0.1:{ports[0]}"] if i else [])
        args += ["--fake-gpus", "H200"] if i == 0 else ["--tag", "gangbox"]
        env = dict(ENV, P2PNODE_SCHEDULER_ON_AGENT_STOP="leave") if i == 3 else ENV  # n3: upgraded in place below
        agents.append(AgentProc(tmp_path / f"n{i}", port, *args, env=env).start())
    try:
        for a in agents:
            a.wait_ready()
        members = agents[1:]

        def whole():
            ms = _members(members)
            return len(ms) == 3 and len({j["gang"]["id"] for _, j in ms}) == 1 and ms

        ms = wait_until(whole, 60, interval=0.5, what="a gang of 3 on the gangbox nodes")
        gid, jobs = ms[0][1]["gang"]["id"], {j["job_id"] for _, j in ms}
        lead = agents[0].status()
        assert lead["election"]["leader"] == lead["node"]["id"]  # the H200 leads, and holds no member
        term = lead["election"]["term"]
        agents[0].kill()

        def new_plan():
            plans = [a.get("/jobs") for a in members]
            return all((p.get("term") or 0) > term and p.get("leader") for p in plans) and plans

        wait_until(new_plan, 60, interval=0.5, what="a new leader of a higher term")

        def held_through_plans(n: int) -> None:
            """The gang stays whole, the same members, while the leader makes ``n`` more plans."""
            def ref():
                r = members[0].get("/plan").get("ref") or {}
                return (r.get("term") or 0, r.get("seq") or 0)

            start = ref()

            def check():
                ms = whole()
                assert ms and {j["job_id"] for _, j in ms} == jobs and ms[0][1]["gang"]["id"] == gid, ms
                now = ref()
                return now[0] > start[0] or now[1] >= start[1] + n

            wait_until(check, 60, interval=0.5, what=f"{n} more plans with the gang whole")

        held_through_plans(3)
        ended = [h for a in members for h in a.get("/jobs")["history"] if h["job_id"] in jobs and h.get("ended_at")]
        assert not ended, ended

        # n3's agent is upgraded in place (on_agent_stop = "leave": its member keeps running), then starts again
        # and re-adopts its member with its gang slot (kept in the job ledger): the gang holds throughout.
        mine = next(j for i, j in ms if members[i] is agents[3])
        wrappers.append(mine["pid"])
        agents[3].stop()
        agents[3] = AgentProc(tmp_path / "n3", ports[3], "--no-mdns", "--catalog", str(catalog), "--join",
                              f"127.0.0.1:{ports[1]}", "--tag", "gangbox", env=ENV).start()
        agents[3].wait_ready()
        members = agents[1:]
        back = wait_until(lambda: [j for j in agents[3].get("/jobs")["running"] if j["job_id"] == mine["job_id"]],
                          30, what="the member re-adopted")[0]
        assert back["gang"] == mine["gang"] and back["pid"] == mine["pid"]
        held_through_plans(3)
    finally:
        for a in agents:
            a.stop()
        for pid in wrappers:  # a member left running by the "leave" stop, if the test ended before it was re-adopted
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
