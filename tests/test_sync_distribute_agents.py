"""Distribution between real agent processes on 127.0.0.1: `p2pnode sync publish` on a durable node, three
subscribers pinning the operator key and one that does not, over the agents' HTTP routes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from agents import AgentProc, free_port, wait_until

from p2pnode.identity import Identity
from p2pnode.synccore import publisher_text

pytestmark = pytest.mark.slow

LOCAL = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SYNC_INTERVAL_S": "0.5"}


def operator_key(tmp_path):
    from p2pnode._ed25519 import pkcs8_pem

    ident = Identity.generate()
    pem = pkcs8_pem(ident.private_key)
    path = tmp_path / "operator.key"
    path.write_bytes(pem)
    path.chmod(0o600)
    return path, publisher_text(ident.public_key)


def test_publish_with_the_cli_reaches_pinned_subscribers(tmp_path):
    key, pinned = operator_key(tmp_path)
    procs = []
    try:
        pub = AgentProc(tmp_path / "pub", free_port(), "--no-mdns", "--tag", "durable",
                        env={**LOCAL, "P2PNODE_SYNC_PUBLISHERS": pinned, "P2PNODE_SYNC_PUBLISH_MAX_BYTES_PER_S":
                             str(4 * 2**20)}).start()
        procs.append(pub)
        pub.wait_ready()
        subs = []
        for i in range(3):
            s = AgentProc(tmp_path / f"s{i}", free_port(), "--no-mdns", "--tag", "training", "--join",
                          f"127.0.0.1:{pub.port}", env={**LOCAL, "P2PNODE_SYNC_PUBLISHERS": pinned}).start()
            procs.append(s)
            subs.append(s)
        nopin = AgentProc(tmp_path / "nopin", free_port(), "--no-mdns", "--tag", "training", "--join",
                          f"127.0.0.1:{pub.port}", env=LOCAL).start()
        procs.append(nopin)
        for p in procs:
            p.wait_ready()
        wait_until(lambda: len(pub.get("/members")["members"]) >= 5, 30, what="every member known")
        data = os.urandom(24 * 2**20 + 5)
        src = tmp_path / "model.safetensors"
        src.write_bytes(data)
        out = subprocess.run([sys.executable, "-m", "p2pnode", "sync", "publish", str(src), "--to", "tag:training",
                              "--key", str(key), "--version", "7", "--url", pub.url], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        for s in subs:
            link = s.data_dir / "published" / "model.safetensors"
            wait_until(lambda link=link: link.exists() and link.stat().st_size == len(data), 90,
                       what=f"{link} complete")
            assert link.read_bytes() == data
        served = {p.data_dir.name: p.get("/sync/status")["distribution"]["bytes_served"] for p in procs}
        fetched = {s.data_dir.name: s.get("/sync/status")["distribution"]["bytes_fetched"] for s in subs}
        print("served", served, "fetched", fetched)
        pub_id = pub.status()["node"]["id"]
        assert any(h != pub_id for f in fetched.values() for h in f), fetched  # peers served each other
        wait_until(lambda: nopin.get("/sync/status")["distribution"]["refused"].get("unpinned", 0) >= 1, 30,
                   what="the unpinned subscriber refusing")
        assert not (nopin.data_dir / "published" / "model.safetensors").exists()
        assert served["nopin"] == 0 and nopin.get("/sync/status")["distribution"]["bytes_fetched"] == {}
        # a replayed (older) version is refused by the publisher itself
        again = subprocess.run([sys.executable, "-m", "p2pnode", "sync", "publish", str(src), "--to",
                                "tag:training", "--key", str(key), "--version", "6", "--url", pub.url],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "stale_version" in again.stderr
        text = subprocess.run([sys.executable, "-m", "p2pnode", "sync", "status", "--url", subs[0].url],
                              capture_output=True, text=True, timeout=30).stdout
        assert "published model.safetensors v7" in text, text
    finally:
        for p in procs:
            p.kill()


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_9_of_a_subscriber_mid_fetch_resumes_after_restart(tmp_path, seed):
    """A subscriber killed (SIGKILL) at a seeded point of its fetch restarts on its data dir and completes from the
    blocks verified in its partial file; its copy is byte-identical, nothing half-written is ever at the link."""
    import random

    key, pinned = operator_key(tmp_path)
    procs = []
    try:
        pub = AgentProc(tmp_path / "pub", free_port(), "--no-mdns", "--tag", "durable",
                        env={**LOCAL, "P2PNODE_SYNC_PUBLISHERS": pinned,
                             "P2PNODE_SYNC_PUBLISH_MAX_BYTES_PER_S": str(2**20)}).start()
        procs.append(pub)
        pub.wait_ready()
        sub = AgentProc(tmp_path / "s0", free_port(), "--no-mdns", "--tag", "training", "--join",
                        f"127.0.0.1:{pub.port}", env={**LOCAL, "P2PNODE_SYNC_PUBLISHERS": pinned}).start()
        procs.append(sub)
        sub.wait_ready()
        wait_until(lambda: len(pub.get("/members")["members"]) >= 2, 30, what="both members known")
        data = os.urandom(16 * 2**20 + 9)
        src = tmp_path / "ckpt.safetensors"
        src.write_bytes(data)
        out = subprocess.run([sys.executable, "-m", "p2pnode", "sync", "publish", str(src), "--to", "tag:training",
                              "--key", str(key), "--url", pub.url], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        want = random.Random(seed).uniform(0.15, 0.6)

        def held_share():
            files = sub.get("/sync/status")["distribution"]["files"]
            return files and files[0]["blocks_held"] / files[0]["blocks"] >= want and files[0]["state"] == "fetching"

        wait_until(held_share, 60, interval=0.1, what=f"{want:.0%} of the blocks held")
        sub.kill()
        link = sub.data_dir / "published" / "ckpt.safetensors"
        assert not link.exists()  # nothing half-fetched is ever switched in
        sub.start()
        sub.wait_ready()
        wait_until(lambda: link.exists(), 90, what="the copy complete after the restart")
        assert link.read_bytes() == data
        fetched = sum(sub.get("/sync/status")["distribution"]["bytes_fetched"].values())
        assert fetched < len(data)  # resumed: the blocks verified before the kill were not fetched again
    finally:
        for p in procs:
            p.kill()
