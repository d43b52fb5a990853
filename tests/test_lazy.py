"""p2pnode._lazy: a module named at import, imported at its first attribute read."""

import subprocess
import sys
import threading


def test_sqlite3_is_imported_at_first_use_not_when_the_job_and_guard_modules_load():
    code = ("import sys\n"
            "import p2pnode.guardcore._disk as d, p2pnode.jobs._ledger, p2pnode.sync._walship\n"
            "assert 'sqlite3' not in sys.modules and '_sqlite3' not in sys.modules, 'imported at load'\n"
            "try:\n"
            "    d.sqlite3.connect('file:/nonexistent/x.db?mode=ro', uri=True).execute('select 1')\n"
            "except d.sqlite3.Error as exc:\n"  # an except clause naming the lazy module works
            "    print(type(exc).__name__)\n"
            "assert d.sqlite3.Error is sys.modules['sqlite3'].Error\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "OperationalError"


def test_threads_racing_to_the_first_read_all_get_the_module():
    from p2pnode._lazy import lazy_module

    lazy = lazy_module("colorsys")  # any small module of the standard library
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(lazy.rgb_to_hsv)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import colorsys

    assert got == [colorsys.rgb_to_hsv] * 8
    assert repr(lazy) == "<lazy module 'colorsys'>"
