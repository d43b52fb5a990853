"""The job table (:mod:`p2pnode.node._table`) against a small reference model written here from its documented life (not
imported): random event sequences, seeded, >= 10,000 steps, most of them events with a transition from the job's
state (the rest: events with none), with ids remembered from history (:meth:`JobTable.remember`), records restored
from the ledger (``Restored*``, kept as read back) and small bounds, so finished records pass into remembered ids and
out of the table; an event with no transition is reported (counted) and changes nothing; states and outcomes agree
with the model; the changes a persisting driver takes (:meth:`JobTable.take_changes`) mirror the table. A mutation
run shows the check can fail: every transition of the table deleted, or redirected to each other state, is caught.
(The table has no deadline of its own, ``next_deadline`` is ``inf``: the core's deadlines are covered by
``tests/test_job_core.py``'s random deadline test.)"""

from __future__ import annotations

import random

import msgspec
import pytest

from p2pnode.node import _table
from p2pnode.node._jobstate import JOB_STATES, STOP_RULES
from p2pnode.node._table import (
    TRANSITIONS,
    Adopted,
    Assigned,
    Exited,
    FetchAsked,
    FetchProgress,
    JobRecord,
    JobTable,
    Refused,
    RestoredEnded,
    RestoredRefused,
    RestoredRunning,
    RestoredStopping,
    StartAsked,
    Started,
    StartFailed,
    StopAsked,
    TransitionError,
    Waiting,
    Withdrawn,
)

# The documented life of a job id, spelled out independently of the table (``gone``: no record).
MODEL: dict[tuple[str, str], str] = {
    ("gone", "Assigned"): "assigned",
    ("gone", "Adopted"): "running",
    ("remembered", "Adopted"): "running",
    ("remembered", "Exited"): "ended",
    ("assigned", "Waiting"): "waiting",
    ("assigned", "StartAsked"): "starting",
    ("assigned", "Refused"): "refused",
    ("assigned", "Withdrawn"): "gone",
    ("waiting", "Waiting"): "waiting",
    ("waiting", "StartAsked"): "starting",
    ("waiting", "Refused"): "refused",
    ("waiting", "Withdrawn"): "gone",
    # issue 41: the config's newest checkpoint fetched before the start; abandoned like an assigned job
    ("assigned", "FetchAsked"): "fetching",
    ("waiting", "FetchAsked"): "fetching",
    ("fetching", "FetchProgress"): "fetching",
    ("fetching", "StartAsked"): "starting",
    ("fetching", "Refused"): "refused",
    ("fetching", "Withdrawn"): "gone",
    ("starting", "Started"): "running",
    ("starting", "StartFailed"): "ended",
    ("starting", "StopAsked"): "stopping",
    ("starting", "Exited"): "ended",
    ("running", "StopAsked"): "stopping",
    ("running", "Exited"): "ended",
    ("stopping", "Exited"): "ended",
    # an earlier run's record read back from the ledger: restored in its state (a starting one as running)
    ("gone", "RestoredRunning"): "running",
    ("remembered", "RestoredRunning"): "running",
    ("gone", "RestoredStopping"): "stopping",
    ("remembered", "RestoredStopping"): "stopping",
    ("gone", "RestoredEnded"): "ended",
    ("remembered", "RestoredEnded"): "ended",
    ("gone", "RestoredRefused"): "refused",
    ("remembered", "RestoredRefused"): "refused",
}
EVENTS = ("Assigned", "Waiting", "StartAsked", "Started", "StartFailed", "StopAsked", "Exited", "Refused", "Adopted",
          "Withdrawn", "RestoredRunning", "RestoredStopping", "RestoredEnded", "RestoredRefused", "FetchAsked",
          "FetchProgress")


def model_outcome(state: str, event: str, args: dict) -> str | None:
    """The documented outcome of a job that ends in ``state`` on ``event``."""
    if event == "StartFailed":
        return "start_failed"
    if state == "stopping" or args.get("stopped"):
        return "stopped"
    if args.get("failed") or args.get("signal") is not None or args.get("status") not in (None, 0):
        return "failed"
    return "completed" if args.get("status") == 0 else "lost"


