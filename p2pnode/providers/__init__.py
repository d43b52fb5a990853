"""Provider plugins: how the leader's scaling decisions add and remove machines (docs/capacity.md, "Providers").

The leader's scaling core (:mod:`p2pnode.scheduler._scaling`) decides; its driver calls a :class:`Provider` in a
worker thread. Built in: ``command`` (the operator's programs, Slurm's ``ResumeProgram``/``SuspendProgram``) and
``local`` (extra agents on this machine, for tests and ``p2pnode demo``); any other provider is a Python entry
point in group ``p2pnode.providers`` whose object is a factory ``(ScalingSettings, ProviderContext) ->
Provider``, chosen by ``[scaling] provider``.

Errors::

    P2PNodeError
    ├── ConfigError      load_provider: no provider of that name (the message lists those installed), or a
    │                    plugin that failed to load
    └── ProviderError    a provider call failed (script failed or hung, bad output, API refused); retried by the
                         caller after its cooldown under the same request id

Every call is idempotent by ``request_id`` (see :class:`Provider`).
"""

from ._base import (
    ENTRY_POINT_GROUP,
    MAX_LISTED,
    Provider,
    ProviderContext,
    ProviderError,
    ProviderNode,
    new_node_key,
)
from ._command import CommandProvider
from ._load import load_provider
from ._local import LocalProvider, LocalRecord

__all__ = [
    "ENTRY_POINT_GROUP",
    "MAX_LISTED",
    "CommandProvider",
    "LocalProvider",
    "LocalRecord",
    "Provider",
    "ProviderContext",
    "ProviderError",
    "ProviderNode",
    "load_provider",
    "new_node_key",
]
