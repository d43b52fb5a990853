"""The ``command`` provider: the operator's programs add and remove nodes (Slurm's ``ResumeProgram`` and
``SuspendProgram``).

``command_up`` and ``command_down`` (argv split shell-like with :func:`shlex.split`, run without a shell, stdin
``/dev/null``, in a process group of their own) get in their environment, beside the agent's own (less every
``P2PNODE_`` variable of the agent: no token, tag or data dir of its own reaches a script):

====================== =================================================================================
``P2PNODE_NODE_CLASS`` the node class to add (``""`` for a scale-down)
``P2PNODE_COUNT``      how many nodes to add (a scale-down: how many node ids)
``P2PNODE_NODE_IDS``   the p2pnode node ids to remove, comma-separated (``""`` for a scale-up)
``P2PNODE_REQUEST_ID`` the action's idempotency id: the script must do nothing twice for one id
``P2PNODE_JOIN``       ``host:port`` addresses a new node should ``--join``, comma-separated
``P2PNODE_TRUST``      the cluster's trust mode (``open`` or ``token``)
``P2PNODE_KEYRING_FILE`` in ``token`` mode, the path of the agent's ``keyring.json`` (mode 0600; copy it to a new
                       node's data dir): no token is ever put on a command line or in this environment
====================== =================================================================================

Exit status 0 is success; any other is a :class:`ProviderError` carrying the tail of the program's stderr (at most
:data:`STDERR_TAIL_CHARS` characters, control characters replaced). A program still running after
``command_timeout_s`` is killed with its whole process group (SIGKILL) and is a :class:`ProviderError` ("timed out
after N s"). A process the program leaves behind in a session of its own (``setsid``) is not waited for and not
killed. ``command_list``, when set, prints a JSON array of :class:`ProviderNode` objects on stdout (read up to
:data:`MAX_LIST_BYTES`); output that is too long or does not decode is a :class:`ProviderError`.
"""

from __future__ import annotations

import logging
import os
import re
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping

import msgspec

from ..config import ScalingSettings
from ._base import ProviderContext, ProviderError, ProviderNode, ProviderNodes, check_node_ids, check_request_id

log = logging.getLogger(__name__)

MAX_LIST_BYTES = 1 << 20
"""Bytes of ``command_list`` output read at most (1 MiB)."""
STDERR_TAIL_CHARS = 400
"""Characters of a failed program's stderr kept in its :class:`ProviderError`."""
_STDERR_KEEP_BYTES = 8192
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


class CommandTimedOut(ProviderError):
    """:func:`run_bounded`: the program ran past its time limit (killed with its process group)."""


class CommandTooLong(ProviderError):
    """:func:`run_bounded`: the program printed more than its stdout limit."""


