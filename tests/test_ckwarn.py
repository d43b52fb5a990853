"""The warning before a stop (issue 41, item 3): :class:`p2pnode.node._ckwarn.CheckpointWarnings` in virtual time."""

from __future__ import annotations

import math

import pytest

from p2pnode.node import StopJob
from p2pnode.node._ckwarn import (
    CheckpointWarnings,
    Listed,
    OwnCheckpoint,
    Replica,
    ReplicaNews,
    SignalJob,
    WarnSpec,
    complete_names,
)

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
    assert w.counts == {"signalled": 1, "confirmed": 0, "local": 0, "deadline": 1}
    assert w.stop(e, SPEC, 161.0) == [e]  # the released stop, passed back by the executor, goes through
    assert w.counts["signalled"] == 1


def test_stop_released_early_when_a_new_checkpoint_appears() -> None:
    w = CheckpointWarnings()
    e = StopJob("j1", "preempted", "plan")
    assert w.stop(e, SPEC, 0.0) == [SignalJob("j1", "SIGUSR1", "plan")]
    assert w.listed("j1", [Listed("old.pt"), Listed("step2", is_dir=True)]) == []  # a dir without its marker
    assert w.listed("j1", [Listed("old.pt"), Listed("step2", is_dir=True, marker=True)]) == [e]
    assert w.step(1000.0) == [] and w.counts["local"] == 1


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


D1, D2 = b"\x01" * 16, b"\x02" * 16
OLD = OwnCheckpoint("c", "3-7", 1, D1, "old.pt")
NEW = OwnCheckpoint("c", "3-7", 2, D2, "new.pt")


def _held(w: CheckpointWarnings, now: float = 0.0, notice_at: float = math.inf) -> StopJob:
    e = StopJob("3-7", "node drained by the operator: deadline passed", "drain")
    assert w.stop(e, SPEC, now, notice_at) == [SignalJob("3-7", "SIGUSR1", "drain")]
    return e


def test_with_a_durable_member_the_stop_waits_for_its_replica_of_the_new_checkpoint() -> None:
    w = CheckpointWarnings()
    w.replicas(ReplicaNews(durable=1, own=(OLD,), held=(Replica("dur", "c", "3-7", 1, D1),)))
    e = _held(w)
    assert w.listed("3-7", [Listed("old.pt"), Listed("new.pt")]) == []  # new locally, not yet replicated
    assert w.replicas(ReplicaNews(1, (OLD, NEW), (Replica("dur", "c", "3-7", 1, D1),))) == []  # signed, not held
    assert w.replicas(ReplicaNews(1, (OLD, NEW), (Replica("dur", "c", "3-7", 2, b"\x09" * 16),))) == []  # other body
    assert w.replicas(ReplicaNews(1, (OLD, NEW), (Replica("dur", "c", "3-8", 2, D2),))) == []  # another job's
    assert w.step(59.9) == []
    assert w.replicas(ReplicaNews(1, (OLD, NEW), (Replica("dur", "c", "3-7", 2, D2),))) == [e]
    assert w.counts == {"signalled": 1, "confirmed": 1, "local": 0, "deadline": 0}
    assert w.held == {} and w.next_deadline() == math.inf


def test_a_replica_of_a_checkpoint_older_than_the_signal_confirms_nothing() -> None:
    w = CheckpointWarnings()
    _held(w)
    # old.pt was complete before the signal (SPEC.before), signed only now: its replica is not the new checkpoint
    assert w.replicas(ReplicaNews(1, (OLD,), (Replica("dur", "c", "3-7", 1, D1),))) == []
    assert w.listed("3-7", [Listed("old.pt")]) == []
    assert w.held


def test_the_replica_may_come_before_the_listing_sees_the_entry() -> None:
    w = CheckpointWarnings()
    e = _held(w)
    assert w.replicas(ReplicaNews(2, (NEW,), (Replica("dur", "c", "3-7", 2, D2),))) == []
    assert w.listed("3-7", [Listed("old.pt"), Listed("new.pt")]) == [e]
    assert w.counts["confirmed"] == 1


def test_no_durable_member_releases_at_the_local_checkpoint_counted() -> None:
    w = CheckpointWarnings()
    e = _held(w)
    assert w.replicas(ReplicaNews(durable=0, own=(NEW,))) == []  # no new entry listed yet
    assert w.listed("3-7", [Listed("old.pt"), Listed("new.pt")]) == [e]
    assert w.counts == {"signalled": 1, "confirmed": 0, "local": 1, "deadline": 0}


