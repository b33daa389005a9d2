"""GPU: launches through the compiled-kernel cache (csrc_bindings._launch_cache) give the bits of Triton's own launch
path, and a key that differs only in a pointer's alignment never reuses the other key's kernel.
"""
import pytest
import torch

from csrc_bindings import _launch_cache, _plans
from tests.helpers import bits_equal
from tests.layer_digests import CONFIGS, step_digests

CUDA = [name for name, cfg in CONFIGS.items() if cfg[0] == "cuda"]


@pytest.mark.parametrize("name", CUDA)
def test_cached_layer_step_gives_triton_paths_bits(name, monkeypatch):
    """One training step with every launch through ``jit[grid]`` (the cache never consulted), then steps with every
    launch a hit: the same digests of the output and every gradient, and no launch left to Triton's path. A first
    step keeps every launch configuration of the step (a ``native-autotune-v1`` choice is timed at the first launch
    of its key, through upstream's autotuner, not through the cache) and gives the same digests."""
    first = step_digests(name)
    real_lookup = _launch_cache.lookup
    monkeypatch.setattr(_launch_cache, "lookup", lambda jit, key: None)
    with _plans.disabled():  # launch plans run kept kernels without a lookup: off, so every launch takes Triton's path
        triton_path = step_digests(name)
    monkeypatch.setattr(_launch_cache, "lookup", real_lookup)
    assert triton_path == first

    hits, kept = [], []
    real_run, real_keep = _launch_cache.run_compiled, _launch_cache.keep
    monkeypatch.setattr(_launch_cache, "run_compiled", lambda *a: hits.append(1) or real_run(*a))
    monkeypatch.setattr(_launch_cache, "keep", lambda *a: kept.append(a[1]) or real_keep(*a))
    for _ in range(2):
        assert step_digests(name) == triton_path
    assert kept == []  # every Triton launch of the step was a hit ...
    assert len(hits) >= 2 * 20  # ... and a step has tens of them (forward and backward)


def test_misaligned_pointer_gets_its_own_kernel():
    """fold_dims on rows 16-byte aligned, then on the same shape 4 bytes off: the second launch must not reuse the
    aligned (vectorised) kernel; both give the CPU's bits, and again from the cache."""
    from ordered_ssd.fold import fold_dims

    gen = torch.Generator().manual_seed(5)
    base = (torch.randn(9, 1024 + 1, generator=gen) * torch.logspace(-6, 6, 1024 + 1)).cuda()
    aligned = base[:, :1024].contiguous()
    misaligned = torch.as_strided(base.view(-1)[1:], (9, 1024), (1024, 1))  # data_ptr % 16 == 4
    assert aligned.data_ptr() % 16 == 0 and misaligned.data_ptr() % 16 == 4
    for _ in range(3):
        for t in (aligned, misaligned):
            got = fold_dims(t, 0)
            torch.cuda.synchronize()
            assert bits_equal(got.cpu(), fold_dims(t.cpu(), 0))
