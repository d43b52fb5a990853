"""Command line: ``p2pnode agent | status | config show``.

Config precedence for the agent: flags > ``P2PNODE_*`` environment > TOML file (``--config`` or
``$P2PNODE_CONFIG``, else ``--config-if-exists`` when that file exists) > embedded defaults.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

# httpx imports its own command line (httpx._main: click, rich, pygments; ~5 MiB in every agent) whenever click
# is installed (import-linter brings it). p2pnode never uses it; httpx falls back to a stub on ImportError.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[assignment]

from . import __version__
from .config import DEFAULT_PORT, load_config
from .errors import P2PNodeError

__all__ = ["main"]


def _agent_overrides(ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    return {
        "agent": {
            "data_dir": ns.data_dir,
            "bind": ns.bind,
            "port": ns.port,
            "advertise": ns.advertise,
            "join": tuple(ns.join) if ns.join else None,
            "tags": tuple(ns.tag) if ns.tag else None,
            "fake_gpus": ns.fake_gpus,
            "fake_gpu_load": tuple(ns.fake_gpu_load) if ns.fake_gpu_load else None,
            "resources": tuple(ns.resource) if getattr(ns, "resource", None) else None,
            "catalog": ns.catalog,
            "log_level": ns.log_level,
        },
        "gossip": {"profile": ns.gossip_profile},
        "discovery": {
            "mdns": False if ns.no_mdns else None,
            "mdns_interfaces": tuple(ns.mdns_interface) if ns.mdns_interface else None,
        },
    }


def _load(ns: argparse.Namespace):
    path = ns.config or os.environ.get("P2PNODE_CONFIG") or None
    optional = getattr(ns, "config_if_exists", None)
    if path is None and optional and os.path.lexists(optional):  # present but unreadable or invalid: an error
        path = optional
    return load_config(Path(path) if path else None, overrides=_agent_overrides(ns))


def _cmd_agent(ns: argparse.Namespace) -> int:
    import trio

    from .agent import Agent

    config = _load(ns)
    logging.basicConfig(
        level=config.agent.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        _check_listen(config.agent.bind, config.agent.port)  # before the data dir is touched
        agent = Agent(config)
    except OSError as exc:
        return _startup_failed(exc, config)
    started = False

    async def main() -> None:
        nonlocal started
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(agent.run)
                started = True
                print(f"p2pnode agent {agent.node_id} on http://{agent.addr}  (data dir {agent.data_dir})",
                      file=sys.stderr, flush=True)
                async for signum in signals:
                    logging.getLogger("p2pnode").info("received %s, leaving", signal.Signals(signum).name)
                    agent.stop()
                    # Leaving is bounded by gossip.leave_timeout_s; never let shutdown exceed 2 s.
                    nursery.cancel_scope.deadline = trio.current_time() + 1.8
                    break

    try:
        trio.run(main)
    except Exception as exc:
        cause = None if started else _startup_cause(exc)
        if cause is None:
            raise
        return _startup_failed(cause, config)
    return 0


# Errors of bind(2) and getaddrinfo(3); any other OSError at startup concerns a file.
_LISTEN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})


def _check_listen(host: str, port: int) -> None:
    """Bind and release ``host:port`` as hypercorn will (``SO_REUSEADDR``, family by the address), so that a
    taken port or an absent address is reported before a key is created. Raises the ``OSError`` of bind; the
    agent's own bind can still fail after this check (a race), and is translated the same way."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))


def _startup_cause(exc: BaseException) -> OSError | P2PNodeError | None:
    """The error to report when ``exc`` (from ``trio.run``, perhaps nested in exception groups) holds only
    ``OSError`` and :class:`P2PNodeError` leaves; ``None`` when it holds anything else (a bug: keep the traceback)."""
    if isinstance(exc, (OSError, P2PNodeError)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        ours, rest = exc.split((OSError, P2PNodeError))
        while rest is None and isinstance(ours, BaseExceptionGroup):
            ours = ours.exceptions[0]
        if rest is None and ours is not None:
            return ours
    return None


def _startup_failed(exc: OSError | P2PNodeError, config: Any) -> int:
    """Print one line naming the cause and the remedy; exit status 2 (the user's to fix)."""
    print(f"p2pnode: {exc if isinstance(exc, P2PNodeError) else _startup_error(exc, config)}", file=sys.stderr)
    return 2


def _startup_error(exc: OSError, config: Any) -> str:
    """The cause and remedy of an ``OSError`` at startup: the listen address, or a file in the data dir."""
    a = config.agent
    listen = exc.errno in _LISTEN_ERRNOS or (exc.errno == errno.EACCES and not exc.filename)
    if listen or isinstance(exc, socket.gaierror):
        where = f"cannot listen on {f'[{a.bind}]' if ':' in a.bind else a.bind}:{a.port}"
        if isinstance(exc, socket.gaierror):
            return f"{where}: cannot resolve {a.bind!r} (choose --bind with an address or host name of this machine)"
        if exc.errno == errno.EADDRINUSE:
            return f"{where}: address already in use (another agent running? stop it or choose another --port)"
        if exc.errno == errno.EADDRNOTAVAIL:
            return (f"{where}: no interface of this machine has the address {a.bind} (choose --bind with one of "
                    "its addresses, or 0.0.0.0 for all)")
        if exc.errno == errno.EACCES:
            return f"{where}: permission denied (ports below 1024 need root; choose --port 1024 or above)"
        return f"{where}: {exc.strerror} (choose another --bind address)"
    data_dir = a.data_dir.absolute()
    path = Path(exc.filename) if exc.filename else data_dir
    other = "or choose another --data-dir"
    place = f"the data dir {data_dir}" if path == data_dir or data_dir in path.parents else str(path)
    if exc.errno == errno.EROFS:
        return f"{place} is on a read-only file system (remount it read-write, {other})"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        cause = "no space left" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        return f"cannot write to {place}: {cause} on its file system (free some space, {other})"
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        blocker = next((p for p in (*reversed(path.parents), path) if p.exists() and not p.is_dir()), None)
        if blocker == data_dir:
            return f"data dir {data_dir} is a file, not a directory (move the file away, {other})"
        if blocker is not None:
            return f"{blocker} is a file where a directory belongs (move the file away, {other})"
    if exc.errno == errno.EISDIR:
        return f"{path} is a directory where a file belongs (move the directory away, {other})"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"cannot use {path}: permission denied (run p2pnode as the user who owns the data dir, "
                f"fix its permissions, {other})")
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return f"cannot open {path}: too many open files (raise the limit, e.g. ulimit -n 4096)"
    return f"cannot use {path}: {exc.strerror or exc} (check the data dir {data_dir}, {other})"


def _fmt_age(age: float | None) -> str:
    if age is None:
        return "-"
    return f"{age:.1f}s" if age < 120 else f"{age / 60:.0f}m"


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
    for col in ("node", "state", "inc", "address", "version", "age", "CPU", "mem", "disk", "GPUs", "power", "jobs",
                "sync"):
        right = col in ("inc", "version", "age", "CPU", "mem", "disk", "power", "jobs")
        table.add_column(col, justify="right" if right else "left", no_wrap=col != "GPUs")
    for m in data["members"]:
        res = m.get("resources") or {}
        name = m["id"] + (" (self)" if m.get("self") else "") + (" ★" if m["id"] == el.get("leader") else "")
        njobs = counts.get(m["id"]) if counts is not None else None
        table.add_row(
            name,
            m.get("state", "?") + (" draining" if m.get("draining") else " cordoned" if m.get("cordoned") else ""),
            str(m.get("incarnation", "")),
            m.get("addr", ""),
            str(m.get("version")),
            _fmt_age(m.get("age_s")),
            _pct(res.get("cpu_percent")),
            _pct(res.get("mem_percent")),
            _pct(res.get("disk_percent")),
            _gpu_summary(res),
            f"{m.get('power_score', 0):g}",
            "-" if njobs is None else str(njobs),
            _sync_cell(m.get("sync") or {}),
        )
    out.append(table)
    mismatch = (data.get("catalog") or {}).get("mismatch") or []
    if mismatch:
        out.append(Text.from_markup(
            f"[bold red]catalog mismatch[/]: {', '.join(mismatch)} run another catalog than this node"))
    rejected = data.get("gossip", {}).get("rejected") or {}
    if rejected:
        out.append(Text("rejected gossip: " + ", ".join(f"{k} {v}" for k, v in rejected.items())))
    return Group(*out)


