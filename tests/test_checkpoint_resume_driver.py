"""The resume driver (:class:`p2pnode.jobs._ckresume.CheckpointResume`, issue 41 item 2): what a placed training
resumes from. Real trust and board logic, a fetch that the test controls (the transfer itself is
tests/test_checkpoint_sync.py's), trio's MockClock: no checkpoint starts at once; a fetched one is the job's
``resume_from`` and raises the persisted floor (read back through the decoder: a replayed older checkpoint is refused
after a restart); a known checkpoint no holder gives is tried for the template's grace, then the job starts from
nothing (``checkpoint_unavailable``); a cancelled fetch hands back nothing."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing

from p2pnode.identity import Identity
from p2pnode.jobs._ckresume import FLOORS_FILE, CheckpointResume
from p2pnode.node import CancelFetch, FetchCheckpoint
from p2pnode.node._table import FetchProgress
from p2pnode.snapshot import CheckpointRef, PlanJob
from p2pnode.synccore import (
    AssignmentBook,
    CheckpointBody,
    CheckpointFile,
    CheckpointRefused,
    CheckpointTrust,
    sign_checkpoint,
)

ORIGIN = "o" * 64


def body(seq: int, job_id: str = "3-7") -> CheckpointBody:
    return CheckpointBody(config="c", job_id=job_id, seq=seq, origin=ORIGIN, dir="checkpoints/c", name=f"step-{seq}",
                          files=(CheckpointFile(path="", size=10, block_size=1 << 16, root=b"r" * 32),))


class Board:
    """A board holding accepted bodies (the trust's checks are test_checkpoints_core's), listed by ``holders``."""

    def __init__(self, *bodies: CheckpointBody, holders=("d" * 64,)) -> None:
        self.trust = CheckpointTrust(AssignmentBook(), lambda n: None)
        self.refs: dict[str, list[CheckpointRef]] = {h: [] for h in holders}
        for i, b in enumerate(bodies):
            digest = bytes([i + 1]) * 16
            self.trust.accepted[digest] = b
            for h in holders:
                self.refs[h].append(CheckpointRef(config=b.config, job_id=b.job_id, seq=b.seq, origin=b.origin,
                                                  digest=digest))
        self.passes = 0

    def refs_by_member(self):
        return self.refs

    async def pass_once(self) -> int:
        self.passes += 1
        return 0


def job(job_id: str = "4-1") -> FetchCheckpoint:
    return FetchCheckpoint(PlanJob(job_id=job_id, node="b", template="train", gpus=[0]), 4, "c")


def driver(tmp_path: Path, board, fetch=None):
    seen: list = []
    def news() -> None:
        seen.append("news")
        _WAKE.wake()

    def observe(ev, now) -> None:
        seen.append(ev)
        _WAKE.wake()

    r = CheckpointResume(node_id="b" * 64, data_dir=tmp_path, news=news, observe=observe, now=trio.current_time)
    r.set_board(board)
    r.fetch = fetch
    return r, seen


class _Wake:
    """Wakes :func:`until` on the driver's news and observations (no polling: a poll's virtual deadlines would let
    MockClock jump while the driver waits on a worker thread, and its grace would run out in virtual time)."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def wake(self) -> None:
        self.event.set()
        self.event = trio.Event()


_WAKE = _Wake()


async def until(cond, what: str) -> None:
    with trio.fail_after(3600):  # virtual seconds: a condition never met fails, it does not hang
        while not cond():
            await _WAKE.event.wait()
    assert cond(), what


def run_with(tmp_path: Path, scenario) -> None:
    async def main():
        async with trio.open_nursery() as n:
            await scenario(n)
            n.cancel_scope.cancel()

    # The clock jumps only once every task has been blocked 0.5 s of real time, so not while the driver waits on a
    # worker thread (disk_usage, mkdir) on a loaded machine.
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.5))


