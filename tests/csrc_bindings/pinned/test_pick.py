"""How a pinned-table search picks one entry per key (csrc_bindings/pinned/pick.py), on the CPU."""
import pytest

from csrc_bindings.pinned import pick


def test_worst_ratio_and_the_kept_entry():
    rows = [{"candidate": {"w": 4}, "ms": 5.0, "ms_more": [2.0]},
            {"candidate": {"w": 8}, "ms": 1.0, "ms_more": [20.0]},
            {"candidate": {"w": 2}, "ms": 1.5, "ms_more": [2.4]}]
    assert pick.worst_ratios(rows) == pytest.approx([5.0, 10.0, 1.5])
    assert pick.least_worst_ratio(rows) is rows[2]
    assert pick.pick_entry(rows) is rows[2]
    assert pick.pick_entry(rows, {"w": 4}, 5.0) is rows[0]  # within: kept (bits unchanged at the key)
    assert pick.pick_entry(rows, {"w": 4}, 4.99) is rows[2]  # loses more than allowed: replaced
    assert pick.pick_entry(rows, {"w": 4}, None) is rows[2]  # no bound: the plain pick
    assert pick.pick_entry(rows, {"w": 16}, 100.0) is rows[2]  # the entry is not among the valid rows
    single = [{"candidate": {"w": 4}, "ms": 2.0}, {"candidate": {"w": 8}, "ms": 1.0}]
    assert pick.worst_ratios(single) == [2.0, 1.0] and pick.pick_entry(single, {"w": 4}, 1.5) is single[1]


def test_out_of_memory_is_not_a_property_of_the_candidate():
    """A run that hit the GPU's memory limit (shared by the tuner's compile workers) is recorded as
    ``OUT_OF_MEMORY``, which keeps the key unwritten; any other error makes the candidate invalid."""
    import torch

    assert pick.failure_status(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate")) == pick.OUT_OF_MEMORY
    assert pick.failure_status(RuntimeError("Triton Error [CUDA]: out of memory")) == pick.OUT_OF_MEMORY
    assert pick.failure_status(ValueError("asks 246272 bytes of shared memory")) == (
        "ValueError: asks 246272 bytes of shared memory")
