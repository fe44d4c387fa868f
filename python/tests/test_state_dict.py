"""Tests of dcp.state_dict: model and optimizer state dicts keyed by FQN.

Runs on CPU. The DTensor tests start two processes with a gloo group over a
FileStore; everything else runs in this process (the DDP test in a
one-process gloo group).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import importlib
import pathlib
import sys
import types

import pytest
import torch
import torch.nn as nn

_PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]


def _load_module():
    """dcp.state_dict; by file path while the dcp package cannot be imported."""
    if (_PYTHON_DIR / "dcp" / "__init__.py").exists():
        if str(_PYTHON_DIR) not in sys.path:
            sys.path.insert(0, str(_PYTHON_DIR))
        try:
            import dcp.state_dict

            return dcp.state_dict
        except ImportError:
            pass  # e.g. libdcp.so not built yet: this module needs only torch.
    # A stand-in package over python/dcp whose __init__.py does not run, so
    # that state_dict.py's relative imports of its parts resolve.
    name = "_dcp_state_dict_under_test"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(_PYTHON_DIR / "dcp")]
        sys.modules[name] = package
    return importlib.import_module(f"{name}.state_dict")


sd = _load_module()
StateDictOptions = sd.StateDictOptions


# --------------------------------------------------------------------------
# Models and training.


class TinyTransformer(nn.Module):
    """Decoder-style stack from torch.nn with the output head tied to the embedding."""

    def __init__(self, vocab: int = 16, dim: int = 8, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(
            dim, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(tokens))))


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _batch(model: nn.Module, seed: int):
    gen = torch.Generator().manual_seed(seed)
    if isinstance(model, TinyTransformer):
        return torch.randint(0, 16, (2, 5), generator=gen), None
    return torch.randn(6, 4, generator=gen), torch.randn(6, 3, generator=gen)


def _train_step(model: nn.Module, optims, seed: int) -> None:
    inputs, target = _batch(model, seed)
    out = model(inputs)
    loss = out.square().mean() if target is None else (out - target).square().mean()
    for optim in optims:
        optim.zero_grad(set_to_none=True)
    loss.backward()
    for optim in optims:
        optim.step()


def _make(kind: str, seed: int):
    """A model and its optimizers, by kind, with parameters from `seed`."""
    torch.manual_seed(seed)
    if kind == "transformer_adamw":
        model = TinyTransformer()
        return model, [torch.optim.AdamW(model.parameters(), lr=0.01, foreach=False)]
    if kind == "mlp_sgd_momentum":
        model = _mlp()
        return model, [
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
        ]
    if kind == "mlp_two_optimizers":
        model = _mlp()
        return model, [
            torch.optim.AdamW(model[0].parameters(), lr=0.01, foreach=False),
            torch.optim.SGD(
                model[2].parameters(), lr=0.1, momentum=0.9, dampening=0.1,
                foreach=False,
            ),
        ]
    raise AssertionError(kind)


def _assert_same_tree(a, b, path="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.shape == b.shape and a.dtype == b.dtype, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, set(a) ^ set(b))
        for key in a:
            _assert_same_tree(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tree(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


def _assert_same_params(a: nn.Module, b: nn.Module) -> None:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name


# --------------------------------------------------------------------------
# Options.


def test_options_have_the_seeds_fields_and_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(StateDictOptions)}
    assert fields == {
        "full_state_dict": False,
        "cpu_offload": False,
        "ignore_frozen_params": False,
        "keep_submodule_prefixes": True,
        "strict": True,
        "broadcast_from_rank0": False,
        "flatten_optimizer_state_dict": False,
        "dsd_fqn_modifiers": "_fqn_modifiers",
    }


def test_broadcast_from_rank0_requires_full_state_dict():
    model, optims = _make("mlp_sgd_momentum", 0)
    with pytest.raises(ValueError, match="requires full_state_dict=True"):
        sd.get_model_state_dict(
            model, options=StateDictOptions(broadcast_from_rank0=True)
        )
    with pytest.raises(ValueError, match="initialized default process group"):
        sd.set_model_state_dict(
            model,
            model.state_dict(),
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )


def test_optimizer_functions_need_an_optimizer():
    model, optims = _make("mlp_sgd_momentum", 0)
    with pytest.raises(RuntimeError, match="no optimizer"):
        sd.get_optimizer_state_dict(model, [])
    with pytest.raises(RuntimeError, match="no optimizer"):
        sd.set_optimizer_state_dict(model, (), {})


def test_get_and_set_state_dict_take_no_optimizers_as_torch_does():
    model, _ = _make("mlp_sgd_momentum", 0)
    for none in ([], ()):
        msd, osd = sd.get_state_dict(model, none)
        assert osd == {} and set(msd) == set(model.state_dict())
    fresh, _ = _make("mlp_sgd_momentum", 3)
    keys = sd.set_state_dict(fresh, optimizers=[], model_state_dict=msd,
                             optim_state_dict={})
    assert not keys.missing_keys and not keys.unexpected_keys
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, msd[k]), k


# --------------------------------------------------------------------------
# Model state.


def test_model_state_dict_is_keyed_by_fqn_and_shares_memory():
    model = _mlp()
    model.register_buffer("counter", torch.tensor(3))
    state = sd.get_model_state_dict(model)
    assert list(state) == list(model.state_dict())
    assert state["0.weight"].data_ptr() == model[0].weight.data_ptr()
    assert not state["0.weight"].requires_grad
    assert state["counter"].item() == 3


def test_cpu_offload_returns_cpu_tensors():
    model, optims = _make("transformer_adamw", 0)
    _train_step(model, optims, 1)
    options = StateDictOptions(cpu_offload=True)
    msd, osd = sd.get_state_dict(model, optims, options=options)
    tensors = [v for v in msd.values()] + [
        v for entry in osd["state"].values() for v in entry.values()
    ]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    _assert_same_tree(msd, dict(model.state_dict()))


def test_submodules_select_entries_with_or_without_prefix():
    model = _mlp()
    kept = sd.get_model_state_dict(model, submodules={model[2]})
    assert set(kept) == {"2.weight", "2.bias"}
    stripped = sd.get_model_state_dict(
        model,
        submodules={model[2]},
        options=StateDictOptions(keep_submodule_prefixes=False),
    )
    assert set(stripped) == {"weight", "bias"}
    assert torch.equal(stripped["weight"], model[2].weight)


def test_tied_weights_appear_under_each_fqn_and_stay_tied_after_load():
    src, src_optims = _make("transformer_adamw", 0)
    _train_step(src, src_optims, 1)
    msd, osd = sd.get_state_dict(src, src_optims)
    assert {"embed.weight", "head.weight"} <= set(msd)
    assert msd["head.weight"].data_ptr() == msd["embed.weight"].data_ptr()
    # The optimizer holds the shared parameter once, under its first FQN.
    assert "embed.weight" in osd["state"] and "head.weight" not in osd["state"]
    assert osd["param_groups"][0]["params"].count("embed.weight") == 1

    dst, dst_optims = _make("transformer_adamw", 7)
    sd.set_state_dict(dst, dst_optims, model_state_dict=msd, optim_state_dict=osd)
    assert dst.head.weight is dst.embed.weight
    assert torch.equal(dst.embed.weight, src.embed.weight)


def test_tied_weights_of_a_model_built_on_meta_stay_tied_after_load():
    """A meta tensor is assigned, not copied into: the tied parameter gets
    one new nn.Parameter, set on every module that owns it."""
    src, _ = _make("transformer_adamw", 0)
    msd = sd.get_model_state_dict(src)
    with torch.device("meta"):
        dst = TinyTransformer()
    count = len(list(dst.parameters()))
    sd.set_model_state_dict(dst, msd)
    assert dst.head.weight is dst.embed.weight
    assert isinstance(dst.embed.weight, nn.Parameter)
    assert dst.embed.weight.requires_grad
    assert len(list(dst.parameters())) == count
    assert torch.equal(dst.embed.weight, src.embed.weight)
    assert dst.embed.weight.data_ptr() != msd["embed.weight"].data_ptr()


def test_frozen_params_are_left_out_and_not_reported_missing():
    model, optims = _make("mlp_sgd_momentum", 0)
    model[0].weight.requires_grad_(False)
    _train_step(model, optims, 1)
    options = StateDictOptions(ignore_frozen_params=True)
    msd, osd = sd.get_state_dict(model, optims, options=options)
    assert "0.weight" not in msd and "0.bias" in msd
    assert "0.weight" not in osd["state"]  # a frozen parameter has no state
    assert "0.weight" in osd["param_groups"][0]["params"]

    dst, dst_optims = _make("mlp_sgd_momentum", 5)
    dst[0].weight.requires_grad_(False)
    frozen_before = dst[0].weight.detach().clone()
    result = sd.set_state_dict(
        dst, dst_optims, model_state_dict=msd, optim_state_dict=osd, options=options
    )
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(dst[0].weight, frozen_before)
    assert torch.equal(dst[0].bias, model[0].bias)
    missing = r"Missing key\(s\) in state_dict: '0.weight'"
    with pytest.raises(RuntimeError, match=missing):
        sd.set_model_state_dict(dst, msd)


def test_extra_state_round_trips():
    class WithExtra(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.tag = "before"

        def get_extra_state(self):
            return {"tag": self.tag}

        def set_extra_state(self, state):
            self.tag = state["tag"]

    src, dst = WithExtra(), WithExtra()
    src.tag = "after"
    msd = sd.get_model_state_dict(src)
    assert msd["_extra_state"] == {"tag": "after"}
    sd.set_model_state_dict(dst, msd)
    assert dst.tag == "after"


# --------------------------------------------------------------------------
# Optimizer state.


def test_optimizer_state_is_keyed_by_fqn_with_0d_step():
    model, optims = _make("mlp_sgd_momentum", 0)
    adam = torch.optim.AdamW(model.parameters(), lr=0.01)
    _train_step(model, [adam], 1)
    nested = sd.get_optimizer_state_dict(model, adam)
    assert set(nested["state"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    step = nested["state"]["0.weight"]["step"]
    assert isinstance(step, torch.Tensor) and step.dim() == 0 and step.item() == 1
    live = adam.state[model[0].weight]["exp_avg"]
    assert nested["state"]["0.weight"]["exp_avg"] is live
    (group,) = nested["param_groups"]
    assert group["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert group["lr"] == 0.01 and group["betas"] == (0.9, 0.999)

    flat = sd.get_optimizer_state_dict(
        model, adam, options=StateDictOptions(flatten_optimizer_state_dict=True)
    )
    for fqn in ("0.weight", "0.bias", "2.weight", "2.bias"):
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert flat[f"state.{fqn}.{name}"] is nested["state"][fqn][name]
        assert flat[f"param_groups.{fqn}.lr"] == 0.01
        assert flat[f"param_groups.{fqn}.betas"] == (0.9, 0.999)
    assert all(k.startswith(("state.", "param_groups.")) for k in flat)


@pytest.mark.parametrize("flatten", [False, True], ids=["nested", "flat"])
@pytest.mark.parametrize(
    "kind", ["transformer_adamw", "mlp_sgd_momentum", "mlp_two_optimizers"]
)
def test_round_trip_gives_identical_state_and_next_step(kind, flatten):
    src, src_optims = _make(kind, 0)
    _train_step(src, src_optims, 1)
    options = StateDictOptions(flatten_optimizer_state_dict=flatten)
    msd, osd = sd.get_state_dict(src, src_optims, options=options)
    msd, osd = copy.deepcopy(msd), copy.deepcopy(osd)

    dst, dst_optims = _make(kind, 99)  # other values, optimizers never stepped
    result = sd.set_state_dict(
        dst, dst_optims, model_state_dict=msd, optim_state_dict=osd, options=options
    )
    assert result.missing_keys == [] and result.unexpected_keys == []
    _assert_same_params(src, dst)
    for a, b in zip(src_optims, dst_optims):
        _assert_same_tree(a.state_dict(), b.state_dict())
    _assert_same_tree(
        sd.get_state_dict(dst, dst_optims, options=options),
        sd.get_state_dict(src, src_optims, options=options),
    )

    _train_step(src, src_optims, 2)
    _train_step(dst, dst_optims, 2)
    _assert_same_params(src, dst)


def test_param_group_ids_handed_to_load_state_dict_behave_as_lists():
    """The ids lists _load_optimizers hands to Optimizer.load_state_dict
    (set lookups for `in`) are lists in every other way, deep copies
    included; and two param groups with their own settings load as
    torch's own state dict does."""
    from dcp._state_dict_optim import _IdList
    ids = _IdList([5, 3, 9])
    assert 3 in ids and 4 not in ids and list(ids) == [5, 3, 9]
    twin = copy.deepcopy(ids)
    assert twin == ids and 9 in twin and 7 not in twin
    ids.append(7)  # grown after a lookup: still found
    assert 7 in ids
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 3))
    optim = torch.optim.AdamW([
        {"params": model[0].parameters()},
        {"params": model[1].parameters(), "lr": 0.5, "weight_decay": 0.0},
    ])
    _train_step(model, [optim], 1)
    want = copy.deepcopy(optim.state_dict())
    osd = copy.deepcopy(sd.get_optimizer_state_dict(model, optim))
    twin_model = copy.deepcopy(model)
    twin_optim = torch.optim.AdamW([
        {"params": twin_model[0].parameters()},
        {"params": twin_model[1].parameters(), "lr": 0.1},
    ])
    sd.set_optimizer_state_dict(twin_model, twin_optim, osd)
    _assert_same_tree(twin_optim.state_dict(), want)
    assert all(type(g["params"]) is list for g in twin_optim.param_groups)


