"""Issue 37, item 1 against real agents: roles the operator grants.

* Attack 2 replayed: a running cluster of three voters with a leader; a fresh agent that was given no peer
  (no ``--join``, no peers file) learns its members only from gossip pushed to it, mixed with ten fake members
  tagged ``voter`` that vote in a term of their own (and, where keys are pinned, publish a closed roll of
  themselves). This stands in for mDNS (``tests/test_netns_mdns.py`` runs real mDNS in namespaces, too slowly to
  replay the attack twice): what matters to the node is that no peer was operator-given, and that its first
  members arrive unverified as voters. It never holds a fake voter on its roll, in open mode (where it adopts no
  found roll: it follows the real leader as a non-voter, or none while fakes publish a closed roll of their own)
  and with an operator key pinned (where it adopts the certified voters' roll).
* A certified voter and durable node whose certificate expires loses both roles (its ``/status`` says
  ``expired``, its peers stop counting it as a voter and as durable) and takes them back when a renewed
  certificate is installed with ``p2pnode node certify --install``, without a restart.
"""

from __future__ import annotations

import sys
import threading
import time

import httpx
import pytest
from agents import AgentProc, free_port, wait_until
from attack import Attacker

from p2pnode._ed25519 import pkcs8_pem
from p2pnode.certs import CERT_FILE, encode_cert, operator_key_text, sign_cert
from p2pnode.identity import SigningKey, load_or_create_identity

pytestmark = pytest.mark.slow

ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_ELECTION_VOTER_BOOTSTRAP_S": "2"}
GPUS = ["H100", "A100", "RTX 4090"]


class Cluster:
    """Three voters (the H100 leads); with ``key`` every node pins it and carries a certificate it signed."""

    def __init__(self, root, key: SigningKey | None) -> None:
        self.root = root
        self.key = key
        self.env = dict(ENV, **({"P2PNODE_OPERATOR_KEYS": operator_key_text(key)} if key else {}))
        self.ports = [free_port() for _ in GPUS]
        self.procs = [self.agent(i, gpu, join=i > 0) for i, gpu in enumerate(GPUS)]

    def agent(self, i: int, gpu: str, *, join: bool, roles=("voter", "lead"), valid_s: int = 3600,
              tags=("voter",)) -> AgentProc:
        data = self.root / f"n{i}"
        data.mkdir(parents=True, exist_ok=True)
        node_id = load_or_create_identity(data).node_id  # the key the agent will use: certify it before start
        if self.key is not None and roles:
            now = int(time.time())
            cert = sign_cert(self.key, node_id, list(roles), issued_at=now, expires_at=now + valid_s)
            (data / CERT_FILE).write_bytes(encode_cert(cert))
        args = ["--no-mdns", "--fake-gpus", gpu]
        for t in tags:
            args += ["--tag", t]
        if join:
            args += ["--join", f"127.0.0.1:{self.ports[0]}"]
        port = self.ports[i] if i < len(self.ports) else free_port()
        return AgentProc(data, port, *args, env=self.env)

    def start(self) -> Cluster:
        for p in self.procs:
            p.start()
        for p in self.procs:
            p.wait_ready()
        self.ids = [p.status()["node"]["id"] for p in self.procs]

        def settled():
            views = [p.status()["election"] for p in self.procs]
            return (all(v["leader"] == self.ids[0] and v["term"] == views[0]["term"] and v["voters"] == 3
                        for v in views) and views[0]["term"])

        self.term = wait_until(settled, 60, what="the H100 node elected by three voters everywhere")

        def rolls_closed():
            rolls = [p.status()["snapshot"].get("roll") or {} for p in self.procs]
            return all(r.get("closed") and set(r["voters"]) == set(self.ids) for r in rolls)

        wait_until(rolls_closed, 30, what="the voter rolls closed")
        return self

    def stop(self) -> None:
        for p in self.procs:
            p.kill()


