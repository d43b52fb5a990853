"""How a job is started (the runner's start arguments, :mod:`p2pnode.jobs._runner`): its command and minimal
environment (:func:`job_command`, :func:`gpu_env`), its memory limit (:func:`job_memory_limit`), the gang checks of
this node (:func:`check_ports_free`, :func:`interface_of`), and what runs in the child before exec
(:func:`child_setup`). Pure, or reading only this machine (interfaces, ports, PATH)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from ..node._engines import engine_command
from ..scheduler import JobTemplate
from ..scheduler._catalog import ResourceRequest
from ..snapshot import GangSlot

__all__ = ["RAY_MEMBER", "check_ports_free", "child_setup", "gpu_env", "interface_of", "job_command",
           "job_memory_limit", "resolve_argv0"]

_DEFAULT_MEMORY_GIB = ResourceRequest().memory_gib


def child_setup(join_file: str | None) -> None:  # runs in the child between fork and exec
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("500")
    except OSError:
        pass
    if join_file:
        try:
            with open(join_file, "w") as fh:
                fh.write(str(os.getpid()))
        except OSError:
            pass  # the parent sees the job outside its cgroup and relies on the watchdog



_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/-]{1,120}")
"""An NVML UUID as CUDA_VISIBLE_DEVICES takes it (``GPU-8f2c...``, ``MIG-GPU-.../1/0``; fake GPUs: ``GPU-fake-...``)."""


def gpu_env(gpus: Sequence[int], uuids: Mapping[int, str]) -> dict[str, str]:
    """The CUDA variables that give a job exactly its assigned GPUs: ``gpus`` are NVML indexes (the plan's), and
    ``uuids`` the NVML UUID of each index (``GPU-...``, from the node's newest resource sample).

    CUDA numbers devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, while NVML numbers them in PCI bus
    order: on a box with mixed cards an index means another GPU to CUDA than to the planner. So the job gets its
    GPUs by UUID (``CUDA_VISIBLE_DEVICES=GPU-a,GPU-b``, which no ordering changes), and always
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: harmless with UUIDs, and it makes the fallback right, the NVML indexes
    themselves, used when the UUID of any assigned GPU is unknown (CUDA's list cannot mix the two safely).
    No GPUs: ``CUDA_VISIBLE_DEVICES`` is empty, which hides every GPU. A UUID that is not of NVML's form
    (``GPU-`` or ``MIG-`` and hex digits, dashes, slashes: :data:`_UUID`) counts as unknown: a comma or a control
    character in it would hand the job other GPUs or none."""
    names = [uuids.get(i, "") for i in gpus]
    visible = names if all(_UUID.fullmatch(n) for n in names) else [str(i) for i in gpus]
    return {"CUDA_VISIBLE_DEVICES": ",".join(visible), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def job_memory_limit(template: JobTemplate, node_limit_gib: float) -> tuple[float, str]:
    """A job's memory limit in GiB (0: none) and where it comes from: the template's ``memory_gib`` when the
    catalog declares one (a value other than the catalog's default, which cannot be told from an undeclared
    one), capped by the node's ``guard.memory_limit_gb``; else the node's limit."""
    declared = template.resources.memory_gib
    if declared > 0 and declared != _DEFAULT_MEMORY_GIB and (node_limit_gib <= 0 or declared < node_limit_gib):
        return declared, f"memory_gib of {template.name}"
    return node_limit_gib, "guard.memory_limit_gb"



RAY_MEMBER = str(Path(__file__).with_name("ray_member.py"))
"""The Ray member script (:mod:`p2pnode.jobs.ray_member`), run by the ray engine's interpreter."""


def interface_of(host: str) -> str:
    """The network interface holding address ``host`` on this machine ("" when none does: a name, or a public
    address behind NAT). A torchrun or Ray member gets it as ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``
    (unless its template passes its own): gloo otherwise binds the address of the machine's host name, often
    127.0.1.1, which no peer reaches."""
    try:
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address.split("%")[0] == host for a in addrs):
                return name
    except OSError:
        pass
    return ""


def check_ports_free(slot: GangSlot, host: str) -> None:
    """Raise ``OSError`` naming the port when the member's first port (rank 0: the rendezvous) cannot be bound
    here: another process holds it, and the engine would fail later with a less clear error."""
    for port in (slot.port_base,):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError as exc:
                raise OSError(exc.errno, f"port {port} of gang {slot.id}'s block is taken on this node "
                                         f"({exc.strerror})") from None


def resolve_argv0(argv0: str, env: Mapping[str, str], cwd: Path) -> str:
    """``argv0`` as the path :func:`subprocess.Popen` would execute (PATH of the job's environment); raises
    ``FileNotFoundError`` like Popen when there is none (the wrapper would only exit 127)."""
    if "/" in argv0:
        path = argv0 if os.path.isabs(argv0) else str(cwd / argv0)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return argv0
    else:
        found = shutil.which(argv0, path=os.pathsep.join(os.get_exec_path(dict(env))))
        if found:
            return found
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv0)



def job_command(template: JobTemplate, params: dict[str, Any], *, job_id: str, node_id: str, data_dir: Path,
                gpus: Sequence[int], gpu_fraction: float, vram_gib: float, uuids: Mapping[int, str],
                catalog_dir: str = ".", gang: GangSlot | None = None, python: str = "",
                own_host: str = "", sync_root: Path | None = None,
                resume_from: str = "") -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` a job starts with (:meth:`p2pnode.jobs.JobRunner.start`, whose arguments these are; ``uuids``:
    the NVML UUID of each GPU index, :func:`gpu_env`): the template's argv rendered, as its engine runs it
    (:func:`p2pnode.node._engines.engine_command`), and its minimal environment (module docstring). Raises
    ``ValueError`` for parameters the template does not declare, ``OSError`` when a port of the gang member's block
    is taken (:func:`check_ports_free`). ``argv[0]`` is not resolved yet (:func:`resolve_argv0`).

    A template with a ``[job.checkpoint]`` (issue 41) is given ``P2PNODE_CHECKPOINT_DIR``: its rendered dir under
    ``sync_root`` (default ``<data_dir>/data``), absolute (``ValueError`` when a parameter makes it unsafe,
    :meth:`p2pnode.scheduler.CheckpointSpec.render_dir`); and ``resume_from`` (a path the node fetched the config's
    newest checkpoint to, "" for none) as ``P2PNODE_RESUME_FROM``."""
    argv = template.render_argv(params, {"python": sys.executable, "catalog_dir": catalog_dir})
    env = {k: os.environ[k] for k in template.env if k in os.environ}
    r = template.resources
    argv, gang_vars = engine_command(template.engine, argv, python=python or sys.executable, slot=gang,
                                     num_gpus=r.num_gpus, num_cpus=r.num_cpus, memory_gib=r.memory_gib,
                                     own_host=own_host, ray_member=RAY_MEMBER, custom=r.custom)
    if gang is not None:
        check_ports_free(gang, own_host)
        iface = interface_of(own_host)
        if iface and template.engine != "process":  # the engines' collectives bind where peers reach them
            gang_vars = {**{k: iface for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k not in env},
                         **gang_vars}
    env.update({
        **gpu_env(gpus, uuids),
        "P2PNODE_JOB_ID": job_id, "P2PNODE_CONFIG": template.config, "P2PNODE_NODE_ID": node_id,
        "P2PNODE_DATA_DIR": str(data_dir), **gang_vars,
    })
    if template.checkpoint is not None:
        rel = template.checkpoint.render_dir({"config": template.config, **template.param_values(params)})
        env["P2PNODE_CHECKPOINT_DIR"] = str(Path(sync_root or data_dir / "data").absolute() / rel)
    if resume_from:
        env["P2PNODE_RESUME_FROM"] = resume_from
    if gpus:  # the job's share of each of its GPUs, to size itself by (issue 38: it may exceed what it asked)
        env.update({"P2PNODE_GPU_FRACTION": f"{gpu_fraction:g}", "P2PNODE_VRAM_GIB": f"{vram_gib:g}"})
    return argv, env
