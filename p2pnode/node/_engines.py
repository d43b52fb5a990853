"""What a node runs for one job under its engine (issue 26): the command line and the gang's environment. Pure.

p2pnode has no distributed runtime of its own: a gang's members are handed to the engine users already run.

* ``process``: the template's argv as is; a gang member also gets the gang's variables below.
* ``torchrun``: ``<python> -m torch.distributed.run --nnodes N --node-rank R --nproc-per-node K --master-addr A
  --master-port P`` + argv (a static rendezvous: every member knows rank 0's address and port from the plan; K is
  the member's whole GPUs, 1 without a GPU). PyTorch's ``torchrun`` then starts K worker processes and sets
  ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` for each. An elastic gang (``slot.min_size`` > 0, issue 41 item 4):
  ``--nnodes MIN:MAX --nproc-per-node K --rdzv-backend c10d --rdzv-endpoint A:P --rdzv-id GANG_ID --rdzv-conf
  is_host=1|0 --max-restarts`` :data:`TORCHRUN_MAX_RESTARTS` (PyTorch's elastic launch: the members rendezvous at
  rank 0's c10d store, which rank 0's own launcher hosts, ``is_host=1``; a member lost or joining restarts the
  workers of the others with the new world size, a loss costing one restart), and ``--local-addr`` the node's
  advertised address (else torchrun names the node by its host name: the workers' store would be unreachable where
  that resolves to a loopback address). torchrun numbers the nodes itself: the slot's rank is not ``NODE_RANK``
  then. The member's environment has ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: the workers of each rendezvous round
  meet at a store of that round (PyTorch's shared store keeps the keys of the round before, and the workers of the
  next round can read a lost member's address from them and hang).
* ``ray``: ``<python> ray_member.py`` (:mod:`p2pnode.jobs.ray_member`, run by the engine's interpreter): rank 0
  starts a Ray head on its address, the others join it, and rank 0 runs argv as the Ray driver once the Ray
  cluster has every member; every Ray port inside the member's own block.

Every member gets ``P2PNODE_GANG_ID``, ``P2PNODE_GANG_RANK``, ``P2PNODE_GANG_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, ``NNODES`` and ``NODE_RANK`` (an elastic gang: ``P2PNODE_GANG_MIN``, ``NNODES`` ``MIN:MAX`` and no
``NODE_RANK``); under ``process`` also ``RANK`` and ``WORLD_SIZE`` (one process per
member). Every value comes from the plan's typed :class:`p2pnode.snapshot.GangSlot` (bounded ints, a checked
host): nothing else from the network reaches the command line.
"""

from __future__ import annotations

import json
import math

from ..snapshot import GangSlot

__all__ = ["RAY_FIXED_PORTS", "TORCHRUN_MAX_RESTARTS", "engine_command", "gang_env", "ray_ports"]

TORCHRUN_MAX_RESTARTS = 16
"""``--max-restarts`` of an elastic torchrun gang's members: each member lost (or failed) costs the others one
restart of their workers; a member joining costs none. Past it, a member's launcher exits non-zero."""

RAY_FIXED_PORTS = 10
"""Ports of a Ray member's block used by Ray's own services (GCS, node manager, object manager, the dashboard
agent, metrics, runtime env agent, client server, dashboard); the rest of the block is for its workers."""


