"""Demo evaluation: plays the newest checkpoint against a random player and records the results."""

import argparse
import os
import random
import time

from _common import data_dir, games_db, play, run_for


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--seconds", type=float, default=15)
    ns = ap.parse_args()
    job = os.environ.get("P2PNODE_JOB_ID", "local")
    rng = random.Random(job)
    ckpts = sorted((data_dir(ns.config) / "checkpoints").glob("*.npz"))
    con = games_db(ns.config)
    con.execute("CREATE TABLE IF NOT EXISTS evals (job TEXT, checkpoint TEXT, wins INTEGER, games INTEGER, at REAL)")
    wins = games = 0
    for _ in run_for(ns.seconds):
        _, winner = play(rng)
        wins += winner
        games += 1
        time.sleep(0.2)
    con.execute("INSERT INTO evals VALUES (?, ?, ?, ?, ?)",
                (job, ckpts[-1].name if ckpts else "", wins, games, time.time()))
    con.commit()
    print(f"evaluate {ns.config}: {wins}/{games}")


if __name__ == "__main__":
    main()
