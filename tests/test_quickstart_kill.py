"""docs/quickstart.md's step 0, as written (issue 38 item 7): five agents as the demo starts them (fake H200, H100,
A100, RTX 4090, RTX 3060; the H200 leads), ``kill -9`` the leader: the others see it suspect, then dead, and elect a
new leader in a higher term; a plain ``kill`` (SIGTERM) of that new leader: it is ``left`` at once, never suspect,
and again a new leader in a higher term."""

import signal
import time

import pytest
from agents import AgentProc, free_port, wait_until

pytestmark = pytest.mark.slow

GPUS = ["H200", "H100", "A100", "RTX 4090", "RTX 3060"]
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test"}


def test_kill_9_the_leader_is_suspect_then_dead_a_plain_kill_is_left(tmp_path):
    ports = [free_port() for _ in GPUS]
    procs = [AgentProc(tmp_path / f"n{i}", ports[i], "--no-mdns", "--fake-gpus", gpu,
                       *(["--join", f"127.0.0.1:{ports[0]}"] if i else []), env=ENV).start()
             for i, gpu in enumerate(GPUS)]
    try:
        ids = [p.wait_ready()["node"]["id"] for p in procs]

        def elected(watchers, not_in=()):
            views = [p.status()["election"] for p in watchers]
            leaders = {v["leader"] for v in views}
            return len(leaders) == 1 and None not in leaders and not leaders & set(not_in) and views[0]

        first = wait_until(lambda: elected(procs), 60, what="a leader")
        assert first["leader"] == ids[0]  # the H200

        def states_of(watcher, node_id, until, seconds):
            """The states ``watcher`` shows ``node_id`` in, in order, until ``until()`` holds."""
            seen: list[str] = []
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                m = {x["id"]: x for x in watcher.status()["members"]}.get(node_id)
                state = m["state"] if m else "gone"
                if not seen or seen[-1] != state:
                    seen.append(state)
                if until(seen):
                    return seen
                time.sleep(0.05)
            raise AssertionError(f"{node_id} seen as {seen}")

        procs[0].stop(signal.SIGKILL)  # kill -9 <pid of n0>
        seen = states_of(procs[1], ids[0], lambda s: s[-1] == "dead", 30)
        assert seen == ["alive", "suspect", "dead"], seen
        second = wait_until(lambda: elected(procs[1:], not_in=[ids[0]]), 30, what="a new leader")
        assert second["term"] > first["term"] and second["leader"] == ids[1]

        procs[1].proc.send_signal(signal.SIGTERM)  # kill <pid of n1>: a clean stop, watched while it happens
        seen = states_of(procs[2], ids[1], lambda s: s[-1] == "left", 15)
        assert seen in (["alive", "left"], ["left"]), seen  # never suspect, never dead
        assert procs[1].proc.wait(10) == 0
        third = wait_until(lambda: elected(procs[2:], not_in=ids[:2]), 30, what="another new leader")
        assert third["term"] > second["term"]
    finally:
        for p in procs:
            p.kill()
