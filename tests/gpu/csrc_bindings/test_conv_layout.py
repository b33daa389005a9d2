"""GPU: the grouped copies and folds of the per-example backward pieces give the old bits.

``launch_causal_conv1d_bwd_per_example`` copies a group of examples at a time with one tiled Triton launch
(``csrc_bindings/_layout.py``). A copy does no arithmetic, so the outputs must equal, bit for bit, the per-example
algorithm: one fresh canonical channel-first ``[1, D, L]`` buffer per example, filled by torch, handed to
causal-conv1d's channel-first backward. That is the algorithm it replaced for every length except 1: the old code's
``.contiguous()`` kept a length-1 slice's strides, which causal-conv1d reads as channel-last (see CHANGELOG); the
reference here takes the channel-first kernel for length 1 too, as the library now does. Checked for every group size, aligned and unaligned ``D * L``, packed sequences, and the layer's layout
(a channel-last slice of ``zxbcdt``). And a double backward through the ordered Functions raises.
"""

import pytest
import torch

from tests.helpers import bits_equal


def _old_algorithm(x, w, b, dout, segments, silu=True):
    from csrc_bindings._native import native_conv
    ext = native_conv().ext
    dx = torch.empty_like(x)
    dw = torch.zeros(len(segments), *w.shape, dtype=torch.float32, device=x.device)
    db = torch.zeros(len(segments), w.shape[0], dtype=torch.float32, device=x.device) if b is not None else None
    for s, (bi, start, end) in enumerate(segments):
        # canonical channel-first buffers: ``.contiguous()`` would keep a length-1 slice's strides, which
        # causal-conv1d reads as channel-last (stride(1) == 1, stride(2) > 1) and sends to its other kernel
        xs = torch.empty(1, x.shape[1], end - start, dtype=x.dtype, device=x.device)
        xs.copy_(x[bi:bi + 1, :, start:end])
        dos = torch.empty_like(xs).copy_(dout[bi:bi + 1, :, start:end])
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
    import csrc_bindings.causal_conv1d as conv1d
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
    import csrc_bindings.causal_conv1d as conv1d

    B, D, L = 3, 264, 100
    x, dout, w, b = _inputs(B, D, L, torch.bfloat16, seed=1)
    # a sequence of 8 (the op's vectorised path) starting at an odd position, and sequences of 1
    ids = [[0] * 30 + [1] * 70, [2] * 100, [3] * 1 + [4] * 8 + [5] * 90 + [6]]
    seq_idx = torch.tensor(ids, dtype=torch.int32, device="cuda")
    segs = conv1d.sequence_segments(seq_idx)
    ref = _old_algorithm(x, w, b, dout, segs)
    for _ in range(3):
        got = conv1d.launch_causal_conv1d_bwd_per_example(x, w, b, dout, seq_idx=seq_idx)
        assert bits_equal(got[0], ref[0]) and bits_equal(got[1], ref[1]) and bits_equal(got[2], ref[2])


def test_channel_first_input_without_copies():
    import csrc_bindings.causal_conv1d as conv1d

    B, D, L = 4, 256, 512
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(B, D, L, device="cuda", generator=g, dtype=torch.bfloat16)
    dout = torch.randn(B, D, L, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(D, 4, device="cuda", generator=g, dtype=torch.bfloat16)
    ref = _old_algorithm(x, w, None, dout, [(i, 0, L) for i in range(B)])
    got = conv1d.launch_causal_conv1d_bwd_per_example(x, w, None, dout)  # dx allocated channel-first
    assert got[0].stride() == x.stride() and got[2] is None
    assert bits_equal(got[0], ref[0]) and bits_equal(got[1], ref[1])


def test_double_backward_raises():
    from ordered_ssd import OrderedMamba2

    torch.manual_seed(0)
    layer = OrderedMamba2(d_model=256, d_state=64, headdim=64, chunk_size=64, device="cuda")
    u = torch.randn(2, 100, 256, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = layer(u)
    (gu,) = torch.autograd.grad(out.float().square().sum(), u, create_graph=True)
    with pytest.raises(RuntimeError):
        gu.sum().backward()


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
