"""One member of a ``ray`` gang (issue 26), run by the ray engine's interpreter: no p2pnode import, only Ray's.

p2pnode starts this on every member with the member's rank, the gang's size, the head's address and every Ray
port inside the member's own port block (:func:`p2pnode.node._engines.engine_command`):

* rank 0 starts a Ray head on its address (``ray start --head --block``) with the member's CPUs, GPUs, custom
  resources and object store, waits until the Ray cluster has every member's node alive, then runs the driver
  (``python`` + the template's argv, ``RAY_ADDRESS`` set) and exits with the driver's status;
* every other rank joins the head (``ray start --block --address``) and runs until it is stopped.

Every Ray process it starts is its child, in the job's session: when the member ends or is stopped, p2pnode
ends them all (never ``ray stop``, which would end every Ray process on the machine, other users' included).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

PORT_FLAGS = ("node-manager-port", "object-manager-port", "dashboard-agent-grpc-port", "dashboard-agent-listen-port",
              "metrics-export-port", "runtime-env-agent-port", "ray-client-server-port", "dashboard-port",
              "min-worker-port", "max-worker-port")
JOIN_TIMEOUT_S = 300.0


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("ray_member: the driver's command follows --")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="ray_member")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--head-port", type=int, required=True, help="the head's GCS port (rank 0's --port)")
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--num-cpus", type=int, default=1)
    ap.add_argument("--num-gpus", type=int, default=0)
    ap.add_argument("--object-store-memory", type=int, default=78 * 2**20)
    ap.add_argument("--resources", default="", help="custom resources, a JSON object (passed to ray start as is)")
    for flag in PORT_FLAGS:
        ap.add_argument(f"--{flag}", type=int, required=True)
    return ap.parse_args(argv[:cut]), argv[cut + 1:]


def ray_start(ns: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
           "--node-ip-address", ns.host, "--num-cpus", str(ns.num_cpus), "--num-gpus", str(ns.num_gpus),
           "--object-store-memory", str(ns.object_store_memory)]
    if ns.resources:
        cmd += ["--resources", ns.resources]
    for flag in PORT_FLAGS:
        if flag == "dashboard-port" and ns.rank != 0:
            continue  # the dashboard (off) is the head's
        cmd += [f"--{flag}", str(getattr(ns, flag.replace("-", "_")))]
    if ns.rank == 0:
        return cmd + ["--head", "--port", str(ns.port), "--include-dashboard", "false"]
    return cmd + ["--address", f"{ns.head}:{ns.head_port}"]


def wait_for_nodes(address: str, size: int) -> int:
    """Connect to the Ray cluster at ``address`` and wait until ``size`` nodes are alive; their count."""
    import ray  # type: ignore[import-not-found, unused-ignore]  # the engine's interpreter has it; the agent's may not

    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while True:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            break
        except Exception:  # the head is still starting  # noqa: BLE001
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    try:
        while True:
            alive = sum(1 for n in ray.nodes() if n.get("Alive"))
            if alive >= size or time.monotonic() > deadline:
                return alive
            time.sleep(0.5)
    finally:
        ray.shutdown()


def wait_for_head(head: str, port: int) -> None:
    """Until the head's GCS port accepts a connection: a worker that starts first would otherwise time out in
    ``ray start`` (Ray gives a joining node 30 s, which a busy machine's head can take to come up)."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while True:
        try:
            with socket.create_connection((head, port), timeout=2.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"ray_member: the head {head}:{port} is not up after {JOIN_TIMEOUT_S:g} s") from None
            time.sleep(0.5)


def main(argv: list[str]) -> int:
    ns, driver = parse(argv)
    if ns.rank != 0:
        wait_for_head(ns.head, ns.head_port)
    ray = subprocess.Popen(ray_start(ns))
    stop = {"sig": 0}

    def on_term(sig: int, _frame: object) -> None:
        stop["sig"] = sig
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        if ns.rank != 0:
            return ray.wait()
        address = f"{ns.host}:{ns.port}"
        alive = wait_for_nodes(address, ns.size)
        print(f"ray_member: Ray cluster at {address} has {alive} of {ns.size} nodes alive", flush=True)
        if alive < ns.size:
            return 1
        return subprocess.call([sys.executable, *driver], env={**os.environ, "RAY_ADDRESS": address})
    except KeyboardInterrupt:
        return 128 + (stop["sig"] or signal.SIGINT)
    finally:
        if ray.poll() is None:
            ray.terminate()
            try:
                ray.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ray.kill()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
