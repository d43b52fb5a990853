"""The goodput accounting core (issue 41, item 6): hand-computed cases in virtual time, the job table's listener,
the bounds, and the members' checkpoint lists it reads."""

from __future__ import annotations

import pytest

from p2pnode.node._goodput import (
    LATE_CONFIRM_S,
    GoodputBook,
    goodput_of,
    own_checkpoints,
    table_listener,
)
from p2pnode.node._table import (
    Assigned,
    Exited,
    FetchAsked,
    FetchProgress,
    JobTable,
    StartAsked,
    Started,
    StopAsked,
    Withdrawn,
)
from p2pnode.snapshot import CheckpointRef


def _interrupted_run(book: GoodputBook) -> None:
    """Fetch 0-10 s, run 10-100 s, checkpoint 1 taken at 40 and held by a replica at 45, checkpoint 2 taken at 70
    (not held by the end), stopped by a drain at 100."""
    book.fetch_started("1-5", "hex8", 0.0)
    book.run_started("1-5", "hex8", 10.0)
    book.checkpoint_taken("1-5", 1, 40.0)
    book.checkpoint_confirmed("1-5", 1, 45.0)
    book.checkpoint_taken("1-5", 2, 70.0)
    book.run_ended("1-5", "stopped", 100.0, cause="drain")


def test_interrupted_run_loses_the_work_since_its_newest_held_checkpoint() -> None:
    book = GoodputBook()
    _interrupted_run(book)
    c = book.totals(200.0)["hex8"]
    assert (c.run_s, c.lost_s, c.fetch_s, c.runs, c.checkpoints) == (90.0, 60.0, 10.0, 1, 1)
    assert dict(c.interrupted) == {"drain": 1}
    assert c.goodput == pytest.approx((90 - 60) / (90 + 10))


def test_a_confirmation_after_the_end_moves_the_safe_point() -> None:
    book = GoodputBook()
    _interrupted_run(book)
    book.checkpoint_confirmed("1-5", 2, 110.0)  # the checkpoint written at 70 reaches a replica after the stop
    c = book.totals(200.0)["hex8"]
    assert c.lost_s == 30.0 and c.checkpoints == 2
    assert c.goodput == pytest.approx(0.6)


def test_a_confirmation_too_late_changes_nothing() -> None:
    book = GoodputBook()
    _interrupted_run(book)
    book.checkpoint_confirmed("1-5", 2, 100.0 + LATE_CONFIRM_S + 1)
    assert book.totals(1000.0)["hex8"].lost_s == 60.0


def test_completed_and_failed_runs_lose_nothing_to_preemption() -> None:
    book = GoodputBook()
    book.run_started("1-1", "c", 0.0)
    book.run_ended("1-1", "completed", 50.0)
    book.run_started("1-2", "c", 50.0)
    book.run_ended("1-2", "failed", 80.0)
    c = book.totals(80.0)["c"]
    assert (c.run_s, c.lost_s, c.runs, dict(c.interrupted)) == (80.0, 0.0, 2, {})
    assert c.goodput == 1.0


def test_a_run_without_a_held_checkpoint_loses_all_of_it() -> None:
    book = GoodputBook()
    book.run_started("2-1", "c", 100.0)
    book.checkpoint_taken("2-1", 1, 130.0)  # signed here, never held by a replica
    book.run_ended("2-1", "lost", 160.0)
    c = book.totals(160.0)["c"]
    assert (c.run_s, c.lost_s, dict(c.interrupted)) == (60.0, 60.0, {"lost": 1})
    assert c.goodput == 0.0


def test_runs_and_fetches_under_way_count_up_to_now() -> None:
    book = GoodputBook()
    book.fetch_started("3-1", "c", 0.0)
    assert book.totals(4.0)["c"].fetch_s == 4.0
    book.run_started("3-1", "c", 6.0)  # the start ends the fetch
    c = book.totals(16.0)["c"]
    assert (c.fetch_s, c.run_s, c.lost_s) == (6.0, 10.0, 0.0)
    assert c.goodput == pytest.approx(10 / 16)
    assert book.view(16.0)["c"]["goodput"] == round(10 / 16, 4)


