"""The split-invariant gradient accumulation (:mod:`ordered_ssd.accumulate`) in one process.

The reduction over ranks (and the same bits for every split ``(R, m)``) is tested on 2 and 4 gloo processes in
``tests/test_distributed.py``.
"""
import math

import pytest
import torch

from ordered_ssd import OrderedMamba2, TreeGradAccumulator, tree_sum
from ordered_ssd.distributed import tree_all_reduce
from ordered_ssd.fold import tree_fold


# ----------------------------------------------------------------------------------------------- tree_sum
def test_tree_sum_is_the_pairwise_tree_in_fp32():
    g = torch.Generator().manual_seed(0)
    ts = [(torch.randn(257, generator=g, dtype=torch.float64) * 10.0 ** k).to(torch.bfloat16) for k in range(8)]
    f = [t.float() for t in ts]
    expected = ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]))
    got = tree_sum(ts)
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    assert torch.equal(tree_sum(ts[:1]), f[0]) and tree_sum(ts[:1]) is not ts[0]
    # the stacked form (used by the reduction over ranks) is the same tree
    assert torch.equal(tree_fold(torch.stack(ts)), expected)
    d = [t.double() for t in ts[:2]]
    assert tree_sum(d).dtype == torch.float64 and torch.equal(tree_sum(d), d[0] + d[1])


def test_tree_sum_errors():
    with pytest.raises(ValueError, match="the number of partials 3 is not a power of two"):
        tree_sum([torch.ones(2)] * 3)
    with pytest.raises(ValueError, match="at least one partial"):
        tree_sum([])
    with pytest.raises(ValueError, match=r"expected shape \(2,\)"):
        tree_sum([torch.ones(2), torch.ones(3)])


def test_tree_differs_from_the_left_to_right_sum():
    """The order matters: 1 + 2^-24 rounds to 1 (ties to even), so the left-to-right sum loses all three small
    terms, the tree keeps two of them. Gradients arrive through .grad, as after a backward."""
    p = torch.nn.Parameter(torch.zeros(1))
    acc = TreeGradAccumulator([p])
    e = 2.0 ** -24
    for v in (1.0, e, e, e):
        p.grad = torch.tensor([v])
        acc.add_block()
    left_to_right = torch.tensor([1.0]) + e + e + e
    assert float(left_to_right) == 1.0
    assert float(acc.local_sum()) == 1.0 + 2 * e == float(tree_sum([torch.tensor([v]) for v in (1.0, e, e, e)]))


# ----------------------------------------------------------------------------------------------- the accumulator
def _mlp(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5)).to(dtype)


def _blocks(k, rows=3, width=12):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(rows, width, generator=g) * 4.0 ** i for i in range(k)]


def _block_grads(model, xs, autocast=False):
    """The flat fp32 gradient of each block's loss, one backward per block (what the accumulator receives)."""
    out = []
    for x in xs:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x.to(next(model.parameters()).dtype)).float().pow(2).mean()
        loss.backward()
        out.append(torch.cat([p.grad.reshape(-1).float() for p in model.parameters()]))
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("case", ["fp32", "bf16", "autocast-bf16"])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_accumulator_equals_tree_sum_of_block_gradients(case, m):
    dtype = torch.bfloat16 if case == "bf16" else torch.float32
    model = _mlp(dtype)
    xs = _blocks(m)
    expected = tree_sum(_block_grads(model, xs, autocast=case == "autocast-bf16"))
    acc = TreeGradAccumulator(model.parameters())
    assert acc.dtype == torch.float32
    for x in xs:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "autocast-bf16"):
            loss = model(x.to(dtype)).float().pow(2).mean()
        loss.backward()
        acc.add_block()
        assert all(p.grad is None for p in model.parameters())
    assert acc.blocks == m
    assert acc.max_buffers_held <= math.log2(m) + 1 and acc.max_buffers_held == int(math.log2(m)) + 1
    assert acc.buffers_held == 1
    assert torch.equal(acc.local_sum(), expected)
    reduced = acc.reduce()  # no process group: a copy of the local sum
    assert torch.equal(reduced, expected) and reduced.data_ptr() != acc.local_sum().data_ptr()
    acc.write_grads()
    off = 0
    for p in model.parameters():
        k = p.numel()
        assert p.grad.dtype == p.dtype and p.grad.shape == p.shape
        assert torch.equal(p.grad, (expected[off:off + k] / m).view(p.shape).to(p.dtype))
        off += k
    assert acc.blocks == 0 and acc.buffers_held == 0 and acc.max_buffers_held == 0


