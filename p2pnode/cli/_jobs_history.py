"""``p2pnode jobs history [--limit N] [--json]``: the cluster's ended and running jobs, from every live member's
``GET /jobs/history``: each node's own runs, and the records of vanished nodes' runs that durable members hold as
replicas of their job archives (issue 41, item 5; docs/jobs.md). One run per node and job id, a node's own record
before a replica's, newest start first."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from ..synccore import ArchivedRun, merge_runs

__all__ = ["add_history_parser", "cmd_history"]

HISTORY_REPLY_MAX = 8 << 20
"""Bytes of an agent's ``/jobs/history`` answer read at most."""


class HistoryRun(ArchivedRun, frozen=True):
    """One run of a ``/jobs/history`` answer: the record, and where the answering node has it (``local``: its
    own run; ``replica``: a replica of another node's archive)."""

    job_id: Annotated[str, Meta(max_length=256)]  # (a node's own row is shown whatever its id's shape)
    source: str = ""


class HistoryReply(msgspec.Struct, frozen=True):
    """An agent's ``/jobs/history`` answer as this client reads it."""

    node_id: str
    runs: list[HistoryRun] = []
    replicated: int = 0
    rejected: dict[str, int] = {}


def add_history_parser(jsub: Any, default_url: str) -> None:
    """``jobs history`` under the ``jobs`` subcommands ``jsub``."""
    jh = jsub.add_parser("history", help="jobs that ran across the cluster, vanished nodes' included",
                         description="The newest runs of every live member, and of nodes that are gone whose job "
                         "archives durable members hold (docs/jobs.md#after-the-node-is-gone), merged: one run per "
                         "node and job id, newest start first.")
    jh.add_argument("--limit", type=int, default=50, help="runs shown at most (1-1000, default 50)")
    jh.add_argument("--json", action="store_true", help="print the merged runs as JSON")
    jh.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    jh.add_argument("--timeout", type=float, default=5.0)
    jh.set_defaults(func=cmd_history)


def _read(url: str, timeout: float, *, bearer: bool) -> HistoryReply:
    """GET ``url`` (signed like every CLI read; ``bearer`` False: without the read token, for an address another
    node named) and decode it. Raises ``ValueError`` naming what went wrong."""
    import httpx

    from ._client import signed

    headers = signed("GET", url)
    if not bearer:
        headers.pop("authorization", None)
    try:
        resp = httpx.get(url, timeout=timeout, trust_env=False, headers=headers)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot read {url}: {exc}") from None
    if resp.status_code != 200:
        raise ValueError(f"{url} answered {resp.status_code}")
    if len(resp.content) > HISTORY_REPLY_MAX:
        raise ValueError(f"{url} answered more than {HISTORY_REPLY_MAX} bytes")
    try:
        return msgspec.json.decode(resp.content, type=HistoryReply)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{url} answered no history this client reads ({str(exc)[:160]})") from None


def _member_urls(ns: argparse.Namespace) -> list[str]:
    """The live members' URLs the agent at ``--url`` lists, without itself (none when it cannot list them)."""
    from ._client import list_members

    try:
        members = list_members(ns)
    except Exception:  # noqa: BLE001 - an agent that cannot list its members: its own answer only
        return []
    return [f"http://{m['addr']}" for m in members if not m.get("self") and m.get("addr")
            and not m.get("addr_refused") and m.get("state") in ("alive", "suspect")]


def cmd_history(ns: argparse.Namespace) -> int:
    """Ask the agent at ``--url`` and every live member it lists; print the merged runs."""
    limit = min(max(ns.limit, 1), 1000)
    base = ns.url.rstrip("/")
    try:
        first = _read(f"{base}/jobs/history?n={limit}", ns.timeout, bearer=True)
    except ValueError as exc:
        print(f"p2pnode: {exc}", file=sys.stderr)
        return 2
    replies, failed = [first], []
    for url in _member_urls(ns):
        try:
            replies.append(_read(f"{url}/jobs/history?n={limit}", ns.timeout, bearer=False))
        except ValueError as exc:
            failed.append(str(exc))
    runs = [dict(msgspec.structs.asdict(r), held_by=reply.node_id) for reply in replies for r in reply.runs]
    runs.sort(key=lambda r: r["source"] != "local")  # a node's own record before any replica of it
    merged = merge_runs([runs], limit)
    if ns.json:
        json.dump(merged, sys.stdout, indent=2)
        print()
        return 0
    _print(merged, failed, sum(sum(r.rejected.values()) for r in replies))
    return 0


def _print(runs: list[dict[str, Any]], failed: list[str], rejected: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from ._screen import fmt_age

    now = time.time()
    t = Table(title="job history (the cluster's live members, and replicas of vanished nodes' archives)")
    for col in ("node", "job", "template", "started", "duration", "exit", "ended by", "reason", "from"):
        t.add_column(col)
    for r in runs:
        dur = (r["ended_at"] or now) - r["started_at"]
        where = "its node" if r["source"] == "local" else f"replica on {str(r['held_by'])[:12]}"
        t.add_row(str(r["node_id"])[:12], r["job_id"], r["template"], fmt_age(now - r["started_at"]) + " ago",
                  fmt_age(dur), str(r.get("exit_status")),
                  str(r.get("rule") or r.get("outcome") or "-") if r["ended_at"] else "",
                  r.get("reason") or "running", where)
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(t)
    for f in failed:
        console.print(f"[yellow]not asked: {f}[/]")
    if rejected:
        console.print(f"[yellow]{rejected} replicated records left out (see GET /jobs/history 'rejected')[/]")
