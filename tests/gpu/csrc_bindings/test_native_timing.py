"""GPU: rule ``native-autotune-v1`` changes no bit. A training step of ``OrderedMamba2`` at keys inside the neutrality
proof's range with every kernel at its static choice (the timing off), then the first step with the timing on
(upstream's autotuners time the all-neutral kernels on the step's own arguments), then two steps at the timed
choices: the same SHA-256 of the output, the input gradient and every parameter gradient, and the timed kernels are
the ones the rule covers, each timed over all its candidates (upstream's autotuner caches emptied for the test,
so no native layer's earlier choice is reused), and the autotuner objects are left as they were.
"""
import pytest
import torch

from csrc_bindings import _configs
from ordered_ssd import OrderedMamba2
from ordered_ssd.digest import tensor_sha256

pytestmark = pytest.mark.native_timing  # the rule's timing is what this file tests

# (chunk_size, headdim, d_state, ngroups, dtype): keys of the proof's cases and between them
SHAPES = [(64, 32, 16, 1, torch.bfloat16), (128, 64, 64, 2, torch.float16), (256, 128, 128, 1, torch.bfloat16)]
# the kernels of a training step that the rule times (chunk_state_varlen runs only with cu_seqlens)
STEP_KERNELS = {"bmm_chunk_fwd", "bmm_chunk_bwd", "chunk_state_fwd", "chunk_scan_fwd", "chunk_scan_bwd_dstates",
                "state_passing_fwd"}


def _step(layer, u, dout, dtype):
    layer.zero_grad(set_to_none=True)
    uu = u.clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=dtype):
        out = layer(uu)
    out.backward(dout)
    digests = {"out": tensor_sha256(out.detach()), "u": tensor_sha256(uu.grad)}
    digests.update({n: tensor_sha256(p.grad) for n, p in layer.named_parameters()})
    return digests


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"cs{s[0]}-P{s[1]}-N{s[2]}-G{s[3]}-{str(s[4])[6:]}")
def test_timed_choices_give_the_static_choices_bits(shape, monkeypatch):
    chunk_size, headdim, d_state, ngroups, dtype = shape
    torch.manual_seed(0)
    layer = OrderedMamba2(d_model=256, d_state=d_state, headdim=headdim, ngroups=ngroups, chunk_size=chunk_size,
                          device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    L = 2 * chunk_size + chunk_size // 2  # a partial last chunk
    u = torch.randn(3, L, 256, device="cuda", generator=g).to(dtype)
    dout = torch.randn(3, L, 256, device="cuda", generator=g).to(dtype)
    from csrc_bindings._native import native
    from csrc_bindings._registry import KERNELS
    _configs.forget_timed()
    monkeypatch.setattr(_configs, "NATIVE_TIMING", False)
    static = _step(layer, u, dout, dtype)
    tuners = {k: native().kernels[k] for k in STEP_KERNELS}
    saved = {k: dict(t.cache) for k, t in tuners.items()}
    for t in tuners.values():
        t.cache.clear()
    try:
        assert _configs.timed_configs() == {}
        monkeypatch.setattr(_configs, "NATIVE_TIMING", True)
        first = _step(layer, u, dout, dtype)
        timed = _configs.timed_configs()
        assert {k.split("/")[2] for k in timed} == STEP_KERNELS, sorted(timed)
        counts = _configs.timing_counts()
        assert all(counts[k] == len(KERNELS[k.split("/")[2]].candidates) for k in timed), counts
        assert all(t.cache == {} for t in tuners.values())  # the autotuners are left as they were
        later = [_step(layer, u, dout, dtype) for _ in range(2)]
        assert first == static
        assert all(d == static for d in later)
        assert _configs.timed_configs() == timed  # nothing timed again
    finally:
        _configs.forget_timed()
        for k, t in tuners.items():
            t.cache.clear()
            t.cache.update(saved[k])


_DET_CHILD = r"""
import json, sys
import torch
from csrc_bindings import _configs
from csrc_bindings._native import native
from mamba_ssm.utils.determinism import use_deterministic_mode
from ordered_ssd import OrderedMamba2
sys.path.insert(0, ".")
from tests.gpu.csrc_bindings.test_native_timing import STEP_KERNELS, _step

torch.manual_seed(0)
layer = OrderedMamba2(d_model=256, d_state=64, headdim=64, ngroups=2, chunk_size=128, device="cuda")
g = torch.Generator(device="cuda").manual_seed(1)
u = torch.randn(3, 320, 256, device="cuda", generator=g).to(torch.float16)
dout = torch.randn(3, 320, 256, device="cuda", generator=g).to(torch.float16)
first = _step(layer, u, dout, torch.float16)
later = _step(layer, u, dout, torch.float16)
print(json.dumps({"det": bool(use_deterministic_mode()), "first": first, "later": later,
                  "timed": sorted(k.split("/")[2] for k in _configs.timed_configs()),
                  "counts": sorted(_configs.timing_counts().values()),
                  "live": {k: len(native().kernels[k].configs) for k in sorted(STEP_KERNELS)}}))
"""


def test_deterministic_mode_process_times_the_full_candidate_lists_with_the_same_bits():
    """In a process started with mamba-ssm's deterministic switches (``MAMBA_DETERMINISTIC=1``: its autotuners hold
    one configuration each), the rule's kernels are timed over all their candidates by the package's own
    autotuners (``_native._tuner_for``), upstream's lists stay cut to one, and a training step gives the bits of a
    process without the switches (fresh processes, SHA-256 of the output, the input gradient and every parameter
    gradient)."""
    import json
    import os
    import subprocess
    import sys

    from csrc_bindings._registry import KERNELS

    runs = {}
    for det in (True, False):
        env = {k: v for k, v in os.environ.items() if k not in ("MAMBA_DETERMINISTIC", "CAUSAL_CONV1D_DETERMINISTIC")}
        if det:
            env.update(MAMBA_DETERMINISTIC="1", CAUSAL_CONV1D_DETERMINISTIC="1")
        res = subprocess.run([sys.executable, "-c", _DET_CHILD], env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        runs[det] = json.loads(res.stdout.strip().splitlines()[-1])
    on, off = runs[True], runs[False]
    assert on["det"] is True and off["det"] is False
    assert set(on["timed"]) == STEP_KERNELS == set(off["timed"])
    assert on["counts"] == off["counts"] and min(on["counts"]) > 1  # every candidate timed, as without the switch
    assert all(n == 1 for n in on["live"].values()), on["live"]  # upstream's lists still cut to one
    assert all(off["live"][k] == len(KERNELS[k].candidates) for k in STEP_KERNELS), off["live"]
    assert on["first"] == on["later"] == off["first"] == off["later"]
