"""``p2pnode status``: this node, the election, cluster totals and the members table, as the agent at ``--url``
sees them."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from ._client import read_view
from ._screen import fmt_age, watch, watch_error

__all__ = ["BUSY_GPU_UTIL_PERCENT", "add_status_parser", "cluster_totals", "scaling_lines"]


def add_status_parser(sub: Any, default_url: str) -> None:
    p = sub.add_parser("status", help="show the cluster as this agent sees it")
    p.add_argument("--url", default=default_url, help=f"agent URL (default $P2PNODE_URL or {default_url})")
    p.add_argument("--json", action="store_true", help="print the raw /status JSON")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the agent (default 5)")
    p.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
                   help="refresh in place every SECONDS (default 2) until Ctrl-C")
    p.set_defaults(func=_cmd_status)


_SHORT_GPU = re.compile(r"\b(NVIDIA|GeForce|Tesla|\d+GB|HBM\d?e?|SXM\d?|PCIe)\b|-", re.IGNORECASE)


def _gpu_summary(res: dict[str, Any]) -> str:
    gpus = res.get("gpus") or []
    if not gpus:
        return "none"
    counts: dict[str, int] = {}
    for g in gpus:
        name = _SHORT_GPU.sub("", str(g.get("name", "?"))).strip() or "?"
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n}× {m}" if n > 1 else m for m, n in counts.items())


def _pct(v: Any) -> str:
    return f"{v:.0f}%" if isinstance(v, (int, float)) else "-"


def _sync_cell(sync: dict[str, Any]) -> str:
    """``12 files (2 < R)`` for a pushing member, ``holds 35`` for a durable one, ``-`` otherwise."""
    parts = []
    if "files" in sync:
        under = sync.get("under_replicated", 0)
        parts.append(f"{sync['files']} files" + (f" ({under} < R)" if under else ""))
    if "receipts" in sync:
        parts.append(f"holds {sync['receipts']}")
    return ", ".join(parts) or "-"


BUSY_GPU_UTIL_PERCENT = 5.0
"""A GPU counts as busy in the cluster totals from this utilization on (the guard's idle threshold's default)."""
_UP_STATES = ("alive", "suspect")
_GIB = 2**30


def cluster_totals(members: list[dict[str, Any]], running_counts: dict[str, int] | None = None) -> dict[str, Any]:
    """Cluster totals over the members that are up (alive or suspect; the snapshots of dead and left members are
    stale), from each member's resources in ``/status``, like ``ray status``: GPUs (count, busy from
    ``BUSY_GPU_UTIL_PERCENT``, mean utilization), VRAM and memory (bytes used and total), CPUs (count, and in use:
    ``cpu_percent`` / 100 × ``cpu_count``), and running jobs (the sum of ``running_counts`` from ``/jobs``)."""
    t: dict[str, Any] = {"members": len(members), "up": 0, "gpus": 0, "gpus_busy": 0, "gpu_util_mean": None,
                         "vram_used_bytes": 0, "vram_total_bytes": 0, "cpus": 0, "cpus_used": 0.0,
                         "mem_used_bytes": 0, "mem_total_bytes": 0, "jobs": None}
    util = []
    for m in members:
        if m.get("state") not in _UP_STATES:
            continue
        t["up"] += 1
        res = m.get("resources") or {}
        for g in res.get("gpus") or []:
            t["gpus"] += 1
            u = g.get("util_percent") or 0.0
            util.append(u)
            t["gpus_busy"] += u >= BUSY_GPU_UTIL_PERCENT
            t["vram_used_bytes"] += g.get("mem_used_bytes") or 0
            t["vram_total_bytes"] += g.get("mem_total_bytes") or 0
        cpus = res.get("cpu_count") or 0
        t["cpus"] += cpus
        t["cpus_used"] += (res.get("cpu_percent") or 0.0) / 100 * cpus
        t["mem_used_bytes"] += res.get("mem_used_bytes") or 0
        t["mem_total_bytes"] += res.get("mem_total_bytes") or 0
    if util:
        t["gpu_util_mean"] = sum(util) / len(util)
    if running_counts is not None:
        t["jobs"] = sum(n for mid, n in running_counts.items()
                        if any(m["id"] == mid and m.get("state") in _UP_STATES for m in members))
    return t


def _totals_line(t: dict[str, Any]) -> str:
    """``cluster  3/3 members up  GPUs 2/3 busy (mean util 45%)  VRAM 60.0/184.0 GiB  CPUs 0.4/6  memory ...``"""
    util = f" (mean util {t['gpu_util_mean']:.0f}%)" if t["gpu_util_mean"] is not None else ""
    jobs = f"  [bold]jobs[/] {t['jobs']} running" if t["jobs"] is not None else ""
    return (f"[bold]cluster[/]  {t['up']}/{t['members']} members up  "
            f"[bold]GPUs[/] {t['gpus_busy']}/{t['gpus']} busy{util}  "
            f"[bold]VRAM[/] {t['vram_used_bytes'] / _GIB:.1f}/{t['vram_total_bytes'] / _GIB:.1f} GiB  "
            f"[bold]CPUs[/] {t['cpus_used']:.1f}/{t['cpus']}  "
            f"[bold]memory[/] {t['mem_used_bytes'] / _GIB:.1f}/{t['mem_total_bytes'] / _GIB:.1f} GiB{jobs}")


def _status_render(data: dict[str, Any], jobs: dict[str, Any] | None):
    """``p2pnode status`` as one rich renderable: this node, the election, cluster totals, the members table (with
    jobs per member from ``/jobs``, when it could be read), catalog mismatches, rejected gossip."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    out: list[Any] = []
    node = data["node"]
    trust = "open (any well-signed node may join)" if node.get("cluster_open") else node.get("trust")
    out.append(Text.from_markup(
        f"[bold]node[/] {node['id']}  [bold]addr[/] {node['addr']}  [bold]version[/] {node['version']}  "
        f"[bold]incarnation[/] {node.get('incarnation')}  [bold]trust[/] {trust}"))
    el = data.get("election") or {}
    vote = el.get("vote") or {}
    leader = el.get("leader") or "none (no quorum)"
    out.append(Text.from_markup(
        f"[bold]leader[/] {leader}  [bold]term[/] {el.get('term')}  "
        f"[bold]votes[/] {el.get('votes_for_leader')}/{el.get('voters')} (quorum {el.get('quorum')})  "
        f"[bold]our vote[/] {vote.get('candidate')} @ term {vote.get('term')}"))
    counts = (jobs or {}).get("running_counts") if jobs is not None else None
    out.append(Text.from_markup(_totals_line(cluster_totals(data["members"], counts))))
    table = Table(show_lines=False)
    for col in ("node", "name", "state", "inc", "address", "version", "age", "CPU", "mem", "disk", "GPUs", "power",
                "jobs", "sync"):
        right = col in ("inc", "version", "age", "CPU", "mem", "disk", "power", "jobs")
        table.add_column(col, justify="right" if right else "left", no_wrap=col != "GPUs")
    for m in data["members"]:
        res = m.get("resources") or {}
        label = " ".join(x for x in (m.get("name"), m.get("provider"), m.get("instance")) if x)  # the member's claim
        name = m["id"] + (" (self)" if m.get("self") else "") + (" ★" if m["id"] == el.get("leader") else "")
        njobs = counts.get(m["id"]) if counts is not None else None
        table.add_row(
            name,
            escape(label),
            m.get("state", "?") + (" draining" if m.get("draining") else " cordoned" if m.get("cordoned") else ""),
            str(m.get("incarnation", "")),
            m.get("addr", ""),
            str(m.get("version")),
            fmt_age(max(0.0, time.time() - m["received_at"]) if m.get("received_at") else None),  # agent's clock
            _pct(res.get("cpu_percent")),
            _pct(res.get("mem_percent")),
            _pct(res.get("disk_percent")),
            _gpu_summary(res),
            f"{m.get('power_score', 0):g}" + ("" if m.get("eligible", True) else " (not eligible)"),
            "-" if njobs is None else str(njobs),
            _sync_cell(m.get("sync") or {}),
        )
    out.append(table)
    mismatch = (data.get("catalog") or {}).get("mismatch") or []
    if mismatch:
        out.append(Text.from_markup(
            f"[bold red]catalog mismatch[/]: {', '.join(mismatch)} run another catalog than this node"))
    out.extend(Text.from_markup(line) for line in scaling_lines(data.get("scaling") or {}))
    rejected = data.get("gossip", {}).get("rejected") or {}
    if rejected:
        out.append(Text("rejected gossip: " + ", ".join(f"{k} {v}" for k, v in rejected.items())))
    return Group(*out)


