"""Gangs on the real engines (issue 26): three agents in three network namespaces (fake GPUs), a ``torchrun`` gang of
3 running a real gloo all-reduce of the ranks (deploy/examples/ddp_allreduce.py), then SIGKILL of a member's
process mid-run and of a member's whole namespace: the gang ends on every survivor, no torch process is left,
and it is placed again. The engines live in their own environment (``.engines``, made by ``.ci/engines``, which
``.ci/run`` runs: ``torch==2.13.0``, ``ray[default]``), configured as the agents' engine interpreter; the rest of
the suite never imports them. ``bash .ci/engines --test`` (as root) builds it and runs this file."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from agents import AgentProc, wait_until
from netns import NetnsLab, require_netns

pytestmark = [pytest.mark.netns, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ROOT / ".engines" / "bin" / "python"
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1", "P2PNODE_LOG_LEVEL": "info",
       "P2PNODE_SCHEDULER_STOP_GRACE_S": "3", "P2PNODE_SCHEDULER_ADOPT_GRACE_S": "6",
       "P2PNODE_JOBS_ENGINES": f"torchrun={ENGINES},ray={ENGINES}"}
CATALOG = """[[job]]
name = "ddp"
kind = "training"
config = "ddp_c"
engine = "torchrun"
argv = ["{catalog_dir}/ddp_allreduce.py", "--seconds", "{seconds}"]
max_concurrency = 1
max_runtime_s = 600
[job.params.seconds]
type = "float"
default = 20
min = 0
max = 3600
[job.gang]
members = 3
[job.resources]
num_gpus = 1
vram_gib = 8
num_cpus = 0.5
memory_gib = 1
"""


def require_engine(module: str) -> None:
    if not ENGINES.exists():
        pytest.skip(f"no engines environment at {ENGINES} (`bash .ci/engines --test` makes it and runs these tests)")
    out = subprocess.run([str(ENGINES), "-c", f"import {module}"], capture_output=True, timeout=120)
    if out.returncode != 0:
        pytest.skip(f"the engines environment {ENGINES} lacks {module}")


def _get(lab, i, path):
    return httpx.get(f"http://{lab.addrs[i]}:8770{path}", timeout=5, trust_env=False).json()


def _members(lab, alive):
    return [(i, j) for i in alive for j in _get(lab, i, "/jobs")["running"] if j.get("gang")]


def _log(lab, i, job_id):
    r = httpx.get(f"http://{lab.addrs[i]}:8770/jobs/logs", params={"job_id": job_id, "offset": 0}, timeout=5,
                  trust_env=False)
    return r.text if r.status_code == 200 else ""


def _processes(pids: set[int], needles: tuple[bytes, ...]) -> list[int]:
    """Of ``pids``, those whose command line holds one of ``needles`` (an engine's processes)."""
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(n in cmd for n in needles):
            out.append(pid)
    return out


def _torch_processes(ns_pids: set[int]) -> list[int]:
    """Processes of the namespaces' agents' jobs running torch (the engine), by their command line."""
    return _processes(ns_pids, (b"torch.distributed.run", b"ddp_allreduce"))


def _lab_catalog(tmp_path: Path, catalog: str, script: str) -> Path:
    """The catalog file the agents read, beside the example ``script`` it runs (deploy/examples)."""
    d = tmp_path / "catalog"
    d.mkdir()
    (d / "catalog.toml").write_text(catalog)
    (d / script).write_text((ROOT / "deploy" / "examples" / script).read_text())
    return d / "catalog.toml"


def _start_agent(lab, tmp_path: Path, i: int, catalog: Path, gpus: str) -> AgentProc:
    """Agent ``i`` in its namespace on port 8770, joining agent 0."""
    args = ["--fake-gpus", gpus, "--catalog", str(catalog), "--no-mdns"]
    if i:
        args += ["--join", f"{lab.addrs[0]}:8770"]
    return AgentProc(tmp_path / f"n{i}", 8770, *args, bind=lab.addrs[i], prefix=lab.prefix_for(i), env=ENV).start()


def _tear_down(lab, procs) -> None:
    """Every agent, and every process left in the lab's namespaces, killed; the namespaces removed."""
    for p in procs:
        if p is not None:
            p.kill()
    for i in range(len(lab.names)):
        for pid in _ns_pids(lab, i):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    lab.close()


def _session(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2:].split()[3])


