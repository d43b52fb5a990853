"""/status latency of an agent under a flood of gossip (issue 12, finding 9), against the same agent idle.

    python bench/gossip_flood.py                      # 2 senders, 30 s per attack, open mode
    python bench/gossip_flood.py --seconds 10 --json

Two sender processes post ``POST /gossip`` messages of 4,096 envelopes as fast as they can, while this process
reads ``GET /status`` every 20 ms and records each request's latency. Two attacks, each measured after a baseline
of the same agent with no flood in the same run:

* ``copies``: one freshly signed envelope (a new origin each message) copied 4,096 times: before the fix every
  copy was Ed25519-verified inline in the handler; now duplicates are dropped before verifying.
* ``distinct``: 4,096 distinct origins per message, 256 of them at a new version (enough to spend the whole
  budget of ``gossip.max_verifications_per_message`` signatures per message, checked in a worker thread), the
  rest replays; new origins beyond ``gossip.max_members`` (1,024) are rejected before any check.

The senders run at nice 19: on this 2-core machine they stand in for attackers on other machines, and without
it the probe mostly measures the kernel scheduler sharing two cores among four busy processes.

Prints p50/p99/max of /status in milliseconds for the baseline, each attack and the same agent idle right after
it (its cluster view then holds the attack's members, up to the cap), the ratio p99(attack) /
p99(baseline), how many flood messages the agent answered and how (200/409/422/503), and its RSS.
Exit status 1 when an attack's p99 exceeds 50 ms (the issue's bound).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
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

N_ENVELOPES = 4096
BODY_LIMIT = 1024 * 1024 - 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _snap(ident: Identity, version: int) -> dict:
    return {"schema": SCHEMA_VERSION, "origin": ident.node_id, "version": version, "addr": "", "tags": [],
            "leaving": False, "resources": {}}


def _fit(envs: list) -> list:
    """As many envelopes as fit one message under the agent's 1 MiB body bound."""
    per = envs[0].wire_size + 8
    return envs[: max(1, min(len(envs), BODY_LIMIT // per))]


def sender(url: str, kind: str, seconds: float, out: mp.Queue) -> None:
    # The attacker is another machine in the threat model; here it shares the two cores. At nice 19 its own CPU
    # (signing, encoding, sending) yields to the agent and the probe, so what is measured is the agent's work.
    os.nice(19)
    counts: dict[str, int] = {}
    idents = [Identity.generate() for _ in range(N_ENVELOPES)] if kind == "distinct" else []
    latest = [seal_snapshot(i, _snap(i, 1)) for i in idents]
    version, k = 1, 0
    deadline = time.monotonic() + seconds
    with httpx.Client(trust_env=False, timeout=30) as client:
        while time.monotonic() < deadline:
            version += 1
            if kind == "copies":
                ident = Identity.generate()
                envs = [seal_snapshot(ident, _snap(ident, version))] * N_ENVELOPES
            else:
                # 256 envelopes at a new version (a message's whole verification budget), from a different slice
                # of the 4,096 origins each time, and the other origins' latest envelopes: every message costs
                # the agent a full decode and its full signature budget, while the sender signs only 256.
                lo = (k * 256) % N_ENVELOPES
                k += 1
                for j in range(lo, lo + 256):
                    latest[j] = seal_snapshot(idents[j], _snap(idents[j], version))
                envs = latest[lo:lo + 256] + latest[:lo] + latest[lo + 256:]
            body = encode_gossip(Identity.generate().node_id, "", {}, _fit(envs))
            try:
                code = str(client.post(f"{url}/gossip", content=body,
                                       headers={"content-type": "application/msgpack"}).status_code)
            except httpx.HTTPError as exc:
                code = exc.__class__.__name__
            counts[code] = counts.get(code, 0) + 1
    out.put(counts)


def probe(url: str, seconds: float) -> list[float]:
    """``GET /status`` every 20 ms for ``seconds``; each latency in milliseconds."""
    lat = []
    deadline = time.monotonic() + seconds
    with httpx.Client(trust_env=False, timeout=10) as client:
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            client.get(f"{url}/status").raise_for_status()
            lat.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.02)
    return lat


def summary(lat: list[float]) -> dict:
    q = statistics.quantiles(lat, n=100)
    return {"n": len(lat), "p50_ms": round(q[49], 2), "p99_ms": round(q[98], 2), "max_ms": round(max(lat), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="flood duration per attack (default 30)")
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="p2pnode-flood-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "P2PNODE_LOG_LEVEL": "warning", "P2PNODE_ALLOW_PRIVATE_ADVERTISE": "1"}
    agent = subprocess.Popen([sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(tmp / "a"), "--bind",
                              "127.0.0.1", "--port", str(port), "--no-mdns", "--fake-gpus", "H100"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results: dict = {}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/healthz", trust_env=False, timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        ps = psutil.Process(agent.pid)
        for kind in ("copies", "distinct"):
            base = summary(probe(url, min(10.0, ns.seconds)))
            q: mp.Queue = mp.Queue()
            procs = [mp.Process(target=sender, args=(url, kind, ns.seconds, q)) for _ in range(ns.senders)]
            for p in procs:
                p.start()
            time.sleep(1.0)  # senders running (the distinct sender signs its first message)
            under = summary(probe(url, ns.seconds - 1.0))
            counts: dict[str, int] = {}
            for p in procs:
                for k, v in q.get().items():
                    counts[k] = counts.get(k, 0) + v
                p.join()
            status = httpx.get(f"{url}/status", trust_env=False, timeout=10).json()
            after = summary(probe(url, min(5.0, ns.seconds)))  # the same agent idle again, its view now larger
            results[kind] = {"baseline": base, "flood": under, "after": after,
                             "p99_ratio": round(under["p99_ms"] / base["p99_ms"], 2),
                             "replies": counts, "members": len(status["members"]),
                             "rejected": status["gossip"]["rejected"],
                             "verifications": status["gossip"]["signature_verifications"],
                             "rss_mb": round(ps.memory_info().rss / 2**20, 1)}
    finally:
        agent.kill()
        agent.wait()
    if ns.json:
        print(json.dumps(results, indent=2))
    else:
        for kind, r in results.items():
            b, f, a = r["baseline"], r["flood"], r["after"]
            print(f"{kind:9} /status p50 {b['p50_ms']:6.2f} -> {f['p50_ms']:6.2f} ms   p99 {b['p99_ms']:6.2f} -> "
                  f"{f['p99_ms']:6.2f} ms (x{r['p99_ratio']})   max {f['max_ms']:6.1f} ms   idle after: p50 "
                  f"{a['p50_ms']:.2f} p99 {a['p99_ms']:.2f} ms   replies {r['replies']}   members {r['members']}   "
                  f"verifications {r['verifications']}   RSS {r['rss_mb']} MB")
    return 0 if all(r["flood"]["p99_ms"] <= 50.0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
