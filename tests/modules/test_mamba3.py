"""OrderedMamba3 on the CPU: layout, constructor checks, the reference's forms against each other, the ordered
backward (values, repeat bits, a fresh process, per-example independence), decoding, refusals.

The layouts below are mamba-ssm 2.3.2.post1's ``Mamba3`` (read from its constructor); tests/gpu/modules/
test_mamba3_native.py checks them against the real module.
"""
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from ordered_ssd.modules.mamba3 import OrderedMamba3
from ordered_ssd.reference.mamba3 import (Mamba3States, ordered_reference_mamba3_bwd, reference_mamba3_layer,
                                          reference_mamba3_recurrence, reference_mamba3_scan)
from tests.helpers import bits_equal, sha256

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # the repository root
F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16

RECORDED = [
    (dict(d_model=64), [
        ("dt_bias", (2,), F32), ("B_bias", (2, 1, 128), F32), ("C_bias", (2, 1, 128), F32), ("D", (2,), F32),
        ("in_proj.weight", (550, 64), F32), ("B_norm.weight", (128,), F32), ("C_norm.weight", (128,), F32),
        ("out_proj.weight", (64, 128), F32)]),
    (dict(d_model=32, d_state=16, headdim=8, ngroups=2, rope_fraction=1.0, is_outproj_norm=True, dtype=BF16), [
        ("dt_bias", (8,), F32), ("B_bias", (8, 1, 16), F32), ("C_bias", (8, 1, 16), F32), ("D", (8,), F32),
        ("in_proj.weight", (224, 32), BF16), ("B_norm.weight", (16,), BF16), ("C_norm.weight", (16,), BF16),
        ("norm.weight", (64,), BF16), ("out_proj.weight", (32, 64), BF16)]),
    (dict(d_model=48, d_state=6, expand=1, headdim=12, dtype=F64), [
        ("dt_bias", (4,), F32), ("B_bias", (4, 1, 6), F32), ("C_bias", (4, 1, 6), F32), ("D", (4,), F32),
        ("in_proj.weight", (121, 48), F64), ("B_norm.weight", (6,), F64), ("C_norm.weight", (6,), F64),
        ("out_proj.weight", (48, 48), F64)]),
]

CFG = dict(d_model=16, d_state=8, headdim=8, chunk_size=5)
CFG2 = dict(d_model=16, d_state=8, headdim=4, ngroups=2, rope_fraction=1.0, is_outproj_norm=True, chunk_size=4)


def make(seed=0, dtype=F64, **kw):
    torch.manual_seed(seed)
    layer = OrderedMamba3(**{**CFG, **kw}).to(dtype)
    with torch.no_grad():  # move every parameter off its constant initialisation
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer


def scan_inputs(batch=2, seqlen=11, heads=4, groups=2, n=8, p=4, s=3, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g, dtype=dtype)
    dt = torch.nn.functional.softplus(r(batch, seqlen, heads))
    return dict(C=r(batch, seqlen, groups, n), Bm=r(batch, seqlen, groups, n), x=r(batch, seqlen, heads, p), dt=dt,
                a=-dt * torch.rand(batch, seqlen, heads, generator=g, dtype=dtype), trap=r(batch, seqlen, heads),
                C_bias=r(heads, n), B_bias=r(heads, n), angle=r(batch, seqlen, s), D=r(heads),
                z=r(batch, seqlen, heads, p))


# ------------------------------------------------------------------------------------------------ layout
@pytest.mark.parametrize("kwargs,layout", RECORDED)
def test_state_dict_layout_matches_recorded_native_layout(kwargs, layout):
    layer = OrderedMamba3(**kwargs)
    assert [(k, tuple(v.shape), v.dtype) for k, v in layer.state_dict().items()] == layout
    other = OrderedMamba3(**kwargs)
    other.load_state_dict(layer.state_dict(), strict=True)
    for k, v in other.state_dict().items():
        assert bits_equal(v, layer.state_dict()[k]), k