@pytest.mark.parametrize("variant", ["open", "open-fake-roll", "operator-key"])
def test_a_fresh_node_that_was_given_no_peer_never_holds_a_fake_voter(tmp_path, variant):
    """``open``: the fakes vote in a term of their own; the node adopts no found roll and follows, as a non-voter,
    the real leader (the one closed roll a quorum of its voters publishes). ``open-fake-roll``: the fakes also
    publish a closed roll of themselves (ten publishers against three): the node cannot tell which roll is real,
    follows no leader and holds no voter; restarted with one ``--join`` it adopts the real roll. ``operator-key``:
    the fakes' voter tags are not certified; the node adopts the roll of the certified voters."""
    pinned = variant == "operator-key"
    key = SigningKey.generate() if pinned else None
    cluster = Cluster(tmp_path, key)
    fakes = [Attacker() for _ in range(10)]
    stop = threading.Event()
    try:
        cluster.start()
        new = cluster.agent(3, "RTX 3090", join=False, roles=())  # no certificate, no --join, no peers file
        new.start()
        new.wait_ready()
        assert new.status()["election"]["roll"]["adoption"] == "watching"
        new_id = new.status()["node"]["id"]
        fake_ids = {f.node_id for f in fakes}
        fake_roll = {"voters": sorted(fake_ids), "removed": [], "created_at": time.time() - 300, "closed": True}
        extra = {"roll": fake_roll} if variant != "open" else {}

        def pushes():  # the fakes keep beating at the new node, the cluster's snapshots with them
            while not stop.is_set():
                envs = [f.envelope(f.snapshot(tags=["voter"], vote={"candidate": fakes[0].node_id, "term": 1},
                                              **extra)) for f in fakes]
                try:
                    fakes[0].post(new.url, envs)
                    fakes[0].post(new.url, fakes[1].pull(cluster.procs[0].url))
                except httpx.HTTPError:
                    pass
                stop.wait(0.2)

        hb = threading.Thread(target=pushes, daemon=True)
        hb.start()
        seen_rolls: list[set[str]] = []

        def election():
            s = new.status()["election"]
            seen_rolls.append(set(s["roll"]["voters"]))
            return s

        def fake_versions() -> int:
            held = {m["id"]: m["version"] for m in new.get("/members")["members"]}
            return min((held.get(f, 0) for f in fake_ids), default=0)

        t0 = time.monotonic()
        if variant == "open-fake-roll":
            s = wait_until(lambda: (e := election())["roll"]["adoption"] == "following" and len(
                e["roll"]["conflict"]) == 2 and e, 60, what="the fresh node sees two vouched rolls and follows none")
        else:
            s = wait_until(lambda: (e := election())["leader"] == cluster.ids[0] and e["term"] == cluster.term
                           and e, 60, what="the fresh node follows the real leader")
        print(f"\n[role certs, {variant}] fresh node settled ({s['roll']['adoption']}, leader {s['leader']}) "
              f"{time.monotonic() - t0:.1f} s after the pushes began", file=sys.stderr)
        assert fake_ids <= {m["id"] for m in new.get("/members")["members"]}  # the fakes are members there
        v0 = fake_versions()
        s = wait_until(lambda: fake_versions() >= v0 + 5 and election(), 60,
                       what="five more heartbeats of every fake")  # they stay off its roll as they go on beating
        assert all(not (r & fake_ids) for r in seen_rolls), "a fake voter was on the fresh node's roll"
        assert new_id not in s["roll"]["voters"]
        if variant == "open":
            assert s["roll"]["adoption"] == "following" and s["roll"]["voters"] == []
            assert sorted(s["roll"]["following"]) == sorted(cluster.ids) and s["voters"] == 3
            assert s["leader"] == cluster.ids[0] and new.status()["snapshot"].get("roll") is None
        elif variant == "open-fake-roll":
            assert s["roll"]["adoption"] == "following" and s["roll"]["voters"] == [] and s["leader"] is None
            assert sorted(map(sorted, s["roll"]["conflict"].values())) == sorted([sorted(fake_ids),
                                                                                   sorted(cluster.ids)])
        else:
            assert set(s["roll"]["voters"]) == set(cluster.ids) and s["roll"]["adoption"] == "adopted"
            assert s["leader"] == cluster.ids[0] and s["voters"] == 3
            members = {m["id"]: m for m in new.get("/members")["members"]}
            assert all("voter" not in members[f]["tags"] and members[f]["roles_reason"] == "no_cert"
                       for f in fake_ids)
            assert all(members[n]["roles"] == ["voter", "lead"] for n in cluster.ids)
            metrics = httpx.get(new.url + "/metrics", timeout=5, trust_env=False).text
            assert 'p2pnode_role_certs_refused_total{reason="no_cert"} 11.0' in metrics  # fakes and itself
        for p in cluster.procs:  # the cluster never moved either
            e = p.status()["election"]
            assert e["leader"] == cluster.ids[0] and not (set(e["roll"]["voters"]) & fake_ids)
        if variant == "open-fake-roll":  # the operator gives it one --join: it adopts the real roll
            new.kill()
            new = cluster.agent(3, "RTX 3090", join=True, roles=())
            new.start()
            new.wait_ready()
            s = wait_until(lambda: (e := election())["leader"] == cluster.ids[0] and e, 60,
                           what="the node restarted with --join follows the real leader")
            assert s["roll"]["adoption"] == "adopted" and set(s["roll"]["voters"]) == set(cluster.ids)
            assert all(not (r & fake_ids) for r in seen_rolls)
    finally:
        stop.set()
        cluster.stop()
        for p in cluster.procs[3:]:
            p.kill()
        if "new" in locals():
            new.kill()


