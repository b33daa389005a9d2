"""ordered_ssd.convert on the CPU, with a stand-in for mamba-ssm's Mamba2 (mamba-ssm is not installed here).

The stand-in is an ``OrderedMamba2`` subclass registered under mamba-ssm's class and module name, so the
conversion sees what it sees in a real model: the same attributes, parameter names and shapes (the GPU test
``tests/gpu/test_convert.py`` converts a real ``MambaLMHeadModel``)."""
import hashlib

import pytest
import torch
import torch.nn as nn

from ordered_ssd import OrderedMamba2, convert_to_mamba2, convert_to_ordered


class Mamba2(OrderedMamba2):
    """Stand-in for mamba_ssm.modules.mamba2.Mamba2 (same name and module)."""


Mamba2.__module__ = "mamba_ssm.modules.mamba2"

ARGS = {"d_model": 32, "d_state": 8, "headdim": 8, "chunk_size": 16}


class Block(nn.Module):
    def __init__(self, layer_idx, **kw):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.mixer = Mamba2(**ARGS, layer_idx=layer_idx, **kw)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(50, 32)
        self.layers = nn.ModuleList([Block(0), Block(1, rmsnorm=False, bias=True, ngroups=2),
                                     Block(2, D_has_hdim=True, d_ssm=32, norm_before_gate=True)])
        self.lm_head = nn.Linear(32, 50, bias=False)

    def forward(self, ids):
        h = self.embedding(ids)
        for block in self.layers:
            h = h + block.mixer(block.norm(h))
        return self.lm_head(h)


def _state_digest(model):
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_convert_to_ordered_keeps_parameters_outputs_and_rng():
    torch.manual_seed(0)
    model = Model()
    ids = torch.randint(0, 50, (2, 20))
    before_out = model(ids)
    before_digest = _state_digest(model)
    params_before = {name: p for name, p in model.named_parameters()}
    model.layers[1].mixer.A_log.grad = torch.ones(model.layers[1].mixer.nheads)
    rng = torch.get_rng_state()
    assert convert_to_ordered(model) is model
    assert torch.equal(torch.get_rng_state(), rng), "conversion drew random numbers"
    for i, block in enumerate(model.layers):
        assert type(block.mixer) is OrderedMamba2
        assert block.mixer.layer_idx == i
    assert model.layers[1].mixer.rmsnorm is False and model.layers[1].mixer.in_proj.bias is not None
    assert model.layers[2].mixer.D_has_hdim and model.layers[2].mixer.d_ssm == 32
    assert model.layers[2].mixer.norm.norm_before_gate is True
    # the very same parameter objects (an optimizer built before keeps working), gradient and attributes included
    for name, p in model.named_parameters():
        assert p is params_before[name], name
    assert model.layers[1].mixer.A_log._no_weight_decay is True
    assert torch.equal(model.layers[1].mixer.A_log.grad, torch.ones(model.layers[1].mixer.nheads))
    assert _state_digest(model) == before_digest
    assert torch.equal(model(ids), before_out)  # the stand-in computes with OrderedMamba2's forward


def test_round_trip_and_strict_state_dict(monkeypatch):
    import csrc_bindings

    torch.manual_seed(0)
    model = Model().double().eval()
    digest = _state_digest(model)
    convert_to_ordered(model)
    monkeypatch.setattr(csrc_bindings, "mamba2_class", lambda: Mamba2)
    assert convert_to_mamba2(model) is model
    assert all(type(b.mixer) is Mamba2 for b in model.layers)
    assert not model.training and not model.layers[0].mixer.training
    assert all(p.dtype == torch.float64 for n, p in model.named_parameters() if not n.endswith(".D"))
    assert _state_digest(model) == digest
    fresh = Model()
    fresh.load_state_dict(model.state_dict(), strict=True)


def test_convert_a_single_layer_returns_the_new_layer():
    layer = Mamba2(**ARGS, layer_idx=7)
    new = convert_to_ordered(layer)
    assert type(new) is OrderedMamba2 and new.layer_idx == 7 and new.in_proj.weight is layer.in_proj.weight


