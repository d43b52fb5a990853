"""Trio drivers of one node: they move bytes, wait and spawn; the decisions are the cores'.

:class:`GossipDriver` (exchanges, inbound admission, leave, mDNS), :class:`GuardDriver` (assessment loop,
events, hooks, disk manager), :class:`Trust` (keyring and signed operator requests).
"""

from ._gossip import GossipDriver, hostport
from ._guard import RECENT_EVENTS_IN_SNAPSHOT, GuardDriver
from ._trust import Trust

__all__ = ["RECENT_EVENTS_IN_SNAPSHOT", "GossipDriver", "GuardDriver", "Trust", "hostport"]
