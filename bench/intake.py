"""Signed-snapshot intake against raw Ed25519 verification of the same envelopes (issue 43 item 3).

    python bench/intake.py                       # 1,000 fresh origins, 100 envelopes per request, 7 rounds
    python bench/intake.py --rounds 5 --json
    python bench/intake.py --profile             # cProfile of the intake path (top functions by own time)
    python bench/intake.py --tree /tmp/base      # the same fixture through another checkout's p2pnode
    python bench/intake.py --baselines all       # also the ratio to OpenSSL's and libsodium's verification
    python bench/intake.py --beside              # microseconds per envelope beside the signature check

The fixture: ``--origins`` fresh identities, each with one signed snapshot (4 GPUs and a full resource sample, as
large as a real member's: ``bench/member_cap.py``'s fake, sealed as a typed :class:`p2pnode.snapshot.Snapshot` as an
agent seals its own; ``--dict-bodies``: the map packed by msgpack as it was before 2026-11-30, keys in another order),
packed ``--per-request`` envelopes to a ``POST /gossip`` body with the sender's full digest (a push: step 3 of an
exchange).

Two measurements on the same envelopes, interleaved in every round (their order alternates):

* **raw**: :func:`p2pnode.identity.verify_signature` (the agent's one Ed25519 check, whatever library it calls)
  for every envelope, nothing else, its key cache cleared first as intake's is (the limit: intake can be no faster
  than its signature checks). ``--baselines`` adds the same loop through OpenSSL (``cryptography``:
  ``Ed25519PublicKey.from_public_bytes(key).verify(sig, body)``) and libsodium (PyNaCl:
  ``VerifyKey(key).verify(body, sig)``) directly, each in the same rounds, so a ratio measured with one library
  in the agent can be read against the other (whichever of them the agent calls).
* **intake**: every body through the real receiver path, :meth:`p2pnode.gossip.Gossiper.handle` on an empty
  :class:`p2pnode.gossip.ClusterState` configured as the agent configures it (role gate, member cap above the
  fixture, per-message budget of ``--per-request``): decode, bounds, duplicate/stale/cap checks, the key's
  derivation of the origin, the signature, the snapshot's decode and checks, install, the news log, the peer
  book, and the reply (encoded). The key cache is cleared before each round, so every origin is new to it.

``--beside``: the intake path with the signature check replaced by a no-op (``p2pnode.wire.verify_signature``),
in CPU microseconds per envelope: what intake costs beside the signature (median and best of the rounds).

Prints each round's envelopes per second of both and their ratio (intake / raw: 1.0 is the limit), the median
ratio, the ratio of the best round of each (on a loaded machine the steadier figure: other processes only ever
slow a round down), intake's time beside its signature checks (intake less raw, per envelope), and the load
average. For another library (``--baselines all``) the ratio is the one intake would have with that library in the
agent: its raw time over itself plus the same time beside the signature (``lib / (lib + intake - agent)``).
A round's ratio is taken within that round, so load that lasts shifts both alike; compare two trees by running them
alternately (``--tree``), as docs/benchmarks.md "Intake (issue 43 item 3)" did.
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
ap.add_argument("--baselines", choices=("agent", "all"), default="agent",
                help="raw verification through the agent's own check only, or also OpenSSL's and libsodium's "
                     "(each where installed)")
ap.add_argument("--beside", action="store_true",
                help="measure intake with the signature check replaced by a no-op: CPU microseconds per envelope")
ap.add_argument("--dict-bodies", action="store_true",
                help="snapshot bodies packed from a map by msgpack (keys in another order than an agent's)")
ap.add_argument("--profile", action="store_true", help="profile the intake path instead (cProfile)")
ap.add_argument("--json", action="store_true")
ns = ap.parse_args()
sys.path.insert(0, str(ns.tree.resolve()))

import msgspec  # noqa: E402

from p2pnode import identity, wire  # noqa: E402
from p2pnode.certs import RoleGate  # noqa: E402
from p2pnode.gossip import ClusterState, Gossiper, PeerBook  # noqa: E402
from p2pnode.identity import Identity  # noqa: E402
from p2pnode.snapshot import SCHEMA_VERSION, Snapshot  # noqa: E402
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


def sealed(ident: Identity) -> wire.Envelope:
    """One origin's signed snapshot: typed, as an agent seals its own (or the packed map, ``--dict-bodies``)."""
    snap = fake_snapshot(ident, ns.gpus)
    return seal_snapshot(ident, snap if ns.dict_bodies else msgspec.convert(snap, Snapshot))


