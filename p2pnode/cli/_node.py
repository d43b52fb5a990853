"""``p2pnode node cordon|uncordon|drain|remove|admit|eligible|ineligible|unmark``: operator actions on a node (kept
by the node concerned) and on the voter roll, which also holds who may lead (applied on every live member; the
eligibility marks also spread from the voters to members that missed them)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._client import http_get, post_json, report, url_of

__all__ = ["add_node_parser"]

MARK_ACTIONS = ("eligible", "ineligible", "unmark")


def add_node_parser(sub: Any, default_url: str) -> None:
    p = sub.add_parser("node", help="operator actions on a node (cordon, uncordon, drain) and on the voter roll "
                       "(remove, admit, eligible, ineligible, unmark)")
    nsub = p.add_subparsers(dest="node_command", required=True)
    for action, text in (("remove", "remove a voter gone for good from the voter roll (like Consul's operator raft "
                                    "remove-peer); dead voters otherwise stay voters"),
                         ("admit", "admit a member tagged voter after open mode's voter roll closed "
                                   "(election.voter_bootstrap_s)"),
                         ("eligible", "let a node lead whatever its tags (by default a node tagged ephemeral does "
                                      "not lead while an eligible node is alive)"),
                         ("ineligible", "keep a node from leading while an eligible node is alive (a box you "
                                        "expect to lose, or too busy to plan)"),
                         ("unmark", "take back an eligible or ineligible mark: the node's tags decide again")):
        marks = (" Eligibility marks (at most 64 nodes carry one) also spread from the voters to every member, "
                 "so a member that was down takes them when it is back.") if action in MARK_ACTIONS else ""
        na = nsub.add_parser(action, help=text, description=f"{text[0].upper()}{text[1:]}. Applied on the agent at "
                             "--url and on every live member it lists (POST /voters)." + marks + " In token trust "
                             "mode set P2PNODE_CLUSTER_TOKEN (or use the node's keyring): requests are signed with "
                             "it.")
        na.add_argument("node_id", help="the member's node id (p2pnode status lists them)")
        na.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
        na.add_argument("--timeout", type=float, default=5.0)
        na.set_defaults(func=_cmd_node_voter)
    _add_certify(nsub)
    for action, text in (("cordon", "keep new work off a node (like kubectl cordon); what runs goes on"),
                         ("uncordon", "let a node take work again (ends a drain too)"),
                         ("drain", "cordon a node and, after --deadline, stop its preemptible work; the rest is "
                                   "waited for (like Nomad node drain)")):
        na = nsub.add_parser(action, help=text, description=f"{text[0].upper()}{text[1:]}. Kept by the node "
                             "concerned (its data dir and snapshot): it survives its restart and a leader failover.")
        na.add_argument("node_id", nargs="?", help="the node (a unique id prefix; default: the agent at --url)")
        if action == "drain":
            na.add_argument("--deadline", default="0", help="when preemptible work stops: 90s, 10m, 2h (default 0)")
        na.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
        na.add_argument("--timeout", type=float, default=5.0)
        na.set_defaults(func=_cmd_node_intent)


def _cmd_node_intent(ns: argparse.Namespace) -> int:
    """``p2pnode node cordon|uncordon|drain [ID]``: the intent is kept by the node concerned (its data dir and
    snapshot), so it survives its restart and any leader failover."""
    import httpx

    what = f"node {ns.node_command}"
    try:
        url = url_of(ns, ns.node_id)
        if ns.node_command == "drain":
            return report(post_json(f"{url}/operator/drain", {"deadline_s": _seconds(ns.deadline)}, ns.timeout),
                           what)
        return report(post_json(f"{url}/operator/cordon", {"cordon": ns.node_command == "cordon"}, ns.timeout),
                       what)
    except (LookupError, ValueError) as exc:
        print(f"p2pnode {what}: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"p2pnode {what}: cannot reach the agent: {exc}", file=sys.stderr)
        return 2


def _seconds(text: str) -> float:
    """``"90"``, ``"90s"``, ``"10m"``, ``"2h"`` -> seconds. Raises ``ValueError``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    mult = units.get(t[-1:], None)
    value = float(t[:-1] if mult else t) * (mult or 1)
    if not 0 <= value <= 30 * 86400:
        raise ValueError(f"--deadline {text!r}: between 0 and 30 days")
    return value


