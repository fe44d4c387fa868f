"""A save borrows CPU tensors: saving 1 GiB raises the process's peak RSS
by far less than 1 GiB (under +256 MiB), and a load into existing tensors
neither. Measured in a fresh subprocess with getrusage's ru_maxrss (a
high-water mark, so anything the save allocated, however briefly, shows).
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = r"""
import os, resource, sys
sys.path.insert(0, sys.argv[2])
import torch
import dcp

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

t = torch.empty(1 << 28, dtype=torch.float32)  # 1 GiB
t.fill_(1.5)                                   # every page resident
ref = t[:: 1 << 20].clone()
dcp.library_version()                          # the library is loaded
base = peak_mib()
dcp.save({"t": t, "step": 1}, checkpoint_id=sys.argv[1])
saved = peak_mib()
t.zero_()
dcp.load({"t": t, "step": 0}, checkpoint_id=sys.argv[1])
loaded = peak_mib()
assert torch.equal(t[:: 1 << 20], ref)
print(f"{base:.0f} {saved:.0f} {loaded:.0f}")
"""


def test_saving_1gib_adds_under_256mib_rss(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, ckpt, os.path.dirname(HERE)],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    base, saved, loaded = map(float, out.stdout.split())
    assert base > 1024  # the tensor itself is resident
    assert saved - base < 256, f"save: +{saved - base:.0f} MiB peak RSS"
    assert loaded - base < 256, f"load: +{loaded - base:.0f} MiB peak RSS"
