"""What the views share on screen: ages and byte sizes in words, and a view redrawn in place (``--watch``)."""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["fmt_age", "fmt_bytes", "watch", "watch_error"]


def fmt_age(age: float | None) -> str:
    if age is None:
        return "-"
    return f"{age:.1f}s" if age < 120 else f"{age / 60:.0f}m"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def watch(render: Any, interval_s: float) -> int:
    """Redraw ``render()`` (a rich renderable) in place every ``interval_s`` seconds until Ctrl-C (exit 0)."""
    from rich.console import Console
    from rich.live import Live

    try:
        console = Console(width=None if sys.stdout.isatty() else 160)
        with Live(render(), console=console, auto_refresh=False, redirect_stderr=False) as live:
            while True:
                time.sleep(interval_s)
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        return 0


def watch_error(why: str):
    from rich.text import Text

    return Text(f"{time.strftime('%H:%M:%S')} {why} (retrying)", style="red")
