"""OrderedMamba2 as a drop-in for mamba_ssm's Mamba2: layout, attributes, initialisation, errors."""
import inspect
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import make_layer, rel_err
from ordered_ssd import OrderedMamba2
from ordered_ssd.reference import reference_mamba2_layer
from ordered_ssd.reference.canonical import canonical_mamba2_layer

# state_dict (key, shape, dtype) of mamba_ssm.modules.mamba2.Mamba2 2.3.2.post1, recorded for each config.
RECORDED = [
    (dict(d_model=256), [
        ("dt_bias", (8,), torch.float32), ("A_log", (8,), torch.float32), ("D", (8,), torch.float32),
        ("in_proj.weight", (1288, 256), torch.float32), ("conv1d.weight", (768, 1, 4), torch.float32),
        ("conv1d.bias", (768,), torch.float32), ("norm.weight", (512,), torch.float32),
        ("out_proj.weight", (256, 512), torch.float32)]),
    (dict(d_model=64, d_state=16, headdim=16, ngroups=2, D_has_hdim=True, bias=True, conv_bias=False, d_ssm=64,
          dtype=torch.float64), [
        ("dt_bias", (4,), torch.float64), ("A_log", (4,), torch.float64), ("D", (64,), torch.float32),
        ("in_proj.weight", (324, 64), torch.float64), ("in_proj.bias", (324,), torch.float64),
        ("conv1d.weight", (128, 1, 4), torch.float64), ("norm.weight", (64,), torch.float64),
        ("out_proj.weight", (64, 128), torch.float64), ("out_proj.bias", (64,), torch.float64)]),
    (dict(d_model=48, d_state=32, d_conv=3, expand=3, headdim=12, ngroups=4, rmsnorm=False), [
        ("dt_bias", (12,), torch.float32), ("A_log", (12,), torch.float32), ("D", (12,), torch.float32),
        ("in_proj.weight", (556, 48), torch.float32), ("conv1d.weight", (400, 1, 3), torch.float32),
        ("conv1d.bias", (400,), torch.float32), ("out_proj.weight", (48, 144), torch.float32)]),
]

NATIVE_SIGNATURE = [
    ("d_model", inspect.Parameter.empty), ("d_state", 128), ("d_conv", 4), ("conv_init", None), ("expand", 2),
    ("headdim", 64), ("d_ssm", None), ("ngroups", 1), ("A_init_range", (1, 16)), ("D_has_hdim", False),
    ("rmsnorm", True), ("norm_before_gate", False), ("dt_min", 0.001), ("dt_max", 0.1), ("dt_init_floor", 1e-4),
    ("dt_limit", (0.0, float("inf"))), ("bias", False), ("conv_bias", True), ("chunk_size", 256),
    ("use_mem_eff_path", True), ("layer_idx", None), ("process_group", None), ("sequence_parallel", True),
    ("device", None), ("dtype", None),
]


@pytest.mark.parametrize("kwargs,layout", RECORDED)
def test_state_dict_layout_matches_recorded_native_layout(kwargs, layout):
    layer = OrderedMamba2(**kwargs)
    got = [(k, tuple(v.shape), v.dtype) for k, v in layer.state_dict().items()]
    assert got == layout
    # and it loads into a fresh layer of the same config with strict=True
    other = OrderedMamba2(**kwargs)
    other.load_state_dict(layer.state_dict(), strict=True)
    for k, v in other.state_dict().items():
        assert torch.equal(v, layer.state_dict()[k]), k


def test_constructor_signature_matches_native():
    params = list(inspect.signature(OrderedMamba2.__init__).parameters.values())[1:]
    assert [(p.name, p.default) for p in params] == NATIVE_SIGNATURE


def test_public_attributes():
    layer = OrderedMamba2(d_model=64, d_state=16, headdim=16, ngroups=2, d_ssm=96, chunk_size=32, layer_idx=3,
                          dt_limit=(0.0, 0.5))
    assert (layer.d_model, layer.d_state, layer.d_conv, layer.expand, layer.d_inner) == (64, 16, 4, 2, 128)
    assert (layer.headdim, layer.d_ssm, layer.ngroups, layer.nheads) == (16, 96, 2, 6)
    assert (layer.rmsnorm, layer.norm_before_gate, layer.dt_limit, layer.chunk_size) == (True, False, (0.0, 0.5), 32)
    assert (layer.activation, layer.layer_idx, layer.use_mem_eff_path, layer.world_size) == ("silu", 3, True, 1)
    assert layer.norm.group_size == 48 and layer.norm.eps == 1e-5 and layer.norm.bias is None
    for name in ("dt_bias", "A_log", "D"):
        assert getattr(layer, name)._no_weight_decay is True