def test_bad_inputs():
    with pytest.raises(TypeError, match=r"model: expected a torch.nn.Module, got int"):
        convert_to_ordered(3)
    with pytest.raises(ValueError, match=r"model: expected at least one mamba_ssm Mamba2 or Mamba3, or transformers "
                                         r"Mamba-2 mixer module, found none"):
        convert_to_ordered(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"model: expected at least one OrderedMamba2 module, found none"):
        convert_to_mamba2(nn.Sequential(nn.Linear(2, 2)))


def test_a_bad_layer_leaves_the_model_unchanged():
    model = Model()
    model.layers[2].mixer.process_group = object()  # tensor parallelism: refused
    with pytest.raises(ValueError, match=r"Mamba2\(layer_idx=2\): process_group: expected None"):
        convert_to_ordered(model)
    assert all(type(b.mixer) is Mamba2 for b in model.layers)


def test_convert_to_mamba2_without_mamba_ssm_names_the_install():
    pytest.importorskip("torch")
    try:
        import mamba_ssm  # noqa: F401
        pytest.skip("mamba-ssm is installed here")
    except ImportError:
        pass
    model = nn.Sequential(OrderedMamba2(**ARGS))
    with pytest.raises(ImportError, match=r"mamba-ssm.*pip install"):
        convert_to_mamba2(model)
    assert type(model[0]) is OrderedMamba2


def test_a_layer_registered_twice_is_replaced_under_both_names_by_one_layer():
    model = nn.Module()
    model.a = Mamba2(**ARGS, layer_idx=0)
    model.b = model.a
    convert_to_ordered(model)
    assert type(model.a) is OrderedMamba2 and model.b is model.a


def _fake_mamba3_class():
    """A stand-in for mamba-ssm's ``Mamba3`` (recognised by class name and module, as the converter does): the
    same constructor, attributes and parameters as OrderedMamba3, which mirrors them."""
    from ordered_ssd.modules.mamba3 import OrderedMamba3

    cls = type("Mamba3", (OrderedMamba3,), {"__module__": "mamba_ssm.modules.mamba3"})
    return cls


def test_mamba3_layers_convert_taking_over_their_parameters():
    from ordered_ssd.modules.mamba3 import OrderedMamba3

    Mamba3 = _fake_mamba3_class()
    torch.manual_seed(0)
    model = nn.Sequential(Mamba3(32, d_state=16, headdim=16, ngroups=2, rope_fraction=1.0, is_outproj_norm=True,
                                 chunk_size=8, layer_idx=0), nn.Linear(32, 32),
                          Mamba3(32, d_state=8, headdim=8, A_floor=1e-3, layer_idx=1))
    model[0].B_norm.eps = 1e-6
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = [id(p) for p in model.parameters()]
    convert_to_ordered(model)
    assert type(model[0]) is OrderedMamba3 and type(model[2]) is OrderedMamba3
    assert [id(p) for p in model.parameters()] == ids
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert (model[0].num_bc_heads, model[0].num_rope_angles, model[0].is_outproj_norm, model[0].layer_idx) == (2, 8,
                                                                                                             True, 0)
    assert model[0].B_norm.eps == 1e-6 and model[2].A_floor == 1e-3 and model[2].chunk_size == 64
    u = torch.randn(2, 5, 32)
    assert model(u).shape == (2, 5, 32)


def test_a_mimo_mamba3_is_refused_and_the_model_left_unchanged():
    Mamba3 = _fake_mamba3_class()
    layer = Mamba3(32, d_state=16, headdim=16)
    layer.is_mimo = True  # the stand-in cannot be built with is_mimo=True; the attribute is what the converter reads
    model = nn.Sequential(Mamba3(32, d_state=16, headdim=16), layer)
    with pytest.raises(ValueError, match="is_mimo: expected False"):
        convert_to_ordered(model)
    assert type(model[0]).__name__ == "Mamba3" and type(model[1]).__name__ == "Mamba3"
