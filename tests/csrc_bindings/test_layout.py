"""The layout copies of csrc_bindings/_layout.py: aligned channel-first buffers and the tiled Triton copy (run on the
CPU under Triton's interpreter in a fresh process when triton is installed; the GPU suite runs it on CUDA)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from csrc_bindings import _layout
from tests.helpers import bits_equal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_layout_helpers():
    assert _layout.aligned_example_stride(10, 37, 4) == 372  # 1480 bytes -> 1488
    assert _layout.aligned_example_stride(10, 37, 2) == 376  # 740 bytes -> 752
    assert _layout.aligned_example_stride(8, 64, 2) == 512
    t = torch.empty(4, 10, 37)
    assert not _layout.is_aligned_channel_first(t)  # example 1 starts at byte 1480
    a = _layout.aligned_channel_first(t.normal_())
    assert a.stride() == (372, 37, 1) and all(a[i].data_ptr() % 16 == 0 for i in range(4))
    assert bits_equal(a.contiguous(), t)
    with pytest.raises(ValueError, match=r"dst: expected the shape of src \[1, 2, 3\], got \[1, 3, 2\]"):
        _layout.copy3d(torch.zeros(1, 2, 3), torch.zeros(1, 3, 2))
    with pytest.raises(ValueError, match="dst: expected the dtype of src"):
        _layout.copy3d(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3, dtype=torch.float64))


def test_copy3d_triton_kernel_under_the_interpreter():
    pytest.importorskip("triton", reason="triton is not installed (the GPU suite runs the kernel on CUDA)")
    code = textwrap.dedent("""
        import torch
        from csrc_bindings._layout import copy3d
        g = torch.Generator().manual_seed(0)
        cases = 0
        for dtype in (torch.float32, torch.bfloat16):
            for B, I, J in ((1, 1, 1), (2, 70, 130), (3, 64, 64), (2, 5, 200)):
                base = torch.randn(B, J, I + 2, generator=g).to(dtype)
                src = base[..., 1:I + 1].transpose(1, 2)          # channel-last view
                dst = torch.full((B, I, J), float("nan"), dtype=dtype)
                copy3d(src, dst, use_triton=True)
                assert torch.equal(dst.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                                   src.contiguous().view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
                back = torch.empty(B, J, I, dtype=dtype).transpose(1, 2)
                copy3d(dst, back, use_triton=True)
                assert torch.equal(back, src)
                cases += 1
        print("ok", cases)
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "ok 8"
