"""The fleet-wide predictor (issue 27, item 1), core: mergeable sketches (the union's quantiles within the relative
accuracy), the robust rule across nodes, cold start from the catalog, untrusted summaries (bounded, never
raising), the history's summary (columns added in place to an older jobs.db) and the leader's fetch of members'
summaries in the job core."""

import math
import sqlite3

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pnode.errors import RejectedMessage
from p2pnode.gossip import MemberState
from p2pnode.jobs._history import JobHistory
from p2pnode.node import Fetch, JobCore, JobInputs, Leadership, MemberJobs
from p2pnode.node._jobs import PREDICTOR_REFRESH_S
from p2pnode.scheduler import (
    SKETCH_RELATIVE_ACCURACY,
    Predictor,
    RunRecord,
    catalog_from_text,
    merge_wires,
    node_class_of,
    open_usage,
    quantile,
    sketch_from_wire,
    sketch_of,
    summarize,
)
from p2pnode.snapshot import SKETCH_BINS_MAX, SketchWire, UsageDoc, UsageEntry, usage_digest

CATALOG = catalog_from_text(
    '[[job]]\nname = "sp"\nkind = "selfplay"\nconfig = "c"\nargv = ["true"]\nmax_runtime_s = 600\n'
    "[job.resources]\nnum_gpus = 1\nvram_gib = 8\nmemory_gib = 4\n", source="test", base_dir=".")
ALPHA = SKETCH_RELATIVE_ACCURACY


def exact_quantile(values, q):
    """The value at rank ``q * (n - 1)`` (rounded down), the rank DDSketch reads."""
    s = sorted(values)
    return s[math.floor(q * (len(s) - 1))]


def within(got, want, rel=ALPHA):
    return abs(got - want) <= rel * want * 1.0001


values = st.lists(st.floats(min_value=0.01, max_value=1e6, allow_nan=False), min_size=1, max_size=200)


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(values, min_size=1, max_size=6))
def test_merging_per_node_sketches_equals_the_sketch_of_the_union(parts):
    union = [v for p in parts for v in p]
    merged = merge_wires(sketch_of(p) for p in parts)
    whole = sketch_of(union)
    assert merged.bins == whole.bins and merged.offset == whole.offset and merged.count == len(union)
    for q in (0.5, 0.9):
        got = quantile(merged, q)
        assert got is not None and within(got, exact_quantile(union, q)), (q, got, exact_quantile(union, q))


def test_values_clamp_to_the_floor_and_the_ceiling():
    w = sketch_of([0.0, -5.0, float("nan"), 1.0])
    assert w.count == 4 and quantile(w, 0.0) == pytest.approx(1e-3, rel=ALPHA)
    w = sketch_of([1e300, float("inf"), 1e10])
    assert w.count == 3 and quantile(w, 1.0) == pytest.approx(1e15, rel=ALPHA)


def test_a_sketch_past_its_bin_limit_collapses_its_lowest_bins():
    w = sketch_of([1.0001 ** i * 1e-3 for i in range(0, 400_000, 7)])  # 1e-3 .. 1.4e14: ~1,700 bins of keys
    assert len(w.bins) == SKETCH_BINS_MAX
    assert within(quantile(w, 0.9), exact_quantile([1.0001 ** i * 1e-3 for i in range(0, 400_000, 7)], 0.9))


# -- untrusted wires and summaries -----------------------------------------------------------------------------------
crafted_wires = st.builds(
    SketchWire,
    count=st.floats(min_value=0, max_value=1e12), sum=st.floats(min_value=0, max_value=1e30),
    offset=st.integers(min_value=-100_000, max_value=100_000),
    bins=st.lists(st.floats(min_value=0, max_value=1e12), max_size=SKETCH_BINS_MAX))


@settings(max_examples=80, deadline=None)
@given(w=crafted_wires)
def test_no_crafted_sketch_raises_and_count_is_the_sum_of_its_bins(w):
    s = sketch_from_wire(w)
    assert s.count == pytest.approx(sum(c for c in w.bins if c > 0))
    for q in (0.0, 0.5, 0.9, 1.0):
        v = s.quantile(q)
        assert v is None if s.count == 0 else (v is not None and 0 < v < 1.1e15)
    assert len(s.wire().bins) <= SKETCH_BINS_MAX