def _cmd_node_voter(ns: argparse.Namespace) -> int:
    """``p2pnode node remove|admit|eligible|ineligible|unmark ID``: edit the voter roll on the agent at ``--url``
    and on every member it lists that is not dead or left. Each keeps its own roll: members that are down miss an
    admission or a removal (run it again when they are back, or with ``--url`` pointed at them); eligibility
    marks they take from the voters' rolls when they are back (:meth:`p2pnode.election.VoterRoll.merge`)."""
    import httpx

    base = ns.url.rstrip("/")
    try:
        members = http_get(f"{base}/members", ns.timeout).json()["members"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        print(f"p2pnode node {ns.node_command}: cannot reach the agent: {exc}", file=sys.stderr)
        return 2
    urls = [base] + [f"http://{m['addr']}" for m in members  # never an address the agent refuses to dial
                     if not m.get("self") and m.get("addr") and not m.get("addr_refused")
                     and m.get("state") in ("alive", "suspect")]
    failed = 0
    for url in urls:
        try:
            resp = post_json(f"{url}/voters", {"node_id": ns.node_id, "action": ns.node_command}, ns.timeout)
            ok = resp.status_code == 200
            detail = resp.json() if ok else resp.text
        except (httpx.HTTPError, ValueError) as exc:
            ok, detail = False, str(exc)
        failed += not ok
        print(f"{url}: {'ok, ' + _roll_line(ns.node_command, detail) if ok else 'failed: ' + str(detail)}")
    return 1 if failed else 0


def _roll_line(action: str, reply: dict) -> str:
    """What the roll holds after ``action``, from a ``POST /voters`` reply: the voters, or the eligibility marks."""
    if action in MARK_ACTIONS:
        forgot = reply.get("forgotten") or []
        return (f"marked eligible: {', '.join(reply.get('eligible') or []) or '-'}; "
                f"marked ineligible: {', '.join(reply.get('ineligible') or []) or '-'}"
                + (f"; forgot the oldest mark of {', '.join(forgot)} (at most 64 are kept)" if forgot else ""))
    return "voters: " + ", ".join(reply.get("voters") or [])


def _add_certify(nsub: Any) -> None:
    from ..certs import ROLES

    c = nsub.add_parser("certify", help="sign a role certificate for a node (voter, durable, lead; a scaled node's "
                        "class): members that pin the operator key count those roles only with it",
                        description="Sign, with the operator key KEYFILE (p2pnode catalog keygen), a certificate "
                        "granting ROLEs to NODE_ID for --valid-for, and print it (JSON) or write it to --out, or with "
                        "--install into the data dir's role.cert (the agent reloads it without a restart). Members "
                        "whose [agent] operator_keys pin that key count the node's voter and durable tags and its "
                        "eligibility to lead only while such a certificate grants them.")
    c.add_argument("node_id", help="the node's id (p2pnode status shows it)")
    c.add_argument("--role", action="append", default=[], choices=ROLES, help="a role to grant (repeatable)")
    c.add_argument("--class", dest="node_class", default="", help="the node class of a scaled node (e.g. 1xH100)")
    c.add_argument("--provider-id", default="", help="the provider's id of a scaled node")
    c.add_argument("--key", required=True, help="the operator's private key file (p2pnode catalog keygen)")
    c.add_argument("--valid-for", default="30d", help="validity: 90s, 10m, 2h, 30d (default 30d; at most 400d)")
    c.add_argument("--out", default="", help="write the certificate to this file instead of printing it")
    c.add_argument("--install", action="store_true",
                   help="write it to role.cert in --data-dir (default: P2PNODE_DATA_DIR or the user's data dir)")
    c.add_argument("--data-dir", default="", help="the node's data dir, for --install")
    c.set_defaults(func=_cmd_node_certify)


def _valid_for(text: str) -> int:
    """``"90s"``, ``"10m"``, ``"2h"``, ``"30d"`` -> whole seconds (at least 1, at most 400 days). Raises
    ``ValueError``."""
    from ..certs import MAX_LIFETIME_S

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    mult = units.get(t[-1:], None)
    digits = t[:-1] if mult else t
    if not digits.isascii() or not digits.isdigit() or len(digits) > 9:
        raise ValueError(f"--valid-for {text!r}: a whole number with s, m, h or d")
    value = int(digits) * (mult or 1)
    if not 1 <= value <= MAX_LIFETIME_S:
        raise ValueError(f"--valid-for {text!r}: between 1 second and {MAX_LIFETIME_S // 86400} days")
    return value


def _cmd_node_certify(ns: argparse.Namespace) -> int:
    """``p2pnode node certify NODE_ID --role R --key KEYFILE``: exit 0 with the certificate printed or written, 2
    when the key or an option is unusable."""
    import time
    from pathlib import Path

    from .._ed25519 import load_pem_key
    from .._files import atomic_write_bytes
    from ..certs import CERT_FILE, encode_cert, sign_cert
    from ..config import default_data_dir

    try:
        seconds = _valid_for(ns.valid_for)
        key = load_pem_key(Path(ns.key))
        now = int(time.time())
        cert = sign_cert(key, ns.node_id, ns.role, issued_at=now, expires_at=now + seconds,
                         node_class=ns.node_class, provider_id=ns.provider_id)
        body = encode_cert(cert)
        if ns.install:
            path = Path(ns.data_dir) if ns.data_dir else default_data_dir()
            atomic_write_bytes(path / CERT_FILE, body + b"\n")
            print(f"{path / CERT_FILE}: roles {','.join(cert.roles) or '-'} for {ns.node_id} until {cert.expires_at}")
        elif ns.out:
            atomic_write_bytes(Path(ns.out), body + b"\n")
            print(f"{ns.out}: roles {','.join(cert.roles) or '-'} for {ns.node_id} until {cert.expires_at}")
        else:
            print(body.decode())
    except (OSError, ValueError, TypeError) as exc:
        print(f"p2pnode node certify: {exc}", file=sys.stderr)
        return 2
    return 0
