"""``p2pnode guard [cleanup]``: this machine against the guard limits, or one disk-manager pass; no agent needed."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from ..snapshot import PathStr, Percent, Reason
from ._options import add_agent_options, config_from

__all__ = ["add_guard_parser"]


def add_guard_parser(sub: Any, default_url: str) -> None:
    """Add ``p2pnode guard`` (and ``guard cleanup``) to the subcommands ``sub`` (argparse's ``add_subparsers``);
    ``default_url``: the local agent asked for its ``/guard`` view."""
    p = sub.add_parser("guard", help="this machine against the guard limits, with recommendations",
                       description="Resource status of this machine (CPU, memory, disk, every GPU) against the "
                       "[guard] limits, the degradation level and recommended actions; CPU and memory as the guard "
                       "assesses them (CPU over guard.cpu_window_s, memory over guard.memory_window_s), the raw "
                       "sample and PSI beside them (PSI never moves the level). Needs no running agent; where the "
                       "local agent answers at --url, also its level, its CPU and memory windows, and how it "
                       "enforces per-job memory limits (cgroup v2, cgroup v1 or its RSS watchdog, as it found at "
                       "its start).")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument("--path", help="file system to check for disk (default: the data dir, else the working dir)")
    p.add_argument("--url", default=default_url, help=f"the local agent, asked how it enforces memory limits "
                   f"(default {default_url})")
    p.set_defaults(func=_cmd_guard)
    gsub = p.add_subparsers(dest="guard_command")
    cl = gsub.add_parser("cleanup", help="run one disk-manager pass over the data dir (see --dry-run)",
                         description="One disk-manager pass over the data dir: old logs, empty databases, stale "
                         "checkpoints. Nothing in the sync root is deleted here, whatever the tags given: only the "
                         "agent, which sees the receipts, deletes there once R durable replicas confirm a file.")
    cl.add_argument("--dry-run", action="store_true", help="list what would be deleted and why; delete nothing")
    cl.add_argument("--json", action="store_true", help="print the result as JSON")
    add_agent_options(cl)
    cl.set_defaults(func=_cmd_guard)


def _cmd_guard(ns: argparse.Namespace) -> int:
    """This machine against the guard limits (no agent needed); or a disk-manager pass with ``cleanup``."""
    from ..guard import get_resource_status, print_resource_status
    from ..guard._api import signal_lines

    if getattr(ns, "guard_command", None) == "cleanup":
        return _cmd_guard_cleanup(ns)
    status = get_resource_status(ns.path)
    enforcement, reply = _agent_guard(ns.url)
    status["memory_enforcement"] = enforcement
    agent = None
    if reply is not None and reply.level is not None and reply.assessment is not None:
        agent = {"url": ns.url, "level": reply.level, "reasons": reply.reasons,
                 "signals": {k: msgspec.to_builtins(v) for k, v in reply.assessment.signals.items()}}
    status["agent"] = agent
    if ns.json:
        json.dump(status, sys.stdout, indent=2)
        print()
    else:
        print_resource_status(status=status)
        if agent is not None:
            print(f"The agent at {ns.url}: degradation level {agent['level']}"
                  + (f": {'; '.join(agent['reasons'])}" if agent["reasons"] else ""))
            for line in signal_lines(agent["signals"], None):
                print(f"  {line}")
        where = f" under {enforcement['base']}" if enforcement.get("base") else ""
        moved = f" (the agent moved itself into {enforcement['moved_to']})" if enforcement.get("moved_to") else ""
        print(f"Per-job memory limits: {enforcement['mode']}{where}{moved}: {enforcement['why']}")
    return 0


GUARD_REPLY_MAX = 1 << 20
"""Bytes of the agent's ``/guard`` answer read at most (the view is a few KiB)."""


class Enforcement(msgspec.Struct, frozen=True):
    """``/guard`` ``memory_enforcement`` as this client reads it (:func:`p2pnode.jobs._cgroup.enforcement`)."""

    mode: Literal["cgroup v2", "cgroup v1", "watchdog"]
    why: Reason
    base: PathStr | None = None
    moved_to: PathStr | None = None


class SignalReply(msgspec.Struct, frozen=True):
    """One resource as the agent's guard assessed it (``/guard`` ``assessment.signals``): percents (None: a NaN
    the agent sent as null, shown as ``-``), its window."""

    assessed_percent: Percent | None
    window_percent: Percent | None
    sample_percent: Percent | None
    window_s: Annotated[float, msgspec.Meta(ge=0.0, le=600.0)]
    samples: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)]
    basis: Literal["window", "sample"]
    psi_some_avg10: Annotated[float, msgspec.Meta(ge=0.0, le=100.0)] | None = None
    psi_full_avg10: Annotated[float, msgspec.Meta(ge=0.0, le=100.0)] | None = None


