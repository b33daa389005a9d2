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