def fixture() -> tuple[list, list[bytes]]:
    """The envelopes and the request bodies carrying them (each with the sender's full digest)."""
    sender = Identity.generate()
    envs = [sealed(i) for i in (Identity.generate() for _ in range(ns.origins))]
    digest = {e.origin: e.version for e in envs} if ns.digest == "full" else {}
    bodies = [encode_gossip(sender.node_id, "", digest, envs[k:k + ns.per_request])
              for k in range(0, len(envs), ns.per_request)]
    return envs, bodies


def fresh_keys() -> None:
    """Empty the agent's cache of parsed public keys (every ``functools`` cache in :mod:`p2pnode.identity`), so
    every origin is new to it, as in a flood of fresh origins."""
    for v in vars(identity).values():
        if callable(getattr(v, "cache_clear", None)):
            v.cache_clear()


def raw_agent(envs: list) -> float:
    """Seconds to verify every envelope's signature alone, by the agent's own check (fresh key cache)."""
    check = identity.verify_signature
    fresh_keys()
    t0 = time.process_time()
    for e in envs:
        if not check(e.key, e.sig, e.body):
            raise SystemExit("a fixture signature did not verify")
    return time.process_time() - t0


def raw_openssl(envs: list) -> float:
    """Seconds to verify every envelope through OpenSSL (``cryptography``) directly."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    load = Ed25519PublicKey.from_public_bytes
    t0 = time.process_time()
    for e in envs:
        load(e.key).verify(e.sig, e.body)
    return time.process_time() - t0


def raw_libsodium(envs: list) -> float:
    """Seconds to verify every envelope through libsodium (PyNaCl) directly."""
    from nacl.signing import VerifyKey
    t0 = time.process_time()
    for e in envs:
        VerifyKey(e.key).verify(e.body, e.sig)
    return time.process_time() - t0


def baselines() -> dict:
    """The raw verifications measured: the agent's, and with ``--baselines all`` each library installed."""
    out = {"agent": raw_agent}
    if ns.baselines == "all":
        for name, mod, fn in (("openssl", "cryptography", raw_openssl), ("libsodium", "nacl", raw_libsodium)):
            try:
                __import__(mod)
            except ImportError:
                print(f"({name}: {mod} is not installed here)", file=sys.stderr)
            else:
                out[name] = fn
    return out


def no_signature(key: bytes, sig: bytes, body: bytes) -> bool:
    """A signature check that passes without checking (``--beside``)."""
    return True


def intake(bodies: list[bytes], self_id: str) -> tuple[float, int]:
    """Seconds for every body through Gossiper.handle on a fresh state; the snapshots it accepted."""
    fresh_keys()
    state = ClusterState(self_id, max_members=ns.origins + 2, max_verifications=ns.per_request,
                         roles=RoleGate(max_members=ns.origins + 2), roles_wall=time.time())
    gossiper = Gossiper(state, PeerBook(self_id), self_addr="", fanout=3, rng=__import__("random").Random(1))
    t0 = time.process_time()
    for b in bodies:
        reply = gossiper.handle(b, time.monotonic())
        if reply.status != 200:
            raise SystemExit(f"intake refused a fixture body: {reply.status} {dict(state.rejected)}")
    return time.process_time() - t0, len(state)


