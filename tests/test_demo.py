"""`p2pnode demo`: within 30 s the first node shows 5 members, a leader and running jobs; Ctrl-C (SIGINT) leaves no
process (agents and jobs, by PID, also the jobs of an agent killed with SIGKILL) and no temporary directory."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from agents import wait_until

pytestmark = pytest.mark.slow


def _key(pid):
    try:
        return pid, psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(key):
    try:
        p = psutil.Process(key[0])
        return p.create_time() == key[1] and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill(keys):
    for key in keys:
        if _alive(key):
            os.kill(key[0], signal.SIGKILL)


def test_demo_cluster_within_30s_and_ctrl_c_leaves_nothing(tmp_path):
    out = tmp_path / "demo.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PNODE_")}
    t0 = time.monotonic()
    with open(out, "wb") as f:
        demo = subprocess.Popen([sys.executable, "-m", "p2pnode", "demo", "--base-port", "0"], stdout=f,
                                stderr=subprocess.STDOUT, env=env)
    seen: set = set()
    root = None
    try:
        def banner():
            text = out.read_text()
            assert demo.poll() is None, text
            return "Dashboard:" in text and text

        text = wait_until(banner, 30, interval=0.2, what="the demo's banner")
        root = Path(re.search(r"data and logs in (\S+)", text).group(1))
        url = re.search(r"Dashboard:\s+(http://127\.0\.0\.1:\d+)/", text).group(1)
        rows = re.findall(r"^\s+(n\d)\s+(.+?)\s+(durable|ephemeral|-)\s+(http://\S+)\s+(\d+)$", text, re.MULTILINE)
        assert [r[1] for r in rows] == ["H200", "H100", "A100", "RTX 4090", "RTX 3060"]
        assert [r[2] for r in rows] == ["durable", "durable", "-", "-", "ephemeral"]
        assert root.is_dir() and str(root).startswith(("/tmp", os.environ.get("TMPDIR", "/tmp")))

        def cluster():
            status = httpx.get(f"{url}/status", timeout=2, trust_env=False).json()
            jobs = httpx.get(f"{url}/jobs", timeout=2, trust_env=False).json()
            alive = [m for m in status["members"] if m["state"] == "alive"]
            running = sum(jobs["running_counts"].values())
            ok = len(alive) == 5 and status["election"]["leader"] and running > 0
            return ok and (status, jobs)

        status, jobs = wait_until(cluster, max(1.0, 30 - (time.monotonic() - t0)), interval=0.5,
                                  what="5 members, a leader and running jobs")
        ready_s = time.monotonic() - t0
        print(f"demo: 5 members, leader, {sum(jobs['running_counts'].values())} jobs after {ready_s:.1f} s")
        assert ready_s < 30
        assert not (status["discovery"] or {}).get("mdns")  # nothing multicasts
        page = httpx.get(f"{url}/", timeout=5, trust_env=False)  # the dashboard the banner points at
        assert page.status_code == 200 and "<html" in page.text.lower()

        # kill -9 an agent (not the first) that runs jobs: its jobs lose their parent and must be found anyway.
        urls = [r[3] for r in rows]

        def victim_jobs():
            for i in range(1, 5):
                running = httpx.get(f"{urls[i]}/jobs", timeout=2, trust_env=False).json()["running"]
                if running:
                    return i, running
            return None

        vi, victim = wait_until(victim_jobs, 20, interval=0.5, what="a node other than n0 running jobs")
        orphans = {_key(j["pid"]) for j in victim} - {None}
        assert orphans
        seen |= orphans | {_key(int(r[4])) for r in rows} - {None}
        for p in psutil.Process(demo.pid).children(recursive=True):
            seen.add(_key(p.pid))
        seen.discard(None)
        # the jobs alive when the agent dies must outlive it (own sessions); checked as soon as it is gone, since
        # the demo's jobs are short and may end by themselves while a busy machine is slow to report the exit
        agent = _key(int(rows[vi][4]))
        before = {k for k in orphans if _alive(k)}
        os.kill(int(rows[vi][4]), signal.SIGKILL)
        wait_until(lambda: agent is None or not _alive(agent), 10, interval=0.05, what="the killed agent gone")
        assert before and any(_alive(k) for k in before), "the killed agent's jobs should outlive it (own sessions)"
        wait_until(lambda: f"n{vi} ({rows[vi][1]}, pid" in out.read_text(), 20, interval=0.2,
                   what="the demo reporting the exit")
        for u in urls[:vi] + urls[vi + 1:]:
            for j in httpx.get(f"{u}/jobs", timeout=2, trust_env=False).json()["running"]:
                seen.add(_key(j["pid"]))
        seen.discard(None)

        t1 = time.monotonic()
        demo.send_signal(signal.SIGINT)
        assert demo.wait(40) == 0, out.read_text()
        stop_s = time.monotonic() - t1
        print(f"demo: stopped in {stop_s:.1f} s; {len(seen)} processes watched")
        left = [k[0] for k in seen if _alive(k)]
        assert not left, f"processes left: {left}\n{out.read_text()}"
        assert not root.exists(), f"{root} left behind"
        assert "removed" in out.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        _kill(seen)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def test_demo_with_scaling_starts_an_extra_agent_and_ctrl_c_stops_it_too(tmp_path):
    """``p2pnode demo --scaling``: the leader's local provider starts an extra RTX 3060 agent for the waiting
    self-play work (it joins, started by the leader's action), and Ctrl-C stops it with the rest."""
    out = tmp_path / "demo.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PNODE_")}
    with open(out, "wb") as f:
        demo = subprocess.Popen([sys.executable, "-m", "p2pnode", "demo", "--scaling", "--nodes", "3",
                                 "--base-port", "0", "--gossip-profile", "local-test"], stdout=f,
                                stderr=subprocess.STDOUT, env=env)
    seen: set = set()
    root = None
    try:
        text = wait_until(lambda: demo.poll() is None and "Dashboard:" in out.read_text() and out.read_text(), 30,
                          interval=0.2, what="the demo's banner")
        root = Path(re.search(r"data and logs in (\S+)", text).group(1))
        url = re.search(r"Dashboard:\s+(http://127\.0\.0\.1:\d+)/", text).group(1)
        assert "1x3060 agents start for waiting work" in text

        def extra():
            status = httpx.get(f"{url}/status", timeout=2, trust_env=False).json()
            ups = [a for a in status["scaling"]["ledger"] if a["op"] == "up" and a["state"] == "done"]
            alive = [m for m in status["members"] if m["state"] == "alive"]
            return ups and len(alive) >= 4 and (ups, status)  # 3 demo agents and an extra one

        ups, status = wait_until(extra, 90, interval=1.0, what="a scale-up done and the extra agent alive")
        assert ups[0]["node_class"] == "1x3060"
        assert status["election"]["voters"] == 3  # the extra agent is no voter
        pids = [int(json.loads(f.read_text())["pid"]) for f in (root / "scaling-local").glob("*.json")]
        assert pids
        seen |= {_key(p) for p in pids} - {None}
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 0, out.read_text()
        left = [k[0] for k in seen if _alive(k)]
        assert not left, f"extra agents left: {left}\n{out.read_text()}"
        assert not root.exists()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        _kill(seen)
        if root is not None and root.exists():
            for f in (root / "scaling-local").glob("*.json"):
                with contextlib.suppress(Exception):
                    os.killpg(int(json.loads(f.read_text())["pid"]), signal.SIGKILL)
            shutil.rmtree(root, ignore_errors=True)
