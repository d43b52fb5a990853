"""Docs and deploy files stay true to the code."""

import json
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


def test_readme_runs_the_engine_tests_in_one_command_that_ci_builds_with():
    """The gang tests on real engines skip under the test command (no ``.engines``): the README names the one
    command that builds the engines and runs them, and ``.ci/run`` builds them with the same script."""
    readme = (ROOT / "README.md").read_text()
    assert "`bash .ci/engines --test`" in readme
    script = (ROOT / ".ci" / "engines").read_text()
    assert "tests/test_netns_gangs.py" in script and "torch==2.13.0" in script
    assert "\nbash .ci/engines " in (ROOT / ".ci" / "run").read_text()


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
    leader's plan has work waiting, and not when nothing waits or the GPUs are in the band; FleetQueueGrowing,
    ScalingProviderFailing and ScalingActionFailed (the p2pnode-fleet group) each with cases that fire and cases
    that do not."""
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


def _doc_commands() -> list[tuple[str, int, str]]:
    """Every ``p2pnode`` command in the shell blocks of README.md and docs/*.md, as ``(file, line, command)``; a
    trailing ``# comment`` and a ``sudo -u USER`` prefix left out."""
    import re

    from p2pnode.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        in_block = False
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("```"):
                in_block = not in_block and line[3:].strip() in ("sh", "bash", "shell", "console")
                continue
            if not in_block:
                continue
            code = re.split(r";|&&|\|\||\|", line.split(" #", 1)[0])[0].strip()  # the first command of a list
            for m in re.finditer(r"(?:^|\s)p2pnode\s+(\S+)", code):
                if m.group(1) in commands or m.group(1).startswith("-"):
                    found.append((path.name, n, code[m.start():].strip()))
                    break
    return found


def test_every_documented_command_parses_and_names_what_the_demo_catalog_has():
    """The README's and docs' command examples stay true: each parses with the CLI's own parser, and the templates,
    parameters and configs they name exist in the demo catalog (issue 25: ``jobs run eval-hex8 --param games=50``
    named neither)."""
    import contextlib
    import io
    import shlex

    from p2pnode.cli import build_parser
    from p2pnode.scheduler import load_catalog

    catalog = load_catalog(ROOT / "deploy" / "examples" / "demo" / "catalog.toml")
    configs = {t.config for t in catalog.templates.values()}
    found = _doc_commands()
    assert len(found) >= 40, found  # the extraction sees the docs' examples
    problems = []
    for name, line, command in found:
        argv = shlex.split(command)[1:]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ns = build_parser().parse_args(argv)
        except SystemExit as exc:
            if exc.code:
                problems.append(f"{name}:{line}: {command}: {err.getvalue().strip().splitlines()[-1]}")
            continue
        if argv[:2] == ["jobs", "run"]:
            template = catalog.templates.get(ns.template)
            if template is None:
                problems.append(f"{name}:{line}: {command}: no template {ns.template!r} in the demo catalog")
                continue
            try:
                template.param_values({k: json.loads(v) for k, v in (kv.split("=", 1) for kv in ns.param or ())})
            except ValueError as exc:
                problems.append(f"{name}:{line}: {command}: {exc}")
        if argv[:2] == ["signals", "set"] and ns.config not in configs:
            problems.append(f"{name}:{line}: {command}: no config {ns.config!r} in the demo catalog")
        for flag in ("--catalog", "--config"):  # a file of this repository (not the user's own p2pnode.toml)
            if flag in argv and argv[argv.index(flag) + 1].startswith("deploy/"):
                path = ROOT / argv[argv.index(flag) + 1]
                if not path.exists():
                    problems.append(f"{name}:{line}: {command}: {path.relative_to(ROOT)} does not exist")
    assert not problems, "\n".join(problems)
