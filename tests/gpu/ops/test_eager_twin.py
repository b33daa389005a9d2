"""GPU: the eager twin of each custom op (an ``autograd.Function`` of the same bodies, applied in plain eager mode;
``ordered_ssd.ops.common``) gives the custom op's bits: a training step of two layers (forward output, input
gradient, every parameter gradient) is the same, bit for bit, through the twins and through the custom ops, for
the fused and the unfused layer paths, the gated-MLP branch, ``seq_idx``, bf16 and fp32, and under autocast."""
import pytest
import torch

from ordered_ssd.ops import common
from tests.gpu.modules.test_compile import COMPILE_CASES, COMPILE_IDS, TwoLayers, _assert_bits, _inputs, _seq_idx
from tests.gpu.modules.test_compile import _step


def _both(model, u, dout, seq_idx, monkeypatch):
    twin = _step(model, model, u, dout, seq_idx)
    with monkeypatch.context() as m:
        m.setattr(common, "plain_eager", lambda args: False)
        op = _step(model, model, u, dout, seq_idx)
    return twin, op


@pytest.mark.parametrize("dtype,extra", COMPILE_CASES, ids=COMPILE_IDS)
@pytest.mark.parametrize("packed", [False, True], ids=["no-seq_idx", "seq_idx"])
def test_twin_and_custom_op_give_the_same_bits(dtype, extra, packed, monkeypatch):
    model = TwoLayers(dtype, **extra)
    u, dout = _inputs(dtype)
    twin, op = _both(model, u, dout, _seq_idx() if packed else None, monkeypatch)
    assert len(twin) == len(list(model.parameters())) + 2
    assert all(torch.isfinite(t.float()).all() for t in twin.values())
    _assert_bits(twin, op, "twin against custom op")


def test_twin_and_custom_op_under_autocast(monkeypatch):
    model = TwoLayers(torch.float32)
    u, dout = _inputs(torch.float32)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        twin, op = _both(model, u, dout.bfloat16(), None, monkeypatch)
    assert twin["out"].dtype == torch.bfloat16 and twin["a.in_proj.weight"].dtype == torch.float32
    _assert_bits(twin, op, "twin against custom op under autocast")
