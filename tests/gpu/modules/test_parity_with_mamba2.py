"""OrderedMamba2 against mamba-ssm's Mamba2 on the GPU: layout, initialisation, state_dict both ways.

Also checks the recorded CPU layouts of tests/modules/test_mamba2.py against the real native module. Outputs and
gradients against native are in test_mamba2_cuda.py.
"""

import pytest
import torch

from tests.helpers import bits_equal
from tests.modules.test_mamba2 import RECORDED

from ordered_ssd import OrderedMamba2

CONFIGS = [
    dict(d_model=256, d_state=64, headdim=32, chunk_size=64),
    dict(d_model=128, d_state=16, headdim=16, ngroups=2, D_has_hdim=True, bias=True, conv_bias=False, d_ssm=128,
         chunk_size=32),
    dict(d_model=96, d_state=32, headdim=24, ngroups=4, rmsnorm=False, chunk_size=64, dt_limit=(0.001, 0.2)),
    dict(d_model=128, d_state=32, headdim=32, norm_before_gate=True, chunk_size=64, conv_init=0.05),
]


def _native():
    from mamba_ssm.modules.mamba2 import Mamba2
    return Mamba2


@pytest.mark.parametrize("kwargs,layout", RECORDED)
def test_recorded_layouts_are_the_native_layouts(kwargs, layout):
    m = _native()(**kwargs, device="cuda")
    assert [(k, tuple(v.shape), v.dtype) for k, v in m.state_dict().items()] == layout


@pytest.mark.parametrize("cfg", CONFIGS)
def test_same_seed_same_initialisation_and_state_dict_both_ways(cfg):
    torch.manual_seed(123)
    native = _native()(**cfg, device="cuda")
    torch.manual_seed(123)
    ours = OrderedMamba2(**cfg, device="cuda")
    sd_n, sd_o = native.state_dict(), ours.state_dict()
    assert list(sd_n) == list(sd_o)
    for k in sd_n:
        assert bits_equal(sd_n[k], sd_o[k]), k
    for name in ("dt_bias", "A_log", "D"):
        assert getattr(native, name)._no_weight_decay and getattr(ours, name)._no_weight_decay
    for attr in ("d_model", "d_state", "d_conv", "expand", "d_inner", "headdim", "d_ssm", "ngroups", "nheads",
                 "rmsnorm", "norm_before_gate", "dt_limit", "chunk_size", "activation", "layer_idx", "D_has_hdim",
                 "conv_init", "use_mem_eff_path", "world_size"):
        assert getattr(native, attr) == getattr(ours, attr), attr
    torch.manual_seed(7)
    other = OrderedMamba2(**cfg, device="cuda")
    other.load_state_dict(sd_n, strict=True)
    native2 = _native()(**cfg, device="cuda")
    native2.load_state_dict(other.state_dict(), strict=True)
    for k, v in native2.state_dict().items():
        assert bits_equal(v, sd_n[k]), k
