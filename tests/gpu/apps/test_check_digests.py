"""``StepDigests`` on CUDA: the snapshot, pinned copy and hashing overlap the next step and still give
``tensor_sha256`` of each tensor as it was at ``submit``."""
import torch

from ordered_ssd.apps.check.digests import StepDigests
from ordered_ssd.digest import tensor_sha256
from tests.apps.check.test_digests import _tensors


def test_cuda_digests_overlap_and_match():
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(1)
    ts = {k: (v.to(dev) if v is not None else None) for k, v in _tensors(g).items()}
    expected, keys = [], []
    with StepDigests(dev, depth=2) as digests:
        for _ in range(5):
            keys.append(digests.submit(ts))
            expected.append({k: "none" if v is None else tensor_sha256(v) for k, v in ts.items()})
            for v in ts.values():
                if v is not None and v.numel():
                    v.mul_(3).add_(1)
        assert [r.sha256 for r in digests.results(keys)] == expected
