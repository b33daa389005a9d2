"""Packed sequences as rows (``ordered_ssd.modules._layout``, the CUDA path of ``sequence_invariant``): each run of
``seq_idx`` goes to its own row from position 0, in whole chunks; the moves are exact copies both ways; the layout is
built once per ``seq_idx`` tensor."""
import torch

from ordered_ssd.modules._layout import pad_to_multiple, sequence_rows
from tests.helpers import bits_equal


def test_each_run_of_seq_idx_goes_to_its_own_row_from_position_0_and_back():
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2], [2, 2, 3, 3, 3, 3, 3, 3]])
    rows = sequence_rows(seq_idx, 4)
    assert (rows.S, rows.Lrow) == (5, 8)  # the runs: 3, 4, 1 | 2, 6 positions; the longest, 6, to whole chunks
    x = torch.randn(2, 8, 3, dtype=torch.float64, requires_grad=True)
    r = rows.to_rows(x)
    assert r.shape == (5, 8, 3)
    starts, lengths = [(0, 0), (0, 3), (0, 7), (1, 0), (1, 2)], [3, 4, 1, 2, 6]
    for s, ((b, t), n) in enumerate(zip(starts, lengths)):
        assert bits_equal(r[s, :n], x[b, t:t + n]) and not r[s, n:].any()  # padding: zeros
    back = rows.from_rows(r * 3)
    assert bits_equal(back, x.detach() * 3)
    g = torch.randn(2, 8, 3, dtype=torch.float64)
    back.backward(g)
    assert bits_equal(x.grad, g * 3)  # each position's gradient is its row position's, copied


def test_the_layout_is_built_once_per_seq_idx_tensor_and_none_when_rows_are_sequences():
    seq_idx = torch.tensor([[0, 0, 1, 1]])
    first = sequence_rows(seq_idx, 2)
    assert sequence_rows(seq_idx, 2) is first  # kept while the tensor is alive and unmodified
    assert sequence_rows(seq_idx, 4) is not first and sequence_rows(seq_idx, 4).Lrow == 4
    seq_idx[0, 3] = 2  # modified in place: built again
    assert sequence_rows(seq_idx, 2).S == 3
    assert sequence_rows(torch.tensor([[5, 5, 5], [7, 7, 7]]), 2) is None  # one run per row
    assert sequence_rows(torch.zeros(0, 4, dtype=torch.long), 2) is None


def test_pad_to_multiple_pads_with_zeros_along_L_only_when_needed():
    x = torch.randn(2, 5, 3)
    assert pad_to_multiple(x, 5) is x
    p = pad_to_multiple(x, 4)
    assert p.shape == (2, 8, 3) and bits_equal(p[:, :5], x) and not p[:, 5:].any()
    m = torch.ones(2, 5, dtype=torch.long)
    assert pad_to_multiple(m[:, :, None], 4)[..., 0].tolist() == [[1] * 5 + [0] * 3] * 2


def test_per_tensor_keeps_a_value_per_live_unmodified_tensor_and_not_for_inference_tensors():
    from ordered_ssd.modules._layout import per_tensor

    calls = []
    t = torch.zeros(3)
    f = lambda: calls.append(1) or len(calls)  # noqa: E731
    assert per_tensor("x", t, f) == 1 and per_tensor("x", t, f) == 1 and per_tensor("y", t, f) == 2
    t.add_(1)
    assert per_tensor("x", t, f) == 3
    with torch.inference_mode():
        i = torch.zeros(2, 4, dtype=torch.long)
        assert per_tensor("x", i, f) == 4 and per_tensor("x", i, f) == 5
        assert sequence_rows(i, 2) is None  # an inference seq_idx: built, not kept
