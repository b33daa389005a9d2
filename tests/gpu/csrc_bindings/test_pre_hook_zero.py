"""GPU (imports mamba-ssm): the arguments upstream's live autotuners zero before a launch are the specs'
``pre_hook_zero``, which the launchers zero by hand (``tests/csrc_bindings/test_pre_hook_zero.py`` checks that on
the CPU). Read with :func:`csrc_bindings.pinned.live.live_pre_hook_zero`: every config's ``pre_hook`` and the
autotuner's own, called with recorders (no tensor is touched).
"""
import pytest

from csrc_bindings._registry import KERNELS
from csrc_bindings.pinned.live import live_pre_hook_zero


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_live_pre_hooks_zero_the_spec_arguments(name):
    spec = KERNELS[name]
    assert live_pre_hook_zero(spec) == set(spec.pre_hook_zero), name
