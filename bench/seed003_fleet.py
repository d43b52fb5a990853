"""Seed 003's fleet under real load (issue 38, first acceptance line): six agents in network namespaces, the example
catalog ``deploy/examples/catalog.toml`` unchanged, every scheduler and guard setting default. Samples the agents'
HTTP APIs about once a second (the H200's ``/jobs``; the voters' ``/status`` for the leader; the leader's
``/members``, ``/jobs`` (``cluster_running``) and ``/plan`` (assignments, pending reasons); every node's own
``/status`` snapshot for its offer, level and full GPUs) and reports:

1. the share of samples (once a leader exists) in which the durable H200 runs a training (its own running list),
   what it ran before the first leader, and where trainings ran (sample counts per node and template);
2. per GPU of every node: committed VRAM (the sum of ``vram_gib`` of the running jobs holding it) over its usable
   VRAM (VRAM x the guard's ``gpu_max_percent``, 80 %), min and mean over the samples after ``--warmup``, per node
   (and the VRAM most often committed per GPU: the issue's "16 of 24 GiB" on the 4090s); and the same over the
   GPU-samples in which the GPU holds work or a waiting template could use it (an empty GPU that nothing waiting
   fits has nothing to commit: counted apart);
3. stranding: samples after the warm-up in which a GPU had a usable remainder (usable VRAM less committed, and the
   fraction) that a GPU template pending in that sample could take (its tiers, its VRAM with its floor, its
   fraction), and those in which such a remainder had been free for at least 10 s (two plan intervals);
4. the pending reasons of every plan, each checked once against an independent recomputation of the planner's
   accounting at the end of that plan, from the facts **that plan version was computed from**: the leader serves
   them with the plan (``GET /plan?inputs=1``: per member its offer, level, cordon, full GPUs, GPUs, VRAM ratio,
   CPUs and memory as planned, and the jobs the planner was given). :func:`inputs_view` rebuilds the plan's end
   state from them (the jobs given, less those whose stop gave their room back, plus the plan's new assignments;
   the offers those used, counted as the capacity model does: a fractional job on a GPU this plan opened uses none)
   and :func:`blockers` (the bench's own code, not the planner's) finds, keyed on facts, not on reason text, per
   node of the kind's tiers the first check it fails in the planner's order (``band``: offers no GPU work;
   ``offers_used``: the plan's own assignments took its offers; ``level``; ``resources``; ``cap``: a GPU would have
   the room without the guard's cap; ``room``: none would), or ``tiers``/``unsatisfiable`` when no node of its
   tiers could take it even empty. :func:`reason_causes` reads which of these a reason names, by keywords. A
   reason agrees when it names every blocker found and nothing else; "names at least one" is the lenient share.
   Beside it, the same check against fresher facts (each node's own ``/status``: offers, levels and full GPUs read
   just before the plan appeared, :func:`plan_view`), per plan, weighted by samples, and over "settled" plans
   (node offers and levels unchanged over the 3 samples before the plan): the leader plans from gossiped
   snapshots, so a changing offer can differ there. Disagreeing reasons are printed (``--show N``).

The fleet: ``h200`` (1xH200, durable, voter, 32 CPUs, 240 GiB), ``a100x8`` (8xA100, ``ephemeral``,
``provider=runpod``, 128 CPUs, 1000 GiB), ``4090x8`` (8xRTX 4090, ``ephemeral``, ``provider=vast``, 64 CPUs, 250 GiB),
``cpu-a`` and ``cpu-b`` (no GPU, durable, voters, 16 CPUs, 64 GiB) on one L2 segment, and ``5090`` (1xRTX 5090,
``ephemeral``, ``provider=vast``, 16 CPUs, 64 GiB) in a container namespace behind a NAT namespace that publishes
only its ports 8770/8771 as 40001/40002 on a public address (iptables DNAT/SNAT; Vast's ``PUBLIC_IPADDR`` and
``VAST_TCP_PORT_*`` tell the agent, which advertises the mapped address; the bench reads its API through the map).
Every box joins ``--seed`` (default ``cpu-a``, the GPU-less coordinator as in seed 003's inventory), started first;
the others ``--stagger`` seconds after it answers (default 0: all at once). CPUs and memory are declared
(``--resource``) as such boxes have them; ``--host-resources`` declares none, so each agent gives jobs this host's
CPU count and memory (2 CPUs here: the 8-CPU training of ``hex8`` then fits nowhere, and one 2-CPU selfplay fills a
box). The host's CPU is not assessed (``P2PNODE_CPU_MAX_PERCENT=0``, as in the tests): six agents on a shared
2-core machine would otherwise measure that machine, not the planner. Each agent's data directory holds
``pipeline/selfplay.py``, ``train.py`` and ``gauntlet.py`` (the catalog's argv, run from the data directory):
sleepers of ``--selfplay-s`` (default 30-90 s, uniform), ``--train-s`` (default 900 s: longer than the run, as a
real training is) and ``--eval-s`` (default 60 s).

Everything it creates is removed by name or PID on exit, Ctrl-C, SIGTERM and errors: the namespaces
``p2pf<pid>-*`` (with their veths and iptables rules) and this host's veth ``p2pf<pid>hh``, the agents, and the job
processes (their process groups, recorded by the sleepers under ``<data dir>/bench-pids``; an agent that stops
leaves its jobs running for adoption), then the data directories (``--keep`` keeps them, with the agents' logs).
Needs root, iproute2 and iptables: without them it says so and exits with status 2.

Rerun it (as root, from the repository root; about 4 minutes: start, leader, ``--seconds`` of samples, cleanup;
it loads both cores of a 2-core machine)::

    PYTHONPATH=$PWD .venv/bin/python bench/seed003_fleet.py --samples-out /tmp/seed003.json
    PYTHONPATH=$PWD .venv/bin/python bench/seed003_fleet.py --analyse /tmp/seed003.json --show 30  # no fleet
    PYTHONPATH=$PWD .venv/bin/python bench/seed003_fleet.py --seed h200 --stagger 10 --json

``--analyse`` re-reads saved samples (the checker can be refined without starting the fleet again). Put the figures
beside the baseline in ``docs/benchmarks.md`` ("Seed 003's fleet"). The acceptance line: (1) >= 80 %; (2) every
node's "lowest GPU mean" >= 90 % over the GPU-samples holding work or fitting waiting work; (3) 0 samples with a
remainder free for >= 10 s; (4) agreement 100 % (strict, against the facts of the same plan).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from agents import AgentProc  # noqa: E402

from p2pnode.guardcore import MIN_PRIORITY  # noqa: E402
from p2pnode.node._plans import RUNNING_KNOWN_TAG  # noqa: E402
from p2pnode.scheduler import load_catalog, node_tier  # noqa: E402
from p2pnode.scheduler._plan import GpuView, NodeView  # noqa: E402

CATALOG = ROOT / "deploy" / "examples" / "catalog.toml"
GIB = 2**30
PORT = 8770
PUBLIC_PORTS = {8770: 40001, 8771: 40002}  # the 5090 container's ports as the NAT box publishes them
PRIVATE_NET = "192.168.77"  # the 5090 container's subnet behind the NAT namespace (.1 NAT, .2 container)
GPU_MAX_PERCENT = 80.0  # guard.gpu_max_percent, the default the agents run with: usable VRAM = VRAM x 0.8


@dataclass
class Box:
    """One machine of the fleet: name, ``--fake-gpus`` spec ("" none), tags, declared CPUs and memory."""

    name: str
    gpus: str
    tags: tuple[str, ...]
    cpus: int
    memory_gib: int
    behind_nat: bool = False


FLEET = (
    Box("h200", "1xH200", ("durable", "voter"), 32, 240),
    Box("a100x8", "8xA100", ("ephemeral", "provider=runpod"), 128, 1000),
    Box("4090x8", "8xRTX 4090", ("ephemeral", "provider=vast"), 64, 250),
    Box("cpu-a", "", ("durable", "voter"), 16, 64),
    Box("cpu-b", "", ("durable", "voter"), 16, 64),
    Box("5090", "1xRTX 5090", ("ephemeral", "provider=vast"), 16, 64, behind_nat=True),
)

SLEEPER = """import os, random, sys, time
os.makedirs("bench-pids", exist_ok=True)
open(os.path.join("bench-pids", str(os.getpid())), "w").write(str(os.getpgid(0)))
lo, hi = {lo!r}, {hi!r}
time.sleep(random.uniform(lo, hi))
"""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def netns_refusal() -> str | None:
    """Why this process cannot build the fleet's namespaces, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns add, iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2, iptables)"
    probe = f"p2pf-probe-{os.getpid()}"
    r = _run("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot create network namespaces here: {r.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


class Lab:
    """The fleet's network: a bridge namespace ``<prefix>-hub``, one namespace per flat box on it
    (``10.<o>.38.<i+1>``), a NAT namespace on it (``10.<o>.38.6``, the 5090's public address) with the 5090's
    container namespace behind it, and this process on the segment as ``10.<o>.38.254``. Removed by name in
    :meth:`close` (a veth goes with its namespace; the host end is deleted by name)."""

    def __init__(self) -> None:
        self.prefix = f"p2pf{os.getpid() % 100000}"
        self.created: list[str] = []
        self.host_if: str | None = None
        used = _run("ip", "-o", "-4", "addr", "show", check=False).stdout
        self.octet = next((100 + (os.getpid() + k) % 100 for k in range(100)
                           if f" 10.{100 + (os.getpid() + k) % 100}." not in used), 199)
        self.net = f"10.{self.octet}.38"
        self.hub = f"{self.prefix}-hub"
        self.names: dict[str, str] = {}
        self.addrs: dict[str, str] = {}
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _ns(self, name: str) -> str:
        _run("ip", "netns", "del", name, check=False)  # a leftover of a killed run with the same pid
        _run("ip", "netns", "add", name)
        self.created.append(name)
        self.sh(name, "ip", "link", "set", "lo", "up")
        return name

    def sh(self, ns: str, *args: str) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", ns, *args)

    def _plug(self, ns: str, tag: str, addr: str) -> str:
        """A veth from namespace ``ns`` (``addr``/24) to the hub's bridge; returns the interface in ``ns``."""
        inner, outer = f"{self.prefix}{tag}", f"{self.prefix}B{tag}"
        _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
        _run("ip", "link", "set", inner, "netns", ns)
        _run("ip", "link", "set", outer, "netns", self.hub)
        self.sh(self.hub, "ip", "link", "set", outer, "master", "br0")
        self.sh(self.hub, "ip", "link", "set", outer, "up")
        self.sh(ns, "ip", "addr", "add", f"{addr}/24", "dev", inner)
        self.sh(ns, "ip", "link", "set", inner, "up")
        return inner

    def _build(self) -> None:
        self._ns(self.hub)
        self.sh(self.hub, "ip", "link", "add", "br0", "type", "bridge")
        self.sh(self.hub, "ip", "link", "set", "br0", "up")
        flat = [b for b in FLEET if not b.behind_nat]
        for i, box in enumerate(flat):
            ns = self._ns(f"{self.prefix}-{box.name}")
            self._plug(ns, f"h{i}", f"{self.net}.{i + 1}")
            self.names[box.name], self.addrs[box.name] = ns, f"{self.net}.{i + 1}"
        # The 5090: a container namespace on a private subnet behind a NAT namespace that publishes its ports.
        box = next(b for b in FLEET if b.behind_nat)
        nat, ctr = self._ns(f"{self.prefix}-nat"), self._ns(f"{self.prefix}-{box.name}")
        public = f"{self.net}.{len(flat) + 1}"
        self._plug(nat, "n", public)
        inner, outer = f"{self.prefix}c", f"{self.prefix}N"
        _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
        _run("ip", "link", "set", inner, "netns", ctr)
        _run("ip", "link", "set", outer, "netns", nat)
        self.sh(nat, "ip", "addr", "add", f"{PRIVATE_NET}.1/24", "dev", outer)
        self.sh(nat, "ip", "link", "set", outer, "up")
        self.sh(ctr, "ip", "addr", "add", f"{PRIVATE_NET}.2/24", "dev", inner)
        self.sh(ctr, "ip", "link", "set", inner, "up")
        self.sh(ctr, "ip", "route", "add", "default", "via", f"{PRIVATE_NET}.1")
        self.sh(nat, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        ipt = ("iptables", "-w")
        self.sh(nat, *ipt, "-P", "FORWARD", "DROP")  # nothing crosses but the mapped ports and the replies
        self.sh(nat, *ipt, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED,DNAT", "-j", "ACCEPT")
        self.sh(nat, *ipt, "-A", "FORWARD", "-s", f"{PRIVATE_NET}.2", "-j", "ACCEPT")  # the container dials out
        for internal, port in PUBLIC_PORTS.items():
            self.sh(nat, *ipt, "-t", "nat", "-A", "PREROUTING", "-d", public, "-p", "tcp", "--dport", str(port),
                    "-j", "DNAT", "--to-destination", f"{PRIVATE_NET}.2:{internal}")
        self.sh(nat, *ipt, "-t", "nat", "-A", "POSTROUTING", "-s", f"{PRIVATE_NET}.2", "-j", "SNAT",
                "--to-source", public)
        self.names[box.name], self.addrs[box.name] = ctr, f"{PRIVATE_NET}.2"
        self.public = public
        # This process joins the segment, to read every agent's API (the 5090's through its mapped port).
        host_if, hub_if = f"{self.prefix}hh", f"{self.prefix}hb"
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", hub_if)
        self.host_if = host_if
        _run("ip", "link", "set", hub_if, "netns", self.hub)
        self.sh(self.hub, "ip", "link", "set", hub_if, "master", "br0")
        self.sh(self.hub, "ip", "link", "set", hub_if, "up")
        _run("ip", "addr", "add", f"{self.net}.254/24", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")

    def url(self, box: Box) -> str:
        """Where this process reads ``box``'s API."""
        return f"http://{self.public}:{PUBLIC_PORTS[PORT]}" if box.behind_nat else f"http://{self.addrs[box.name]}:{PORT}"

    def close(self) -> None:
        if self.host_if:
            _run("ip", "link", "del", self.host_if, check=False)  # its peer in the hub goes with it
            self.host_if = None
        for name in reversed(self.created):
            _run("ip", "netns", "del", name, check=False)
        self.created.clear()


def _write_pipeline(data_dir: Path, selfplay_s: tuple[float, float], train_s: float, eval_s: float) -> None:
    pipe = data_dir / "pipeline"
    pipe.mkdir(parents=True, exist_ok=True)
    for script, (lo, hi) in (("selfplay.py", selfplay_s), ("train.py", (train_s, train_s)),
                             ("gauntlet.py", (eval_s, eval_s))):
        (pipe / script).write_text(SLEEPER.format(lo=float(lo), hi=float(hi)))


def kill_jobs(root: Path) -> int:
    """Kill (SIGKILL, whole process group) every job process the sleepers recorded under ``root``; a PID is
    killed only while its working directory is still under ``root`` (never a reused PID). Returns how many."""
    killed = 0
    for pidfile in root.glob("*/bench-pids/*"):
        try:
            pid, pgid = int(pidfile.name), int(pidfile.read_text() or 0)
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except (OSError, ValueError):
            continue
        if not cwd.startswith(str(root)):
            continue
        try:
            os.killpg(pgid, signal.SIGKILL) if pgid > 1 else os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass
    return killed


class Fleet:
    """The six agents in the :class:`Lab`, started by :meth:`start`, everything removed by :meth:`close`."""

    def __init__(self, root: Path, *, selfplay_s: tuple[float, float], train_s: float, eval_s: float,
                 host_resources: bool = False) -> None:
        self.root = root
        self.host_resources = host_resources
        self.lab = Lab()
        self.agents: dict[str, AgentProc] = {}
        self.ids: dict[str, str] = {}  # box name -> node id
        self.started: dict[str, float] = {}  # box name -> when its agent was started (monotonic)
        self.nat_addr: dict[str, str] = {}  # the 5090's advertised address and where it came from
        self.times = (selfplay_s, train_s, eval_s)
        self.http = httpx.Client(timeout=3.0, trust_env=False)

    def start(self, seed_box: str, stagger_s: float, tick=None) -> None:
        """Start ``seed_box`` (the one address every other box joins), then, ``stagger_s`` seconds after it
        answers, the rest, as an operator brings a fleet up (0: all at once, the seed first); ``tick()`` is called
        about once a second meanwhile (the bench samples the seed alone)."""
        lab = self.lab
        binp = self.root / "bin"
        binp.mkdir(parents=True, exist_ok=True)
        py = Path("/usr/bin/python3") if Path("/usr/bin/python3").exists() else Path(sys.executable)
        (binp / "python3").symlink_to(py)  # the catalog's "python3", without a pyenv shim per job start
        path = f"{binp}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        seed = f"{lab.addrs[seed_box]}:{PORT}"
        order = sorted(FLEET, key=lambda b: b.name != seed_box)
        for box in order:
            if box.name != seed_box and stagger_s > 0 and not self.ids:
                self.wait_ready(90, only=(seed_box,))
                until = time.monotonic() + stagger_s
                while time.monotonic() < until:
                    if tick is not None:
                        tick()
                    time.sleep(max(0.0, min(1.0, until - time.monotonic())))
            data = self.root / box.name
            _write_pipeline(data, *self.times)
            args = ["--no-mdns", "--catalog", str(CATALOG)]
            if not self.host_resources:
                args += ["--resource", f"cpus={box.cpus}", "--resource", f"memory_gib={box.memory_gib}"]
            args += [x for t in box.tags for x in ("--tag", t)]
            if box.gpus:
                args += ["--fake-gpus", box.gpus]
            if box.name != seed_box:
                args += ["--join", seed]
            env = {"PATH": path, "P2PNODE_SYNC_DATA_PORT": "8771"}
            if box.behind_nat:
                env |= {"PUBLIC_IPADDR": lab.public, **{f"VAST_TCP_PORT_{p}": str(q) for p, q in PUBLIC_PORTS.items()}}
            self.agents[box.name] = AgentProc(data, PORT, *args, bind=lab.addrs[box.name],
                                              prefix=["ip", "netns", "exec", lab.names[box.name]], env=env).start()
            self.started[box.name] = time.monotonic()

    def get(self, box: str, path: str) -> Any:
        b = next(x for x in FLEET if x.name == box)
        return self.http.get(self.lab.url(b) + path).json()

    def wait_ready(self, timeout: float, only: tuple[str, ...] = (), tick=None) -> None:
        """Wait until every agent started (or those named in ``only``) answers ``/status``, calling ``tick()``
        between looks; raises with an agent's log when it exits, ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        want = [b for b in FLEET if b.name in self.agents and (not only or b.name in only)]
        while any(b.name not in self.ids for b in want):
            for box in want:
                p = self.agents[box.name]
                if p.proc is not None and p.proc.poll() is not None:
                    raise RuntimeError(f"agent {box.name} exited with {p.proc.returncode}:\n"
                                       f"{p.log.read_text()[-3000:]}")
                if box.name not in self.ids:
                    try:
                        node = self.get(box.name, "/status")["node"]
                    except (httpx.HTTPError, ValueError, KeyError):
                        continue
                    self.ids[box.name] = node["id"]
                    if box.behind_nat:
                        self.nat_addr = {"addr": node.get("addr", ""), "addr_source": node.get("addr_source", "")}
            if time.monotonic() > deadline:
                missing = sorted(b.name for b in want if b.name not in self.ids)
                raise TimeoutError(f"agents {missing} did not answer within {timeout:g} s")
            if tick is not None and "h200" in self.ids:
                tick()
            time.sleep(0.5)

    def close(self) -> dict[str, int]:
        self.http.close()
        for p in self.agents.values():
            if p.proc is not None and p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
        for p in self.agents.values():
            if p.proc is not None:
                try:
                    p.proc.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        jobs = kill_jobs(self.root)
        self.lab.close()
        return {"job_groups_killed": jobs}


# -- sampling ----------------------------------------------------------------------------------------------------------
def take_sample(fleet: Fleet, t: float) -> dict[str, Any]:
    """One sample: the H200's own running jobs (``h200_running``: template, kind), and from the leader's view its
    members' GPUs, tags and declared resources, each member's offer, level, full GPUs and spawn-rate backlog (read
    from the member's own ``/status`` snapshot: ``/members`` does not carry them), the jobs running cluster-wide
    (GPUs, fraction, VRAM), and the leader's newest plan: its assignments (carried-over ones included) and the
    templates pending with their reasons. ``leader`` None while no voter knows one; ``error`` when a read failed."""
    out: dict[str, Any] = {"t": t, "leader": None}
    try:
        out["h200_running"] = [{"template": j["template"], "kind": j.get("kind", "")}
                               for j in fleet.get("h200", "/jobs")["running"]]
    except (httpx.HTTPError, ValueError, KeyError):
        pass
    leader = None
    for box in ("h200", "cpu-a", "cpu-b"):
        try:
            leader = fleet.get(box, "/status")["election"]["leader"]
        except (httpx.HTTPError, ValueError, KeyError):
            continue
        if leader:
            break
    if not leader:
        return out
    out["leader"] = leader
    lbox = next((b for b, i in fleet.ids.items() if i == leader), None)
    if lbox is None:
        return out | {"error": "the leader is not one of the fleet's agents"}
    try:
        members = fleet.get(lbox, "/members")["members"]
        jobs = fleet.get(lbox, "/jobs")
        got = fleet.get(lbox, "/plan?inputs=1")
        doc = got.get("plan") or {}
    except (httpx.HTTPError, ValueError) as exc:
        return out | {"error": f"{type(exc).__name__}: {exc}"}
    nodes = {}
    for m in members:
        if m.get("state") not in ("alive", "suspect"):
            continue
        r = m["resources"]
        nodes[m["id"]] = {"gpus": [g["mem_total_bytes"] / GIB for g in r.get("gpus", [])],
                          "tags": list(m.get("tags", [])), "declared": r.get("declared", {}),
                          "cordoned": m.get("cordoned", False)}
    for box in FLEET:
        nid = fleet.ids.get(box.name)
        if nid not in nodes:
            continue
        try:
            snap = fleet.get(box.name, "/status")["snapshot"]
        except (httpx.HTTPError, ValueError, KeyError):
            continue
        js, g = snap.get("jobs", {}), snap.get("guard", {})
        nodes[nid] |= {"offer": js.get("offer") or 0, "level": g.get("level") or 0, "full": g.get("gpus_full") or [],
                       "waiting": js.get("waiting") or 0}  # (null while a section is not filled in yet)
    running = [{"job_id": j["job_id"], "node": j["node_id"], "template": j["template"], "kind": j.get("kind", ""),
                "gpus": j.get("gpus", []), "fraction": j.get("gpu_fraction", 0.0), "vram": j.get("vram_gib", 0.0)}
               for j in jobs.get("cluster_running", [])]
    at = doc.get("at", 0.0)
    assignments = [{"job_id": a["job_id"], "node": a["node"], "template": a.get("template", ""),
                    "gpus": a.get("gpus", []), "fraction": a.get("gpu_fraction", 0.0), "vram": a.get("vram_gib", 0.0),
                    "new": abs(a.get("assigned_at", 0.0) - at) < 1e-6}  # placed by this plan (not carried over)
                   for a in doc.get("assignments", [])]
    pending = [{"template": p["template"], "reason": p["reason"], "wait_s": p.get("wait_s", 0.0)}
               for p in doc.get("pending", [])]
    stops = [{"job_id": x["job_id"], "node": x["node"], "reason": x.get("reason", ""), "rule": x.get("rule", "plan")}
             for x in doc.get("stops", [])]
    inputs = got.get("inputs")
    if inputs and (inputs.get("term"), inputs.get("seq")) == (doc.get("term"), doc.get("seq")):
        out["inputs"] = _compact_inputs(inputs)
    return out | {"nodes": nodes, "running": running, "assignments": assignments, "pending": pending,
                  "stops": stops, "plan": [doc.get("term", 0), doc.get("seq", 0)], "ratio": GPU_MAX_PERCENT / 100.0}


def _compact_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """The facts the leader computed its plan from (``GET /plan?inputs=1``), in the sample's own shapes: per member
    its GPUs' VRAM (GiB), their ``full`` indices, the guard's VRAM ratio, tags, CPUs and memory it gives jobs, its
    offer, level and cordon as planned; the jobs the planner was given as running or assigned."""
    nodes = {m["node"]: {"gpus": [g["vram_gib"] for g in m["gpus"]],
                         "full": [g["index"] for g in m["gpus"] if g["full"]], "ratio": m["vram_limit_ratio"],
                         "tags": m["tags"],
                         "declared": {"cpus": m["cpus"], "memory_gib": m["memory_gib"]}, "offer": m["offer"],
                         "level": m["level"], "cordoned": m["cordoned"]} for m in inputs["members"]}
    running = [{"job_id": j["job_id"], "node": j["node"], "template": j["template"], "gpus": j["gpus"],
                "fraction": j["gpu_fraction"], "vram": j["vram_gib"]} for j in inputs["running"]]
    return {"nodes": nodes, "running": running, "held_configs": inputs.get("held_configs", []),
            "complete": inputs["members_total"] == len(inputs["members"])
            and inputs["running_total"] == len(inputs["running"])}


# -- the independent accounting ----------------------------------------------------------------------------------------
PERSIST_S = 10.0
"""A remainder free this long (two plan intervals at the default ``scheduler.interval_s``, 5 s) is stranded, not
merely between plans."""
SETTLE_SAMPLES = 3
"""A plan is checked as "settled" when the node facts read in this many samples before it appeared were equal: the
leader plans from gossiped snapshots, the bench reads each node's own (fresher), so a changing offer may differ."""
CAUSES = ("tiers", "unsatisfiable", "cap", "band", "offers_used", "level", "resources", "room", "spawn_rate", "held",
          "other")
"""What can hold a GPU template (:func:`blockers`), in the planner's order of checks on a node."""


def reason_causes(reason: str) -> set[str]:
    """The causes a pending reason names, read by keywords (today's strings and reworded ones alike): ``tiers``
    (no node in its tiers), ``unsatisfiable`` (no node could take it even empty), ``cap`` (the guard's
    ``gpu_max_percent`` cap), ``band`` (nodes in their utilization band offer nothing), ``offers_used`` (this
    plan used the offers), ``level`` (degraded nodes), ``resources`` (CPUs, memory), ``room`` (no GPU with the
    VRAM/fraction free), ``spawn_rate`` (assignments held back by a node's spawn-rate limit)."""
    r = reason.lower()
    if " takes it: " in r and "unsatisfiable" not in r and "waits until the running jobs of" not in r:
        return _clause_causes(r)
    out = set()
    if "unsatisfiable" in r:
        out.add("unsatisfiable")
    if "no node is in them" in r or ("tier" in r and ("no node in tier" in r and "has a gpu" not in r)):
        out.add("tiers")
    if "cap" in r.replace("capacity", "") or "gpu_max_percent" in r or "can commit" in r or "usable" in r:
        out.add("cap")
    if "band" in r or "offering none" in r or "offer nothing" in r or "offers nothing" in r:
        out.add("band")
    if "used every offer" in r or "offers used" in r or "offers already used" in r or "offer used" in r:
        out.add("offers_used")
    if "degraded" in r or "level " in r and "refuses" in r:
        out.add("level")
    if "free cpus" in r or "of free memory" in r or "custom resource" in r:
        out.add("resources")
    if ("gib free" in r or "floor" in r or "no free gpu" in r or "fraction" in r) and "unsatisfiable" not in r:
        out.add("room")
    if "spawn-rate" in r or "spawn rate" in r:
        out.add("spawn_rate")
    if "waits until the running jobs of" in r:
        out.add("held")
    return out or {"other"}


_CLAUSES = (  # the planner's per-node counted reason (issue 38): a clause's words -> the cause it names
    ("not under the guard's cap", "cap"),
    ("offer no gpu work", "band"),  # in their band, cordoned, or degraded to the backpressure level: no offer
    ("spent their gpu offers", "offers_used"),
    ("their level refuses", "level"),
    ("over the guard's measured gpu memory limit", "room"),
    ("held by their jobs", "room"),
    ("free cpus", "resources"), ("free memory", "resources"), ("custom resource", "resources"),
    ("disk", "resources"),
)
_INFORMATIONAL = ("outside tiers", "the vram floor of", "predicted peak", "waits ~", "expected wait",
                  "usable even when empty", "until its running jobs are known", "running list unknown past the grace")
"""Clauses that explain without naming a blocker of a node of the template's tiers (nodes outside them, the
floor's share, nodes too small even empty (the checker's ``cap_always``), predictions: the checker does not
model them; members whose running list is unknown, which take no training or get no view: not counted)."""


_CLAUSE_SEP = re.compile(r"; (?![^(]*\))")
"""The separator of the counted form's clauses: ``"; "`` outside parentheses (the floor's clause holds one:
``the VRAM floor of C (8 GiB per GPU; it asks 4) rules out 1 of them``)."""


def _clause_causes(r: str) -> set[str]:
    """:func:`reason_causes` of the planner's counted form (``no node in tiers T takes it: N <cause>; ...``), read
    clause by clause: each clause names one cause; a clause the table does not know is ``other``."""
    out: set[str] = set()
    body = r.split(" takes it: ", 1)[1]
    for clause in _CLAUSE_SEP.split(body):
        if any(word in clause for word in _INFORMATIONAL):
            continue
        cause = next((c for words, c in _CLAUSES if words in clause), None)
        if cause is None and "rules out every node" in clause:
            cause = "tiers"
        out.add(cause or "other")
    return out or {"other"}


@dataclass
class Need:
    """What one instance of a GPU template needs: GPUs (a fraction below 1), VRAM per GPU (its floor applied),
    tiers, guard priority, CPUs, memory."""

    num_gpus: float
    vram: float
    tiers: tuple[int, ...]
    prio: int
    cpus: float
    memory: float
    kind: str
    hard_tags: tuple[str, ...] = field(default_factory=tuple)


def needs_of(catalog) -> dict[str, Need]:
    out = {}
    for t in catalog.templates.values():
        r = t.resources
        if r.num_gpus <= 0:
            continue
        out[t.name] = Need(r.num_gpus, max(r.vram_gib, catalog.vram_floor_gib(t.config)), catalog.tiers_for(t.kind),
                           int(catalog.priority_of(t.kind)), r.num_cpus, r.memory_gib, t.kind,
                           tuple(a.tag for a in t.placement.affinity if a.hard))
    return out


def gpu_state(nodes: dict[str, Any], jobs: list[dict[str, Any]], ratio: float) -> dict[str, list[dict[str, Any]]]:
    """Per node of ``nodes``, per GPU: VRAM, usable VRAM (x ``ratio``, the guard's cap), the VRAM and fraction
    the ``jobs`` (running jobs, or a plan's assignments) commit on it, and ``full`` (its measured memory over the
    guard's limit: it takes no new work)."""
    out = {nid: [{"vram": v, "usable": v * n.get("ratio", ratio), "committed": 0.0, "fraction": 0.0,
                  "full": i in (n.get("full") or [])} for i, v in enumerate(n["gpus"])] for nid, n in nodes.items()}
    for j in jobs:
        gpus = out.get(j["node"])
        for i in j["gpus"] if gpus is not None else ():
            if 0 <= i < len(gpus):
                gpus[i]["committed"] += j["vram"]
                gpus[i]["fraction"] += j["fraction"]
    return out


def plan_view(sample: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """The planner's accounting at the end of the plan current in ``sample``: every node alive in ``sample``,
    its offer, level and full GPUs as last read before the plan appeared (``before``, the previous sample; else
    ``sample``'s own), the plan's assignments (carried over and new) holding GPUs, CPUs and memory, and the
    offers the plan's new assignments used per node."""
    facts = before if before is not None and "nodes" in before else sample
    nodes = {nid: {**n, **{k: facts["nodes"].get(nid, n).get(k, n.get(k)) for k in ("offer", "level", "full")}}
             for nid, n in sample["nodes"].items()}
    return {"nodes": nodes, "jobs": sample.get("assignments", []), "ratio": sample["ratio"],
            "used": Counter(a["node"] for a in sample.get("assignments", []) if a["new"])}


RELEASED = ("preempted by ", "duplicate training of ", "template ")
"""How the reason of a stop starts when the planner gave its room back in the same plan (a preemption, a duplicate
training, a template gone; a gang's end by its rule): the job then holds nothing at the plan's end. A job stopped
over its template's ``max_concurrency`` keeps its room until it exits."""


def inputs_view(sample: dict[str, Any], templates: dict[str, Any]) -> dict[str, Any] | None:
    """The planner's accounting at the end of the plan in ``sample``, recomputed from the facts that plan was computed
    from (``sample["inputs"]``, the leader's ``GET /plan?inputs=1``; None without them): the members as planned
    (offer, level, cordon, full GPUs, tags, CPUs and memory), the jobs the planner was given less those whose stop
    gave their room back (:data:`RELEASED`) plus the plan's new assignments (those it was not given); and the
    offers those used, counted as the issue's capacity model says: a whole-GPU job uses one; a fractional job uses
    one, except on a GPU that was empty at the plan's start and that an earlier fractional job of this plan opened
    (its one offer paid for the GPU); a preemption gives a node whose offers were spent one back for the job it
    makes room for. Per node: ``offer_left`` and ``opened`` (the GPUs opened)."""
    inputs = sample.get("inputs")
    if not inputs or not inputs.get("complete", True):  # (a document cut at its bounds: not this fleet's size)
        return None
    nodes = inputs["nodes"]
    stopped = {x["job_id"]: x for x in sample.get("stops", [])}
    released = {j for j, x in stopped.items() if x["rule"] != "plan" or x["reason"].startswith(RELEASED)}
    start = [j for j in inputs["running"] if j["node"] in nodes]
    given = {j["job_id"] for j in inputs["running"]}  # (an adopted job's entry is stamped with the plan's time too)
    new = [a for a in sample.get("assignments", []) if a["job_id"] not in given]
    jobs = [j for j in start if j["job_id"] not in released] + new
    busy = {(j["node"], i) for j in start for i in j["gpus"] if j["fraction"] > 1e-9}
    fresh = {nid: {i for i in range(len(n["gpus"])) if i not in n["full"] and (nid, i) not in busy}
             for nid, n in nodes.items()}
    offer_left = {nid: 0 if n["cordoned"] else n["offer"] for nid, n in nodes.items()}
    opened: dict[str, set[int]] = defaultdict(set)
    preempted_for = Counter((x["node"], x["reason"][len("preempted by "):].split(" ", 1)[0])
                            for x in stopped.values() if x["reason"].startswith("preempted by "))
    for a in new:
        nid = a["node"]
        if nid not in offer_left:
            continue
        t = templates.get(a["template"])
        fractional = t is not None and 0 < t.resources.num_gpus < 1 and len(a["gpus"]) == 1
        if preempted_for[(nid, a["template"])] > 0:
            preempted_for[(nid, a["template"])] -= 1
            offer_left[nid] = max(offer_left[nid], 1)
        if fractional and a["gpus"][0] in opened[nid]:
            continue
        offer_left[nid] -= 1
        if fractional and a["gpus"][0] in fresh[nid]:
            opened[nid].add(a["gpus"][0])
    return {"nodes": nodes, "jobs": jobs, "ratio": sample["ratio"], "offer_left": offer_left, "opened": opened,
            "used": Counter(a["node"] for a in new), "held_configs": set(inputs.get("held_configs", ())),
            "guarded": any(RUNNING_KNOWN_TAG in n["tags"] for n in nodes.values())}


def _node_used(jobs: list[dict[str, Any]], nid: str, templates: dict[str, Any]) -> tuple[float, float]:
    """CPUs and memory (GiB) the ``jobs`` on ``nid`` hold (their templates' requests)."""
    cpus = mem = 0.0
    for j in jobs:
        if j["node"] == nid and j["template"] in templates:
            r = templates[j["template"]].resources
            cpus, mem = cpus + r.num_cpus, mem + r.memory_gib
    return cpus, mem


def _fits(gpus: list[dict[str, Any]], need: Need, *, capped: bool) -> bool:
    """Whether a GPU (or ``num_gpus`` whole GPUs) has the fraction and the VRAM free (under the cap or not); a GPU
    over the guard's measured memory limit (``full``) takes nothing either way: no cap makes room there."""
    def free(g):
        return (g["usable"] if capped else g["vram"]) - g["committed"]
    if need.num_gpus < 1:
        return any(1.0 - g["fraction"] + 1e-9 >= need.num_gpus and free(g) + 1e-9 >= need.vram and not g["full"]
                   for g in gpus)
    whole = [g for g in gpus if g["fraction"] <= 1e-9 and free(g) + 1e-9 >= need.vram and not g["full"]]
    return len(whole) >= int(need.num_gpus)


def _tier(n: dict[str, Any]) -> int:
    return node_tier(NodeView("", tuple(GpuView(i, v) for i, v in enumerate(n["gpus"]))))


def _could_use(g: dict[str, Any], need: Need, tier: int) -> bool:
    """Whether GPU ``g`` (of a node of ``tier``) has what one instance of ``need`` takes free: the fraction (a
    whole GPU for one of 1 or more GPUs) and the VRAM under the cap."""
    return (tier in need.tiers and 1.0 - g["fraction"] + 1e-9 >= min(1.0, need.num_gpus)
            and g["usable"] - g["committed"] + 1e-9 >= need.vram)


def blockers(view: dict[str, Any], need: Need, templates: dict[str, Any]) -> tuple[set[str], dict[str, str]]:
    """What holds a GPU template needing ``need`` in the planner's accounting ``view`` (:func:`plan_view`),
    recomputed from the facts, not from any reason text: per node of its tiers (and hard tags), the first check it
    fails in the planner's order: its offer (``band``: the node offers no GPU work, its GPUs in their
    utilization band, degraded to backpressure or cordoned; ``offers_used``: the plan's own new assignments took
    its offers), ``level`` (its degradation level refuses the kind's priority), ``resources`` (CPUs, memory),
    then GPU room: ``cap`` when a GPU would have the fraction and VRAM free without the guard's cap, ``room`` when
    none would. Before the per-node checks: ``tiers`` when no node is in its tiers; ``cap`` (or
    ``unsatisfiable`` when even the full VRAM is too small) when no node of its tiers could take it empty. Returns
    the set of causes (empty when some node could take it: ``fits``) and the cause per node. A node of its tiers
    whose GPUs could hold the work empty without the cap but never under it is shown as ``cap_always`` and is no
    cause while another node could take the work (it never could: a reason need not name it each time); one whose
    GPUs are too small even without the cap is no candidate and no cause."""
    per_node: dict[str, str] = {}
    ratio = view["ratio"]
    in_tiers = {nid: n for nid, n in view["nodes"].items() if n["gpus"] and _tier(n) in need.tiers
                and all(t in n["tags"] for t in need.hard_tags)}
    if not in_tiers:
        return {"tiers"}, per_node
    def empty_fits(n: dict[str, Any], capped: bool) -> bool:
        return _fits([{"vram": v, "usable": v * n.get("ratio", ratio), "committed": 0.0, "fraction": 0.0, "full": False}
                      for v in n["gpus"]], need, capped=capped)

    empty = {nid for nid, n in in_tiers.items() if empty_fits(n, True)}
    for nid, n in in_tiers.items():  # a GPU big enough that the cap alone keeps it from the work (a 5090 for 32 GiB)
        if nid not in empty and empty_fits(n, False):
            per_node[nid] = "cap_always"
    if not empty:
        return ({"cap"} if per_node else {"unsatisfiable"}), per_node
    state = gpu_state({nid: in_tiers[nid] for nid in empty}, view["jobs"], ratio)
    for nid in sorted(empty):
        n = in_tiers[nid]
        offer = 0 if n.get("cordoned") else (n.get("offer") or 0)  # (missing: its /status was not read)
        cpus_used, mem_used = _node_used(view["jobs"], nid, templates)
        decl = n["declared"]
        if offer <= 0:
            per_node[nid] = "band"
        elif _offers_spent(view, nid, offer, state[nid], need):
            per_node[nid] = "offers_used"
        elif need.prio < MIN_PRIORITY[max(0, min(4, n.get("level", 0)))]:
            per_node[nid] = "level"
        elif (decl.get("cpus", 0) and decl["cpus"] - cpus_used + 1e-9 < need.cpus) or \
                (decl.get("memory_gib", 0) and decl["memory_gib"] - mem_used + 1e-9 < need.memory):
            per_node[nid] = "resources"
        elif _fits(state[nid], need, capped=True):
            per_node[nid] = "fits"
        else:
            per_node[nid] = "cap" if _fits(state[nid], need, capped=False) else "room"
    causes = set(per_node.values()) - {"cap_always"}
    return (set() if "fits" in causes else causes), per_node


def _offers_spent(view: dict[str, Any], nid: str, offer: int, gpus: list[dict[str, Any]], need: Need) -> bool:
    """Whether the plan's own assignments spent node ``nid``'s offers for ``need``: with the offers counted as the
    capacity model does (``view["offer_left"]``, :func:`inputs_view`), none left and (a fraction) no GPU this plan
    opened with the fraction and the VRAM free under the cap; else (sampled facts only) as many new assignments as
    the node offered."""
    if "offer_left" not in view:
        return view["used"].get(nid, 0) >= offer
    if view["offer_left"][nid] > 0:
        return False
    opened = view["opened"].get(nid, ())
    return not (need.num_gpus < 1 and any(
        i in opened and not g["full"] and 1.0 - g["fraction"] + 1e-9 >= need.num_gpus
        and g["usable"] - g["committed"] + 1e-9 >= need.vram for i, g in enumerate(gpus)))


_DISPLACED = re.compile(r"its placement on (\S+) went to ")
"""A displaced template's reason: the node where a stable kind took its placement back in this plan (the room left
there after the stable kind's placement appeared after other templates were looked for, as a preemption's does)."""
STRANDING = "would take it only by stranding GPU time"
"""What a displaced template's reason says of a node that would take it only by stranding GPU time (issue 38)."""


def check_reasons(s: dict[str, Any], view: dict[str, Any], needs: dict[str, Need], templates: dict[str, Any],
                  names: dict[str, str], key: tuple, settled: bool) -> list[dict[str, Any]]:
    """Each GPU template pending in sample ``s``'s plan: the causes its reason names (:func:`reason_causes`) against
    the blockers recomputed in ``view`` (:func:`blockers`); ``strict``: the same set, ``names_one``: one in
    common; ``stranding``: the nodes that fit it at the plan's end when its reason says it waits rather than strand
    GPU time (:data:`STRANDING`: not blockers)."""
    out = []
    preempted_on = {x["node"] for x in s.get("stops", []) if x["reason"].startswith("preempted by ")}
    preempted_on |= {m.group(1) for p in s["pending"] if (m := _DISPLACED.match(p["reason"]))}  # (room given back)
    for p in s["pending"]:
        need = needs.get(p["template"])
        if need is None:
            continue
        if need.kind == "training" and view.get("guarded"):  # some running list unknown: the leader's guard
            need = replace(need, hard_tags=(*need.hard_tags, RUNNING_KNOWN_TAG))
        found, per_node = blockers(view, need, templates)
        if need.kind == "training" and templates[p["template"]].config in view.get("held_configs", ()):
            found, per_node = {"held"}, {}  # a new training of the config waits for those lists
        named = reason_causes(p["reason"]) - {"spawn_rate"}
        if "held" in named:
            named = {"held"}  # (what follows is the planner's own words of the same hold: its required tags)
        late = sorted(nid for nid, c in per_node.items() if c == "fits")
        stranding: list[str] = []
        if not found and late and STRANDING in p["reason"]:
            # taken back for a stable kind, it waits rather than strand GPU time on a node that would take it (the
            # planner's _TakeBack._place_again): the nodes it fits at the plan's end are those, not blockers
            stranding, late = late, []
            found = set(per_node.values()) - {"fits", "cap_always"}
        elif found or not late or not all(nid in preempted_on for nid in late):
            late = []
        else:
            # room a preemption of this plan made after the template was looked for: the planner counts the nodes
            # that held it then, not those (its docstring: _Reasons._count_causes); the next plan places it
            found = set(per_node.values()) - {"fits", "cap_always"}
        if "unsatisfiable: " in p["reason"] and "held" not in named:  # what no node could ever take, not a check
            named = {"unsatisfiable", *(named & {"tiers"})}
            if found and found <= {"tiers", "unsatisfiable", "cap"}:  # no node of its tiers takes it even empty
                found = {"unsatisfiable", *(found & {"tiers"})}
        out.append({"t": round(s["t"], 1), "plan": list(key), "settled": settled, "template": p["template"],
                    "reason": p["reason"], "named": sorted(named), "found": sorted(found or {"fits"}),
                    "per_node": {names.get(k, k): v for k, v in per_node.items()},
                    "strict": named == found, "names_one": bool(named & found),
                    "late_room": [names.get(k, k) for k in late],
                    "stranding": [names.get(k, k) for k in stranding]})
    return out


# -- the analysis ------------------------------------------------------------------------------------------------------
def _held_figures(node: str, gpus: list[dict[str, Any]], held: dict[tuple[str, int], list[float]],
                  unwanted: Counter) -> dict[str, Any]:
    """Figure (2) over the GPU-samples of ``node`` in which the GPU holds work or waiting work fits it (an empty
    GPU that no waiting template could use has nothing to commit): min, mean, lowest GPU's mean, and how many
    GPU-samples were left out as empty with nothing waiting that fits."""
    ratios = [held[(node, g["gpu"])] for g in gpus if held.get((node, g["gpu"]))]
    if not ratios:
        return {"held_min": None, "held_mean": None, "held_lowest_gpu_mean": None, "unwanted_gpu_samples":
                unwanted[node]}
    return {"held_min": min(min(r) for r in ratios), "held_mean": statistics.fmean(x for r in ratios for x in r),
            "held_lowest_gpu_mean": min(statistics.fmean(r) for r in ratios), "unwanted_gpu_samples": unwanted[node]}


def analyse(samples: list[dict[str, Any]], fleet_ids: dict[str, str], warmup_s: float, show: int) -> dict[str, Any]:
    """The four figures (module docstring) from the samples of :func:`take_sample`; ``warmup_s`` after the first
    leader before the VRAM figures count; ``show`` disagreeing reasons kept (-1: all)."""
    catalog = load_catalog(CATALOG)
    templates = dict(catalog.templates)
    needs = needs_of(catalog)
    names = {i: b for b, i in fleet_ids.items()}
    for n in (n for s in samples for n in s.get("nodes", {}).values()):  # samples saved before nulls were read as 0
        n.update({k: d for k, d in (("offer", 0), ("level", 0), ("full", [])) if k in n and n[k] is None})
    first_leader = next((s["t"] for s in samples if s.get("leader")), None)
    after = [s for s in samples if first_leader is not None and s["t"] >= first_leader]
    led = [s for s in after if "nodes" in s]
    # (1) training on the H200 (its own running list), trainings per node (the leader's cluster view)
    h200 = [s for s in after if "h200_running" in s]
    h200_training = sum(1 for s in h200 if any(j["kind"] == "training" for j in s["h200_running"]))
    before = [s for s in samples if first_leader is None or s["t"] < first_leader]
    h200_before = sorted({j["template"] for s in before for j in s.get("h200_running", [])})
    h200_first_sample = next((s["t"] for s in samples if "h200_running" in s), None)
    h200_at_leader = sorted({j["template"] for j in after[0].get("h200_running", [])}) if after else []
    h200_trains_at = next((s["t"] for s in h200 if any(j["kind"] == "training" for j in s["h200_running"])), None)
    train_per_node: Counter = Counter()
    for s in led:
        for j in s["running"]:
            if j["kind"] == "training":
                train_per_node[f"{names.get(j['node'], j['node'])}:{j['template']}"] += 1
    # (2) committed / usable per GPU after warm-up; (3) usable remainders >= the smallest waiting floor
    per_gpu: dict[tuple[str, int], list[float]] = defaultdict(list)
    committed_gib: dict[tuple[str, int], list[float]] = defaultdict(list)
    held: dict[tuple[str, int], list[float]] = defaultdict(list)
    unwanted: Counter = Counter()
    stranded_samples = stranded_lasting = 0
    since: dict[tuple[str, int], float] = {}
    stranded_gpus: Counter = Counter()
    stranded_examples: list[str] = []
    reasons: Counter = Counter()
    checks = []
    plan_checks: dict[tuple[int, int], list[dict[str, Any]]] = {}  # against the fresher facts of each node
    same_checks: dict[tuple[int, int], list[dict[str, Any]]] = {}  # against the facts the plan was computed from
    prev = None
    recent: list[Any] = []  # the offers, levels and members of the last samples: a plan is "settled" when they held
    for s in led:
        state = gpu_state(s["nodes"], s["running"], s["ratio"])
        waiting = [needs[p["template"]] for p in s["pending"] if p["template"] in needs]
        floor = min((w.vram for w in waiting), default=None)
        tiers = {nid: _tier(n) for nid, n in s["nodes"].items()}
        if s["t"] >= first_leader + warmup_s:
            for nid, gpus in state.items():
                for i, g in enumerate(gpus):
                    ratio = g["committed"] / g["usable"] if g["usable"] else 0.0
                    per_gpu[(names.get(nid, nid), i)].append(ratio)
                    committed_gib[(names.get(nid, nid), i)].append(g["committed"])
                    if g["fraction"] > 1e-9 or any(_could_use(g, w, tiers[nid]) for w in waiting):
                        held[(names.get(nid, nid), i)].append(ratio)  # holds work, or waiting work fits it
                    else:
                        unwanted[names.get(nid, nid)] += 1  # empty, and nothing waiting fits it
        hits = [(names.get(nid, nid), i, g["usable"] - g["committed"]) for nid, gpus in state.items()
                for i, g in enumerate(gpus) if not g["full"] and any(_could_use(g, w, tiers[nid]) for w in waiting)]
        since = {k: since.get(k, s["t"]) for k in ((n, i) for n, i, _ in hits)}  # when each GPU's remainder began
        if hits and s["t"] >= first_leader + warmup_s:
            stranded_samples += 1
            lasting = [(n, i, free) for n, i, free in hits if s["t"] - since[(n, i)] >= PERSIST_S]
            stranded_gpus.update(n for n, _, _ in lasting)
            stranded_lasting += bool(lasting)
            if lasting and len(stranded_examples) < 5:
                stranded_examples.append(f"t={s['t']:.0f}s floor {floor:g} GiB waits; free for >= {PERSIST_S:g} s: "
                                         + ", ".join(f"{n}/gpu{i} {free:.1f} GiB" for n, i, free in lasting[:6]))
        # (4) each plan's reasons against the planner's accounting, recomputed once, at the plan's first sample
        key = tuple(s.get("plan") or (0, 0))
        if key not in plan_checks:
            settled = len(recent) >= SETTLE_SAMPLES and all(x == recent[-1] for x in recent[-SETTLE_SAMPLES:]) \
                and set(recent[-1]) == set(s["nodes"])
            plan_checks[key] = check_reasons(s, plan_view(s, prev), needs, templates, names, key, settled)
            same = inputs_view(s, templates)
            if same is not None:
                same_checks[key] = check_reasons(s, same, needs, templates, names, key, True)
        for p in s["pending"]:
            reasons[p["reason"]] += 1
        checks += plan_checks[key]
        prev = s
        recent = [*recent[-SETTLE_SAMPLES:], {nid: (n.get("offer"), n.get("level"), tuple(n.get("full") or []))
                                              for nid, n in s["nodes"].items()}]
    nodes = defaultdict(list)
    for (node, i), ratios in sorted(per_gpu.items()):
        nodes[node].append({"gpu": i, "min": min(ratios), "mean": statistics.fmean(ratios),
                            "committed_gib_mean": statistics.fmean(committed_gib[(node, i)]),
                            "committed_gib_mode": Counter(committed_gib[(node, i)]).most_common(1)[0][0]})
    per_node = {n: {"gpus": len(g), "min": min(x["min"] for x in g), "mean": statistics.fmean(x["mean"] for x in g),
                    "lowest_gpu_mean": min(x["mean"] for x in g),
                    "committed_gib_mean": statistics.fmean(x["committed_gib_mean"] for x in g),
                    "committed_gib_modes": dict(Counter(x["committed_gib_mode"] for x in g)),
                    **_held_figures(n, g, held, unwanted)}
                for n, g in nodes.items()}
    first = [c for v in plan_checks.values() for c in v]
    settled = [c for c in first if c["settled"]]

    def share(xs, key):
        return sum(1 for c in xs if c[key]) / len(xs) if xs else None

    disagree = [c for c in settled if not c["strict"]] + [c for c in first if not c["strict"] and not c["settled"]]
    same = [c for v in same_checks.values() for c in v]
    same_disagree = [c for c in same if not c["strict"]]
    return {
        "samples": len(samples), "samples_after_leader": len(after), "samples_with_view": len(led),
        "first_leader_s": first_leader, "warmup_s": warmup_s,
        "samples_after_warmup": sum(1 for s in led if s["t"] >= first_leader + warmup_s),
        "h200_samples": len(h200), "h200_training_share": h200_training / len(h200) if h200 else 0.0,
        "h200_before_leader": h200_before, "h200_first_sample_s": h200_first_sample,
        "h200_at_first_leader": h200_at_leader,
        "h200_training_after_leader_s": h200_trains_at - first_leader if h200_trains_at is not None else None,
        "training_samples_per_node": dict(sorted(train_per_node.items())),
        "vram_committed_over_usable_per_node": per_node,
        "vram_committed_over_usable_per_gpu": dict(nodes),
        "stranded_samples": stranded_samples, "stranded_lasting_samples": stranded_lasting,
        "stranded_lasting_gpu_samples_per_node": dict(stranded_gpus),
        "stranded_examples": stranded_examples,
        "pending_reasons": dict(reasons.most_common()),
        "plans": len(plan_checks), "pending_checked_per_plan": len(first), "pending_checked_per_sample": len(checks),
        "agree_strict_share_per_plan": share(first, "strict"), "agree_strict_share_per_sample": share(checks, "strict"),
        "agree_names_one_share_per_plan": share(first, "names_one"),
        "pending_checked_settled": len(settled), "agree_strict_share_settled": share(settled, "strict"),
        "agree_names_one_share_settled": share(settled, "names_one"),
        "blockers_found_settled": dict(Counter(c for x in settled for c in x["found"])),
        "blockers_found_per_plan": dict(Counter(c for x in first for c in x["found"])),
        "causes_named_per_plan": dict(Counter(c for x in first for c in x["named"])),
        "plans_with_inputs": len(same_checks), "pending_checked_same_facts": len(same),
        "agree_strict_share_same_facts": share(same, "strict"),
        "agree_names_one_share_same_facts": share(same, "names_one"),
        "blockers_found_same_facts": dict(Counter(c for x in same for c in x["found"])),
        "causes_named_same_facts": dict(Counter(c for x in same for c in x["named"])),
        "disagreeing_same_facts": same_disagree[:show] if show >= 0 else same_disagree,
        "disagreeing": disagree[:show] if show >= 0 else disagree,
    }


def run(seconds: float, warmup_s: float, leader_timeout_s: float, show: int, selfplay_s: tuple[float, float],
        train_s: float, eval_s: float, keep: bool = False, samples_out: str = "", stagger_s: float = 0.0,
        seed_box: str = "cpu-a", host_resources: bool = False) -> dict[str, Any]:
    """Start the fleet, sample it, clean up, and :func:`analyse` the samples (written raw to ``samples_out``
    first, when given, for ``--analyse``)."""
    root = Path(tempfile.mkdtemp(prefix="p2pnode-seed003-"))
    fleet = None
    samples: list[dict[str, Any]] = []
    cleanup: dict[str, Any] = {}
    try:
        fleet = Fleet(root, selfplay_s=selfplay_s, train_s=train_s, eval_s=eval_s, host_resources=host_resources)
        t0 = time.monotonic()

        def tick() -> None:  # the H200 from its first answer on: what it runs before any leader is part of (1)
            samples.append(take_sample(fleet, time.monotonic() - t0))

        fleet.start(seed_box, stagger_s, tick=tick)
        fleet.wait_ready(90, tick=tick)
        ready_s = time.monotonic() - t0
        deadline = time.monotonic() + leader_timeout_s
        while True:  # wait for a leader, sampling (training on the H200 before any leader is part of the story)
            s = take_sample(fleet, time.monotonic() - t0)
            samples.append(s)
            if s.get("leader"):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no leader within {leader_timeout_s:g} s")
            time.sleep(1.0)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.monotonic()
            samples.append(take_sample(fleet, t - t0))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
        ids, nat_addr = dict(fleet.ids), dict(fleet.nat_addr)
    finally:
        if fleet is not None:
            cleanup = fleet.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    if samples_out:
        Path(samples_out).write_text(json.dumps({"ids": ids, "agents_ready_s": ready_s, "seconds": seconds,
                                                 "seed": seed_box, "stagger_s": stagger_s, "nat_addr": nat_addr,
                                                 "samples": samples}))
    out = analyse(samples, ids, warmup_s, show)
    return {"seconds": seconds, "seed": seed_box, "stagger_s": stagger_s, "host_resources": host_resources,
            "agents_ready_s": ready_s,
            "nat_addr": nat_addr, "cleanup": cleanup, "data_dir": str(root) if keep else None, **out}


def _report(r: dict[str, Any]) -> str:
    pct = lambda x: f"{x:.1%}" if x is not None else "n/a"  # noqa: E731
    lines = [f"seed 003's fleet (seed {r.get('seed')}, the others {r.get('stagger_s')} s after it): "
             f"{r['samples_after_leader']} samples once a leader exists (first leader "
             f"{r['first_leader_s']:.0f} s after the first agent started; all six answered after "
             f"{r['agents_ready_s']:.0f} s); the 5090 behind NAT advertised {r.get('nat_addr')}",
             f"(1) the H200 runs a training in {pct(r['h200_training_share'])} of {r['h200_samples']} samples; it ran "
             f"{r['h200_before_leader'] or 'nothing'} before the first leader (sampled from "
             f"{r.get('h200_first_sample_s') or 0:.0f} s), {r.get('h200_at_first_leader') or 'nothing'} when the "
             f"leader was first seen; its first training " + (
                 f"{r['h200_training_after_leader_s']:.0f} s after that" if r.get("h200_training_after_leader_s")
                 is not None else "never") + "; training samples per node:",
             *(f"      {k} {c}" for k, c in r["training_samples_per_node"].items()),
             f"(2) committed VRAM / usable (VRAM x gpu_max_percent) after {r['warmup_s']:g} s of warm-up "
             f"({r['samples_after_warmup']} samples), per node: min over samples and GPUs, mean, lowest GPU's mean:"]
    for n, x in sorted(r["vram_committed_over_usable_per_node"].items()):
        modes = ", ".join(f"{k:g} GiB x{c}" for k, c in sorted(x["committed_gib_modes"].items()))
        lines.append(f"    {n:8s} {x['gpus']} GPU(s): min {x['min']:.0%}, mean {x['mean']:.0%}, lowest GPU mean "
                     f"{x['lowest_gpu_mean']:.0%}; mean {x['committed_gib_mean']:.1f} GiB committed per GPU "
                     f"(most often per GPU: {modes})")
        if x.get("held_mean") is not None:
            lines.append(f"             holding work or fitting waiting work: min {x['held_min']:.0%}, mean "
                         f"{x['held_mean']:.0%}, lowest GPU mean {x['held_lowest_gpu_mean']:.0%} "
                         f"({x['unwanted_gpu_samples']} GPU-samples empty with nothing waiting that fits, left out)")
    lines.append(f"(3) samples after warm-up with a usable remainder a waiting GPU template could take (VRAM >= its "
                 f"floor under the cap, its fraction, its tiers): "
                 f"{r['stranded_samples']}; with one free for >= {PERSIST_S:g} s: {r['stranded_lasting_samples']} "
                 f"(GPU-samples per node: {r['stranded_lasting_gpu_samples_per_node']})")
    lines += [f"    {e}" for e in r["stranded_examples"]]
    lines.append(f"(4) pending reasons of the {r.get('plans_with_inputs', 0)} plans whose inputs the leader served "
                 f"(GET /plan?inputs=1): {r.get('pending_checked_same_facts', 0)}; agree with the blockers recomputed "
                 f"from the facts that plan was computed from (names every one found, nothing else): "
                 f"{pct(r.get('agree_strict_share_same_facts'))}; names at least one: "
                 f"{pct(r.get('agree_names_one_share_same_facts'))}")
    lines.append(f"    blockers found: {r.get('blockers_found_same_facts')}; causes named: "
                 f"{r.get('causes_named_same_facts')}")
    for c in r.get("disagreeing_same_facts") or ():
        lines.append(f"      t={c['t']}s plan {c['plan']} {c['template']}: named {c['named']}, found {c['found']} "
                     f"per node {c['per_node']}\n        {c['reason']}")
    lines.append(f"    the same against fresher facts (each node's own /status, read about when the plan appeared): "
                 f"pending reasons of {r['plans']} plans: {r['pending_checked_per_plan']}; agree with the "
                 f"recomputed blockers (names every one found, nothing else): {pct(r['agree_strict_share_per_plan'])} "
                 f"(weighted by samples: {pct(r['agree_strict_share_per_sample'])} of "
                 f"{r['pending_checked_per_sample']}); names at least one: {pct(r['agree_names_one_share_per_plan'])}")
    lines.append(f"    settled plans only (every node's offer and level unchanged over the {SETTLE_SAMPLES} samples "
                 f"before the plan appeared): {r['pending_checked_settled']} reasons, agree "
                 f"{pct(r['agree_strict_share_settled'])}, name at least one {pct(r['agree_names_one_share_settled'])}"
                 f"; blockers found {r['blockers_found_settled']}")
    lines.append(f"    blockers found: {r['blockers_found_per_plan']}; causes named: {r['causes_named_per_plan']}")
    lines.append("    reasons sampled (count):")
    lines += [f"      {c:4d}  {reason}" for reason, c in list(r["pending_reasons"].items())[:15]]
    if r["disagreeing"]:
        lines.append("    disagreeing with fresher facts (named: what the reason says; found: recomputed blockers):")
        for c in r["disagreeing"]:
            unsettled = "" if c["settled"] else " (unsettled)"
            lines.append(f"      t={c['t']}s plan {c['plan']}{unsettled} {c['template']}: named {c['named']}, "
                         f"found {c['found']} "
                         f"per node {c['per_node']}\n        {c['reason']}")
    return "\n".join(lines)


def _span(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition("-")
    return float(lo), float(hi or lo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=180.0, help="seconds of samples once a leader exists (180)")
    ap.add_argument("--warmup", type=float, default=30.0,
                    help="seconds after the first leader before VRAM figures count (30)")
    ap.add_argument("--leader-timeout", type=float, default=120.0)
    ap.add_argument("--selfplay-s", default="30-90", help="selfplay run time, LO-HI seconds (30-90)")
    ap.add_argument("--train-s", type=float, default=900.0, help="training run time, seconds (900)")
    ap.add_argument("--eval-s", type=float, default=60.0, help="evaluation run time, seconds (60)")
    ap.add_argument("--seed", choices=[b.name for b in FLEET], default="cpu-a",
                    help="the box every other joins, started first (cpu-a: the GPU-less coordinator, as seed 003's)")
    ap.add_argument("--stagger", type=float, default=0.0,
                    help="seconds between the seed answering and the other five starting (0: all at once)")
    ap.add_argument("--host-resources", action="store_true",
                    help="declare no CPUs and memory: each agent gives jobs this host's (what an agent without "
                         "--resource does)")
    ap.add_argument("--show", type=int, default=10, help="disagreeing reasons to print (10; -1 all)")
    ap.add_argument("--keep", action="store_true", help="keep the agents' data directories (logs)")
    ap.add_argument("--samples-out", metavar="FILE", default="", help="write the raw samples (JSON) to FILE")
    ap.add_argument("--analyse", metavar="FILE", default="",
                    help="analyse the samples of an earlier --samples-out FILE; starts no fleet")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    if ns.analyse:
        raw = json.loads(Path(ns.analyse).read_text())
        r = {"seconds": raw["seconds"], "seed": raw.get("seed"), "stagger_s": raw.get("stagger_s"),
             "agents_ready_s": raw["agents_ready_s"],
             "nat_addr": raw.get("nat_addr"), "cleanup": {}, "data_dir": None,
             **analyse(raw["samples"], raw["ids"], ns.warmup, ns.show)}
        print(json.dumps(r, indent=2) if ns.json else _report(r))
        return 0
    why = netns_refusal()
    if why:
        print(f"seed003_fleet: {why}; nothing was measured", file=sys.stderr)
        return 2

    def _stop(signum, frame):  # SIGTERM cleans up as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    r = run(ns.seconds, ns.warmup, ns.leader_timeout, ns.show, _span(ns.selfplay_s), ns.train_s, ns.eval_s, ns.keep,
            ns.samples_out, ns.stagger, ns.seed, ns.host_resources)
    print(json.dumps(r, indent=2) if ns.json else _report(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
