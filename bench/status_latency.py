"""``GET /status`` latency of an agent that knows N members, at a steady request rate, beside ``GET /healthz``.

    python bench/status_latency.py                     # 100 members of 4 GPUs, 100 requests/s each, 20 s
    python bench/status_latency.py --members 1000 --rate 20 --json
    python bench/status_latency.py --members 1000 --etag   # also the 304 path: /status again with its ETag

One agent on loopback (mDNS off, one fake H100); a stranger posts signed snapshots of ``--members`` - 1
identities (each a full resource sample with ``--gpus`` GPUs, as large as a real member's) and keeps them fresh
(a new version of each every 2 s, so they stay alive and their snapshots change as in a live cluster). Then
``/status`` and ``/healthz`` are requested alternately, each ``--rate`` times per second, on one keep-alive
connection, for ``--seconds``. Prints p50/p99/max in milliseconds of both, the ratio of their p99s (the cost of
the view itself beyond the HTTP round trip measured in the same run) and the /status body size.

With ``--etag`` each ``/status`` is followed at once by the same request with ``If-None-Match: <its ETag>`` (the
dashboard's and a poller's repeated request): the latencies of the answers that were 304 are reported apart
(``status_304``), with how many of those repeats were 304 (the others found the view changed in between).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from member_cap import fake_snapshot, free_port  # noqa: E402

from p2pnode.identity import Identity  # noqa: E402
from p2pnode.wire import encode_gossip, seal_snapshot  # noqa: E402


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _stats(lat: list[float]) -> dict[str, float]:
    return {"n": len(lat), "p50_ms": round(_q(lat, 0.50), 2), "p99_ms": round(_q(lat, 0.99), 2),
            "max_ms": round(max(lat), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=100, help="members the agent knows, itself included")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per fake member")
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second of each route")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--etag", action="store_true", help="also measure /status repeated with its ETag (304)")
    ns = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="p2pnode-status-"))
    agent = subprocess.Popen([sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(tmp), "--bind", "127.0.0.1",
                              "--port", str(port), "--no-mdns", "--fake-gpus", "H100"],
                             env={**os.environ, "P2PNODE_LOG_LEVEL": "warning", "P2PNODE_ALLOW_PRIVATE_ADVERTISE": "1"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    idents = [Identity.generate() for _ in range(ns.members - 1)]

    def keep_fresh() -> None:
        """New versions of every fake member every 2 s (a live cluster's heartbeats)."""
        version = 0
        with httpx.Client(trust_env=False, timeout=10) as c:
            while not stop.is_set():
                version += 1
                envs = []
                for i in idents:
                    snap = fake_snapshot(i, ns.gpus)
                    snap["version"] = version
                    envs.append(seal_snapshot(i, snap))
                for k in range(0, len(envs), 200):
                    try:
                        c.post(f"{url}/gossip", content=encode_gossip("x", "", {}, envs[k:k + 200]),
                               headers={"content-type": "application/msgpack"})
                    except httpx.HTTPError:
                        pass
                stop.wait(2.0)

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
            feeder = threading.Thread(target=keep_fresh, daemon=True)
            feeder.start()
            deadline = time.monotonic() + 60
            while len(client.get(f"{url}/status").json()["members"]) < ns.members:
                if time.monotonic() > deadline:
                    raise SystemExit("the agent did not learn every fake member within 60 s")
                time.sleep(0.5)
            lat: dict[str, list[float]] = {"/status": [], "/healthz": [], "304": []}
            size = 0
            repeats = 0
            period = 1.0 / ns.rate
            t_next = time.monotonic()
            end = t_next + ns.seconds
            while t_next < end:
                for route in ("/status", "/healthz"):
                    time.sleep(max(0.0, t_next - time.monotonic()))
                    t0 = time.perf_counter()
                    r = client.get(f"{url}{route}")
                    lat[route].append((time.perf_counter() - t0) * 1000.0)
                    r.raise_for_status()
                    if route == "/status":
                        size = len(r.content)
                        if ns.etag and "etag" in r.headers:
                            repeats += 1
                            t0 = time.perf_counter()
                            again = client.get(f"{url}/status", headers={"if-none-match": r.headers["etag"]})
                            if again.status_code == 304:
                                lat["304"].append((time.perf_counter() - t0) * 1000.0)
                    t_next += period / 2
    finally:
        stop.set()
        agent.kill()
        agent.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    s, h = _stats(lat["/status"]), _stats(lat["/healthz"])
    out = {"members": ns.members, "gpus_per_member": ns.gpus, "rate_per_s": ns.rate, "status_bytes": size,
           "status": s, "healthz": h, "p99_ratio_status_vs_healthz": round(s["p99_ms"] / max(1e-9, h["p99_ms"]), 2)}
    if ns.etag:
        out["status_304_of_repeats"] = f"{len(lat['304'])}/{repeats}"
        if lat["304"]:
            out["status_304"] = _stats(lat["304"])
            out["p99_ratio_304_vs_healthz"] = round(out["status_304"]["p99_ms"] / max(1e-9, h["p99_ms"]), 2)
    if ns.json:
        print(json.dumps(out))
    else:
        print(f"{ns.members} members, {size / 1000:.0f} KB /status, {ns.rate:g} requests/s of each route")
        for route, st in (("/status", s), ("/healthz", h)):
            print(f"  {route:9} p50 {st['p50_ms']:6.2f} ms   p99 {st['p99_ms']:6.2f} ms   max {st['max_ms']:6.2f} ms"
                  f"   ({st['n']} requests)")
        print(f"  p99 /status / p99 /healthz = {out['p99_ratio_status_vs_healthz']}")
        if "status_304" in out:
            st = out["status_304"]
            print(f"  304 (repeat with ETag: {out['status_304_of_repeats']}) p50 {st['p50_ms']:6.2f} ms   "
                  f"p99 {st['p99_ms']:6.2f} ms   max {st['max_ms']:6.2f} ms;  p99 304 / p99 /healthz = "
                  f"{out['p99_ratio_304_vs_healthz']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