def test_initial_values_and_attributes():
    torch.manual_seed(3)
    layer = OrderedMamba3(d_model=64, d_state=16, headdim=16, dt_min=0.01, dt_max=0.05)
    assert (layer.B_bias == 1).all() and (layer.C_bias == 1).all() and (layer.D == 1).all()
    assert (layer.B_norm.weight == 1).all() and (layer.C_norm.weight == 1).all()
    dt = torch.nn.functional.softplus(layer.dt_bias.detach())  # dt_bias = softplus^-1(dt), dt in [dt_min, dt_max]
    assert float(dt.min()) >= 0.01 * (1 - 1e-5) and float(dt.max()) <= 0.05 * (1 + 1e-5)
    assert (layer.nheads, layer.num_rope_angles, layer.split_tensor_size, layer.rotary_dim_divisor) == (8, 4, 8, 4)
    assert layer.dt_bias._no_weight_decay and layer.D._no_weight_decay
    # the same seed draws the same parameters
    torch.manual_seed(3)
    again = OrderedMamba3(d_model=64, d_state=16, headdim=16, dt_min=0.01, dt_max=0.05)
    for (k, a), b in zip(layer.state_dict().items(), again.state_dict().values()):
        assert bits_equal(a, b), k


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(is_mimo=True), NotImplementedError, "is_mimo=True"),
    (dict(rope_fraction=0.25), ValueError, "rope_fraction"),
    (dict(headdim=48), ValueError, "headdim"),
    (dict(headdim=8, ngroups=3), ValueError, "ngroups"),
    (dict(d_state=2, rope_fraction=0.5), ValueError, "d_state"),
    (dict(dt_min=0.2, dt_max=0.1), ValueError, "dt_min"),
    (dict(d_state=0), ValueError, "d_state"),
    (dict(chunk_size=2.0), TypeError, "chunk_size"),
    (dict(dtype=torch.int32), TypeError, "dtype"),
    (dict(is_outproj_norm="yes"), TypeError, "is_outproj_norm"),
])
def test_constructor_refuses_bad_arguments(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        OrderedMamba3(**{"d_model": 32, "d_state": 16, "headdim": 16, **kwargs})


# ------------------------------------------------------------------------------------------------ the reference
@pytest.mark.parametrize("chunk_size", [1, 3, 4, 11, 64])
@pytest.mark.parametrize("with_states", [False, True])
def test_chunked_scan_equals_the_recurrence(chunk_size, with_states):
    inp = scan_inputs()
    init = None
    if with_states:
        g = torch.Generator().manual_seed(5)
        init = Mamba3States(torch.rand(2, 4, 3, generator=g, dtype=F64) * 6, torch.randn(2, 4, 4, 8, generator=g,
                            dtype=F64), torch.randn(2, 4, 8, generator=g, dtype=F64),
                            torch.randn(2, 4, 4, generator=g, dtype=F64))
    y_rec, f_rec = reference_mamba3_recurrence(**inp, initial_states=init)
    y_chk, f_chk = reference_mamba3_scan(**inp, initial_states=init, chunk_size=chunk_size)
    assert (y_rec - y_chk).abs().max() < 1e-12
    for a, b in zip(f_rec, f_chk):
        assert (a - b).abs().max() < 1e-12


def test_recurrence_matches_a_hand_computed_two_steps():
    """One head, P = 1, N = 2, one rotary angle, no bias: the equations of the module docstring by hand."""
    import math
    q = torch.tensor([[[[1.0, 2.0]], [[0.5, -1.0]]]], dtype=F64)
    k = torch.tensor([[[[3.0, -1.0]], [[1.0, 1.0]]]], dtype=F64)
    x = torch.tensor([[[[2.0]], [[-1.0]]]], dtype=F64)
    dt = torch.tensor([[[0.5], [0.25]]], dtype=F64)
    a = torch.tensor([[[-0.2], [-0.4]]], dtype=F64)
    trap = torch.tensor([[[0.0], [1.0]]], dtype=F64)
    angle = torch.tensor([[[0.3], [-0.7]]], dtype=F64)
    zeros = torch.zeros(1, 2, dtype=F64)
    y, final = reference_mamba3_recurrence(q, k, x, dt, a, trap, zeros, zeros, angle)

    def rot(v, th):
        return torch.tensor([v[0] * math.cos(th) - v[1] * math.sin(th), v[0] * math.sin(th) + v[1] * math.cos(th)],
                            dtype=F64)
    th0 = math.pi * math.tanh(0.3) * 0.5
    th1 = th0 + math.pi * math.tanh(-0.7) * 0.25
    lam0, lam1 = 0.5, 1 / (1 + math.exp(-1.0))
    k0, k1 = rot([3.0, -1.0], th0), rot([1.0, 1.0], th1)
    q0, q1 = rot([1.0, 2.0], th0), rot([0.5, -1.0], th1)
    s0 = lam0 * 0.5 * 2.0 * k0
    s1 = (math.exp(-0.4) * s0 + (1 - lam1) * 0.25 * math.exp(-0.4) * 2.0 * k0 + lam1 * 0.25 * -1.0 * k1)
    assert torch.allclose(y[0, :, 0, 0], torch.stack([s0 @ q0, s1 @ q1]), atol=1e-14, rtol=0)
    assert torch.allclose(final.ssm[0, 0, 0], s1, atol=1e-14, rtol=0)
    assert abs(float(final.angle[0, 0, 0]) - (th1 % (2 * math.pi))) < 1e-14


def test_a_split_with_states_continues_the_whole_sequence():
    layer = make(**CFG2)
    u = torch.randn(2, 13, 16, dtype=F64)
    p, dims = layer.layer_params(), layer.dims
    whole, f_whole = reference_mamba3_layer(u, p, dims, return_final_states=True)
    first, f_first = reference_mamba3_layer(u[:, :6], p, dims, return_final_states=True)
    second, f_second = reference_mamba3_layer(u[:, 6:], p, dims, initial_states=f_first, return_final_states=True)
    assert (torch.cat([first, second], 1) - whole).abs().max() < 1e-12
    for a, b in zip(f_second, f_whole):
        assert (a - b).abs().max() < 1e-12


def test_varlen_sequences_are_computed_alone():
    layer = make()
    u = torch.randn(1, 12, 16, dtype=F64)
    cu = torch.tensor([0, 5, 6, 12], dtype=torch.int32)
    packed = layer(u, cu_seqlens=cu)
    alone = torch.cat([layer(u[:, lo:hi]) for lo, hi in ((0, 5), (5, 6), (6, 12))], dim=1)
    assert (packed - alone).abs().max() < 1e-12  # the projections' GEMMs over other lengths round differently
    assert (packed - layer(u)).abs().max() > 1e-3  # and the packing matters


# ------------------------------------------------------------------------------------------------ ordered backward
def _step(layer, u, cu_seqlens=None):
    layer.zero_grad(set_to_none=True)
    u = u.detach().clone().requires_grad_(True)
    out = layer(u, cu_seqlens=cu_seqlens)
    out.float().sin().sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in layer.named_parameters()}
    grads["u"], grads["out"] = u.grad.detach().clone(), out.detach().clone()
    return grads


