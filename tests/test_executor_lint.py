"""Only the effect executor starts and stops jobs (issue 39): an AST scan of ``p2pnode/`` finds every REFERENCE (a
call, a bound method, a callback handed to a nursery) to the job runner's ``start``, ``stop``, ``shutdown`` and its
signalling internals (``_stop_proc``, ``_term``, ``_signal``, ``_stop_all``), on any expression that names a runner
(``runner``, ``self.runner``, ``x._runner``, ``self.job_runner``, a local alias of one, a parameter typed
``JobRunner``, or ``self`` inside :class:`p2pnode.jobs.JobRunner`), every ``getattr`` of one of those names (on
anything), and every ``os.kill`` / ``os.killpg`` (and their import), and fails for one outside the places allowed
(:data:`ALLOWED`, :data:`KILLS`): :meth:`p2pnode.jobs._control.JobControl.apply` starts and stops,
:meth:`~p2pnode.jobs._control.JobControl.shutdown` shuts the runner down, the runner's own stop path signals. Every
stop is then an effect with a rule the core (:mod:`p2pnode.node._stoprules`, :class:`p2pnode.node.JobCore`)
chose. Probes lint sources with a stop added elsewhere, in each way the scan must see, and show that it fails."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER_CLASS = "JobRunner"
RUNNER_CLASSES = {RUNNER_CLASS, "RunnerSignals"}
"""Classes whose ``self`` is the runner (:class:`p2pnode.jobs._runner.RunnerSignals`: a part of it)."""
NAMES = {"start", "stop", "shutdown", "signal_job", "_stop_proc", "_term", "_signal", "_stop_all"}
"""The runner's attributes that start, stop or signal a job."""
_CONTROL, _RUNNER = "p2pnode/jobs/_control.py", "p2pnode/jobs/_runner.py"
ALLOWED: dict[tuple[str, str], set[str]] = {
    (_CONTROL, "JobControl.apply"): {"start", "stop", "signal_job"},  # the one executor of the effects
    (_RUNNER, "RunnerSignals.signal_job"): {"_signal"},  # a checkpoint signal before a stop (issue 41 item 3)
    (_CONTROL, "JobControl.shutdown"): {"shutdown"},  # the agent stops (its stops asked through apply first)
    (_RUNNER, "JobRunner.run"): {"_stop_proc", "shutdown"},  # a stop asked before the nursery; a cancelled run
    (_RUNNER, "JobRunner.stop"): {"_stop_proc"},
    (_RUNNER, "JobRunner._stop_proc"): {"_term", "_signal"},
    (_RUNNER, "JobRunner._term"): {"_signal"},
    (_RUNNER, "JobRunner.shutdown"): {"_stop_all"},
    (_RUNNER, "JobRunner._stop_all"): {"_term", "_signal"},
}
"""(module, qualified function) -> the runner attributes it may name."""
KILLS = {
    (_RUNNER, "JobRunner._signal"),  # the runner's one signal to a job's process group
    ("p2pnode/jobs/_leftovers.py", "reap_leftovers"),  # what an ended job left in its session
    ("p2pnode/providers/_local.py", "LocalProvider.scale_down"),  # the local provider's agents, not jobs
    ("p2pnode/providers/_command.py", "_kill_group"),  # a provider command that timed out
    ("p2pnode/_demo.py", "_signal_group"),  # the demo's agents
}
"""(module, qualified function) allowed ``os.kill`` / ``os.killpg``."""
KILL_FUNCS = {"kill", "killpg"}


def _runnerish(name: str) -> bool:
    return "runner" in name.lower()


def _aliases(tree: ast.AST) -> set[str]:
    """Names bound in the module to a runner expression (``r = self.runner``) or typed ``JobRunner``."""
    found: set[str] = set()
    for _ in range(2):  # (an alias of an alias)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if _is_runner(node.value, None, found):
                    found |= {t.id for t in targets if isinstance(t, ast.Name)}
            if isinstance(node, ast.arg) and node.annotation is not None and RUNNER_CLASS in ast.unparse(
                    node.annotation):
                found.add(node.arg)
    return found


def _is_runner(node: ast.expr, cls: str | None, aliases: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return _runnerish(node.id) or node.id in aliases or (node.id == "self" and cls in RUNNER_CLASSES)
    return isinstance(node, ast.Attribute) and _runnerish(node.attr)


def _reference(node: ast.AST, cls: str | None, aliases: set[str]) -> str | None:
    """What ``node`` names that the scan looks for, or None."""
    if isinstance(node, ast.Attribute):
        if node.attr in NAMES and _is_runner(node.value, cls, aliases):
            return node.attr
        if node.attr in KILL_FUNCS and isinstance(node.value, ast.Name) and node.value.id == "os":
            return f"os.{node.attr}"
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in NAMES):
        return f"getattr:{node.args[1].value}"
    if isinstance(node, ast.ImportFrom) and node.module == "os" and any(a.name in KILL_FUNCS for a in node.names):
        return "os.kill"
    return None


