"""The ``local`` provider: extra ``p2pnode agent`` processes on this machine (tests and ``p2pnode demo``).

Each node it starts is an agent process **detached** from the agent that started it (a session of its own,
stdin ``/dev/null``, output appended to ``<local_dir>/<request>.<i>.log``), so it outlives a leader that stops or
fails over. It gets its own data dir ``<local_dir>/<request>.<i>/`` holding a node key the provider writes first
(so the node id is known at once), a free loopback port (``--bind 127.0.0.1``), ``--join`` the context's
addresses, ``--no-mdns``, its class's ``--fake-gpus`` and ``--tag``\\ s (never ``voter``), ``--catalog`` the
agent's, ``--config`` ``local_config`` when set, and in its environment ``P2PNODE_SCALING_STARTED_BY=<request>``
(published in its snapshot's ``scaling.started_by``), ``P2PNODE_TRUST``, ``P2PNODE_SYNC_DATA_PORT=0`` (several
agents on one host), ``P2PNODE_ALLOW_PRIVATE_ADVERTISE=1`` (its peers are on loopback: the cluster that starts it
must set it too) and ``P2PNODE_READ_TOKEN`` when the cluster has one. The agent's own ``P2PNODE_*`` variables
are not passed on (its tags, port or config file are not the new node's); in ``token`` mode the agent's
``keyring.json`` is copied into the new data dir (mode 0600).

**Records.** One JSON file per node, ``<local_dir>/<request>.<i>.json`` (:class:`LocalRecord`, written
atomically), so whichever agent on this machine leads later sees the same nodes: :meth:`LocalProvider.list`
reads them (untrusted: a typed decode; a bad or oversized file is counted in ``bad_records`` and skipped, at most
:data:`MAX_RECORDS` files), marks ``running`` a node whose port answers and ``stopped`` one whose process is gone
(a pid is only the node's while that process started when the record says and its command line names the data
dir: pids are reused). A lock file (``flock``) serialises the agents of this machine over the records.

**Idempotency.** ``scale_up(c, n, r)`` starts the nodes ``r.0`` .. ``r.(n-1)`` that have no record yet: called
again it starts nothing (or only what a failed first call left out). ``scale_down(ids, r)`` sends SIGTERM (the
agent leaves the cluster and stops its jobs), waits up to :data:`STOP_TIMEOUT_S`, then SIGKILLs the process
group; a node already stopped is left alone. Records are kept (with the data dirs) until the operator removes
them: a request id is never carried out twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import msgspec
import psutil
from msgspec import Meta

from .._files import atomic_write_bytes
from ..config import ScalingSettings
from ..identity import KEY_FILE
from ._base import (
    NodeState,
    ProviderContext,
    ProviderError,
    ProviderNode,
    RequestId,
    check_node_ids,
    check_request_id,
    new_node_key,
)

log = logging.getLogger(__name__)

MAX_RECORDS = 1024
"""Record files a ``local_dir`` may hold; past it ``scale_up`` refuses (remove the stopped nodes' files)."""
MAX_RECORD_BYTES = 64 * 1024
STOP_TIMEOUT_S = 10.0
"""Seconds a node has to leave after SIGTERM before its process group gets SIGKILL."""
_PATH = Annotated[str, Meta(min_length=1, max_length=4096, pattern=r"^[^\x00-\x1f\x7f]*\Z")]


class LocalRecord(msgspec.Struct, frozen=True):
    """One node of the ``local`` provider, as its record file holds it: the ``request_id`` and ``index`` within
    that request, its ``node_class`` and ``node_id``, its process (``pid`` and the ``create_time`` psutil reports,
    in seconds since the epoch), its loopback ``port``, ``data_dir`` and ``log_file``, its ``state``, when it was
    started (``started_at``, wall seconds) and the request that stopped it (``stopped_by``)."""

    request_id: RequestId
    index: Annotated[int, Meta(ge=0, lt=1000)]
    node_class: Annotated[str, Meta(max_length=64, pattern=r"^[^\x00-\x1f\x7f]*\Z")]
    node_id: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[a-z2-7]+\Z")]
    pid: Annotated[int, Meta(ge=0, le=2**31 - 1)]
    create_time: Annotated[float, Meta(ge=0.0, le=1e11)]
    port: Annotated[int, Meta(ge=1, le=65535)]
    data_dir: _PATH
    log_file: _PATH
    state: NodeState = "starting"
    started_at: Annotated[float, Meta(ge=0.0, le=1e11)] = 0.0
    stopped_by: Annotated[str, Meta(max_length=64, pattern=r"^[^\x00-\x1f\x7f]*\Z")] = ""

    def node(self) -> ProviderNode:
        """This record as the interface reports it."""
        return ProviderNode(request_id=self.request_id, node_class=self.node_class, node_id=self.node_id,
                            state=self.state, detail={"pid": str(self.pid), "address": f"127.0.0.1:{self.port}",
                                                      "data_dir": self.data_dir[:256]})


_Records = list[LocalRecord]
_Argv = list[str]


class LocalProvider:
    """The ``local`` provider (see the module docstring). ``bad_records`` counts record files refused so far."""

    name = "local"

    def __init__(self, settings: ScalingSettings, ctx: ProviderContext) -> None:
        self.settings = settings
        self.ctx = ctx
        self.dir = Path(settings.local_dir) if settings.local_dir else Path(ctx.data_dir) / "scaling-local"
        self.bad_records = 0
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # reaped when they exit (no zombies)
        self._decoder = msgspec.json.Decoder(LocalRecord)

    # -- the interface ------------------------------------------------------------------------------
    def scale_up(self, node_class: str, count: int, request_id: str) -> list[ProviderNode]:
        """Start the nodes of ``request_id`` not started yet (``count`` in all); returns that request's nodes."""
        check_request_id(request_id)
        cls = self.settings.classes.get(node_class)
        if cls is None:
            raise ProviderError(f"local: node class {node_class[:64]!r} is not in [scaling.classes]")
        if "voter" in cls.tags:
            raise ProviderError(f"local: node class {node_class!r} has the tag 'voter' (scaling never adds voters)")
        if not 1 <= count <= 1000:
            raise ProviderError(f"local: count must be 1-1000, not {count}")
        self._check_local_config()
        with self._locked():
            records = self._refresh(self._read())
            if len(records) + count > MAX_RECORDS:
                raise ProviderError(f"local: {self.dir} holds {len(records)} node records; remove stopped ones")
            mine = {r.index: r for r in records if r.request_id == request_id}
            ports = {r.port for r in records if r.state != "stopped"}
            for i in range(count):
                if i not in mine:
                    mine[i] = self._start(node_class, request_id, i, ports)
                    ports.add(mine[i].port)
            return [mine[i].node() for i in sorted(mine)]

    def scale_down(self, node_ids: list[str], request_id: str) -> list[ProviderNode]:
        """Stop the nodes ``node_ids`` this provider started (SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`);
        returns them, ``stopped``. Ids it has no record of are ignored."""
        check_request_id(request_id)
        wanted = set(check_node_ids(node_ids))
        with self._locked():
            records = [r for r in self._refresh(self._read()) if r.node_id in wanted]
            live = [r for r in records if r.state != "stopped"]
            procs = []
            for r in live:
                log.info("scaling: stopping local node %s (pid %d, request %s)", r.node_id, r.pid, request_id)
                self._write(msgspec.structs.replace(r, state="stopping", stopped_by=request_id))
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(r.pid)
                    p.send_signal(signal.SIGTERM)
                    procs.append(p)
            _, stuck = psutil.wait_procs(procs, timeout=STOP_TIMEOUT_S)
            for p in stuck:
                log.warning("scaling: local node pid %d still running %g s after SIGTERM: SIGKILL", p.pid,
                            STOP_TIMEOUT_S)
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
            psutil.wait_procs(stuck, timeout=5.0)
            for p in procs:
                child = self._children.pop(p.pid, None)
                if child is not None:
                    child.poll()
            done = {r.node_id: msgspec.structs.replace(r, state="stopped", stopped_by=r.stopped_by or request_id)
                    for r in live}
            for r in done.values():
                self._write(r)
            return [done.get(r.node_id, r).node() for r in records]

    def list(self) -> list[ProviderNode]:
        """Every node of the records, in its current state (see the module docstring)."""
        with self._locked():
            return [r.node() for r in self._refresh(self._read())]

    def _check_local_config(self) -> None:
        """``local_config`` loads and tags no node ``voter`` (ProviderError otherwise)."""
        if not self.settings.local_config:
            return
        from ..config import load_config
        from ..errors import ConfigError

        try:
            tags = load_config(Path(self.settings.local_config), env={}).agent.tags
        except ConfigError as exc:
            raise ProviderError(f"local: scaling.local_config: {exc}") from None
        if "voter" in tags:
            raise ProviderError(f"local: {self.settings.local_config} tags its agents 'voter' (scaling never adds "
                                "voters)")

    # -- records ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold ``<local_dir>/.lock`` (``flock``): one agent of this machine at a time works on the records."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ProviderError(f"local: cannot use {self.dir}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> _Records:
        """The record files, decoded; a bad one counted, logged and skipped."""
        out: _Records = []
        try:
            paths = sorted(p for p in self.dir.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
        except OSError as exc:
            raise ProviderError(f"local: cannot list {self.dir}: {exc.strerror or exc}") from None
        for path in paths[:MAX_RECORDS]:
            try:
                with open(path, "rb") as f:
                    raw = f.read(MAX_RECORD_BYTES + 1)
                if len(raw) > MAX_RECORD_BYTES:
                    raise ValueError(f"over {MAX_RECORD_BYTES} bytes")
                rec = self._decoder.decode(raw)
                if path.name != _record_name(rec.request_id, rec.index):
                    raise ValueError("its request id and index do not match its file name")
            except (OSError, ValueError, msgspec.DecodeError) as exc:  # msgspec.ValidationError is a ValueError
                self.bad_records += 1
                log.warning("scaling: skipping local node record %s: %s", path, str(exc)[:200])
                continue
            out.append(rec)
        return out

    def _write(self, rec: LocalRecord) -> None:
        try:
            atomic_write_bytes(self.dir / _record_name(rec.request_id, rec.index), msgspec.json.encode(rec),
                               mode=0o600)
        except OSError as exc:
            raise ProviderError(f"local: cannot write a node record in {self.dir}: {exc.strerror or exc}") from None

    def _refresh(self, records: _Records) -> _Records:
        """``records`` with their states brought up to date (and written back where they changed)."""
        out = []
        for r in records:
            state = r.state
            if state != "stopped" and not self._alive(r):
                state = "stopped"
            elif state == "starting" and _answers(r.port):
                state = "running"
            if state != r.state:
                r = msgspec.structs.replace(r, state=state)
                self._write(r)
            out.append(r)
        return out

    def _alive(self, r: LocalRecord) -> bool:
        """Whether the record's process still runs: its pid, started when the record says, naming its data dir."""
        child = self._children.get(r.pid)
        if child is not None and child.poll() is not None:
            del self._children[r.pid]
            return False
        try:
            p = psutil.Process(r.pid)
            with p.oneshot():
                return (p.status() != psutil.STATUS_ZOMBIE and abs(p.create_time() - r.create_time) < 1.0
                        and r.data_dir in p.cmdline())
        except psutil.Error:  # gone, a zombie, or another user's process: not ours
            return False

    # -- starting a node ----------------------------------------------------------------------------
    def _start(self, node_class: str, request_id: str, index: int, taken: set[int]) -> LocalRecord:
        """Start node ``index`` of ``request_id`` and write its record."""
        name = f"{request_id}.{index}"
        data_dir = self.dir / name
        log_file = self.dir / f"{name}.log"
        try:
            data_dir.mkdir(mode=0o700, exist_ok=True)
            node_id = self._node_key(data_dir)
            if self.ctx.trust == "token" and self.ctx.keyring_file:
                shutil.copyfile(self.ctx.keyring_file, data_dir / "keyring.json")
                os.chmod(data_dir / "keyring.json", 0o600)
            port = _free_port(taken)
            argv = self._argv(node_class, data_dir, port)
            with open(log_file, "ab") as out:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=self._env(request_id), cwd=data_dir, start_new_session=True,
                                        close_fds=True)
        except OSError as exc:
            raise ProviderError(f"local: cannot start node {name}: {exc.strerror or exc}") from None
        self._children[proc.pid] = proc
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            created = time.time()
        rec = LocalRecord(request_id=request_id, index=index, node_class=node_class, node_id=node_id, pid=proc.pid,
                          create_time=created, port=port, data_dir=str(data_dir), log_file=str(log_file),
                          started_at=time.time())
        self._write(rec)
        log.info("scaling: started local node %s (%s, pid %d, port %d, request %s)", node_id, node_class, proc.pid,
                 port, request_id)
        return rec

    @staticmethod
    def _node_key(data_dir: Path) -> str:
        """Write a fresh node key into ``data_dir`` (or keep the one there) and return its node id."""
        from ..errors import IdentityError
        from ..identity import load_or_create_identity

        path = data_dir / KEY_FILE
        if not path.exists():
            seed, node_id = new_node_key()
            atomic_write_bytes(path, seed, mode=0o600)
            return node_id
        try:
            return load_or_create_identity(data_dir).node_id
        except IdentityError as exc:  # a damaged key in a data dir of ours
            raise ProviderError(f"local: {path}: {exc}") from None

    def _argv(self, node_class: str, data_dir: Path, port: int) -> _Argv:
        cls = self.settings.classes[node_class]
        argv = [self.ctx.interpreter, "-m", "p2pnode", "agent", "--data-dir", str(data_dir), "--bind", "127.0.0.1",
                "--port", str(port), "--no-mdns"]
        for addr in self.ctx.join:
            argv += ["--join", addr]
        if cls.fake_gpus:
            argv += ["--fake-gpus", cls.fake_gpus]
        for tag in cls.tags:
            argv += ["--tag", tag]
        if self.ctx.catalog:
            argv += ["--catalog", self.ctx.catalog]
        if self.settings.local_config:
            argv += ["--config", self.settings.local_config]
        return argv

    def _env(self, request_id: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("P2PNODE_")}
        env.update(P2PNODE_SCALING_STARTED_BY=request_id, P2PNODE_TRUST=self.ctx.trust, P2PNODE_SYNC_DATA_PORT="0",
                   P2PNODE_ALLOW_PRIVATE_ADVERTISE="1", PYTHONUNBUFFERED="1")
        if self.ctx.read_token:
            env["P2PNODE_READ_TOKEN"] = self.ctx.read_token
        return env


def _record_name(request_id: str, index: int) -> str:
    return f"{request_id}.{index}.json"


def _free_port(taken: set[int]) -> int:
    """A loopback TCP port free now and not given to another live node of the records."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in taken:
            return port
    raise ProviderError("local: no free loopback port")


def _answers(port: int) -> bool:
    """Whether something accepts TCP connections on ``127.0.0.1:port`` (within 0.2 s)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False
