"""The job core keeps its job table (:attr:`p2pnode.node.JobCore.table`) as it decides and as the driver reports:
starts, stops with their rule (plan, adoption, shed), final refusals, waiting starts, exits and their outcomes; the
executor's entry point :meth:`p2pnode.node.JobCore.observe`. Virtual time, no process."""

from __future__ import annotations

import sqlite3
from collections import Counter, deque
from types import SimpleNamespace

import pytest
from test_job_core import (
    GRACE,
    core,
    cpu,
    drive,
    inputs,
    lead,
    local,
    member,
    of,
    pjob,
    plan_of,
    shed_core,
    shed_jobs,
)

from p2pnode.guardcore import Pressure
from p2pnode.jobs._control import JobControl
from p2pnode.node import Leadership, Refuse, StartJob, StopJob
from p2pnode.node._plandist import part_version
from p2pnode.node._table import (
    MAX_HISTORY,
    Adopted,
    Assigned,
    Exited,
    StartAsked,
    Started,
    StopAsked,
    TransitionError,
)
from p2pnode.snapshot import PlanStop, plan_ref


def acting(c, jobs, stops=()):
    p = plan_of(1, 1, jobs, stops)
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    return p


def test_a_started_job_runs_ends_and_is_kept_in_the_history_with_its_outcome():
    c = core("b")
    p = acting(c, [pjob("1-1", "b"), pjob("1-2", "b", gpu=1)])
    ms = [member("b"), member("a", plan=p)]
    assert len(of(drive(c, inputs(lead("a"), ms), 0.0), StartJob)) == 2
    assert c.table.state("1-1") == "starting" and "1-1" in c.ran
    running = {"1-1": local("1-1", started=0.0), "1-2": local("1-2", started=0.0)}
    drive(c, inputs(lead("a"), ms, running), 1.0)
    assert c.table.state("1-1") == "running" and c.table.get("1-1").started_at == 1.0
    c.job_exited("1-1", False, 5.0)
    r = c.observe(Exited("1-2", status=3), 6.0)
    assert r.state == "ended" and r.outcome == "failed" and r.status == 3
    assert c.breaker.consecutive_failures == 1  # the exit status 3 fed the breaker
    assert [(h.job_id, h.outcome) for h in c.history()] == [("1-2", "failed"), ("1-1", "completed")]
    assert not of(drive(c, inputs(lead("a"), ms), 7.0), StartJob)  # never started again by the same plan


def test_an_event_with_no_transition_is_reported_and_changes_nothing():
    c = core("b")
    err = c.observe(Started("nobody", 12), 0.0)
    assert isinstance(err, TransitionError) and c.table.errors[("unknown", "Started")] == 1
    assert c.table.get("nobody") is None


def test_plan_stops_and_adoption_grace_stops_carry_their_rule_and_the_table_knows_them_stopping():
    c = core("b", interval_s=300.0)
    p = acting(c, [], stops=[])
    running = {"old": local("old", started=-100.0), "back": local("back", started=-100.0, adopted=True)}
    inp = inputs(lead("a"), [member("b"), member("a", plan=p)], running)
    (stop,) = of(drive(c, inp, 100.0), StopJob)
    assert (stop.job_id, stop.rule) == ("old", "plan")
    assert c.table.state("old") == "stopping" and c.table.get("old").rule == "plan"
    # the driver has not marked it stopping (LocalJob.stopping False): the table's state keeps it from a second stop
    (stop,) = of(drive(c, inp, 100.0 + GRACE), StopJob)
    assert (stop.job_id, stop.rule) == ("back", "adoption")
    assert c.table.get("back").adopted
    del running["old"], running["back"]  # both gone without an exit report (the simulator's way)
    drive(c, inputs(lead("a"), [member("b"), member("a", plan=p)], running), 200.0)
    assert [(h.job_id, h.outcome, h.rule) for h in c.history()] == [("back", "stopped", "adoption"),
                                                                     ("old", "stopped", "plan")]


def test_a_shed_stop_carries_its_rule_and_a_stopping_job_is_not_shed_again():
    c, running = shed_core(), shed_jobs()
    lsh = Leadership(None, None, 0, True, {})
    drive(c, inputs(lsh, [member("b")], running, pressure=cpu(0.0)), 0.0)
    (s,) = of(drive(c, inputs(lsh, [member("b")], running, pressure=cpu(10.0)), 10.0), StopJob)
    assert s.rule == "shed" and c.table.get(s.job_id).rule == "shed" and c.table.state(s.job_id) == "stopping"
    assert not of(drive(c, inputs(lsh, [member("b")], running, pressure=cpu(11.0)), 11.0), StopJob)


