"""The CUDA-only ops refuse CPU tensors and bad arguments with a clear error before any kernel runs (no GPU and no
native extras needed: the checks come first)."""
import pytest
import torch

from ordered_ssd.ops import (ordered_causal_conv1d, ordered_gated_rmsnorm, ordered_mamba_chunk_scan_combined,
                             ordered_mamba_split_conv1d_scan_combined)


def _ssd_args(device="cpu"):
    B, L, H, P, G, N = 2, 8, 2, 4, 1, 4
    return (torch.randn(B, L, H, P, device=device), torch.rand(B, L, H, device=device), -torch.rand(H, device=device),
            torch.randn(B, L, G, N, device=device), torch.randn(B, L, G, N, device=device), 4)


def test_causal_conv1d_refuses_cpu_and_non_tensors():
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor .*got device cpu"):
        ordered_causal_conv1d(torch.randn(2, 8, 16), torch.randn(8, 4))
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list"):
        ordered_causal_conv1d([1.0], torch.randn(8, 4))


def test_gated_rmsnorm_refuses_cpu():
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        ordered_gated_rmsnorm(torch.randn(2, 8, 16), torch.ones(16))


def test_chunk_scan_refuses_unsupported_arguments_then_cpu():
    args = _ssd_args()
    for name in ("initial_states", "cu_seqlens"):
        with pytest.raises(NotImplementedError, match=f"^{name} is not supported"):
            ordered_mamba_chunk_scan_combined(*args, **{name: torch.zeros(1)})
    with pytest.raises(NotImplementedError, match="^return_final_states is not supported"):
        ordered_mamba_chunk_scan_combined(*args, return_final_states=True)
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        ordered_mamba_chunk_scan_combined(*args)


def test_split_conv1d_scan_refuses_bad_arguments():
    zxbcdt = torch.randn(2, 8, 30)
    weight, D = torch.randn(12, 4), torch.ones(2)
    with pytest.raises(ValueError, match=r"^zxbcdt: expected a CUDA tensor"):
        ordered_mamba_split_conv1d_scan_combined(zxbcdt, weight, None, torch.zeros(2), -torch.ones(2), D, 4,
                                                 headdim=4)
    with pytest.raises(NotImplementedError, match="^initial_states is not supported"):
        ordered_mamba_split_conv1d_scan_combined(zxbcdt, weight, None, torch.zeros(2), -torch.ones(2), D, 4,
                                                 initial_states=torch.zeros(1))
