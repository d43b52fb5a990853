"""Versions in place on the receiver (issue 40, item 2): a 1 GiB replica's next version, grown by 1 MiB or with
1 MiB changed, on a loop-mounted XFS (reflinks) and on ext4 (the copy fallback); the receiver's kernel write
counter (``/proc/<pid>/io`` ``write_bytes``) around each version. Needs root, loop devices and ``mkfs.xfs``.

    python bench/sync_reflink.py                 # the receiver alone (tests/cowfs.py), 1 GiB, XFS and ext4
    python bench/sync_reflink.py --agents        # also two agents on 127.0.0.1, the durable one's data dir on the
                                                 # file system: the same figure for the whole agent process
    python bench/sync_reflink.py --mib 256 --json

The receiver alone: a process of its own receives each version as a block stream into a
:class:`~p2pnode.sync.ReplicaStore` (``tests/cowfs.py``; the bytes come from a thread of that process that only
reads). With ``--agents``: an ephemeral agent replicates a sealed file to a durable agent; the file is grown by
1 MiB (its mtime set back, so it is settled at once), a pass is triggered, and the durable agent's counter is read
before the trigger and after its receipt for the new version reached the sender (all of that agent's writes in
the window: the version, its state files, its log). Every replica is compared byte for byte. Exit 1 when the
grown version on XFS writes more than 2 x 1 MiB + 256 KiB, or a replica differs.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
import cowfs  # noqa: E402
import sync_throughput as st  # noqa: E402
from cowfs import Version  # noqa: E402

MiB = 2**20
METADATA_BYTES = 256 * 1024


def write_bytes_of(pid: int) -> int:
    """``write_bytes`` of process ``pid`` (``/proc/<pid>/io``; all its threads)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError(f"no write_bytes for {pid}")


def receiver_alone(kind: str, work: Path, mib: int) -> dict:
    """The three versions received by a store of its own on a loop-mounted ``kind`` file system."""
    base = mib * MiB + 777
    versions = [Version(1, base), Version(1, base + MiB), Version(1, base + MiB, (mib // 2,))]
    with cowfs.loop_fs(kind, work, size_bytes=3 * base + 2**30) as mnt:
        res = cowfs.receive_versions(mnt / "data", versions, timeout_s=1800)
        same = cowfs.check_replica(cowfs.replica_path(mnt / "data"), versions[-1])
    return {"fs": kind, "first": res[0], "grown": res[1], "changed": res[2], "identical": same}


def agents(kind: str, work: Path, mib: int) -> dict:
    """An ephemeral agent replicating a sealed file of ``mib`` MiB to a durable agent whose data dir is on a
    loop-mounted ``kind`` file system; then the file grown by 1 MiB (see module docstring)."""
    size = mib * MiB + 777
    with cowfs.loop_fs(kind, work, size_bytes=3 * size + 2**30) as mnt:
        src_dir = work / "eph-src"
        src_dir.mkdir()
        pd, pe = st.free_port(), st.free_port()
        procs = [st.start(mnt, "durable", "durable", pd, None, True)]
        try:
            st.wait(lambda: st.get(pd, "/healthz"), 30, "durable agent up")
            procs.append(st.start(work, "eph", "ephemeral", pe, pd, True))
            st.wait(lambda: st.get(pe, "/sync/status")["durable_members"] == 1, 60, "cluster formed")
            eid = st.get(pe, "/healthz")["node_id"]
            root = work / "eph" / "data"
            root.mkdir(parents=True, exist_ok=True)
            f = root / "big.npz"
            with open(f, "wb") as fh:
                for _ in range(mib):
                    fh.write(os.urandom(MiB))
                fh.write(os.urandom(777))
            replica = mnt / "durable" / "replicas" / eid / "big.npz"
            out = {"fs": kind}
            for step, grow in (("first", 0), ("grown", MiB)):
                with open(f, "ab") as fh:
                    fh.write(os.urandom(grow))
                old = time.time() - 60
                os.utime(f, (old, old))  # settled: eligible at once
                want = f.stat().st_size
                subprocess.run(["sync"], check=True)
                before, t0 = write_bytes_of(procs[0].pid), time.perf_counter()
                httpx.post(f"http://127.0.0.1:{pe}/sync/trigger", timeout=5, trust_env=False)

                def confirmed(want=want):
                    e = [x for x in st.get(pe, "/sync/status")["files"] if x["path"] == "big.npz"]
                    return e and e[0]["size"] == want and e[0]["replicas"] >= 1

                st.wait(lambda want=want: replica.exists() and replica.stat().st_size == want, 900,
                        f"{step} replicated", step=0.01)
                st.wait(confirmed, 120, f"{step} confirmed", step=0.02)
                out[step] = {"write_bytes": write_bytes_of(procs[0].pid) - before,
                             "seconds": round(time.perf_counter() - t0, 3), "size": want}
            out["identical"] = filecmp.cmp(f, replica, shallow=False)
            out["received"] = st.get(pd, "/sync/status")["received"]
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024, help="the first version's size in MiB (default 1024)")
    ap.add_argument("--agents", action="store_true", help="also run two real agents (see above)")
    ap.add_argument("--dir", default=None, help="where the images go (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    for kind in ("xfs", "ext4"):
        why = cowfs.why_no_loop_fs(kind)
        if why is not None:
            print(f"sync_reflink: no loop-mounted {kind}: {why}", file=sys.stderr)
            return 2
    tmp = Path(tempfile.mkdtemp(prefix="p2pnode-bench-reflink-", dir=ns.dir))
    results = []
    try:
        for kind in ("xfs", "ext4"):
            (tmp / kind).mkdir()
            results.append(receiver_alone(kind, tmp / kind, ns.mib))
        if ns.agents:
            for kind in ("xfs", "ext4"):
                (tmp / f"agents-{kind}").mkdir()
                r = agents(kind, tmp / f"agents-{kind}", ns.mib)
                r["mode"] = "agents"
                results.append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bad = [r for r in results if not r["identical"]]
    xfs_grown = results[0]["grown"]["write_bytes"]
    fail = bad or xfs_grown > 2 * MiB + METADATA_BYTES
    if ns.json:
        print(json.dumps({"mib": ns.mib, "results": results}))
        return 1 if fail else 0
    print(f"{ns.mib} MiB (+777 bytes) file; receiver's write_bytes per version (the change: 1 MiB)")
    for r in results:
        who = "agent process" if r.get("mode") == "agents" else "receiver alone"
        line = f"  {r['fs']:5s} {who:15s}"
        for step in ("first", "grown", "changed"):
            if step in r:
                x = r[step]
                line += f"  {step}: {x['write_bytes'] / MiB:8.2f} MiB in {x['seconds']:6.2f} s"
        print(line + ("  byte-identical" if r["identical"] else "  REPLICA DIFFERS"))
    if xfs_grown > 2 * MiB + METADATA_BYTES:
        print(f"  FAIL: the grown version on XFS wrote {xfs_grown} bytes > 2 x 1 MiB + {METADATA_BYTES}")
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
