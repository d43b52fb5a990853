"""One-off runs' outcomes (issue 39, item 5): the ``jobs.ended`` report of the node that ran a ``run-<id>`` job,
the requesting node's table of outcomes (virtual wall-clock time, plain values), its file, the exit status
``p2pnode jobs run --wait`` maps it to, the CLI's wait loop over a fake agent, and the leader that stops carrying
a withdrawn run. The cluster test is ``tests/test_jobs_run_outcome.py``."""

from __future__ import annotations

import json
import math

import msgspec
import pytest
from test_gangs import node

from p2pnode.node._operator import IntentStore, RunPlaced
from p2pnode.node._plans import MemberPlanInput, Planner
from p2pnode.node._runs import (
    MAX_OUTCOMES,
    NOT_RUN_STATUS,
    UNSEEN_GRACE_S,
    MemberRuns,
    RunRecord,
    RunTable,
    ended_report,
    exit_status_of_record,
    rule_of_reason,
)
from p2pnode.scheduler import parse_catalog
from p2pnode.snapshot import EndedJob, JobsSection, RunRequest

T0 = 1_800_000_000.0


def table_with(*ids: str) -> RunTable:
    t = RunTable()
    for i in ids:
        t.requested(i, "tpl", T0)
    return t


# -- what the running node publishes ---------------------------------------------------------------------------
@pytest.mark.parametrize(("status", "stopping", "want"), [
    (0, None, {"ok": True, "exit_code": 0, "signal": None, "rule": "", "reason": ""}),
    (3, None, {"ok": False, "exit_code": 3, "signal": None, "rule": "", "reason": ""}),
    (-9, None, {"ok": False, "exit_code": None, "signal": 9, "rule": "", "reason": ""}),
    (None, None, {"ok": False, "exit_code": None, "signal": None, "reason": "ended without an exit status"}),
    (-15, "stopped by the operator", {"ok": False, "signal": 15, "rule": "operator",
                                      "reason": "stopped by the operator"}),
    (-15, "maximum runtime reached", {"rule": "max_runtime"}),
    (-9, "memory limit: RSS 9 GiB > 8 GiB (template)", {"rule": "memory_limit"}),
    (0, "something new\nwith a newline", {"ok": False, "rule": "", "reason": "something new with a newline"}),
])
def test_the_ended_report_carries_the_exit_code_the_signal_or_the_stop(status, stopping, want):
    e = ended_report("run-ab-1", status, stopping, T0)
    got = msgspec.to_builtins(e)
    for k, v in want.items():
        assert getattr(e, k) == v, (k, got)
    assert msgspec.json.decode(msgspec.json.encode(e), type=EndedJob) == e  # within the wire's bounds