def test_accumulator_on_an_ordered_mamba2_layer():
    torch.manual_seed(0)
    layer = OrderedMamba2(16, d_state=8, headdim=8, chunk_size=8)
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(2, 12, 16, generator=g) for _ in range(4)]
    grads = []
    for x in xs:
        layer.zero_grad(set_to_none=True)
        layer(x).pow(2).mean().backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in layer.parameters()]))
    layer.zero_grad(set_to_none=True)
    acc = TreeGradAccumulator(layer.parameters())
    for x in xs:
        layer(x).pow(2).mean().backward()
        acc.add_block()
    assert torch.equal(acc.local_sum(), tree_sum(grads))


def test_buffers_held_follow_the_binary_counter():
    p = torch.nn.Parameter(torch.zeros(3))
    acc = TreeGradAccumulator([p])
    held = []
    for k in range(16):
        p.grad = torch.full((3,), float(k))
        acc.add_block()
        held.append(acc.buffers_held)
    assert held == [bin(k + 1).count("1") for k in range(16)]
    assert acc.max_buffers_held == 5 == math.log2(16) + 1


def test_missing_gradients_count_as_zeros_and_order_is_kept():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    acc = TreeGradAccumulator([b, a])
    a.grad = torch.ones(2)
    acc.add_block()  # b.grad is None
    b.grad = torch.full((3,), 2.0)
    acc.add_block()  # a.grad is None
    assert acc.local_sum().tolist() == [2.0, 2.0, 2.0, 1.0, 1.0]
    acc.write_grads(scale=1.0)
    assert a.grad.tolist() == [1.0, 1.0] and b.grad.tolist() == [2.0, 2.0, 2.0]


def test_frozen_and_unused_parameters_keep_no_gradient_and_do_not_move():
    """A requires_grad=False parameter is left out; one that no block gave a gradient keeps .grad None; so AdamW
    with weight decay leaves both alone, as it would without the accumulator."""
    used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    acc = TreeGradAccumulator([used, unused, frozen])
    assert acc.params == [used, unused] and acc.numel == 4
    for _ in range(2):
        used.grad = torch.full((2,), 0.5)
        acc.add_block()
    acc.write_grads()
    assert used.grad.tolist() == [0.5, 0.5] and unused.grad is None and frozen.grad is None
    opt = torch.optim.AdamW([used, unused, frozen], lr=0.1, weight_decay=0.1)
    opt.step()
    assert unused.tolist() == [1.0, 1.0] and frozen.tolist() == [1.0, 1.0] and used.tolist() != [1.0, 1.0]
    with pytest.raises(ValueError, match="at least one parameter that requires grad"):
        TreeGradAccumulator([frozen])


def test_write_grads_without_blocks_raises_and_writes_nothing():
    p = torch.nn.Parameter(torch.zeros(2))
    acc = TreeGradAccumulator([p])
    with pytest.raises(ValueError, match="the number of accumulated blocks 0 is not a power of two"):
        acc.write_grads()
    assert p.grad is None


def test_non_power_of_two_blocks_raise():
    p = torch.nn.Parameter(torch.zeros(2))
    acc = TreeGradAccumulator([p])
    with pytest.raises(ValueError, match="the number of accumulated blocks 0 is not a power of two"):
        acc.local_sum()
    for _ in range(3):
        p.grad = torch.ones(2)
        acc.add_block()
    for call in (acc.local_sum, acc.reduce, acc.write_grads):
        with pytest.raises(ValueError, match="the number of accumulated blocks 3 is not a power of two"):
            call()
    acc.reset()
    assert acc.blocks == 0 and acc.buffers_held == 0


def test_fp64_models_accumulate_in_fp64_and_mixtures_raise():
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    acc = TreeGradAccumulator([p])
    assert acc.dtype == torch.float64
    p.grad = torch.tensor([1.0, 1e-300], dtype=torch.float64)
    acc.add_block()
    assert acc.local_sum().dtype == torch.float64 and float(acc.local_sum()[1]) == 1e-300
    with pytest.raises(ValueError, match="fp64 parameter"):
        TreeGradAccumulator([p, torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError, match="at least one parameter"):
        TreeGradAccumulator([])


def test_write_grads_keeps_the_parameter_layout():
    p = torch.nn.Parameter(torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last))
    acc = TreeGradAccumulator([p])
    p.grad = torch.arange(120.0).view(2, 3, 4, 5)
    acc.add_block()
    acc.write_grads()
    assert p.grad.stride() == p.stride() and torch.equal(p.grad, torch.arange(120.0).view(2, 3, 4, 5))


def test_tree_all_reduce_without_a_process_group_is_the_identity():
    t = torch.arange(5.0)
    assert tree_all_reduce(t) is t and t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(TypeError, match="floating-point"):
        tree_all_reduce(torch.arange(5))
