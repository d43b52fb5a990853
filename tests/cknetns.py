"""Issue 41's acceptance in network namespaces (driven by ``tests/test_netns_checkpoint.py``,
``bench/checkpoint_resume.py`` and ``bench/checkpoint_fetch.py``): three agents, one durable without a GPU (the
only voter: the leader) and two ephemeral with a fake GPU, each in its own namespace on one bridge; a training
template whose job steps once a second, logs each step with its time to a JSON-lines file the driver reads, and
writes a checkpoint holding its step number by atomic rename every ``ck_every`` steps (and on its checkpoint signal,
SIGUSR1); it starts from the step in ``P2PNODE_RESUME_FROM``.

What a run observes, besides the job's own log: every 0.5 s the training processes alive (``/proc``: the namespaces
share the PID namespace, so one scan sees every node's jobs) and the checkpoints the durable node holds whole (its
``<data_dir>/.sync/held-checkpoints/*.ck``, each decoded once, timed when first seen). A node is killed as a box
that vanishes: SIGKILL to every process of its namespace (``ip netns pids``: the agent, the job's wrapper, the job).
Everything a run builds is removed by it."""

from __future__ import annotations

import contextlib
import filecmp
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from agents import AgentProc, wait_until
from netns import NetnsLab

from p2pnode.synccore import decode_signed_checkpoint

PORT = 8770
STEP_S = 1.0
CK_EVERY = 5
"""Steps between checkpoints: a checkpoint every 5 s (the acceptance's interval)."""
ORPHAN_GRACE_S = 3.0
INTERVAL_S = 1.0
GRACE_S = 20
"""The template's ``[job.checkpoint] grace_s``: how long a stop that can wait holds for the signalled checkpoint."""

TRAIN = r'''
import json, os, signal, sys, time
log, step_s, every, size = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ck = os.environ["P2PNODE_CHECKPOINT_DIR"]
resume = os.environ.get("P2PNODE_RESUME_FROM", "")
ident = {"job": os.environ["P2PNODE_JOB_ID"], "node": os.environ["P2PNODE_NODE_ID"], "pid": os.getpid()}

def emit(**kw):
    with open(log, "a") as f:
        f.write(json.dumps({**ident, "t": time.time(), **kw}) + "\n")

step = 0
if resume:
    with open(resume, "rb") as f:
        step = int(f.readline())
emit(ev="start", step=step, resume=resume)
os.makedirs(ck, exist_ok=True)
asked = []
signal.signal(signal.SIGUSR1, lambda *a: asked.append(time.time()))

def on_term(*a):
    emit(ev="term", step=step)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)

def save(why):  # a checkpoint on the signal is a new entry even at the step of the last one
    name = "step-%06d" % step + ("-signal" if why == "signal" else "")
    tmp = os.path.join(ck, ".step.tmp")
    with open(tmp, "wb") as f:
        f.write(b"%d\n" % step)
        left = size - f.tell()
        while left > 0:
            n = min(left, 1 << 20)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ck, name))
    emit(ev="ck", step=step, why=why, name=name)

if not resume and every == 0:
    save("once")
t_next = time.time() + step_s
while True:
    while time.time() < t_next and not asked:
        time.sleep(min(0.05, max(0.0, t_next - time.time())))
    if asked:
        asked.clear()
        save("signal")
        continue
    t_next += step_s
    step += 1
    emit(ev="step", step=step)
    if every and step % every == 0:
        save("interval")
'''

ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": str(INTERVAL_S),
       "P2PNODE_SCHEDULER_ORPHAN_GRACE_S": str(ORPHAN_GRACE_S), "P2PNODE_SCHEDULER_ADOPT_GRACE_S": "5",
       "P2PNODE_SYNC_INTERVAL_S": "1", "P2PNODE_SYNC_SETTLE_S": "0.5",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}


