"""``p2pnode sync status|push|gc|publish``: data replication as the agent at ``--url`` sees it, a push now (with
progress until every file has R replicas), replica retention on a durable node, and a file published to
subscribers."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any

from ._client import fetch_view, get_json, read_view, signed
from ._screen import fmt_age, fmt_bytes, watch, watch_error

__all__ = ["add_sync_parser"]


def add_sync_parser(sub: Any, default_url: str) -> None:
    p = sub.add_parser("sync", help="data replication: status, push now, replica retention (gc), publish a file")
    ysub = p.add_subparsers(dest="sync_command", required=True)
    ys = ysub.add_parser("status", help="each synced file: class, size, replicas confirmed of R, lag, bytes pending")
    ys.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    ys.add_argument("--json", action="store_true", help="print the raw /sync/status JSON")
    ys.add_argument("--timeout", type=float, default=5.0)
    ys.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
                    help="refresh in place every SECONDS (default 2) until Ctrl-C")
    ys.set_defaults(func=_cmd_sync_status)
    yp = ysub.add_parser("push", help="run a sync pass now (POST /sync/trigger)",
                         description="Run a sync pass now (POST /sync/trigger). In token trust mode set "
                                     "P2PNODE_CLUSTER_TOKEN (or run it as the agent's user: the node's keyring is "
                                     "used): the request is signed with it (an HMAC; the token itself never leaves "
                                     "this machine).")
    yp.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    yp.add_argument("--wait", action="store_true",
                    help="wait, with progress bars, until every file has R confirmed replicas (exit 1 on timeout)")
    yp.add_argument("--wait-timeout", dest="wait_timeout", type=float, default=600.0, help="seconds (default 600)")
    yp.add_argument("--progress", action="store_true", help="show progress bars even when stderr is not a terminal")
    yp.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, seconds")
    yp.set_defaults(func=_cmd_sync_push)
    yg = ysub.add_parser(
        "gc", help="replica retention on a durable node: retire now what the policy lets go (see --dry-run)",
        description="Ask the running agent (a durable node) for a replica-retention pass now, like `nomad system gc`: "
                    "only the agent knows which versions the other durable nodes confirm and what each origin still "
                    "lists, so nothing is decided offline. A replica goes when its origin deleted the file and "
                    "[sync] retention_keep_versions / retention_keep_days passed, or, past retention_cap_bytes, when "
                    "R other durable nodes confirm that version; never when this node holds the only copy. Exit 1 "
                    "when the folder stays past its cap (new data is refused with 507). Signed like `sync push` in "
                    "token mode (P2PNODE_CLUSTER_TOKEN or the node's keyring).")
    yg.add_argument("--dry-run", action="store_true",
                    help="list what would be retired and why, and what is kept as an only copy; delete nothing")
    yg.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    yg.add_argument("--json", action="store_true", help="print the plan (or the pass) as JSON")
    yg.add_argument("--wait-timeout", dest="wait_timeout", type=float, default=300.0,
                    help="seconds to wait for the pass (default 300)")
    yg.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, seconds")
    yg.set_defaults(func=_cmd_sync_gc)
    yb = ysub.add_parser(
        "publish", help="publish FILE from this (durable) node to every node tagged T, signed with an operator key",
        description="Publish FILE to the nodes tagged T: they fetch it block by block from any member that holds it, "
                    "check every block against this signed manifest, and see it at <sync.subscribe_dir>/<name>, "
                    "switched by rename, with a MODEL_UPDATED event. Each subscriber fetches only from keys its own "
                    "[sync] publishers pins (ed25519:<base64>, as `p2pnode catalog keygen` prints); pin the key on "
                    "the publishing node too (it is what lets this request make the agent read FILE). A checkpoint "
                    "saved as a pickle runs code when loaded: publish safetensors where you can.")
    yb.add_argument("file", help="the file to publish (a path the agent at --url can read)")
    yb.add_argument("--to", required=True, metavar="tag:T", help="the tag of the nodes it is for (tag:training)")
    yb.add_argument("--key", required=True, help="the operator's private key file (p2pnode catalog keygen)")
    yb.add_argument("--name", default=None, help="the name subscribers see (default: the file's name)")
    yb.add_argument("--version", type=int, default=None,
                    help="the version (1 to 2^53, above the last one published under this name; default: now, Unix s)")
    yb.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    yb.add_argument("--timeout", type=float, default=600.0, help="seconds (the agent copies and hashes FILE)")
    yb.set_defaults(func=_cmd_sync_publish)


def _sync_table(data: dict[str, Any]):
    from rich.table import Table

    table = Table(title=f"files under {data.get('root')} (R = {data.get('r_effective')} of "
                        f"{data.get('replication_factor')} wanted, {data.get('durable_members')} durable members)")
    for col in ("path", "class", "size", "replicas", "lag", "pending", "targets"):
        table.add_column(col, justify="right" if col in ("size", "replicas", "lag", "pending") else "left")
    for f in data.get("files", []):
        style = "" if f["replicas"] >= f["r"] else "yellow"
        cls = f["class"] + (" by WAL" if f.get("carried_by") == "wal" else "")  # its backup copies are rare
        table.add_row(f["path"], cls, fmt_bytes(f["size"]), f"{f['replicas']}/{f['r']}",
                      fmt_age(f["lag_s"]) if f["lag_s"] else "-",
                      fmt_bytes(f["bytes_pending"]) if f["bytes_pending"] else "-",
                      ", ".join(f.get("targets") or []) or "-", style=style)
    return table


def _challenge_lines(data: dict[str, Any]) -> list[Any]:
    """Proof of possession on a pushing node: the challenges' counters and every holder that failed one."""
    from rich.text import Text

    ch = data.get("challenges") or {}
    failed = {k: v for k, v in (ch.get("failed") or {}).items() if v}
    out: list[Any] = [Text(f"challenges sent {ch.get('sent', 0)}, passed {ch.get('passed', 0)}, failed "
                           + (", ".join(f"{k} {v}" for k, v in sorted(failed.items())) or "0")
                           + f", overloaded {ch.get('overloaded', 0)} (inconclusive)")]
    for f in data.get("files", []):
        for holder, h in sorted((f.get("holders") or {}).items()):
            if h.get("state") == "failed" or (h.get("reason") and h.get("counted") is False):
                out.append(Text.assemble(("not counted", "yellow"),
                                         f": {holder} for {f['path']} (failed a challenge: {h.get('reason')})"))
            elif h.get("counted") is False:
                out.append(Text.assemble(("not counted", "yellow"),
                                         f": {holder} for {f['path']} (overloaded {h.get('overloads')}x in a row)"))
            elif h.get("passes_needed"):
                out.append(Text(f"recovering: {holder} for {f['path']} (counts; {h['passes_needed']} more pass(es) "
                                "in a row before it counts toward a delete)"))
    return out


