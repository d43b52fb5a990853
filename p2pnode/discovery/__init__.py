"""Finding peers: mDNS on the LAN, ``--join`` addresses, and the peers file of a former run.

The mDNS half (zeroconf, asyncio, ifaddr: ~3 MiB) loads on first use (PEP 562), so an agent with mDNS off
never imports it.
"""

from typing import Any

from ._peers_file import MAX_PEERS, PEERS_FILE, load_peer_entries, load_peers, save_peers

__all__ = ["MAX_PEERS", "PEERS_FILE", "SERVICE_TYPE", "MdnsDiscovery", "load_peer_entries", "load_peers", "save_peers"]

_LAZY = {"MdnsDiscovery", "SERVICE_TYPE"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import _mdns

        return getattr(_mdns, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
