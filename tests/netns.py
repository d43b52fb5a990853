"""Test hosts in Linux network namespaces joined by veth links (created and removed by the test itself)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def require_netns() -> None:
    """Skip the calling test, with the reason, unless this process may create network namespaces."""
    if os.geteuid() != 0:
        pytest.skip("network-namespace tests need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("network-namespace tests need iproute2 (`ip`)")
    probe = f"p2pn-probe-{os.getpid()}"
    r = _run("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {r.stderr.strip()}")
    _run("ip", "netns", "del", probe, check=False)


def _free_octet(pid: int) -> int:
    """A second octet in 100-199 that no IPv4 address of this namespace has after ``10.`` (see :class:`NetnsLab`)."""
    used = _run("ip", "-o", "-4", "addr", "show", check=False).stdout
    for k in range(100):
        octet = 100 + (pid + k) % 100
        if f" 10.{octet}." not in used:
            return octet
    return 100 + pid % 100


class NetnsLab:
    """Namespaces ``<prefix>-<i>`` on one L2 segment: a bridge in its own namespace, one veth per host.

    Host ``i`` gets ``10.<o>.<net>.<i+1>/24``; with ``host_link`` the test process joins the segment too, as
    ``10.<o>.<net>.254``. The second octet ``o`` (100-199) is one no address of this host's namespace uses yet,
    searched from one derived from the pid: two suites running side by side (the load our tests must bear) would
    otherwise both add 10.213.<net>.254 to the host and each reach the other's agents. Everything is removed by
    name in :meth:`close`.
    """

    def __init__(self, n: int, *, net: int = 0, host_link: bool = False) -> None:
        self.prefix = f"p2pn{os.getpid() % 100000}"
        self.octet = _free_octet(os.getpid())
        self.hub = f"{self.prefix}-hub"
        self.names: list[str] = []
        self.addrs: list[str] = []
        self.created: list[str] = []
        try:
            self._add_ns(self.hub)
            self.sh(self.hub, "ip", "link", "add", "br0", "type", "bridge")
            self.sh(self.hub, "ip", "link", "set", "br0", "up")
            for i in range(n):
                name = f"{self.prefix}-{i}"
                self._add_ns(name)
                host_if, hub_if = f"{self.prefix}h{i}", f"{self.prefix}b{i}"
                _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", hub_if)
                _run("ip", "link", "set", host_if, "netns", name)
                _run("ip", "link", "set", hub_if, "netns", self.hub)
                self.sh(self.hub, "ip", "link", "set", hub_if, "master", "br0")
                self.sh(self.hub, "ip", "link", "set", hub_if, "up")
                addr = f"10.{self.octet}.{net}.{i + 1}"
                self.sh(name, "ip", "addr", "add", f"{addr}/24", "dev", host_if)
                self.sh(name, "ip", "link", "set", host_if, "up")
                self.sh(name, "ip", "link", "set", "lo", "up")
                self.names.append(name)
                self.addrs.append(addr)
            if host_link:
                # The test process itself joins the segment as 10.<o>.<net>.254, to talk to agents directly.
                host_if, hub_if = f"{self.prefix}hh", f"{self.prefix}hb"
                _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", hub_if)
                self.host_if = host_if
                _run("ip", "link", "set", hub_if, "netns", self.hub)
                self.sh(self.hub, "ip", "link", "set", hub_if, "master", "br0")
                self.sh(self.hub, "ip", "link", "set", hub_if, "up")
                _run("ip", "addr", "add", f"10.{self.octet}.{net}.254/24", "dev", host_if)
                _run("ip", "link", "set", host_if, "up")
        except BaseException:
            self.close()
            raise

    def _add_ns(self, name: str) -> None:
        _run("ip", "netns", "del", name, check=False)  # a leftover of a killed run with the same pid
        _run("ip", "netns", "add", name)
        self.created.append(name)

    def sh(self, ns: str, *args: str) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", ns, *args)

    def prefix_for(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]

    def link(self, i: int, up: bool) -> None:
        """Cut (``up=False``) or restore host ``i``'s link to the segment."""
        self.sh(self.hub, "ip", "link", "set", f"{self.prefix}b{i}", "up" if up else "down")

    def close(self) -> None:
        if getattr(self, "host_if", None):
            _run("ip", "link", "del", self.host_if, check=False)  # also removes its peer in the hub
            self.host_if = None
        for name in reversed(self.created):
            _run("ip", "netns", "del", name, check=False)
        self.created.clear()
