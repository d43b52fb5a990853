"""PeerBook: every address this node may gossip with, where it came from, and retry backoff. Pure.

Addresses come from the operator (``--join``, the peers file) and from signed snapshots learned by gossip (a
member's advertised ``addr``); never from what an unauthenticated message states. An address learned from a member
(gossip, mDNS, a peers-file entry the agent wrote from those: ``learned``) enters the book only when the node's
:class:`~p2pnode.gossip.DialPolicy` allows it (:mod:`p2pnode.gossip._dialpolicy`: no names, loopback, metadata
addresses...); operator-given ones are taken as they are. mDNS finds (anyone on the LAN
can announce anything) are **candidates**: a small separate list (``max_candidates``, admissions rate-limited
to a token bucket of ``candidate_burst`` refilled at ``candidate_rate_per_s``) that can never crowd out known
addresses; :meth:`PeerBook.choose` adds at most one due candidate per round, and a candidate that turns out to
be a member is learned from that member's signed snapshot like any other. Each address may be tied to a node id
once a reply or a snapshot names it. :meth:`PeerBook.choose` picks ``fanout`` random targets among addresses
that are due, one address per node, never this node and never a node that announced it is leaving. A failed
contact backs off exponentially (``base_backoff_s`` doubling to ``max_backoff_s``), so dead join addresses cost
little.
"""

from __future__ import annotations

import random
import re

import msgspec

from ..inputs import decimal
from ..snapshot import ADDR_PATTERN
from ._dialpolicy import DialPolicy

_DIALABLE = re.compile(ADDR_PATTERN)


def dialable(addr: str) -> bool:
    """Whether ``addr`` is a non-empty ``host:port`` peers may dial (:data:`p2pnode.snapshot.ADDR_PATTERN`:
    ASCII DNS name, IPv4 or bracketed IPv6, port 1-65535). A name the IDNA codec refuses never reaches a URL."""
    return bool(addr) and _DIALABLE.match(addr) is not None

__all__ = ["OPERATOR_SOURCES", "PeerAddr", "PeerBook", "dialable", "parse_hostport"]

OPERATOR_SOURCES = frozenset({"join", "peers-file"})
"""Sources whose addresses the operator gave (never judged by the dial policy unless marked ``learned``)."""


