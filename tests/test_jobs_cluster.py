"""Five agents on loopback with the demo catalog: jobs everywhere, training on tier 1, failover without
double starts, bad signals rejected, a bad catalog stops the agent."""

import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from agents import AgentProc, free_port, wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "deploy" / "examples" / "demo" / "catalog.toml"
PROFILES = ["H200", "H100", "A100", "RTX 4090", "RTX 3060"]
ENV = {
    "P2PNODE_GOSSIP_PROFILE": "local-test",
    "P2PNODE_SCHEDULER_INTERVAL_S": "2",
    "P2PNODE_SCHEDULER_ADOPT_GRACE_S": "6",
    "P2PNODE_GUARD_DWELL_S": "3",
    "P2PNODE_GUARD_CHECK_INTERVAL": "1",
}


@pytest.fixture
def five(tmp_path):
    ports = [free_port() for _ in PROFILES]
    procs = []
    for i, gpu in enumerate(PROFILES):
        args = ["--no-mdns", "--fake-gpus", gpu, "--catalog", str(DEMO)]
        if i:
            args += ["--join", f"127.0.0.1:{ports[0]}"]
        procs.append(AgentProc(tmp_path / f"n{i}", ports[i], *args, env=ENV).start())
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.kill()


def demo_with_short_selfplay(into: Path, seconds: float) -> Path:
    """A copy of the demo catalog (its scripts beside it) under ``into`` whose selfplay runs ``seconds`` by
    default instead of 20 s, the rest as it is; returns the catalog's path."""
    shutil.copytree(DEMO.parent, into, ignore=shutil.ignore_patterns("__pycache__"))
    blocks = (into / "catalog.toml").read_text().split("[[job]]")
    for i, b in enumerate(blocks):
        if 'kind = "selfplay"' in b:
            blocks[i], n = re.subn(r'(\[job\.params\.seconds\]\ntype = "float"\ndefault = )[0-9.]+',
                                   rf"\g<1>{seconds}", b)
            assert n == 1, b
    (into / "catalog.toml").write_text("[[job]]".join(blocks))
    return into / "catalog.toml"


def snapshot(p):
    return p.status()["snapshot"]


def all_runs(procs):
    runs = []
    for p in procs:
        db = p.data_dir / "jobs.db"
        if db.exists():
            con = sqlite3.connect(db)
            con.row_factory = sqlite3.Row
            runs += [dict(r) for r in con.execute("SELECT * FROM runs")]
            con.close()
    return runs


def training_overlaps(runs):
    now = time.time()
    by_config = {}
    for r in runs:
        if r["kind"] == "training":
            span = (r["started_at"], r["ended_at"] or now, r["job_id"], r["node_id"])
            by_config.setdefault(r["config"], []).append(span)
    bad = []
    for cfg, spans in by_config.items():
        spans.sort()
        for (_s1, e1, j1, n1), (s2, _e2, j2, n2) in zip(spans, spans[1:]):
            if s2 < e1 - 0.5:  # allow the stop/start handover jitter of the process bookkeeping
                bad.append((cfg, j1, n1, j2, n2))
    return bad


