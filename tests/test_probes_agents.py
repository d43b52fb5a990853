"""SWIM probes in real agents on 127.0.0.1 (``gossip.probes = true``, issue 42): a member killed with SIGKILL is
dead everywhere sooner than heartbeats alone could find it, nobody is suspected while all run, and a member whose
UDP is dropped stays unsuspected thanks to the ``POST /probe`` fallback."""

from __future__ import annotations

import re
import socket
import time

import httpx
import pytest
from agents import AgentProc, free_port, wait_until

from p2pnode.gossip import PROFILES, suspect_after_s, suspicion_timeout_s

pytestmark = pytest.mark.slow

PROBE_ENV = {"P2PNODE_GOSSIP_PROBES": "1", "P2PNODE_GOSSIP_PROBE_INTERVAL_S": "0.5",
             "P2PNODE_GOSSIP_PROBE_TIMEOUT_S": "0.25", "P2PNODE_GOSSIP_PUSH_PULL_INTERVAL_S": "30"}


def metric(proc: AgentProc, name: str, labels: str = "") -> float:
    """The value of ``name{labels}`` (a counter's ``_total``) in the agent's ``/metrics``."""
    text = httpx.get(proc.url + "/metrics", timeout=2.0, trust_env=False).text
    m = re.search(rf"^{re.escape(name)}(?:{{{re.escape(labels)}}})? (\S+)$", text, re.M)
    assert m is not None, f"{name} not in /metrics"
    return float(m.group(1))


def states(proc: AgentProc) -> dict[str, str]:
    return {m["id"]: m["state"] for m in proc.status()["members"]}


def start_three(tmp_path, env: dict[str, str], ports: list[int]) -> list[AgentProc]:
    procs = [AgentProc(tmp_path / "a", ports[0], "--no-mdns", env=env).start()]
    for i in (1, 2):
        procs.append(AgentProc(tmp_path / "abc"[i], ports[i], "--no-mdns", "--join", f"127.0.0.1:{ports[0]}",
                               env=env).start())
    return procs


def wait_converged(procs: list[AgentProc]) -> list[str]:
    ids = [p.wait_ready()["node"]["id"] for p in procs]
    wait_until(lambda: all(set(states(p)) == set(ids) and set(states(p).values()) == {"alive"} for p in procs),
               60, what="three alive members everywhere")
    return ids


def test_killed_member_dead_sooner_than_heartbeats_and_no_false_suspicion(tmp_path):
    procs = start_three(tmp_path, PROBE_ENV, [free_port() for _ in range(3)])
    try:
        ids = wait_converged(procs)
        # Every agent probes and is acked for a while (a condition, not a sleep): 20 acks each is ~10 probe
        # intervals during which each member was probed about 10 times by the two others.
        wait_until(lambda: all(metric(p, "p2pnode_probe_acks_total") >= 20 for p in procs), 90,
                   what="20 probe acks on every agent")
        for p in procs:
            assert metric(p, "p2pnode_suspicions_total") == 0, p.log.read_text()[-4000:]
            assert metric(p, "p2pnode_probe_failed_total") == 0
            assert metric(p, "p2pnode_probe_rejected_total", 'reason="bad_mac"') == 0
        # With probes, gossip sends partial digests between full push-pulls (issue 42 item 2); the views still
        # reach every member's current version.
        wait_until(lambda: all(metric(p, "p2pnode_gossip_digests_total", 'kind="partial"') >= 5 for p in procs), 30,
                   what="partial digests sent by every agent")
        own = {p.status()["node"]["id"]: p.status()["node"]["version"] for p in procs}
        wait_until(lambda: all(m["version"] >= own[m["id"]] for p in procs for m in p.status()["members"]
                               if m["id"] in own), 15, what="views at current versions by partial digests")
        victim, survivors = procs[2], procs[:2]
        t0 = time.monotonic()
        victim.kill()
        dead_at: dict[int, float] = {}

        def all_dead() -> bool:
            for i, p in enumerate(survivors):
                if i not in dead_at and states(p).get(ids[2]) == "dead":
                    dead_at[i] = time.monotonic() - t0
            return len(dead_at) == len(survivors)

        wait_until(all_dead, 60, interval=0.05, what="the killed member dead on both survivors")
        observed = max(dead_at.values())
        # Heartbeats alone (same profile, N = 3): silence for suspect_after_s, then the suspicion timeout with
        # every confirmation it can get (its shortest).
        cfg, n = PROFILES["lan"], 3
        heartbeat_only = suspect_after_s(n, cfg) + suspicion_timeout_s(n, 1, cfg)
        print(f"killed member dead on both survivors after {observed:.2f} s; heartbeats alone: {heartbeat_only:.2f} s")
        assert observed < heartbeat_only
        for p in survivors:  # the killed member was suspected once, the survivors never
            assert metric(p, "p2pnode_suspicions_total") == 1
            assert p.status()["membership"]["news_pushes"] >= 1  # the accusation was pushed at once (NewsPush)
    finally:
        for p in procs:
            p.kill()


def test_member_without_udp_is_not_suspected(tmp_path):
    """Agent c's UDP port is held by the test (its probe socket cannot bind): every datagram sent to it is
    dropped, as where a marketplace maps TCP only. The others reach it over ``POST /probe``."""
    ports = [free_port() for _ in range(3)]
    blocker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    blocker.bind(("127.0.0.1", ports[2]))
    blocker.setblocking(False)
    env = {**PROBE_ENV, "P2PNODE_GOSSIP_PROBE_INTERVAL_S": "1.0", "P2PNODE_GOSSIP_PROBE_TIMEOUT_S": "0.3"}
    procs = start_three(tmp_path, env, ports)
    try:
        ids = wait_converged(procs)
        a, b, c = procs
        # Counted from the moment all three know each other: while they join, a relay may not know c's address yet
        # and a loaded machine may answer the TCP fallback after the interval (memberlist's join has the same).
        before = {p.port: (metric(p, "p2pnode_suspicions_total"), metric(p, "p2pnode_probe_failed_total"),
                           metric(p, "p2pnode_probe_acks_total")) for p in (a, b)}
        wait_until(lambda: all(metric(p, "p2pnode_probe_acks_total") >= before[p.port][2] + 15 for p in (a, b)), 120,
                   what="15 more probe acks on a and b")
        dropped = 0
        try:
            while True:
                blocker.recv(2048)
                dropped += 1
        except BlockingIOError:
            pass
        assert dropped > 0, "no probe was sent to c's UDP port"
        assert "not bound" in c.log.read_text()
        for p in (a, b):
            assert metric(p, "p2pnode_suspicions_total") == before[p.port][0], p.log.read_text()[-4000:]
            assert metric(p, "p2pnode_probe_failed_total") == before[p.port][1]
            assert metric(p, "p2pnode_probe_indirect_total") > 0  # c's probes went past the direct ping
            assert states(p)[ids[2]] == "alive"
    finally:
        blocker.close()
        for p in procs:
            p.kill()