@settings(max_examples=30, deadline=None)
@given(w=crafted_wires, runs=st.integers(min_value=0, max_value=2**40))
def test_a_predictor_over_crafted_summaries_never_raises(w, runs):
    e = UsageEntry(template="sp", node_class="1xH100", runs=runs, runtime_s=w, peak_rss_bytes=w, peak_vram_bytes=w)
    honest = summarize("b", [RunRecord("sp", "1xH100", 30.0, 2e9)] * 5)
    p = Predictor({"a": UsageDoc(node="a", entries=[e, e]), "b": honest}, CATALOG)
    p.predict("sp", "1xH100")
    p.predict("sp")
    p.table()
    assert isinstance(p.outliers, dict)


def test_a_fetched_summary_is_decoded_bounded_and_checked_against_the_signed_digest():
    doc = summarize("a", [RunRecord("sp", "1xH100", 30.0, 2e9)])
    data = msgspec.msgpack.encode(doc)
    assert open_usage(data, usage_digest(doc)) == doc

    def entry(**sketch):
        return msgspec.msgpack.encode({"node": "a", "entries": [{"template": "sp", "node_class": "1xH100", "runs": 1,
                                                                 "runtime_s": sketch}]})

    bad = [(data, "0" * 32, "stale"), (b"\xc1", usage_digest(doc), "malformed"),
           (entry(bins=[float("nan")]), "", "bad_type"), (entry(offset=10**9), "", "bad_type"),
           (entry(bins=[1.0] * 1025), "", "bad_type"),
           (b"\x90" * (9 << 20), "", "oversized")]
    for data, digest, reason in bad:
        with pytest.raises(RejectedMessage) as exc:
            open_usage(data, digest)
        assert exc.value.reason.value == reason


def test_a_summary_is_bounded_most_run_first():
    runs = [RunRecord(f"t{i}", "cpu", 1.0) for i in range(300) for _ in range(1 + i % 3)]
    runs.append(RunRecord("bad\x00name", "cpu", 1.0))
    doc = summarize("a", runs)
    assert len(doc.entries) == 256
    assert [e.runs for e in doc.entries[:3]] == [3, 3, 3] and doc.entries[-1].runs == 1
    assert all(e.template != "bad\x00name" for e in doc.entries)
    msgspec.msgpack.decode(msgspec.msgpack.encode(doc), type=UsageDoc)  # it decodes as a member would


# -- predictions ------------------------------------------------------------------------------------------------------
def doc(node, cls, runtimes, rss=None):
    return summarize(node, [RunRecord("sp", cls, t, rss) for t in runtimes])


def test_cold_start_gives_the_declared_values():
    p = Predictor({}, CATALOG).predict("sp", "1xH100")
    assert p is not None and p.source == "declared" and p.runs == 0
    assert (p.runtime_p50_s, p.runtime_p90_s, p.rss_p90_bytes, p.vram_p90_bytes) == (600, 600, 4 * 2**30, 8 * 2**30)
    assert Predictor({}, CATALOG).predict("unknown") is None
    short = Predictor({"a": doc("a", "1xH100", [10.0, 12.0])}, CATALOG, min_runs=3).predict("sp", "1xH100")
    assert short is not None and short.source == "declared"  # 2 runs < min_runs


def test_the_class_own_figures_then_the_fleet_s():
    docs = {"a": doc("a", "1xH100", [10.0] * 5), "b": doc("b", "1x4090", [30.0] * 2),
            "c": doc("c", "1x4090", [20.0] * 1)}
    p = Predictor(docs, CATALOG)
    h100 = p.predict("sp", "1xH100")
    assert h100.node_class == "1xH100" and within(h100.runtime_p50_s, 10.0) and h100.runs == 5
    r4090 = p.predict("sp", "1x4090")  # 3 runs on the class: its own
    assert r4090.node_class == "1x4090" and r4090.runs == 3 and r4090.nodes == 2 and within(r4090.runtime_p90_s, 30.0)
    other = p.predict("sp", "1xA100")  # no history on the class: the fleet's over every class
    assert other.node_class == "" and other.runs == 8 and other.nodes == 3 and other.source == "history"
    assert p.predict("sp", "1xA100") is other  # memoized
    rows = p.table()
    assert [(r.template, r.node_class) for r in rows] == [("sp", ""), ("sp", "1x4090"), ("sp", "1xH100")]


