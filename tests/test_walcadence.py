"""How often the backup path copies a database its write-ahead log ships (p2pnode.synccore._walcadence), in
virtual time: rarely while R targets hold the last segment, every interval otherwise, at once after a fallback."""

from __future__ import annotations

from p2pnode.synccore import TargetPosition, WalStanding, backup_due, current_targets, current_window_s

INTERVAL_S = 5.0
WINDOW_S = 3 * INTERVAL_S
BACKUP_S = 600.0


class Sim:
    """A sender with two targets (R = 2) passing every interval in virtual time; each pass ships one segment that
    every target applies, and the scan before it asks :func:`backup_due` (the database changed every interval)."""

    def __init__(self, targets: tuple[str, ...] = ("a", "b"), r: int = 2) -> None:
        self.now = 0.0
        self.s = WalStanding(r=r, targets=targets)
        self.last_backup_at: float | None = None
        self.copies = 0
        self.refusing: set[str] = set()
        self.unreachable: set[str] = set()

    def scan(self) -> bool:
        due = backup_due(self.s, now=self.now, last_backup_at=self.last_backup_at, backup_interval_s=BACKUP_S,
                         window_s=WINDOW_S)
        if due:
            self.copies += 1
            self.last_backup_at = self.now
        return due

    def ship(self) -> None:
        self.s.last_seq += 1
        ok = True
        for t in self.s.targets:
            if t in self.refusing:
                self.s.fallback_at, self.s.fallback, ok = self.now, "refused:out_of_order", False
            elif t in self.unreachable:
                self.s.fallback_at, self.s.fallback, ok = self.now, "failed", False
            else:
                self.s.positions[t] = TargetPosition(self.s.last_seq, self.now)
        if ok:
            self.s.passed_at = self.now

    def run(self, passes: int) -> int:
        """``passes`` intervals; the copies taken meanwhile."""
        before = self.copies
        for _ in range(passes):
            self.scan()
            self.ship()
            self.now += INTERVAL_S
        return self.copies - before


def test_wal_current_makes_the_backup_rare() -> None:
    sim = Sim()
    assert sim.run(1) == 1  # the first copy: none yet
    # 1 hour at a 5 s interval: a copy every 600 s, not every interval (720 passes)
    assert sim.run(720) == 6
    assert current_targets(sim.s, sim.now, WINDOW_S) == ["a", "b"]


def test_backup_interval_zero_copies_every_interval() -> None:
    s = WalStanding(last_seq=3, r=1, targets=("a",), positions={"a": TargetPosition(3, 10.0)}, passed_at=10.0)
    assert backup_due(s, now=11.0, last_backup_at=10.5, backup_interval_s=0.0, window_s=WINDOW_S)
    assert not backup_due(s, now=11.0, last_backup_at=10.5, backup_interval_s=BACKUP_S, window_s=WINDOW_S)


def test_not_shipped_by_its_log_copies_every_interval() -> None:
    assert backup_due(None, now=100.0, last_backup_at=99.0, backup_interval_s=BACKUP_S, window_s=WINDOW_S)
    s = WalStanding(r=2, targets=("a", "b"))  # nothing shipped yet
    assert backup_due(s, now=100.0, last_backup_at=99.0, backup_interval_s=BACKUP_S, window_s=WINDOW_S)


def test_a_target_refusing_makes_the_copy_due_at_once() -> None:
    sim = Sim()
    sim.run(10)
    assert not sim.scan()
    sim.refusing.add("b")
    sim.ship()  # b refuses the segment
    sim.now += INTERVAL_S
    assert sim.scan(), "the next scan copies at once"
    # still refusing: every interval
    assert sim.run(10) == 10
    # b applies again (a snapshot): one more copy (the last refusal came after the last copy), then rare again
    sim.refusing.clear()
    sim.ship()
    sim.now += INTERVAL_S
    assert sim.scan()
    sim.ship()
    sim.now += INTERVAL_S
    assert sim.run(100) == 0