def test_a_refusal_is_a_final_refused_record_and_waiting_starts_are_records_withdrawn_when_fenced():
    c = core("b")
    p = acting(c, [pjob("1-1", "b")])
    no = inputs(lead("a"), [member("b"), member("a", plan=p)], refuse_new="disk full")
    assert of(drive(c, no, 0.0), Refuse) == [Refuse("1-1", "sp", "disk full")]
    r = c.table.get("1-1")
    assert r.state == "refused" and r.reason == "disk full" and "1-1" in c.ran
    w = core("b", spawns_per_minute=1.0)
    p = acting(w, [pjob("1-1", "b"), pjob("1-2", "b", gpu=1)])
    ms = [member("b"), member("a", plan=p)]
    drive(w, inputs(lead("a"), ms), 0.0)
    assert w.table.state("1-2") == "waiting" and "spawn-rate limit" in w.table.get("1-2").reason
    assert "1-2" not in w.ran
    drive(w, inputs(lead("a", 1, highest=2), ms), 1.0)  # fenced: it is no longer asked for
    assert w.table.get("1-2") is None


def test_ids_from_the_run_history_are_never_started_and_the_executors_own_stop_is_kept():
    c = core("b", ran={"1-1"})
    p = acting(c, [pjob("1-1", "b"), pjob("1-2", "b", gpu=1)])
    ms = [member("b"), member("a", plan=p)]
    assert [s.job.job_id for s in of(drive(c, inputs(lead("a"), ms), 0.0), StartJob)] == ["1-2"]
    drive(c, inputs(lead("a"), ms, {"1-2": local("1-2")}), 1.0)
    r = c.observe(StopAsked("1-2", "max_runtime", "maximum runtime reached"), 2.0)
    assert r.state == "stopping"
    c.job_exited("1-2", None, 3.0)  # stopped: not fed to the breaker
    assert c.table.get("1-2").outcome == "stopped" and c.table.get("1-2").rule == "max_runtime"
    assert c.breaker.consecutive_failures == 0


def test_a_start_the_executor_never_reports_running_failed_to_start():
    pressure = Pressure((), 0.0)
    c = core("b")
    p = acting(c, [pjob("1-1", "b")])
    ms = [member("b"), member("a", plan=p)]
    drive(c, inputs(lead("a"), ms, pressure=pressure), 0.0)
    drive(c, inputs(lead("a"), ms, pressure=pressure), 1.0)
    assert c.table.get("1-1").outcome == "start_failed"


# -- issue 39 review: restarts, same-step stops, the bound, exit status -------------------------------------------
def test_a_job_running_across_a_restart_is_adopted_and_one_ended_while_down_is_recorded_ended():
    c = core("b", ran={"1-1", "gone"})  # the run history after a restart: rows of runs not ended included
    assert c.table.state("1-1") == "remembered" and "1-1" in c.ran and "gone" in c.ran
    p = acting(c, [pjob("1-1", "b")])
    ms = [member("b"), member("a", plan=p)]
    running = {"1-1": local("1-1", started=-50.0, adopted=True)}
    assert not of(drive(c, inputs(lead("a"), ms, running), 0.0), StartJob)  # never started again
    r = c.table.get("1-1")
    assert r is not None and r.state == "running" and r.adopted and r.started_at == -50.0
    c.job_exited("1-1", False, 10.0)
    c.job_exited("gone", True, 1.0)  # the runner's readopt found it ended while the agent was down
    assert c.table.get("1-1").outcome == "completed" and c.table.get("gone").outcome == "failed"
    assert not c.table.errors, dict(c.table.errors)
    assert "1-1" in c.ran and "gone" in c.ran


def _preempted_after_restart(c):
    p = acting(c, [pjob("1-9", "b")], [PlanStop(job_id="old", node="b", reason="preempted by 1-9")])
    running = {"old": local("old", started=-50.0, adopted=True)}
    inp = inputs(lead("a"), [member("b"), member("a", plan=p)], running)  # old holds GPU 0, which 1-9 needs
    return drive(c, inp, 0.0)


def test_a_preempted_readopted_job_of_the_history_holds_its_replacement_back():
    c = core("b", ran={"old"})
    out = _preempted_after_restart(c)
    assert [e.job_id for e in of(out, StopJob)] == ["old"] and not of(out, Refuse) and not of(out, StartJob)
    assert c.table.state("old") == "stopping" and [w[0] for w in c.waiting] == ["1-9"]


def test_a_stop_emitted_in_the_same_step_holds_the_replacement_even_when_the_table_missed_it():
    c = core("b")
    c.table.transitions = {k: v for k, v in c.table.transitions.items() if k != ("running", StopAsked)}
    out = _preempted_after_restart(c)  # the table cannot record the stop: the emitted StopJob still counts
    assert c.table.errors[("running", "StopAsked")] == 1
    assert [e.job_id for e in of(out, StopJob)] == ["old"] and not of(out, Refuse)
    assert [w[0] for w in c.waiting] == ["1-9"]