def test_set_model_state_dict_copies_into_wide_and_hooked_models(
        monkeypatch):
    """A model that loads plainly is copied into directly; one with a load
    hook, extra state or a module loading its own way (BatchNorm) goes
    through Module.load_state_dict, hooks called; both give the values."""
    calls = []

    def wide(seed):
        torch.manual_seed(seed)
        return nn.ModuleList([nn.Linear(2, 2) for _ in range(300)])

    src, dst = wide(0), wide(1)

    def unused(*args, **kwargs):
        raise AssertionError("a plain model is copied into directly")

    monkeypatch.setattr(nn.Module, "_load_from_state_dict", unused)
    msd = copy.deepcopy(sd.get_model_state_dict(src))
    del msd["299.bias"]
    result = sd.set_model_state_dict(dst, msd, options=StateDictOptions(
        strict=False))
    assert result.missing_keys == ["299.bias"]
    assert result.unexpected_keys == []
    for key, value in msd.items():
        assert torch.equal(dst.state_dict()[key], value), key
    assert not torch.equal(dst[299].bias, src[299].bias)
    monkeypatch.undo()

    class OwnLoad(nn.Sequential):  # its load_state_dict is called
        def load_state_dict(self, state_dict, *args, **kwargs):
            calls.append("OwnLoad")
            return super().load_state_dict(state_dict, *args, **kwargs)

    own = OwnLoad(nn.Linear(3, 3))
    sd.set_model_state_dict(own, sd.get_model_state_dict(OwnLoad(
        nn.Linear(3, 3))))
    assert calls == ["OwnLoad"]
    calls.clear()
    hooked_src = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    hooked_src[1].num_batches_tracked.fill_(7)
    hooked = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    hooked[0].register_load_state_dict_post_hook(
        lambda module, keys: calls.append(type(module).__name__))
    msd = copy.deepcopy(sd.get_model_state_dict(hooked_src))
    sd.set_model_state_dict(hooked, msd)
    assert calls == ["Linear"]
    assert int(hooked[1].num_batches_tracked) == 7
    for key, value in msd.items():
        assert torch.equal(hooked.state_dict()[key], value), key


