"""Levels from windows, not samples (issue 38 item 5), in virtual time: the guard's CPU and memory windows
(:class:`p2pnode.guardcore.LoadWindows`) with the degradation tracker, one sample a second; the PSI decoder and
the choice of PSI files (pure)."""

from __future__ import annotations

import math

import pytest

from p2pnode.guardcore import (
    MAX_WINDOW_SAMPLES,
    DegradationTracker,
    GuardLimits,
    LoadWindow,
    LoadWindows,
    assess,
    pressure_of,
    validate_limits,
)
from p2pnode.resources import (
    MAX_PSI_BYTES,
    PressureStall,
    StallRejected,
    cgroup2_mount,
    decode_stall,
    in_container,
    pressure_dir,
    pressure_files,
)


def _sample(cpu: float = 5.0, mem: float = 30.0, disk: float = 20.0) -> dict:
    return {"cpu_percent": cpu, "mem_percent": mem, "disk_percent": disk, "gpus": []}


class Node:
    """A guard in virtual time: windows, assessment, tracker, one sample per ``step``."""

    def __init__(self, limits: GuardLimits | None = None) -> None:
        self.limits = limits or GuardLimits()
        self.windows = LoadWindows(self.limits)
        self.tracker = DegradationTracker(self.limits)
        self.now = 0.0
        self.assessment = None

    def step(self, psi: PressureStall | None = None, **sample: float) -> int:
        wire = _sample(**sample)
        signals = self.windows.observe(wire, self.now, psi)
        self.assessment = assess(self.windows.windowed(wire, signals), self.limits, signals)
        level = self.tracker.update(self.assessment, self.now)
        self.now += 1.0
        return level

    def run(self, seconds: int, **sample: float) -> list[int]:
        return [self.step(**sample) for _ in range(seconds)]


def test_a_two_second_spike_at_100_percent_leaves_the_level_at_0():
    node = Node()
    levels = node.run(30, cpu=5.0) + node.run(2, cpu=100.0) + node.run(30, cpu=5.0)
    assert set(levels) == {0}, levels
    assert max(a for a in [node.assessment.ratio]) < 0.70
    # The spike's samples were seen: the window's mean rose by about 100 x 2 / 10 points, under the first edge.
    node2 = Node()
    node2.run(30, cpu=5.0)
    node2.run(2, cpu=100.0)
    cpu = next(s for s in node2.assessment.signals if s.resource == "cpu")
    assert cpu.sample_percent == 100.0 and 20.0 < cpu.window_percent < 30.0 and cpu.basis == "window"
    assert pressure_of(node2.assessment, node2.now).over == ()  # no CPU pressure either: nothing is shed


def test_the_hog_2_s_of_every_10_never_raises_the_level():
    node = Node()
    levels = []
    for _ in range(12):  # two minutes of the bench's hog, from the start
        levels += node.run(2, cpu=100.0) + node.run(8, cpu=10.0)
    assert set(levels) == {0}, levels


def test_15_s_at_100_percent_raises_the_level_within_the_window():
    node = Node()
    node.run(30, cpu=5.0)
    levels = node.run(15, cpu=100.0)
    assert levels[-1] == 4
    first_critical = levels.index(4) + 1  # seconds of load before level 4
    assert first_critical <= node.limits.cpu_window_s, levels
    assert levels[0] == 0  # one saturated second moves nothing
    a = node.assessment
    assert any(r.startswith("CPU (10 s mean) at 100 % is at or above its limit (80 %)") for r in a.reasons), a.reasons
    over = pressure_of(a, node.now).of("cpu")
    assert over is not None and str(over) == "CPU (10 s mean) at 100 % >= its limit 80 %"


def test_a_burst_at_start_is_a_spike_like_any_other():
    """The agent's own start (or a script's first look) at 100 %: the part of the window not yet sampled counts as
    idle, so 3 s of it raise nothing, and 100 % sustained from the start still reaches critical within the
    window."""
    node = Node()
    assert node.run(3, cpu=100.0) == [0, 0, 0]
    cpu = node.assessment.signals[0]
    assert cpu.window_percent == 100.0 and cpu.covered == 0.2 and cpu.label == "CPU (10 s mean, 2 s sampled)"
    levels = node.run(12, cpu=100.0)
    assert 4 in levels and 3 + levels.index(4) + 1 <= node.limits.cpu_window_s, levels
    assert node.assessment.signals[0].label == "CPU (10 s mean)"


