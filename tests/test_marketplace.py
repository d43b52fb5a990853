"""A marketplace container's public address and port mapping, from its provider's environment (issue 25):
decoded once, bounded, refused by name when malformed; the operator's own settings come first."""

import pytest

from p2pnode.config import AgentConfig, ProviderNat, provider_nat
from p2pnode.drivers._host import advertised_addr
from p2pnode.errors import ConfigError

VAST = {"PUBLIC_IPADDR": "65.130.162.74", "VAST_TCP_PORT_8770": "33526", "VAST_TCP_PORT_8771": "33527",
        "VAST_TCP_PORT_22": "40000", "VAST_TCP_PORT_70000": "70000"}


def test_vast_and_runpod_variables_give_the_public_ip_and_each_mapped_port():
    nat = provider_nat(VAST)
    assert nat == ProviderNat("vast.ai", "65.130.162.74", {22: 40000, 8770: 33526, 8771: 33527})
    assert nat.public(8770) == 33526 and nat.public(9000) is None  # an identity map above 65535 is not a port
    runpod = provider_nat({"RUNPOD_PUBLIC_IP": "2001:db8::7", "RUNPOD_TCP_PORT_8770": " 10022 "})
    assert runpod == ProviderNat("runpod", "2001:db8::7", {8770: 10022})
    assert provider_nat({"HOME": "/root", "VAST_TCP_PORT_8770": "1"}) is None  # no public IP: not a container
    assert provider_nat({"PUBLIC_IPADDR": ""}) is None


@pytest.mark.parametrize("env, named", [
    ({"PUBLIC_IPADDR": "65.130.162"}, "PUBLIC_IPADDR"),
    ({"PUBLIC_IPADDR": "٦٥.١٣٠.١٦٢.٧٤"}, "PUBLIC_IPADDR"),  # Arabic-Indic digits
    ({"PUBLIC_IPADDR": "1.2.3.4\n"}, None),  # stripped: fine
    ({"PUBLIC_IPADDR": "1.2.3.4", "VAST_TCP_PORT_8770": "٣٣٥٢٦"}, "VAST_TCP_PORT_8770"),
    ({"PUBLIC_IPADDR": "1.2.3.4", "VAST_TCP_PORT_8770": "99999"}, "VAST_TCP_PORT_8770"),
    ({"PUBLIC_IPADDR": "1.2.3.4", "VAST_TCP_PORT_8770": "0"}, "VAST_TCP_PORT_8770"),
    ({"PUBLIC_IPADDR": "1.2.3.4", "VAST_TCP_PORT_8770": "-1"}, "VAST_TCP_PORT_8770"),
    ({"PUBLIC_IPADDR": "1.2.3.4", "VAST_TCP_PORT_8770": "1e3"}, "VAST_TCP_PORT_8770"),
    ({"PUBLIC_IPADDR": "1.2.3.4", "VAST_TCP_PORT_8770": "9" * 400}, "VAST_TCP_PORT_8770"),
    ({"RUNPOD_PUBLIC_IP": "x" * 10_000}, "RUNPOD_PUBLIC_IP"),
    ({"PUBLIC_IPADDR": "1.2.3.4\x00"}, "PUBLIC_IPADDR"),
    ({"PUBLIC_IPADDR": "0.0.0.0"}, "not an address peers can dial"),
    ({"PUBLIC_IPADDR": "127.0.0.1"}, "not an address peers can dial"),
    ({"RUNPOD_PUBLIC_IP": "::1"}, "not an address peers can dial"),
    ({"PUBLIC_IPADDR": "224.0.0.251"}, "not an address peers can dial"),
    ({"PUBLIC_IPADDR": "169.254.1.1"}, "not an address peers can dial"),
    ({"RUNPOD_PUBLIC_IP": "::ffff:127.0.0.1"}, "not an address peers can dial"),
    ({"PUBLIC_IPADDR": "255.255.255.255"}, "not an address peers can dial"),
    ({"PUBLIC_IPADDR": "0.1.2.3"}, "not an address peers can dial"),
    ({"PUBLIC_IPADDR": "240.0.0.1"}, "not an address peers can dial"),
])
def test_a_malformed_variable_is_refused_by_name(env, named):
    if named is None:
        assert provider_nat(env).public_ip == "1.2.3.4"
        return
    with pytest.raises(ConfigError, match=named) as info:
        provider_nat(env)
    assert len(str(info.value)) < 200  # the value is quoted, capped


def test_a_port_name_with_a_leading_zero_is_not_a_port_and_collides_with_none():
    env = {"PUBLIC_IPADDR": "1.2.3.4", "VAST_TCP_PORT_8770": "33526", "VAST_TCP_PORT_08770": "40000"}
    assert provider_nat(env).ports == {8770: 33526}


def test_the_operator_advertised_address_takes_no_provider_port():
    from p2pnode.drivers._host import provider_ports

    nat = provider_nat(VAST)
    addr, source = advertised_addr(AgentConfig(advertise="203.0.113.7:9000"), 8770, nat)
    assert provider_ports(nat, source) == {}  # the data port: sync.advertise_data_port, else the bound one
    addr, source = advertised_addr(AgentConfig(), 8770, nat)
    assert provider_ports(nat, source) == nat.ports and provider_ports(None, "bind") == {}


def test_the_mapping_is_bounded():
    env = {"PUBLIC_IPADDR": "1.2.3.4", **{f"VAST_TCP_PORT_{p}": str(p) for p in range(1, 5000)}}
    assert len(provider_nat(env).ports) == 256


def test_advertised_address_the_operator_first_then_the_provider_then_the_bind(caplog):
    nat = provider_nat(VAST)
    assert advertised_addr(AgentConfig(advertise="203.0.113.7:9000"), 8770, nat) == ("203.0.113.7:9000", "config")
    assert advertised_addr(AgentConfig(bind="10.0.0.2"), 8770, nat) == ("65.130.162.74:33526", "vast.ai")
    assert advertised_addr(AgentConfig(bind="10.0.0.2"), 8770, None) == ("10.0.0.2:8770", "bind")
    with caplog.at_level("WARNING"):
        assert advertised_addr(AgentConfig(bind="10.0.0.2"), 8123, nat) == ("65.130.162.74:8123", "vast.ai")
    assert "maps no public port to 8123" in caplog.text
    v6 = provider_nat({"RUNPOD_PUBLIC_IP": "2001:db8::7", "RUNPOD_TCP_PORT_8770": "10022"})
    assert advertised_addr(AgentConfig(), 8770, v6) == ("[2001:db8::7]:10022", "runpod")


def test_a_bad_provider_variable_stops_the_agent_with_one_line(tmp_path, monkeypatch, capsys):
    from p2pnode.cli import main

    monkeypatch.setenv("PUBLIC_IPADDR", "1.2.3.4")
    monkeypatch.setenv("VAST_TCP_PORT_8770", "port")
    assert main(["agent", "--data-dir", str(tmp_path), "--port", "0", "--no-mdns"]) == 2
    err = capsys.readouterr().err
    assert "VAST_TCP_PORT_8770='port' (vast.ai) is not a port number" in err and len(err.splitlines()) == 1


def test_an_ipv6_scope_id_is_refused():
    with pytest.raises(ConfigError, match="RUNPOD_PUBLIC_IP"):
        provider_nat({"RUNPOD_PUBLIC_IP": "fe80::1%eth0"})
