"""Five agents in five namespaces running the demo catalog; every link cut so no side has a voter majority:
nodes keep running autonomous work only, and no training starts. Built and removed by the test itself."""

import sqlite3
import time

import httpx
import pytest
from agents import AgentProc, wait_until
from netns import NetnsLab, require_netns
from test_jobs_cluster import DEMO, ENV, PROFILES

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def runs(tmp_path, i):
    db = tmp_path / f"n{i}" / "jobs.db"
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM runs")]
    finally:
        con.close()


def leader_inside(lab, i):
    out = lab.sh(lab.names[i], "python3", "-c",
                 "import json,urllib.request as u;"
                 f"d=json.load(u.urlopen('http://{lab.addrs[i]}:8770/status',timeout=3));"
                 "print(d['election']['leader'])")
    return out.stdout.strip()


def test_no_majority_means_autonomous_work_only(tmp_path):
    require_netns()
    lab = NetnsLab(5, net=2, host_link=True)
    procs = []
    try:
        for i, gpu in enumerate(PROFILES):
            args = ["--fake-gpus", gpu, "--catalog", str(DEMO)]
            if i:
                args += ["--join", f"{lab.addrs[0]}:8770"]
            procs.append(AgentProc(tmp_path / f"n{i}", 8770, *args, bind=lab.addrs[i], prefix=lab.prefix_for(i),
                                   env=ENV).start())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if all(httpx.get(f"http://{a}:8770/status", timeout=1, trust_env=False)
                       .json()["snapshot"]["jobs"]["running"] for a in lab.addrs):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise AssertionError("jobs did not start on every node")
        for i in range(5):
            lab.link(i, up=False)
        cut = time.time()

        def autonomous_work_started():  # detection, then a selfplay lifetime (20 s), without a majority
            after = [r for i in range(5) for r in runs(tmp_path, i) if r["started_at"] > cut + 3]
            return after if after and all(leader_inside(lab, i) == "None" for i in range(5)) else None

        after = wait_until(autonomous_work_started, 60, interval=1, what="work started during the partition")
        templates = {r["template"] for r in after}
        assert all(t.startswith("selfplay-") for t in templates), templates  # the autonomous templates
        assert not [r for r in after if r["kind"] == "training"]
        for i in range(5):
            lab.link(i, up=True)
    finally:
        for p in procs:
            p.kill()
        lab.close()
