"""The CUDA path's new plumbing on the CPU, with the natives faked (``tests.csrc_bindings.launch_record``): the
state arguments reach the right launchers with the right shapes, and OrderedMamba2's prefill and step run through
the composition (no numbers are checked here: the fake kernels compute nothing; the GPU tests check values)."""
from types import SimpleNamespace

import pytest
import torch

from csrc_bindings import _native
from tests.csrc_bindings.launch_record import fake_native

Bsz, L, H, P, G, N, CS = 2, 100, 4, 16, 2, 16, 32


@pytest.fixture
def launches(monkeypatch):
    from ordered_ssd import OrderedMamba2
    from ordered_ssd.ops import causal_conv1d, decode, layernorm_gated, ssd_combined, ssd_split_conv1d

    log = []
    tri, conv = fake_native(log)
    monkeypatch.setitem(_native._state, "triton", tri)
    monkeypatch.setitem(_native._state, "conv", conv)
    for mod in (ssd_combined, ssd_split_conv1d, decode, causal_conv1d, layernorm_gated):
        if hasattr(mod, "require_cuda"):
            monkeypatch.setattr(mod, "require_cuda", lambda name, t: None)
    monkeypatch.setattr(OrderedMamba2, "backend_for", lambda self, u: "cuda")
    return log


def _args(name, log):
    from csrc_bindings._registry import KERNELS
    entries = [e for e in log if e["kernel"] == name]
    return [dict(zip(KERNELS[name].arg_names, e["args"])) for e in entries]


def test_chunk_scan_passes_initial_and_final_states_to_the_state_passing_kernels(launches):
    from ordered_ssd.ops.ssd_combined import ordered_mamba_chunk_scan_combined

    x = torch.randn(Bsz, L, H, P, requires_grad=True)
    init = torch.randn(Bsz, H, P, N, requires_grad=True)
    args = (torch.randn(Bsz, L, H), -torch.rand(H), torch.randn(Bsz, L, G, N), torch.randn(Bsz, L, G, N), CS)
    out, final = ordered_mamba_chunk_scan_combined(x, *args, D=torch.randn(H), dt_bias=torch.randn(H),
                                                   initial_states=init, dt_softplus=True, return_final_states=True)
    assert out.shape == (Bsz, L, H, P) and final.shape == (Bsz, H, P, N)
    fwd = _args("state_passing_fwd", launches)
    assert fwd[0]["HAS_INITSTATES"] and fwd[0]["initstates_ptr"].shape == (Bsz, H, P * N)
    (out.sum() + final.sum()).backward()
    assert init.grad.shape == (Bsz, H, P, N) and init.grad.dtype == init.dtype
    bwd = _args("state_passing_bwd", launches)
    assert len(bwd) == 1 and bwd[0]["HAS_DINITSTATES"] and bwd[0]["HAS_DFINAL_STATES"]
    assert _args("state_passing_fwd", launches)[-1]["HAS_INITSTATES"]  # the backward's recomputation sees it too


def test_without_the_new_arguments_the_launches_are_as_before(launches):
    from ordered_ssd.ops.ssd_combined import ordered_mamba_chunk_scan_combined

    x = torch.randn(Bsz, L, H, P, requires_grad=True)
    args = (torch.randn(Bsz, L, H), -torch.rand(H), torch.randn(Bsz, L, G, N), torch.randn(Bsz, L, G, N), CS)
    out = ordered_mamba_chunk_scan_combined(x, *args, D=torch.randn(H), dt_bias=torch.randn(H), dt_softplus=True)
    out.sum().backward()
    assert not any(a["HAS_INITSTATES"] for a in _args("state_passing_fwd", launches))
    bwd = _args("state_passing_bwd", launches)
    assert not bwd[0]["HAS_DINITSTATES"] and not bwd[0]["HAS_DFINAL_STATES"] and bwd[0]["dinitstates_ptr"] is None
    assert not _args("chunk_state_varlen", launches)


@pytest.mark.parametrize("extra", [{}, dict(rmsnorm=False, ngroups=2), dict(d_ssm=32, D_has_hdim=True,
                                                                            dt_limit=(0.01, 0.1))],
                         ids=["default", "g2-nonorm", "mlp-Dhdim-dt_limit"])
def test_module_prefill_varlen_prefill_and_step_run_through_the_cuda_composition(launches, extra):
    from ordered_ssd import OrderedMamba2

    layer = OrderedMamba2(64, d_state=16, headdim=16, chunk_size=32, layer_idx=0, **extra)
    conv_dim, nheads = layer.conv1d.weight.shape[0], layer.nheads
    params = SimpleNamespace(key_value_memory_dict={}, seqlen_offset=0)
    with torch.no_grad():
        assert layer(torch.randn(2, 50, 64), inference_params=params).shape == (2, 50, 64)
        assert _args("state_passing_fwd", launches)  # the prefill ran the chunk scan (non-fused path)
        launches.clear()
        params.seqlen_offset = 50
        assert layer(torch.randn(2, 1, 64), inference_params=params).shape == (2, 1, 64)
        kernels = {e["kernel"] for e in launches}
        assert {"causal_conv1d_update", "selective_state_update"} <= kernels
        assert not kernels & {"chunk_scan_fwd", "state_passing_fwd", "causal_conv1d_fwd"}
        ssu = _args("selective_state_update", launches)[0]
        assert ssu["TIE_HDIM"] and ssu["DT_SOFTPLUS"] == ("dt_limit" not in extra)
        cu = torch.tensor([0, 10, 50], dtype=torch.int32)
        seq_idx = torch.zeros(1, 50, dtype=torch.int32)
        seq_idx[0, 10:] = 1
        params = SimpleNamespace(key_value_memory_dict={}, seqlen_offset=0)
        launches.clear()
        layer(torch.randn(1, 50, 64), seq_idx=seq_idx, cu_seqlens=cu, inference_params=params)
        assert len(_args("chunk_state_varlen", launches)) == 1
        conv_state, ssm_state = params.key_value_memory_dict[0]
        assert conv_state.shape == (2, conv_dim, 4) and ssm_state.shape == (2, nheads, 16, 16)


