"""The node's own stop rules (:class:`p2pnode.node._stoprules.StopRules`) in virtual time: each rule with plain
values, ``now`` passed in, the effects and ``next_deadline()`` checked exactly (issue 39, item 3)."""

from __future__ import annotations

import math
import random

from p2pnode.node import StopJob
from p2pnode.node._jobstate import STOP_RULES
from p2pnode.node._stoprules import GIB, MemorySample, RuleInputs, RuleJob, StopRules

T = frozenset({"play", "train"})


def _job(job_id="j1", **kw):
    kw.setdefault("template", "play")
    return RuleJob(job_id, **kw)


def _inp(*jobs, **kw):
    kw.setdefault("templates", T)
    return RuleInputs(tuple(jobs), **kw)


def test_every_rule_name_is_of_the_shared_vocabulary():
    rules = StopRules()
    out = rules.step(_inp(_job("a", started_at=0.0, max_runtime_s=1.0), _job("b", adopted=True, template="gone"),
                          _job("c", preemptible=True), _job("d"), draining=True, drain_deadline=0.0,
                          operator_stops=frozenset({"d"})), 5.0)
    out += rules.sampled(_job("e", memory_limit_gib=1.0), MemorySample("e", rss_bytes=2 * GIB))
    assert {e.rule for e in out} == {"max_runtime", "template_removed", "drain", "operator", "memory_limit"}
    assert {e.rule for e in out} <= set(STOP_RULES)


def test_max_runtime_stops_at_exactly_its_deadline_and_not_before():
    rules = StopRules()
    job = _job(started_at=100.0, max_runtime_s=60.0)
    assert rules.step(_inp(job), 100.0) == []
    assert rules.next_deadline() == 160.0
    assert rules.step(_inp(job), 159.999) == []
    assert rules.next_deadline() == 160.0
    assert rules.step(_inp(job), 160.0) == [StopJob("j1", "maximum runtime reached", "max_runtime")]
    assert rules.next_deadline() == math.inf  # asked: no deadline left for it
    assert rules.counts["max_runtime"] == 1


def test_a_readopted_job_counts_its_runtime_from_its_true_start():
    rules = StopRules()  # started 50 s before this run's clock began (mapped back by the driver)
    job = _job(started_at=-50.0, max_runtime_s=60.0, adopted=True)
    assert rules.step(_inp(job), 0.0) == [] and rules.next_deadline() == 10.0
    assert [e.rule for e in rules.step(_inp(job), 10.0)] == ["max_runtime"]


