"""Provider plugins (p2pnode.providers): the ``command`` provider runs the operator's scripts with the documented
environment and turns failures, hangs and bad output into ProviderError; the ``local`` provider starts a detached
agent that joins, is listed with its node id, is not started twice for one request id, and leaves when scaled
down; plugins load from entry points."""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import msgspec
import psutil
import pytest
from agents import AgentProc, free_port, wait_until

from p2pnode.config import ScalingClass, ScalingSettings
from p2pnode.errors import ConfigError
from p2pnode.providers import (
    CommandProvider,
    LocalProvider,
    ProviderContext,
    ProviderError,
    ProviderNode,
    load_provider,
)

CTX = ProviderContext(data_dir="/nonexistent", join=["127.0.0.1:1", "127.0.0.1:2"])


def _script(path: Path, body: str) -> str:
    """An executable sh script at ``path``; returns its path quoted for a command line."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return shlex.quote(str(path))


def _command(tmp_path: Path, **kw: object) -> CommandProvider:
    base = {"command_up": "true", "command_down": "true", "command_timeout_s": 30.0, **kw}
    return CommandProvider(ScalingSettings(provider="command", **base), CTX)  # type: ignore[arg-type]


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line.startswith("P2PNODE_"))


def test_command_scripts_see_the_documented_environment(tmp_path):
    up_env, down_env = tmp_path / "up.env", tmp_path / "down.env"
    d = tmp_path / "a dir"  # a path with a space: the command line is split shell-like, not on spaces
    d.mkdir()
    dump = _script(d / "dump.sh", 'env > "$1"\n')
    p = _command(tmp_path, command_up=f"{dump} {shlex.quote(str(up_env))}",
                 command_down=f"{dump} {shlex.quote(str(down_env))}")
    nodes = p.scale_up("1xH100", 2, "7-1")
    assert nodes == [ProviderNode(request_id="7-1", node_class="1xH100")] * 2  # no command_list: placeholders
    env = _env_file(up_env)
    assert {k: env[k] for k in ("P2PNODE_NODE_CLASS", "P2PNODE_COUNT", "P2PNODE_REQUEST_ID", "P2PNODE_NODE_IDS",
                                "P2PNODE_JOIN", "P2PNODE_TRUST")} == {
        "P2PNODE_NODE_CLASS": "1xH100", "P2PNODE_COUNT": "2", "P2PNODE_REQUEST_ID": "7-1", "P2PNODE_NODE_IDS": "",
        "P2PNODE_JOIN": "127.0.0.1:1,127.0.0.1:2", "P2PNODE_TRUST": "open"}
    nodes = p.scale_down(["aaaa", "bbbb"], "7-2")
    assert [(n.node_id, n.state, n.request_id) for n in nodes] == [("aaaa", "stopping", "7-2"),
                                                                   ("bbbb", "stopping", "7-2")]
    env = _env_file(down_env)
    assert (env["P2PNODE_NODE_IDS"], env["P2PNODE_REQUEST_ID"], env["P2PNODE_COUNT"], env["P2PNODE_NODE_CLASS"]) == \
        ("aaaa,bbbb", "7-2", "2", "")
    assert p.list() == []  # no command_list: the fleet's members are the record
    with pytest.raises(ProviderError, match="request id"):
        p.scale_up("1xH100", 1, "../x")


def test_no_variable_of_the_agents_own_reaches_a_script(tmp_path, monkeypatch):
    """The cluster and read tokens, the agent's tags and data dir stay out of the scripts' environment (their
    output may be logged and shown in /status): only the documented P2PNODE_ variables are set."""
    for k, v in {"P2PNODE_CLUSTER_TOKEN": "s3cret-token", "P2PNODE_READ_TOKEN": "read-s3cret",
                 "P2PNODE_TAGS": "voter,durable", "P2PNODE_DATA_DIR": "/var/lib/p2pnode"}.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "up.env"
    dump = _script(tmp_path / "dump.sh", 'env > "$1"\n')
    p = _command(tmp_path, command_up=f"{dump} {shlex.quote(str(out))}")
    p.scale_up("1xH100", 1, "7-1")
    text = out.read_text()
    assert "s3cret" not in text and "voter,durable" not in text and "/var/lib/p2pnode" not in text
    assert set(_env_file(out)) == {"P2PNODE_NODE_CLASS", "P2PNODE_COUNT", "P2PNODE_NODE_IDS", "P2PNODE_REQUEST_ID",
                                   "P2PNODE_JOIN", "P2PNODE_TRUST", "P2PNODE_KEYRING_FILE"}


class _Plugin:
    """A provider plugin whose answers a test sets: a value to return, or an exception to raise."""

    name = "plugin"

    def __init__(self, answer: object) -> None:
        self.answer = answer

    def _reply(self):
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def scale_up(self, node_class, count, request_id):
        return self._reply()

    def scale_down(self, node_ids, request_id):
        return self._reply()

    def list(self):
        return self._reply()


@pytest.mark.parametrize("answer, listed", [
    ([ProviderNode(request_id="3-1-5", node_class="1xH100", node_id="n9", state="running")],
     [("3-1-5", "n9", "running", "1xH100")]),
    ([{"request_id": "3-1-5", "node_class": "1xH100", "state": "starting"}], [("3-1-5", "", "starting", "1xH100")]),
    ([{"request_id": 7}], None),  # wrong type
    ([ProviderNode(request_id="a\nb")], None),  # a plugin's own instance, built unchecked: checked all the same
    ("not a list", None),
    ([ProviderNode(request_id="x")] * 5000, None),  # over MAX_LISTED
    (ValueError("quota\nexceeded\x1b[31m"), None),  # a plugin's bug, with control characters
])
def test_the_driver_decodes_a_plugins_answer_and_counts_a_bad_one(answer, listed):
    """A plugin's list() is decoded into the interface's types in the driver's call: a wrong type, an answer over
    the bound or a raise is a counted failure on one line, handed to the core as a failed listing; job control
    never sees the exception."""
    import trio

    from p2pnode.jobs._scaling import ScalingDriver
    from p2pnode.scheduler._scaling import ProviderList

    got: list = []
    drv = ScalingDriver(ScalingSettings(provider="plugin", command_timeout_s=5.0), lambda: _Plugin(answer),
                        result=lambda *a: None, listed=lambda nodes, why, wall: got.append((nodes, why)) or [],
                        apply=lambda effects: None, news=lambda: None)

    async def main():
        await drv._ensure_loaded()
        await drv._carry_out(ProviderList())

    trio.run(main)
    [(nodes, why)] = got
    assert nodes == listed
    if listed is None:
        assert why and "\n" not in why and "\x1b" not in why and drv.failures[("plugin", "list")] == 1
        assert "\n" not in drv.last_error
    else:
        assert why == "" and drv.failures[("plugin", "list")] == 0


def test_a_failing_script_is_a_provider_error_with_its_stderr_tail(tmp_path):
    fail = _script(tmp_path / "fail.sh", "i=0; while [ $i -lt 300 ]; do echo 'noise line' >&2; i=$((i+1)); done\n"
                                         "printf 'quota \\033[31mexceeded\\033[0m\\nfor 1xH100\\n' >&2; exit 3\n")
    with pytest.raises(ProviderError) as err:
        _command(tmp_path, command_up=fail).scale_up("1xH100", 1, "1-1")
    msg = str(err.value)
    assert msg.startswith("fail.sh: exit status 3; stderr: ...") and msg.endswith("exceeded [0m for 1xH100")
    assert len(msg) < 500 and not any(ord(c) < 32 or ord(c) == 127 for c in msg)
    with pytest.raises(ProviderError, match="cannot start"):
        _command(tmp_path, command_up=str(tmp_path / "missing")).scale_up("1xH100", 1, "1-1")


def test_a_hanging_script_is_killed_with_its_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    hang = _script(tmp_path / "hang.sh", f'sleep 120 & echo $! > {shlex.quote(str(pidfile))}; wait\n')
    p = _command(tmp_path, command_down=hang, command_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(ProviderError, match=r"hang.sh: timed out after 1 s"):
        p.scale_down(["aaaa"], "2-1")
    assert time.monotonic() - t0 < 10
    child = int(pidfile.read_text())

    def gone() -> bool:
        try:
            return psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    try:
        wait_until(gone, 10, interval=0.05, what="the script's child killed with its group")
    finally:
        if not gone():
            os.kill(child, signal.SIGKILL)


def test_a_daemon_left_holding_the_pipes_is_not_waited_for(tmp_path):
    """A script that starts a process in its own session which keeps stdout open returns when the script exits."""
    pidfile = tmp_path / "daemon.pid"
    up = _script(tmp_path / "up.sh", f"setsid sleep 120 & echo $! > {shlex.quote(str(pidfile))}; echo started\n")
    t0 = time.monotonic()
    try:
        _command(tmp_path, command_up=up).scale_up("1xH100", 1, "3-1")
        assert time.monotonic() - t0 < 10
    finally:
        wait_until(pidfile.exists, 5, interval=0.05, what="the daemon's pid")
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_command_list_output_is_decoded_and_bad_output_refused(tmp_path):
    good = [{"request_id": "4-1", "node_class": "1xH100", "node_id": "n1", "state": "running",
             "detail": {"instance": "i-0abc"}},
            {"request_id": "4-2", "node_class": "1xH100", "node_id": "", "state": "starting"}]
    out = tmp_path / "list.json"
    out.write_bytes(msgspec.json.encode(good))
    lister = _script(tmp_path / "list.sh", f"cat {shlex.quote(str(out))}\n")
    p = _command(tmp_path, command_list=lister)
    assert p.list() == msgspec.convert(good, list[ProviderNode])
    assert [n.node_id for n in p.scale_up("1xH100", 1, "4-1")] == ["n1"]  # the request's nodes from the list
    for bad, why in ((b"not json", "no JSON array"), (b'{"request_id": "x"}', "no JSON array"),
                     (b'[{"request_id": "x", "state": "exploded"}]', "state"),
                     (b'[{"request_id": "x", "extra": 1}]', "extra"),
                     (b'[{"request_id": "x\\u0007"}]', "no JSON array")):
        out.write_bytes(bad)
        with pytest.raises(ProviderError, match=why):
            p.list()
    huge = _script(tmp_path / "huge.sh", "head -c 3000000 /dev/zero\n")
    with pytest.raises(ProviderError, match="printed more than 1048576 bytes"):
        _command(tmp_path, command_list=huge).list()


# -- entry points ------------------------------------------------------------------------------------------------

class FakeCloud:
    """A provider plugin as a third party would write one (loaded through a faked entry point)."""

    name = "fakecloud"

    def __init__(self, settings: ScalingSettings, ctx: ProviderContext) -> None:
        self.settings, self.ctx = settings, ctx

    def scale_up(self, node_class: str, count: int, request_id: str) -> list[ProviderNode]:
        return [ProviderNode(request_id=request_id, node_class=node_class)] * count

    def scale_down(self, node_ids: list[str], request_id: str) -> list[ProviderNode]:
        return []

    def list(self) -> list[ProviderNode]:
        return []


def test_plugins_load_from_entry_points_and_an_unknown_name_lists_the_available(monkeypatch):
    ep = importlib.metadata.EntryPoint(name="fakecloud", value=f"{__name__}:FakeCloud", group="p2pnode.providers")
    other = importlib.metadata.EntryPoint(name="other", value="os:getcwd", group="something.else")

    def entry_points(**selection: str) -> importlib.metadata.EntryPoints:
        return importlib.metadata.EntryPoints(e for e in (ep, other) if e.group == selection.get("group", e.group))

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    settings = ScalingSettings(provider="fakecloud")
    p = load_provider(settings, CTX)
    assert isinstance(p, FakeCloud) and p.settings is settings and p.ctx is CTX
    assert load_provider(ScalingSettings(), CTX) is None
    assert isinstance(load_provider(ScalingSettings(provider="local"), CTX), LocalProvider)
    assert isinstance(load_provider(ScalingSettings(provider="command", command_up="u", command_down="d"), CTX),
                      CommandProvider)
    with pytest.raises(ConfigError, match=r"'nosuch': no such provider \(available: command, local, fakecloud;"):
        load_provider(ScalingSettings(provider="nosuch"), CTX)


def test_context_keeps_its_read_token_out_of_repr():
    assert "s3cret" not in repr(ProviderContext(data_dir="/d", read_token="s3cret-token-value"))


# -- the local provider ------------------------------------------------------------------------------------------

def _local(tmp_path: Path, ctx: ProviderContext, local_config: str = "") -> LocalProvider:
    settings = ScalingSettings(provider="local", local_dir=str(tmp_path / "local"), local_config=local_config,
                               classes={"cpu": ScalingClass(max_nodes=2, tags=["ephemeral"], fake_gpus="RTX 4090")})
    return LocalProvider(settings, ctx)


def test_local_records_are_untrusted_and_a_reused_pid_is_not_the_node(tmp_path):
    p = _local(tmp_path, CTX)
    assert p.list() == []
    (tmp_path / "local" / "junk.json").write_text("{not json")
    (tmp_path / "local" / "9-9.0.json").write_text('{"request_id": "9-9", "index": -1}')
    # pid reuse: this test's own (live) pid, but its command line names no such data dir
    rec = {"request_id": "5-1", "index": 0, "node_class": "cpu", "node_id": "abcdefgh", "pid": os.getpid(),
           "create_time": psutil.Process().create_time(), "port": 9, "data_dir": str(tmp_path / "local" / "5-1.0"),
           "log_file": "x.log", "state": "running"}
    (tmp_path / "local" / "5-1.0.json").write_bytes(msgspec.json.encode(rec))
    assert [(n.node_id, n.state) for n in p.list()] == [("abcdefgh", "stopped")]
    assert p.bad_records == 2
    assert p.scale_down(["abcdefgh"], "5-2")[0].state == "stopped"  # already stopped: no signal sent
    with pytest.raises(ProviderError, match="not in \\[scaling.classes\\]"):
        p.scale_up("8xH100", 1, "5-3")


@pytest.mark.slow
def test_local_provider_starts_a_detached_agent_that_joins_and_leaves(tmp_path):
    env = {"P2PNODE_GOSSIP_PROFILE": "local-test"}
    seed = AgentProc(tmp_path / "seed", free_port(), "--no-mdns", "--tag", "voter", env=env).start()
    cfg = tmp_path / "extra.toml"
    cfg.write_text('[gossip]\nprofile = "local-test"\n\n[guard]\ncpu_max_percent = 0.0\n')
    ctx = ProviderContext(data_dir=str(tmp_path / "seed"), join=[f"127.0.0.1:{seed.port}"], interpreter=sys.executable)
    p = _local(tmp_path, ctx, local_config=str(cfg))
    pids: list[int] = []
    try:
        seed.wait_ready()
        [node] = p.scale_up("cpu", 1, "1-1")
        pids.append(int(node.detail["pid"]))
        assert node.node_id and node.state == "starting" and node.node_class == "cpu"
        assert os.getsid(pids[0]) == pids[0]  # a session of its own: it outlives the agent that started it

        def member() -> dict | None:
            return next((m for m in seed.status()["members"] if m["id"] == node.node_id and m["state"] == "alive"),
                        None)

        m = wait_until(member, 40, what="the started agent alive in the seed's view")
        assert "voter" not in m.get("tags", []) and "ephemeral" in m.get("tags", ["ephemeral"])
        assert [(n.node_id, n.state) for n in p.list()] == [(node.node_id, "running")]
        again = p.scale_up("cpu", 1, "1-1")  # the same request id: nothing new
        assert [(n.node_id, n.detail["pid"]) for n in again] == [(node.node_id, node.detail["pid"])]
        assert len(list((tmp_path / "local").glob("*.json"))) == 1
        # another provider object over the same directory (a later leader on this machine) sees the same node
        assert [n.node_id for n in _local(tmp_path, ctx).list()] == [node.node_id]
        [down] = p.scale_down([node.node_id], "1-2")
        assert down.state == "stopped" and not psutil.pid_exists(pids[0])
        wait_until(lambda: any(m["id"] == node.node_id and m["state"] == "left" for m in seed.status()["members"]),
                   20, what="the node LEFT in the seed's view")
        assert p.scale_down([node.node_id], "1-2")[0].state == "stopped"  # again: nothing to do
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        seed.kill()


def test_local_nodes_get_their_own_flags_environment_and_keyring(tmp_path, monkeypatch):
    """What a started agent is given, seen by a stand-in interpreter that records its argv and environment: the
    leader's P2PNODE_* variables (its tags, its config) are not passed on, the keyring file is copied with mode
    0600, the node id is that of the key in its data dir; a local_config tagging agents 'voter' is refused."""
    from p2pnode.identity import load_or_create_identity

    seen = tmp_path / "seen.json"
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys, time\n"
                    f"json.dump({{'argv': sys.argv, 'env': dict(os.environ)}}, open({str(seen)!r} + '.tmp', 'w'))\n"
                    f"os.rename({str(seen)!r} + '.tmp', {str(seen)!r})\ntime.sleep(60)\n")
    fake.chmod(0o755)
    keyring = tmp_path / "keyring.json"
    keyring.write_text('{"tokens": {}}')
    monkeypatch.setenv("P2PNODE_TAGS", "voter")
    monkeypatch.setenv("P2PNODE_CONFIG", str(tmp_path / "leader.toml"))
    ctx = ProviderContext(data_dir=str(tmp_path), join=["127.0.0.1:1"], trust="token", keyring_file=str(keyring),
                          read_token="r" * 20, interpreter=str(fake))
    p = _local(tmp_path, ctx)
    [node] = p.scale_up("cpu", 1, "6-1")
    pid = int(node.detail["pid"])
    try:
        wait_until(seen.exists, 20, interval=0.05, what="the stand-in agent started")
        got = msgspec.json.decode(seen.read_bytes())
        argv, env = got["argv"][1:], got["env"]
        data_dir = tmp_path / "local" / "6-1.0"
        assert argv[:6] == ["-m", "p2pnode", "agent", "--data-dir", str(data_dir), "--bind"]
        assert {"--no-mdns", "ephemeral", "RTX 4090", "127.0.0.1:1"} <= set(argv) and "voter" not in argv
        assert {k: v for k, v in env.items() if k.startswith("P2PNODE_")} == {
            "P2PNODE_SCALING_STARTED_BY": "6-1", "P2PNODE_TRUST": "token", "P2PNODE_SYNC_DATA_PORT": "0",
            "P2PNODE_ALLOW_PRIVATE_ADVERTISE": "1", "P2PNODE_READ_TOKEN": "r" * 20}
        copied = data_dir / "keyring.json"
        assert copied.read_text() == keyring.read_text() and copied.stat().st_mode & 0o777 == 0o600
        assert load_or_create_identity(data_dir).node_id == node.node_id
        assert [n.state for n in p.scale_down([node.node_id], "6-2")] == ["stopped"]
        assert not psutil.pid_exists(pid)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    voter_cfg = tmp_path / "voter.toml"
    voter_cfg.write_text('[agent]\ntags = ["voter"]\n')
    with pytest.raises(ProviderError, match="voter"):
        _local(tmp_path, ctx, local_config=str(voter_cfg)).scale_up("cpu", 1, "6-3")
