"""Real agent processes on 127.0.0.1: join, convergence, clean leave, restart with the same identity."""

import signal
import time

import pytest
from agents import AgentProc, free_port, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def three(tmp_path):
    ports = [free_port() for _ in range(3)]
    procs = [AgentProc(tmp_path / "a", ports[0], "--no-mdns").start()]
    for i in (1, 2):
        # Agent b joins a, agent c joins b: c learns of a only through gossip.
        procs.append(AgentProc(tmp_path / "abc"[i], ports[i], "--no-mdns", "--join",
                               f"127.0.0.1:{ports[i - 1]}").start())
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.kill()


def views(procs):
    return [{m["id"]: m for m in p.status()["members"]} for p in procs]


def test_three_agents_see_each_others_current_versions(three):
    ids = [p.status()["node"]["id"] for p in three]
    assert len(set(ids)) == 3

    def all_members():
        return all(set(v) == set(ids) for v in views(three))

    wait_until(all_members, 15, what="three members everywhere")
    # "Current": every view catches up with each node's own version as read now, within a few intervals.
    own = {p.status()["node"]["id"]: p.status()["node"]["version"] for p in three}

    def caught_up():
        return all(v[i]["version"] >= own[i] for v in views(three) for i in ids)

    wait_until(caught_up, 10, what="views at current versions")
    # c was only told about b; it learned a's address by gossip and talks to it directly.
    a_addr = three[0].status()["node"]["addr"]

    def c_talks_to_a():
        peer = {p["addr"]: p for p in three[2].status()["gossip"]["peers"]}.get(a_addr)
        return peer is not None and peer["source"] == "gossip" and peer["last_ok_age_s"] is not None

    wait_until(c_talks_to_a, 5, what="c gossiping with a directly")
    for v in views(three):
        assert all(time.time() - m["received_at"] < 5 for m in v.values())  # the agents share this clock
        assert all(m["resources"]["mem_total_bytes"] > 0 for m in v.values())


def test_clean_leave_and_restart_keep_identity(three, tmp_path):
    a, b, c = three
    c_id = c.status()["node"]["id"]
    wait_until(lambda: all(c_id in v for v in views([a, b])), 15, what="c known")
    c_version = c.status()["node"]["version"]

    took = c.stop(signal.SIGTERM)
    assert c.proc.returncode == 0 and took < 2.0, f"shutdown took {took:.2f}s"
    wait_until(lambda: all(v[c_id]["leaving"] for v in views([a, b])), 5, what="c marked leaving")

    # Restart c with the same data dir and no --join: the peers file brings it back.
    c2 = AgentProc(tmp_path / "c", c.port, "--no-mdns").start()
    try:
        st = c2.wait_ready()
        assert st["node"]["id"] == c_id
        assert st["node"]["version"] > c_version  # versions keep increasing across restarts

        def accepted():
            return all(not v[c_id]["leaving"] and v[c_id]["version"] > c_version for v in views([a, b]))

        wait_until(accepted, 10, what="peers accept c's new snapshots")
        assert len(c2.status()["members"]) == 3
    finally:
        c2.kill()


def test_sigint_also_leaves_promptly(tmp_path):
    p = AgentProc(tmp_path / "solo", free_port(), "--no-mdns").start()
    try:
        p.wait_ready()
        took = p.stop(signal.SIGINT)
        assert p.proc.returncode == 0 and took < 2.0
    finally:
        p.kill()


def _df_used_total(path):
    import subprocess

    out = subprocess.run(["df", "-B1", "--output=used,size", str(path)], capture_output=True, text=True, check=True)
    used, size = out.stdout.splitlines()[1].split()
    return int(used), int(size)


def test_status_shows_this_machines_real_resources(tmp_path):
    import os

    p = AgentProc(tmp_path / "solo", free_port(), "--no-mdns").start()
    try:
        first = p.wait_ready()
        res = first["snapshot"]["resources"]
        meminfo = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
        assert res["mem_total_bytes"] == meminfo
        assert res["cpu_count"] == os.cpu_count()
        used, size = _df_used_total(tmp_path / "solo")
        assert res["disk_total_bytes"] == size
        assert abs(res["disk_used_bytes"] - used) < 64 * 1024**2
        assert res["disk_path"] == str(tmp_path / "solo")
        assert res["gpu_source"] in ("nvml", "none") and (res["gpus"] or res["gpu_absent_reason"])
        # (the snapshot is republished every second or so: a newer version, then, and not a fixed wait for it)
        wait_until(lambda: p.status()["node"]["version"] > first["node"]["version"], 30, interval=0.2,
                   what="a newer snapshot version")
    finally:
        p.kill()


def test_a_node_killed_soon_after_it_met_the_cluster_finds_it_again_without_join(tmp_path):
    """The peers file is written within a second of a new peer answering, not only every 30 s and at a clean
    stop: agent a (started with no --join; the others joined it) killed with SIGKILL soon after the cluster
    formed, then restarted once the others hold it dead, contacts its remembered peers at once instead of waiting
    for their backoff."""
    env = {"P2PNODE_GOSSIP_PROFILE": "local-test"}  # dead within seconds
    ports = [free_port() for _ in range(3)]
    a = AgentProc(tmp_path / "a", ports[0], "--no-mdns", env=env).start()
    b, c = (AgentProc(tmp_path / n, port, "--no-mdns", "--join", f"127.0.0.1:{ports[0]}", env=env).start()
            for n, port in (("b", ports[1]), ("c", ports[2])))
    procs = [a, b, c]
    try:
        for p in procs:
            p.wait_ready()
        ids = [p.status()["node"]["id"] for p in procs]
        wait_until(lambda: all(set(v) == set(ids) for v in views(procs)), 15, what="three members everywhere")
        peers_file = tmp_path / "a" / "peers.json"
        wait_until(peers_file.exists, 3, interval=0.1, what="a's peers file")
        a.stop(signal.SIGKILL)
        wait_until(lambda: all(v[ids[0]]["state"] == "dead" for v in views([b, c])), 30, what="a dead in b and c")
        procs[0] = a = AgentProc(tmp_path / "a", ports[0], "--no-mdns", env=env).start()
        a.wait_ready()

        def back():
            return all(v[ids[0]]["state"] == "alive" for v in views([b, c])) and len(a.status()["members"]) == 3

        wait_until(back, 5, interval=0.1, what="a back in b's and c's views")  # was up to ~8 s: their backoff
    finally:
        for p in procs:
            p.kill()