@pytest.mark.parametrize("cfg", [CFG, CFG2])
def test_ordered_gradients_equal_autograd_of_the_reference(cfg):
    layer = make(**cfg)
    u = torch.randn(3, 14, 16, dtype=F64)
    got = _step(layer, u)
    uu = u.clone().requires_grad_(True)
    params = layer.layer_params()
    leaves = [p.detach().double().requires_grad_() if p is not None else None for p in params]
    out = reference_mamba3_layer(uu, type(params)(*leaves), layer.dims)
    out.float().sin().sum().backward()  # the loss of _step
    assert (got["u"] - uu.grad).abs().max() < 1e-12
    for (name, p), leaf in zip(((n, p) for n, p in zip(params._fields, params)), leaves):
        if p is None:
            continue
        key = {"in_proj_weight": "in_proj.weight", "out_proj_weight": "out_proj.weight", "norm_weight": "norm.weight",
               "B_norm_weight": "B_norm.weight", "C_norm_weight": "C_norm.weight"}.get(name, name)
        tol = 1e-12 if got[key].dtype == F64 else 1e-5 * max(1.0, float(leaf.grad.abs().max()))
        assert (got[key].double() - leaf.grad).abs().max() <= tol, name


@pytest.mark.parametrize("dtype", [F32, F64])
def test_gradients_bitwise_identical_over_repeats(dtype):
    layer = make(seed=2, dtype=dtype, **CFG2)
    u = torch.randn(3, 17, 16, dtype=dtype)
    first = _step(layer, u)
    for _ in range(9):
        again = _step(layer, u)
        for name, g in first.items():
            assert bits_equal(g, again[name]), name


def test_an_examples_partial_does_not_depend_on_the_rest_of_the_batch():
    layer = make(seed=4, dtype=F32)
    u = torch.randn(4, 10, 16)
    dout = torch.randn(4, 10, 16)
    params = layer._reference_params(F32)
    _, _, partials = ordered_reference_mamba3_bwd(dout, u, params, layer.dims, return_partials=True)
    for b in (0, 2):
        _, alone, _ = ordered_reference_mamba3_bwd(dout[b:b + 1], u[b:b + 1], params, layer.dims)
        for name, got, want in zip(alone._fields, alone, partials[b]):
            if want is not None:
                assert bits_equal(got, want.to(got.dtype)), (b, name)


