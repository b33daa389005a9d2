"""The byte-level LM's data (:mod:`ordered_ssd.apps.lm`)."""
import torch

from ordered_ssd.apps.lm import ByteData
from ordered_ssd.distributed import shard_rows


def test_ddp_batch_rows_are_the_documented_slice():
    data = ByteData(bytes(range(256)) * 40, 16)
    x, y = data.batch(3, 7, 6)
    for r in range(3):
        off, cnt = shard_rows(6, 3, r)
        xr, yr = data.batch(3, 7, 6, offset=off, count=cnt)
        assert torch.equal(xr, x[2 * r:2 * r + 2]) and torch.equal(yr, y[2 * r:2 * r + 2])



def test_batch_to_cpu_is_tensor_to():
    """On the CPU ``batch_to`` is ``tensor.to(device)``: the same values, dtype and device."""
    from ordered_ssd.apps.lm import batch_to

    win = torch.arange(2 * 9, dtype=torch.int64).reshape(2, 9)
    x = win[:, :-1]
    out = batch_to(x, torch.device("cpu"))
    assert torch.equal(out, torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16]]))
    assert out.dtype == torch.int64 and out.device.type == "cpu"


def test_batch_to_cuda_copies_from_pinned_memory_without_blocking(monkeypatch):
    """On CUDA the batch is copied into a contiguous pinned buffer, which goes to the device with
    ``non_blocking=True`` (a pageable copy would make the host wait for the device every step). Checked with
    ``torch.empty`` stood in for: this machine may have no GPU (the values on a real device:
    tests/gpu/apps/test_check_loop.py)."""
    from ordered_ssd.apps import lm

    calls = []

    class Stand:
        def copy_(self, src):
            calls.append(("copy_", src))
            return self

        def to(self, *args, **kwargs):
            calls.append(("to", args, kwargs))
            return "on device"

    def empty(shape, dtype=None, pin_memory=False):
        calls.append(("empty", tuple(shape), dtype, pin_memory))
        return Stand()

    monkeypatch.setattr(lm.torch, "empty", empty)
    x = torch.zeros(2, 8, dtype=torch.int64)
    dev = torch.device("cuda")
    assert lm.batch_to(x, dev) == "on device"
    assert calls == [("empty", (2, 8), torch.int64, True), ("copy_", x), ("to", (dev,), {"non_blocking": True})]
