"""Per-example isolation of non-finite inputs on the CUDA path (issue #17, item 5).

A NaN or inf in example 1 of a batch of 4 must leave examples 0, 2 and 3 finite and bitwise the same as in a run
where example 1 is finite: their outputs and their input gradients. The native kernels run one program per (example,
chunk, tile) in the forward and in the backward's per-position outputs, causal-conv1d's backward runs once per
example, and the projections' input gradients are row-wise GEMMs, so nothing of example 1 may reach another example;
only the parameter gradients (folds over every example) see it, and they are NaN. The CPU version is
``tests/modules/test_isolation.py``.
"""
import pytest
import torch

from ordered_ssd import OrderedMamba2
from tests.helpers import bits_equal

B, L, BAD = 4, 200, 1


def _make(dtype, use_mem_eff_path, literal):
    torch.manual_seed(0)
    layer = OrderedMamba2(d_model=256, d_state=64, headdim=64, chunk_size=64, use_mem_eff_path=use_mem_eff_path,
                          device="cuda")
    with torch.no_grad():  # move the constant initialisations so every gradient path carries signal
        for p in layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    layer.literal = literal
    return layer.to(dtype) if dtype != torch.float32 else layer


def _step(layer, u, dout, seq_idx):
    layer.zero_grad(set_to_none=True)
    x = u.clone().requires_grad_(True)
    out = layer(x, seq_idx=seq_idx)
    out.backward(dout)
    torch.cuda.synchronize()
    return out.detach(), x.grad.detach(), {n: p.grad.detach().clone() for n, p in layer.named_parameters()}


CASES = [(dtype, mem_eff, packed, False) for dtype in (torch.bfloat16, torch.float32) for mem_eff in (True, False)
         for packed in (False, True)] + [(torch.bfloat16, True, False, True)]  # and the literal backward once
IDS = [f"{str(d)[6:]}-{'memeff' if m else 'split'}-{'seq_idx' if p else 'plain'}{'-literal' if lit else ''}"
       for d, m, p, lit in CASES]


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("dtype,mem_eff,packed,literal", CASES, ids=IDS)
def test_a_non_finite_example_leaves_the_others_bitwise_unchanged(dtype, mem_eff, packed, literal, value):
    layer = _make(dtype, mem_eff, literal)
    assert layer.backend_for(torch.empty(1, device="cuda", dtype=dtype)) == "cuda"
    g = torch.Generator(device="cuda").manual_seed(1)
    u = torch.randn(B, L, 256, device="cuda", dtype=dtype, generator=g)
    dout = torch.randn(B, L, 256, device="cuda", dtype=dtype, generator=g)
    seq_idx = None
    if packed:  # two packed sequences per example, the cut inside a chunk
        seq_idx = (torch.arange(L, device="cuda") >= 90).to(torch.int32).expand(B, L).contiguous()
    out_ref, du_ref, grads_ref = _step(layer, u, dout, seq_idx)
    assert all(bool(torch.isfinite(t).all()) for t in (out_ref, du_ref, *grads_ref.values()))
    bad = u.clone()
    bad[BAD, 130, 7] = value  # mid-chunk, in the second packed sequence
    out, du, grads = _step(layer, bad, dout, seq_idx)
    for b in range(B):
        if b == BAD:
            continue
        assert bool(torch.isfinite(out[b]).all()) and bool(torch.isfinite(du[b]).all()), b
        assert bits_equal(out[b], out_ref[b]), f"output of example {b} changed"
        assert bits_equal(du[b], du_ref[b]), f"input gradient of example {b} changed"
    assert not bool(torch.isfinite(out[BAD]).all())
    for name, grad in grads.items():  # a fold over every example: NaN (also for an inf input, as on the CPU)
        assert bool(torch.isnan(grad).any()), name
