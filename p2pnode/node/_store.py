"""Where the node core's durable counters and decisions live: the :class:`CoreStore` protocol (snapshot version,
incarnation, vote, voter roll) and :class:`MemoryStore`, its in-memory form (simulator, tests). The agent's file-backed
store is :mod:`p2pnode.node._persist`."""

from __future__ import annotations

from typing import Protocol

from ..election import Vote, VoterRoll

__all__ = ["CoreStore", "MemoryStore"]


class CoreStore(Protocol):
    """Where the core's durable counters and decisions live (files in the agent, memory in the simulator)."""

    def next_version(self) -> int:
        """A snapshot version above every version this node ever published."""
        ...

    def advance_version_past(self, value: int) -> None:
        """Make every later version greater than ``value``."""
        ...

    def incarnation_past(self, value: int) -> int:
        """Persist and return an incarnation above ``value`` (a refutation)."""
        ...

    def save_vote(self, vote: Vote) -> None:
        """Persist this node's vote before it is published (one vote per term across restarts)."""
        ...

    def save_roll(self, roll: VoterRoll) -> None:
        """Persist the voter roll."""
        ...


class MemoryStore:
    """A :class:`CoreStore` in memory (simulator, tests)."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.incarnation = 0
        self.vote: Vote | None = None
        self.roll: dict[str, object] | None = None

    def next_version(self) -> int:
        """See :meth:`CoreStore.next_version`."""
        self.version += 1
        return self.version

    def advance_version_past(self, value: int) -> None:
        """See :meth:`CoreStore.advance_version_past`."""
        self.version = max(self.version, value)

    def incarnation_past(self, value: int) -> int:
        """See :meth:`CoreStore.incarnation_past`."""
        self.incarnation = max(self.incarnation, value) + 1
        return self.incarnation

    def save_vote(self, vote: Vote) -> None:
        """See :meth:`CoreStore.save_vote`."""
        self.vote = vote

    def save_roll(self, roll: VoterRoll) -> None:
        """See :meth:`CoreStore.save_roll`."""
        self.roll = roll.to_wire()
