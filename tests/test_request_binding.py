"""Issue 22, findings 3, 6 and 7, against real agents over HTTP: a signed request captured on its way to one node
is refused by every other (``wrong_receiver``) and by its own receiver the second time (``replayed``), in token
mode (HMAC, ``v2``) and open mode (node key, ``k2``); with a read token in open mode a member's key reads only its
own plan part and running lists, never the operator views; a header with a non-ASCII digit is a 401 ``malformed``,
never a 500."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from agents import AgentProc, free_port, wait_until
from attack import TINY_CATALOG, Attacker

from p2pnode.identity import load_or_create_identity
from p2pnode.keyring import key_id_of
from p2pnode.reqauth import AUTH_HEADER, sign_request, sign_request_with_key

pytestmark = pytest.mark.slow

TOKEN = "binding-cluster-token-5c1e9a07d2"
READ = "binding-read-token-for-prometheus"
BEARER = {"authorization": f"Bearer {READ}"}
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1", "P2PNODE_READ_TOKEN": READ}
NONCE = "0123456789abcdef0123456789abcdef"


def pair(tmp_path, *args: str, env: dict[str, str]) -> tuple[AgentProc, AgentProc]:
    """Two agents with a read token and a catalog, the second joining the first; each answers ``/healthz``."""
    cat = tmp_path / "catalog.toml"
    cat.write_text(TINY_CATALOG)
    p1 = free_port()
    a = AgentProc(tmp_path / "n1", p1, "--no-mdns", "--catalog", str(cat), *args, env={**ENV, **env}).start()
    b = AgentProc(tmp_path / "n2", free_port(), "--no-mdns", "--catalog", str(cat), "--join", f"127.0.0.1:{p1}",
                  *args, env={**ENV, **env}).start()
    for p in (a, b):
        wait_until(lambda p=p: p.get("/healthz")["status"] == "ok", 30, what=f"{p.url} up")
    return a, b


def view(p: AgentProc, path: str = "/status") -> dict:
    r = httpx.get(p.url + path, headers=BEARER, trust_env=False, timeout=5)
    assert r.status_code == 200, r.text[:300]
    return r.json()


def metric(p: AgentProc, line_start: str) -> str:
    r = httpx.get(p.url + "/metrics", headers=BEARER, trust_env=False, timeout=5)
    return next((ln for ln in r.text.splitlines() if ln.startswith(line_start)), "")


def node_id(p: AgentProc) -> str:
    return p.get("/healthz")["node_id"]


def post(p: AgentProc, path: str, body: bytes, headers: dict) -> httpx.Response:
    return httpx.post(p.url + path, content=body, headers={"content-type": "application/json", **headers},
                      trust_env=False, timeout=5)


def test_token_mode_a_captured_drain_works_only_once_and_only_on_its_receiver(tmp_path):
    """Finding 3: ``p2pnode node drain --deadline 0`` signed for node 1, replayed byte for byte to node 2 within the
    window, drained node 2 as well. Now node 2 refuses it (401 ``wrong_receiver``, counted in ``/status`` and
    ``/metrics``) and stays undrained; node 1 takes it once, then refuses it as ``replayed``. The CLI signs for the
    node it talks to (its id from ``/healthz``), reads included where the read token protects them."""
    a, b = pair(tmp_path, env={"P2PNODE_TRUST": "token", "P2PNODE_CLUSTER_TOKEN": TOKEN})
    try:
        id_a, id_b = node_id(a), node_id(b)
        body = b'{"deadline_s": 0}'
        captured = {AUTH_HEADER: sign_request(TOKEN, key_id_of(TOKEN), "POST", "/operator/drain", body, time.time(),
                                              receiver=id_a)}
        r = post(b, "/operator/drain", body, captured)
        assert r.status_code == 401 and r.json()["reason"] == "wrong_receiver", r.text
        st = view(b)["node"]
        assert st["request_auth"]["refused"]["wrong_receiver"] == 1 and st["request_auth"]["accepted"] == 0
        assert st["operator"]["cordoned"] is False and st["operator"]["draining"] is False
        assert metric(b, 'p2pnode_request_auth_refused_total{reason="wrong_receiver"}').endswith(" 1.0")

        r = post(a, "/operator/drain", body, captured)
        assert r.status_code == 200 and r.json()["draining"] is True, r.text
        r = post(a, "/operator/drain", body, captured)
        assert r.status_code == 401 and r.json()["reason"] == "replayed", r.text
        assert view(a)["node"]["request_auth"]["refused"]["replayed"] == 1
        assert view(b)["node"]["operator"]["draining"] is False

        # the CLI: reads /members on node 1 (signed for node 1), cordons node 2 (signed for node 2)
        wait_until(lambda: len(view(a, "/members")["members"]) == 2, 30, what="node 2 seen by node 1")
        env = {**os.environ, "P2PNODE_CLUSTER_TOKEN": TOKEN, "P2PNODE_DATA_DIR": str(tmp_path / "nowhere")}
        env.pop("P2PNODE_READ_TOKEN", None)
        out = subprocess.run([sys.executable, "-m", "p2pnode", "node", "cordon", id_b[:8], "--url", a.url],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        assert view(b)["node"]["operator"]["cordoned"] is True
        assert view(b)["node"]["request_auth"]["refused"]["wrong_receiver"] == 1  # nothing new refused
    finally:
        a.stop()
        b.stop()


def test_open_mode_a_captured_voter_roll_change_works_only_on_its_receiver(tmp_path):
    """Finding 3 in open mode, on the route that takes a node-key signature (``k2``): a voter roll change signed
    by voter 1's key for node 1, replayed to node 2 (where voter 1 may sign it too), is refused
    (``wrong_receiver``) and node 2's roll is unchanged; node 1 takes it once, then ``replayed``."""
    a, b = pair(tmp_path, "--tag", "voter", env={"P2PNODE_TRUST": "open"})
    try:
        id_a, id_b = node_id(a), node_id(b)
        wait_until(lambda: {id_a, id_b} <= set(view(b)["election"]["roll"]["voters"])
                   and {id_a, id_b} <= set(view(a)["election"]["roll"]["voters"]), 30, what="both on both rolls")
        key_a = load_or_create_identity(a.data_dir)
        fake = Attacker().node_id
        body = json.dumps({"node_id": fake, "action": "admit"}).encode()
        captured = {AUTH_HEADER: sign_request_with_key(key_a, "POST", "/voters", body, time.time(), receiver=id_a)}
        r = post(b, "/voters", body, captured)
        assert r.status_code == 401 and r.json()["reason"] == "wrong_receiver", r.text
        assert fake not in view(b)["election"]["roll"]["voters"]
        assert view(b)["node"]["request_auth"]["refused"]["wrong_receiver"] == 1
        r = post(a, "/voters", body, captured)
        assert r.status_code == 200 and fake in r.json()["voters"], r.text
        r = post(a, "/voters", body, captured)
        assert r.status_code == 401 and r.json()["reason"] == "replayed"
        undo = json.dumps({"node_id": fake, "action": "remove"}).encode()
        r = post(a, "/voters", undo, {AUTH_HEADER: sign_request_with_key(key_a, "POST", "/voters", undo, time.time(),
                                                                         receiver=id_a)})
        assert r.status_code == 200 and fake not in r.json()["voters"]
        # the unbound k1 of an older CLI is refused by default, counted
        old = {AUTH_HEADER: sign_request_with_key(key_a, "POST", "/voters", undo, time.time(), receiver=None)}
        r = post(a, "/voters", undo, old)
        assert r.status_code == 401 and r.json()["reason"] == "unbound"
    finally:
        a.stop()
        b.stop()