def test_set_copies_instead_of_sharing_the_callers_tensors():
    src, src_optims = _make("mlp_sgd_momentum", 0)
    _train_step(src, src_optims, 1)
    dst, dst_optims = _make("mlp_sgd_momentum", 1)
    msd, osd = sd.get_state_dict(src, src_optims)  # live tensors of src
    sd.set_state_dict(dst, dst_optims, model_state_dict=msd, optim_state_dict=osd)
    buffer = dst_optims[0].state[dst[0].weight]["momentum_buffer"]
    assert buffer.data_ptr() != osd["state"]["0.weight"]["momentum_buffer"].data_ptr()
    _train_step(src, src_optims, 2)
    _train_step(dst, dst_optims, 2)
    _assert_same_params(src, dst)


def test_never_stepped_optimizer_gets_state_to_load_into():
    model, _ = _make("mlp_sgd_momentum", 0)
    adam = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    before = copy.deepcopy(model.state_dict())

    osd = sd.get_optimizer_state_dict(model, adam)

    _assert_same_tree(dict(model.state_dict()), before)  # lr was 0 for that step
    assert model[0].weight.grad is None  # the zero grads are taken back
    assert adam.param_groups[0]["lr"] == 0.01
    assert set(osd["state"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert torch.count_nonzero(osd["state"]["0.weight"]["exp_avg"]) == 0

    # Filling the returned tensors in place, as dcp.load does, then setting.
    src, src_optims = _make("mlp_sgd_momentum", 3)
    trained = torch.optim.AdamW(src.parameters(), lr=0.01, weight_decay=0.1)
    _train_step(src, [trained], 1)
    _train_step(src, [trained], 2)
    saved = sd.get_optimizer_state_dict(src, trained)
    for fqn, entry in osd["state"].items():
        for name, tensor in entry.items():
            tensor.copy_(saved["state"][fqn][name])
    sd.set_optimizer_state_dict(model, adam, osd)
    _assert_same_tree(adam.state_dict()["state"], trained.state_dict()["state"])


def test_stateless_optimizer_round_trips():
    model, _ = _make("mlp_sgd_momentum", 0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    osd = sd.get_optimizer_state_dict(model, sgd)
    assert osd["state"] == {}
    sd.set_optimizer_state_dict(model, sgd, osd)
    assert sgd.param_groups[0]["lr"] == 0.1


def test_param_group_without_params_round_trips():
    model = _mlp()
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optim.add_param_group({"params": [], "lr": 0.5})
    _train_step(model, [optim], 1)
    osd = copy.deepcopy(sd.get_optimizer_state_dict(model, optim))
    assert osd["param_groups"][1] == {**osd["param_groups"][1], "params": [], "lr": 0.5}

    dst = copy.deepcopy(model)
    dst_optim = torch.optim.SGD(dst.parameters(), lr=0.2, momentum=0.9)
    dst_optim.add_param_group({"params": [], "lr": 0.7})
    sd.set_optimizer_state_dict(dst, dst_optim, osd)
    assert [g["lr"] for g in dst_optim.param_groups] == [0.1, 0.5]


def test_one_optimizer_takes_its_entries_from_a_merged_state_dict():
    src, src_optims = _make("mlp_two_optimizers", 0)
    _train_step(src, src_optims, 1)
    osd = sd.get_optimizer_state_dict(src, src_optims)
    assert {"0.weight", "2.weight"} <= set(osd["state"])
    dst, dst_optims = _make("mlp_two_optimizers", 4)
    sd.set_optimizer_state_dict(dst, dst_optims[1], osd)
    _assert_same_tree(dst_optims[1].state_dict(), src_optims[1].state_dict())


def test_parameter_outside_the_model_is_an_error():
    model = _mlp()
    stray = nn.Parameter(torch.zeros(3))
    optim = torch.optim.SGD([stray], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"not a parameter of the model"):
        sd.get_optimizer_state_dict(model, optim)


@pytest.mark.parametrize("flatten", [False, True], ids=["nested", "flat"])
@pytest.mark.parametrize(
    "kind", ["transformer_adamw", "mlp_sgd_momentum", "mlp_two_optimizers"]
)
def test_same_state_dicts_as_torch_distributed_checkpoint(kind, flatten):
    """The seed's behaviour, as torch implements it, on the same models."""
    try:
        from torch.distributed.checkpoint import state_dict as torch_sd
    except ImportError:
        pytest.skip("torch.distributed.checkpoint.state_dict is not available")
    for steps in (1, 0):  # trained, and never stepped (state created lazily)
        model, optims = _make(kind, 0)
        for step in range(steps):
            _train_step(model, optims, step)
        ours = sd.get_state_dict(
            model,
            optims,
            options=StateDictOptions(flatten_optimizer_state_dict=flatten),
        )
        theirs = torch_sd.get_state_dict(
            model,
            optims,
            options=torch_sd.StateDictOptions(flatten_optimizer_state_dict=flatten),
        )
        _assert_same_tree(ours, theirs)


# --------------------------------------------------------------------------
# Strict and non-strict loading.


def test_strict_model_load_names_missing_and_unexpected_fqns():
    model = _mlp()
    state = dict(sd.get_model_state_dict(_mlp()))
    del state["2.bias"]
    state["extra.weight"] = torch.zeros(1)
    with pytest.raises(RuntimeError) as info:
        sd.set_model_state_dict(model, state)
    message = str(info.value)
    assert "Missing key(s) in state_dict: '2.bias'" in message
    assert "Unexpected key(s) in state_dict: 'extra.weight'" in message

    result = sd.set_model_state_dict(
        model, state, options=StateDictOptions(strict=False)
    )
    assert result.missing_keys == ["2.bias"]
    assert result.unexpected_keys == ["extra.weight"]
    assert torch.equal(model[0].weight, state["0.weight"])


def test_shape_mismatch_raises_even_when_not_strict():
    model = _mlp()
    state = dict(sd.get_model_state_dict(_mlp()))
    state["0.weight"] = torch.zeros(2, 2)
    with pytest.raises(RuntimeError, match="size mismatch for 0.weight"):
        sd.set_model_state_dict(model, state, options=StateDictOptions(strict=False))


@pytest.mark.parametrize("flatten", [False, True], ids=["nested", "flat"])
def test_strict_optimizer_load_requires_every_trained_parameter(flatten):
    src, src_optims = _make("mlp_sgd_momentum", 0)
    _train_step(src, src_optims, 1)
    options = StateDictOptions(flatten_optimizer_state_dict=flatten)
    osd = copy.deepcopy(sd.get_optimizer_state_dict(src, src_optims, options=options))
    if flatten:
        del osd["state.2.bias.momentum_buffer"]
    else:
        del osd["state"]["2.bias"]

    dst, dst_optims = _make("mlp_sgd_momentum", 1)
    _train_step(dst, dst_optims, 5)
    kept = dst_optims[0].state[dst[2].bias]["momentum_buffer"].clone()
    before = copy.deepcopy(dst_optims[0].state_dict())
    with pytest.raises(RuntimeError, match=r"optimizer state for parameter '2.bias'"):
        sd.set_optimizer_state_dict(dst, dst_optims, osd, options=options)
    _assert_same_tree(dst_optims[0].state_dict(), before)  # checked before changed
    sd.set_optimizer_state_dict(
        dst,
        dst_optims,
        osd,
        options=dataclasses.replace(options, strict=False),
    )
    state = dst_optims[0].state
    assert torch.equal(state[dst[2].bias]["momentum_buffer"], kept)
    assert torch.equal(
        state[dst[0].weight]["momentum_buffer"],
        src_optims[0].state[src[0].weight]["momentum_buffer"],
    )


def test_flat_form_rejects_different_settings_within_one_group():
    model, optims = _make("mlp_sgd_momentum", 0)
    _train_step(model, optims, 1)
    flat = dict(
        sd.get_optimizer_state_dict(
            model, optims, options=StateDictOptions(flatten_optimizer_state_dict=True)
        )
    )
    flat["param_groups.2.bias.lr"] = 0.5
    with pytest.raises(RuntimeError, match=r"saved 'lr' differ"):
        sd.set_optimizer_state_dict(model, optims, flat)


def _two_linears_adam(lrs):
    """Two Linear layers and an Adam with one param group per lr."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    params = list(model.parameters())
    per = len(params) // len(lrs)
    groups = [{"params": params[i * per:(i + 1) * per], "lr": lr,
               "weight_decay": 0.5 * i}
              for i, lr in enumerate(lrs)]
    return model, torch.optim.Adam(groups, lr=1.0)


def test_conflicting_group_settings_raise_with_strict_and_warn_without():
    """Parameters saved in two groups, loaded into one: strict raises
    before the optimizer changes; non-strict takes each setting from the
    last saved group that sets it, as torch's set_optimizer_state_dict."""
    src, src_optim = _two_linears_adam([0.1, 0.01])
    osd = sd.get_optimizer_state_dict(src, src_optim)
    dst, dst_optim = _two_linears_adam([0.7])
    with pytest.raises(RuntimeError, match=r"saved 'lr' differ: 0.1 vs 0.01"):
        sd.set_optimizer_state_dict(dst, dst_optim, osd)
    assert dst_optim.param_groups[0]["lr"] == 0.7
    with pytest.warns(UserWarning, match=r"saved 'lr' differ: 0.1 vs 0.01; "
                      r"with StateDictOptions\(strict=False\)"):
        sd.set_optimizer_state_dict(
            dst, dst_optim, osd, options=StateDictOptions(strict=False))
    (group,) = dst_optim.param_groups
    assert (group["lr"], group["weight_decay"]) == (0.01, 0.5)


# --------------------------------------------------------------------------
# Wrapper prefixes.


def test_torch_compile_prefix_is_removed_and_restored():
    plain, plain_optims = _make("mlp_sgd_momentum", 0)
    _train_step(plain, plain_optims, 1)
    msd, osd = sd.get_state_dict(plain, plain_optims)

    inner, _ = _make("mlp_sgd_momentum", 3)
    compiled = torch.compile(inner)  # wrapping only; nothing is compiled
    compiled_optim = torch.optim.SGD(compiled.parameters(), lr=0.1, momentum=0.9)
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    sd.set_state_dict(
        compiled, compiled_optim, model_state_dict=msd, optim_state_dict=osd
    )
    _assert_same_params(plain, inner)
    cmsd, cosd = sd.get_state_dict(compiled, compiled_optim)
    assert list(cmsd) == list(msd)
    _assert_same_tree(cosd, osd)


def test_activation_checkpoint_prefix_is_removed_from_optimizer_keys():
    try:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )
    except ImportError:
        pytest.skip("torch's checkpoint_wrapper is not available")
    plain, plain_optims = _make("mlp_sgd_momentum", 0)
    _train_step(plain, plain_optims, 1)
    wrapped = copy.deepcopy(plain)
    wrapped[0] = checkpoint_wrapper(wrapped[0])
    wrapped_optim = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    assert "0._checkpoint_wrapped_module.weight" in dict(wrapped.named_parameters())
    msd, osd = sd.get_state_dict(plain, plain_optims)
    sd.set_state_dict(
        wrapped, wrapped_optim, model_state_dict=msd, optim_state_dict=osd
    )
    wmsd, wosd = sd.get_state_dict(wrapped, wrapped_optim)
    assert list(wmsd) == list(msd)
    _assert_same_tree(wosd, osd)


def test_ddp_prefix_is_removed_and_restored(tmp_path):
    dist = torch.distributed
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        plain, plain_optims = _make("mlp_sgd_momentum", 0)
        _train_step(plain, plain_optims, 1)
        inner, _ = _make("mlp_sgd_momentum", 3)
        ddp = nn.parallel.DistributedDataParallel(inner)
        ddp_optim = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        assert all(k.startswith("module.") for k in ddp.state_dict())

        msd, osd = sd.get_state_dict(plain, plain_optims)
        sd.set_state_dict(ddp, ddp_optim, model_state_dict=msd, optim_state_dict=osd)
        _assert_same_params(plain, inner)
        dmsd, dosd = sd.get_state_dict(ddp, ddp_optim)
        assert list(dmsd) == list(msd)
        _assert_same_tree(dosd, osd)

        missing = dict(msd)
        del missing["0.bias"]
        missing_message = r"Missing key\(s\) in state_dict: '0.bias'"
        with pytest.raises(RuntimeError, match=missing_message):
            sd.set_model_state_dict(ddp, missing)

        _train_step(plain, plain_optims, 2)
        _train_step(ddp, [ddp_optim], 2)
        _assert_same_params(plain, inner)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------
# load_sharded_optimizer_state_dict.


def _torch_dcp():
    try:
        import torch.distributed.checkpoint as torch_dcp
    except ImportError:
        pytest.skip("torch.distributed.checkpoint is not available")
    return torch_dcp


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_load_sharded_optimizer_state_dict_through_the_seed_load_api(
    tmp_path, monkeypatch
):
    """dcp.load's seed signature, served here by torch's implementation.

    Checks the allocation, the key-to-path mapping and the result's shape
    independently of whether dcp's own engine is built.
    """
    torch_dcp = _torch_dcp()
    model, optims = _make("mlp_two_optimizers", 0)
    _train_step(model, optims, 1)
    msd, osd = sd.get_state_dict(model, optims)
    torch_dcp.save(
        {"model": msd, "optim": osd}, checkpoint_id=str(tmp_path), no_dist=True
    )
    calls = []

    def load(state_dict, *, storage_reader=None, planner=None, **kwargs):
        calls.append(sorted(state_dict))
        torch_dcp.load(
            state_dict, storage_reader=storage_reader, planner=planner, no_dist=True
        )

    monkeypatch.setitem(sys.modules, "dcp", types.SimpleNamespace(load=load))
    fresh = {k: torch.zeros_like(v) for k, v in msd.items()}
    result = sd.load_sharded_optimizer_state_dict(
        fresh, "optim", torch_dcp.FileSystemReader(str(tmp_path))
    )
    assert len(calls) == 1 and all(k.startswith("optim.") for k in calls[0])
    assert set(result) == {"optim"}
    _assert_same_tree(result["optim"], osd)

    # Without planner_data the paths come from the key text and model FQNs.
    reader = torch_dcp.FileSystemReader(str(tmp_path))
    metadata = reader.read_metadata()
    metadata.planner_data = None
    reader.read_metadata = lambda: metadata
    result = sd.load_sharded_optimizer_state_dict(fresh, "optim", reader)
    _assert_same_tree(result["optim"], osd)


def _dcp_or_skip():
    if not (_PYTHON_DIR / "dcp" / "__init__.py").exists():
        pytest.skip("the dcp package (python/dcp/__init__.py) does not exist yet")
    try:
        import dcp
    except ImportError as error:
        pytest.skip(f"dcp does not import here: {error}")
    if not (hasattr(dcp, "save") and hasattr(dcp, "load")):
        pytest.skip("dcp has no save/load yet")
    probe = getattr(dcp, "library_version", None)
    if probe is not None:
        try:
            probe()
        except Exception as error:  # the engine's own tests report this
            pytest.skip(f"libdcp.so is not usable here: {error}")
    return dcp


@pytest.mark.parametrize("flatten", [False, True], ids=["nested", "flat"])
def test_round_trip_through_dcp_save_and_load(tmp_path, flatten):
    """The intended use: get -> dcp.save; get (template) -> dcp.load -> set."""
    dcp = _dcp_or_skip()
    options = StateDictOptions(flatten_optimizer_state_dict=flatten)
    src, src_optims = _make("transformer_adamw", 0)
    _train_step(src, src_optims, 1)
    msd, osd = sd.get_state_dict(src, src_optims, options=options)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path))

    dst, dst_optims = _make("transformer_adamw", 42)  # optimizer never stepped
    msd2, osd2 = sd.get_state_dict(dst, dst_optims, options=options)
    dcp.load({"model": msd2, "optim": osd2}, checkpoint_id=str(tmp_path))
    sd.set_state_dict(
        dst, dst_optims, model_state_dict=msd2, optim_state_dict=osd2, options=options
    )
    _assert_same_params(src, dst)
    _assert_same_tree(dst_optims[0].state_dict(), src_optims[0].state_dict())
    _train_step(src, src_optims, 2)
    _train_step(dst, dst_optims, 2)
    _assert_same_params(src, dst)


