from pathlib import Path

import pytest

from p2pnode.cli import build_parser, main
from p2pnode.config import Config, load_config
from p2pnode.errors import ConfigError


def write(tmp_path, text):
    p = tmp_path / "p2pnode.toml"
    p.write_text(text)
    return p


def test_defaults_need_no_file(monkeypatch, tmp_path):
    monkeypatch.setenv("P2PNODE_DATA_DIR", str(tmp_path / "d"))
    c = load_config(None, env={})
    assert c.agent.port == 8770 and c.discovery.mdns is True and c.agent.trust == "open"
    assert c.gossip_interval_s == 1.0 and c.gossip.fanout == 3 and c.gossip.max_body_bytes == 1024 * 1024
    assert c.agent.data_dir == tmp_path / "d"
    assert c.scheduler.lease_s == 30.0 and c.scheduler.lease_s > c.scheduler.stop_grace_s


def test_precedence_flags_over_env_over_file(tmp_path):
    f = write(tmp_path, '[agent]\nport = 9001\nbind = "127.0.0.1"\ntags = ["durable"]\n[gossip]\nfanout = 5\n')
    c = load_config(f, env={})
    assert (c.agent.port, c.agent.bind, c.agent.tags, c.gossip.fanout) == (9001, "127.0.0.1", ("durable",), 5)
    env = {"P2PNODE_PORT": "9002", "P2PNODE_GOSSIP_FANOUT": "4", "P2PNODE_MDNS": "off", "P2PNODE_TAGS": "a, b"}
    c = load_config(f, env=env)
    assert (c.agent.port, c.gossip.fanout, c.discovery.mdns, c.agent.tags) == (9002, 4, False, ("a", "b"))
    c = load_config(f, env=env, overrides={"agent": {"port": 9003, "bind": None}})
    assert c.agent.port == 9003 and c.agent.bind == "127.0.0.1"


