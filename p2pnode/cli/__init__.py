"""Command line: ``p2pnode agent | status | jobs | sync | node | guard | ...``, one module per command family.

* :mod:`._parser`: :func:`build_parser`, assembled from each family's parsers, and ``completion``;
* :mod:`._agent`: ``agent`` (runs :class:`p2pnode.agent.Agent`, which only this package imports) and the one-line
  startup errors; :mod:`._options`: the agent's options and the config they select (also for ``config`` and
  ``guard cleanup``);
* :mod:`._status`, :mod:`._jobs`, :mod:`._sync`, :mod:`._node`, :mod:`._signals`: views of and requests to a
  running agent, through :mod:`._client` (signed requests, reads with the reason they failed) and
  :mod:`._screen` (ages, sizes, ``--watch``);
* :mod:`._guard`, :mod:`._keys`, :mod:`._config` (``config``, ``catalog``), :mod:`._simulate` (``simulate``,
  ``demo``): commands that need no running agent.

Config precedence for the agent: flags > ``P2PNODE_*`` environment > TOML file (``--config`` or
``$P2PNODE_CONFIG``, else ``--config-if-exists`` when that file exists) > embedded defaults.
"""

from __future__ import annotations

import sys

# httpx imports its own command line (httpx._main: click, rich, pygments; ~5 MiB in every agent) whenever click
# is installed (import-linter brings it). p2pnode never uses it; httpx falls back to a stub on ImportError.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

from ..errors import P2PNodeError
from ._parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status (0 ok, 1 failed, 2 usage
    or configuration error).
    """
    args = sys.argv[1:] if argv is None else argv
    # `p2pnode agent ...` builds the agent's parser alone: the agent process loads no other command's module.
    ns = build_parser("agent" if args[:1] == ["agent"] else None).parse_args(args)
    try:
        return ns.func(ns)
    except P2PNodeError as exc:
        print(f"p2pnode: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
