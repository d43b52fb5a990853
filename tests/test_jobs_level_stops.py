"""Load shedding end to end (kubelet's node-pressure eviction; each step is tested in virtual time in
test_job_core.py): a real agent runs a training job and three selfplay jobs as real processes; its resource
sampler (the /proc boundary) reports CPU, then memory, over the limit. The selfplay jobs stop one at a time,
lowest priority first, the training job keeps running under CPU pressure, and memory pressure stops it last,
each with the reason in the job history."""

from __future__ import annotations

import sys

import msgspec
import trio

from p2pnode.agent import Agent
from p2pnode.config import load_config

CATALOG = """
[policy]
priorities = { training = "high", selfplay = "normal" }

[[job]]
name = "train"
kind = "training"
config = "c"
argv = ["{python}", "-c", "import time; time.sleep(600)"]
max_concurrency = 1
[job.resources]
num_gpus = 1
vram_gib = 8
num_cpus = 0.25
"""
SELFPLAY = """
[[job]]
name = "{name}"
kind = "selfplay"
config = "c"
argv = ["{python}", "-c", "import time; time.sleep(600)"]
priority = {priority}
max_concurrency = 1
[job.resources]
num_gpus = 1
vram_gib = 8
num_cpus = 0.25
"""


class Pressing:
    """The agent's sampler with CPU and memory percent overridden (None: as measured). CPU starts at a quiet 5 %:
    the test must not depend on this host's own load (the suite runs beside another)."""

    def __init__(self, sampler):
        self.inner, self.cpu, self.mem = sampler.sample, 5.0, None

    def __call__(self):
        s = self.inner()
        if self.cpu is not None:
            s = msgspec.structs.replace(s, cpu_percent=self.cpu)
        if self.mem is not None:
            s = msgspec.structs.replace(s, mem_percent=self.mem)
        return s


async def test_pressure_sheds_selfplay_one_at_a_time_and_stops_training_last(tmp_path):
    py = sys.executable
    text = CATALOG.replace("{python}", py) + "".join(
        SELFPLAY.replace("{name}", n).replace("{priority}", str(p)).replace("{python}", py)
        for n, p in (("sp_low", 20), ("sp_mid", 50), ("sp_high", 80)))
    (tmp_path / "catalog.toml").write_text(text)
    cfg = load_config(None, env={}, overrides={
        "agent": {"data_dir": tmp_path / "d", "port": 0, "catalog": str(tmp_path / "catalog.toml"),
                  "fake_gpus": "4xA100", "sample_interval_s": 0.3},
        "discovery": {"mdns": False},
        # A CPU window of one sample (0.3 s): the test is about the shedding order, not how long the window is.
        "guard": {"dwell_s": 1.0, "check_interval_s": 0.5, "cpu_window_s": 0.3},
        "scheduler": {"interval_s": 1.0, "stop_grace_s": 1.0}})
    agent = Agent(cfg)
    pressing = Pressing(agent.sampler)
    agent.sampler.sample = pressing
    seen: list[frozenset[str]] = []  # each distinct set of running templates, in order

    def running() -> frozenset[str]:
        now = frozenset(j.template.name for j in agent.jobs.runner.jobs.values() if j.stopping is None)
        if not seen or seen[-1] != now:
            seen.append(now)
        return now

    async with trio.open_nursery() as n:
        await n.start(agent.run)
        everything = {"train", "sp_low", "sp_mid", "sp_high"}
        with trio.fail_after(60):
            while running() != everything:
                await trio.sleep(0.05)
        start = len(seen) - 1
        pressing.cpu = 98.0
        with trio.fail_after(60):
            while running() != {"train"}:
                await trio.sleep(0.02)
        cpu_seen = seen[start:]
        pressing.cpu, pressing.mem = 5.0, 95.0
        with trio.fail_after(60):
            while running():
                await trio.sleep(0.05)
        n.cancel_scope.cancel()
    # One at a time, lowest priority first; training untouched by CPU pressure.
    assert cpu_seen == [frozenset(everything), frozenset({"train", "sp_mid", "sp_high"}),
                        frozenset({"train", "sp_high"}), frozenset({"train"})], cpu_seen
    history = {r["template"]: r["reason"] for r in agent.jobs.history.recent(50)}
    for name in ("sp_low", "sp_mid", "sp_high"):
        assert "load shed: CPU (0.3 s mean) at 98 % >= its limit 80 %" in history[name], history
    assert "load shed: memory at 95 % >= its limit 80 %" in history["train"], history
