"""Issue 37, attack 1 (catalog rollback and freeze), in the pure parts: a served catalog must carry the version its
member advertised, a member whose reply was not that is skipped for a while and the next holder is tried, and the
highest version adopted is a floor kept on disk (a stale persisted copy is not adopted at start)."""

import json
import math

import pytest

from p2pnode.errors import RejectedMessage
from p2pnode.identity import SigningKey
from p2pnode.jobs._catalogs import FLOOR, PERSISTED, CatalogPush, Fetched
from p2pnode.scheduler import CatalogBook, CatalogRefused, CatalogSources, encode_signed, public_key_text, sign_catalog
from p2pnode.statefiles import open_report

TOML = '[[job]]\nname = "w"\nkind = "selfplay"\nconfig = "c"\nargv = ["true"]\n'
KEY = SigningKey.generate()
LIE = 2**53 - 1


def test_candidates_are_the_highest_advertisers_above_what_is_held_and_a_liar_is_skipped_then_retried():
    s = CatalogSources(skip_s=2.0, max_skip_s=10.0)
    s.advertised([("liar", LIE), ("a", 2), ("b", 2), ("old", 1)], now=0.0)
    assert s.candidates(held=0, floor=0, now=0.0) == [("liar", LIE), ("a", 2), ("b", 2), ("old", 1)]
    assert s.candidates(held=1, floor=2, now=0.0) == [("liar", LIE), ("a", 2), ("b", 2)]
    assert s.choose(held=0, floor=0, now=0.0) == ("liar", LIE)
    assert s.failed("liar", "version_mismatch", 0.0, served=1) == 2.0
    assert s.choose(held=0, floor=0, now=0.0) == ("a", 2)  # the next holder at once
    s.adopted("a", 2, 0.5)
    assert s.choose(held=2, floor=2, now=1.0) is None  # only the liar is above 2, and it is skipped
    assert s.next_deadline(held=2, floor=2) == 2.0
    assert s.choose(held=2, floor=2, now=2.0) == ("liar", LIE)  # tried again once its skip ends
    # Its skips double (2, 4, 8, then the 10 s bound), whatever it advertises meanwhile.
    assert [s.failed("liar", "version_mismatch", t) - t for t in (2.0, 6.0, 14.0)] == [4.0, 8.0, 10.0]
    s.advertised([("liar", 5), ("a", 2), ("b", 3)], now=15.0)
    assert s.choose(held=2, floor=2, now=15.0) == ("b", 3)
    v = s.view(15.0)
    assert v["members"]["liar"] == {"advertised": 5, "result": "version_mismatch", "served": 0, "failures": 4,
                                    "skipped_for_s": 9.0}
    assert set(v["members"]) == {"liar", "a"}  # members tried; the others' versions are in their snapshots
    assert v["members"]["a"]["result"] == "adopted" and v["refused"] == {"version_mismatch": 4}
    assert v["adopted_from"] == 1


def test_a_skipped_member_that_leaves_and_comes_back_is_still_skipped():
    s = CatalogSources(skip_s=5.0)
    s.advertised([("liar", LIE), ("a", 1)], now=0.0)
    s.failed("liar", "unreachable", 0.0)
    s.advertised([("a", 1)], now=1.0)
    assert "liar" in s.members and s.advertised([("a", 1)], now=5.0) is None and "liar" not in s.members
    s.advertised([("liar", LIE)], now=1.0)
    s.failed("liar", "unreachable", 1.0)
    s.advertised([], now=2.0)
    s.advertised([("liar", LIE)], now=3.0)
    assert s.choose(held=0, floor=0, now=3.0) is None and s.next_deadline(0, 0) == 6.0
    assert CatalogSources().next_deadline(0, 0) == math.inf