def scaling_lines(sc: dict[str, Any]) -> list[str]:
    """``p2pnode status``'s scaling lines (rich markup): the provider, the cooldown left, one line per node class
    with the leader's verdict and reason, the newest actions, nodes draining, and a ``[scaling]`` mismatch."""
    from rich.markup import escape

    if not sc.get("classes") and not sc.get("verdicts"):
        return []
    provider = sc.get("provider") or "none (decisions only)"
    cool = sc.get("cooldown_left_s") or 0
    lines = [f"[bold]scaling[/] provider {escape(str(provider))}"
             + (f"  cooldown {cool:.0f} s left" if cool else "")
             + (f"  draining {', '.join(map(str, sc.get('draining') or []))}" if sc.get("draining") else "")]
    for v in sc.get("verdicts") or []:
        util = v.get("utilization")
        what = {"up": f"up {v.get('count')}", "down": f"down {', '.join(v.get('nodes') or [])}"}.get(
            v.get("verdict"), "hold")
        lines.append(f"  {escape(str(v.get('node_class')))}: {v.get('nodes_now')} nodes"
                     + (f", GPUs {util:.0%} used" if isinstance(util, (int, float)) else "")
                     + f", {v.get('queued')} waiting  [bold]{escape(what)}[/]: {escape(str(v.get('reason', '')))}")
    for a in (sc.get("ledger") or [])[-3:]:
        target = f"{a.get('count')} x {a.get('node_class')}" if a.get("op") == "up" else ", ".join(a.get("nodes", []))
        if a.get("for_templates"):
            target += f" for {', '.join(map(str, a['for_templates']))}"
        err = f" ({a.get('error')})" if a.get("error") else ""
        lines.append(f"  action {escape(str(a.get('id')))} {a.get('op')} {escape(target)}: "
                     f"{a.get('state')}{escape(err)}")
    if sc.get("mismatch"):
        lines.append(f"[bold red]scaling settings mismatch[/]: {', '.join(sc['mismatch'])} have another \\[scaling] "
                     "table than this node")
    return lines


def _cmd_status(ns: argparse.Namespace) -> int:
    from rich.console import Console

    url = ns.url.rstrip("/")
    if ns.watch is not None:
        if ns.json or ns.watch <= 0:
            print("p2pnode status: --watch takes a positive interval and no --json", file=sys.stderr)
            return 2

        def render():
            data, why = read_view(f"{url}/status", ns.timeout)
            return watch_error(why) if data is None else _status_render(data, read_view(f"{url}/jobs",
                                                                                           ns.timeout)[0])

        return watch(render, ns.watch)
    data, why = read_view(f"{url}/status", ns.timeout)
    if data is None:
        print(f"p2pnode status: {why}", file=sys.stderr)
        return 2
    if ns.json:
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    jobs, _ = read_view(f"{url}/jobs", ns.timeout)
    Console(width=None if sys.stdout.isatty() else 160).print(_status_render(data, jobs))
    return 0
