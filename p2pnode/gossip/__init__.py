"""Pure gossip cores: :class:`ClusterState` (anti-entropy over signed snapshots) and :class:`PeerBook`."""

from ._protocol import GossipReply, Gossiper
from ._peers import PeerAddr, PeerBook, parse_hostport
from ._state import ClusterState, MemberEntry, MergeResult

__all__ = ["ClusterState", "GossipReply", "Gossiper", "MemberEntry", "MergeResult", "PeerAddr", "PeerBook", "parse_hostport"]
