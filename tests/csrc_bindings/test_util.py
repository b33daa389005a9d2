"""Binding errors name the argument, the expected and the actual value (csrc_bindings/_util.py)."""
import pytest
import torch

from csrc_bindings._util import check_D, check_rows, check_shape, nsplits, out_buffer


def test_messages():
    with pytest.raises(ValueError, match=r"^A: expected shape \[H\] = \(8,\), got \(4,\)$"):
        check_shape("A", torch.zeros(4), (8,), "[H]")
    with pytest.raises(ValueError, match=r"^x: expected shape \(2, 3\), got \(3, 2\)$"):
        check_shape("x", torch.zeros(3, 2), (2, 3))
    with pytest.raises(ValueError, match=r"^w: expected stride 1 in the last dim, got strides \(1, 2\)$"):
        check_rows("w", torch.zeros(3, 2).t(), (2, 3))
    with pytest.raises(ValueError, match=r"^D: expected shape \[H, P\] = \(4, 8\) or \[H\] = \(4,\), got \(8,\)$"):
        check_D(torch.zeros(8), 4, 8)
    with pytest.raises(ValueError, match=r"^nheads: expected a multiple of ngroups \(3\), got 8$"):
        nsplits(8, 3, None)
    with pytest.raises(ValueError, match=r"^nheads_per_program: expected 1 <= nheads_per_program <= "
                                         r"nheads // ngroups = 4, got 5$"):
        nsplits(8, 2, 5)
    assert nsplits(8, 2, None) == (4, 1) and nsplits(8, 2, 3) == (3, 2)
    like = torch.zeros(1)
    with pytest.raises(ValueError, match=r"^out: expected shape \(2, 2\), got \(2,\)$"):
        out_buffer(torch.zeros(2), (2, 2), torch.float32, like, "out")
    with pytest.raises(ValueError, match=r"^out: expected dtype torch.float32, got torch.float64$"):
        out_buffer(torch.zeros(2, dtype=torch.float64), (2,), torch.float32, like, "out")
    buf = torch.ones(2)
    assert out_buffer(buf, (2,), torch.float32, like, "out", zero=True) is buf and not buf.any()