def random_event(rng: random.Random, job_id: str, name: str) -> tuple[str, dict, object]:
    args: dict = {}
    if name == "Exited":
        args = {"status": rng.choice([None, 0, 1, 3]), "signal": rng.choice([None, None, 9]),
                "stopped": rng.random() < 0.2, "failed": rng.random() < 0.2}
    ev = {
        "Assigned": lambda: Assigned(job_id, "sp", "selfplay", (0,), 1.0, 8.0, 1),
        "Waiting": lambda: Waiting(job_id, "spawn-rate limit"),
        "StartAsked": lambda: StartAsked(job_id),
        "Started": lambda: Started(job_id, rng.randrange(1, 1 << 16)),
        "StartFailed": lambda: StartFailed(job_id, "no such file"),
        # (one draw whatever the number of rules: a rule added later does not shift the rest of the sequence)
        "StopAsked": lambda: StopAsked(job_id, STOP_RULES[int(rng.random() * len(STOP_RULES))],  # type: ignore[arg-type]
                                       "a reason"),
        "Exited": lambda: Exited(job_id, **args),
        "Refused": lambda: Refused(job_id, "cordoned"),
        "Adopted": lambda: Adopted(job_id, "sp", "selfplay", (0,), started_at=1.0),
        "Withdrawn": lambda: Withdrawn(job_id),
        "FetchAsked": lambda: FetchAsked(job_id, 1000, rng.choice([0, 400]), "checkpoint 5-1#3"),
        "FetchProgress": lambda: FetchProgress(job_id, rng.randrange(0, 2000)),
        "RestoredRunning": lambda: RestoredRunning(job_id, restored_record(rng, job_id)),
        "RestoredStopping": lambda: RestoredStopping(job_id, restored_record(rng, job_id)),
        "RestoredEnded": lambda: RestoredEnded(job_id, restored_record(rng, job_id)),
        "RestoredRefused": lambda: RestoredRefused(job_id, restored_record(rng, job_id)),
    }[name]()
    return name, args, ev


def restored_record(rng: random.Random, job_id: str) -> JobRecord:
    """An earlier run's record as the ledger gives it back (its state is the event's to set)."""
    return JobRecord(job_id, rng.choice(JOB_STATES), "sp", "selfplay", (1,), 0.5, 4.0, rng.randrange(5),  # type: ignore[arg-type]
                     rule=[None, *STOP_RULES][int(rng.random() * (len(STOP_RULES) + 1))], reason="earlier",
                     outcome=rng.choice([None, "completed"]),
                     status=rng.choice([None, 0]), pid=rng.randrange(1, 99), started_at=-rng.random(),
                     adopted=rng.random() < 0.5)


class Model:
    """The documented states of job ids with the bounds: finished records (ended, refused) kept for the newest
    ``records`` ids, then as remembered ids for the newest ``ids`` of those, then gone."""

    def __init__(self, records: int, ids: int) -> None:
        self.records, self.ids = records, ids
        self.state: dict[str, str] = {}
        self.done: list[str] = []  # finished records, oldest first
        self.kept: list[str] = []  # remembered ids, oldest first

    def get(self, job_id: str) -> str:
        return self.state.get(job_id, "gone")

    def move(self, job_id: str, to: str) -> None:
        for order in (self.done, self.kept):
            if job_id in order:
                order.remove(job_id)
        self.state[job_id] = to
        if to in ("ended", "refused"):
            self.done.append(job_id)
            if len(self.done) > self.records:
                self.move(self.done[0], "remembered")
        elif to == "remembered":
            self.kept.append(job_id)
            if len(self.kept) > self.ids:
                self.move(self.kept[0], "gone")

    def remember(self, job_id: str) -> str:
        """:meth:`JobTable.remember`: an assigned, waiting or fetching id is asked to start; an id without a record
        is remembered (again: the newest)."""
        s = self.get(job_id)
        if s in ("assigned", "waiting", "fetching"):
            self.move(job_id, "starting")
        elif s in ("gone", "remembered"):
            self.move(job_id, "remembered")
        return self.get(job_id)


