"""ordered_ssd.ops.causal_conv1d on the GPU: the custom op's gradients are its composition's, the weight and bias
gradients are the folds of the per-example partials in example order, an example's partial does not depend on the
rest of the batch, and fresh buffers full of NaN change nothing."""
import pytest
import torch

from ordered_ssd.fold import LexicalFold
from ordered_ssd.ops.causal_conv1d import ordered_causal_conv1d, ordered_causal_conv1d_bwd
from tests.helpers import bits_equal


def _problem(dtype):
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(3, 70, 40, device="cuda", generator=g).to(dtype).transpose(1, 2)  # [B, D, L], channel-last
    weight = torch.randn(40, 4, device="cuda", generator=g).to(dtype)
    bias = torch.randn(40, device="cuda", generator=g).to(dtype)
    dout = torch.randn(3, 70, 40, device="cuda", generator=g).to(dtype).transpose(1, 2)
    return x, weight, bias, dout


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_function_equals_composition_and_the_example_fold(dtype, nan_fresh_buffers):
    x, weight, bias, dout = _problem(dtype)
    xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, weight, bias))
    ordered_causal_conv1d(xg, wg, bg, activation="silu").backward(dout)
    dx, dweight, dbias, dweight_partial, dbias_partial = ordered_causal_conv1d_bwd(
        x, weight, bias, dout.contiguous(), silu=True)
    assert bits_equal(xg.grad, dx) and bits_equal(wg.grad, dweight) and bits_equal(bg.grad, dbias)
    fold_w, fold_b = LexicalFold(dtype), LexicalFold(dtype)
    for b in range(x.shape[0]):
        fold_w.add(dweight_partial[b])
        fold_b.add(dbias_partial[b])
        _, _, _, alone_w, alone_b = ordered_causal_conv1d_bwd(x[b:b + 1], weight, bias, dout[b:b + 1].contiguous(),
                                                              silu=True)
        assert bits_equal(alone_w[0], dweight_partial[b]) and bits_equal(alone_b[0], dbias_partial[b]), b
    assert bits_equal(dweight, fold_w.result()) and bits_equal(dbias, fold_b.result())
    assert torch.isfinite(dx.float()).all()
