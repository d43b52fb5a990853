"""`p2pnode status`: cluster totals (GPUs, VRAM, CPUs, memory, jobs) that match the sum of the members' snapshots,
a jobs column per member, and --watch on `status` and `sync status`."""

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from agents import AgentProc, free_port, wait_until
from test_operator import kill_jobs_of

from p2pnode.cli._status import BUSY_GPU_UTIL_PERCENT, _status_render, cluster_totals

pytestmark = pytest.mark.slow

GIB = 2**30
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1"}
# GPU-free jobs: fake GPU utilization and memory stay as --fake-gpu-load holds them, so the totals are exact.
CATALOG = """
[[job]]
name = "idle"
kind = "selfplay"
config = "c"
autonomous = true
max_concurrency = 2
argv = ["sleep", "600"]
[job.resources]
num_cpus = 0.1
"""
NODES = [("H100", ["0=50/40"]), ("2xRTX 4090", ["1=90/80"]), ("A100,RTX 3060", [])]
TOTALS = re.compile(r"cluster\s+(\d+)/(\d+) members up\s+GPUs (\d+)/(\d+) busy \(mean util (\d+)%\)\s+"
                    r"VRAM ([\d.]+)/([\d.]+) GiB\s+CPUs ([\d.]+)/(\d+)\s+memory ([\d.]+)/([\d.]+) GiB"
                    r"(?:\s+jobs (\d+) running)?")


@pytest.fixture
def three(tmp_path):
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    ports = [free_port() for _ in NODES]
    procs = []
    for i, (gpus, loads) in enumerate(NODES):
        args = ["--no-mdns", "--fake-gpus", gpus, "--catalog", str(catalog)]
        for load in loads:
            args += ["--fake-gpu-load", load]
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
        kill_jobs_of([p.data_dir for p in procs])  # SIGKILL leaves the jobs (their own sessions): 10 min sleeps


def expected(status):
    """The totals summed here, independently of the CLI, from every member's resources in /status."""
    e = dict(gpus=0, busy=0, util=[], vram_used=0, vram_total=0, cpus=0, cpus_used=0.0, mem_used=0, mem_total=0)
    for m in status["members"]:
        r = m["resources"]  # fields at zero are left out of a snapshot
        for g in r.get("gpus", []):
            e["gpus"] += 1
            e["busy"] += g.get("util_percent", 0) >= BUSY_GPU_UTIL_PERCENT
            e["util"].append(g.get("util_percent", 0))
            e["vram_used"] += g.get("mem_used_bytes", 0)
            e["vram_total"] += g.get("mem_total_bytes", 0)
        e["cpus"] += r.get("cpu_count", 0)
        e["cpus_used"] += r.get("cpu_percent", 0) / 100 * r.get("cpu_count", 0)
        e["mem_used"] += r.get("mem_used_bytes", 0)
        e["mem_total"] += r.get("mem_total_bytes", 0)
    return e


def cli(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "p2pnode", *args], capture_output=True, text=True, timeout=timeout)


def test_status_prints_totals_matching_the_sum_of_snapshots_and_jobs_per_member(three):
    url = three[0].url

    def settled():
        st = three[0].status()
        jobs = three[0].get("/jobs")
        counts = jobs["running_counts"]
        up = [m for m in st["members"] if m["state"] == "alive"]
        return len(up) == 3 and len(counts) == 3 and (st, counts)

    wait_until(settled, 30, interval=0.5, what="3 members")
    # Jobs start unless this 2-core machine is so busy that the guard refuses work: then the counts are zeros.
    deadline = time.monotonic() + 20
    while not sum(three[0].get("/jobs")["running_counts"].values()) and time.monotonic() < deadline:
        time.sleep(0.5)

    def stable_counts():  # the same running counts before and after the CLI ran
        before = three[0].get("/jobs")["running_counts"]
        out = cli("status", "--url", url)
        after = three[0].get("/jobs")["running_counts"]
        return before == after and (out, before)

    out, counts = wait_until(stable_counts, 30, interval=1, what="stable job counts")
    status = three[0].status()
    assert out.returncode == 0, out.stderr
    m = TOTALS.search(out.stdout)
    assert m, out.stdout
    up, members, busy, gpus, util, vram_used, vram_total, cpus_used, cpus, mem_used, mem_total, jobs = m.groups()
    e = expected(status)
    # Fixed by the fake GPUs and the machine: exact.
    assert (int(up), int(members)) == (3, 3)
    assert int(gpus) == e["gpus"] == 5
    assert int(busy) == e["busy"] == 2  # H100 GPU 0 at 50 %, RTX 4090 GPU 1 at 90 %; the rest idle
    assert int(util) == round(sum(e["util"]) / len(e["util"])) == 28
    assert float(vram_used) == round(e["vram_used"] / GIB, 1)
    assert float(vram_total) == round(e["vram_total"] / GIB, 1)
    assert int(cpus) == e["cpus"]
    assert float(mem_total) == round(e["mem_total"] / GIB, 1)
    assert int(jobs) == sum(counts.values())
    # Sampled every second on each member: the CLI's read and ours differ by a sample at most.
    assert 0 <= float(cpus_used) <= int(cpus)
    assert abs(float(mem_used) - e["mem_used"] / GIB) < 1.0
    # Jobs per member: the jobs column of each member's row.
    for m in status["members"]:
        row = next(line for line in out.stdout.splitlines() if m["id"] in line and "│" in line)
        cells = [c.strip() for c in row.split("│")]
        assert cells[13] == str(counts[m["id"]]), row

    # The renderer, on one /status and /jobs read: every used figure exactly the sum of the snapshots.
    from rich.console import Console

    jobs_view = three[0].get("/jobs")
    status = three[0].status()
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(_status_render(status, jobs_view))
    text = console.export_text()
    e = expected(status)
    m = TOTALS.search(text)
    assert m, text
    assert float(m.group(8)) == round(e["cpus_used"], 1)
    assert float(m.group(10)) == round(e["mem_used"] / GIB, 1)
    assert int(m.group(12)) == sum(jobs_view["running_counts"].values())
    t = cluster_totals(status["members"], jobs_view["running_counts"])
    assert t["vram_used_bytes"] == e["vram_used"] and t["gpus_busy"] == e["busy"]


