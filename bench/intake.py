"""Signed-snapshot intake against raw Ed25519 verification of the same envelopes (issue 43 item 3).

    python bench/intake.py                       # 1,000 fresh origins, 100 envelopes per request, 7 rounds
    python bench/intake.py --rounds 5 --json
    python bench/intake.py --profile             # cProfile of the intake path (top functions by own time)
    python bench/intake.py --tree /tmp/base      # the same fixture through another checkout's p2pnode

The fixture: ``--origins`` fresh identities, each with one signed snapshot (4 GPUs and a full resource sample, as
large as a real member's: ``bench/member_cap.py``'s fake), packed ``--per-request`` envelopes to a ``POST
/gossip`` body with the sender's full digest (a push: step 3 of an exchange).

Two measurements on the same envelopes, interleaved in every round (their order alternates):

* **raw**: ``Ed25519PublicKey.from_public_bytes(key).verify(sig, body)`` for every envelope, nothing else
  (the limit: intake can be no faster than its signature checks).
* **intake**: every body through the real receiver path, :meth:`p2pnode.gossip.Gossiper.handle` on an empty
  :class:`p2pnode.gossip.ClusterState` configured as the agent configures it (role gate, member cap above the
  fixture, per-message budget of ``--per-request``): decode, bounds, duplicate/stale/cap checks, the key's
  derivation of the origin, the signature, the snapshot's decode and checks, install, the news log, the peer
  book, and the reply (encoded). The key cache is cleared before each round, so every origin is new to it.

Prints each round's envelopes per second of both and their ratio (intake / raw: 1.0 is the limit), the median
ratio, the ratio of the best round of each (on a loaded machine the steadier figure: other processes only ever
slow a round down), and the load average. A round's ratio is taken within that round, so load that lasts shifts
both alike; compare two trees by running them alternately (``--tree``), as docs/benchmarks.md "Intake (issue 43
item 3)" did.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--origins", type=int, default=1000, help="fresh origins (one envelope each)")
ap.add_argument("--per-request", type=int, default=100, help="envelopes per POST /gossip body")
ap.add_argument("--gpus", type=int, default=4, help="GPUs per fake member")
ap.add_argument("--rounds", type=int, default=15)
ap.add_argument("--digest", choices=("full", "none"), default="full",
                help="the sender's digest in each body: every origin it pushes (a push), or none (a first contact)")
ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent,
                help="checkout whose p2pnode is measured (default: this one)")
ap.add_argument("--profile", action="store_true", help="profile the intake path instead (cProfile)")
ap.add_argument("--json", action="store_true")
ns = ap.parse_args()
sys.path.insert(0, str(ns.tree.resolve()))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # noqa: E402

from p2pnode import identity  # noqa: E402
from p2pnode.certs import RoleGate  # noqa: E402
from p2pnode.gossip import ClusterState, Gossiper, PeerBook  # noqa: E402
from p2pnode.identity import Identity  # noqa: E402
from p2pnode.snapshot import SCHEMA_VERSION  # noqa: E402
from p2pnode.wire import decode_gossip, encode_gossip, seal_snapshot  # noqa: E402

GIB = 2**30


def fake_snapshot(ident: Identity, gpus: int) -> dict:
    """A member's snapshot as large as a real one (``bench/member_cap.py``'s fake)."""
    return {"schema": SCHEMA_VERSION, "origin": ident.node_id, "version": 1, "addr": "", "tags": [],
            "leaving": False, "started_at": time.time() - 3600, "ts": time.time(), "agent_version": "0.2.0",
            "trust": "open", "membership": {"incarnation": 1},
            "guard": {"ratio": 0.25}, "resources": {
                "cpu_percent": 12.5, "cpu_count": 64, "load_avg": [1.0, 1.0, 1.0], "mem_total_bytes": 512 * GIB,
                "mem_available_bytes": 400 * GIB, "mem_used_bytes": 112 * GIB, "mem_percent": 21.9,
                "disk_path": "/data/p2pnode", "disk_total_bytes": 4000 * GIB, "disk_used_bytes": 1000 * GIB,
                "disk_free_bytes": 3000 * GIB, "disk_percent": 25.0, "gpu_source": "nvml",
                "gpus": [{"index": i, "name": "NVIDIA GeForce RTX 4090", "uuid": f"GPU-{ident.node_id}-{i}",
                          "util_percent": 50.0, "mem_used_bytes": 10 * GIB, "mem_total_bytes": 24 * GIB,
                          "temperature_c": 60.0, "power_w": 300.0} for i in range(gpus)]}}


def fixture() -> tuple[list, list[bytes]]:
    """The envelopes and the request bodies carrying them (each with the sender's full digest)."""
    sender = Identity.generate()
    envs = [seal_snapshot(i, fake_snapshot(i, ns.gpus)) for i in (Identity.generate() for _ in range(ns.origins))]
    digest = {e.origin: e.version for e in envs} if ns.digest == "full" else {}
    bodies = [encode_gossip(sender.node_id, "", digest, envs[k:k + ns.per_request])
              for k in range(0, len(envs), ns.per_request)]
    return envs, bodies


def raw(envs: list) -> float:
    """Seconds to verify every envelope's signature alone."""
    t0 = time.process_time()
    for e in envs:
        Ed25519PublicKey.from_public_bytes(e.key).verify(e.sig, e.body)
    return time.process_time() - t0


def intake(bodies: list[bytes], self_id: str) -> tuple[float, int]:
    """Seconds for every body through Gossiper.handle on a fresh state; the snapshots it accepted."""
    identity._public_key.cache_clear()  # every origin is new to the key cache, as in a flood of fresh origins
    state = ClusterState(self_id, max_members=ns.origins + 2, max_verifications=ns.per_request,
                         roles=RoleGate(max_members=ns.origins + 2), roles_wall=time.time())
    gossiper = Gossiper(state, PeerBook(self_id), self_addr="", fanout=3, rng=__import__("random").Random(1))
    t0 = time.process_time()
    for b in bodies:
        reply = gossiper.handle(b, time.monotonic())
        if reply.status != 200:
            raise SystemExit(f"intake refused a fixture body: {reply.status} {dict(state.rejected)}")
    return time.process_time() - t0, len(state)


def main() -> int:
    envs, bodies = fixture()
    assert all(not decode_gossip(b).bad_envelopes for b in bodies)
    self_id = Identity.generate().node_id
    n = len(envs)
    if ns.profile:
        prof = cProfile.Profile()
        for _ in range(ns.rounds):
            prof.enable()
            intake(bodies, self_id)
            prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
        return 0
    raw(envs), intake(bodies, self_id)  # warm-up (imports, first decodes)
    rounds = []
    for r in range(ns.rounds):
        if r % 2:
            t_in, held = intake(bodies, self_id)
            t_raw = raw(envs)
        else:
            t_raw = raw(envs)
            t_in, held = intake(bodies, self_id)
        if held != n:
            raise SystemExit(f"intake held {held} of {n} origins")
        rounds.append({"raw_per_s": n / t_raw, "intake_per_s": n / t_in, "ratio": t_raw / t_in})
    best_raw, best_in = max(r["raw_per_s"] for r in rounds), max(r["intake_per_s"] for r in rounds)
    res = {"tree": str(ns.tree), "origins": n, "per_request": ns.per_request, "body_bytes": len(bodies[0]),
           "rounds": rounds, "median_ratio": statistics.median(r["ratio"] for r in rounds),
           "best_raw_per_s": best_raw, "best_intake_per_s": best_in, "best_ratio": best_in / best_raw,
           "loadavg": os.getloadavg()}
    if ns.json:
        print(json.dumps(res))
        return 0
    for i, r in enumerate(rounds):
        print(f"round {i}: raw {r['raw_per_s']:8.0f}/s  intake {r['intake_per_s']:8.0f}/s  ratio {r['ratio']:.3f}")
    print(f"best of each: raw {best_raw:.0f}/s, intake {best_in:.0f}/s, ratio {res['best_ratio']:.3f} (the least "
          "disturbed round of each: on a loaded machine the steadier figure)")
    print(f"median ratio {res['median_ratio']:.3f} ({ns.tree}; {n} origins, {ns.per_request} per request, "
          f"{len(bodies[0])} bytes a body; load average {' '.join(f'{x:.2f}' for x in res['loadavg'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