class AssessmentReply(msgspec.Struct, frozen=True):
    """The part of ``/guard`` ``assessment`` this client reads."""

    signals: dict[Literal["cpu", "memory"], SignalReply] = {}


class GuardReply(msgspec.Struct, frozen=True):
    """The part of the agent's ``/guard`` answer ``p2pnode guard`` reads."""

    memory_enforcement: Enforcement
    level: Annotated[int, msgspec.Meta(ge=0, le=4)] | None = None
    reasons: Annotated[list[Reason], msgspec.Meta(max_length=64)] = []
    assessment: AssessmentReply | None = None


def _memory_enforcement(url: str) -> dict[str, Any]:
    """How the agent at ``url`` enforces per-job memory limits (see :func:`_agent_guard`)."""
    return _agent_guard(url)[0]


def _agent_guard(url: str) -> tuple[dict[str, Any], GuardReply | None]:
    """How the agent at ``url`` enforces per-job memory limits (``/guard`` ``memory_enforcement``, found at its
    start: never assumed here); mode ``unknown`` with the reason when it does not answer, or answers something
    that is not that view (read at most :data:`GUARD_REPLY_MAX` bytes, decoded into typed, bounded fields)."""
    import time

    import httpx

    from ._client import signed

    base = url.rstrip("/")
    why = f"no agent answers at {base}"
    deadline = time.monotonic() + 5.0  # in all: a server that trickles a byte a second is cut off
    try:
        with httpx.stream("GET", f"{base}/guard", timeout=2.0, trust_env=False,
                          headers=signed("GET", f"{base}/guard")) as resp:
            if resp.status_code != 200:
                why = f"the agent at {base} answered {resp.status_code}"
                raise ValueError(why)
            body = b""
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > GUARD_REPLY_MAX:
                    why = f"the agent at {base} answered more than {GUARD_REPLY_MAX} bytes"
                    raise ValueError(why)
                if time.monotonic() > deadline:
                    why = f"the agent at {base} took more than 5 s to answer"
                    raise ValueError(why)
        reply = msgspec.json.decode(body, type=GuardReply)
        found = reply.memory_enforcement
        return {"mode": found.mode, "base": found.base, "moved_to": found.moved_to, "why": found.why}, reply
    except msgspec.DecodeError as exc:
        why = f"the agent at {base} answered no enforcement this client reads ({str(exc)[:120]})"
    except (httpx.HTTPError, ValueError):
        pass
    return {"mode": "unknown", "base": None, "moved_to": None, "why": f"{why} (an agent finds it at its start)"}, None


def _sync_root_predicate(config: Any) -> Any:
    """Paths (relative to the data dir) under the sync root, or None when the root lies outside the data dir. Both
    are resolved (symlinks, ``..``), so a root named through a link into the data dir is still protected."""
    data_dir = config.agent.data_dir.resolve()
    root = Path(config.sync.root).resolve() if config.sync.root else data_dir / "data"
    try:
        rel = root.relative_to(data_dir).as_posix()
    except ValueError:
        return None
    prefix = "" if rel in ("", ".") else rel + "/"
    return lambda path: path.startswith(prefix)


def _cmd_guard_cleanup(ns: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..guardcore import run_cleanup

    config = config_from(ns)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if not config.agent.data_dir.is_dir():
        print(f"p2pnode guard cleanup: no data dir at {config.agent.data_dir}", file=sys.stderr)
        return 2
    # Offline the CLI cannot see receipts, nor trust the tags it was given (an operator who leaves out the node's
    # `ephemeral` tag would be shown its unreplicated checkpoints as deletable): nothing in the sync root is deleted
    # here; the agent deletes there once R durable receipts confirm a file.
    protected = _sync_root_predicate(config) if config.sync.enabled else None
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