def test_durable_members_gone_while_held_release_at_the_local_checkpoint() -> None:
    w = CheckpointWarnings()
    w.replicas(ReplicaNews(durable=1))
    e = _held(w)
    assert w.listed("3-7", [Listed("new.pt")]) == []
    assert w.replicas(ReplicaNews(durable=0)) == [e]
    assert w.counts["local"] == 1


def test_no_replica_in_time_releases_at_the_notice_deadline() -> None:
    w = CheckpointWarnings()
    w.replicas(ReplicaNews(durable=1))
    e = _held(w, now=100.0, notice_at=130.0)  # grace 60, stop grace 10: deadline 120
    assert w.next_deadline() == 120.0
    assert w.listed("3-7", [Listed("new.pt")]) == []
    assert w.step(119.99) == []
    assert w.step(120.0) == [e]
    assert w.counts == {"signalled": 1, "confirmed": 0, "local": 0, "deadline": 1}


def test_a_notice_brings_a_held_stop_deadline_forward() -> None:
    w = CheckpointWarnings()
    w.replicas(ReplicaNews(durable=1))
    e = _held(w, now=0.0)
    assert w.next_deadline() == 60.0
    assert w.stop(StopJob("3-7", "spot notice", "notice"), SPEC, 1.0, notice_at=25.0) == []
    assert w.next_deadline() == 15.0
    assert w.step(15.0) == [e]


def test_news_is_bounded() -> None:
    w = CheckpointWarnings()
    many = tuple(Replica("dur", "c", "x", i + 1, D1) for i in range(10_000))
    w.replicas(ReplicaNews(1, (), many))
    assert len(w.news.held) == 4096


def test_an_agent_stop_is_bounded_by_its_jobs_grace_and_the_cap() -> None:
    """:meth:`CheckpointWarnings.hold_bound`: the latest deadline the holds of a clean agent stop may have, asked
    before its stops; passed to :meth:`stop` as ``until``, no hold outlasts it."""
    w = CheckpointWarnings()
    short = WarnSpec("SIGUSR1", 20.0, stop_grace_s=10.0)
    none = WarnSpec(None, 60.0)
    assert w.hold_bound([], 5.0) == 5.0  # nothing to hold: now
    assert w.hold_bound([("j1", SPEC), ("j2", short), ("j3", none), ("j4", None)], 5.0) == 65.0
    assert w.hold_bound([("j1", SPEC)], 5.0, cap_s=30.0) == 35.0  # the agent's cap
    assert w.hold_bound([("j1", SPEC)], 5.0, notice_at=45.0) == 35.0  # a notice: gone at 45, less the stop grace
    until = w.hold_bound([("j1", SPEC), ("j2", short)], 5.0, cap_s=30.0)
    assert w.stop(StopJob("j1", "agent shutdown", "agent_stop"), SPEC, 5.1, until=until) == [
        SignalJob("j1", "SIGUSR1", "agent_stop")]
    assert w.stop(StopJob("j2", "agent shutdown", "agent_stop"), short, 5.1, until=until) == [
        SignalJob("j2", "SIGUSR1", "agent_stop")]
    assert {k: h.deadline for k, h in w.held.items()} == {"j1": 35.0, "j2": 25.1}
    assert w.hold_bound([("j1", SPEC), ("j2", short)], 6.0) == 35.0  # held already: their own deadlines
    assert w.step(25.1) == [StopJob("j2", "agent shutdown", "agent_stop")]
    assert w.hold_bound([("j2", short)], 26.0) == 26.0  # released: never held again


def test_a_hold_of_a_drain_takes_the_agent_stops_earlier_bound() -> None:
    w = CheckpointWarnings()
    drain = StopJob("j1", "drained", "drain")
    assert w.stop(drain, SPEC, 0.0) == [SignalJob("j1", "SIGUSR1", "drain")]
    assert w.next_deadline() == 60.0
    until = w.hold_bound([("j1", SPEC)], 10.0, cap_s=15.0)
    assert until == 25.0
    assert w.stop(StopJob("j1", "agent shutdown", "agent_stop"), SPEC, 10.0, until=until) == []  # held once
    assert w.next_deadline() == 25.0
    assert w.step(25.0) == [drain]


def test_a_second_signal_cuts_every_held_stop() -> None:
    w = CheckpointWarnings()
    a, b = StopJob("j1", "agent shutdown", "agent_stop"), StopJob("j2", "agent shutdown", "agent_stop")
    w.stop(a, SPEC, 0.0)
    w.stop(b, SPEC, 0.0)
    assert w.cut(3.0) == [a, b]
    assert w.held == {} and w.counts["deadline"] == 2
    assert w.stop(a, SPEC, 3.0) == [a]  # released: goes through
