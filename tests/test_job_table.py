"""The job table (:mod:`p2pnode.node._table`) against a small reference model written here from its documented
life (not imported): random event sequences, seeded, >= 10,000 steps; an event with no transition is reported
(counted) and changes nothing; states and outcomes agree with the model; no deadline in the past. A mutation run
shows the check can fail: every transition of the table deleted, or redirected to each other state, is caught."""

from __future__ import annotations

import random

import pytest

from p2pnode.node import _table
from p2pnode.node._jobstate import JOB_STATES, STOP_RULES
from p2pnode.node._table import (
    TRANSITIONS,
    Adopted,
    Assigned,
    Exited,
    JobTable,
    Refused,
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
    ("assigned", "Waiting"): "waiting",
    ("assigned", "StartAsked"): "starting",
    ("assigned", "Refused"): "refused",
    ("assigned", "Withdrawn"): "gone",
    ("waiting", "Waiting"): "waiting",
    ("waiting", "StartAsked"): "starting",
    ("waiting", "Refused"): "refused",
    ("waiting", "Withdrawn"): "gone",
    ("starting", "Started"): "running",
    ("starting", "StartFailed"): "ended",
    ("starting", "StopAsked"): "stopping",
    ("starting", "Exited"): "ended",
    ("running", "StopAsked"): "stopping",
    ("running", "Exited"): "ended",
    ("stopping", "Exited"): "ended",
}
STATES = ("gone", "assigned", "waiting", "starting", "running", "stopping", "ended", "refused")
EVENTS = ("Assigned", "Waiting", "StartAsked", "Started", "StartFailed", "StopAsked", "Exited", "Refused", "Adopted",
          "Withdrawn")


def model_outcome(state: str, event: str, args: dict) -> str | None:
    """The documented outcome of a job that ends in ``state`` on ``event``."""
    if event == "StartFailed":
        return "start_failed"
    if state == "stopping" or args.get("stopped"):
        return "stopped"
    if args.get("failed") or args.get("signal") is not None or args.get("status") not in (None, 0):
        return "failed"
    return "completed" if args.get("status") == 0 else "lost"


def random_event(rng: random.Random, job_id: str) -> tuple[str, dict, object]:
    name = rng.choice(EVENTS)
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
        "StopAsked": lambda: StopAsked(job_id, rng.choice(STOP_RULES), "a reason"),  # type: ignore[arg-type]
        "Exited": lambda: Exited(job_id, **args),
        "Refused": lambda: Refused(job_id, "cordoned"),
        "Adopted": lambda: Adopted(job_id, "sp", "selfplay", (0,), started_at=1.0),
        "Withdrawn": lambda: Withdrawn(job_id),
    }[name]()
    return name, args, ev


def check(transitions: dict, seed: int, steps: int) -> str | None:
    """Drive a table following ``transitions`` with ``steps`` random events; the first disagreement with the
    model, or None."""
    rng = random.Random(seed)
    table = JobTable(transitions=transitions)
    ids = [f"j{i}" for i in range(12)]  # a window of ids: finished ones are final, new ones come in
    state = {j: "gone" for j in ids}
    outcome: dict[str, str | None] = {}
    now = 0.0
    for step in range(steps):
        now += rng.random()
        if rng.random() < 0.05:
            ids = [*ids[1:], f"j{step + 12}"]
            state[ids[-1]] = "gone"
        job_id = rng.choice(ids)
        name, args, ev = random_event(rng, job_id)
        before, errors_before = table.get(job_id), sum(table.errors.values())
        got = table.apply(ev, now)  # type: ignore[arg-type]
        want = MODEL.get((state[job_id], name))
        seen = "gone" if table.state(job_id) == _table.UNKNOWN else table.state(job_id)
        where = f"step {step}: {name} on {job_id} from {state[job_id]}"
        if want is None:
            if not isinstance(got, TransitionError):
                return f"{where}: no transition expected, got {seen}"
            if table.get(job_id) != before or sum(table.errors.values()) != errors_before + 1:
                return f"{where}: a refused event changed the record or was not counted"
            continue
        if isinstance(got, TransitionError):
            return f"{where}: expected {want}, reported {got}"
        if seen != want:
            return f"{where}: expected {want}, table says {seen}"
        if want == "ended" and state[job_id] != "ended":
            outcome[job_id] = model_outcome(state[job_id], name, args)
            rec = table.get(job_id)
            if rec is None or rec.outcome != outcome[job_id] or rec.ended_at != now:
                return f"{where}: outcome {rec and rec.outcome} != {outcome[job_id]}"
        if want == "stopping":
            rec = table.get(job_id)
            if rec is None or rec.rule != getattr(ev, "rule", None):
                return f"{where}: the stop rule was not kept"
        state[job_id] = want
        if table.next_deadline() < now:
            return f"{where}: a deadline in the past"
    return None


def test_the_table_follows_the_model_over_random_event_sequences():
    for seed in range(3):
        assert check(TRANSITIONS, seed, 10_000) is None


def _mutants() -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []
    for key, target in TRANSITIONS.items():
        deleted = dict(TRANSITIONS)
        del deleted[key]
        out.append((f"delete {key}", deleted))
        for other in (*JOB_STATES, _table.UNKNOWN):
            if other != target:
                out.append((f"redirect {key} to {other}", {**TRANSITIONS, key: other}))
    return out


def test_every_mutant_of_the_transition_table_is_caught(monkeypatch):
    mutants = _mutants()
    assert len(mutants) >= 8 * len(TRANSITIONS)
    escaped = []
    for name, table in mutants:
        monkeypatch.setattr(_table, "TRANSITIONS", table)  # (the table is also handed in: both paths mutate)
        if check(table, 0, 10_000) is None:
            escaped.append(name)
    assert not escaped, escaped


def test_a_refused_id_stays_final_while_remembered_and_the_history_is_bounded():
    t = JobTable(max_history=3)
    t.apply(Assigned("a"), 0.0)
    assert t.apply(Refused("a", "cordoned"), 1.0).state == "refused"  # type: ignore[union-attr]
    err = t.apply(Assigned("a"), 2.0)
    assert isinstance(err, TransitionError) and t.errors[("refused", "Assigned")] == 1 and t.ran("a")
    for j in ("b", "c", "d"):
        t.apply(Adopted(j), 3.0)
        t.apply(Exited(j, status=0), 4.0)
    assert t.state("a") == _table.UNKNOWN and not t.ran("a")  # forgotten past the bound: 3 kept
    assert [r.job_id for r in t.history()] == ["d", "c", "b"]
    assert [r.outcome for r in t.history(2)] == ["completed", "completed"]


def test_ids_from_history_are_final_and_a_withdrawn_record_goes():
    t = JobTable(history=["old"])
    assert t.ran("old") and t.state("old") == "ended"
    assert isinstance(t.apply(Assigned("old"), 0.0), TransitionError)
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
