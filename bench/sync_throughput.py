"""Sync throughput: a sealed file replicated from an ephemeral agent to a durable one on 127.0.0.1, next to
``cp`` + ``sync`` of the same file on the same file system, measured in the same run (the baseline).

    python bench/sync_throughput.py                      # 1 GiB, 3 rounds, data channel
    python bench/sync_throughput.py --mib 256 --rounds 5 --json
    python bench/sync_throughput.py --transport http     # blocks in HTTP pushes (sync.data_port = -1)

Each round, alternately: (a) ``cp SRC DST && sync`` (the copy fsynced, as the replica is), timed; (b) the file is
linked into the ephemeral agent's sync root (settled, so it is eligible at once), a pass is triggered, and the
time until the durable agent's signed receipt reaches the sender is measured; that covers hashing the manifest,
sending every block, verifying each, the commit's checks, fsync, rename and the receipt's gossip. The
replica is compared byte for byte. Dirty pages are flushed (``sync``) before each measurement. The disk of a
virtual machine is noisy: the medians over the rounds are reported, with every round's figure.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

LOG_LEVEL = ["warning"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp: Path, name: str, tag: str, port: int, join: int | None, channel: bool) -> subprocess.Popen:
    env = {**os.environ, "P2PNODE_LOG_LEVEL": LOG_LEVEL[0], "P2PNODE_GOSSIP_PROFILE": "local-test",
           "P2PNODE_SYNC_INTERVAL_S": "60",  # passes only when triggered
           "P2PNODE_SYNC_DATA_PORT": "0" if channel else "-1",
           "P2PNODE_ALLOW_PRIVATE_ADVERTISE": "1"}  # both agents on loopback
    cmd = [sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(tmp / name), "--bind", "127.0.0.1",
           "--port", str(port), "--no-mdns", "--tag", tag]
    if join:
        cmd += ["--join", f"127.0.0.1:{join}"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "wb"), env=env)


def get(port: int, path: str) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5, trust_env=False).json()


def wait(pred, timeout: float, what: str, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except httpx.HTTPError:
            pass
        time.sleep(step)
    raise TimeoutError(what)


def prime(tmp: Path, size: int) -> None:
    """Write and delete ``size`` bytes, so the next writer finds recently freed page-cache memory. On this kind of
    virtual machine freed memory goes back to the host within seconds, and memory touched afresh is about ten
    times slower to write (1 GiB into the page cache: 4.1 s fresh, 0.3 s right after a free). Priming before
    each measurement gives both the baseline and p2pnode the same, steady-state, condition."""
    scratch = tmp / "scratch"
    chunk = b"\x5a" * (8 * 2**20)
    with open(scratch, "wb") as fh:
        for _ in range(size // len(chunk) + 1):
            fh.write(chunk)
    scratch.unlink()


def settle(tmp: Path, size: int, memory: str) -> None:
    if memory == "primed":
        prime(tmp, size)
    else:
        time.sleep(5.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024, help="file size in MiB (default 1024)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to work (default: a temp dir on the default file system)")
    ap.add_argument("--memory", choices=("primed", "cold"), default="primed",
                    help="primed: write and free the file's size of memory just before each measurement (steady "
                         "state of a busy machine); cold: wait 5 s first, so freed memory has gone back to the host "
                         "and every write touches fresh memory (default primed)")
    ap.add_argument("--transport", choices=("channel", "http"), default="channel",
                    help="channel: blocks stream over the data channel (the default); http: sync.data_port = -1, "
                         "blocks go in POST /sync/push requests")
    ap.add_argument("--log-level", default="warning", help="the agents' log level (debug: per-transfer timings)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (agent logs) instead of deleting it")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    LOG_LEVEL[0] = ns.log_level

    tmp = Path(tempfile.mkdtemp(prefix="p2pnode-bench-sync-", dir=ns.dir))
    size = ns.mib * 2**20
    src = tmp / "source.npz"
    with open(src, "wb") as fh:
        for _ in range(ns.mib // 8):
            fh.write(os.urandom(8 * 2**20))
        fh.write(os.urandom(size - (ns.mib // 8) * 8 * 2**20))
    old = time.time() - 60
    os.utime(src, (old, old))
    pd, pe = free_port(), free_port()
    procs = [start(tmp, "durable", "durable", pd, None, ns.transport == "channel")]
    try:
        wait(lambda: get(pd, "/healthz"), 30, "durable agent up")
        procs.append(start(tmp, "eph", "ephemeral", pe, pd, ns.transport == "channel"))
        wait(lambda: get(pe, "/sync/status")["durable_members"] == 1, 30, "cluster formed")
        eid = get(pe, "/healthz")["node_id"]
        root = tmp / "eph" / "data"
        root.mkdir(parents=True, exist_ok=True)
        cp_s, sync_s = [], []
        for r in range(-1, ns.rounds):  # round -1 warms up (page cache, the VM's memory) and is not counted
            subprocess.run(["sync"], check=True)
            dst = tmp / "copy.npz"
            settle(tmp, size, ns.memory)
            t0 = time.perf_counter()
            subprocess.run(["cp", str(src), str(dst)], check=True)
            subprocess.run(["sync"], check=True)
            cp_t = time.perf_counter() - t0
            dst.unlink()
            subprocess.run(["sync"], check=True)
            name = f"round{r}.npz"
            os.link(src, root / name)  # same bytes and mtime: settled, eligible at once
            settle(tmp, size, ns.memory)
            t0 = time.perf_counter()
            httpx.post(f"http://127.0.0.1:{pe}/sync/trigger", timeout=5, trust_env=False)

            def confirmed(name=name):
                f = [f for f in get(pe, "/sync/status")["files"] if f["path"] == name]
                return f and f[0]["replicas"] >= 1

            # watch for the replica's rename with stat() (costs nothing) before asking the sender over HTTP: a
            # tight HTTP poll would take CPU from the transfer on this 2-core machine
            replica = tmp / "durable" / "replicas" / eid / name
            wait(lambda replica=replica: replica.exists() and replica.stat().st_size == size, 600,
                 f"round {r} replicated", step=0.002)
            wait(confirmed, 60, f"round {r} confirmed", step=0.005)
            if r >= 0:
                cp_s.append(cp_t)
                sync_s.append(time.perf_counter() - t0)
            if not filecmp.cmp(src, replica, shallow=False):
                print(f"round {r}: replica differs from the source", file=sys.stderr)
                return 1
            replica.unlink()
            (root / name).unlink()
        recv = get(pd, "/sync/status")["received"]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        if ns.keep:
            print("kept", tmp, file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    mib_s = lambda s: ns.mib / s  # noqa: E731
    out = {
        "file_mib": ns.mib,
        "memory": ns.memory,
        "transport": ns.transport,
        "rounds": ns.rounds,
        "cp_sync_s": [round(x, 3) for x in cp_s],
        "p2pnode_s": [round(x, 3) for x in sync_s],
        "cp_sync_mib_s_median": round(mib_s(statistics.median(cp_s)), 1),
        "p2pnode_mib_s_median": round(mib_s(statistics.median(sync_s)), 1),
        "ratio_median": round(statistics.median(cp_s) / statistics.median(sync_s), 3),
        "ratio_per_round": [round(c / s, 3) for c, s in zip(cp_s, sync_s)],
        "blocks_rejected": recv.get("rejected", {}),
    }
    if ns.json:
        print(json.dumps(out))
        return 0
    print(f"{ns.mib} MiB sealed file, {ns.rounds} rounds, memory {ns.memory}, transport {ns.transport}, "
          "byte-identical every round")
    print(f"  cp + sync (baseline): median {statistics.median(cp_s):.2f} s = {out['cp_sync_mib_s_median']} MiB/s "
          f"  rounds {out['cp_sync_s']}")
    print(f"  p2pnode sync:         median {statistics.median(sync_s):.2f} s = {out['p2pnode_mib_s_median']} MiB/s "
          f"  rounds {out['p2pnode_s']}")
    print(f"  ratio (p2pnode / baseline throughput): {out['ratio_median']}  per round {out['ratio_per_round']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
