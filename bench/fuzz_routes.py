"""Route fuzz run (issue 22, item 7): hostile requests to every HTTP route of real agents, in three configurations.

``--cases`` requests (default 50,000) spread evenly over every route of the agent (:data:`fuzz.routes.ROUTES`,
checked against the app's router first) and over the configurations (``--configs``: ``open``, ``token-read``
(token mode, a keyring token, ``agent.read_token`` set), ``open-read``), from a seeded generator
(``tests/fuzz/routes.py``: the same one the normal suite drives from hypothesis). One long-lived agent per
configuration; after every case no 5xx, no traceback in its log, no state change from a refused request, its
own snapshot still publishing; after each route's batch and at the end the agent is stopped (SIGTERM) and started
again on its data dir and must come back healthy. Distinct failures are printed with their smallest request and
whether that request reproduces alone.

Exit status 1 on any failure.

    .venv/bin/python bench/fuzz_routes.py                          # 50,000 cases
    .venv/bin/python bench/fuzz_routes.py --cases 3000 --seed 7 --configs open
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fuzz.routes import AGENT_CONFIGS, ROUTES, RouteFuzzer, Stats, app_routes, sign_check  # noqa: E402


def run_config(tmp: Path, name: str, cases_per_route: int, seed: int, progress_s: float) -> RouteFuzzer:
    fz = RouteFuzzer(tmp / name, AGENT_CONFIGS[name])
    fz.start()
    print(f"[{name}] agent {fz.ctx.node_id} on port {fz.proc.port}, signing with {sign_check(fz.ctx)}", flush=True)
    last = time.monotonic()
    try:
        for i, spec in enumerate(ROUTES):
            fz.refresh_context()
            rng = random.Random(f"{seed}/{name}/{spec.key}")
            for _ in range(cases_per_route):
                fz.run_case(spec, rng.getrandbits(64))
                if time.monotonic() - last > progress_s:
                    last = time.monotonic()
                    s = fz.stats
                    print(f"[{name}] {s.cases} cases, route {i + 1}/{len(ROUTES)} {spec.key}; failures "
                          f"{len(s.failures)}", flush=True)
            fz.restart(spec.key)
        fz.restart("end")
        for f in list(fz.stats.failures.values()):
            fz.replay(f)
    finally:
        fz.close()
    return fz


def table(rows: list[tuple[str, Stats]]) -> str:
    head = ("| configuration | cases | 5xx | tracebacks | state changes on refusal | quarantines | restarts OK "
            "| heartbeat OK | cases/s |")
    out = [head, "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for name, s in rows:
        rate = s.cases / s.seconds if s.seconds else 0.0
        out.append(f"| {name} | {s.cases:,} | {s.x5xx} | {s.tracebacks} | {s.state_changes} | {s.quarantines} | "
                   f"{s.restarts_ok}/{s.restarts} | {'yes' if s.heartbeat_ok else 'NO'} | {rate:.1f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=50_000, help="requests in all (default 50,000)")
    ap.add_argument("--configs", default="open,token-read,open-read", help="comma-separated (default: all three)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--progress-s", type=float, default=60.0)
    args = ap.parse_args()
    served = app_routes()
    fuzzed = {(r.method, r.path) for r in ROUTES}
    if served != fuzzed:
        print(f"route table out of date: not fuzzed {sorted(served - fuzzed)}, gone {sorted(fuzzed - served)}")
        return 1
    names = [n for n in args.configs.split(",") if n]
    per_route = max(1, -(-args.cases // (len(names) * len(ROUTES))))  # at least --cases in all
    print(f"{per_route * len(names) * len(ROUTES):,} cases: {per_route} per route, {len(ROUTES)} routes, "
          f"configurations {', '.join(names)}, seed {args.seed}", flush=True)
    rows: list[tuple[str, Stats]] = []
    total = Stats()
    failures = []
    with tempfile.TemporaryDirectory(prefix="p2pnode-routefuzz-") as t:
        for name in names:
            fz = run_config(Path(t), name, per_route, args.seed, args.progress_s)
            print(f"[{name}] " + fz.stats.summary().replace("\n", f"\n[{name}] "), flush=True)
            rows.append((name, fz.stats))
            total.merge(fz.stats)
            failures += list(fz.stats.failures.values())
    rows.append(("all", total))
    print()
    print(table(rows))
    for f in failures:
        print()
        print(f.report())
    print("FAIL" if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