def _sync_status_render(data: dict[str, Any]):
    """``p2pnode sync status`` as one rich renderable."""
    from rich.console import Group
    from rich.text import Text

    out: list[Any] = []
    roles = [r for r, on in (("pushes (ephemeral)", data.get("pushes")),
                             ("keeps replicas (durable)", data.get("keeps"))) if on]
    out.append(Text.from_markup(f"[bold]node[/] {data['node_id']}  "
                                f"[bold]role[/] {', '.join(roles) or 'none (tag it ephemeral or durable)'}"))
    if data.get("pushes"):
        out.append(_sync_table(data))
        sent = data.get("sent", {})
        out.append(Text(f"sent {fmt_bytes(sent.get('bytes', 0))} in {sent.get('requests', 0)} requests "
                        f"({sent.get('request_failures', 0)} failed; {sent.get('streams', 0)} block streams, "
                        f"{sent.get('channel_fallbacks', 0)} fallbacks to HTTP), "
                        f"blocks re-sent {sent.get('blocks_resent', 0)}, "
                        f"refused by targets: {sent.get('rejected_by_targets') or 'none'}"))
        if data.get("refusing"):
            out.append(Text.from_markup(f"[yellow]skipped (backpressure)[/]: {', '.join(data['refusing'])}"))
        out += _challenge_lines(data)
        for path, err in (data.get("errors") or {}).items():
            out.append(Text.assemble((f"cannot sync {path}", "red"), f": {err}"))
    rec = data.get("received", {})
    if data.get("keeps"):
        port = data.get("data_port")
        out.append(Text(f"replicas held {rec.get('replicas', 0)} ({fmt_bytes(rec.get('replica_bytes', 0))}), "
                        f"received {fmt_bytes(rec.get('bytes_received', 0))}, commits {rec.get('commits', 0)}, "
                        f"transfers under way {len(rec.get('transfers', []))}; data channel "
                        + (f"on port {port} ({rec.get('streams', 0)} streams)" if port else "off (blocks over HTTP)")))
    out += _distribution_lines(data.get("distribution") or {})
    refused = Counter(rec.get("rejected", {}))
    refused.update(rec.get("refused_requests", {}))
    if refused:
        out.append(Text.assemble(("refused input", "yellow"),
                                 ": " + ", ".join(f"{k} {v}" for k, v in sorted(refused.items()))))
    return Group(*out)