def test_memory_at_95_percent_raises_the_level_at_once():
    node = Node()
    node.run(30, mem=30.0)
    assert node.step(mem=95.0) == 4
    mem = next(s for s in node.assessment.signals if s.resource == "memory")
    assert mem.basis == "sample" and mem.assessed_percent == 95.0
    assert any(r.startswith("Memory at 95 % is at or above its limit") for r in node.assessment.reasons)
    assert str(pressure_of(node.assessment, node.now).of("memory")) == "memory at 95 % >= its limit 80 %"


def test_memory_below_its_limit_counts_over_its_short_window():
    node = Node()
    node.run(10, mem=30.0)
    node.step(mem=76.0)  # ratio 0.95 alone: level 3; over 3 s of samples (30, 30, 76): 45 %, level 0
    mem = next(s for s in node.assessment.signals if s.resource == "memory")
    assert node.assessment.level == 0 and mem.basis == "window" and math.isclose(mem.assessed_percent, 136 / 3)
    node.run(3, mem=76.0)
    assert node.assessment.level == 3


def test_disk_rises_to_critical_at_once():
    node = Node()
    node.run(10)
    assert node.step(disk=75.0) == 4


def test_a_window_of_0_s_is_each_sample_alone():
    node = Node(GuardLimits(cpu_window_s=0.0))
    node.run(10, cpu=5.0)
    assert node.step(cpu=100.0) == 4
    cpu = next(s for s in node.assessment.signals if s.resource == "cpu")
    assert cpu.basis == "sample" and cpu.samples == 1 and cpu.label == "CPU"


def test_the_window_is_bounded_and_forgets_old_samples():
    w = LoadWindow(10.0)
    for i in range(3 * MAX_WINDOW_SAMPLES):
        w.add(i * 0.001, 50.0)  # far more samples than fit, all within the window
    assert w.count(3 * MAX_WINDOW_SAMPLES * 0.001) == MAX_WINDOW_SAMPLES
    w.add(100.0, 10.0)
    assert w.count(100.0) == 1 and w.mean(100.0) == 10.0
    assert w.mean(500.0) == 10.0  # no sample in the window (the sampler stalled): the newest stands
    assert LoadWindow(10.0).mean(0.0) is None


def test_psi_is_shown_beside_the_window_and_never_moves_the_level():
    heavy = PressureStall(cpu=decode_stall(b"some avg10=95.00 avg60=90.00 avg300=50.00 total=1\n"),
                          memory=decode_stall(b"some avg10=80.00 avg60=1.00 avg300=1.00 total=9\n"
                                              b"full avg10=70.00 avg60=1.00 avg300=1.00 total=5\n"),
                          source="/proc/pressure")
    node = Node()
    levels = [node.step(psi=heavy, cpu=5.0) for _ in range(20)]
    assert set(levels) == {0}
    cpu, mem = node.assessment.signals
    assert (cpu.psi_some, mem.psi_full) == (95.0, 70.0)
    shown = node.assessment.to_dict()["signals"]
    assert shown["cpu"]["psi_some_avg10"] == 95.0 and shown["cpu"]["psi_moves_level"] is False


def test_window_settings_are_validated():
    assert validate_limits(GuardLimits()) == []
    assert any("guard.cpu_window_s" in e for e in validate_limits(GuardLimits(cpu_window_s=-1.0)))
    assert any("guard.cpu_window_s" in e for e in validate_limits(GuardLimits(cpu_window_s=float("nan"))))
    assert any("guard.memory_window_s" in e for e in validate_limits(GuardLimits(memory_window_s=61.0)))


def test_a_window_holds_every_sample_taken_in_it_or_the_config_is_refused(tmp_path):
    """``cpu_window_s / agent.sample_interval_s`` at most MAX_WINDOW_SAMPLES: a longer window would keep only its
    newest 4096 samples and assess a shorter span than it says."""
    from p2pnode.config import ConfigError, load_config

    over = {"agent": {"data_dir": str(tmp_path), "sample_interval_s": 0.1}, "guard": {"cpu_window_s": 600.0}}
    with pytest.raises(ConfigError, match=r"guard.cpu_window_s 600 s over agent.sample_interval_s 0.1 s is 6000"):
        load_config(None, env={}, overrides=over)
    over["agent"]["sample_interval_s"] = 600.0 / MAX_WINDOW_SAMPLES
    assert load_config(None, env={}, overrides=over).guard.cpu_window_s == 600.0


