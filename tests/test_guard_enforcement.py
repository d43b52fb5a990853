"""``p2pnode guard`` says how the local agent enforces per-job memory limits, as that agent found at its start
(issue 25): here, where the agent may create cgroups in the v1 memory hierarchy, ``cgroup v1``; with no agent,
``unknown`` and why; never assumed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agents import AgentProc, free_port

pytestmark = pytest.mark.slow


def _v1_memory_writable() -> bool:
    """Whether this host has the v1 memory controller this process may nest cgroups in (and no v2 one)."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    v2_memory = any(" - cgroup2 " in m and "memory" in (Path(m.split()[4]) / "cgroup.controllers").read_text()
                    for m in mounts if " - cgroup2 " in m and (Path(m.split()[4]) / "cgroup.controllers").exists())
    v1 = [m.split()[4] for m in mounts if " - cgroup " in m and "memory" in m.split(" - ")[1].split()[2].split(",")]
    return not v2_memory and bool(v1) and os.access(v1[0], os.W_OK)


def _guard(url: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "p2pnode", "guard", "--json", "--url", url], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["memory_enforcement"]


def test_guard_reports_the_enforcement_the_agent_found_at_start(tmp_path):
    catalog = tmp_path / "catalog.toml"
    catalog.write_text('[[job]]\nname = "big"\nkind = "selfplay"\nconfig = "c"\nargv = ["true"]\n'
                       '[job.resources]\nnum_gpus = 8\nvram_gib = 80\n')  # nothing this host can run
    agent = AgentProc(tmp_path / "a", free_port(), "--no-mdns", "--catalog", str(catalog)).start()
    try:
        agent.wait_ready()
        found = agent.get("/guard")["memory_enforcement"]
        assert found["mode"] in ("cgroup v1", "cgroup v2", "watchdog") and found["why"]
        if _v1_memory_writable():
            assert found["mode"] == "cgroup v1" and "/p2pnode-jobs/" in found["base"]
        assert _guard(agent.url) == found
        text = subprocess.run([sys.executable, "-m", "p2pnode", "guard", "--url", agent.url], capture_output=True,
                              text=True, timeout=60).stdout
        assert f"Per-job memory limits: {found['mode']}" in text
        # Issue 38 item 5: the agent's CPU and memory windows beside this machine's own figures and PSI.
        assert f"The agent at {agent.url}: degradation level" in text and "CPU " in text and "mean of" in text
        full = json.loads(subprocess.run([sys.executable, "-m", "p2pnode", "guard", "--json", "--url", agent.url],
                                         capture_output=True, text=True, timeout=60).stdout)
        cpu = full["agent"]["signals"]["cpu"]
        assert cpu["window_s"] == 10.0 and cpu["basis"] == "window" and 0 <= cpu["sample_percent"] <= 100
        assert set(full["assessment"]["signals"]) == {"cpu", "memory"} and "pressure_stall" in full
    finally:
        agent.stop()
    gone = _guard(agent.url)
    assert gone["mode"] == "unknown" and "no agent answers" in gone["why"]


@pytest.mark.parametrize("body, says", [
    (b'{"memory_enforcement": {"mode": "cgroup v9", "why": "x"}}', "no enforcement this client reads"),
    (b'{"memory_enforcement": {"mode": "watchdog", "why": "a\\u0007b"}}', "no enforcement this client reads"),
    (b'{"memory_enforcement": {"mode": "watchdog", "why": "' + b"x" * 600 + b'"}}', "no enforcement"),
    (b"[1, 2", "no enforcement this client reads"),
    (b'{"memory_enforcement": ', "no enforcement this client reads"),
    (b'{"pad": "' + b"x" * (2 << 20) + b'"}', "more than 1048576 bytes"),
])
def test_a_hostile_answer_reads_as_unknown_never_as_a_mode(body, says):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from p2pnode.cli._guard import _memory_enforcement

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass  # the client stopped reading past its bound

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        found = _memory_enforcement(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert found["mode"] == "unknown" and says in found["why"], found
