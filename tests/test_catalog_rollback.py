"""Issue 37, attack 1 (catalog rollback and freeze), replayed against real agents with an operator key pinned for
pushed catalogs (``catalog.signers``), in open mode, in token mode (the fakes then hold the token: insiders) and
with an operator key pinned for roles (``agent.operator_keys``; the real nodes certified, the fakes not).

Three agents hold catalog v2 (v1 was pushed before it). Fake members, each a signed member in good standing,
advertise catalog versions near 2^53 (``jobs.catalog_version``) at addresses the test listens on: one serves the
genuinely signed, withdrawn v1 (as anyone can read it at ``GET /catalog/signed``), one serves garbage, one's port
is closed, one trickles its reply a byte at a time (each read quick, the whole never done). A fresh fourth agent
joins: it ends up with v2 and never held v1, and every liar is counted by name and skipped. Then v3 is pushed to
one node: every node holds it within 10 s (measured and printed), despite the liars still advertising far more.
Last, a node restarted with the stale v1 put back as its persisted copy comes back on v3: its floor held.
"""

from __future__ import annotations

import http.server
import sys
import threading
import time

import httpx
import pytest
from agents import AgentProc, free_port, wait_until
from attack import Attacker
from roles import MODES, Trust

from p2pnode.identity import SigningKey
from p2pnode.scheduler import encode_signed, public_key_text, sign_catalog

pytestmark = pytest.mark.slow

LIE = 2**53 - 1
SPREAD_S = 10.0
LOCAL = """[[job]]
name = "local-only"
kind = "selfplay"
config = "c0"
argv = ["sleep", "60"]
[job.resources]
num_gpus = 8
vram_gib = 80
"""


def pushed_toml(v: int) -> str:
    """Catalog text of version ``v``: one template no node here can place (no GPU), so nothing runs."""
    return LOCAL.replace("local-only", f"pushed-v{v}")


