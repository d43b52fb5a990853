"""Issue 39 item 3, the rest: a plan's stop names its rule (``PlanStop.rule``: ``gang_ended``, ``template_removed``,
``plan``), a node records it, and the job history keeps each ended run's rule and outcome, shown by ``GET /jobs``
and ``p2pnode jobs`` (its ``ended by`` column). Virtual time for the core; a real SQLite file for the history."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import blake3
import httpx
import msgspec
import pytest
import trio
from test_gangs import _running, cat, gang_job, node, run
from test_job_core import GRACE, core, drive, inputs, lead, local, member, of, pjob, plan_of

from p2pnode.agent import Agent
from p2pnode.config import load_config
from p2pnode.http import create_app
from p2pnode.jobs import JobHistory
from p2pnode.node import StopJob
from p2pnode.node._jobstate import PLAN_RULES, STOP_RULES, exit_outcome, plan_rule
from p2pnode.node._plandist import part_version
from p2pnode.node._plans import MemberPlanInput, Planner
from p2pnode.scheduler import ClusterView
from p2pnode.snapshot import JobReport, PlanSection, PlanStop, plan_digest, plan_ref


# -- the plan's stop names its rule --------------------------------------------------------------------------------
class _OldPlanStop(msgspec.Struct, frozen=True, omit_defaults=True):
    """``PlanStop`` as an agent before its ``rule`` encoded it."""

    job_id: str
    node: str = "-"
    reason: str = ""


def test_a_plan_stop_round_trips_its_rule_and_an_old_plan_decodes_to_plan():
    stop = PlanStop(job_id="7-2", node="n2", reason="gang 7-1 ended", rule="gang_ended")
    p = PlanSection(term=3, stops=[stop])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=PlanSection).stops == [stop]
    assert msgspec.json.decode(msgspec.json.encode(p), type=PlanSection).stops[0].rule == "gang_ended"
    old = msgspec.msgpack.encode({"term": 3, "stops": [_OldPlanStop("7-2", "n2", "preempted")]})
    (decoded,) = msgspec.msgpack.decode(old, type=PlanSection).stops
    assert decoded == PlanStop(job_id="7-2", node="n2", reason="preempted") and decoded.rule == "plan"
    assert "rule" not in msgspec.to_builtins(decoded)  # the default stays off the wire: old readers see no change
    for bad in ("Gang-Ended", "x" * 33, "gang ended", "plan\n"):  # bounded lowercase names only
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({"job_id": "7-2", "rule": bad}, PlanStop)


def test_the_digest_leaves_the_rule_out_so_an_older_agent_checks_a_whole_plan_the_same():
    """An agent before ``rule`` recomputes a whole plan's digest over what it decoded (no rule): it must match."""
    tagged = [PlanStop(job_id="7-2", node="n2", reason="gang 7-1 ended", rule="gang_ended")]
    plain = [PlanStop(job_id="7-2", node="n2", reason="gang 7-1 ended")]
    old = blake3.blake3(msgspec.msgpack.encode(([], [_OldPlanStop("7-2", "n2", "gang 7-1 ended")]))).hexdigest(16)
    assert plan_digest([], tagged) == plan_digest([], plain) == old  # the older agent's formula, over its decode
    assert plan_digest([], tagged) != plan_digest([], [PlanStop(job_id="7-2", node="n2", reason="other")])


def test_a_node_records_only_the_rules_a_plan_may_order():
    assert set(PLAN_RULES) <= set(STOP_RULES)
    assert [plan_rule(r) for r in PLAN_RULES] == list(PLAN_RULES)
    assert plan_rule("operator") == plan_rule("memory_limit") == plan_rule("some_future_rule") == "plan"


# -- the leader tags gang-ended and template-removed stops -----------------------------------------------------------
def test_the_scheduler_tags_a_gang_end_a_removed_template_and_leaves_preemption_plan():
    c = cat(gang_job())
    nodes = {f"n{i}": node(f"n{i}") for i in range(1, 4)}
    lost = run(ClusterView(nodes, _running(nodes=("n1", "n3"), ranks=(0, 2)), {"7-1": "gang 7-1 ended: rank 1"}), c)
    assert {(s.job_id, s.rule) for s in lost.stops} == {("7-1", "gang_ended"), ("7-3", "gang_ended")}
    removed = run(ClusterView(nodes, _running()), cat(gang_job(name="other")))
    assert {(s.job_id, s.rule) for s in removed.stops} == {(f"7-{i}", "template_removed") for i in (1, 2, 3)}
    assert all("no longer in the catalog" in s.reason for s in removed.stops)
    low = gang_job(name="low", kind="selfplay", members=2, priority=10, config="c1")
    high = {"name": "high", "kind": "selfplay", "config": "c2", "argv": ["x"], "priority": 90,
            "resources": {"num_gpus": 1, "vram_gib": 16}}
    running = tuple(r._replace(template="low") for r in _running(gid="7-1", size=2, nodes=("n1", "n2")))
    preempted = run(ClusterView({k: nodes[k] for k in ("n1", "n2")}, running), cat(low, high))
    assert {s.rule for s in preempted.stops} == {"plan"} and len(preempted.stops) == 2


