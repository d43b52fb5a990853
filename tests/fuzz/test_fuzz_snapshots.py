"""Fuzz: hostile, valid-shaped schema-2 snapshots (every section) through a real in-process agent; no consumer
may fail.

A few thousand cases in the normal run (derandomized hypothesis, then the fast seeded generator); the 100,000-case
run with the over-HTTP phase is ``bench/fuzz_snapshots.py``.
"""

from __future__ import annotations

import logging
import time

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fuzz.drive import Fuzzer, run_fuzz
from fuzz.strategies import HypothesisDraw

HYPOTHESIS_CASES = 400  # hypothesis draws cost ~20 ms a case; the seeded generator does the bulk
SEEDED_CASES = 1500  # bench/fuzz_snapshots.py runs 100,000


def _check(stats) -> None:
    print(stats.summary())
    assert not stats.crashes, "\n\n".join(c.report() for c in stats.crashes[:3])
    assert stats.quarantines == 0
    assert not stats.log_failures, stats.log_failures
    # The generator reaches the consumers: 34 % of the derandomized cases alone, 19 % once in a loaded full
    # suite (more cases claiming this node's origin or impersonating a member: timing decides which are stale).
    assert stats.accepted > stats.cases // 8, "too few snapshots reach the consumers"


def test_hypothesis_snapshots_break_no_consumer(tmp_path):
    logging.getLogger("p2pnode").setLevel(logging.CRITICAL + 1)  # the agent's warnings are expected here
    clock = trio.testing.MockClock()
    box = {}

    async def main():
        fz = Fuzzer(tmp_path, epoch_cases=300, clock=clock)
        box["fz"] = fz

        @settings(max_examples=HYPOTHESIS_CASES, derandomize=True, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(st.data())
        def one(data):
            fz.run_case(HypothesisDraw(data.draw))

        t0 = time.monotonic()
        try:
            one()
        finally:
            fz.stats.seconds = time.monotonic() - t0
            fz.close()
            logging.getLogger("p2pnode").removeHandler(fz.errlog)

    try:
        trio.run(main, clock=clock)
    finally:
        logging.getLogger("p2pnode").setLevel(logging.NOTSET)
    _check(box["fz"].stats)
    assert box["fz"].stats.cases >= HYPOTHESIS_CASES


def test_seeded_snapshots_break_no_consumer(tmp_path):
    logging.getLogger("p2pnode").setLevel(logging.CRITICAL + 1)
    try:
        stats = run_fuzz(tmp_path, cases=SEEDED_CASES, seed=12, epoch_cases=500)
    finally:
        logging.getLogger("p2pnode").setLevel(logging.NOTSET)
    _check(stats)
    assert stats.plans_acted > 0 and stats.rejected["bad_type"] > 0 and stats.rejected["impersonation"] > 0
    assert stats.rejected["bad_schema"] > 0  # schema 1 (the flat shape) and other schema values
    assert stats.signals_accepted > 0


def test_the_fuzzer_finds_and_minimizes_a_planted_consumer_bug(tmp_path, monkeypatch):
    """A view that breaks on a peer's ``sync.data_port`` is found, and the snapshot shrunk to that field."""
    from p2pnode.http import _views

    real = _views._sync_summary

    def planted(sync):
        if sync.data_port is not None:
            raise ZeroDivisionError("planted")
        return real(sync)

    monkeypatch.setattr(_views, "_sync_summary", planted)
    logging.getLogger("p2pnode").setLevel(logging.CRITICAL + 1)
    try:
        stats = run_fuzz(tmp_path, cases=200, seed=3, epoch_cases=200)
    finally:
        logging.getLogger("p2pnode").setLevel(logging.NOTSET)
    assert stats.crashes, "the planted bug was not found:\n" + stats.summary()
    c = stats.crashes[0]
    assert "ZeroDivisionError: planted" in c.error and c.consumer in ("GET /status", "GET /members")
    assert c.reproduces_alone
    assert set(c.minimal) <= {"schema", "origin", "version", "addr", "tags", "leaving", "sync"}
    assert set(c.minimal["sync"]) == {"data_port"}


@pytest.mark.parametrize("addr", ["a" * 64 + ":1", "a..b:1", "h:80/x", "u@h:1", "host:99999", "nohost", "\u00e9.com:1",
                                  "h:1\n"])
def test_an_addr_that_cannot_be_dialled_is_rejected_at_the_wire(addr):
    """Found by the HTTP phase: a signed snapshot whose addr has a host label of 64 characters put it in the peer
    book, and the gossip exchange with it raised UnicodeError (IDNA) out of the agent's nursery: the agent died."""
    import msgpack
    from helpers import snapshot

    from p2pnode.errors import RejectedMessage
    from p2pnode.identity import Identity
    from p2pnode.snapshot import decode_snapshot

    ident = Identity.generate()
    decode_snapshot(msgpack.packb(snapshot(ident, 1, addr="node-1.lan:8770")))
    with pytest.raises(RejectedMessage, match="addr"):
        decode_snapshot(msgpack.packb(snapshot(ident, 1, addr=addr)))
