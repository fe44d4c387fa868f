"""tests/gpu/python_cuda_check.py, the Python part of the GPU run, on the
CPU: its checks must pass here before device time is spent on them (a
check that cannot run on the CPU reports itself skipped)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_every_check_passes_on_the_cpu(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python")] +
        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "gpu",
                                      "python_cuda_check.py"),
         "--device", "cpu", "--dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600)
    rows = [json.loads(line) for line in proc.stdout.splitlines()
            if line.startswith("{")]
    checks = {row["check"]: row for row in rows}
    failed = [row for row in rows if not row["ok"]]
    assert proc.returncode == 0 and not failed, (proc.stdout, proc.stderr)
    for name in ("setup", "roundtrip", "convert", "async_thread",
                 "async_process", "async_stager_thread",
                 "async_stager_process", "strided_load", "state_dict"):
        assert name in checks, proc.stdout
    assert checks["convert"]["pairs"] == 12
    assert checks["roundtrip"]["tensors"] == 15
