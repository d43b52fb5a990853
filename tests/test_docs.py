"""Docs and deploy files stay true to the code."""

from pathlib import Path

from p2pnode.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def test_example_config_loads_and_lists_every_key():
    cfg = load_config(ROOT / "deploy" / "p2pnode.example.toml", env={})
    text = (ROOT / "deploy" / "p2pnode.example.toml").read_text()
    for section, values in cfg.to_dict().items():
        for key in values:
            assert key in text, f"[{section}] {key} missing from the example config"


def test_configuration_doc_lists_every_key():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for section, values in load_config(None, env={}).to_dict().items():
        assert f"[{section}]" in doc
        for key in values:
            assert key in doc, f"{key} missing from docs/configuration.md"


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0].strip() for b in setup.split("```sh\n")[1:]]
    assert len(blocks) == 2
    assert blocks[0].endswith("p2pnode agent")
    assert blocks[1] in (ROOT / ".ci" / "run").read_text()


def test_alert_rules_pass_promtool():
    import shutil
    import subprocess

    import pytest

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) not installed")
    r = subprocess.run([promtool, "check", "rules", str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    rules = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text().count("- alert:")
    assert rules >= 8 and f"SUCCESS: {rules} rules found" in r.stdout


def test_alert_rule_cases_pass_promtool_test_rules():
    """``deploy/prometheus/alerts_test.yml``: GpusIdleWhileWorkWaits fires when GPUs stay below the band while the
    leader's plan has work waiting, and not when nothing waits or the GPUs are in the band."""
    import shutil
    import subprocess

    import pytest

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) not installed")
    r = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], capture_output=True, text=True,
                       cwd=ROOT / "deploy" / "prometheus")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_example_catalog_is_valid():
    from p2pnode.scheduler import load_catalog

    c = load_catalog(ROOT / "deploy" / "examples" / "catalog.toml")
    assert {t.kind for t in c.templates.values()} == {"selfplay", "training", "evaluation"}
