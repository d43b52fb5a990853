"""Job supervision in-process: the ledger and exit files, re-adoption after the agent, a clean stop that stops or
leaves, per-job memory cgroups (fake, and the host's where writable), the planner's duplicate-training rule."""

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
import trio
from msgspec.structs import replace
from stops import RulesOnRunner

from p2pnode.jobs import JobHistory, JobRunner
from p2pnode.jobs._cgroup import CgroupFs, detect
from p2pnode.jobs._ledger import JobLedger, exit_status_of, process_alive, process_start_ticks
from p2pnode.jobs._runner import SHUTDOWN_REASON
from p2pnode.scheduler import ClusterView, GpuView, NodeView, RunningJob, parse_catalog, plan
from p2pnode.snapshot import plan_job_id


def _template(script, **kw):
    job = {"name": "t", "kind": "selfplay", "config": "c", "argv": ["sh", str(script)], "env": ["PATH"]}
    job.update(kw)
    return parse_catalog({"job": [job]}).templates["t"]


def _script(tmp_path, body, name="job.sh"):
    p = tmp_path / name
    p.write_text(body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def _runner(tmp_path, history, **kw):
    kw.setdefault("cgroups", None)
    return JobRunner(node_id="n1", data_dir=tmp_path / "d", history=history, grace_s=1.0, **kw)


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


async def _until(pred, timeout=10):
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.05)


def _start(runner, job_id, template, term=1):
    runner.start(job_id=job_id, template=template, params={}, gpus=(0,), gpu_fraction=0.5, vram_gib=4.0, term=term)


async def test_ledger_then_exit_file_then_history(tmp_path):
    script = _script(tmp_path, "sleep 0.5\nexit 3\n")
    history = JobHistory(tmp_path / "jobs.db")
    runner = _runner(tmp_path, history)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        _start(runner, "j1", _template(script))
        (e,) = runner.ledger.entries()  # recorded before it counts as started
        assert (e.job_id, e.pid, e.template, e.gpus, e.term) == ("j1", runner.jobs["j1"].proc.pid, "t", (0,), 1)
        assert e.start_ticks == process_start_ticks(e.pid) and process_alive(e.pid, e.start_ticks)
        assert not process_alive(e.pid, e.start_ticks + 1)  # a pid is an identity only with its start time
        await _until(lambda: "j1" not in runner.jobs)
        nursery.cancel_scope.cancel()
    (run,) = history.recent()
    assert (run["exit_status"], run["reason"]) == (3, "failed with status 3")
    assert runner.ledger.entries() == [] and not list((tmp_path / "d" / "jobs").glob("*.exit"))


async def test_clean_stop_stops_every_job_and_says_so(tmp_path):
    stubborn = _script(tmp_path, "trap '' TERM\nwhile true; do sleep 0.1; done\n", "stubborn.sh")
    polite = _script(tmp_path, "exec sleep 30\n", "polite.sh")
    history = JobHistory(tmp_path / "jobs.db")
    runner = _runner(tmp_path, history)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        _start(runner, "a", _template(stubborn))
        _start(runner, "b", _template(polite))
        await trio.sleep(0.3)
        pids = {j: runner.jobs[j].proc.pid for j in ("a", "b")}
        kids = {p: _children(p) for p in pids.values()}
        t0 = time.monotonic()
        nursery.cancel_scope.cancel()  # the agent stops (on_agent_stop = "stop")
    took = time.monotonic() - t0
    assert took < 3.5, took  # grace 1 s for the stubborn one, then SIGKILL
    for pid in [*pids.values(), *(c for k in kids.values() for c in k)]:
        assert not process_alive(pid, None), pid  # checked against /proc, not only the runner's view
    runs = {r["job_id"]: r for r in history.recent()}
    assert runs["a"]["reason"] == runs["b"]["reason"] == "stopped: agent shutdown"
    assert runs["b"]["exit_status"] == -signal.SIGTERM and runs["a"]["exit_status"] == -signal.SIGKILL
    assert runner.ledger.entries() == []