def test_open_mode_read_token_a_members_key_reads_only_its_own_peer_routes(tmp_path):
    """Finding 7: with ``agent.read_token`` set in open mode, a stranger that became a member with one self-signed
    snapshot signed ``GET /status`` with its key and read it. Now the operator views take the read token, this
    node's key or a voter's; a member's key only its own plan part and running lists. The agents' own peer reads
    (plan parts) still work."""
    a, b = pair(tmp_path, "--tag", "voter", "--fake-gpus", "H100", env={"P2PNODE_TRUST": "open"})
    try:
        id_a, id_b = node_id(a), node_id(b)
        stranger = Attacker()
        assert stranger.post(a.url, [stranger.envelope()]).status_code == 200
        wait_until(lambda: stranger.node_id in {m["id"] for m in view(a, "/members")["members"]}, 10,
                   what="the stranger is a member of node 1")

        def read(ident, target, to=id_a):
            h = {AUTH_HEADER: sign_request_with_key(ident, "GET", target, b"", time.time(), receiver=to)}
            return httpx.get(a.url + target, headers=h, trust_env=False, timeout=5)

        r = read(stranger.ident, "/status")
        assert r.status_code == 401 and r.json()["reason"] == "unknown_key", r.text
        assert read(stranger.ident, "/metrics").status_code == 401
        assert read(stranger.ident, f"/plan/part?node={id_b}").status_code == 401  # another node's part
        assert read(stranger.ident, f"/plan/part?node={stranger.node_id}&node={id_b}").status_code == 401
        assert read(stranger.ident, f"/plan/part?node={stranger.node_id}").status_code != 401  # its own
        assert read(stranger.ident, "/jobs/running").status_code != 401
        # this node's own key and a voter's read the views; a request for node 2 is refused here
        assert read(load_or_create_identity(a.data_dir), "/status").status_code == 200
        wait_until(lambda: id_b in view(a)["election"]["roll"]["voters"], 30, what="node 2 on node 1's roll")
        key_b = load_or_create_identity(b.data_dir)
        assert read(key_b, "/status").status_code == 200
        r = read(key_b, "/status", to=id_b)
        assert r.status_code == 401 and r.json()["reason"] == "wrong_receiver"
        # the CLI run as a node's agent user signs reads with that node's key, for the node it reads
        for data_dir, code in ((a.data_dir, 0), (b.data_dir, 0), (tmp_path / "no-key", 2)):
            env = {**os.environ, "P2PNODE_DATA_DIR": str(data_dir)}
            env.pop("P2PNODE_READ_TOKEN", None)
            env.pop("P2PNODE_CLUSTER_TOKEN", None)
            out = subprocess.run([sys.executable, "-m", "p2pnode", "jobs", "--json", "--url", a.url],
                                 capture_output=True, text=True, timeout=60, env=env)
            assert out.returncode == code, (data_dir, out.stdout[-300:], out.stderr[-300:])
        # the agents' own signed peer reads: the follower fetches its plan parts from the leader
        def fetches() -> dict:
            st = view(a)
            follower = b if st["election"]["leader"] == id_a else a
            return view(follower, "/jobs")["fetches"]

        wait_until(lambda: fetches()["fetched"] >= 1, 30, what="a plan part fetched with the node's key")
        assert not any(k.startswith("http_4") for k in fetches()["failed"]), fetches()
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("mode", ["token", "open"])
def test_a_non_ascii_digit_in_the_auth_header_is_a_401_never_a_500(tmp_path, mode):
    """Finding 6: ``x-p2pnode-auth: v1 <kid> ² <nonce> <mac>`` (``str.isdigit()`` accepts ``²``, ``int()`` raises)
    answered 500 on every signed route and on reads with a read token. Now that and every other bad shape (the
    bound ``v2``/``k2`` forms, 400 digits) is 401 ``malformed``, counted."""
    env = {"P2PNODE_TRUST": mode, "P2PNODE_CLUSTER_TOKEN": TOKEN if mode == "token" else ""}
    cat = tmp_path / "catalog.toml"
    cat.write_text(TINY_CATALOG)
    p = AgentProc(tmp_path / "n", free_port(), "--no-mdns", "--catalog", str(cat), env={**ENV, **env}).start()
    try:
        wait_until(lambda: p.get("/healthz")["status"] == "ok", 30, what="agent up")
        me = node_id(p)
        kid = key_id_of(TOKEN)
        scheme, mac = ("v2", "ab" * 32) if mode == "token" else ("k2", "cd" * 64)
        headers = [f"{scheme[0]}1 {kid} \xb2 {NONCE} {mac}",  # the unbound form: a 500 before
                   f"{scheme} {kid} \xb2 {NONCE} {mac}", f"{scheme} {kid} {me} \xb2 {NONCE} {mac}",
                   f"{scheme} {kid} {me} {'9' * 400} {NONCE} {mac}", f"{scheme} {kid} {me} \xb2\xb2 {NONCE} {mac}"]
        routes = [("GET", "/status"), ("GET", "/plan/part?node=" + me), ("POST", "/voters")]
        if mode == "token":
            routes += [("POST", "/operator/cordon"), ("POST", "/signals")]
        n = 0
        for value in headers:
            raw = value.encode("latin-1")  # the raw byte 0xb2 on the wire
            for method, path in routes:
                r = httpx.request(method, p.url + path, content=b'{"cordon": true}' if method == "POST" else None,
                                  headers={AUTH_HEADER: raw}, trust_env=False, timeout=5)
                assert r.status_code == 401 and r.json()["reason"] == "malformed", (value, path, r.text[:300])
                n += 1
        st = view(p)["node"]
        assert st["request_auth"]["refused"]["malformed"] == n and st["request_auth"]["accepted"] == 0
        assert st["operator"]["cordoned"] is False
        # a bearer value that is not ASCII is refused too, never a 500
        r = httpx.get(p.url + "/status", headers={"authorization": b"Bearer \xb2\xff"}, trust_env=False, timeout=5)
        assert r.status_code == 401 and r.json()["reason"] == "bad_read_token"
        assert "Traceback" not in p.log.read_text()
    finally:
        p.stop()