def test_initialisation_distributions():
    torch.manual_seed(0)
    layer = OrderedMamba2(d_model=512, d_state=16, headdim=8, dt_min=0.002, dt_max=0.05)
    dt = F.softplus(layer.dt_bias.detach().double())
    assert dt.min() >= 0.002 * (1 - 1e-5) and dt.max() <= 0.05 * (1 + 1e-5)
    # log-uniform: the mean of log(dt) is the midpoint of [log dt_min, log dt_max]
    mid = (math.log(0.002) + math.log(0.05)) / 2
    assert abs(dt.log().mean().item() - mid) < 0.15
    A = torch.exp(layer.A_log.detach())
    assert A.min() >= 1 and A.max() <= 16 and abs(A.mean().item() - 8.5) < 0.6
    assert torch.equal(layer.D.detach(), torch.ones(layer.nheads))
    assert torch.equal(layer.norm.weight.detach(), torch.ones(layer.d_ssm))
    bound = 1 / math.sqrt(layer.d_conv)  # nn.Conv1d default (kaiming-uniform, a=sqrt(5)) for a depthwise conv
    w = layer.conv1d.weight.detach()
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    conv = OrderedMamba2(d_model=64, d_state=16, headdim=16, conv_init=0.01).conv1d.weight.detach()
    assert conv.abs().max() <= 0.01 and conv.abs().max() > 0.009
    small = OrderedMamba2(d_model=64, d_state=16, headdim=16, dt_min=1e-6, dt_max=2e-6, dt_init_floor=1e-4)
    assert torch.allclose(F.softplus(small.dt_bias.detach()), torch.full((8,), 1e-4), rtol=1e-4)


def test_same_seed_same_parameters():
    torch.manual_seed(5)
    a = OrderedMamba2(d_model=32, d_state=8, headdim=8)
    torch.manual_seed(5)
    b = OrderedMamba2(d_model=32, d_state=8, headdim=8)
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k


def test_forward_equals_the_reference_layer_and_flat_input():
    layer = make_layer(seed=1)
    torch.manual_seed(2)
    u = torch.randn(3, 10, layer.d_model, dtype=torch.float64)
    out = layer(u)
    assert out.shape == u.shape
    assert torch.equal(out, canonical_mamba2_layer(u, layer.layer_params(), layer.dims))
    assert rel_err(out, reference_mamba2_layer(u, layer.layer_params(), layer.dims)) < 1e-12  # the same function
    flat = layer(u.reshape(30, layer.d_model), seqlen=10)
    assert flat.shape == (30, layer.d_model) and torch.equal(flat.reshape(3, 10, -1), out)


def test_fp32_parameters_with_fp64_module_D():
    """dtype=float64 keeps D in fp32 (as Mamba2 does); the layer computes in fp64 and D's grad is fp32."""
    layer = OrderedMamba2(d_model=16, d_state=8, headdim=8, chunk_size=8, dtype=torch.float64)
    assert layer.D.dtype == torch.float32
    u = torch.randn(2, 5, 16, dtype=torch.float64)
    layer(u).sum().backward()
    assert layer.D.grad.dtype == torch.float32 and layer.A_log.grad.dtype == torch.float64


def test_nan_input_propagates_without_error():
    layer = make_layer(seed=3, dtype=torch.float32)
    u = torch.randn(2, 12, layer.d_model)
    u[0, 4, 1] = float("nan")
    uu = u.clone().requires_grad_(True)
    out = layer(uu)
    # NaN reaches every later position of its example (earlier positions of the same chunk too:
    # the chunked matmuls multiply it by a zero weight) and never the other example.
    assert torch.isnan(out[0, 4:]).all()
    assert torch.isfinite(out[1]).all()
    out.sum().backward()
    assert torch.isnan(layer.in_proj.weight.grad).any()


def test_importing_does_not_import_native_libraries():
    code = ("import sys, ordered_ssd, csrc_bindings; "
            "bad = [m for m in ('mamba_ssm', 'causal_conv1d', 'triton') if m in sys.modules]; "
            "assert not bad, bad; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
