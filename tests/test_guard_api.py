"""The guard library API on this machine and on a small real file system; async parts under trio and asyncio."""

import asyncio

import msgspec
import pytest
import trio
from fs import SmallFs

from p2pnode import guard
from p2pnode.guard import (
    AsyncResourceLimiter,
    GuardLimits,
    OperationPriority,
    ResourceGuard,
    ResourceUnavailable,
    _api,
    can_proceed,
    check_disk_space,
    check_gpu_memory,
    check_memory,
    get_degradation_level,
    get_recommended_actions,
    get_resource_status,
    require_resources,
    respect_resource_limits,
    should_proceed_with_priority,
)


@pytest.fixture
def small_fs(tmp_path, monkeypatch):
    """A small real file system; the host's CPU is not assessed (``cpu_max_percent`` 0): these tests are about the
    disk, and the suite runs beside another on a busy machine."""
    monkeypatch.setattr(_api, "_LIMITS", GuardLimits(cpu_max_percent=0.0))
    fs = SmallFs(tmp_path / "fs")
    try:
        yield fs
    finally:
        fs.close()


@pytest.fixture
def fake_gpus(monkeypatch):
    monkeypatch.setenv("P2PNODE_FAKE_GPUS", "H100,RTX 3060")
    monkeypatch.setattr(_api._Probe, "_sampler", None)
    yield
    monkeypatch.setattr(_api._Probe, "_sampler", None)


