"""An interruption notice end to end on a real agent (issue 41, item 3): the operator's probe (a local script,
``[agent] interruption_probe``) starts reporting a notice; the agent publishes it in its snapshot, sends its
training the checkpoint signal, stops it under the ``notice`` rule once the new checkpoint is written (no durable
member here: the local one ends the hold, counted ``local``), admits no new work, and counts the probe's runs.
Waits are on conditions with deadlines, never fixed sleeps; no network but the agent's own loopback."""

from __future__ import annotations

import sys

import trio

from p2pnode.agent import Agent
from p2pnode.config import load_config

JOB = """import os, pathlib, signal, sys, time
d, log = os.environ["P2PNODE_CHECKPOINT_DIR"], sys.argv[1]
def note(w):
    with open(log, "a") as f: f.write(w + "\\n")
def usr1(*a):
    pathlib.Path(d, "ckpt-9.pt.tmp").write_bytes(b"x" * 100)
    os.rename(os.path.join(d, "ckpt-9.pt.tmp"), os.path.join(d, "ckpt-9.pt"))
    note("U")
def term(*a):
    note("T")
    sys.exit(0)
signal.signal(signal.SIGUSR1, usr1)
signal.signal(signal.SIGTERM, term)
note("R")
while True: time.sleep(0.05)
"""
PROBE = """import os, sys
if os.path.exists(sys.argv[1]):
    print('{"notice": true, "deadline_s": 600, "reason": "test spot"}')
else:
    print('{"notice": false}')
"""
CATALOG = """
[[job]]
name = "train"
kind = "training"
config = "c"
argv = ["{python}", "{job}", "{log}"]
max_concurrency = 1
[job.resources]
num_gpus = 1
vram_gib = 8
[job.checkpoint]
dir = "ck/{{config}}"
signal = "SIGUSR1"
grace_s = 60
"""


async def _until(pred, timeout=60):
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.05)


async def test_a_probe_notice_stops_the_training_after_its_checkpoint_and_is_published(tmp_path):
    py, log, flag = sys.executable, tmp_path / "job.log", tmp_path / "noticed"
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "catalog.toml").write_text(CATALOG.format(python=py, job=tmp_path / "job.py", log=log))
    cfg = load_config(None, env={}, overrides={
        "agent": {"data_dir": tmp_path / "d", "port": 0, "catalog": str(tmp_path / "catalog.toml"),
                  "fake_gpus": "1xA100", "sample_interval_s": 0.3,
                  "interruption_probe": f"{py} {tmp_path / 'probe.py'} {flag}",
                  "interruption_probe_interval_s": 0.2, "interruption_probe_timeout_s": 20},
        "discovery": {"mdns": False},
        "scheduler": {"interval_s": 1.0, "stop_grace_s": 1.0}})
    agent = Agent(cfg)
    async with trio.open_nursery() as n:
        await n.start(agent.run)
        jc = agent.jobs
        probes = jc.stops.notices.core.counts
        await _until(lambda: log.exists() and "R" in log.read_text())
        await _until(lambda: probes["ok"] >= 1)  # the probe runs, and says nothing yet
        assert agent.build_snapshot(10**6).jobs.notice_deadline_ms is None
        (job_id,) = list(jc.runner.jobs)
        flag.touch()
        await _until(lambda: job_id not in jc.runner.jobs)
        snap = agent.build_snapshot(10**6 + 1)
        assert snap.jobs.notice_deadline_ms is not None and snap.jobs.notice_reason == "test spot"
        assert jc.inputs().cordoned  # no new work here
        n.cancel_scope.cancel()
    assert log.read_text().split() == ["R", "U", "T"]  # the signal, its checkpoint, then the stop
    assert jc.stops.warnings.counts == {"signalled": 1, "confirmed": 0, "local": 1, "deadline": 0}
    assert jc.stops.rules.counts["notice"] == 1
    row = next(r for r in jc.history.recent(10) if r["job_id"] == job_id)
    assert row["rule"] == "notice" and row["reason"].startswith("interruption notice (test spot): node gone in")
    assert probes["notice"] >= 1 and probes["malformed"] == probes["failed"] == 0