def beside(bodies: list[bytes], self_id: str, n: int) -> dict:
    """Intake without its signature checks, CPU microseconds per envelope per round."""
    real = wire.verify_signature
    wire.verify_signature = no_signature  # what open_envelopes calls
    try:
        intake(bodies, self_id)  # warm-up
        us = []
        for _ in range(ns.rounds):
            t, held = intake(bodies, self_id)
            if held != n:
                raise SystemExit(f"intake held {held} of {n} origins")
            us.append(t / n * 1e6)
    finally:
        wire.verify_signature = real
    return {"tree": str(ns.tree), "beside_us": us, "median_us": statistics.median(us), "best_us": min(us),
            "loadavg": os.getloadavg()}


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
    if ns.beside:
        res = beside(bodies, self_id, n)
        if ns.json:
            print(json.dumps(res))
        else:
            print(f"beside the signature: median {res['median_us']:.1f} µs, best {res['best_us']:.1f} µs an envelope "
                  f"({ns.tree}; {ns.rounds} rounds; load average {' '.join(f'{x:.2f}' for x in res['loadavg'])})")
        return 0
    raws = baselines()
    for fn in raws.values():
        fn(envs)
    intake(bodies, self_id)  # warm-up (imports, first decodes)
    rounds = []
    for r in range(ns.rounds):
        steps = [("intake", lambda: intake(bodies, self_id)[0])]
        steps += [(b, lambda fn=fn: fn(envs)) for b, fn in raws.items()]
        k = r % len(steps)
        times = {name: f() for name, f in steps[k:] + steps[:k]}  # the order rotates from round to round
        over = times["intake"] - times["agent"]  # intake's work beside its signature checks, this round
        rounds.append({"intake_per_s": n / times["intake"], "beside_us": over / n * 1e6,
                       **{f"{b}_per_s": n / times[b] for b in raws},
                       **{f"ratio_{b}": times[b] / (times[b] + over) for b in raws}})
    best_in = max(r["intake_per_s"] for r in rounds)
    res = {"tree": str(ns.tree), "origins": n, "per_request": ns.per_request, "body_bytes": len(bodies[0]),
           "rounds": rounds, "best_intake_per_s": best_in, "loadavg": os.getloadavg()}
    res["median_beside_us"] = statistics.median(r["beside_us"] for r in rounds)
    best_s = {b: 1 / max(r[f"{b}_per_s"] for r in rounds) for b in raws}  # seconds an envelope, best round
    best_over = 1 / best_in - best_s["agent"]
    for b in raws:
        res[f"median_ratio_{b}"] = statistics.median(r[f"ratio_{b}"] for r in rounds)
        res[f"best_{b}_per_s"] = 1 / best_s[b]
        res[f"best_ratio_{b}"] = best_s[b] / (best_s[b] + best_over)
    res["median_ratio"], res["best_ratio"] = res["median_ratio_agent"], res["best_ratio_agent"]
    if ns.json:
        print(json.dumps(res))
        return 0
    for i, r in enumerate(rounds):
        print(f"round {i}: intake {r['intake_per_s']:8.0f}/s (beside {r['beside_us']:5.1f} µs)  " + "  ".join(
            f"{b} {r[f'{b}_per_s']:8.0f}/s ratio {r[f'ratio_{b}']:.3f}" for b in raws))
    for b in raws:
        print(f"raw = {b}: median ratio {res[f'median_ratio_{b}']:.3f}; best of each: raw "
              f"{res[f'best_{b}_per_s']:.0f}/s, intake {best_in:.0f}/s, ratio {res[f'best_ratio_{b}']:.3f}")
    print(f"intake's work beside the signature: median {res['median_beside_us']:.1f} µs an envelope (intake less "
          "raw = agent, each round)")
    print(f"({ns.tree}; {n} origins, {ns.per_request} per request, {len(bodies[0])} bytes a body; the best round of "
          "each is the steadier figure on a loaded machine; load average "
          f"{' '.join(f'{x:.2f}' for x in res['loadavg'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
