"""``StepDigests`` on CUDA: the snapshot, pinned copy and hashing overlap the next step and still give
``tensor_sha256`` of each tensor as it was at ``submit``."""
import pytest
import torch

from ordered_ssd.apps.check.digests import StepDigests
from ordered_ssd.digest import tensor_sha256
from tests.apps.check.test_digests import _tensors


@pytest.mark.parametrize("hasher, registered", [("process", True), ("process", False), ("threads", None)])
def test_cuda_digests_overlap_and_match(monkeypatch, hasher, registered):
    """Each hasher; the process's shared buffers registered as page-locked memory, or (the driver refusing) copied
    to through a pinned staging buffer."""
    from ordered_ssd.apps.check import digests as module

    if registered is False:
        monkeypatch.setattr(module, "_in_thread", lambda index, call: 1)  # cudaHostRegister refused
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(1)
    ts = {k: (v.to(dev) if v is not None else None) for k, v in _tensors(g).items()}
    ts["big"] = torch.randn(3_000_000, generator=g).to(dev)  # 12 MB: the copy still running when the hashing asks
    expected, keys = [], []
    with StepDigests(dev, depth=2, hasher=hasher) as digests:
        for _ in range(5):
            keys.append(digests.submit(ts))
            expected.append({k: "none" if v is None else tensor_sha256(v) for k, v in ts.items()})
            for v in ts.values():
                if v is not None and v.numel():
                    v.mul_(3).add_(1)
        assert [r.sha256 for r in digests.results(keys)] == expected
        if hasher == "process":
            assert all(slot.host.registered is registered for slot in digests._slots)
            assert all((slot.host.staging is None) is registered for slot in digests._slots)
            assert all(slot.host_buf.is_pinned() for slot in digests._slots)  # the device copies asynchronously


def test_cuda_norms_are_the_device_float64_norms_at_submit():
    """The norms are each tensor's float64 L2 norm as it was at ``submit`` (to rounding: ``device_norms``'
    ``_foreach_norm`` may split a tensor among its accumulators otherwise than ``vector_norm``), and the same bits
    for the same values in the same layout."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(3)
    ts = {"w": torch.randn(64, 33, generator=g).to(dev), "b": torch.randn(7, generator=g).to(dev, torch.bfloat16),
          "none": None, "ints": torch.arange(5, device=dev)}
    with StepDigests(dev) as digests:
        keys, expected = [], []
        for _ in range(3):
            keys.append((digests.submit(ts, norms=True), digests.submit(ts, norms=True)))
            expected.append({k: None if v is None or not v.is_floating_point() else
                             float(torch.linalg.vector_norm(v, dtype=torch.float64)) for k, v in ts.items()})
            ts["w"].mul_(2)
            ts["b"].add_(1)
        got = [(digests.result(a).norms, digests.result(b).norms) for a, b in keys]
    for (first, again), want in zip(got, expected):
        assert first == again  # the same bits
        for k, v in want.items():
            if v is None:
                assert first[k] == "none", k
            else:
                assert float.fromhex(first[k]) == pytest.approx(v, rel=1e-14, abs=0.0), k
    assert len({first["w"] for first, _ in got}) == 3
