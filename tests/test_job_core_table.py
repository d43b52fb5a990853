"""The job core keeps its job table (:attr:`p2pnode.node.JobCore.table`) as it decides and as the driver reports:
starts, stops with their rule (plan, adoption, shed), final refusals, waiting starts, exits and their outcomes; the
executor's entry point :meth:`p2pnode.node.JobCore.observe`. Virtual time, no process."""

from __future__ import annotations

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
from p2pnode.node import Leadership, Refuse, StartJob, StopJob
from p2pnode.node._plandist import part_version
from p2pnode.node._table import Exited, Started, StopAsked, TransitionError
from p2pnode.snapshot import plan_ref


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
