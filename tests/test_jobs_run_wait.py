"""Issue 38 item 7: the README's ``p2pnode jobs run eval-hex8_2p ... --node ID`` on a node whose tier cannot take
evaluation (the demo catalog: tiers 2 and 1; an RTX 4090 is tier 3) used to return at once and wait forever,
silently. Now the CLI follows the request: on the H100 it says where it started, or why it waits (exit 0); on the
RTX 4090 it says, with the leader's reason, that it can never be placed (exit 1), and ``p2pnode jobs stop
run-<id>`` withdraws it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agents import AgentProc, free_port, wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "deploy" / "examples" / "demo" / "catalog.toml"
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}


def cli(url, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "p2pnode", *args, "--url", url], capture_output=True, text=True,
                          timeout=timeout)


def test_jobs_run_says_where_it_started_or_why_it_never_will(tmp_path):
    ports = [free_port(), free_port()]
    h100 = AgentProc(tmp_path / "h100", ports[0], "--no-mdns", "--fake-gpus", "H100", "--catalog", str(DEMO),
                     env=ENV).start()
    rtx = AgentProc(tmp_path / "rtx", ports[1], "--no-mdns", "--fake-gpus", "RTX 4090", "--catalog", str(DEMO),
                    "--join", f"127.0.0.1:{ports[0]}", env=ENV).start()
    try:
        ids = [p.wait_ready()["node"]["id"] for p in (h100, rtx)]
        wait_until(lambda: all(p.status()["election"]["leader"] for p in (h100, rtx)), 60, what="a leader")
        # The README's example, on the H100: started, or waiting for GPU room its training and selfplay hold (the
        # leader's reason, exit 0: it will run).
        ok = cli(h100.url, "jobs", "run", "eval-hex8_2p", "--param", "seconds=30", "--node", ids[0][:6], "--wait", "8")
        assert ok.returncode == 0, ok.stderr
        job_id = json.loads(ok.stdout)["job_id"]
        assert (f"{job_id} started on {ids[0]}" in ok.stderr
                or f"{job_id} waits: no node in tiers 2/1 takes it: " in ok.stderr), ok.stderr
        # On the RTX 4090 (tier 3): never; said at once, with the leader's reason, and the way to withdraw it.
        no = cli(h100.url, "jobs", "run", "eval-hex8_2p", "--param", "seconds=30", "--node", ids[1][:6])
        assert no.returncode == 1, no.stdout + no.stderr
        run = json.loads(no.stdout)["job_id"]
        assert f"{run} cannot be placed: unsatisfiable" in no.stderr, no.stderr
        assert f"withdraw it: p2pnode jobs stop {run}" in no.stderr
        assert [r["template"] for r in rtx.status()["node"]["operator"]["runs"]] == ["eval-hex8_2p"]
        out = cli(h100.url, "jobs", "stop", run)
        assert out.returncode == 0, out.stderr
        assert rtx.status()["node"]["operator"]["runs"] == []
        # --wait 0: the old behaviour (the request's id, at once)
        quick = cli(h100.url, "jobs", "run", "eval-hex8_2p", "--node", ids[0][:6], "--wait", "0")
        assert quick.returncode == 0 and json.loads(quick.stdout)["job_id"].startswith("run-") and not quick.stderr
    finally:
        for p in (h100, rtx):
            p.kill()


def test_run_state_reads_the_request_from_a_jobs_view():
    from p2pnode.cli._jobs import run_state

    req = {"id": "ab-1", "job_id": "run-ab-1"}
    assert run_state({}, "t", req) == ("unknown", "")
    pending = {"pending": [{"template": "t (run ab-1)", "reason": "no node in tiers 2/1 has a GPU with 8 GiB free"},
                           {"template": "t (run ab-2)", "reason": "unsatisfiable: other"}]}
    assert run_state(pending, "t", req) == ("pending", "no node in tiers 2/1 has a GPU with 8 GiB free")
    never = {"pending": [{"template": "t (run ab-1)", "reason": "unsatisfiable: no node carries tag x"}]}
    assert run_state(never, "t", req) == ("unsatisfiable", "unsatisfiable: no node carries tag x")
    refused = {**never, "refused": [{"job_id": "run-ab-1", "node_id": "n2", "reason": "node cordoned"}]}
    assert run_state(refused, "t", req) == ("refused", "n2: node cordoned")
    started = {**refused, "cluster_running": [{"job_id": "run-ab-1", "node_id": "n3"}]}
    assert run_state(started, "t", req) == ("started", "n3")  # what runs wins over an older pending entry
    ended = {"node_id": "n4", "history": [{"job_id": "run-ab-1"}]}
    assert run_state(ended, "t", req) == ("started", "n4")  # ran here and ended already
