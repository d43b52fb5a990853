"""Two marketplace containers behind a port mapping (issue 25), in network namespaces the test builds and removes:
each agent sits on a private subnet behind a NAT box that, as a Vast.ai host does, publishes its gossip and data
ports as other ports on a public address (iptables DNAT in, SNAT out) and forwards nothing else. Given only the
provider's variables (``PUBLIC_IPADDR``, ``VAST_TCP_PORT_<port>``) and the other's public gossip port to join, the
agents advertise their mapped addresses, find each other, gossip, and a file of the ephemeral one syncs to the
durable one over the data channel (not the HTTP fallback)."""

import json
import os
import shutil
import subprocess

import pytest
from agents import AgentProc, wait_until
from netns import require_netns

pytestmark = [pytest.mark.netns, pytest.mark.slow]

PRIVATE = ("10.215.1", "10.215.2")  # each container's subnet: .1 the NAT box, .2 the container
PUBLIC = ("10.216.0.1", "10.216.0.2")  # each host's public address, on the NAT box
MAPPED = ({8770: 40001, 8771: 40002}, {8770: 40011, 8771: 40012})  # internal -> public port, per host


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


class NatLab:
    """Namespaces ``<prefix>-nat`` (the hosts' NAT and the network between them) and ``<prefix>-c0``, ``-c1`` (the
    containers). Removed by name in :meth:`close`."""

    def __init__(self) -> None:
        self.prefix = f"p2pm{os.getpid() % 100000}"
        self.nat = f"{self.prefix}-nat"
        self.names = [f"{self.prefix}-c0", f"{self.prefix}-c1"]
        self.created: list[str] = []
        try:
            for ns in (self.nat, *self.names):
                _run("ip", "netns", "del", ns, check=False)
                _run("ip", "netns", "add", ns)
                self.created.append(ns)
            self.sh(self.nat, "ip", "link", "set", "lo", "up")
            self.sh(self.nat, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            ipt = ["iptables", "-w"]
            self.sh(self.nat, *ipt, "-P", "FORWARD", "DROP")  # nothing crosses but the mapped ports
            self.sh(self.nat, *ipt, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED,DNAT",
                    "-j", "ACCEPT")
            for i, (net, public, ns) in enumerate(zip(PRIVATE, PUBLIC, self.names, strict=True)):
                outer, inner = f"{self.prefix}n{i}", f"{self.prefix}c{i}"
                _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
                _run("ip", "link", "set", outer, "netns", self.nat)
                _run("ip", "link", "set", inner, "netns", ns)
                self.sh(self.nat, "ip", "addr", "add", f"{net}.1/24", "dev", outer)
                self.sh(self.nat, "ip", "link", "set", outer, "up")
                self.sh(self.nat, "ip", "addr", "add", f"{public}/32", "dev", "lo")
                self.sh(ns, "ip", "addr", "add", f"{net}.2/24", "dev", inner)
                self.sh(ns, "ip", "link", "set", inner, "up")
                self.sh(ns, "ip", "link", "set", "lo", "up")
                self.sh(ns, "ip", "route", "add", "default", "via", f"{net}.1")
                for internal, port in MAPPED[i].items():
                    self.sh(self.nat, *ipt, "-t", "nat", "-A", "PREROUTING", "-d", public, "-p", "tcp", "--dport",
                            str(port), "-j", "DNAT", "--to-destination", f"{net}.2:{internal}")
                self.sh(self.nat, *ipt, "-t", "nat", "-A", "POSTROUTING", "-s", f"{net}.2", "-j", "SNAT",
                        "--to-source", public)
        except BaseException:
            self.close()
            raise

    def sh(self, ns: str, *args: str) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", ns, *args)

    def get(self, i: int, path: str) -> dict:
        """``path`` of container ``i``'s agent, asked from inside its namespace."""
        out = self.sh(self.names[i], "python3", "-c",
                      "import json,urllib.request as u;"
                      f"print(json.dumps(json.load(u.urlopen('http://{PRIVATE[i]}.2:8770{path}',timeout=3))))")
        return json.loads(out.stdout)

    def reaches(self, i: int, host: str, port: int) -> bool:
        """Whether container ``i`` can open a TCP connection to ``host:port``."""
        r = _run("ip", "netns", "exec", self.names[i], "python3", "-c",
                 f"import socket; socket.create_connection(('{host}', {port}), timeout=2).close()", check=False)
        return r.returncode == 0

    def close(self) -> None:
        for ns in reversed(self.created):
            _run("ip", "netns", "del", ns, check=False)  # its veth ends and iptables rules go with it
        self.created.clear()


def test_marketplace_nodes_find_each_other_by_their_mapped_ports_and_sync_over_the_data_channel(tmp_path):
    require_netns()
    if shutil.which("iptables") is None:
        pytest.skip("the port mapping needs iptables (Debian package iptables; .ci/run installs it)")
    lab = NatLab()
    procs = []
    try:
        tags = ["ephemeral", "durable"]
        for i, tag in enumerate(tags):
            env = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SYNC_INTERVAL_S": "1",
                   "P2PNODE_SYNC_DATA_PORT": "8771", "PUBLIC_IPADDR": PUBLIC[i],
                   **{f"VAST_TCP_PORT_{p}": str(q) for p, q in MAPPED[i].items()}}
            other = 1 - i
            args = ["--no-mdns", "--tag", tag, "--join", f"{PUBLIC[other]}:{MAPPED[other][8770]}"]
            procs.append(AgentProc(tmp_path / f"n{i}", 8770, *args, bind=f"{PRIVATE[i]}.2",
                                   prefix=["ip", "netns", "exec", lab.names[i]], env=env).start())

        def both_alive():
            for i in (0, 1):
                if procs[i].proc.poll() is not None:
                    raise AssertionError(procs[i].log.read_text()[-3000:])
            views = [lab.get(i, "/members")["members"] for i in (0, 1)]
            return all(len(v) == 2 and all(m["state"] == "alive" for m in v) for v in views) and views

        views = wait_until(both_alive, 45, interval=0.5, what="both agents alive in both views",
                           retry_on=(Exception,))
        # Nothing but the mapping joins the two: the durable agent listens on its private address, unreachable.
        assert lab.reaches(0, PUBLIC[1], MAPPED[1][8770]) and not lab.reaches(0, f"{PRIVATE[1]}.2", 8770)
        for i in (0, 1):
            node = lab.get(i, "/status")["node"]
            assert node["addr"] == f"{PUBLIC[i]}:{MAPPED[i][8770]}" and node["addr_source"] == "vast.ai", node
            seen = {m["id"]: m for m in views[1 - i]}[node["id"]]
            assert seen["addr"] == f"{PUBLIC[i]}:{MAPPED[i][8770]}"  # what the other dials
        did = lab.get(1, "/status")["node"]["id"]

        def data_port_seen():  # the mapped data port, signed in the durable node's snapshot, as the other sees it
            return {m["id"]: m for m in lab.get(0, "/members")["members"]}[did]["sync"].get("data_port")

        assert wait_until(data_port_seen, 30, interval=0.5, what="the durable node's data port",
                          retry_on=(Exception,)) == MAPPED[1][8771]
        assert lab.get(1, "/sync/status")["advertised_data_port"] == MAPPED[1][8771]

        shard = tmp_path / "n0" / "data" / "cfg" / "shard-1.npz"
        shard.parent.mkdir(parents=True)
        tmp = shard.with_name(".shard-1.npz.tmp")
        tmp.write_bytes(os.urandom(3 * 2**20))
        os.replace(tmp, shard)
        wait_until(lambda: [f["replicas"] for f in lab.get(0, "/sync/status")["files"]] == [1], 60, interval=0.5,
                   what="the shard on the durable node", retry_on=(Exception,))
        eid = lab.get(0, "/status")["node"]["id"]
        assert (tmp_path / "n1" / "replicas" / eid / "cfg" / "shard-1.npz").read_bytes() == shard.read_bytes()
        sent = lab.get(0, "/sync/status")["sent"]
        assert sent["streams"] >= 1 and sent["channel_fallbacks"] == 0, sent  # the data channel, through the map
    finally:
        for p in procs:
            p.kill()
        lab.close()
