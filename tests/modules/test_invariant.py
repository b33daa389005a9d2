"""``InvariantLinear``: a row's bits do not depend on how many rows come with it, where it is among them, or the
other rows' values; and a small Mamba-2 language model with it gives every sequence its canonical per-token losses
in random layouts (the reference path)."""
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ordered_ssd import (InvariantLinear, InvariantRMSNorm, OrderedMamba2, convert_to_ordered, invariant_linear,
                         invariant_rms_norm)
from tests.helpers import bits_equal, make_layer, rel_err


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(256, 1160), (33, 7), (1, 5), (96, 50)])
def test_a_rows_bits_do_not_depend_on_the_other_rows(shape, dtype):
    K, N = shape
    g = torch.Generator().manual_seed(K * N)
    w, b = torch.randn(N, K, generator=g, dtype=dtype), torch.randn(N, generator=g, dtype=dtype)
    x = torch.randn(K, generator=g, dtype=dtype)
    alone = invariant_linear(x[None], w, b)[0]
    for R in (2, 11, 16, 17, 100, 333):
        for pos in {0, R // 2, R - 1}:
            X = torch.randn(R, K, generator=g, dtype=dtype)
            X[pos] = x
            assert bits_equal(invariant_linear(X, w, b)[pos], alone), (R, pos)
    X = torch.randn(3, 7, K, generator=g, dtype=dtype)
    assert rel_err(invariant_linear(X, w, b), F.linear(X, w, b)) < (1e-5 if dtype == torch.float32 else 1e-12)


def test_the_control_f_linear_does_depend_on_the_number_of_rows():
    """What InvariantLinear is for: F.linear gives a row other bits among few rows than among many (the CPU's
    matmul picks its kernel by shape; seen on CI's CPU model)."""
    g = torch.Generator().manual_seed(0)
    w, X = torch.randn(1160, 256, generator=g), torch.randn(4000, 256, generator=g)
    many = F.linear(X, w)
    differ = [m for m in range(1, 20) if not bits_equal(F.linear(X[:m], w), many[:m])]
    if not differ:
        pytest.skip("this CPU's matmul happens to give the same bits for 1 to 19 rows as for 4000")
    assert all(bits_equal(invariant_linear(X[:m], w), invariant_linear(X, w)[:m]) for m in differ)


def test_input_gradient_is_row_invariant_and_the_module_keeps_the_parameter_objects():
    lin = nn.Linear(40, 24)
    inv = InvariantLinear.from_linear(lin)
    assert inv.weight is lin.weight and inv.bias is lin.bias and inv.state_dict().keys() == lin.state_dict().keys()
    x = torch.randn(40)
    dy = torch.randn(24)

    def dx_of(rows, pos):
        X = torch.randn(rows, 40).requires_grad_(False)
        X[pos] = x
        X.requires_grad_(True)
        dY = torch.zeros(rows, 24)
        dY[pos] = dy
        inv(X).backward(dY)
        return X.grad[pos]

    first = dx_of(1, 0)
    for rows, pos in [(5, 3), (40, 17), (129, 128)]:
        assert bits_equal(dx_of(rows, pos), first)
    lin.weight.grad = None
    assert torch.allclose(inv(torch.ones(2, 40)), lin(torch.ones(2, 40)), atol=1e-6)


def test_bad_input_is_named():
    w = torch.randn(4, 3)
    with pytest.raises(ValueError, match="x: expected last dimension in_features = 3"):
        invariant_linear(torch.randn(2, 5), w)
    with pytest.raises(ValueError, match="weight: expected 2-d"):
        invariant_linear(torch.randn(2, 3), torch.randn(3))
    with pytest.raises(ValueError, match=r"bias: expected shape \(4,\)"):
        invariant_linear(torch.randn(2, 3), w, torch.randn(3))
    with pytest.raises(TypeError, match="weight: expected x's dtype torch.float32, got torch.float64"):
        invariant_linear(torch.randn(2, 3), w.double())
    with pytest.raises(TypeError, match="x: expected a floating-point tensor, got dtype torch.int64"):
        invariant_linear(torch.zeros(2, 3, dtype=torch.long), w)
    with pytest.raises(TypeError, match="linear: expected an nn.Linear"):
        InvariantLinear.from_linear(nn.Conv1d(2, 2, 1))


class _LM(nn.Module):
    def __init__(self, d_model=32, layers=2, vocab=61):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        self.mixers = nn.ModuleList([make_layer(seed=i, dtype=torch.float32, d_model=d_model, d_state=8, headdim=8,
                                                chunk_size=8, ngroups=2) for i in range(layers)])
        self.norms = nn.ModuleList([nn.RMSNorm(d_model) for _ in range(layers)])
        self.norm_f = nn.RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.embedding.weight

    def forward(self, tokens, seq_idx=None):
        h = self.embedding(tokens)
        for norm, mixer in zip(self.norms, self.mixers):
            h = h + mixer(norm(h), seq_idx=seq_idx)
        return self.lm_head(self.norm_f(h))


def _losses(model, tokens, seq_idx=None):
    logits = model(tokens, seq_idx=seq_idx)
    B, L, V = logits.shape  # rows of the vocabulary (a softmax over a strided dimension vectorises over positions)
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1), reduction="none").view(B, -1)


