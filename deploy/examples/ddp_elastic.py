"""An elastic torchrun gang's smallest real work (p2pnode docs/gangs.md, ``members = "2:3"``): gloo all-reduces in
steps, on the CPU, that go on when a member is lost and when one joins.

p2pnode starts it on each member under ``python -m torch.distributed.run --nnodes MIN:MAX --rdzv-backend c10d ...``.
When a member is lost or joins, torchrun restarts the workers of every member with the new world size; each worker
then takes the gang's step as the largest any member holds (an all-reduce of each member's own step file, so a member
that just joined, with none, takes the others'), and goes on from there: the steps never start again at 0. Each step
is one all-reduce of ones, whose sum is the world size. Every worker prints ``step S world W`` at each step
(torchrun numbers the workers at each rendezvous: p2pnode's rank 0 member need not hold torchrun's rank 0). With
``P2PNODE_CHECKPOINT_DIR`` set (a ``[job.checkpoint]``), the first worker of p2pnode's rank 0 member (the node the plan
gave the training, whose checkpoints other nodes trust) writes ``step-<S>.json`` there by an atomic rename every
``--checkpoint-every`` steps; a run given ``P2PNODE_RESUME_FROM`` starts from the step in that file.

    python -m torch.distributed.run --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:29400 --rdzv-id demo ddp_elastic.py --seconds 10
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: a reader (or p2pnode's checkpoint watcher) never sees half a file


def _own_step(state: Path) -> int:
    """This member's step: its own state file, else the checkpoint it was given, else 0."""
    for path in (state, Path(os.environ.get("P2PNODE_RESUME_FROM", "") or "/nonexistent")):
        try:
            return int(json.loads(path.read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0, help="run this long (from this worker's start), then exit")
    ap.add_argument("--step-s", type=float, default=0.5, help="seconds between steps")
    ap.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (rank 0)")
    args = ap.parse_args()
    print(f"{time.strftime('%H:%M:%S')} worker up", flush=True)
    dist.init_process_group("gloo")  # env:// from torchrun's elastic agent: RANK, WORLD_SIZE, MASTER_*
    rank, world = dist.get_rank(), dist.get_world_size()
    home = Path(os.environ.get("P2PNODE_DATA_DIR") or ".")
    state = home / f"elastic-{os.environ.get('P2PNODE_GANG_ID', 'solo')}-{os.environ.get('LOCAL_RANK', '0')}.json"
    t = torch.tensor([float(_own_step(state))])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the gang's step: the largest any member holds
    step = int(t.item())
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"{time.strftime('%H:%M:%S')} start rank {rank} of {world} at step {step} (restart {restarts}, gang "
          f"{os.environ.get('P2PNODE_GANG_ID')}, resume from {os.environ.get('P2PNODE_RESUME_FROM') or 'none'})",
          flush=True)
    writer = os.environ.get("P2PNODE_GANG_RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"
    ckpt = os.environ.get("P2PNODE_CHECKPOINT_DIR", "")
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(args.step_s)
        ones = torch.ones(1)
        dist.all_reduce(ones)  # a lost member makes this fail: torchrun restarts the workers with the others
        step += 1
        _write(state, json.dumps({"step": step}))
        print(f"{time.strftime('%H:%M:%S')} step {step} world {world} sum {ones.item():g}", flush=True)
        if writer:
            if ckpt and step % max(1, args.checkpoint_every) == 0:
                Path(ckpt).mkdir(parents=True, exist_ok=True)
                _write(Path(ckpt) / f"step-{step}.json", json.dumps({"step": step, "world": world}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