_CHILD = textwrap.dedent("""
    import json, torch
    torch.set_num_threads(1)
    from ordered_ssd.modules.mamba3 import OrderedMamba3
    from ordered_ssd.digest import tensor_sha256
    torch.manual_seed(0)
    layer = OrderedMamba3(d_model=16, d_state=8, headdim=4, ngroups=2, rope_fraction=1.0, is_outproj_norm=True,
                          chunk_size=4)
    u = torch.randn(3, 9, 16, requires_grad=True)
    layer(u).sin().sum().backward()
    print(json.dumps({n: tensor_sha256(p.grad) for n, p in layer.named_parameters()} | {"u": tensor_sha256(u.grad)}))
""")


def test_a_fresh_process_gives_the_same_gradient_digests():
    runs = [subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=ROOT, check=True)
            for _ in range(2)]
    digests = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        layer = OrderedMamba3(d_model=16, d_state=8, headdim=4, ngroups=2, rope_fraction=1.0, is_outproj_norm=True,
                              chunk_size=4)
        u = torch.randn(3, 9, 16, requires_grad=True)
        layer(u).sin().sum().backward()
        here = {n: sha256(p.grad) for n, p in layer.named_parameters()} | {"u": sha256(u.grad)}
    finally:
        torch.set_num_threads(threads)
    assert len(here) == 10
    assert digests[0] == digests[1] == here


# ------------------------------------------------------------------------------------------------ decoding
@pytest.mark.parametrize("cfg", [CFG, CFG2])
def test_prefill_then_steps_continue_the_forward(cfg):
    layer = make(layer_idx=3, **cfg)
    u = torch.randn(2, 12, 16, dtype=F64)
    full = layer(u).detach()
    params = SimpleNamespace(key_value_memory_dict={}, seqlen_offset=0)
    with torch.no_grad():
        outs = [layer(u[:, :7], inference_params=params)]
        for t in range(7, 12):
            params.seqlen_offset = t
            outs.append(layer(u[:, t:t + 1], inference_params=params))
    assert (torch.cat(outs, 1) - full).abs().max() < 1e-12
    angle, ssm, k, v = params.key_value_memory_dict[3]
    assert [tuple(t.shape) for t in (angle, ssm, k, v)] == [(2, layer.nheads, layer.num_rope_angles),
                                                             (2, layer.nheads, 4 if cfg is CFG2 else 8, 8),
                                                             (2, 1, layer.nheads, 8),
                                                             (2, layer.nheads, 4 if cfg is CFG2 else 8)]
    assert float(angle.min()) >= 0 and float(angle.max()) < 2 * 3.141592653589794


def test_steps_are_bitwise_repeatable_and_update_the_cache_in_place():
    layer = make(dtype=F32)
    u = torch.randn(3, 16)
    results = []
    for _ in range(3):
        cache = layer.allocate_inference_cache(3, 10)
        ids = [t.data_ptr() for t in cache]
        outs = [layer.step(u * (i + 1), *cache)[0] for i in range(4)]
        assert [t.data_ptr() for t in cache] == ids
        results.append((torch.stack(outs), *[t.clone() for t in cache]))
    for later in results[1:]:
        for a, b in zip(results[0], later):
            assert bits_equal(a, b)
    assert results[0][1].dtype == F32 and results[0][3].dtype == F32


def test_allocate_inference_cache_dtypes():
    layer = OrderedMamba3(**CFG)
    angle, ssm, k, v = layer.allocate_inference_cache(2, 0, dtype=BF16)
    assert (angle.dtype, ssm.dtype, k.dtype, v.dtype) == (F32, F32, BF16, BF16)
    angle, ssm, k, v = layer.double().allocate_inference_cache(2, 0)
    assert (angle.dtype, ssm.dtype, k.dtype, v.dtype) == (F64, F64, F64, F64)


