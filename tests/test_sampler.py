import os

from p2pnode.probes import ResourceSampler
from p2pnode.resources import NoGpus


def _meminfo_total_bytes():
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def test_sample_matches_the_machine(tmp_path):
    s = ResourceSampler(tmp_path, NoGpus("test")).sample()
    assert s.mem_total_bytes == _meminfo_total_bytes()
    assert s.cpu_count == os.cpu_count()
    st = os.statvfs(tmp_path)
    assert s.disk_total_bytes == st.f_blocks * st.f_frsize
    # df's Used = blocks - bfree; allow a little drift between the two reads.
    assert abs(s.disk_used_bytes - (st.f_blocks - st.f_bfree) * st.f_frsize) < 64 * 1024**2
    assert 0.0 <= s.cpu_percent <= 100.0 and 0.0 <= s.disk_percent <= 100.0
    assert len(s.load_avg) == 3
    assert s.gpu_absent_reason == "test"
    wire = s.to_wire()
    assert wire["mem_total_bytes"] == s.mem_total_bytes and wire["gpus"] == []