def test_totals_leave_out_dead_and_left_members():
    res = {"cpu_count": 4, "cpu_percent": 50.0, "mem_used_bytes": GIB, "mem_total_bytes": 4 * GIB,
           "gpus": [{"util_percent": 80.0, "mem_used_bytes": GIB, "mem_total_bytes": 8 * GIB}]}
    members = [{"id": "a", "state": "alive", "resources": res}, {"id": "b", "state": "suspect", "resources": res},
               {"id": "c", "state": "dead", "resources": res}, {"id": "d", "state": "left", "resources": res}]
    t = cluster_totals(members, {"a": 3, "b": 1, "c": 7})
    assert (t["up"], t["members"], t["gpus"], t["gpus_busy"], t["cpus"], t["cpus_used"], t["jobs"]) == \
        (2, 4, 2, 2, 8, 4.0, 4)
    assert t["vram_total_bytes"] == 16 * GIB and t["mem_used_bytes"] == 2 * GIB


def read_until(fd: int, done, timeout: float) -> str:
    """What comes out of ``fd`` until ``done(text so far)`` holds or it closes; raises after ``timeout`` seconds."""
    text, deadline = b"", time.monotonic() + timeout
    while not done(text.decode(errors="replace")):
        assert time.monotonic() < deadline, f"waited {timeout} s; so far: {text.decode(errors='replace')[-600:]!r}"
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                chunk = b""
            if not chunk:
                break
            text += chunk
    return text.decode(errors="replace")


def test_watch_refreshes_until_ctrl_c(three):
    """On a terminal (a pseudo-terminal here: into a pipe the view is drawn once, at the end) ``--watch`` draws
    the view again every interval until Ctrl-C, which ends it with status 0."""
    for args in (["status"], ["sync", "status"]):
        marker = "members up" if args == ["status"] else "role"
        master, slave = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "p2pnode", *args, "--url", three[0].url, "--watch", "0.5"],
                                stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
                                env={**os.environ, "TERM": "xterm", "COLUMNS": "160", "LINES": "60"})
        os.close(slave)
        try:
            # drawn twice: it refreshes, and it is in its loop (a Ctrl-C during its imports would be a traceback)
            shown = read_until(master, lambda t, m=marker: t.count(m) >= 2, 60)
            assert proc.poll() is None
            proc.send_signal(signal.SIGINT)
            out = shown + read_until(master, lambda t: False, 10)
            proc.wait(10)
            err = proc.stderr.read().decode(errors="replace")
        finally:
            os.close(master)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert ("cluster" in out and "members up" in out) if args == ["status"] else "role" in out, out
    bad = cli("status", "--url", three[0].url, "--watch", "--json")
    assert bad.returncode == 2 and "--watch" in bad.stderr


def test_bash_completion_completes_commands_and_options(tmp_path):
    pytest.importorskip("shtab", reason="shtab (the extra p2pnode[completion]) not installed")
    script = tmp_path / "p2pnode.bash"
    r = cli("completion", "bash")
    assert r.returncode == 0, r.stderr
    script.write_text(r.stdout)
    probe = (f'source {script}; COMP_WORDS=(p2pnode st); COMP_CWORD=1; _shtab_p2pnode; echo "1:${{COMPREPLY[*]}}"; '
             'COMP_WORDS=(p2pnode status --w); COMP_CWORD=2; _shtab_p2pnode; echo "2:${COMPREPLY[*]}"; '
             'COMP_WORDS=(p2pnode sync status --w); COMP_CWORD=3; _shtab_p2pnode; echo "3:${COMPREPLY[*]}"')
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30).stdout
    assert "1:status" in out and "2:--watch" in out and "3:--watch" in out, out
    assert cli("completion", "zsh").stdout.startswith("#compdef p2pnode")