def pick_event(rng: random.Random, state: str) -> str:
    """Mostly an event with a transition from ``state`` (documented in :data:`MODEL`), else any."""
    allowed = [e for (s, e) in MODEL if s == state]
    return rng.choice(allowed) if allowed and rng.random() < 0.8 else rng.choice(EVENTS)


def check(transitions: dict, seed: int, steps: int, rows: set | None = None) -> str | None:
    """Drive a table following ``transitions`` (bounds of 6 records, 6 remembered ids) with ``steps`` random
    events and remembered ids; the first disagreement with the model, or None. ``rows``: gets the model's rows
    followed, and ``("no transition", n)``."""
    rng = random.Random(seed)
    table = JobTable(transitions=transitions, max_history=6, max_ids=6)
    model = Model(6, 6)
    mirror: dict[str, str] = {}  # what a driver persisting the changes holds (checked when ``rows`` is given)
    if rows is not None:
        table.track()
    ids = [f"j{i}" for i in range(12)]  # a window of ids: finished ones are final, new ones come in
    now, no_transition = 0.0, 0
    for step in range(steps):
        now += rng.random()
        if rng.random() < 0.05:
            ids = [*ids[1:], f"j{step + 12}"]
        open_ids = [j for j in ids if model.get(j) not in ("ended", "refused")]
        job_id = rng.choice(open_ids if open_ids and rng.random() < 0.8 else ids)  # mostly one not final
        if rng.random() < 0.05:  # an earlier run's history, or a start the driver made itself
            table.remember(job_id)
            want = model.remember(job_id)
            seen = "gone" if table.state(job_id) == _table.UNKNOWN else table.state(job_id)
            if seen != want:
                return f"step {step}: remember {job_id}: expected {want}, table says {seen}"
            continue
        name = pick_event(rng, model.get(job_id))
        _, args, ev = random_event(rng, job_id, name)
        before, errors_before = table.get(job_id), sum(table.errors.values())
        got = table.apply(ev, now)  # type: ignore[arg-type]
        was = model.get(job_id)
        want = MODEL.get((was, name))
        seen = "gone" if table.state(job_id) == _table.UNKNOWN else table.state(job_id)
        where = f"step {step}: {name} on {job_id} from {was}"
        if want is None:
            no_transition += 1
            if not isinstance(got, TransitionError):
                return f"{where}: no transition expected, got {seen}"
            if table.get(job_id) != before or sum(table.errors.values()) != errors_before + 1:
                return f"{where}: a refused event changed the record or was not counted"
            continue
        if isinstance(got, TransitionError):
            return f"{where}: expected {want}, reported {got}"
        model.move(job_id, want)
        if rows is not None:
            rows.add((was, name))
        for j in {job_id, *ids, *model.done, *model.kept}:  # the bounds moved the oldest ids on
            s = "gone" if table.state(j) == _table.UNKNOWN else table.state(j)
            if s != model.get(j):
                return f"{where}: {j} expected {model.get(j)}, table says {s}"
        if want == "ended" and not name.startswith("Restored"):
            outcome = model_outcome(was, name, args)
            rec = table.get(job_id)
            if rec is None or rec.outcome != outcome or rec.ended_at != now:
                return f"{where}: outcome {rec and rec.outcome} != {outcome}"
        if name.startswith("Restored"):
            if table.get(job_id) != msgspec.structs.replace(ev.record, state=want):  # type: ignore[attr-defined]
                return f"{where}: the restored record was not kept as it was read back"
        elif want == "stopping":
            rec = table.get(job_id)
            if rec is None or rec.rule != getattr(ev, "rule", None):
                return f"{where}: the stop rule was not kept"
        if rows is not None:
            for j in table.take_changes():
                if table.state(j) == _table.UNKNOWN:
                    mirror.pop(j, None)
                else:
                    mirror[j] = table.state(j)
            if mirror != {j: table.state(j) for j in table.ids()}:
                return f"{where}: the changes taken do not mirror the table"
    if rows is not None:
        rows.add(("no transition", no_transition))
    return None


