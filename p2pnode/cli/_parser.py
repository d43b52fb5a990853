"""The parser of every ``p2pnode`` command, assembled from each command family's own parsers (their order is the
order ``p2pnode --help`` lists them in), and ``p2pnode completion``, which is generated from it."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from .. import __version__
from ..config import DEFAULT_PORT

__all__ = ["build_parser"]


FAMILIES: tuple[tuple[str, str, str, bool], ...] = (
    ("agent", "._agent", "add_agent_parser", False),
    ("status", "._status", "add_status_parser", True),
    ("demo", "._simulate", "add_demo_parser", False),
    ("completion", "", "", False),
    ("simulate", "._simulate", "add_simulate_parser", False),
    ("guard", "._guard", "add_guard_parser", True),
    ("jobs", "._jobs", "add_jobs_parser", True),
    ("sync", "._sync", "add_sync_parser", True),
    ("signals", "._signals", "add_signals_parser", True),
    ("node", "._node", "add_node_parser", True),
    ("keys", "._keys", "add_keys_parser", False),
    ("catalog", "._config", "add_catalog_parser", True),
    ("config", "._config", "add_config_parser", False),
)
"""``(command, module, adder, takes the default URL)`` in ``p2pnode --help`` order: each family's module adds its
parser. A module is imported only when its parser is built: ``p2pnode agent`` builds the agent's alone, so the
agent process never loads the other commands' modules (issue 43: an idle agent's RSS)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argparse parser of every ``p2pnode`` command; with ``command`` (a name in :data:`FAMILIES`), of that
    command alone (the same subparser: its ``--help`` and errors read the same)."""
    parser = argparse.ArgumentParser(prog="p2pnode", description="Peer-to-peer node agent for GPU fleets.")
    parser.add_argument("--version", action="version", version=f"p2pnode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    default_url = os.environ.get("P2PNODE_URL", f"http://127.0.0.1:{os.environ.get('P2PNODE_PORT', DEFAULT_PORT)}")
    for name, module, adder, with_url in FAMILIES:
        if command is not None and name != command:
            continue
        if not module:
            _add_completion_parser(sub)
            continue
        add = getattr(importlib.import_module(module, __package__), adder)
        if with_url:
            add(sub, default_url)
        else:
            add(sub)
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
