"""The NVML boundary, tested with a fake pynvml-like library."""

from types import SimpleNamespace

import pytest

from p2pnode.errors import ConfigError
from p2pnode.probes import NvmlGpus, ResourceSampler, open_gpu_source
from p2pnode.resources import FakeGpus, NoGpus, parse_fake_gpus

GIB = 1024**3


class FakeNvmlError(Exception):
    pass


class FakeNvml:
    """Two devices; the second does not report power (raises NVMLError, as some boards do)."""

    NVMLError = FakeNvmlError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices=None, *, init_error=None):
        self.devices = devices if devices is not None else [
            dict(name=b"NVIDIA H100 80GB HBM3", uuid=b"GPU-aaa", util=37, used=10 * GIB, total=80 * GIB,
                 temp=55, mw=312_500),
            dict(name="NVIDIA GeForce RTX 4090", uuid="GPU-bbb", util=3, used=1 * GIB, total=24 * GIB,
                 temp=41, mw=None),
        ]
        self.init_error = init_error
        self.shutdown_called = False

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.devices[h]["name"]

    def nvmlDeviceGetUUID(self, h):
        return self.devices[h]["uuid"]

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.devices[h]["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        d = self.devices[h]
        return SimpleNamespace(used=d["used"], total=d["total"], free=d["total"] - d["used"])

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self.devices[h]["temp"]

    def nvmlDeviceGetPowerUsage(self, h):
        if self.devices[h]["mw"] is None:
            raise FakeNvmlError("Not Supported")
        return self.devices[h]["mw"]


def test_two_nvml_gpus_map_to_snapshot_fields(tmp_path):
    lib = FakeNvml()
    source = open_gpu_source(None, lib=lib)
    assert isinstance(source, NvmlGpus)
    sample = ResourceSampler(tmp_path, source).sample()
    assert sample.gpu_source == "nvml" and sample.gpu_absent_reason is None
    g0, g1 = sample.to_wire()["gpus"]
    assert g0 == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-aaa",
        "util_percent": 37.0,
        "mem_used_bytes": 10 * GIB,
        "mem_total_bytes": 80 * GIB,
        "temperature_c": 55.0,
        "power_w": 312.5,
    }
    assert g1["name"] == "NVIDIA GeForce RTX 4090" and g1["uuid"] == "GPU-bbb"
    assert g1["power_w"] is None and g1["mem_used_bytes"] == GIB
    assert sample.power_score == 2000 + 330
    assert sample.vram_total_bytes == 104 * GIB
    source.close()
    assert lib.shutdown_called


def test_nvml_absent_says_why():
    source = open_gpu_source(None, lib=FakeNvml(init_error=FakeNvmlError("NVML Shared Library Not Found")))
    assert isinstance(source, NoGpus)
    assert source.read() == []
    assert "NVML Shared Library Not Found" in source.absent_reason


def test_real_nvml_absent_on_this_machine_gives_reason(tmp_path):
    source = open_gpu_source(None)
    sample = ResourceSampler(tmp_path, source).sample()
    if sample.gpu_source == "nvml":
        pytest.skip("this machine has NVML")
    assert sample.gpus == () and sample.gpu_absent_reason
    assert sample.power_score == 0


def test_nvml_with_zero_devices():
    source = open_gpu_source(None, lib=FakeNvml(devices=[]))
    assert source.read() == [] and source.absent_reason == "NVML found no GPUs"


def test_fake_gpu_spec():
    models = parse_fake_gpus("2xH100, RTX 4090")
    assert [m.nvml_name for m in models] == ["NVIDIA H100 80GB HBM3"] * 2 + ["NVIDIA GeForce RTX 4090"]
    with pytest.raises(ConfigError, match="unknown GPU model 'Voodoo 5'"):
        parse_fake_gpus("H100,Voodoo 5")
    with pytest.raises(ConfigError):
        parse_fake_gpus(" , ")


def test_fake_gpus_read_and_load(tmp_path):
    fake = open_gpu_source("H200,RTX 3060", seed="node-a")
    assert isinstance(fake, FakeGpus)
    r = fake.read()
    assert [g.mem_total_bytes for g in r] == [141 * GIB, 12 * GIB]
    assert all(g.util_percent == 0.0 and g.mem_used_bytes == 0 for g in r)
    fake.set_load(1, util_percent=150, mem_used_bytes=99 * GIB)
    g = fake.read()[1]
    assert g.util_percent == 100.0 and g.mem_used_bytes == 12 * GIB
    other = open_gpu_source("H200,RTX 3060", seed="node-b")
    assert {g.uuid for g in r}.isdisjoint({g.uuid for g in other.read()})
    sample = ResourceSampler(tmp_path, fake).sample()
    assert sample.gpu_source == "fake" and sample.power_score == 2500 + 51


def test_a_held_fake_gpu_load_adds_to_the_jobs_load():
    from p2pnode.resources import parse_fake_gpu_load

    fake = open_gpu_source("2xH100")
    index, util, mem = parse_fake_gpu_load("0=100/90")
    fake.hold(index, util_percent=util, mem_percent=mem)
    g0, g1 = fake.read()
    assert (g0.util_percent, g0.mem_used_bytes) == (100.0, int(80 * GIB * 0.9)) and g1.util_percent == 0.0
    fake.set_load(0, util_percent=0.0, mem_used_bytes=0)  # the jobs leave: the held load stays
    assert fake.read()[0].util_percent == 100.0
    fake.set_load(0, util_percent=50.0, mem_used_bytes=40 * GIB)  # a job on top: clamped to the GPU
    assert fake.read()[0].util_percent == 100.0 and fake.read()[0].mem_used_bytes == 80 * GIB
    fake.hold(1, util_percent=30.0)
    assert fake.read()[1].util_percent == 30.0 and fake.read()[1].mem_used_bytes == 0
    for bad in ("x=1", "0=101", "-1=5", "0=50/200", "0"):
        with pytest.raises(ConfigError):
            parse_fake_gpu_load(bad)


def test_a_host_without_the_nvml_library_never_imports_pynvml():
    """On a GPU-less host the reason comes from probing ``libnvidia-ml.so.1``; pynvml (1.3 MiB) stays unloaded."""
    import ctypes
    import subprocess
    import sys

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("this machine has the NVML library")
    except OSError:
        pass
    code = ("import sys; from p2pnode.probes import open_gpu_source; s = open_gpu_source(None); "
            "print(type(s).__name__, 'pynvml' in sys.modules, s.absent_reason)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("NoGpus False NVML unavailable: libnvidia-ml.so.1 not found"), out