# -- PSI ---------------------------------------------------------------------------------------------------------
GOOD = b"some avg10=1.53 avg60=0.87 avg300=0.31 total=20118745\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def test_psi_decodes_a_good_file():
    r = decode_stall(GOOD)
    assert (r.some.avg10, r.some.avg60, r.some.avg300, r.some.total) == (1.53, 0.87, 0.31, 20118745)
    assert r.full is not None and r.full.avg10 == 0.0
    assert decode_stall(GOOD.split(b"\n")[0]).full is None  # CPU on a kernel before 5.13: no 'full' line


@pytest.mark.parametrize("data, reason", [
    (b"some avg10=1.53 avg60=0.87", "truncated"),
    (b"some avg10=1.53 avg60=0.87 avg300=0.31 tot", "garbage"),
    (b"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", "truncated"),
    (b"", "truncated"),
    (b"\x00\xff\xfe garbage", "not_text"),
    (b"hello world", "garbage"),
    (b"some avg10=x avg60=0.87 avg300=0.31 total=1", "garbage"),
    (b"some avg10=1 avg60=1 avg300=1 total=1 Extra=2", "garbage"),  # a field name not as the kernel writes them
    (b"some avg10=1_0.0 avg60=0 avg300=0 total=1", "garbage"),  # float() takes underscores; the decoder does not
    (b"some avg10=1 avg60=0 avg300=0 total=1_000", "garbage"),
    (b"some avg10=1e1 avg60=0 avg300=0 total=1", "out_of_range"),
    (b"some avg10=1 avg10=1 avg60=1 avg300=1 total=1", "garbage"),
    (b"some avg10=1 avg60=1 avg300=1 total=1\nsome avg10=1 avg60=1 avg300=1 total=1", "duplicate"),
    (b"some avg10=NaN avg60=0.87 avg300=0.31 total=1", "out_of_range"),
    (b"some avg10=nan avg60=inf avg300=0.31 total=1", "out_of_range"),
    (b"some avg10=1e400 avg60=0.87 avg300=0.31 total=1", "out_of_range"),
    (b"some avg10=100.5 avg60=0.87 avg300=0.31 total=1", "out_of_range"),
    (b"some avg10=-1 avg60=0.87 avg300=0.31 total=1", "out_of_range"),
    (b"some avg10=1 avg60=0.87 avg300=0.31 total=" + b"9" * 40, "out_of_range"),
    (b"some avg10=1 avg60=0.87 avg300=0.31 total=-5", "out_of_range"),
    (b"some avg10=1 avg60=0.87 avg300=0.31 total=1.5", "garbage"),
    (GOOD * 20, "too_long"),
])
def test_psi_rejects_bad_files_with_a_reason(data, reason):
    with pytest.raises(StallRejected) as info:
        decode_stall(data)
    assert info.value.reason == reason, info.value


def test_psi_never_raises_anything_else_on_random_bytes():
    import random

    rng = random.Random(38)
    alphabet = b"someful avg1036=.0123456789total\n \x00\xffeE+-naNinf"
    for _ in range(3000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, MAX_PSI_BYTES + 40)))
        try:
            decode_stall(data)
        except StallRejected:
            pass


