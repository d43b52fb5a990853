"""Disk manager rules, the event monitor, and the acceptance run on a real small file system (tmpfs)."""

import os
import sqlite3
import time
from pathlib import Path

import msgspec
import pytest
from fs import SmallFs

from p2pnode.agent import Agent
from p2pnode.config import load_config
from p2pnode.guardcore import (
    DegradationTracker,
    FileInfo,
    GuardLimits,
    GuardMonitor,
    OperationPriority,
    assess,
    plan_cleanup,
)
from p2pnode.http import _views as views

DAY = 86400.0
L = GuardLimits()


def test_plan_rules_and_order():
    now = 100 * DAY
    files = [
        FileInfo("logs/agent.log", 10, now - 8 * DAY),
        FileInfo("logs/agent.log.1", 10, now - 9 * DAY),
        FileInfo("logs/recent.log", 10, now - 1 * DAY),
        FileInfo("games/empty.db", 10, now - DAY, empty_db=True),
        FileInfo("games/full.db", 10, now - DAY, empty_db=False),
        FileInfo("games/unsure.db", 10, now - DAY, empty_db=None),
        *[FileInfo(f"ckpt/m{i}.pt", 10, now - (10 - i) * DAY) for i in range(5)],
        FileInfo("other/m.pt", 10, now - 50 * DAY),
        FileInfo("data/shard.npz", 10, now - 60 * DAY),
    ]
    plan = plan_cleanup(files, used_bytes=700, total_bytes=1000, limits=L, now=now)
    assert [(d.path, d.rule) for d in plan.deletions] == [
        ("logs/agent.log.1", "old-log"),
        ("logs/agent.log", "old-log"),
        ("games/empty.db", "empty-database"),
        ("ckpt/m0.pt", "stale-checkpoint"),
        ("ckpt/m1.pt", "stale-checkpoint"),
    ]
    assert plan.usage_percent == 70.0 and plan.projected_percent == 65.0


def test_replicated_data_only_as_far_as_needed():
    files = [FileInfo(f"d/{i}.npz", 100, float(i)) for i in range(5)]
    plan = plan_cleanup(files, used_bytes=800, total_bytes=1000, limits=L, now=10.0,
                        replicated=lambda p: p != "d/0.npz")
    # 80 % -> below the 60 % notice threshold: 3 replicated files (oldest first, d/0 is not replicated).
    assert [d.path for d in plan.deletions] == ["d/1.npz", "d/2.npz", "d/3.npz"]
    assert plan_cleanup(files, used_bytes=800, total_bytes=1000, limits=L, now=10.0).deletions == ()


def sample(disk=10.0, gpus=()):
    return {"cpu_percent": 1.0, "mem_percent": 1.0, "disk_percent": disk, "disk_path": "/d",
            "gpus": [{"index": i, "util_percent": u, "mem_used_bytes": 0, "mem_total_bytes": 1, "uuid": f"u{i}",
                      "name": "NVIDIA H100"} for i, u in enumerate(gpus)]}


def test_monitor_edges():
    limits = GuardLimits(dwell_s=0.0, idle_grace_period_s=300.0)
    mon, tr = GuardMonitor(limits), DegradationTracker(limits)

    def step(s, now):
        a = assess(s, limits)
        return [e.name for e in mon.observe(s, a, tr.update(a, now), now=now, at=1000 + now)]

    assert step(sample(gpus=(0.0, 50.0)), 0.0) == []
    assert step(sample(disk=61.0, gpus=(0.0, 50.0)), 10.0) == ["DISK_SPACE_LOW", "BACKPRESSURE_ACTIVATED"]
    assert step(sample(disk=61.0, gpus=(0.0, 50.0)), 20.0) == []  # edge-triggered
    assert step(sample(disk=69.0, gpus=(0.0, 50.0)), 30.0) == ["RESOURCE_CONSTRAINT", "NODE_OVERLOADED"]
    assert step(sample(disk=10.0, gpus=(0.0, 50.0)), 40.0) == ["BACKPRESSURE_RELEASED"]
    assert step(sample(disk=10.0, gpus=(0.0, 50.0)), 300.0) == ["IDLE_RESOURCE_DETECTED"]
    ev = mon.log.recent(1)[0]
    assert ev.payload["gpu"] == 0 and ev.payload["idle_for_s"] == 300.0 and ev.at == 1300.0
    assert step(sample(disk=10.0, gpus=(0.0, 50.0)), 900.0) == []
    assert step(sample(disk=61.0, gpus=(50.0, 50.0)), 901.0) == ["DISK_SPACE_LOW", "BACKPRESSURE_ACTIVATED"]
    assert [e.seq for e in mon.log.recent()] == list(range(1, 9))


def _db(path, rows):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE games (id INTEGER)")
    con.executemany("INSERT INTO games VALUES (?)", [(i,) for i in range(rows)])
    con.commit()
    con.close()


