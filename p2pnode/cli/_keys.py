"""``p2pnode keys list|install|use|remove``: the cluster keyring of token mode in this node's data dir (no network:
tokens reach a node only through the operator's own channel)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_keys_parser"]


def add_keys_parser(sub: Any) -> None:
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


def _cmd_keys(ns: argparse.Namespace) -> int:
    """``p2pnode keys list|install|use|remove``: edit the keyring in this node's data dir (no network: tokens
    reach a node only through the operator's own channel). A running agent reloads the file within a second."""
    from ..keyring import KEYRING_FILE, Keyring, KeyringError

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
    from ..config import default_data_dir

    return default_data_dir()
