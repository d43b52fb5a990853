"""kill -9 of a subscriber mid-distribution (200 small published files) and of a WAL sender mid-segment, a few seeds
of ``bench/sync_kill.py`` (which runs 20 of each, and the 1 GiB file): nothing corrupt, nothing applied out of
order, every copy complete after the restart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from sync_kill import run  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("seed", [1, 2])
def test_subscriber_killed_mid_distribution_of_200_small_files(tmp_path, seed):
    res = run("dist", [seed], files=200, mib=8, rate=4_000_000, timeout_s=120, work=tmp_path)
    (rec,) = res["records"]
    assert rec["ok"], rec
    assert rec["corrupt_at_kill"] == 0 and rec["complete_at_kill"] < 200 and rec["complete"] == 200


@pytest.mark.parametrize("seed", [1, 2])
def test_wal_sender_killed_mid_segment(tmp_path, seed):
    res = run("wal", [seed], db_mib=32, timeout_s=120, work=tmp_path)
    (rec,) = res["records"]
    assert rec["ok"], rec
    assert rec["integrity"] == "ok" and not rec["problems"] and rec["samples"] >= 30
