"""Run real `p2pnode agent` processes for tests (loopback or inside a network namespace)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AgentProc:
    """One agent subprocess. ``prefix`` wraps the command (e.g. ``ip netns exec NS``)."""

    def __init__(self, data_dir: Path, port: int, *args: str, bind: str = "127.0.0.1", prefix: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.bind = bind
        self.args = list(args)
        self.prefix = prefix or []
        # several durable agents share a host in tests: each takes a free data-channel port (advertised by gossip)
        # The host's CPU is not assessed (guard.cpu_max_percent 0): tests run on a busy machine (a second suite
        # beside this one is the normal case) and test placement, not this host's load; the guard's CPU rules are
        # tested with injected samples.
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "P2PNODE_SYNC_DATA_PORT": "0",
                    "P2PNODE_CPU_MAX_PERCENT": "0", **(env or {})}
        self.env.setdefault("P2PNODE_ALLOW_PRIVATE_ADVERTISE", "1")  # loopback clusters (a test may set "0")
        self.proc: subprocess.Popen | None = None
        self.log = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}"

    def start(self) -> AgentProc:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [*self.prefix, sys.executable, "-m", "p2pnode", "agent", "--data-dir", str(self.data_dir),
               "--bind", self.bind, "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"), env=self.env)
        return self

    def get(self, path: str, timeout: float = 2.0) -> dict:
        return httpx.get(self.url + path, timeout=timeout, trust_env=False).json()

    def status(self) -> dict:
        return self.get("/status")

    def wait_ready(self, timeout: float = 60.0) -> dict:
        """The agent's ``/status`` once it answers. The bound is for a busy machine (a second suite beside this
        one, five agents importing at once on 2 cores: starts of 20 s and more were seen); a quiet start takes
        one or two seconds. Raises with the agent's log when it exits or the bound passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                return self.status()
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError(f"agent on {self.url} not ready:\n{self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> float:
        """Send ``sig`` and wait; returns seconds until exit. Kills (SIGKILL) after ``timeout``."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_until(pred, timeout: float, interval: float = 0.25, what: str = "condition",
               retry_on: tuple[type[BaseException], ...] = (httpx.HTTPError,)):
    """``pred()``'s first truthy value within ``timeout`` seconds; exceptions in ``retry_on`` count as "not yet"."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except retry_on as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
