"""Every resource a job asks for is honoured: two agents on loopback, one declaring ``--resource nvlink=1``.
A job asking for nvlink runs there and only once (the declared amount is counted); jobs asking more CPUs, memory
or a custom resource than any node has stay pending with a reason that says so."""

import time

import pytest
from agents import AgentProc, free_port, wait_until
from test_operator import kill_jobs_of

from p2pnode.config import ConfigError, load_config
from p2pnode.resources import parse_resources

pytestmark = pytest.mark.slow

ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}
SLEEP = 'argv = ["{python}", "-c", "import time; time.sleep(60)"]\n'


def job(name, resources, max_concurrency=1):
    return (f'[[job]]\nname = "{name}"\nkind = "selfplay"\nconfig = "c"\nmax_concurrency = {max_concurrency}\n'
            + SLEEP + "[job.resources]\n" + resources + "\n")


def test_declared_resources_parse_and_bad_ones_are_refused(tmp_path):
    assert parse_resources(["nvlink=1", "cpus=64", "memory_gib=512.5"]) == {"nvlink": 1.0, "cpus": 64.0,
                                                                            "memory_gib": 512.5}
    for bad in ["nvlink", "=1", "nv link=1", "nvlink=nan", "nvlink=-1", "nvlink=1e13", "x=inf"]:
        with pytest.raises(ValueError):
            parse_resources([bad])
    with pytest.raises(ValueError):
        parse_resources(["a=1", "a=2"])
    cfg = tmp_path / "p2pnode.toml"
    cfg.write_text("[agent.resources]\nnvlink = 1\ncpus = 32\n")
    assert set(load_config(cfg).agent.resources) == {"nvlink=1", "cpus=32"}
    cfg.write_text("[agent.resources]\nnvlink = -1\n")
    with pytest.raises(ConfigError, match="agent.resources"):
        load_config(cfg)


def test_custom_resources_are_placed_and_counted_and_impossible_requests_say_so(tmp_path):
    cat = tmp_path / "catalog.toml"
    cat.write_text(job("nv", 'num_gpus = 0.5\nvram_gib = 2\ncustom = { nvlink = 1 }', max_concurrency=3)
                   + job("many-cpus", "num_cpus = 1000")
                   + job("much-memory", "memory_gib = 100000")
                   + job("infiniband", "custom = { infiniband = 1 }")
                   + job("plain", "num_cpus = 1", max_concurrency=2))
    ports = [free_port(), free_port()]
    procs = [AgentProc(tmp_path / "a", ports[0], "--no-mdns", "--fake-gpus", "H100", "--resource", "nvlink=1",
                       "--resource", "cpus=16", "--catalog", str(cat), env=ENV).start(),
             AgentProc(tmp_path / "b", ports[1], "--no-mdns", "--fake-gpus", "2xA100", "--resource", "cpus=16",
                       "--join", f"127.0.0.1:{ports[0]}", "--catalog", str(cat), env=ENV).start()]
    try:
        for p in procs:
            p.wait_ready()
        ids = [p.status()["node"]["id"] for p in procs]

        def running():
            return {(r["template"], r["node_id"]) for p in procs for r in p.get("/jobs")["cluster_running"]}

        wait_until(lambda: ("nv", ids[0]) in running() and {t for t, _ in running()} >= {"plain"}, 30,
                   what="the nvlink job on the node that declares nvlink")

        def pending():
            return {x["template"]: x["reason"] for p in procs for x in p.get("/jobs")["pending"]}

        wait_until(lambda: {"many-cpus", "much-memory", "infiniband", "nv"} <= set(pending()), 20,
                   what="impossible requests pending")
        time.sleep(3)
        reasons = pending()
        runs = running()
        assert [n for t, n in runs if t == "nv"] == [ids[0]]  # one nvlink declared: one nv job, on that node
        assert not any(t in ("many-cpus", "much-memory", "infiniband") for t, _ in runs)
        assert "CPU" in reasons["many-cpus"] and "1000" in reasons["many-cpus"], reasons
        assert "memory" in reasons["much-memory"], reasons
        assert "infiniband" in reasons["infiniband"], reasons
        assert "nvlink" in reasons["nv"], reasons
        for p in procs:
            snap = p.status()["snapshot"]
            assert snap["resources"]["declared"]["cpus"] == 16
    finally:
        for p in procs:
            p.kill()
        kill_jobs_of([p.data_dir for p in procs])  # SIGKILL leaves the jobs: they run in their own sessions