def _ns_pids(lab, i) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", lab.names[i]], capture_output=True, text=True, check=False)
    return {int(x) for x in out.stdout.split()}


def test_torchrun_gang_all_reduces_and_ends_whole_on_a_kill(tmp_path):
    require_netns()
    require_engine("torch.distributed.run")
    catalog = _lab_catalog(tmp_path, CATALOG, "ddp_allreduce.py")
    lab = NetnsLab(3, net=3, host_link=True)
    procs: list[AgentProc | None] = []

    def start(i):
        return _start_agent(lab, tmp_path, i, catalog, "2xA100")

    try:
        procs = [start(i) for i in range(3)]
        alive = [0, 1, 2]

        def gang(exclude=()):
            ms = _members(lab, alive)
            ids = {j["gang"]["id"] for _, j in ms} - set(exclude)
            ms = [(i, j) for i, j in ms if j["gang"]["id"] in ids]
            return len(ms) == 3 and len(ids) == 1 and ms

        ms = wait_until(gang, 120, interval=1, what="a torchrun gang of 3 running")
        gid = ms[0][1]["gang"]["id"]
        assert sorted(j["gang"]["rank"] for _, j in ms) == [0, 1, 2] and len({i for i, _ in ms}) == 3

        def reduced():
            texts = {j["gang"]["rank"]: _log(lab, i, j["job_id"]) for i, j in ms}
            return all("sum of ranks 3, expected 3" in t for t in texts.values()) and texts

        texts = wait_until(reduced, 120, interval=1, what="every member's all-reduce of the ranks")
        for rank, text in texts.items():
            assert f"rank {rank} of 3 (node {rank}, gang {gid})" in text, text

        # SIGKILL of rank 1's torch launcher mid-run: every survivor ends, no torch process is left, placed again.
        i1, j1 = next((i, j) for i, j in ms if j["gang"]["rank"] == 1)
        launcher = [p for p in _torch_processes(_ns_pids(lab, i1)) if b"torch.distributed.run" in
                    Path(f"/proc/{p}/cmdline").read_bytes()]
        assert launcher
        t0 = time.monotonic()
        os.kill(launcher[0], signal.SIGKILL)
        wait_until(lambda: not any(j["gang"]["id"] == gid for _, j in _members(lab, alive)), 60, interval=0.5,
                   what="the gang ended on every member")
        took = time.monotonic() - t0
        sessions = {j["pid"] for _, j in ms}  # each member's wrapper leads its session: the gang's processes
        left = [p for i in alive for p in _torch_processes(_ns_pids(lab, i)) if _session(p) in sessions]
        assert not left, f"torch processes of gang {gid} left: {left}"  # (a gang placed again has its own)
        ms2 = wait_until(lambda: gang(exclude=(gid,)), 120, interval=1, what="the gang placed again")
        gid2 = ms2[0][1]["gang"]["id"]
        print(f"[netns gang] SIGKILL of a member's launcher: gang ended everywhere in {took:.1f} s")

        # SIGKILL of a whole member namespace (its agent and its jobs): the survivors end theirs.
        i2 = next(i for i, j in ms2 if j["gang"]["rank"] == 2)
        t0 = time.monotonic()
        for pid in _ns_pids(lab, i2):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        alive.remove(i2)
        wait_until(lambda: not any(j["gang"]["id"] == gid2 for _, j in _members(lab, alive)), 90, interval=0.5,
                   what="the gang ended on the survivors")
        took = time.monotonic() - t0
        left = [p for i in range(3) for p in _torch_processes(_ns_pids(lab, i))]
        assert not left, f"torch processes left: {left}"
        print(f"[netns gang] SIGKILL of a member's namespace: gang ended on the survivors in {took:.1f} s")
        pending = _get(lab, alive[0], "/jobs").get("pending") or []
        procs[i2] = start(i2)  # the node comes back (a new agent, same data dir): the gang is placed again
        alive.append(i2)
        ms3 = wait_until(lambda: gang(exclude=(gid, gid2)), 120, interval=1, what="the gang placed again on 3 nodes")
        print(f"[netns gang] while 2 nodes were up: {pending}")
        assert any(p["template"] == "ddp" and "gang of 3 needs 3 nodes" in p["reason"] for p in pending), pending

        # Left alone, the gang runs its 20 s and every member exits 0 (the gang completes, nothing is stopped).
        ids3 = {(i, j["job_id"]) for i, j in ms3}

        def ended():
            rows = {h["job_id"]: h for i, job_id in ids3 for h in _get(lab, i, "/jobs")["history"]
                    if h["job_id"] == job_id and h.get("ended_at")}
            return len(rows) == 3 and rows

        rows = wait_until(ended, 120, interval=1, what="the third gang's members all ended")
        assert all(h["exit_status"] == 0 and h["reason"] == "exited" for h in rows.values()), rows
    finally:
        _tear_down(lab, procs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-s"]))


RAY_CATALOG = """[[job]]
name = "raygang"
kind = "evaluation"
config = "ray_c"
engine = "ray"
argv = ["{catalog_dir}/ray_tasks.py", "--seconds", "{seconds}"]
max_concurrency = 1
max_runtime_s = 600
[job.params.seconds]
type = "float"
default = 120
min = 0
max = 3600
[job.gang]
members = 3
[job.resources]
num_gpus = 1
vram_gib = 8
num_cpus = 1
memory_gib = 1
"""


def _ray_processes(pids: set[int]) -> list[int]:
    """Of ``pids``, Ray's processes (the member script, raylet, GCS, workers), by their command line."""
    return [p for p in _processes(pids, (b"ray_member", b"raylet", b"gcs_server", b"ray.scripts", b"ray::",
                                         b"default_worker"))]


def test_ray_gang_builds_a_ray_cluster_over_the_members_and_ends_whole(tmp_path):
    require_netns()
    require_engine("ray")
    catalog = _lab_catalog(tmp_path, RAY_CATALOG, "ray_tasks.py")
    lab = NetnsLab(3, net=4, host_link=True)
    procs: list[AgentProc | None] = []
    try:
        procs = [_start_agent(lab, tmp_path, i, catalog, "A100") for i in range(3)]
        alive = [0, 1, 2]

        def gang():
            ms = _members(lab, alive)
            return len(ms) == 3 and len({j["gang"]["id"] for _, j in ms}) == 1 and ms

        def driver_done():  # the current gang's (a member whose `ray start` timed out ends it: placed again)
            ms = gang()
            if not ms:
                return False
            i0, j0 = next((i, j) for i, j in ms if j["gang"]["rank"] == 0)
            text = _log(lab, i0, j0["job_id"])
            return text.count("task on ") == 3 and (ms, text)

        ms, text = wait_until(driver_done, 360, interval=1, what="the driver's tasks on every node")
        gid = ms[0][1]["gang"]["id"]
        assert "3 alive Ray nodes" in text, text
        for addr in lab.addrs:
            assert f"node {addr}: " in text and f"ran on {addr} (p2pnode node" in text, text
        assert text.count("'GPU': 1.0") == 3 and text.count("'CPU': 1.0") == 3, text  # the members' resources

        # SIGKILL of rank 1's member process: the gang ends everywhere, no Ray process is left on any member.
        i1, j1 = next((i, j) for i, j in ms if j["gang"]["rank"] == 1)
        member = [p for p in _ns_pids(lab, i1) if b"ray_member" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert member
        t0 = time.monotonic()
        os.kill(member[0], signal.SIGKILL)
        wait_until(lambda: not any(j["gang"]["id"] == gid for _, j in _members(lab, alive)), 60, interval=0.5,
                   what="the ray gang ended on every member")
        took = time.monotonic() - t0
        sessions = {j["pid"] for _, j in ms}  # each member's wrapper leads its session: the gang's processes

        def left_over():  # (a gang placed again since has Ray processes of its own, in other sessions)
            return [(p, Path(f"/proc/{p}/cmdline").read_bytes()[:120]) for i in alive
                    for p in _ray_processes(_ns_pids(lab, i)) if _session(p) in sessions]

        try:
            wait_until(lambda: not left_over(), 30, interval=0.5, what="no Ray process left on any member")
        except AssertionError:
            raise AssertionError(f"Ray processes left: {left_over()}") from None
        print(f"[netns ray] 3 Ray nodes, a task on each; SIGKILL of a member: gang ended everywhere in {took:.1f} s, "
              "no Ray process left")
    finally:
        _tear_down(lab, procs)
