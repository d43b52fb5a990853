"""A catalog pushed once (issue 25): signed with an operator key, pushed to one of three nodes that pin that key,
it is adopted by all three within 10 s without a restart (they fetch it from each other) and its work runs; a
node that pins no key keeps its own catalog; unsigned, wrongly signed, older and invalid catalogs are refused and
counted; the adopted catalog survives a restart."""

import subprocess
import sys

import httpx
import pytest
from agents import AgentProc, free_port, wait_until

from p2pnode.identity import SigningKey
from p2pnode.scheduler import SignedCatalog, encode_signed, public_key_text, sign_catalog

pytestmark = pytest.mark.slow

LOCAL = """[[job]]
name = "local-only"
kind = "selfplay"
config = "c0"
argv = ["sleep", "60"]
[job.resources]
num_gpus = 8
vram_gib = 80
"""
PUSHED = """[[job]]
name = "pushed-work"
kind = "selfplay"
config = "p1"
argv = ["sleep", "120"]
max_concurrency = 3
[job.resources]
num_gpus = 0
num_cpus = 0.1
memory_gib = 0.1
[job.placement]
strategy = "spread"
"""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1", "P2PNODE_LOG_LEVEL": "info"}


def _pushed(agent: AgentProc) -> dict:
    return agent.get("/status")["catalog"]["pushed"]


def test_a_pushed_catalog_reaches_every_opted_in_node_and_bad_ones_are_refused(tmp_path):
    key = SigningKey.generate()
    local = tmp_path / "local.toml"
    local.write_text(LOCAL)
    ports = [free_port() for _ in range(4)]
    agents = []
    for i, port in enumerate(ports):
        env = dict(ENV, P2PNODE_CATALOG_SIGNERS=public_key_text(key)) if i < 3 else dict(ENV)
        # The leader plans from the catalog it holds: the node that keeps its own file is tagged ephemeral, so it
        # does not lead while the opted-in nodes are alive (else a 1-in-4 draw plans only its own file's work).
        args = ["--no-mdns", "--catalog", str(local)] + (["--join", f"127.0.0.1:{ports[0]}"] if i else [])
        args += ["--tag", "ephemeral"] if i == 3 else []
        agents.append(AgentProc(tmp_path / f"n{i}", port, *args, env=env).start())
    try:
        for a in agents:
            a.wait_ready()
        wait_until(lambda: all(len(a.get("/members")["members"]) == 4 for a in agents), 30, what="4 members")
        own_digest = agents[3].get("/status")["catalog"]["digest"]
        leaders = wait_until(lambda: len({a.status()["election"]["leader"] for a in agents} - {None}) == 1
                             and {a.status()["election"]["leader"] for a in agents}, 30, what="one leader")
        assert leaders != {agents[3].status()["node"]["id"]}  # the node that kept its own file does not lead

        # Refused, and counted: a key the node does not pin, a tampered text, a catalog that does not validate.
        stranger = SigningKey.generate()
        n1 = agents[1].url + "/catalog"
        good = sign_catalog(key, 5, PUSHED)
        tampered = SignedCatalog(5, good.signer, PUSHED + "\n# changed\n", good.sig)
        bad = [(sign_catalog(stranger, 5, PUSHED), 403, "unknown_signer"), (tampered, 403, "bad_signature"),
               (sign_catalog(key, 5, "[[job]]\nname = 1\n"), 422, "invalid_catalog")]
        for doc, status, reason in bad:
            r = httpx.post(n1, content=encode_signed(doc), timeout=5, trust_env=False)
            assert (r.status_code, r.json()["error"]) == (status, reason)
        r = httpx.post(n1, content=b'{"version": "5"}', timeout=5, trust_env=False)
        assert (r.status_code, r.json()["error"]) == (400, "malformed")
        r = httpx.post(agents[3].url + "/catalog", content=encode_signed(sign_catalog(key, 5, PUSHED)), timeout=5,
                       trust_env=False)
        assert (r.status_code, r.json()["error"]) == (403, "not_accepted")  # the node that did not opt in
        assert _pushed(agents[1])["refused"] == {"unknown_signer": 1, "bad_signature": 1, "invalid_catalog": 1,
                                                 "malformed": 1}
        assert _pushed(agents[1])["version"] == 0  # nothing adopted

        # Pushed once, with the CLI, to one node: all three opted-in nodes hold it within 10 s.
        made = tmp_path / "new.key"
        out = subprocess.run([sys.executable, "-m", "p2pnode", "catalog", "keygen", str(made)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.startswith("ed25519:") and made.stat().st_mode & 0o777 == 0o600
        again = subprocess.run([sys.executable, "-m", "p2pnode", "catalog", "keygen", str(made)],
                               capture_output=True, text=True, timeout=30)
        assert again.returncode == 2  # never over an existing key
        keyfile = tmp_path / "operator.key"  # the key the nodes pin
        keyfile.write_bytes(_pem(key))
        pushed_file = tmp_path / "pushed.toml"
        pushed_file.write_text(PUSHED)
        out = subprocess.run([sys.executable, "-m", "p2pnode", "catalog", "push", str(pushed_file), "--key",
                              str(keyfile), "--version", "10", "--url", agents[0].url],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        wait_until(lambda: all(_pushed(a)["version"] == 10 for a in agents[:3]), 10, interval=0.2,
                   what="version 10 on the three opted-in nodes")
        digests = {a.get("/status")["catalog"]["digest"] for a in agents[:3]}
        assert len(digests) == 1 and own_digest not in digests
        assert agents[3].get("/status")["catalog"]["digest"] == own_digest and _pushed(agents[3])["version"] == 0
        assert sum(_pushed(a)["adopted"]["fetch"] for a in agents[1:3]) == 2  # from each other, not pushed twice

        def pushed_work_runs():
            running = [j for a in agents for j in a.get("/jobs")["running"] if j["template"] == "pushed-work"]
            return len(running) >= 1 and running

        wait_until(pushed_work_runs, 30, what="the pushed catalog's work running")

        # Older than what they hold: refused by name; the CLI says so and exits 1.
        out = subprocess.run([sys.executable, "-m", "p2pnode", "catalog", "push", str(pushed_file), "--key",
                              str(keyfile), "--version", "9", "--url", agents[1].url],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 1 and "older" in out.stderr

        # A restart keeps it: the persisted copy is adopted again at start.
        agents[2].stop()
        agents[2] = AgentProc(tmp_path / "n2", ports[2], "--no-mdns", "--catalog", str(local), "--join",
                              f"127.0.0.1:{ports[0]}", env=dict(ENV, P2PNODE_CATALOG_SIGNERS=public_key_text(key)))
        agents[2].start().wait_ready()
        assert _pushed(agents[2])["version"] == 10 and agents[2].get("/status")["catalog"]["digest"] in digests
        status = subprocess.run([sys.executable, "-m", "p2pnode", "catalog", "status", "--url", agents[0].url],
                                capture_output=True, text=True, timeout=30).stdout
        assert "accepts pushed catalogs; holds version 10" in status and status.count("version 10 ") >= 2
    finally:
        for a in agents:
            a.stop()


def _pem(key: SigningKey) -> bytes:
    from p2pnode._ed25519 import pkcs8_pem

    return pkcs8_pem(key)
