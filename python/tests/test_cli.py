"""`python -m dcp` (the wheel's `dcp` script): runs the dcp command line,
here the build tree's (DCP_TOOL), and says what to do when there is none."""

import os
import subprocess
import sys

import numpy as np
import pytest

import dcp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
TOOL = os.path.join(ROOT, "bazel-bin", "tools", "dcp")


def run(args, **env):
    environment = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    environment.update(env)
    return subprocess.run([sys.executable, "-m", "dcp"] + args,
                          capture_output=True, text=True, env=environment,
                          timeout=120)


@pytest.mark.skipif(not os.access(TOOL, os.X_OK),
                    reason="bazel-bin/tools/dcp not built")
def test_inspect_and_verify_through_python_m_dcp(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    dcp.save({"w": np.arange(6, dtype=np.float32), "step": 3},
             checkpoint_id=ckpt)
    inspected = run(["inspect", ckpt], DCP_TOOL=TOOL)
    assert inspected.returncode == 0, inspected.stderr
    assert "w" in inspected.stdout and "F32" in inspected.stdout
    verified = run(["verify", ckpt], DCP_TOOL=TOOL)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("OK: 2 items"), verified.stdout
    # A flipped byte: non-zero, naming the tensor.
    md = dcp.read_metadata(ckpt)
    info = md.storage_data[dcp.MetadataIndex("w", (0,))]
    path = os.path.join(ckpt, info.relative_path)
    with open(path, "r+b") as f:
        f.seek(info.offset)
        byte = f.read(1)
        f.seek(info.offset)
        f.write(bytes([byte[0] ^ 1]))
    broken = run(["verify", ckpt], DCP_TOOL=TOOL)
    assert broken.returncode != 0
    assert "CORRUPT" in broken.stdout and "w" in broken.stdout


@pytest.mark.skipif(not os.access(TOOL, os.X_OK),
                    reason="bazel-bin/tools/dcp not built")
def test_a_source_checkout_runs_its_built_binary():
    # The source tree's package has no _bin/dcp; an empty DCP_TOOL is unset.
    result = run(["--help"], DCP_TOOL="")
    assert result.returncode == 0, result.stderr
    assert "inspect" in result.stdout


def test_without_a_binary_it_says_how_to_get_one(tmp_path):
    # A copy of the package, with no _bin/dcp and no bazel-bin beside it.
    import shutil
    copy = tmp_path / "python"
    shutil.copytree(os.path.join(ROOT, "python", "dcp"), copy / "dcp")
    shutil.copy(os.path.join(ROOT, "python", "_dcp_command.py"), copy)
    environment = dict(os.environ, PYTHONPATH=str(copy), DCP_TOOL="")
    result = subprocess.run([sys.executable, "-m", "dcp", "inspect", "/x"],
                            capture_output=True, text=True, env=environment,
                            timeout=120)
    assert result.returncode == 2
    assert "no dcp command-line binary" in result.stderr
    assert "DCP_TOOL" in result.stderr


@pytest.mark.skipif(not os.access(TOOL, os.X_OK),
                    reason="bazel-bin/tools/dcp not built")
def test_mistakes_a_newcomer_makes_are_named(tmp_path):
    """A mistyped command names the word and the nearest command; convert
    refuses a torch.save file and a torch DCP directory as inspect does,
    naming the conversion; a run's root names the checkpoints inside."""
    import torch
    typo = run(["inspct", str(tmp_path)], DCP_TOOL=TOOL)
    assert typo.returncode == 2
    assert 'unknown command "inspct" (did you mean "inspect"?)' in \
        typo.stderr, typo.stderr
    pt = str(tmp_path / "model.pt")
    torch.save({"w": torch.ones(2)}, pt)
    converted = run(["convert", pt, str(tmp_path / "out"), "--to", "dcp"],
                    DCP_TOOL=TOOL)
    assert converted.returncode != 0
    assert "dcp.format_utils torch_to_dcp " + pt in converted.stderr, \
        converted.stderr
    import torch.distributed.checkpoint as tdcp
    theirs = str(tmp_path / "theirs")
    tdcp.save({"w": torch.ones(2)}, checkpoint_id=theirs, no_dist=True)
    converted = run(["convert", theirs, str(tmp_path / "out2"), "--to",
                     "safetensors"], DCP_TOOL=TOOL)
    assert converted.returncode != 0
    assert "UNIMPLEMENTED" in converted.stderr and \
        "torch_dcp_to_dcp " + theirs in converted.stderr, converted.stderr
    root = tmp_path / "run"
    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(root / "step-10"))
    inspected = run(["inspect", str(root)], DCP_TOOL=TOOL)
    assert inspected.returncode != 0
    assert "its subdirectory step-10 holds one: pass it" in \
        inspected.stderr, inspected.stderr
