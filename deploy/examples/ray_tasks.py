"""A ray gang's smallest real work (p2pnode docs/gangs.md): list the Ray cluster p2pnode built over the gang's
members, then run one task pinned to each node. p2pnode runs this as the Ray driver on rank 0 once every member's
node is alive, with ``RAY_ADDRESS`` set; its exit status is the gang's.

    RAY_ADDRESS=HOST:PORT python ray_tasks.py
"""

import argparse
import os
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0.1)
def where() -> str:
    return f"{ray.util.get_node_ip_address()} (p2pnode node {os.environ.get('P2PNODE_NODE_ID', '?')})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=0.0, help="stay connected this long after the tasks")
    args = ap.parse_args()
    ray.init()  # RAY_ADDRESS
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    print(f"{len(nodes)} alive Ray nodes", flush=True)
    for n in nodes:
        res = {k: v for k, v in n["Resources"].items() if k in ("CPU", "GPU") or not k.startswith("node:")}
        print(f"node {n['NodeManagerAddress']}: {res}", flush=True)
    refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
            for n in nodes]
    for n, r in zip(nodes, ray.get(refs)):
        print(f"task on {n['NodeManagerAddress']}: ran on {r}", flush=True)
    time.sleep(args.seconds)


if __name__ == "__main__":
    main()