def test_no_checkpoint_starts_at_once_and_a_fetched_one_is_resumed_from_and_raises_the_floor(tmp_path):
    async def scenario(n):
        r, _ = driver(tmp_path, Board())
        await n.start(r.run)
        r.apply(job("4-1"))
        await until(lambda: "4-1" in r.results, "decided")
        assert r.results["4-1"] == "" and r.counts["no_checkpoint"] == 1

        async def fetch(newest, dest, progress):
            progress(5, 10)
            progress(10, 10)
            (dest / newest.body.name).write_bytes(b"x" * 10)
            return dest / newest.body.name

        board = Board(body(1), body(2))
        r2, seen = driver(tmp_path, board, fetch)
        (tmp_path / "resume" / "c").mkdir(parents=True, exist_ok=True)
        (tmp_path / "resume" / "c" / "old-entry").write_bytes(b"old")
        await n.start(r2.run)
        r2.apply(job("4-2"))
        await until(lambda: "4-2" in r2.results, "fetched")
        got = Path(r2.results["4-2"])
        assert got == tmp_path / "resume" / "c" / "step-2" and got.read_bytes() == b"x" * 10
        assert not (tmp_path / "resume" / "c" / "old-entry").exists()  # the folder keeps the newest only
        assert [e.done_bytes for e in seen if isinstance(e, FetchProgress)] == [0, 5, 10]
        assert "news" in seen and board.passes == 1
        assert r2.resumes(lambda k: False) == {} and "4-2" not in r2.results  # started: dropped
        # after a restart: the floor is read back, and a replayed older checkpoint is refused
        who = Identity.generate()
        old = Board()
        old.trust = CheckpointTrust(AssignmentBook(), {who.node_id: who.public_key}.get)
        old.trust.assignments.record("c", "3-7", who.node_id)
        driver(tmp_path, old)
        assert old.trust.floors == {"c": (3, 7, 2)}
        replayed = msgspec.structs.replace(body(1), origin=who.node_id)
        with pytest.raises(CheckpointRefused, match="older"):
            old.trust.check(sign_checkpoint(who.sign, replayed), replayed)
        assert old.trust.refused["stale"] == 1

    run_with(tmp_path, scenario)


def test_a_known_checkpoint_no_holder_gives_is_tried_for_the_grace_then_the_job_starts_from_nothing(tmp_path):
    async def scenario(n):
        tries: list[float] = []

        async def fetch(newest, dest, progress):
            tries.append(trio.current_time())
            raise OSError("no holder answered")

        r, _ = driver(tmp_path, Board(body(1)), fetch)
        await n.start(r.run)
        start = trio.current_time()
        r.apply(job(), {"train": None})
        await until(lambda: "4-1" in r.results, "gave up")
        assert r.results["4-1"] == "" and r.counts["checkpoint_unavailable"] == 1
        assert len(tries) >= 4 and tries[-1] - start <= 60.0  # the default grace (the template is not known)
        assert [round(b - a) for a, b in zip(tries, tries[1:])][:4] == [1, 2, 4, 8]  # backoff

    run_with(tmp_path, scenario)


def test_a_cancelled_fetch_hands_back_nothing_and_a_bad_floors_file_is_counted(tmp_path):
    async def scenario(n):
        release = trio.Event()

        async def fetch(newest, dest, progress):
            await release.wait()
            return dest / "x"

        (tmp_path / FLOORS_FILE).write_text('{"floors": {"c": [1, 2]}}')  # a wrong shape
        r, _ = driver(tmp_path, Board(body(1)), fetch)
        assert r.counts["floors_unreadable"] == 1
        await n.start(r.run)
        r.apply(job())
        await until(lambda: "4-1" in r.view()["fetching"], "fetching")
        r.apply(CancelFetch("4-1"))
        release.set()
        await until(lambda: not r.view()["fetching"], "cancelled")
        assert "4-1" not in r.results and r.counts["cancelled"] == 1

    run_with(tmp_path, scenario)


def test_a_fetching_job_is_in_the_running_list_so_the_leader_keeps_counting_it(tmp_path):
    from test_checkpoint_resume_core import CATALOG, acting, core
    from test_job_core import drive, inputs, lead, pjob

    c = core()
    drive(c, inputs(lead("a"), acting(c, [pjob("1-1", "b", "train", gpu=2)])), 0.0)
    r, _ = driver(tmp_path, Board())
    (rep,) = r.reports(c.table, CATALOG)
    assert (rep.job_id, rep.template, rep.config, rep.kind, rep.gpus, rep.pid, rep.term) == \
        ("1-1", "train", "c", "training", [2], None, 1)
    drive(c, inputs(lead("a"), acting(c, [], 2)), 1.0)  # withdrawn: no longer reported
    assert r.reports(c.table, CATALOG) == []
