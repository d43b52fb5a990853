"""An elastic torchrun gang across network namespaces (issue 41, item 4): three agents (fake GPUs), a ``2:3`` gang of
deploy/examples/ddp_elastic.py (gloo all-reduces in steps). SIGKILL of the namespace of a member that does not host
the rendezvous (nor the leader): the gang is not ended, the other two go on with a world of 2 and rising steps (never
step 0 again), the leader's gang table marks the member lost; the agent started again gets a member back, which
joins (a world of 3). SIGKILL of the rendezvous host's namespace: the gang ends on the survivors (``member_down``,
"rank 0 hosts the rendezvous", or ``member_gone`` when the survivors' launchers fail first, left below the minimum)
and is placed again. Not here: that it resumes from its checkpoint (this lab has no durable node, so rank 0's
checkpoints have no copy once its node is gone): ``bench/elastic_resume_netns.py`` adds a durable node and shows
every member of the torchrun gang placed again resuming from rank 0's newest checkpoint the durable node held, and,
with the ``process`` engine on loopback, tests/test_checkpoint_gang_agents.py in the suite.
Needs torch in ``.engines`` (``.ci/engines``), root and iproute2."""

import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from agents import AgentProc, wait_until
from netns import NetnsLab, require_netns
from test_netns_gangs import ENGINES, _get, _lab_catalog, _log, _members, _ns_pids, _tear_down, require_engine

pytestmark = [pytest.mark.netns, pytest.mark.slow]

ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1", "P2PNODE_LOG_LEVEL": "info",
       "P2PNODE_SCHEDULER_STOP_GRACE_S": "3", "P2PNODE_SCHEDULER_ADOPT_GRACE_S": "6",
       "P2PNODE_SCHEDULER_ORPHAN_GRACE_S": "5", "P2PNODE_JOBS_ENGINES": f"torchrun={ENGINES}"}
CATALOG = """[[job]]
name = "ddpe"
kind = "training"
config = "ddpe_c"
engine = "torchrun"
argv = ["{catalog_dir}/ddp_elastic.py", "--seconds", "900", "--step-s", "0.25"]
max_concurrency = 1
max_runtime_s = 1800
[job.gang]
members = "2:3"
[job.resources]
num_gpus = 1
vram_gib = 8
num_cpus = 0.5
memory_gib = 1
"""
_STEP = re.compile(r"step (\d+) world (\d+) sum (\d+)")
_START = re.compile(r"start rank \d+ of (\d+) at step (\d+)")


def _start(lab, tmp_path: Path, i: int, catalog: Path) -> AgentProc:
    args = ["--fake-gpus", "2xA100", "--catalog", str(catalog), "--no-mdns"]
    if i:
        args += ["--join", f"{lab.addrs[0]}:8770"]
    return AgentProc(tmp_path / f"n{i}", 8770, *args, bind=lab.addrs[i], prefix=lab.prefix_for(i), env=ENV).start()


def _kill_namespace(lab, i: int) -> None:
    for pid in _ns_pids(lab, i):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _steps(text: str) -> list[tuple[int, int]]:
    out = []
    for m in _STEP.finditer(text):
        assert m.group(2) == m.group(3), m.group(0)  # the all-reduce of ones sums to the world size
        out.append((int(m.group(1)), int(m.group(2))))
    return out


def _table(lab, i: int, gid: str) -> dict:
    """The leader's gang table entry of ``gid`` (from the plan node ``i`` serves)."""
    plan = _get(lab, i, "/plan").get("plan") or {}
    return next((g for g in plan.get("gangs") or [] if g["id"] == gid), {})


