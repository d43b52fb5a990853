"""SIGTERM to an agent whose training's checkpoint reaches the durable node slowly (issue 41, acceptance line 2;
``p2pnode._agentclose``), real agents on loopback: one durable node without a GPU (the only voter: the leader), two
ephemeral nodes with a fake GPU whose sync signs a checkpoint only after a 2.5 s settle time (so a durable replica
confirms the signalled checkpoint well after the 1.8 s the CLI used to allow for the whole stop). The node running
the training gets SIGTERM: the job gets SIGUSR1 and writes a checkpoint; the node publishes a notice (reason
``agent stop``) while its stop is held; the durable node holds that checkpoint before the job gets SIGTERM; the agent
exits 0; the training runs again on the other ephemeral node from exactly that checkpoint; never two at once.
The training, catalog and settings are ``tests/test_notice_agents.py``'s. Every wait is on a condition."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import pytest
from agents import AgentProc, free_port, wait_until
from test_notice_agents import CATALOG, ENV, TRAIN, events, trainings

from p2pnode.synccore import decode_signed_checkpoint

pytestmark = pytest.mark.slow

SETTLE_S = 2.5
"""The ephemeral nodes' ``sync.settle_s``: a checkpoint is signed (and can be confirmed) this long after it is
written at the earliest."""


def _held(durable: AgentProc) -> dict[str, float]:
    """Checkpoint name -> when the durable node came to hold it whole (its signed file's mtime, wall-clock)."""
    out = {}
    for p in (durable.data_dir / ".sync" / "held-checkpoints").glob("*.ck"):
        with contextlib.suppress(Exception):
            _, body = decode_signed_checkpoint(p.read_bytes())
            out[body.name] = p.stat().st_mtime
    return out


def test_sigterm_holds_the_stop_until_the_durable_node_holds_the_signalled_checkpoint(tmp_path):
    train, log = tmp_path / "train.py", tmp_path / "events.log"
    train.write_text(TRAIN)
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG.replace("TRAIN", str(train)).replace("LOG", str(log)))
    env = {**os.environ, **ENV}
    d = AgentProc(tmp_path / "durable", free_port(), "--no-mdns", "--catalog", str(cat), "--tag", "durable",
                  "--tag", "voter", env=env).start()
    procs = [d]
    try:
        d.wait_ready()
        for name in ("e1", "e2"):
            procs.append(AgentProc(tmp_path / name, free_port(), "--no-mdns", "--catalog", str(cat), "--tag",
                                   "ephemeral", "--fake-gpus", "RTX 4090", "--join", f"127.0.0.1:{d.port}",
                                   env={**env, "P2PNODE_SYNC_SETTLE_S": str(SETTLE_S)}).start())
        for p in procs[1:]:
            p.wait_ready()
        eph = dict(zip(("e1", "e2"), procs[1:], strict=True))

        def running_on():
            on = [(n, t) for n, p in eph.items() if p.proc.poll() is None for t in trainings(p)]
            assert len(on) <= 1, f"two trainings of the config at once: {on}"
            return on[0] if on and on[0][1].get("pid") else None

        name, job = wait_until(running_on, 120, interval=0.5, what="the training running on an ephemeral node")
        first = eph[name]
        first_id = first.status()["node"]["id"]
        ck_dir = first.data_dir / "data" / "ck" / "c"
        wait_until(lambda: (ck_dir / "step-000003").exists(), 60, what="a few periodic checkpoints")
        t_sig = time.time()
        first.proc.send_signal(signal.SIGTERM)
        usr1 = wait_until(lambda: next((e for e in events(log) if e["event"] == "usr1"), None), 60,
                          interval=0.2, what="the checkpoint signal")
        noticed = wait_until(lambda: first.status()["snapshot"]["jobs"].get("notice_reason"), 30, interval=0.2,
                             what="the notice of the agent's stop in its snapshot")
        assert noticed == "agent stop"
        term = wait_until(lambda: next((e for e in events(log) if e["event"] == "term"), None), 90,
                          interval=0.2, what="the stop after the checkpoint")
        first.proc.wait(30)
        assert first.proc.returncode == 0
        assert usr1["job"] == term["job"] == job["job_id"] and term["step"] == usr1["step"]
        ck = f"step-{usr1['step']:06d}"
        held = _held(d)
        assert ck in held and held[ck] <= term["t"], (held, usr1, term)  # the durable node held it first
        assert term["t"] - t_sig > 1.8, (t_sig, term)  # past the CLI's old bound (holds on the old code too)

        def left():
            m = {m["id"]: m for m in d.status()["members"]}.get(first_id)
            return m is not None and m["state"] == "left"

        # The leave ran after the hold and the job's exit: the durable node heard `left`, not a silence (a CLI bound
        # that ends before the jobs' exit loses it: review M2; tests/test_ckwarn_driver.py has the discriminating
        # case, a job slow to exit after a hold that runs to its bound). The code before the hold fails above: its
        # agent exited 1.8 s after SIGTERM, its notice never seen (checked against 20ae554).
        wait_until(left, 10, interval=0.2, what="the durable node hearing the stopped node leave")

        def resumed():
            running_on()
            return next((e for e in events(log) if e["event"] == "start" and e["job"] != job["job_id"]), None)

        again = wait_until(resumed, 180, interval=0.5, what="the training running again on the other node")
        assert again["resume"] and again["step"] == usr1["step"], (usr1, again)  # exactly the signalled checkpoint
        print(f"FIGURES sigterm_to_usr1_s={usr1['t'] - t_sig:.1f} held_s={held[ck] - t_sig:.1f} "
              f"sigterm_to_term_s={term['t'] - t_sig:.1f} term_to_resume_s={again['t'] - term['t']:.1f}")
    finally:
        for p in procs:
            p.kill()
        for pid in {e["pid"] for e in events(log)}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
