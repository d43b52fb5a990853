"""PeerBook: every address this node may gossip with, where it came from, and retry backoff. Pure.

Addresses come from ``--join``, mDNS, the peers file, and snapshots learned by gossip (a member's advertised
``addr``, or the ``addr`` a gossip sender states). Each address may be tied to a node id once a reply or a
snapshot names it. :meth:`PeerBook.choose` picks ``fanout`` random targets among addresses that are due,
one address per node, never this node and never a node that announced it is leaving. A failed contact backs
off exponentially (``base_backoff_s`` doubling to ``max_backoff_s``), so dead join addresses cost little.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["PeerAddr", "PeerBook", "parse_hostport"]


def parse_hostport(addr: str, default_port: int | None = None) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> ``(host, port)``. Raises ``ValueError`` on a malformed address."""
    addr = addr.strip()
    if addr.startswith("["):
        host, _, rest = addr[1:].partition("]")
        port_s = rest[1:] if rest.startswith(":") else ""
    elif addr.count(":") == 1:
        host, _, port_s = addr.partition(":")
    elif ":" not in addr:
        host, port_s = addr, ""
    else:
        raise ValueError(f"address {addr!r}: write IPv6 addresses as [addr]:port")
    if not host:
        raise ValueError(f"address {addr!r} has no host")
    if not port_s:
        if default_port is None:
            raise ValueError(f"address {addr!r} has no port")
        return host, default_port
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"address {addr!r}: port is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"address {addr!r}: port out of range")
    return host, port


@dataclass(slots=True)
class PeerAddr:
    """One address. ``source`` is ``join``, ``mdns``, ``peers-file`` or ``gossip``; times are monotonic seconds."""

    addr: str
    source: str
    node_id: str | None = None
    failures: int = 0
    next_attempt_at: float = 0.0
    last_ok_at: float | None = None
    left: bool = False


class PeerBook:
    """Addresses to gossip with (see module docstring). ``self_addrs`` are never chosen."""

    def __init__(
        self, self_id: str, *, base_backoff_s: float = 1.0, max_backoff_s: float = 30.0, max_addrs: int = 4096
    ) -> None:
        self.self_id = self_id
        self.max_addrs = max_addrs
        self.dropped = 0
        self.self_addrs: set[str] = set()
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self._peers: dict[str, PeerAddr] = {}
        self._preferred: dict[str, str] = {}  # node id -> the address it advertises

    def __len__(self) -> int:
        return len(self._peers)

    def get(self, addr: str) -> PeerAddr | None:
        return self._peers.get(addr)

    def all(self) -> list[PeerAddr]:
        return sorted(self._peers.values(), key=lambda p: p.addr)

    def _evict_one(self) -> bool:
        """Make room by forgetting the anonymous address with the most failures (never one that answered)."""
        victims = [p for p in self._peers.values() if p.last_ok_at is None and p.source != "join"]
        if not victims:
            return False
        victim = max(victims, key=lambda p: (p.node_id is None, p.failures))
        del self._peers[victim.addr]
        return True

    def add(
        self, addr: str, source: str, *, node_id: str | None = None, advertised: bool = False
    ) -> PeerAddr | None:
        """Record ``addr`` (idempotent). ``advertised`` marks it as the address ``node_id`` states itself,
        which :meth:`choose` prefers over other addresses of the same node. The book holds at most
        ``max_addrs`` addresses; when full, an address that never answered is forgotten to make room, and if
        there is none the new address is dropped (counted in ``dropped``) and ``None`` returned."""
        p = self._peers.get(addr)
        if p is None:
            if len(self._peers) >= self.max_addrs and not self._evict_one():
                self.dropped += 1
                return None
            p = self._peers[addr] = PeerAddr(addr, source)
        if node_id is not None:
            p.node_id = node_id
            if advertised:
                self._preferred[node_id] = addr
        return p

    def mark_left(self, node_id: str, left: bool = True) -> None:
        """A node announced a clean shutdown (``left``) or came back (``left=False``)."""
        for p in self._peers.values():
            if p.node_id == node_id:
                p.left = left

    def report(self, addr: str, ok: bool, now: float, *, node_id: str | None = None) -> None:
        """Record the outcome of a contact with ``addr`` at ``now``; a failure schedules the next try."""
        p = self._peers.get(addr)
        if p is None:
            return
        if node_id is not None:
            p.node_id = node_id
        if ok:
            p.failures = 0
            p.next_attempt_at = now
            p.last_ok_at = now
        else:
            p.failures += 1
            p.next_attempt_at = now + min(self.max_backoff_s, self.base_backoff_s * 2 ** (p.failures - 1))

    def choose(self, fanout: int, now: float, rng: random.Random) -> list[str]:
        """Up to ``fanout`` distinct, due addresses picked uniformly at random, one per node."""
        per_node: dict[str, str] = {}
        anonymous: list[str] = []
        for p in self._peers.values():
            if p.addr in self.self_addrs or p.node_id == self.self_id or p.left or p.next_attempt_at > now:
                continue
            if p.node_id is None:
                anonymous.append(p.addr)
            elif self._preferred.get(p.node_id) == p.addr or p.node_id not in per_node:
                per_node[p.node_id] = p.addr
        candidates = sorted(per_node.values()) + sorted(anonymous)
        return rng.sample(candidates, min(fanout, len(candidates)))

    def known_good(self) -> list[PeerAddr]:
        """Addresses that answered at least once (what the peers file keeps), newest contact first."""
        return sorted((p for p in self._peers.values() if p.last_ok_at is not None), key=lambda p: -(p.last_ok_at or 0))
