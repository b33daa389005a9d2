"""GPU: the grouped channel-first copies of the per-example causal-conv1d backward give the old bits.

``launch_causal_conv1d_bwd_per_example`` copies a group of examples at a time with one tiled Triton launch
(``csrc_bindings/_layout.py``). A copy does no arithmetic, so the outputs must equal, bit for bit, the algorithm it
replaced: one fresh contiguous ``[1, D, L]`` copy per example, made by torch, handed to causal-conv1d's channel-first
backward. Checked for every group size, aligned and unaligned ``D * L``, packed sequences, and the layer's layout
(a channel-last slice of ``zxbcdt``).
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import bits_equal  # noqa: E402


def _old_algorithm(x, w, b, dout, segments, silu=True):
    from csrc_bindings._native import native_conv
    ext = native_conv().ext
    dx = torch.empty_like(x)
    dw = torch.zeros(len(segments), *w.shape, dtype=torch.float32, device=x.device)
    db = torch.zeros(len(segments), w.shape[0], dtype=torch.float32, device=x.device) if b is not None else None
    for s, (bi, start, end) in enumerate(segments):
        xs = x[bi:bi + 1, :, start:end].contiguous()
        dos = dout[bi:bi + 1, :, start:end].contiguous()
        dxs = torch.empty_like(xs)
        ext.causal_conv1d_bwd(xs, w, b, dos, None, None, None, dxs, dw[s], db[s] if db is not None else None, None,
                              silu)
        dx[bi:bi + 1, :, start:end].copy_(dxs)
    return dx, dw, db


def _inputs(B, D, L, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    # as in the layer: xBC is a channel-last slice of zxbcdt [B, L, d_in_proj]
    x = torch.randn(B, L, D + 24, device="cuda", generator=g).to(dtype)[..., 8:D + 8].transpose(1, 2)
    dout = torch.randn(B, L, D, device="cuda", generator=g).to(dtype).transpose(1, 2)
    w = torch.randn(D, 4, device="cuda", generator=g).to(dtype)
    b = torch.randn(D, device="cuda", generator=g).to(dtype)
    return x, dout, w, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("D,L", [(320, 200), (136, 37), (1024, 1), (264, 4096)])
def test_grouped_copies_equal_the_per_example_algorithm(dtype, D, L):
    import csrc_bindings.conv1d as conv1d
    from csrc_bindings import _layout

    B = 6
    x, dout, w, b = _inputs(B, D, L, dtype)
    segs = [(i, 0, L) for i in range(B)]
    ref = _old_algorithm(x, w, b, dout, segs)
    per_example = 3 * _layout.aligned_example_stride(D, L, x.element_size()) * x.element_size()
    for group_bytes in (1, 2 * per_example, 4 * per_example, 1 << 40):
        dx = torch.full((B, L, D), float("nan"), dtype=dtype, device="cuda").transpose(1, 2)
        for _ in range(3):
            got = conv1d.launch_causal_conv1d_bwd_per_example(x, w, b, dout, dx=dx, group_bytes=group_bytes)
            assert got[0] is dx
            assert bits_equal(dx, ref[0]) and bits_equal(got[1], ref[1]) and bits_equal(got[2], ref[2]), group_bytes


def test_packed_sequences():
    import csrc_bindings.conv1d as conv1d

    B, D, L = 3, 264, 100
    x, dout, w, b = _inputs(B, D, L, torch.bfloat16, seed=1)
    ids = [[0] * 30 + [1] * 70, [2] * 100, [3] * 1 + [4] * 98 + [5]]
    seq_idx = torch.tensor(ids, dtype=torch.int32, device="cuda")
    segs = conv1d.sequence_segments(seq_idx)
    ref = _old_algorithm(x, w, b, dout, segs)
    for group_bytes in (1, 1 << 40):
        got = conv1d.launch_causal_conv1d_bwd_per_example(x, w, b, dout, seq_idx=seq_idx, group_bytes=group_bytes)
        assert bits_equal(got[0], ref[0]) and bits_equal(got[1], ref[1]) and bits_equal(got[2], ref[2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_copy3d_on_cuda(dtype):
    from csrc_bindings._layout import copy3d

    g = torch.Generator(device="cuda").manual_seed(2)
    for B, I, J in ((1, 1, 1), (3, 70, 130), (2, 4352, 4096), (64, 1664, 512)):
        src = torch.randn(B, J, I + 16, device="cuda", generator=g).to(dtype)[..., 8:I + 8].transpose(1, 2)
        dst = torch.full((B, I, J), float("nan"), device="cuda", dtype=dtype)
        copy3d(src, dst)
        assert bits_equal(dst, src.contiguous())
        back = torch.empty(B, J, I, device="cuda", dtype=dtype).transpose(1, 2)
        copy3d(dst, back)
        assert bits_equal(back.contiguous(), src.contiguous())
