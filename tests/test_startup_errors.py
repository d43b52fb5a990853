"""Startup failures that are the user's to fix: one line on stderr naming the cause and the remedy, exit status 2.

Each fault is set up for real and the real CLI is run as a subprocess (``python -m p2pnode agent``); the file
system faults use a small tmpfs (root only, skipped otherwise).
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from agents import free_port
from fs import SmallFs

from p2pnode import cli
from p2pnode.cli import _agent
from p2pnode.errors import IdentityError
from p2pnode.identity import load_or_create_identity


def run_agent(data_dir: Path, *, bind: str = "127.0.0.1", port: int = 0) -> subprocess.CompletedProcess:
    """The agent with its default log level, as a user starts it; it must exit by itself, fast."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PNODE_")}
    cmd = [sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(data_dir), "--bind", bind, "--port", str(port),
           "--no-mdns"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20, env=env, cwd=Path(__file__).parent.parent)


def one_line(r: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert exit status 2 and exactly one line on stderr, ``p2pnode: ...`` containing every needle."""
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].startswith("p2pnode: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def small_fs(tmp_path):
    fs = SmallFs(tmp_path / "fs", size_mib=1)
    try:
        yield fs
    finally:
        fs.close()


def test_port_in_use(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = run_agent(tmp_path / "data", port=port)
    one_line(r, f"cannot listen on 127.0.0.1:{port}", "address already in use", "choose another --port")
    assert not (tmp_path / "data").exists()  # checked before the data dir is touched: no key made for nothing


def test_bind_address_absent(tmp_path):
    port = free_port()
    r = run_agent(tmp_path / "data", bind="192.0.2.1", port=port)  # TEST-NET-1: no interface has it
    one_line(r, f"cannot listen on 192.0.2.1:{port}", "no interface of this machine has the address 192.0.2.1",
             "choose --bind")


def test_bind_host_unresolvable(tmp_path):
    r = run_agent(tmp_path / "data", bind="no-such-host.invalid")
    one_line(r, "cannot resolve 'no-such-host.invalid'", "choose --bind")


def test_data_dir_is_a_file(tmp_path):
    f = tmp_path / "data"
    f.write_text("not a dir")
    one_line(run_agent(f), f"data dir {f} is a file", "move the file away, or choose another --data-dir")
    one_line(run_agent(f / "sub"), f"{f} is a file where a directory belongs", "choose another --data-dir")


def test_node_key_is_a_directory(tmp_path):
    (tmp_path / "data" / "node.key").mkdir(parents=True)
    one_line(run_agent(tmp_path / "data"), f"node key {tmp_path / 'data' / 'node.key'} is a directory",
             "restore this node's key file, or move it away")


def test_counter_file_is_a_directory(tmp_path):
    (tmp_path / "data" / "snapshot.version").mkdir(parents=True)
    r = run_agent(tmp_path / "data")
    assert r.returncode == 2, r.stderr
    last = r.stderr.splitlines()[-1]  # the key is created first, and its creation logged
    assert f"{tmp_path / 'data' / 'snapshot.version'} is a directory where a file belongs" in last
    assert "Traceback" not in r.stderr


def test_data_dir_on_read_only_file_system(small_fs):
    load_or_create_identity(small_fs.path / "old")  # a node that ran before: its key is there, counters not
    r = subprocess.run(["mount", "-o", "remount,ro", str(small_fs.path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only: {r.stderr.strip()}")
    for data in (small_fs.path / "new", small_fs.path / "old"):
        one_line(run_agent(data), f"the data dir {data} is on a read-only file system",
                 "remount it read-write, or choose another --data-dir")


def test_data_dir_on_full_file_system(small_fs):
    with open(small_fs.ballast, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    data = small_fs.path / "data"
    one_line(run_agent(data), f"cannot write to the data dir {data}: no space left on its file system",
             "free some space, or choose another --data-dir")


def test_bind_failure_after_the_check_is_translated(tmp_path, monkeypatch, capsys):
    """The agent's own bind (inside trio.run, in exception groups) fails the same way when the port is taken
    between the check and the bind."""
    monkeypatch.setattr(_agent, "_check_listen", lambda host, port: None)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code = cli.main(["agent", "--data-dir", str(tmp_path / "data"), "--bind", "127.0.0.1", "--port", str(port),
                         "--no-mdns"])
    assert code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"p2pnode: cannot listen on 127.0.0.1:{port}: address already in use (another agent running? "
                   "stop it or choose another --port)"]


def test_startup_cause_unwraps_groups_of_our_errors_only():
    bind = OSError(errno.EADDRINUSE, "Address already in use")
    assert _agent._startup_cause(ExceptionGroup("a", [ExceptionGroup("b", [bind])])) is bind
    ident = IdentityError("bad key")
    assert _agent._startup_cause(ExceptionGroup("a", [ident])) is ident
    assert _agent._startup_cause(ExceptionGroup("a", [bind, ValueError("bug")])) is None
    assert _agent._startup_cause(ValueError("bug")) is None