def _read_view(url: str, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """``(JSON, "")`` of a GET, or ``(None, why)``: unreachable, or protected (which token to set)."""
    import httpx

    try:
        resp = _get(url, timeout)
        if resp.status_code == 401:
            return None, (f"{url} protects its views: set P2PNODE_READ_TOKEN (agent.read_token) or a cluster token "
                          "(P2PNODE_CLUSTER_TOKEN, or run as the agent's user)")
        resp.raise_for_status()
        return resp.json(), ""
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"cannot reach agent at {url}: {exc}"


def _watch(render: Any, interval_s: float) -> int:
    """Redraw ``render()`` (a rich renderable) in place every ``interval_s`` seconds until Ctrl-C (exit 0)."""
    from rich.console import Console
    from rich.live import Live

    try:
        console = Console(width=None if sys.stdout.isatty() else 160)
        with Live(render(), console=console, auto_refresh=False, redirect_stderr=False) as live:
            while True:
                time.sleep(interval_s)
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        return 0


def _watch_error(why: str):
    from rich.text import Text

    return Text(f"{time.strftime('%H:%M:%S')} {why} (retrying)", style="red")


def _cmd_status(ns: argparse.Namespace) -> int:
    from rich.console import Console

    url = ns.url.rstrip("/")
    if ns.watch is not None:
        if ns.json or ns.watch <= 0:
            print("p2pnode status: --watch takes a positive interval and no --json", file=sys.stderr)
            return 2

        def render():
            data, why = _read_view(f"{url}/status", ns.timeout)
            return _watch_error(why) if data is None else _status_render(data, _read_view(f"{url}/jobs",
                                                                                           ns.timeout)[0])

        return _watch(render, ns.watch)
    data, why = _read_view(f"{url}/status", ns.timeout)
    if data is None:
        print(f"p2pnode status: {why}", file=sys.stderr)
        return 2
    if ns.json:
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    jobs, _ = _read_view(f"{url}/jobs", ns.timeout)
    Console(width=None if sys.stdout.isatty() else 160).print(_status_render(data, jobs))
    return 0


def _cmd_config_validate(ns: argparse.Namespace) -> int:
    """Exit 0 with "config OK", or 1 with every inconsistency (each message names the settings)."""
    from .errors import ConfigError

    try:
        _load(ns)
    except ConfigError as exc:
        print(f"p2pnode config validate: {exc}", file=sys.stderr)
        return 1
    print("config OK")
    return 0


def _cmd_config_show(ns: argparse.Namespace) -> int:
    config = _load(ns)
    json.dump(config.to_dict(), sys.stdout, indent=2)
    print()
    return 0


def _cmd_simulate(ns: argparse.Namespace) -> int:
    from .sim import format_report, simulate

    if ns.nodes < 2 or ns.fanout < 1 or not 0.0 <= ns.loss < 1.0 or ns.interval <= 0:
        print("p2pnode simulate: need --nodes >= 2, --fanout >= 1, 0 <= --loss < 1, --interval > 0", file=sys.stderr)
        return 2
    if ns.scenario == "scheduling":
        from .sim import format_scheduling_report, run_scheduling

        r = run_scheduling(ns.nodes, ns.configs, duration_s=ns.duration, seed=ns.seed)
        if ns.json:
            json.dump(r, sys.stdout, indent=2, default=str)
            print()
        else:
            print(format_scheduling_report(r))
        return 0 if r["violation_count"] == 0 else 1
    result = simulate(
        nodes=ns.nodes, fanout=ns.fanout, interval_s=ns.interval, loss=ns.loss, latency_ms=ns.latency_ms,
        seed=ns.seed, gossip_profile=ns.gossip_profile, cluster_nodes=ns.cluster_nodes,
        partition_runs=ns.partition_runs, partition_nodes=ns.partition_nodes,
    )
    if ns.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(format_report(result))
    return 0


def _cmd_guard(ns: argparse.Namespace) -> int:
    """This machine against the guard limits (no agent needed); or a disk-manager pass with ``cleanup``."""
    from .guard import get_resource_status, print_resource_status

    if getattr(ns, "guard_command", None) == "cleanup":
        return _cmd_guard_cleanup(ns)
    status = get_resource_status(ns.path)
    if ns.json:
        json.dump(status, sys.stdout, indent=2)
        print()
    else:
        print_resource_status(status=status)
    return 0


def _sync_root_predicate(config: Any) -> Any:
    """Paths (relative to the data dir) under the sync root, or None when the root lies outside the data dir."""
    data_dir = config.agent.data_dir.absolute()
    root = Path(config.sync.root).absolute() if config.sync.root else data_dir / "data"
    try:
        rel = root.relative_to(data_dir).as_posix()
    except ValueError:
        return None
    prefix = "" if rel in ("", ".") else rel + "/"
    return lambda path: path.startswith(prefix)


def _cmd_guard_cleanup(ns: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .guard import run_cleanup

    config = _load(ns)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if not config.agent.data_dir.is_dir():
        print(f"p2pnode guard cleanup: no data dir at {config.agent.data_dir}", file=sys.stderr)
        return 2
    # Offline the CLI cannot see receipts: on a node that pushes its data (tagged ephemeral), nothing in the sync
    # root is deleted here; the agent deletes there once R durable receipts confirm a file.
    protected = _sync_root_predicate(config) if "ephemeral" in config.agent.tags and config.sync.enabled else None
    result = run_cleanup(config.agent.data_dir, config.guard, dry_run=ns.dry_run,
                         protected=protected or (lambda path: False))
    if ns.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    console = Console()
    verb = "would delete" if result["dry_run"] else "deleted"
    console.print(f"disk at {result['usage_percent']:.1f} %, {verb} {len(result['done'])} files "
                  f"({result['freed_bytes']:,} bytes) -> {result['projected_percent']:.1f} % projected")
    table = Table()
    for col in ("file", "bytes", "rule", "why"):
        table.add_column(col, justify="right" if col == "bytes" else "left")
    for d in result["deletions"]:
        table.add_row(d["path"], f"{d['size_bytes']:,}", d["rule"], d["reason"])
    console.print(table)
    return 0


def _cmd_demo(ns: argparse.Namespace) -> int:
    """A cluster of agents on this machine until Ctrl-C (see :mod:`p2pnode._demo`)."""
    from ._demo import run_demo

    return run_demo(nodes=ns.nodes, base_port=ns.base_port, keep=ns.keep, gossip_profile=ns.gossip_profile)


def _cmd_completion(ns: argparse.Namespace) -> int:
    """Print a bash or zsh completion script generated from the parser (shtab; the extra p2pnode[completion])."""
    try:
        import shtab
    except ImportError:
        print("p2pnode completion: needs shtab (pip install 'p2pnode[completion]' or pip install shtab)",
              file=sys.stderr)
        return 2
    print(shtab.complete(build_parser(), shell=ns.shell))
    return 0


def _cmd_catalog_validate(ns: argparse.Namespace) -> int:
    """Exit 0 with a summary, or 1 with every error and its location."""
    from .scheduler import CatalogError, load_catalog

    try:
        c = load_catalog(Path(ns.file))
    except CatalogError as exc:
        print(f"p2pnode catalog validate: {exc}", file=sys.stderr)
        return 1
    kinds: dict[str, int] = {}
    for t in c.templates.values():
        kinds[t.kind] = kinds.get(t.kind, 0) + 1
    print(f"catalog OK: {len(c.templates)} templates ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}) "
          f"for {len(c.configs)} configs; digest {c.digest}")
    return 0


def _get_json(url: str, timeout: float) -> dict | None:
    import httpx

    try:
        resp = _get(url, timeout)
        if resp.status_code == 401:
            print(f"p2pnode: {url} is protected: set P2PNODE_READ_TOKEN (agent.read_token) or a cluster token",
                  file=sys.stderr)
            return None
        resp.raise_for_status()
        return resp.json()
    except httpx.HTTPError as exc:
        print(f"p2pnode: cannot read {url}: {exc}", file=sys.stderr)
        return None


def _fetch_view(ns: argparse.Namespace, path: str):
    """GET ``path`` from the agent at ``--url``. Returns ``(data, console)`` to render, or an exit code: 2 when
    the agent cannot be read (the reason printed), 0 after printing the raw JSON for ``--json``."""
    from rich.console import Console

    data = _get_json(f"{ns.url.rstrip('/')}{path}", ns.timeout)
    if data is None:
        return 2
    if ns.json:
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    return data, Console(width=None if sys.stdout.isatty() else 160)


def _members(ns: argparse.Namespace) -> list[dict]:
    """The members the agent at ``--url`` lists (raises ``httpx.HTTPError``, ``ValueError``, ``KeyError``)."""
    return _get(f"{ns.url.rstrip('/')}/members", ns.timeout).json()["members"]


def _url_of(ns: argparse.Namespace, node_id: str | None) -> str:
    """The URL of member ``node_id`` (a unique prefix is enough) as the agent at ``--url`` knows it; ``--url``
    itself for None. Raises ``LookupError`` naming what went wrong."""
    base = ns.url.rstrip("/")
    if not node_id:
        return base
    found = [m for m in _members(ns) if m["id"].startswith(node_id)]
    if len(found) != 1:
        raise LookupError(f"{len(found)} members match {node_id!r}" + ("" if found else " (p2pnode status lists them)"))
    m = found[0]
    return base if m.get("self") else f"http://{m['addr']}"


def _owner_urls(ns: argparse.Namespace, job_id: str) -> list[str]:
    """URLs to try for the node running or having run ``job_id``: the owner the agent's ``/jobs`` names first,
    then every live member."""
    base = ns.url.rstrip("/")
    urls: list[str] = []
    try:
        jobs = _get(f"{base}/jobs", ns.timeout).json()
        members = {m["id"]: m for m in _members(ns)}
        for r in jobs.get("cluster_running", []):
            if r.get("job_id") == job_id and r.get("node_id") in members:
                m = members[r["node_id"]]
                urls.append(base if m.get("self") else f"http://{m['addr']}")
        urls += [base if m.get("self") else f"http://{m['addr']}" for m in members.values()
                 if m.get("addr") and m.get("state") in ("alive", "suspect")]
    except (ValueError, KeyError, TypeError):
        urls.append(base)
    return list(dict.fromkeys(urls))


def _report(resp, what: str) -> int:
    """Print an operator route's answer: 0 when accepted, 1 refused (the reason printed)."""
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    if resp.status_code == 200:
        print(json.dumps(body) if not isinstance(body, str) else body)
        return 0
    print(f"p2pnode {what}: refused ({resp.status_code}): {body}", file=sys.stderr)
    return 1


def _cmd_jobs_op(ns: argparse.Namespace) -> int:
    """``p2pnode jobs run|stop|logs``."""
    import httpx

    what = f"jobs {ns.jobs_command}"
    try:
        if ns.jobs_command == "run":
            params: dict[str, Any] = {}
            for kv in ns.param or ():
                k, sep, v = kv.partition("=")
                if not sep:
                    print(f"p2pnode {what}: --param {kv!r}: expected KEY=VALUE", file=sys.stderr)
                    return 2
                try:
                    params[k] = json.loads(v)  # numbers and booleans typed, the rest a string
                except ValueError:
                    params[k] = v
            url = _url_of(ns, ns.node)
            body = {"template": ns.template, "params": params, "node": _full_id(ns, ns.node), "tag": ns.tag or ""}
            return _report(_post_json(f"{url}/jobs/run", body, ns.timeout), what)
        if ns.jobs_command == "stop":
            last = None
            for url in _owner_urls(ns, ns.job_id):
                last = _post_json(f"{url}/jobs/stop", {"job_id": ns.job_id}, ns.timeout)
                if last.status_code != 404:
                    return _report(last, what)
            print(f"p2pnode {what}: job {ns.job_id} runs on no live member", file=sys.stderr)
            return 1
        return _follow_log(ns, what)
    except LookupError as exc:
        print(f"p2pnode {what}: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"p2pnode {what}: cannot reach the agent: {exc}", file=sys.stderr)
        return 2


def _full_id(ns: argparse.Namespace, prefix: str | None) -> str:
    if not prefix:
        return ""
    return next(m["id"] for m in _members(ns) if m["id"].startswith(prefix))


def _follow_log(ns: argparse.Namespace, what: str) -> int:
    """``p2pnode jobs logs JOB_ID [--follow]``: the log from the node that has it; ``--follow`` polls for more
    every second until interrupted."""
    import time as _time

    url = None
    for candidate in _owner_urls(ns, ns.job_id):
        r = _get(f"{candidate}/jobs/logs?job_id={ns.job_id}&offset=0", ns.timeout)
        if r.status_code == 200:
            url = candidate
            break
    if url is None:
        print(f"p2pnode {what}: no live member has a log of job {ns.job_id}", file=sys.stderr)
        return 1
    offset = 0
    try:
        while True:
            r = _get(f"{url}/jobs/logs?job_id={ns.job_id}&offset={offset}", ns.timeout)
            if r.status_code != 200:
                return _report(r, what)
            sys.stdout.buffer.write(r.content)
            sys.stdout.flush()
            offset += len(r.content)
            if offset < int(r.headers.get("x-log-size", offset)):
                continue
            if not ns.follow:
                return 0
            _time.sleep(1.0)
    except KeyboardInterrupt:
        return 0


def _cmd_node_intent(ns: argparse.Namespace) -> int:
    """``p2pnode node cordon|uncordon|drain [ID]``: the intent is kept by the node concerned (its data dir and
    snapshot), so it survives its restart and any leader failover."""
    import httpx

    what = f"node {ns.node_command}"
    try:
        url = _url_of(ns, ns.node_id)
        if ns.node_command == "drain":
            return _report(_post_json(f"{url}/operator/drain", {"deadline_s": _seconds(ns.deadline)}, ns.timeout),
                           what)
        return _report(_post_json(f"{url}/operator/cordon", {"cordon": ns.node_command == "cordon"}, ns.timeout),
                       what)
    except (LookupError, ValueError) as exc:
        print(f"p2pnode {what}: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"p2pnode {what}: cannot reach the agent: {exc}", file=sys.stderr)
        return 2


def _seconds(text: str) -> float:
    """``"90"``, ``"90s"``, ``"10m"``, ``"2h"`` -> seconds. Raises ``ValueError``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    mult = units.get(t[-1:], None)
    value = float(t[:-1] if mult else t) * (mult or 1)
    if not 0 <= value <= 30 * 86400:
        raise ValueError(f"--deadline {text!r}: between 0 and 30 days")
    return value


def _cmd_jobs(ns: argparse.Namespace) -> int:
    """Running jobs across the cluster, pending work with reasons, refusals with reasons, recent history; with
    ``--watch`` redrawn in place every ``--interval`` seconds until Ctrl-C."""
    if getattr(ns, "jobs_command", None):
        return _cmd_jobs_op(ns)
    if getattr(ns, "watch", False) and not ns.json:
        return _watch_jobs(ns)
    view = _fetch_view(ns, "/jobs")
    if isinstance(view, int):
        return view
    data, console = view
    console.print(_jobs_renderable(data))
    return 0


def _watch_jobs(ns: argparse.Namespace) -> int:
    """``p2pnode jobs --watch``: one screen, refreshed in place (rich's Live); a failed read is shown on it and
    retried at the next refresh."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console()
    url = f"{ns.url.rstrip('/')}/jobs"
    try:
        with Live(Text(f"reading {url} ..."), console=console, auto_refresh=False, screen=False) as live:
            while True:
                try:
                    resp = _get(url, ns.timeout)
                    resp.raise_for_status()
                    shown = _jobs_renderable(resp.json(), footer=f"{url} at {time.strftime('%H:%M:%S')}, every "
                                                                 f"{ns.interval:g} s (Ctrl-C to quit)")
                except Exception as exc:  # noqa: BLE001 - any failed read is shown and retried
                    shown = Text(f"cannot read {url}: {exc} (retrying every {ns.interval:g} s)")
                live.update(shown, refresh=True)
                time.sleep(ns.interval)
    except KeyboardInterrupt:
        return 0


def _jobs_renderable(data: dict, footer: str = ""):
    """The ``p2pnode jobs`` screen for a ``/jobs`` document, as one rich renderable."""
    from rich.console import Group
    from rich.table import Table

    parts: list = [f"[bold]leader[/] {data.get('leader') or 'none'}  [bold]term[/] {data.get('term')}  "
                   f"[bold]this node's offer[/] {data.get('offer')}"]
    table = Table(title="running")
    for col in ("job", "template", "kind", "node", "GPUs", "term", "age"):
        table.add_column(col)
    now = time.time()
    for j in sorted(data.get("cluster_running", []), key=lambda j: (j["node_id"], j["job_id"])):
        gpus = ",".join(map(str, j.get("gpus") or [])) or "-"
        if j.get("gpu_fraction") and j["gpu_fraction"] < 1:
            gpus += f" ×{j['gpu_fraction']:g}"
        table.add_row(j["job_id"], j["template"], j.get("kind", ""), j["node_id"], gpus, str(j.get("term")),
                      _fmt_age(now - j.get("started_at", now)))
    parts.append(table)
    if data.get("pending"):
        t2 = Table(title="pending")
        for col in ("template", "waiting", "reason"):
            t2.add_column(col)
        for p in data["pending"]:
            t2.add_row(p["template"], _fmt_age(p.get("wait_s")), p["reason"])
        parts.append(t2)
    if data.get("refusing"):
        t5 = Table(title="nodes refusing NORMAL work")
        for col in ("node", "level", "reason"):
            t5.add_column(col)
        for r in data["refusing"]:
            t5.add_row(r["node_id"], str(r["level"]), r["reason"])
        parts.append(t5)
    if data.get("refused"):
        t3 = Table(title="refused")
        for col in ("node", "job", "template", "reason"):
            t3.add_column(col)
        for r in data["refused"]:
            t3.add_row(r["node_id"], r["job_id"], r["template"], r["reason"])
        parts.append(t3)
    if data.get("history"):
        t4 = Table(title="recent runs on this node")
        for col in ("job", "template", "duration", "exit", "reason"):
            t4.add_column(col)
        for h in data["history"][:10]:
            dur = (h["ended_at"] or now) - h["started_at"]
            t4.add_row(h["job_id"], h["template"], _fmt_age(dur), str(h.get("exit_status")),
                       h.get("reason") or "running")
        parts.append(t4)
    if footer:
        parts.append(f"[dim]{footer}[/]")
    return Group(*parts)


def _cluster_token() -> tuple[str, str] | None:
    """``(token, key id)`` the CLI signs requests with: ``P2PNODE_CLUSTER_TOKEN``, else the primary token of the
    keyring in the data dir (``$P2PNODE_DATA_DIR`` or the default; readable only by the agent's user: the file's
    permission is the access rule). ``None`` when there is neither."""
    from .config import default_data_dir
    from .keyring import KEYRING_FILE, Keyring, KeyringError, key_id_of

    token = os.environ.get("P2PNODE_CLUSTER_TOKEN", "")
    if token:
        return token, key_id_of(token)
    try:
        ring = Keyring.load(default_data_dir() / KEYRING_FILE)
    except (KeyringError, OSError):
        return None
    if ring is None or ring.primary_token is None:
        return None
    return ring.primary_token, ring.primary


_RECEIVERS: dict[str, str | None] = {}
"""Node id of the agent at each base URL (``scheme://host:port``), read once per CLI run from its ``/healthz``."""
HEALTHZ_TIMEOUT_S = 5.0


def _receiver(base: str) -> str | None:
    """The node id the agent at ``base`` answers on ``GET /healthz`` (always open; ``{"status", "node_id"}``),
    cached for this run; None when it cannot be read or names none (an agent that predates receiver binding:
    the request is then signed unbound, ``v1``/``k1``, which only such an agent or one with
    ``agent.accept_unbound_requests`` accepts)."""
    import httpx

    from .reqauth import receiver_id

    if base not in _RECEIVERS:
        node_id = None
        try:
            resp = httpx.get(f"{base}/healthz", timeout=HEALTHZ_TIMEOUT_S, trust_env=False)
            if resp.status_code == 200:
                data = resp.json()
                node_id = receiver_id(data.get("node_id")) if isinstance(data, dict) else None
        except (httpx.HTTPError, ValueError):
            node_id = None
        _RECEIVERS[base] = node_id
    return _RECEIVERS[base]


def _signed(method: str, url: str, body: bytes = b"") -> dict[str, str]:
    """Headers that authenticate a request without sending a secret (:mod:`p2pnode.reqauth`): an
    ``x-p2pnode-auth`` HMAC when a cluster token is at hand, else a signature with this node's key when it is
    readable (open mode: the voter roll, and reads where ``agent.read_token`` is set, which take this node's or a
    voter's key), each signed for the node at ``url`` (its id from :func:`_receiver`), so no other node accepts
    it; for reads ``P2PNODE_READ_TOKEN``, when set, as a bearer token instead of the key. Empty in an open cluster
    without a readable node key."""
    from urllib.parse import urlsplit

    from .reqauth import AUTH_HEADER, sign_request, sign_request_with_key

    headers: dict[str, str] = {}
    read_token = os.environ.get("P2PNODE_READ_TOKEN", "")
    if read_token and method in ("GET", "HEAD"):
        headers["authorization"] = f"Bearer {read_token}"
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    base = f"{parts.scheme}://{parts.netloc}"
    found = _cluster_token()
    if found is not None:
        headers[AUTH_HEADER] = sign_request(found[0], found[1], method, target, body, time.time(),
                                            receiver=_receiver(base))
    elif (method == "POST" or "authorization" not in headers) and (ident := _node_identity()) is not None:
        headers[AUTH_HEADER] = sign_request_with_key(ident, method, target, body, time.time(),
                                                     receiver=_receiver(base))
    return headers


def _node_identity():
    """This node's key from the data dir, when readable (open mode: the voter roll's operator routes need a
    voter's signature); never creates one."""
    from .config import default_data_dir
    from .identity import KEY_FILE, load_or_create_identity

    path = default_data_dir() / KEY_FILE
    try:
        if not path.is_file():
            return None
        return load_or_create_identity(path.parent)
    except (OSError, P2PNodeError):
        return None


def _post_json(url: str, obj: Any, timeout: float):
    """POST ``obj`` as JSON, signed (see :func:`_signed`)."""
    import httpx

    body = json.dumps(obj).encode()
    return httpx.post(url, content=body, timeout=timeout, trust_env=False,
                      headers={"content-type": "application/json", **_signed("POST", url, body)})


def _get(url: str, timeout: float):
    import httpx

    return httpx.get(url, timeout=timeout, trust_env=False, headers=_signed("GET", url))


def _cmd_signals_set(ns: argparse.Namespace) -> int:
    import httpx

    sig: dict = {"config": ns.config}
    for key in ("curriculum_weight", "elo_velocity", "data_age_s", "quality", "game_count"):
        v = getattr(ns, key)
        if v is not None:
            sig[key] = v
    try:
        resp = _post_json(f"{ns.url.rstrip('/')}/signals", sig, ns.timeout)
    except httpx.HTTPError as exc:
        print(f"p2pnode signals set: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    if resp.status_code != 200:
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else resp.text
        print(f"p2pnode signals set: rejected ({resp.status_code}): {body}", file=sys.stderr)
        return 1
    print(f"signals for {ns.config} accepted")
    return 0


def _cmd_node_voter(ns: argparse.Namespace) -> int:
    """``p2pnode node remove|admit ID``: edit the voter roll on the agent at ``--url`` and on every member it
    lists that is not dead or left (each keeps its own roll; members that are down miss the change: run it
    again when they are back, or with ``--url`` pointed at them)."""
    import httpx

    base = ns.url.rstrip("/")
    try:
        members = _get(f"{base}/members", ns.timeout).json()["members"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        print(f"p2pnode node {ns.node_command}: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    urls = [base] + [f"http://{m['addr']}" for m in members
                     if not m.get("self") and m.get("addr") and m.get("state") in ("alive", "suspect")]
    failed = 0
    for url in urls:
        try:
            resp = _post_json(f"{url}/voters", {"node_id": ns.node_id, "action": ns.node_command}, ns.timeout)
            ok = resp.status_code == 200
            detail = resp.json() if ok else resp.text
        except (httpx.HTTPError, ValueError) as exc:
            ok, detail = False, str(exc)
        failed += not ok
        print(f"{url}: {'ok, voters: ' + ', '.join(detail['voters']) if ok else 'failed: ' + str(detail)}")
    return 1 if failed else 0


def _cmd_keys(ns: argparse.Namespace) -> int:
    """``p2pnode keys list|install|use|remove``: edit the keyring in this node's data dir (no network: tokens
    reach a node only through the operator's own channel). A running agent reloads the file within a second."""
    from .keyring import KEYRING_FILE, Keyring, KeyringError

    path = Path(ns.data_dir or os.environ.get("P2PNODE_DATA_DIR") or _default_dir()) / KEYRING_FILE
    try:
        ring = Keyring.load(path) or Keyring()
        if ns.keys_command == "list":
            if not ring.tokens:
                print(f"no keyring at {path}")
                return 1
            for kid in ring.tokens:
                print(f"{kid}{'  primary' if kid == ring.primary else ''}")
            return 0
        if ns.keys_command == "install":
            token = ns.token if ns.token != "-" else sys.stdin.readline().strip()
            kid = ring.install(token)
            msg = f"installed {kid}" + (" (primary: the first token)" if ring.primary == kid and len(ring) == 1 else "")
        elif ns.keys_command == "use":
            changed = ring.use(ns.key_id)
            msg = f"primary is now {ring.primary}" + ("" if changed else " (unchanged)")
        else:
            msg = f"removed {ring.remove(ns.key_id)}"
        path.parent.mkdir(parents=True, exist_ok=True)
        ring.save(path)
    except KeyringError as exc:
        print(f"p2pnode keys {ns.keys_command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"p2pnode keys {ns.keys_command}: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(msg)
    return 0


def _default_dir() -> Path:
    from .config import default_data_dir

    return default_data_dir()


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _sync_table(data: dict[str, Any]):
    from rich.table import Table

    table = Table(title=f"files under {data.get('root')} (R = {data.get('r_effective')} of "
                        f"{data.get('replication_factor')} wanted, {data.get('durable_members')} durable members)")
    for col in ("path", "class", "size", "replicas", "lag", "pending", "targets"):
        table.add_column(col, justify="right" if col in ("size", "replicas", "lag", "pending") else "left")
    for f in data.get("files", []):
        style = "" if f["replicas"] >= f["r"] else "yellow"
        table.add_row(f["path"], f["class"], _fmt_bytes(f["size"]), f"{f['replicas']}/{f['r']}",
                      _fmt_age(f["lag_s"]) if f["lag_s"] else "-",
                      _fmt_bytes(f["bytes_pending"]) if f["bytes_pending"] else "-",
                      ", ".join(f.get("targets") or []) or "-", style=style)
    return table


def _sync_status_render(data: dict[str, Any]):
    """``p2pnode sync status`` as one rich renderable."""
    from rich.console import Group
    from rich.text import Text

    out: list[Any] = []
    roles = [r for r, on in (("pushes (ephemeral)", data.get("pushes")),
                             ("keeps replicas (durable)", data.get("keeps"))) if on]
    out.append(Text.from_markup(f"[bold]node[/] {data['node_id']}  "
                                f"[bold]role[/] {', '.join(roles) or 'none (tag it ephemeral or durable)'}"))
    if data.get("pushes"):
        out.append(_sync_table(data))
        sent = data.get("sent", {})
        out.append(Text(f"sent {_fmt_bytes(sent.get('bytes', 0))} in {sent.get('requests', 0)} requests "
                        f"({sent.get('request_failures', 0)} failed; {sent.get('streams', 0)} block streams, "
                        f"{sent.get('channel_fallbacks', 0)} fallbacks to HTTP), "
                        f"blocks re-sent {sent.get('blocks_resent', 0)}, "
                        f"refused by targets: {sent.get('rejected_by_targets') or 'none'}"))
        if data.get("refusing"):
            out.append(Text.from_markup(f"[yellow]skipped (backpressure)[/]: {', '.join(data['refusing'])}"))
        for path, err in (data.get("errors") or {}).items():
            out.append(Text.assemble((f"cannot sync {path}", "red"), f": {err}"))
    rec = data.get("received", {})
    if data.get("keeps"):
        port = data.get("data_port")
        out.append(Text(f"replicas held {rec.get('replicas', 0)} ({_fmt_bytes(rec.get('replica_bytes', 0))}), "
                        f"received {_fmt_bytes(rec.get('bytes_received', 0))}, commits {rec.get('commits', 0)}, "
                        f"transfers under way {len(rec.get('transfers', []))}; data channel "
                        + (f"on port {port} ({rec.get('streams', 0)} streams)" if port else "off (blocks over HTTP)")))
    refused = Counter(rec.get("rejected", {}))
    refused.update(rec.get("refused_requests", {}))
    if refused:
        out.append(Text.assemble(("refused input", "yellow"),
                                 ": " + ", ".join(f"{k} {v}" for k, v in sorted(refused.items()))))
    return Group(*out)


def _cmd_sync_status(ns: argparse.Namespace) -> int:
    """Each synced file: class, size, replicas confirmed of R, lag, bytes pending; replicas held for others."""
    if ns.watch is not None:
        if ns.json or ns.watch <= 0:
            print("p2pnode sync status: --watch takes a positive interval and no --json", file=sys.stderr)
            return 2
        url = f"{ns.url.rstrip('/')}/sync/status"

        def render():
            data, why = _read_view(url, ns.timeout)
            return _watch_error(why) if data is None else _sync_status_render(data)

        return _watch(render, ns.watch)
    view = _fetch_view(ns, "/sync/status")
    if isinstance(view, int):
        return view
    data, console = view
    console.print(_sync_status_render(data))
    return 0


def _cmd_sync_push(ns: argparse.Namespace) -> int:
    """Run a sync pass now; with --wait, show progress until every file has R confirmed replicas."""
    import httpx
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    base = ns.url.rstrip("/")
    try:
        resp = httpx.post(f"{base}/sync/trigger", timeout=ns.timeout, trust_env=False,
                          headers=_signed("POST", f"{base}/sync/trigger"))
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"p2pnode sync push: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    if not resp.json().get("triggered"):
        print("p2pnode sync push: this node does not push (tag it ephemeral)", file=sys.stderr)
        return 1
    if not ns.wait:
        print("sync pass triggered")
        return 0
    deadline = time.monotonic() + ns.wait_timeout
    time.sleep(0.2)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                  TransferSpeedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[replicas]}"),
                  disable=not sys.stderr.isatty() and not ns.progress) as progress:
        tasks: dict[str, Any] = {}
        while True:
            data = _get_json(f"{base}/sync/status", ns.timeout)
            if data is None:
                return 2
            files = data.get("files", [])
            for f in files:
                total = max(f["size"], 1)
                done = total if f["replicas"] >= f["r"] else (
                    f["progress"]["sent"] * total // max(f["progress"]["total"], 1) if f.get("progress") else 0)
                if f["path"] not in tasks:
                    if f["replicas"] >= f["r"] and f["size"] < 64 * 2**20:
                        continue  # small and already safe: no bar
                    tasks[f["path"]] = progress.add_task(f["path"], total=total, replicas="")
                progress.update(tasks[f["path"]], completed=done, replicas=f"{f['replicas']}/{f['r']} replicas")
            under = [f for f in files if f["replicas"] < f["r"]]
            if data.get("durable_members", 0) > 0 and not under:
                break
            if time.monotonic() > deadline:
                progress.stop()
                print(f"p2pnode sync push: {len(under)} file(s) below R after {ns.wait_timeout:g} s"
                      + ("" if data.get("durable_members") else " (no durable member known)"), file=sys.stderr)
                return 1
            time.sleep(0.5)
    print(f"every file has R = {data.get('r_effective')} confirmed replicas ({len(files)} files)")
    return 0


def _gc_why(d: dict[str, Any]) -> str:
    """Why one retention decision (a line of the plan in ``/sync/status``) was taken, in words."""
    days = (d.get("unlisted_for_s") or 0) / 86400
    above = len(d.get("above") or [])
    if d["reason"] == "retired":
        return f"origin deleted it {days:.1f} days ago; {above} higher-ranked durable node(s) hold this version"
    if d["reason"] == "over_cap":
        return f"past the cap; {above} higher-ranked durable node(s) hold this version ({d['status']} at origin)"
    if d["reason"] == "only_copy":
        return ("origin's listing unknown" if d["status"] == "unknown" else f"{d['status']} at origin") + \
            "; no other durable node holds this version"
    return d["reason"]


def _gc_table(title: str, rows: list[dict[str, Any]], total: int):
    from rich.table import Table

    table = Table(title=f"{title} ({total})" + (f", first {len(rows)} shown" if total > len(rows) else ""))
    for col in ("origin", "path", "size", "why"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for d in rows:
        table.add_row(d["origin"][:12], d["path"], _fmt_bytes(d["size"]), _gc_why(d))
    return table


def _cmd_sync_gc(ns: argparse.Namespace) -> int:
    """Replica retention on the running agent (a durable node): a pass now, or with --dry-run the plan."""
    import httpx
    from rich.console import Console

    base = ns.url.rstrip("/")
    data = _get_json(f"{base}/sync/status", ns.timeout)
    if data is None:
        return 2
    ret = data.get("retention")
    if not data.get("keeps") or not ret:
        print("p2pnode sync gc: this node keeps no replicas (tag it durable)", file=sys.stderr)
        return 1
    console = Console(width=None if sys.stdout.isatty() else 160)
    if ns.dry_run:
        plan = ret["plan"]
        if ns.json:
            json.dump(plan, sys.stdout, indent=2)
            print()
            return 0
        cap = _fmt_bytes(plan["cap_bytes"]) if plan["cap_bytes"] else "no cap"
        console.print(f"replicas held {_fmt_bytes(plan['held_bytes'])} (cap: {cap}); would retire "
                      f"{plan['retire_count']} ({_fmt_bytes(plan['retire_bytes'])}) -> "
                      f"{_fmt_bytes(plan['after_bytes'])} (listings and receipt lists as of the agent's last "
                      f"retention pass; {ret['passes']} so far)")
        console.print(_gc_table("would retire", plan["retire"], plan["retire_count"]))
        console.print(_gc_table("kept: only copies", plan["only_copies"], plan["only_copy_count"]))
        if plan["full"]:
            console.print("[red]still past the cap after that[/]: new data is refused (507) until room is found")
        return 0
    before = ret["passes"]
    try:
        resp = httpx.post(f"{base}/sync/trigger", timeout=ns.timeout, trust_env=False,
                          headers=_signed("POST", f"{base}/sync/trigger"))
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"p2pnode sync gc: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + ns.wait_timeout
    while ret["passes"] <= before:
        if time.monotonic() > deadline:
            print(f"p2pnode sync gc: no retention pass finished within {ns.wait_timeout:g} s", file=sys.stderr)
            return 1
        time.sleep(0.2)
        data = _get_json(f"{base}/sync/status", ns.timeout)
        if data is None:
            return 2
        ret = data["retention"]
    last = ret["last_pass"] or {}
    if ns.json:
        json.dump(last, sys.stdout, indent=2)
        print()
        return 0
    console.print(f"retired {last.get('retired_count', 0)} replicas ({_fmt_bytes(last.get('freed_bytes', 0))}); "
                  f"{last.get('only_copy_count', 0)} only copies kept")
    console.print(_gc_table("retired", last.get("retired", []), last.get("retired_count", 0)))
    if last.get("full"):
        console.print(f"[red]refusing new data (507)[/]: {ret.get('full_detail')}")
        return 1
    return 0


def _add_agent_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config file (default: $P2PNODE_CONFIG; none needed)")
    p.add_argument("--config-if-exists", dest="config_if_exists", metavar="FILE",
                   help="TOML config file read only when it exists (the systemd unit names /etc/p2pnode/p2pnode.toml); "
                        "--config and $P2PNODE_CONFIG come first")
    p.add_argument("--data-dir", metavar="DIR",
                   help="key, counters, peers file (default: $P2PNODE_DATA_DIR or the user data dir)")
    p.add_argument("--bind", metavar="ADDR", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, metavar="N",
                   help=f"HTTP port for gossip, status and metrics (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--advertise", metavar="HOST[:PORT]", help="address peers should use to reach this node")
    p.add_argument("--join", action="append", metavar="HOST:PORT", help="peer to contact at start (repeatable)")
    p.add_argument("--tag", action="append", metavar="TAG",
                   help="tag carried in the snapshot (repeatable): ephemeral (pushes its data), durable (keeps "
                        "replicas; listens on the sync data port, 8771 by default), voter")
    p.add_argument("--fake-gpus", metavar="SPEC",
                   help='simulate GPUs where NVML is absent, e.g. "H100,RTX 4090" or "2xA100"')
    p.add_argument("--fake-gpu-load", metavar="INDEX=UTIL[/MEM]", action="append",
                   help="hold a simulated GPU busy whatever runs on it, in percent (repeatable), e.g. 0=100/90: "
                        "GPU 0 at 100 %% utilization with 90 %% of its memory used")
    p.add_argument("--resource", metavar="NAME=AMOUNT", action="append",
                   help="declare a resource jobs can request (repeatable), like Ray's --resources: nvlink=1; "
                        "cpus=N and memory_gib=G set the CPUs and memory this node gives to jobs")
    p.add_argument("--catalog", metavar="FILE",
                   help="job catalog (TOML); its digest is gossiped and mismatches flagged")
    p.add_argument("--no-mdns", action="store_true", help="disable mDNS announcement and browsing")
    p.add_argument("--mdns-interface", action="append", metavar="ADDR",
                   help="IPv4 address of an interface mDNS uses (repeatable)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="log verbosity (default info)")
    p.add_argument("--gossip-profile", choices=["lan", "wan", "local-test"],
                   help="failure-detection timings (default lan; see docs/configuration.md)")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of every ``p2pnode`` command."""
    parser = argparse.ArgumentParser(prog="p2pnode", description="Peer-to-peer node agent for GPU fleets.")
    parser.add_argument("--version", action="version", version=f"p2pnode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("agent", help="run the node agent (until SIGINT/SIGTERM)", description="Run the node agent. "
                       "Precedence: flags > P2PNODE_* environment > TOML file > defaults.")
    _add_agent_options(p)
    p.set_defaults(func=_cmd_agent)

    default_url = os.environ.get("P2PNODE_URL", f"http://127.0.0.1:{os.environ.get('P2PNODE_PORT', DEFAULT_PORT)}")
    p = sub.add_parser("status", help="show the cluster as this agent sees it")
    p.add_argument("--url", default=default_url, help=f"agent URL (default $P2PNODE_URL or {default_url})")
    p.add_argument("--json", action="store_true", help="print the raw /status JSON")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the agent (default 5)")
    p.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
                   help="refresh in place every SECONDS (default 2) until Ctrl-C")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("demo", help="a 5-node cluster on this machine (fake GPUs, the demo catalog) until Ctrl-C",
                       description="Start a cluster on 127.0.0.1: agents with fake GPUs (H200, H100, A100, RTX 4090, "
                       "RTX 3060), the demo catalog, two durable nodes and one ephemeral, mDNS off (joined by "
                       "address). Prints the dashboard URL and what to try; Ctrl-C stops every agent and job and "
                       "removes the temporary data. P2PNODE_* settings of the shell are not passed to the agents.")
    p.add_argument("--nodes", type=int, default=5, help="agents to start (default 5)")
    p.add_argument("--base-port", dest="base_port", type=int, default=DEFAULT_PORT,
                   help=f"HTTP port of the first agent, the others follow (default {DEFAULT_PORT}; 0 = any free ports)")
    p.add_argument("--keep", action="store_true", help="keep the data dirs and logs on exit")
    p.add_argument("--gossip-profile", choices=["lan", "wan", "local-test"],
                   default=os.environ.get("P2PNODE_GOSSIP_PROFILE", "lan"),
                   help="failure-detection timings (default $P2PNODE_GOSSIP_PROFILE or lan; a killed node is "
                        "dead after about 10 s with lan, 4 s with local-test)")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="Print a completion script for every command and option. bash: "
                       "p2pnode completion bash > /etc/bash_completion.d/p2pnode; zsh: "
                       "p2pnode completion zsh > \"${fpath[1]}/_p2pnode\". Needs shtab (p2pnode[completion]).")
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(func=_cmd_completion)

    p = sub.add_parser("simulate", help="simulate a cluster of the real membership and election cores",
                       description="Deterministic simulation (same seed, same figures): spread of a fresh update "
                       "beside Serf's estimate, leader agreement, kill -9 detection, false suspicions under loss, "
                       "per-node message/byte/verification rates, and partition safety runs.")
    p.add_argument("--scenario", choices=["gossip", "scheduling"], default="gossip",
                   help="gossip: spread, failure detection, election (default); scheduling: the planner on a "
                   "seed-003-shaped fleet with a failover")
    p.add_argument("--nodes", type=int, default=1000, help="N: spread experiment or scheduling fleet (default 1000)")
    p.add_argument("--configs", type=int, default=200, help="scheduling: configs in the catalog (default 200)")
    p.add_argument("--duration", type=float, default=1800.0, help="scheduling: simulated seconds (default 1800)")
    p.add_argument("--cluster-nodes", type=int,
                   help="N for the cluster experiments (default: --nodes; skipped above 2000)")
    p.add_argument("--fanout", type=int, default=3)
    p.add_argument("--interval", type=float, default=1.0, help="gossip interval, seconds (default 1)")
    p.add_argument("--loss", type=float, default=0.0, help="probability that a message is lost (default 0)")
    p.add_argument("--latency-ms", type=float, default=1.0, help="one-way message latency (default 1 ms)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gossip-profile", choices=["lan", "wan", "local-test"], default="lan")
    p.add_argument("--partition-runs", type=int, default=20, help="random partition runs (default 20; 0 skips)")
    p.add_argument("--partition-nodes", type=int, default=15, help="cluster size in partition runs (default 15)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("guard", help="this machine against the guard limits, with recommendations",
                       description="Resource status of this machine (CPU, memory, disk, every GPU) against the "
                       "[guard] limits, the degradation level and recommended actions. Needs no running agent.")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument("--path", help="file system to check for disk (default: the data dir, else the working dir)")
    p.set_defaults(func=_cmd_guard)
    gsub = p.add_subparsers(dest="guard_command")
    cl = gsub.add_parser("cleanup", help="run one disk-manager pass over the data dir (see --dry-run)")
    cl.add_argument("--dry-run", action="store_true", help="list what would be deleted and why; delete nothing")
    cl.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_agent_options(cl)
    cl.set_defaults(func=_cmd_guard)

    p = sub.add_parser("jobs", help="jobs across the cluster: running, pending and refused with reasons, history")
    p.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    p.add_argument("--json", action="store_true", help="print the raw /jobs JSON")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--watch", action="store_true", help="redraw in place every --interval seconds until Ctrl-C")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between redraws with --watch (default 2)")
    p.set_defaults(func=_cmd_jobs)
    jsub = p.add_subparsers(dest="jobs_command")
    jr = jsub.add_parser("run", help="run a template once, through the leader's plan and the node's admission",
                         description="Run one instance of a catalog template now (job id run-<id>), placed by the "
                         "leader on --node, on a node tagged --tag, or anywhere. The request is kept by the node it "
                         "concerns (--node, else the agent at --url) until the job starts: it survives a leader "
                         "failover and an agent restart.")
    jr.add_argument("template")
    jr.add_argument("--param", action="append", metavar="KEY=VALUE", help="a template parameter (repeatable)")
    where = jr.add_mutually_exclusive_group()
    where.add_argument("--node", metavar="ID", help="the node to run on (a unique id prefix)")
    where.add_argument("--tag", metavar="TAG", help="run on a node carrying this tag")
    jst = jsub.add_parser("stop", help="stop a running job (on whichever node runs it)")
    jst.add_argument("job_id")
    jl = jsub.add_parser("logs", help="print a job's log from the node that ran it")
    jl.add_argument("job_id")
    jl.add_argument("--follow", "-f", action="store_true", help="keep printing what the job writes")
    for sp in (jr, jst, jl):
        sp.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
        sp.add_argument("--timeout", type=float, default=5.0)
        sp.set_defaults(func=_cmd_jobs)

    p = sub.add_parser("sync", help="data replication: status, push now, replica retention (gc)")
    ysub = p.add_subparsers(dest="sync_command", required=True)
    ys = ysub.add_parser("status", help="each synced file: class, size, replicas confirmed of R, lag, bytes pending")
    ys.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    ys.add_argument("--json", action="store_true", help="print the raw /sync/status JSON")
    ys.add_argument("--timeout", type=float, default=5.0)
    ys.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
                    help="refresh in place every SECONDS (default 2) until Ctrl-C")
    ys.set_defaults(func=_cmd_sync_status)
    yp = ysub.add_parser("push", help="run a sync pass now (POST /sync/trigger)",
                         description="Run a sync pass now (POST /sync/trigger). In token trust mode set "
                                     "P2PNODE_CLUSTER_TOKEN (or run it as the agent's user: the node's keyring is "
                                     "used): the request is signed with it (an HMAC; the token itself never leaves "
                                     "this machine).")
    yp.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    yp.add_argument("--wait", action="store_true",
                    help="wait, with progress bars, until every file has R confirmed replicas (exit 1 on timeout)")
    yp.add_argument("--wait-timeout", dest="wait_timeout", type=float, default=600.0, help="seconds (default 600)")
    yp.add_argument("--progress", action="store_true", help="show progress bars even when stderr is not a terminal")
    yp.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, seconds")
    yp.set_defaults(func=_cmd_sync_push)
    yg = ysub.add_parser(
        "gc", help="replica retention on a durable node: retire now what the policy lets go (see --dry-run)",
        description="Ask the running agent (a durable node) for a replica-retention pass now, like `nomad system gc`: "
                    "only the agent knows which versions the other durable nodes confirm and what each origin still "
                    "lists, so nothing is decided offline. A replica goes when its origin deleted the file and "
                    "[sync] retention_keep_versions / retention_keep_days passed, or, past retention_cap_bytes, when "
                    "R other durable nodes confirm that version; never when this node holds the only copy. Exit 1 "
                    "when the folder stays past its cap (new data is refused with 507). Signed like `sync push` in "
                    "token mode (P2PNODE_CLUSTER_TOKEN or the node's keyring).")
    yg.add_argument("--dry-run", action="store_true",
                    help="list what would be retired and why, and what is kept as an only copy; delete nothing")
    yg.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    yg.add_argument("--json", action="store_true", help="print the plan (or the pass) as JSON")
    yg.add_argument("--wait-timeout", dest="wait_timeout", type=float, default=300.0,
                    help="seconds to wait for the pass (default 300)")
    yg.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, seconds")
    yg.set_defaults(func=_cmd_sync_gc)

    p = sub.add_parser("signals", help="training-pipeline signals")
    ssub = p.add_subparsers(dest="signals_command", required=True)
    sset = ssub.add_parser("set", help="send signals for one config to an agent (POST /signals)",
                           description="Send signals for one config to an agent (POST /signals). In token trust "
                                       "mode set P2PNODE_CLUSTER_TOKEN (or run it as the agent's user: the node's "
                                       "keyring is used): the request is signed with it (an HMAC; the token itself "
                                       "never leaves this machine).")
    sset.add_argument("config", help="config name from the catalog, e.g. hex8_2p")
    sset.add_argument("--curriculum-weight", dest="curriculum_weight", type=float, help=">= 0, 1 = nominal")
    sset.add_argument("--elo-velocity", dest="elo_velocity", type=float, help="Elo per day")
    sset.add_argument("--data-age", dest="data_age_s", type=float, help="seconds since the newest data")
    sset.add_argument("--quality", type=float, help="0-1")
    sset.add_argument("--game-count", dest="game_count", type=int, help="games so far")
    sset.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    sset.add_argument("--timeout", type=float, default=5.0)
    sset.set_defaults(func=_cmd_signals_set)

    p = sub.add_parser("node", help="operator actions on a node (cordon, uncordon, drain) and on the voter roll "
                       "(remove, admit)")
    nsub = p.add_subparsers(dest="node_command", required=True)
    for action, text in (("remove", "remove a voter gone for good from the voter roll (like Consul's operator raft "
                                    "remove-peer); dead voters otherwise stay voters"),
                         ("admit", "admit a member tagged voter after open mode's voter roll closed "
                                   "(election.voter_bootstrap_s)")):
        na = nsub.add_parser(action, help=text, description=f"{text[0].upper()}{text[1:]}. Applied on the agent at "
                             "--url and on every live member it lists (POST /voters). In token trust mode set "
                             "P2PNODE_CLUSTER_TOKEN (or use the node's keyring): requests are signed with it.")
        na.add_argument("node_id", help="the member's node id (p2pnode status lists them)")
        na.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
        na.add_argument("--timeout", type=float, default=5.0)
        na.set_defaults(func=_cmd_node_voter)
    for action, text in (("cordon", "keep new work off a node (like kubectl cordon); what runs goes on"),
                         ("uncordon", "let a node take work again (ends a drain too)"),
                         ("drain", "cordon a node and, after --deadline, stop its preemptible work; the rest is "
                                   "waited for (like Nomad node drain)")):
        na = nsub.add_parser(action, help=text, description=f"{text[0].upper()}{text[1:]}. Kept by the node "
                             "concerned (its data dir and snapshot): it survives its restart and a leader failover.")
        na.add_argument("node_id", nargs="?", help="the node (a unique id prefix; default: the agent at --url)")
        if action == "drain":
            na.add_argument("--deadline", default="0", help="when preemptible work stops: 90s, 10m, 2h (default 0)")
        na.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
        na.add_argument("--timeout", type=float, default=5.0)
        na.set_defaults(func=_cmd_node_intent)

    p = sub.add_parser("keys", help="the cluster keyring of token mode: list, install, use, remove tokens",
                       description="The cluster keyring (token trust mode) in this node's data dir. Rotate without "
                       "downtime: `keys install NEW` on every node, then `keys use KEY_ID` on every node, then "
                       "`keys remove OLD_ID` on every node. Tokens never cross the network; a running agent "
                       "reloads the keyring within a second.")
    ksub = p.add_subparsers(dest="keys_command", required=True)
    for name, text in (("list", "key ids of the accepted tokens, the primary marked"),
                       ("install", "accept a token (the first one becomes the primary)"),
                       ("use", "make a key id (or a unique prefix) the primary: this node endorses with it"),
                       ("remove", "stop accepting a key id (not the primary)")):
        kp = ksub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        if name == "install":
            kp.add_argument("token", help="the token, or - to read it from stdin (keeps it out of shell history)")
        elif name != "list":
            kp.add_argument("key_id", help="a key id from `p2pnode keys list` (a unique prefix will do)")
        kp.add_argument("--data-dir", dest="data_dir", default=None,
                        help="the node's data dir (default: $P2PNODE_DATA_DIR or the user data dir)")
        kp.set_defaults(func=_cmd_keys)

    p = sub.add_parser("catalog", help="job catalog tools")
    csub_cat = p.add_subparsers(dest="catalog_command", required=True)
    cv = csub_cat.add_parser("validate", help="check a catalog file; exit 1 listing every error with its location")
    cv.add_argument("file", help="catalog TOML file")
    cv.set_defaults(func=_cmd_catalog_validate)

    p = sub.add_parser("config", help="inspect configuration")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the effective configuration as JSON (token masked)")
    _add_agent_options(show)
    show.set_defaults(func=_cmd_config_show)
    val = csub.add_parser("validate", help="check the configuration (file, env, flags); exit 1 on inconsistencies")
    _add_agent_options(val)
    val.set_defaults(func=_cmd_config_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status (0 ok, 1 failed, 2 usage
    or configuration error).
    """
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except P2PNodeError as exc:
        print(f"p2pnode: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
