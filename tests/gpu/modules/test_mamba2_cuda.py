"""The native ordered path of OrderedMamba2 on the GPU: bits, literal mode, accuracy, no global state."""
import collections
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.helpers import bits_equal, layer_step, rel_err, sha256

from ordered_ssd import OrderedMamba2

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository root
REPEATS = 100

# A grid that covers every value of each axis at least once (the full product would take hours to compile).
GRID = [
    # d_model, headdim, d_state, ngroups, chunk, L, dtype, extra options
    (256, 64, 64, 1, 64, 200, torch.bfloat16, {}),
    (256, 32, 16, 2, 64, 63, torch.float16, dict(D_has_hdim=True)),
    (256, 32, 128, 8, 128, 129, torch.float32, dict(rmsnorm=False)),
    (1024, 128, 256, 2, 256, 2048, torch.bfloat16, dict(norm_before_gate=True)),
    (1024, 64, 128, 1, 128, 1, torch.bfloat16, dict(bias=True)),
    (256, 32, 64, 2, 64, 4, torch.bfloat16, dict(conv_bias=False, dt_limit=(0.001, 0.05))),
    (2048, 128, 128, 8, 256, 3 * 256, torch.bfloat16, dict(d_ssm=2048)),  # 16 heads of 128, d_mlp = 2048
    (192, 32, 64, 2, 128, 255, torch.float16, dict(d_ssm=320)),  # nheads = 10, not a multiple of 8
    (256, 64, 64, 1, 64, 200, torch.bfloat16, dict(use_mem_eff_path=False)),
    # d_in_proj = 1034, not a multiple of 8 (channel-last conv view needs a copy); gated MLP, z gate, bias
    (192, 32, 64, 2, 64, 100, torch.bfloat16, dict(use_mem_eff_path=False, d_ssm=320, rmsnorm=False, bias=True)),
]
IDS = [f"d{g[0]}-p{g[1]}-n{g[2]}-g{g[3]}-cs{g[4]}-L{g[5]}-{str(g[6])[6:]}-{'-'.join(g[7]) or 'default'}" for g in GRID]


def _make(d_model, headdim, d_state, ngroups, chunk, dtype, extra, seed=0):
    torch.manual_seed(seed)
    layer = OrderedMamba2(d_model=d_model, d_state=d_state, headdim=headdim, ngroups=ngroups, chunk_size=chunk,
                          device="cuda", **extra)
    with torch.no_grad():  # move the constant initialisations so every gradient path carries signal
        for p in layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return layer.to(dtype) if dtype != torch.float32 else layer