def test_memory_over_its_limit_by_sample_stops_it_with_todays_words():
    rules = StopRules()
    job = _job(memory_limit_gib=0.5, limit_source="memory_gib of play")
    assert rules.sampled(job, MemorySample("j1", rss_bytes=GIB // 2)) == []  # at the limit: within it
    out = rules.sampled(job, MemorySample("j1", rss_bytes=int(0.75 * GIB)))
    assert out == [StopJob("j1", "memory limit: RSS 0.750 GiB > 0.5 GiB (memory_gib of play)", "memory_limit")]
    assert rules.sampled(job, MemorySample("j1", rss_bytes=GIB)) == []  # asked once
    assert rules.sampled(_job("k"), MemorySample("k", rss_bytes=10**15)) == []  # no limit (0)


OOM_REASON = "memory limit: killed by the kernel at its cgroup limit of 2 GiB (memory_gib of t)"


def test_a_cgroup_oom_kill_names_the_end_of_a_job_as_a_memory_limit_stop():
    rules = StopRules()
    job = _job(memory_limit_gib=2.0, limit_source="memory_gib of t")
    assert rules.sampled(job, MemorySample("j1", rss_bytes=None, oom_kills=0)) == []  # held by a cgroup: no RSS rule
    # a live job whose cgroup counted an OOM kill (a child's: a dataloader's) runs on: the kernel enforced the limit
    assert rules.sampled(job, MemorySample("j1", oom_kills=1)) == []
    assert rules.sampled(job, MemorySample("j1", oom_kills=3, rss_bytes=GIB)) == []
    # the sample at its exit: the OOM kill names its end
    (e,) = rules.sampled(job, MemorySample("j1", oom_kills=1, final=True))
    assert (e.rule, e.reason) == ("memory_limit", OOM_REASON)
    assert rules.sampled(_job("j2", memory_limit_gib=2.0), MemorySample("j2", final=True)) == []  # no kill: no stop


def test_an_oom_kill_at_exit_names_the_end_over_a_clean_agent_stop_only():
    rules = StopRules()
    kw = dict(memory_limit_gib=2.0, limit_source="memory_gib of t", stopping=True)
    final = MemorySample("j1", oom_kills=1, final=True)
    (e,) = rules.sampled(_job(stop_rule="agent_stop", **kw), final)
    assert (e.rule, e.reason) == ("memory_limit", OOM_REASON)
    assert rules.sampled(_job(stop_rule="agent_stop", **kw), final) == []  # asked once
    for rule in ("plan", "operator", "max_runtime", "drain"):  # any other stop keeps its reason
        assert StopRules().sampled(_job(stop_rule=rule, **kw), final) == []
    # a job stopping for the agent, still alive, is not stopped again by a live sample
    assert StopRules().sampled(_job(stop_rule="agent_stop", **kw), MemorySample("j1", oom_kills=1)) == []
    assert StopRules().sampled(_job(stop_rule="agent_stop", memory_limit_gib=0.5, stopping=True),
                               MemorySample("j1", rss_bytes=GIB)) == []


def test_drain_deadline_stops_only_preemptible_work_at_its_deadline():
    rules = StopRules()
    pre, keep = _job("pre", preemptible=True), _job("keep", preemptible=False)
    drain = dict(draining=True, drain_deadline=30.0)
    assert rules.step(_inp(pre, keep, **drain), 10.0) == []
    assert rules.next_deadline() == 30.0
    assert rules.step(_inp(pre, keep, **drain), 29.9) == []
    out = rules.step(_inp(pre, keep, **drain), 30.0)
    assert out == [StopJob("pre", "node drained by the operator: deadline passed", "drain")]
    assert rules.next_deadline() == math.inf  # the rest runs to its end: no deadline for it
    assert rules.step(_inp(pre, keep, **drain), 1e6) == []
    # not draining (uncordoned): nothing, and no deadline from a stale drain_deadline
    other = StopRules()
    assert other.step(_inp(pre, drain_deadline=5.0), 10.0) == [] and other.next_deadline() == math.inf


def test_operator_stop_stops_the_job_asked_for_only():
    rules = StopRules()
    out = rules.step(_inp(_job("a"), _job("b"), operator_stops=frozenset({"b", "elsewhere"})), 1.0)
    assert out == [StopJob("b", "stopped by the operator", "operator")]


def test_template_removed_stops_a_readopted_job_whose_template_is_gone():
    rules = StopRules()
    gone, kept = _job("g", template="old", adopted=True), _job("k", adopted=True)
    out = rules.step(_inp(gone, kept), 0.0)
    assert out == [StopJob("g", "template 'old' is no longer in the catalog", "template_removed")]
    # a job this run started keeps running when a pushed catalog drops its template (it is not started again)
    mine = _job("m", template="train")
    assert rules.step(_inp(mine), 1.0) == []
    assert rules.step(_inp(mine, templates=frozenset({"play"})), 2.0) == []


def test_no_duplicate_stop_while_stopping():
    rules = StopRules()
    job = _job(started_at=0.0, max_runtime_s=5.0, preemptible=True, memory_limit_gib=1.0)
    assert len(rules.step(_inp(job, operator_stops=frozenset({"j1"})), 1.0)) == 1
    for now in (2.0, 5.0, 100.0):  # max runtime and drain now apply too: never asked again
        assert rules.step(_inp(job, operator_stops=frozenset({"j1"}), draining=True, drain_deadline=0.0), now) == []
    assert rules.sampled(job, MemorySample("j1", rss_bytes=2 * GIB)) == []
    # a job a stop of the core's (plan, shed) is under way for: none of these rules asks again
    busy = _job("b", started_at=0.0, max_runtime_s=1.0, stopping=True)
    assert rules.step(_inp(busy), 10.0) == [] and rules.sampled(busy, MemorySample("b", oom_kills=3)) == []
    assert rules.next_deadline() == math.inf
    assert sum(rules.counts.values()) == 1


def test_a_job_that_left_is_forgotten():
    rules = StopRules()
    rules.step(_inp(_job()), 0.0)
    rules.step(_inp(_job(), operator_stops=frozenset({"j1"})), 1.0)
    assert rules.asked == {"j1": "operator"}
    rules.step(_inp(), 2.0)
    assert rules.asked == {}


def test_next_deadline_is_never_in_the_past():
    """Random jobs, drains and steps: after each step the deadline is later than its ``now`` (what was due is
    asked), and a step at the deadline asks a stop or moves it."""
    rnd = random.Random(39)
    for _ in range(200):
        rules = StopRules()
        jobs = [_job(f"j{i}", started_at=rnd.uniform(0, 50), max_runtime_s=rnd.choice([math.inf, rnd.uniform(1, 100)]),
                     preemptible=rnd.random() < 0.5) for i in range(rnd.randint(0, 6))]
        drain = dict(draining=rnd.random() < 0.5, drain_deadline=rnd.uniform(0, 150))
        now = rnd.uniform(0, 20)
        while True:
            rules.step(_inp(*jobs, **drain), now)
            due = rules.next_deadline()
            assert due > now
            if due == math.inf:
                break
            asked = len(rules.asked)
            rules.step(_inp(*jobs, **drain), due)
            assert len(rules.asked) > asked  # at its deadline something is asked to stop
            now = due