def test_load_sharded_optimizer_state_dict_with_dcp(tmp_path):
    dcp = _dcp_or_skip()
    model, optims = _make("mlp_two_optimizers", 0)
    _train_step(model, optims, 1)
    msd, osd = sd.get_state_dict(model, optims)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path))
    reader = dcp.FileSystemReader(str(tmp_path))
    fresh = {k: torch.zeros_like(v) for k, v in msd.items()}
    result = sd.load_sharded_optimizer_state_dict(fresh, "optim", reader)
    _assert_same_tree(result["optim"], osd)

    dst, dst_optims = _make("mlp_two_optimizers", 8)
    sd.set_optimizer_state_dict(dst, dst_optims, result["optim"])
    for a, b in zip(dst_optims, optims):
        _assert_same_tree(a.state_dict()["state"], b.state_dict()["state"])


@pytest.mark.parametrize("names", [("0", "2"), ("body", "head")],
                         ids=["sequential", "named"])
def test_load_sharded_optimizer_state_dict_fqn_absent_from_model(tmp_path,
                                                                 names):
    """Without planner_data, the state of a parameter the model state dict
    lacks nests under its whole FQN (state["head.weight"]["momentum_buffer"]),
    as the saver's planner_data (which torch's function reads) has it; not
    split at every dot (state["head"]["weight"]...; with "2" a list index)."""
    dcp = _dcp_or_skip()
    body, head = names
    torch.manual_seed(0)
    model = nn.Sequential(collections.OrderedDict(
        [(body, nn.Linear(4, 8)), ("relu", nn.ReLU()), (head, nn.Linear(8, 3))]))
    optims = [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                              foreach=False)]
    _train_step(model, optims, 1)
    msd, osd = sd.get_state_dict(model, optims)
    dcp.save({"optim": osd}, checkpoint_id=str(tmp_path))
    reader = dcp.FileSystemReader(str(tmp_path))
    saved = reader.read_metadata()
    assert saved.planner_data[f"optim.state.{head}.weight.momentum_buffer"] == (
        "optim", "state", f"{head}.weight", "momentum_buffer")
    without_paths = dcp.Metadata(
        state_dict_metadata=saved.state_dict_metadata, planner_data=None,
        storage_data=saved.storage_data, storage_meta=saved.storage_meta,
        version=saved.version)
    reader.read_metadata = lambda: without_paths
    partial = {k: torch.zeros_like(v) for k, v in msd.items()
               if not k.startswith(f"{head}.")}
    result = sd.load_sharded_optimizer_state_dict(partial, "optim", reader)
    assert sorted(result["optim"]["state"]) == sorted(
        [f"{body}.bias", f"{body}.weight", f"{head}.bias", f"{head}.weight"])
    _assert_same_tree(result["optim"], _tuples_as_lists(osd))


