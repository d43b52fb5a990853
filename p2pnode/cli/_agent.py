"""``p2pnode agent``: run the node agent until SIGINT or SIGTERM, and name the cause and the remedy of a failed
start in one line (exit 2) rather than a traceback."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from ..config import provider_nat
from ..errors import P2PNodeError
from ._options import add_agent_options, config_from, config_path

__all__ = ["add_agent_parser"]


def add_agent_parser(sub: Any) -> None:
    p = sub.add_parser("agent", help="run the node agent (until SIGINT/SIGTERM)", description="Run the node agent. "
                       "Precedence: flags > P2PNODE_* environment > TOML file > defaults. SIGTERM or SIGINT stops "
                       "it cleanly: jobs with a checkpoint signal get it and their stop waits until a durable node "
                       "holds the new checkpoint (at most the template's checkpoint grace_s, and "
                       "scheduler.max_close_hold_s), then the jobs get SIGTERM (SIGKILL after stop_grace_s) and the "
                       "agent leaves (gossip.leave_timeout_s); a second SIGTERM or SIGINT releases the held stops "
                       "at once.")
    add_agent_options(p)
    p.set_defaults(func=_cmd_agent)


def _cmd_agent(ns: argparse.Namespace) -> int:
    import faulthandler

    import trio

    try:  # a crash in a C extension leaves every thread's Python stack in the log (stderr)
        faulthandler.enable()
    except (RuntimeError, OSError, ValueError):  # stderr None or without a file descriptor (embedded, captured)
        pass

    from ..agent import Agent

    config = config_from(ns)
    path = config_path(ns)
    logging.basicConfig(
        level=config.agent.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        _check_listen(config.agent.bind, config.agent.port)  # before the data dir is touched
        agent = Agent(config, nat=provider_nat(os.environ))
    except OSError as exc:
        return _startup_failed(exc, config)
    started = False

    async def serve(nursery: trio.Nursery, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        await agent.run(task_status=task_status)
        nursery.cancel_scope.cancel()  # the agent returned: stop listening for signals

    async def main() -> None:
        nonlocal started
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve, nursery)
                started = True
                source = f"config {path}" if path is not None else "no config file: defaults, environment, flags"
                print(f"p2pnode agent {agent.node_id} on http://{agent.addr}  (data dir {agent.data_dir}; {source})",
                      file=sys.stderr, flush=True)
                async for signum in signals:  # the first: a clean stop, its held stops bounded; the next: at once
                    again = agent.stopping
                    # The agent's hard bound: its held stops' deadline + the jobs' exit + the leave
                    # (p2pnode._agentclose: _AgentClosing.close_tail_s).
                    nursery.cancel_scope.deadline = deadline = agent.stop(at_once=again)
                    logging.getLogger("p2pnode").info(
                        "received %s%s, leaving within %.1f s%s", signal.Signals(signum).name,
                        " again" if again else "", max(0.0, deadline - trio.current_time()),
                        "" if again else " (held checkpoints first; a second signal stops at once)")

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
        leaf: BaseException | None = ours
        while rest is None and isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        if rest is None and isinstance(leaf, (OSError, P2PNodeError)):  # split() leaves only these
            return leaf
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
