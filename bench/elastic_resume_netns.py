"""An elastic torchrun gang resumes from its checkpoint after the rendezvous host is lost (issue 41, acceptance line
3's last clause, with torchrun in network namespaces).

Four agents, each in its own namespace on one bridge: n0 durable without a GPU (the only node eligible to lead: the
leader, and the durable peer the gang's checkpoints sync to), n1-n3 ephemeral with 2 fake A100s each. A ``2:3``
torchrun gang of ``deploy/examples/ddp_elastic.py`` (gloo all-reduces in steps of 0.25 s) with ``[job.checkpoint]``:
p2pnode's rank-0 member writes ``step-<S>.json`` every 4 steps, which sync carries to n0. Once n0 holds a few of
them, every process of rank 0's namespace gets SIGKILL (the box vanishes, with the c10d rendezvous it hosts): the
gang ends on the survivors, the leader places it again on the two GPU nodes left, and each new member is started
with ``P2PNODE_RESUME_FROM``. A run holds when every member of the new gang starts (torchrun's ``start rank R of W
at step S``) from a checkpoint at least as new as the newest n0 held whole at the kill, and not from step 0.

    sudo .venv/bin/python bench/elastic_resume_netns.py --runs 3

Needs root, iproute2 and torch in ``.engines`` (``bash .ci/engines``). Every wait is on a condition, with a deadline;
everything a run builds is removed by it. Prints one JSON line per run and a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from agents import AgentProc, wait_until  # noqa: E402
from netns import NetnsLab, require_netns  # noqa: E402
from test_netns_elastic import CATALOG as ELASTIC_CATALOG  # noqa: E402
from test_netns_elastic import ENV as ELASTIC_ENV  # noqa: E402
from test_netns_gangs import _get, _lab_catalog, _log, _members, _tear_down, require_engine  # noqa: E402

from p2pnode.synccore import decode_signed_checkpoint  # noqa: E402

ENV = {**ELASTIC_ENV, "P2PNODE_SYNC_INTERVAL_S": "1", "P2PNODE_SYNC_SETTLE_S": "0.5"}
CATALOG = ELASTIC_CATALOG.replace('"--step-s", "0.25"]', '"--step-s", "0.25", "--checkpoint-every", "4"]') + """
[job.checkpoint]
dir = "ck/{config}"
grace_s = 30
"""
_START = re.compile(r"start rank \d+ of (\d+) at step (\d+) \(restart \d+, gang (\S+), resume from (\S+)\)")
_CK = re.compile(r"step-(\d+)\.json$")


def _start(lab: NetnsLab, base: Path, i: int, catalog: Path) -> AgentProc:
    if i == 0:
        args = ["--tag", "durable", "--tag", "voter"]
    else:
        args = ["--tag", "ephemeral", "--fake-gpus", "2xA100", "--join", f"{lab.addrs[0]}:8770"]
    return AgentProc(base / f"n{i}", 8770, "--no-mdns", "--catalog", str(catalog), *args, bind=lab.addrs[i],
                     prefix=lab.prefix_for(i), env={**os.environ, **ENV}).start()


def _held_steps(base: Path) -> list[int]:
    """Steps of the gang's checkpoints the durable node n0 holds whole now."""
    out = []
    for p in (base / "n0" / ".sync" / "held-checkpoints").glob("*.ck"):
        with contextlib.suppress(Exception):
            _, body = decode_signed_checkpoint(p.read_bytes())
            m = _CK.search(body.name)
            if m:
                out.append(int(m.group(1)))
    return out


def _kill_namespace(lab: NetnsLab, i: int) -> None:
    from test_netns_gangs import _ns_pids

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (pids := _ns_pids(lab, i)):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        time.sleep(0.05)


def run(base: Path, *, net: int) -> dict:
    catalog = _lab_catalog(base, CATALOG, "ddp_elastic.py")
    lab = NetnsLab(4, net=net, host_link=True)
    procs: list[AgentProc | None] = []
    try:
        procs = [_start(lab, base, i, catalog) for i in range(4)]
        gpu = [1, 2, 3]

        def gang(alive, size, not_gid=None):
            ms = [(i, j) for i, j in _members(lab, alive) if j["gang"]["id"] != not_gid]
            return len(ms) == size and len({j["gang"]["id"] for _, j in ms}) == 1 and ms

        t_start = time.monotonic()
        ms = wait_until(lambda: gang(gpu, 3), 240, interval=1, what="a torchrun gang of 3 running")
        gid = ms[0][1]["gang"]["id"]
        i0 = next(i for i, j in ms if j["gang"]["rank"] == 0)
        wait_until(lambda: len(_held_steps(base)) >= 2, 240, interval=0.5,
                   what="two of the gang's checkpoints held whole by the durable node")
        held = max(_held_steps(base))
        formed_s = time.monotonic() - t_start
        t0 = time.monotonic()
        _kill_namespace(lab, i0)
        held = max([held, *_held_steps(base)])  # (one more may have arrived before the kill took)
        alive = [i for i in gpu if i != i0]
        again = wait_until(lambda: gang(alive, 2, not_gid=gid), 240, interval=1,
                           what="the gang placed again on the two GPU nodes left")
        placed_s = time.monotonic() - t0

        def started():  # the members of the gang now (it may have been placed once more meanwhile)
            out = []
            for i, j in gang(alive, 2, not_gid=gid) or []:
                found = _START.findall(_log(lab, i, j["job_id"]))
                if not found:
                    return None
                world, step, _, resume = found[-1]
                out.append({"node": i, "rank": j["gang"]["rank"], "world": int(world), "step": int(step),
                            "resume": resume, "gang": j["gang"]["id"]})
            return out or None
        try:
            starts = wait_until(started, 300, interval=1, what="every member of the new gang started its steps")
        except AssertionError as exc:
            logs = {f"n{i} {j['job_id']}": _log(lab, i, j["job_id"])[-800:] for i, j in _members(lab, alive)}
            raise AssertionError(f"{exc}; placed again {[(i, j['job_id']) for i, j in again]}; now {logs}") from None
        resumed_s = time.monotonic() - t0
        leader = _get(lab, 0, "/jobs")["leader"]
        ok = all(s["resume"] != "none" and s["step"] >= held > 0 for s in starts)
        return {"ok": ok, "held_at_kill": held, "starts": starts, "formed_s": round(formed_s, 1),
                "placed_again_s": round(placed_s, 1), "resumed_s": round(resumed_s, 1),
                "leader_is_durable": leader == _get(lab, 0, "/status")["node"]["id"]}
    finally:
        _tear_down(lab, procs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="runs, one after another")
    a = ap.parse_args()
    require_netns()
    require_engine("torch.distributed.run")
    results = []
    for k in range(a.runs):
        with tempfile.TemporaryDirectory(prefix="p2pnode-elastic-resume-") as d:
            try:
                r = run(Path(d), net=48 + k % 4)
            except AssertionError as exc:
                r = {"ok": False, "error": str(exc)[:400]}
        print(json.dumps(r), flush=True)
        results.append(r)
    held = sum(r["ok"] for r in results)
    print(f"[elastic resume] {held} of {len(results)} runs: every member of the gang placed again resumed from a "
          "checkpoint at least as new as the durable node's at the kill", flush=True)
    return 0 if held == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
