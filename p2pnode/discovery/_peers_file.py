"""The peers file: ``<data_dir>/peers.json`` remembers peers that answered, so a restarted node finds its
cluster again without mDNS or ``--join``.

Format: ``{"format": 1, "peers": [{"addr": "host:port", "node_id": "..."}]}``, newest contact first, at most
:data:`MAX_PEERS` entries. A missing file is an empty list; an unreadable or malformed one is logged and
ignored (a bad peers file must never keep the agent from starting).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .._files import atomic_write_bytes

__all__ = ["MAX_PEERS", "PEERS_FILE", "load_peers", "save_peers"]

log = logging.getLogger(__name__)

PEERS_FILE = "peers.json"
MAX_PEERS = 256


def load_peers(data_dir: Path) -> list[tuple[str, str | None]]:
    """``[(addr, node_id or None)]`` from the peers file; ``[]`` when missing or unusable."""
    path = Path(data_dir) / PEERS_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable peers file %s: %s", path, exc)
        return []
    out: list[tuple[str, str | None]] = []
    peers = doc.get("peers") if isinstance(doc, dict) else None
    if not isinstance(peers, list):
        log.warning("ignoring malformed peers file %s", path)
        return []
    for p in peers[:MAX_PEERS]:
        if isinstance(p, dict) and isinstance(p.get("addr"), str) and len(p["addr"]) <= 256:
            nid = p.get("node_id")
            out.append((p["addr"], nid if isinstance(nid, str) and len(nid) <= 64 else None))
    return out


def save_peers(data_dir: Path, peers: list[tuple[str, str | None]]) -> None:
    """Atomically write ``peers`` (newest first; truncated to :data:`MAX_PEERS`). Raises ``OSError``."""
    doc = {"format": 1, "peers": [{"addr": a, "node_id": n} for a, n in peers[:MAX_PEERS]]}
    atomic_write_bytes(Path(data_dir) / PEERS_FILE, (json.dumps(doc, indent=1) + "\n").encode())