def test_one_node_s_1000x_values_do_not_move_the_fleet_p90_and_are_recorded():
    normal = {n: doc(n, "1xH100", [10.0 + i for i in range(10)], rss=1e9) for n in ("a", "b", "c")}
    base = Predictor(normal, CATALOG).predict("sp")
    crazy = Predictor({**normal, "x": doc("x", "1xH100", [1e4 + i for i in range(50)], rss=1e12)}, CATALOG)
    p = crazy.predict("sp")
    assert p.runtime_p90_s == base.runtime_p90_s and p.rss_p90_bytes == base.rss_p90_bytes
    assert p.runs == 30 and p.nodes == 3
    why = crazy.outliers["x"]
    assert "runtime_s median" in why and "peak_rss_bytes median" in why and "left out" in why
    assert set(crazy.outliers) == {"x"}
    # two nodes: the lower median is the reference, so a node reporting huge figures never blocks a placement
    two = Predictor({"a": normal["a"], "x": doc("x", "1xH100", [1e4] * 50, rss=1e12)}, CATALOG).predict("sp")
    assert within(two.runtime_p90_s, 18.0) and two.nodes == 1


def test_a_summary_over_the_bin_budget_is_read_in_part_and_recorded():
    def wide():
        return SketchWire(count=1024, offset=-300, bins=[1.0] * SKETCH_BINS_MAX)

    entries = [UsageEntry(template=f"t{i}", node_class="cpu", runs=1024, runtime_s=wide(), peak_rss_bytes=wide(),
                          peak_vram_bytes=wide()) for i in range(256)]
    p = Predictor({"x": UsageDoc(node="x", entries=entries)}, None)
    rows = p.table()
    assert len(rows) < 256 and "over 65536 bins" in p.outliers["x"]


def test_node_class_of_gpu_names():
    assert node_class_of([]) == "cpu"
    assert node_class_of(["NVIDIA H100 80GB HBM3"] * 8) == "8xH100"
    assert node_class_of(["RTX 4090", "RTX 4090", "RTX 3060"]) == "2x4090"


# -- the history's summary ------------------------------------------------------------------------------------------
def test_history_records_class_and_vram_and_an_older_file_gains_the_columns(tmp_path):
    db = tmp_path / "jobs.db"
    con = sqlite3.connect(db)
    con.executescript("""CREATE TABLE runs (job_id TEXT PRIMARY KEY, template TEXT NOT NULL, config TEXT NOT NULL,
        kind TEXT NOT NULL, node_id TEXT NOT NULL, term INTEGER NOT NULL, started_at REAL NOT NULL, ended_at REAL,
        exit_status INTEGER, peak_rss_bytes INTEGER, reason TEXT);
        INSERT INTO runs VALUES ('old', 'sp', 'c', 'selfplay', 'n', 1, 100.0, 110.0, 0, 5000, 'exited');
        INSERT INTO runs VALUES ('bad', 'sp', 'c', 'selfplay', 'n', 1, 'x', 110.0, 0, 5000, 'exited');""")
    con.commit()
    con.close()
    h = JobHistory(db)
    h.started(job_id="new", template="sp", config="c", kind="selfplay", node_id="n", term=2, at=200.0,
              node_class="1xH100")
    h.ended("new", at=230.0, exit_status=0, peak_rss_bytes=7000, reason="exited", peak_vram_bytes=3 * 2**30)
    h.started(job_id="stopped", template="sp", config="c", kind="selfplay", node_id="n", term=2, at=300.0,
              node_class="1xH100")
    h.ended("stopped", at=301.0, exit_status=None, peak_rss_bytes=0, reason="stopped: preempted")
    d = h.usage_doc("n", "1x4090")
    by_class = {e.node_class: e for e in d.entries}
    assert set(by_class) == {"1xH100", "1x4090"}  # the old row counts as the node's class now
    assert within(quantile(by_class["1x4090"].runtime_s, 0.5), 10.0)
    assert within(quantile(by_class["1xH100"].runtime_s, 0.5), 30.0)
    assert within(quantile(by_class["1xH100"].peak_vram_bytes, 0.5), 3 * 2**30)
    assert by_class["1x4090"].peak_vram_bytes is None
    assert h.report.counts.get(("jobs.db", "bad_entry"), 0) >= 1 or "bad_entry" in str(h.report.view())
    h.close()


# -- the leader fetches members' summaries --------------------------------------------------------------------------
def member(origin, digest):
    return MemberJobs(origin, MemberState.ALIVE, 0.0, None, (), "", usage_digest=digest)


