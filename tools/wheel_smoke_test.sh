#!/usr/bin/env bash
# Installs a dcp wheel into a fresh venv (numpy from PyPI, nothing else) and
# checks from outside the checkout that it works there: save, load, async
# save and metadata of numpy arrays and plain values, with libdcp.so and its
# bundled libraries loaded from the wheel (never from the build tree or the
# system's Gloo).
#
#   tools/wheel_smoke_test.sh dist/dcp-*.whl
set -euo pipefail
wheel="$(realpath "$1")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$wheel" >&2
cd "$work"
env -u DCP_LIBRARY -u PYTHONPATH "$work/venv/bin/python" - "$work/ckpt" <<'PY'
import os, sys
import numpy as np
import dcp

ckpt = sys.argv[1]
w = np.arange(12, dtype=np.float32).reshape(3, 4)
state = {"model": {"w": w, "b": np.ones(4, dtype=np.int64)}, "step": 7,
         "name": "smoke", "blob": b"\x00\x01"}
dcp.save(state, checkpoint_id=ckpt)
into = {"model": {"w": np.zeros((3, 4), np.float32),
                  "b": np.zeros(4, np.int64)}, "step": 0, "name": "",
        "blob": b""}
dcp.load(into, checkpoint_id=ckpt)
assert np.array_equal(into["model"]["w"], w), into
assert into["step"] == 7 and into["name"] == "smoke" and into["blob"] == b"\x00\x01"
r = dcp.async_save(state, checkpoint_id=ckpt + "-async")
r.staging_completion.result()
r.upload_completion.result()
md = dcp.read_metadata(ckpt + "-async")
assert "model.w" in md.state_dict_metadata, md.state_dict_metadata.keys()

pkg = os.path.dirname(dcp.__file__)
maps = open("/proc/self/maps").read()
for lib in ("libdcp.so", "libgloo.so.0", "libprotobuf.so.32"):
    paths = {l.split()[-1] for l in maps.splitlines() if l.endswith(lib)}
    assert paths and all(p.startswith(pkg) for p in paths), (lib, paths)
print(f"wheel smoke test: OK (dcp {dcp.version} from {pkg})")
PY
# The command line the wheel carries, as its `dcp` script and python -m dcp.
out="$(env -u DCP_TOOL -u LD_LIBRARY_PATH "$work/venv/bin/dcp" inspect "$work/ckpt")"
grep -q "model.w" <<<"$out" || { echo "dcp inspect: $out" >&2; exit 1; }
out="$(env -u DCP_TOOL -u LD_LIBRARY_PATH "$work/venv/bin/python" -m dcp \
  verify "$work/ckpt-async")"
grep -q "^OK: " <<<"$out" || { echo "python -m dcp verify: $out" >&2; exit 1; }
echo "wheel smoke test: the dcp command line runs from the wheel"