def test_an_elastic_gang_keeps_running_without_a_member_and_takes_one_back(tmp_path):
    require_netns()
    require_engine("torch.distributed.run")
    catalog = _lab_catalog(tmp_path, CATALOG, "ddp_elastic.py")
    lab = NetnsLab(3, net=9, host_link=True)
    procs: list[AgentProc | None] = []
    try:
        procs = [_start(lab, tmp_path, i, catalog) for i in range(3)]
        alive = [0, 1, 2]

        def gang(size=3, gid=None):
            ms = [(i, j) for i, j in _members(lab, alive) if gid is None or j["gang"]["id"] == gid]
            return len(ms) == size and len({j["gang"]["id"] for _, j in ms}) == 1 and ms

        def wait(pred, timeout, what):  # on a time-out, what the gang was doing
            try:
                return wait_until(pred, timeout, interval=1, what=what)
            except AssertionError as exc:
                logs = {i: _log(lab, i, j["job_id"])[-1500:] for i, j in _members(lab, alive)}
                raise AssertionError(f"{exc}; gang table {_table(lab, alive[0], gid)}; members' logs {logs}") from None

        gid = ""
        ms = wait(gang, 180, "an elastic torchrun gang of 3 running")
        gid = ms[0][1]["gang"]["id"]
        i0, j0 = next((i, j) for i, j in ms if j["gang"]["rank"] == 0)

        def rank0_steps():
            return _steps(_log(lab, i0, j0["job_id"]))

        wait(lambda: sum(w == 3 for _, w in rank0_steps()) >= 4, 180, "steps in a world of 3")
        leader = _get(lab, i0, "/jobs")["leader"]
        ids = {i: _get(lab, i, "/jobs")["node_id"] for i in alive}
        victim = next(i for i, j in ms if j["gang"]["rank"] != 0 and ids[i] != leader)  # neither host nor leader
        rank = next(j["gang"]["rank"] for i, j in ms if i == victim)
        before = rank0_steps()[-1][0]
        t0 = time.monotonic()
        _kill_namespace(lab, victim)
        alive.remove(victim)
        two = wait(lambda: [s for s, w in rank0_steps() if w == 2][3:], 240, "the two survivors' steps in a world of 2")
        took = time.monotonic() - t0
        assert two[0] > before and gang(2, gid), "the gang was ended"
        entry = wait_until(lambda: (e := _table(lab, i0, gid)) and e["members"][rank]["state"] == "lost" and e, 60,
                           interval=1, what="the leader's gang table marking the member lost")
        assert entry["state"] == "running" and entry["min_size"] == 2, entry
        print(f"[netns elastic] SIGKILL of a member's namespace: world 2 after {took:.1f} s, steps {before} -> "
              f"{two[0]}")

        t0 = time.monotonic()
        procs[victim] = _start(lab, tmp_path, victim, catalog)  # its node is back: a member is placed back there
        alive.append(victim)
        ms3 = wait(lambda: gang(3, gid), 180, "a member placed back into the gang")
        back = next(j for i, j in ms3 if i == victim)
        assert back["gang"]["rank"] == rank and back["job_id"] != next(j["job_id"] for i, j in ms if i == victim)
        three = wait(lambda: [s for s, w in rank0_steps() if w == 3 and s > two[-1]][3:], 240,
                     "steps in a world of 3 again")
        took = time.monotonic() - t0
        seen = rank0_steps()
        assert [s for s, _ in seen] == sorted(s for s, _ in seen)  # the steps only rose
        starts = _START.findall(_log(lab, i0, j0["job_id"]))
        assert starts[0][1] == "0" and all(int(s) > 0 for _, s in starts[1:]), starts  # never step 0 again
        joined = _START.findall(_log(lab, victim, back["job_id"]))
        assert joined and joined[-1][0] == "3" and int(joined[-1][1]) > 0, joined
        assert _table(lab, i0, gid)["members"][rank]["state"] == "running"
        print(f"[netns elastic] the node back: a member joined, world 3 after {took:.1f} s, steps on to {three[0]}")

        # SIGKILL of the rendezvous host (rank 0's namespace): the gang ends on the survivors and is placed again.
        t0 = time.monotonic()
        _kill_namespace(lab, i0)
        alive.remove(i0)
        wait_until(lambda: not any(j["gang"]["id"] == gid for _, j in _members(lab, alive)), 120, interval=0.5,
                   what="the gang ended on the survivors")
        took = time.monotonic() - t0
        ended = wait_until(lambda: next((e for i in alive if (e := _table(lab, i, gid)).get("state") == "ended"),
                                        None), 60, interval=1, what="the gang table's end of the gang")
        # (which is seen first: rank 0's node declared dead, or the survivors' launchers failing without their store)
        assert ended["cause"] in ("member_down", "member_gone") and (
            "rank 0 hosts the rendezvous" in ended["reason"] or "below the minimum 2" in ended["reason"]), ended
        again = wait_until(lambda: (ms := [(i, j) for i, j in _members(lab, alive) if j["gang"]["id"] != gid])
                           and len(ms) == 2 and ms, 180, interval=1, what="the gang placed again on the two nodes")
        print(f"[netns elastic] SIGKILL of the rendezvous host: ended in {took:.1f} s ({ended['cause']}: "
              f"{ended['reason']}), placed again as {again[0][1]['gang']['id']} with 2 members")
    finally:
        _tear_down(lab, procs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-s"]))
