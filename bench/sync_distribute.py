"""Distribution, durable to subscribers (issue 40, item 3): a file published on a durable node reaches N subscribers
in network namespaces; the publisher's bytes sent (its interface's kernel counter) and the time, beside N sequential
whole-file copies of the same file over the same links. Needs root (``ip netns``) and ``tc`` for ``--mbit``.

    python bench/sync_distribute.py                        # the acceptance: 1 GiB to 4 subscribers
    python bench/sync_distribute.py --mib 64 --mbit 400    # a small run, every host's upload shaped to 400 Mbit/s
    python bench/sync_distribute.py --json

Hosts: ``n0`` the publisher (tagged durable), ``n1..nN`` subscribers (tagged training, pinning the operator key),
and one more subscriber of the same tag that does not pin it (it must fetch nothing). With ``--mbit`` each host's
egress is shaped (``tc tbf``), so the publisher's upload is the bottleneck of the copies, as on a real fleet. The
file is published with ``p2pnode sync publish --key`` run inside the publisher's namespace; every subscriber's
``<data_dir>/published/<name>`` is compared byte for byte. Then the agents stop and the same file is copied to each
subscriber in turn over HTTP (``python -m http.server`` in the publisher's namespace). Exit 1 when a copy differs,
the unpinned subscriber fetched anything, or the publisher sent more than 2 copies during distribution.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from agents import AgentProc, wait_until  # noqa: E402
from netns import NetnsLab  # noqa: E402

MiB = 2**20
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SYNC_INTERVAL_S": "1", "P2PNODE_SYNC_DATA_PORT": "-1"}


def tx_bytes(lab: NetnsLab, i: int) -> int:
    """Bytes host ``i``'s interface sent (kernel counter)."""
    out = lab.sh(lab.names[i], "cat", f"/sys/class/net/{lab.prefix}h{i}/statistics/tx_bytes")
    return int(out.stdout.strip())


def shape(lab: NetnsLab, i: int, mbit: int) -> None:
    lab.sh(lab.names[i], "tc", "qdisc", "add", "dev", f"{lab.prefix}h{i}", "root", "tbf", "rate", f"{mbit}mbit",
           "burst", "256kb", "latency", "100ms")


def inside_json(lab: NetnsLab, i: int, path: str) -> dict:
    out = lab.sh(lab.names[i], sys.executable, "-c",
                 "import json,urllib.request as u;"
                 f"print(json.dumps(json.load(u.urlopen('http://{lab.addrs[i]}:8770{path}',timeout=5))))")
    return json.loads(out.stdout)


def operator_key(work: Path) -> tuple[Path, str]:
    from p2pnode._ed25519 import pkcs8_pem
    from p2pnode.identity import Identity
    from p2pnode.synccore import publisher_text

    ident = Identity.generate()
    path = work / "operator.key"
    path.write_bytes(pkcs8_pem(ident.private_key))
    path.chmod(0o600)
    return path, publisher_text(ident.public_key)


def write_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 * MiB)
            f.write(os.urandom(n))
            left -= n


def distribute(lab: NetnsLab, work: Path, src: Path, subs: int, key: Path, pinned: str, timeout_s: float) -> dict:
    procs: list[AgentProc] = []
    n = subs + 2
    try:
        for i in range(n):
            tag = "durable" if i == 0 else "training"
            env = {**ENV, **({"P2PNODE_SYNC_PUBLISHERS": pinned} if i < n - 1 else {})}
            args = ["--no-mdns", "--tag", tag] + (["--join", f"{lab.addrs[0]}:8770"] if i else [])
            procs.append(AgentProc(work / f"n{i}", 8770, *args, bind=lab.addrs[i], prefix=lab.prefix_for(i),
                                   env=env).start())
        wait_until(lambda: len(inside_json(lab, 0, "/members")["members"]) >= n, 60, interval=0.5,
                   what="every member known", retry_on=(Exception,))
        before = tx_bytes(lab, 0)
        t0 = time.monotonic()
        out = lab.sh(lab.names[0], sys.executable, "-m", "p2pnode", "sync", "publish", str(src), "--to",
                     "tag:training", "--key", str(key), "--url", f"http://{lab.addrs[0]}:8770")
        assert out.returncode == 0, out.stderr
        done_at: dict[int, float] = {}

        def all_done() -> bool:
            for i in range(1, subs + 1):
                if i not in done_at:
                    p = work / f"n{i}" / "published" / src.name
                    if p.exists() and p.stat().st_size == src.stat().st_size and \
                            inside_json(lab, i, "/sync/status")["distribution"]["updated"] >= 1:
                        done_at[i] = time.monotonic() - t0
            return len(done_at) == subs

        wait_until(all_done, timeout_s, interval=0.25, what="every subscriber's copy", retry_on=(Exception,))
        seconds = time.monotonic() - t0
        sent = tx_bytes(lab, 0) - before
        same = all(filecmp.cmp(src, work / f"n{i}" / "published" / src.name, shallow=False)
                   for i in range(1, subs + 1))
        views = {i: inside_json(lab, i, "/sync/status")["distribution"] for i in range(n)}
        unpinned = views[n - 1]
        return {"seconds": round(seconds, 2), "publisher_sent_bytes": sent, "identical": same,
                "done_at_s": {f"n{i}": round(t, 2) for i, t in sorted(done_at.items())},
                "served_bytes": {f"n{i}": v["bytes_served"] for i, v in views.items()},
                "unpinned_fetched_bytes": sum(unpinned["bytes_fetched"].values()),
                "unpinned_refused": unpinned["refused"]}
    finally:
        for p in procs:
            p.kill()