def _age(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.fixture
def small_fs(tmp_path):
    fs = SmallFs(tmp_path / "fs", size_mib=16)
    try:
        yield fs
    finally:
        fs.close()


async def test_small_filesystem_drives_level_events_refusal_and_cleanup(small_fs):
    data = small_fs.path
    cfg = load_config(None, env={}, overrides={"agent": {"data_dir": data, "port": 0}, "discovery": {"mdns": False},
                                               "guard": {"dwell_s": 0.0}})
    agent = Agent(cfg)

    def check(percent):
        small_fs.fill_to(percent)
        agent.sample()
        # Only the disk is under test: neutralize CPU and memory noise from the machine running the tests.
        agent.last_sample = msgspec.structs.replace(agent.last_sample, cpu_percent=0.0, mem_percent=0.0)
        names = [e.name for e in agent.guard.check(agent.last_sample)]
        return names, agent.guard.tracker.level

    names, level = check(30)
    assert level == 0 and "DISK_SPACE_LOW" not in names and agent.guard.admits("training")[0]
    names, level = check(61)
    assert "DISK_SPACE_LOW" in names and level == 2
    assert agent.guard.admits("training", OperationPriority.HIGH)[0]
    assert not agent.guard.admits("selfplay", OperationPriority.BACKGROUND)[0]
    names, level = check(67)
    assert level == 3 and "NODE_OVERLOADED" in names and "RESOURCE_CONSTRAINT" in names
    names, level = check(71)
    assert level == 4
    ok, why = agent.guard.admits("training", OperationPriority.CRITICAL)
    assert not ok and "training refused: disk at 7" in why
    assert agent.guard.admits("sync", OperationPriority.CRITICAL)[0]
    assert agent.guard.view()["admits"]["training"]["ok"] is False
    events = views.events_view(agent.surfaces)["events"]
    assert [e["name"] for e in events][0] in ("NODE_OVERLOADED", "RESOURCE_CONSTRAINT")

    # Files the rules name, and files they do not.
    (data / "logs").mkdir()
    (data / "logs" / "old.log").write_text("x" * 1000)
    _age(data / "logs" / "old.log", 8 * 86400)
    (data / "logs" / "fresh.log").write_text("y" * 1000)
    _age(data / "logs" / "fresh.log", 1 * 86400)
    (data / "games").mkdir()
    _db(data / "games" / "empty.db", 0)
    _db(data / "games" / "full.db", 3)
    _db(data / "games" / "live.db", 0)
    (data / "games" / "live.db-wal").write_bytes(b"")  # in use: the cleaner is unsure, keeps it
    for name in ("empty.db", "full.db", "live.db"):
        _age(data / "games" / name, 3600)
    (data / "ckpt").mkdir()
    for i in range(5):
        (data / "ckpt" / f"model_{i}.pt").write_bytes(b"w" * 2000)
        _age(data / "ckpt" / f"model_{i}.pt", (10 - i) * 3600)
    (data / "shard_old.npz").write_bytes(b"n" * 1000)
    _age(data / "shard_old.npz", 90 * 86400)

    def snapshot_tree():
        return {str(p.relative_to(data)): p.stat().st_size for p in data.rglob("*") if p.is_file()}

    before = snapshot_tree()
    named = {"logs/old.log", "games/empty.db", "ckpt/model_0.pt", "ckpt/model_1.pt"}
    dry = agent.guard.cleanup_pass(dry_run=True)
    assert {d["path"] for d in dry["deletions"]} == named and set(dry["done"]) == named
    assert snapshot_tree() == before  # dry run changes nothing
    real = agent.guard.cleanup_pass(dry_run=False)
    assert set(real["done"]) == named
    after = snapshot_tree()
    assert set(before) - set(after) == named  # exactly the named files went
    assert all(after[p] == before[p] for p in after)  # and nothing else changed
    assert agent.guard.view()["last_cleanup"]["freed_bytes"] == sum(before[p] for p in named)


def test_cli_cleanup_lists_no_checkpoint_of_the_sync_root_whatever_the_tags_given(tmp_path, monkeypatch, capsys):
    """``p2pnode guard cleanup --dry-run``: checkpoints in the sync root are never listed, whatever tags the command
    was given (offline, receipts cannot be checked, and an operator who leaves out the node's ``ephemeral`` tag must
    not be shown its unreplicated data as deletable); stale checkpoints elsewhere in the data dir are."""
    import json

    from p2pnode.cli import main

    data = tmp_path / "d"
    for sub in ("data/run1", "scratch/run2"):
        run = data / sub
        run.mkdir(parents=True)
        for i in range(6):
            f = run / f"step{i}.pt"
            f.write_bytes(b"x" * 10)
            os.utime(f, (1_000_000 + i, 1_000_000 + i))

    def listed(tags: str, data_dir: Path = data, extra: str = "") -> list[str]:
        cfg = tmp_path / f"p2pnode-{len(tags)}.toml"
        cfg.write_text(f'[agent]\ndata_dir = "{data_dir}"\ntags = [{tags}]\n{extra}')
        monkeypatch.setenv("P2PNODE_CONFIG", str(cfg))
        assert main(["guard", "cleanup", "--dry-run", "--json"]) == 0
        return [d["path"] for d in json.loads(capsys.readouterr().out)["deletions"]]

    for tags in ('"ephemeral"', "", '"durable"'):
        stale = listed(tags)
        assert stale and all(p.startswith("scratch/run2/step") for p in stale), (tags, stale)
    # The data dir named through a link, the sync root through "..": the same directories, still protected.
    (tmp_path / "link").symlink_to(data)
    stale = listed('"ephemeral"', tmp_path / "link", f'[sync]\nroot = "{data}/../d/data"\n')
    assert stale and all(p.startswith("scratch/run2/step") for p in stale), stale


def test_the_agents_cleaner_protects_a_sync_root_named_through_a_link(tmp_path):
    """The agent's own disk manager (not only the CLI): a data dir named through a link and a root with "..":
    an unreplicated file of the sync root is still protected."""
    from types import SimpleNamespace

    from p2pnode.sync._replication import Replication

    data = tmp_path / "d"
    (data / "data").mkdir(parents=True)
    (tmp_path / "link").symlink_to(data)
    fake = SimpleNamespace(source=object(), root=Path(f"{data}/../d/data").absolute(),
                           ctx=SimpleNamespace(data_dir=(tmp_path / "link").absolute()),
                           replicated_predicate=lambda: (lambda path: False))
    protected = Replication.protected_predicate(fake)  # type: ignore[arg-type]
    assert protected("data/run1/step0.pt") and not protected("scratch/step0.pt")