def _chunk_scan_inputs():
    x = torch.randn(Bsz, L, H, P, requires_grad=True)
    return x, (torch.randn(Bsz, L, H), -torch.rand(H), torch.randn(Bsz, L, G, N), torch.randn(Bsz, L, G, N), CS)


def test_final_states_alone_in_the_loss_reaches_the_backward_as_before(launches):
    """Through the custom op, a loss of the final states only gives the backward a zero dout and the dfinal_states
    (as autograd materialised them for the former Function); without return_final_states no dfinal_states."""
    from ordered_ssd.ops.ssd_combined import ordered_mamba_chunk_scan_combined

    x, args = _chunk_scan_inputs()
    init = torch.randn(Bsz, H, P, N, dtype=torch.float64, requires_grad=True)
    _, final = ordered_mamba_chunk_scan_combined(x, *args, D=torch.randn(H), initial_states=init,
                                                 return_final_states=True)
    assert final.dtype == torch.float32 and final.requires_grad
    final.sum().backward()
    bwd = _args("state_passing_bwd", launches)
    assert len(bwd) == 1 and bwd[0]["HAS_DFINAL_STATES"] and bwd[0]["HAS_DINITSTATES"]
    assert x.grad.shape == x.shape and init.grad.dtype == torch.float64 and init.grad.shape == init.shape


def test_varlen_states_come_back_and_a_backward_through_them_raises(launches):
    from ordered_ssd.ops.ssd_combined import ordered_mamba_chunk_scan_combined

    x = torch.randn(1, L, H, P, requires_grad=True)
    args = (torch.randn(1, L, H), -torch.rand(H), torch.randn(1, L, G, N), torch.randn(1, L, G, N), CS)
    cu = torch.tensor([0, 40, L], dtype=torch.int32)
    seq_idx = torch.zeros(1, L, dtype=torch.int32)
    seq_idx[0, 40:] = 1
    out, final, varlen = ordered_mamba_chunk_scan_combined(x, *args, seq_idx=seq_idx, cu_seqlens=cu,
                                                           return_final_states=True, return_varlen_states=True)
    assert out.shape == (1, L, H, P) and final.shape == (1, H, P, N) and varlen.shape == (2, H, P, N)
    assert not varlen.requires_grad and len(_args("chunk_state_varlen", launches)) == 1
    with pytest.raises(NotImplementedError, match=r"no backward with return_varlen_states=True"):
        out.sum().backward()
    out = ordered_mamba_chunk_scan_combined(x, *args, seq_idx=seq_idx, cu_seqlens=cu)  # cu_seqlens alone: no states
    assert isinstance(out, torch.Tensor) and len(_args("chunk_state_varlen", launches)) == 1


def test_split_conv1d_scan_passes_initial_and_final_states(launches):
    from ordered_ssd.ops import ordered_mamba_split_conv1d_scan_combined

    dim = H * P
    zxbcdt = torch.randn(Bsz, L, 2 * dim + 2 * G * N + H, requires_grad=True)
    weights = dict(conv1d_weight=torch.randn(dim + 2 * G * N, 4, requires_grad=True),
                   conv1d_bias=torch.randn(dim + 2 * G * N), dt_bias=torch.randn(H), A=-torch.rand(H),
                   D=torch.randn(H, P), rmsnorm_weight=torch.randn(dim), outproj_weight=torch.randn(32, dim))
    init = torch.randn(Bsz, H, P, N, requires_grad=True)
    out, final = ordered_mamba_split_conv1d_scan_combined(zxbcdt, chunk_size=CS, initial_states=init,
                                                          return_final_states=True, ngroups=G, **weights)
    assert out.shape == (Bsz, L, 32) and final.shape == (Bsz, H, P, N) and final.dtype == torch.float32
    assert _args("state_passing_fwd", launches)[0]["HAS_INITSTATES"]
    (out.sum() + final.sum()).backward()
    bwd = _args("state_passing_bwd", launches)
    assert len(bwd) == 1 and bwd[0]["HAS_DINITSTATES"] and bwd[0]["HAS_DFINAL_STATES"]
    assert init.grad.shape == init.shape and zxbcdt.grad.shape == zxbcdt.shape
    assert weights["conv1d_weight"].grad.shape == weights["conv1d_weight"].shape
