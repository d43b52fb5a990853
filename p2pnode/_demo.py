"""``p2pnode demo``: a whole cluster on this machine, in one command.

Starts ``--nodes`` agents (5 by default) on 127.0.0.1, consecutive HTTP ports from ``--base-port`` (8770) and their
data-channel ports after them (8775-8779; 0: any free ports), with fake GPUs
(H200, H100, A100, RTX 4090, RTX 3060, repeated beyond five), the demo catalog shipped in the package
(``p2pnode/_demo_catalog``, a link to ``deploy/examples/demo``), two nodes tagged ``durable`` and one ``ephemeral``,
mDNS off (the agents join the first one by address: nothing multicasts on the host's networks) and a data dir each
under one temporary directory. It prints the dashboard URL and what to try, then waits. On SIGINT (Ctrl-C), SIGTERM
or SIGHUP it stops every agent with SIGTERM (an agent stops its own jobs), then makes sure that no process it
started is left, jobs included, by PID: the agents' children and every process working in the demo's directory
(jobs of an agent the user killed with ``kill -9`` too) get SIGTERM, then SIGKILL; then it removes the directory
(unless ``--keep``). A second signal skips the grace periods.

The agents run in their own sessions (Ctrl-C reaches the demo only, which stops them in order) and get SIGTERM
from the kernel should the demo itself die (``PR_SET_PDEATHSIG``).

With ``--scaling`` the first three nodes are also tagged ``voter`` and every agent reads a ``[scaling]`` table
(:func:`scaling_config`): the ``local`` provider, class ``1x3060`` (0-2 nodes, fake RTX 3060, tagged
``ephemeral``), short cooldown and idle timeout. The leader starts extra agents for waiting work (detached, in
``<dir>/scaling-local``) and removes them once idle; Ctrl-C stops them too (every process working in that
directory).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.resources
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["DEMO_PROFILES", "run_demo"]

DEMO_PROFILES = ("H200", "H100", "A100", "RTX 4090", "RTX 3060")
"""Fake GPU of node ``i``: ``DEMO_PROFILES[i % 5]``."""
READY_TIMEOUT_S = 60.0
"""Seconds the demo waits for every agent to answer ``/status`` before it gives up (and cleans up)."""
AGENT_STOP_TIMEOUT_S = 15.0
"""Seconds an agent gets after SIGTERM (it stops its jobs within the scheduler's 10 s grace) before SIGKILL."""
JOB_STOP_TIMEOUT_S = 3.0
"""Seconds a job left behind gets after SIGTERM to its process group before SIGKILL."""
_PR_SET_PDEATHSIG = 1


class DemoNode(msgspec.Struct):
    """One agent of the demo: its name, fake GPU, tags, port, data dir, log and process."""

    name: str
    gpu: str
    tags: tuple[str, ...]
    port: int
    data_dir: Path
    log: Path
    proc: subprocess.Popen | None = None
    exit_reported: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class _Signals(msgspec.Struct):
    received: list[int] = msgspec.field(default_factory=list)

    def __call__(self, signum: int, frame: Any) -> None:
        self.received.append(signum)


def demo_tags(i: int, n: int, scaling: bool = False) -> tuple[str, ...]:
    """Nodes 0 and 1 keep replicas (durable); the last of three or more pushes its data (ephemeral); with
    ``scaling`` the first three are voters too (scaling holds where no member is tagged ``voter``)."""
    voter = ("voter",) if scaling and i < 3 else ()
    if i < 2:
        return ("durable", *voter)
    if i == n - 1 and n >= 3 and not voter:
        return ("ephemeral",)
    return voter


SCALING_CLASS = "1x3060"


def scaling_config(root: Path, gossip_profile: str) -> str:
    """The demo's ``[scaling]`` config (TOML) for the agents in ``root``, also the config of the agents the
    ``local`` provider starts (their gossip profile and CPU assessment as the demo's)."""
    return f"""# p2pnode demo --scaling
[gossip]
profile = "{gossip_profile}"

[guard]
cpu_max_percent = 0

[scaling]
provider = "local"
cooldown_s = 20
up_after_s = 10
idle_timeout_s = 60
max_step = 2
local_dir = "{root / 'scaling-local'}"
local_config = "{root / 'scaling.toml'}"

[scaling.classes."{SCALING_CLASS}"]
min_nodes = 0
max_nodes = 2
price_per_hour = 0.2
fake_gpus = "RTX 3060"
tags = ["ephemeral"]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _agent_env(gossip_profile: str) -> dict[str, str]:
    """The shell's environment without its ``P2PNODE_*`` settings (a token, a config file, an advertised address
    would break a loopback demo), plus what several agents on one host need.

    The agents do not assess CPU (``guard.cpu_max_percent`` 0): five simulated machines share this host's CPUs,
    so the host's load is no one node's, and on a busy host (a build, a second demo) every node would sit at
    degradation level 4 and run nothing. Memory and disk are still assessed. Loopback addresses are dialed
    (``agent.allow_private_advertise``): every agent advertises 127.0.0.1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PNODE_")}
    env.update({
        "PYTHONUNBUFFERED": "1",
        "P2PNODE_GOSSIP_PROFILE": gossip_profile,
        "P2PNODE_CPU_MAX_PERCENT": "0",  # the host's CPU is shared by every simulated node: not assessed
        "P2PNODE_ALLOW_PRIVATE_ADVERTISE": "1",  # the agents advertise 127.0.0.1: loopback peers must be dialed
    })
    return env


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def _status(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    import httpx

    try:
        resp = httpx.get(f"{url}/status", timeout=timeout, trust_env=False)
        return resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _process_key(pid: int) -> tuple[int, float] | None:
    import psutil

    try:
        return pid, psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(key: tuple[int, float]) -> bool:
    import psutil

    try:
        p = psutil.Process(key[0])
        return p.create_time() == key[1] and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _processes_of(nodes: list[DemoNode], root: Path) -> set[tuple[int, float]]:
    """``(pid, create time)`` of every process the demo started, but the agents: their descendants (jobs), and
    every job whose working directory and ``P2PNODE_DATA_DIR`` lie in ``root`` (jobs run in their node's data dir;
    this finds the jobs of an agent killed with SIGKILL, whose parent is gone)."""
    import psutil

    found: set[tuple[int, float]] = set()
    agents = {n.proc.pid for n in nodes if n.proc is not None}
    for pid in agents:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    found.add((child.pid, child.create_time()))
    me = os.getpid()
    prefix = str(root) + os.sep
    scaled = str(root / "scaling-local") + os.sep
    for p in psutil.process_iter(["cwd", "create_time"]):
        cwd = p.info.get("cwd")
        if p.pid == me or p.pid in agents or not cwd or not (cwd + os.sep).startswith(prefix):
            continue
        if (cwd + os.sep).startswith(scaled):  # an agent the local provider started (it runs in its data dir)
            found.add((p.pid, p.info["create_time"]))
            continue
        with contextlib.suppress(psutil.Error):  # a job (the runner sets its data dir), not a shell cd'd there
            if (p.environ().get("P2PNODE_DATA_DIR", "") + os.sep).startswith(prefix):
                found.add((p.pid, p.info["create_time"]))
    return found


def _signal_group(key: tuple[int, float], sig: int) -> None:
    """``sig`` to the process group a job leads (jobs run in their own sessions), else to the process."""
    if not _alive(key):
        return
    pid = key[0]
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


class Demo:
    """The demo's processes and directory; :meth:`start`, :meth:`wait`, :meth:`stop` (see the module docstring)."""

    def __init__(self, *, nodes: int, base_port: int, keep: bool, gossip_profile: str, scaling: bool = False) -> None:
        self.n = nodes
        self.scaling = scaling
        self.base_port = base_port
        self.keep = keep
        self.gossip_profile = gossip_profile
        self.signals = _Signals()
        self.root: Path | None = None
        self.nodes: list[DemoNode] = []
        self._catalog_ctx: Any = None

    def ports(self) -> tuple[list[int], list[int]]:
        """Each agent's HTTP port and data-channel port: with ``--base-port B``, HTTP ports ``B`` .. ``B+n-1`` and
        data ports ``B+n`` .. ``B+2n-1`` (all checked free, so a firewall rule or a second demo can plan on them);
        with 0, any free ports (the data port chosen by each agent). Raises ``OSError`` naming a taken port."""
        if self.base_port == 0:
            return [_free_port() for _ in range(self.n)], [0] * self.n
        ports = list(range(self.base_port, self.base_port + 2 * self.n))
        taken = [p for p in ports if not _port_free(p)]
        if taken:
            raise OSError(f"port {taken[0]} on 127.0.0.1 is in use (an agent running? choose another --base-port, "
                          "or --base-port 0 for any free ports)")
        return ports[:self.n], ports[self.n:]

    def start(self) -> None:
        ports, data_ports = self.ports()
        self.root = Path(tempfile.mkdtemp(prefix="p2pnode-demo-"))
        self._catalog_ctx = importlib.resources.as_file(
            importlib.resources.files("p2pnode").joinpath("_demo_catalog", "catalog.toml"))
        catalog = self._catalog_ctx.__enter__()
        env = _agent_env(self.gossip_profile)
        config: list[str] = []
        if self.scaling:
            (self.root / "scaling.toml").write_text(scaling_config(self.root, self.gossip_profile))
            config = ["--config", str(self.root / "scaling.toml")]
        for i, port in enumerate(ports):
            node = DemoNode(name=f"n{i}", gpu=DEMO_PROFILES[i % len(DEMO_PROFILES)],
                            tags=demo_tags(i, self.n, self.scaling),
                            port=port, data_dir=self.root / f"n{i}", log=self.root / f"n{i}.log")
            args = [sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(node.data_dir),
                    "--bind", "127.0.0.1", "--port", str(port), "--no-mdns", "--fake-gpus", node.gpu,
                    "--catalog", str(catalog), *config]
            for tag in node.tags:
                args += ["--tag", tag]
            if i:
                args += ["--join", f"127.0.0.1:{ports[0]}"]
            node.data_dir.mkdir()
            with open(node.log, "ab") as log:
                node.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                             env={**env, "P2PNODE_SYNC_DATA_PORT": str(data_ports[i])},
                                             start_new_session=True, preexec_fn=_die_with_parent)
            self.nodes.append(node)

    def wait_ready(self) -> bool:
        """Until every agent answers ``/status``; False when one exits first, the time runs out or a signal came."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = list(self.nodes)
        while pending:
            if self.signals.received:
                return False
            for node in list(pending):
                if node.proc is not None and node.proc.poll() is not None:
                    _say(f"p2pnode demo: agent {node.name} exited with status {node.proc.returncode}; its log:")
                    _say(node.log.read_text(errors="replace")[-2000:])
                    return False
                if _status(node.url, timeout=1.0) is not None:
                    pending.remove(node)
            if time.monotonic() > deadline:
                _say(f"p2pnode demo: {', '.join(n.name for n in pending)} not answering after "
                     f"{READY_TIMEOUT_S:g} s (logs in {self.root})")
                return False
            time.sleep(0.3)
        return True

    def banner(self) -> None:
        first, last = self.nodes[0], self.nodes[-1]
        _say(f"p2pnode demo: {self.n} agents on 127.0.0.1, gossip profile {self.gossip_profile}, no mDNS, "
             f"data and logs in {self.root}")
        _say()
        _say(f"  {'node':<5} {'GPU':<9} {'tags':<10} {'URL':<24} pid")
        for node in self.nodes:
            pid = node.proc.pid if node.proc is not None else "-"
            _say(f"  {node.name:<5} {node.gpu:<9} {','.join(node.tags) or '-':<10} {node.url:<24} {pid}")
        _say()
        _say(f"Dashboard:  {first.url}/")
        _say()
        _say("Try, in another terminal:")
        url = "" if first.port == 8770 else f" --url {first.url}"
        tries = [(f"p2pnode status{url} --watch", "members, leader, cluster totals, jobs per member"),
                 (f"p2pnode jobs{url}", "running, pending and refused work, with reasons")]
        if len(self.nodes) >= 3:
            tries.append((f"p2pnode sync status --url {last.url}", "what the ephemeral node pushes to durable ones"))
        if self.scaling:
            tries.append((f"p2pnode status{url}", f"scaling: the leader's verdicts; up to 2 extra {SCALING_CLASS} "
                          "agents start for waiting work and go once idle"))
        if first.proc is not None:
            tries.append((f"kill {first.proc.pid}", f"stop {first.name} ({first.gpu}, the likely leader): it turns "
                          "suspect, then dead, and another node leads in a higher term"))
        width = max(len(cmd) for cmd, _ in tries)
        for cmd, what in tries:
            _say(f"  {cmd:<{width}}   {what}")
        _say()
        _say("Ctrl-C stops every agent and job and removes the data" + (" (kept: --keep)." if self.keep else "."))

    def watch(self, t0: float) -> None:
        """Report once when the cluster is whole (members, a leader, running jobs) and whenever an agent exits;
        return on a signal."""
        ready_reported = False
        while not self.signals.received:
            if not ready_reported and self.nodes and self.nodes[0].proc is not None \
                    and self.nodes[0].proc.poll() is None:
                ready_reported = self._report_ready(t0)
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None and not node.exit_reported:
                    node.exit_reported = True
                    _say(f"p2pnode demo: {node.name} ({node.gpu}, pid {node.proc.pid}) exited with status "
                         f"{node.proc.returncode}; the others go on (Ctrl-C ends the demo)")
            time.sleep(0.5 if not ready_reported else 1.0)

    def _report_ready(self, t0: float) -> bool:
        data = _status(self.nodes[0].url)
        if data is None:
            return False
        alive = [m for m in data.get("members", []) if m.get("state") == "alive"]
        leader = (data.get("election") or {}).get("leader")
        if len(alive) < self.n or not leader:
            return False
        import httpx

        try:
            jobs = httpx.get(f"{self.nodes[0].url}/jobs", timeout=2, trust_env=False).json()
        except (httpx.HTTPError, ValueError):
            return False
        running = sum((jobs.get("running_counts") or {}).values())
        if not running:
            return False
        by_id = {m["id"]: m for m in alive}
        gpu = _gpu_name(by_id.get(leader, {}))
        _say(f"p2pnode demo: after {time.monotonic() - t0:.1f} s: {len(alive)} members alive, leader {leader} "
             f"({gpu}), {running} job{'s' if running != 1 else ''} running")
        return True

    def stop(self) -> list[str]:
        """Stop every agent and job (by PID) and remove the directory unless ``keep``; returns what was left
        behind (PIDs that survived SIGKILL), normally nothing."""
        hurry = len(self.signals.received) > 1
        jobs = _processes_of(self.nodes, self.root) if self.root else set()
        agents = [(n, _process_key(n.proc.pid)) for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for _node, key in agents:
            if key is not None:
                _signal_group(key, signal.SIGKILL if hurry else signal.SIGTERM)
        deadline = time.monotonic() + AGENT_STOP_TIMEOUT_S
        for node in self.nodes:
            if node.proc is None:
                continue
            while node.proc.poll() is None and time.monotonic() < deadline:
                if len(self.signals.received) > 1:  # another Ctrl-C: no more waiting
                    deadline = 0.0
                time.sleep(0.05)
            if node.proc.poll() is None:
                node.proc.kill()
            node.proc.wait()
        jobs |= _processes_of(self.nodes, self.root) if self.root else set()
        left = [k for k in jobs if _alive(k)]
        for key in left:
            _signal_group(key, signal.SIGTERM)
        deadline = time.monotonic() + (0 if len(self.signals.received) > 1 else JOB_STOP_TIMEOUT_S)
        while any(_alive(k) for k in left) and time.monotonic() < deadline:
            time.sleep(0.05)
        for key in left:
            _signal_group(key, signal.SIGKILL)
        time.sleep(0.05)
        survivors = [str(k[0]) for k in left if _alive(k)]
        if self._catalog_ctx is not None:
            self._catalog_ctx.__exit__(None, None, None)
        if self.root is not None:
            if self.keep:
                _say(f"p2pnode demo: stopped; data and logs kept in {self.root}")
            else:
                shutil.rmtree(self.root, ignore_errors=True)
                _say(f"p2pnode demo: stopped {len(self.nodes)} agents"
                     + (f" and {len(jobs)} job processes" if jobs else "") + f"; removed {self.root}")
        return survivors


def _gpu_name(member: dict[str, Any]) -> str:
    gpus = (member.get("resources") or {}).get("gpus") or []
    return str(gpus[0].get("name", "?")) if gpus else "no GPU"


def run_demo(*, nodes: int = 5, base_port: int = 8770, keep: bool = False, gossip_profile: str = "lan",
             scaling: bool = False) -> int:
    """Run the demo until SIGINT, SIGTERM or SIGHUP (see the module docstring); returns the exit status."""
    if nodes < 1 or nodes > 64:
        print("p2pnode demo: --nodes must be between 1 and 64", file=sys.stderr)
        return 2
    if not 0 <= base_port <= 65535 - 2 * nodes + 1:
        print("p2pnode demo: --base-port must leave room for two ports per node (HTTP, data channel)",
              file=sys.stderr)
        return 2
    demo = Demo(nodes=nodes, base_port=base_port, keep=keep, gossip_profile=gossip_profile, scaling=scaling)
    previous = {s: signal.signal(s, demo.signals) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    status = 0
    try:
        t0 = time.monotonic()
        try:
            demo.start()
        except OSError as exc:
            print(f"p2pnode demo: {exc}", file=sys.stderr)
            return 2
        if demo.wait_ready():
            demo.banner()
            demo.watch(t0)
        elif not demo.signals.received:
            status = 1
    finally:
        survivors = demo.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if survivors:
        print(f"p2pnode demo: processes still running after SIGKILL: {', '.join(survivors)}", file=sys.stderr)
        return 1
    return status