def _tuples_as_lists(value):
    if isinstance(value, dict):
        return {k: _tuples_as_lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tuples_as_lists(v) for v in value]
    return value


def _shared_by_adam_and_sgd(seed: int):
    """Parameters a.* held by an Adam (A) and an SGD with momentum (B);
    b.* by B only."""
    torch.manual_seed(seed)
    model = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    adam = torch.optim.Adam(model["a"].parameters(), lr=0.1, foreach=False)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                          foreach=False)
    return model, adam, sgd


@pytest.mark.parametrize("sgd_stepped", [True, False],
                         ids=["sgd_stepped_b", "sgd_never_stepped"])
@pytest.mark.parametrize("order", ["adam_first", "sgd_first"])
def test_shared_parameter_state_lands_in_the_optimizer_that_had_it(
        sgd_stepped, order):
    """a.* is held by both optimizers but only Adam has state for it. get
    keeps Adam's real state (not SGD's made-up zeros, which torch's last
    optimizer wins for) and leaves SGD without state for it; set loads it
    into Adam only (torch's set gives SGD a copy of Adam's state), and both
    optimizers' state dicts round-trip exactly."""
    x = torch.randn(3, 2, generator=torch.Generator().manual_seed(1))
    model, adam, sgd = _shared_by_adam_and_sgd(0)
    if sgd_stepped:  # only b.* has a gradient: SGD gets state for b.* only
        model["b"](x).sum().backward()
        sgd.step()
        sgd.zero_grad(set_to_none=True)
    model["a"](x).sum().backward()
    adam.step()
    adam.zero_grad(set_to_none=True)
    a_params = list(model["a"].parameters())
    want_adam = copy.deepcopy(adam.state_dict())

    def ordered(adam, sgd):
        return [adam, sgd] if order == "adam_first" else [sgd, adam]

    osd = sd.get_optimizer_state_dict(model, ordered(adam, sgd))
    for fqn in ("a.weight", "a.bias"):
        assert sorted(osd["state"][fqn]) == ["exp_avg", "exp_avg_sq", "step"]
    assert sorted(osd["state"]) == ["a.bias", "a.weight", "b.bias", "b.weight"]
    assert all(p not in sgd.state for p in a_params)
    _assert_same_tree(adam.state_dict(), want_adam)
    osd = copy.deepcopy(osd)

    dst, dst_adam, dst_sgd = _shared_by_adam_and_sgd(5)
    sd.set_optimizer_state_dict(dst, ordered(dst_adam, dst_sgd), osd)
    assert all(p not in dst_sgd.state for p in dst["a"].parameters())
    _assert_same_tree(dst_adam.state_dict(), adam.state_dict())
    _assert_same_tree(dst_sgd.state_dict(), sgd.state_dict())