def test_an_id_that_ran_is_not_started_again_after_more_than_max_history_later_jobs():
    c = core("b")
    p = acting(c, [pjob("1-1", "b")])
    ms = [member("b"), member("a", plan=p)]
    assert of(drive(c, inputs(lead("a"), ms), 0.0), StartJob)
    c.job_exited("1-1", False, 1.0)
    for i in range(MAX_HISTORY):  # later jobs of this node end: 1-1's record passes out of the records kept
        c.table.apply(Adopted(f"x{i}"), 2.0)
        c.table.apply(Exited(f"x{i}", status=0), 2.0)
    assert c.table.get("1-1") is None and c.table.state("1-1") == "remembered"
    assert not of(drive(c, inputs(lead("a"), ms, {"o": local("o")}), 3.0), StartJob)


def test_the_driver_passes_the_exit_status_and_the_signal_and_the_start_error():
    c = core("b")
    for j in ("three", "killed"):
        c.table.apply(Adopted(j, "sp", "selfplay"), 0.0)
    stub = SimpleNamespace(stops=SimpleNamespace(ended=lambda ids: None),
                           operator=SimpleNamespace(ended=lambda j: None), core=c,
                           ctx=SimpleNamespace(now=lambda: 5.0, publish_soon=lambda: None),
                           ended_by_kind=Counter(), ended=deque(),
                           _usage_wanted=SimpleNamespace(set=lambda: None), news=lambda: None, refused=deque(),
                           records=SimpleNamespace(flush=lambda: None))
    job = SimpleNamespace(job_id="three", stopping=None, template=SimpleNamespace(kind="selfplay"), gang=None,
                          gpus=(0,), stop_rule=None)
    JobControl._exited(stub, job, 3)  # type: ignore[arg-type]
    JobControl._exited(stub, SimpleNamespace(**{**vars(job), "job_id": "killed"}), -9)  # type: ignore[arg-type]
    three, killed = c.table.get("three"), c.table.get("killed")
    assert (three.outcome, three.status, three.signal) == ("failed", 3, None)
    c.table.apply(Adopted("late", "sp", "selfplay"), 0.0)  # the operator's side raising cannot lose the exit
    stub.operator = SimpleNamespace(ended=lambda j: (_ for _ in ()).throw(sqlite3.OperationalError("disk full")))
    with pytest.raises(sqlite3.OperationalError):
        JobControl._exited(stub, SimpleNamespace(**{**vars(job), "job_id": "late"}), 0)  # type: ignore[arg-type]
    assert c.table.get("late").outcome == "completed"
    assert (killed.outcome, killed.status, killed.signal) == ("failed", None, 9)
    c.table.apply(Assigned("s", "sp"), 6.0)
    c.table.apply(StartAsked("s"), 6.0)
    sp = SimpleNamespace(name="sp")
    JobControl._start_failed(stub, pjob("s", "b"), sp, OSError("no such file: sh"))  # type: ignore[arg-type]
    s = c.table.get("s")
    assert s.outcome == "start_failed" and "no such file: sh" in s.reason and not c.table.errors


def test_the_core_accounts_goodput_from_its_table_and_the_checkpoints_members_hold():
    """Issue 41 item 6: a training started by the plan, its checkpoints as members list them
    (:attr:`JobInputs.own_checkpoints`), a drain's stop: the run's lost time is from the newest checkpoint a replica
    held; a selfplay job is not accounted."""
    c = core("b")
    p = acting(c, [pjob("1-1", "b", template="train"), pjob("1-2", "b", gpu=1)])
    ms = [member("b"), member("a", plan=p)]
    assert len(of(drive(c, inputs(lead("a"), ms), 0.0), StartJob)) == 2
    running = {"1-1": local("1-1", "train", started=0.0), "1-2": local("1-2", started=0.0)}
    drive(c, inputs(lead("a"), ms, running), 10.0)  # running from 10
    drive(c, inputs(lead("a"), ms, running, own_checkpoints={"1-1": (1, 0)}), 30.0)  # #1 signed at 30
    drive(c, inputs(lead("a"), ms, running, own_checkpoints={"1-1": (2, 1)}), 50.0)  # #2 at 50, #1 held
    c.observe(StopAsked("1-1", "drain", "draining"), 60.0)
    c.observe(Exited("1-1", signal=15), 70.0)
    g = c.book.goodput.totals(70.0)
    assert list(g) == ["c"]
    assert (g["c"].run_s, g["c"].lost_s, g["c"].interrupted) == (60.0, 40.0, {"drain": 1})