async def test_leave_then_readopt_same_pid_and_learn_the_exit_status(tmp_path):
    flag = tmp_path / "go"
    script = _script(tmp_path, f"while [ ! -e {flag} ]; do sleep 0.05; done\nexit 7\n")
    history = JobHistory(tmp_path / "jobs.db")
    first = _runner(tmp_path, history, on_agent_stop="leave")
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        _start(first, "j1", _template(script), term=4)
        pid = first.jobs["j1"].proc.pid
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert process_alive(pid, process_start_ticks(pid))  # left running
    assert history.recent()[0]["ended_at"] is None
    second = _runner(tmp_path, history, templates={"t": _template(script)})
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        job = second.jobs["j1"]
        assert (job.proc.pid, job.adopted, job.term, job.gpus) == (pid, True, 4, (0,))
        flag.touch()
        await _until(lambda: "j1" not in second.jobs)
        nursery.cancel_scope.cancel()
    run = history.recent()[0]
    assert (run["exit_status"], run["reason"]) == (7, "failed with status 7")
    os.waitpid(pid, 0)  # it was the first runner's child (this process): reap it


async def test_jobs_gone_while_the_agent_was_down_get_an_honest_end(tmp_path):
    history = JobHistory(tmp_path / "jobs.db")
    first = _runner(tmp_path, history, on_agent_stop="leave")
    quick = _script(tmp_path, "sleep 0.3\nexit 5\n", "quick.sh")
    slow = _script(tmp_path, "exec sleep 30\n", "slow.sh")
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        _start(first, "ended", _template(quick))
        _start(first, "killed", _template(slow))
        pids = {j: first.jobs[j].proc.pid for j in ("ended", "killed")}
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    os.killpg(pids["killed"], signal.SIGKILL)  # gone without a word (as a host OOM kill of the wrapper would)
    for pid in pids.values():
        os.waitpid(pid, 0)
    second = _runner(tmp_path, history)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        assert second.jobs == {}
        nursery.cancel_scope.cancel()
    runs = {r["job_id"]: r for r in history.recent()}
    assert runs["ended"]["exit_status"] == 5
    assert runs["ended"]["reason"] == "failed with status 5 while the agent was down"
    assert (runs["killed"]["exit_status"], runs["killed"]["reason"]) == (None, "lost while the agent was down")
    assert second.ledger.entries() == []


async def test_an_intent_row_finds_its_wrapper(tmp_path):
    """The agent died between spawning a job and recording its pid: the wrapper is found by its exit file."""
    history = JobHistory(tmp_path / "jobs.db")
    first = _runner(tmp_path, history, on_agent_stop="leave")
    slow = _script(tmp_path, "exec sleep 30\n")
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        _start(first, "j1", _template(slow))
        pid = first.jobs["j1"].proc.pid
        nursery.cancel_scope.cancel()
    (e,) = first.ledger.entries()
    ledger = JobLedger(tmp_path / "d" / "jobs" / "ledger.db")
    ledger.put(replace(e, pid=None, start_ticks=None))
    second = _runner(tmp_path, history, templates={"t": _template(slow)})
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        assert second.jobs["j1"].proc.pid == pid
        nursery.cancel_scope.cancel()  # stop: the re-adopted job is stopped too
    assert not process_alive(pid, None) or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    os.waitpid(pid, 0)
    assert history.recent()[0]["reason"] == "stopped: agent shutdown"


def test_exit_file_statuses(tmp_path):
    f = tmp_path / "x.exit"
    assert exit_status_of(f) is None
    for text, status in (("0", 0), ("3\n", 3), ("137", -9), ("143", -15), ("255", 255), ("junk", None)):
        f.write_text(text)
        assert exit_status_of(f) == status


class FakeCgroups:
    version = 2

    def __init__(self, root: Path):
        self.root = root
        self.made: dict[str, int] = {}
        self.removed: list[str] = []

    def create(self, name, limit_bytes):
        path = self.root / name
        path.mkdir()
        self.made[name] = limit_bytes
        return str(path)

    def join_file(self, path):
        return str(Path(path) / "cgroup.procs")

    def holds(self, path, pid):  # a cgroup removed meanwhile holds nothing (as the real one reads it)
        try:
            return (Path(path) / "cgroup.procs").read_text().strip() == str(pid)
        except OSError:
            return False

    def oom_kills(self, path):
        return 1 if (Path(path) / "oom").exists() else 0

    def peak_bytes(self, path):
        return 123

    def release(self):
        pass

    def sweep(self, keep):
        return 0

    def remove(self, path):
        for f in Path(path).iterdir():
            f.unlink()
        os.rmdir(path)
        self.removed.append(path)
        return True