def test_the_book_refuses_a_served_version_other_than_the_advertised_one_and_anything_below_its_floor():
    book = CatalogBook((public_key_text(KEY),), base_dir=".")
    v1, v2, v3 = (sign_catalog(KEY, v, TOML) for v in (1, 2, 3))
    with pytest.raises(CatalogRefused) as info:
        book.check(v1, advertised=LIE)
    assert info.value.reason == "version_mismatch"
    assert book.check(v2, advertised=2)
    book.adopt(v2)
    assert book.floor == 2
    book.held = None  # as at start, before the persisted copy is read back
    with pytest.raises(CatalogRefused) as info:
        book.check(v1, restore=True)
    assert info.value.reason == "below_floor"
    assert book.check(v3) and book.refused["version_mismatch"] == 1 and book.refused["below_floor"] == 1


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _push(tmp_path, clock=None) -> tuple[CatalogPush, list]:
    adopted: list = []
    book = CatalogBook((public_key_text(KEY),), base_dir=str(tmp_path))
    return CatalogPush(book, tmp_path, adopted.append, clock=clock or Clock()), adopted


def test_a_liar_is_refused_counted_and_skipped_and_the_honest_holder_is_fetched(tmp_path):
    clock = Clock()
    push, adopted = _push(tmp_path, clock)
    v1, v2 = sign_catalog(KEY, 1, TOML), sign_catalog(KEY, 2, TOML)
    wants = push.wanted([("liar", LIE), ("honest", 2)])
    assert [(w.origin, w.key, w.digest, w.deadline_s) for w in wants] == [
        ("liar", ("catalog", "liar"), f"{LIE}@liar", 3.0), ("honest", ("catalog", "honest"), "2@honest", 3.0)]
    want = wants[0]  # both are asked at once; the liar answers first
    with pytest.raises(RejectedMessage):
        want.open(encode_signed(v1))  # genuinely signed, not what it advertised
    push.fetch_failed("liar", "mismatch")
    [want] = push.wanted([("liar", LIE), ("honest", 2)])
    assert want.origin == "honest"
    got = want.open(encode_signed(v2))
    assert isinstance(got, Fetched) and got.origin == "honest"
    push.fetched(got)
    assert push.book.version == 2 and len(adopted) == 1 and push.wanted([("liar", LIE), ("honest", 2)]) == []
    view = push.view()
    assert view["floor"] == 2 and view["refused"]["version_mismatch"] == 1
    liar = view["sources"]["members"]["liar"]
    assert (liar["result"], liar["served"], liar["skipped_for_s"]) == ("version_mismatch", 1, 2.0)
    assert view["sources"]["members"]["honest"]["result"] == "adopted"
    clock.t += 2.0
    assert [w.origin for w in push.wanted([("liar", LIE), ("honest", 2)])] == ["liar"]  # again after its skip
    push.fetch_failed("liar", "unreachable")  # serves nothing now
    assert push.view()["sources"]["members"]["liar"]["skipped_for_s"] == 4.0
    assert json.loads((tmp_path / FLOOR).read_bytes()) == {"version": 2}


def test_the_floor_survives_a_restart_and_a_stale_persisted_copy_is_not_adopted(tmp_path):
    push, _ = _push(tmp_path)
    push.offer(sign_catalog(KEY, 2, TOML), "push")
    push.offer(sign_catalog(KEY, 3, TOML), "push")
    (tmp_path / PERSISTED).write_bytes(encode_signed(sign_catalog(KEY, 1, TOML)))  # a stale copy put back
    again, _ = _push(tmp_path)
    assert again.restore() is None and again.book.version == 0 and again.book.floor == 3
    assert again.book.refused["below_floor"] == 1
    assert [w.origin for w in again.wanted([("old", 2), ("new", 3)])] == ["new"]  # a holder of v2 is not asked


@pytest.mark.parametrize("raw", [b"garbage", b'{"version": -1}', b'{"version": "3"}', b'{"version": 1e400}',
                                 b'{"version": 9007199254740993}', b'{"version": 3, "x": 1}', b"[]"])
def test_a_bad_floor_file_is_dropped_and_counted(tmp_path, raw):
    report = open_report(tmp_path)
    push, _ = _push(tmp_path)
    push.offer(sign_catalog(KEY, 2, TOML), "push")
    (tmp_path / FLOOR).write_bytes(raw)
    again, _ = _push(tmp_path)
    assert again.restore() is not None and again.book.version == 2 and again.book.floor == 2
    assert report.count(FLOOR) == 1
    assert json.loads((tmp_path / FLOOR).read_bytes()) == {"version": 2}  # written again from the copy held


