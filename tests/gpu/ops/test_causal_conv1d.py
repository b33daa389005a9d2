"""ordered_ssd.ops.causal_conv1d on the GPU.

* the custom op's gradients are its composition's, and ``dweight``/``dbias`` are the folds of the per-(example, tile)
  partials, example then tile; fresh buffers full of NaN change nothing;
* ``dx`` has the bits of causal-conv1d's own batched backward (``causal_conv1d_bwd_function``), with and without
  ``seq_idx``;
* ``dweight``/``dbias`` are within the GPU binding tests' tolerance of an fp64 autograd reference
  (``err_ours <= 2 * err_native + floor * max|ref|``, ``floor`` 1e-2 bf16, 2e-3 fp32);
* the partials kernel is close to its PyTorch order (:func:`conv1d_grad_partials_torch`; the CUDA build may
  contract a product and a sum into one FMA, so not bitwise);
* literal (per-example launches) == fast, an example's partials alone == in the batch, 20 repeats bitwise;
* the number of CUDA kernel launches of the backward is the same for B = 2 and B = 16 (and with packed sequences),
  counted with ``torch.profiler``.
"""
from functools import partial

import pytest
import torch

from ordered_ssd.fold import (
    CONV1D_BWD_TILE_L,
    LexicalFold,
    conv1d_grad_partials,
    conv1d_grad_partials_torch,
)
from ordered_ssd.ops.causal_conv1d import (
    ordered_causal_conv1d,
    ordered_causal_conv1d_bwd,
)
from ordered_ssd.reference import reference_causal_conv1d
from tests.helpers import bits_equal

FLOOR = {torch.bfloat16: 1e-2, torch.float32: 2e-3}


