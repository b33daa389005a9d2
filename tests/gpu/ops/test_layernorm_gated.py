"""ordered_ssd.ops.layernorm_gated on the GPU: the custom op's gradients are its composition's; one launch and the
literal per-example launches give the same bits; fresh buffers full of NaN change nothing."""
import pytest
import torch

from ordered_ssd.fold import rmsnorm_rows_per_program
from ordered_ssd.ops.layernorm_gated import ordered_gated_rmsnorm, ordered_rmsnorm_gated_bwd, ordered_rmsnorm_gated_fwd
from tests.helpers import bits_equal


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("norm_before_gate", [False, True])
def test_function_composition_and_literal_agree(dtype, norm_before_gate, nan_fresh_buffers):
    g = torch.Generator(device="cuda").manual_seed(6)
    B, L, D, chunk_size, group_size = 3, 48, 64, 32, 32
    x, z, dy = (torch.randn(B, L, D, device="cuda", generator=g).to(dtype) for _ in range(3))
    weight = (1 + 0.1 * torch.randn(D, device="cuda", generator=g)).to(dtype)
    xg, zg, wg = (t.clone().requires_grad_() for t in (x, z, weight))
    out = ordered_gated_rmsnorm(xg, wg, zg, eps=1e-5, group_size=group_size, norm_before_gate=norm_before_gate,
                                chunk_size=chunk_size)
    out.backward(dy)
    rows = rmsnorm_rows_per_program(L, chunk_size)
    assert rows == 16
    x2, z2, dy2 = (t.reshape(-1, D) for t in (x, z, dy))
    out2, rstd = ordered_rmsnorm_gated_fwd(x2, weight, 1e-5, z=z2, group_size=group_size,
                                           norm_before_gate=norm_before_gate)
    assert bits_equal(out.detach().reshape(-1, D), out2)
    results = []
    for examples in (None, B):
        dx, dweight, dz, _, partial = ordered_rmsnorm_gated_bwd(
            dy2, x2, weight, 1e-5, rstd, rows_per_program=rows, z=z2, group_size=group_size,
            norm_before_gate=norm_before_gate, dz=torch.empty_like(z2), examples=examples)
        results.append((dx, dweight, dz, partial))
        assert bits_equal(xg.grad.reshape(-1, D), dx) and bits_equal(wg.grad, dweight)
        assert bits_equal(zg.grad.reshape(-1, D), dz)
    assert bits_equal(results[0][3], results[1][3])  # the same partials, one launch or one per example
    assert results[0][3].shape == (B * L // rows, D)
