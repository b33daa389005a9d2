"""Bitwise repeatability and per-example independence of the ordered CPU gradients."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.helpers import bits_equal, grads_of, make_layer, sha256
from ordered_ssd.fold import lexical_fold
from ordered_ssd.reference import ordered_reference_mamba2_bwd
from ordered_ssd.reference.canonical import sequence_spans

REPEATS = 20
CFG = dict(d_model=32, d_state=16, headdim=16, chunk_size=16, ngroups=2, d_ssm=32, bias=True)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # the repository root


def _step(layer, u, seq_idx=None):
    layer.zero_grad(set_to_none=True)
    u = u.detach().clone().requires_grad_(True)
    out = layer(u, seq_idx=seq_idx)
    (out.float().sin().sum()).backward()
    grads = grads_of(layer)
    grads["u"] = u.grad.detach().clone()
    grads["out"] = out.detach().clone()
    return grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_bitwise_identical_over_repeats(dtype):
    layer = make_layer(seed=11, dtype=dtype, **CFG)
    torch.manual_seed(12)
    u = torch.randn(4, 37, CFG["d_model"], dtype=dtype)
    first = _step(layer, u)
    assert len(first) == len(list(layer.parameters())) + 2
    for _ in range(REPEATS - 1):
        again = _step(layer, u)
        for name, g in first.items():
            assert bits_equal(again[name], g), name


def test_gradients_identical_in_a_fresh_process():
    """The same step in a new interpreter gives the same SHA-256 of every gradient."""
    script = textwrap.dedent("""
        import json, torch
        from tests.helpers import make_layer, sha256
        from tests.modules.test_determinism import _step, CFG
        layer = make_layer(seed=11, dtype=torch.float32, **CFG)
        torch.manual_seed(12)
        u = torch.randn(4, 37, CFG["d_model"], dtype=torch.float32)
        print(json.dumps({k: sha256(v) for k, v in _step(layer, u).items()}))
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    theirs = json.loads(res.stdout.strip().splitlines()[-1])
    layer = make_layer(seed=11, dtype=torch.float32, **CFG)
    torch.manual_seed(12)
    u = torch.randn(4, 37, CFG["d_model"], dtype=torch.float32)
    ours = {k: sha256(v) for k, v in _step(layer, u).items()}
    assert ours == theirs


def test_per_sequence_partials_do_not_depend_on_the_batch():
    """Each sequence (a run of ``seq_idx`` in a row) has the input gradient and parameter partials of the sequence
    alone, and the gradient is their lexical fold in sequence order."""
    layer = make_layer(seed=21, dtype=torch.float32, **CFG)
    torch.manual_seed(22)
    Bsz, L = 5, 29
    u = torch.randn(Bsz, L, CFG["d_model"])
    dout = torch.randn(Bsz, L, CFG["d_model"])
    seq_idx = torch.sort(torch.randint(0, 3, (Bsz, L), dtype=torch.int32), dim=1).values
    params = layer.layer_params()
    du, grads, partials = ordered_reference_mamba2_bwd(dout, u, params, layer.dims, seq_idx, return_partials=True)
    spans = sequence_spans(Bsz, L, seq_idx)
    assert len(partials) == len(spans) > Bsz
    for (b, s, e), in_batch_partials in zip(spans, partials):
        du_alone, _, alone = ordered_reference_mamba2_bwd(dout[b:b + 1, s:e], u[b:b + 1, s:e], params, layer.dims,
                                                          return_partials=True)
        assert bits_equal(du_alone, du[b:b + 1, s:e])
        for name, in_batch, by_itself in zip(params._fields, in_batch_partials, alone[0]):
            if params._asdict()[name] is None:
                assert in_batch is None and by_itself is None
                continue
            assert bits_equal(in_batch, by_itself), (b, s, name)
    # The folded gradient is the lexical fold of those partials, the first sequence first.
    for i, name in enumerate(params._fields):
        if params[i] is None:
            continue
        assert bits_equal(grads[i], lexical_fold([p[i] for p in partials])), name


def test_module_gradients_equal_the_composition_functions():
    layer = make_layer(seed=31, dtype=torch.float32, **CFG)
    torch.manual_seed(32)
    u = torch.randn(3, 20, CFG["d_model"])
    dout = torch.randn(3, 20, CFG["d_model"])
    uu = u.clone().requires_grad_(True)
    layer(uu).backward(dout)
    du, grads, _ = ordered_reference_mamba2_bwd(dout, u, layer.layer_params(), layer.dims)
    assert bits_equal(uu.grad, du)
    for (name, p), g in zip(layer.layer_params()._asdict().items(), grads):
        if p is not None:
            assert bits_equal(p.grad, g), name


def test_ordered_gradients_close_to_plain_autograd():
    """Ordering changes the rounding only: compared with autograd's own sums the difference is tiny."""
    layer = make_layer(seed=41, dtype=torch.float64, **CFG)
    torch.manual_seed(42)
    u = torch.randn(3, 20, CFG["d_model"], dtype=torch.float64)
    from ordered_ssd.reference import reference_mamba2_layer
    params = [p for p in layer.layer_params() if p is not None]
    out = reference_mamba2_layer(u, layer.layer_params(), layer.dims)
    plain = torch.autograd.grad(out.float().sin().sum(), params)  # the loss of _step
    ordered = _step(layer, u)
    name_of = {id(p): n for n, p in layer.named_parameters()}
    for p, g in zip(params, plain):
        name = name_of[id(p)]
        assert torch.allclose(ordered[name], g, rtol=1e-10, atol=1e-12), name