def parse_hostport(addr: str, default_port: int | None = None) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> ``(host, port)``. Raises ``ValueError`` on a malformed address (also
    a host that is not an ASCII DNS name with 1-63 character labels or an IP address: see :func:`dialable`)."""
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
    port = decimal(port_s, max_digits=5)
    if port is None:
        raise ValueError(f"address {addr!r}: port is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"address {addr!r}: port out of range")
    if not dialable(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"):
        raise ValueError(f"address {addr!r}: the host is not an ASCII DNS name or an IP address")
    return host, port


class PeerAddr(msgspec.Struct):
    """One address. ``source`` is ``join``, ``peers-file`` or ``gossip`` (known), or ``mdns`` (a candidate);
    times are monotonic seconds."""

    addr: str
    source: str
    node_id: str | None = None
    failures: int = 0
    next_attempt_at: float = 0.0
    last_ok_at: float | None = None
    left: bool = False
    answered_as: str | None = None
    """The member that answered from this address: the sender of our last successful exchange with it, whose
    signed snapshot we held (set by :meth:`PeerBook.report` only). Unlike ``node_id``, which a signed snapshot
    advertising the address may set, no claim made to us re-labels it: it is what ties an operator-given address
    to a member (a new node adopts the voter roll of those members)."""
    learned: bool = False
    """True when the address came from a member's claim (a snapshot, mDNS, or a peers-file entry the agent wrote
    from one), not from the operator: it passed the dial policy and is written back to the peers file as learned."""


class PeerBook:
    """Addresses to gossip with (see module docstring). ``self_addrs`` are never chosen. ``policy`` judges learned
    addresses (the agent passes its own; None, for unit tests of the book alone: none judged)."""

    def __init__(
        self, self_id: str, *, base_backoff_s: float = 1.0, max_backoff_s: float = 30.0, max_addrs: int = 4096,
        max_candidates: int = 64, candidate_burst: float = 64.0, candidate_rate_per_s: float = 1.0,
        max_candidate_failures: int = 5, policy: DialPolicy | None = None,
    ) -> None:
        self.self_id = self_id
        self.policy = policy
        self.first_contacts = 0
        """Known addresses that answered for the first time, counted (a driver saves the peers file when it grows)."""
        self.max_addrs = max_addrs
        self.dropped = 0
        self.max_candidates = max_candidates
        self.candidate_burst = candidate_burst
        self.candidate_rate_per_s = candidate_rate_per_s
        self.max_candidate_failures = max_candidate_failures
        self.candidates_dropped = 0
        self.invalid = 0  # addresses refused as not dialable (see dialable())
        self._tokens = candidate_burst
        self._tokens_at: float | None = None
        self._candidates: dict[str, PeerAddr] = {}
        self.self_addrs: set[str] = set()
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self._peers: dict[str, PeerAddr] = {}
        self._preferred: dict[str, str] = {}  # node id -> the address it advertises

    def __len__(self) -> int:
        return len(self._peers)

    def get(self, addr: str) -> PeerAddr | None:
        """The known address ``addr`` (``host:port``), or ``None``."""
        return self._peers.get(addr)

    def all(self) -> list[PeerAddr]:
        """Every known address (candidates excluded), sorted by ``addr``."""
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
        self, addr: str, source: str, *, node_id: str | None = None, advertised: bool = False,
        learned: bool | None = None,
    ) -> PeerAddr | None:
        """Record ``addr`` (idempotent). ``advertised`` marks it as the address ``node_id`` states itself,
        which :meth:`choose` prefers over other addresses of the same node. ``learned`` (default: ``source`` is not
        one of :data:`OPERATOR_SOURCES`): a member's claim, refused (``None`` returned, counted by the policy) when
        the dial policy refuses it. The book holds at most ``max_addrs`` addresses; when full, an address that
        never answered is forgotten to make room, and if there is none the new address is dropped (counted in
        ``dropped``) and ``None`` returned."""
        p = self._peers.get(addr)
        if p is None:
            if not dialable(addr):
                self.invalid += 1
                return None
            learned = source not in OPERATOR_SOURCES if learned is None else learned
            if learned and self.policy is not None and self.policy.refusal(addr) is not None:
                return None
            self._candidates.pop(addr, None)  # promoted: now known from the operator or a signed snapshot
            if len(self._peers) >= self.max_addrs and not self._evict_one():
                self.dropped += 1
                return None
            p = self._peers[addr] = PeerAddr(addr, source, learned=learned)
        if node_id is not None and (p.answered_as is None or p.answered_as == node_id):
            # an address that answered as one member is never re-labelled by another member's claim to it
            p.node_id = node_id
            if advertised:
                self._preferred[node_id] = addr
        return p

    def add_candidate(self, addr: str, source: str, now: float, *, node_id: str | None = None) -> PeerAddr | None:
        """Record an unverified address (mDNS): kept apart from known addresses, at most ``max_candidates`` of
        them (the one with most failures is evicted), new ones admitted at most at the token-bucket rate.
        Returns the entry, or ``None`` when it was dropped (counted in ``candidates_dropped``). ``node_id`` is
        only a hint here; it never ties the address to that node."""
        if addr in self._peers or addr in self.self_addrs:
            return self._peers.get(addr)
        if not dialable(addr):
            self.invalid += 1
            return None
        if self.policy is not None and self.policy.refusal(addr) is not None:
            return None
        p = self._candidates.get(addr)
        if p is not None:
            return p
        if self._tokens_at is not None:
            self._tokens = min(self.candidate_burst, self._tokens + (now - self._tokens_at) * self.candidate_rate_per_s)
        self._tokens_at = now
        if self._tokens < 1.0:
            self.candidates_dropped += 1
            return None
        if len(self._candidates) >= self.max_candidates:
            victim = max(self._candidates.values(), key=lambda c: (c.failures, -c.next_attempt_at))
            del self._candidates[victim.addr]
            self.candidates_dropped += 1
        self._tokens -= 1.0
        p = self._candidates[addr] = PeerAddr(addr, source, learned=True)
        return p

    def candidates(self) -> list[PeerAddr]:
        """The unconfirmed candidate addresses (from mDNS and the like), sorted by ``addr``."""
        return sorted(self._candidates.values(), key=lambda p: p.addr)

    def mark_left(self, node_id: str, left: bool = True) -> None:
        """A node announced a clean shutdown (``left``) or came back (``left=False``)."""
        for p in self._peers.values():
            if p.node_id == node_id:
                p.left = left

    def report(self, addr: str, ok: bool, now: float, *, node_id: str | None = None) -> None:
        """Record the outcome of a contact with ``addr`` at ``now``; a failure schedules the next try."""
        p = self._peers.get(addr)
        if p is None:
            c = self._candidates.get(addr)
            if c is not None:
                self._report(c, ok, now)
                if c.failures >= self.max_candidate_failures:
                    del self._candidates[addr]
            return
        if node_id is not None:
            p.node_id = node_id
            if ok:
                p.answered_as = node_id
        if ok and p.last_ok_at is None:
            self.first_contacts += 1
        self._report(p, ok, now)

    def _report(self, p: PeerAddr, ok: bool, now: float) -> None:
        if ok:
            p.failures = 0
            p.next_attempt_at = now
            p.last_ok_at = now
        else:
            p.failures += 1
            p.next_attempt_at = now + min(self.max_backoff_s, self.base_backoff_s * 2 ** (p.failures - 1))

    def choose(self, fanout: int, now: float, rng: random.Random) -> list[str]:
        """Up to ``fanout`` distinct, due known addresses picked uniformly at random, one per node, plus at most
        one due candidate."""
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
        out = rng.sample(candidates, min(fanout, len(candidates)))
        due = sorted(c.addr for c in self._candidates.values()
                     if c.next_attempt_at <= now and c.addr not in self.self_addrs)
        if due:
            out.append(rng.choice(due))  # one unverified candidate per round, never in place of a known peer
        return out

    def known_good(self) -> list[PeerAddr]:
        """Addresses that answered at least once (what the peers file keeps), newest contact first."""
        return sorted((p for p in self._peers.values() if p.last_ok_at is not None), key=lambda p: -(p.last_ok_at or 0))
