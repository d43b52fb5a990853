"""Demo gang member (docs/gangs.md): says where it stands in its gang, then works a while. p2pnode starts one on
each of the gang's nodes with the gang's variables (rank, size, rendezvous)."""

import argparse
import os
import random

from _common import play, run_for


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ns = ap.parse_args()
    env = os.environ
    print(f"gang {env.get('P2PNODE_GANG_ID')}: rank {env.get('P2PNODE_GANG_RANK')} of {env.get('P2PNODE_GANG_SIZE')} "
          f"on node {env.get('P2PNODE_NODE_ID')}, rendezvous {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}",
          flush=True)
    rng = random.Random(env.get("P2PNODE_JOB_ID", "local"))
    games = sum(1 for _ in run_for(ns.seconds) if play(rng))
    print(f"rank {env.get('P2PNODE_GANG_RANK')}: {games} games", flush=True)


if __name__ == "__main__":
    main()
