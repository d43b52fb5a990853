"""A real small file system for disk tests: a tmpfs the test mounts and unmounts itself."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


class SmallFs:
    """A ``size_mib`` tmpfs mounted at ``path``; :meth:`fill_to` writes a ballast file to reach a usage."""

    def __init__(self, path: Path, size_mib: int = 16) -> None:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(self.path)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        self.ballast = self.path / ".ballast"

    def usage_percent(self) -> float:
        st = os.statvfs(self.path)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        return 100.0 * used / (used + st.f_bavail * st.f_frsize)

    def fill_to(self, percent: float) -> None:
        """Grow or shrink the ballast so usage is about ``percent`` (within a block)."""
        st = os.statvfs(self.path)
        total = st.f_blocks * st.f_frsize
        current = self.ballast.stat().st_size if self.ballast.exists() else 0
        used_other = (st.f_blocks - st.f_bfree) * st.f_frsize - current
        want = max(0, int(total * percent / 100.0) - used_other)
        with open(self.ballast, "wb") as f:
            f.write(b"\0" * want)

    def close(self) -> None:
        subprocess.run(["umount", str(self.path)], capture_output=True)
