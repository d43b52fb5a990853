"""Event hooks: the script gets the event name as argument and the JSON payload on stdin, with a timeout."""

import json
import os
import stat

import trio

from p2pnode.agent import Agent
from p2pnode.config import load_config


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


async def test_hooks_run_with_payload_and_timeout(tmp_path):
    out = tmp_path / "out"
    ok = _script(tmp_path / "ok.sh", f'printf "%s " "$1" >> {out}; cat >> {out}; echo >> {out}\n')
    slow = _script(tmp_path / "slow.sh", "sleep 30\n")
    cfg = load_config(None, env={}, overrides={
        "agent": {"data_dir": tmp_path / "d", "port": 0}, "discovery": {"mdns": False},
        "guard": {"hooks": (f"DISK_SPACE_LOW={ok}", f"*={slow}"), "hook_timeout_s": 0.5}})
    agent = Agent(cfg)
    async with trio.open_nursery() as n:
        n.start_soon(agent.guard._hook_loop)
        for name in ("DISK_SPACE_LOW", "NODE_OVERLOADED"):
            ev = agent.guard.monitor.log.emit(name, {"disk_percent": 61.5}, 1000.0)
            agent.guard._event_send.send_nowait(ev)
        with trio.fail_after(10):
            while agent.guard.hook_runs < 3 or agent.guard.hook_failures < 2:
                await trio.sleep(0.05)
        n.cancel_scope.cancel()
    lines = out.read_text().strip().splitlines()
    assert len(lines) == 1
    name, payload = lines[0].split(" ", 1)
    assert name == "DISK_SPACE_LOW"
    assert json.loads(payload) == {"node_id": agent.node_id, "seq": 1, "name": "DISK_SPACE_LOW", "at": 1000.0,
                                   "payload": {"disk_percent": 61.5}}
    assert agent.guard.hook_failures == 2  # the slow hook timed out twice (once per event)
    assert os.path.exists(out)