def _distribution_lines(d: dict[str, Any]) -> list[Any]:
    """Published files: each one's version, state, progress and holders; what was served and fetched."""
    from rich.text import Text

    out: list[Any] = []
    for f in d.get("files", []):
        holders = f.get("holders") or {}
        complete = sum(1 for h in holders.values() if h["blocks"] >= f["blocks"])
        pct = 100.0 * f["blocks_held"] / f["blocks"] if f["blocks"] else 100.0
        role = "published here" if f.get("origin") else f["state"]
        out.append(Text(f"published {f['name']} v{f['version']} ({fmt_bytes(f['size'])}, to "
                        f"{('tag:' + f['to']) if f['to'] else 'all'}): {role}, {pct:.0f}% here; holders "
                        f"{complete} complete of {len(holders)}"
                        + "".join(f"; {h[:8]} {100.0 * v['blocks'] / max(1, f['blocks']):.0f}%"
                                  for h, v in sorted(holders.items())[:8])))
    if d.get("files") or d.get("refused") or d.get("serve_refused"):
        out.append(Text(f"distribution: served {fmt_bytes(d.get('bytes_served', 0))}, fetched "
                        f"{fmt_bytes(sum((d.get('bytes_fetched') or {}).values()))}; publications refused "
                        f"{d.get('refused') or 'none'}; requests refused {d.get('serve_refused') or 'none'}"))
    return out