def test_jobs_everywhere_training_on_tier1_and_failover_adopts(five):
    ids = [p.status()["node"]["id"] for p in five]

    def every_node_busy():
        snaps = [snapshot(p) for p in five]
        return all(s["jobs"]["running"] for s in snaps) and snaps

    snaps = wait_until(every_node_busy, 60, interval=1, what="jobs on every node")
    for i, s in enumerate(snaps):
        for j in s["jobs"]["running"]:
            if j["kind"] == "training":
                assert PROFILES[i] in ("H200", "H100", "A100"), f"training on {PROFILES[i]}"
    out = subprocess.run([sys.executable, "-m", "p2pnode", "jobs", "--url", five[1].url],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "running" in out.stdout and "selfplay" in out.stdout

    leader = five[0].status()["election"]["leader"]
    li = ids.index(leader)
    survivors = [p for i, p in enumerate(five) if i != li]
    before = {p.status()["node"]["id"]: {j["job_id"] for j in snapshot(p)["jobs"]["running"]} for p in survivors}
    old_term = five[li].status()["election"]["term"]
    five[li].stop(signal.SIGKILL)

    def new_leader():
        views = [p.status()["election"] for p in survivors]
        leaders = {v["leader"] for v in views}
        return len(leaders) == 1 and None not in leaders and leader not in leaders and views[0]["term"] > old_term

    wait_until(new_leader, 40, interval=0.5, what="a new leader")
    new = survivors[0].status()["election"]["leader"]

    def adopted():
        plan = httpx.get(f"{survivors[0].url}/plan", timeout=2, trust_env=False).json()["plan"]
        if not plan or plan["term"] <= old_term:
            return False
        planned = {j["job_id"] for j in plan["assignments"]}
        still = {jid for jobs in before.values() for jid in jobs}
        # Jobs that ran before the failover are in the new leader's plan, or have finished on their own.
        finished = {r["job_id"] for r in all_runs(survivors) if r["ended_at"] is not None}
        return still <= planned | finished

    wait_until(adopted, 30, interval=1, what=f"the new leader {new} adopting the running jobs")
    new_term = survivors[0].status()["election"]["term"]
    # Jobs kept running across the failover: the new leader stopped none of those that ran before it.
    was_running = {jid for jobs in before.values() for jid in jobs}
    for r in all_runs(survivors):
        if r["job_id"] in was_running:
            assert f"no longer in the plan of term {new_term}" not in (r["reason"] or ""), r
    time.sleep(8)
    assert training_overlaps(all_runs(five)) == []


def test_bad_catalog_stops_the_agent_naming_file_line_and_field(tmp_path):
    bad = tmp_path / "catalog.toml"
    bad.write_text(DEMO.read_text().replace('priority = 70', 'priority = 0', 1))
    r = subprocess.run([sys.executable, "-m", "p2pnode", "agent", "--no-mdns", "--data-dir", str(tmp_path / "d"),
                        "--port", "0", "--catalog", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), 1) if text.strip() == "priority = 0")
    assert f"{bad}:{line}: job[2] (train-hex8_2p).priority: an integer 1-100" in r.stderr


