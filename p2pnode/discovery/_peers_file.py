"""The peers file: ``<data_dir>/peers.json`` remembers peers that answered, so a restarted node finds its
cluster again without mDNS or ``--join``.

Format: ``{"format": 1, "peers": [{"addr": "host:port", "node_id": "...", "learned": true}]}``, newest contact
first, at most :data:`MAX_PEERS` entries. ``learned`` (absent: false) marks an address the agent learned from a
member (a snapshot's ``addr``, mDNS) rather than from the operator: on read-back it is judged by the dial policy
like any advertised address (:mod:`p2pnode.gossip._dialpolicy`); entries without it (``--join`` addresses the
agent remembered, or a file the operator wrote) are the operator's word. A missing file is an empty list. Decoded
by the state-file rule (:mod:`p2pnode.statefiles`): an entry whose ``addr`` is not a dialable ``host:port``
(:data:`p2pnode.snapshot.ADDR_PATTERN`) or whose ``node_id`` is not a node id is dropped, logged and counted
(``peers.json``: ``bad_entry``), a file that is not JSON is ignored (``malformed``): a bad peers file never keeps
the agent from starting. The writer keeps only entries the reader accepts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import msgspec

from .._files import atomic_write_bytes
from ..snapshot import Addr, NodeId
from ..statefiles import decode_entries, decode_entry, read_json_file, report_for

__all__ = ["MAX_PEERS", "PEERS_FILE", "load_peer_entries", "load_peers", "save_peers"]

log = logging.getLogger(__name__)

PEERS_FILE = "peers.json"
MAX_PEERS = 256


class _Peer(msgspec.Struct, forbid_unknown_fields=False):
    addr: Addr
    node_id: NodeId | None = None
    learned: bool = False


def load_peers(data_dir: Path) -> list[tuple[str, str | None]]:
    """``[(addr, node_id or None)]`` from the peers file; ``[]`` when missing or unusable (see module
    docstring: bad entries are dropped and counted in the data dir's report)."""
    return [(a, n) for a, n, _ in load_peer_entries(data_dir)]


def load_peer_entries(data_dir: Path) -> list[tuple[str, str | None, bool]]:
    """``[(addr, node_id or None, learned)]`` from the peers file, as :func:`load_peers` reads it."""
    report = report_for(Path(data_dir))
    doc = read_json_file(Path(data_dir) / PEERS_FILE, file=PEERS_FILE, report=report)
    if doc is None:
        return []
    if not isinstance(doc, dict):
        report.drop(PEERS_FILE, "malformed", f"expected an object, found {type(doc).__name__}: ignored")
        return []
    peers = decode_entries(doc.get("peers"), _Peer, file=PEERS_FILE, report=report, limit=MAX_PEERS)
    return [(p.addr, p.node_id, p.learned) for p in peers if p.addr]


def save_peers(data_dir: Path, peers: list[tuple[str, str | None]], learned: frozenset[str] = frozenset()) -> None:
    """Atomically write ``peers`` (newest first; truncated to :data:`MAX_PEERS`; an entry :func:`load_peers`
    would drop is left out); the addresses in ``learned`` are marked ``"learned": true``. Raises ``OSError``."""
    keep = []
    for a, n in peers:
        try:
            decode_entry({"addr": a, "node_id": n}, _Peer)
        except ValueError:
            continue
        if a:
            keep.append({"addr": a, "node_id": n, **({"learned": True} if a in learned else {})})
    doc = {"format": 1, "peers": keep[:MAX_PEERS]}
    atomic_write_bytes(Path(data_dir) / PEERS_FILE, (json.dumps(doc, indent=1) + "\n").encode())