def test_an_expired_certificate_loses_the_role_and_a_renewed_one_restores_it_without_a_restart(tmp_path):
    from p2pnode.cli import main

    key = SigningKey.generate()
    keyfile = tmp_path / "operator.key"
    keyfile.write_bytes(pkcs8_pem(key))
    cluster = Cluster(tmp_path, key)
    cluster.procs[2] = cluster.agent(2, GPUS[2], join=True, roles=("voter", "durable"), tags=("voter", "durable"))
    try:
        cluster.start()
        c, c_id = cluster.procs[2], cluster.ids[2]
        pid = c.proc.pid

        def counted_by_peers(voters: int, durable: bool):
            for p in cluster.procs[:2]:
                m = {x["id"]: x for x in p.get("/members")["members"]}[c_id]
                if p.status()["election"]["voters"] != voters or ("durable" in m["tags"]) != durable:
                    return False
            return True

        wait_until(lambda: counted_by_peers(3, True), 20, what="peers count the certified durable voter")
        roles = c.status()["node"]["roles"]
        assert roles["pinned"] and roles["roles"] == ["voter", "durable"] and roles["refused"] == ["lead"]

        # A certificate valid for a few seconds, installed while the node runs (the CLI, as an operator would).
        assert main(["node", "certify", c_id, "--role", "voter", "--role", "durable", "--key", str(keyfile),
                     "--valid-for", "8s", "--install", "--data-dir", str(c.data_dir)]) == 0
        wait_until(lambda: c.status()["node"]["roles"]["cert"]["expires_in_s"] <= 8.5, 10,
                   what="the short certificate loaded")
        roles = wait_until(lambda: (r := c.status()["node"]["roles"])["reason"] == "expired" and r, 30,
                           what="the node's own /status says its certificate expired")
        t0 = time.monotonic()
        assert roles["roles"] == [] and set(roles["refused"]) == {"voter", "durable", "lead"}
        wait_until(lambda: counted_by_peers(2, False), 20, what="peers stop counting it as voter and durable")
        print(f"\n[role certs] expiry: role gone everywhere {time.monotonic() - t0:.1f} s after /status showed it",
              file=sys.stderr)
        for p in cluster.procs[:2]:
            m = {x["id"]: x for x in p.get("/members")["members"]}[c_id]
            assert m["roles_reason"] == "expired" and "voter" not in m["tags"]
            assert p.status()["election"]["leader"] == cluster.ids[0]  # two of three voters still lead

        assert main(["node", "certify", c_id, "--role", "voter", "--role", "durable", "--key", str(keyfile),
                     "--valid-for", "1h", "--install", "--data-dir", str(c.data_dir)]) == 0
        wait_until(lambda: c.status()["node"]["roles"]["roles"] == ["voter", "durable"], 20,
                   what="the renewed certificate counted on the node itself")
        wait_until(lambda: counted_by_peers(3, True), 20, what="peers count it again")
        assert c.proc.pid == pid and c.proc.poll() is None  # no restart
        assert c.status()["node"]["roles"]["reloads"] >= 3
    finally:
        cluster.stop()
