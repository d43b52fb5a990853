"""Cost of running agents: N agents on loopback for T seconds, each agent's CPU time per second of wall time
and RSS, next to an idle Python process measured in the same run (the baseline).

    python bench/agents_idle.py                 # 10 agents, 60 s
    python bench/agents_idle.py --agents 5 --seconds 20 --json
    python bench/agents_idle.py --seconds 1800 --rss-every 30   # the 30-minute soak: RSS sampled over the window
    python bench/agents_idle.py --voters 3      # 3 voters and 7 workers (untagged: every member votes)

The agents form one cluster (each joins the first), mDNS off, the default gossip (1 s rounds, fanout 3, one peer
a quiet round, a heartbeat every second) and sampling (1 s). CPU time is user+system of the process from psutil,
measured from the moment every agent has seen the whole cluster, so start-up (imports, key creation) is not
counted.

Bytes: the loopback interface's ``tx_bytes`` over the same window, divided by the agents (every byte an agent sends
another one crosses ``lo`` once). Meaningful only when nothing else uses that loopback: run the bench in a network
namespace of its own (``ip netns add idle && ip netns exec idle ip link set lo up && ip netns exec idle python
bench/agents_idle.py``; ``ip netns del idle`` after), where ``lo_private`` is printed true.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lo_tx_bytes() -> int:
    """``tx_bytes`` of this network namespace's loopback interface."""
    return int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())


def lo_private() -> bool:
    """Whether ``lo`` is this network namespace's only interface (a namespace made for the bench: nothing else
    sends on its loopback)."""
    return sorted(os.listdir("/sys/class/net")) == ["lo"]


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def soak(agents: list[psutil.Process], t0: float, seconds: float, every: float) -> list[list[int]]:
    """Wait ``seconds`` from ``t0``; with ``every`` > 0, sample each agent's RSS (bytes) every ``every`` seconds on
    the way (one row per sample, one column per agent), the first sample at ``t0``."""
    rows: list[list[int]] = []
    end = t0 + seconds
    while every > 0:
        rows.append([p.memory_info().rss for p in agents])
        nxt = t0 + len(rows) * every
        if nxt > end:
            break
        time.sleep(max(0.0, nxt - time.monotonic()))
    time.sleep(max(0.0, end - time.monotonic()))
    if every > 0 and end - (t0 + (len(rows) - 1) * every) > 1.0:
        rows.append([p.memory_info().rss for p in agents])
    return rows


