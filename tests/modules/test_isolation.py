"""Per-example isolation of non-finite inputs (issue #17, item 5), on the reference path (CPU, fp32 and fp64).

A NaN or inf in one example's input must leave every other example's output and input gradient finite and bitwise
the same as in a run where that example is finite; the parameter gradients, folds over all examples, are then NaN
(for an inf as well: inf - inf and 0 * inf occur on the way). The GPU version is
``tests/gpu/modules/test_isolation.py``.
"""
import pytest
import torch

from tests.helpers import bits_equal, make_layer

B, L, BAD = 4, 24, 1  # example 1 of 4 gets the non-finite value


def _step(layer, u, dout, seq_idx):
    layer.zero_grad(set_to_none=True)
    x = u.clone().requires_grad_(True)
    out = layer(x, seq_idx=seq_idx)
    out.backward(dout)
    return out.detach(), x.grad.detach(), {n: p.grad.detach().clone() for n, p in layer.named_parameters()}


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "seq_idx"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_a_non_finite_example_leaves_the_others_bitwise_unchanged(dtype, value, packed):
    layer = make_layer(seed=0, dtype=dtype)
    g = torch.Generator().manual_seed(3)
    u = torch.randn(B, L, layer.d_model, generator=g, dtype=dtype)
    dout = torch.randn(B, L, layer.d_model, generator=g, dtype=dtype)
    seq_idx = torch.tensor([0] * 10 + [1] * 14, dtype=torch.int32).expand(B, L).contiguous() if packed else None
    out_ref, du_ref, grads_ref = _step(layer, u, dout, seq_idx)
    assert all(bool(torch.isfinite(t).all()) for t in (out_ref, du_ref, *grads_ref.values()))
    bad = u.clone()
    bad[BAD, 13, 3] = value  # the second packed sequence, mid-chunk
    out, du, grads = _step(layer, bad, dout, seq_idx)
    for b in range(B):
        if b == BAD:
            continue
        assert bool(torch.isfinite(out[b]).all()) and bool(torch.isfinite(du[b]).all())
        assert bits_equal(out[b], out_ref[b]), b
        assert bits_equal(du[b], du_ref[b]), b
    assert not bool(torch.isfinite(out[BAD]).all())
    for name, grad in grads.items():  # every parameter gradient is a fold over all examples: NaN
        assert bool(torch.isnan(grad).any()), name