def test_the_table_follows_the_model_over_random_event_sequences():
    for seed in range(3):
        rows: set = set()
        assert check(TRANSITIONS, seed, 10_000, rows) is None
        assert set(MODEL) <= rows, set(MODEL) - rows  # every documented row followed, remembered ones included
        n = next(n for r, n in rows if r == "no transition")
        assert 1_000 < n < 10_000 // 3, n  # most steps follow a transition; events with none are tried too


def _mutants() -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []
    for key, target in TRANSITIONS.items():
        deleted = dict(TRANSITIONS)
        del deleted[key]
        out.append((f"delete {key}", deleted))
        for other in (*JOB_STATES, _table.UNKNOWN, _table.REMEMBERED):
            if other != target:
                out.append((f"redirect {key} to {other}", {**TRANSITIONS, key: other}))
    return out


def test_every_mutant_of_the_transition_table_is_caught(monkeypatch):
    mutants = _mutants()
    assert len(mutants) >= 9 * len(TRANSITIONS)
    escaped = []
    for name, table in mutants:
        monkeypatch.setattr(_table, "TRANSITIONS", table)  # (the table is also handed in: both paths mutate)
        if check(table, 0, 10_000) is None:
            escaped.append(name)
    assert not escaped, escaped


def test_a_refused_id_stays_final_while_remembered_and_the_history_is_bounded():
    t = JobTable(max_history=3, max_ids=2)
    t.apply(Assigned("a"), 0.0)
    assert t.apply(Refused("a", "cordoned"), 1.0).state == "refused"  # type: ignore[union-attr]
    err = t.apply(Assigned("a"), 2.0)
    assert isinstance(err, TransitionError) and t.errors[("refused", "Assigned")] == 1 and t.ran("a")
    for j in ("b", "c", "d"):
        t.apply(Adopted(j), 3.0)
        t.apply(Exited(j, status=0), 4.0)
    assert t.state("a") == _table.REMEMBERED and t.get("a") is None  # past the records' bound: its id alone
    assert t.ran("a") and isinstance(t.apply(Assigned("a"), 5.0), TransitionError)  # still final
    assert [r.job_id for r in t.history()] == ["d", "c", "b"]
    assert [r.outcome for r in t.history(2)] == ["completed", "completed"]
    for j in ("e", "f"):
        t.apply(Adopted(j), 6.0)
        t.apply(Exited(j, status=0), 7.0)
    assert t.state("a") == _table.UNKNOWN and not t.ran("a")  # past both bounds (3 records, 2 ids): forgotten
    assert [t.state(j) for j in "bcdef"] == ["remembered", "remembered", "ended", "ended", "ended"]
    assert len(t) == 5 and t.ids() == ["b", "c", "d", "e", "f"]


def test_ids_from_history_are_final_and_a_withdrawn_record_goes():
    t = JobTable(history=["old", "gone", "runs"])
    assert t.ran("old") and t.state("old") == _table.REMEMBERED and t.get("old") is None  # not ended: not known
    assert isinstance(t.apply(Assigned("old"), 0.0), TransitionError)
    r = t.apply(Exited("gone", failed=True), 0.5)  # it ended while the agent was down
    assert r.state == "ended" and r.outcome == "failed" and t.ran("gone")  # type: ignore[union-attr]
    r = t.apply(Adopted("runs", "sp", "selfplay", started_at=-5.0), 0.5)  # it runs on: re-adopted
    assert r.state == "running" and r.adopted and r.started_at == -5.0 and t.ran("runs")  # type: ignore[union-attr]
    assert t.apply(Exited("runs", status=0), 1.0).outcome == "completed"  # type: ignore[union-attr]
    assert dict(t.errors) == {("remembered", "Assigned"): 1}
    t.apply(Assigned("w"), 0.0)
    t.apply(Waiting("w", "spawn-rate limit"), 0.0)
    assert not t.ran("w") and t.get("w").reason == "spawn-rate limit"  # type: ignore[union-attr]
    t.apply(Withdrawn("w"), 1.0)
    assert t.get("w") is None and t.state("w") == _table.UNKNOWN