def catalog(train: Path, log: Path, *, ck_every: int = CK_EVERY, size: int = 0, grace_s: int = GRACE_S) -> str:
    return f"""
[[job]]
name = "train"
kind = "training"
config = "c"
max_concurrency = 1
argv = ["{{python}}", "{train}", "{log}", "{STEP_S}", "{ck_every}", "{size}"]
[job.resources]
num_gpus = 1
vram_gib = 4
num_cpus = 0.1
[job.checkpoint]
dir = "ck/{{config}}"
signal = "SIGUSR1"
grace_s = {grace_s}
"""


def events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def step_of(name: str) -> int:
    """The step a checkpoint's name holds (``step-000010``, ``step-000010-signal``)."""
    return int(name.split("-")[1])


def ns_pids(name: str) -> list[int]:
    r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


class Cluster:
    """The three agents (index 0 durable, 1 and 2 ephemeral) in ``base``; :meth:`close` removes everything."""

    def __init__(self, base: Path, *, net: int, ck_every: int = CK_EVERY, size: int = 0,
                 env: dict[str, str] | None = None) -> None:
        self.base = base
        self.train, self.log = base / "train.py", base / "steps.jsonl"
        self.train.write_text(TRAIN)
        cat = base / "catalog.toml"
        cat.write_text(catalog(self.train, self.log, ck_every=ck_every, size=size))
        self.lab = NetnsLab(3, net=net, host_link=True)
        self.procs: list[AgentProc] = []
        self.ids: dict[str, int] = {}
        try:
            for i in range(3):
                if i == 0:
                    args = ["--tag", "durable", "--tag", "voter"]
                else:
                    args = ["--tag", "ephemeral", "--fake-gpus", "RTX 4090", "--join", f"{self.lab.addrs[0]}:{PORT}"]
                self.procs.append(AgentProc(base / f"n{i}", PORT, "--no-mdns", "--catalog", str(cat), *args,
                                            bind=self.lab.addrs[i], prefix=self.lab.prefix_for(i),
                                            env={**os.environ, **ENV, **(env or {})}).start())
            for i, p in enumerate(self.procs):
                self.ids[p.wait_ready(120)["node"]["id"]] = i
        except BaseException:
            self.close()
            raise

    def get(self, i: int, path: str) -> dict:
        return self.procs[i].get(path, timeout=5)

    def trainings(self) -> list[int]:
        """Pids of the live training processes of this cluster (any node)."""
        me = str(self.train).encode()
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
                if len(argv) < 2 or argv[1] != me or not os.path.basename(argv[0]).startswith(b"python"):
                    continue
                with open(f"/proc/{name}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        continue
            except (OSError, IndexError):
                continue
            out.append(int(name))
        return out

    def held(self) -> dict[str, tuple[str, float]]:
        """Digest (hex) -> (name, when held: the time its signed checkpoint was written into the durable node's
        held-checkpoints, wall-clock) of the checkpoints the durable node holds whole now."""
        out = {}
        for p in (self.base / "n0" / ".sync" / "held-checkpoints").glob("*.ck"):
            with contextlib.suppress(Exception):
                _, body = decode_signed_checkpoint(p.read_bytes())
                out[p.stem] = (body.name, p.stat().st_mtime)
        return out

    def kill_node(self, i: int) -> int:
        """SIGKILL every process of node ``i``'s namespace until none is left; how many were killed."""
        killed: set[int] = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = ns_pids(self.lab.names[i])
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            time.sleep(0.05)
        with contextlib.suppress(Exception):
            self.procs[i].proc.wait(5)
        return len(killed)

    def cli(self, i: int, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "p2pnode", *args, "--url", self.procs[i].url],
                              capture_output=True, text=True, timeout=60, check=False)

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.kill()
        for name in self.lab.names:
            for pid in ns_pids(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in self.trainings():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.lab.close()


class Sampler(threading.Thread):
    """Every 0.5 s: the training processes alive (``samples``: ``(time, pids)``) and the checkpoints the durable
    node holds (``held_at``: checkpoint name -> when it was held, the mtime of its file in held-checkpoints;
    wall-clock seconds, comparable with the job's log). Sampling every 0.5 s misses no checkpoint: the durable node
    keeps 3 per config."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.c = cluster
        self.samples: list[tuple[float, list[int]]] = []
        self.held_at: dict[int, float] = {}
        self.seen: set[str] = set()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            now = time.time()
            self.samples.append((now, self.c.trainings()))
            with contextlib.suppress(OSError):
                for digest, (name, at) in self.c.held().items():
                    if digest not in self.seen:
                        self.seen.add(digest)
                        self.held_at.setdefault(name, at)
            self.halt.wait(0.5)

    def held_by(self, t: float) -> int | None:
        """The newest step the durable node held whole at ``t``."""
        return max((step_of(n) for n, at in self.held_at.items() if at <= t), default=None)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)


def _running(c: Cluster) -> dict | None:
    """The current training run: its start event (the newest start), once it has written two checkpoints."""
    ev = events(c.log)
    starts = [e for e in ev if e["ev"] == "start"]
    if not starts:
        return None
    s = starts[-1]
    cks = [e for e in ev if e["ev"] == "ck" and e["job"] == s["job"]]
    return s if len(cks) >= 2 else None


def resume_run(base: Path, *, seed: int, notice: bool = False, net: int = 41) -> dict:
    """One run under ``base`` (see the module docstring): the training runs on an ephemeral node and writes two
    checkpoints, a seeded fraction of a checkpoint interval later its node is killed (``notice``: its agent gets
    SIGTERM instead, a clean stop that warns the job), and the run waits for the training to start again on the
    other ephemeral node. Returns the figures (times in seconds after the kill): ``ran_again_s``, ``suspect_s`` and
    ``dead_s`` (the durable node, the leader, saw the node suspect, then dead or leaving), ``placed_s`` (the taker's
    ``/jobs`` showed the training), ``resumed`` (the step it started from), ``held_at_kill`` (the newest checkpoint
    the durable node held whole at the kill), ``last_step`` (the killed run's last step), ``lost_steps``,
    ``sync_lag_s`` (per checkpoint of the killed run, written to held; median and max), ``most`` (trainings at once
    in any sample), and with ``notice`` ``signal_ck`` (the step the signalled checkpoint holds), ``job_stopped_s``,
    ``signal_ck_held_s`` (None: never held)."""
    rnd = random.Random(seed)
    c = Cluster(base, net=net)
    sampler = Sampler(c)
    try:
        sampler.start()
        first = wait_until(lambda: _running(c), 240, interval=0.5, what="the training writing two checkpoints")
        victim = c.ids[first["node"]]
        other = 3 - victim
        time.sleep(rnd.uniform(0.0, CK_EVERY * STEP_S))  # the seeded point within a checkpoint interval
        t_kill = time.time()
        if notice:
            c.procs[victim].proc.send_signal(signal.SIGTERM)
        else:
            c.kill_node(victim)
        marks: dict[str, float] = {}
        victim_id = next(k for k, v in c.ids.items() if v == victim)

        def again():
            now = time.time()
            if "dead" not in marks:
                with contextlib.suppress(httpx.HTTPError):
                    m = {x["id"]: x for x in c.get(0, "/members")["members"]}.get(victim_id)
                    if m is None or m["state"] != "alive" or m.get("leaving"):
                        marks.setdefault("suspect", now)
                    if m is None or m["state"] in ("dead", "left") or m.get("leaving"):
                        marks["dead"] = now
            if "placed" not in marks:
                with contextlib.suppress(httpx.HTTPError):
                    js = c.get(other, "/jobs")
                    if any(j["template"] == "train" for j in js["running"]) or js.get("fetching_checkpoints"):
                        marks["placed"] = now
            return next((e for e in events(c.log) if e["ev"] == "start" and e["node"] != first["node"]), None)

        s2 = wait_until(again, 240, interval=0.25, what="the training started on the other node")
        # one more sample after it runs (it is in /proc once its start line is written)
        n = len(sampler.samples)
        wait_until(lambda: len(sampler.samples) >= n + 2, 10, interval=0.1, what="two more samples")
        if notice:  # the signalled checkpoint may reach the durable node after the stop: give it a few seconds
            wait_until(lambda: c.procs[victim].proc.poll() is not None, 60, interval=0.2, what="the agent's exit")
        sampler.stop()
        held_at_kill = sampler.held_by(t_kill)
        ev = events(c.log)
        mine = [e for e in ev if e["job"] == first["job"]]
        cks = [e for e in mine if e["ev"] == "ck"]
        lags = [sampler.held_at[e["name"]] - e["t"] for e in cks if e["name"] in sampler.held_at]
        last_step = max(e["step"] for e in mine if e["ev"] in ("step", "start", "term"))
        r = {"seed": seed, "victim": victim, "ran_again_s": round(s2["t"] - t_kill, 2),
             "suspect_s": round(marks["suspect"] - t_kill, 2) if "suspect" in marks else None,
             "dead_s": round(marks["dead"] - t_kill, 2) if "dead" in marks else None,
             "placed_s": round(marks["placed"] - t_kill, 2) if "placed" in marks else None,
             "resumed": s2["step"], "resume_path": bool(s2["resume"]), "resumed_name": Path(s2["resume"]).name,
             "held_at_kill": held_at_kill,
             "last_ck": max(e["step"] for e in cks), "last_step": last_step,
             "lost_steps": last_step - s2["step"],
             "sync_lag_s": [round(statistics.median(lags), 2), round(max(lags), 2)] if lags else None,
             "most": max((len(p) for _, p in sampler.samples), default=0), "samples": len(sampler.samples)}
        if notice:
            sig = next((e for e in cks if e["why"] == "signal"), None)
            end = next((e["t"] for e in mine if e["ev"] == "term"), None)
            r["signal_ck"] = sig["step"] if sig else None
            r["job_stopped_s"] = round(end - t_kill, 2) if end else None
            held = sampler.held_at.get(sig["name"]) if sig else None
            r["signal_ck_held_s"] = round(held - t_kill, 2) if held else None
        return r
    finally:
        sampler.stop()
        c.close()


def cp_sync_s(src: Path, dst: Path) -> float:
    """Seconds for ``cp src dst`` then ``sync dst`` (its data on disk, as the fetch's fsync); ``dst`` removed."""
    t0 = time.monotonic()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    subprocess.run(["sync", str(dst)], check=True)
    took = time.monotonic() - t0
    dst.unlink()
    return took


def corrupt_replica(c: Cluster, name: str, *, at: float = 0.5) -> tuple[Path, int, int]:
    """Flip 64 bytes inside the block at fraction ``at`` of the durable node's replica of checkpoint ``name`` (its
    mtime and size kept: what the durable node's index says of it stays true, only the bytes lie); its path, the
    block's index and the file's number of blocks."""
    (ck,) = list((c.base / "n0" / ".sync" / "held-checkpoints").glob("*.ck"))
    _, body = decode_signed_checkpoint(ck.read_bytes())
    (replica,) = [p for p in (c.base / "n0").rglob(name) if p.is_file() and "resume" not in p.parts]
    st = replica.stat()
    f0 = body.files[0]
    block = int(f0.size * at) // f0.block_size
    off = block * f0.block_size + min(100, f0.size - block * f0.block_size - 64)
    with open(replica, "r+b") as f:
        f.seek(off)
        data = f.read(64)
        f.seek(off)
        f.write(bytes(b ^ 0xFF for b in data))
        f.flush()
        os.fsync(f.fileno())
    os.utime(replica, ns=(st.st_atime_ns, st.st_mtime_ns))
    return replica, block, -(-f0.size // f0.block_size)


def fetch_run(base: Path, *, size: int, corrupt: bool, net: int = 43, rate_mbit: int | None = None) -> dict:
    """One checkpoint of ``size`` bytes fetched by the node that takes the training over (see the module docstring): the
    training writes it once at its start; once the durable node holds it, the node running it is killed (the durable
    node the only holder left), or with ``corrupt`` the middle block of the durable node's replica is flipped and the
    node running the training is cordoned and its job stopped by the operator (``p2pnode node cordon``, ``p2pnode jobs
    stop``: that node stays up, a second holder of the checkpoint); the other ephemeral node takes the training over and
    fetches the checkpoint (the durable holder first). Returns ``fetch_s`` (the taker's ``/jobs`` goodput ``fetch_s``:
    deciding, fetching, verifying, fsync), ``fetch_window_s`` (first seen fetching in its ``/jobs`` -> the job's start
    line), ``cp_sync_s`` (cp + sync of the origin's file on this machine, median of 3: before, between, after), ``same``
    (the fetched file equals the origin's), ``cut_off`` (the taker's log lines of a reply cut off and asked again),
    ``refusals`` (the taker's log lines of a holder refused: its block hashes do
    not bind to the signed root, ``bad_hashes``, or a block does not match its hash, ``bad_block``), ``resumed``,
    ``split`` (the taker's own account of the fetch: its time, and of that the block hashes, the data channel, HTTP)."""
    c = Cluster(base, net=net, ck_every=0, size=size)
    try:
        first = wait_until(lambda: next((e for e in events(c.log) if e["ev"] == "ck"), None), 300, interval=0.5,
                           what="the checkpoint written")
        origin = c.ids[first["node"]]
        other = 3 - origin
        if rate_mbit:  # what reaches the taker through the bridge, at most this rate (its fetch; not the sync)
            c.lab.sh(c.lab.hub, "tc", "qdisc", "add", "dev", f"{c.lab.prefix}b{other}", "root", "tbf", "rate",
                     f"{rate_mbit}mbit", "burst", "256kb", "latency", "100ms")
        src = c.base / f"n{origin}" / "data" / "ck" / "c" / first["name"]
        wait_until(lambda: any(n == first["name"] for n, _ in c.held().values()), 600, interval=0.5,
                   what="the durable node holding the checkpoint")
        cps = [cp_sync_s(src, base / "cp-copy")]
        block = blocks = None
        if corrupt:
            _, block, blocks = corrupt_replica(c, first["name"])
        origin_id = next(k for k, v in c.ids.items() if v == origin)
        if corrupt:
            for args in (("node", "cordon", origin_id), ("jobs", "stop", first["job"])):
                out = c.cli(origin, *args)
                assert out.returncode == 0, (args, out.stdout, out.stderr)
        else:
            c.kill_node(origin)
        seen: dict[str, float] = {}

        def started():
            with contextlib.suppress(httpx.HTTPError):
                if c.get(other, "/jobs").get("fetching_checkpoints"):
                    seen.setdefault("fetching", time.time())
            return next((e for e in events(c.log) if e["ev"] == "start" and e["node"] != first["node"]), None)

        s2 = wait_until(started, 600, interval=0.2, what="the training started on the other node")
        g = wait_until(lambda: c.get(other, "/jobs")["goodput"].get("c"), 30, what="the taker's goodput")
        cps.append(cp_sync_s(src, base / "cp-copy"))
        same = bool(s2["resume"]) and filecmp.cmp(src, s2["resume"], shallow=False)
        cuts = sum("cut off at" in ln for ln in (c.base / f"n{other}.log").read_text(errors="replace").splitlines())
        cps.append(cp_sync_s(src, base / "cp-copy"))
        log = (c.base / f"n{other}.log").read_text(errors="replace")
        return {"size": size, "corrupt": corrupt, "block": block, "blocks": blocks, "fetch_s": round(g["fetch_s"], 2),
                "fetch_window_s": round(s2["t"] - seen["fetching"], 2) if "fetching" in seen else None,
                "cp_sync_s": round(statistics.median(cps), 2), "cp_sync_all_s": [round(x, 2) for x in cps],
                "same": same, "resumed": s2["step"], "resume": s2["resume"], "cut_off": cuts,
                "refusals": [ln[-160:] for ln in log.splitlines()
                             if "do not match its signed root" in ln or "does not match its hash" in ln],
                "split": next((ln.split(" bytes in ", 1)[1] for ln in log.splitlines() if " fetched, " in ln
                               and " bytes in " in ln), None)}
    finally:
        c.close()
