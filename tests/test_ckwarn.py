"""The warning before a stop (issue 41, item 3): :class:`p2pnode.node._ckwarn.CheckpointWarnings` in virtual time."""

from __future__ import annotations

import math

import pytest

from p2pnode.node import StopJob
from p2pnode.node._ckwarn import CheckpointWarnings, Listed, SignalJob, WarnSpec, complete_names

SPEC = WarnSpec("SIGUSR1", 60.0, stop_grace_s=10.0, before=frozenset({"old.pt"}))


def test_signal_sent_once_and_stop_released_at_the_deadline_without_checkpoint() -> None:
    w = CheckpointWarnings()
    e = StopJob("j1", "node drained by the operator: deadline passed", "drain")
    assert w.stop(e, SPEC, 100.0) == [SignalJob("j1", "SIGUSR1", "drain")]
    assert w.stop(StopJob("j1", "again", "shed"), SPEC, 101.0) == []  # held once: no second signal
    assert w.next_deadline() == 160.0
    assert w.step(159.9) == []
    assert w.listed("j1", [Listed("old.pt"), Listed("new.pt.tmp"), Listed(".hidden")]) == []  # nothing new complete
    assert w.step(160.0) == [e]
    assert w.held == {} and w.next_deadline() == math.inf
    assert w.counts == {"signalled": 1, "checkpointed": 0, "deadline": 1}
    assert w.stop(e, SPEC, 161.0) == [e]  # the released stop, passed back by the executor, goes through
    assert w.counts["signalled"] == 1


def test_stop_released_early_when_a_new_checkpoint_appears() -> None:
    w = CheckpointWarnings()
    e = StopJob("j1", "preempted", "plan")
    assert w.stop(e, SPEC, 0.0) == [SignalJob("j1", "SIGUSR1", "plan")]
    assert w.listed("j1", [Listed("old.pt"), Listed("step2", is_dir=True)]) == []  # a dir without its marker
    assert w.listed("j1", [Listed("old.pt"), Listed("step2", is_dir=True, marker=True)]) == [e]
    assert w.step(1000.0) == [] and w.counts["checkpointed"] == 1


@pytest.mark.parametrize("rule", ["memory_limit", "lease_expired", "operator", "max_runtime"])
def test_stops_that_cannot_wait_do_not(rule: str) -> None:
    w = CheckpointWarnings()
    e = StopJob("j1", "r", rule)  # type: ignore[arg-type]
    assert w.stop(e, SPEC, 0.0) == [e]
    assert w.held == {}


def test_a_stop_that_cannot_wait_releases_a_held_one() -> None:
    w = CheckpointWarnings()
    assert w.stop(StopJob("j1", "shed", "shed"), SPEC, 0.0) == [SignalJob("j1", "SIGUSR1", "shed")]
    oom = StopJob("j1", "memory limit", "memory_limit")
    assert w.stop(oom, SPEC, 1.0) == [oom]
    assert w.held == {} and w.step(100.0) == []


def test_no_signal_no_spec_or_no_time_left_stops_at_once() -> None:
    w = CheckpointWarnings()
    e = StopJob("j1", "r", "agent_stop")
    assert w.stop(e, None, 0.0) == [e]
    assert w.stop(e, WarnSpec(None, 60.0), 0.0) == [e]
    assert w.stop(e, SPEC, 0.0, notice_at=5.0) == [e]  # notice in 5 s, stop grace 10 s: no time to wait
    assert w.stop(e, SPEC, 0.0, notice_at=30.0) == [SignalJob("j1", "SIGUSR1", "agent_stop")]
    assert w.next_deadline() == 20.0  # notice - stop grace, before grace_s


def test_forget_drops_a_held_stop() -> None:
    w = CheckpointWarnings()
    w.stop(StopJob("j1", "r", "drain"), SPEC, 0.0)
    w.forget(["j1"])
    assert w.step(1e9) == [] and w.listed("j1", [Listed("x.pt")]) == []
    assert w.released == set()


def test_complete_names() -> None:
    assert complete_names([Listed("a.pt"), Listed("b.partial"), Listed(".c"), Listed("d", True, False),
                           Listed("e", True, True)]) == frozenset({"a.pt", "e"})
