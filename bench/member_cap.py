"""What 2,000 fake members cost an open-mode agent (issue 12, finding 10): members admitted, /status size, RSS.

    python bench/member_cap.py                    # 2,000 fake members of 8 GPUs each, default cap (1,024)
    python bench/member_cap.py --fakes 500 --gpus 0 --json

One agent on loopback; a stranger posts signed snapshots of ``--fakes`` new identities (each with ``--gpus``
GPUs and a full resource sample, so each is as large as a real member's), 200 per message, at most as fast as
the agent's budgets admit. Prints the members held (never above ``gossip.max_members``), ``/status`` bytes per
member, and the agent's RSS before and after, next to the documented bounds: ``/status`` <= 4 KB + (600 + 220 x
GPUs) bytes per member (2.4 KB for a member with 8 GPUs: <= 2.5 MB at the default cap of 1,024), and RSS growth
<= 40 KB per member (<= 40 MB at the cap).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from p2pnode.identity import Identity  # noqa: E402
from p2pnode.snapshot import SCHEMA_VERSION  # noqa: E402
from p2pnode.wire import encode_gossip, seal_snapshot  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_snapshot(ident: Identity, gpus: int) -> dict:
    gib = 2**30
    return {"schema": SCHEMA_VERSION, "origin": ident.node_id, "version": 1, "addr": "", "tags": [],
            "leaving": False, "started_at": time.time() - 3600, "ts": time.time(), "agent_version": "0.2.0",
            "trust": "open", "membership": {"incarnation": 1},
            "label": {"name": f"gpu-{ident.node_id[:8]}", "provider": "vast.ai", "instance": f"C.{ident.node_id[:8]}"},
            "guard": {"ratio": 0.25}, "resources": {
                "cpu_percent": 12.5, "cpu_count": 64, "load_avg": [1.0, 1.0, 1.0], "mem_total_bytes": 512 * gib,
                "mem_available_bytes": 400 * gib, "mem_used_bytes": 112 * gib, "mem_percent": 21.9,
                "disk_path": "/data/p2pnode", "disk_total_bytes": 4000 * gib, "disk_used_bytes": 1000 * gib,
                "disk_free_bytes": 3000 * gib, "disk_percent": 25.0, "gpu_source": "nvml",
                "gpus": [{"index": i, "name": "NVIDIA GeForce RTX 4090", "uuid": f"GPU-{ident.node_id}-{i}",
                          "util_percent": 50.0, "mem_used_bytes": 10 * gib, "mem_total_bytes": 24 * gib,
                          "temperature_c": 60.0, "power_w": 300.0} for i in range(gpus)]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fakes", type=int, default=2000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="p2pnode-cap-"))
    agent = subprocess.Popen([sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(tmp), "--bind", "127.0.0.1",
                              "--port", str(port), "--no-mdns", "--fake-gpus", "H100"],
                             env={**os.environ, "P2PNODE_LOG_LEVEL": "warning", "P2PNODE_ALLOW_PRIVATE_ADVERTISE": "1"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(trust_env=False, timeout=30) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.get(f"{url}/healthz").raise_for_status()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            ps = psutil.Process(agent.pid)
            time.sleep(2.0)
            status0 = len(client.get(f"{url}/status").content)
            rss0 = ps.memory_info().rss
            envs = [seal_snapshot(i, fake_snapshot(i, ns.gpus)) for i in (Identity.generate() for _ in range(ns.fakes))]
            codes: dict[int, int] = {}
            t0 = time.monotonic()
            i = 0
            while i < len(envs) and time.monotonic() - t0 < 120:
                r = client.post(f"{url}/gossip", content=encode_gossip("x", "", {}, envs[i:i + 200]),
                                headers={"content-type": "application/msgpack"})
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code in (429, 503):
                    time.sleep(0.5)
                    continue
                if r.status_code == 200 or "over_budget" not in r.text:
                    i += 200
                else:
                    time.sleep(0.3)  # the per-second signature budget: send the rest again
            time.sleep(1.0)
            status = client.get(f"{url}/status")
            members = len(status.json()["members"])
            rss1 = ps.memory_info().rss
    finally:
        agent.kill()
        agent.wait()
    per_member = (len(status.content) - status0) / max(1, members - 1)
    out = {"fakes": ns.fakes, "gpus_per_member": ns.gpus, "members_held": members, "replies": codes,
           "status_bytes": len(status.content), "status_bytes_per_member": round(per_member),
           "status_bound_bytes": 4096 + (600 + 220 * ns.gpus) * members,
           "rss_mb_before": round(rss0 / 2**20, 1), "rss_mb_after": round(rss1 / 2**20, 1),
           "rss_growth_kb_per_member": round((rss1 - rss0) / 1024 / max(1, members - 1), 1)}
    print(json.dumps(out, indent=None if not ns.json else 2))
    ok = members <= 1024 and len(status.content) <= out["status_bound_bytes"] and out["rss_growth_kb_per_member"] <= 40
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
