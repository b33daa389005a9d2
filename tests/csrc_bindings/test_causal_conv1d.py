"""The per-example causal-conv1d backward (csrc_bindings/causal_conv1d.py) and its grouped channel-first copies.

causal-conv1d itself needs CUDA; here a stand-in for its channel-first backward (batch 1, exact fp64 autograd) that
also checks the layout the real kernel needs (stride 1 along L, 16-byte aligned start) lets the CPU tests check the
grouping, the packed-sequence segments and the copies back, bit for bit (the GPU suite runs the real op).
"""
import pytest
import torch
import torch.nn.functional as F

import csrc_bindings.causal_conv1d as conv1d
from csrc_bindings import _layout
from tests.helpers import bits_equal


class _FakeConvExt:
    """Stand-in for ``causal_conv1d_cuda.causal_conv1d_bwd`` (channel-first, batch 1)."""

    def __init__(self):
        self.calls = []

    def causal_conv1d_bwd(self, x, weight, bias, dout, seq_idx, init, dfinal, dx, dweight, dbias, dinit, silu):
        for name, t in (("x", x), ("dout", dout), ("dx", dx)):
            assert t.shape[0] == 1, name
            # the layout test of causal-conv1d's C++ op: channel-last iff stride(1) == 1 and stride(2) > 1
            assert not (t.stride(1) == 1 and t.stride(2) > 1), name
            assert t.stride(2) == 1 and (t.stride(1) == t.shape[2] or t.shape[1] == 1), name  # channel-first
            assert t.data_ptr() % 16 == 0, name  # vectorised loads need an aligned start
        assert seq_idx is None and init is None and dfinal is None and dinit is None
        self.calls.append(tuple(x.shape))
        D, W = weight.shape
        L = x.shape[-1]
        xx = x.detach().double().requires_grad_(True)
        ww = weight.detach().double().requires_grad_(True)
        bb = bias.detach().double().requires_grad_(True) if bias is not None else None
        pre = F.conv1d(F.pad(xx, (W - 1, 0)), ww[:, None, :], bb, groups=D)[..., :L]
        y = F.silu(pre) if silu else pre
        gx, gw, *gb = torch.autograd.grad(y, [xx, ww] + ([bb] if bb is not None else []), dout.double())
        dx.copy_(gx.to(dx.dtype))
        dweight.add_(gw.float())
        if dbias is not None:
            dbias.add_(gb[0].float())


@pytest.fixture
def fake_ext(monkeypatch):
    ext = _FakeConvExt()
    monkeypatch.setattr(conv1d, "conv_op", lambda spec: getattr(ext, spec.attr))
    return ext


