"""``p2pnode jobs predict [TEMPLATE] [--json]``: the fleet's predictions of run time and memory per template and
node class (``GET /jobs/predict``), from the leader, which holds every member's run-history summary."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Literal

import msgspec

from ..scheduler import Prediction

__all__ = ["add_predict_parser", "cmd_predict"]

PREDICT_REPLY_MAX = 8 << 20
"""Bytes of an agent's ``/jobs/predict`` answer read at most."""


class LeaderRef(msgspec.Struct, frozen=True):
    """The leader as the answering node sees it: node id and ``host:port`` ("" unknown)."""

    node: str
    addr: str = ""


class PredictReply(msgspec.Struct, frozen=True):
    """An agent's ``/jobs/predict`` answer as this client reads it."""

    node: str
    leader: LeaderRef | None = None
    partial: bool = False
    predictions: list[Prediction] = []
    outliers: dict[str, str] = {}
    min_runs: int = 3
    nodes: list[str] = []


def add_predict_parser(jsub: Any, default_url: str) -> None:
    """``jobs predict`` under the ``jobs`` subcommands ``jsub``."""
    jp = jsub.add_parser("predict", help="predicted run time and memory per template and node class",
                         description="Median and p90 run time, p90 peak RSS and VRAM, the runs and nodes they rest "
                         "on, per template and node class, from the fleet's job history (docs/capacity.md). Asked "
                         "of a node that does not lead, the leader's answer is fetched (it holds every node's).")
    jp.add_argument("template", nargs="?", default="", help="only this template")
    jp.add_argument("--json", action="store_true", help="print the answer as JSON")
    jp.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    jp.add_argument("--timeout", type=float, default=5.0)
    jp.set_defaults(func=cmd_predict)


def _read(url: str, timeout: float, *, bearer: bool = True) -> PredictReply:
    """GET ``url`` (signed like every CLI read) and decode the answer (at most :data:`PREDICT_REPLY_MAX` bytes).
    ``bearer`` False: without ``P2PNODE_READ_TOKEN`` (an address another node named is not trusted with a secret;
    the signed header, bound to its receiver, still goes). Raises ``ValueError`` naming what went wrong."""
    import httpx

    from ._client import signed

    deadline = time.monotonic() + timeout
    headers = signed("GET", url)
    if not bearer:
        headers.pop("authorization", None)
    try:
        with httpx.stream("GET", url, timeout=timeout, trust_env=False, headers=headers) as resp:
            if resp.status_code == 401:
                raise ValueError(f"{url} is protected: set P2PNODE_READ_TOKEN (agent.read_token) or a cluster token"
                                 + ("" if bearer else "; the read token is not sent to an address another node "
                                    "named: ask it with --url"))
            if resp.status_code != 200:
                raise ValueError(f"{url} answered {resp.status_code}")
            body = b""
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > PREDICT_REPLY_MAX:
                    raise ValueError(f"{url} answered more than {PREDICT_REPLY_MAX} bytes")
                if time.monotonic() > deadline:
                    raise ValueError(f"{url} took more than {timeout:g} s to answer")
        return msgspec.json.decode(body, type=PredictReply)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot read {url}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"{url} answered no predictions this client reads ({str(exc)[:160]})") from None


def cmd_predict(ns: argparse.Namespace) -> int:
    """Print the predictions of the leader (asked through the node at ``--url``)."""
    from urllib.parse import quote

    query = f"?template={quote(ns.template)}" if ns.template else ""
    asked = f"{ns.url.rstrip('/')}/jobs/predict{query}"
    try:
        reply = _read(asked, ns.timeout)
    except ValueError as exc:
        print(f"p2pnode: {exc}", file=sys.stderr)
        return 2
    note, answered = "", asked
    if reply.partial and reply.leader is not None and reply.leader.addr:
        leader, first = reply.leader, reply.node
        answered = f"http://{leader.addr}/jobs/predict{query}"
        try:
            reply = _read(answered, ns.timeout, bearer=False)
            note = f"{first[:12]} is not the leader: answered by the leader {leader.node[:12]} at {leader.addr}"
        except ValueError as exc:
            note = f"the node asked is not the leader, and the leader does not answer ({exc}): its own runs only"
            answered = asked
    elif reply.partial:
        note = "no leader: this node's own runs only"
    if ns.json:
        out: dict[str, Any] = msgspec.to_builtins(reply)
        out.update(asked=asked, answered_by=answered, note=note)
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    if note:
        print(f"({note})")
    _print_table(reply)
    return 0


def _print_table(reply: PredictReply) -> None:
    rows = [("TEMPLATE", "CLASS", "RUNS", "NODES", "P50", "P90", "RSS P90", "VRAM P90", "SOURCE")]
    for p in reply.predictions:
        rows.append((p.template, p.node_class or "(fleet)", str(p.runs), str(p.nodes), _secs(p.runtime_p50_s),
                     _secs(p.runtime_p90_s), _bytes(p.rss_p90_bytes), _bytes(p.vram_p90_bytes), _source(p.source)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if not reply.predictions:
        print("(no template in the catalog and no run in the history)")
    for node, why in sorted(reply.outliers.items()):
        print(f"left out: {node[:12]}: {why}")
    print(f"(history is preferred from {reply.min_runs} runs on; summaries of {len(reply.nodes)} node(s))")


def _source(s: Literal["history", "declared"]) -> str:
    return "history" if s == "history" else "declared (catalog)"


def _secs(v: float) -> str:
    if v >= 3600:
        return f"{v / 3600:.1f} h"
    if v >= 60:
        return f"{v / 60:.1f} min"
    return f"{v:.1f} s"


def _bytes(v: float | None) -> str:
    if v is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B"
