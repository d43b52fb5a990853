"""`p2pnode demo --base-port B`: every port the demo opens is known before it starts (HTTP ports B.., then each
agent's data-channel port), checked free, and refused by name when one is taken (issue 25)."""

import socket

import pytest

from p2pnode._demo import Demo, run_demo


def _free_run(length: int) -> int:
    """A port P on 127.0.0.1 with P .. P+length-1 free now."""
    for start in range(20000, 60000, 97):
        socks = []
        try:
            for p in range(start, start + length):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return start
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no run of free ports on 127.0.0.1")


def test_base_port_fixes_http_and_data_ports_and_names_a_taken_one():
    base = _free_run(10)
    demo = Demo(nodes=5, base_port=base, keep=False, gossip_profile="local-test")
    assert demo.ports() == (list(range(base, base + 5)), list(range(base + 5, base + 10)))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", base + 7))  # a data port
        s.listen()
        with pytest.raises(OSError, match=f"port {base + 7} on 127.0.0.1 is in use"):
            demo.ports()


def test_base_port_zero_leaves_each_data_port_to_its_agent():
    http, data = Demo(nodes=3, base_port=0, keep=False, gossip_profile="lan").ports()
    assert len(set(http)) == 3 and all(p > 0 for p in http) and data == [0, 0, 0]


def test_a_base_port_without_room_for_both_ranges_is_refused(capsys):
    assert run_demo(nodes=5, base_port=65530) == 2
    assert "two ports per node" in capsys.readouterr().err
