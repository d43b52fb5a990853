"""``p2pnode config show|validate`` and ``p2pnode catalog validate``: the operator's files checked offline."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ._options import add_agent_options, config_from

__all__ = ["add_catalog_parser", "add_config_parser"]


def add_catalog_parser(sub: Any) -> None:
    p = sub.add_parser("catalog", help="job catalog tools")
    csub_cat = p.add_subparsers(dest="catalog_command", required=True)
    cv = csub_cat.add_parser("validate", help="check a catalog file; exit 1 listing every error with its location")
    cv.add_argument("file", help="catalog TOML file")
    cv.set_defaults(func=_cmd_catalog_validate)


def add_config_parser(sub: Any) -> None:
    p = sub.add_parser("config", help="inspect configuration")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the effective configuration as JSON (token masked)")
    add_agent_options(show)
    show.set_defaults(func=_cmd_config_show)
    val = csub.add_parser("validate", help="check the configuration (file, env, flags); exit 1 on inconsistencies")
    add_agent_options(val)
    val.set_defaults(func=_cmd_config_validate)


def _cmd_config_show(ns: argparse.Namespace) -> int:
    config = config_from(ns)
    json.dump(config.to_dict(), sys.stdout, indent=2)
    print()
    return 0


def _cmd_config_validate(ns: argparse.Namespace) -> int:
    """Exit 0 with "config OK", or 1 with every inconsistency (each message names the settings)."""
    from ..errors import ConfigError

    try:
        config_from(ns)
    except ConfigError as exc:
        print(f"p2pnode config validate: {exc}", file=sys.stderr)
        return 1
    print("config OK")
    return 0


def _cmd_catalog_validate(ns: argparse.Namespace) -> int:
    """Exit 0 with a summary, or 1 with every error and its location."""
    from ..scheduler import CatalogError, load_catalog

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
