"""The parser of every ``p2pnode`` command, assembled from each command family's own parsers (their order is the
order ``p2pnode --help`` lists them in), and ``p2pnode completion``, which is generated from it."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .. import __version__
from ..config import DEFAULT_PORT
from ._agent import add_agent_parser
from ._config import add_catalog_parser, add_config_parser
from ._guard import add_guard_parser
from ._jobs import add_jobs_parser
from ._keys import add_keys_parser
from ._node import add_node_parser
from ._signals import add_signals_parser
from ._simulate import add_demo_parser, add_simulate_parser
from ._status import add_status_parser
from ._sync import add_sync_parser

__all__ = ["build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of every ``p2pnode`` command."""
    parser = argparse.ArgumentParser(prog="p2pnode", description="Peer-to-peer node agent for GPU fleets.")
    parser.add_argument("--version", action="version", version=f"p2pnode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    default_url = os.environ.get("P2PNODE_URL", f"http://127.0.0.1:{os.environ.get('P2PNODE_PORT', DEFAULT_PORT)}")
    add_agent_parser(sub)
    add_status_parser(sub, default_url)
    add_demo_parser(sub)
    _add_completion_parser(sub)
    add_simulate_parser(sub)
    add_guard_parser(sub, default_url)
    add_jobs_parser(sub, default_url)
    add_sync_parser(sub, default_url)
    add_signals_parser(sub, default_url)
    add_node_parser(sub, default_url)
    add_keys_parser(sub)
    add_catalog_parser(sub, default_url)
    add_config_parser(sub)
    return parser


def _add_completion_parser(sub: Any) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="Print a completion script for every command and option. bash: "
                       "p2pnode completion bash > /etc/bash_completion.d/p2pnode; zsh: "
                       "p2pnode completion zsh > \"${fpath[1]}/_p2pnode\". Needs shtab (p2pnode[completion]).")
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(func=_cmd_completion)


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
