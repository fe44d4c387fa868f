"""dcp's Hugging Face storage against the reference `safetensors` library.

(a) Every file dcp writes (one file, a fqn_to_index_mapping over several,
    save_distributed with consolidation) opens with safetensors.safe_open
    and, where numpy has the dtypes, safetensors.numpy.load_file, and holds
    exactly the bytes dcp was given; PyTorch's own HuggingFaceStorageReader
    loads the directory too.
(b) Files the library writes (safetensors.torch for every dtype, bf16 and
    fp8 included; safetensors.numpy; a hub-style directory of three files and
    an index) load into dcp bit for bit, whole and resharded (rows n/3..n).

Run by tests/hf_interop_test.sh with the repository's .venv interpreter;
HF_INTEROP_HELPER names tests/hf_interop_helper.
"""

import json
import os
import subprocess
import tempfile
import unittest

import numpy as np
import safetensors.numpy
import safetensors.torch
import torch
from safetensors import safe_open

HELPER = os.environ["HF_INTEROP_HELPER"]

# safetensors name, torch dtype, numpy dtype (None: numpy has none).
DTYPES = [
    ("BOOL", torch.bool, np.bool_),
    ("U8", torch.uint8, np.uint8),
    ("I8", torch.int8, np.int8),
    ("U16", torch.uint16, np.uint16),
    ("I16", torch.int16, np.int16),
    ("U32", torch.uint32, np.uint32),
    ("I32", torch.int32, np.int32),
    ("U64", torch.uint64, np.uint64),
    ("I64", torch.int64, np.int64),
    ("F16", torch.float16, np.float16),
    ("BF16", torch.bfloat16, None),
    ("F32", torch.float32, np.float32),
    ("F64", torch.float64, np.float64),
    ("F8_E4M3", torch.float8_e4m3fn, None),
    ("F8_E5M2", torch.float8_e5m2, None),
    ("C64", torch.complex64, np.complex64),
]
TORCH_OF = {name: t for name, t, _ in DTYPES}
NUMPY_OF = {name: n for name, _, n in DTYPES}
# 0-d, zero-size, small, odd-sized and multi-page tensors.
SHAPES = [(3, 5), (), (0, 4), (37, 11), (4097,), (300, 257)]


