"""Guard cores: levels, hysteresis and dwell, priorities, actions, limits validation, safeguards."""

import pytest

from p2pnode.guardcore import (
    CircuitBreaker,
    DegradationTracker,
    GuardLimits,
    OperationPriority,
    SpawnRateLimiter,
    assess,
    host_tier,
    level_for_ratio,
    may_start,
    validate_limits,
)

L = GuardLimits()
GIB = 2**30


def sample(cpu=10.0, mem=10.0, disk=10.0, gpus=()):
    return {"cpu_percent": cpu, "mem_percent": mem, "disk_percent": disk,
            "gpus": [{"index": i, "util_percent": u, "mem_used_bytes": int(m * 80 * GIB / 100),
                      "mem_total_bytes": 80 * GIB} for i, (u, m) in enumerate(gpus)]}


@pytest.mark.parametrize("ratio, level", [(0.0, 0), (0.6999, 0), (0.70, 1), (0.8499, 1), (0.85, 2), (0.95, 3),
                                          (0.9999, 3), (1.0, 4), (1.7, 4)])
def test_level_edges(ratio, level):
    assert level_for_ratio(ratio) == level


def test_highest_resource_decides_and_reasons_name_it():
    a = assess(sample(cpu=20, mem=30, disk=50.4), L)  # disk 50.4 / 70 = 0.72 -> light
    assert a.level == 1 and a.level_name == "light"
    a = assess(sample(disk=72), L)
    assert a.level == 4
    assert "Disk at 72 %: archive old games or delete unused data" in a.actions
    assert any("Disk at 72 % is at or above its limit" in r for r in a.reasons)
    assert "Memory OK at 10 %" in a.actions
    a = assess(sample(gpus=[(10, 10), (10, 79)]), L)  # second GPU's memory at 79 % of 80 %: warned, not full
    assert a.level == 0 and a.gpus_full == () and any(r.startswith("GPU 1 memory at 79 %") for r in a.reasons)


def test_gpus_never_overload_a_node_by_utilization_and_by_memory_only_when_all_are_full():
    # An 8-GPU node with one GPU at 100 % utilization and full memory: that GPU takes no new work, the node does.
    busy = [(100, 95)] + [(0, 0)] * 7
    a = assess(sample(gpus=busy), L)
    assert a.level == 0 and a.gpus_full == (0,)
    assert not any("utilization" in r for r in a.reasons)  # 100 % utilization is the goal, not an overload
    assert assess(sample(gpus=[(97, 10)] * 8), L).level == 0  # training at 97 % everywhere: fine
    everything = assess(sample(gpus=[(100, 90)] * 8), L)  # every GPU's memory over the limit: the node is full
    assert everything.level == 4 and everything.gpus_full == tuple(range(8))
    assert assess(sample(cpu=85, gpus=busy), L).level == 4  # CPU, memory and disk still decide the level


def test_priorities_per_level():
    P = OperationPriority
    assert all(may_start(p, 0) and may_start(p, 1) for p in P)
    assert not may_start(P.BACKGROUND, 2) and may_start(P.LOW, 2)
    assert not may_start(P.NORMAL, 3) and may_start(P.HIGH, 3)
    assert [p for p in P if may_start(p, 4)] == [P.CRITICAL]


@pytest.mark.parametrize("low, high", [(59.3, 59.7), (55.0, 64.0)])  # inside, and beyond, the hysteresis margin
def test_oscillation_changes_level_at_most_once_per_dwell(low, high):
    limits = GuardLimits(dwell_s=30.0)
    t = DegradationTracker(limits)
    # Disk oscillating around the light/moderate edge (0.85 × 70 % = 59.5 %) every 2 s for 5 minutes.
    levels = []
    for step in range(150):
        now = step * 2.0
        disk = high if step % 2 else low
        levels.append((now, t.update(assess(sample(disk=disk), limits), now)))
    change_times = [levels[i][0] for i in range(1, len(levels)) if levels[i][1] != levels[i - 1][1]]
    assert change_times, "the level never rose"
    assert all(b - a >= 30.0 for a, b in zip(change_times, change_times[1:]))
    assert t.changes <= 1 + 300 / 30
    if low < 59.5 - 0.03 * 70:  # beyond the margin the level does come back down, once per dwell at most
        assert len(change_times) > 2


def test_hysteresis_keeps_level_until_clearly_below():
    limits = GuardLimits(dwell_s=0.0, hysteresis_ratio=0.03)
    t = DegradationTracker(limits)
    assert t.update(assess(sample(disk=60.0), limits), 0.0) == 2  # 0.857
    assert t.update(assess(sample(disk=58.5), limits), 1.0) == 2  # 0.836: inside the margin
    assert t.update(assess(sample(disk=57.0), limits), 2.0) == 1  # 0.814 < 0.85 - 0.03
    assert t.update(assess(sample(disk=10.0), limits), 3.0) == 0


def test_rise_to_critical_is_never_delayed():
    t = DegradationTracker(GuardLimits(dwell_s=60.0))
    t.update(assess(sample(disk=50.0), L), 0.0)
    assert t.update(assess(sample(disk=60.0), L), 1.0) == 1  # a rise to moderate waits out the dwell
    assert t.update(assess(sample(disk=71.0), L), 2.0) == 4


def test_validate_limits_names_both_settings():
    errs = validate_limits(GuardLimits(disk_warn_percent=80.0, disk_max_percent=70.0))
    assert any("guard.disk_warn_percent = 80" in e and "guard.disk_max_percent = 70" in e for e in errs)
    assert any("disk thresholds out of order" in e for e in errs)
    assert validate_limits(GuardLimits()) == []
    assert any("target band" in e for e in validate_limits(GuardLimits(target_util_max_percent=90.0)))


def test_host_tiers():
    assert host_tier(128 * GIB, 8).target_util_percent == 65
    assert host_tier(64 * GIB, 1).name == "mid"
    assert host_tier(16 * GIB, 1).target_util_percent == 55
    assert host_tier(512 * GIB, 0).name == "cpu-only"


def test_circuit_breaker_opens_and_recovers():
    b = CircuitBreaker(failures=3, cooldown_s=60.0)
    for t in range(3):
        assert b.allow(float(t))
        b.record(False, float(t))
    assert b.state == "open" and not b.allow(10.0) and b.reopens_at() == 62.0
    assert b.allow(62.0) and b.state == "half-open"
    b.record(False, 62.0)
    assert b.state == "open" and not b.allow(100.0)
    assert b.allow(122.0)
    b.record(True, 122.0)
    assert b.state == "closed" and b.consecutive_failures == 0 and b.trips == 2


def test_spawn_rate_limiter():
    r = SpawnRateLimiter(per_minute=6.0)
    assert [r.try_acquire(0.0) for _ in range(7)] == [True] * 6 + [False]
    assert not r.try_acquire(5.0) and r.try_acquire(10.0)  # one token per 10 s
    assert r.refused == 2