def test_an_old_snapshot_without_the_new_fields_still_decodes_and_bounds_hold():
    old = msgspec.json.decode(b'{"ended": [{"job_id": "12-3", "ok": true, "at": 5.0}]}', type=JobsSection)
    assert old.ended[0] == EndedJob(job_id="12-3", ok=True, at=5.0)
    assert old.ended[0].exit_code is None and old.ended[0].signal is None and old.ended[0].rule == ""
    for bad in ({"exit_code": 256}, {"exit_code": -1}, {"signal": 0}, {"signal": 65}, {"rule": "x" * 33},
                {"rule": "Operator"}, {"reason": "a\x00b"}, {"reason": "r" * 257}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({"job_id": "run-a-1", **bad}, EndedJob)


# -- the requesting node's table -------------------------------------------------------------------------------
def test_a_run_goes_from_waiting_to_running_to_its_exit_status():
    t = table_with("ab-1")
    assert t.get("ab-1").state == "waiting" and not t.get("ab-1").final
    assert t.observe([MemberRuns("n1", running=frozenset())], T0 + 1) == []
    [r] = t.observe([MemberRuns("n1", running=frozenset()), MemberRuns("n2", running=frozenset({"run-ab-1"}))],
                    T0 + 2)
    assert (r.state, r.node) == ("running", "n2") and exit_status_of_record(r) is None
    assert not t.waiting() and t.nodes() == {"n2"} and t.open() == [r]  # (only n2's reports matter now)
    [r] = t.observe([MemberRuns("n2", running=frozenset(), ended=(ended_report("run-ab-1", 3, None, T0 + 3),))],
                    T0 + 4)
    assert (r.state, r.exit_code, r.node, r.ended_at) == ("exited", 3, "n2", T0 + 3)
    assert exit_status_of_record(r) == 3
    # final: nothing changes it any more (a later report, the node's death, a cancel)
    assert t.observe([MemberRuns("n2", gone=True)], T0 + 9) == [] and not t.cancel("ab-1", T0 + 9)
    assert t.get("ab-1") == r and t.open() == [] and RunTable(t.rows()).open() == []


def test_a_quick_run_is_known_from_its_ended_report_alone():
    t = table_with("ab-1", "ab-2", "ab-3")
    ended = (ended_report("run-ab-1", 0, None, T0), ended_report("run-ab-2", -9, None, T0),
             ended_report("run-ab-3", -15, "stopped by the operator", T0), ended_report("99-9", 1, None, T0))
    changed = t.observe([MemberRuns("n3", running=frozenset(), ended=ended)], T0 + 1)
    assert {r.id: r.state for r in changed} == {"ab-1": "exited", "ab-2": "killed", "ab-3": "stopped"}
    assert [exit_status_of_record(t.get(i)) for i in ("ab-1", "ab-2", "ab-3")] == [0, 128 + 9, NOT_RUN_STATUS]
    assert (t.get("ab-3").rule, t.get("ab-3").reason) == ("operator", "stopped by the operator")


def test_a_refusal_ends_a_waiting_run_unless_it_runs_elsewhere():
    t = table_with("ab-1", "ab-2")
    refusals = {"run-ab-1": "node cordoned", "run-ab-2": "node cordoned"}
    t.observe([MemberRuns("n1", running=frozenset(), refused=refusals),
               MemberRuns("n2", running=frozenset({"run-ab-2"}))], T0 + 1)
    assert (t.get("ab-1").state, t.get("ab-1").reason) == ("refused", "n1: node cordoned")
    assert exit_status_of_record(t.get("ab-1")) == NOT_RUN_STATUS
    assert t.get("ab-2").state == "running"


def test_a_run_whose_node_dies_or_is_forgotten_is_lost():
    t = table_with("ab-1", "ab-2", "ab-3")
    t.observe([MemberRuns("n1", running=frozenset({"run-ab-1"})), MemberRuns("n2", running=frozenset({"run-ab-2"})),
               MemberRuns("n3", running=frozenset({"run-ab-3"}))], T0 + 1)
    # n1 dead (its last snapshot still lists the run), n2 forgotten, n3 alive but its list is not known now
    down = [MemberRuns("n1", gone=True, running=frozenset({"run-ab-1"})), MemberRuns("n3")]
    t.observe(down, T0 + 2)
    a, b = t.get("ab-1"), t.get("ab-2")
    assert (a.state, a.unseen_since) == ("running", T0 + 2)  # death starts the grace (a false suspicion ends)
    assert (b.state, b.reason) == ("lost", "node lost: n2 is forgotten by the membership")  # held, then removed
    assert t.next_deadline() == T0 + 2 + UNSEEN_GRACE_S
    t.observe(down, T0 + 2 + UNSEEN_GRACE_S - 0.1)
    assert t.get("ab-1").state == "running"
    t.observe(down, T0 + 2 + UNSEEN_GRACE_S)
    a, c = t.get("ab-1"), t.get("ab-3")
    assert (a.state, a.reason, a.ended_at) == ("lost", "node lost: n1 is dead or left", T0 + 2 + UNSEEN_GRACE_S)
    assert c.state == "running" and exit_status_of_record(a) == NOT_RUN_STATUS


def test_its_end_reported_before_the_death_wins_over_the_lost_node():
    t = table_with("ab-1")
    t.observe([MemberRuns("n1", running=frozenset({"run-ab-1"}))], T0 + 1)
    t.observe([MemberRuns("n1", gone=True, running=frozenset(), ended=(ended_report("run-ab-1", 0, None, T0),))],
              T0 + 2)
    assert (t.get("ab-1").state, t.get("ab-1").exit_code) == ("exited", 0)


def test_a_run_gone_from_a_complete_list_without_a_report_is_lost_but_not_from_an_older_fetched_one():
    t = table_with("ab-1", "ab-2")
    t.observe([MemberRuns("n1", running=frozenset({"run-ab-1"})), MemberRuns("n2", running=frozenset({"run-ab-2"}))],
              T0 + 1)
    gone = [MemberRuns("n1", running=frozenset()), MemberRuns("n2", running=frozenset(), running_complete=False)]
    t.observe(gone, T0 + 2)
    assert t.get("ab-1").unseen_since == T0 + 2 and t.next_deadline() == T0 + 2 + UNSEEN_GRACE_S
    # back within the grace (an agent that restarted re-adopts its jobs): nothing lost
    t.observe([MemberRuns("n1", running=frozenset({"run-ab-1"})), gone[1]], T0 + 3)
    assert t.get("ab-1").unseen_since is None and t.next_deadline() == math.inf
    t.observe(gone, T0 + 4)
    t.observe(gone, T0 + 4 + UNSEEN_GRACE_S - 0.1)
    assert t.get("ab-1").state == "running"
    t.observe(gone, T0 + 4 + UNSEEN_GRACE_S)
    assert (t.get("ab-1").state, t.get("ab-1").reason) == ("lost", "ended on n1; its outcome was not seen")
    assert t.get("ab-2").state == "running" and t.get("ab-2").unseen_since is None


def test_the_operator_cancels_a_waiting_run_only():
    t = table_with("ab-1", "ab-2")
    t.observe([MemberRuns("n2", running=frozenset({"run-ab-2"}))], T0 + 1)
    assert t.cancel("ab-1", T0 + 2) and not t.cancel("ab-2", T0 + 2) and not t.cancel("zz-1", T0 + 2)
    # withdrawn: no node may have started it yet; final once none reported it within the grace
    assert (t.get("ab-1").state, t.get("ab-1").withdrawn_at) == ("waiting", T0 + 2)
    assert t.next_deadline() == T0 + 2 + UNSEEN_GRACE_S
    t.observe([MemberRuns("n2", running=frozenset({"run-ab-2"}))], T0 + 2 + UNSEEN_GRACE_S - 0.1)
    assert t.get("ab-1").state == "waiting"
    t.observe([MemberRuns("n2", running=frozenset({"run-ab-2"}))], T0 + 2 + UNSEEN_GRACE_S)
    r = t.get("ab-1")
    assert (r.state, r.rule, r.reason, r.ended_at) == ("stopped", "operator", "stopped by the operator",
                                                       T0 + 2 + UNSEEN_GRACE_S)
    assert exit_status_of_record(r) == NOT_RUN_STATUS and t.get("ab-2").state == "running"


def test_the_table_keeps_the_newest_outcomes_and_every_open_run():
    t = RunTable()
    t.requested("open-1", "tpl", T0)
    for i in range(MAX_OUTCOMES + 50):
        t.requested(f"r-{i}", "tpl", T0 + i)
        t.cancel(f"r-{i}", T0 + i)
        t.observe([], T0 + i + UNSEEN_GRACE_S)
    assert len(t.rows()) == MAX_OUTCOMES
    assert t.get("open-1") is not None and t.get("r-0") is None and t.get(f"r-{MAX_OUTCOMES + 49}") is not None
    assert [r.id for r in t.open()] == ["open-1"]


def test_exit_status_mapping():
    base = RunRecord(id="a-1", job_id="run-a-1")
    assert exit_status_of_record(base) is None
    assert exit_status_of_record(msgspec.structs.replace(base, state="running", node="n")) is None
    assert exit_status_of_record(msgspec.structs.replace(base, state="exited", exit_code=0)) == 0
    assert exit_status_of_record(msgspec.structs.replace(base, state="exited", exit_code=255)) == 255
    assert exit_status_of_record(msgspec.structs.replace(base, state="killed", signal=15)) == 143
    for state in ("stopped", "refused", "lost"):
        assert exit_status_of_record(msgspec.structs.replace(base, state=state)) == NOT_RUN_STATUS


# -- kept with the operator's intents --------------------------------------------------------------------------
def test_outcomes_are_kept_in_the_operator_file_and_read_back_through_the_typed_boundary(tmp_path):
    store = IntentStore(tmp_path)
    a = store.add_run("tpl", {}, "", "", "nodeabcdef", T0)
    b = store.add_run("tpl", {}, "", "", "nodeabcdef", T0)
    assert store.run_record(a.id).state == "waiting"
    assert store.cancel_run(a.id, T0 + 1) and not store.cancel_run(a.id, T0 + 2)
    assert [r.id for r in store.section.runs] == [b.id]  # withdrawn: the leader no longer sees it
    store.observe_runs([MemberRuns("n2", running=frozenset(), ended=(ended_report(f"run-{b.id}", 4, None, T0),))],
                       T0 + 3)
    again = IntentStore(tmp_path)
    assert again.run_record(a.id).withdrawn_at == T0 + 1 and again.run_record(b.id).exit_code == 4
    again.observe_runs([], T0 + 1 + UNSEEN_GRACE_S)
    assert IntentStore(tmp_path).run_record(a.id).state == "stopped"
    raw = json.loads((tmp_path / "operator.json").read_text())
    raw["outcomes"].append({"id": "bad id!", "job_id": "run-x"})
    raw["outcomes"].append({"id": "ok-1", "job_id": "run-ok-1", "state": "exited", "exit_code": 999})
    (tmp_path / "operator.json").write_text(json.dumps(raw))
    third = IntentStore(tmp_path)
    assert [r.id for r in third.runs.rows()] == [a.id, b.id]
    assert third.report.count("operator.json", "bad_entry") == 2
    del raw["outcomes"]  # a file from before issue 39
    (tmp_path / "operator.json").write_text(json.dumps(raw))
    assert IntentStore(tmp_path).runs.rows() == []


# -- the leader stops carrying a withdrawn run -----------------------------------------------------------------
def test_a_run_withdrawn_before_it_started_is_no_longer_carried_by_the_plan():
    c = parse_catalog({"job": [{"name": "ev", "kind": "evaluation", "argv": ["x"], "config": "hex8_2p",
                                "max_concurrency": 0, "resources": {"num_gpus": 1, "vram_gib": 8}}]})
    planner = Planner(c)
    members = [MemberPlanInput("n1", node("n1"))]
    req = RunRequest(id="ab-1", template="ev", node="n1")
    first = planner.lead(7, members, None, {}, 100.0, T0, runs=[req]).section
    assert [a.job_id for a in first.assignments] == ["run-ab-1"]
    kept = planner.lead(7, members, first, {}, 101.0, T0, runs=[req]).section
    assert [a.job_id for a in kept.assignments] == ["run-ab-1"]  # still wanted: carried while it starts
    started = planner.lead(7, members, kept, {}, 102.0, T0, runs=[], done_runs={"run-ab-1"}).section
    assert [a.job_id for a in started.assignments] == ["run-ab-1"]  # started on n1 (its done_runs): carried
    dropped = planner.lead(7, members, kept, {}, 103.0, T0, runs=[]).section
    assert dropped.assignments == []


# -- the CLI's wait (a fake agent, virtual time) ---------------------------------------------------------------
class _Resp:
    def __init__(self, status: int, body: object) -> None:
        self.status_code, self._body, self.text = status, body, json.dumps(body)

    def json(self):
        return self._body


class _Agent:
    """Answers ``GET /jobs/runs?id=<id>`` with ``records`` in turn (the last one repeated) and ``GET /jobs`` with
    ``view``; time advances only when the CLI sleeps."""

    def __init__(self, records, view=None, interrupt_after=None):
        self.records, self.view, self.now, self.gets, self.interrupt_after = list(records), view or {}, 0.0, 0, \
            interrupt_after

    def get(self, url, timeout):
        if url.endswith("/jobs"):
            return _Resp(200, self.view)
        self.gets += 1
        if self.interrupt_after is not None and self.gets > self.interrupt_after:
            raise KeyboardInterrupt
        r = self.records.pop(0) if len(self.records) > 1 else self.records[0]
        return r if isinstance(r, _Resp) else _Resp(200, r)

    def sleep(self, s):
        self.now += s


def _wait(monkeypatch, agent, timeout_s=None, as_json=False):
    from p2pnode.cli import _jobs

    monkeypatch.setattr(_jobs, "http_get", agent.get)
    return _jobs.wait_outcome("http://a", {"id": "ab-1", "job_id": "run-ab-1"}, timeout_s, 1.0, as_json=as_json,
                              clock=lambda: agent.now, sleep=agent.sleep)


def _rec(state, **kw):
    r = RunRecord(id="ab-1", job_id="run-ab-1", template="tpl", state=state, **kw)
    return {**msgspec.structs.asdict(r), "final": r.final, "exit_status": exit_status_of_record(r)}


def test_wait_exits_with_the_jobs_own_status_or_128_plus_the_signal(monkeypatch, capsys):
    agent = _Agent([_rec("waiting"), _rec("running", node="n2"), _rec("exited", node="n2", exit_code=3)])
    assert _wait(monkeypatch, agent) == 3
    assert "run-ab-1 exited with status 3 on n2" in capsys.readouterr().err and agent.now == 1.0
    assert _wait(monkeypatch, _Agent([_rec("killed", node="n2", signal=9)])) == 137
    assert _wait(monkeypatch, _Agent([_rec("exited", node="n2", exit_code=0)]), as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["exit_code"] == 0


def test_wait_gives_125_with_the_reason_for_a_stop_a_refusal_or_a_lost_node(monkeypatch, capsys):
    for rec in (_rec("stopped", rule="operator", reason="stopped by the operator"),
                _rec("refused", reason="n1: node cordoned"), _rec("lost", node="n3", reason="node lost: n3 is dead")):
        assert _wait(monkeypatch, _Agent([rec])) == NOT_RUN_STATUS
        assert rec["reason"] in capsys.readouterr().err


def test_the_wait_timeout_does_not_cancel_and_names_the_leaders_reason(monkeypatch, capsys):
    view = {"pending": [{"template": "tpl (run ab-1)", "reason": "unsatisfiable: no node carries tag gpu-x"}]}
    agent = _Agent([_rec("waiting")], view=view)
    assert _wait(monkeypatch, agent, timeout_s=3.0) == NOT_RUN_STATUS
    err = capsys.readouterr().err
    assert "could not be placed within 3 s: unsatisfiable: no node carries tag gpu-x; it still waits" in err
    assert "run-ab-1" in err and 3.0 <= agent.now <= 3.5
    assert _wait(monkeypatch, _Agent([_rec("running", node="n2")]), timeout_s=1.0) == 124
    assert "still runs on n2" in capsys.readouterr().err


def test_ctrl_c_detaches_and_prints_the_run_id_and_an_unknown_run_ends_the_wait(monkeypatch, capsys):
    assert _wait(monkeypatch, _Agent([_rec("waiting")], interrupt_after=2)) == 130
    assert "detached from run-ab-1" in capsys.readouterr().err
    assert _wait(monkeypatch, _Agent([_Resp(404, {"error": "unknown_run"})])) == NOT_RUN_STATUS
    assert _wait(monkeypatch, _Agent([_Resp(401, {"error": "unauthenticated"})])) == 2


# -- members' snapshots as the table's input (the driver's side) -----------------------------------------------
def _member(origin, state="alive", running=(), ended=(), refused=(), inline=True):
    from p2pnode.gossip import MemberState
    from p2pnode.node import Member
    from p2pnode.snapshot import SCHEMA_VERSION, JobReport, Refusal, Snapshot

    reports = [JobReport(job_id=j, template="tpl") for j in running]
    js = JobsSection(running=reports if inline else [], running_count=len(reports), ended=list(ended),
                     refused=[Refusal(job_id=j, reason="full") for j in refused])
    snap = Snapshot(schema=SCHEMA_VERSION, origin=origin, version=1, addr="127.0.0.1:1", tags=[], leaving=False,
                    jobs=js)
    return Member(origin, MemberState(state), snap, b"k" * 32, 0.0), reports


def test_members_snapshots_become_the_tables_input():
    from p2pnode.jobs._runs import member_runs

    inline, _ = _member("n1", running=("run-a-1", "7-1"), ended=(ended_report("run-a-2", 0, None, T0),
                                                                 EndedJob(job_id="7-2")), refused=("run-a-3", "7-3"))
    fetched, reports = _member("n2", running=("run-a-4",), inline=False)
    dead, _ = _member("n3", state="dead", running=("run-a-5",))
    one, two, three = member_runs([inline, fetched, dead], lambda m: reports if m.origin == "n2" else None)
    assert (one.running, one.running_complete, one.gone) == (frozenset({"run-a-1", "7-1"}), True, False)
    assert [e.job_id for e in one.ended] == ["run-a-2"] and one.refused == {"run-a-3": "full"}
    assert (two.running, two.running_complete) == (frozenset({"run-a-4"}), False)  # fetched: maybe older
    assert three.gone


# -- review findings (issue 39, hostile review of the run outcomes) -------------------------------------------------
def _running_on_n1() -> RunTable:
    t = table_with("ab-1")
    t.observe([MemberRuns("n1", running=frozenset({"run-ab-1"}))], T0 + 1)
    assert (t.get("ab-1").state, t.get("ab-1").node) == ("running", "n1")
    return t


def test_a_member_that_does_not_run_the_job_cannot_publish_its_outcome():
    t = _running_on_n1()
    liar = MemberRuns("n2", running=frozenset({"run-ab-1"}), ended=(ended_report("run-ab-1", 0, None, T0 + 2),))
    t.observe([liar, MemberRuns("n1", running=frozenset({"run-ab-1"}))], T0 + 3)
    assert (t.get("ab-1").state, t.get("ab-1").node) == ("running", "n1")
    t.observe([liar, MemberRuns("n1", running=frozenset(), ended=(ended_report("run-ab-1", 3, None, T0 + 4),))],
              T0 + 5)
    assert (t.get("ab-1").state, t.get("ab-1").exit_code, t.get("ab-1").node) == ("exited", 3, "n1")


def test_while_it_waits_only_the_node_the_acting_plan_assigns_it_is_believed():
    t = table_with("ab-1", "ab-2")
    placed = {"run-ab-1": "n1", "run-ab-2": "n1"}
    claims = [MemberRuns("n0", running=frozenset({"run-ab-1"}), refused={"run-ab-2": "no"}),
              MemberRuns("n1", running=frozenset())]
    t.observe(claims, T0 + 1, placed)
    assert t.get("ab-1").state == "waiting" and t.get("ab-2").state == "waiting"
    t.observe([MemberRuns("n0", running=frozenset()), MemberRuns("n1", running=frozenset({"run-ab-1"}),
                                                                 refused={"run-ab-2": "full"})], T0 + 2, placed)
    assert (t.get("ab-1").state, t.get("ab-1").node) == ("running", "n1")
    assert (t.get("ab-2").state, t.get("ab-2").reason) == ("refused", "n1: full")


def _no_member_yet():
    class Ctx:  # a node context right after the agent started: it holds no member's snapshot yet
        def members(self):
            return []

        def member(self, origin):
            return None

    return Ctx()


def test_the_requesting_agent_restarting_does_not_lose_its_running_runs(tmp_path):
    from p2pnode.jobs._runs import follow_runs

    store = IntentStore(tmp_path)
    req = store.add_run("tpl", {}, "", "", "nodeabcdef", T0)
    store.observe_runs([MemberRuns("n1", running=frozenset({f"run-{req.id}"}))], T0 + 1)
    store.finish_runs({req.id})
    again = IntentStore(tmp_path)  # restarted: its first steps run before gossip brings n1 back
    follow_runs(again, _no_member_yet(), lambda m: None, T0 + 5)
    assert again.run_record(req.id).state == "running" and again.runs.next_deadline() == T0 + 5 + UNSEEN_GRACE_S
    follow_runs(again, _no_member_yet(), lambda m: None, T0 + 5 + UNSEEN_GRACE_S - 0.1)
    assert again.run_record(req.id).state == "running"
    again.observe_runs([MemberRuns("n1", running=frozenset({f"run-{req.id}"}))], T0 + 6)  # n1 is back
    follow_runs(again, _no_member_yet(), lambda m: None, T0 + 7)  # then forgotten: lost at once
    assert again.run_record(req.id).reason == "node lost: n1 is forgotten by the membership"
    # never held since the start: lost once the grace from the start passed
    third = IntentStore(tmp_path)
    other = third.add_run("tpl", {}, "", "", "nodeabcdef", T0)
    third.finish_runs({other.id}, {other.id: "n9"})
    follow_runs(third, _no_member_yet(), lambda m: None, T0 + 10)
    follow_runs(third, _no_member_yet(), lambda m: None, T0 + 10 + UNSEEN_GRACE_S)
    assert third.run_record(other.id).reason == "node lost: n9 is forgotten by the membership"


def test_a_run_started_but_never_seen_running_or_ended_is_running_on_the_node_that_started_it(tmp_path):
    store = IntentStore(tmp_path)
    req = store.add_run("tpl", {}, "", "", "nodeabcdef", T0)
    store.finish_runs({req.id}, {req.id: "n1"})  # n1's done_runs name it: the request is forgotten
    assert (store.run_record(req.id).state, store.run_record(req.id).node) == ("running", "n1")
    with pytest.raises(RunPlaced) as placed:  # the operator's stop goes to n1, not a false "withdrawn"
        store.cancel_run(req.id, T0 + 1)
    assert placed.value.node == "n1" and f"p2pnode jobs stop run-{req.id}" in str(placed.value)
    store.observe_runs([MemberRuns("n1", gone=True, running=frozenset())], T0 + 2)
    store.observe_runs([MemberRuns("n1", gone=True, running=frozenset())], T0 + 2 + UNSEEN_GRACE_S)
    r = store.run_record(req.id)
    assert (r.state, r.reason) == ("lost", "node lost: n1 is dead or left")


def test_withdrawing_a_run_the_acting_plan_placed_is_refused_and_a_later_report_decides(tmp_path):
    store = IntentStore(tmp_path)
    req = store.add_run("tpl", {}, "", "", "nodeabcdef", T0)
    with pytest.raises(RunPlaced):
        store.cancel_run(req.id, T0 + 1, placed_on="n1")
    assert [r.id for r in store.section.runs] == [req.id] and store.run_record(req.id).withdrawn_at is None
    # not known placed here (this node does not lead): withdrawn, but n1 had started it: its exit decides
    t = table_with("ab-1")
    assert t.cancel("ab-1", T0 + 1)
    t.observe([MemberRuns("n1", running=frozenset(), ended=(ended_report("run-ab-1", 0, None, T0 + 9),))], T0 + 10)
    assert (t.get("ab-1").state, t.get("ab-1").exit_code, t.get("ab-1").rule) == ("exited", 0, "")


def test_a_member_briefly_declared_dead_does_not_turn_a_run_that_exits_0_into_node_lost():
    t = _running_on_n1()
    t.observe([MemberRuns("n1", gone=True, running=frozenset({"run-ab-1"}))], T0 + 2)  # a false suspicion
    t.observe([MemberRuns("n1", running=frozenset({"run-ab-1"}))], T0 + 3)
    assert t.get("ab-1").unseen_since is None
    t.observe([MemberRuns("n1", running=frozenset(), ended=(ended_report("run-ab-1", 0, None, T0 + 5),))], T0 + 6)
    assert (t.get("ab-1").state, t.get("ab-1").exit_code) == ("exited", 0)


def test_a_request_not_written_leaves_no_record(tmp_path, monkeypatch):
    import p2pnode.node._operator as op

    store = IntentStore(tmp_path)

    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(op, "atomic_write_bytes", fail)
    with pytest.raises(OSError):
        store.add_run("tpl", {}, "", "", "nodeabcdef", T0)
    assert store.runs.rows() == [] and store.section.runs == []


def test_stop_rules_are_named_by_whole_words_or_prefixes():
    assert rule_of_reason("finished") == "" and rule_of_reason("load shed: memory") == "shed"
    assert rule_of_reason("stopped: agent shutdown") == "agent_stop"
    assert rule_of_reason("the gang's member ended") == "gang_ended" and rule_of_reason("megang") == ""


@pytest.mark.parametrize("argv", [["--wait", "30", "--wait-timeout", "5"], ["--wait", "30", "--json"], ["--json"],
                                  ["--wait-timeout", "-1"], ["--wait-timeout", "nan"], ["--wait", "inf"]])
def test_run_wait_flag_combinations_that_would_be_ignored_are_refused(argv):
    from p2pnode.cli._parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["jobs", "run", "tpl", *argv])


@pytest.mark.parametrize("argv", [["--wait"], ["--wait", "--json"], ["--wait-timeout", "5", "--json"], ["--wait", "0"],
                                  ["--wait", "--wait-timeout", "0"]])
def test_run_wait_flag_combinations_that_mean_something_are_accepted(argv):
    from p2pnode.cli._parser import build_parser

    ns = build_parser().parse_args(["jobs", "run", "tpl", *argv])
    assert ns.template == "tpl"


def test_the_operator_control_believes_only_the_planned_node_and_follows_the_node_that_started_a_run(tmp_path):
    """The driver (``OperatorControl.apply``, ``stop_job``): a request is forgotten as started only on the word of
    the node the acting plan assigns it (when known here), and its record runs on that node from then; a run
    placed is not withdrawn by ``jobs stop`` (409 on the route)."""
    from types import SimpleNamespace

    from p2pnode.jobs._operator import OperatorControl
    from p2pnode.snapshot import OperatorSection, PlanJob, PlanSection

    def member(origin, done):
        m, _ = _member(origin)
        snap = msgspec.structs.replace(m.snapshot, operator=OperatorSection(done_runs=list(done)))
        return msgspec.structs.replace(m, snapshot=snap)

    members: list = []
    ctx = SimpleNamespace(data_dir=tmp_path, members=lambda: members,
                          member=lambda o: next((m for m in members if m.origin == o), None), publish_soon=lambda: None)
    plan: list = [None]
    from p2pnode.jobs._ledger import JobLedger

    oc = OperatorControl(ctx, SimpleNamespace(jobs={}, ledger=JobLedger(tmp_path / "jobs" / "ledger.db")),
                         lambda m: None, lambda: plan[0])
    a = oc.intents.add_run("tpl", {}, "", "", "nodeabcdef", T0)
    b = oc.intents.add_run("tpl", {}, "", "", "nodeabcdef", T0)
    plan[0] = PlanSection(term=1, assignments=[PlanJob(job_id=f"run-{a.id}", node="n1", template="tpl")])
    members[:] = [member("n0", [f"run-{a.id}"]), member("n1", [])]
    oc.apply()  # n0 claims a, which the plan gives n1: not believed
    assert {r.id for r in oc.section.runs} == {a.id, b.id} and oc.intents.run_record(a.id).state == "waiting"
    with pytest.raises(RunPlaced):  # placed by the acting plan: not withdrawn
        oc.stop_job(f"run-{a.id}")
    members[:] = [member("n0", [f"run-{b.id}"]), member("n1", [f"run-{a.id}"])]
    oc.apply()
    assert not oc.section.runs
    assert [(oc.intents.run_record(i).state, oc.intents.run_record(i).node) for i in (a.id, b.id)] == [
        ("running", "n1"), ("running", "n0")]


def test_jobs_stop_of_a_placed_run_asks_the_other_nodes_and_reports_the_409_when_none_runs_it(monkeypatch, capsys):
    import p2pnode.cli._jobs as cj
    from p2pnode.cli._parser import build_parser

    answers: dict = {}
    monkeypatch.setattr(cj, "_owner_urls", lambda ns, job_id: ["http://a", "http://b"])
    monkeypatch.setattr(cj, "post_json", lambda url, body, timeout: answers[url.removesuffix("/jobs/stop")])
    placed = _Resp(409, {"error": "placed", "detail": "run-ab-1 is already placed on node n1: not withdrawn"})
    ns = build_parser().parse_args(["jobs", "stop", "run-ab-1"])
    answers.update({"http://a": placed, "http://b": _Resp(200, {"stopped": "run-ab-1", "node_id": "n1"})})
    assert cj._cmd_jobs(ns) == 0  # the requester's 409 did not end the search: n1 stopped it
    answers["http://b"] = _Resp(404, {"error": "not_here"})
    assert cj._cmd_jobs(ns) != 0 and "already placed on node n1" in capsys.readouterr().err
