"""`batch_to` on CUDA, the copy of the check's batches: no synchronising call, the values of `tensor.to`."""
import pytest
import torch

from ordered_ssd.apps.lm import batch_to

pytestmark = pytest.mark.gpu


def test_batch_to_matches_a_plain_copy_and_does_not_synchronise():
    """``batch_to`` gives the values and layout of ``tensor.to("cuda")`` (a strided view becomes contiguous), and
    makes no synchronising call: under ``torch.cuda.set_sync_debug_mode("error")`` a pageable copy raises."""
    dev = torch.device("cuda")
    win = torch.randint(0, 256, (8, 513), generator=torch.Generator().manual_seed(0)).to(torch.int64)
    x, y = win[:, :-1], win[:, 1:]
    expected = x.to(dev), y.to(dev)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            x.to(dev)  # the pageable copy that batch_to avoids: the mode does see it
        got = batch_to(x, dev), batch_to(y, dev)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    for g, e in zip(got, expected):
        assert g.device == e.device and g.is_contiguous() and g.dtype == torch.int64
        assert torch.equal(g, e)
