"""Shared pytest configuration.

Tests marked ``gpu`` (and every test under ``tests/gpu/``) need a CUDA device *and* the native extras (mamba-ssm, causal-conv1d);
anywhere else they are skipped, with the reason printed by ``pytest -rs``.
"""
import importlib.util

import pytest
import torch


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device"
    missing = [m for m in ("mamba_ssm", "causal_conv1d", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        return "native extras missing: " + ", ".join(missing) + " (pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0)"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:  # everything under tests/gpu/ is a GPU test
        if "/tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
    reason = _gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_global_torch_state():
    """Tests seed torch's RNG; put the global generator (and thread count) back afterwards."""
    rng = torch.random.get_rng_state()
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.random.set_rng_state(rng)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    """Every test starts without launch plans (``csrc_bindings._plans``): a plan recorded under one test's stand-in
    natives or configuration table must not replay in another."""
    from csrc_bindings import _plans
    _plans.clear()
    yield
    _plans.clear()
