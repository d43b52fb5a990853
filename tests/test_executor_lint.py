"""Only the effect executor starts and stops jobs (issue 39): an AST scan of ``p2pnode/`` finds every call of the
job runner's ``start(`` or ``stop(`` (on ``runner``, ``self.runner``, ``x._runner``, or ``self`` inside
:class:`p2pnode.jobs.JobRunner`) and fails for one outside :meth:`p2pnode.jobs._control.JobControl.apply`. Every
stop is then an effect with a rule the core (:mod:`p2pnode.node._stoprules`, :class:`p2pnode.node.JobCore`)
chose. A probe lints a source with a stop added elsewhere and shows that the check fails."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXECUTOR = {("p2pnode/jobs/_control.py", "JobControl.apply")}
"""(module, qualified function) allowed to call the runner's start and stop."""
RUNNER_NAMES = {"runner", "_runner"}
RUNNER_CLASS = "JobRunner"
METHODS = {"start", "stop"}


def _is_runner(node: ast.expr, cls: str | None) -> bool:
    if isinstance(node, ast.Name):
        return node.id in RUNNER_NAMES or (node.id == "self" and cls == RUNNER_CLASS)
    return isinstance(node, ast.Attribute) and node.attr in RUNNER_NAMES


def runner_calls(source: str, module: str) -> list[tuple[str, str, int]]:
    """``(module, qualified function, line)`` of each call of the runner's start or stop in ``source``."""
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, scope: list[str], cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, [*scope, child.name], child.name)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, [*scope, child.name], cls)
            else:
                if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                        and child.func.attr in METHODS and _is_runner(child.func.value, cls)):
                    found.append((module, ".".join(scope), child.lineno))
                visit(child, scope, cls)

    visit(ast.parse(source), [], None)
    return found


def misplaced(calls: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    return [c for c in calls if (c[0], c[1]) not in EXECUTOR]


def _all_calls() -> list[tuple[str, str, int]]:
    calls = []
    for path in sorted((ROOT / "p2pnode").rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        calls += runner_calls(path.read_text(), module)
    return calls


def test_only_the_executor_calls_the_runners_start_and_stop():
    calls = _all_calls()
    assert misplaced(calls) == [], "start or stop a job only through JobControl.apply (an effect with its rule)"
    # the scan sees the executor's own calls: it is not blind
    assert {(m, f) for m, f, _ in calls} == EXECUTOR
    assert len(calls) >= 2


def test_the_probe_a_stop_added_elsewhere_fails_the_check():
    module = "p2pnode/jobs/_operator.py"
    src = (ROOT / module).read_text()
    assert misplaced(runner_calls(src, module)) == []
    probe = src + ("\n\ndef _sneaky(control):\n    control.runner.stop('j1', 'because')\n"
                   "\n\nclass JobRunner:\n    def tick(self):\n        self.stop('j2', 'maximum runtime reached')\n"
                   "\n\nasync def _sneaky_start(runner):\n    runner.start(job_id='j3')\n")
    bad = misplaced(runner_calls(probe, module))
    assert [f for _, f, _ in bad] == ["_sneaky", "JobRunner.tick", "_sneaky_start"]
    # a start or stop of something else is no runner call (nurseries, scopes, the agent)
    other = "def f(n, agent):\n    n.start(g)\n    agent.stop()\n    self.runner.run()\n"
    assert runner_calls(other, module) == []