def _spread(push: CatalogPush, clock: Clock, versions: list[tuple[str, int]], honest: dict[str, object],
            rounds: int) -> tuple[int, int]:
    """Fetch rounds as the driver runs them: every round the wanted fetches run at once; a liar's ends ``too_slow``
    at the fetch deadline (3 s), an honest holder's reply (``honest``: member -> signed catalog) is adopted.
    Returns (rounds, fetches) until the node holds the honest version (or ``rounds`` ran out)."""
    fetches = 0
    target = max(v for o, v in versions if o in honest)
    for r in range(1, rounds + 1):
        wants = push.wanted(versions)
        assert len(wants) <= 3 and len({w.key for w in wants}) == len(wants)
        clock.t += 3.0
        for w in wants:
            fetches += 1
            if w.origin in honest:
                push.fetched(w.open(encode_signed(honest[w.origin])))
            else:
                push.fetch_failed(w.origin, "too_slow")
        if push.book.version == target:
            return r, fetches
    return rounds, fetches


def test_fifty_liars_delay_a_fresh_node_by_a_bounded_number_of_fetches_and_never_freeze_it(tmp_path):
    """Issue 37, attack 1's freeze: 50 liars each advertise a version above the honest holder's and never answer
    within the fetch deadline. Tried highest version first, one at a time, each liar's skip (2 s, doubling) ends
    before the 50th is reached and the honest holder never is. Ranked by failures first and fetched three at a
    time, a fresh node reaches it within ceil(50 / 3) + 1 rounds; a later push reaches it in one round, though
    the liars' skips ended and they advertise far more."""
    clock = Clock()
    push, adopted = _push(tmp_path, clock)
    liars = [(f"liar{i:02d}", LIE - i) for i in range(50)]
    v2, v3 = sign_catalog(KEY, 2, TOML), sign_catalog(KEY, 3, TOML)
    rounds, fetches = _spread(push, clock, [*liars, ("honest", 2)], {"honest": v2}, rounds=100)
    assert push.book.version == 2 and len(adopted) == 1
    assert rounds <= math.ceil(50 / 3) + 1 and fetches <= 51 + 2, (rounds, fetches)
    assert push.view()["sources"]["refused"] == {"too_slow": 50}  # each liar counted, by name in the view
    assert all(push.view()["sources"]["members"][o]["result"] == "too_slow" for o, _v in liars)
    clock.t += 200.0  # every liar's skip ended
    rounds, fetches = _spread(push, clock, [*liars, ("honest", 3)], {"honest": v3}, rounds=10)
    assert push.book.version == 3 and rounds == 1  # asked first, beside two liars


def test_a_holder_that_never_failed_ranks_before_a_liar_whose_skip_ended():
    s = CatalogSources(skip_s=2.0)
    s.advertised([("liar", LIE), ("a", 3), ("b", 2)], now=0.0)
    s.failed("liar", "version_mismatch", 0.0)
    assert s.candidates(held=0, floor=0, now=5.0) == [("a", 3), ("b", 2), ("liar", LIE)]
    s.failed("a", "unreachable", 5.0)  # an honest holder that failed once ranks among the failed, by version
    assert s.candidates(held=0, floor=0, now=9.0) == [("b", 2), ("liar", LIE), ("a", 3)]


def test_a_true_reply_that_lost_a_race_ends_the_holders_failures_in_a_row():
    """An honest holder slow once (``too_slow``) then answering what it advertised (``older``: another reply won)
    ranks again before liars that failed once: its failures in a row ended with the true reply."""
    s = CatalogSources(skip_s=1.0, max_skip_s=1.0)
    s.advertised([("honest", 3), ("liar", LIE)], now=0.0)
    s.failed("honest", "too_slow", 0.0)
    s.failed("liar", "version_mismatch", 0.0)
    assert [o for o, _v in s.candidates(held=0, floor=0, now=5.0)] == ["liar", "honest"]  # both failed once
    s.settled("honest", "older", 3, 6.0)
    assert [o for o, _v in s.candidates(held=0, floor=0, now=7.0)] == ["honest", "liar"]