def gang_env(slot: GangSlot, engine: str) -> dict[str, str]:
    """The gang's variables for one member (see the module docstring)."""
    env = {
        "P2PNODE_GANG_ID": slot.id, "P2PNODE_GANG_RANK": str(slot.rank), "P2PNODE_GANG_SIZE": str(slot.size),
        "MASTER_ADDR": slot.master, "MASTER_PORT": str(slot.master_port), "NNODES": str(slot.size),
        "NODE_RANK": str(slot.rank),
    }
    if engine == "process":
        env.update({"RANK": str(slot.rank), "WORLD_SIZE": str(slot.size)})
    if slot.min_size:
        del env["NODE_RANK"]
        env.update({"P2PNODE_GANG_MIN": str(slot.min_size), "NNODES": f"{slot.min_size}:{slot.size}"})
        if engine == "torchrun":  # a fresh store per rendezvous round (the shared one keeps the last round's keys)
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def _bracketed(host: str) -> str:
    """``host`` as the host of a ``HOST:PORT`` endpoint (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def ray_ports(slot: GangSlot) -> dict[str, int]:
    """Every port a Ray member opens, inside its block ``[port_base, port_base + ports)``: rank 0's GCS port is
    the block's first (the rendezvous, ``master_port``), workers take the block's tail."""
    b = slot.port_base
    ports = {
        "port": b, "node_manager_port": b + 1, "object_manager_port": b + 2, "dashboard_agent_grpc_port": b + 3,
        "dashboard_agent_listen_port": b + 4, "metrics_export_port": b + 5, "runtime_env_agent_port": b + 6,
        "ray_client_server_port": b + 7, "dashboard_port": b + 8,
        "min_worker_port": b + RAY_FIXED_PORTS, "max_worker_port": b + max(RAY_FIXED_PORTS, slot.ports - 1),
    }
    return ports


def engine_command(engine: str, argv: list[str], *, python: str, slot: GangSlot | None, num_gpus: float,
                   num_cpus: float, memory_gib: float, own_host: str, ray_member: str,
                   custom: tuple[tuple[str, float], ...] = ()) -> tuple[list[str], dict[str, str]]:
    """``(argv, extra environment)`` of one job run by ``engine`` (``process``, ``torchrun``, ``ray``) with the
    engine's interpreter ``python``. ``slot`` is the member's place in its gang (None: a job of one; torchrun and
    Ray then run a gang of one on this node); ``num_gpus``, ``num_cpus``, ``memory_gib`` the member's request (a
    Ray member's resources); ``own_host`` this node's advertised host (a Ray member's ``--node-ip-address``);
    ``ray_member`` the path of :mod:`p2pnode.jobs.ray_member`. Raises ``ValueError`` for an unknown engine."""
    if slot is None:
        slot = GangSlot(id="solo", rank=0, size=1, master=own_host or "127.0.0.1", master_port=29400,
                        port_base=29400, ports=64, engine=engine)  # type: ignore[arg-type]
        env: dict[str, str] = {}
    else:
        env = gang_env(slot, engine)
    if engine == "process":
        return list(argv), env
    gpus = int(num_gpus) if num_gpus >= 1 else (1 if num_gpus > 0 else 0)
    if engine == "torchrun":
        nproc = max(1, gpus)
        if slot.min_size:
            local = ["--local-addr", own_host] if own_host else []
            return [python, "-m", "torch.distributed.run", "--nnodes", f"{slot.min_size}:{slot.size}",
                    "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"{_bracketed(slot.master)}:{slot.master_port}", "--rdzv-id", slot.id,
                    "--rdzv-conf", f"is_host={1 if slot.rank == 0 else 0}", *local,
                    "--max-restarts", str(TORCHRUN_MAX_RESTARTS), *argv], env
        return [python, "-m", "torch.distributed.run", "--nnodes", str(slot.size), "--node-rank", str(slot.rank),
                "--nproc-per-node", str(nproc), "--master-addr", slot.master, "--master-port",
                str(slot.master_port), *argv], env
    if engine == "ray":
        cmd = [python, ray_member, "--rank", str(slot.rank), "--size", str(slot.size), "--head", slot.master,
               "--head-port", str(slot.master_port), "--host", own_host or slot.master,
               "--num-cpus", str(max(1, math.floor(num_cpus))),
               "--num-gpus", str(gpus),
               "--object-store-memory", str(max(78 * 2**20, int(memory_gib * 2**30 * 0.3)))]
        if custom:  # Ray's own form: a JSON object of name -> amount (from this node's catalog)
            cmd += ["--resources", json.dumps(dict(custom), sort_keys=True)]
        for k, v in ray_ports(slot).items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        return [*cmd, "--", *argv], env
    raise ValueError(f"unknown engine {engine!r}")
