"""Finding peers: mDNS on the LAN, ``--join`` addresses, and the peers file of a former run."""

from ._mdns import SERVICE_TYPE, MdnsDiscovery
from ._peers_file import MAX_PEERS, PEERS_FILE, load_peers, save_peers

__all__ = ["MAX_PEERS", "PEERS_FILE", "SERVICE_TYPE", "MdnsDiscovery", "load_peers", "save_peers"]
