"""A large plan on a few real agents: three agents with many fake GPUs each, filled with ``sleep`` jobs (shared by
``tests/test_plan_scale.py`` and ``bench/plan_scale.py``)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
from agents import AgentProc, free_port, wait_until

ENV = {
    "P2PNODE_GOSSIP_PROFILE": "local-test",
    "P2PNODE_SCHEDULER_INTERVAL_S": "1",
    "P2PNODE_MAX_SPAWNS_PER_MINUTE": "100000",
    # the utilization band above what the fake load of the jobs reaches: the PID controller keeps asking for work
    # until the GPUs are full (the band itself is tested elsewhere); the host's CPU is shared with the suite
    "P2PNODE_TARGET_UTIL_MIN": "95",
    "P2PNODE_TARGET_UTIL_MAX": "99",
    "P2PNODE_CPU_MAX_PERCENT": "0",
    "P2PNODE_CPU_WARN_PERCENT": "100",
    "P2PNODE_GPU_WARN_PERCENT": "99",
    "P2PNODE_GPU_MAX_PERCENT": "100",
    "P2PNODE_LOG_LEVEL": "warning",
    "P2PNODE_GUARD_DWELL_S": "3",  # a CPU burst while three agents start must not hold a node at level 2 for 30 s
    "P2PNODE_GUARD_CHECK_INTERVAL": "1",
}


def catalog(instances: int, templates: int = 4) -> str:
    """``templates`` templates of 1/8-GPU ``sleep`` jobs, ``instances`` in all."""
    out = []
    per = [instances // templates + (1 if i < instances % templates else 0) for i in range(templates)]
    for i, n in enumerate(per):
        out.append(f'[[job]]\nname = "sleep-{i}"\nkind = "selfplay"\nconfig = "c{i}"\nmax_concurrency = {n}\n'
                   'argv = ["sleep", "900"]\n[job.resources]\nnum_gpus = 0.125\nvram_gib = 1\n'
                   "num_cpus = 0.01\nmemory_gib = 0.01\n")
    return "".join(out)


@dataclass
class FillResult:
    """What a fill run measured."""

    assignments: int = 0
    running: int = 0
    fill_s: float = 0.0
    leaders: set[str] = field(default_factory=set)
    terms: set[int] = field(default_factory=set)
    max_snapshot_bytes: int = 0
    snapshot_bound: int = 65536
    """The default ``gossip.max_snapshot_bytes``: the runs leave it unchanged."""
    plans_omitted: int = 0
    unpublishable: int = 0
    gossip_bytes_per_node_s: float = 0.0
    fetch_bytes_per_node_s: float = 0.0
    refused: int = 0


def _running_pids(p: AgentProc) -> list[int]:
    r = httpx.get(p.url + "/jobs/running", timeout=10, trust_env=False)
    return [j["pid"] for j in msgspec.msgpack.decode(r.content) if j.get("pid")]


def _kill_jobs(pids: list[int], data_dirs: list[Path]) -> None:
    """SIGKILL the process group of each of ``pids`` whose working directory is under one of ``data_dirs`` (a job
    runs in its agent's data dir, as the leader of its own session: the wrapper shell and the job)."""
    roots = [str(d) for d in data_dirs]
    for pid in pids:
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if not any(cwd.startswith(r) for r in roots):
                continue  # not ours (any more)
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
            pass


def fill(tmp: Path, *, gpus: int, instances: int, window_s: float = 10.0, timeout_s: float = 120.0) -> FillResult:
    """Start three agents with ``gpus`` fake A100s each and a catalog of ``instances`` 1/8-GPU sleep jobs; wait
    until all run (or ``timeout_s``), then measure gossip bytes per node and second over ``window_s``."""
    cat = tmp / "catalog.toml"
    cat.write_text(catalog(instances))
    ports = [free_port() for _ in range(3)]
    procs: list[AgentProc] = []
    res = FillResult()
    try:
        for i in range(3):
            args = ["--no-mdns", "--fake-gpus", f"{gpus}xA100", "--resource", "cpus=256", "--catalog", str(cat)]
            if i:
                args += ["--join", f"127.0.0.1:{ports[0]}"]
            procs.append(AgentProc(tmp / f"n{i}", ports[i], *args, env=ENV).start())
        for p in procs:
            p.wait_ready()

        def agreed() -> bool:
            views = [p.status()["election"] for p in procs]
            return len({(v["leader"], v["term"]) for v in views}) == 1 and views[0]["leader"] is not None

        wait_until(agreed, 60, interval=0.5, what="one leader that every agent sees")  # the cluster formed
        t0 = time.monotonic()

        def observe() -> int:
            total = 0
            for p in procs:
                st = p.status()
                el = st["election"]
                if el["leader"]:
                    res.leaders.add(el["leader"])
                    res.terms.add(el["term"])
                total += len(p.get("/jobs", timeout=10)["running"])
            res.running = total
            return total

        wait_until(lambda: observe() >= instances, timeout_s, interval=1.0,
                   what=f"{instances} jobs running", retry_on=(httpx.HTTPError,))
        res.fill_s = time.monotonic() - t0

        def counters() -> tuple[int, int]:
            g = sum(p.status()["gossip"]["bytes_sent"] for p in procs)
            f = sum(p.get("/jobs", timeout=10)["fetches"]["bytes"] for p in procs)
            return g, f

        g0, f0 = counters()
        w0 = time.monotonic()
        time.sleep(window_s)
        g1, f1 = counters()
        dt = time.monotonic() - w0
        res.gossip_bytes_per_node_s = (g1 - g0) / dt / len(procs)
        res.fetch_bytes_per_node_s = (f1 - f0) / dt / len(procs)
        observe()
        for p in procs:
            st = p.status()
            res.max_snapshot_bytes = max(res.max_snapshot_bytes, st["gossip"]["own_snapshot_bytes_max"])
            res.plans_omitted += st["gossip"]["plans_omitted"]
            res.unpublishable += st["gossip"]["unpublishable"]
            res.refused += len(p.get("/jobs", timeout=10)["refused"])
        # the plan of the leader now (``leaders`` holds every leader seen; the checks of the callers count them)
        leader = procs[0].status()["election"]["leader"]
        ids = [p.status()["node"]["id"] for p in procs]
        plan = procs[ids.index(leader)].get("/plan", timeout=20)["plan"] if leader in ids else None
        res.assignments = len(plan["assignments"]) if plan else 0
        return res
    finally:
        pids: list[int] = []
        for p in procs:
            try:
                pids += _running_pids(p)
            except (httpx.HTTPError, msgspec.DecodeError):
                pass
        for p in procs:
            p.kill()
        dirs = [p.data_dir for p in procs]
        _kill_jobs(pids, dirs)
        # jobs spawned after the last listing: every process whose working directory is one of our data dirs
        for p in procs:
            _kill_jobs(_children_of_data_dir(p.data_dir), dirs)


def _children_of_data_dir(data_dir: Path) -> list[int]:
    """PIDs of ``sleep 900`` jobs whose working directory is under ``data_dir`` (jobs run in the data dir)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cwd = os.readlink(d / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(data_dir)):
            out.append(int(d.name))
    return out
