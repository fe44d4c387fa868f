"""PyTorch's HuggingFaceStorageWriter/Reader on the state bench/hf_bench
saves (per layer a [2048, 4096] bf16 weight and a [4096] f32 norm), for the
comparison in docs/BENCHMARKS.md:

    bench/torch_env.sh hf_torch_compare.py --size-gib 1 --dir /tmp/hf_torch \
        --repeat 3

Each repetition: save into an empty directory (torch.distributed.checkpoint
.save, no process group), fsync the files and drop them from the page cache,
load into preallocated zero-filled tensors, check every byte. Prints GB/s
(1e9 bytes/s of tensor data) per repetition and the medians.
"""

import argparse
import os
import shutil
import statistics
import time
import warnings

import torch
import torch.distributed.checkpoint as tdcp


def make_state(size_gib, fill):
    layers = max(1, int(size_gib * (1 << 30)) // (2048 * 4096 * 2))
    gen = torch.Generator().manual_seed(1)
    state = {}
    for i in range(layers):
        for name, dtype, shape in ((f"model.layers.{i}.weight", torch.bfloat16,
                                    (2048, 4096)),
                                   (f"model.layers.{i}.norm", torch.float32,
                                    (4096,))):
            t = torch.empty(shape, dtype=dtype)
            if fill:
                t.view(torch.int16 if dtype == torch.bfloat16 else
                       torch.int32).random_(generator=gen)
            else:
                t.zero_()
            state[name] = t
    return state


def drop_cache(directory):
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--dir", default="/tmp/hf_torch")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    source = make_state(args.size_gib, True)
    target = make_state(args.size_gib, False)
    nbytes = sum(t.numel() * t.element_size() for t in source.values())
    print(f"# torch {torch.__version__}: {len(source)} tensors, "
          f"{nbytes / 1e9:.3f} GB")
    saves, loads = [], []
    for rep in range(args.repeat):
        shutil.rmtree(args.dir, ignore_errors=True)
        os.sync()
        start = time.perf_counter()
        tdcp.save(source,
                  storage_writer=tdcp.HuggingFaceStorageWriter(args.dir),
                  no_dist=True)
        # torch's writer does not fsync; dcp's numbers include it.
        for root, _, files in os.walk(args.dir):
            for name in files:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
        save_s = time.perf_counter() - start
        drop_cache(args.dir)
        for t in target.values():
            t.zero_()
        start = time.perf_counter()
        tdcp.load(target,
                  storage_reader=tdcp.HuggingFaceStorageReader(args.dir),
                  no_dist=True)
        load_s = time.perf_counter() - start
        for name, t in source.items():
            assert torch.equal(t.view(torch.uint8) if t.dim() else t,
                               target[name].view(torch.uint8)
                               if t.dim() else target[name]), name
        saves.append(nbytes / save_s / 1e9)
        loads.append(nbytes / load_s / 1e9)
        print(f"rep {rep + 1} torch-hf save {save_s:6.3f} s {saves[-1]:6.2f} "
              f"GB/s   load {load_s:6.3f} s {loads[-1]:6.2f} GB/s",
              flush=True)
    shutil.rmtree(args.dir, ignore_errors=True)
    print(f"median torch-hf save {statistics.median(saves):6.2f} GB/s   "
          f"load {statistics.median(loads):6.2f} GB/s")


if __name__ == "__main__":
    main()