def test_convert_to_ordered_checks_invariant_linears_before_anything():
    model = _LM()
    with pytest.raises(TypeError, match="invariant_linears: expected a bool"):
        convert_to_ordered(model, invariant_linears=1)
    assert type(model.lm_head) is nn.Linear


def test_a_model_of_ordered_layers_gets_its_linears_swapped_and_keeps_its_tie():
    model = _LM()
    assert convert_to_ordered(model, invariant_linears=True) is model
    assert type(model.lm_head) is InvariantLinear and model.lm_head.weight is model.embedding.weight
    assert all(type(m.in_proj) is nn.Linear for m in model.mixers)  # the ordered layers' own linears stay
    assert [m.sequence_invariant for m in model.mixers] == [True, True]  # their CUDA path made invariant
    assert _LM().mixers[0].sequence_invariant is False  # the default
    with pytest.raises(ValueError, match="expected at least one"):  # without the option: nothing to convert
        convert_to_ordered(_LM())


def test_a_language_model_gives_each_sequence_its_canonical_per_token_losses_in_random_layouts():
    torch.manual_seed(0)
    model = _LM()
    model.lm_head = InvariantLinear.from_linear(model.lm_head)
    rng = random.Random(5)
    seqs = [torch.randint(0, 61, (rng.randint(2, 50),)) for _ in range(40)]
    with torch.no_grad():
        want = [_losses(model, s[None])[0] for s in seqs]
        order = list(range(len(seqs)))
        for trial in range(3):
            rng.shuffle(order)
            i = 0
            while i < len(order):  # right-padded batches of 1 to 40 rows
                members = order[i:i + rng.choice([1, 2, 7, 40])]
                i += len(members)
                width = max(seqs[m].numel() for m in members) + rng.randint(0, 20)
                rows = torch.randint(0, 61, (len(members), width))
                for r, m in enumerate(members):
                    rows[r, :seqs[m].numel()] = seqs[m]
                got = _losses(model, rows)
                for r, m in enumerate(members):
                    assert bits_equal(got[r, :seqs[m].numel() - 1], want[m]), (trial, m)
            tokens = torch.cat([seqs[m] for m in order])[None]  # packed into one row
            seq_idx = torch.cat([torch.full((seqs[m].numel(),), j, dtype=torch.int32)
                                 for j, m in enumerate(order)])[None]
            got = _losses(model, tokens, seq_idx)[0]
            start = 0
            for m in order:
                n = seqs[m].numel()
                assert bits_equal(got[start:start + n - 1], want[m]), (trial, m)
                start += n
    assert isinstance(model.mixers[0], OrderedMamba2)


@pytest.mark.parametrize("style", ["torch", "hf"])
def test_invariant_rms_norm_rows_are_their_own_and_match_the_originals(style):
    torch.manual_seed(0)
    if style == "torch":
        original = nn.RMSNorm(48, eps=1e-5)
    else:
        from transformers.models.mamba2.modeling_mamba2 import Mamba2RMSNorm

        original = Mamba2RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        original.weight.add_(0.1 * torch.randn(48))
    norm = InvariantRMSNorm.from_module(original)
    assert norm.weight is original.weight and norm.style == style
    x = torch.randn(4000, 48) * 3
    full = norm(x)
    assert torch.allclose(full, original(x), rtol=1e-5, atol=1e-6)
    for start, rows in [(0, 1), (7, 1), (3, 5), (100, 11), (3990, 10)]:
        assert bits_equal(norm(x[start:start + rows]), full[start:start + rows]), (start, rows)
    xd = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: invariant_rms_norm(a, b, 1e-5, style=style), (xd, w))
    with pytest.raises(ValueError, match="style: expected 'torch' or 'hf'"):
        invariant_rms_norm(x, None, 1e-5, style="llama")
    with pytest.raises(TypeError, match="module: expected torch.nn.RMSNorm"):
        InvariantRMSNorm.from_module(nn.LayerNorm(4))


def test_convert_swaps_the_norms_outside_the_ordered_layers():
    model = _LM()
    convert_to_ordered(model, invariant_linears=True)
    assert all(type(n) is InvariantRMSNorm for n in model.norms) and type(model.norm_f) is InvariantRMSNorm
