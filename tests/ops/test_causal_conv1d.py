"""The conv1d backward composition (ordered_ssd.ops.causal_conv1d.ordered_causal_conv1d_bwd) on the CPU, with a
stand-in for causal-conv1d's op (:class:`tests.csrc_bindings.test_causal_conv1d.FakeConvExt`) and the partials in
their PyTorch order: one native call whatever B, the literal path's bits, the fold order, the layouts it copies.
The GPU suite runs the same checks on the real kernels."""
import pytest
import torch

import csrc_bindings.causal_conv1d as conv1d
from ordered_ssd.fold import CONV1D_BWD_TILE_L, LexicalFold
from ordered_ssd.ops.causal_conv1d import ordered_causal_conv1d_bwd
from tests.csrc_bindings.test_causal_conv1d import FakeConvExt, inputs
from tests.helpers import bits_equal


@pytest.fixture
def fake_ext(monkeypatch):
    ext = FakeConvExt()
    monkeypatch.setattr(conv1d, "conv_op", lambda spec: getattr(ext, spec.attr))
    return ext


def _seq_idx(B, L):
    s = torch.zeros(B, L, dtype=torch.int32)
    s[:, L // 3:] = 1
    s[1:, L // 2 + 1:] = 2
    return s


@pytest.mark.parametrize("B", [2, 16])
@pytest.mark.parametrize("seq", [False, True])
def test_one_native_call_for_any_batch_and_packed_sequences(fake_ext, B, seq):
    x, dout, w, b = inputs(B, 8, 30, torch.float32, seed=B)
    ordered_causal_conv1d_bwd(x, w, b, dout, seq_idx=_seq_idx(B, 30) if seq else None, silu=True)
    assert fake_ext.calls == [{"batch": B, "seq_idx": seq, "channel_last": True}]


@pytest.mark.parametrize("seq", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_literal_path_gives_the_same_bits_and_the_fold_is_example_then_tile(fake_ext, seq, dtype):
    B, L = 3, CONV1D_BWD_TILE_L + 9
    x, dout, w, b = inputs(B, 8, L, dtype, seed=1)
    seq_idx = _seq_idx(B, L) if seq else None
    fast = ordered_causal_conv1d_bwd(x, w, b, dout, seq_idx=seq_idx, silu=True)
    n_fast = len(fake_ext.calls)
    literal = ordered_causal_conv1d_bwd(x, w, b, dout, seq_idx=seq_idx, silu=True, literal=True)
    assert n_fast == 1 and [c["batch"] for c in fake_ext.calls[1:]] == [1] * B
    for got, want in zip(literal, fast, strict=True):
        assert bits_equal(got, want)
    _, dweight, dbias, dw_p, db_p = fast
    assert dw_p.shape == (B, 2, 8, 4) and db_p.shape == (B, 2, 8)
    assert dweight.dtype == w.dtype and dbias.dtype == b.dtype
    fold_w, fold_b = LexicalFold(dtype), LexicalFold(dtype)
    for bi in range(B):
        for t in range(2):
            fold_w.add(dw_p[bi, t])
            fold_b.add(db_p[bi, t])
    assert bits_equal(dweight, fold_w.result()) and bits_equal(dbias, fold_b.result())
    # the stand-in's own (fp64, cast) weight gradient: the ordered fold is within fp32 rounding of it
    ref_w, ref_b = torch.zeros(8, 4), torch.zeros(8)
    FakeConvExt().causal_conv1d_bwd(x, w, b, dout, seq_idx, None, None, torch.empty_like(x), ref_w, ref_b, None, True)
    assert torch.allclose(fold_w._acc, ref_w, rtol=1e-5, atol=1e-5 * ref_w.abs().max().item())
    assert torch.allclose(fold_b._acc, ref_b, rtol=1e-5, atol=1e-5 * ref_b.abs().max().item())


def test_layouts_causal_conv1d_rejects_are_copied_and_dx_is_written_in_place(fake_ext):
    """x a slice of [B, L, 13] memory (strides not multiples of 8) and dx a view of such memory: the native call
    gets aligned copies, and dx is still written where the caller asked."""
    g = torch.Generator().manual_seed(3)
    zx = torch.randn(2, 20, 13, generator=g)
    x = zx[..., 2:10].transpose(1, 2)  # [2, 8, 20], strides (260, 1, 13)
    dout = torch.randn(2, 8, 20, generator=g)  # channel-first: copied channel-last
    w, b = torch.randn(8, 4, generator=g), torch.randn(8, generator=g)
    dz = torch.full((2, 20, 13), float("nan"))
    dx_view = dz[..., 2:10].transpose(1, 2)
    dx, *grads = ordered_causal_conv1d_bwd(x, w, b, dout, silu=True, dx=dx_view)
    assert dx is dx_view and fake_ext.calls == [{"batch": 2, "seq_idx": False, "channel_last": True}]
    assert torch.isnan(dz[..., :2]).all() and torch.isnan(dz[..., 10:]).all() and not torch.isnan(dx).any()
    again = ordered_causal_conv1d_bwd(x.contiguous().transpose(1, 2).contiguous().transpose(1, 2), w, b,
                                      dout.transpose(1, 2).contiguous().transpose(1, 2), silu=True)
    assert bits_equal(dx.contiguous(), again[0].contiguous())
    assert all(bits_equal(a, c) for a, c in zip(grads, again[1:]))


def test_seq_idx_must_be_int32(fake_ext):
    x, dout, w, b = inputs(2, 8, 10, torch.float32)
    with pytest.raises(ValueError, match=r"seq_idx: expected dtype torch.int32, got torch.int64"):
        ordered_causal_conv1d_bwd(x, w, b, dout, seq_idx=torch.zeros(2, 10, dtype=torch.int64))
    assert fake_ext.calls == []