def runner_calls(source: str, module: str) -> list[tuple[str, str, int, str]]:
    """``(module, qualified function, line, what)`` of each reference in ``source`` the scan looks for (module
    docstring): ``what`` is the runner attribute, ``getattr:<name>`` or ``os.kill`` / ``os.killpg``."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found: list[tuple[str, str, int, str]] = []

    def visit(node: ast.AST, scope: list[str], cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, [*scope, child.name], child.name)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, [*scope, child.name], cls)
            else:
                what = _reference(child, cls, aliases)
                if what is not None:
                    found.append((module, ".".join(scope), child.lineno, what))
                visit(child, scope, cls)

    visit(tree, [], None)
    return found


def misplaced(refs: list[tuple[str, str, int, str]]) -> list[tuple[str, str, int, str]]:
    """The references outside the places allowed (:data:`ALLOWED`, :data:`KILLS`)."""
    return [r for r in refs if not ((r[0], r[1]) in KILLS if r[3].startswith("os.")
                                    else r[3] in ALLOWED.get((r[0], r[1]), ()))]


def _all_refs() -> list[tuple[str, str, int, str]]:
    refs = []
    for path in sorted((ROOT / "p2pnode").rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        refs += runner_calls(path.read_text(), module)
    return refs


def test_only_the_executor_starts_stops_and_signals_jobs():
    refs = _all_refs()
    assert misplaced(refs) == [], "start or stop a job only through JobControl.apply (an effect with its rule)"
    # the scan sees every allowed place: it is not blind (and the allowlists hold no stale entry)
    assert {(m, f) for m, f, _, w in refs if not w.startswith("os.")} == set(ALLOWED)
    assert {(m, f) for m, f, _, w in refs if w.startswith("os.")} == KILLS


def test_the_probe_a_stop_added_elsewhere_fails_the_check():
    module = "p2pnode/jobs/_operator.py"
    src = (ROOT / module).read_text()
    assert misplaced(runner_calls(src, module)) == []
    probe = src + ("\n\ndef _sneaky(control):\n    control.runner.stop('j1', 'because')\n"
                   "\n\nclass JobRunner:\n    def tick(self):\n        self.stop('j2', 'maximum runtime reached')\n"
                   "\n\nasync def _sneaky_start(runner):\n    runner.start(job_id='j3')\n")
    bad = misplaced(runner_calls(probe, module))
    assert [f for _, f, _, _ in bad] == ["_sneaky", "JobRunner.tick", "_sneaky_start"]
    # a start or stop of something else is no runner reference (nurseries, scopes, the agent)
    other = ("def f(n, agent):\n    n.start(g)\n    agent.stop()\n    self.runner.run()\n"
             "    n.start_soon(agent.shutdown)\n")
    assert runner_calls(other, module) == []


BYPASSES = {
    "getattr": "def f(self):\n    getattr(self.runner, 'stop')('j', 'x')\n",
    "getattr on anything": "def f(x):\n    getattr(x, '_stop_proc')\n",
    "alias": "def f(self):\n    r = self.runner\n    r.stop('j', 'x')\n",
    "alias of an alias": "def f(self):\n    r = self.runner\n    q = r\n    q.stop('j', 'x')\n",
    "typed parameter": "def f(r: JobRunner):\n    r.stop('j', 'x')\n",
    "bound method": "def f(self):\n    stop = self.runner.stop\n    stop('j', 'x')\n",
    "partial/start_soon": "def f(self, n):\n    n.start_soon(self.runner._stop_proc, job, 'x')\n",
    "other attr name": "def f(self):\n    self.job_runner.stop('j', 'x')\n",
    "runner.shutdown elsewhere": "async def f(self):\n    await self.runner.shutdown()\n",
    "JobControl.apply shuts down": "class JobControl:\n    async def apply(self):\n"
                                   "        await self.runner.shutdown()\n",
    "inside JobRunner: _stop_proc": "class JobRunner:\n    def tick(self, n, job):\n"
                                    "        n.start_soon(self._stop_proc, job, 'max')\n",
    "inside JobRunner: _signal": "import signal\nclass JobRunner:\n    def tick(self, job):\n"
                                 "        self._signal(job, signal.SIGTERM)\n",
    "os.killpg": "import os, signal\ndef f(job):\n    os.killpg(job.proc.pid, signal.SIGTERM)\n",
    "os.kill as a value": "import os\ndef f(n, job):\n    n.start_soon(os.kill, job.proc.pid, 15)\n",
    "from os import kill": "from os import killpg\n",
}


def test_each_bypass_of_the_executor_is_caught():
    module = "p2pnode/jobs/_control.py"
    missed = [name for name, src in BYPASSES.items() if not misplaced(runner_calls(src, module))]
    assert missed == [], f"the lint misses: {missed}"
    # and the real executor's places, spelled the same way, pass
    ok = ("class JobControl:\n    def apply(self, e):\n        self.runner.stop(e.job_id, e.reason, e.rule)\n"
          "    async def shutdown(self):\n        await self.runner.shutdown()\n")
    assert misplaced(runner_calls(ok, module)) == [] and len(runner_calls(ok, module)) == 2
