"""Fixtures of the GPU tests."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _static_configs_unless_marked(request, monkeypatch):
    """Every GPU test not marked ``native_timing`` runs with ``csrc_bindings._configs.NATIVE_TIMING`` and
    ``ordered_ssd.fold.settings.GEMM_FOLD_TIMING`` off: the kernels of rule ``native-autotune-v1`` launch their
    static choice instead of timing every candidate at the first launch of each key (tens of seconds per key and
    process, which would put the suite over the gate's time limit), and the projection folds take the static
    variant instead of rule ``gemm-timed-v2``'s.

    Why that loses no check: the rule's choices are bit-neutral, and the timed path itself is tested where it is
    marked: ``test_native_timing`` (static, timing and later steps give the same bits), the bitwise grid
    (repeatable and literal == fast with every key timed in its first step), ``torch.compile`` and CUDA-graph
    capture, the tests that snapshot the autotuners' state, and the fold's timed-choice test
    (``tests/gpu/fold/test_gemm_fold.py``) (``native_timing`` marks). Child processes that a test starts are not
    reached by this fixture: they run with the timing on, as users do. A key already timed earlier in the process
    keeps its timed choice (``_configs._timed``, ``fold.gemm._gemm_timed``). Put back after the test.
    """
    if request.node.get_closest_marker("native_timing") is None:
        from csrc_bindings import _configs  # imports nothing native
        from ordered_ssd.fold import settings

        monkeypatch.setattr(_configs, "NATIVE_TIMING", False)
        monkeypatch.setattr(settings, "GEMM_FOLD_TIMING", False)
    yield


@pytest.fixture
def nan_fresh_buffers():
    """Fill every fresh ``torch.empty*`` allocation with NaN (integers with their maximum) during the test.

    The launchers promise that every entry of an output they allocate is written, and that the buffers the
    autotuner's pre-hook zeroed are zeroed first; with fresh memory full of NaN, a missed entry or a missed zeroing
    shows up as NaN or as other bits in a result. Uses torch's own switch
    (``torch.utils.deterministic.fill_uninitialized_memory``, which acts under
    ``torch.use_deterministic_algorithms``; ``warn_only=True`` so no op is refused); both global settings are put
    back afterwards.
    """
    was_enabled = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        probe = torch.empty(4, device="cuda")
        assert bool(torch.isnan(probe).all()), "fresh CUDA buffers are not NaN-filled: the fixture does not work"
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_enabled, warn_only=was_warn_only)
