"""An interruption notice with real agents on loopback (issue 41, item 3; acceptance line 2 with a probe's notice
for the SIGTERM): one durable node without a GPU (the only voter: the leader), two ephemeral nodes with a fake GPU,
each with an interruption probe (a local script that reports a notice once a flag file exists). A training writes a
checkpoint every second until its checkpoint signal, then one more at the signal, and nothing after. The node
running it gets a notice: the job gets SIGUSR1, its checkpoint reaches the durable node (whole and verified) before
the job gets SIGTERM (the hold released ``confirmed``), and the training runs again on the other ephemeral node,
resumed from exactly that checkpoint; never two trainings of the config at once. Every wait is on a condition."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time

import httpx
import pytest
from agents import AgentProc, free_port, wait_until

pytestmark = pytest.mark.slow

TRAIN = r'''
import json, os, signal, sys, time
log, ck = sys.argv[1], os.environ["P2PNODE_CHECKPOINT_DIR"]
resume = os.environ.get("P2PNODE_RESUME_FROM", "")
step = int(open(resume).read()) if resume else 0
def note(**kw):
    with open(log, "a") as f:
        f.write(json.dumps({"job": os.environ["P2PNODE_JOB_ID"], "node": os.environ["P2PNODE_NODE_ID"],
                            "pid": os.getpid(), "t": time.time(), **kw}) + "\n")
def save():
    tmp = os.path.join(ck, ".step.tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(ck, f"step-{step:06d}"))
signalled = []
def usr1(*a):
    global step
    step += 1
    save()
    signalled.append(step)
    note(event="usr1", step=step)
def term(*a):
    note(event="term", step=step)
    sys.exit(0)
signal.signal(signal.SIGUSR1, usr1)
signal.signal(signal.SIGTERM, term)
note(event="start", resume=resume, step=step)
os.makedirs(ck, exist_ok=True)
while True:
    time.sleep(1.0)
    if not signalled:
        step += 1
        save()
'''
PROBE = r'''
import os, sys
print('{"notice": true, "deadline_s": 120, "reason": "test spot"}' if os.path.exists(sys.argv[1])
      else '{"notice": false}')
'''
CATALOG = """
[[job]]
name = "train"
kind = "training"
config = "c"
max_concurrency = 1
argv = ["{python}", "TRAIN", "LOG"]
[job.resources]
num_gpus = 1
vram_gib = 4
num_cpus = 0.1
[job.checkpoint]
dir = "ck/{config}"
signal = "SIGUSR1"
grace_s = 60
"""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_SCHEDULER_ORPHAN_GRACE_S": "3", "P2PNODE_SCHEDULER_ADOPT_GRACE_S": "5",
       "P2PNODE_SYNC_INTERVAL_S": "1", "P2PNODE_SYNC_SETTLE_S": "0.5",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100",
       "P2PNODE_INTERRUPTION_PROBE_INTERVAL_S": "0.5", "P2PNODE_INTERRUPTION_PROBE_TIMEOUT_S": "20"}


def trainings(p) -> list[dict]:
    return [j for j in p.get("/jobs")["running"] if j["template"] == "train"]


def events(log) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def metric(p, name: str, outcome: str) -> float:
    text = httpx.get(p.url + "/metrics", timeout=5.0, trust_env=False).text
    m = re.search(rf'^{name}{{outcome="{outcome}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else -1.0


def test_a_notice_checkpoints_to_the_durable_node_then_the_training_resumes_elsewhere(tmp_path):
    train, log, probe = tmp_path / "train.py", tmp_path / "events.log", tmp_path / "probe.py"
    train.write_text(TRAIN)
    probe.write_text(PROBE)
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG.replace("TRAIN", str(train)).replace("LOG", str(log)))
    env = {**os.environ, **ENV}
    d = AgentProc(tmp_path / "durable", free_port(), "--no-mdns", "--catalog", str(cat), "--tag", "durable",
                  "--tag", "voter", env=env).start()
    procs = [d]
    try:
        d.wait_ready()
        flags = {}
        for name in ("e1", "e2"):
            flags[name] = tmp_path / f"notice-{name}"
            procs.append(AgentProc(tmp_path / name, free_port(), "--no-mdns", "--catalog", str(cat), "--tag",
                                   "ephemeral", "--fake-gpus", "RTX 4090", "--join", f"127.0.0.1:{d.port}",
                                   env={**env, "P2PNODE_INTERRUPTION_PROBE":
                                        f"{sys.executable} {probe} {flags[name]}"}).start())
        for p in procs[1:]:
            p.wait_ready()
        eph = dict(zip(("e1", "e2"), procs[1:], strict=True))

        def running_on():
            on = [(n, t) for n, p in eph.items() for t in trainings(p)]
            assert len(on) <= 1, f"two trainings of the config at once: {on}"
            return on[0] if on and on[0][1].get("pid") else None

        name, job = wait_until(running_on, 120, interval=0.5, what="the training running on an ephemeral node")
        first = eph[name]
        ck_dir = first.data_dir / "data" / "ck" / "c"
        wait_until(lambda: (ck_dir / "step-000003").exists(), 60, what="a few periodic checkpoints")
        t_notice = time.time()
        flags[name].touch()  # the platform's notice, as the node's probe reads it
        usr1 = wait_until(lambda: next((e for e in events(log) if e["event"] == "usr1"), None), 60,
                          interval=0.2, what="the checkpoint signal")
        term = wait_until(lambda: next((e for e in events(log) if e["event"] == "term"), None), 90,
                          interval=0.2, what="the stop after the checkpoint")
        assert usr1["job"] == term["job"] == job["job_id"] and term["step"] == usr1["step"]
        # the hold was released by the durable node's confirmation of that checkpoint, not the local file alone
        warned = {o: metric(first, "p2pnode_checkpoint_warnings_total", o)
                  for o in ("signalled", "confirmed", "local", "deadline")}
        assert warned == {"signalled": 1.0, "confirmed": 1.0, "local": 0.0, "deadline": 0.0}, (warned, usr1, term)
        assert metric(first, "p2pnode_interruption_probes_total", "notice") >= 1.0
        assert first.status()["snapshot"]["jobs"].get("notice_reason") == "test spot"
        other_name = "e2" if name == "e1" else "e1"

        def resumed():
            running_on()
            return next((e for e in events(log) if e["event"] == "start" and e["job"] != job["job_id"]), None)

        again = wait_until(resumed, 180, interval=0.5, what="the training running again on the other node")
        assert again["resume"], f"started from nothing: {again}"
        assert again["step"] == usr1["step"], (usr1, again)  # exactly the checkpoint written at the signal
        assert again["node"] == eph[other_name].status()["node"]["id"]
        print(f"FIGURES notice_to_usr1_s={usr1['t'] - t_notice:.1f} usr1_to_term_s={term['t'] - usr1['t']:.1f} "
              f"term_to_resume_s={again['t'] - term['t']:.1f} step={usr1['step']}")
    finally:
        for p in procs:
            p.kill()
        for pid in {e["pid"] for e in events(log)}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
