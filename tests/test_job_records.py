"""The job table kept in the job ledger across an agent restart (:mod:`p2pnode.jobs._records`), at the core level:
a table written through :class:`JobRecords`, read back into a fresh core (no process, no trio: the clock is a
number), then reconciled by the core's step with what the executor re-adopted; hostile rows skipped and counted;
the bounds; the operator's stop intents kept and removed. The real-process restarts are in
``tests/test_restart_records.py``."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import deque
from types import SimpleNamespace

import pytest
from test_job_core import CATALOG, core, drive, inputs, lead, local, member, of, pjob, plan_of

from p2pnode.guardcore import CircuitBreaker
from p2pnode.jobs._ledger import JobLedger
from p2pnode.jobs._records import RECORDS_SCHEMA, JobRecords, StopIntents, encode_record
from p2pnode.node import StartJob, StopJob
from p2pnode.node._book import JobBook
from p2pnode.node._plandist import part_version
from p2pnode.node._runs import ended_report
from p2pnode.node._table import REMEMBERED, UNKNOWN, Adopted, Assigned, Exited, JobTable, Refused, StartAsked, StopAsked
from p2pnode.snapshot import plan_ref
from p2pnode.statefiles import open_report

WALL0 = 1_700_000_000.0


class Operator:
    """The stop intents as :class:`p2pnode.jobs._operator.OperatorControl` keeps them."""

    def __init__(self, ledger: JobLedger) -> None:
        self.kept = StopIntents(ledger)
        self.stop_intents = set(self.kept.load())

    def carried_out(self, job_id: str) -> None:
        if job_id in self.stop_intents and self.kept.remove(job_id):
            self.stop_intents.discard(job_id)


def agent(tmp_path, now: float, c=None, *, jobs=(), readopted=True):
    """One start of a node's job control on ``tmp_path`` at monotonic ``now``: its ledger, a runner holding
    ``jobs`` (re-adopted), the stop intents, the records read back (not yet restored)."""
    open_report(tmp_path)
    ledger = JobLedger(tmp_path / "jobs" / "ledger.db")
    runner = SimpleNamespace(ledger=ledger, jobs={j: None for j in jobs}, readopt_done=readopted,
                             before_readopt=None)
    c = c or core("b")
    op = Operator(ledger)
    clock = SimpleNamespace(now=now)
    rec = JobRecords(runner, c, op, lambda: clock.now)  # type: ignore[arg-type]
    return SimpleNamespace(ledger=ledger, runner=runner, core=c, op=op, records=rec, clock=clock)


def first_run(tmp_path):
    """A node's first run: records in every state, written as they change."""
    a = agent(tmp_path, 100.0)
    a.runner.before_readopt()
    t = a.core.table
    t.apply(Adopted("run", "sp", "selfplay", (0,), term=2, started_at=40.0), 90.0)
    t.apply(Assigned("start", "sp", "selfplay", (1,), term=2), 91.0)
    t.apply(StartAsked("start"), 91.0)
    t.apply(Adopted("stop", "sp", "selfplay", (2,), term=2), 92.0)
    t.apply(StopAsked("stop", "max_runtime", "maximum runtime reached"), 93.0)
    t.apply(Adopted("done", "sp", "selfplay", (3,), term=2), 94.0)
    t.apply(Exited("done", status=3), 95.0)
    t.apply(Assigned("no", "ev"), 96.0)
    t.apply(Refused("no", "cordoned"), 96.0)
    t.apply(Assigned("wait", "sp"), 97.0)
    t.remember("old")
    a.records.flush()
    return a


def test_every_record_is_restored_in_its_state_with_its_times_on_the_new_clock(tmp_path):
    a = first_run(tmp_path)
    assert a.ledger.query("SELECT version FROM ledger_meta") == [(RECORDS_SCHEMA,)]
    a.ledger.close()
    b = agent(tmp_path, 7.0)  # the new run's monotonic clock starts elsewhere; its wall clock moved on
    b.runner.before_readopt()
    t = b.core.table
    assert {j: t.state(j) for j in ("run", "start", "stop", "done", "no", "wait", "old")} == {
        "run": "running", "start": "running", "stop": "stopping", "done": "ended", "no": "refused", "wait": UNKNOWN,
        "old": REMEMBERED}
    stop, done = t.get("stop"), t.get("done")
    assert (stop.rule, stop.reason, stop.gpus, stop.term) == ("max_runtime", "maximum runtime reached", (2,), 2)
    assert (done.outcome, done.status) == ("failed", 3) and t.get("no").reason == "cordoned"
    assert abs(t.get("run").started_at - (7.0 - 60.0)) < 5.0  # 60 s before the crash, on this run's clock
    assert all(j in b.core.ran for j in ("run", "start", "stop", "done", "no", "old")) and "wait" not in b.core.ran
    assert b.records.restored == 5 and not t.errors
    assert "wait" not in {r[0] for r in b.ledger.query("SELECT job_id FROM job_records")}  # never started: gone


