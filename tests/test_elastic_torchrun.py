"""An elastic torchrun gang on the real engine (issue 41, item 4), on loopback: three members launched with the exact
command line and environment p2pnode gives an elastic ``2:3`` gang's members (:func:`p2pnode.node._engines.
engine_command`), running deploy/examples/ddp_elastic.py (gloo all-reduces in steps). SIGKILL of the member that does
not host the rendezvous (its launcher and its worker): the other two go on with a world of 2, their steps rising from
where they were (never step 0 again); the member started again joins, and the three go on with a world of 3. What
p2pnode itself decides around it (the gang kept, a member placed back) is tested in tests/test_gangs_elastic.py.

It needs torch in the engines environment (``.engines``, made by ``.ci/engines``) and is skipped without it."""

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest
from agents import wait_until

from p2pnode.node._engines import engine_command
from p2pnode.snapshot import GangSlot

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ROOT / ".engines" / "bin" / "python"
SCRIPT = ROOT / "deploy" / "examples" / "ddp_elastic.py"
_STEP = re.compile(r"step (\d+) world (\d+) sum (\d+)")
_START = re.compile(r"start rank (\d+) of (\d+) at step (\d+)")


def _free_port_block(size: int = 192) -> int:
    """A first port such that ``size`` ports from it were free a moment ago (three members' blocks of 64)."""
    for base in range(29600, 40000, size):
        try:
            for p in (base, base + 64, base + 128):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    pytest.skip("no free port block on loopback")


def _kill_tree(p: subprocess.Popen) -> None:
    """``p`` and every process under it (torchrun's workers run in sessions of their own) killed."""
    try:
        kids = psutil.Process(p.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for pid in [p.pid, *(k.pid for k in kids)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    p.wait(timeout=30)


def test_an_elastic_gang_goes_on_without_a_member_and_takes_it_back(tmp_path):
    if not ENGINES.exists() or subprocess.run([str(ENGINES), "-c", "import torch.distributed.run"],
                                              capture_output=True, timeout=120).returncode != 0:
        pytest.skip(f"no torch in the engines environment {ENGINES} (`bash .ci/engines` makes it)")
    base = _free_port_block()
    procs: dict[int, subprocess.Popen] = {}

    def start(rank: int) -> None:
        slot = GangSlot(id="9-1", rank=rank, size=3, master="127.0.0.1", master_port=base, port_base=base + 64 * rank,
                        ports=64, engine="torchrun", min_size=2)
        argv, env = engine_command("torchrun", [str(SCRIPT), "--seconds", "600", "--step-s", "0.25"],
                                   python=str(ENGINES), slot=slot, num_gpus=0, num_cpus=1, memory_gib=1,
                                   own_host="127.0.0.1", ray_member="")
        home = tmp_path / f"m{rank}"
        home.mkdir(exist_ok=True)
        with open(tmp_path / f"m{rank}.log", "ab") as log:
            procs[rank] = subprocess.Popen(argv, env={**os.environ, **env, "P2PNODE_DATA_DIR": str(home)},
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def steps(rank: int = 0) -> list[tuple[int, int]]:
        """``(step, world)`` of every step rank 0's member printed, in order (the all-reduce of ones is checked)."""
        text = (tmp_path / f"m{rank}.log").read_text(errors="replace")
        out = []
        for m in _STEP.finditer(text):
            assert m.group(2) == m.group(3), m.group(0)  # the sum of ones is the world size
            out.append((int(m.group(1)), int(m.group(2))))
        return out

    try:
        for r in range(3):
            start(r)
        wait_until(lambda: sum(w == 3 for _, w in steps()) >= 4, 180, interval=0.5, what="steps with a world of 3")
        before = steps()[-1][0]
        _kill_tree(procs[2])  # the member that does not host the rendezvous, launcher and worker: as its node going
        two = wait_until(lambda: [s for s, w in steps() if w == 2][3:], 180, interval=0.5,
                         what="steps with a world of 2 after the kill")
        assert two[0] > before
        start(2)  # its node is back: the member joins the running gang
        wait_until(lambda: [s for s, w in steps() if w == 3 and s > two[-1]][3:], 180, interval=0.5,
                   what="steps with a world of 3 after the member joined")
        seen = steps()
        assert [s for s, _ in seen] == sorted(s for s, _ in seen)  # the steps only rose
        worlds = [w for _, w in seen]
        assert worlds[0] == 3 and 2 in worlds and worlds[-1] == 3
        starts = [(int(a), int(b), int(c)) for a, b, c in _START.findall((tmp_path / "m0.log").read_text())]
        assert [c for _, _, c in starts][0] == 0 and all(c > 0 for _, _, c in starts[1:]), starts  # no step 0 again
        joined = _START.findall((tmp_path / "m2.log").read_text())
        assert joined[-1][1] == "3" and int(joined[-1][2]) > 0, joined  # the new member took the gang's step
        print(f"[elastic torchrun] worlds {worlds[0]} -> 2 -> {worlds[-1]}, steps {seen[0][0]}..{seen[-1][0]}, "
              f"starts {starts}")
    finally:
        for p in procs.values():
            _kill_tree(p)