def _problem(dtype, B=3, L=2 * CONV1D_BWD_TILE_L + 70, D=40, W=4, seed=4, extra=24):
    """x and dout channel-last views [B, D, L] (x a slice of wider memory, as xBC of zxbcdt), weight, bias."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, L, D + extra, device="cuda", generator=g).to(dtype)[..., :D].transpose(1, 2)
    weight = (0.5 * torch.randn(D, W, device="cuda", generator=g)).to(dtype)
    bias = torch.randn(D, device="cuda", generator=g).to(dtype)
    dout = torch.randn(B, L, D, device="cuda", generator=g).to(dtype).transpose(1, 2)
    return x, weight, bias, dout


def _seq_idx(B, L):
    s = torch.zeros(B, L, dtype=torch.int32, device="cuda")
    s[:, L // 3:] = 1
    s[1:, L // 2 + 1:] = 2  # a boundary inside a tile, rows that differ
    return s


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_function_equals_composition_and_the_example_then_tile_fold(dtype, nan_fresh_buffers):
    x, weight, bias, dout = _problem(dtype)
    xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, weight, bias))
    ordered_causal_conv1d(xg, wg, bg, activation="silu").backward(dout)
    dx, dweight, dbias, dw_p, db_p = ordered_causal_conv1d_bwd(x, weight, bias, dout.contiguous(), silu=True)
    assert bits_equal(xg.grad, dx) and bits_equal(wg.grad, dweight) and bits_equal(bg.grad, dbias)
    assert dw_p.shape == (3, 3, 40, 4) and db_p.shape == (3, 3, 40)
    fold_w, fold_b = LexicalFold(dtype), LexicalFold(dtype)
    for b in range(3):
        for t in range(3):
            fold_w.add(dw_p[b, t])
            fold_b.add(db_p[b, t])
    assert bits_equal(dweight, fold_w.result()) and bits_equal(dbias, fold_b.result())
    assert torch.isfinite(dx.float()).all()


@pytest.mark.parametrize("seq", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dx_is_the_native_batched_dx_and_the_weight_grads_are_within_tolerance(dtype, seq):
    from causal_conv1d.cpp_functions import causal_conv1d_bwd_function

    x, weight, bias, dout = _problem(dtype)
    seq_idx = _seq_idx(3, x.shape[2]) if seq else None
    dx, dweight, dbias, _, _ = ordered_causal_conv1d_bwd(x, weight, bias, dout, seq_idx=seq_idx, silu=True)
    ndx, ndw, ndb, _ = causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, None, None, None, False, True)
    assert bits_equal(dx, ndx)
    xx = x.detach().double().transpose(1, 2)
    ww, bb = weight.detach().double().requires_grad_(), bias.detach().double().requires_grad_()
    out = reference_causal_conv1d(xx, ww, bb, seq_idx.long() if seq else None, activation="silu")
    ref_w, ref_b = torch.autograd.grad((out * dout.double().transpose(1, 2)).sum(), (ww, bb))
    for ours, native, ref in ((dweight, ndw, ref_w), (dbias, ndb, ref_b)):
        err_ours = (ours.double() - ref).abs().max().item()
        err_native = (native.double() - ref).abs().max().item()
        assert err_ours <= 2 * err_native + FLOOR[dtype] * ref.abs().max().item(), (err_ours, err_native)


@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("seq", [False, True])
def test_partials_kernel_is_close_to_its_pytorch_order(W, silu, seq):
    x, weight, bias, dout = _problem(torch.float32, W=W, D=72)  # two channel blocks
    seq_idx = _seq_idx(3, x.shape[2]) if seq else None
    got_w, got_b = conv1d_grad_partials(x, weight, bias, dout, seq_idx=seq_idx, silu=silu)
    ref_w, ref_b = conv1d_grad_partials_torch(x, weight, bias, dout, seq_idx=seq_idx, silu=silu)
    assert torch.allclose(got_w, ref_w, rtol=1e-5, atol=1e-5 * ref_w.abs().max().item())
    assert torch.allclose(got_b, ref_b, rtol=1e-5, atol=1e-5 * ref_b.abs().max().item())


@pytest.mark.parametrize("seq", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_literal_equals_fast_and_an_examples_partials_do_not_depend_on_the_batch(dtype, seq):
    x, weight, bias, dout = _problem(dtype)
    seq_idx = _seq_idx(3, x.shape[2]) if seq else None
    fast = ordered_causal_conv1d_bwd(x, weight, bias, dout, seq_idx=seq_idx, silu=True)
    literal = ordered_causal_conv1d_bwd(x, weight, bias, dout, seq_idx=seq_idx, silu=True, literal=True)
    for got, want in zip(literal, fast, strict=True):
        assert bits_equal(got, want)
    for b in range(3):
        alone = ordered_causal_conv1d_bwd(x[b:b + 1], weight, bias, dout[b:b + 1], silu=True,
                                          seq_idx=seq_idx[b:b + 1] if seq else None)
        assert bits_equal(alone[0], fast[0][b:b + 1])
        assert bits_equal(alone[3][0], fast[3][b]) and bits_equal(alone[4][0], fast[4][b]), b


@pytest.mark.parametrize("seq", [False, True])
def test_bitwise_repeatable(seq):
    x, weight, bias, dout = _problem(torch.bfloat16, B=4)
    seq_idx = _seq_idx(4, x.shape[2]) if seq else None
    first = ordered_causal_conv1d_bwd(x, weight, bias, dout, seq_idx=seq_idx, silu=True)
    for _ in range(20):
        again = ordered_causal_conv1d_bwd(x, weight, bias, dout, seq_idx=seq_idx, silu=True)
        assert all(bits_equal(a, f) for a, f in zip(again, first))


def _cuda_launches(fn):
    """Number of CUDA kernel launches (kernels and memsets) ``fn`` makes, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # compile and warm up outside the count
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


@pytest.mark.parametrize("seq", [False, True])
def test_launch_count_does_not_depend_on_the_batch(seq):
    counts, literal_counts = {}, {}
    for B in (2, 16):
        x, weight, bias, dout = _problem(torch.bfloat16, B=B)
        seq_idx = _seq_idx(B, x.shape[2]) if seq else None
        if seq:  # more packed sequences per row in the larger batch
            seq_idx = seq_idx + (torch.arange(x.shape[2], device="cuda", dtype=torch.int32) // 37) * (B > 2)
        bwd = partial(ordered_causal_conv1d_bwd, x, weight, bias, dout, seq_idx=seq_idx, silu=True)
        counts[B] = _cuda_launches(bwd)
        literal_counts[B] = _cuda_launches(partial(bwd, literal=True))
    assert counts[2] == counts[16] and counts[2] > 0, counts
    assert literal_counts[16] > literal_counts[2], literal_counts  # the counter sees per-example launches