def test_the_leader_fetches_a_changed_summary_and_rebuilds_its_predictor_only_on_change():
    core = JobCore("me", CATALOG)
    mine = doc("me", "1xH100", [10.0] * 3)
    theirs = doc("b", "1xH100", [12.0] * 3)
    core.set_usage(mine)
    lead = Leadership("me", 1, 1)
    inp = JobInputs(lead, [member("me", ""), member("b", usage_digest(theirs))], {})
    out = []
    core._refresh_predictor(inp, 0.0, out)
    assert out == [Fetch(("usage", "b"), usage_digest(theirs), "b")]
    assert set(core.predictor.docs) == {"me"}
    core.fetched(("usage", "b"), usage_digest(theirs), theirs)
    before = core.predictor
    core._refresh_predictor(inp, 10.0, out := [])
    assert out == [] and core.predictor is before  # changed, but rebuilt at most every PREDICTOR_REFRESH_S
    core._refresh_predictor(inp, PREDICTOR_REFRESH_S, out := [])
    assert out == [] and set(core.predictor.docs) == {"me", "b"} and core.predictor is not before
    p = core.predictor
    core._refresh_predictor(inp, 1000.0, [])
    assert core.predictor is p  # nothing changed: not rebuilt
    assert core.predictor.predict("sp", "1xH100").runs == 6
    # not leading: no fetch, its own summary alone
    follower = JobInputs(Leadership("b", 1, 1), inp.members, {})
    core._refresh_predictor(follower, 2000.0, out := [])
    assert out == [] and set(core.predictor.docs) == {"me"}


def test_a_node_claiming_a_huge_run_count_weighs_no_more_than_four_times_the_usual():
    honest = {n: doc(n, "1xH100", [100.0 + i for i in range(20)]) for n in ("a", "b", "c")}
    base = Predictor(honest, CATALOG).predict("sp", "1xH100")
    # within 4x on median and p90 (so not left out), but with a billion-fold weight at its high end
    w = doc("evil", "1xH100", [350.0] * 20)
    heavy = msgspec.structs.replace(w, entries=[msgspec.structs.replace(
        e, runtime_s=msgspec.structs.replace(e.runtime_s, bins=[b * 1e9 for b in e.runtime_s.bins]))
        for e in w.entries])
    p = Predictor({**honest, "evil": heavy}, CATALOG).predict("sp", "1xH100")
    assert base is not None and p is not None
    # capped at 4 x 20 runs: 80 of 140 values at 350 s move the median, never to a billion-run figure
    assert p.runs <= 4 * 20 + 3 * 20 + 1
    alone = Predictor({"evil": heavy}, CATALOG).predict("sp", "1xH100")
    assert alone is not None and alone.runs > 10**9  # alone it is all there is


async def test_a_node_serves_the_summary_of_the_digest_asked_for_while_it_keeps_it(tmp_path):
    """A node whose jobs end faster than its new digest spreads and a fetch takes (each ended job changes its
    summary) still serves the summary the reader saw signed: ``GET /jobs/usage?digest=D`` answers D's while the
    node keeps it (its last ``USAGE_KEPT``), the newest without a digest or once D is gone, 400 on a non-hex one."""
    import httpx
    from test_http import app_of, demo_agent

    from p2pnode.jobs._control import USAGE_KEPT

    a = demo_agent(tmp_path)
    docs = [summarize(a.node_id, [RunRecord("sp", "1xH100", 10.0 + i, 2e9)]) for i in range(USAGE_KEPT + 2)]
    assert all(a.jobs.keep_usage(d) for d in docs) and not a.jobs.keep_usage(docs[-1])
    digests = [usage_digest(d) for d in docs]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        async def get(query):
            r = await c.get("/jobs/usage", params=query)
            return r.status_code, r.content

        for d in digests[2:]:  # each kept one, exactly (the reader's check passes)
            status, body = await get({"digest": d})
            assert status == 200 and open_usage(body, d) == docs[digests.index(d)]
        for query in ({"digest": digests[0]}, {}):  # gone, or not asked for: the newest (the reader says stale)
            status, body = await get(query)
            assert status == 200 and open_usage(body, digests[-1]) == docs[-1]
        with pytest.raises(RejectedMessage):
            open_usage((await get({"digest": digests[0]}))[1], digests[0])
        for bad in ("XYZ", "0" * 65, "\u0661\u0662", "a b"):
            assert (await get({"digest": bad}))[0] == 400
    assert list(a.jobs.usage_by_digest) == digests[2:] and a.jobs.usage_digest == digests[-1]
    # the leader asks for the digest it saw signed (a peer's text, quoted into the query)
    for seen, query in ((digests[3], f"digest={digests[3]}"), ("a b/&", "digest=a%20b%2F%26")):
        a.jobs._fetch(Fetch(("usage", "b"), seen, "b"))
        assert a.jobs.fetcher._wants[("usage", "b")].path == f"/jobs/usage?{query}"
