"""ordered_ssd.ops.ssd_combined on the GPU: the per-example partials of the split-conv1d-scan composition do not
depend on the rest of the batch; the functional API without out_proj and with a gated MLP."""
import torch

from tests.gpu.modules.test_mamba2_cuda import _make
from tests.helpers import bits_equal


def test_per_example_partials_do_not_depend_on_the_batch():
    from einops import rearrange

    from ordered_ssd.ops import split_conv1d_scan_partials

    layer = _make(256, 32, 64, 2, 64, torch.bfloat16, dict(d_ssm=384))
    B, L = 4, 150
    torch.manual_seed(5)
    zxbcdt = torch.randn(B, L, layer.in_proj.out_features, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(B, L, layer.d_model, device="cuda", dtype=torch.bfloat16)
    kw = dict(dt_limit=(0.0, float("inf")), activation="silu", rmsnorm_weight=layer.norm.weight, rmsnorm_eps=1e-5,
              outproj_weight=layer.out_proj.weight, outproj_bias=None, headdim=layer.headdim, ngroups=layer.ngroups,
              norm_before_gate=False)
    args = (rearrange(layer.conv1d.weight, "d 1 w -> d w"), layer.conv1d.bias, layer.dt_bias,
            -torch.exp(layer.A_log.float()), layer.D, layer.chunk_size)
    with torch.no_grad():
        _, batch_parts = split_conv1d_scan_partials(zxbcdt, *args, dout, **kw)
        for b in range(B):
            _, alone = split_conv1d_scan_partials(zxbcdt[b:b + 1], *args, dout[b:b + 1], **kw)
            for key in ("dA_partial", "ddt_bias_partial", "dD_partial", "drmsnorm_weight", "dconv1d_weight",
                        "dconv1d_bias"):
                assert bits_equal(batch_parts[key][b:b + 1], alone[key]), (b, key)


def test_functional_split_scan_without_out_proj_and_with_gated_mlp():
    """d_ssm < d_inner and no out_proj: the swiglu backward must not recompute its output (upstream raises)."""
    from einops import rearrange

    from ordered_ssd.ops import ordered_mamba_split_conv1d_scan_combined

    layer = _make(256, 32, 64, 2, 64, torch.bfloat16, dict(d_ssm=384))
    torch.manual_seed(3)
    zxbcdt = torch.randn(2, 90, layer.in_proj.out_features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kw = dict(activation="silu", rmsnorm_weight=layer.norm.weight, rmsnorm_eps=1e-5, headdim=layer.headdim,
              ngroups=layer.ngroups, norm_before_gate=False)
    grads = []
    for _ in range(3):
        zxbcdt.grad = None
        layer.zero_grad(set_to_none=True)
        # A = -exp(A_log) is rebuilt every step, as Mamba2.forward does (its graph is freed by each backward)
        args = (rearrange(layer.conv1d.weight, "d 1 w -> d w"), layer.conv1d.bias, layer.dt_bias,
                -torch.exp(layer.A_log.float()), layer.D, layer.chunk_size)
        out = ordered_mamba_split_conv1d_scan_combined(zxbcdt, *args, **kw)
        assert out.shape == (2, 90, layer.d_inner)
        out.float().square().sum().backward()
        grads.append([zxbcdt.grad.clone(), layer.A_log.grad.clone(), layer.conv1d.weight.grad.clone()])
    for g in grads[1:]:
        assert all(bits_equal(a, b) for a, b in zip(g, grads[0]))
    assert all(torch.isfinite(t.float()).all() for t in grads[0])
    assert grads[0][1].abs().sum() > 0  # A_log receives a gradient through the ordered backward
