import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config: object) -> None:
    """Give the suite, and every process it starts, the SIGINT a terminal gives.

    A shell starts a background job (`cmd &`) with SIGINT ignored, and an ignored signal stays ignored across exec,
    so the CLI subprocesses that tests stop with Ctrl-C (`status --watch`, `jobs logs --follow`, `jobs --watch`,
    `demo`) would never exit. A handled signal reverts to the default on exec, so installing Python's default
    handler here is enough for every child.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
