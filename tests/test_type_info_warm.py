"""msgspec's type information is built once, in the agent's event loop thread, before any worker thread exists.

msgspec (0.22) publishes a Struct class's type information before it is complete while it builds it on the
class's first decode; a second thread decoding the same class meanwhile dies of SIGSEGV (an agent did, under
load; ``bench/msgspec_first_use_race.py`` reproduces it). :func:`p2pnode.inputs.warm_type_info` builds it for
every class up front. These tests check, in a fresh process, that after it no decode of any p2pnode class runs
msgspec's Python-level type introspection again (which is the window the race needs)."""

import subprocess
import sys

CHECK = r"""
import sys
import msgspec
import p2pnode.agent  # every module the agent has loaded when it starts (the CLI's entry point included)
import p2pnode.cli._agent
import p2pnode.jobs
p2pnode.jobs.JobControl, p2pnode.jobs.JobControlSurface  # what Agent.__init__ loads with a catalog (before run)
from p2pnode.inputs import warm_type_info

def structs():
    seen, stack = [], [msgspec.Struct]
    while stack:
        for c in stack.pop().__subclasses__():
            if c not in seen:
                seen.append(c)
                stack.append(c)
    return [c for c in seen if c.__module__.startswith("p2pnode.")]

calls = []
def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.endswith("msgspec/_utils.py"):
        calls.append(frame.f_code.co_name)

def introspects(cls):
    del calls[:]
    sys.setprofile(profile)
    try:
        msgspec.msgpack.Decoder(cls)
    except Exception:
        return None
    finally:
        sys.setprofile(None)
    return bool(calls)

# The control: some of the agent's classes are not built yet when it starts (types decoded at import are), and
# a first decode of one of them runs msgspec's Python introspection. It builds that one class; the rest wait.
lazy = next((c for c in structs() if introspects(c)), None)
assert lazy is not None, "every class built at import: the check below would prove nothing"
built, refused = warm_type_info()
assert built >= 100, built
still = [f"{c.__module__}.{c.__qualname__}" for c in structs() if introspects(c)]
assert not still, still
assert set(refused) <= {"p2pnode.sync._wire.PushItem", "p2pnode.jobs._runner.RunningProcess"}, refused
print("ok", built, len(structs()), lazy.__qualname__)
"""


def test_after_the_warm_up_no_p2pnode_struct_builds_type_information_again():
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok")


LATE = r"""
import importlib, pkgutil, sys
import msgspec
import p2pnode, p2pnode.agent, p2pnode.cli._agent
# Job control is imported in Agent.__init__ when there is a catalog (p2pnode.jobs), before Agent.run's warm-up
p2pnode.jobs.JobControl, p2pnode.jobs.JobControlSurface
at_start = set(sys.modules)

calls = []
def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.endswith("msgspec/_utils.py"):
        calls.append(frame.f_code.co_name)

def introspects(cls):
    del calls[:]
    sys.setprofile(profile)
    try:
        msgspec.msgpack.Decoder(cls)
    except Exception:
        return False  # not decodable at all (a live handle): never decoded, nothing to race on
    finally:
        sys.setprofile(None)
    return bool(calls)

late, other_commands = [], []
for m in pkgutil.walk_packages(p2pnode.__path__, "p2pnode."):
    if m.name in at_start or m.name.endswith("__main__"):
        continue
    if m.name == "p2pnode._demo" or m.name.startswith("p2pnode.sim."):
        continue  # other commands (p2pnode demo, p2pnode simulate), never loaded by an agent
    try:
        mod = importlib.import_module(m.name)
    except ImportError:  # an optional engine (ray) not installed here
        continue
    own = [v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == m.name]
    structs = [v for v in own if issubclass(v, msgspec.Struct)]
    if structs and m.name.startswith("p2pnode.cli."):
        other_commands.append(m.name)  # `p2pnode status`, `jobs`...: their own process, never an agent's
        continue
    cold = [v.__qualname__ for v in structs if introspects(v)]
    if cold:
        late.append((m.name, cold))
print("late", late, "other commands", other_commands)
assert not late, late
assert other_commands, "no CLI module with a Struct loaded late: the exemption above is stale"
"""


def test_no_module_loaded_after_the_agent_starts_defines_a_struct():
    """A Struct class defined in a module the agent imports later (inside a function) would miss the warm-up,
    unless that module warms its own classes as it is imported (:func:`p2pnode.inputs.warm_type_info` with its
    name: an import runs once, under the import lock, before any other thread can use the classes). The modules
    of the other commands (``p2pnode status``, ``jobs``, ...) are exempt: ``p2pnode agent`` never loads them."""
    r = subprocess.run([sys.executable, "-c", LATE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_job_control_is_loaded_in_the_constructor_before_the_warm_up():
    """The tests above count job control among the modules loaded at start: the agent imports it lazily (only with
    a catalog), in ``Agent.__init__``, which runs before ``Agent.run`` and its warm-up; not later."""
    import inspect

    from p2pnode.agent import Agent

    assert "jobs.JobControl(" in inspect.getsource(Agent.__init__)
    others = [name for name, fn in vars(Agent).items() if callable(fn) and name != "__init__"
              and "jobs.JobControl(" in inspect.getsource(fn)]
    assert not others, others


def test_the_agent_warms_up_before_its_first_worker_thread():
    """The agent calls the warm-up at the top of ``Agent.run``, before its nursery starts anything."""
    import inspect

    from p2pnode.agent import Agent

    code = [ln.split("#")[0] for ln in inspect.getsource(Agent.run).splitlines()]
    first = next(i for i, ln in enumerate(code) if "warm_type_info()" in ln)
    assert all("open_nursery" not in ln and "to_thread" not in ln for ln in code[:first])