def tensor_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def make_tensors(seed):
    """{name: torch tensor} for every dtype and shape, random bytes."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dtype, _ in DTYPES:
        for k, shape in enumerate(SHAPES):
            size = int(np.prod(shape, dtype=np.int64)) * torch.empty(
                (), dtype=dtype).element_size()
            raw = rng.integers(0, 256, size=size, dtype=np.uint8)
            if dtype == torch.bool:
                raw %= 2
            t = torch.frombuffer(bytearray(raw.tobytes()) or bytearray(1),
                                 dtype=torch.uint8)[:size]
            out[f"{name}.s{k}"] = t.view(dtype).reshape(shape).clone()
    return out


def run_helper(*args):
    result = subprocess.run([HELPER, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"hf_interop_helper {' '.join(args)} failed:\n"
                             f"{result.stderr}")


def dcp_save(directory, tensors, **manifest):
    """Saves `tensors` with dcp into `directory`."""
    raw = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    entries = []
    for i, (name, t) in enumerate(tensors.items()):
        path = os.path.join(raw, f"{i}.bin")
        with open(path, "wb") as f:
            f.write(tensor_bytes(t))
        entries.append({
            "name": name,
            "dtype": name.split(".")[0],
            "shape": list(t.shape),
            "file": path,
        })
    manifest["tensors"] = entries
    manifest_path = os.path.join(raw, "manifest.json")
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    run_helper("save", directory, manifest_path)


def dcp_load(directory, rows_from_third=False):
    """{name: (dtype, shape, offsets, bytes)} as dcp loads `directory`."""
    out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    run_helper("load", directory, out,
               *(["--rows-from-third"] if rows_from_third else []))
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    loaded = {}
    for name, entry in manifest.items():
        with open(entry["file"], "rb") as f:
            loaded[name] = (entry["dtype"], tuple(entry["shape"]),
                            tuple(entry["offsets"]), f.read())
    return loaded


def safetensors_files(directory):
    files = []
    for sub in ("", "sharded"):
        d = os.path.join(directory, sub)
        if os.path.isdir(d):
            files += [
                os.path.join(d, n) for n in sorted(os.listdir(d))
                if n.endswith(".safetensors") and not n.startswith(".")
            ]
    return files


class DcpWritesLibraryReads(unittest.TestCase):

    def check_directory(self, directory, tensors, sharded):
        seen = {}
        for path in safetensors_files(directory):
            top_level = os.path.dirname(path) == directory
            with safe_open(path, framework="pt") as f:
                metadata = f.metadata()
                self.assertEqual(metadata["format"], "pt", path)
                if not top_level:
                    info = json.loads(metadata["DCP_SHARDING_INFO"])
                for key in f.keys():
                    t = f.get_tensor(key)
                    want = tensors[key]
                    self.assertEqual(t.dtype, want.dtype, key)
                    self.assertEqual(tuple(t.shape), tuple(want.shape), key)
                    self.assertEqual(tensor_bytes(t), tensor_bytes(want),
                                     f"{key} in {path}")
                    if top_level:
                        seen[key] = os.path.basename(path)
                    else:
                        self.assertEqual(info[key]["saved_offsets"],
                                         [0] * want.dim())
            # numpy reads the files whose dtypes numpy has.
            names = safetensors.torch.load_file(path).keys()
            if all(NUMPY_OF[n.split(".")[0]] is not None for n in names):
                arrays = safetensors.numpy.load_file(path)
                for key, array in arrays.items():
                    self.assertEqual(array.dtype,
                                     np.dtype(NUMPY_OF[key.split(".")[0]]))
                    self.assertEqual(array.tobytes(), tensor_bytes(tensors[key]),
                                     key)
        self.assertEqual(set(seen), set(tensors))
        with open(os.path.join(directory,
                               "model.safetensors.index.json")) as f:
            index = json.load(f)
        self.assertEqual(index["weight_map"], seen)
        self.assertEqual(
            index["metadata"]["total_size"],
            sum(len(tensor_bytes(t)) for t in tensors.values()))
        if sharded:
            self.assertTrue(os.listdir(os.path.join(directory, "sharded")))

    def test_one_file(self):
        tensors = make_tensors(1)
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        dcp_save(directory, tensors)
        self.assertEqual(safetensors_files(directory),
                         [os.path.join(directory,
                                       "model-00001-of-00001.safetensors")])
        self.check_directory(directory, tensors, sharded=False)

    def test_mapping_over_files_numpy_dtypes_apart(self):
        tensors = make_tensors(2)
        mapping = {
            name: (1 if NUMPY_OF[name.split(".")[0]] is not None else 2) +
            (k % 2) * 2 for k, name in enumerate(tensors)
        }
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        dcp_save(directory, tensors, mapping=mapping)
        self.assertEqual(len(safetensors_files(directory)), 4)
        self.check_directory(directory, tensors, sharded=False)

    def test_distributed_with_consolidation(self):
        tensors = make_tensors(3)
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        dcp_save(directory, tensors, save_distributed=True,
                 enable_consolidation=True)
        self.check_directory(directory, tensors, sharded=True)

    def test_pytorch_hugging_face_reader_loads_it(self):
        import torch.distributed.checkpoint as tdcp
        tensors = {
            k: v for k, v in make_tensors(4).items()
            if k.split(".")[0] in ("F32", "BF16", "F16", "I64", "U8", "BOOL")
        }
        mapping = {name: 1 + k % 3 for k, name in enumerate(tensors)}
        # Plain, and save_distributed without consolidation (its shards lie
        # where PyTorch's writer puts them, in the directory itself).
        for distributed in (False, True):
            directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
            dcp_save(directory, tensors, mapping=mapping,
                     save_distributed=distributed)
            state = {k: torch.zeros_like(v) for k, v in tensors.items()}
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tdcp.load(state,
                          storage_reader=tdcp.HuggingFaceStorageReader(
                              directory), no_dist=True)
            for key, want in tensors.items():
                self.assertEqual(tensor_bytes(state[key]), tensor_bytes(want),
                                 (distributed, key))


class LibraryWritesDcpReads(unittest.TestCase):

    def check(self, directory, tensors, rows_from_third=False):
        loaded = dcp_load(directory, rows_from_third)
        self.assertEqual(set(loaded), set(tensors))
        for key, want in tensors.items():
            dtype, shape, offsets, data = loaded[key]
            self.assertEqual(dtype, key.split(".")[0])
            if offsets and offsets[0] > 0:
                want = want[offsets[0]:]
            self.assertEqual(shape, tuple(want.shape), key)
            self.assertEqual(data, tensor_bytes(want), key)

    def test_torch_every_dtype(self):
        tensors = make_tensors(10)
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        safetensors.torch.save_file(tensors,
                                    os.path.join(directory,
                                                 "model.safetensors"),
                                    metadata={"format": "pt"})
        self.check(directory, tensors)
        self.check(directory, tensors, rows_from_third=True)

    def test_numpy_every_numpy_dtype(self):
        tensors = {
            k: v for k, v in make_tensors(11).items()
            if NUMPY_OF[k.split(".")[0]] is not None
        }
        arrays = {}
        for k, v in tensors.items():
            dtype = NUMPY_OF[k.split(".")[0]]
            arrays[k] = (np.frombuffer(tensor_bytes(v), dtype=dtype)
                         if v.numel() else np.zeros(0, dtype)).reshape(
                             tuple(v.shape))
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        safetensors.numpy.save_file(arrays,
                                    os.path.join(directory,
                                                 "model.safetensors"))
        self.check(directory, tensors)

    def test_hub_style_sharded_directory(self):
        tensors = make_tensors(12)
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        names = sorted(tensors)
        weight_map = {}
        for k in range(3):
            file = f"model-{k + 1:05d}-of-00003.safetensors"
            part = {n: tensors[n] for n in names[k::3]}
            safetensors.torch.save_file(part, os.path.join(directory, file),
                                        metadata={"format": "pt"})
            weight_map.update({n: file for n in part})
        with open(os.path.join(directory, "model.safetensors.index.json"),
                  "w") as f:
            json.dump({"metadata": {"total_size": 0},
                       "weight_map": weight_map}, f)
        self.check(directory, tensors)
        self.check(directory, tensors, rows_from_third=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