def test_the_core_reconciles_restored_records_with_what_was_re_adopted(tmp_path):
    a = first_run(tmp_path)
    a.ledger.close()
    b = agent(tmp_path, 7.0, jobs=("stop", "run"))
    b.runner.before_readopt()
    c = b.core
    running = {"run": local("run", adopted=True), "stop": local("stop", adopted=True)}  # "start" did not survive
    out = c.step(inputs(lead("a"), [member("b"), member("a")], running), 8.0)
    assert of(out, StopJob) == [StopJob("stop", "maximum runtime reached", "max_runtime")]  # the same rule, again
    assert c.table.state("start") == "ended" and c.table.get("start").outcome == "lost"  # a transition, not dropped
    assert c.table.state("run") == "running" and c.table.state("stop") == "stopping"
    running["stop"] = local("stop", adopted=True, stopping=True)
    assert not of(c.step(inputs(lead("a"), [member("b"), member("a")], running), 9.0), StopJob)  # asked once
    del running["stop"]
    c.step(inputs(lead("a"), [member("b"), member("a")], running), 10.0)
    assert c.table.get("stop").outcome == "stopped" and c.table.get("stop").rule == "max_runtime"
    b.records.flush()
    kept = {r[0]: json.loads(r[1])["state"] for r in b.ledger.query("SELECT job_id, record FROM job_records")}
    assert kept["start"] == "ended" and kept["stop"] == "ended" and kept["run"] == "running"


def test_a_restarted_node_does_not_start_a_job_id_it_ran(tmp_path):
    a = first_run(tmp_path)
    a.ledger.close()
    b = agent(tmp_path, 7.0)
    b.runner.before_readopt()
    c = b.core
    p = plan_of(1, 1, [pjob("done", "b"), pjob("no", "b", gpu=1), pjob("fresh", "b", gpu=2)])
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    out = drive(c, inputs(lead("a"), [member("b"), member("a", plan=p)]), 8.0)
    assert [e.job.job_id for e in of(out, StartJob)] == ["fresh"]


def test_a_stopping_record_whose_job_ended_while_down_ends_stopped(tmp_path):
    a = first_run(tmp_path)
    a.ledger.close()
    b = agent(tmp_path, 7.0)
    b.runner.before_readopt()
    out = b.core.step(inputs(lead("a"), [member("b"), member("a")], {}), 8.0)
    assert not of(out, StopJob) and b.core.table.get("stop").outcome == "stopped"
    assert b.core.table.get("run").outcome == "lost" and not b.core.book.resuming


def test_hostile_rows_are_skipped_counted_and_never_a_crash(tmp_path):
    first_run(tmp_path).ledger.close()
    good = json.loads(encode_record(None, "x", 0.0, WALL0))
    bad = {
        "nan": '{"job_id": "nan", "state": "ended", "vram_gib": NaN}',
        "huge": '{"job_id": "huge", "state": "ended", "term": ' + "9" * 400 + "}",
        "ctl": json.dumps({"job_id": "ctl", "state": "ended", "template": "a\x07b"}),
        "state": json.dumps({"job_id": "state", "state": "sleeping"}),
        "types": json.dumps({"job_id": "types", "state": "ended", "gpus": "0,1"}),
        "neg": json.dumps({"job_id": "neg", "state": "ended", "ended_at": -1.0}),
        "extra": json.dumps({"job_id": "extra", "state": "ended", "owner": "root"}),
        "other": json.dumps({**good, "job_id": "someone"}),
        "junk": "{not json",
        "bad id\n": json.dumps({"job_id": "bad id\n", "state": "ended"}),
    }
    con = sqlite3.connect(tmp_path / "jobs" / "ledger.db")
    with con:
        for i, (job_id, record) in enumerate(bad.items()):
            con.execute("INSERT INTO job_records VALUES (?, ?, ?)", (job_id, 1000 + i, record))
        con.execute("INSERT INTO job_records VALUES ('blob', 2000, ?)", (b"\x80\x81",))
        con.execute("INSERT INTO job_records VALUES ('int', 2001, 7)")
        con.execute("INSERT INTO stop_intents VALUES ('ok', ?)", (WALL0,))
        con.execute("INSERT INTO stop_intents VALUES ('bad\x01', ?)", (WALL0,))
        con.execute("INSERT INTO stop_intents VALUES ('inf', ?)", (float("inf"),))
        con.execute("INSERT INTO stop_intents VALUES ('text', 'soon')")
    con.close()
    b = agent(tmp_path, 7.0)
    b.runner.before_readopt()
    assert b.ledger.report.count("jobs/ledger.db", "bad_entry") == len(bad) + 2 + 3
    assert b.records.restored == 5 and b.core.table.state("done") == "ended"  # the good rows load
    assert all(b.core.table.state(j) == UNKNOWN for j in bad)
    assert b.op.stop_intents == {"ok"}