def _inputs(B, D, L, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # channel-last memory [B, L, D'] with D' > D (x is a slice, as xBC is a slice of zxbcdt), viewed [B, D, L]
    x = torch.randn(B, L, D + 3, generator=g).to(dtype)[..., 1:D + 1].transpose(1, 2)
    dout = torch.randn(B, L, D, generator=g).to(dtype).transpose(1, 2)
    w = torch.randn(D, 4, generator=g).to(dtype)
    b = torch.randn(D, generator=g).to(dtype)
    return x, dout, w, b


def _direct(ext, x, dout, w, b, segments, silu=True):
    """The pre-grouping algorithm: one fresh contiguous copy per segment."""
    dx = torch.zeros(x.shape, dtype=x.dtype)
    dw = torch.zeros(len(segments), *w.shape)
    db = torch.zeros(len(segments), w.shape[0])
    for s, (bi, start, end) in enumerate(segments):
        xs = x[bi:bi + 1, :, start:end].clone(memory_format=torch.contiguous_format)
        dos = dout[bi:bi + 1, :, start:end].clone(memory_format=torch.contiguous_format)
        dxs = torch.empty(xs.shape, dtype=xs.dtype)
        ext.causal_conv1d_bwd(xs, w, b, dos, None, None, None, dxs, dw[s], db[s] if b is not None else None, None,
                              silu)
        dx[bi:bi + 1, :, start:end] = dxs
    return dx, dw, db


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D,L", [(10, 37), (8, 64), (3, 1)])
def test_grouped_copies_give_the_per_example_bits(fake_ext, dtype, D, L):
    B = 5
    x, dout, w, b = _inputs(B, D, L, dtype)
    segs = [(i, 0, L) for i in range(B)]
    ref = _direct(fake_ext, x, dout, w, b, segs)
    per_example = 3 * _layout.aligned_example_stride(D, L, x.element_size()) * x.element_size()
    for group_bytes in (1, per_example * 2, per_example * 3 + 1, 1 << 30):  # groups of 1, 2, 3 and all 5
        fake_ext.calls.clear()
        dx_out = torch.full((B, L, D), float("nan"), dtype=dtype).transpose(1, 2)  # channel-last gradient view
        dx, dw, db, got_segs = conv1d.launch_causal_conv1d_bwd_per_example(x, w, b, dout, dx=dx_out,
                                                                           group_bytes=group_bytes)
        assert got_segs == segs
        assert dx is dx_out
        assert len(fake_ext.calls) == B
        assert bits_equal(dx, ref[0]) and bits_equal(dw, ref[1]) and bits_equal(db, ref[2]), group_bytes
    # dx allocated by the launcher (layout of x), no bias
    dx, dw, db, _ = conv1d.launch_causal_conv1d_bwd_per_example(x, w, None, dout, group_bytes=per_example * 2)
    ref_nb = _direct(fake_ext, x, dout, w, None, segs)
    assert db is None and bits_equal(dx, ref_nb[0]) and bits_equal(dw, ref_nb[1])


@pytest.mark.parametrize("D,dtype", [(6, torch.float32), (1, torch.bfloat16)])
def test_packed_sequences(fake_ext, D, dtype):
    """Every packed sequence gets its own aligned buffers (also D == 1 with a sequence of 8 at an odd offset,
    where a view of the example would start misaligned)."""
    B, L = 4, 21
    x, dout, w, b = _inputs(B, D, L, dtype, seed=3)
    seq_idx = torch.tensor([[0] * 5 + [1] * 16, [2] * 21, [3] * 1 + [4] * 8 + [5] * 12, [6] * 10 + [7] * 11],
                           dtype=torch.int32)
    segs = conv1d.sequence_segments(seq_idx)
    assert segs == [(0, 0, 5), (0, 5, 21), (1, 0, 21), (2, 0, 1), (2, 1, 9), (2, 9, 21), (3, 0, 10), (3, 10, 21)]
    ref = _direct(fake_ext, x, dout, w, b, segs)
    fake_ext.calls.clear()
    dx, dw, db, got = conv1d.launch_causal_conv1d_bwd_per_example(x, w, b, dout, seq_idx=seq_idx)
    assert got == segs and len(fake_ext.calls) == len(segs)
    assert bits_equal(dx, ref[0]) and bits_equal(dw, ref[1]) and bits_equal(db, ref[2])


def test_aligned_channel_first_input_is_used_without_a_copy(fake_ext, monkeypatch):
    B, D, L = 3, 8, 16  # D * L * 4 bytes is a multiple of 16
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, D, L, generator=g)
    dout = torch.randn(B, D, L, generator=g)
    w, b = torch.randn(D, 4, generator=g), torch.randn(D, generator=g)
    assert _layout.is_aligned_channel_first(x) and _layout.is_aligned_channel_first(dout)
    copies = []
    monkeypatch.setattr(conv1d, "copy3d", lambda src, dst, **k: copies.append(1) or dst.copy_(src))
    seen = []
    real = fake_ext.causal_conv1d_bwd
    fake_ext.causal_conv1d_bwd = lambda xs, *a: seen.append(xs.data_ptr()) or real(xs, *a)
    dx, dw, db, _ = conv1d.launch_causal_conv1d_bwd_per_example(x, w, b, dout, group_bytes=1)
    assert copies == []  # dx was allocated channel-first too, so nothing was copied back either
    assert seen == [x[i].data_ptr() for i in range(B)]
    ref = _direct(_FakeConvExt(), x, dout, w, b, [(i, 0, L) for i in range(B)])
    assert bits_equal(dx, ref[0]) and bits_equal(dw, ref[1]) and bits_equal(db, ref[2])


def test_empty_dims_return_zero_partials(fake_ext):
    for B, D, L in ((0, 4, 8), (2, 0, 8), (2, 4, 0)):
        x, dout, w, b = _inputs(B, D, L, torch.float32)
        dx, dw, db, segs = conv1d.launch_causal_conv1d_bwd_per_example(x, w, b, dout)
        assert dx.shape == (B, D, L) and dw.shape == (len(segs), D, 4) and not dw.any() and not db.any()
    assert fake_ext.calls == []


def test_errors_name_the_argument_the_expected_and_the_actual_value(fake_ext):
    x, dout, w, b = _inputs(2, 4, 8, torch.float32)
    with pytest.raises(ValueError, match=r"group_bytes: expected a positive int, got 0"):
        conv1d.launch_causal_conv1d_bwd_per_example(x, w, b, dout, group_bytes=0)
    with pytest.raises(ValueError, match=r"dout: expected shape \[B, D, L\] = \(2, 4, 8\), got \(2, 4, 7\)"):
        conv1d.launch_causal_conv1d_bwd_per_example(x, w, b, dout[..., :7])
    with pytest.raises(ValueError, match=r"bias: expected shape \[D\] = \(4,\), got \(3,\)"):
        conv1d.launch_causal_conv1d_bwd_per_example(x, w, b[:3], dout)
    with pytest.raises(ValueError, match=r"weight: expected a width W in 2..4 \(causal-conv1d\), got 5"):
        conv1d.launch_causal_conv1d_bwd_per_example(x, torch.zeros(4, 5), b, dout)
    with pytest.raises(ValueError, match=r"seq_idx: expected non-decreasing rows .* row 1 falling from 2 to 1 at "
                                         r"position 3"):
        conv1d.sequence_segments(torch.tensor([[0, 0, 1, 1], [0, 2, 2, 1]]))
    assert fake_ext.calls == []
