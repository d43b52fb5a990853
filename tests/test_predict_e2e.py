"""The fleet-wide predictor end to end (issue 27 acceptance): two agents on loopback with fake GPUs run jobs of
varied lengths; ``p2pnode jobs predict --json`` (asked of the node that does not lead: it asks the leader) matches
an independent query of every node's ``jobs.db`` within 20 %, and its predictions of the runs that come after
err less than the catalog's declared values.

Every wait is on its condition, polled, and ends as soon as it holds; its deadline (``PATIENCE_S``) is for a loaded
machine (a second suite beside this one: a quiet run takes about 45 s). The longer run, with more agents and
templates and the leader's figures followed over minutes, is ``bench/predict_e2e.py``."""

import json
import sqlite3
import statistics
import subprocess
import sys
import time

import pytest
from agents import AgentProc, free_port, wait_until

from p2pnode.node._jobs import PREDICTOR_REFRESH_S

pytestmark = pytest.mark.slow

CATALOG = """
[[job]]
name = "quick"
kind = "selfplay"
config = "a"
argv = ["{python}", "-c", "import random, time; time.sleep(random.uniform(1.0, 2.0))"]
autonomous = true
max_concurrency = 2
max_runtime_s = 60
[job.resources]
num_gpus = 1
vram_gib = 2

[[job]]
name = "slow"
kind = "selfplay"
config = "b"
argv = ["{python}", "-c", "import random, time; time.sleep(random.uniform(3.0, 4.5))"]
autonomous = true
max_concurrency = 2
max_runtime_s = 60
[job.resources]
num_gpus = 1
vram_gib = 2
"""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_MAX_SPAWNS_PER_MINUTE": "600", "P2PNODE_GUARD_CHECK_INTERVAL": "1"}
TEMPLATES = ("quick", "slow")
# The deadline of each wait below: runs start and end later, and the leader rebuilds its predictor at most every
# PREDICTOR_REFRESH_S, on a machine that is running other work (the 90 s this file waited for the leader's figures
# failed twice beside a second suite)
PATIENCE_S = max(240.0, 4 * PREDICTOR_REFRESH_S)


def completed(procs, after=0.0):
    """``{template: [run time s]}`` of the runs that exited with status 0 (started after ``after``, Unix time),
    straight from every node's jobs.db."""
    out: dict[str, list[float]] = {t: [] for t in TEMPLATES}
    for p in procs:
        con = sqlite3.connect(p.data_dir / "jobs.db")
        for t, d in con.execute("SELECT template, ended_at - started_at FROM runs WHERE exit_status = 0 "
                                "AND ended_at IS NOT NULL AND started_at > ?", (after,)):
            out[t].append(d)
        con.close()
    return out


