"""Command line: ``p2pnode agent | status | config show``.

Config precedence for the agent: flags > ``P2PNODE_*`` environment > TOML file (``--config`` or
``$P2PNODE_CONFIG``) > embedded defaults.
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
                print(f"p2pnode agent {agent.node_id} on http://{agent.addr}  (data dir {agent.data_dir})", file=sys.stderr, flush=True)
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


def _cmd_status(ns: argparse.Namespace) -> int:
    import httpx
    from rich.console import Console
    from rich.table import Table

    url = ns.url.rstrip("/")
    try:
        resp = _get(f"{url}/status", ns.timeout)
        if resp.status_code == 401:
            print(f"p2pnode status: {url} protects its views: set P2PNODE_READ_TOKEN (agent.read_token) or a "
                  "cluster token (P2PNODE_CLUSTER_TOKEN, or run as the agent's user)", file=sys.stderr)
            return 2
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"p2pnode status: cannot reach agent at {url}: {exc}", file=sys.stderr)
        return 2
    data = resp.json()
    if ns.json:
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    node = data["node"]
    console = Console(width=None if sys.stdout.isatty() else 160)
    trust = "open (any well-signed node may join)" if node.get("cluster_open") else node.get("trust")
    console.print(f"[bold]node[/] {node['id']}  [bold]addr[/] {node['addr']}  [bold]version[/] {node['version']}  "
                  f"[bold]incarnation[/] {node.get('incarnation')}  [bold]trust[/] {trust}")
    el = data.get("election") or {}
    vote = el.get("vote") or {}
    leader = el.get("leader") or "none (no quorum)"
    console.print(f"[bold]leader[/] {leader}  [bold]term[/] {el.get('term')}  "
                  f"[bold]votes[/] {el.get('votes_for_leader')}/{el.get('voters')} (quorum {el.get('quorum')})  "
                  f"[bold]our vote[/] {vote.get('candidate')} @ term {vote.get('term')}")
    table = Table(show_lines=False)
    for col in ("node", "state", "inc", "address", "version", "age", "CPU", "mem", "disk", "GPUs", "power", "sync"):
        right = col in ("inc", "version", "age", "CPU", "mem", "disk", "power")
        table.add_column(col, justify="right" if right else "left", no_wrap=col != "GPUs")
    for m in data["members"]:
        res = m.get("resources") or {}
        name = m["id"] + (" (self)" if m.get("self") else "") + (" ★" if m["id"] == el.get("leader") else "")
        table.add_row(
            name,
            m.get("state", "?"),
            str(m.get("incarnation", "")),
            m.get("addr", ""),
            str(m.get("version")),
            _fmt_age(m.get("age_s")),
            _pct(res.get("cpu_percent")),
            _pct(res.get("mem_percent")),
            _pct(res.get("disk_percent")),
            _gpu_summary(res),
            f"{m.get('power_score', 0):g}",
            _sync_cell(m.get("sync") or {}),
        )
    console.print(table)
    mismatch = (data.get("catalog") or {}).get("mismatch") or []
    if mismatch:
        console.print(f"[bold red]catalog mismatch[/]: {', '.join(mismatch)} run another catalog than this node")
    rejected = data.get("gossip", {}).get("rejected") or {}
    if rejected:
        console.print("rejected gossip: " + ", ".join(f"{k} {v}" for k, v in rejected.items()))
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


def _cmd_guard_cleanup(ns: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .guard import run_cleanup

    config = _load(ns)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if not config.agent.data_dir.is_dir():
        print(f"p2pnode guard cleanup: no data dir at {config.agent.data_dir}", file=sys.stderr)
        return 2
    result = run_cleanup(config.agent.data_dir, config.guard, dry_run=ns.dry_run)
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


def _cmd_jobs(ns: argparse.Namespace) -> int:
    """Running jobs across the cluster, pending work with reasons, refusals with reasons, recent history."""
    from rich.table import Table

    view = _fetch_view(ns, "/jobs")
    if isinstance(view, int):
        return view
    data, console = view
    console.print(f"[bold]leader[/] {data.get('leader') or 'none'}  [bold]term[/] {data.get('term')}  "
                  f"[bold]this node's offer[/] {data.get('offer')}")
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
    console.print(table)
    if data.get("pending"):
        t2 = Table(title="pending")
        for col in ("template", "waiting", "reason"):
            t2.add_column(col)
        for p in data["pending"]:
            t2.add_row(p["template"], _fmt_age(p.get("wait_s")), p["reason"])
        console.print(t2)
    if data.get("refusing"):
        t5 = Table(title="nodes refusing NORMAL work")
        for col in ("node", "level", "reason"):
            t5.add_column(col)
        for r in data["refusing"]:
            t5.add_row(r["node_id"], str(r["level"]), r["reason"])
        console.print(t5)
    if data.get("refused"):
        t3 = Table(title="refused")
        for col in ("node", "job", "template", "reason"):
            t3.add_column(col)
        for r in data["refused"]:
            t3.add_row(r["node_id"], r["job_id"], r["template"], r["reason"])
        console.print(t3)
    if data.get("history"):
        t4 = Table(title="recent runs on this node")
        for col in ("job", "template", "duration", "exit", "reason"):
            t4.add_column(col)
        for h in data["history"][:10]:
            dur = (h["ended_at"] or now) - h["started_at"]
            t4.add_row(h["job_id"], h["template"], _fmt_age(dur), str(h.get("exit_status")), h.get("reason") or "running")
        console.print(t4)
    return 0


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


def _signed(method: str, url: str, body: bytes = b"") -> dict[str, str]:
    """Headers that authenticate a request without sending a secret (token mode; :mod:`p2pnode.reqauth`):
    an ``x-p2pnode-auth`` HMAC when a cluster token is at hand; for reads also ``P2PNODE_READ_TOKEN`` as a
    bearer token. Empty in an open cluster (nothing to sign with)."""
    from urllib.parse import urlsplit

    from .reqauth import AUTH_HEADER, sign_request, sign_request_with_key

    headers: dict[str, str] = {}
    read_token = os.environ.get("P2PNODE_READ_TOKEN", "")
    if read_token and method in ("GET", "HEAD"):
        headers["authorization"] = f"Bearer {read_token}"
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    found = _cluster_token()
    if found is not None:
        headers[AUTH_HEADER] = sign_request(found[0], found[1], method, target, body, time.time())
    elif method == "POST" and (ident := _node_identity()) is not None:
        headers[AUTH_HEADER] = sign_request_with_key(ident, method, target, body, time.time())
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
                      _fmt_age(f["lag_s"]) if f["lag_s"] else "-", _fmt_bytes(f["bytes_pending"]) if f["bytes_pending"] else "-",
                      ", ".join(f.get("targets") or []) or "-", style=style)
    return table


def _cmd_sync_status(ns: argparse.Namespace) -> int:
    """Each synced file: class, size, replicas confirmed of R, lag, bytes pending; replicas held for others."""
    view = _fetch_view(ns, "/sync/status")
    if isinstance(view, int):
        return view
    data, console = view
    roles = [r for r, on in (("pushes (ephemeral)", data.get("pushes")), ("keeps replicas (durable)", data.get("keeps"))) if on]
    console.print(f"[bold]node[/] {data['node_id']}  [bold]role[/] {', '.join(roles) or 'none (tag it ephemeral or durable)'}")
    if data.get("pushes"):
        console.print(_sync_table(data))
        sent = data.get("sent", {})
        console.print(f"sent {_fmt_bytes(sent.get('bytes', 0))} in {sent.get('requests', 0)} requests "
                      f"({sent.get('request_failures', 0)} failed; {sent.get('streams', 0)} block streams, "
                      f"{sent.get('channel_fallbacks', 0)} fallbacks to HTTP), blocks re-sent "
                      f"{sent.get('blocks_resent', 0)}, refused by targets: {sent.get('rejected_by_targets') or 'none'}")
        if data.get("refusing"):
            console.print(f"[yellow]skipped (backpressure)[/]: {', '.join(data['refusing'])}")
        for path, err in (data.get("errors") or {}).items():
            console.print(f"[red]cannot sync {path}[/]: {err}")
    rec = data.get("received", {})
    if data.get("keeps"):
        port = data.get("data_port")
        console.print(f"replicas held {rec.get('replicas', 0)} ({_fmt_bytes(rec.get('replica_bytes', 0))}), "
                      f"received {_fmt_bytes(rec.get('bytes_received', 0))}, commits {rec.get('commits', 0)}, "
                      f"transfers under way {len(rec.get('transfers', []))}; data channel "
                      + (f"on port {port} ({rec.get('streams', 0)} streams)" if port else "off (blocks over HTTP)"))
    refused = Counter(rec.get("rejected", {}))
    refused.update(rec.get("refused_requests", {}))
    if refused:
        console.print("[yellow]refused input[/]: " + ", ".join(f"{k} {v}" for k, v in sorted(refused.items())))
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


def _add_agent_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config file (default: $P2PNODE_CONFIG; none needed)")
    p.add_argument("--data-dir", metavar="DIR", help="key, counters, peers file (default: $P2PNODE_DATA_DIR or the user data dir)")
    p.add_argument("--bind", metavar="ADDR", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, metavar="N", help=f"HTTP port for gossip, status and metrics (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--advertise", metavar="HOST[:PORT]", help="address peers should use to reach this node")
    p.add_argument("--join", action="append", metavar="HOST:PORT", help="peer to contact at start (repeatable)")
    p.add_argument("--tag", action="append", metavar="TAG",
                   help="tag carried in the snapshot (repeatable): ephemeral (pushes its data), durable (keeps "
                        "replicas; listens on the sync data port, 8771 by default), voter")
    p.add_argument("--fake-gpus", metavar="SPEC", help='simulate GPUs where NVML is absent, e.g. "H100,RTX 4090" or "2xA100"')
    p.add_argument("--catalog", metavar="FILE", help="job catalog (TOML); its digest is gossiped and mismatches flagged")
    p.add_argument("--no-mdns", action="store_true", help="disable mDNS announcement and browsing")
    p.add_argument("--mdns-interface", action="append", metavar="ADDR", help="IPv4 address of an interface mDNS uses (repeatable)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="log verbosity (default info)")
    p.add_argument("--gossip-profile", choices=["lan", "wan", "local-test"],
                   help="failure-detection timings (default lan; see docs/configuration.md)")


def build_parser() -> argparse.ArgumentParser:
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
    p.set_defaults(func=_cmd_status)

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
    p.add_argument("--cluster-nodes", type=int, help="N for the cluster experiments (default: --nodes; skipped above 2000)")
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
    p.set_defaults(func=_cmd_jobs)

    p = sub.add_parser("sync", help="data replication: status, push now")
    ysub = p.add_subparsers(dest="sync_command", required=True)
    ys = ysub.add_parser("status", help="each synced file: class, size, replicas confirmed of R, lag, bytes pending")
    ys.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    ys.add_argument("--json", action="store_true", help="print the raw /sync/status JSON")
    ys.add_argument("--timeout", type=float, default=5.0)
    ys.set_defaults(func=_cmd_sync_status)
    yp = ysub.add_parser("push", help="run a sync pass now (POST /sync/trigger)",
                         description="Run a sync pass now (POST /sync/trigger). In token trust mode set "
                                     "P2PNODE_CLUSTER_TOKEN (or run it as the agent's user: the node's keyring is used): the request is signed with it "
                                     "(an HMAC; the token itself never leaves this machine).")
    yp.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    yp.add_argument("--wait", action="store_true",
                    help="wait, with progress bars, until every file has R confirmed replicas (exit 1 on timeout)")
    yp.add_argument("--wait-timeout", dest="wait_timeout", type=float, default=600.0, help="seconds (default 600)")
    yp.add_argument("--progress", action="store_true", help="show progress bars even when stderr is not a terminal")
    yp.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, seconds")
    yp.set_defaults(func=_cmd_sync_push)

    p = sub.add_parser("signals", help="training-pipeline signals")
    ssub = p.add_subparsers(dest="signals_command", required=True)
    sset = ssub.add_parser("set", help="send signals for one config to an agent (POST /signals)",
                           description="Send signals for one config to an agent (POST /signals). In token trust "
                                       "mode set P2PNODE_CLUSTER_TOKEN (or run it as the agent's user: the node's keyring is used): the request is signed with it "
                                     "(an HMAC; the token itself never leaves this machine).")
    sset.add_argument("config", help="config name from the catalog, e.g. hex8_2p")
    sset.add_argument("--curriculum-weight", dest="curriculum_weight", type=float, help=">= 0, 1 = nominal")
    sset.add_argument("--elo-velocity", dest="elo_velocity", type=float, help="Elo per day")
    sset.add_argument("--data-age", dest="data_age_s", type=float, help="seconds since the newest data")
    sset.add_argument("--quality", type=float, help="0-1")
    sset.add_argument("--game-count", dest="game_count", type=int, help="games so far")
    sset.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    sset.add_argument("--timeout", type=float, default=5.0)
    sset.set_defaults(func=_cmd_signals_set)

    p = sub.add_parser("node", help="operator actions on the voter roll (remove a voter gone for good, admit one)")
    nsub = p.add_subparsers(dest="node_command", required=True)
    for action, text in (("remove", "remove a voter gone for good from the voter roll (like Consul's operator raft "
                                    "remove-peer); dead voters otherwise stay voters"),
                         ("admit", "admit a member tagged voter after open mode's voter roll closed (election.voter_bootstrap_s)")):
        na = nsub.add_parser(action, help=text, description=f"{text[0].upper()}{text[1:]}. Applied on the agent at "
                             "--url and on every live member it lists (POST /voters). In token trust mode set "
                             "P2PNODE_CLUSTER_TOKEN (or use the node's keyring): requests are signed with it.")
        na.add_argument("node_id", help="the member's node id (p2pnode status lists them)")
        na.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
        na.add_argument("--timeout", type=float, default=5.0)
        na.set_defaults(func=_cmd_node_voter)

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