# ------------------------------------------------------------------------------------------------ refusals
def test_refusals_name_the_argument():
    layer = make(dtype=F32)
    u = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="seq_idx"):
        layer(u, seq_idx=torch.zeros(2, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="d_model"):
        layer(torch.randn(2, 5, 15))
    with pytest.raises(TypeError, match="dtype"):
        layer(u.double())
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer(torch.randn(1, 5, 16), cu_seqlens=torch.tensor([0, 3, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="layer_idx"):
        layer(u, inference_params=SimpleNamespace(key_value_memory_dict={}, seqlen_offset=0))
    cache = layer.allocate_inference_cache(2, 0)
    with pytest.raises(ValueError, match="ssm_state"):
        layer.step(u[:, 0], cache[0], cache[1][:1], *cache[2:])
    with pytest.raises(ValueError, match="one token"):
        layer.step(u, *cache)
    layer.backend = "cuda"
    with pytest.raises(ValueError, match="CUDA tensor"):
        layer(u)
    layer.backend = "fast"
    with pytest.raises(ValueError, match="backend"):
        layer(u)


def test_each_norm_uses_its_own_eps():
    """``B_norm``, ``C_norm`` and ``norm`` each keep their own ``eps`` (a converted model may have unequal ones)."""
    layer = make(**CFG2)
    u = torch.randn(2, 9, 16, dtype=F64)
    with torch.no_grad():
        base = layer(u)
        outs = []
        for name in ("B_norm", "C_norm", "norm"):
            getattr(layer, name).eps = 0.5
            outs.append(layer(u))
            getattr(layer, name).eps = 1e-5
    assert all((o - base).abs().max() > 1e-6 for o in outs)
    assert layer.dims.B_norm_eps == layer.dims.C_norm_eps == layer.dims.norm_eps == 1e-5


@pytest.mark.parametrize("kwargs,name", [(dict(d_state=20), "d_state"), (dict(headdim=8, d_state=16), "headdim"),
                                         (dict(chunk_size=48), "chunk_size"), (dict(d_state=8), "d_state")])
def test_the_cuda_path_sizes_are_checked_by_name(kwargs, name):
    """What the CUDA path needs beyond the reference (powers of two >= 16), refused naming the attribute; the
    reference path takes these sizes (they run on the CPU below)."""
    layer = OrderedMamba3(**{"d_model": 32, "d_state": 16, "headdim": 16, "chunk_size": 16, **kwargs})
    with pytest.raises(ValueError, match=rf"{name}: expected a power of two >= 16 on the CUDA path"):
        layer._check_cuda_sizes()
    assert layer(torch.randn(1, 5, 32)).shape == (1, 5, 32)
    OrderedMamba3(d_model=32, d_state=16, headdim=16, chunk_size=16)._check_cuda_sizes()  # accepted


def test_the_reference_op_passes_opcheck_and_a_compiled_layer_gives_the_eager_bits():
    """``ordered_ssd::reference_mamba3`` (the reference path as a custom op): ``torch.library.opcheck`` (schema,
    fake, autograd registration), and ``torch.compile(fullgraph=True)`` of the layer gives eager's bits, output and
    every gradient (inductor cannot fuse the opaque op's arithmetic)."""
    from ordered_ssd.reference.mamba3 import _dims_args, _reference_mamba3

    layer = make(seed=5, dtype=F32, **CFG2)
    u = torch.randn(2, 11, 16)
    args = (u.clone().requires_grad_(True), None, *[p.detach().clone().requires_grad_(True) if p is not None else None
                                                    for p in layer.layer_params()], *_dims_args(layer.dims))
    torch.library.opcheck(_reference_mamba3, args, test_utils=("test_schema", "test_faketensor",
                                                               "test_autograd_registration"))

    def step(fn):
        layer.zero_grad(set_to_none=True)
        x = u.clone().requires_grad_(True)
        out = fn(x)
        out.square().sum().backward()
        return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]
    eager = step(layer)
    compiled = step(torch.compile(layer, fullgraph=True))
    assert len(eager) == 2 + len(list(layer.parameters()))
    for a, b in zip(eager, compiled):
        assert bits_equal(a, b)


def test_step_parameters_are_cast_once_and_again_after_a_change():
    """A step's parameters in another dtype (fp32 for a bf16 layer on CUDA) are cast once and kept, and cast again
    after an in-place update or a new parameter object; the same dtype is never copied."""
    layer = make(dtype=F32)
    first = layer._step_params(F64)
    assert layer._step_params(F64) is first and first.in_proj_weight.dtype == F64
    with torch.no_grad():
        layer.D.add_(1.0)  # an optimizer step: the in-place version changes
    second = layer._step_params(F64)
    assert second is not first and torch.equal(second.D, layer.D.double())
    layer.load_state_dict({k: v.clone() for k, v in layer.state_dict().items()})
    assert layer._step_params(F64) is not second
    assert layer._step_params(F32).in_proj_weight is layer.in_proj.weight