@pytest.mark.parametrize(
    "text, match",
    [
        ("[agent]\nprot = 1\n", "unknown key 'prot' in \\[agent\\]"),
        ("[agnet]\n", "unknown section \\[agnet\\]"),
        ("[agent]\nport = 'x'\n", "\\[agent\\] port: expected an integer"),
        ("[gossip]\nfanout = 0\n", "fanout must be at least 1"),
        ("[agent]\ntrust = 'token'\n", "needs a cluster token"),
        ("[agent]\nfake_gpus = 'Voodoo'\n", "unknown GPU model"),
        ("[agent]\njoin = ['a:b:c']\n", "agent.join"),
        ("not toml [", "invalid TOML"),
        ("[scheduler]\nlease_s = 5\n", "lease_s must be 0 \\(off\\) or above stop_grace_s"),
        ("[scheduler]\nlease_s = -1\n", "lease_s must be 0"),
        ("[agent]\ninterruption_probe = \"probe 'unclosed\"\n", "agent.interruption_probe: No closing quotation"),
        ("[agent]\ninterruption_probe_interval_s = 0\n", "interruption_probe_interval_s must be between"),
        ("[agent]\ninterruption_probe_timeout_s = 601\n", "interruption_probe_timeout_s must be between"),
        ("[scheduler]\nmax_close_hold_s = -1\n", "max_close_hold_s must be between 0 and 3600"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, text), env={})


def test_bad_env_names_the_variable():
    with pytest.raises(ConfigError, match="P2PNODE_GOSSIP_INTERVAL_S"):
        load_config(None, env={"P2PNODE_GOSSIP_INTERVAL_S": "fast"})


def test_token_is_masked_in_show(tmp_path):
    c = load_config(None, env={"P2PNODE_TRUST": "token", "P2PNODE_CLUSTER_TOKEN": "hunter2-hunter2-hunter2"})
    assert c.agent.cluster_token == "hunter2-hunter2-hunter2"
    assert c.to_dict()["agent"]["cluster_token"] == "********"


def test_cli_config_show_and_error_exit(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("P2PNODE_DATA_DIR", str(tmp_path))
    assert main(["config", "show", "--port", "1234", "--join", "h:1", "--join", "h:2"]) == 0
    out = capsys.readouterr().out
    assert '"port": 1234' in out and '"h:2"' in out
    assert main(["config", "show", "--fake-gpus", "nope"]) == 2
    assert "unknown GPU model" in capsys.readouterr().err


def test_agent_help_lists_the_documented_flags():
    text = build_parser()._subparsers._group_actions[0].choices["agent"].format_help()
    for flag in ("--config", "--bind", "--port", "--join", "--data-dir", "--no-mdns", "--fake-gpus"):
        assert flag in text
    assert isinstance(Config(), Config) and Path


def test_gossip_profile_and_overrides():
    c = load_config(None, env={"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_GOSSIP_SUSPICION_MULT": "5"})
    m = c.membership()
    assert (m.gossip_interval_s, m.suspicion_mult, m.suspicion_max_timeout_mult) == (0.5, 5.0, 4.0)
    assert c.to_dict()["gossip"]["interval_s"] == 0.5  # `config show` prints resolved values
    assert load_config(None, env={"P2PNODE_GOSSIP_PROFILE": "wan"}).gossip_interval_s == 2.0
    with pytest.raises(ConfigError, match="gossip.profile"):
        load_config(None, env={"P2PNODE_GOSSIP_PROFILE": "moon"})
    with pytest.raises(ConfigError, match="min_voters"):
        load_config(None, env={"P2PNODE_ELECTION_MIN_VOTERS": "0"})


def test_config_validate_rejects_disk_warn_above_max(tmp_path, capsys):
    bad = write(tmp_path, "[guard]\ndisk_warn_percent = 80\ndisk_max_percent = 70\n")
    assert main(["config", "validate", "--config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "guard.disk_warn_percent = 80" in err and "guard.disk_max_percent = 70" in err
    assert main(["config", "validate", "--config", str(write(tmp_path, "[guard]\ndisk_max_percent = 72\n"))]) == 0
    assert "config OK" in capsys.readouterr().out


def test_bad_catalog_is_a_config_error(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text('[[job]]\nname = "x"\nkind = "selfplay"\nconfig = "c"\nargv = ["{nope}"]\n')
    with pytest.raises(ConfigError, match="(?s)agent.catalog: .*placeholder"):
        load_config(None, env={"P2PNODE_CATALOG": str(bad)})


def test_scaling_classes_are_checked_as_nodes_report_them():
    ok = load_config(None, env={"P2PNODE_SCALING_CLASSES": '{"1x4090": {"max_nodes": 2}, "cpu": {"max_nodes": 1}}'})
    assert set(ok.scaling.classes) == {"1x4090", "cpu"}
    for table, why in [('{"1xRTX4090": {"max_nodes": 2}}', "nodes with that GPU report class 1x4090"),
                       ('{"1xH100": {"min_nodes": 3, "max_nodes": 2}}', "min_nodes 3 > max_nodes 2"),
                       ('{"1xH100": {"tags": ["voter"]}}', "never voters"),
                       ('{"1xH100": {"max_nodes": -1}}', "max_nodes"),
                       ('{"1xH100": {"colour": "red"}}', "colour"),
                       ("[" * 5000 + "]" * 5000, "P2PNODE_SCALING_CLASSES")]:
        with pytest.raises(ConfigError, match=why):
            load_config(None, env={"P2PNODE_SCALING_CLASSES": table})
    with pytest.raises(ConfigError, match="No closing quotation"):
        load_config(None, env={"P2PNODE_SCALING_PROVIDER": "command", "P2PNODE_SCALING_COMMAND_UP": "'up",
                               "P2PNODE_SCALING_COMMAND_DOWN": "down"})


@pytest.mark.parametrize("sub", ["d", "d/models", ".", "elsewhere/../d/x"])
def test_subscribe_dir_overlapping_data_dir_is_refused(tmp_path, sub):
    """Review: ``sync.subscribe_dir`` inside, equal to or above ``agent.data_dir`` would let a published name
    replace one of the agent's own files; refused at load. A folder apart, or empty (the default), loads."""
    data = tmp_path / "d"
    with pytest.raises(ConfigError, match="subscribe_dir"):
        load_config(None, env={}, overrides={"agent": {"data_dir": data},
                                             "sync": {"subscribe_dir": str(tmp_path / sub)}})
    for ok in (str(tmp_path / "models"), ""):
        c = load_config(None, env={}, overrides={"agent": {"data_dir": data}, "sync": {"subscribe_dir": ok}})
        assert c.sync.subscribe_dir == ok


def test_interruption_probe_is_local_config_with_bounded_timings(tmp_path):
    c = load_config(write(tmp_path, "[agent]\ninterruption_probe = \"/opt/probe --region 'eu west'\"\n"
                          "interruption_probe_interval_s = 2\ninterruption_probe_timeout_s = 1.5\n"), env={})
    a = c.agent
    assert (a.interruption_probe, a.interruption_probe_interval_s, a.interruption_probe_timeout_s) == (
        "/opt/probe --region 'eu west'", 2.0, 1.5)
    d = load_config(None, env={})
    assert (d.agent.interruption_probe, d.agent.interruption_probe_interval_s,
            d.agent.interruption_probe_timeout_s) == ("", 5.0, 2.0)


def test_the_shipped_unit_stop_timeout_covers_the_default_agent_stop():
    """Review M1: with the default settings a clean agent stop (the longest hold, ``scheduler.max_close_hold_s``,
    then the jobs' exit and the leave: ``_AgentClosing.close_tail_s``) ends before ``deploy/p2pnode.service``'s
    ``TimeoutStopSec`` (before: a hold of up to 120 s against 90 s, and systemd's SIGKILL mid-hold)."""
    from p2pnode._agentclose import LEAVE_MARGIN_S
    from p2pnode.jobs._runner import KILL_WAIT_S

    unit = (Path(__file__).parent.parent / "deploy" / "p2pnode.service").read_text()
    (timeout_s,) = [float(line.split("=", 1)[1]) for line in unit.splitlines() if line.startswith("TimeoutStopSec=")]
    c = load_config(None, env={})
    worst = (c.scheduler.max_close_hold_s + c.scheduler.stop_grace_s + KILL_WAIT_S + c.gossip.leave_timeout_s
             + LEAVE_MARGIN_S)
    assert worst < timeout_s
