"""QuantizedHuggingFaceStorageReader against PyTorch's dequantization.

Files written by the reference `safetensors` library (two files and an
index, as a hub checkpoint): F8_E4M3 weights quantized in 128x128 blocks
with their F32 `*_scale_inv` tensors (2-D with clipped edge blocks, 3-D
stacked experts, 1-D), and plain BF16/F32 tensors. dcp loads them whole and
as resharded slices, for each target dtype, and must match
`(fp8.float() * scale_inv expanded to its blocks).to(target)` bit for bit.
Malformed directories fail naming the file and the tensor.

Run by tests/hf_quantized_test.sh; HF_INTEROP_HELPER names
tests/hf_interop_helper (its load-quantized command).
"""

import json
import os
import subprocess
import tempfile
import unittest

import safetensors.torch
import torch

HELPER = os.environ["HF_INTEROP_HELPER"]
BLOCK = 128
TARGETS = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def quantize(w, block=BLOCK):
    """(fp8, scale_inv) of float32 `w`, blocks over the last two dims."""
    one_d = w.dim() == 1
    if one_d:
        w = w.unsqueeze(0)
    *lead, rows, cols = w.shape
    sr, sc = -(-rows // block), -(-cols // block)
    padded = torch.zeros(*lead, sr * block, sc * block)
    padded[..., :rows, :cols] = w
    tiles = padded.reshape(*lead, sr, block, sc, block)
    amax = tiles.abs().amax(dim=(-3, -1)).clamp(min=1e-6)
    scale = amax / 448.0
    expanded = expand(scale, rows, cols, block)
    q = (w / expanded).clamp(-448, 448).to(torch.float8_e4m3fn)
    if one_d:
        return q.squeeze(0), scale.squeeze(-2).contiguous()
    return q, scale.contiguous()


def expand(scale, rows, cols, block=BLOCK):
    return scale.repeat_interleave(block, -2)[..., :rows, :].repeat_interleave(
        block, -1)[..., :cols]


def dequantize(q, scale, target, block=BLOCK):
    """The reference: fp8 to float32, times its block's scale, to target."""
    if q.dim() == 1:
        s = scale.repeat_interleave(block)[: q.shape[0]]
    else:
        s = expand(scale, q.shape[-2], q.shape[-1], block)
    return (q.to(torch.float32) * s).to(target)


def make_checkpoint(root):
    g = torch.Generator().manual_seed(21)
    weights = {
        "model.layers.0.self_attn.q_proj.weight": (300, 257),
        "model.layers.0.mlp.experts.weight": (3, 200, 260),
        "model.layers.0.mlp.down_proj.weight": (128, 384),
        "model.layers.0.vec.weight": (300,),
    }
    quantized = {}
    files = [{}, {}]
    for i, (name, shape) in enumerate(weights.items()):
        w = torch.randn(*shape, generator=g) * (1 + 3 * torch.rand(1, generator=g))
        q, s = quantize(w)
        quantized[name] = (q, s)
        # Scale and weight in different files for half of them.
        files[i % 2][name] = q
        files[(i // 2) % 2][name + "_scale_inv"] = s
    files[0]["model.norm.weight"] = torch.randn(257, generator=g).to(torch.bfloat16)
    files[1]["lm_head.weight"] = torch.randn(10, 7, generator=g)
    weight_map = {}
    for i, tensors in enumerate(files):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        safetensors.torch.save_file(tensors, os.path.join(root, fname),
                                    metadata={"format": "pt"})
        weight_map.update({k: fname for k in tensors})
    with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    plain = {k: v for tensors in files for k, v in tensors.items()}
    return quantized, plain


def run_helper(src, target, threads=2, boxes=None):
    out = tempfile.mkdtemp()
    args = [HELPER, "load-quantized", src, out, target, str(BLOCK), str(threads)]
    if boxes is not None:
        path = os.path.join(out, "boxes.json")
        with open(path, "w") as f:
            json.dump(boxes, f)
        args.append(path)
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    return manifest, proc.stderr


def loaded(manifest, name, dtype):
    entry = manifest[name]
    with open(entry["file"], "rb") as f:
        raw = f.read()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(
        entry["shape"])


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


class QuantizedReaderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.src = tempfile.mkdtemp()
        cls.quantized, cls.plain = make_checkpoint(cls.src)

    def test_whole_tensors_match_reference(self):
        for target, tdtype in TARGETS.items():
            with self.subTest(target=target):
                manifest, err = run_helper(self.src, target)
                self.assertIsNotNone(manifest, err)
                for name, (q, s) in self.quantized.items():
                    self.assertEqual(manifest[name]["dtype"], target)
                    want = dequantize(q, s, tdtype)
                    got = loaded(manifest, name, tdtype)
                    self.assertTrue(torch.equal(raw(got), raw(want)), name)
                # Plain tensors and the scales load as stored.
                for name, t in self.plain.items():
                    if name in self.quantized:
                        continue
                    got = loaded(manifest, name, t.dtype)
                    self.assertTrue(torch.equal(raw(got), raw(t)), name)
                self.assertEqual(manifest["__stats__"]["scales_read"], 4)

    def test_resharded_slices_match_reference(self):
        boxes = {
            "model.layers.0.self_attn.q_proj.weight":
                ([100, 50], [200, 150]),
            "model.layers.0.mlp.experts.weight": ([1, 60, 10], [2, 140, 240]),
            "model.layers.0.mlp.down_proj.weight": ([127, 0], [1, 384]),
            "model.layers.0.vec.weight": ([130], [160]),
        }
        spec = {k: {"offsets": o, "lengths": l} for k, (o, l) in boxes.items()}
        for target, tdtype in TARGETS.items():
            with self.subTest(target=target):
                manifest, err = run_helper(self.src, target, threads=3,
                                           boxes=spec)
                self.assertIsNotNone(manifest, err)
                for name, (offsets, lengths) in boxes.items():
                    q, s = self.quantized[name]
                    full = dequantize(q, s, tdtype)
                    index = tuple(slice(o, o + l) for o, l in zip(offsets, lengths))
                    got = loaded(manifest, name, tdtype)
                    self.assertTrue(torch.equal(raw(got), raw(full[index])), name)
                total = sum(q.numel() for q, _ in self.quantized.values())
                self.assertLess(manifest["__stats__"]["fp8_bytes_read"], total / 2)
                self.assertEqual(manifest["__stats__"]["scales_read"], 4)

    def check_error(self, tensors, *needles):
        root = tempfile.mkdtemp()
        safetensors.torch.save_file(tensors,
                                    os.path.join(root, "model.safetensors"))
        manifest, err = run_helper(root, "BF16")
        self.assertIsNone(manifest)
        self.assertIn(os.path.join(root, "model.safetensors"), err)
        for needle in needles:
            self.assertIn(needle, err)

    def test_missing_scale(self):
        q, _ = quantize(torch.randn(130, 140))
        self.check_error({"a.weight": q}, "F8_E4M3 tensor a.weight has no scale",
                         "a.weight_scale_inv")

    def test_scale_shape_not_ceil_of_blocks(self):
        q, _ = quantize(torch.randn(130, 140))
        self.check_error(
            {"a.weight": q, "a.weight_scale_inv": torch.ones(1, 2)},
            "a.weight_scale_inv has shape [1, 2]", "needs [2, 2]")

    def test_scale_beside_a_tensor_that_is_not_fp8(self):
        _, s = quantize(torch.randn(130, 140))
        self.check_error(
            {"a.weight": torch.randn(130, 140).to(torch.bfloat16),
             "a.weight_scale_inv": s},
            "tensor a.weight is BF16 but has the scale a.weight_scale_inv")


if __name__ == "__main__":
    unittest.main()
