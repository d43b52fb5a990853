"""Issue 22, findings 1, 2 and 6, against real agents over HTTP: hostile member data and hostile request values
never take a node down, never silence its heartbeat, never stop it from restarting, never answer 5xx.

1. A member reporting running jobs with ids ``"<term>-²"`` crashed every leader in turn (``str.isdigit`` accepts
   ``²``, ``int`` raised in the planner). Now the snapshot decoder refuses such ids (``bad_type``) and planning
   carries on.
2. ``POST /jobs/run`` with a tag holding a newline (or a ``str`` parameter holding one) was accepted; the node's own
   snapshot then failed its own decoder, it stopped heartbeating, and ``operator.json`` stopped it from restarting.
6. ``/jobs/logs?offset=²``, 400-digit integers in ``/jobs/run`` parameters, ``/signals`` values and drain's
   ``deadline_s`` answered 500.
"""

import json
import time

import httpx
import pytest
from agents import AgentProc, free_port, wait_until
from attack import Attacker

from p2pnode.keyring import key_id_of
from p2pnode.reqauth import AUTH_HEADER, sign_request

pytestmark = pytest.mark.slow

TOKEN = "fail-closed-cluster-token-0123456789"
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100", "P2PNODE_MAX_SPAWNS_PER_MINUTE": "600"}
CATALOG = """
[[job]]
name = "work"
kind = "selfplay"
config = "c"
max_concurrency = 2
argv = ["sleep", "600"]
[job.resources]
num_gpus = 0.5
vram_gib = 2
num_cpus = 0.1

[[job]]
name = "once"
kind = "evaluation"
config = "c"
max_concurrency = 0
argv = ["sleep", "{word}"]
[job.params.word]
type = "str"
default = "1"
[job.resources]
num_cpus = 0.1
"""


def _agent(tmp_path, name, *extra, env=None):
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    return AgentProc(tmp_path / name, free_port(), "--no-mdns", "--fake-gpus", "H100", "--catalog", str(cat),
                     *extra, env={**ENV, **(env or {})})


def _own_version(agent: AgentProc) -> int:
    return agent.status()["snapshot"]["version"]


def _heartbeats(agent: AgentProc, timeout: float = 10.0) -> None:
    """The node's own snapshot keeps being published (its version rises) and it decodes (it lists its sections)."""
    v0 = _own_version(agent)
    wait_until(lambda: _own_version(agent) > v0 + 1, timeout, what="the heartbeat")
    assert "membership" in agent.status()["snapshot"]


def test_hostile_job_ids_in_a_members_snapshot_do_not_crash_the_leader(tmp_path):
    a = _agent(tmp_path, "a").start()
    try:
        a.wait_ready()
        me = a.get("/healthz")["node_id"]
        wait_until(lambda: a.status()["election"]["leader"] == me, 20, what="a leader")
        term = a.status()["election"]["term"]

        def seq():
            return (a.get("/plan")["ref"] or {}).get("seq", -1)

        wait_until(lambda: seq() >= 0, 20, what="a first plan")
        att = Attacker()
        for t in range(term, term + 3):  # the current term and the next ones
            snap = att.snapshot(jobs={"running": [{"job_id": f"{t}-\u00b2", "template": "work", "term": t}]})
            att.post(a.url, [att.envelope(snap)])
        wait_until(lambda: a.status()["gossip"]["rejected"].get("bad_type", 0) >= 3, 10, what="the refusals")
        seq0 = seq()
        wait_until(lambda: seq() >= seq0 + 2, 20, what="two more plans")
        assert a.proc.poll() is None, a.log.read_text()[-3000:]
        assert att.node_id not in {m["id"] for m in a.get("/members")["members"]}  # never a member
        _heartbeats(a)
    finally:
        a.stop()


@pytest.mark.parametrize("mode", ["open", "token"])
def test_hostile_request_values_get_4xx_and_the_node_keeps_heartbeating_and_restarts(tmp_path, mode):
    env = {"P2PNODE_TRUST": "token", "P2PNODE_CLUSTER_TOKEN": TOKEN} if mode == "token" else {}
    a = _agent(tmp_path, "a", env=env).start()
    try:
        a.wait_ready()
        node_id = a.get("/healthz")["node_id"]
        client = httpx.Client(base_url=a.url, trust_env=False, timeout=10.0)

        def post(path, body):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers = {"content-type": "application/json"}
            if mode == "token":
                headers[AUTH_HEADER] = sign_request(TOKEN, key_id_of(TOKEN), "POST", path, data, time.time(),
                                                    receiver=node_id)
            return client.post(path, content=data, headers=headers)

        before = a.get("/jobs")
        before_op = a.status()["node"]["operator"]
        huge = b"1" + b"0" * 400
        cases = [
            (post("/jobs/run", {"template": "once", "tag": "x\ny"}), 400),  # finding 2: a control character
            (post("/jobs/run", {"template": "once", "params": {"word": "a\nb"}}), 400),
            (post("/jobs/run", b'{"template": "once", "params": {"word": ' + huge + b"}}"), 400),  # finding 6
            (post("/operator/drain", b'{"deadline_s": ' + huge + b"}"), 400),
            (post("/signals", b'{"config": "c", "game_count": ' + huge + b"}"), 422),
            (post("/signals", b'{"config": "c", "quality": NaN}'), 400),
            (client.get("/jobs/logs", params={"job_id": "1-1", "offset": "\u00b2"}), 400),
            (client.get("/jobs/logs", params={"job_id": "1-1", "offset": "9" * 4300}), 400),
            (client.get("/plan", params={"node": "\u00b2"}), 400),
        ]
        for i, (r, status) in enumerate(cases):
            assert r.status_code == status, (i, r.status_code, r.text)
        after = a.get("/jobs")
        assert after.get("operator") == before.get("operator") and after.get("runs") == before.get("runs")
        assert a.status()["node"]["operator"] == before_op  # neither cordoned nor draining, no run kept
        _heartbeats(a)
        assert "Traceback" not in a.log.read_text()
        a.stop()
        a.start()  # finding 2: operator.json must not stop the agent from starting
        a.wait_ready()
        _heartbeats(a)
        assert "Traceback" not in a.log.read_text()
    finally:
        a.stop()
