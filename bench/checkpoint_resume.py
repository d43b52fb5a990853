"""Issue 41's first two acceptance lines, measured: three agents in network namespaces (one durable without a GPU,
two ephemeral with a fake GPU), a training whose job steps once a second and writes a checkpoint holding its step
every 5 s (and on its checkpoint signal); once it has written two, at a seeded point within the next checkpoint
interval, the ephemeral node running it is killed (SIGKILL to every process of its namespace: agent, job wrapper,
job), or with ``--notice`` its agent gets SIGTERM (``on_agent_stop = "stop"``: the job gets SIGUSR1 and its stop
waits for a new checkpoint). The run (``tests/cknetns.py`` ``resume_run``) waits for the training to start on the
other ephemeral node.

Per seed, one table row: seconds after the kill until the durable node (the leader) saw the node suspect, then dead
(or leaving), the other node showed the training (placed, fetching), and its job started (ran again); the step it
resumed from, the newest checkpoint the durable node held whole at the kill (its held-checkpoints file's time), the
killed run's newest checkpoint and last step, the steps lost (last step - resumed), the sync lag (a checkpoint
written -> held by the durable node; median/max over the killed run), the most trainings of the config alive at once
(``/proc`` every 0.5 s), and with ``--notice`` the signalled checkpoint's step, when the job stopped and when (if
ever) the durable node held that checkpoint. A summary line follows; exits 1 when a run had two trainings at once,
resumed from older than the durable node held at the kill, or lost more than a checkpoint interval plus the sync lag
(5 steps + the run's max lag).

Needs root and ``ip netns``; each seed takes 30-60 s.

    sudo .venv/bin/python bench/checkpoint_resume.py --seeds 20
    sudo .venv/bin/python bench/checkpoint_resume.py --seeds 20 --notice
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from cknetns import CK_EVERY, ORPHAN_GRACE_S, STEP_S, resume_run  # noqa: E402


def bad(r: dict) -> list[str]:
    """What a run broke of the acceptance line (empty: nothing)."""
    out = []
    if r["most"] > 1:
        out.append("two trainings at once")
    if not r["resume_path"]:
        out.append("started without P2PNODE_RESUME_FROM")
    if r["held_at_kill"] is not None and r["resumed"] < r["held_at_kill"]:
        out.append("resumed from older than the durable node held")
    lag = math.ceil((r["sync_lag_s"] or [0, 0])[1] / STEP_S)
    if r["lost_steps"] > CK_EVERY + lag:
        out.append(f"lost {r['lost_steps']} steps > {CK_EVERY} + {lag}")
    return out


def row(r: dict, notice: bool) -> str:
    if "error" in r:
        return f"{r['seed']:>4}  error: {r['error']}"
    lag = r["sync_lag_s"] or ["-", "-"]
    s = (f"{r['seed']:>4} {r.get('suspect_s') or '-':>7} {r['dead_s'] or '-':>6} {r['placed_s'] or '-':>7} "
         f"{r['ran_again_s']:>6} "
         f"{r['resumed']:>7} {str(r['held_at_kill']):>5} {r['last_ck']:>7} {r['last_step']:>5} {r['lost_steps']:>5} "
         f"{lag[0]:>5}/{lag[1]:<5} {r['most']:>4}")
    if notice:
        held = r["signal_ck_held_s"]
        s += (f" {str(r['signal_ck']):>6} {str(r['job_stopped_s']):>7} "
              f"{'-' if held is None else held:>7}")
    return s + ("  " + "; ".join(bad(r)) if bad(r) else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="runs (default 20)")
    ap.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    ap.add_argument("--notice", action="store_true", help="SIGTERM to the agent instead of kill -9 of the node")
    ap.add_argument("--json", action="store_true", help="also print each run as a JSON line")
    ap.add_argument("--keep", type=Path, help="keep each run's directory (agents' logs, the job's steps) under this")
    a = ap.parse_args()
    head = (f"{'seed':>4} {'suspect':>7} {'dead':>6} {'placed':>7} {'again':>6} {'resumed':>7} {'held':>5} "
            f"{'last_ck':>7} "
            f"{'last':>5} {'lost':>5} {'lag med/max':>11} {'most':>4}")
    if a.notice:
        head += f" {'sig_ck':>6} {'stopped':>7} {'sig_held':>7}"
    print(f"kill {'SIGTERM to the agent (notice)' if a.notice else '-9 of the node'}; a checkpoint every "
          f"{CK_EVERY * STEP_S:g} s, orphan_grace_s {ORPHAN_GRACE_S:g}; seconds after the kill, steps")
    print(head, flush=True)
    runs = []
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        with tempfile.TemporaryDirectory(prefix="ck-resume-") as d:
            base = Path(d) if a.keep is None else a.keep / f"seed-{seed}"
            base.mkdir(parents=True, exist_ok=True)
            try:
                r = resume_run(base, seed=seed, notice=a.notice)
            except Exception as exc:  # one failed run is a result too: reported, the next seed runs
                r = {"seed": seed, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        runs.append(r)
        print(row(r, a.notice), flush=True)
        if a.json:
            print(json.dumps(r), flush=True)
    ok = [r for r in runs if "error" not in r]
    again = [r["ran_again_s"] for r in ok]
    lost = [r["lost_steps"] for r in ok]
    lags = [r["sync_lag_s"][1] for r in ok if r["sync_lag_s"]]
    failing = [r["seed"] for r in ok if bad(r)]
    line = (f"{len(ok)}/{len(runs)} runs completed; ran again after the kill: median "
            f"{statistics.median(again):.1f} s, max {max(again):.1f} s; resumed from the durable node's newest "
            f"held checkpoint in {sum(r['resumed'] == r['held_at_kill'] for r in ok)}, newer in "
            f"{sum(r['held_at_kill'] is not None and r['resumed'] > r['held_at_kill'] for r in ok)}, older in "
            f"{sum(r['held_at_kill'] is not None and r['resumed'] < r['held_at_kill'] for r in ok)}; steps lost: "
            f"median {statistics.median(lost):g}, max {max(lost)} (bound {CK_EVERY} + sync lag, max lag "
            f"{max(lags, default=0):.1f} s); at most {max(r['most'] for r in ok)} trainings at once"
            if ok else f"0/{len(runs)} runs completed")
    if a.notice and ok:
        held = [r for r in ok if r["signal_ck_held_s"] is not None]
        before = [r for r in held if r["job_stopped_s"] is not None and r["signal_ck_held_s"] <= r["job_stopped_s"]]
        line += (f"; the signalled checkpoint written in {sum(r['signal_ck'] is not None for r in ok)}, held by "
                 f"the durable node in {len(held)} ({len(before)} before the job stopped), resumed from exactly it "
                 f"in {sum(r['resumed_name'].endswith('-signal') for r in ok)}")
    print(line + (f"; failing seeds {failing}" if failing else ""))
    return 1 if failing or len(ok) < len(runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