def test_a_table_of_another_schema_version_is_counted_and_started_anew(tmp_path):
    first_run(tmp_path).ledger.close()
    con = sqlite3.connect(tmp_path / "jobs" / "ledger.db")
    with con:
        con.execute("UPDATE ledger_meta SET version = 99")
    con.close()
    b = agent(tmp_path, 7.0)
    b.runner.before_readopt()
    assert b.ledger.report.count("jobs/ledger.db", "malformed") == 1 and b.records.restored == 0
    assert b.ledger.query("SELECT version FROM ledger_meta") == [(RECORDS_SCHEMA,)]
    assert b.ledger.query("SELECT count(*) FROM job_records") == [(0,)]


def test_the_rows_keep_the_tables_bounds(tmp_path):
    table = JobTable(max_history=3, max_ids=2)
    c = SimpleNamespace(table=table, book=JobBook(table, CircuitBreaker(), CATALOG), ran=set())
    a = agent(tmp_path, 0.0, c)
    a.runner.before_readopt()
    for i in range(20):
        table.apply(Adopted(f"j{i}", "sp"), float(i))
        table.apply(Exited(f"j{i}", status=0), float(i))
        a.records.flush()
    rows = a.ledger.query("SELECT job_id, record FROM job_records ORDER BY job_id")
    assert [(j, json.loads(r)["state"]) for j, r in rows] == [
        ("j15", "remembered"), ("j16", "remembered"), ("j17", "ended"), ("j18", "ended"), ("j19", "ended")]
    a.ledger.close()
    t2 = JobTable(max_history=3, max_ids=2)
    b = agent(tmp_path, 50.0, SimpleNamespace(table=t2, book=JobBook(t2, CircuitBreaker(), CATALOG)))
    b.runner.before_readopt()
    assert t2.ids() == ["j15", "j16", "j17", "j18", "j19"] and [r.job_id for r in t2.history()] == ["j19", "j18",
                                                                                                      "j17"]


def test_a_stop_intent_is_kept_until_carried_out(tmp_path):
    a = agent(tmp_path, 0.0, jobs=("j",))
    a.runner.before_readopt()
    a.core.table.apply(Adopted("j", "sp"), 0.0)
    a.op.kept.add("j", WALL0)
    a.op.stop_intents.add("j")
    a.records.flush()  # not carried out yet: kept
    a.ledger.close()
    b = agent(tmp_path, 5.0, jobs=("j",))  # kill -9 before the stop: the restarted agent still wants it
    b.runner.before_readopt()
    assert b.op.stop_intents == {"j"}
    b.core.table.apply(StopAsked("j", "operator", "stopped by the operator"), 6.0)  # the stop rules carried it out
    b.records.flush()
    assert not b.op.stop_intents and b.ledger.query("SELECT count(*) FROM stop_intents") == [(0,)]
    b.op.kept.add("gone", WALL0)  # an intent for a job not here once re-adoption is done: nothing to stop
    b.op.stop_intents.add("gone")
    b.records.flush()
    assert not b.op.stop_intents


def test_a_ledger_refusing_to_forget_an_intent_keeps_it_and_tries_again(tmp_path):
    """Review of issue 39: on a full disk the records' write was counted, but the removal of a carried-out stop
    intent in the same flush raised out of the driver's flush and exit handling. Now counted; the intent is kept
    (in memory and in the file) and removed at a later flush once the database takes writes again."""
    a = agent(tmp_path, 0.0, jobs=("j",))
    a.runner.before_readopt()
    a.core.table.apply(Adopted("j", "sp"), 0.0)
    a.op.kept.add("j", WALL0)
    a.op.stop_intents.add("j")
    a.records.flush()
    a.ledger.query("PRAGMA query_only = 1")  # every write refused from here ("attempt to write a readonly database")
    a.core.table.apply(StopAsked("j", "operator", "stopped by the operator"), 1.0)
    a.records.flush()  # does not raise
    assert a.op.stop_intents == {"j"} and a.op.kept.remove_errors == 1 and a.records.write_errors == 1
    assert a.ledger.query("SELECT job_id FROM stop_intents") == [("j",)]
    a.core.table.apply(Exited("j", status=0), 2.0)
    a.records.flush()
    assert a.op.kept.remove_errors == 2 and a.core.table.state("j") == "ended"
    a.ledger.query("PRAGMA query_only = 0")
    a.records.flush()
    assert not a.op.stop_intents and a.ledger.query("SELECT count(*) FROM stop_intents") == [(0,)]


