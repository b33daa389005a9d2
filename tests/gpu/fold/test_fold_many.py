"""GPU: :func:`fold_many` (several folds in one launch) and :func:`fold_example_sums` (the projection bias's fold)
give, bit for bit, what :func:`fold_dims` / the per-example :class:`LexicalFold` give on the CPU and on CUDA.

The layouts are those of one backward step (``tests/fold/test_many.py``'s :func:`step_requests`, at sizes where the
launch has several programs per fold), with values spanning many binades so that another order of additions would
give other bits.
"""
import itertools

import torch

from tests.fold.test_many import _reference, _wide, example_sums_reference, step_requests
from tests.helpers import bits_equal


def _cuda(req):
    return (req[0].cuda(), *req[1:])


def test_fold_many_on_cuda_equals_fold_dims_on_cuda_and_on_the_cpu(nan_fresh_buffers):
    from ordered_ssd.fold import fold_many

    reqs = step_requests(seed=3)
    big = [("conv weight, 600 channels", ((_wide((3, 4, 600, 4), 90)), (0, 1)), True),
           ("dB, 70 positions", ((_wide((2, 70, 3, 2, 64), 91)), 2), True)]
    reqs = reqs + big
    for _ in range(2):  # twice: the same bits
        got = fold_many([_cuda(req) for _, req, _ in reqs])
        for (name, req, _), g in zip(reqs, got):
            want = _reference(req)
            assert g.is_cuda and g.dtype == want.dtype and g.shape == want.shape, name
            assert bits_equal(g.cpu(), want), name
            assert bits_equal(g, _reference(_cuda(req))), name


def test_fold_example_sums_on_cuda_equals_the_per_example_fold(nan_fresh_buffers):
    from ordered_ssd.fold import fold_example_sums

    # L = 300 and 2048: the unrolled loop and its tail; M = 700 (blocks of 256), 32 and 5 (one block of 32); the
    # layouts: contiguous, examples apart, and a position's features L apart (copied contiguous before the launch)
    for dtype, shape in itertools.product((torch.float32, torch.bfloat16), ((9, 300, 700), (8, 2048, 32), (3, 45, 5))):
        dy = _wide(shape, 5, dtype)
        for t in (dy, dy.transpose(0, 1).contiguous().transpose(0, 1), dy.transpose(1, 2).contiguous().transpose(1, 2)):
            for bias_dtype in (torch.float32, torch.bfloat16):
                got = fold_example_sums(t.cuda(), bias_dtype)
                want = example_sums_reference(t, bias_dtype)  # on the CPU
                assert got.dtype == bias_dtype and bits_equal(got.cpu(), want), (dtype, bias_dtype)
                assert bits_equal(got, example_sums_reference(t.cuda(), bias_dtype)), (dtype, bias_dtype)
