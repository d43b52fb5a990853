"""Issue 41's fetch acceptance line, measured with real agents in network namespaces (``tests/cknetns.py``
``fetch_run``): one durable node without a GPU and two ephemeral ones with a fake GPU; the training's job writes one
checkpoint of ``--size`` bytes (random) at its start; once the durable node holds it whole:

* **clean**: the node running the training is killed (every process of its namespace), so the durable node is the
  only holder; the other ephemeral node is given the training and fetches the checkpoint from it over the veth
  links (block hashes first, ``GET /sync/checkpoint/file?part=hashes``; then the bytes over the durable node's data
  channel, each block verified as it lands, fsync, rename).
* **corrupt**: 64 bytes in the middle block of the durable node's replica are flipped (size and mtime kept), then
  the node running the training is cordoned and its job stopped (``p2pnode node cordon``, ``p2pnode jobs stop``),
  so it stays up as a second holder; the taker must refuse the durable node's copy and fetch from the other.

The fetch's time is the taker's own account (``/jobs`` goodput ``fetch_s``: the time the job was ``fetching``:
a refresh of what the members hold, the fetch, verification, fsync); the reference is ``cp`` + ``sync FILE`` of the
same file on the same machine (median of three: before, between, after the fetch). The acceptance asks for at
least 0.6 of that throughput. What the ratio weighs: the fetch crosses a veth pair (``sendfile`` on the durable
node, ``splice`` on the taker; from a holder without a data channel, such as the ephemeral origin in the corrupt
case, two agents' HTTP stacks) and hashes every block on the taker, while ``cp`` does neither; both write and fsync
1 GiB on the same disk. ``split`` is the taker's own account (its log): the block hashes, the data channel, HTTP.

Needs root and ``ip netns``; a 1 GiB run takes 2-4 minutes and 4 GiB of disk.

    sudo .venv/bin/python bench/checkpoint_fetch.py --size-mib 1024 --runs 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from cknetns import fetch_run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="the checkpoint's size in MiB (default 1024)")
    ap.add_argument("--runs", type=int, default=1, help="runs of each case (default 1)")
    ap.add_argument("--only", choices=("clean", "corrupt"), help="one case only")
    ap.add_argument("--rate-mbit", type=int, help="shape what reaches the taker to this rate (tc tbf on its bridge "
                    "port): a fetch longer than the HTTP server's 30 s read_timeout")
    a = ap.parse_args()
    size = a.size_mib << 20
    cases = [a.only] if a.only else ["clean", "corrupt"]
    print(f"checkpoint of {a.size_mib} MiB; MB/s = 10^6 bytes a second"
          + (f"; the taker's link shaped to {a.rate_mbit} Mbit/s" if a.rate_mbit else ""))
    print(f"{'case':>8} {'fetch_s':>8} {'MB/s':>7} {'cp+sync_s':>10} {'MB/s':>7} {'ratio':>6}  same  cut_off  refused")
    rows = []
    for case in cases:
        for _ in range(a.runs):
            with tempfile.TemporaryDirectory(prefix="ck-fetch-") as d:
                try:
                    r = fetch_run(Path(d), size=size, corrupt=case == "corrupt", rate_mbit=a.rate_mbit)
                except Exception as exc:  # a failed run is a result too
                    print(f"{case:>8} error: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    rows.append({"case": case, "error": str(exc)[:300]})
                    continue
            r["case"] = case
            r["ratio"] = r["cp_sync_s"] / r["fetch_s"]
            rows.append(r)
            print(f"{case:>8} {r['fetch_s']:>8.2f} {size / r['fetch_s'] / 1e6:>7.1f} {r['cp_sync_s']:>10.2f} "
                  f"{size / r['cp_sync_s'] / 1e6:>7.1f} {r['ratio']:>6.2f}  {str(r['same']):>4}  {r['cut_off']:>7}  "
                  f"{len(r['refusals'])}", flush=True)
            print("         " + json.dumps({k: r[k] for k in ("fetch_window_s", "cp_sync_all_s", "refusals",
                                                                "block", "blocks", "split")}), flush=True)
    ok = [r for r in rows if "error" not in r]
    clean = [r["ratio"] for r in ok if r["case"] == "clean"]
    bad = [r for r in ok if r["case"] == "corrupt"]
    print(f"{len(ok)}/{len(rows)} runs completed"
          + (f"; clean fetch/cp+sync throughput ratio median {statistics.median(clean):.2f} (acceptance >= 0.6)"
             if clean else "")
          + (f"; corrupt replica refused in {sum(bool(r['refusals']) for r in bad)}/{len(bad)}, the fetched file "
             f"equal to the origin's in {sum(r['same'] for r in bad)}/{len(bad)}" if bad else ""))
    return 0 if ok and all(r["same"] for r in ok) and all(r["refusals"] for r in bad) else 1


if __name__ == "__main__":
    raise SystemExit(main())
