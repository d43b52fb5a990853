"""Fuzz: hostile requests to every HTTP route of a real agent, signed and unsigned, in open mode and in token mode
with a read token (issue 22, item 7; the driver and its oracles are :mod:`fuzz.routes`).

Per configuration one long-lived agent; per route a batch of cases, each generated from a seed that hypothesis
draws (derandomized: the same seeds every run). The generator's choices come from ``random.Random(seed)``, as in
the bench: hypothesis's own draws lean so hard towards the benign choice that few requests were signed or hostile,
and a case is too stateful to shrink on a live agent anyway; a failure prints its seed and its request. After every
case: no 5xx, no traceback, no state change from a refusal, the heartbeat running, no quarantine. The agent is
restarted on its data dir (SIGTERM, then start) after each state-changing route's batch and after the read-only
routes; the 50,000-case run that restarts it after every route's batch, in three configurations, is
``bench/fuzz_routes.py``.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fuzz.routes import AGENT_CONFIGS, ROUTES, RouteFuzzer, app_routes

READ_CASES = 15
"""Cases per read-only route (a few ms each)."""
WRITE_CASES = 40
"""Cases per state-changing route (each also reads the state before and after). (25 and 60 until the suite
had to keep to about 15 minutes: ``bench/fuzz_routes.py`` runs the 50,000 cases.)"""
CASES = {"open": (READ_CASES, WRITE_CASES), "token-read": (10, 20)}
"""Cases per read and per write route, by configuration: the open agent takes the bulk (its signed cases must
reach every state-changing route); the token-mode agent with a read token a smaller batch (its auth paths, the
read token's views; ``bench/fuzz_routes.py`` runs 50,000 over all three configurations)."""


def test_every_route_of_the_app_is_fuzzed():
    """A route added to the agent must be added to :data:`fuzz.routes.ROUTES` (and so fuzzed) too."""
    served = app_routes()
    fuzzed = {(r.method, r.path) for r in ROUTES}
    assert served - fuzzed == set(), f"routes the fuzzer does not cover: {sorted(served - fuzzed)}"
    assert fuzzed - served == set(), f"fuzzed routes the app no longer serves: {sorted(fuzzed - served)}"


def _batch(fz: RouteFuzzer, spec, cases: int) -> None:
    fz.refresh_context()

    @settings(max_examples=cases, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 2**64 - 1))
    def one(seed):
        fz.run_case(spec, seed)

    one()


@pytest.mark.slow
@pytest.mark.parametrize("config", ["open", "token-read"])
def test_hostile_requests_to_every_route_break_nothing(tmp_path, config):
    fz = RouteFuzzer(tmp_path, AGENT_CONFIGS[config])
    reads, writes = CASES[config]
    t0 = time.monotonic()
    fz.start()
    try:
        for spec in ROUTES:
            if spec.writes:
                _batch(fz, spec, writes)
                fz.restart(spec.key)
            else:
                _batch(fz, spec, reads)
        fz.restart("read-only routes")
        replayed = [f for f in list(fz.stats.failures.values()) if fz.replay(f) is not None]
    finally:
        fz.close()
    s = fz.stats
    print(f"{config}: {time.monotonic() - t0:.1f} s\n{s.summary()}")
    reports = "\n\n".join(f.report() for f in s.failures.values())
    assert not s.failures, f"{len(s.failures)} distinct failures ({len(replayed)} replayed):\n{reports}"
    assert s.restarts_ok == s.restarts == sum(r.writes for r in ROUTES) + 1
    assert s.cases >= len(ROUTES) * reads
    if config != "open":
        return
    # the signed cases get past authentication: each state-changing route accepted some requests
    for key in ("POST /signals", "POST /operator/cordon", "POST /operator/drain", "POST /jobs/run",
                "POST /sync/trigger"):
        assert s.accepted_writes[key] > 0, f"no {key} was accepted: the signed cases do not reach the route"