async def test_a_job_runs_in_its_cgroup_and_an_oom_kill_is_a_memory_limit(tmp_path):
    fake = FakeCgroups(tmp_path / "cg")
    fake.root.mkdir()
    script = _script(tmp_path, "sleep 0.3\nexit 137\n")
    history = JobHistory(tmp_path / "jobs.db")
    runner = _runner(tmp_path, history, cgroups=fake, memory_limit_gib=8.0)
    rules = RulesOnRunner(runner)  # the OOM kill the runner saw at the job's exit names its end by the memory rule
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await nursery.start(rules.run)
        _start(runner, "big", _template(script, resources={"memory_gib": 2}))
        _start(runner, "plain", _template(script))
        job = runner.jobs["big"]
        assert fake.holds(job.cgroup, job.proc.pid)  # joined between fork and exec
        assert fake.made == {"big": 2 * 2**30, "plain": 8 * 2**30}  # the catalog's memory_gib, else the node's
        (Path(job.cgroup) / "oom").touch()
        await _until(lambda: not runner.jobs)
        nursery.cancel_scope.cancel()
    runs = {r["job_id"]: r for r in history.recent()}
    assert runs["big"]["reason"] == "memory limit: killed by the kernel at its cgroup limit of 2 GiB (memory_gib of t)"
    assert runs["plain"]["reason"] == "failed with status -9"
    assert len(fake.removed) == 2 and [(e.job_id, e.rule) for e in rules.stops] == [("big", "memory_limit")]


