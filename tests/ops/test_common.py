"""``ordered_ssd.ops.common.autocast_context``: the CUDA autocast state an op body runs under."""
import warnings

import pytest
import torch

from ordered_ssd.ops.common import autocast_context


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without CUDA")
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_without_cuda_the_context_is_off_and_warns_nothing(dtype):
    """The CPU tests run the bodies with an autocast dtype (``autocast_dtype`` patched): torch would turn CUDA
    autocast off there with a "CUDA is not available" warning; the context is off without it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with autocast_context(dtype):
            assert not torch.is_autocast_enabled("cuda")
            assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32