def test_parameter_without_state_keeps_none_on_a_fresh_optimizer():
    """A parameter that never got a gradient has no optimizer state in the
    state dict. strict=True refuses it, as the seed does (a state dict
    missing a trainable parameter's state may have lost it), even into a
    never-stepped optimizer, and changes nothing; strict=False leaves it
    none (not the made-up state of the load's own initialisation), and the
    next step matches the uninterrupted run's."""
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))

    def trained():
        torch.manual_seed(0)
        model = nn.ModuleDict({"used": nn.Linear(4, 4), "aux": nn.Linear(4, 4)})
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        model["used"](x).sum().backward()
        opt.step()
        return model, opt

    def step(model, opt):
        opt.zero_grad()
        (model["used"](x) + model["aux"](x)).sum().backward()
        opt.step()

    for strict in (True, False):
        src, opt = trained()
        msd, osd = sd.get_state_dict(src, opt)
        msd, osd = copy.deepcopy(msd), copy.deepcopy(osd)
        assert not any(k.startswith("aux.") for k in osd["state"])
        torch.manual_seed(5)  # other initial values
        dst = nn.ModuleDict({"used": nn.Linear(4, 4), "aux": nn.Linear(4, 4)})
        fresh = torch.optim.Adam(dst.parameters(), lr=0.1)
        if strict:
            before = copy.deepcopy(dst.state_dict())
            with pytest.raises(RuntimeError, match="optimizer state for "
                               "parameter 'aux.weight' is missing"):
                sd.set_state_dict(dst, fresh, model_state_dict=msd,
                                  optim_state_dict=osd)
            assert not fresh.state
            assert all(torch.equal(v, dst.state_dict()[k])
                       for k, v in before.items())
            continue
        sd.set_state_dict(dst, fresh, model_state_dict=msd,
                          optim_state_dict=osd,
                          options=sd.StateDictOptions(strict=strict))
        assert dst["aux"].weight not in fresh.state
        assert dst["aux"].bias not in fresh.state
        step(src, opt)  # aux's first gradient, on both
        step(dst, fresh)
        for (name, a), b in zip(src.named_parameters(), dst.parameters()):
            assert torch.equal(a, b), (strict, name)


