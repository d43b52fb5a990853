"""Issue 37 item 6, "dial only where allowed": a member's advertised address is a claim. Pure tests of the policy
(:func:`p2pnode.gossip.addr_refusal`), the peer book and the peers file, then real agents in network namespaces
(``agent.allow_private_advertise`` off) that fake members point at listeners on loopback, link-local and cloud
metadata addresses: no connection reaches any of them, in open and in token mode."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import httpx
import pytest
from agents import AgentProc, wait_until
from attack import Attacker
from netns import NetnsLab, require_netns
from roles import MODES, Trust

from p2pnode.config import load_config
from p2pnode.discovery import load_peer_entries, load_peers, save_peers
from p2pnode.gossip import DialPolicy, PeerBook, addr_refusal

REFUSED = [
    ("127.0.0.1:8770", "loopback"),
    ("127.9.9.9:80", "loopback"),
    ("[::1]:8770", "loopback"),
    ("[::ffff:127.0.0.1]:8770", "loopback"),
    ("[::ffff:7f00:1]:8770", "loopback"),
    ("169.254.169.254:80", "metadata"),
    ("[::ffff:169.254.169.254]:80", "metadata"),
    ("[fd00:ec2::254]:80", "metadata"),
    ("100.100.100.200:80", "metadata"),
    ("168.63.129.16:80", "metadata"),
    ("169.254.1.2:8770", "link_local"),
    ("[fe80::1]:8770", "link_local"),
    ("224.0.0.251:5353", "multicast"),
    ("[ff02::1]:8770", "multicast"),
    ("0.0.0.0:8770", "unspecified"),
    ("0.1.2.3:8770", "unspecified"),
    ("[::]:8770", "unspecified"),
    ("240.0.0.1:8770", "reserved"),
    ("255.255.255.255:8770", "reserved"),
    ("[64:ff9b::a9fe:a9fe]:80", "reserved"),
    ("localhost:22", "name"),
    ("metadata.google.internal:80", "name"),
    ("node-b.lan:8770", "name"),
    ("10.0.0.1:0", "port"),
    ("10.0.0.1:65536", "port"),
    ("10.0.0.1:+80", "port"),
    ("10.0.0.1", "malformed"),
    ("::1:8770", "malformed"),
    ("[fe80::1%eth0]:8770", "malformed"),
    ("[node]:8770", "malformed"),
]
ALLOWED = ["10.0.0.1:8770", "192.168.1.20:8770", "172.16.5.4:1", "100.64.3.2:8770", "203.0.113.7:8770",
           "8.8.8.8:443", "[fd12:3456::1]:8770", "[2001:db8::1]:8770", "[::ffff:10.0.0.1]:8770"]


@pytest.mark.parametrize(("addr", "reason"), REFUSED)
def test_refused_addresses_have_a_reason(addr, reason):
    assert addr_refusal(addr, allow_private=False) == reason
    lab = addr_refusal(addr, allow_private=True)
    assert lab == (None if reason == "loopback" else reason)  # the lab setting allows loopback only


@pytest.mark.parametrize("addr", ALLOWED)
def test_private_and_public_literals_are_allowed(addr):
    assert addr_refusal(addr, allow_private=False) is None


def test_the_policy_counts_each_refused_address_once_per_reason():
    p = DialPolicy()
    for _ in range(3):
        assert p.dialable("127.0.0.1:80") == ""
        assert p.dialable("localhost:22") == ""
        assert p.dialable("10.0.0.1:8770") == "10.0.0.1:8770"
    assert p.refusal("169.254.169.254:80") == "metadata"
    assert {k: v for k, v in p.refused.items() if v} == {"loopback": 1, "name": 1, "metadata": 1}


def test_the_peer_book_takes_the_operators_addresses_and_judges_members_claims():
    book = PeerBook("me", policy=DialPolicy())
    assert book.add("localhost:8770", "join") is not None  # the operator's word: names and loopback allowed
    assert book.add("127.0.0.1:8771", "peers-file") is not None
    assert book.add("127.0.0.1:22", "gossip", node_id="fake", advertised=True) is None
    assert book.add("169.254.169.254:80", "gossip", node_id="fake2") is None
    assert book.add("127.0.0.2:80", "peers-file", learned=True) is None  # the agent wrote it from a claim
    assert book.add_candidate("127.0.0.3:8770", "mdns", 0.0) is None
    assert book.add_candidate("metadata.google.internal:80", "mdns", 0.0) is None
    assert book.add("10.0.0.7:8770", "gossip", node_id="real") is not None
    assert book.add_candidate("10.0.0.8:8770", "mdns", 0.0) is not None
    assert sorted(p.addr for p in book.all()) == ["10.0.0.7:8770", "127.0.0.1:8771", "localhost:8770"]
    assert {p.addr: p.learned for p in book.all()} == {"10.0.0.7:8770": True, "127.0.0.1:8771": False,
                                                       "localhost:8770": False}
    assert {k: v for k, v in book.policy.refused.items() if v} == {"loopback": 3, "metadata": 1, "name": 1}
    chosen = set()
    for seed in range(50):
        chosen |= set(book.choose(3, 0.0, random.Random(seed)))
    assert chosen == {"10.0.0.7:8770", "127.0.0.1:8771", "localhost:8770", "10.0.0.8:8770"}


def test_the_peers_file_remembers_which_addresses_were_learned(tmp_path):
    save_peers(tmp_path, [("10.0.0.1:8770", "aaaa"), ("127.0.0.1:9", "bbbb"), ("localhost:8770", None)],
               frozenset({"127.0.0.1:9"}))
    assert load_peer_entries(tmp_path) == [("10.0.0.1:8770", "aaaa", False), ("127.0.0.1:9", "bbbb", True),
                                           ("localhost:8770", None, False)]
    assert load_peers(tmp_path) == [("10.0.0.1:8770", "aaaa"), ("127.0.0.1:9", "bbbb"), ("localhost:8770", None)]
    doc = json.loads((tmp_path / "peers.json").read_text())
    assert [p.get("learned", False) for p in doc["peers"]] == [False, True, False]


def test_the_setting_is_off_by_default_and_read_from_the_environment():
    assert load_config(None, env={}).agent.allow_private_advertise is False
    assert load_config(None, env={"P2PNODE_ALLOW_PRIVATE_ADVERTISE": "1"}).agent.allow_private_advertise is True


# -- real agents ----------------------------------------------------------------------------------------------------

DATA_PORT = 8771
LISTEN_HOSTS = ["127.0.0.1", "127.0.0.2", "169.254.169.254", "100.100.100.200", "169.254.10.10"]
"""Addresses every namespace gets on its loopback device, each with a listener on port 80 and the data port."""
FAKE_ADDRS = {
    "127.0.0.1:80": "loopback",
    "127.0.0.2:80": "loopback",
    "[::ffff:127.0.0.1]:80": "loopback",
    "169.254.169.254:80": "metadata",
    "100.100.100.200:80": "metadata",
    "169.254.10.10:80": "link_local",
    "localhost:22": "name",
    "metadata.google.internal:80": "name",
    "0.0.0.0:80": "unspecified",
    "224.0.0.1:80": "multicast",
}
EXPECTED = {}
for _reason in FAKE_ADDRS.values():
    EXPECTED[_reason] = EXPECTED.get(_reason, 0) + 1

LISTENER = r"""
import selectors, socket, sys
binds = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[2:])]
sel = selectors.DefaultSelector()
for b in binds:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(b); s.listen(64)
    sel.register(s, selectors.EVENT_READ, b)
