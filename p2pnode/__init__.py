"""p2pnode: the node agent for heterogeneous GPU fleets with no central coordinator.

Public surface: the exception tree in :mod:`p2pnode.errors`, configuration in :mod:`p2pnode.config`, and the
pure cores in :mod:`p2pnode.gossip`, :mod:`p2pnode.wire` and :mod:`p2pnode.resources`.
"""

from .errors import ConfigError, IdentityError, P2PNodeError, PeerError, RejectedMessage, RejectReason

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "IdentityError", "P2PNodeError", "PeerError", "RejectReason", "RejectedMessage", "__version__",
]