def test_the_leaders_plan_document_carries_the_gang_ended_rule():
    c = cat(gang_job())
    running = _running(nodes=("n2", "n3"), ranks=(1, 2))  # rank 0 (7-1) exited 0
    reports = {r.node_id: (JobReport(job_id=r.job_id, template="ddp", gpus=[0], gpu_fraction=1.0, vram_gib=16.0,
                                     term=7, gang=r.gang),) for r in running}
    members = [MemberPlanInput("n1", node("n1"), (), ended_ok=frozenset({"7-1"}), ended=frozenset({"7-1"})),
               *(MemberPlanInput(n, node(n), reports[n]) for n in ("n2", "n3"))]
    planner = Planner(c)
    first = planner.lead(8, members, None, {}, 100.0, 1e9)
    later = planner.lead(8, members, first.section, {}, 131.0, 1e9)
    assert {(s.job_id, s.rule) for s in later.section.stops} == {("7-2", "gang_ended"), ("7-3", "gang_ended")}
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(later.section), type=PlanSection)
    assert plan_digest(wire.assignments, wire.stops, wire.gangs) == later.section.digest
    assert [(g.id, g.state, g.cause) for g in wire.gangs] == [("8-1", "placing", ""), ("7-1", "ended", "complete")]


def test_a_node_stops_a_gang_member_with_the_rule_its_plan_names():
    c = core("b")
    stops = [PlanStop(job_id="g-1", node="b", reason="gang g ended: member rank 0 ended", rule="gang_ended"),
             PlanStop(job_id="t-1", node="b", reason="template 'x' is no longer in the catalog",
                      rule="template_removed"),
             PlanStop(job_id="p-1", node="b", reason="preempted"),
             PlanStop(job_id="f-1", node="b", reason="a newer leader's rule", rule="operator")]
    p = plan_of(1, 1, [pjob("keep", "b")], stops)
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    running = {k: local(k, started=0.0) for k in ("keep", "g-1", "t-1", "p-1", "f-1")}
    out = of(drive(c, inputs(lead("a"), [member("b"), member("a", plan=p)], running), 1.0), StopJob)
    assert {(s.job_id, s.rule) for s in out} == {("g-1", "gang_ended"), ("t-1", "template_removed"),
                                                ("p-1", "plan"), ("f-1", "plan")}
    assert next(s for s in out if s.job_id == "g-1").reason == "gang g ended: member rank 0 ended (term 1)"
    assert c.table.get("g-1").rule == "gang_ended" and c.table.state("g-1") == "stopping"


def test_a_job_the_plan_holds_with_a_template_this_node_dropped_stops_as_template_removed():
    """A pushed catalog that drops a template here before the leader's plan does: the plan still holds the job, the
    node no longer knows its template; once the adoption grace passed it stops, named ``template_removed``."""
    c = core("b")
    p = plan_of(1, 1, [pjob("x", "b", template="gone")])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    running = {"x": local("x", template="gone", kind="selfplay", started=-100.0),
               "y": local("y", started=-100.0)}  # y: not in the plan at all
    (x, y) = sorted(of(drive(c, inputs(lead("a"), [member("b"), member("a", plan=p)], running), GRACE), StopJob),
                    key=lambda s: s.job_id)
    assert (x.rule, x.reason) == ("template_removed", "template 'gone' is no longer in this node's catalog (term 1)")
    assert (y.rule, y.reason) == ("plan", "no longer in the plan of term 1")


# -- the history keeps the rule and the outcome ---------------------------------------------------------------------
def test_exit_outcome_names_how_a_process_ended():
    assert [exit_outcome(s, stopped=False) for s in (0, 3, -9, None)] == ["completed", "failed", "failed", "lost"]
    assert exit_outcome(0, stopped=True) == exit_outcome(None, stopped=True) == "stopped"


def _start(h: JobHistory, job_id: str, at: float) -> None:
    h.started(job_id=job_id, template="sp", config="c", kind="selfplay", node_id="n1", term=1, at=at)


def test_the_history_stores_each_runs_rule_and_outcome(tmp_path):
    h = JobHistory(tmp_path / "jobs.db")
    _start(h, "a", 1.0)
    _start(h, "b", 2.0)
    _start(h, "c", 3.0)
    h.ended("a", at=5.0, exit_status=-15, peak_rss_bytes=1, reason="maximum runtime reached", rule="max_runtime",
            outcome="stopped")
    h.ended("b", at=6.0, exit_status=0, peak_rss_bytes=1, reason="exited", outcome="completed")
    rows = {r["job_id"]: (r["rule"], r["outcome"]) for r in h.recent()}
    assert rows == {"a": ("max_runtime", "stopped"), "b": (None, "completed"), "c": (None, None)}
    h.close()