def test_an_unreachable_target_or_not_wal_or_error_copies_every_interval() -> None:
    for why in ("failed", "not_wal", "error"):
        sim = Sim()
        sim.run(10)
        if why == "failed":
            sim.unreachable.add("a")
            sim.ship()
            sim.now += INTERVAL_S
            assert sim.run(10) == 10, why
        else:
            for _ in range(10):  # the log is not read: no segment, a fallback each pass
                sim.s.fallback_at, sim.s.fallback = sim.now, why
                sim.now += INTERVAL_S
                assert sim.scan(), why


def test_fewer_than_r_current_targets_copies_every_interval() -> None:
    sim = Sim(targets=("a",), r=2)  # the ranking found one target for R = 2
    assert sim.run(20) == 20
    sim = Sim()
    sim.run(10)
    # b's position is behind (a new target after a member left): no fallback, but only one current of two
    sim.s.targets = ("a", "c")
    sim.s.last_seq += 1
    sim.s.positions["a"] = TargetPosition(sim.s.last_seq, sim.now)
    sim.s.passed_at = sim.now
    assert sim.scan()


def test_a_target_silent_beyond_the_window_is_not_current() -> None:
    s = WalStanding(last_seq=7, r=1, targets=("a",), positions={"a": TargetPosition(7, 0.0)}, passed_at=0.0)
    assert current_targets(s, WINDOW_S, WINDOW_S) == ["a"]
    assert current_targets(s, WINDOW_S + 0.1, WINDOW_S) == []  # no pass and no answer within the window
    assert backup_due(s, now=WINDOW_S + 0.1, last_backup_at=0.0, backup_interval_s=BACKUP_S, window_s=WINDOW_S)
    # an idle database: the pass found nothing new to send and left the target at the last segment
    s.passed_at = 100.0
    assert current_targets(s, 101.0, WINDOW_S) == ["a"]
    assert not backup_due(s, now=101.0, last_backup_at=50.0, backup_interval_s=BACKUP_S, window_s=WINDOW_S)
    assert backup_due(s, now=650.0, last_backup_at=50.0, backup_interval_s=BACKUP_S, window_s=WINDOW_S + 600)


def test_the_window_is_three_intervals_and_at_least_15_s() -> None:
    assert current_window_s(INTERVAL_S) == WINDOW_S
    assert current_window_s(1.0) == 15.0 and current_window_s(10.0) == 30.0


def test_a_pass_under_way_does_not_age_its_targets_out() -> None:
    """The 1 GiB agent run with free pages (``bench/sync_wal.py --agents --fragment 3``): the ``VACUUM``'s snapshot
    took longer than the window to reach the target, the target aged out meanwhile, and the backup path copied
    the vacuumed database again (724 MB beside the 720 MB snapshot). The window is measured up to the start of the
    pass under way."""
    s = WalStanding(last_seq=7, r=1, targets=("a",), positions={"a": TargetPosition(7, 0.0)}, passed_at=0.0)
    s.pass_started_at = 5.0  # a pass began within the window and is still sending its snapshot minutes later
    assert current_targets(s, 300.0, WINDOW_S) == ["a"]
    assert not backup_due(s, now=300.0, last_backup_at=1.0, backup_interval_s=BACKUP_S, window_s=WINDOW_S)
    s.pass_started_at = WINDOW_S + 5.0  # a pass that began once the target was already silent too long
    assert current_targets(s, 300.0, WINDOW_S) == []
    s.pass_started_at = None  # the pass ended without an answer: aged out at once
    assert current_targets(s, 300.0, WINDOW_S) == []
    s.fallback_at, s.pass_started_at = 200.0, 5.0  # a refusal during the pass is a fallback whatever the window
    assert backup_due(s, now=300.0, last_backup_at=1.0, backup_interval_s=BACKUP_S, window_s=WINDOW_S)
