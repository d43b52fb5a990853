"""A gang's checkpoint follows the gang, with real agents on loopback (issue 41, acceptance line 3's second half, with
the cheap ``process`` engine instead of torchrun): one durable node without a GPU (the only voter: the leader),
three ephemeral nodes with a fake GPU each. A gang of 2 of a training with ``[job.checkpoint]``: its rank-0 member
writes a checkpoint holding its step every second (by atomic rename); its rank-1 member writes decoys with far
larger steps into its own checkpoint dir (synced, never announced: a gang's checkpoints are rank 0's). kill -9 of
rank 0's node (the agent and the member's process group): the gang ends and is placed again on the two other nodes,
and both of its members start with ``P2PNODE_RESUME_FROM`` holding a checkpoint of rank 0's at least as new as the
one the durable node held at the kill. Every wait is on a condition, with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

import pytest
from agents import AgentProc, free_port, wait_until

pytestmark = pytest.mark.slow

DECOY = 1_000_000
MEMBER = r'''
import json, os, sys, time
log, ck = sys.argv[1], os.environ["P2PNODE_CHECKPOINT_DIR"]
rank = int(os.environ["P2PNODE_GANG_RANK"])
resume = os.environ.get("P2PNODE_RESUME_FROM", "")
step = int(open(resume).read()) if resume else 0
with open(log, "a") as f:
    f.write(json.dumps({"job": os.environ["P2PNODE_JOB_ID"], "node": os.environ["P2PNODE_NODE_ID"],
                        "gang": os.environ["P2PNODE_GANG_ID"], "rank": rank, "resume": resume, "step": step,
                        "pid": os.getpid(), "t": time.time()}) + "\n")
os.makedirs(ck, exist_ok=True)
while True:
    time.sleep(1.0)
    step += 1
    tmp = os.path.join(ck, ".step.tmp")
    with open(tmp, "w") as f:
        f.write(str(step if rank == 0 else DECOY + step))
    os.replace(tmp, os.path.join(ck, f"step-{step if rank == 0 else DECOY + step:08d}"))
'''.replace("DECOY", str(DECOY))

CATALOG = """
[[job]]
name = "ddp"
kind = "training"
config = "c"
engine = "process"
max_concurrency = 1
argv = ["{python}", "MEMBER", "LOG"]
[job.gang]
members = 2
[job.resources]
num_gpus = 1
vram_gib = 4
num_cpus = 0.1
[job.checkpoint]
dir = "ck/{config}"
grace_s = 30
"""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_SCHEDULER_ORPHAN_GRACE_S": "3", "P2PNODE_SCHEDULER_ADOPT_GRACE_S": "5",
       "P2PNODE_SYNC_INTERVAL_S": "1", "P2PNODE_SYNC_SETTLE_S": "0.5", "P2PNODE_SCHEDULER_GANG_PORTS": "31200-31455",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}


def members(p) -> list[dict]:
    return [j for j in p.get("/jobs")["running"] if j["template"] == "ddp"]


def starts(log) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_kill_9_of_rank_0s_node_places_the_gang_again_and_every_member_resumes_from_rank_0s_checkpoint(tmp_path):
    member, log = tmp_path / "member.py", tmp_path / "starts.log"
    member.write_text(MEMBER)
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG.replace("MEMBER", str(member)).replace("LOG", str(log)))
    env = {**os.environ, **ENV}
    d = AgentProc(tmp_path / "durable", free_port(), "--no-mdns", "--catalog", str(cat), "--tag", "durable",
                  "--tag", "voter", env=env).start()
    procs = [d]
    try:
        d.wait_ready()
        for name in ("e1", "e2", "e3"):
            procs.append(AgentProc(tmp_path / name, free_port(), "--no-mdns", "--catalog", str(cat), "--tag",
                                   "ephemeral", "--fake-gpus", "RTX 4090", "--join", f"127.0.0.1:{d.port}",
                                   env=env).start())
        for p in procs[1:]:
            p.wait_ready()
        eph = procs[1:]
        ids = {p.status()["node"]["id"]: p for p in eph}

        def gang_running(not_gang: str = ""):
            ms = [(p, j) for p in eph for j in members(p) if j["gang"]["id"] != not_gang]
            whole = len(ms) == 2 and all(j.get("pid") for _, j in ms) and len({j["gang"]["id"] for _, j in ms}) == 1
            return whole and ms

        ms = wait_until(gang_running, 180, interval=0.5, what="the gang of 2 running")
        gid = ms[0][1]["gang"]["id"]
        first, j0 = next((p, j) for p, j in ms if j["gang"]["rank"] == 0)
        wait_until(lambda: len(starts(log)) >= 2, 30, what="both members' start lines")
        assert all(s["resume"] == "" for s in starts(log)), starts(log)  # nothing to resume yet

        def durable_holds(min_step: int):
            newest = d.get("/sync/status")["checkpoints"]["newest"].get("c")
            mine = d.status()["snapshot"]["sync"].get("checkpoints") or []
            held = newest is not None and any(r["digest"] == newest["digest"] for r in mine)
            return held and int(newest["name"].split("-")[1]) >= min_step and newest

        held_at_kill = wait_until(lambda: durable_holds(5), 120, interval=0.5,
                                  what="the durable node holding a checkpoint of rank 0's")
        held_step = int(held_at_kill["name"].split("-")[1])
        assert held_step < DECOY and held_at_kill["job_id"] == gid, held_at_kill  # rank 0's: its job id is the gang's
        # kill -9 rank 0's node: its agent and its member's process group
        killed_at = time.time()
        first.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(j0["pid"]), signal.SIGKILL)
        ck_dir = first.data_dir / "data" / "ck" / "c"
        last_written = max(int(p.name.split("-")[1]) for p in ck_dir.glob("step-*"))
        assert last_written < DECOY
        alive = [p for p in eph if p is not first]

        def placed_again():
            ms = [(p, j) for p in alive for j in members(p) if j["gang"]["id"] != gid]
            new = [s for s in starts(log) if s["gang"] != gid]
            return len(ms) == 2 and all(j.get("pid") for _, j in ms) and len(new) == 2 and new

        new = wait_until(placed_again, 240, interval=0.5, what="the gang placed again on the two other nodes")
        assert sorted(s["rank"] for s in new) == [0, 1] and {ids[s["node"]] for s in new} == set(alive)
        for s in new:
            assert s["resume"], f"rank {s['rank']} started from nothing: {s}"
            assert s["resume"].startswith(str(ids[s["node"]].data_dir / "resume")), s  # fetched, outside its dir
            assert held_step <= s["step"] <= last_written, (held_step, s, last_written)  # rank 0's, never a decoy
        assert len({s["step"] for s in new}) == 1, new  # every rank from the same checkpoint
        print(f"FIGURES held_at_kill={held_step} resumed_from={new[0]['step']} last_written={last_written} "
              f"replaced_after_s={max(s['t'] for s in new) - killed_at:.1f}")
    finally:
        for p in procs:
            p.kill()
        for s in starts(log):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(s["pid"]), signal.SIGKILL)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
