"""GPU: a layer of headdim 512 (d_model 1024, expand 2: 4 heads; d_state 128, chunk_size 256) runs on the H200.

In fp32, ``chunk_state_bwd_db`` and ``chunk_scan_bwd_dC`` (262,400 bytes) and ``chunk_scan_bwd_dcb`` (262,144) at
their pinned configuration (rule ``mincost-v1``, 3 stages) ask more shared memory per program than the H200's
232,448 (compiled offline for sm_90 on the example problems; Triton raised ``OutOfResources`` in the backward
before ``fit-stages-v1``); the rule runs them at 2 stages (about 131 KB). Only kernels that hold a whole
``[*, headdim]`` tile (``BLOCK_SIZE_K = 512``) may be lowered, and only to 2 stages.
In bf16 every kernel fits as pinned. Checked: the step runs, its outputs and gradients are finite, repeat bit for
bit, and (fp32) match the fp64 reference.
"""
import pytest
import torch

from ordered_ssd import OrderedMamba2
from tests.helpers import bits_equal, layer_step, rel_err

#: the kernels whose BLOCK_SIZE_K is next_pow2(headdim) (one [*, headdim] tile per pipeline buffer)
WIDE_K = {"chunk_state_bwd_db", "chunk_scan_bwd_dC", "chunk_scan_bwd_dcb", "chunk_scan_bwd_ddAcs_stable"}
SHAPE = {"d_model": 1024, "headdim": 512, "d_state": 128, "expand": 2, "chunk_size": 256}


def _layer(dtype):
    torch.manual_seed(0)
    layer = OrderedMamba2(**SHAPE, device="cuda")
    with torch.no_grad():  # move the constant initialisations so every gradient path carries signal
        for p in layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return layer.to(dtype)


def _inputs(dtype, B=2, L=512):
    g = torch.Generator(device="cuda").manual_seed(1)
    u = torch.randn(B, L, SHAPE["d_model"], device="cuda", generator=g).to(dtype)
    dout = torch.randn(B, L, SHAPE["d_model"], device="cuda", generator=g).to(dtype)
    return u, dout


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_headdim_512_layer_steps_and_repeats(dtype, monkeypatch):
    from csrc_bindings import _resources

    monkeypatch.setattr(_resources, "_verdicts", {})  # this test's launches only
    layer = _layer(dtype)
    assert layer.nheads == 4
    u, dout = _inputs(dtype)
    first = layer_step(layer, u, dout)
    for name, t in first.items():
        assert bool(torch.isfinite(t.float()).all()), name
    again = layer_step(layer, u, dout)
    for name in first:
        assert bits_equal(again[name], first[name]), name
    # the verdict cache: (kernel, config items, explicit, device, ...) -> num_stages launched
    lowered = {key[0]: stages for key, stages in _resources._verdicts.items()
               if stages != dict(key[1])["num_stages"]}
    if dtype == torch.float32:
        assert lowered, "expected the headdim-wide kernels (262,400 bytes at 3 stages) to run at fewer stages"
        assert set(lowered) <= WIDE_K and set(lowered.values()) == {2}, lowered
        ref_layer = OrderedMamba2(**SHAPE, device="cpu", dtype=torch.float64)
        ref_layer.load_state_dict({k: v.double().cpu() for k, v in layer.state_dict().items()})
        ref = layer_step(ref_layer, u.double().cpu(), dout.double().cpu())
        for name, r in ref.items():  # the kernels' fp32 dots run in TF32
            assert rel_err(first[name].double().cpu(), r) < 3e-2, name


def test_a_device_with_less_shared_memory_gets_the_clear_error(monkeypatch):
    """With the limit faked below what even one stage of the headdim-wide kernels needs at headdim 512 (131,072
    bytes in fp32; the rule reads the faked limit once Triton refuses their pinned 3 stages), the step raises
    ``ValueError`` naming the bytes, the limit and headdim=512."""
    from csrc_bindings import _resources

    monkeypatch.setattr(_resources, "_verdicts", {})
    monkeypatch.setattr(_resources, "shared_memory_limit", lambda device: 120000)
    layer = _layer(torch.float32)
    u, dout = _inputs(torch.float32, B=1, L=256)
    with pytest.raises(ValueError) as err:
        layer_step(layer, u, dout)
    msg = str(err.value)
    assert "bytes of shared memory per program, more than the 120000 bytes" in msg
    assert "headdim=512" in msg and "fewer stages do not fit either" in msg