def test_unbound_requests_only_with_the_rolling_upgrade_setting_each_counted_and_logged(tmp_path):
    """``agent.accept_unbound_requests`` (env ``P2PNODE_ACCEPT_UNBOUND_REQUESTS``) lets the ``v1`` of an older CLI
    through during a rolling upgrade, each one counted and logged; a bound request still must name this node."""
    cat = tmp_path / "catalog.toml"
    cat.write_text(TINY_CATALOG)
    env = {**ENV, "P2PNODE_TRUST": "token", "P2PNODE_CLUSTER_TOKEN": TOKEN, "P2PNODE_ACCEPT_UNBOUND_REQUESTS": "1"}
    p = AgentProc(tmp_path / "n", free_port(), "--no-mdns", "--catalog", str(cat), env=env).start()
    try:
        wait_until(lambda: p.get("/healthz")["status"] == "ok", 30, what="agent up")
        body = b'{"cordon": true}'
        old = {AUTH_HEADER: sign_request(TOKEN, key_id_of(TOKEN), "POST", "/operator/cordon", body, time.time(),
                                         receiver=None)}
        r = post(p, "/operator/cordon", body, old)
        assert r.status_code == 200 and r.json()["cordoned"] is True, r.text
        assert post(p, "/operator/cordon", body, old).json()["reason"] == "replayed"
        elsewhere = {AUTH_HEADER: sign_request(TOKEN, key_id_of(TOKEN), "POST", "/operator/cordon", body,
                                               time.time(), receiver="someothernode")}
        assert post(p, "/operator/cordon", body, elsewhere).json()["reason"] == "wrong_receiver"
        auth = view(p)["node"]["request_auth"]
        assert auth["accept_unbound"] is True and auth["unbound_accepted"] == 1 and auth["accepted"] == 1
        assert metric(p, "p2pnode_request_auth_unbound_total").endswith(" 1.0")
        assert "accepted an unbound v1 request" in p.log.read_text()
    finally:
        p.stop()
