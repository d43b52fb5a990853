"""Guard cores: levels, hysteresis and dwell, priorities, actions, limits validation, safeguards."""

import pytest

from p2pnode.guardcore import (
    CircuitBreaker,
    DegradationTracker,
    GuardLimits,
    GuardMonitor,
    OperationPriority,
    SpawnRateLimiter,
    admission,
    assess,
    host_tier,
    level_change_message,
    level_for_ratio,
    level_reasons,
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


def test_gpus_never_overload_a_node_neither_by_utilization_nor_by_memory():
    # An 8-GPU node with one GPU at 100 % utilization and full memory: that GPU takes no new work, the node does.
    busy = [(100, 95)] + [(0, 0)] * 7
    a = assess(sample(gpus=busy), L)
    assert a.level == 0 and a.gpus_full == (0,)
    assert not any("utilization" in r for r in a.reasons)  # 100 % utilization is the goal, not an overload
    assert assess(sample(gpus=[(97, 10)] * 8), L).level == 0  # training at 97 % everywhere: fine
    everything = assess(sample(gpus=[(100, 90)] * 8), L)  # every GPU's memory over the limit: no GPU work,
    assert everything.level == 0 and everything.gpus_full == tuple(range(8))  # but CPU-only work is still taken
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
    t.update(assess(sample(disk=60.0), L), 0.0)
    assert t.update(assess(sample(disk=10.0), L), 61.0) == 0  # a fall (past the dwell since the rise)
    assert t.update(assess(sample(disk=60.0), L), 62.0) == 0  # a rise soon after a fall waits out the dwell
    assert t.update(assess(sample(disk=71.0), L), 63.0) == 4  # but not a rise to critical


def test_the_dwell_holds_only_a_change_of_direction():
    """The steps of one rise, or of one fall, follow the load at once; a reversal waits out the dwell."""
    t = DegradationTracker(GuardLimits(dwell_s=30.0))
    assert [t.update(assess(sample(disk=d), L), float(i)) for i, d in enumerate((50.0, 60.0, 67.0))] == [1, 2, 3]
    assert t.update(assess(sample(disk=10.0), L), 10.0) == 3  # a fall 7 s after the rise: held by the dwell
    assert t.update(assess(sample(disk=60.0), L), 33.0) == 2  # past the dwell: straight to what the ratio allows
    assert t.update(assess(sample(disk=10.0), L), 34.0) == 0  # a further fall follows at once
    assert t.update(assess(sample(disk=60.0), L), 40.0) == 0  # a rise 6 s after the fall: held
    assert t.update(assess(sample(disk=60.0), L), 64.0) == 2
    assert t.direction == 1 and t.changes == 6


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


# -- true reasons and messages (issue 24 item 5) ----------------------------------------------------------------
def test_each_reason_prints_the_threshold_it_passed():
    limits = GuardLimits(cpu_max_percent=100.0, cpu_warn_percent=95.0)
    (reason,) = assess(sample(cpu=98.0), limits).reasons
    assert reason == "CPU at 98 % is above its warning level (95 %; limit 100 %)"  # not "(100 %)"
    assert assess(sample(cpu=100.0), limits).reasons == ("CPU at 100 % is at or above its limit (100 %)",)
    assert assess(sample(cpu=50.0), limits).reasons == ()


def test_a_level_reached_below_every_warn_limit_still_has_its_reasons():
    # CPU at 68 % of an 80 % limit: ratio 0.85, level 2 (moderate), below the 70 % warn limit.
    a = assess(sample(cpu=68.0), L)
    assert a.level == 2 and a.reasons == ("CPU at 68 % is 0.85 of its limit (80 %)",)
    assert "CPU at 68 %: reduce concurrent jobs or move CPU-heavy work to another node" in a.actions
    ok, why = admission(a, 2, L, kind="selfplay", priority=OperationPriority.BACKGROUND)
    assert not ok and why.endswith("(moderate): CPU at 68 % is 0.85 of its limit (80 %)")
    # Every level above 0 names its reasons, whatever the resource (disk limit 70 %, memory 80 %).
    for s in (sample(disk=50.0), sample(mem=60.0), sample(disk=68.0), sample(cpu=90.0)):
        b = assess(s, L)
        assert b.level >= 1 and b.reasons, s


def test_level_changes_say_the_direction_the_new_level_and_why():
    up = assess(sample(cpu=68.0), L)
    assert level_change_message(0, 2, up, L) == "degradation level 0 -> 2 (moderate), up: CPU at 68 % is 0.85 of " \
                                                "its limit (80 %)"
    down = assess(sample(cpu=58.0), L)  # ratio 0.725: light
    assert level_change_message(3, 1, down, L) == (
        "degradation level 3 -> 1 (light), down: load ratio 0.72 is under 0.82 (the moderate edge 0.85 less the "
        "hysteresis); still: CPU at 58 % is 0.72 of its limit (80 %)")
    calm = assess(sample(), L)
    assert level_change_message(2, 0, calm, L) == ("degradation level 2 -> 0 (normal), down: load ratio 0.14 is "
                                                   "under 0.67 (the light edge 0.70 less the hysteresis)")


def test_a_level_held_by_the_dwell_or_hysteresis_says_so_and_when_it_may_fall():
    limits = GuardLimits(dwell_s=30.0)
    t = DegradationTracker(limits)
    assert t.update(assess(sample(cpu=77.0), limits), 0.0) == 3  # ratio 0.96: heavy
    calm = assess(sample(cpu=10.0), limits)
    assert calm.level == 0 and calm.reasons == () and t.update(calm, 10.0) == 3  # held: the dwell is 30 s
    assert level_reasons(calm, 3, limits, since_change_s=10.0) == (
        "level 3 (heavy) is held by the dwell: load ratio 0.14 is back under its edge 0.95; the level may fall "
        "in 20 s",)
    ok, why = admission(calm, t.level, limits, kind="selfplay", priority=OperationPriority.NORMAL,
                        since_change_s=10.0)
    assert not ok and "held by the dwell" in why and "may fall in 20 s" in why
    # Past the dwell but inside the hysteresis margin (ratio 0.93 under 0.95, not under 0.92): hysteresis holds.
    near = assess(sample(cpu=74.5), limits)
    assert near.level == 2 and t.update(near, 40.0) == 3
    assert level_reasons(near, 3, limits, since_change_s=40.0)[0] == (
        "level 3 (heavy) is held by hysteresis: load ratio 0.93 is under its edge 0.95 but not yet under 0.92")
    # A rise waiting out the dwell: the lower level in force says what it waits for.
    t2 = DegradationTracker(limits, level=1, changed_at=0.0, direction=-1)  # it fell to 1 at 0 s
    high = assess(sample(cpu=77.0), limits)
    assert t2.update(high, 5.0) == 1
    assert level_reasons(high, 1, limits, since_change_s=5.0)[0] == (
        "load ratio 0.96 reaches level 3 (heavy); level 1 (light) holds until the dwell ends in 25 s")
    assert level_reasons(high, 3, limits) == high.reasons and level_reasons(None, 2, limits) == ()


def test_level_events_carry_the_level_name_and_their_reasons():
    limits = GuardLimits()
    m = GuardMonitor(limits)
    a = assess(sample(cpu=68.0), limits)  # moderate, below every warn limit
    (ev,) = [e for e in m.observe(sample(cpu=68.0), a, 2, now=0.0, at=0.0) if e.name == "BACKPRESSURE_ACTIVATED"]
    assert ev.payload == {"level": 2, "level_name": "moderate", "reasons": ["CPU at 68 % is 0.85 of its limit (80 %)"]}
    calm = assess(sample(), limits)
    (ev,) = m.observe(sample(), calm, 0, now=1.0, at=1.0)
    assert ev.name == "BACKPRESSURE_RELEASED" and ev.payload == {
        "level": 0, "level_name": "normal",
        "reasons": ["load ratio 0.14 is under 0.67 (the light edge 0.70 less the hysteresis)"]}


def test_cpu_max_percent_0_means_cpu_is_not_assessed():
    """Issue 24: a GPU box whose data loaders keep every core busy can turn the CPU out of the guard: no level,
    no reason, no event, no CPU pressure; memory still counts."""
    from p2pnode.guardcore import GuardMonitor, pressure_of

    off = GuardLimits(cpu_max_percent=0.0)
    assert validate_limits(off) == []
    a = assess(sample(cpu=100), off)
    assert a.level == 0 and a.reasons == () and pressure_of(a, 1.0).over == ()
    assert GuardMonitor(off).observe(sample(cpu=100), a, 0, now=0.0, at=0.0) == []
    assert assess(sample(cpu=100, mem=95), off).level == 4  # memory is still assessed
    assert any("(or 0: not assessed)" in e for e in validate_limits(GuardLimits(cpu_max_percent=-1.0)))