def predict(url):
    r = subprocess.run([sys.executable, "-m", "p2pnode", "jobs", "predict", "--json", "--url", url],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def leader_and_other(procs):
    """``(leader id, the agent that does not lead)`` once both agents name the same leader, else None."""
    ids = [p.status()["node"]["id"] for p in procs]
    leaders = {p.status()["election"]["leader"] for p in procs}
    if len(leaders) != 1 or not leaders <= set(ids):
        return None
    (leader,) = leaders
    return leader, next(p for p, i in zip(procs, ids) if i != leader)


def test_predictions_match_the_history_and_beat_the_declared_values(tmp_path, capsys):
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    ports = [free_port(), free_port()]
    procs = [AgentProc(tmp_path / "a", ports[0], "--no-mdns", "--fake-gpus", "2xH100", "--catalog", str(cat),
                       env=ENV),
             AgentProc(tmp_path / "b", ports[1], "--no-mdns", "--fake-gpus", "2xRTX 4090", "--catalog", str(cat),
                       "--join", f"127.0.0.1:{ports[0]}", env=ENV)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready()
        wait_until(lambda: all(len(v) >= 6 for v in completed(procs).values()), PATIENCE_S, interval=0.5,
                   what="6 completed runs of each template")

        def fleet_rows():
            found = leader_and_other(procs)
            if found is None:
                return None
            leader, other = found
            reply = predict(other.url)
            rows = {r["template"]: r for r in reply["predictions"] if r["node_class"] == ""}
            db = completed(procs)
            # (the leader rebuilds its predictor at most every PREDICTOR_REFRESH_S: its figures may lag the files by
            # the runs of that time; the run times are stationary, so the medians compare all the same)
            # (a template may run on one node only: the planner keeps what runs where it runs; both nodes' summaries
            # must reach the leader, as their classes' rows show; the fleet row's run count is the robust merge's, where
            # no node weighs more than 4x the lower median of the nodes' counts: a template one node ran once counts
            # at most 5 runs there however many the other ran, so it is held to the predictor's min_runs, 3)
            # (a reply the leader answered, and the same leader before and after the question: on a loaded machine
            # the node asked may fail to reach the leader for a moment, or the lead may move; asked again then)
            classes = {r["node_class"] for r in reply["predictions"] if r["source"] == "history"}
            ok = reply["answered_by"] != reply["asked"] and leader_and_other(procs) == found and \
                {"2xH100", "2x4090"} <= classes and all(
                    rows.get(t, {}).get("source") == "history" and 3 <= rows[t]["runs"] <= len(db[t])
                    for t in TEMPLATES)
            return (leader, reply, rows, db) if ok else None

        leader, reply, rows, db = wait_until(fleet_rows, PATIENCE_S, interval=1.0,
                                             what="the leader's figures from both nodes")
        assert "not the leader" in reply["note"], reply["note"]
        assert reply["partial"] is False and reply["leader"]["node"] == leader
        for t in TEMPLATES:
            want = statistics.median(db[t])
            assert abs(rows[t]["runtime_p50_s"] - want) <= 0.2 * want, (t, rows[t], want)
        classes = {r["node_class"] for r in reply["predictions"]}
        assert {"2xH100", "2x4090", ""} <= classes
        # the runs that come after: the predicted median errs less than the declared max_runtime_s
        cut = time.time()
        wait_until(lambda: all(len(v) >= 3 for v in completed(procs, cut).values()), PATIENCE_S, interval=0.5,
                   what="3 later runs of each template")
        later = completed(procs, cut)
        for t in TEMPLATES:
            predicted = statistics.mean(abs(d - rows[t]["runtime_p50_s"]) for d in later[t])
            declared = statistics.mean(abs(d - 60.0) for d in later[t])
            assert predicted < declared, (t, predicted, declared)
            with capsys.disabled():
                print(f"\n[predict] {t}: leader p50 {rows[t]['runtime_p50_s']:.2f} s over {rows[t]['runs']} runs "
                      f"(jobs.db median {statistics.median(db[t]):.2f} s); {len(later[t])} later runs err "
                      f"{predicted:.2f} s on average (declared: {declared:.1f} s)", file=sys.stderr)
    finally:
        for p in procs:
            p.kill()


def demo_catalog(into, seconds):
    """A copy of the demo catalog as shipped (``p2pnode/_demo_catalog``: its scripts, templates, resources,
    policy and declared ``max_runtime_s``) under ``into``, whose every job runs ``seconds`` by default instead of
    the shipped 10-60 s; returns the catalog's path."""
    import re
    import shutil
    from pathlib import Path

    shipped = Path(__file__).resolve().parent.parent / "p2pnode" / "_demo_catalog"
    shutil.copytree(shipped, into, ignore=shutil.ignore_patterns("__pycache__"))
    cat = into / "catalog.toml"
    text, n = re.subn(r'(\[job\.params\.seconds\]\ntype = "float"\ndefault = )[0-9.]+', rf"\g<1>{seconds}",
                      cat.read_text())
    assert n >= 2, n  # (the two autonomous selfplay templates at least: the runs this test waits for)
    cat.write_text(text)
    return cat


def test_on_the_demo_catalog_predictions_beat_the_declared_run_times(tmp_path, capsys):
    """The demo catalog (``p2pnode/_demo_catalog``) with its jobs shortened from 10-60 s to 2 s each, against its
    declared ``max_runtime_s`` of 300-1,200 s as shipped: once a few runs of a template ended, the leader's median
    predicts its later runs far better than the declared value, and matches the node's ``jobs.db`` within 20 %.
    The catalog as shipped, unshortened (about two minutes), is ``python bench/predict_e2e.py --demo``."""
    from p2pnode.scheduler import load_catalog

    cat = demo_catalog(tmp_path / "demo", 2.0)
    declared = {name: t.max_runtime_s for name, t in load_catalog(str(cat)).templates.items()}
    # (the node declares 8 CPUs: on a 2-core test machine the demo's two trainings would take every CPU it has)
    proc = AgentProc(tmp_path / "a", free_port(), "--no-mdns", "--fake-gpus", "2xH100", "--catalog", str(cat),
                     "--resource", "cpus=8", env=ENV)

    def runs(after=0.0):
        con = sqlite3.connect(proc.data_dir / "jobs.db")
        try:
            out: dict[str, list[float]] = {}
            for t, d in con.execute("SELECT template, ended_at - started_at FROM runs WHERE exit_status = 0 AND "
                                    "ended_at IS NOT NULL AND started_at > ?", (after,)):
                out.setdefault(t, []).append(d)
            return out
        finally:
            con.close()

    try:
        proc.start().wait_ready()
        wait_until(lambda: sum(len(v) >= 3 for v in runs().values()) >= 2, PATIENCE_S, interval=1.0,
                   what="3 runs ended of two templates")

        def rows():
            db = runs()
            got = {p["template"]: p for p in predict(proc.url)["predictions"] if p["node_class"] == ""
                   and p["source"] == "history" and 3 <= p["runs"] <= len(db.get(p["template"], []))}
            return len(got) >= 2 and (got, db)

        got, db = wait_until(rows, PATIENCE_S, interval=1.0, what="predictions from history")
        for t, p in got.items():
            want = statistics.median(db[t])
            assert abs(p["runtime_p50_s"] - want) <= 0.2 * want, (t, p, want)
        cut = time.time()

        def later():
            r = {t: v for t, v in runs(cut).items() if t in got}
            return sum(map(len, r.values())) >= 3 and r

        after = wait_until(later, PATIENCE_S, interval=1.0, what="3 later runs of predicted templates")
        errs = [(abs(d - got[t]["runtime_p50_s"]), abs(d - declared[t])) for t, v in after.items() for d in v]
        predicted = statistics.mean(e for e, _ in errs)
        decl = statistics.mean(e for _, e in errs)
        assert predicted < decl / 10, (predicted, decl, after, got)
        shown = ", ".join(f"{t} p50 {p['runtime_p50_s']:.1f} s" for t, p in got.items())
        with capsys.disabled():
            print(f"\n[predict] demo catalog: {shown}; {len(errs)} later runs err {predicted:.2f} s on average "
                  f"(declared: {decl:.0f} s)", file=sys.stderr)
    finally:
        proc.kill()