def test_degraded_node_refuses_normal_work_and_idle_gpus_get_work(tmp_path):
    import psutil

    disk = psutil.disk_usage(str(tmp_path)).percent
    heavy_max = round(disk / 0.975, 2)  # load ratio 0.975: heavy (level 3) on the disk alone
    heavy_env = {**ENV, "P2PNODE_MAX_DISK_PERCENT": str(heavy_max), "P2PNODE_DISK_WARN_PERCENT": str(heavy_max * 0.9),
                 "P2PNODE_DISK_NOTICE_PERCENT": str(heavy_max * 0.8), "P2PNODE_DISK_CLEANUP": "off"}
    env = {**ENV, "P2PNODE_IDLE_GRACE_PERIOD": "2"}
    ports = [free_port() for _ in range(3)]
    specs = [("H100", env), ("RTX 4090", heavy_env), ("RTX 4090", env)]
    catalog = demo_with_short_selfplay(tmp_path / "demo", 5.0)  # (the wait below is for a selfplay to end)
    procs = []
    try:
        for i, (gpu, e) in enumerate(specs):
            args = ["--no-mdns", "--fake-gpus", gpu, "--catalog", str(catalog)]
            if i:
                args += ["--join", f"127.0.0.1:{ports[0]}"]
            procs.append(AgentProc(tmp_path / f"n{i}", ports[i], *args, env=e).start())
        for p in procs:
            p.wait_ready()
        heavy_id = procs[1].status()["node"]["id"]

        def refusing_shown():
            jobs = httpx.get(f"{procs[0].url}/jobs", timeout=2, trust_env=False).json()
            return any(r["node_id"] == heavy_id and r["level"] >= 3 for r in jobs["refusing"]) and jobs

        jobs = wait_until(refusing_shown, 40, interval=1, what="the heavy node listed as refusing NORMAL work")
        reason = next(r["reason"] for r in jobs["refusing"] if r["node_id"] == heavy_id)
        assert "refuses NORMAL work" in reason and "Disk at" in reason
        out = subprocess.run([sys.executable, "-m", "p2pnode", "jobs", "--url", procs[0].url],
                             capture_output=True, text=True, timeout=30)
        assert "nodes refusing NORMAL work" in out.stdout and heavy_id in out.stdout
        # The leader places the selfplay elsewhere: the healthy 4090 runs it, the heavy one runs nothing.
        healthy = procs[2]
        wait_until(lambda: any(j["kind"] == "selfplay" for j in snapshot(healthy)["jobs"]["running"]), 40, interval=1,
                   what="selfplay on the healthy node")

        def worked_again():  # a run ended on the healthy node (a selfplay runs 5 s here), and one started after it
            runs = all_runs([healthy])
            ends = [r["ended_at"] for r in runs if r["ended_at"] is not None]
            return bool(ends) and any(r["started_at"] >= min(ends) for r in runs)

        wait_until(worked_again, 120, interval=1, what="a run ended on the healthy node and its GPU given work again")
        assert not snapshot(procs[1])["jobs"]["running"]
        runs = sorted(all_runs([healthy]), key=lambda r: r["started_at"])
        # Once its GPU falls idle (no job at all), it stays idle at most the grace period (2 s) plus one
        # scheduling interval (2 s), with 4 s of slack for process start and gossip.
        now = time.time()
        busy_until = None
        for r in runs:
            if busy_until is not None and r["started_at"] > busy_until:
                assert r["started_at"] - busy_until <= 2 + 2 + 4, ("idle gap", busy_until, r, runs)
            end = r["ended_at"] or now
            busy_until = end if busy_until is None else max(busy_until, end)
    finally:
        for p in procs:
            p.kill()


