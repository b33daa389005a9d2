"""The causal-conv1d backward launcher (csrc_bindings/causal_conv1d.py): dx from one batched call, the op's
weight/bias gradients sent to discarded scratch buffers.

causal-conv1d itself needs CUDA; here :class:`FakeConvExt`, a stand-in for its backward op (exact fp64 autograd of
the masked convolution, the layout checks of its C++ entry point), lets the CPU tests check what the launcher
passes; the GPU suite runs the real op.
"""
import pytest
import torch

import csrc_bindings.causal_conv1d as conv1d
from ordered_ssd.reference import reference_causal_conv1d
from tests.helpers import bits_equal


class FakeConvExt:
    """Stand-in for ``causal_conv1d_cuda.causal_conv1d_bwd`` (either layout, ``seq_idx`` channel-last only)."""

    def __init__(self):
        self.calls = []

    def causal_conv1d_bwd(self, x, weight, bias, dout, seq_idx, init, dfinal, dx, dweight, dbias, dinit, silu):
        channel_last = x.stride(1) == 1 and x.stride(2) > 1  # causal-conv1d's own layout test
        for name, t in (("x", x), ("dout", dout), ("dx", dx)):
            assert t.data_ptr() % 16 == 0, name  # vectorised loads need an aligned start
            if channel_last:
                assert t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.stride(2) % 8 == 0, name
            else:
                assert t.stride(2) == 1, name
        assert seq_idx is None or (channel_last and seq_idx.dtype == torch.int32 and seq_idx.is_contiguous())
        assert init is None and dfinal is None and dinit is None
        assert dweight.dtype == torch.float32 and tuple(dweight.shape) == tuple(weight.shape)
        assert dbias is None or (dbias.dtype == torch.float32 and tuple(dbias.shape) == tuple(bias.shape))
        self.calls.append({"batch": x.shape[0], "seq_idx": seq_idx is not None, "channel_last": channel_last})
        xx = x.detach().double().transpose(1, 2).requires_grad_(True)
        ww = weight.detach().double().requires_grad_(True)
        bb = bias.detach().double().requires_grad_(True) if bias is not None else None
        out = reference_causal_conv1d(xx, ww, bb, seq_idx.long() if seq_idx is not None else None,
                                      activation="silu" if silu else None)
        gx, gw, *gb = torch.autograd.grad((out * dout.double().transpose(1, 2)).sum(),
                                          [xx, ww] + ([bb] if bb is not None else []))
        dx.copy_(gx.transpose(1, 2).to(dx.dtype))
        dweight.add_(gw.float())  # the real op's atomicAdd: these buffers are the launcher's scratch
        if dbias is not None:
            dbias.add_(gb[0].float())


@pytest.fixture
def fake_ext(monkeypatch):
    ext = FakeConvExt()
    monkeypatch.setattr(conv1d, "conv_op", lambda spec: getattr(ext, spec.attr))
    return ext


def inputs(B, D, L, dtype, seed=0, extra=8):
    """x, dout channel-last views [B, D, L] of [B, L, D + extra] memory (x a slice, as xBC of zxbcdt), w, b."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, D + extra, generator=g).to(dtype)[..., :D].transpose(1, 2)
    dout = torch.randn(B, L, D, generator=g).to(dtype).transpose(1, 2)
    w = (0.5 * torch.randn(D, 4, generator=g)).to(dtype)
    b = torch.randn(D, generator=g).to(dtype)
    return x, dout, w, b


@pytest.mark.parametrize("seq", [False, True])
def test_one_batched_call_writes_dx_in_place(fake_ext, seq):
    x, dout, w, b = inputs(3, 16, 20, torch.float32)
    seq_idx = torch.zeros(3, 20, dtype=torch.int32)
    seq_idx[:, 7:] = 1
    dx = torch.full((3, 20, 16), float("nan")).transpose(1, 2)
    got = conv1d.launch_causal_conv1d_bwd_dx(x, w, b, dout, seq_idx=seq_idx if seq else None, dx=dx)
    assert got is dx and fake_ext.calls == [{"batch": 3, "seq_idx": seq, "channel_last": True}]
    want = torch.empty_like(dx)
    FakeConvExt().causal_conv1d_bwd(x, w, b, dout, seq_idx if seq else None, None, None, want,
                                    torch.zeros(16, 4), torch.zeros(16), None, True)
    assert bits_equal(dx, want)


def test_channel_first_and_no_bias(fake_ext):
    x, dout, w, _ = inputs(2, 5, 9, torch.bfloat16)
    dx = conv1d.launch_causal_conv1d_bwd_dx(x.contiguous(), w, None, dout.contiguous(), silu_activation=False)
    assert dx.shape == (2, 5, 9) and dx.is_contiguous() and torch.isfinite(dx.float()).all()
    assert fake_ext.calls == [{"batch": 2, "seq_idx": False, "channel_last": False}]


def test_empty_dims_launch_nothing(fake_ext):
    for B, D, L in ((0, 8, 8), (2, 0, 8), (2, 8, 0)):
        x, dout, w, b = inputs(B, D, L, torch.float32)
        assert conv1d.launch_causal_conv1d_bwd_dx(x, w, b, dout).shape == (B, D, L)
    assert fake_ext.calls == []


def test_errors_name_the_argument_the_expected_and_the_actual_value(fake_ext):
    x, dout, w, b = inputs(2, 8, 8, torch.float32)
    with pytest.raises(ValueError, match=r"dout: expected shape \[B, D, L\] = \(2, 8, 8\), got \(2, 8, 7\)"):
        conv1d.launch_causal_conv1d_bwd_dx(x, w, b, dout[..., :7])
    with pytest.raises(ValueError, match=r"dout: expected the dtype of x \(torch.float32\), got torch.bfloat16"):
        conv1d.launch_causal_conv1d_bwd_dx(x, w, b, dout.bfloat16())
    with pytest.raises(ValueError, match=r"bias: expected shape \[D\] = \(8,\), got \(3,\)"):
        conv1d.launch_causal_conv1d_bwd_dx(x, w, b[:3], dout)
    with pytest.raises(ValueError, match=r"weight: expected a width W in 2..4 \(causal-conv1d\), got 5"):
        conv1d.launch_causal_conv1d_bwd_dx(x, torch.zeros(8, 5), b, dout)
    with pytest.raises(ValueError, match=r"seq_idx: expected shape \[B, L\] = \(2, 8\), got \(2, 7\)"):
        conv1d.launch_causal_conv1d_bwd_dx(x, w, b, dout, seq_idx=torch.zeros(2, 7, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"seq_idx: causal-conv1d masks packed sequences in its channel-last kernel"):
        conv1d.launch_causal_conv1d_bwd_dx(x.contiguous(), w, b, dout, seq_idx=torch.zeros(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"dx: expected shape \[B, D, L\] = \(2, 8, 8\), got \(2, 8, 9\)"):
        conv1d.launch_causal_conv1d_bwd_dx(x, w, b, dout, dx=torch.empty(2, 8, 9))
    assert fake_ext.calls == []