def test_the_cgroup_path_choice():
    mounts_v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\nproc /proc proc rw 0 0\n"
    mounts_hybrid = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    assert cgroup2_mount(mounts_v2) == "/sys/fs/cgroup"
    assert cgroup2_mount(mounts_hybrid) == "/sys/fs/cgroup/unified"
    assert cgroup2_mount("proc /proc proc rw 0 0\n") is None
    own = "12:memory:/docker/abc\n0::/docker/abc\n"
    files = {"/sys/fs/cgroup/docker/abc/cpu.pressure", "/sys/fs/cgroup/cpu.pressure",
             "/sys/fs/cgroup/unified/cpu.pressure"}
    exists = files.__contains__
    # Outside a container: the host's /proc/pressure, whatever the cgroup.
    assert pressure_dir(in_container=False, proc_self_cgroup=own, cgroup2_mount="/sys/fs/cgroup",
                        exists=exists) == "/proc/pressure"
    # Inside one: the container's own cgroup (from /proc/self/cgroup) under the cgroup2 mount.
    assert pressure_dir(in_container=True, proc_self_cgroup=own, cgroup2_mount="/sys/fs/cgroup",
                        exists=exists) == "/sys/fs/cgroup/docker/abc"
    # With a cgroup namespace ("0::/") or a path not mounted inside: the mount's root, the container's cgroup.
    assert pressure_dir(in_container=True, proc_self_cgroup="0::/\n", cgroup2_mount="/sys/fs/cgroup",
                        exists=exists) == "/sys/fs/cgroup"
    assert pressure_dir(in_container=True, proc_self_cgroup="0::/kubepods/pod1/c2\n",
                        cgroup2_mount="/sys/fs/cgroup/unified", exists=exists) == "/sys/fs/cgroup/unified"
    # No cgroup v2, or no PSI in it: /proc/pressure (the host's, which the source then names).
    assert pressure_dir(in_container=True, proc_self_cgroup=own, cgroup2_mount=None, exists=exists) == "/proc/pressure"
    assert pressure_dir(in_container=True, proc_self_cgroup=own, cgroup2_mount="/elsewhere",
                        exists=exists) == "/proc/pressure"
    # A path that tries to climb out is not followed.
    assert pressure_dir(in_container=True, proc_self_cgroup="0::/../../etc\n", cgroup2_mount="/sys/fs/cgroup",
                        exists=exists) == "/sys/fs/cgroup"
    assert pressure_files("/proc/pressure")["cpu"] == "/proc/pressure/cpu"
    assert pressure_files("/sys/fs/cgroup/docker/abc")["memory"] == "/sys/fs/cgroup/docker/abc/memory.pressure"
    assert in_container(env={}, exists=lambda p: p == "/.dockerenv")
    assert in_container(env={"container": "podman"}, exists=lambda p: False)
    assert not in_container(env={}, exists=lambda p: False)


def test_the_sampler_counts_rejected_psi_files(tmp_path):
    from p2pnode.probes import ResourceSampler, open_gpu_source

    (tmp_path / "cpu").write_bytes(GOOD)
    (tmp_path / "memory").write_bytes(b"some avg10=NaN avg60=0 avg300=0 total=0\n")
    files = {"cpu": str(tmp_path / "cpu"), "memory": str(tmp_path / "memory"), "io": str(tmp_path / "missing")}
    sampler = ResourceSampler(tmp_path, open_gpu_source(None), psi=files)
    s = sampler.sample()
    assert s.psi is not None and s.psi.avg10("cpu", "some") == 1.53 and s.psi.memory is None and s.psi.io is None
    assert s.psi.source == str(tmp_path)
    assert dict(sampler.psi_rejected) == {"out_of_range": 1, "unreadable": 1}
    assert "psi" not in s.to_wire()  # PSI stays on this node
    assert ResourceSampler(tmp_path, open_gpu_source(None), psi={}).sample().psi is None


