"""ordered_ssd.fold.conv1d: the conv1d weight/bias gradient partials per (example, tile) and their order.

On the CPU, :func:`conv1d_grad_partials_torch` (the kernel's order in PyTorch) is checked against an fp64 autograd
gradient, against an independent position-by-position :class:`LexicalFold` of the same fp32 products, and for
batch independence; the Triton kernel itself is run under Triton's interpreter in a fresh process (when triton is
installed; skipped otherwise) and must give the emulation's bits, and is compiled ahead of time for sm_90 (triton's
own ptxas) to check that it builds without atomics (the GPU suite runs it on CUDA).
"""
import textwrap

import pytest
import torch

from ordered_ssd.fold import (
    CONV1D_BWD_TILE_L,
    LexicalFold,
    conv1d_grad_partials,
    conv1d_grad_partials_torch,
    fold_dims,
)
from ordered_ssd.reference import reference_causal_conv1d
from tests.fold.interpreter import run_python
from tests.helpers import bits_equal



def _problem(B, D, L, W, dtype=torch.float32, seq=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, D + 2, generator=g).to(dtype)[..., 1:D + 1].transpose(1, 2)  # channel-last view
    dout = torch.randn(B, L, D, generator=g).to(dtype).transpose(1, 2)
    w = (0.5 * torch.randn(D, W, generator=g)).to(dtype)
    b = torch.randn(D, generator=g).to(dtype)
    seq_idx = None
    if seq:
        seq_idx = torch.zeros(B, L, dtype=torch.int32)
        seq_idx[:, L // 3:] = 1
        seq_idx[1:, L // 2 + 1:] = 2  # a boundary inside a tile, and rows that differ
    return x, dout, w, b, seq_idx


def _fp64_grads(x, dout, w, b, seq_idx, silu):
    xx = x.detach().double().transpose(1, 2)
    ww = w.detach().double().requires_grad_(True)
    bb = b.detach().double().requires_grad_(True) if b is not None else None
    out = reference_causal_conv1d(xx, ww, bb, seq_idx.long() if seq_idx is not None else None,
                                  activation="silu" if silu else None)
    grads = torch.autograd.grad((out * dout.double().transpose(1, 2)).sum(), [ww] + ([bb] if bb is not None else []))
    return grads[0], (grads[1] if bb is not None else None)


@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("seq", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_partials_match_the_fp64_gradient(W, silu, seq, dtype):
    L = 2 * CONV1D_BWD_TILE_L + 37  # three tiles, the last one partial
    x, dout, w, b, seq_idx = _problem(3, 6, L, W, dtype, seq)
    dw_p, db_p = conv1d_grad_partials_torch(x, w, b, dout, seq_idx=seq_idx, silu=silu)
    assert dw_p.shape == (3, 3, 6, W) and db_p.shape == (3, 3, 6) and dw_p.dtype == db_p.dtype == torch.float32
    dw = fold_dims(dw_p, (0, 1))
    db = fold_dims(db_p, (0, 1))
    ref_w, ref_b = _fp64_grads(x, dout, w, b, seq_idx, silu)
    # fp32 products and sums over 3 * 293 positions (the inputs are the same values in both)
    assert torch.allclose(dw.double(), ref_w, rtol=1e-5, atol=1e-4 * ref_w.abs().max().item())
    assert torch.allclose(db.double(), ref_b, rtol=1e-5, atol=1e-4 * ref_b.abs().max().item())


@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("seq", [False, True])
def test_partials_are_the_tiles_position_by_position_folds(W, seq):
    """Without activation ``g = dout``: partial (b, t) must be the left fold, position 0 of the tile first, of the
    fp32 products ``dout[l] * x[l - j]`` (masked), computed here one position at a time."""
    L = CONV1D_BWD_TILE_L + 21
    x, dout, w, b, seq_idx = _problem(2, 5, L, W, seq=seq, seed=1)
    dw_p, db_p = conv1d_grad_partials_torch(x, w, b, dout, seq_idx=seq_idx, silu=False)
    for bi in range(2):
        for t in range(2):
            fw, fb = LexicalFold(torch.float32), LexicalFold(torch.float32)
            for pos in range(t * CONV1D_BWD_TILE_L, min(L, (t + 1) * CONV1D_BWD_TILE_L)):
                g = dout[bi, :, pos].float()
                taps = []
                for k in range(W):  # weight column k multiplies x[pos - (W-1) + k]
                    src = pos - (W - 1) + k
                    ok = src >= 0 and (seq_idx is None or int(seq_idx[bi, src]) == int(seq_idx[bi, pos]))
                    taps.append(g * x[bi, :, src].float() if ok else torch.zeros_like(g))
                fw.add(torch.stack(taps, dim=-1))
                fb.add(g)
            assert bits_equal(dw_p[bi, t], fw.result()) and bits_equal(db_p[bi, t], fb.result()), (bi, t)


def test_fold_order_is_example_then_tile():
    x, dout, w, b, _ = _problem(3, 4, 2 * CONV1D_BWD_TILE_L, 4, seed=2)
    dw_p, _ = conv1d_grad_partials_torch(x, w, b, dout, silu=True)
    fold = LexicalFold(torch.float32)
    for bi in range(3):
        for t in range(2):
            fold.add(dw_p[bi, t])
    assert bits_equal(fold_dims(dw_p, (0, 1)), fold.result())


def test_an_examples_partials_do_not_depend_on_the_batch_and_no_bias():
    x, dout, w, _, seq_idx = _problem(3, 4, CONV1D_BWD_TILE_L + 5, 3, seq=True, seed=3)
    dw_p, db_p = conv1d_grad_partials(x, w, None, dout, seq_idx=seq_idx, silu=True)  # CPU: the PyTorch order
    assert db_p is None
    for bi in range(3):
        alone, _ = conv1d_grad_partials(x[bi:bi + 1], w, None, dout[bi:bi + 1], seq_idx=seq_idx[bi:bi + 1],
                                        silu=True)
        assert bits_equal(alone[0], dw_p[bi]), bi


def test_shape_errors_name_the_argument():
    x, dout, w, b, _ = _problem(2, 4, 8, 4)
    with pytest.raises(ValueError, match=r"weight: expected shape \[D, W\] with D = 4 and W in 2..4, got \(4, 5\)"):
        conv1d_grad_partials(x, torch.zeros(4, 5), b, dout)
    with pytest.raises(ValueError, match=r"bias: expected shape \[D\] = \(4,\), got \(3,\)"):
        conv1d_grad_partials(x, w, b[:3], dout)
    with pytest.raises(ValueError, match=r"dout: expected shape \[B, D, L\] = \(2, 4, 8\), got \(2, 4, 7\)"):
        conv1d_grad_partials(x, w, b, dout[..., :7])
    with pytest.raises(ValueError, match=r"seq_idx: expected shape \[B, L\] = \(2, 8\), got \(2, 7\)"):
        conv1d_grad_partials(x, w, b, dout, seq_idx=torch.zeros(2, 7, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"x: expected a 3-d \[B, D, L\] tensor"):
        conv1d_grad_partials(x[0], w, b, dout)


def test_triton_kernel_under_the_interpreter():
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernel on CUDA)")
    code = textwrap.dedent("""
        import torch
        import ordered_ssd.fold.conv1d as conv1d_module
        from ordered_ssd.fold import conv1d_grad_partials, conv1d_grad_partials_torch
        from tests.fold.test_conv1d import _problem
        from tests.helpers import bits_equal
        conv1d_module.CONV1D_BWD_TILE_L = 16  # a short tile: the interpreter runs every position in Python
        cases = 0
        L = 2 * 16 + 13
        # every W with and without seq_idx; SiLU and the bias alternate (the PyTorch tests cover their product)
        for i, (W, seq) in enumerate([(W, seq) for W in (2, 3, 4) for seq in (False, True)]):
            for silu in (False, True):
                has_bias = (i + silu) % 2 == 0
                x, dout, w, b, seq_idx = _problem(3, 66, L, W, seq=seq, seed=W)  # two channel blocks
                b = b if has_bias else None
                kw = dict(seq_idx=seq_idx, silu=silu)
                got_w, got_b = conv1d_grad_partials(x, w, b, dout, use_triton=True, **kw)
                lit_w, lit_b = conv1d_grad_partials(x, w, b, dout, use_triton=True, literal=True, **kw)
                ref_w, ref_b = conv1d_grad_partials_torch(x, w, b, dout, **kw)
                assert (got_b is None) == (b is None)
                assert bits_equal(got_w, lit_w) and (b is None or bits_equal(got_b, lit_b))
                alone_w, _ = conv1d_grad_partials(x[1:2], w, b, dout[1:2], use_triton=True,
                                                  seq_idx=None if seq_idx is None else seq_idx[1:2], silu=silu)
                assert bits_equal(alone_w[0], got_w[1])
                if silu:  # exp: numpy's and torch's fp32 exp may differ in the last bit
                    assert torch.allclose(got_w, ref_w, rtol=1e-5, atol=1e-5)
                else:
                    assert bits_equal(got_w, ref_w) and (b is None or bits_equal(got_b, ref_b))
                cases += 1
        # channel-first input and bf16: the same bits as the emulation
        x, dout, w, b, _ = _problem(2, 9, 40, 4, dtype=torch.bfloat16, seed=7)
        got = conv1d_grad_partials(x.contiguous(), w, b, dout.contiguous(), use_triton=True)
        ref = conv1d_grad_partials_torch(x, w, b, dout)
        assert bits_equal(got[0], ref[0]) and bits_equal(got[1], ref[1])
        print("cases", cases + 1)
    """)
    assert "cases 13" in run_python(code, interpret=True)


def test_triton_kernel_compiles_for_sm90_without_atomics():
    """Ahead-of-time compile (triton's own ptxas, no GPU needed) of the kernel's extreme variants for the H200's
    sm_90: it compiles, and its PTX has no atomic instruction."""
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernel on CUDA)")
    code = textwrap.dedent("""
        import re
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from ordered_ssd.fold import CONV1D_BWD_BLOCK_D, CONV1D_BWD_NUM_WARPS, CONV1D_BWD_TILE_L, kernels
        fn = kernels.conv1d_grad_partials_kernel
        ptrs = {"x_ptr": "*bf16", "w_ptr": "*fp32", "bias_ptr": "*fp32", "dout_ptr": "*bf16", "seq_ptr": "*i32",
                "dw_ptr": "*fp32", "db_ptr": "*fp32"}
        for W, flag in ((2, False), (4, True)):
            const = dict(W=W, HAS_BIAS=flag, HAS_SEQ=flag, SILU=flag, TILE_L=CONV1D_BWD_TILE_L,
                         BLOCK_D=CONV1D_BWD_BLOCK_D)
            sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in fn.arg_names}
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": CONV1D_BWD_NUM_WARPS})
            assert k.asm["cubin"] and not re.search(r"^\\s*(@%p\\d+\\s+)?(atom|red)\\.", k.asm["ptx"], re.M), W
        print("compiled")
    """)
    assert "compiled" in run_python(code, interpret=False)
