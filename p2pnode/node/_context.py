"""The narrow interface every subsystem (jobs, sync, the guard driver, HTTP views, metrics) gets instead of the agent.

A subsystem never reaches into :class:`p2pnode.agent.Agent`: it is handed a :class:`NodeContext` and reads this
node's identity and config, the members and their typed snapshot sections through it, asks for a publication with
:meth:`NodeContext.publish_soon` and records events with :meth:`NodeContext.emit_event`. The agent implements it
over its node core; tests implement it with a few lines (see ``tests/helpers.py``).

Pure: typing only, no trio, no sockets.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from ..certs import RoleCheck
from ..gossip import MemberState
from ..snapshot import Snapshot

if TYPE_CHECKING:
    from ..config import Config
    from ..identity import Identity
    from ..resources import ResourceSample

__all__ = ["Member", "NodeContext", "S"]

S = TypeVar("S")


class Member(msgspec.Struct, frozen=True):
    """One member as this node sees it: its newest verified snapshot (typed) and its membership state.

    ``received_at`` is local monotonic seconds; ``key`` the member's Ed25519 public key (32 bytes) from its
    signed envelope; ``state`` is ``ALIVE`` for this node itself. ``addr_refused``: why this node's dial policy
    refuses the address the member advertises (:func:`p2pnode.gossip.addr_refusal`), None when it may be dialed.
    """

    origin: str
    state: MemberState
    snapshot: Snapshot
    key: bytes
    received_at: float
    roles: RoleCheck | None = None
    """Its roles as this node counts them (:class:`p2pnode.certs.RoleCheck`; None: not judged). The tags of
    :attr:`snapshot` are already the effective ones; :func:`p2pnode.certs.certified_class` gives the node class
    and provider id its certificate grants."""
    addr_refused: str | None = None

    @property
    def addr(self) -> str:
        """``host:port`` to dial this member at: its signed snapshot's ``addr``, or '' when unknown or refused by
        the dial policy (``addr_refused``; the advertised one stays in ``snapshot.addr``, for display only)."""
        return "" if self.addr_refused is not None else self.snapshot.addr

    @property
    def leaving(self) -> bool:
        """True when the member announced that it leaves."""
        return self.snapshot.leaving


class NodeContext(Protocol):
    """What a subsystem may know and do. Times: ``now()`` is monotonic seconds (trio's clock in the agent, the
    simulated clock in the simulator); wall-clock time is only for display and file names."""

    @property
    def node_id(self) -> str:
        """This node's id."""
        ...

    @property
    def identity(self) -> Identity:
        """This node's key pair (signs requests and stream headers)."""
        ...

    @property
    def config(self) -> Config:
        """The whole configuration; a subsystem reads its own section."""
        ...

    @property
    def data_dir(self) -> Path:
        """The data dir (absolute)."""
        ...

    @property
    def leaving(self) -> bool:
        """True once this node announced it leaves: subsystems start nothing new."""
        ...

    @property
    def last_sample(self) -> ResourceSample | None:
        """This node's newest resource sample (None before the first)."""
        ...

    @property
    def degradation_level(self) -> int:
        """This node's guard degradation level 0-4 (:mod:`p2pnode.guard`)."""
        ...

    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def members(self, *, live: bool = False) -> list[Member]:
        """Every member whose snapshot this node holds, this node included; ``live``: alive and suspect only."""
        ...

    def member(self, origin: str) -> Member | None:
        """``origin`` as a :class:`Member`, or None when no snapshot of it is held."""
        ...

    def section(self, origin: str, kind: type[S]) -> S | None:
        """The typed section ``kind`` (e.g. :class:`p2pnode.snapshot.SyncSection`) of ``origin``'s newest
        snapshot, or None when this node holds no snapshot of ``origin`` (or that snapshot has no such section)."""
        ...

    def state_of(self, origin: str) -> MemberState | None:
        """``origin``'s membership state (None: unknown)."""
        ...

    def publish_soon(self) -> None:
        """Ask for a new snapshot version soon (within the minimum publish gap): a section changed."""
        ...

    def publish_to(self, *node_ids: str) -> None:
        """Publish now (one snapshot version) and gossip with each of ``node_ids`` at once (news those members wait
        on, e.g. a sync receipt, a plan that gives them work)."""
        ...

    def emit_event(self, name: str, payload: dict[str, Any]) -> None:
        """Record an event (``EVENT_NAMES``): logged, carried in the snapshot, handed to the hooks."""
        ...

    def quarantine(self, origin: str, where: str, exc: Exception) -> None:
        """A member's accepted snapshot broke ``where``: drop it, count it, log once (a decoder-bound bug)."""
        ...

    @property
    def client(self) -> Any:
        """The agent's shared ``httpx.AsyncClient`` (drivers only; cores never touch it)."""
        ...
