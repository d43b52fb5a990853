"""The scheduling simulation drives the nodes' own stop rules beside their job cores (issue 39 item 7): drains,
maximum runtimes and memory overruns in virtual time, reported by rule, with the job tables' transition errors."""

import json
import math

import msgspec

from p2pnode.cli import main
from p2pnode.node._jobstate import StopRule
from p2pnode.scheduler import parse_catalog
from p2pnode.sim import StopsConfig, format_scheduling_report, run_scheduling
from p2pnode.sim._stops import SimStops

STOPS = StopsConfig(drains=4, drain_deadline_s=120.0, max_runtime_s=600.0, memory_over=0.05, operator_stops=5)


class _J(msgspec.Struct):
    job_id: str
    template: str
    started_at: float


def _catalog():
    return parse_catalog({"job": [
        {"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"], "preemptible": True,
         "resources": {"num_gpus": 1, "vram_gib": 8, "memory_gib": 4}},
        {"name": "tr", "kind": "training", "config": "c", "argv": ["x"], "preemptible": False,
         "resources": {"num_gpus": 1, "vram_gib": 8, "memory_gib": 4}},
    ]})


def test_a_drain_stops_preemptible_jobs_at_its_deadline_and_the_rest_run_to_their_end():
    s = SimStops(StopsConfig(drains=1, drain_deadline_s=100.0), _catalog(), seed=0)
    s.drain_at = {"n1": 50.0}
    on = {"n1": {"a": _J("a", "sp", 0.0), "b": _J("b", "tr", 0.0)}, "n2": {"c": _J("c", "sp", 0.0)}}
    assert s.step(40.0, on) == {} and not s.draining("n1")
    assert s.step(50.0, on) == {} and s.draining("n1")  # draining, deadline not passed
    assert s.rules["n1"].next_deadline() == 150.0  # the rules wake at the deadline with no other news
    assert s.step(149.0, on) == {}
    out = s.step(150.0, on)
    assert [(e.job_id, e.rule) for e in out["n1"]] == [("a", "drain")] and "n2" not in out
    del on["n1"]["a"]
    assert s.step(160.0, on) == {} and "n1" not in s.emptied  # training runs to its end
    del on["n1"]["b"]
    s.step(900.0, on)
    assert s.emptied == {"n1": 850.0}
    assert s.report() == {"nodes_drained": 1, "jobs_stopped_by_drain": 1, "nodes_emptied": 1,
                          "drain_deadline_s": 100.0, "time_to_empty_s": {"median": 850.0, "max": 850.0}}


def test_maximum_runtime_and_memory_overruns_stop_a_job_once_by_their_rule():
    s = SimStops(StopsConfig(max_runtime_s=300.0, memory_over=1.0), _catalog(), seed=1)
    on = {"n": {"a": _J("a", "sp", 0.0), "b": _J("b", "tr", 10.0)}}
    s.started("n", "a", 0.0, 1000.0)
    s.started("n", "b", 10.0, 20.0)
    assert s.step(0.0, on) == {}
    over = s.over_at["b"]
    assert 10.0 <= over <= 20.0
    out = s.step(20.0, on)
    assert [(e.job_id, e.rule) for e in out["n"]] == [("b", "memory_limit")]
    assert out["n"][0].reason == "memory limit: RSS 6.0 GiB > 4 GiB (template memory_gib)"
    assert s.step(25.0, on) == {}  # asked once
    del on["n"]["b"]
    assert s.rules["n"].next_deadline() == 300.0
    out = s.step(300.0, on)
    assert [(e.job_id, e.rule, e.reason) for e in out["n"]] == [("a", "max_runtime", "maximum runtime reached")]


def test_an_operator_stop_asks_one_running_job_to_stop_at_its_time():
    s = SimStops(StopsConfig(operator_stops=1), _catalog(), seed=4)
    s.schedule_drains(["n"], 1000.0)
    at = s.operator_at[0]
    assert 100.0 <= at <= 900.0
    on = {"n": {"a": _J("a", "sp", 0.0)}}
    s.started("n", "a", 0.0, 5000.0)
    assert s.step(at - 1, on) == {}
    out = s.step(at, on)
    assert [(e.job_id, e.rule, e.reason) for e in out["n"]] == [("a", "operator", "stopped by the operator")]
    s.ended("a")
    assert s.operator == {"n": set()} and s.operator_at == []


def test_templates_without_a_runtime_option_keep_the_catalogs_own():
    s = SimStops(StopsConfig(), _catalog(), seed=0)
    assert s.rule_job(_J("a", "sp", 5.0)).max_runtime_s == 3600.0
    assert s.rule_job(_J("z", "gone", 5.0)).max_runtime_s == math.inf


def test_the_scenario_reports_stops_by_rule_drains_and_no_transition_errors():
    r = run_scheduling(60, 12, duration_s=1200, seed=3, stops=STOPS)
    rules = r["stops_by_rule"]
    assert set(rules) <= set(StopRule.__args__)  # type: ignore[attr-defined]
    assert rules["drain"] > 0 and rules["max_runtime"] > 0 and rules["memory_limit"] > 0
    assert rules["operator"] == 5
    assert r["drains"]["nodes_drained"] == 4 and r["drains"]["jobs_stopped_by_drain"] == rules["drain"]
    assert r["transition_errors"] == 0 and r["violation_count"] == 0
    assert sum(r["refusals_by_reason"].values()) == r["refusals"]
    again = run_scheduling(60, 12, duration_s=1200, seed=3, stops=STOPS)
    assert (again["stops_by_rule"], again["drains"]) == (rules, r["drains"])  # same seed, same figures
    text = format_scheduling_report(r)
    assert "stops by rule: " in text and "nodes drained" in text and "transition errors (every node): 0" in text


def test_without_stop_options_the_scenario_schedules_none_of_them():
    r = run_scheduling(40, 8, duration_s=600, seed=2)
    assert not {"drain", "max_runtime", "memory_limit"} & set(r["stops_by_rule"])
    assert r["drains"]["nodes_drained"] == 0 and r["transition_errors"] == 0


def test_simulate_cli_stop_options(capsys):
    assert main(["simulate", "--scenario", "scheduling", "--nodes", "40", "--configs", "8", "--duration", "900",
                 "--drains", "3", "--drain-deadline", "60", "--max-runtime", "400", "--memory-over", "0.1",
                 "--operator-stops", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["drains"]["nodes_drained"] == 3 and out["drains"]["drain_deadline_s"] == 60
    assert out["stops_by_rule"]["max_runtime"] > 0 and out["stops_by_rule"]["operator"] == 2
    assert out["transition_errors"] == 0
    assert main(["simulate", "--scenario", "scheduling", "--memory-over", "2"]) == 2
