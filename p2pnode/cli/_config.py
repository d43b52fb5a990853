"""``p2pnode config show|validate`` and ``p2pnode catalog validate``: the operator's files checked offline."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ._options import add_agent_options, config_from

__all__ = ["add_catalog_parser", "add_config_parser"]


def add_catalog_parser(sub: Any, default_url: str) -> None:
    p = sub.add_parser("catalog", help="job catalog tools: validate a file, push a signed catalog to the fleet")
    csub_cat = p.add_subparsers(dest="catalog_command", required=True)
    cv = csub_cat.add_parser("validate", help="check a catalog file; exit 1 listing every error with its location")
    cv.add_argument("file", help="catalog TOML file")
    cv.set_defaults(func=_cmd_catalog_validate)
    kg = csub_cat.add_parser("keygen", help="make an operator key that signs pushed catalogs and role certificates",
                             description="Write a new Ed25519 private key to KEYFILE (mode 0600; refused if it "
                             "exists) and print its public key, ed25519:<base64>: list it in catalog.signers on the "
                             "nodes that should accept catalogs pushed with it, and in agent.operator_keys on the "
                             "nodes that should count the roles it certifies (p2pnode node certify).")
    kg.add_argument("keyfile", help="where the private key goes (keep it off the fleet)")
    kg.set_defaults(func=_cmd_catalog_keygen)
    cp = csub_cat.add_parser("push", help="sign a catalog and push it; opted-in nodes adopt it without a restart",
                             description="Validate FILE, sign it at --version with --key and POST it to the agent "
                             "at --url. Nodes whose catalog.signers pin that key adopt it (the newest version wins), "
                             "persist it and reload without a restart; they fetch it from each other, so one node "
                             "is enough. A catalog names commands nodes run: the scripts it points to are deployed "
                             "separately (an image, an on-start script). Nodes that pin no key keep their own file.")
    cp.add_argument("file", help="catalog TOML file")
    cp.add_argument("--key", required=True, help="the operator's private key file (p2pnode catalog keygen)")
    cp.add_argument("--version", type=int, default=None,
                    help="catalog version, above the fleet's (default: the current Unix time in seconds)")
    cp.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    cp.add_argument("--timeout", type=float, default=10.0)
    cp.set_defaults(func=_cmd_catalog_push)
    cs = csub_cat.add_parser("status", help="each member's catalog: pushed version (0: its own file), digest and, "
                                            "where this node fetched from it, what it served (adopted, refused)")
    cs.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    cs.add_argument("--json", action="store_true")
    cs.add_argument("--timeout", type=float, default=5.0)
    cs.set_defaults(func=_cmd_catalog_status)


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


def _cmd_catalog_keygen(ns: argparse.Namespace) -> int:
    """Write a new operator key (0600, never over an existing file) and print its public half."""
    import os

    from .._ed25519 import SigningKey, pkcs8_pem
    from ..scheduler import public_key_text

    key = SigningKey.generate()
    pem = pkcs8_pem(key)
    try:
        fd = os.open(ns.keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        print(f"p2pnode catalog keygen: {ns.keyfile}: {exc.strerror}", file=sys.stderr)
        return 2
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    print(public_key_text(key))
    return 0


def _cmd_catalog_push(ns: argparse.Namespace) -> int:
    """Validate, sign and POST a catalog; exit 0 when the agent adopted it, 1 when it refused (with the reason)."""
    import time

    import httpx

    from .._ed25519 import load_pem_key
    from ..scheduler import CatalogError, encode_signed, load_catalog, sign_catalog

    try:
        load_catalog(Path(ns.file))
        text = Path(ns.file).read_text()
        key = load_pem_key(Path(ns.key))
    except CatalogError as exc:
        print(f"p2pnode catalog push: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"p2pnode catalog push: {exc}", file=sys.stderr)
        return 2
    version = ns.version if ns.version is not None else int(time.time())
    if not 1 <= version <= 2**53:
        print("p2pnode catalog push: --version must be 1 to 2^53", file=sys.stderr)
        return 2
    body = encode_signed(sign_catalog(key, version, text))
    try:
        # authenticated by the catalog's own signature (a key the nodes pin), not by the request
        resp = httpx.post(f"{ns.url.rstrip('/')}/catalog", content=body, timeout=ns.timeout, trust_env=False,
                          headers={"content-type": "application/json"})
    except httpx.HTTPError as exc:
        print(f"p2pnode catalog push: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    try:
        answer = resp.json()
    except ValueError:
        answer = {"error": resp.text[:200]}
    if resp.status_code == 200:
        print(f"{ns.url}: adopted catalog version {version}; opted-in members fetch it from there")
        return 0
    print(f"p2pnode catalog push: {ns.url} refused version {version} ({resp.status_code} {answer.get('error')}: "
          f"{answer.get('detail', '')}; it holds version {answer.get('version')})", file=sys.stderr)
    return 1


def _cmd_catalog_status(ns: argparse.Namespace) -> int:
    """Each member's catalog as its signed snapshot says (pushed version, 0: its own file; digest) and, as this
    node found it, what the member served when asked (``/status`` ``catalog.pushed.sources``): adopted, or the
    refusal (``version_mismatch``, ``unreachable``...) and how long it stays skipped."""
    from ._client import get_json

    base = ns.url.rstrip("/")
    members = get_json(f"{base}/members", ns.timeout)
    status = get_json(f"{base}/status", ns.timeout)
    if members is None or status is None:
        return 2
    here = (status.get("catalog") or {}).get("pushed") or {}
    tried = (here.get("sources") or {}).get("members") or {}
    rows = []
    for m in members.get("members") or []:
        t = tried.get(m.get("id")) or {}
        rows.append({"id": m.get("id"), "state": m.get("state"), "version": m.get("catalog_version", 0),
                     "digest": m.get("catalog_digest", ""), "result": t.get("result") or "",
                     "served": t.get("served") or 0, "skipped_for_s": t.get("skipped_for_s") or 0})
    if ns.json:
        print(json.dumps({"members": rows, "here": here}, indent=2))
        return 0
    print(f"this node: {'accepts' if here.get('accepts_pushed') else 'does not accept'} pushed catalogs; holds "
          f"version {here.get('version', 0)} (floor {here.get('floor', 0)}); refused {here.get('refused') or {}}")
    for r in rows:
        line = f"  {str(r['id'])[:16]:<16} {str(r['state']):<8} version {r['version']:<12} digest {r['digest']}"
        if r["result"]:
            line += f"  fetched: {r['result']}"
            line += f" (served {r['served']})" if r["served"] and r["served"] != r["version"] else ""
            line += f", skipped for {r['skipped_for_s']:g} s" if r["skipped_for_s"] else ""
        print(line)
    return 0
