"""The fleet-wide predictor end to end, the long run (issue 39, item 8; the test is tests/test_predict_e2e.py): real
agents on loopback with fake GPUs of different classes (2xH100, 2xRTX 4090, 2xA100 by default) run four templates
of known run-time distributions for ``--seconds``. Every ``--poll`` seconds the bench asks a node that does not
lead for the leader's figures (``p2pnode jobs predict --json``, which fetches them from the leader) and reads every
node's ``jobs.db`` itself. Halfway through, the leader's medians are frozen as the predictions of the runs that end
after. It reports:

* when the leader's figures came from history for every template, from every node class, and when every
  template's fleet median first came within 20 % of the jobs.db median (seconds from the agents' start);
* per template: runs in the files and in the leader's row, the leader's p50 against the files' median at the end
  and the largest gap over the polls once history was used (the leader rebuilds at most every 30 s, so it lags;
  ``bimodal`` runs 1 s or 6 s at even odds, so its median may lie anywhere between and its gap swings: a median
  summarises it poorly, and the bench shows how poorly);
* per template: the mean error of the frozen median over the later runs against that of the declared
  ``max_runtime_s`` (the acceptance line of issue 27: the prediction errs less).

    python bench/predict_e2e.py                   # 3 agents, 6 minutes
    python bench/predict_e2e.py --agents 2 --seconds 180 --poll 2
    python bench/predict_e2e.py --json            # every poll as well
    python bench/predict_e2e.py --demo            # the demo catalog as shipped, one agent (about 2 minutes)

``--demo`` runs the demo catalog as shipped (``p2pnode/_demo_catalog``: selfplay of 20 s against a declared
600 s) on one agent with two fake H100s until 3 runs of two templates ended and the agent predicts them from
history, then freezes its medians and waits for 3 later runs: the medians must match ``jobs.db`` within 20 % and
err less than a tenth of the declared values (tests/test_predict_e2e.py runs the same catalog with 2 s jobs).
Measured on a 2-core machine: about 130 s.

A run of 2 agents for 150 s on a 2-core machine: history from both classes after 32 s, every median within 20 %
after 88 s, the later runs' mean error 0.3-3.3 s against 56-117 s declared.

Exit status 1 when a template's later runs are not predicted better than declared, or the figures never agreed.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from agents import AgentProc, free_port, wait_until  # noqa: E402

# template -> (the run's Python body, declared max_runtime_s); the bodies sleep a drawn time
TEMPLATES = {
    "quick": ("time.sleep(random.uniform(1.0, 2.0))", 60),
    "slow": ("time.sleep(random.uniform(3.0, 4.5))", 60),
    "skewed": ("time.sleep(min(20.0, random.lognormvariate(1.6, 0.5)))", 120),
    "bimodal": ("time.sleep(random.choice((1.0, 6.0)) + random.uniform(0.0, 0.5))", 120),
}
GPUS = ("2xH100", "2xRTX 4090", "2xA100")
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_MAX_SPAWNS_PER_MINUTE": "600", "P2PNODE_GUARD_CHECK_INTERVAL": "1"}


def catalog_text() -> str:
    out = []
    for name, (body, declared) in TEMPLATES.items():
        out.append(f'''[[job]]
name = "{name}"
kind = "selfplay"
config = "{name}"
argv = ["{{python}}", "-c", "import random, time; {body}"]
autonomous = true
max_concurrency = 2
max_runtime_s = {declared}
[job.resources]
num_gpus = 1
vram_gib = 2
''')
    return "\n".join(out)


def completed(agents: list[AgentProc], after: float = 0.0) -> dict[str, list[float]]:
    """``{template: [run time s]}`` of the runs that exited 0 and started after ``after`` (Unix time), every node's
    jobs.db."""
    out: dict[str, list[float]] = {t: [] for t in TEMPLATES}
    for a in agents:
        con = sqlite3.connect(a.data_dir / "jobs.db")
        try:
            for t, d in con.execute("SELECT template, ended_at - started_at FROM runs WHERE exit_status = 0 AND "
                                    "ended_at IS NOT NULL AND started_at > ?", (after,)):
                out.setdefault(t, []).append(d)
        except sqlite3.OperationalError:  # the agent has not made its table yet
            pass
        finally:
            con.close()
    return out


def predict(agents: list[AgentProc]) -> dict | None:
    """The leader's answer asked of a node that does not lead, or None (no leader yet, or no answer)."""
    try:
        leaders = {a.status()["election"]["leader"] for a in agents}
        ids = [a.status()["node"]["id"] for a in agents]
    except Exception:  # noqa: BLE001 - a slow answer: this poll is skipped
        return None
    if len(leaders) != 1 or None in leaders:
        return None
    other = next(a for a, i in zip(agents, ids) if i not in leaders)
    r = subprocess.run([sys.executable, "-m", "p2pnode", "jobs", "predict", "--json", "--url", other.url],
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else None


def _poll(agents: list[AgentProc], t: float) -> dict | None:
    reply = predict(agents)
    if reply is None or reply["answered_by"] == reply["asked"]:
        return None
    db = completed(agents)
    rows = {r["template"]: r for r in reply["predictions"] if r["node_class"] == ""}
    out: dict = {"t": round(t, 1), "classes": sorted({r["node_class"] for r in reply["predictions"]
                                                      if r["source"] == "history" and r["node_class"]})}
    for name in TEMPLATES:
        row, files = rows.get(name, {}), db.get(name, [])
        med = statistics.median(files) if files else None
        gap = (abs(row["runtime_p50_s"] - med) / med * 100 if row.get("source") == "history" and med else None)
        out[name] = {"source": row.get("source"), "runs": row.get("runs", 0), "db_runs": len(files),
                     "p50_s": row.get("runtime_p50_s"), "db_median_s": med, "gap_percent": gap}
    return out


def run(n: int, seconds: float, poll: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="p2pnode-predict-") as tmp:
        root = Path(tmp)
        cat = root / "catalog.toml"
        cat.write_text(catalog_text())
        ports = [free_port() for _ in range(n)]
        agents = [AgentProc(root / f"n{i}", p, "--no-mdns", "--fake-gpus", GPUS[i % len(GPUS)], "--catalog",
                            str(cat), *(["--join", f"127.0.0.1:{ports[0]}"] if i else []), env=ENV)
                  for i, p in enumerate(ports)]
        try:
            for a in agents:
                a.start()
            for a in agents:
                a.wait_ready()
            t0 = time.monotonic()
            polls: list[dict] = []
            frozen: dict[str, float] = {}
            cut = 0.0
            while time.monotonic() - t0 < seconds:
                p = _poll(agents, time.monotonic() - t0)
                if p is not None:
                    polls.append(p)
                if not frozen and time.monotonic() - t0 >= seconds / 2 and polls:
                    frozen = {t: polls[-1][t]["p50_s"] for t in TEMPLATES if polls[-1][t]["source"] == "history"}
                    cut = time.time()
                time.sleep(poll)
            later = completed(agents, cut) if cut else {}
            return _report(n, seconds, polls, frozen, later)
        finally:
            for a in agents:
                a.kill()


def _report(n: int, seconds: float, polls: list[dict], frozen: dict[str, float], later: dict) -> dict:
    def first(pred) -> float | None:
        return next((p["t"] for p in polls if pred(p)), None)

    history = first(lambda p: len(p["classes"]) >= min(n, len(GPUS)) and all(
        p[t]["source"] == "history" for t in TEMPLATES))
    within = first(lambda p: all(p[t]["gap_percent"] is not None and p[t]["gap_percent"] <= 20 for t in TEMPLATES))
    last = polls[-1] if polls else {}
    per: dict[str, dict] = {}
    for t, (_, declared) in TEMPLATES.items():
        gaps = [p[t]["gap_percent"] for p in polls if p[t]["gap_percent"] is not None]
        runs = later.get(t, [])
        per[t] = {**last.get(t, {}), "max_gap_percent": max(gaps) if gaps else None, "later_runs": len(runs),
                  "predicted_err_s": statistics.mean(abs(d - frozen[t]) for d in runs) if runs and t in frozen
                  else None,
                  "declared_err_s": statistics.mean(abs(d - declared) for d in runs) if runs else None}
    return {"agents": n, "seconds": seconds, "polls": len(polls), "history_after_s": history,
            "within_20_percent_after_s": within, "templates": per, "series": polls}


def demo(patience_s: float = 600.0) -> int:
    """The ``--demo`` run: prints one line per predicted template and returns the exit status."""
    from p2pnode.scheduler import load_catalog

    cat = Path(__file__).resolve().parent.parent / "p2pnode" / "_demo_catalog" / "catalog.toml"
    declared = {name: t.max_runtime_s for name, t in load_catalog(str(cat)).templates.items()}
    with tempfile.TemporaryDirectory(prefix="p2pnode-predict-demo-") as tmp:
        # (the node declares 8 CPUs: on a 2-core machine the demo's two trainings would take every CPU it has)
        a = AgentProc(Path(tmp) / "a", free_port(), "--no-mdns", "--fake-gpus", "2xH100", "--catalog", str(cat),
                      "--resource", "cpus=8", env=ENV)
        t0 = time.monotonic()
        try:
            a.start().wait_ready()
            wait_until(lambda: sum(len(v) >= 3 for v in completed([a]).values()) >= 2, patience_s, interval=1.0,
                       what="3 runs ended of two templates")

            def rows():
                db = completed([a])
                r = subprocess.run([sys.executable, "-m", "p2pnode", "jobs", "predict", "--json", "--url", a.url],
                                   capture_output=True, text=True, timeout=60)
                got = {p["template"]: p for p in json.loads(r.stdout)["predictions"] if p["node_class"] == ""
                       and p["source"] == "history" and 3 <= p["runs"] <= len(db.get(p["template"], []))}
                return len(got) >= 2 and (got, db)

            got, db = wait_until(rows, patience_s, interval=1.0, what="predictions from history")
            t_history = time.monotonic() - t0
            cut = time.time()

            def later():
                r = {t: v for t, v in completed([a], cut).items() if t in got and v}
                return sum(map(len, r.values())) >= 3 and r

            after = wait_until(later, patience_s, interval=1.0, what="3 later runs of predicted templates")
        finally:
            a.kill()
    ok = True
    print(f"demo catalog, 1 agent: predictions from history after {t_history:.0f} s, "
          f"done after {time.monotonic() - t0:.0f} s")
    for t, p in got.items():
        med = statistics.median(db[t])
        runs = after.get(t, [])
        pred = statistics.mean(abs(d - p["runtime_p50_s"]) for d in runs) if runs else None
        decl = statistics.mean(abs(d - declared[t]) for d in runs) if runs else None
        within = abs(p["runtime_p50_s"] - med) <= 0.2 * med
        ok = ok and within and (pred is None or pred < decl / 10)
        print(f"{t}: p50 {p['runtime_p50_s']:.1f} s over {p['runs']} runs (jobs.db median {med:.1f} s); "
              + (f"{len(runs)} later runs err {pred:.2f} s on average (declared: {decl:.0f} s)" if runs
                 else "no later run"))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=3, choices=range(2, 7), metavar="2-6")
    ap.add_argument("--seconds", type=float, default=360.0)
    ap.add_argument("--poll", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--demo", action="store_true", help="the demo catalog as shipped, one agent (about 2 minutes)")
    ns = ap.parse_args()
    if ns.demo:
        return demo()
    r = run(ns.agents, ns.seconds, ns.poll)
    ok = r["within_20_percent_after_s"] is not None and all(
        v["predicted_err_s"] is not None and v["predicted_err_s"] < v["declared_err_s"]
        for v in r["templates"].values())
    if ns.json:
        print(json.dumps(r, indent=2))
        return 0 if ok else 1
    print(f"{r['agents']} agents, {ns.seconds:g} s, {r['polls']} polls of the leader's figures; history from every "
          f"class after {r['history_after_s']} s, every median within 20 % after {r['within_20_percent_after_s']} s")
    print("TEMPLATE  DB RUNS  LEADER RUNS  P50 S  DB MEDIAN S  GAP %  MAX GAP %  LATER  PRED ERR S  DECL ERR S")

    def f(v, spec=".2f"):
        return "-" if v is None else format(v, spec)

    for t, v in r["templates"].items():
        print(f"{t:<9} {v.get('db_runs', 0):>7}  {v.get('runs', 0):>11}  {f(v.get('p50_s')):>5}  "
              f"{f(v.get('db_median_s')):>11}  {f(v.get('gap_percent'), '.1f'):>5}  {f(v['max_gap_percent'], '.1f'):>9}"
              f"  {v['later_runs']:>5}  {f(v['predicted_err_s']):>10}  {f(v['declared_err_s'], '.1f'):>10}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