out = open(sys.argv[1], "a", buffering=1)
out.write("ready\n")
while True:
    for key, _ in sel.select():
        conn, peer = key.fileobj.accept()
        out.write(f"{key.data[0]}:{key.data[1]} from {peer[0]}\n")
        conn.close()
"""


def _start_listeners(lab: NetnsLab, i: int, log) -> subprocess.Popen:
    for h in LISTEN_HOSTS[1:]:
        lab.sh(lab.names[i], "ip", "addr", "add", f"{h}/32", "dev", "lo")
    binds = [f"{h}:{p}" for h in LISTEN_HOSTS for p in (80, DATA_PORT)] + ["127.0.0.1:22"]
    proc = subprocess.Popen([*lab.prefix_for(i), sys.executable, "-c", LISTENER, str(log), *binds])
    wait_until(lambda: log.exists() and "ready" in log.read_text(), 30, what=f"listeners in {lab.names[i]}")
    return proc


def _refused(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/status", timeout=5, trust_env=False).json()["gossip"]["addr_refused"]


def _rounds(url: str) -> float:
    """Gossip rounds the agent ran (``p2pnode_gossip_rounds_total`` on ``/metrics``)."""
    text = httpx.get(f"{url}/metrics", timeout=5, trust_env=False).text
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("p2pnode_gossip_rounds_total "))


def _sync(url: str) -> dict:
    return httpx.get(f"{url}/sync/status", timeout=5, trust_env=False).json()


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_no_connection_reaches_a_refused_advertised_address(tmp_path, mode):
    """Two real agents (an ephemeral one with a file to push, a durable one) on 10.x namespace addresses; ten fake
    members, tagged durable with a data port, advertise loopback, metadata, link-local, name, unspecified and
    multicast addresses, each with a real listener behind it in both namespaces. Both agents count every refused
    address by reason, keep the fakes as members (spread from the one they were posted to), push the file to the
    real durable node only, gossip on, and no listener ever sees a connection."""
    require_netns()
    env = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SYNC_INTERVAL_S": "1", "P2PNODE_LOG_LEVEL": "info",
           "P2PNODE_SYNC_DATA_PORT": str(DATA_PORT), "P2PNODE_ALLOW_PRIVATE_ADVERTISE": "0"}
    trust = Trust(mode)  # operator-key: the durable node certified, the fakes' durable claims not
    env.update(trust.env())
    lab = NetnsLab(2, net=37, host_link=True)
    procs: list[AgentProc] = []
    listeners: list[subprocess.Popen] = []
    logs = [tmp_path / f"listen{i}.log" for i in range(2)]
    try:
        listeners = [_start_listeners(lab, i, logs[i]) for i in range(2)]
        for i, tag in enumerate(["ephemeral", "durable"]):
            args = ["--no-mdns", "--tag", tag] + (["--join", f"{lab.addrs[1]}:8770"] if i == 0 else [])
            trust.certify(tmp_path / f"n{i}", (tag,) if tag == "durable" else ())
            procs.append(AgentProc(tmp_path / f"n{i}", 8770, *args, bind=lab.addrs[i], prefix=lab.prefix_for(i),
                                   env=env).start())
        urls = [f"http://{a}:8770" for a in lab.addrs]
        ids = [p.wait_ready()["node"]["id"] for p in procs]
        wait_until(lambda: _sync(urls[0])["durable_members"] == 1, 60, what="the durable node known")
        data = tmp_path / "n0" / "data" / "cfg"
        data.mkdir(parents=True)
        (data / "shard-1.npz").write_bytes(os.urandom(300_000))  # a class the sync source picks up
        fakes = {addr: Attacker(token=trust.token) for addr in FAKE_ADDRS}

        def heartbeat() -> None:  # the fakes stay alive members: posted to the ephemeral node only
            envs = [a.envelope(a.snapshot(addr=addr, tags=["durable"], sync={"data_port": DATA_PORT}))
                    for addr, a in fakes.items()]
            r = next(iter(fakes.values())).post(urls[0], envs)
            assert r.status_code == 200, r.text

        def counted(url: str):
            heartbeat()
            got = _refused(url)
            return got if all(got.get(k, 0) >= n for k, n in EXPECTED.items()) else None

        for url in urls:  # the durable node gets the fakes only by gossip: they spread, and are refused there too
            got = wait_until(lambda url=url: counted(url), 60, interval=0.5, what=f"refusals counted on {url}")
            assert got == {**dict.fromkeys(got, 0), **EXPECTED}
        for url in urls:
            members = httpx.get(f"{url}/members", timeout=5, trust_env=False).json()["members"]
            seen = {m["addr"]: m["addr_refused"] for m in members if m["id"] not in ids}
            assert seen == FAKE_ADDRS

        last: dict = {}
        targeted: set[str] = set()

        def pushed():
            heartbeat()
            last["sync"] = _sync(urls[0])
            files = last["sync"]["files"]
            targeted.update(t for f in files for t in f["targets"])
            return files if files and all(ids[1] in f["confirmed_by"] for f in files) else None

        try:
            files = wait_until(pushed, 90, interval=0.5, what="the file pushed to the real durable node")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last /sync/status: {last.get('sync')}") from None
        assert all(set(f["confirmed_by"]) == {ids[1]} for f in files)
        assert targeted <= {ids[1]}  # a fake durable member is never a push target
        rounds = [_rounds(u) for u in urls]
        passes = _sync(urls[0])["sent"]["passes"]

        def more_rounds():  # several more gossip rounds and sync passes with the fakes alive and under-replication
            heartbeat()
            now = [_rounds(u) for u in urls]
            return all(n >= r + 10 for n, r in zip(now, rounds)) and _sync(urls[0])["sent"]["passes"] >= passes + 5

        wait_until(more_rounds, 90, interval=0.5, what="ten more gossip rounds and five sync passes")
        for i, log in enumerate(logs):
            hits = [line for line in log.read_text().splitlines() if line != "ready"]
            assert hits == [], f"connections reached listeners in {lab.names[i]}: {hits}"
        assert _refused(urls[0]) == {**dict.fromkeys(_refused(urls[0]), 0), **EXPECTED}  # each counted once
        print(f"\n[dial policy {mode}] {len(FAKE_ADDRS)} fake addresses refused on both agents by reason "
              f"{EXPECTED}; file pushed to the real durable node only; 0 connections on "
              f"{len(LISTEN_HOSTS) * 2 + 1} listeners x 2 namespaces", file=sys.stderr)
    finally:
        for p in procs:
            p.kill()
        for lp in listeners:
            lp.kill()
            lp.wait()
        lab.close()


def test_a_member_whose_address_is_refused_hosts_no_gang():
    """The planner's view takes the dialable address: a member advertising a metadata address gets no host, so no
    gang is placed on it (its host would be every other member's torchrun master or Ray head address)."""
    from helpers import envelope, typed

    from p2pnode.identity import Identity
    from p2pnode.node import node_view_of

    snap = typed(envelope(Identity.generate(), 1, addr="169.254.169.254:80"))
    kw = {"disk_max_percent": 70.0, "vram_limit_ratio": 0.8}
    assert node_view_of(snap, **kw).host == "169.254.169.254"  # the claim, as signed
    refused = DialPolicy(allow_private=False).refusal(snap.addr)
    assert refused == "metadata"
    assert node_view_of(snap, **kw, addr="").host == ""