def _cmd_sync_publish(ns: argparse.Namespace) -> int:
    """Hash and sign FILE here, then ask the agent to publish it; exit 0 published, 1 refused, 2 a local error."""
    import os
    from pathlib import Path

    import httpx
    import msgspec

    from .._ed25519 import load_pem_key
    from ..synccore import PublicationRefused, block_size_for, encode_publication, hash_file, sign_publication

    to = ns.to[4:] if ns.to.startswith("tag:") else ""
    if not to:
        print("p2pnode sync publish: --to takes tag:T", file=sys.stderr)
        return 2
    path = Path(ns.file).absolute()
    try:
        key = load_pem_key(Path(ns.key))
        manifest = hash_file(path, block_size=block_size_for(os.path.getsize(path)))
        pub = sign_publication(key.sign, key.public_key, ns.name or path.name,
                               ns.version if ns.version is not None else int(time.time()), manifest, to)
    except (OSError, ValueError, TypeError, PublicationRefused) as exc:
        print(f"p2pnode sync publish: {exc}", file=sys.stderr)
        return 2
    body = msgspec.msgpack.encode({"path": str(path), "publication": encode_publication(pub)})
    url = f"{ns.url.rstrip('/')}/sync/publish"
    try:
        resp = httpx.post(url, content=body, timeout=ns.timeout, trust_env=False,
                          headers={"content-type": "application/msgpack", **signed("POST", url, body)})
    except httpx.HTTPError as exc:
        print(f"p2pnode sync publish: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    try:
        answer = resp.json()
    except ValueError:
        answer = {"error": resp.text[:200]}
    if resp.status_code == 200:
        print(f"published {pub.name} v{pub.version} ({pub.size} bytes, root {pub.root.hex()[:16]}) to tag:{to}")
        return 0
    print(f"p2pnode sync publish: refused ({resp.status_code}): {answer.get('error')}: {answer.get('detail', '')}",
          file=sys.stderr)
    return 1


def _cmd_sync_status(ns: argparse.Namespace) -> int:
    """Each synced file: class, size, replicas confirmed of R, lag, bytes pending; replicas held for others."""
    if ns.watch is not None:
        if ns.json or ns.watch <= 0:
            print("p2pnode sync status: --watch takes a positive interval and no --json", file=sys.stderr)
            return 2
        url = f"{ns.url.rstrip('/')}/sync/status"

        def render():
            data, why = read_view(url, ns.timeout)
            return watch_error(why) if data is None else _sync_status_render(data)

        return watch(render, ns.watch)
    view = fetch_view(ns, "/sync/status")
    if isinstance(view, int):
        return view
    data, console = view
    console.print(_sync_status_render(data))
    return 0


def _cmd_sync_push(ns: argparse.Namespace) -> int:
    """Run a sync pass now; with --wait, show progress until every file has R confirmed replicas."""
    import httpx
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    base = ns.url.rstrip("/")
    try:
        resp = httpx.post(f"{base}/sync/trigger", timeout=ns.timeout, trust_env=False,
                          headers=signed("POST", f"{base}/sync/trigger"))
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"p2pnode sync push: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    if not resp.json().get("triggered"):
        print("p2pnode sync push: this node does not push (tag it ephemeral)", file=sys.stderr)
        return 1
    if not ns.wait:
        print("sync pass triggered")
        return 0
    deadline = time.monotonic() + ns.wait_timeout
    time.sleep(0.2)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                  TransferSpeedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[replicas]}"),
                  disable=not sys.stderr.isatty() and not ns.progress) as progress:
        tasks: dict[str, Any] = {}
        while True:
            data = get_json(f"{base}/sync/status", ns.timeout)
            if data is None:
                return 2
            files = data.get("files", [])
            for f in files:
                total = max(f["size"], 1)
                done = total if f["replicas"] >= f["r"] else (
                    f["progress"]["sent"] * total // max(f["progress"]["total"], 1) if f.get("progress") else 0)
                if f["path"] not in tasks:
                    if f["replicas"] >= f["r"] and f["size"] < 64 * 2**20:
                        continue  # small and already safe: no bar
                    tasks[f["path"]] = progress.add_task(f["path"], total=total, replicas="")
                progress.update(tasks[f["path"]], completed=done, replicas=f"{f['replicas']}/{f['r']} replicas")
            under = [f for f in files if f["replicas"] < f["r"]]
            if data.get("durable_members", 0) > 0 and not under:
                break
            if time.monotonic() > deadline:
                progress.stop()
                print(f"p2pnode sync push: {len(under)} file(s) below R after {ns.wait_timeout:g} s"
                      + ("" if data.get("durable_members") else " (no durable member known)"), file=sys.stderr)
                return 1
            time.sleep(0.5)
    print(f"every file has R = {data.get('r_effective')} confirmed replicas ({len(files)} files)")
    return 0


def _gc_why(d: dict[str, Any]) -> str:
    """Why one retention decision (a line of the plan in ``/sync/status``) was taken, in words."""
    days = (d.get("unlisted_for_s") or 0) / 86400
    above = len(d.get("above") or [])
    if d["reason"] == "retired":
        return f"origin deleted it {days:.1f} days ago; {above} higher-ranked durable node(s) hold this version"
    if d["reason"] == "over_cap":
        return f"past the cap; {above} higher-ranked durable node(s) hold this version ({d['status']} at origin)"
    if d["reason"] == "only_copy":
        return ("origin's listing unknown" if d["status"] == "unknown" else f"{d['status']} at origin") + \
            "; no other durable node holds this version"
    return d["reason"]


def _gc_table(title: str, rows: list[dict[str, Any]], total: int):
    from rich.table import Table

    table = Table(title=f"{title} ({total})" + (f", first {len(rows)} shown" if total > len(rows) else ""))
    for col in ("origin", "path", "size", "why"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for d in rows:
        table.add_row(d["origin"][:12], d["path"], fmt_bytes(d["size"]), _gc_why(d))
    return table


def _cmd_sync_gc(ns: argparse.Namespace) -> int:
    """Replica retention on the running agent (a durable node): a pass now, or with --dry-run the plan."""
    import httpx
    from rich.console import Console

    base = ns.url.rstrip("/")
    data = get_json(f"{base}/sync/status", ns.timeout)
    if data is None:
        return 2
    ret = data.get("retention")
    if not data.get("keeps") or not ret:
        print("p2pnode sync gc: this node keeps no replicas (tag it durable)", file=sys.stderr)
        return 1
    console = Console(width=None if sys.stdout.isatty() else 160)
    if ns.dry_run:
        plan = ret["plan"]
        if ns.json:
            json.dump(plan, sys.stdout, indent=2)
            print()
            return 0
        cap = fmt_bytes(plan["cap_bytes"]) if plan["cap_bytes"] else "no cap"
        console.print(f"replicas held {fmt_bytes(plan['held_bytes'])} (cap: {cap}); would retire "
                      f"{plan['retire_count']} ({fmt_bytes(plan['retire_bytes'])}) -> "
                      f"{fmt_bytes(plan['after_bytes'])} (listings and receipt lists as of the agent's last "
                      f"retention pass; {ret['passes']} so far)")
        console.print(_gc_table("would retire", plan["retire"], plan["retire_count"]))
        console.print(_gc_table("kept: only copies", plan["only_copies"], plan["only_copy_count"]))
        if plan["full"]:
            console.print("[red]still past the cap after that[/]: new data is refused (507) until room is found")
        return 0
    before = ret["passes"]
    try:
        resp = httpx.post(f"{base}/sync/trigger", timeout=ns.timeout, trust_env=False,
                          headers=signed("POST", f"{base}/sync/trigger"))
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"p2pnode sync gc: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + ns.wait_timeout
    while ret["passes"] <= before:
        if time.monotonic() > deadline:
            print(f"p2pnode sync gc: no retention pass finished within {ns.wait_timeout:g} s", file=sys.stderr)
            return 1
        time.sleep(0.2)
        data = get_json(f"{base}/sync/status", ns.timeout)
        if data is None:
            return 2
        ret = data["retention"]
    last = ret["last_pass"] or {}
    if ns.json:
        json.dump(last, sys.stdout, indent=2)
        print()
        return 0
    console.print(f"retired {last.get('retired_count', 0)} replicas ({fmt_bytes(last.get('freed_bytes', 0))}); "
                  f"{last.get('only_copy_count', 0)} only copies kept")
    console.print(_gc_table("retired", last.get("retired", []), last.get("retired_count", 0)))
    if last.get("full"):
        console.print(f"[red]refusing new data (507)[/]: {ret.get('full_detail')}")
        return 1
    return 0
