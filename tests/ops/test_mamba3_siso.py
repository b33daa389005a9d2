""":func:`ordered_ssd.ops.mamba3_siso.ordered_dt_softplus` on the CPU: the forward and ``d dd_dt`` are autograd's own
(bit for bit), ``d dt_bias`` is the per-example fold of that gradient (example 0 first, each example's positions in
order) for a gradient in the layout the layer's kernels hand back (``[B, H, L]`` transposed), and the fold reads it
contiguous."""
import torch
import torch.nn.functional as F

from ordered_ssd.fold import LexicalFold, fold_dims
from ordered_ssd.ops.mamba3_siso import ordered_dt_softplus
from tests.helpers import bits_equal


def _inputs(seed=0, B=3, L=37, H=5):
    g = torch.Generator().manual_seed(seed)
    dd_dt = (torch.randn(B, L, H, generator=g) * 4).to(torch.bfloat16)
    dt_bias = torch.randn(H, generator=g) * 3
    grad = torch.randn(B, H, L, generator=g).exp() * torch.randn(B, H, L, generator=g)  # many binades
    return dd_dt, dt_bias, grad


def test_gradients_are_autograds_and_the_ordered_fold_for_a_transposed_gradient():
    dd_dt, dt_bias, grad = _inputs()
    a, b = dd_dt.clone().requires_grad_(True), dt_bias.clone().requires_grad_(True)
    out = ordered_dt_softplus(a, b)
    out.transpose(1, 2).backward(grad)  # the gradient arrives [B, L, H] with a position's heads L apart
    ra, rb = dd_dt.clone().requires_grad_(True), dt_bias.clone().requires_grad_(True)
    ref = F.softplus(ra + rb)
    ref.transpose(1, 2).backward(grad)
    assert bits_equal(out, ref) and out.dtype == torch.float32
    assert a.grad.dtype == torch.bfloat16 and bits_equal(a.grad, ra.grad)
    gx = torch.ops.aten.softplus_backward(grad.transpose(1, 2), dd_dt + dt_bias, 1.0, 20.0)
    folder = LexicalFold(torch.float32)
    for e in range(gx.shape[0]):
        folder.add(fold_dims(gx[e], 0, dtype=torch.float32))
    want = folder.result(like=torch.empty(gx.shape[-1]))
    assert b.grad.dtype == torch.float32 and bits_equal(b.grad, want)
    # the test data tells orders apart: the positions folded in reverse give other bits
    rev = LexicalFold(torch.float32)
    for e in range(gx.shape[0]):
        rev.add(fold_dims(gx[e].flip(0), 0, dtype=torch.float32))
    assert not bits_equal(rev.result(like=torch.empty(gx.shape[-1])), want)


def test_the_fold_reads_the_gradient_contiguous(monkeypatch):
    """The kernels hand ``DT``'s gradient back ``[B, H, L]``; the backward writes it ``[B, L, H]`` contiguous before
    the fold, whose kernel loads a position's heads at once (``ordered_ssd/fold/many.py``)."""
    from ordered_ssd.ops import mamba3_siso

    seen = []

    def fold(t, dtype):
        seen.append((tuple(t.shape), t.stride()))
        return mamba3_siso_fold(t, dtype)
    mamba3_siso_fold = mamba3_siso.fold_example_sums
    monkeypatch.setattr(mamba3_siso, "fold_example_sums", fold)
    dd_dt, dt_bias, grad = _inputs(seed=1)
    a, b = dd_dt.clone().requires_grad_(True), dt_bias.clone().requires_grad_(True)
    ordered_dt_softplus(a, b).transpose(1, 2).backward(grad)
    B, L, H = dd_dt.shape
    assert seen == [((B, L, H), (L * H, H, 1))]  # the old backward passed strides (L * H, 1, L)
    assert b.grad.shape == (H,) and torch.isfinite(b.grad).all()
