"""The provider interface: :class:`Provider`, the nodes it reports (:class:`ProviderNode`), what the agent gives it
(:class:`ProviderContext`), its one error (:class:`ProviderError`) and :func:`load_provider`."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Literal, Protocol, runtime_checkable

import msgspec
from msgspec import Meta

from ..errors import P2PNodeError
from ..identity import SigningKey, node_id_for

if TYPE_CHECKING:
    from ..config import Config, ScalingSettings

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "p2pnode.providers"
"""The group of the Python entry points that name provider plugins (``[project.entry-points."p2pnode.providers"]``)."""
BUILT_IN = ("command", "local")

_TEXT = r"^[^\x00-\x1f\x7f]*\Z"
RequestId = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")]
"""An action's idempotency id (the leader's ``"<term>-<n>-<ms>"``): also a file name, so no ``/`` and no leading dot."""
NodeState = Literal["starting", "running", "stopping", "stopped"]
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_NODE_ID = re.compile(r"[^\x00-\x1f\x7f,]{1,64}")


class ProviderError(P2PNodeError):
    """A provider could not carry out a call (its script failed or hung, its API refused, its output was not what
    the interface says). The message is for the operator (bounded, one line); the caller counts it and tries the
    action again, under the same request id, after its cooldown."""


class ProviderNode(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One node a provider started, as :meth:`Provider.list` reports it (also the JSON objects a ``command_list``
    script prints): the ``request_id`` that started it, its ``node_class``, its p2pnode ``node_id`` (``""`` while
    unknown), its ``state`` and provider ``detail`` (``{"pid": "4242", "address": "127.0.0.1:41000"}``; strings
    only, at most 16 entries)."""

    request_id: Annotated[str, Meta(max_length=64, pattern=_TEXT)]
    node_class: Annotated[str, Meta(max_length=64, pattern=_TEXT)] = ""
    node_id: Annotated[str, Meta(max_length=64, pattern=_TEXT)] = ""
    state: NodeState = "starting"
    detail: Annotated[dict[Annotated[str, Meta(max_length=64, pattern=_TEXT)],
                           Annotated[str, Meta(max_length=256, pattern=_TEXT)]], Meta(max_length=16)] = {}


MAX_LISTED = 4096
"""Nodes one :meth:`Provider.list` answer may hold (a longer ``command_list`` output is a :class:`ProviderError`)."""
ProviderNodes = Annotated[list[ProviderNode], Meta(max_length=MAX_LISTED)]


class ProviderContext(msgspec.Struct, frozen=True, kw_only=True):
    """What the agent hands a provider besides its ``[scaling]`` table: its ``data_dir``; the ``join`` addresses
    new nodes should contact (``host:port``: the agent's own advertised address and its live members'); the
    cluster's ``trust`` mode and, in ``token`` mode, ``keyring_file`` (the agent's ``keyring.json``, mode 0600: a
    provider copies it or hands its path on, never a token on a command line); ``read_token`` (a secret: only ever
    passed in an environment variable; left out of ``repr``); the ``catalog`` path; the ``interpreter`` that runs
    ``python -m p2pnode`` (the agent's own)."""

    data_dir: str
    join: list[str] = []
    trust: str = "open"
    keyring_file: str = ""
    read_token: str = ""
    catalog: str = ""
    interpreter: str = sys.executable

    def __repr__(self) -> str:
        return (f"ProviderContext(data_dir={self.data_dir!r}, join={self.join!r}, trust={self.trust!r}, "
                f"keyring_file={self.keyring_file!r}, read_token={'<set>' if self.read_token else ''!r}, "
                f"catalog={self.catalog!r}, interpreter={self.interpreter!r})")

    @classmethod
    def of(cls, config: Config, join: list[str]) -> ProviderContext:
        """The context of an agent running with ``config`` whose advertised and members' addresses are ``join``."""
        from ..keyring import KEYRING_FILE

        a = config.agent
        keyring = a.data_dir / KEYRING_FILE
        return cls(data_dir=str(a.data_dir), join=list(join), trust=a.trust,
                   keyring_file=str(keyring) if a.trust == "token" else "", read_token=a.read_token,
                   catalog=a.catalog)


@runtime_checkable
class Provider(Protocol):
    """A way to add and remove machines. Every method blocks (the leader calls it in a worker thread under its
    own deadline) and raises :class:`ProviderError` for anything the operator must hear about.

    **Idempotency** (the contract that makes failover safe): the leader records an action with its id
    (``request_id``) in its replicated ledger *before* it calls the provider, so a new leader may re-issue an
    action its predecessor did or did not carry out. A provider given a ``request_id`` it has already carried out
    does nothing a second time and returns what that request made; one it carried out in part completes it.
    ``list()`` is how a leader learns what was carried out."""

    name: str

    def scale_up(self, node_class: str, count: int, request_id: str) -> list[ProviderNode]:
        """Start ``count`` nodes of ``node_class`` under ``request_id``; returns the nodes of that request."""
        ...

    def scale_down(self, node_ids: list[str], request_id: str) -> list[ProviderNode]:
        """Stop the nodes ``node_ids`` (p2pnode node ids; they leave the cluster) under ``request_id``; returns
        those it knows, in their new state. Ids it never started are ignored."""
        ...

    def list(self) -> list[ProviderNode]:
        """Every node this provider started that it still knows of, stopped ones included."""
        ...


ProviderFactory = Callable[["ScalingSettings", ProviderContext], Provider]


def check_request_id(request_id: str) -> str:
    """``request_id`` when it is a valid id (:data:`RequestId`), else :class:`ProviderError`."""
    if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
        raise ProviderError(f"request id {str(request_id)[:80]!r} is not 1-64 of A-Z a-z 0-9 _ . : - "
                            "(first a letter or digit)")
    return request_id


def check_node_ids(node_ids: list[str]) -> list[str]:
    """``node_ids`` when every one is 1-64 characters without a control character or comma, at most 1000."""
    if len(node_ids) > 1000 or not all(isinstance(n, str) and _NODE_ID.fullmatch(n) for n in node_ids):
        raise ProviderError("node ids must be at most 1000, each 1-64 characters without control characters or commas")
    return list(node_ids)


def new_node_key() -> tuple[bytes, str]:
    """A fresh Ed25519 seed (32 bytes, the content of ``<data_dir>/node.key``, mode 0600) and the node id it
    gives: a provider that writes it into a new node's data dir knows the node's id before the node starts."""
    key = SigningKey.generate()
    return key.seed, node_id_for(key.public_key)
