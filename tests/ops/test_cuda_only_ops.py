"""The CUDA-only ops refuse CPU tensors and bad arguments with a clear error before any kernel runs (no GPU and no
native extras needed: the checks come first)."""
import pytest
import torch

from ordered_ssd.ops import (ordered_causal_conv1d, ordered_gated_rmsnorm, ordered_mamba_chunk_scan_combined,
                             ordered_mamba_split_conv1d_scan_combined)

B_, L_, H_, P_, G_, N_ = 2, 8, 2, 4, 1, 4


def _ssd_args(device="cpu", batch=B_):
    return (torch.randn(batch, L_, H_, P_, device=device), torch.rand(batch, L_, H_, device=device),
            -torch.rand(H_, device=device), torch.randn(batch, L_, G_, N_, device=device),
            torch.randn(batch, L_, G_, N_, device=device), 4)


def test_causal_conv1d_refuses_cpu_and_non_tensors():
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor .*got device cpu"):
        ordered_causal_conv1d(torch.randn(2, 8, 16), torch.randn(8, 4))
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list"):
        ordered_causal_conv1d([1.0], torch.randn(8, 4))


def test_gated_rmsnorm_refuses_cpu():
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        ordered_gated_rmsnorm(torch.randn(2, 8, 16), torch.ones(16))


def test_chunk_scan_checks_the_state_arguments_then_refuses_cpu():
    args = _ssd_args()
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        ordered_mamba_chunk_scan_combined(*args, initial_states=torch.zeros(B_, H_, P_, N_), return_final_states=True)
    bad = [
        (dict(initial_states=torch.zeros(B_, H_, P_, N_ + 1)), ValueError,
         r"^initial_states: expected shape \[B, H, P, N\] = \(2, 2, 4, 4\), got \(2, 2, 4, 5\)"),
        (dict(initial_states=torch.zeros(B_, H_, P_, N_, dtype=torch.int32)), TypeError,
         r"^initial_states: expected a floating dtype, got torch.int32"),
        (dict(initial_states=torch.zeros(B_, H_, P_, N_, device="meta")), ValueError,
         r"^initial_states: expected device cpu, got meta"),
        (dict(return_varlen_states=True), ValueError, r"^cu_seqlens: required with return_varlen_states=True"),
        (dict(cu_seqlens=torch.tensor([0, 8], dtype=torch.int32)), ValueError,
         r"^cu_seqlens: expected batch size 1 .*got B=2"),
    ]
    for kw, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            ordered_mamba_chunk_scan_combined(*args, **kw)


@pytest.mark.parametrize("cu,exc,msg", [
    ([1, 8], ValueError, r"^cu_seqlens: expected cu_seqlens\[0\] == 0, got 1"),
    ([0, 5, 5, 8], ValueError, r"^cu_seqlens: expected strictly increasing offsets \(no empty sequence\)"),
    ([0, 6, 4, 8], ValueError, r"^cu_seqlens: expected strictly increasing offsets"),
    ([0, 7], ValueError, r"^cu_seqlens: expected cu_seqlens\[-1\] == B \* L = 8, got 7"),
    ([0.0, 8.0], TypeError, r"^cu_seqlens: expected an integer dtype"),
    ([[0, 8]], ValueError, r"^cu_seqlens: expected a 1-d tensor of S \+ 1 >= 2 offsets, got shape \(1, 2\)"),
    ([0], ValueError, r"^cu_seqlens: expected a 1-d tensor of S \+ 1 >= 2 offsets, got shape \(1,\)"),
])
def test_chunk_scan_refuses_bad_cu_seqlens(cu, exc, msg):
    args = _ssd_args(batch=1)
    with pytest.raises(exc, match=msg):
        ordered_mamba_chunk_scan_combined(*args, cu_seqlens=torch.tensor(cu), return_varlen_states=True)


def test_chunk_scan_refuses_seq_idx_that_disagrees_with_cu_seqlens():
    args = _ssd_args(batch=1)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^seq_idx: expected ids that change exactly at the offsets of cu_seqlens"):
        ordered_mamba_chunk_scan_combined(*args, seq_idx=seq_idx, cu_seqlens=torch.tensor([0, 4, 8]),
                                          return_varlen_states=True)
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):  # the matching ids pass the checks
        ordered_mamba_chunk_scan_combined(*args, seq_idx=seq_idx, cu_seqlens=torch.tensor([0, 3, 8]),
                                          return_varlen_states=True)


def test_split_conv1d_scan_refuses_bad_arguments():
    zxbcdt = torch.randn(2, 8, 30)  # d_ssm = 8 (H = 2, P = 4), N = 2 (conv_dim = 12), d_mlp = 4
    weight, D = torch.randn(12, 4), torch.ones(2)
    with pytest.raises(ValueError, match=r"^zxbcdt: expected a CUDA tensor"):
        ordered_mamba_split_conv1d_scan_combined(zxbcdt, weight, None, torch.zeros(2), -torch.ones(2), D, 4,
                                                 headdim=4)
    with pytest.raises(ValueError, match=r"^initial_states: expected shape \[B, H, P, N\] = \(2, 2, 4, 2\)"):
        ordered_mamba_split_conv1d_scan_combined(zxbcdt, weight, None, torch.zeros(2), -torch.ones(2), D, 4,
                                                 initial_states=torch.zeros(1), headdim=4)
    with pytest.raises(ValueError, match=r"^zxbcdt: expected a CUDA tensor"):
        ordered_mamba_split_conv1d_scan_combined(zxbcdt, weight, None, torch.zeros(2), -torch.ones(2), D, 4,
                                                 initial_states=torch.zeros(2, 2, 4, 2), headdim=4)


def test_decode_ops_refuse_cpu_and_bad_arguments():
    from ordered_ssd.ops import ordered_causal_conv1d_update, ordered_selective_state_update

    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        ordered_causal_conv1d_update(torch.randn(2, 8), torch.zeros(2, 8, 4), torch.randn(8, 4))
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got NoneType"):
        ordered_causal_conv1d_update(None, torch.zeros(2, 8, 4), torch.randn(8, 4))
    with pytest.raises(ValueError, match=r"^state: expected a CUDA tensor"):
        ordered_selective_state_update(torch.zeros(2, 2, 4, 4), torch.randn(2, 2, 4), torch.rand(2, 2),
                                       -torch.ones(2), torch.randn(2, 1, 4), torch.randn(2, 1, 4))