def test_partly_meta_model_assigns_only_its_meta_tensors():
    """A model whose base weights are on meta (LoRA-style) and whose adapter
    is real: the meta tensors get new tensors of their dtype, the real ones
    are loaded in place (the optimizer's parameters stay the model's), and
    the caller's state dict is shared with neither."""
    torch.manual_seed(0)
    real = nn.ModuleDict({"base": nn.Linear(4, 4), "adapter": nn.Linear(4, 2)})
    values = {k: v.detach().clone().double() if k.startswith("base.") else
              v.detach().clone() for k, v in real.state_dict().items()}
    model = nn.ModuleDict({"base": nn.Linear(4, 4, device="meta"),
                           "adapter": nn.Linear(4, 2)})
    adapter_params = list(model["adapter"].parameters())
    sd.set_model_state_dict(model, values)
    assert [p is q for p, q in zip(model["adapter"].parameters(),
                                   adapter_params)] == [True, True]
    for k, v in real.state_dict().items():
        got = model.state_dict()[k]
        assert got.device.type == "cpu" and got.dtype == torch.float32, k
        assert torch.equal(got, v), k
    for v in values.values():
        v.fill_(7.0)  # the caller's tensors change; the model's do not
    for k, v in real.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_optimizer_state_keyed_by_parameter_id_keeps_integer_keys():
    """Without planner data, `optim.state.0.exp_avg` (a torch optimizer's
    own state dict, keyed by parameter id) stays keyed by the integer 0: a
    string "0" would be ignored by Optimizer.load_state_dict."""
    from dcp.state_dict import _path_of
    assert _path_of("optim.state.0.exp_avg", "optim", None, set()) == (
        "optim", "state", 0, "exp_avg")
    assert _path_of("optim.state.head.weight.exp_avg", "optim", None,
                    set()) == ("optim", "state", "head.weight", "exp_avg")


def _linear_adam(seed: int):
    torch.manual_seed(seed)
    m = nn.Linear(4, 2)
    return m, torch.optim.Adam(m.parameters(), lr=0.1)


def test_get_between_backward_and_the_first_step_leaves_the_optimizer_alone():
    """As torch's helpers: with gradients present and no state yet, get
    makes no state (a step here would make the loop's step the second)."""
    m, o = _linear_adam(0)
    ref_m, ref_o = _linear_adam(0)
    for model in (m, ref_m):
        model(torch.ones(3, 4)).sum().backward()
    _, osd = sd.get_state_dict(m, o)
    assert osd["state"] == {}
    o.step()
    ref_o.step()
    assert o.state[m.weight]["step"].item() == 1.0
    assert torch.equal(m.weight, ref_m.weight)


def test_an_optimizers_own_state_dict_loads_as_torch_takes_it():
    m, o = _linear_adam(0)
    m(torch.ones(3, 4)).sum().backward()
    o.step()
    o.param_groups[0]["lr"] = 0.05
    native = o.state_dict()
    for strict in (True, False):
        m2, o2 = _linear_adam(1)
        sd.set_optimizer_state_dict(
            m2, o2, native, options=StateDictOptions(strict=strict))
        assert o2.param_groups[0]["lr"] == 0.05
        assert torch.equal(o2.state[m2.weight]["exp_avg"],
                           o.state[m.weight]["exp_avg"])
        # Copied, not shared with the source optimizer.
        assert o2.state[m2.weight]["exp_avg"].data_ptr() != \
            o.state[m.weight]["exp_avg"].data_ptr()
    # Checked as any other: a trainable parameter's state missing.
    partial = {"state": {1: native["state"][1]},
               "param_groups": native["param_groups"]}
    m4, o4 = _linear_adam(4)
    m4(torch.ones(3, 4)).sum().backward()
    o4.step()  # has state of its own for the missing entry
    with pytest.raises(RuntimeError, match="'weight' is missing"):
        sd.set_optimizer_state_dict(m4, o4, partial)
    m3, o3 = _linear_adam(2)
    other = torch.optim.SGD(m3.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="cannot be split between 2"):
        sd.set_optimizer_state_dict(m3, [o3, other], native)


def test_an_empty_optimizer_state_dict_is_refused_strict_or_not():
    """As the seed: set_state_dict / set_optimizer_state_dict with an empty
    optim_state_dict raise RuntimeError whatever strict says (a resume that
    lost the optimizer's state must not go unnoticed), and change
    nothing."""
    model = nn.Linear(3, 2)
    optim = torch.optim.AdamW(model.parameters())
    for strict in (True, False):
        options = sd.StateDictOptions(strict=strict)
        with pytest.raises(RuntimeError, match="optimizer state dict to load "
                           "is empty"):
            sd.set_state_dict(model, optim,
                              model_state_dict=model.state_dict(),
                              optim_state_dict={}, options=options)
        with pytest.raises(RuntimeError, match="is empty"):
            sd.set_optimizer_state_dict(model, optim, {}, options=options)
        assert not optim.state


class _WithExtraState(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.extra = {"calls": 0}

    def get_extra_state(self):
        return {"calls": self.extra["calls"] + 1}

    def set_extra_state(self, state):
        self.extra = dict(state)


def _mixed_model():
    """Plain modules, modules that load their own way (BatchNorm, extra
    state, load hooks) nested at several depths, and a shared one under two
    names."""
    shared = nn.BatchNorm1d(2)
    inner = nn.Sequential(nn.Linear(2, 2), _WithExtraState(), shared)
    model = nn.ModuleDict({
        "a": nn.Linear(2, 2), "inner": inner, "again": shared,
        "hooked": nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)),
        "tail": nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])})
    return model


