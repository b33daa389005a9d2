"""Under autocast the reference path (OrderedMamba2 and OrderedMamba3 on the CPU) does not autocast: it computes in
the input's dtype and gives the bits of a run without autocast, and says so once per process."""
import warnings

import pytest
import torch

from ordered_ssd import OrderedMamba2, OrderedMamba3
from ordered_ssd.reference import ordered as ordered_module
from tests.helpers import bits_equal

SIZES = dict(d_model=32, d_state=16, headdim=16, chunk_size=16)


def _step(layer, u, autocast):
    layer.zero_grad(set_to_none=True)
    x = u.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = layer(x)
    out.backward(torch.ones_like(out))
    return [out.detach(), x.grad, *(p.grad for p in layer.parameters())]


def _warnings_of(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the once-only is ordered-ssd's, not the warnings registry's
        result = fn()
    return result, [str(w.message) for w in caught if "does not autocast" in str(w.message)]


@pytest.mark.parametrize("cls", [OrderedMamba2, OrderedMamba3])
def test_cpu_autocast_keeps_the_bits_and_warns_once(monkeypatch, cls):
    monkeypatch.setattr(ordered_module, "_AUTOCAST_WARNED", False)
    torch.manual_seed(0)
    layer = cls(**SIZES)
    u = torch.randn(2, 24, SIZES["d_model"])
    plain, caught = _warnings_of(lambda: _step(layer, u, autocast=False))
    assert caught == []
    (first, second), caught = _warnings_of(lambda: (_step(layer, u, True), _step(layer, u, True)))
    assert len(caught) == 1  # two steps under autocast, one warning
    assert "'cpu' (dtype torch.bfloat16)" in caught[0] and "in the input's dtype, torch.float32" in caught[0]
    for got in (first, second):
        assert got[0].dtype == torch.float32
        assert all(bits_equal(a, b) for a, b in zip(got, plain))
    # once per process: another layer, the other class included, does not warn again
    other = (OrderedMamba3 if cls is OrderedMamba2 else OrderedMamba2)(**SIZES)
    _, caught = _warnings_of(lambda: _step(other, u, True))
    assert caught == []