class Liar:
    """A small HTTP listener at the address a fake member advertises: ``GET /catalog/signed`` answers ``body``
    (200); anything else 404. Counts the catalog requests it got."""

    def __init__(self, body: bytes, *, trickle: bool = False) -> None:
        liar = self
        self.requests = 0
        self.stop = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path.split("?")[0] == "/catalog/signed":
                    liar.requests += 1
                    if trickle:  # a byte every 0.5 s: each read is quick, the whole reply never ends
                        self.send_response(200)
                        self.send_header("content-length", str(len(body)))
                        self.end_headers()
                        for i in range(len(body)):
                            if liar.stop.wait(0.5):
                                return
                            try:
                                self.wfile.write(body[i:i + 1])
                                self.wfile.flush()
                            except OSError:  # the agent gave up on it, as it should
                                return
                    self._answer(200, body)
                else:
                    self._answer(404, b"{}")

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self._answer(404, b"{}")

            def _answer(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _pushed(agent: AgentProc) -> dict:
    return agent.get("/status")["catalog"]["pushed"]


def _push(agent: AgentProc, doc) -> None:
    r = httpx.post(agent.url + "/catalog", content=encode_signed(doc), timeout=10, trust_env=False)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("mode", MODES)
def test_a_liar_advertising_a_huge_version_neither_rolls_back_a_fresh_node_nor_freezes_the_fleet(tmp_path, mode):
    key = SigningKey.generate()
    (tmp_path / "local.toml").write_text(LOCAL)
    env = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
           "P2PNODE_LOG_LEVEL": "info", "P2PNODE_CATALOG_SIGNERS": public_key_text(key)}
    trust = Trust(mode)
    env |= trust.env()
    ports = [free_port() for _ in range(4)]

    def agent(i: int) -> AgentProc:
        args = ["--no-mdns", "--catalog", str(tmp_path / "local.toml")]
        args += ["--join", f"127.0.0.1:{ports[0]}"] if i else []
        trust.certify(tmp_path / f"n{i}", ("lead",))
        return AgentProc(tmp_path / f"n{i}", ports[i], *args, env=env)

    agents = [agent(i) for i in range(3)]
    v = {n: sign_catalog(key, n, pushed_toml(n)) for n in (1, 2, 3)}
    liars = [Liar(encode_signed(v[1])), Liar(b"\x00garbage, not a catalog"), Liar(encode_signed(v[2]), trickle=True)]
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    fakes = [Attacker(token=trust.token) for _ in range(4)]
    addrs = [liars[0].addr, liars[1].addr, closed, liars[2].addr]
    claims = [LIE, LIE - 1, LIE - 2, LIE - 3]
    stop = threading.Event()
    urls = [a.url for a in agents]

    def heartbeats():  # the fakes stay alive on every agent, advertising their versions
        while not stop.is_set():
            envs = [f.envelope(f.snapshot(addr=addr, jobs={"catalog_version": claim}))
                    for f, addr, claim in zip(fakes, addrs, claims, strict=True)]
            for url in list(urls):
                try:
                    fakes[0].post(url, envs)
                except httpx.HTTPError:
                    pass  # an agent not up yet
            stop.wait(0.3)

    hb = threading.Thread(target=heartbeats, daemon=True)
    try:
        for a in agents:
            a.start()
        for a in agents:
            a.wait_ready()
        wait_until(lambda: all(len(a.get("/members")["members"]) == 3 for a in agents), 30, what="3 members")
        for n in (1, 2):  # v1, then v2 withdraws it
            _push(agents[0], v[n])
            wait_until(lambda n=n: all(_pushed(a)["version"] == n for a in agents), 30, what=f"v{n} everywhere")
        if mode == "open":  # what the liar serves is what anyone can read
            assert httpx.get(agents[0].url + "/catalog/signed", timeout=5, trust_env=False).content == \
                encode_signed(v[2])

        hb.start()
        fake_ids = {f.node_id for f in fakes}

        def fakes_seen(a: AgentProc) -> bool:
            alive = {m["id"] for m in a.get("/members")["members"] if m["state"] == "alive"}
            return fake_ids <= alive

        wait_until(lambda: all(fakes_seen(a) for a in agents), 30, what="the fakes alive everywhere")

        # The members that hold v2 are lied to as well: each liar refused by name, nothing adopted, v2 kept.
        def liars_counted(a: AgentProc) -> dict | None:
            p = _pushed(a)
            seen = {i: p["sources"]["members"].get(f.node_id, {}).get("result") for i, f in enumerate(fakes)}
            return p if seen == {0: "version_mismatch", 1: "malformed", 2: "unreachable", 3: "too_slow"} else None

        wait_until(lambda: all(liars_counted(a) for a in agents), 30, what="every liar refused on the three")
        assert all(_pushed(a)["version"] == 2 for a in agents)

        # A fresh node joins: it ends up with v2 and never held v1.
        fresh = agent(3)
        agents.append(fresh)
        urls.append(fresh.url)
        fresh.start().wait_ready()
        held = []

        def fresh_done() -> dict | None:
            p = _pushed(fresh)
            held.append(p["version"])
            return liars_counted(fresh) if p["version"] == 2 else None

        p = wait_until(fresh_done, 60, interval=0.1, what="the fresh node on v2 with every liar refused")
        assert 1 not in held and p["adopted"] == {"push": 0, "fetch": 1, "restore": 0} and p["floor"] == 2
        assert p["refused"].get("version_mismatch", 0) >= 1
        liar0 = p["sources"]["members"][fakes[0].node_id]
        assert liar0["advertised"] == LIE and liar0["served"] == 1 and liar0["failures"] >= 1
        assert liars[0].requests >= 4  # each of the four nodes asked it and refused its answer
        assert fresh.get("/status")["catalog"]["digest"] == agents[0].get("/status")["catalog"]["digest"]
        metrics = httpx.get(fresh.url + "/metrics", timeout=5, trust_env=False).text
        assert 'p2pnode_catalog_fetch_failed_total{reason="version_mismatch"}' in metrics
        assert 'p2pnode_catalog_fetch_failed_total{reason="too_slow"}' in metrics

        # A later push to one node spreads to every node within 10 s, the liars notwithstanding.
        t0 = time.monotonic()
        _push(agents[1], v[3])
        wait_until(lambda: all(_pushed(a)["version"] == 3 for a in agents), SPREAD_S, interval=0.1,
                   what="v3 on every node")
        spread = time.monotonic() - t0
        print(f"catalog rollback ({mode} mode): v3 pushed to one node reached all 4 in {spread:.2f} s, with 4 "
              f"liars advertising up to 2^53-1; liar v1 requests {liars[0].requests}", file=sys.stderr)

        # The CLI shows who serves what.
        import subprocess

        out = subprocess.run([sys.executable, "-m", "p2pnode", "catalog", "status", "--url", fresh.url],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "version_mismatch" in out.stdout and "unreachable" in out.stdout and str(LIE) in out.stdout

        # A restart keeps the floor: the node comes back on v3 (its floor), whatever stale copy it finds.
        agents[2].stop()
        (tmp_path / "n2" / "catalog.signed.json").write_bytes(encode_signed(v[1]))
        agents[2] = agent(2)
        urls[2] = agents[2].url
        agents[2].start().wait_ready()
        wait_until(lambda: _pushed(agents[2])["version"] == 3, 30, what="the restarted node back on v3")
        p = _pushed(agents[2])
        assert p["floor"] == 3 and p["adopted"]["restore"] == 0 and p["refused"].get("below_floor") == 1
    finally:
        stop.set()
        if hb.is_alive():
            hb.join(5)
        for a in agents:
            a.stop()
        for liar in liars:
            liar.close()