def test_the_ended_list_of_gang_members_and_one_off_runs_is_refilled(tmp_path):
    a = agent(tmp_path, 100.0)
    a.runner.before_readopt()
    t = a.core.table
    t.apply(Adopted("run-1", "sp"), 90.0)
    t.apply(Exited("run-1", status=3), 95.0)
    t.apply(Adopted("run-2", "sp"), 90.0)
    t.apply(StopAsked("run-2", "operator", "stopped by the operator"), 96.0)
    t.apply(Exited("run-2", signal=15), 97.0)
    t.apply(Adopted("plain", "sp"), 90.0)
    t.apply(Exited("plain", status=0), 98.0)
    a.records.flush()
    a.ledger.close()
    open_report(tmp_path)
    ledger = JobLedger(tmp_path / "jobs" / "ledger.db")
    ended: deque = deque([ended_report("run-9", 0, None, WALL0)], maxlen=16)  # one reported during re-adoption
    c = core("b")
    runner = SimpleNamespace(ledger=ledger, jobs={}, readopt_done=True, before_readopt=None)
    JobRecords(runner, c, Operator(ledger), lambda: 7.0, ended).restore()  # type: ignore[arg-type]
    assert [(e.job_id, e.exit_code, e.signal, e.rule, e.reason) for e in ended] == [
        ("run-1", 3, None, "", ""), ("run-2", None, 15, "operator", "stopped by the operator"),
        ("run-9", 0, None, "", "")]
    assert ended[0].at < ended[1].at <= time.time()


@pytest.mark.parametrize("ddl", [
    # job_records of a newer version without `seq` (a rollback): the index on seq used to be made before the check
    "CREATE TABLE ledger_meta (name TEXT PRIMARY KEY, version INTEGER NOT NULL);"
    "INSERT INTO ledger_meta VALUES ('job_records', 2);"
    "CREATE TABLE job_records (job_id TEXT PRIMARY KEY, rev INTEGER, record TEXT);",
    "CREATE TABLE ledger_meta (name TEXT PRIMARY KEY);",  # no version column: the INSERT raised
    "CREATE TABLE stop_intents (job_id TEXT PRIMARY KEY);",  # no `at`: the stop route's add() raised
], ids=["records_without_seq", "meta_without_version", "intents_without_at"])
def test_tables_of_another_shape_are_counted_and_started_anew_before_anything_is_written(tmp_path, ddl):
    """Review of issue 39: a ledger.db whose tables have other columns (a newer agent's, after a rollback) used to
    crash the agent at start (its schema script ran before the check) or the stop route; now counted ``malformed``
    and the three tables are made again; the process ledger's rows stay."""
    open_report(tmp_path)
    db = tmp_path / "jobs" / "ledger.db"
    JobLedger(db).close()
    con = sqlite3.connect(db)
    con.executescript(ddl)
    con.close()
    b = agent(tmp_path, 7.0)
    b.runner.before_readopt()
    assert b.ledger.report.count("jobs/ledger.db", "malformed") == 1 and b.records.restored == 0
    assert b.ledger.query("SELECT version FROM ledger_meta") == [(RECORDS_SCHEMA,)]
    b.op.kept.add("1-1", WALL0)
    assert StopIntents(b.ledger).load() == ["1-1"] and b.ledger.report.count("jobs/ledger.db", "malformed") == 1
    b.core.table.apply(Adopted("run", "sp", "selfplay", (0,), term=2), 8.0)
    b.records.flush()
    assert [r[0] for r in b.ledger.query("SELECT job_id FROM job_records")] == ["run"]
    assert b.ledger.entries() == []


def test_the_stop_route_answers_503_when_the_intent_cannot_be_kept(tmp_path):
    """A stop intent the ledger refuses (a full disk, a table gone) is a 503 naming it, not a 500: nothing was
    asked, the operator tries again."""
    import httpx
    import trio
    from starlette.applications import Starlette

    from p2pnode.http._operator import operator_routes

    open_report(tmp_path)
    ledger = JobLedger(tmp_path / "jobs" / "ledger.db")
    kept = StopIntents(ledger)
    ledger.script("DROP TABLE stop_intents")
    jobs = SimpleNamespace(stop_job=lambda job_id: kept.add(job_id, WALL0) or True)
    trust = SimpleNamespace(authenticate=lambda *a, **k: None)
    app = Starlette(routes=operator_routes(jobs, SimpleNamespace(node_id="n1"), trust))  # type: ignore[arg-type]

    async def post():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://n1") as client:
            return await client.post("/jobs/stop", json={"job_id": "1-1"})

    r = trio.run(post)
    assert r.status_code == 503 and r.json()["error"] == "not_kept" and "stop_intents" in r.json()["detail"]
