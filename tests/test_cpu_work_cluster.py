"""Issue 24 item 2's acceptance, end to end: a GPU-less node and a GPU node on loopback, with a catalog of CPU-only
and GPU templates. Both kinds run, each where it fits (the GPU-less node takes CPU work, the GPU node its GPU job
beside CPU work), and ``p2pnode jobs`` gives a true reason for each waiting template: CPUs for the CPU ones, never
"a GPU with 0 GiB free"."""

import subprocess
import sys

import pytest
from agents import AgentProc, free_port, wait_until
from test_operator import kill_jobs_of

pytestmark = pytest.mark.slow

# The host's CPU is shared with the rest of the suite: its measured use must not hold the CPU offers at 0.
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}
SLEEP = 'argv = ["{python}", "-c", "import time; time.sleep(60)"]\n'


def job(name, resources, max_concurrency=1):
    return (f'[[job]]\nname = "{name}"\nkind = "selfplay"\nconfig = "c"\nmax_concurrency = {max_concurrency}\n'
            + SLEEP + "[job.resources]\n" + resources + "\n")


# selfplay's GPU tiers leave tier 4 (GPU-less nodes) out: its CPU-only templates go there all the same.
CATALOG = ("[policy]\ntiers = { selfplay = [3, 2, 1] }\n\n"
           + job("sp", "num_gpus = 1\nvram_gib = 4\nnum_cpus = 1\nmemory_gib = 0.25")
           + job("loader", "num_gpus = 0\nnum_cpus = 2\nmemory_gib = 0.25", max_concurrency=3)
           + job("huge", "num_gpus = 0\nnum_cpus = 1000"))
CPU_TEMPLATES = {"loader", "huge"}


def test_cpu_and_gpu_templates_each_run_where_they_fit_and_waiting_ones_say_why(tmp_path):
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    ports = [free_port(), free_port()]
    # 2 CPUs on the GPU-less node: one 2-CPU loader. 3 on the GPU node: its GPU job (1 CPU) and one loader, in
    # whichever order they come; the third loader waits for CPUs, "huge" fits nowhere.
    cpu_node = AgentProc(tmp_path / "cpu", ports[0], "--no-mdns", "--resource", "cpus=2", "--resource",
                         "memory_gib=8", "--catalog", str(cat), env=ENV)
    gpu_node = AgentProc(tmp_path / "gpu", ports[1], "--no-mdns", "--fake-gpus", "RTX 4090", "--resource",
                         "cpus=3", "--resource", "memory_gib=8", "--join", f"127.0.0.1:{ports[0]}",
                         "--catalog", str(cat), env=ENV)
    procs = [cpu_node.start(), gpu_node.start()]
    try:
        for p in procs:
            p.wait_ready()
        if cpu_node.status()["snapshot"]["resources"].get("gpus"):
            pytest.skip("this host has GPUs (NVML): no GPU-less node to start")
        cpu_id, gpu_id = (p.status()["node"]["id"] for p in procs)

        def running():
            return {(r["template"], r["node_id"]) for r in gpu_node.get("/jobs")["cluster_running"]}

        def pending():
            return {x["template"]: x["reason"] for x in gpu_node.get("/jobs")["pending"]}

        seen: list = []

        def settled():
            runs, waits = running(), pending()
            seen[:] = [runs, waits, {p.port: p.status()["snapshot"]["jobs"] for p in procs}]
            return (("sp", gpu_id) in runs and ("loader", cpu_id) in runs and ("loader", gpu_id) in runs
                    and {"huge", "loader"} <= set(waits)) and (runs, waits)

        try:
            runs, waits = wait_until(settled, 30, what="the GPU job on the GPU node, loaders on both, CPU work waiting")
        except AssertionError:
            raise AssertionError(f"{cpu_id=} {gpu_id=} {seen}") from None
        # Each where it fits: nothing GPU-bound on the GPU-less node; CPUs never over-committed on either node.
        assert {t for t, n in runs if n == cpu_id} <= CPU_TEMPLATES
        cpus = {"sp": 1, "loader": 2}
        used = {}
        for r in gpu_node.get("/jobs")["cluster_running"]:
            used[r["node_id"]] = used.get(r["node_id"], 0) + cpus[r["template"]]
        assert used == {cpu_id: 2, gpu_id: 3}, used
        # True reasons: CPUs for each waiting CPU template, never a GPU.
        assert waits["huge"] == "unsatisfiable: asks 1000 CPUs, the largest node has 3", waits
        for name, reason in waits.items():
            assert name in CPU_TEMPLATES, waits
            assert "GPU" not in reason and "CPU" in reason, waits
        out = subprocess.run([sys.executable, "-m", "p2pnode", "jobs", "--url", gpu_node.url],
                             capture_output=True, text=True, timeout=30)
        text = " ".join(out.stdout.split())
        assert out.returncode == 0, out.stderr
        for name in waits:
            assert name in text
        assert "asks 1000 CPUs" in text and "a GPU with" not in text, out.stdout
        snaps = {p.status()["node"]["id"]: p.status()["snapshot"]["jobs"] for p in procs}
        assert not snaps[cpu_id].get("offer")  # the GPU-less node never offers GPU work
    finally:
        for p in procs:
            p.kill()
        kill_jobs_of([p.data_dir for p in procs])  # SIGKILL leaves the jobs: they run in their own sessions
