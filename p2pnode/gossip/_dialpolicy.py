"""Which advertised addresses this node may dial: the policy every dial of a member's address goes through. Pure.

A member's ``addr`` (and its sync ``data_port``) is its own claim, signed by its key but not otherwise checked:
a fake member, or a real one that lies, could advertise ``127.0.0.1:22``, ``169.254.169.254:80`` (a cloud
metadata service), ``metadata.google.internal:80`` or a name that resolves there later (DNS rebinding), and make
every node send ``POST /gossip``, ``POST /sync/push`` (an ephemeral node's files) or signed reads there. So an
address a node learned from a member (a snapshot's ``addr``, an mDNS announcement, a peers-file entry the agent
wrote from those) is dialed only when :func:`addr_refusal` finds nothing wrong with it:

* ``malformed`` -- not ``host:port`` / ``[v6]:port``; ``port`` -- port 0 or out of 1-65535;
* ``name`` -- a DNS name, not an IP literal (what it resolves to is not ours to check at dial time);
* ``metadata`` -- a cloud metadata or host-agent address (:data:`METADATA_ADDRESSES`);
* ``unspecified`` -- ``0.0.0.0/8`` or ``::`` (Linux connects those to this host);
* ``loopback`` -- ``127.0.0.0/8``, ``::1`` (allowed with ``[agent] allow_private_advertise``);
* ``link_local`` -- ``169.254.0.0/16``, ``fe80::/10``; ``multicast``; ``reserved`` -- ``240.0.0.0/4``, the
  broadcast address and the IETF-reserved IPv6 ranges (``64:ff9b::/96`` NAT64 and ``::/96`` among them).

An IPv4 address written as IPv6 (``::ffff:127.0.0.1``, and the IPv4 part of a ``2002::/16`` 6to4 address) is
judged as that IPv4 address. Private ranges (RFC 1918, ``fc00::/7``, ``100.64.0.0/10``) are allowed: clusters live
on them (Tailscale, VPCs, lab LANs). Names stay refused even with ``allow_private_advertise``; operator-given
addresses (``--join``, a peers file the operator wrote) are never judged here: the operator is trusted.

A member whose address is refused stays a member (its snapshots are accepted and spread) but is never dialed;
``/status`` shows the reason (``addr_refused``) and ``/metrics`` counts each refused address once per reason
(``p2pnode_addr_refused_total{reason}``, via :class:`DialPolicy`).
"""

from __future__ import annotations

import ipaddress

from ..inputs import decimal

__all__ = ["METADATA_ADDRESSES", "REFUSAL_REASONS", "DialPolicy", "addr_refusal"]

METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle, Hetzner... instance metadata
    "169.254.170.2",  # AWS ECS task metadata and credentials
    "169.254.170.23",  # AWS EKS pod identity agent
    "169.254.0.23",  # Tencent Cloud metadata
    "100.100.100.200",  # Alibaba Cloud metadata
    "168.63.129.16",  # Azure WireServer (host agent; a public address)
    "192.0.0.192",  # Oracle Cloud Classic metadata
    "fd00:ec2::254",  # AWS metadata over IPv6
    "fd00:ec2::23",  # AWS EKS pod identity agent over IPv6
    "fd20:ce::254",  # GCP metadata over IPv6
))
"""Cloud metadata and host-agent addresses, refused whatever ``allow_private_advertise`` says (source: each
provider's instance-metadata documentation)."""

REFUSAL_REASONS = ("malformed", "port", "name", "metadata", "unspecified", "loopback", "link_local", "multicast",
                   "reserved")
"""Every reason :func:`addr_refusal` gives, in the order it checks them."""

_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_MAX_REMEMBERED = 4096


def _split(addr: str) -> tuple[str, str] | None:
    """``(host, port text)`` of ``host:port`` or ``[v6]:port``; None when malformed."""
    if addr.startswith("["):
        host, sep, rest = addr[1:].partition("]")
        return (host, rest[1:]) if sep and rest.startswith(":") else None
    host, sep, port = addr.rpartition(":")
    return (host, port) if sep and host and ":" not in host else None


def _ip_refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_private: bool) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is not None:
            return _ip_refusal(embedded, allow_private)
    if ip in METADATA_ADDRESSES:
        return "metadata"
    if ip.is_unspecified or (isinstance(ip, ipaddress.IPv4Address) and ip in _THIS_NETWORK):
        return "unspecified"
    if ip.is_loopback:
        return None if allow_private else "loopback"
    if ip.is_link_local:
        return "link_local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    return None


def addr_refusal(addr: str, *, allow_private: bool) -> str | None:
    """Why a member's advertised ``addr`` (``host:port`` or ``[v6]:port``) must not be dialed, as one of
    :data:`REFUSAL_REASONS`; None when it may be. ``allow_private``: ``[agent] allow_private_advertise`` (loopback
    allowed too). The rules and their sources: see the module docstring."""
    parts = _split(addr)
    if parts is None:
        return "malformed"
    host, port_s = parts
    port = decimal(port_s, max_digits=5)
    if port is None or not 0 < port < 65536:
        return "port"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "malformed" if addr.startswith("[") else "name"
    if isinstance(ip, ipaddress.IPv6Address) and (ip.scope_id or not addr.startswith("[")):
        return "malformed"  # a zone id (fe80::1%eth0) names one of our interfaces; IPv6 must be bracketed
    return _ip_refusal(ip, allow_private)


class DialPolicy:
    """:func:`addr_refusal` with counts: ``refused[reason]`` is how many distinct addresses were refused for each
    reason (an address judged again is not counted again while remembered: up to 4,096 refused addresses, then
    the memory starts over). One per node, shared by the peer book and every driver that dials a member."""

    def __init__(self, *, allow_private: bool = False) -> None:
        self.allow_private = allow_private
        self.refused: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        self._seen: dict[str, str | None] = {}

    def refusal(self, addr: str) -> str | None:
        """Why ``addr`` (a member's claim) must not be dialed, or None; a new refused address is counted."""
        if addr in self._seen:
            return self._seen[addr]
        reason = addr_refusal(addr, allow_private=self.allow_private)
        if len(self._seen) >= _MAX_REMEMBERED:
            self._seen.clear()
        self._seen[addr] = reason
        if reason is not None:
            self.refused[reason] += 1
        return reason

    def dialable(self, addr: str) -> str:
        """``addr`` when it may be dialed, else "" (what callers already read as "no address")."""
        return addr if addr and self.refusal(addr) is None else ""
