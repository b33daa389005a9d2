""":func:`ordered_ssd.ops.mamba3_siso.ordered_dt_softplus` on the CPU: the forward and ``d dd_dt`` are autograd's own
(bit for bit), ``d dt_bias`` is the per-example fold of that gradient (example 0 first, each example's positions in
order), whatever the layout the gradient arrives in: the layer's kernels hand it back as ``[B, H, L]`` transposed."""
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


def test_the_layout_of_the_gradient_does_not_change_a_bit():
    dd_dt, dt_bias, grad = _inputs(seed=1)
    grads = []
    for g in (grad.transpose(1, 2), grad.transpose(1, 2).contiguous()):
        a, b = dd_dt.clone().requires_grad_(True), dt_bias.clone().requires_grad_(True)
        ordered_dt_softplus(a, b).backward(g)
        grads.append((a.grad, b.grad))
    assert bits_equal(grads[0][0], grads[1][0]) and bits_equal(grads[0][1], grads[1][1])
