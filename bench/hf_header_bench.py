"""Cost per tensor of reading a safetensors file's header: dcp's
HuggingFaceStorageReader(...).read_metadata() against the safetensors
library's safe_open (keys listed) on the same file, one file of N tiny
tensors, N doubling: a cost per tensor that stays flat is linear.

    DCP_LIBRARY=bazel-bin/capi/libdcp.so PYTHONPATH=python \\
      .venv/bin/python bench/hf_header_bench.py --max 40000 --reps 3

Prints one line per N with the medians in seconds and microseconds per
tensor, safe_open and dcp alternated within each repetition."""

import argparse
import os
import statistics
import tempfile
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--min", type=int, default=2500)
    parser.add_argument("--max", type=int, default=40000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    import dcp

    n = args.min
    while n <= args.max:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "model.safetensors")
            save_file({f"layers.{i}.w": torch.full((4,), float(i))
                       for i in range(n)}, path)
            ours, theirs = [], []
            for _ in range(args.reps):
                start = time.perf_counter()
                with safe_open(path, "pt") as f:
                    keys = list(f.keys())
                theirs.append(time.perf_counter() - start)
                start = time.perf_counter()
                md = dcp.HuggingFaceStorageReader(d).read_metadata()
                ours.append(time.perf_counter() - start)
                assert len(keys) == len(md.state_dict_metadata) == n
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"N={n:7d}  dcp {a:.3f} s ({a / n * 1e6:.2f} us/tensor)  "
              f"safe_open {b:.3f} s ({b / n * 1e6:.2f} us/tensor)  "
              f"dcp/safe_open {a / b:.1f}x", flush=True)
        n *= 2


if __name__ == "__main__":
    main()