def test_one_busy_gpu_leaves_the_other_seven_busy(tmp_path, capsys):
    """Issue 15's first finding, end to end: an 8 x RTX 4090 node whose GPU 0 is held at 100 % utilization with
    90 % of its memory used (outside p2pnode) keeps offering the other seven: each gets a one-GPU job within two
    scheduling intervals, and while work is pending it keeps at least 7 of 8 GPUs busy on average.

    Busy: GPU 0 by its own load (checked in the samples), the others while they hold a job (the node's own
    ``/jobs``, read every 0.5 s). The utilization samples (once a second) are printed beside it: they lag a job's
    start and end by up to a sample each."""
    cat = tmp_path / "catalog.toml"
    cat.write_text(
        '[[job]]\nname = "short"\nkind = "selfplay"\nconfig = "c"\nmax_concurrency = 16\n'
        'argv = ["{python}", "-c", "import random, time; time.sleep(random.uniform(4, 10))"]\n'
        "[job.resources]\nnum_gpus = 1\nvram_gib = 4\n")
    # The host's CPU is shared with the rest of the suite: only the GPUs are under test here.
    env = {**ENV, "P2PNODE_SCHEDULER_INTERVAL_S": "1", "P2PNODE_MAX_SPAWNS_PER_MINUTE": "600",
           "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}
    p = AgentProc(tmp_path / "box", free_port(), "--no-mdns", "--fake-gpus", "8xRTX 4090", "--resource", "cpus=64",
                  "--fake-gpu-load",
                  "0=100/90", "--catalog", str(cat), env=env).start()
    try:
        p.wait_ready()
        t0 = time.monotonic()

        def gpus_with_jobs():
            return {g for j in p.get("/jobs")["running"] for g in j["gpus"]}

        wait_until(lambda: gpus_with_jobs() >= set(range(1, 8)), 20, interval=0.2, what="a job on GPUs 1-7")
        first_s = time.monotonic() - t0
        busy, sampled, zero = [], [], []
        for _ in range(40):  # 20 s: jobs end after 4-10 s and new ones take their GPUs
            held = gpus_with_jobs()
            gpus = snapshot(p)["resources"]["gpus"]
            zero.append(gpus[0]["util_percent"])
            busy.append((gpus[0]["util_percent"] >= 30.0) + len(held & set(range(1, 8))))
            sampled.append(sum(1 for g in gpus if g["util_percent"] >= 30.0))
            assert 0 not in held  # the full GPU gets nothing
            time.sleep(0.5)
        mean_busy = sum(busy) / len(busy)
        assert min(zero) == 100.0
        assert mean_busy >= 7.0, busy
        level = p.status()["snapshot"]["guard"]["level"]
        with capsys.disabled():
            print(f"\n[busy GPU] 8 x RTX 4090, GPU 0 held at 100 %: GPUs 1-7 each ran a job {first_s:.1f} s after "
                  f"start; {mean_busy:.2f} of 8 GPUs busy on average over 20 s (by the utilization samples "
                  f"{sum(sampled) / len(sampled):.2f}); degradation level {level}", file=sys.stderr)
    finally:
        p.kill()


def test_each_job_runs_on_its_own_gpus_by_uuid_on_a_mixed_box(tmp_path):
    """Issue 24 item 4, end to end: a node whose NVML order (RTX 3060, then H100) is not CUDA's fastest-first
    order. Each job's own environment names, by UUID, exactly the GPU its report says it was assigned, with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``."""
    cat = tmp_path / "catalog.toml"
    cat.write_text(
        '[[job]]\nname = "dump"\nkind = "selfplay"\nconfig = "c"\nmax_concurrency = 2\n'
        'argv = ["{python}", "-c", "import os, time; e = os.environ; open(e[\'P2PNODE_JOB_ID\'] + \'.env\', \'w\')'
        '.write(e[\'CUDA_VISIBLE_DEVICES\'] + \'|\' + e.get(\'CUDA_DEVICE_ORDER\', \'\')); time.sleep(60)"]\n'
        "[job.resources]\nnum_gpus = 1\nvram_gib = 4\n")
    # The host's CPU and memory are shared with the rest of the suite: only the GPUs are under test here.
    env = {**ENV, "P2PNODE_SCHEDULER_INTERVAL_S": "1", "P2PNODE_CPU_MAX_PERCENT": "0",
           "P2PNODE_CPU_WARN_PERCENT": "100", "P2PNODE_MEMORY_MAX_PERCENT": "100", "P2PNODE_MEMORY_WARN_PERCENT": "100"}
    p = AgentProc(tmp_path / "box", free_port(), "--no-mdns", "--fake-gpus", "RTX 3060,H100", "--catalog", str(cat),
                  env=env).start()
    try:
        p.wait_ready()

        def both_written():
            running = p.get("/jobs")["running"]
            files = {j["job_id"]: p.data_dir / f"{j['job_id']}.env" for j in running}
            done = len(running) == 2 and all(f.exists() and f.read_text() for f in files.values())
            return done and {j["job_id"]: (j["gpus"], files[j["job_id"]].read_text()) for j in running}

        jobs = wait_until(both_written, 40, interval=0.5, what="two jobs that wrote their environment")
        gpus = snapshot(p)["resources"]["gpus"]
        assert [g["name"] for g in gpus] == ["NVIDIA GeForce RTX 3060", "NVIDIA H100 80GB HBM3"]
        uuid = {g["index"]: g["uuid"] for g in gpus}
        assert sorted(g for assigned, _ in jobs.values() for g in assigned) == [0, 1]
        for job_id, (assigned, written) in jobs.items():
            assert written == f"{uuid[assigned[0]]}|PCI_BUS_ID", (job_id, assigned, written, uuid)
    finally:
        p.kill()
