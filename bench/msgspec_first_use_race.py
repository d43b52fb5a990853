"""Does msgspec still crash when two threads decode a Struct class for the first time at once?

msgspec 0.22 publishes a class's type information before it is complete while it builds it (on the class's
first decode or convert); a second thread decoding the same class meanwhile follows a NULL type node and the
process dies of SIGSEGV. An agent died so under load (2026-11-27). ``p2pnode.inputs.warm_type_info`` works
around it; run this after upgrading msgspec to see whether the work-around is still needed.

    python bench/msgspec_first_use_race.py            # up to 10,000 fresh classes, in a child process

The child defines fresh Struct classes (bounded, nested, like the agent's usage summary) and, for each, lets one
thread ``convert`` to the inner class, another decode the outer one and the main thread ``convert`` to the outer
one, all at once and for the first time. Prints the
child's fate: "crashed (SIGSEGV) after ..." or "no crash in N classes". (On 2026-11-27, msgspec 0.22.0, Python
3.11, this 2-core machine: SIGSEGV in 2 of 5 runs, once after 69 classes; the window is narrow, and a busy
machine opens it more often.)
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

CHILD = r'''
import sys, threading
from typing import Annotated
import msgspec
from msgspec import Meta

SRC = """
class Sk{i}(msgspec.Struct, frozen=True):
    bins: Annotated[dict[Annotated[int, Meta(ge=-4096)], Annotated[int, Meta(ge=0)]], Meta(max_length=2048)] = {{}}
    count: Annotated[int, Meta(ge=0)] = 0
class E{i}(msgspec.Struct, frozen=True):
    template: Annotated[str, Meta(max_length=128)]
    runs: Annotated[int, Meta(ge=0)] = 0
    runtime_s: Sk{i} = Sk{i}()
    peak_rss_bytes: Sk{i} | None = None
class D{i}(msgspec.Struct, frozen=True):
    node: str
    entries: Annotated[list[E{i}], Meta(max_length=256)] = []
"""

for i in range(int(sys.argv[1])):
    ns = {"msgspec": msgspec, "Annotated": Annotated, "Meta": Meta}
    exec(SRC.format(i=i), ns)
    E, D, Sk = ns[f"E{i}"], ns[f"D{i}"], ns[f"Sk{i}"]
    e = E(template="t", runtime_s=Sk(bins={1: 2}, count=2))
    raw = msgspec.msgpack.encode({"node": "n", "entries": [msgspec.to_builtins(e)]})
    go = threading.Barrier(3)
    def converts():
        go.wait()
        msgspec.convert(msgspec.to_builtins(e), E)
    def decodes():
        go.wait()
        msgspec.msgpack.decode(raw, type=D)
    ts = [threading.Thread(target=converts), threading.Thread(target=decodes)]
    for t in ts:
        t.start()
    go.wait()
    msgspec.convert(msgspec.msgpack.decode(raw), D)
    for t in ts:
        t.join()
    print(i + 1, flush=True)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--classes", type=int, default=10000)
    args = ap.parse_args()
    import msgspec

    r = subprocess.run([sys.executable, "-c", CHILD, str(args.classes)], capture_output=True, text=True)
    done = r.stdout.split()[-1] if r.stdout.split() else "0"
    if r.returncode == -signal.SIGSEGV:
        print(f"msgspec {msgspec.__version__}: crashed (SIGSEGV) after {done} classes")
    elif r.returncode == 0:
        print(f"msgspec {msgspec.__version__}: no crash in {done} classes")
    else:
        print(f"msgspec {msgspec.__version__}: child exited {r.returncode}: {r.stderr[-500:]}")


if __name__ == "__main__":
    main()