@pytest.mark.parametrize("status,signal,stopped,outcome", [(0, None, False, "completed"), (3, None, False, "failed"),
                                                           (None, 9, False, "failed"), (None, None, False, "lost"),
                                                           (1, None, True, "stopped")])
def test_outcomes(status, signal, stopped, outcome):
    t = JobTable()
    t.apply(Adopted("x"), 0.0)
    r = t.apply(Exited("x", status=status, signal=signal, stopped=stopped), 5.0)
    assert r.outcome == outcome and r.status == status and r.signal == signal  # type: ignore[union-attr]


def test_the_drivers_ran_set_is_a_view_of_the_table():
    t = JobTable(history=["h"])
    ran = _table.RanView(t)
    assert "h" in ran and "x" not in ran and list(ran) == ["h"]
    t.apply(Assigned("x"), 1.0)
    assert "x" not in ran  # assigned, not started: a later step may still start it
    ran.add("x")  # the driver starts it itself
    assert "x" in ran and t.state("x") == "starting"
    ran.add("y")
    assert "y" in ran and t.get("y") is None and len(ran) == 3


def test_the_ran_view_is_a_true_set():
    ran = _table.RanView(JobTable(history=["h1", "h2"]))
    assert set(ran) == {"h1", "h2"} and ran == {"h1", "h2"} and ran != {"h1"}
    assert {"h1", "x"} - ran == {"x"} and ran - {"h1"} == {"h2"} and ran | {"x"} == {"h1", "h2", "x"}
    assert {"h1"} <= ran and {"h1"}.issubset(ran) and ran & {"h2", "y"} == {"h2"} and not ran.isdisjoint({"h2"})
    assert "x" not in ran and 3 not in ran  # type: ignore[operator]


def test_the_transition_table_is_the_only_rule_for_ids_without_a_record():
    t = JobTable(transitions={**TRANSITIONS, (_table.UNKNOWN, Started): "running"})
    r = t.apply(Started("x", 7), 2.0)
    assert not isinstance(r, TransitionError) and (r.state, r.pid, r.started_at) == ("running", 7, 2.0)
    assert isinstance(JobTable().apply(Started("x", 7), 2.0), TransitionError)  # the documented table has no row
    t = JobTable(transitions={**TRANSITIONS, (_table.REMEMBERED, StartFailed): "ended"}, history=["h"])
    assert t.apply(StartFailed("h", "gone"), 1.0).outcome == "start_failed"  # type: ignore[union-attr]


def test_a_checkpoint_fetch_shows_its_progress_bounded_and_never_going_back():
    t = JobTable()
    t.apply(Assigned("5-1", "train", "training"), 0.0)
    r = t.apply(FetchAsked("5-1", total_bytes=1000, have_bytes=5000, reason="checkpoint 4-2#7 from 2 holders"), 1.0)
    assert (r.state, r.fetch_bytes, r.fetch_total_bytes, r.reason) == ("fetching", 1000, 1000,
                                                                        "checkpoint 4-2#7 from 2 holders")
    t = JobTable()
    t.apply(Assigned("5-1", "train", "training"), 0.0)
    t.apply(FetchAsked("5-1", total_bytes=1000, have_bytes=200), 1.0)
    assert t.apply(FetchProgress("5-1", 600), 2.0).fetch_bytes == 600
    assert t.apply(FetchProgress("5-1", 300), 3.0).fetch_bytes == 600  # a late report does not go back
    assert t.apply(FetchProgress("5-1", 10**12), 4.0).fetch_bytes == 1000
    r = t.apply(StartAsked("5-1"), 5.0)
    assert (r.state, r.fetch_bytes, r.fetch_total_bytes) == ("starting", 1000, 1000)
    assert isinstance(t.apply(FetchProgress("5-1", 1), 6.0), TransitionError)
    assert not t.ran("never") and t.state("5-1") == "starting"
