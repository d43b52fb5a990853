"""A torchrun gang's smallest real work (p2pnode docs/gangs.md): a gloo all-reduce of the ranks across every
member, on the CPU. p2pnode starts it on each member under ``python -m torch.distributed.run`` with a static
rendezvous (``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port`` from the plan); torchrun sets
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` for each process.

    python -m torch.distributed.run --nnodes 1 --nproc-per-node 2 ddp_allreduce.py --seconds 0
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=0.0, help="keep reducing this long after the first one")
    args = ap.parse_args()
    dist.init_process_group("gloo")  # env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    want = world * (world - 1) / 2
    print(f"rank {rank} of {world} (node {os.environ.get('NODE_RANK')}, gang {os.environ.get('P2PNODE_GANG_ID')}): "
          f"sum of ranks {t.item():g}, expected {want:g}", flush=True)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:  # a long run: a lost member makes the others' next all-reduce fail
        time.sleep(1.0)
        dist.all_reduce(torch.ones(1))
    dist.barrier()
    dist.destroy_process_group()
    if t.item() != want:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