def clean_env() -> dict[str, str]:
    """The agent's environment less every ``P2PNODE_`` variable (no token, tag or data dir of the agent's own
    reaches an operator's script, whose output may be logged): the base of the scaling commands' environment and
    the interruption probe's (:mod:`p2pnode.jobs._noticeprobe`)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("P2PNODE_")}


def one_line(raw: bytes, limit: int = STDERR_TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``raw`` (UTF-8, invalid bytes replaced) on one line: every run of control
    characters (newlines included) becomes one space."""
    text = _CONTROL.sub(" ", raw.decode("utf-8", "replace")).strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def run_bounded(argv: list[str], env: Mapping[str, str], timeout_s: float, *,
                max_stdout_bytes: int = MAX_LIST_BYTES) -> bytes:
    """Run ``argv`` (no shell, stdin ``/dev/null``, a new session) until it exits or ``timeout_s`` passed; returns
    its stdout (at most ``max_stdout_bytes``). Raises :class:`ProviderError` for a program that cannot start or exits
    non-zero (with the tail of its stderr), :class:`CommandTimedOut` for one that runs past ``timeout_s`` (its
    process group killed), :class:`CommandTooLong` for one that prints more than ``max_stdout_bytes``. Output is
    read as it comes, so a chatty program never blocks on a full pipe, and the pipes
    are not waited for once the program exited (a daemon it left behind may keep them open)."""
    name = os.path.basename(argv[0]) if argv else "?"
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(env), start_new_session=True, close_fds=True)
    except OSError as exc:
        raise ProviderError(f"{name}: cannot start: {exc.strerror or exc}") from None
    out, err = bytearray(), bytearray()
    too_long = False
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        try:
            while sel.get_map():
                exited = proc.poll() is not None
                left = deadline - time.monotonic()
                if left <= 0:
                    if exited:
                        break  # a daemon it left behind keeps writing to its pipes
                    _kill_group(proc)
                    raise CommandTimedOut(f"{name}: timed out after {timeout_s:g} s (killed with its process group)"
                                          + (f"; stderr: {one_line(bytes(err))}" if err else ""))
                ready = sel.select(0 if exited else min(left, 0.2))
                if exited and not ready:
                    break  # exited, and the pipes hold nothing more now: a leftover daemon may keep them open
                for key, _ in ready:
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    buf: bytearray = key.data
                    buf += data
                    if buf is err and len(err) > _STDERR_KEEP_BYTES:
                        del err[:-_STDERR_KEEP_BYTES]
                    elif buf is out and len(out) > max_stdout_bytes:
                        too_long = True
                        del out[max_stdout_bytes:]
            rc = proc.wait(max(0.0, deadline - time.monotonic()) + 1.0)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CommandTimedOut(f"{name}: timed out after {timeout_s:g} s (killed with its process group)") from None
        finally:
            proc.stdout.close()
            proc.stderr.close()
    if rc != 0:
        tail = one_line(bytes(err))
        raise ProviderError(f"{name}: exit status {rc}" + (f"; stderr: {tail}" if tail else ""))
    if too_long:
        raise CommandTooLong(f"{name}: printed more than {max_stdout_bytes} bytes")
    return bytes(out)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group (it leads its own session) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class CommandProvider:
    """The ``command`` provider (see the module docstring). ``list()`` is ``command_list``'s output, or ``[]``
    without one (the fleet's members are then the only record: the leader counts the members whose snapshot names
    the request, ``scaling.started_by``)."""

    name = "command"

    def __init__(self, settings: ScalingSettings, ctx: ProviderContext) -> None:
        self.settings = settings
        self.ctx = ctx
        self._decoder = msgspec.json.Decoder(ProviderNodes)

    def _argv(self, key: str) -> list[str]:
        line = getattr(self.settings, key)
        try:
            argv = shlex.split(line)
        except ValueError as exc:
            raise ProviderError(f"scaling.{key}: {exc}") from None
        if not argv:
            raise ProviderError(f"scaling.{key} is empty")
        return argv

    def _env(self, *, node_class: str = "", count: int = 0, node_ids: list[str] | None = None,
             request_id: str = "") -> dict[str, str]:
        env = clean_env()  # only the documented variables below
        env.update(P2PNODE_NODE_CLASS=node_class, P2PNODE_COUNT=str(count), P2PNODE_NODE_IDS=",".join(node_ids or []),
                   P2PNODE_REQUEST_ID=request_id, P2PNODE_JOIN=",".join(self.ctx.join), P2PNODE_TRUST=self.ctx.trust,
                   P2PNODE_KEYRING_FILE=self.ctx.keyring_file if self.ctx.trust == "token" else "")
        return env

    def scale_up(self, node_class: str, count: int, request_id: str) -> list[ProviderNode]:
        """Run ``command_up``; the nodes of ``request_id`` from ``command_list`` when set, else ``count``
        placeholders (``starting``, node id unknown)."""
        check_request_id(request_id)
        if not 1 <= count <= 1000:
            raise ProviderError(f"scale_up: count must be 1-1000, not {count}")
        log.info("scaling: %s for %d x %s (request %s)", self.settings.command_up, count, node_class, request_id)
        run_bounded(self._argv("command_up"), self._env(node_class=node_class, count=count, request_id=request_id),
                    self.settings.command_timeout_s)
        if self.settings.command_list:
            return [n for n in self.list() if n.request_id == request_id]
        return [ProviderNode(request_id=request_id, node_class=node_class) for _ in range(count)]

    def scale_down(self, node_ids: list[str], request_id: str) -> list[ProviderNode]:
        """Run ``command_down``; those nodes from ``command_list`` when set, else each as ``stopping``."""
        check_request_id(request_id)
        ids = check_node_ids(node_ids)
        log.info("scaling: %s for %s (request %s)", self.settings.command_down, ",".join(ids), request_id)
        run_bounded(self._argv("command_down"), self._env(count=len(ids), node_ids=ids, request_id=request_id),
                    self.settings.command_timeout_s)
        if self.settings.command_list:
            wanted = set(ids)
            return [n for n in self.list() if n.node_id in wanted]
        return [ProviderNode(request_id=request_id, node_id=n, state="stopping") for n in ids]

    def list(self) -> list[ProviderNode]:
        """``command_list``'s JSON array decoded, or ``[]`` without ``command_list``."""
        if not self.settings.command_list:
            return []
        out = run_bounded(self._argv("command_list"), self._env(), self.settings.command_timeout_s)
        try:
            return self._decoder.decode(out)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ProviderError(f"{os.path.basename(self._argv('command_list')[0])}: its output is no JSON array of "
                                f"nodes ({one_line(str(exc).encode(), 200)})") from None
