"""The chunked reference against the per-time-step recurrence (fp64), and fp32 against fp64."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import make_layer, rel_err
from ordered_ssd.reference import (
    reference_causal_conv1d,
    reference_chunk_scan,
    reference_gated_rmsnorm,
    reference_mamba2_layer,
    reference_sequential_scan,
)

CHUNK = 8
OPTIONS = [
    dict(),
    dict(ngroups=2),
    dict(ngroups=4),
    dict(D_has_hdim=True),
    dict(rmsnorm=False),
    dict(norm_before_gate=True),
    dict(d_ssm=16),  # d_inner = 32: a 16-wide gated-MLP branch
    dict(bias=True),
    dict(conv_bias=False),
    dict(dt_limit=(0.01, 0.05)),
    dict(ngroups=2, D_has_hdim=True, rmsnorm=False, d_ssm=16, bias=True, conv_bias=False, dt_limit=(0.0, 0.08)),
]
LENGTHS = [1, 3, CHUNK - 1, CHUNK + 1, 3 * CHUNK]


def _layer_grads_sequential(layer, u, seq_idx=None):
    """Plain autograd through the per-step recurrence: the oracle."""
    params = layer.layer_params()
    leaves = [p for p in params if p is not None]
    u = u.detach().requires_grad_(True)
    out = reference_mamba2_layer(u, params, layer.dims, seq_idx, scan="sequential")
    dout = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    grads = torch.autograd.grad(out, [u] + leaves, dout)
    return out.detach(), dout, grads


@pytest.mark.parametrize("opts,L", list(itertools.product(OPTIONS, LENGTHS)),
                         ids=[f"{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}-L{L}"
                              for o, L in itertools.product(OPTIONS, LENGTHS)])
def test_layer_matches_sequential_recurrence_fp64(opts, L):
    layer = make_layer(seed=L, **opts)
    torch.manual_seed(100 + L)
    u = torch.randn(2, L, layer.d_model, dtype=torch.float64)
    out_ref, dout, grads_ref = _layer_grads_sequential(layer, u)

    u1 = u.clone().requires_grad_(True)
    out = layer(u1)
    out.backward(dout)
    assert rel_err(out.detach(), out_ref) < 1e-10
    assert rel_err(u1.grad, grads_ref[0]) < 1e-10
    leaves = [(n, p) for n, p in zip(layer.layer_params()._fields, layer.layer_params()) if p is not None]
    assert len(leaves) == len(grads_ref) - 1 == len(list(layer.parameters()))
    for (name, p), g_ref in zip(leaves, grads_ref[1:]):
        assert p.grad is not None, name
        if not (name == "A_log" and L == 1):  # with one step the decay never acts: dA_log is exactly 0
            assert g_ref.abs().max() > 0, f"{name}: the oracle gradient is zero, the check would be vacuous"
        assert rel_err(p.grad, g_ref) < 1e-10, name


@pytest.mark.parametrize("L", [5, 17, 24])
def test_seq_idx_matches_recurrence_with_resets(L):
    layer = make_layer(seed=3, ngroups=2)
    torch.manual_seed(7)
    u = torch.randn(2, L, layer.d_model, dtype=torch.float64)
    seq_idx = torch.sort(torch.randint(0, 4, (2, L), dtype=torch.int32), dim=1).values
    out_ref, dout, grads_ref = _layer_grads_sequential(layer, u, seq_idx)
    u1 = u.clone().requires_grad_(True)
    out = layer(u1, seq_idx=seq_idx)
    out.backward(dout)
    assert rel_err(out.detach(), out_ref) < 1e-10
    assert rel_err(u1.grad, grads_ref[0]) < 1e-10
    # Packed sequences are independent: the second sequence of example 0 equals the same tokens run alone.
    ids = seq_idx[0]
    start = int((ids == ids[-1]).nonzero()[0])
    if start > 0:
        alone = layer(u[:1, start:])
        assert rel_err(out[:1, start:].detach(), alone.detach()) < 1e-12


def test_scan_with_z_gate_and_D_per_channel_matches_recurrence():
    torch.manual_seed(1)
    Bz, L, H, P, G, N = 2, 13, 4, 3, 2, 5
    f = lambda *s: torch.randn(*s, dtype=torch.float64)
    x, dt, Bm, Cm, z = f(Bz, L, H, P), f(Bz, L, H), f(Bz, L, G, N), f(Bz, L, G, N), f(Bz, L, H, P)
    A = -torch.rand(H, dtype=torch.float64) - 0.5
    D, dt_bias = f(H, P), f(H)
    for cs in (1, 4, 5, 13, 16):
        y = reference_chunk_scan(x, dt, A, Bm, Cm, cs, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
        y_seq = reference_sequential_scan(x, dt, A, Bm, Cm, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
        assert rel_err(y, y_seq) < 1e-12, cs


def test_causal_conv1d_matches_torch_conv1d():
    torch.manual_seed(2)
    x = torch.randn(3, 11, 6, dtype=torch.float64)
    w = torch.randn(6, 4, dtype=torch.float64)
    b = torch.randn(6, dtype=torch.float64)
    ours = reference_causal_conv1d(x, w, b, activation=None)
    theirs = F.conv1d(x.transpose(1, 2), w.unsqueeze(1), b, padding=3, groups=6)[..., :11].transpose(1, 2)
    assert rel_err(ours, theirs) < 1e-14
    assert torch.allclose(reference_causal_conv1d(x, w, b), F.silu(theirs), rtol=0, atol=1e-14)


def test_causal_conv1d_seq_idx_zeroes_taps_across_sequences():
    x = torch.ones(1, 6, 1, dtype=torch.float64)
    w = torch.ones(1, 3, dtype=torch.float64)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 2]], dtype=torch.int32)
    out = reference_causal_conv1d(x, w, None, seq_idx, activation=None)
    assert out.flatten().tolist() == [1.0, 2.0, 3.0, 1.0, 2.0, 1.0]


@pytest.mark.parametrize("norm_before_gate", [False, True])
def test_gated_rmsnorm_by_hand(norm_before_gate):
    torch.manual_seed(4)
    y, z = torch.randn(2, 5, 12, dtype=torch.float64), torch.randn(2, 5, 12, dtype=torch.float64)
    w = torch.randn(12, dtype=torch.float64)
    out = reference_gated_rmsnorm(y, z, w, 1e-5, 4, norm_before_gate)
    g = F.silu(z)
    v = y if norm_before_gate else y * g
    expected = torch.empty_like(v)
    for k in range(3):
        blk = v[..., 4 * k:4 * k + 4]
        expected[..., 4 * k:4 * k + 4] = blk / torch.sqrt((blk * blk).mean(-1, keepdim=True) + 1e-5)
    expected = expected * w
    if norm_before_gate:
        expected = expected * g
    assert rel_err(out, expected) < 1e-14


@pytest.mark.parametrize("opts", [dict(), dict(ngroups=2, d_ssm=32, D_has_hdim=True), dict(rmsnorm=False)])
def test_fp32_close_to_fp64(opts):
    layer64 = make_layer(seed=5, d_model=32, headdim=16, chunk_size=16, **opts)
    layer32 = make_layer(seed=5, dtype=torch.float32, d_model=32, headdim=16, chunk_size=16, **opts)
    layer32.load_state_dict({k: v.float() for k, v in layer64.state_dict().items()})
    torch.manual_seed(6)
    u64 = torch.randn(2, 40, 32, dtype=torch.float64, requires_grad=True)
    u32 = u64.detach().float().requires_grad_(True)
    out64, out32 = layer64(u64), layer32(u32)
    dout = torch.randn_like(out64)
    out64.backward(dout)
    out32.backward(dout.float())
    assert rel_err(out32.double(), out64.detach()) < 1e-5
    assert rel_err(u32.grad.double(), u64.grad) < 1e-4
    for (n, p32), p64 in zip(layer32.named_parameters(), layer64.parameters()):
        err = rel_err(p32.grad.double(), p64.grad)
        assert err < 1e-4, (n, err)
        assert err > 0 or p64.grad.abs().max() == 0 or n in ("D",), (n, "fp32 equal to fp64 bit for bit: suspicious")
