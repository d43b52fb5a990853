"""Demo training: reads the NPZ shards of a config, "fits" a model with numpy, writes checkpoints."""

import argparse
import os
import time

import numpy as np
from _common import data_dir, run_for


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ns = ap.parse_args()
    job = os.environ.get("P2PNODE_JOB_ID", "local")
    root = data_dir(ns.config)
    ckpts = root / "checkpoints"
    ckpts.mkdir(exist_ok=True)
    weights = np.zeros(64)
    step = 0
    for _ in run_for(ns.seconds):
        shards = sorted((root / "shards").glob("*.npz")) if (root / "shards").exists() else []
        games = [np.load(p)["games"] for p in shards[-20:]]
        if games:
            x = np.concatenate(games).astype(float)
            weights = 0.9 * weights + 0.1 * np.resize(x.mean(axis=0), 64)
        step += 1
        if step % 10 == 0:
            tmp = ckpts / f".{job}-{step}.npz"
            np.savez(tmp, weights=weights, step=step)
            os.replace(tmp, ckpts / f"{job}-{step}.npz")
        time.sleep(0.5)
    print(f"train {ns.config}: {step} steps")


if __name__ == "__main__":
    main()
