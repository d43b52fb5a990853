"""Demo selfplay: plays random games for a while, appending records to games.db and writing NPZ shards."""

import argparse
import os
import random
import time

import numpy as np
from _common import data_dir, games_db, play, run_for


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--shard-every", type=int, default=20)
    ns = ap.parse_args()
    job = os.environ.get("P2PNODE_JOB_ID", "local")
    rng = random.Random(job)
    con = games_db(ns.config)
    shard, n = [], 0
    shards = data_dir(ns.config) / "shards"
    shards.mkdir(exist_ok=True)
    for _ in run_for(ns.seconds):
        moves, winner = play(rng)
        con.execute("INSERT INTO games (job, moves, winner, at) VALUES (?, ?, ?, ?)", (job, moves, winner, time.time()))
        con.commit()
        shard.append((moves, winner))
        n += 1
        if len(shard) >= ns.shard_every:
            tmp = shards / f".{job}-{n}.npz"
            np.savez(tmp, games=np.array(shard, dtype=np.int32))
            os.replace(tmp, shards / f"{job}-{n}.npz")  # sealed: written once, renamed into place
            shard = []
        time.sleep(0.2)
    print(f"selfplay {ns.config}: {n} games")


if __name__ == "__main__":
    main()