def rss_summary(rows: list[list[int]]) -> dict:
    """Flatness of RSS samples: per agent, last over first and max over min of its series; flat within 5 % when
    every agent's series stays within 5 % of its own minimum."""
    cols = list(zip(*rows))
    growth = [c[-1] / c[0] - 1 for c in cols]
    spread = [max(c) / min(c) - 1 for c in cols]
    return {"samples": len(rows), "first_mib": statistics.mean(c[0] for c in cols) / 2**20,
            "last_mib": statistics.mean(c[-1] for c in cols) / 2**20, "min_growth": min(growth),
            "max_growth": max(growth), "max_spread": max(spread), "flat_within_5pct": max(spread) <= 0.05,
            "mean_mib_by_sample": [round(statistics.mean(r) / 2**20, 2) for r in rows]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--voters", type=int, default=0, metavar="K",
                    help="tag the first K agents `voter` (a fleet's shape: a few durable voters, workers besides; "
                         "0, the default: no tag, every member votes)")
    ap.add_argument("--rss-every", type=float, default=0.0, metavar="S",
                    help="also sample every agent's RSS every S seconds over the window (a soak: is RSS flat?)")
    ns = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="p2pnode-bench-"))
    ports = [free_port() for _ in range(ns.agents)]
    env = {**os.environ, "P2PNODE_LOG_LEVEL": "warning", "P2PNODE_ALLOW_PRIVATE_ADVERTISE": "1"}
    procs = []
    baseline = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)"])
    try:
        for i, port in enumerate(ports):
            args = [sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(tmp / f"a{i}"), "--bind", "127.0.0.1",
                    "--port", str(port), "--no-mdns"]
            if i:
                args += ["--join", f"127.0.0.1:{ports[0]}"]
            if i < ns.voters:
                args += ["--tag", "voter"]
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if all(len(httpx.get(f"http://127.0.0.1:{p}/members", timeout=2, trust_env=False).json()["members"])
                       == ns.agents for p in ports):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            print("cluster did not converge within 60 s", file=sys.stderr)
            return 1
        watched = [psutil.Process(p.pid) for p in procs] + [psutil.Process(baseline.pid)]
        c0 = [cpu_s(p) for p in watched]
        b0 = lo_tx_bytes()
        t0 = time.monotonic()
        series = soak(watched[:-1], t0, ns.seconds, ns.rss_every)
        wall = time.monotonic() - t0
        b1 = lo_tx_bytes()
        c1 = [cpu_s(p) for p in watched]
        rss = [p.memory_info().rss for p in watched]
        status = httpx.get(f"http://127.0.0.1:{ports[0]}/status", timeout=2, trust_env=False).json()
    finally:
        for p in procs:
            p.terminate()
        baseline.terminate()
        for p in [*procs, baseline]:
            p.wait(10)

    per = [(c1[i] - c0[i]) / wall for i in range(len(watched))]
    agents = [{"agent": i, "cpu_s_per_s": per[i], "rss_mib": rss[i] / 2**20} for i in range(ns.agents)]
    base = {"cpu_s_per_s": per[-1], "rss_mib": rss[-1] / 2**20}
    mean_cpu = statistics.mean(a["cpu_s_per_s"] for a in agents)
    mean_rss = statistics.mean(a["rss_mib"] for a in agents)
    result = {
        "agents": ns.agents,
        "voters": ns.voters,
        "seconds": round(wall, 1),
        "per_agent": agents,
        "baseline_idle_python": base,
        "mean_agent_cpu_s_per_s": mean_cpu,
        "mean_agent_rss_mib": mean_rss,
        "rss_ratio_vs_idle_python": mean_rss / base["rss_mib"],
        "members_seen_by_agent0": len(status["members"]),
        "exchanges_ok_agent0": status["gossip"]["exchanges_ok"],
        "cpu_count": os.cpu_count(),
        "lo_bytes_per_agent_s": (b1 - b0) / wall / ns.agents,
        "lo_private": lo_private(),
    }
    if 0 < ns.voters < ns.agents:  # the tagged voters apart from the workers
        result["mean_voter_cpu_s_per_s"] = statistics.mean(a["cpu_s_per_s"] for a in agents[:ns.voters])
        result["mean_worker_cpu_s_per_s"] = statistics.mean(a["cpu_s_per_s"] for a in agents[ns.voters:])
    if series:
        result["rss_series"] = rss_summary(series)
    if ns.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{ns.agents} agents on loopback for {wall:.1f} s ({os.cpu_count()} cores); baseline = idle python process")
    print(f"{'process':<14}{'CPU s/s':>10}{'CPU %':>8}{'RSS MiB':>10}{'RSS × idle':>12}")
    for a in agents:
        print(f"agent {a['agent']:<8}{a['cpu_s_per_s']:>10.4f}{100 * a['cpu_s_per_s']:>8.2f}{a['rss_mib']:>10.1f}"
              f"{a['rss_mib'] / base['rss_mib']:>12.1f}")
    print(f"{'idle python':<14}{base['cpu_s_per_s']:>10.4f}{100 * base['cpu_s_per_s']:>8.2f}{base['rss_mib']:>10.1f}"
          f"{1.0:>12.1f}")
    print(f"mean agent: {mean_cpu:.4f} CPU s/s ({100 * mean_cpu:.2f} % of one core), {mean_rss:.1f} MiB RSS "
          f"({result['rss_ratio_vs_idle_python']:.1f}× the idle process)")
    if "mean_voter_cpu_s_per_s" in result:
        print(f"voters (agents 0-{ns.voters - 1}): {100 * result['mean_voter_cpu_s_per_s']:.2f} % of a core; workers: "
              f"{100 * result['mean_worker_cpu_s_per_s']:.2f} %")
    print(f"loopback bytes sent per agent per second: {result['lo_bytes_per_agent_s']:.0f} (own namespace: "
          f"{result['lo_private']})")
    if series:
        r = result["rss_series"]
        print(f"RSS over the window ({r['samples']} samples every {ns.rss_every:g} s): first {r['first_mib']:.1f} MiB, "
              f"last {r['last_mib']:.1f}, per agent last/first {r['min_growth']:+.2%} .. {r['max_growth']:+.2%}, "
              f"max over min of the series {r['max_spread']:.2%}; flat within 5 %: {r['flat_within_5pct']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
