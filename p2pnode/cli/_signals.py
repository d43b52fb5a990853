"""``p2pnode signals set``: a training pipeline's signals for one config, sent to an agent (signed)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._client import post_json

__all__ = ["add_signals_parser"]


def add_signals_parser(sub: Any, default_url: str) -> None:
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


def _cmd_signals_set(ns: argparse.Namespace) -> int:
    import httpx

    sig: dict = {"config": ns.config}
    for key in ("curriculum_weight", "elo_velocity", "data_age_s", "quality", "game_count"):
        v = getattr(ns, key)
        if v is not None:
            sig[key] = v
    try:
        resp = post_json(f"{ns.url.rstrip('/')}/signals", sig, ns.timeout)
    except httpx.HTTPError as exc:
        print(f"p2pnode signals set: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    if resp.status_code != 200:
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else resp.text
        print(f"p2pnode signals set: rejected ({resp.status_code}): {body}", file=sys.stderr)
        return 1
    print(f"signals for {ns.config} accepted")
    return 0
