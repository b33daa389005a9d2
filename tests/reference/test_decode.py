"""Decoding with the reference: prefill (``return_states``) then one step per token == the forward over all tokens."""
import pytest
import torch

from ordered_ssd.reference import (reference_causal_conv1d, reference_causal_conv1d_update, reference_conv_state,
                                   reference_mamba2_layer, reference_mamba2_step)
from tests.helpers import make_layer, rel_err

OPTIONS = [
    dict(),
    dict(ngroups=2),
    dict(D_has_hdim=True),
    dict(rmsnorm=False),
    dict(norm_before_gate=True),
    dict(d_ssm=16),
    dict(bias=True, conv_bias=False),
    dict(dt_limit=(0.01, 0.05)),
]
IDS = ["-".join(f"{k}={v}" for k, v in o.items()) or "default" for o in OPTIONS]


@pytest.mark.parametrize("opts", OPTIONS, ids=IDS)
@pytest.mark.parametrize("prompt", [1, 3, 9])
def test_prefill_then_steps_equal_the_forward(opts, prompt):
    layer = make_layer(seed=prompt, **opts)
    params, dims = layer.layer_params(), layer.dims
    steps = 6
    u = torch.randn(2, prompt + steps, layer.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        full = reference_mamba2_layer(u, params, dims)
        out, conv_state, ssm_state = reference_mamba2_layer(u[:, :prompt], params, dims, return_states=True)
        assert torch.equal(out, full[:, :prompt]) or rel_err(out, full[:, :prompt]) < 1e-12
        assert conv_state.shape == (2, dims.conv_dim, dims.d_conv)
        assert ssm_state.shape == (2, dims.nheads, dims.headdim, dims.d_state)
        for t in range(prompt, prompt + steps):
            y = reference_mamba2_step(u[:, t:t + 1], params, dims, conv_state, ssm_state)
            assert y.shape == (2, 1, layer.d_model)
            assert rel_err(y, full[:, t:t + 1]) < 1e-11, t


def test_varlen_prefill_states_equal_each_sequence_alone():
    layer = make_layer(seed=4, ngroups=2)
    params, dims = layer.layer_params(), layer.dims
    lengths = [5, 2, 11]
    u = torch.randn(1, sum(lengths), layer.d_model, dtype=torch.float64)
    cu = torch.tensor([0, 5, 7, 18], dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(3, dtype=torch.int32), torch.tensor(lengths))[None]
    with torch.no_grad():
        out, conv_state, ssm_state = reference_mamba2_layer(u, params, dims, seq_idx, return_states=True,
                                                            cu_seqlens=cu)
        assert conv_state.shape == (3, dims.conv_dim, dims.d_conv)
        for i in range(3):
            lo, hi = cu[i].item(), cu[i + 1].item()
            out_i, conv_i, ssm_i = reference_mamba2_layer(u[:, lo:hi], params, dims, return_states=True)
            assert rel_err(out[:, lo:hi], out_i) < 1e-12
            assert rel_err(conv_state[i], conv_i[0]) < 1e-14  # in_proj of 18 vs 5 rows: bits may differ
            assert rel_err(ssm_state[i], ssm_i[0]) < 1e-12


def test_conv_state_pads_short_prompts_with_zeros():
    x = torch.arange(1.0, 7.0).view(1, 2, 3)  # [B=1, L=2, C=3]
    st = reference_conv_state(x, 4)
    assert st.shape == (1, 3, 4)
    assert torch.equal(st[0], torch.tensor([[0.0, 0, 1, 4], [0, 0, 2, 5], [0, 0, 3, 6]]))


def test_conv_update_equals_the_causal_conv():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 5, dtype=torch.float64, generator=g)
    w = torch.randn(5, 4, dtype=torch.float64, generator=g)
    b = torch.randn(5, dtype=torch.float64, generator=g)
    full = reference_causal_conv1d(x, w, b)
    state = reference_conv_state(x[:, :3], 4)
    for t in range(3, 7):
        y = reference_causal_conv1d_update(x[:, t], state, w, b)
        assert rel_err(y, full[:, t]) < 1e-14
