"""``p2pnode simulate --scenario goodput`` (issue 41, item 6): trainings on nodes with seeded lifetimes by class,
goodput with resume against without, accounted by the agent's own goodput core."""

from __future__ import annotations

import math

import pytest

from p2pnode.cli import main
from p2pnode.sim import parse_lifetimes, run_goodput, simulate_goodput


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_resume_beats_starting_from_nothing_under_the_same_deaths(seed: int) -> None:
    r = simulate_goodput(seed=seed, inventory="seed003", duration_s=12 * 3600.0)
    w, wo = r["with_resume"], r["without_resume"]
    assert w["deaths"] == wo["deaths"] > 0  # the same seeded node lifetimes in both runs
    assert w["interrupted"] > 0 and wo["interrupted"] > 0
    assert w["goodput"] > wo["goodput"]
    assert w["fetch_s"] > 0 and wo["fetch_s"] == 0


def test_each_interruption_loses_at_most_one_interval_plus_the_sync_lag() -> None:
    interval, lag = 60.0, 5.0
    w = run_goodput(resume=True, seed=4, inventory="random", nodes=40, duration_s=6 * 3600.0,
                    checkpoint_interval_s=interval, sync_lag_s=lag, lifetimes={"ephemeral": 900.0})
    assert w["interrupted"] > 20
    assert 0 < w["lost_s"] <= w["interrupted"] * (interval + lag) + 1.0


def test_without_resume_a_death_loses_the_whole_run_and_durable_nodes_never_die() -> None:
    wo = run_goodput(resume=False, seed=5, inventory="random", nodes=8, configs=8, duration_s=3600.0,
                     lifetimes={"ephemeral": math.inf, "durable": math.inf})
    assert wo["deaths"] == 0 and wo["lost_s"] == 0 and wo["goodput"] == 1.0
    assert wo["run_s"] == pytest.approx(8 * 3600.0, abs=1.0)


def test_same_seed_same_figures() -> None:
    kw = dict(seed=7, inventory="random", nodes=30, duration_s=4 * 3600.0)
    assert simulate_goodput(**kw) == simulate_goodput(**kw)


def test_parse_lifetimes() -> None:
    assert parse_lifetimes("ephemeral=600, durable=inf") == {"ephemeral": 600.0, "durable": math.inf}
    assert parse_lifetimes("")["durable"] == math.inf
    for bad in ("spot=60", "ephemeral", "ephemeral=0", "ephemeral=-5", "ephemeral=x"):
        with pytest.raises(ValueError):
            parse_lifetimes(bad)


def test_cli_prints_both_runs(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--scenario", "goodput", "--inventory", "seed003", "--seed", "1", "--duration", "7200",
               "--lifetimes", "ephemeral=1200,durable=inf", "--checkpoint-interval", "30"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "with resume     goodput" in out and "without resume  goodput" in out
    assert main(["simulate", "--scenario", "goodput", "--lifetimes", "spot=1"]) == 2