def test_goodput_of_is_none_without_time_and_clamped() -> None:
    assert goodput_of(0.0, 0.0, 0.0) is None
    assert goodput_of(10.0, 20.0, 0.0) == 0.0


def test_configs_are_bounded_and_filtered() -> None:
    book = GoodputBook(accept=lambda c: c.startswith("ok"), max_configs=2)
    book.run_started("1", "nope", 0.0)
    book.run_started("2", "ok1", 0.0)
    book.run_started("3", "ok2", 0.0)
    book.run_started("4", "ok3", 0.0)
    assert sorted(book.configs) == ["ok1", "ok2"] and book.dropped == 2
    assert sorted(book.live_runs()) == ["2", "3"]


def test_own_checkpoints_reads_signed_and_held_sequences() -> None:
    d = b"\x01" * 16
    refs = {"me": [CheckpointRef("c", "4-1", 3, "me", d), CheckpointRef("c", "4-1", 2, "me", d)],
            "durable": [CheckpointRef("c", "4-1", 2, "me", d), CheckpointRef("c", "3-9", 7, "other", d)],
            "other": [CheckpointRef("c", "3-9", 7, "other", d)]}
    assert own_checkpoints("me", refs) == {"4-1": (3, 2)}


def test_checkpoints_seen_takes_and_confirms() -> None:
    book = GoodputBook()
    book.run_started("4-1", "c", 0.0)
    book.checkpoints_seen({"4-1": (1, 0)}, 20.0)   # signed at 20
    book.checkpoints_seen({"4-1": (2, 1)}, 40.0)   # 2 signed at 40, 1 held
    book.run_ended("4-1", "stopped", 50.0, cause="plan")
    assert book.totals(50.0)["c"].lost_s == 30.0  # safe at 20
    book.checkpoints_seen({"4-1": (2, 2)}, 55.0)   # 2 held after the stop
    assert book.totals(55.0)["c"].lost_s == 10.0  # safe at 40


def test_the_table_listener_accounts_a_fetch_a_run_and_its_stop() -> None:
    table = JobTable()
    book = GoodputBook()
    table.listener = table_listener(book, lambda t: "hex8" if t == "train" else None)
    table.apply(Assigned("5-1", "train", "training"), 0.0)
    table.apply(FetchAsked("5-1", 100), 1.0)
    table.apply(FetchProgress("5-1", 50), 3.0)
    table.apply(StartAsked("5-1"), 5.0)
    table.apply(Started("5-1", 42), 6.0)
    table.apply(StopAsked("5-1", "shed", "memory"), 30.0)
    table.apply(Exited("5-1", signal=15), 31.0)
    # selfplay is not accounted; a withdrawn fetch counts its time
    table.apply(Assigned("5-2", "selfplay", "selfplay"), 0.0)
    table.apply(StartAsked("5-2"), 0.0)
    table.apply(Started("5-2"), 0.0)
    table.apply(Assigned("5-3", "train", "training"), 40.0)
    table.apply(FetchAsked("5-3"), 40.0)
    table.apply(Withdrawn("5-3"), 43.0)
    c = book.totals(50.0)["hex8"]
    assert (c.fetch_s, c.run_s, c.lost_s, dict(c.interrupted)) == (4.0 + 3.0, 25.0, 25.0, {"shed": 1})
    assert list(book.configs) == ["hex8"]


def test_lost_time_settles_after_the_late_window_and_never_shrinks_then() -> None:
    book = GoodputBook()
    _interrupted_run(book)
    c = book.totals(101.0)["hex8"]
    assert (c.lost_s, c.lost_unsettled_s) == (60.0, 60.0)
    book.checkpoint_confirmed("1-5", 2, 150.0)  # within the window: 30 s taken back
    assert book.totals(150.0)["hex8"].lost_unsettled_s == 30.0
    c = book.totals(100.0 + LATE_CONFIRM_S + 1)["hex8"]
    assert (c.lost_s, c.lost_unsettled_s) == (30.0, 0.0)
    assert book.configs["hex8"].lost_s == 30.0  # settled: what the counter exports