def sequential_copies(lab: NetnsLab, src: Path, subs: int) -> dict:
    server = subprocess.Popen([*lab.prefix_for(0), sys.executable, "-m", "http.server", "8000", "--bind",
                               lab.addrs[0], "--directory", str(src.parent)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"http://{lab.addrs[0]}:8000/{src.name}"
        probe = ("import urllib.request as u,sys\n"
                 "r=u.urlopen(sys.argv[1],timeout=600)\nn=0\n"
                 "while True:\n b=r.read(8<<20)\n if not b: break\n n+=len(b)\nprint(n)")
        wait_until(lambda: lab.sh(lab.names[1], sys.executable, "-c",
                                  f"import urllib.request as u;u.urlopen('http://{lab.addrs[0]}:8000/',timeout=2)"),
                   30, interval=0.25, what="the copy server", retry_on=(Exception,))
        before = tx_bytes(lab, 0)
        t0 = time.monotonic()
        for i in range(1, subs + 1):
            got = int(lab.sh(lab.names[i], sys.executable, "-c", probe, url).stdout.strip())
            assert got == src.stat().st_size, got
        return {"seconds": round(time.monotonic() - t0, 2), "publisher_sent_bytes": tx_bytes(lab, 0) - before}
    finally:
        server.kill()
        server.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="file size in MiB (default 1024)")
    ap.add_argument("--subs", type=int, default=4, help="pinned subscribers (default 4)")
    ap.add_argument("--mbit", type=int, default=0, help="shape every host's egress to this many Mbit/s (0: none)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    lab = NetnsLab(ns.subs + 2, net=7)
    try:
        if ns.mbit:
            for i in range(ns.subs + 2):
                shape(lab, i, ns.mbit)
        with tempfile.TemporaryDirectory(prefix="p2pnode-dist-") as tmp:
            work = Path(tmp)
            key, pinned = operator_key(work)
            src = work / "src" / "model.safetensors"
            src.parent.mkdir()
            size = ns.mib * MiB + 777
            write_file(src, size)
            dist = distribute(lab, work, src, ns.subs, key, pinned, ns.timeout)
            copies = sequential_copies(lab, src, ns.subs)
    finally:
        lab.close()
    res = {"file_bytes": size, "subscribers": ns.subs, "mbit": ns.mbit, "distribution": dist,
           "sequential_copies": copies}
    ok = dist["identical"] and dist["unpinned_fetched_bytes"] == 0 and dist["publisher_sent_bytes"] <= 2 * size
    if ns.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{ns.mib} MiB to {ns.subs} subscribers{f' ({ns.mbit} Mbit/s links)' if ns.mbit else ''}: "
              f"distribution {dist['seconds']} s, the publisher sent {dist['publisher_sent_bytes'] / size:.2f} copies "
              f"({dist['publisher_sent_bytes']} bytes, interface counter); {ns.subs} sequential copies "
              f"{copies['seconds']} s ({copies['publisher_sent_bytes'] / size:.2f} copies); every copy identical: "
              f"{dist['identical']}; unpinned subscriber fetched {dist['unpinned_fetched_bytes']} bytes "
              f"(refused {dist['unpinned_refused']}); served {dist['served_bytes']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
