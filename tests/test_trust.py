"""Issue 13: a keyring rotated without downtime while three agents gossip, sync and take signed requests; no
secret on the wire (a capture of every packet in network namespaces)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time

import httpx
import pytest
from agents import AgentProc, free_port, wait_until
from attack import TINY_CATALOG as CATALOG

from p2pnode.keyring import key_id_of
from p2pnode.reqauth import AUTH_HEADER, sign_request

pytestmark = pytest.mark.slow

OLD = "old-cluster-token-7f3a9c1e55d0"
NEW = "new-cluster-token-b81e2d4490aa"
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_TRUST": "token", "P2PNODE_SYNC_INTERVAL_S": "1"}


def keys(p: AgentProc, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "p2pnode", "keys", *args, "--data-dir", str(p.data_dir)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def put(p: AgentProc, rel: str, data: bytes) -> None:
    dest = p.data_dir / "data" / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp"
    tmp.write_bytes(data)
    old = time.time() - 60
    os.utime(tmp, (old, old))
    os.replace(tmp, dest)


class Load(threading.Thread):
    """Signed requests as fast as an operator's scripts would send them (about 10 a second): signals to every
    agent and sync triggers to the ephemeral one, each signed with the primary token of node 0's keyring at that
    moment (what the CLI on node 0 does). Every answer that is not 200 is kept."""

    def __init__(self, procs: list[AgentProc]) -> None:
        super().__init__(daemon=True)
        self.procs = procs
        self.stop = threading.Event()
        self.sent = 0
        self.failures: list[str] = []

    def primary(self) -> str:
        from p2pnode.keyring import Keyring

        return Keyring.load(self.procs[0].data_dir / "keyring.json").primary_token

    def run(self) -> None:
        with httpx.Client(trust_env=False, timeout=5) as c:
            i = 0
            while not self.stop.is_set():
                token = self.primary()
                p = self.procs[i % len(self.procs)]
                path, body = (("/signals", b'{"config": "x_2p", "quality": 0.7}') if i % 2 == 0
                              else ("/sync/trigger", b""))
                if path == "/sync/trigger":
                    p = self.procs[0]
                h = {AUTH_HEADER: sign_request(token, key_id_of(token), "POST", path, body, time.time(),
                                               receiver=p.get("/healthz")["node_id"]),
                     "content-type": "application/json"}
                r = c.post(p.url + path, content=body, headers=h)
                self.sent += 1
                if r.status_code != 200:
                    self.failures.append(f"{path} -> {r.status_code} {r.text[:200]}")
                i += 1
                time.sleep(0.1)


def unendorsed(p: AgentProc) -> int:
    return p.status()["gossip"]["rejected"].get("unendorsed", 0)


def sync_refusals(p: AgentProc) -> dict:
    """Sync input this node refused (requests and blocks), and pushes its targets refused."""
    s = p.get("/sync/status")
    received = s.get("received", {})
    merged = {**received.get("rejected", {}), **received.get("refused_requests", {}),
              **s.get("sent", {}).get("rejected_by_targets", {})}
    return {k: v for k, v in merged.items() if v}


def test_rotation_under_load_rejects_nothing_and_then_refuses_the_old_token(tmp_path):
    (tmp_path / "catalog.toml").write_text(CATALOG)
    tags = ["ephemeral", "durable", "durable"]
    procs: list[AgentProc] = []
    ports = [free_port() for _ in tags]
    for i, tag in enumerate(tags):
        args = ["--no-mdns", "--tag", tag, "--catalog", str(tmp_path / "catalog.toml")]
        if i:
            args += ["--join", f"127.0.0.1:{ports[0]}"]
        procs.append(AgentProc(tmp_path / f"n{i}", ports[i], *args, env={**ENV, "P2PNODE_CLUSTER_TOKEN": OLD}))
    load = Load(procs)
    intruder = None
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready()
        ids = [p.status()["node"]["id"] for p in procs]
        wait_until(lambda: all({m["id"] for m in p.status()["members"] if m["state"] == "alive"} == set(ids)
                               for p in procs), 20, what="three members everywhere")
        load.start()
        n_files = 0

        def write_data() -> None:
            nonlocal n_files
            put(procs[0], f"cfg/shard{n_files}.npz", os.urandom(256 * 1024))
            n_files += 1

        def settled(step: str) -> None:
            """Every agent shows the step, the load goes on, nothing refused anywhere."""
            write_data()
            sent, path = load.sent, f"cfg/shard{n_files - 1}.npz"

            def went_on() -> bool:  # sync passes (the file just written reached a durable node) and more requests
                files = procs[0].get("/sync/status")["files"]
                return load.sent >= sent + 20 and any(f["path"] == path and f["replicas"] >= 1 for f in files)

            wait_until(went_on, 60, interval=0.5, what=f"{step}: {path} synced and 20 more signed requests")
            for p in procs:
                assert unendorsed(p) == 0, f"{step}: {p.url} rejected an envelope as unendorsed"
                refused = {k: v for k, v in p.status()["node"]["request_auth"]["refused"].items() if v}
                assert not refused, f"{step}: {p.url} refused requests: {refused}"
                assert not sync_refusals(p), f"{step}: {p.url} refused sync input: {sync_refusals(p)}"
            assert not load.failures, f"{step}: {load.failures[:3]}"

        settled("before")
        new_id = key_id_of(NEW)
        for p in procs:  # 1. install the new token everywhere: accepted, not used yet
            keys(p, "install", NEW)
        for p in procs:
            wait_until(lambda p=p: new_id in p.status()["node"]["keyring"]["key_ids"], 5, what="new key installed")
        settled("install")
        for p in procs:  # 2. use it: every node re-endorses its key without a restart
            keys(p, "use", new_id[:8])
        for p in procs:
            wait_until(lambda p=p: p.status()["node"]["keyring"]["primary"] == new_id, 5, what="new key primary")
        settled("use")
        old_id = key_id_of(OLD)
        for p in procs:  # 3. remove the old token everywhere
            keys(p, "remove", old_id)
        for p in procs:
            wait_until(lambda p=p: p.status()["node"]["keyring"]["key_ids"] == [new_id], 5, what="old key removed")
        settled("remove")
        load.stop.set()
        load.join(5)
        assert load.sent >= 50
        wait_until(lambda: all((f := next((x for x in procs[0].get("/sync/status")["files"]
                                            if x["path"] == "cfg/shard0.npz"), None)) and f["replicas"] >= 1
                               for _ in [0]), 20, what="data synced during the rotation")

        # Afterwards a node holding only the old token is refused, with a counted reason...
        intruder = AgentProc(tmp_path / "old", free_port(), "--no-mdns", "--join", f"127.0.0.1:{ports[1]}",
                             env={**ENV, "P2PNODE_CLUSTER_TOKEN": OLD}).start()
        intruder.wait_ready()
        wait_until(lambda: unendorsed(procs[1]) > 0, 10, what="the old-token node refused as unendorsed")
        assert intruder.status()["node"]["id"] not in {m["id"] for m in procs[1].status()["members"]}
        # ... and so is a request signed with the old token.
        body = b'{"config": "x_2p", "quality": 0.5}'
        r = httpx.post(procs[1].url + "/signals", content=body, trust_env=False, headers={
            AUTH_HEADER: sign_request(OLD, old_id, "POST", "/signals", body, time.time(),
                                      receiver=procs[1].get("/healthz")["node_id"])})
        assert r.status_code == 401 and r.json()["reason"] == "unknown_key"
        assert procs[1].status()["node"]["request_auth"]["refused"]["unknown_key"] == 1
    finally:
        load.stop.set()
        for p in procs + ([intruder] if intruder else []):
            p.kill()


@pytest.mark.netns
def test_capture_of_a_token_mode_cluster_holds_no_token(tmp_path):
    """Every packet between three hosts (network namespaces), captured on their bridge during `p2pnode signals
    set`, `p2pnode sync push` (from another host) and a whole key rotation, contains neither token nor the
    request key derived from one."""
    import hashlib
    import hmac
    import shutil

    from netns import NetnsLab, require_netns

    require_netns()
    if shutil.which("tcpdump") is None:
        pytest.skip("the capture test needs tcpdump (Debian package tcpdump; .ci/run installs it)")
    (tmp_path / "catalog.toml").write_text(CATALOG)
    lab = NetnsLab(3, net=7)
    procs: list[AgentProc] = []
    pcap = tmp_path / "all.pcap"
    dump = None
    try:
        dump = subprocess.Popen(["ip", "netns", "exec", lab.hub, "tcpdump", "-i", "br0", "-U", "-s", "0", "-w",
                                 str(pcap)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        said = b""  # tcpdump says "listening on br0" once it captures: from then on no packet is missed
        deadline = time.monotonic() + 30
        while b"listening on" not in said and time.monotonic() < deadline and dump.poll() is None:
            if select.select([dump.stderr], [], [], 1.0)[0]:
                said += dump.stderr.readline()
        assert b"listening on" in said, f"tcpdump is not capturing: {said!r}"
        tags = ["ephemeral", "durable", "durable"]
        env = {**ENV, "P2PNODE_CLUSTER_TOKEN": OLD, "P2PNODE_SYNC_DATA_PORT": "8771"}
        for i, tag in enumerate(tags):
            args = ["--no-mdns", "--tag", tag, "--catalog", str(tmp_path / "catalog.toml")]
            if i:
                args += ["--join", f"{lab.addrs[0]}:8770"]
            procs.append(AgentProc(tmp_path / f"n{i}", 8770, *args, bind=lab.addrs[i], prefix=lab.prefix_for(i),
                                   env=env).start())

        def status_in(i: int) -> dict:
            out = lab.sh(lab.names[i], sys.executable, "-c", "import json,urllib.request as u;print(json.dumps("
                         f"json.load(u.urlopen('http://{lab.addrs[i]}:8770/status',timeout=3))))")
            return json.loads(out.stdout)

        def wait_in(pred, what):
            return wait_until(pred, 30, interval=0.5, what=what, retry_on=(Exception,))

        wait_in(lambda: all(len([m for m in status_in(i)["members"] if m["state"] == "alive"]) == 3 for i in range(3)),
                "three members")
        put(procs[0], "cfg/shard.npz", os.urandom(512 * 1024))

        def cli(i: int, *args: str, token: str) -> None:
            r = subprocess.run([*lab.prefix_for(i), sys.executable, "-m", "p2pnode", *args], capture_output=True,
                               text=True, timeout=60, env={**os.environ, "P2PNODE_CLUSTER_TOKEN": token})
            assert r.returncode == 0, r.stdout + r.stderr

        # from host 1 to host 0 and 2: the requests cross the bridge
        cli(1, "signals", "set", "x_2p", "--quality", "0.8", "--url", f"http://{lab.addrs[2]}:8770", token=OLD)
        cli(1, "sync", "push", "--wait", "--wait-timeout", "60", "--url", f"http://{lab.addrs[0]}:8770", token=OLD)
        new_id = key_id_of(NEW)
        shown = {"install": lambda k: new_id in k["key_ids"], "use": lambda k: k["primary"] == new_id,
                 "remove": lambda k: k["key_ids"] == [new_id]}
        for step in (("install", NEW), ("use", new_id), ("remove", key_id_of(OLD))):
            for p in procs:
                keys(p, *step)
            # reloaded (every node's keyring shows the step), re-endorsed and gossiped (every node's view of every
            # member at least at the version that member has now)
            wait_in(lambda s=step[0]: all(shown[s](status_in(i)["node"]["keyring"]) for i in range(3)),
                    f"the keyring step {step[0]} on every node")
            own = {st["node"]["id"]: st["node"]["version"] for st in map(status_in, range(3))}
            wait_in(lambda own=own: all(m["version"] >= own[m["id"]] for i in range(3)
                                        for m in status_in(i)["members"] if m["id"] in own),
                    f"every node's view current after {step[0]}")
        cli(1, "signals", "set", "x_2p", "--quality", "0.6", "--url", f"http://{lab.addrs[2]}:8770", token=NEW)
        put(procs[0], "cfg/shard2.npz", os.urandom(256 * 1024))
        cli(1, "sync", "push", "--wait", "--wait-timeout", "60", "--url", f"http://{lab.addrs[0]}:8770", token=NEW)
        for i in range(3):
            st = status_in(i)
            assert st["gossip"]["rejected"].get("unendorsed", 0) == 0
            assert st["node"]["keyring"]["key_ids"] == [key_id_of(NEW)]
        time.sleep(1.0)
    finally:
        for p in procs:
            p.kill()
        if dump is not None:
            dump.terminate()
            dump.wait(10)
        lab.close()
    raw = pcap.read_bytes()
    text = subprocess.run(["tcpdump", "-A", "-r", str(pcap)], capture_output=True, timeout=60).stdout
    assert len(raw) > 100_000 and b"POST /signals" in text and b"x-p2pnode-auth" in text  # the capture saw it all
    for token in (OLD, NEW):
        request_key = hmac.new(token.encode(), b"p2pnode-request-key-v1", hashlib.sha256).digest()
        for secret in (token.encode(), token.encode().hex().encode(), request_key, request_key.hex().encode(),
                       __import__("base64").b64encode(token.encode())):
            assert secret not in raw and secret not in text, f"a secret of {token[:3]}... is in the capture"


def test_a_corrupt_keyring_or_voter_roll_on_disk_is_handled(tmp_path):
    """A keyring garbled while the agent runs is logged and the one in memory kept (the node stays a member and
    keeps accepting signed requests); garbled at start, it stops the agent with one line and exit 2. A garbled
    voter roll does not (issue 22): it is reported and the node rebuilds its roll as a node starting for the first
    time does."""
    p = AgentProc(tmp_path / "n", free_port(), "--no-mdns", env={**ENV, "P2PNODE_CLUSTER_TOKEN": OLD}).start()
    try:
        p.wait_ready()
        kid = key_id_of(OLD)
        (p.data_dir / "keyring.json").write_text('{"primary": "nope", "tokens": [1, 2')
        wait_until(lambda: "keeping the keyring in memory" in p.log.read_text(), 30, interval=0.2,
                   what="the garbled keyring noticed (its reload check)")
        assert p.proc.poll() is None and p.status()["node"]["keyring"]["primary"] == kid
        body = b""
        r = httpx.post(p.url + "/sync/trigger", content=body, trust_env=False, headers={
            AUTH_HEADER: sign_request(OLD, kid, "POST", "/sync/trigger", body, time.time(),
                                      receiver=p.get("/healthz")["node_id"])})
        assert r.status_code == 200
    finally:
        p.stop()
    for name, text in (("keyring.json", "garbage"),):
        (p.data_dir / name).write_text(text)
        r = subprocess.run([sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(p.data_dir), "--bind",
                            "127.0.0.1", "--port", str(free_port()), "--no-mdns"], capture_output=True, text=True,
                           timeout=30, env={**os.environ, **ENV})
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert name in lines[-1], lines
    (p.data_dir / "keyring.json").write_text(json.dumps({"primary": key_id_of(OLD), "tokens": [OLD]}))
    (p.data_dir / "voters.json").write_text('{"voters": "x"}')
    back = AgentProc(p.data_dir, free_port(), "--no-mdns", env={**ENV, "P2PNODE_CLUSTER_TOKEN": OLD}).start()
    try:
        st = back.wait_ready()
        assert st["state_files"]["voters.json"]["malformed"] == 1 and "Traceback" not in back.log.read_text()
    finally:
        back.stop()
