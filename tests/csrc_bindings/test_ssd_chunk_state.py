"""The ssd_chunk_state launchers check their inputs before anything native (CPU)."""
import pytest
import torch

import csrc_bindings as cb


def test_bad_inputs_are_named_with_expected_and_actual_shapes():
    dt = torch.zeros(2, 10, 4)
    with pytest.raises(ValueError, match=r"^A: expected shape \[H\] = \(4,\), got \(3,\)$"):
        cb.launch_chunk_cumsum_fwd(dt, torch.zeros(3), 8)
    with pytest.raises(ValueError, match=r"^dt_bias: expected shape \[H\] = \(4,\), got \(5,\)$"):
        cb.launch_chunk_cumsum_fwd(dt, torch.zeros(4), 8, dt_bias=torch.zeros(5))
    x, dtc = torch.zeros(2, 16, 4, 8), torch.zeros(2, 4, 2, 8)
    with pytest.raises(ValueError, match=r"^dstates: expected shape \[B, C, H, P, N\] = \(2, 2, 4, 8, 3\), got "
                                         r"\(2, 2, 4, 7, 3\)$"):
        cb.launch_chunk_state_bwd_db(x, dtc, dtc, torch.zeros(2, 2, 4, 7, 3))
    with pytest.raises(ValueError, match=r"^nheads_per_program: expected 1 <= nheads_per_program <= nheads // "
                                         r"ngroups = 2, got 3$"):
        cb.launch_chunk_state_bwd_db(x, dtc, dtc, torch.zeros(2, 2, 4, 8, 3), ngroups=2, nheads_per_program=3)
