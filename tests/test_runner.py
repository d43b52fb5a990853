"""The job runner with real subprocesses: minimal env, GPUs, logs, runtime limit, SIGTERM then SIGKILL, history."""

import os
import stat

import trio
from stops import RulesOnRunner

from p2pnode.jobs import JobHistory, JobRunner
from p2pnode.scheduler import parse_catalog


def _catalog(script, **kw):
    job = {"name": "t", "kind": "selfplay", "config": "c", "argv": ["sh", str(script), "{n}"],
           "params": {"n": {"type": "int", "default": 1, "min": 0, "max": 9}}, "env": ["PATH", "KEEP_ME"]}
    job.update(kw)
    return parse_catalog({"job": [job]}).templates["t"]


def _script(tmp_path, body):
    p = tmp_path / "job.sh"
    p.write_text(body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


async def _wait(runner, job_id, timeout=10):
    with trio.fail_after(timeout):
        while job_id in runner.jobs:
            await trio.sleep(0.05)


async def test_env_gpus_logs_and_history(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEP_ME", "yes")
    monkeypatch.setenv("SECRET_TOKEN", "must-not-leak")
    script = _script(tmp_path, 'echo "arg=$1 gpus=$CUDA_VISIBLE_DEVICES keep=$KEEP_ME secret=${SECRET_TOKEN:-none}"\n'
                               'cat /proc/self/oom_score_adj\nexit 3\n')
    history = JobHistory(tmp_path / "jobs.db")
    runner = JobRunner(node_id="n1", data_dir=tmp_path / "d", history=history)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        runner.start(job_id="j1", template=_catalog(script), params={"n": 7}, gpus=(0, 2), gpu_fraction=1.0,
                     vram_gib=8.0, term=4)
        await _wait(runner, "j1")
        nursery.cancel_scope.cancel()
    log = (tmp_path / "d" / "logs" / "j1.log").read_text()  # one log file per job
    assert "arg=7 gpus=0,2 keep=yes secret=none" in log
    assert "\n500\n" in log  # the kernel's OOM killer takes the job first
    (run,) = history.recent()
    assert (run["job_id"], run["exit_status"], run["term"], run["node_id"]) == ("j1", 3, 4, "n1")
    assert run["reason"] == "failed with status 3" and run["ended_at"] >= run["started_at"]
    assert (run["rule"], run["outcome"]) == (None, "failed")  # it ended on its own: no rule stopped it


async def test_stop_is_sigterm_then_sigkill(tmp_path):
    stubborn = _script(tmp_path, "trap '' TERM\ntouch trapped\nwhile true; do sleep 0.1; done\n")
    history = JobHistory(tmp_path / "jobs.db")
    runner = JobRunner(node_id="n1", data_dir=tmp_path / "d", history=history, grace_s=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        runner.start(job_id="j2", template=_catalog(stubborn), params={}, gpus=(), gpu_fraction=0.0, vram_gib=0.0,
                     term=1)
        with trio.fail_after(10):  # until its TERM trap is set (the file is written once it is)
            while not (tmp_path / "d" / "trapped").exists():
                await trio.sleep(0.02)
        t0 = trio.current_time()
        runner.stop("j2", "preempted")
        await _wait(runner, "j2")
        assert 0.4 <= trio.current_time() - t0 < 5
        nursery.cancel_scope.cancel()
    run = history.recent()[0]
    assert run["reason"] == "preempted" and run["exit_status"] == -9


async def test_maximum_runtime_is_enforced(tmp_path):
    """The rule is the core's (:class:`p2pnode.node._stoprules.StopRules`, tested in virtual time); here its stop
    reaches a real process through the runner, no earlier than the runtime."""
    forever = _script(tmp_path, "sleep 30\n")
    history = JobHistory(tmp_path / "jobs.db")
    runner = JobRunner(node_id="n1", data_dir=tmp_path / "d", history=history, grace_s=1.0)
    rules = RulesOnRunner(runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await nursery.start(rules.run)
        t0 = trio.current_time()
        runner.start(job_id="j3", template=_catalog(forever, max_runtime_s=0.5), params={}, gpus=(), gpu_fraction=0.0,
                     vram_gib=0.0, term=1)
        await _wait(runner, "j3")
        assert trio.current_time() - t0 >= 0.5
        nursery.cancel_scope.cancel()
    assert [(e.job_id, e.rule) for e in rules.stops] == [("j3", "max_runtime")]
    (run,) = history.recent()
    assert (run["reason"], run["rule"], run["outcome"]) == ("maximum runtime reached", "max_runtime", "stopped")
    assert os.path.exists(tmp_path / "d" / "logs" / "j3.log")


async def test_each_job_gets_its_own_gpus_by_uuid_on_a_mixed_box(tmp_path):
    """Issue 24 item 4: NVML numbers GPUs in PCI bus order, CUDA (by default) fastest first. On a box whose NVML
    order is not its speed order, a job given NVML indexes would land on another job's GPU: each job's own
    environment names exactly its GPUs by UUID, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the index fallback's
    meaning) beside them."""
    from p2pnode.resources import FakeGpus, parse_fake_gpus

    models = parse_fake_gpus("RTX 3060,H100,RTX 4090")
    readings = FakeGpus(models, seed="n1").read()
    fastest_first = sorted(range(3), key=lambda i: -models[i].score)
    assert fastest_first == [1, 2, 0] != [r.index for r in readings]  # CUDA's default order is not NVML's
    uuid = {r.index: r.uuid for r in readings}
    assert len(set(uuid.values())) == 3 and all(u.startswith("GPU-") for u in uuid.values())
    dump = _script(tmp_path, 'echo "$CUDA_VISIBLE_DEVICES|$CUDA_DEVICE_ORDER|${P2PNODE_GPU_FRACTION-unset}|'
                             '${P2PNODE_VRAM_GIB-unset}" >"$P2PNODE_JOB_ID.env"\n')  # in data_dir
    history = JobHistory(tmp_path / "jobs.db")
    runner = JobRunner(node_id="n1", data_dir=tmp_path / "d", history=history, gpu_uuids=lambda: uuid)
    bare = JobRunner(node_id="n2", data_dir=tmp_path / "e", history=JobHistory(tmp_path / "e.db"))  # no sample yet
    assigned = {"slow": (0,), "pair": (1, 2), "none": ()}
    share = {"slow": (0.75, 11.2), "pair": (1.0, 8.0), "none": (0.0, 0.0)}  # issue 38: the job learns its share
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await nursery.start(bare.run)
        for job_id, gpus in assigned.items():
            runner.start(job_id=job_id, template=_catalog(dump), params={}, gpus=gpus, gpu_fraction=share[job_id][0],
                         vram_gib=share[job_id][1], term=1)
        bare.start(job_id="fallback", template=_catalog(dump), params={}, gpus=(2, 0), gpu_fraction=1.0, vram_gib=8.0,
                   term=1)
        reported = {j.job_id: j.to_wire()["gpus"] for j in runner.jobs.values()}
        for r, job_id in [(runner, "slow"), (runner, "pair"), (runner, "none"), (bare, "fallback")]:
            await _wait(r, job_id)
        nursery.cancel_scope.cancel()
    assert reported == {k: list(v) for k, v in assigned.items()}
    for job_id, gpus in assigned.items():
        visible, order, frac, vram = (tmp_path / "d" / f"{job_id}.env").read_text().strip().split("|")
        assert visible.split(",") == ([uuid[i] for i in gpus] or [""]) and order == "PCI_BUS_ID", job_id
        assert (frac, vram) == ((f"{share[job_id][0]:g}", f"{share[job_id][1]:g}") if gpus else ("unset", "unset"))
    # Where no UUID is known, the NVML indexes themselves, meant in PCI bus order as NVML counts.
    assert (tmp_path / "e" / "fallback.env").read_text().strip() == "2,0|PCI_BUS_ID|1|8"


def test_gpu_env_takes_only_uuids_of_nvmls_form():
    """A UUID with a comma or a control character would give the job other GPUs (or none): any such name makes the
    whole list fall back to NVML indexes under PCI_BUS_ID ordering."""
    from p2pnode.jobs._runner import gpu_env

    ok = gpu_env([1, 0], {0: "GPU-8f2c1a2b-0000-1111-2222-333344445555", 1: "MIG-GPU-8f2c/1/0"})
    assert ok == {"CUDA_VISIBLE_DEVICES": "MIG-GPU-8f2c/1/0,GPU-8f2c1a2b-0000-1111-2222-333344445555",
                  "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    for bad in ("GPU-a,1", "GPU-a\n", "GPU-", "gpu-abc", "", "GPU-a b"):
        assert gpu_env([1, 0], {0: "GPU-ok", 1: bad})["CUDA_VISIBLE_DEVICES"] == "1,0", bad
    assert gpu_env([], {})["CUDA_VISIBLE_DEVICES"] == ""