def test_psi_files_chosen_once_leave_out_the_missing_ones(monkeypatch):
    """A cgroup without the memory controller has no ``memory.pressure``: the file set leaves it out, so it is not
    counted ``unreadable`` at every sample."""
    from p2pnode.probes._sampler import psi_files

    monkeypatch.delenv("container", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    there = {"/proc/pressure/cpu", "/proc/pressure/io"}
    assert psi_files(exists=there.__contains__) == {"cpu": "/proc/pressure/cpu", "io": "/proc/pressure/io"}
    assert psi_files(exists=lambda p: False) == {}


def test_psi_ignores_a_field_a_later_kernel_adds():
    s = decode_stall(b"some avg10=1.00 avg60=0.00 avg300=0.00 total=5 avg1=2.0\n")
    assert s.some.avg10 == 1.0 and s.some.total == 5


def _quiet(node: Node, seconds: int = 60, **sample: float) -> None:
    node.run(seconds, **sample)


def test_a_sustained_load_reaches_its_level_within_the_window():
    """CPU at 77 % of an 80 % limit (ratio 0.96, level 3): the mean ramps through levels 1 and 2, and each step of
    that one rise follows at once (the dwell holds only a change of direction)."""
    node = Node()
    _quiet(node, cpu=5.0)
    levels = node.run(15, cpu=77.0)
    assert levels[-1] == 3 and levels.index(3) + 1 <= node.limits.cpu_window_s, levels
    assert levels == sorted(levels)  # one rise: never down on the way


def test_memory_stepping_up_is_not_held_at_level_1_by_the_dwell():
    node = Node()
    _quiet(node, mem=30.0)
    levels = node.run(6, mem=77.0)  # ratio 0.96 over the 3 s memory window
    assert levels[-1] == 3 and levels.index(3) + 1 <= node.limits.memory_window_s, levels


def test_the_level_falls_within_the_window_once_a_long_overload_ends():
    """After 60 s at 100 % (the rise long past the dwell) the mean falls over the window and the level follows it
    down step by step at once: level 0 within cpu_window_s of the load's end (it was 32 s when the dwell held
    every step)."""
    node = Node()
    _quiet(node, cpu=5.0)
    assert node.run(60, cpu=100.0)[-1] == 4
    down = node.run(30, cpu=5.0)
    assert down.index(0) + 1 <= node.limits.cpu_window_s, down
    assert down == sorted(down, reverse=True)


def test_a_fall_soon_after_a_rise_waits_out_the_dwell():
    """A 9 s burst raises the level; it falls again only once the dwell since the rise has passed, then straight
    to the level the ratio allows."""
    node = Node()
    _quiet(node, cpu=5.0)
    up = node.run(9, cpu=100.0)
    assert max(up) == 4
    rose_at = node.tracker.changed_at
    down = node.run(40, cpu=5.0)
    fell = [i for i in range(1, len(down)) if down[i] < down[i - 1]]
    assert fell and node.now - 40 + fell[0] - rose_at >= node.limits.dwell_s, (up, down)
    assert down[fell[0]] == 0  # straight down: the ratio allows 0 by then


def test_a_nan_sample_is_dropped_and_counted_not_hiding_an_overload():
    node = Node()
    _quiet(node, cpu=5.0)
    node.step(cpu=math.nan)
    assert node.windows.cpu.dropped == 1 and math.isfinite(node.assessment.signals[0].assessed_percent)
    levels = node.run(9, cpu=100.0)
    assert max(levels) == 4, levels


def test_an_inf_or_out_of_range_sample_never_enters_the_window():
    node = Node()
    node.step(mem=math.inf)
    node.step(mem=30.0)
    mem = node.assessment.signals[1]
    assert node.windows.memory.dropped == 1 and mem.assessed_percent == 30.0 and node.tracker.level == 0
    w = LoadWindow(10.0)
    w.add(0.0, 250.0)
    w.add(1.0, -5.0)
    assert w.mean(1.0) == 50.0 and w.dropped == 0  # clamped to 100 and 0


def test_a_one_off_assessment_without_the_start_up_discount_counts_its_sample():
    """The guard library's windows (``idle_start`` False): a first sample at 100 % is the window, level 4; the
    agent's (``idle_start``) counts the part not yet sampled as idle."""
    lib, agent = LoadWindows(GuardLimits(), idle_start=False), LoadWindows(GuardLimits())
    for w, want in ((lib, 4), (agent, 0)):
        sig = w.observe(_sample(cpu=100.0), 1000.0, None)
        assert assess(w.windowed(_sample(cpu=100.0), sig), GuardLimits(), sig).level == want
    assert lib.observe(_sample(cpu=100.0), 1000.0, None)[0].covered == 1.0


def test_the_agents_cpu_offer_reads_the_window_without_the_start_up_discount(tmp_path):
    """The start-up discount is the level's alone: the CPU offer (GuardDriver.cpu_percent) reads the mean of what
    was sampled, so an agent starting on a saturated host offers no CPU while its level is still 0."""
    import msgspec

    from p2pnode.drivers._guard import GuardDriver
    from p2pnode.probes import ResourceSampler, open_gpu_source

    clock = [0.0]
    g = GuardDriver(GuardLimits(), node_id="n", data_dir=tmp_path, now=lambda: clock[0], on_news=lambda: None)
    real = ResourceSampler(tmp_path, open_gpu_source(None), psi={}).sample()
    for t in range(3):
        clock[0] = float(t)
        g.check(msgspec.structs.replace(real, cpu_percent=100.0, mem_percent=10.0, disk_percent=10.0))
    assert g.level == 0 and g.assessment.used_percent("cpu") == pytest.approx(20.0)  # 2 s of 10 sampled
    assert g.cpu_percent() == 100.0
    assert g.view()["windows"]["dropped_samples"] == {"cpu": 0, "memory": 0}