def test_cgroup_detection_finds_the_controller_not_the_mount(tmp_path):
    unified, v1 = tmp_path / "unified", tmp_path / "memory"
    for d in (unified, v1 / "agent"):
        d.mkdir(parents=True)
    (unified / "cgroup.controllers").write_text("hugetlb\n")  # a cgroup2 mount without the memory controller
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"41 31 0:38 / {unified} rw,relatime - cgroup2 cgroup2 rw\n"
                         f"35 31 0:32 / {v1} rw,relatime - cgroup cgroup rw,memory\n")
    own = tmp_path / "cgroup"
    own.write_text("4:memory:/agent\n0::/\n")
    cg = detect(mountinfo=mountinfo, proc_cgroup=own, node_dir="n1")
    assert cg == CgroupFs(1, v1 / "agent" / "p2pnode-jobs" / "n1")
    (cg.base / "left-behind").mkdir()
    (cg.base / "running").mkdir()
    assert cg.sweep({str(cg.base / "running")}) == 1 and [d.name for d in cg.base.iterdir()] == ["running"]
    (unified / "cgroup.controllers").write_text("cpu memory pids\n")  # now v2 has it: preferred
    (unified / "cgroup.subtree_control").write_text("")
    cg = detect(mountinfo=mountinfo, proc_cgroup=own, node_dir="n1")
    assert cg is not None and cg.version == 2 and cg.base == unified / "p2pnode-jobs" / "n1"
    path = cg.create("j1", 2**30)
    assert (Path(path) / "memory.max").read_text() == str(2**30)
    (Path(path) / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert cg.oom_kills(path) == 1


HOG = "import sys, time\nb = bytearray(int(sys.argv[1]) * 2**20)\nb[::4096] = b'x' * len(b[::4096])\ntime.sleep(30)\n"


async def test_the_hosts_memory_cgroup_stops_a_hog(tmp_path):
    cg = detect(node_dir="test-supervision")
    if cg is None:
        pytest.skip("no writable memory cgroup controller on this host (v2 memory.max or v1 memory)")
    hog = tmp_path / "hog.py"
    hog.write_text(HOG)
    t = parse_catalog({"job": [{"name": "hog", "kind": "selfplay", "config": "c",
                                "argv": [sys.executable, str(hog), "400"],
                                "resources": {"memory_gib": 0.125}}]}).templates["hog"]
    history = JobHistory(tmp_path / "jobs.db")
    runner = JobRunner(node_id="n1", data_dir=tmp_path / "d", history=history, grace_s=1.0, cgroups=cg,
                       memory_check_interval_s=60)  # the samples too slow to matter: the kernel acts
    rules = RulesOnRunner(runner)  # and the memory rule names the end by the OOM kill seen at its exit
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await nursery.start(rules.run)
        runner.start(job_id="hog1", template=t, params={}, gpus=(), gpu_fraction=0.0, vram_gib=0.0, term=1)
        path = runner.jobs["hog1"].cgroup
        assert path and cg.holds(path, runner.jobs["hog1"].proc.pid)
        await _until(lambda: not runner.jobs, timeout=15)
        nursery.cancel_scope.cancel()
    run = history.recent()[0]
    assert run["reason"].startswith("memory limit: killed by the kernel at its cgroup limit of 0.125 GiB"), run
    assert not os.path.exists(path) and not cg.base.exists()  # cleaned up


def _view(*running):
    nodes = {n: NodeView(n, (GpuView(0, 80.0),), frozenset(), 0.0, False, 1, 0, 10.0, 90.0) for n in ("a", "b")}
    return ClusterView(nodes, tuple(running))


def test_the_planner_stops_a_duplicate_training_and_keeps_the_older():
    cat = parse_catalog({"job": [{"name": "train-c", "kind": "training", "config": "c", "argv": ["x"],
                                  "resources": {"num_gpus": 1, "vram_gib": 40}}]})
    readopted = RunningJob("3-1", "train-c", "a", (0,), 1.0, 40.0, 0.0, 3)
    placed = RunningJob("7-2", "train-c", "b", (0,), 1.0, 40.0, 0.0, 7)
    p = plan(_view(placed, readopted), cat, {}, 0.0, term=8)
    assert [(s.job_id, s.node_id) for s in p.stops] == [("7-2", "b")]
    assert p.stops[0].reason.startswith("duplicate training of c: 3-1 on a (term 3) runs it")
    assert not p.assignments
    assert plan(_view(readopted), cat, {}, 0.0, term=8).stops == ()


def test_a_leader_restarted_within_its_term_gives_no_running_id_to_new_work():
    cat = parse_catalog({"job": [{"name": "play", "kind": "selfplay", "config": "c", "argv": ["x"],
                                  "max_concurrency": 4, "resources": {"num_gpus": 0.5, "vram_gib": 4}}]})
    readopted = RunningJob("2-2", "play", "a", (0,), 0.5, 4.0, 0.0, 2, plan_job_id("2-2"))  # as node_plans builds it
    p = plan(_view(readopted), cat, {}, 0.0, term=2)  # a fresh planner state, as after a restart
    assert p.assignments and all(int(a.job_id.split("-")[1]) > 2 for a in p.assignments)


async def test_readopt_before_run_lists_the_jobs_at_once_and_run_watches_them(tmp_path):
    """The agent re-adopts before its first snapshot (a leader that saw it without its jobs placed a second
    training of their config, caught by the suite): the jobs are listed before the runner runs; run() watches
    them, and the stop rules stop the one whose template left the catalog (rule ``template_removed``)."""
    flag = tmp_path / "go"
    script = _script(tmp_path, f"while [ ! -e {flag} ]; do sleep 0.05; done\nexit 5\n")
    gone = _script(tmp_path, "exec sleep 30\n", "gone.sh")
    history = JobHistory(tmp_path / "jobs.db")
    first = _runner(tmp_path, history, on_agent_stop="leave")
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        _start(first, "j1", _template(script), term=4)
        old = parse_catalog({"job": [{"name": "old", "kind": "selfplay", "config": "c", "argv": ["sh", str(gone)],
                                       "env": ["PATH"]}]}).templates["old"]
        _start(first, "j2", old, term=4)
        pids = {j: first.jobs[j].proc.pid for j in ("j1", "j2")}
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    second = _runner(tmp_path, history, templates={"t": _template(script)})
    second.readopt()  # no nursery yet: listed now, watched from run()
    assert {j: second.jobs[j].proc.pid for j in second.jobs} == pids
    rules = RulesOnRunner(second)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        assert set(second.jobs) == {"j1", "j2"}  # run() re-adopts nothing twice
        await nursery.start(rules.run)
        await _until(lambda: "j2" not in second.jobs)  # its template left the catalog: stopped
        flag.touch()
        await _until(lambda: "j1" not in second.jobs)  # watched: its end is seen
        nursery.cancel_scope.cancel()
    runs = {r["job_id"]: r for r in history.recent()}
    assert (runs["j1"]["exit_status"], runs["j1"]["reason"]) == (5, "failed with status 5")
    assert runs["j2"]["reason"] == "template 'old' is no longer in the catalog"
    assert [(e.job_id, e.rule) for e in rules.stops] == [("j2", "template_removed")]
    for pid in pids.values():
        os.waitpid(pid, 0)  # the first runner's children (this process): reap them


class _FakeV2Kernel:
    """cgroup v2's rules over a directory tree (files stand in for the control files): a process is in exactly one
    cgroup (writing a pid into ``cgroup.procs`` moves it), and ``+memory`` in ``cgroup.subtree_control`` is refused
    with EBUSY while that cgroup holds a process ("no internal processes"), or with EACCES outside ``delegated``."""

    def __init__(self, root, delegated):
        self.root, self.delegated = root, delegated

    @staticmethod
    def _text(path):  # a new cgroup's control files exist, empty, as the kernel makes them
        return path.read_text() if path.exists() else ""

    def __call__(self, path, text):
        import errno

        if path.name == "cgroup.subtree_control":
            if not path.parent.is_relative_to(self.delegated):
                raise PermissionError(errno.EACCES, "not delegated", str(path))
            if self._text(path.parent / "cgroup.procs").split():
                raise OSError(errno.EBUSY, "Device or resource busy", str(path))
            path.write_text(" ".join(sorted(set(self._text(path).split()) | {text.lstrip("+")})))
        elif path.name == "cgroup.procs":
            if not path.parent.is_relative_to(self.delegated):
                raise PermissionError(errno.EACCES, "not delegated", str(path))
            for procs in self.root.rglob("cgroup.procs"):
                procs.write_text("\n".join(p for p in procs.read_text().split() if p != text))
            path.write_text((self._text(path) + "\n" + text).strip())
        else:
            path.write_text(text)


def _v2_tree(tmp_path):
    """A cgroup2 mount whose agent sits, alone, in a delegated systemd unit's cgroup."""
    top = tmp_path / "cg"
    unit = top / "system.slice" / "p2pnode.service"
    unit.mkdir(parents=True)
    (top / "cgroup.controllers").write_text("cpu io memory pids\n")
    for d in (top, top / "system.slice", unit):
        (d / "cgroup.subtree_control").write_text("")
        (d / "cgroup.procs").write_text("")
    (unit / "cgroup.procs").write_text(f"{os.getpid()}\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"30 23 0:26 / {top} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    own = tmp_path / "cgroup"
    own.write_text("0::/system.slice/p2pnode.service\n")
    return top, unit, mountinfo, own


def test_cgroup_v2_under_a_delegated_unit_moves_the_agent_into_a_leaf(tmp_path):
    """issue 25: with Delegate=yes the agent starts in its unit's cgroup, where v2 refuses +memory for children
    while the agent is there; it moves itself into p2pnode-agent, then job cgroups get the memory controller."""
    from p2pnode.jobs._cgroup import enforcement

    top, unit, mountinfo, own = _v2_tree(tmp_path)
    kernel = _FakeV2Kernel(top, delegated=unit)
    cg = detect(mountinfo=mountinfo, proc_cgroup=own, node_dir="n1", write=kernel)
    assert cg == CgroupFs(2, unit / "p2pnode-jobs" / "n1", moved_to=str(unit / "p2pnode-agent"))
    assert (unit / "cgroup.procs").read_text() == "" and str(os.getpid()) in (unit / "p2pnode-agent" /
                                                                               "cgroup.procs").read_text()
    assert "memory" in (unit / "cgroup.subtree_control").read_text().split()
    assert "memory" in (unit / "p2pnode-jobs" / "n1" / "cgroup.subtree_control").read_text().split()
    e = enforcement(cg)
    assert e["mode"] == "cgroup v2" and e["moved_to"] == str(unit / "p2pnode-agent")

    # Jobs left running across restarts (on_agent_stop = "leave"): no move, so systemd can start the next agent.
    top, unit, mountinfo, own = _v2_tree(tmp_path / "d")
    assert detect(mountinfo=mountinfo, proc_cgroup=own, node_dir="n1", write=_FakeV2Kernel(top, unit),
                  move=False) is None
    assert str(os.getpid()) in (unit / "cgroup.procs").read_text()

    # Not delegated (a plain user session): nothing moves, nothing at the root either: the watchdog.
    top, unit, mountinfo, own = _v2_tree(tmp_path / "b")
    cg = detect(mountinfo=mountinfo, proc_cgroup=own, node_dir="n1", write=_FakeV2Kernel(top, delegated=top / "x"))
    assert cg is None and str(os.getpid()) in (unit / "cgroup.procs").read_text()
    assert enforcement(None)["mode"] == "watchdog"

    # Root in a unit without Delegate=yes: the kernel would let it do anything, but systemd owns those cgroups;
    # nothing is changed, neither the unit's cgroup nor the root, and the agent stays where it is.
    top, unit, mountinfo, own = _v2_tree(tmp_path / "e")
    before = {p: p.read_text() for p in top.rglob("*") if p.is_file()}
    assert detect(mountinfo=mountinfo, proc_cgroup=own, node_dir="n1", write=_FakeV2Kernel(top, delegated=top),
                  may_change=lambda path: False) is None
    assert {p: p.read_text() for p in top.rglob("*") if p.is_file()} == before
    assert detect(mountinfo=mountinfo, proc_cgroup=own, node_dir="n1", write=_FakeV2Kernel(top, delegated=top),
                  may_change=lambda path: path == unit).moved_to == str(unit / "p2pnode-agent")  # marked: it moves

    # Another process shares the unit's cgroup (an ExecStartPre leftover): moving ourselves is not enough; no
    # controller there, and the root is not ours.
    top, unit, mountinfo, own = _v2_tree(tmp_path / "c")
    (unit / "cgroup.procs").write_text(f"{os.getpid()}\n1\n")
    assert detect(mountinfo=mountinfo, proc_cgroup=own, node_dir="n1", write=_FakeV2Kernel(top, unit)) is None


def test_delegation_is_read_from_the_user_systemd_and_the_unit(tmp_path, monkeypatch):
    """``delegated``: a non-root agent (the kernel decides), no systemd as init, or the unit's word."""
    from p2pnode.jobs import _cgroup

    monkeypatch.setattr(_cgroup.os, "geteuid", lambda: 1000)
    assert _cgroup.delegated(tmp_path)
    monkeypatch.setattr(_cgroup.os, "geteuid", lambda: 0)
    monkeypatch.delenv(_cgroup.DELEGATED_ENV, raising=False)
    real_is_dir = Path.is_dir
    monkeypatch.setattr(Path, "is_dir", lambda p: True if str(p) == "/run/systemd/system" else real_is_dir(p))
    assert not _cgroup.delegated(tmp_path)  # root under systemd, no xattr, no word from the unit
    monkeypatch.setenv(_cgroup.DELEGATED_ENV, "yes")
    assert not _cgroup.delegated(tmp_path)  # only "1"
    monkeypatch.setenv(_cgroup.DELEGATED_ENV, "1")
    assert _cgroup.delegated(tmp_path)
    monkeypatch.delenv(_cgroup.DELEGATED_ENV)
    monkeypatch.setattr(_cgroup.os, "getxattr", lambda path, attr: b"1" if attr == "trusted.delegate" else b"0",
                        raising=False)
    assert _cgroup.delegated(tmp_path)  # systemd 251+: the cgroup is marked


async def test_a_job_that_survived_a_cgroup_oom_kill_keeps_running_and_its_end_is_named(tmp_path):
    """A cgroup's OOM kill of a child (a dataloader's, say) while the job runs on does not stop it: the kernel
    enforced the limit; the kill names the job's end only at its exit (the sample taken then)."""
    fake = FakeCgroups(tmp_path / "cg")
    fake.root.mkdir()
    gate = tmp_path / "gate"
    script = _script(tmp_path, f"while [ ! -e {gate} ]; do sleep 0.05; done\nexit 3\n")
    history = JobHistory(tmp_path / "jobs.db")
    runner = _runner(tmp_path, history, cgroups=fake, memory_limit_gib=8.0, memory_check_interval_s=0.05)
    rules = RulesOnRunner(runner)
    samples = []
    sampled = runner.on_sample
    runner.on_sample = lambda job, s: (samples.append(s), sampled(job, s))
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await nursery.start(rules.run)
        _start(runner, "j", _template(script, resources={"memory_gib": 2}))
        (Path(runner.jobs["j"].cgroup) / "oom").touch()  # the kernel killed a child at the cgroup's limit
        await _until(lambda: sum(s.oom_kills for s in samples) >= 3)  # three live samples saw the OOM kill
        assert runner.jobs["j"].stopping is None and rules.stops == []  # the job runs on
        gate.touch()
        await _until(lambda: not runner.jobs)
        nursery.cancel_scope.cancel()
    assert samples[-1].final and not any(s.final for s in samples[:-1])
    reason = history.recent()[0]["reason"]
    assert reason == "memory limit: killed by the kernel at its cgroup limit of 2 GiB (memory_gib of t)"


async def test_an_oom_kill_during_a_clean_agent_stop_names_the_end(tmp_path):
    """The kernel OOM-kills a job in its cgroup while the agent stops it: the memory limit names its end, not
    ``stopped: agent shutdown`` (the one stop reason the exit's OOM kill replaces)."""
    fake = FakeCgroups(tmp_path / "cg")
    fake.root.mkdir()
    script = _script(tmp_path, "trap '' TERM\nwhile true; do sleep 0.05; done\n")
    history = JobHistory(tmp_path / "jobs.db")
    runner = _runner(tmp_path, history, cgroups=fake, memory_limit_gib=8.0, memory_check_interval_s=600)
    rules = RulesOnRunner(runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await nursery.start(rules.run)
        _start(runner, "big", _template(script, resources={"memory_gib": 2}))
        _start(runner, "other", _template(script))
        job = runner.jobs["big"]
        runner.stop("big", SHUTDOWN_REASON, "agent_stop")  # what JobControl.shutdown does
        runner.stop("other", "stopped by the operator", "operator")
        (Path(job.cgroup) / "oom").touch()  # the kernel kills it at its limit while it shuts down
        (Path(runner.jobs["other"].cgroup) / "oom").touch()
        await runner.shutdown()
        nursery.cancel_scope.cancel()
    runs = {r["job_id"]: r["reason"] for r in history.recent()}
    assert runs["big"] == "memory limit: killed by the kernel at its cgroup limit of 2 GiB (memory_gib of t)"
    assert runs["other"] == "stopped by the operator"  # any other stop keeps its reason


async def test_an_oom_kill_while_the_agent_was_down_names_the_end(tmp_path):
    fake = FakeCgroups(tmp_path / "cg")
    fake.root.mkdir()
    history = JobHistory(tmp_path / "jobs.db")
    first = _runner(tmp_path, history, cgroups=fake, memory_limit_gib=8.0, on_agent_stop="leave")
    script = _script(tmp_path, "sleep 0.3\nexit 137\n")
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        _start(first, "big", _template(script, resources={"memory_gib": 2}))
        job = first.jobs["big"]
        nursery.cancel_scope.cancel()
    (Path(job.cgroup) / "oom").touch()  # the kernel killed it while the agent was down
    os.waitpid(job.proc.pid, 0)
    second = _runner(tmp_path, history, cgroups=fake, memory_limit_gib=8.0)
    rules = RulesOnRunner(second)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        assert second.jobs == {}
        nursery.cancel_scope.cancel()
    row = history.recent()[0]
    assert (row["job_id"], row["exit_status"]) == ("big", -9)  # (the wrapper: status 137 is SIGKILL)
    # (no catalog given to this runner: the limit is the ledger's)
    assert row["reason"] == ("memory limit: killed by the kernel at its cgroup limit of 2 GiB "
                             "(the limit it started with)")
    assert [(e.job_id, e.rule) for e in rules.stops] == [("big", "memory_limit")]