_OLD_SCHEMA = """CREATE TABLE runs (job_id TEXT PRIMARY KEY, template TEXT NOT NULL, config TEXT NOT NULL,
kind TEXT NOT NULL, node_id TEXT NOT NULL, term INTEGER NOT NULL, started_at REAL NOT NULL, ended_at REAL,
exit_status INTEGER, peak_rss_bytes INTEGER, reason TEXT{extra});"""


@pytest.mark.parametrize("extra", ["", ", node_class TEXT, peak_vram_bytes INTEGER"])
def test_an_older_history_file_gains_the_columns_and_its_rows_still_load(tmp_path, extra):
    con = sqlite3.connect(tmp_path / "jobs.db")
    con.executescript(_OLD_SCHEMA.format(extra=extra))
    con.execute("INSERT INTO runs (job_id, template, config, kind, node_id, term, started_at, ended_at, exit_status, "
                "peak_rss_bytes, reason) VALUES ('old', 'sp', 'c', 'selfplay', 'n1', 1, 1.0, 2.0, 0, 5, 'exited')")
    con.commit()
    con.close()
    h = JobHistory(tmp_path / "jobs.db")
    (old,) = h.recent()
    assert (old["job_id"], old["rule"], old["outcome"], old["reason"]) == ("old", None, None, "exited")
    _start(h, "new", 3.0)
    h.ended("new", at=4.0, exit_status=None, peak_rss_bytes=1, reason="gang g ended", rule="gang_ended",
            outcome="stopped")
    assert [(r["job_id"], r["rule"]) for r in h.recent()] == [("new", "gang_ended"), ("old", None)]
    h.close()


def test_a_row_with_a_bad_rule_is_left_out_and_counted(tmp_path):
    h = JobHistory(tmp_path / "jobs.db")
    _start(h, "good", 1.0)
    _start(h, "bad", 2.0)
    h.ended("good", at=3.0, exit_status=0, peak_rss_bytes=1, reason="exited", outcome="completed")
    h.ended("bad", at=3.0, exit_status=0, peak_rss_bytes=1, reason="x", rule="Not A Rule\x00", outcome="stopped")
    assert [r["job_id"] for r in h.recent()] == ["good"]
    assert h.report.count(h.file, "bad_entry") == 1
    h.close()


# -- shown by GET /jobs and p2pnode jobs ----------------------------------------------------------------------------
async def test_get_jobs_history_entries_carry_rule_and_outcome(tmp_path):
    demo = Path(__file__).parent.parent / "deploy" / "examples" / "demo" / "catalog.toml"
    a = Agent(load_config(None, env={}, overrides={"agent": {"data_dir": tmp_path, "port": 0, "catalog": str(demo)},
                                                   "discovery": {"mdns": False}}))
    a.sample()
    a.publish()
    hist = a.jobs.history
    _start(hist, "1-1", 1.0)
    _start(hist, "1-2", 2.0)
    hist.ended("1-1", at=3.0, exit_status=None, peak_rss_bytes=1, reason="node drained by the operator: deadline "
               "passed", rule="drain", outcome="stopped")
    hist.ended("1-2", at=4.0, exit_status=3, peak_rss_bytes=1, reason="failed with status 3", outcome="failed")
    app = create_app(a.surfaces, a.metrics_registry)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as c:
        r = await c.get("/jobs")
    assert r.status_code == 200
    got = {h["job_id"]: (h["rule"], h["outcome"]) for h in r.json()["history"]}
    assert got == {"1-1": ("drain", "stopped"), "1-2": (None, "failed")}
    await trio.lowlevel.checkpoint()


def test_p2pnode_jobs_shows_how_each_run_ended_by_the_rules_name():
    from rich.console import Console

    from p2pnode.cli._jobs import _jobs_renderable, ended_by

    def run_(job_id, ended_at, rule=None, outcome=None, reason=None):
        return {"job_id": job_id, "template": "sp", "started_at": 1.0, "ended_at": ended_at, "exit_status": None,
                "rule": rule, "outcome": outcome, "reason": reason}

    history = [run_("1-1", 5.0, "gang_ended", "stopped", "gang 7-1 ended"), run_("1-2", 5.0, None, "completed",
                                                                                 "exited"),
               run_("1-3", None), {k: v for k, v in run_("1-4", 5.0, reason="exited").items()
                                   if k not in ("rule", "outcome")}]
    assert [ended_by(h) for h in history] == ["gang_ended", "completed", "", "-"]
    data = {"node_id": "n", "leader": "n", "term": 1, "offer": 0, "running": [], "cluster_running": [],
            "pending": [], "refused": [], "history": history}
    out = io.StringIO()
    Console(file=out, width=300).print(_jobs_renderable(data))
    lines = out.getvalue().splitlines()
    assert any("ended by" in line for line in lines)
    (row,) = [line for line in lines if "1-1" in line]
    assert "gang_ended" in row and "gang 7-1 ended" in row
    assert "completed" in next(line for line in lines if "1-2" in line)
