"""The GPU rows of the bad-input table (issue #17, item 3; the CPU rows are ``tests/test_bad_inputs.py``): mixed
CUDA/CPU devices, the CUDA path's own limits (conv width, 32-bit offsets, a pinned configuration that does not fit
the device), each a one-line error naming the argument, expected and actual, before any kernel runs; and the one
documented non-error of the CUDA path (a chunk size that is not a power of two runs and matches the reference).
"""
import re

import pytest
import torch

from ordered_ssd import OrderedMamba2
from ordered_ssd.ops import ordered_mamba_chunk_scan_combined, ordered_mamba_split_conv1d_scan_combined
from tests.helpers import rel_err


def _layer(dtype=torch.bfloat16, **kw):
    torch.manual_seed(0)
    base = dict(d_model=256, d_state=64, headdim=64, chunk_size=64)
    layer = OrderedMamba2(**{**base, **kw}, device="cuda")
    return layer.to(dtype) if dtype != torch.float32 else layer


def _raises(exc, pattern, fn):
    with pytest.raises(exc) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message, f"not one line: {message!r}"
    assert re.search(pattern, message), f"{message!r} !~ {pattern!r}"


def test_module_input_on_the_cpu():
    layer = _layer()
    _raises(ValueError, r"^u: expected device cuda:0 \(the device of the layer's parameters\), got cpu$",
            lambda: layer(torch.randn(2, 64, 256, dtype=torch.bfloat16)))


def test_module_seq_idx_on_the_cpu():
    layer = _layer()
    u = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16)
    _raises(ValueError, r"^seq_idx: expected device cuda:0, got cpu$",
            lambda: layer(u, seq_idx=torch.zeros(2, 64, dtype=torch.int32)))


def test_functional_mixed_devices():
    x = torch.randn(2, 64, 4, 16, device="cuda", dtype=torch.bfloat16)
    args = dict(x=x, dt=torch.rand(2, 64, 4, device="cuda"), A=-torch.rand(4, device="cuda"),
                B=torch.randn(2, 64, 1, 16, device="cuda", dtype=torch.bfloat16),
                C=torch.randn(2, 64, 1, 16, device="cuda", dtype=torch.bfloat16), chunk_size=64)
    _raises(ValueError, r"^dt: expected device cuda:0 \(that of x\), got cpu$",
            lambda: ordered_mamba_chunk_scan_combined(**dict(args, dt=torch.rand(2, 64, 4))))
    _raises(ValueError, r"^D: expected device cuda:0 \(that of x\), got cpu$",
            lambda: ordered_mamba_chunk_scan_combined(**args, D=torch.ones(4)))
    zxbcdt = torch.randn(2, 64, 2 * 64 + 2 * 16 + 4, device="cuda", dtype=torch.bfloat16)
    _raises(ValueError, r"^conv1d_weight: expected device cuda:0 \(that of zxbcdt\), got cpu$",
            lambda: ordered_mamba_split_conv1d_scan_combined(
                zxbcdt, torch.randn(64 + 32, 4), None, torch.zeros(4, device="cuda"), -torch.ones(4, device="cuda"),
                torch.ones(4, device="cuda"), 64, headdim=16))


def test_module_conv_width_outside_2_to_4_on_the_cuda_path():
    """The reference path takes any d_conv; the CUDA path refuses 5 before any kernel (no silent fallback)."""
    layer = _layer(d_conv=5)
    u = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    _raises(ValueError, r"^d_conv: expected 2, 3 or 4 on the CUDA path \(causal-conv1d's kernel widths\), got 5$",
            lambda: layer(u))
    assert all(p.grad is None for p in layer.parameters())


def test_module_input_past_the_32_bit_offsets():
    """B * L * d_in_proj >= 2**31 (zxbcdt; the input itself, 1 GiB, is below): refused from the sizes, before the
    in_proj GEMM allocates its 4.5 GiB output."""
    layer = _layer()
    u = torch.empty(2, 1 << 20, 256, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    _raises(ValueError, r"^B=2, L=1048576: expected fewer than 2\*\*31 elements in every tensor of the CUDA path "
                        r"\(its kernels use 32-bit offsets\), got 2432696320 in zxbcdt \[B, L, d_in_proj\]; split the "
                        r"batch or the sequence$", lambda: layer(u))
    assert torch.cuda.max_memory_allocated() - before < (1 << 20)  # nothing of the layer's size was allocated


# A headdim or d_state whose pinned configuration does not fit the device: with the shared-memory rule
# (csrc_bindings/_resources.py, "fit-stages-v1") a pinned configuration that asks too much runs at fewer pipeline
# stages (same bits) and only a configuration that fits at no stage count is refused with a one-line ValueError.
# On the H200 every headdim-512 configuration fits at fewer stages, so that row is
# tests/gpu/modules/test_resource_fit.py: test_headdim_512_layer_steps_and_repeats (it runs) and
# test_a_device_with_less_shared_memory_gets_the_clear_error (the ValueError naming the bytes, the limit and
# headdim=512, with the limit faked to 120,000 bytes). Both passed on the H200 (2026-11-30).


def _grads_cuda(chunk_size, u, dout):
    layer = _layer(torch.float32, chunk_size=chunk_size)
    assert layer.backend_for(u) == "cuda"
    x = u.clone().requires_grad_(True)
    out = layer(x)
    out.backward(dout)
    res = {"out": out.detach(), "u": x.grad}
    res.update({n: p.grad for n, p in layer.named_parameters()})
    return {k: v.double().cpu() for k, v in res.items()}


def test_chunk_size_not_a_power_of_two_runs_and_matches_the_reference():
    """Documented non-error: the kernels take chunk_size as a runtime argument and mask the last tile, so 48 works.
    Its error against the fp64 reference (on the CPU, same parameters) is within twice that of chunk size 64 (the
    Triton dots of fp32 inputs use TF32, so a fixed tolerance would be loose)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    u = torch.randn(2, 200, 256, device="cuda", generator=g)
    dout = torch.randn(2, 200, 256, device="cuda", generator=g)
    ref_layer = _layer(torch.float32, chunk_size=48).to("cpu", torch.float64)
    xr = u.detach().cpu().double().requires_grad_(True)
    out_r = ref_layer(xr)
    out_r.backward(dout.cpu().double())
    ref = {"out": out_r.detach(), "u": xr.grad}
    ref.update({n: p.grad for n, p in ref_layer.named_parameters()})
    got48, got64 = _grads_cuda(48, u, dout), _grads_cuda(64, u, dout)
    for name, r in ref.items():
        e48, e64 = rel_err(got48[name], r), rel_err(got64[name], r)
        assert e48 <= 2 * e64 + 1e-5, (name, e48, e64)
