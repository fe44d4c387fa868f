"""The Python examples of README.md and python/README.md run as written, in
order, as a reader following them would: on a small model with an AdamW
optimizer, with the checkpoint directories under a temporary one. Shell
lines and the DeepSeek example (it needs that checkpoint) are left out."""
import os
import re

import torch

import dcp

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SHELL = ("./dcp.sh", "pip ", "torchrun", "DCP_LIBRARY=", "PYTHONPATH=")


def _fenced_python(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _indented(text):
    """The 4-space indented blocks (Markdown code) that are Python."""
    blocks, lines = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("    ") or (lines and not line.strip()):
            lines.append(line[4:])
            continue
        if lines:
            block = "\n".join(lines).strip("\n")
            if not block.lstrip().startswith(SHELL):
                blocks.append(block + "\n")
            lines = []
    return blocks


class Model(torch.nn.Module):
    """Hugging Face style names: `model.*` and `lm_head.*`."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Linear(8, 8)
        self.lm_head = torch.nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.lm_head(torch.relu(self.model(x)))


def test_readme_python_examples_run_as_written(tmp_path):
    blocks = []
    for name, parse in (("README.md", _fenced_python),
                        (os.path.join("python", "README.md"), _indented)):
        with open(os.path.join(ROOT, name)) as f:
            blocks += [(name, b) for b in parse(f.read())]
    blocks = [(n, b) for n, b in blocks if "/hub/" not in b]
    assert len(blocks) >= 7, [b[:40] for _, b in blocks]

    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)

    def train_step():
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    train_step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1,
                                                gamma=0.5)

    lrs = []  # the learning rate after each step

    def train_step():  # noqa: F811 - the loop's, with the scheduler
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])

    namespace = {"model": model, "optimizer": optimizer, "step": 3,
                 "steps": 2, "train_step": train_step, "torch": torch,
                 "scheduler": scheduler}
    for name, block in blocks:
        for root in ("/ckpt", "/export"):
            block = block.replace(f'"{root}/', f'"{tmp_path}{root}/')
        try:
            exec(compile(block, name, "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{name}, the example\n{block}\nraised "
                                 f"{type(e).__name__}: {e}") from e

    # What the examples saved is the model's state and loads back.
    assert os.path.exists(tmp_path / "ckpt" / "step-1000" / ".metadata")
    back = {k: torch.zeros_like(v) for k, v in expected.items()}
    dcp.load({"model": back}, checkpoint_id=str(
        tmp_path / "ckpt" / "step-1000"),
        planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    for k, v in expected.items():
        assert torch.equal(back[k], v), k
    for sub in ("ckpt/run/step-2", "export/hf", "ckpt/mega",
                "ckpt/step-100"):
        assert os.listdir(tmp_path / sub), sub
    # The loop's checkpoint holds the learning rate of its step (plain
    # values are taken when the state is built), and the resume found it.
    assert namespace["start"] == 2
    # On a job's first run there is no checkpoint root yet.
    assert namespace["latest_checkpoint"](str(tmp_path / "first-run")) is None
    saved_lr = dcp.format_utils.load_all(str(tmp_path / "ckpt" / "run" / "step-2"),
                            keys=["optim"])["optim"]["param_groups"][0]["lr"]
    assert saved_lr in lrs and saved_lr < 0.1, (saved_lr, lrs)