def _inputs(layer, B, L, dtype, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    u = torch.randn(B, L, layer.d_model, device="cuda", dtype=dtype, generator=g)
    dout = torch.randn(B, L, layer.d_model, device="cuda", dtype=dtype, generator=g)
    return u, dout


@pytest.mark.native_timing
@pytest.mark.parametrize("cfg", GRID, ids=IDS)
def test_cuda_path_bitwise_repeatable_and_equal_to_literal(cfg):
    d_model, headdim, d_state, ngroups, chunk, L, dtype, extra = cfg
    layer = _make(d_model, headdim, d_state, ngroups, chunk, dtype, extra)
    assert layer.backend_for(torch.empty(1, device="cuda")) == "cuda"
    B = 2 if L >= 1024 else 3
    u, dout = _inputs(layer, B, L, dtype)
    first = layer_step(layer, u, dout)
    assert len(first) == len(list(layer.parameters())) + 2
    for name, t in first.items():
        assert torch.isfinite(t.float()).all(), name
    for _ in range(REPEATS - 1):
        again = layer_step(layer, u, dout)
        for name in first:
            assert bits_equal(again[name], first[name]), name
    layer.literal = True
    lit = layer_step(layer, u, dout)
    for name in first:
        assert bits_equal(lit[name], first[name]), ("literal", name)


def _fp64_reference(layer, u, dout):
    ref = OrderedMamba2(d_model=layer.d_model, d_state=layer.d_state, headdim=layer.headdim, ngroups=layer.ngroups,
                        chunk_size=layer.chunk_size, d_ssm=layer.d_ssm, D_has_hdim=layer.D_has_hdim,
                        rmsnorm=layer.rmsnorm, norm_before_gate=layer.norm_before_gate, dt_limit=layer.dt_limit,
                        bias=layer.in_proj.bias is not None, conv_bias=layer.conv1d.bias is not None,
                        device="cpu", dtype=torch.float64)
    ref.load_state_dict({k: v.double().cpu() for k, v in layer.state_dict().items()})
    return layer_step(ref, u.double().cpu(), dout.double().cpu())


@pytest.mark.parametrize("cfg", [GRID[0], GRID[2]], ids=[IDS[0], IDS[2]])
def test_accuracy_against_fp64_is_within_twice_native(cfg):
    from mamba_ssm.modules.mamba2 import Mamba2

    d_model, headdim, d_state, ngroups, chunk, L, dtype, extra = cfg
    ours = _make(d_model, headdim, d_state, ngroups, chunk, dtype, extra)
    native = Mamba2(d_model=d_model, d_state=d_state, headdim=headdim, ngroups=ngroups, chunk_size=chunk,
                    device="cuda", **extra).to(dtype)
    native.load_state_dict(ours.state_dict(), strict=True)
    u, dout = _inputs(ours, 2, L, dtype)
    ref = _fp64_reference(ours, u, dout)
    got_o, got_n = layer_step(ours, u, dout), layer_step(native, u, dout)
    floor = 1e-5 if dtype == torch.float32 else 2e-3
    for name, r in ref.items():
        e_o = rel_err(got_o[name].double().cpu(), r)
        e_n = rel_err(got_n[name].double().cpu(), r)
        assert e_o <= 2 * e_n + floor, (name, e_o, e_n)


def test_autocast_bf16_and_deterministic_algorithms():
    layer = _make(256, 64, 64, 1, 64, torch.float32, {})
    u, dout = _inputs(layer, 2, 150, torch.float32)
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        results = []
        for _ in range(5):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                results.append(layer_step(layer, u, dout))
    finally:
        torch.use_deterministic_algorithms(prev)
    assert results[0]["out"].dtype == torch.bfloat16
    assert results[0]["in_proj.weight"].dtype == torch.float32
    for r in results[1:]:
        for name in r:
            assert bits_equal(r[name], results[0][name]), name


@pytest.mark.parametrize("mem_eff", [True, False])
def test_autocast_casts_each_projection_weight_once_per_step(mem_eff):
    """Under bf16 autocast with fp32 parameters, a training step casts ``in_proj.weight`` and ``out_proj.weight``
    once each (the forward's casts are kept for the backward, as native autocast keeps its own), on the fused
    path (out_proj inside ``mamba_split_conv1d_scan_combined``) and the unfused one; the bits are those of the
    step that cast again (``tests/gpu/modules/test_layer_digests.py``, ``cuda-fp32-autocast-bf16-bias``)."""
    from torch.profiler import ProfilerActivity, profile

    layer = _make(256, 64, 64, 1, 64, torch.float32, dict(use_mem_eff_path=mem_eff))
    u, dout = _inputs(layer, 2, 150, torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        layer_step(layer, u, dout)  # warm-up (compiles, plans)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            layer_step(layer, u, dout)
    shapes = [list(e.input_shapes[0]) for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes]
    for name in ("in_proj.weight", "out_proj.weight"):
        shape = list(dict(layer.named_parameters())[name].shape)
        assert shapes.count(shape) == 1, (name, shape, shapes)


def _kernel_snapshot():
    import mamba_ssm.ops.triton.layernorm_gated as lg
    import mamba_ssm.ops.triton.ssd_bmm as sb
    import mamba_ssm.ops.triton.ssd_chunk_scan as sc
    import mamba_ssm.ops.triton.ssd_chunk_state as cs
    import mamba_ssm.ops.triton.ssd_combined as co
    import mamba_ssm.ops.triton.ssd_state_passing as sp

    snap = {}
    for mod in (lg, sb, sc, cs, co, sp):
        for name, obj in sorted(vars(mod).items()):
            key = f"{mod.__name__}.{name}"
            snap[key] = id(obj)
            if hasattr(obj, "configs") and hasattr(obj, "cache"):
                snap[key + ".configs"] = [str(c) for c in obj.configs]
                snap[key + ".cache"] = dict(obj.cache)
                snap[key + ".hooks"] = (id(getattr(obj, "pre_hook", None)), id(getattr(obj, "post_hook", None)))
    snap["env"] = {k: v for k, v in os.environ.items() if k.startswith(("MAMBA_", "CAUSAL_CONV1D_", "TRITON_"))}
    snap["deterministic"] = torch.are_deterministic_algorithms_enabled()
    return snap


@pytest.mark.native_timing  # the timing goes through upstream's autotuners: they must be left as they were
def test_training_leaves_native_modules_untouched():
    import causal_conv1d.cpp_functions as ccf

    before = _kernel_snapshot()
    conv_before = {k: id(v) for k, v in vars(ccf).items()}
    layer = _make(256, 64, 64, 1, 64, torch.bfloat16, {})
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    u, dout = _inputs(layer, 2, 130, torch.bfloat16)
    for _ in range(3):
        opt.zero_grad()
        layer(u).backward(dout)
        opt.step()
    assert _kernel_snapshot() == before
    assert {k: id(v) for k, v in vars(ccf).items()} == conv_before


def test_bits_equal_in_two_fresh_processes(tmp_path):
    script = textwrap.dedent("""
        import json, torch
        from tests.gpu.modules.test_mamba2_cuda import _make, _inputs, GRID
        from tests.helpers import layer_step, sha256
        d_model, headdim, d_state, ngroups, chunk, L, dtype, extra = GRID[0]
        layer = _make(d_model, headdim, d_state, ngroups, chunk, dtype, extra)
        u, dout = _inputs(layer, 3, L, dtype)
        print(json.dumps({k: sha256(v) for k, v in layer_step(layer, u, dout).items()}))
    """)
    digests = []
    for i in range(2):
        env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / f"triton-{i}"),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        digests.append(json.loads(res.stdout.strip().splitlines()[-1]))
    assert digests[0] == digests[1]
    d_model, headdim, d_state, ngroups, chunk, L, dtype, extra = GRID[0]
    layer = _make(d_model, headdim, d_state, ngroups, chunk, dtype, extra)
    u, dout = _inputs(layer, 3, L, dtype)
    here = {k: sha256(v) for k, v in layer_step(layer, u, dout).items()}
    assert here == digests[0]
    print("fresh-process digest of in_proj.weight grad:", hashlib.sha256(json.dumps(here, sort_keys=True).encode()).hexdigest()[:16])


@pytest.mark.parametrize("mem_eff", [True, False])
def test_seq_idx_packed_sequences(mem_eff):
    """Packed sequences: bits repeat, literal equals fast, and the result matches the fp64 reference (which
    resets the conv and the state at every change of id) as closely as native Mamba2 does."""
    from mamba_ssm.modules.mamba2 import Mamba2

    extra = dict(use_mem_eff_path=mem_eff)
    layer = _make(256, 64, 64, 1, 64, torch.bfloat16, extra)
    u, dout = _inputs(layer, 2, 200, torch.bfloat16)
    seq_idx = torch.zeros(2, 200, dtype=torch.int32, device="cuda")
    seq_idx[0, 70:] = 1
    seq_idx[0, 150:] = 2
    seq_idx[1, 128:] = 1  # a boundary on a chunk boundary

    def step(m, x, d, s):
        m.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_(True)
        out = m(xx, seq_idx=s)
        out.backward(d)
        return {"out": out.detach(), "u": xx.grad.detach(), **{n: p.grad.detach() for n, p in m.named_parameters()}}

    first = step(layer, u, dout, seq_idx)
    for _ in range(20):
        again = step(layer, u, dout, seq_idx)
        assert all(bits_equal(again[k], first[k]) for k in first)
    layer.literal = True
    lit = step(layer, u, dout, seq_idx)
    layer.literal = False
    assert all(bits_equal(lit[k], first[k]) for k in first)

    native = Mamba2(d_model=256, d_state=64, headdim=64, chunk_size=64, device="cuda", **extra).to(torch.bfloat16)
    native.load_state_dict(layer.state_dict())
    got_n = step(native, u, dout, seq_idx)
    ref_layer = OrderedMamba2(d_model=256, d_state=64, headdim=64, chunk_size=64, dtype=torch.float64)
    ref_layer.load_state_dict({k: v.double().cpu() for k, v in layer.state_dict().items()})
    ref = step(ref_layer, u.double().cpu(), dout.double().cpu(), seq_idx.cpu())
    for name, r in ref.items():
        e_o = rel_err(first[name].double().cpu(), r)
        e_n = rel_err(got_n[name].double().cpu(), r)
        assert e_o <= 2 * e_n + 2e-3, (name, e_o, e_n)


@pytest.mark.parametrize("packed", [False, True])
def test_training_step_launch_count_does_not_depend_on_the_batch(packed):
    """One forward and backward of the layer launches the same CUDA kernels and copies at ``B`` = 1 as at ``B`` = 3,
    with sequences of two projection-fold segments (``GEMM_FOLD_SEGMENT_L + 100`` positions; reduction version 5)
    and, with ``seq_idx``, more packed sequences in the larger batch. cuBLAS's GEMMs (the projections' forward and
    input gradients, as native's) count as one name: cuBLAS picks its kernel by the problem size, and some of its
    kernels clear a workspace first, so its memsets are left out (on the H200: 65 launches at B = 1, 66 at 2, 68 at
    3 and 5, the differences all cuBLAS kernel names and memsets). The literal mode's count grows with ``B`` (so the
    counter does see per-example launches)."""
    from torch.profiler import ProfilerActivity, profile

    from ordered_ssd.apps.bench.breakdown import kernel_category
    from ordered_ssd.fold import GEMM_FOLD_SEGMENT_L

    layer = _make(256, 64, 64, 1, 64, torch.bfloat16, {})
    L = GEMM_FOLD_SEGMENT_L + 100

    def count(B, literal=False):
        u, dout = _inputs(layer, B, L, torch.bfloat16)
        seq_idx = None
        if packed:  # sequences of 700 positions at B = 1, of 301 at B = 3
            pos = torch.arange(L, device="cuda", dtype=torch.int32)
            seq_idx = (pos // (700 if B == 1 else 301)).expand(B, L).contiguous()

        def step():
            layer.zero_grad(set_to_none=True)
            uu = u.clone().requires_grad_(True)
            layer(uu, seq_idx=seq_idx).backward(dout)

        layer.literal = literal
        try:
            step()  # compile and warm up outside the count
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
        finally:
            layer.literal = False
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return collections.Counter("cuBLAS GEMM" if kernel_category(n) == "GEMM (cuBLAS)" else n
                                   for n in names if n != "Memset (Device)")

    counts = {B: count(B) for B in (1, 3)}
    assert counts[1] == counts[3] and sum(counts[1].values()) > 20, (counts[3] - counts[1], counts[1] - counts[3])
    literal = {B: sum(count(B, literal=True).values()) for B in (1, 3)}
    assert literal[3] > literal[1], literal