def _meminfo(key):
    for line in open("/proc/meminfo"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def test_status_matches_proc_and_df(tmp_path):
    st = get_resource_status(tmp_path)
    s = st["sample"]
    assert s["mem_total_bytes"] == _meminfo("MemTotal")
    assert abs(s["mem_available_bytes"] - _meminfo("MemAvailable")) < 256 * 2**20
    import os

    assert s["cpu_count"] == os.cpu_count()
    stv = os.statvfs(tmp_path)
    assert s["disk_total_bytes"] == stv.f_blocks * stv.f_frsize
    assert set(st["assessment"]["resources"]) >= {"cpu", "memory", "disk"}


def test_disk_checks_on_a_small_file_system(small_fs):
    small_fs.fill_to(30)
    assert check_disk_space(1 / 1024, small_fs.path)  # 1 MiB fits below 70 %
    assert not check_disk_space(8 / 1024, small_fs.path)  # 8 MiB of 16 would pass 70 %
    assert get_degradation_level(small_fs.path) == 0
    small_fs.fill_to(72)
    assert get_degradation_level(small_fs.path) == 4
    assert not should_proceed_with_priority(OperationPriority.HIGH, small_fs.path)
    assert should_proceed_with_priority(OperationPriority.CRITICAL, small_fs.path)
    assert any(a.startswith("Disk at 7") and "archive old games" in a for a in get_recommended_actions(small_fs.path))
    with pytest.raises(ResourceUnavailable) as info:
        require_resources(disk_gb=0.001, path=small_fs.path)
    assert info.value.resource == "disk" and "GiB free within the 70 % limit" in str(info.value)
    with ResourceGuard(disk_required_gb=0.001, path=small_fs.path) as g:
        assert not g.ok and g.problems[0].resource == "disk"
    assert not can_proceed(path=small_fs.path)  # even with nothing required: over the disk limit


def test_memory_and_gpu_checks(fake_gpus):
    assert check_memory(0.5)
    assert not check_memory(10**6)
    assert check_gpu_memory(60) and check_gpu_memory(60, device=0)  # H100: 64 GiB room within 80 %
    assert not check_gpu_memory(60, device=1)  # RTX 3060: 12 GiB
    with pytest.raises(ResourceUnavailable, match="gpu: need 70 GiB on any GPU"):
        require_resources(gpu_gb=70)


def test_no_gpu_means_gpu_checks_fail(monkeypatch):
    monkeypatch.delenv("P2PNODE_FAKE_GPUS", raising=False)
    monkeypatch.setattr(_api._Probe, "_sampler", None)
    if _api._Probe.sample().gpus:
        pytest.skip("this machine has GPUs")
    assert not check_gpu_memory(0.1)
    with pytest.raises(ResourceUnavailable, match="NVML"):
        require_resources(gpu_gb=1)


def test_limits_come_from_env(monkeypatch):
    monkeypatch.setenv("P2PNODE_MAX_DISK_PERCENT", "68")
    assert _api._load_limits().disk_max_percent == 68.0
    assert guard.LIMITS.cpu_max_percent == 80.0


async def _limiter_roundtrip(sleep):
    ok = AsyncResourceLimiter(mem_required_gb=0.1, max_concurrent=1, poll_interval_s=0.01)
    async with ok.acquire("a"):
        assert ok.active == ["a"]
    assert ok.active == []
    never = AsyncResourceLimiter(mem_required_gb=10**6, poll_interval_s=0.01, timeout_s=0.2)
    with pytest.raises(ResourceUnavailable, match="memory"):
        async with never.acquire("huge"):
            pass

    @respect_resource_limits(mem_gb=0.1, poll_interval_s=0.01)
    async def work(x):
        await sleep(0)
        return x * 2

    @respect_resource_limits(mem_gb=10**6, poll_interval_s=0.01, timeout_s=0.1)
    async def impossible():
        return 1

    assert await work(21) == 42
    with pytest.raises(ResourceUnavailable):
        await impossible()
    return True


async def test_async_limiter_and_decorator_under_trio():
    assert await _limiter_roundtrip(trio.sleep)


def test_async_limiter_and_decorator_under_asyncio():
    assert asyncio.run(_limiter_roundtrip(asyncio.sleep))


def test_limiter_bounds_concurrency_under_trio():
    async def main():
        lim = AsyncResourceLimiter(mem_required_gb=0.01, max_concurrent=2, poll_interval_s=0.01)
        peak = 0

        async def job(i):
            nonlocal peak
            async with lim.acquire(f"j{i}"):
                peak = max(peak, len(lim.active))
                await trio.sleep(0.5)

        async with trio.open_nursery() as n:
            for i in range(5):
                n.start_soon(job, i)
        return peak

    assert trio.run(main) == 2


def test_sync_decorator_waits_then_raises():
    calls = []

    @respect_resource_limits(mem_gb=0.1, poll_interval_s=0.01)
    def fine(x):
        calls.append(x)
        return x

    @respect_resource_limits(mem_gb=10**6, poll_interval_s=0.01, timeout_s=0.05)
    def never():
        calls.append("never")

    assert fine(3) == 3
    with pytest.raises(ResourceUnavailable, match="memory: need"):
        never()
    assert calls == [3]


def test_wait_for_resources(monkeypatch, tmp_path):
    """On injected samples: ``wait_for_resources`` asks for NORMAL priority, so the degradation level counts,
    CPU included, and the host's own CPU (busy while the suite runs beside another) must not decide the test."""
    import time as _time

    samples = [_calm(tmp_path)]
    monkeypatch.setattr(_api._Probe, "sample", staticmethod(lambda path=None: samples[-1]))
    monkeypatch.setattr(_api, "_LIMITS", None)
    assert guard.wait_for_resources(timeout=1, interval=0.01, mem_required_gb=0.01)
    t0 = _time.monotonic()
    assert not guard.wait_for_resources(timeout=0.2, interval=0.05, mem_required_gb=10**6)
    assert 0.2 <= _time.monotonic() - t0 < 30.0  # waited its timeout, and gave up (a busy host may be slow)
    samples.append(_calm(tmp_path, cpu_percent=100.0))  # CPU past its 80 % limit, for one sample
    # Over the 10 s CPU window (the agent's default) one saturated sample beside a calm one is a spike: it passes.
    assert guard.wait_for_resources(timeout=0.1, interval=0.02, mem_required_gb=0.01)
    assert _api.get_resource_status()["assessment"]["signals"]["cpu"]["sample_percent"] == 100.0
    monkeypatch.setenv("P2PNODE_CPU_WINDOW_S", "0")  # each sample alone: the level admits no NORMAL work
    monkeypatch.setattr(_api, "_LIMITS", None)
    assert not guard.wait_for_resources(timeout=0.1, interval=0.02, mem_required_gb=0.01)
    assert guard.wait_for_resources(timeout=0.1, interval=0.02, mem_required_gb=0.01, priority=None)


def test_disk_room_counts_only_what_an_unprivileged_process_can_fill(monkeypatch, tmp_path):
    # A file system of 1,000 GiB with 300 GiB used and only 78 GiB available to us (the rest reserved for root,
    # or by quotas): room within the 70 % limit is 70 % of used + available, less used: none at all here.
    from p2pnode.probes import ResourceSampler, open_gpu_source

    gib = 2**30
    real = ResourceSampler(tmp_path, open_gpu_source(None)).sample()
    fake = msgspec.structs.replace(real, disk_total_bytes=1000 * gib, disk_used_bytes=300 * gib,
                               disk_free_bytes=78 * gib, disk_percent=100.0 * 300 / 378)
    monkeypatch.setattr(_api._Probe, "sample", staticmethod(lambda path=None: fake))
    monkeypatch.setenv("P2PNODE_MAX_DISK_PERCENT", "90")
    monkeypatch.setattr(_api, "_LIMITS", None)  # read again, with the 90 % above
    assert not check_disk_space(100)  # 100 GiB more than the 78 available: never yes
    assert check_disk_space(30)  # 90 % of 378 GiB is 340: 40 GiB of room
    assert not check_disk_space(45)


def _calm(tmp_path, **changes):
    """This machine's real sample (its memory and disk sizes) made calm: CPU 1 %, memory and disk 10 % used."""
    from p2pnode.probes import ResourceSampler, open_gpu_source

    real = ResourceSampler(tmp_path, open_gpu_source(None)).sample()
    mem, disk = real.mem_total_bytes, real.disk_total_bytes
    calm = dict(cpu_percent=1.0, mem_percent=10.0, mem_used_bytes=mem // 10, disk_percent=10.0,
                disk_used_bytes=disk // 10, disk_free_bytes=disk - disk // 10)
    return msgspec.structs.replace(real, **{**calm, **changes})


@pytest.fixture
def no_gpus(monkeypatch, tmp_path):
    """This machine as a host without GPUs (whatever it has), calm, so that only the GPU request can fail."""
    bare = _calm(tmp_path, gpus=(), gpu_source="none", gpu_absent_reason="NVML: no NVIDIA driver")
    monkeypatch.setattr(_api._Probe, "sample", staticmethod(lambda path=None: bare))
    monkeypatch.setattr(_api, "_LIMITS", None)


def test_gpu_waits_on_a_host_without_gpus_answer_at_once(no_gpus):
    """Issue 24 item 5: no GPU can ever satisfy a GPU request on a GPU-less host, so every waiting call answers
    at once with the reason instead of polling until its timeout (or forever)."""
    import time as _time

    async def limiter():
        never = AsyncResourceLimiter(gpu_required_gb=1.0, poll_interval_s=30.0)  # no timeout: it used to wait forever
        with trio.fail_after(15):
            async with never.acquire("train"):
                pytest.fail("acquired a GPU on a host without one")

    with pytest.raises(ResourceUnavailable, match="NVML: no NVIDIA driver: no wait can satisfy it") as info:
        trio.run(limiter)
    assert info.value.resource == "gpu" and info.value.permanent

    @respect_resource_limits(gpu_gb=1.0, timeout_s=30.0, poll_interval_s=30.0)
    def work():
        pytest.fail("ran without a GPU")

    t0 = _time.monotonic()
    with pytest.raises(ResourceUnavailable, match="gpu: need 1 GiB on any GPU"):
        work()
    assert not guard.wait_for_resources(timeout=30.0, interval=30.0, check_gpu=True, gpu_required_gb=1.0)
    assert _time.monotonic() - t0 < 15.0  # both answered long before their first poll interval (30 s)
    assert not check_gpu_memory(0.1) and not can_proceed(check_gpu=True, gpu_required_gb=0.1)
    assert can_proceed(gpu_required_gb=0.1)  # not asked to check the GPU: nothing stands in the way


def test_a_gpu_request_no_gpu_here_can_hold_answers_at_once(fake_gpus):
    """With GPUs (H100: 64 GiB within the 80 % limit; RTX 3060: 12 GiB), a request larger than any of them
    within the limit, or for a GPU the machine lacks, is permanent too; a request that fits once memory frees
    up is not."""
    with pytest.raises(ResourceUnavailable, match="the largest holds 64.0 GiB within the 80 % limit") as info:
        require_resources(gpu_gb=70)
    assert info.value.permanent
    assert not [p for p in _api._shortfalls(_api._Probe.sample(), _api.limits(), gpu_gb=60) if p.permanent]
    (missing,) = _api._shortfalls(_api._Probe.sample(), _api.limits(), gpu_gb=1, device=5)
    assert missing.permanent and "this machine has 2 GPUs (indexes 0-1)" in str(missing)

    async def limiter():
        with trio.fail_after(2):
            async with AsyncResourceLimiter(gpu_required_gb=70, poll_interval_s=3.0).acquire("big"):
                pytest.fail("acquired 70 GiB of an 80 GiB GPU within its 80 % limit")

    with pytest.raises(ResourceUnavailable, match="no wait can satisfy it"):
        trio.run(limiter)


class _FakeCpuTimes:
    """``psutil.cpu_times()`` of a machine whose CPUs are ``busy`` (0-1) busy: each call advances 1 CPU-second of
    counters, whatever thread calls."""

    def __init__(self, busy: float) -> None:
        import threading
        from collections import namedtuple

        self.busy, self._t, self._lock = busy, 0.0, threading.Lock()
        self._type = namedtuple("scputimes", "user nice system idle iowait irq softirq steal guest guest_nice")

    def __call__(self, percpu: bool = False):
        with self._lock:
            self._t += 1.0
            t = self._t
        return self._type(t * self.busy, 0.0, 0.0, t * (1 - self.busy), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@pytest.fixture
def saturated(monkeypatch):
    """This process's guard library, fresh, on a machine at 100 % CPU (psutil's counters faked)."""
    import p2pnode.probes._sampler as smp

    monkeypatch.setattr(smp.psutil, "cpu_times", _FakeCpuTimes(1.0))
    monkeypatch.setattr(_api._Probe, "_sampler", None)
    monkeypatch.setattr(_api._Windows, "_windows", None)
    monkeypatch.setattr(_api, "_LIMITS", GuardLimits())
    yield
    monkeypatch.setattr(_api._Probe, "_sampler", None)
    monkeypatch.setattr(_api._Windows, "_windows", None)


def test_a_one_off_call_on_a_saturated_machine_refuses(saturated, monkeypatch):
    """No start-up discount in the library: a script's first look measures 0.2 s and counts it as the window."""
    assert guard.check_cpu() is False
    for fresh in ("check_cpu", "get_degradation_level", "should_proceed", "can_proceed", "wait"):
        monkeypatch.setattr(_api._Windows, "_windows", None)
        monkeypatch.setattr(_api._Probe, "_sampler", None)
        if fresh == "check_cpu":
            assert guard.check_cpu() is False
        elif fresh == "get_degradation_level":
            assert get_degradation_level() == 4
        elif fresh == "should_proceed":
            assert not should_proceed_with_priority(OperationPriority.HIGH)
        elif fresh == "can_proceed":
            assert not can_proceed(check_cpu=True, priority=None)
        else:
            assert guard.wait_for_resources(timeout=0.3, interval=0.1, check_cpu=True) is False
    status = get_resource_status()
    assert status["assessment"]["signals"]["cpu"]["covered"] == 1.0


def test_samples_on_fresh_threads_share_one_cpu_baseline(monkeypatch, tmp_path):
    """psutil's own ``cpu_percent(interval=None)`` keeps its baseline per thread: a sample on a fresh worker thread
    (anyio/trio ``to_thread``) read 0 or 100 % noise. The sampler keeps one baseline: every thread reads the load."""
    import threading

    import p2pnode.probes._sampler as smp
    from p2pnode.probes import ResourceSampler, open_gpu_source

    monkeypatch.setattr(smp.psutil, "cpu_times", _FakeCpuTimes(0.6))
    monkeypatch.setattr(smp, "MIN_CPU_SPAN_S", 0.0)
    sampler = ResourceSampler(tmp_path, open_gpu_source(None), psi={})
    got: list[float] = []
    for _ in range(4):
        t = threading.Thread(target=lambda: got.append(sampler.sample().cpu_percent))
        t.start()
        t.join()
    assert got == pytest.approx([60.0] * 4), got
    assert smp.cpu_busy_percent((5.0, 10.0), (5.0, 10.0)) is None  # no tick between: nothing measured


def test_anyio_limiter_sees_a_saturated_machine(saturated):
    """AsyncResourceLimiter samples in worker threads: on a saturated machine its CPU-checking priority waits."""

    async def main() -> None:
        limiter = AsyncResourceLimiter(priority=OperationPriority.NORMAL, poll_interval_s=0.05, timeout_s=0.5)
        with pytest.raises(ResourceUnavailable, match="degradation level 4"):
            async with limiter.acquire("x"):
                pass

    trio.run(main)


def test_signal_lines_show_a_missing_figure_as_a_dash():
    sig = {"assessed_percent": None, "window_percent": None, "sample_percent": float("nan"), "window_s": 10.0,
           "samples": 3, "basis": "window", "psi_some_avg10": None}
    (line,) = _api.signal_lines({"cpu": sig}, None)
    assert line == "CPU - %: mean of 3 samples over 10 s; newest sample - %"