def test_a_model_with_modules_of_their_own_way_loads_as_torch_loads_it():
    """set_model_state_dict copies plain modules' tensors itself and runs
    torch's steps only for the subtrees that load their own way: values,
    extra state, the prefixes and strictness hooks see, what post hooks
    see and change, and missing/unexpected keys are those of torch's own
    load_state_dict of the whole model."""
    torch.manual_seed(0)
    source = _mixed_model()
    for m in source.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.fill_(3.0)
            m.num_batches_tracked.fill_(7)
    saved = sd.get_model_state_dict(source)
    saved.pop("tail.1.bias")  # missing
    results = []
    for how in ("torch", "dcp"):
        torch.manual_seed(1)
        model = _mixed_model()
        seen = []
        model["hooked"].register_load_state_dict_pre_hook(
            lambda module, state, prefix, *rest: seen.append(
                ("pre", prefix, sorted(k for k in state
                                       if k.startswith(prefix)))))

        def post(module, incompatible):
            seen.append(("post", sorted(incompatible.missing_keys)))
            incompatible.missing_keys[:] = [
                k for k in incompatible.missing_keys
                if not k.startswith("hooked.")]
        model["hooked"].register_load_state_dict_post_hook(post)
        state = dict(saved)
        state["hooked.0.weight"] = state.pop("hooked.0.weight")
        del state["hooked.1.bias"]  # missing, then dropped by the post hook
        if how == "torch":
            keys = model.load_state_dict(state, strict=False)
        else:
            keys = sd.set_model_state_dict(
                model, state, options=sd.StateDictOptions(strict=False))
        results.append((model, seen, sorted(keys.missing_keys),
                        sorted(keys.unexpected_keys)))
    (want, want_seen, want_missing, want_unexpected), \
        (got, got_seen, got_missing, got_unexpected) = results
    for (name, a), b in zip(want.state_dict().items(),
                            got.state_dict().values()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name
        else:
            assert a == b, name
    assert got["inner"][1].extra == want["inner"][1].extra == {"calls": 1}
    assert got_seen == want_seen
    assert got_missing == want_missing == ["tail.1.bias"]
    assert got_unexpected == want_unexpected == []


def test_loads_that_go_through_torchs_steps_keep_their_order_and_effects():
    """Where modules load their own way, set_model_state_dict runs torch's
    steps in torch's order over the whole model: a failing module's error
    comes after the earlier modules' effects, once each; a post hook of a
    module without tensors sees the keys missing before it only; of a
    weight tied under two names the later key's value stays; a post hook
    returning a value is an AssertionError; a lazy module loads."""
    relaxed = sd.StateDictOptions(strict=False)

    def both(case):
        return [case(lambda m, s: m.load_state_dict(s, strict=False)),
                case(lambda m, s: sd.set_model_state_dict(m, s,
                                                          options=relaxed))]

    class Refuses(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2))

        def _load_from_state_dict(self, state, prefix, *args):
            super()._load_from_state_dict(state, prefix, *args)
            if float(state[prefix + "w"].sum()) < 0:
                args[-1].append("negative w")

    def failing(load):
        log = []
        m = nn.Sequential(_WithExtraState(), nn.Linear(2, 2), Refuses())
        m[0].register_load_state_dict_post_hook(
            lambda module, keys: log.append("post"))
        state = dict(m.state_dict())
        state["2.w"] = torch.full((2,), -1.0)
        try:
            load(m, state)
        except RuntimeError as e:
            log.append(str(e).splitlines()[-1].strip())
        return log, m[0].extra

    def sees_missing(load):
        log = []
        m = nn.Sequential(nn.Linear(2, 2), nn.Identity(), nn.Linear(2, 2))
        m[1].register_load_state_dict_post_hook(
            lambda module, keys: log.append(list(keys.missing_keys)))
        state = dict(m.state_dict())
        del state["0.bias"], state["2.weight"]
        load(m, state)
        return log

    def tied(load):
        m = nn.Module()
        m.head = nn.Sequential(nn.Linear(2, 2, bias=False))
        m.emb = nn.Linear(2, 2, bias=False)
        m.emb.weight = m.head[0].weight
        m.head.register_load_state_dict_post_hook(lambda module, keys: None)
        load(m, {"head.0.weight": torch.full((2, 2), 1.0),
                 "emb.weight": torch.full((2, 2), 2.0)})
        return float(m.emb.weight[0, 0])

    def returning(load):
        m = nn.Sequential(nn.Linear(2, 2))
        m[0].register_load_state_dict_post_hook(lambda module, keys: "x")
        try:
            load(m, dict(m.state_dict()))
            return "loaded"
        except AssertionError:
            return "AssertionError"

    def lazy(load):
        torch.manual_seed(0)
        source = nn.Sequential(nn.Linear(4, 3))
        m = nn.Sequential(nn.LazyLinear(3))
        load(m, dict(source.state_dict()))
        return torch.equal(m[0].weight, source[0].weight)

    want, got = both(failing)
    assert got == want and want[0] == ["post", "negative w"], (want, got)
    want, got = both(sees_missing)
    assert got == want == [["0.bias"]], (want, got)
    assert both(tied) == [2.0, 2.0]
    assert both(returning) == ["AssertionError", "AssertionError"]
    assert both(lazy) == [True, True]


def test_module_versions_travel_with_the_state_dict():
    """get_model_state_dict keeps the modules' versions (_metadata, in an
    OrderedDict) as torch's does, and set_model_state_dict hands each
    module its own: a quantized Linear reads its version to know where its
    weight lies (without it the load failed with KeyError '0.weight')."""
    import warnings

    nnq = pytest.importorskip("torch.ao.nn.quantized")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated
        source = nn.Sequential(nnq.Linear(4, 3))
        target = nn.Sequential(nnq.Linear(4, 3))
        source[0].set_weight_bias(
            torch.quantize_per_tensor(torch.arange(12.).reshape(3, 4) / 10,
                                      0.05, 0, torch.qint8),
            torch.tensor([1., 2., 3.]))
        state = sd.get_model_state_dict(source)
        assert isinstance(state, collections.OrderedDict)
        assert state._metadata["0"] == source.state_dict()._metadata["0"]
        result = sd.set_model_state_dict(target, state)
        assert (result.missing_keys, result.unexpected_keys) == ([], [])
        weight, bias = target[0]._weight_bias()
        assert torch.equal(weight.int_repr(), source[0].weight().int_repr())
        assert torch.equal(bias, torch.tensor([1., 2., 3.]))
        # Also the copies full_state_dict and cpu_offload return (torch's
        # lose the versions there).
        for options in (sd.StateDictOptions(cpu_offload=True),
                        sd.StateDictOptions(full_state_dict=True)):
            other = nn.Sequential(nnq.Linear(4, 3))
            copied = sd.get_model_state_dict(source, options=options)
            assert "0" in copied._metadata, options
            sd.set_model_state_dict(other, copied, options=options)
            assert torch.equal(other[0].weight().int_repr(),
                               source[0].weight().int_repr()), options
