"""The scaling simulation (p2pnode.sim._autoscale): the leader's ScalingCore over a bursty day with a simulated
provider. Deterministic; the hysteresis and the cooldown hold (one action per cooldown, no flapping), the queue
drains, and removing hysteresis flaps."""

from __future__ import annotations

import json
import subprocess
import sys

from p2pnode.sim import compare_autoscale, run_autoscale


def test_same_seed_same_figures():
    assert run_autoscale(seed=3, duration_s=3 * 3600.0) == run_autoscale(seed=3, duration_s=3 * 3600.0)


def test_hysteresis_and_cooldown_hold_and_the_queue_drains():
    r = compare_autoscale(seed=0, duration_s=4 * 3600.0)
    h, none = r["hysteresis"], r["no_hysteresis"]
    assert h["min_action_gap_s"] >= 300.0  # one action per cooldown, failed ones included
    assert h["queued_at_end"] == 0 and h["actions_up"] > 0 and h["actions_down"] > 0
    assert h["flaps"] <= 1 < none["flaps"]
    assert h["actions_up"] + h["actions_down"] < none["actions_up"] + none["actions_down"]
    assert h["nodes_started"] < none["nodes_started"]


def test_the_cli_prints_both_policies():
    out = subprocess.run([sys.executable, "-m", "p2pnode", "simulate", "--scenario", "scaling", "--duration", "7200",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert set(r) == {"hysteresis", "no_hysteresis"} and r["hysteresis"]["jobs"] > 0
