#!/usr/bin/env python
"""Time the ordered projection weight gradient against native's single GEMM, at the bench shapes' in_proj and
out_proj sizes (bf16 inputs, as under autocast).

For each shape and projection:
- ``native``: one bf16 GEMM over all ``B * L`` positions, what ``Mamba2``'s backward does (not ordered);
- ``grouped``: one fp32-output cuBLAS GEMM per example into group slots plus fold launches (the CUDA path for
  ``L >= 8192`` up to reduction version 4; still the path for fp64 and off CUDA);
- ``fused``: :func:`ordered_ssd.fold.fold_example_gemms`, one launch;
- ``fused@S`` (``--segments``): the same with ``GEMM_FOLD_SEGMENT_L = S`` (other bits where ``L > S``; for
  choosing the setting);
- ``--variants``: every launch variant of ``GEMM_FOLD_VARIANTS`` that fits (the static chain first), launched
  directly, untimed by the rule, with a check that each gives the static chain's bits.

GPU ms by CUDA events (median, interleaved, :func:`ordered_ssd.apps.bench.time_interleaved`), host ms to enqueue.
It also checks the fused result's bits against a :class:`~ordered_ssd.fold.LexicalFold` over its own
single-segment results (per-segment independence) and reports the error of both ordered paths against an fp64
reference. A measuring tool, not a test.

    python benchmarks/linear_grad_bench.py --shapes S1,S2,S3,S4,S5 --repeats 20 --out results.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from ordered_ssd.apps.bench import named_or_parsed_shape, time_interleaved  # noqa: E402
import ordered_ssd.fold as fold_mod  # noqa: E402
from ordered_ssd.fold import settings as fold_settings  # noqa: E402
from ordered_ssd.fold import LexicalFold, fold_example_gemms  # noqa: E402
from ordered_ssd.fold import fold_example_gemms_grouped  # noqa: E402


def projections(shape):
    """``(name, E, L, M, N)``: the weight gradient is ``[M, N]`` from ``dy [E, L, M]`` and ``x [E, L, N]``."""
    d_inner = 2 * shape.d_model
    d_in_proj = 2 * d_inner + 2 * shape.G * shape.N + shape.nheads
    return [("in_proj", shape.B, shape.L, d_in_proj, shape.d_model),
            ("out_proj", shape.B, shape.L, shape.d_model, d_inner)]


def _patched(patch):
    """``fold_example_gemms(dy, x)`` under ``patch`` (a ``unittest.mock`` patch of a fold setting; for choosing it)."""
    def run(dy, x):
        with patch:
            return fold_example_gemms(dy, x)
    return run


def _variant_steps(dy, x, steps):
    """Add a step per variant of ``GEMM_FOLD_VARIANTS`` (the static chain first; ``partials`` where all its
    partials fit the workspace; the TMA kinds where both operands allow TMA) to ``steps``; returns
    ``{name: its output}``."""
    from csrc_bindings import _resources
    from ordered_ssd.fold import gemm, kernels

    E, L, M = dy.shape
    N = x.shape[2]
    static = ("chain", fold_settings.gemm_fold_config(dy.dtype, _resources.shared_memory_limit(dy.device)))
    nseg = fold_settings.gemm_fold_segments(L)
    segments = (E * nseg, nseg, fold_settings.GEMM_FOLD_SEGMENT_L)
    outs = {}
    for v in [static] + list(fold_settings.GEMM_FOLD_VARIANTS[1:]):
        if v[0] == "partials" and 4 * M * N * E * nseg > fold_settings.GEMM_FOLD_WORKSPACE_BYTES:
            continue
        if v[0].startswith("tma") and not (gemm.tma_ready(dy) and gemm.tma_ready(x)):
            continue
        name = f"{v[0]} " + "x".join(map(str, v[1]))
        out = outs[name] = torch.empty(M, N, dtype=torch.float32, device=dy.device)
        steps[name] = (lambda v, out: lambda: gemm._launch_gemm_variant(kernels, v, dy, x, out, False, out, segments,
                                                                        None))(v, out)
    return outs


def bench_one(E, L, M, N, repeats, device, check, configs=(), segments=(), variants=False):
    g = torch.Generator(device=device).manual_seed(0)
    dy = torch.randn(E, L, M, device=device, generator=g).to(torch.bfloat16)
    x = torch.randn(E, L, N, device=device, generator=g).to(torch.bfloat16)
    dy2, x2 = dy.view(-1, M), x.view(-1, N)
    steps = {
        "native": lambda: torch.mm(dy2.t(), x2),
        "grouped": lambda: fold_example_gemms_grouped(dy, x, torch.float32),
        "fused": lambda: fold_example_gemms(dy, x),
    }
    for cfg in configs:
        patch = mock.patch.dict(fold_mod.GEMM_FOLD_CONFIGS, {torch.bfloat16: cfg})  # another bf16 configuration
        steps["fused" + "x".join(map(str, cfg))] = (lambda f: (lambda: f(dy, x)))(_patched(patch))
    for seg in segments:
        patch = mock.patch.object(fold_settings, "GEMM_FOLD_SEGMENT_L", seg)
        steps[f"fused@{seg}"] = (lambda f: (lambda: f(dy, x)))(_patched(patch))
    outs = _variant_steps(dy, x, steps) if variants else {}
    for f in steps.values():  # warm-up (compilation)
        for _ in range(3):
            f()
    bits = {}
    if outs:
        first = next(iter(outs.values()))  # the static chain's
        bits = {m: torch.equal(o.view(torch.int32), first.view(torch.int32)) for m, o in outs.items()}
    host = {}
    times = time_interleaved(lambda m: steps[m](), list(steps), repeats, device, host=host)
    res = {m: {"ms": statistics.median(times[m]), "host_ms": statistics.median(host[m])} for m in steps}
    res["configs_ms"] = {m: res[m]["ms"] for m in steps if m.startswith("fused")}
    res["variants"] = {m: {"ms": res[m]["ms"], "bits_of_static": bits[m]} for m in outs}
    res["timed_choices"] = {str(k): list(v) for k, v in fold_mod.gemm_fold_timed_choices().items()
                            if k[2:6] == (E, L, M, N)}
    res["fused_vs_grouped"] = res["fused"]["ms"] / res["grouped"]["ms"]
    res["fused_vs_native"] = res["fused"]["ms"] / res["native"]["ms"]
    if check:
        fused = fold_example_gemms(dy, x)
        fold = LexicalFold(torch.float32)
        seg = fold_settings.GEMM_FOLD_SEGMENT_L
        for e in range(E):
            for s0 in range(0, max(L, 1), seg):
                fold.add(fold_example_gemms(dy[e:e + 1, s0:s0 + seg], x[e:e + 1, s0:s0 + seg]))
        res["fused_equals_fold_of_single_segments"] = torch.equal(fused, fold.result())
        ref = torch.mm(dy2.t().double(), x2.double())
        scale = ref.abs().max().item()
        res["fused_max_rel_err"] = (fused.double() - ref).abs().max().item() / scale
        res["grouped_max_rel_err"] = (steps["grouped"]().double() - ref).abs().max().item() / scale
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="S1,S2,S3,S4,S5", help="names, ','-separated; ';'-separated when a shape is "
                    "given as B,L,d_model,d_state,ngroups,headdim,chunk_size")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-check", action="store_true", help="skip the bit and error checks")
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    ap.add_argument("--segments", default="", help="more GEMM_FOLD_SEGMENT_L values to time, ','-separated")
    ap.add_argument("--configs", default="", help="more bf16 launch configurations to time, ';'-separated "
                    "BM,BN,BK,GROUP_M,num_warps,num_stages")
    ap.add_argument("--variants", action="store_true", help="time every variant of GEMM_FOLD_VARIANTS directly and "
                    "check it gives the static chain's bits")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("linear_grad_bench.py: needs CUDA")
    device = torch.device("cuda")
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";") if c.strip()]
    segments = [int(v) for v in args.segments.split(",") if v.strip()]
    results = {}
    print("| shape | proj | E x L | M x N | native ms | grouped ms | fused ms | fused/grouped | fused/native | "
          "host ms grouped / fused | bits | rel err fused / grouped |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|---|---|")
    for name in args.shapes.split(";" if ";" in args.shapes else ","):
        shape = named_or_parsed_shape(name)
        for proj, E, L, M, N in projections(shape):
            r = bench_one(E, L, M, N, args.repeats, device, not args.no_check, configs, segments, args.variants)
            results[f"{shape.name}/{proj}"] = r
            torch.cuda.empty_cache()
            print(f"| {shape.name} | {proj} | {E} x {L} | {M} x {N} | {r['native']['ms']:.3f} | "
                  f"{r['grouped']['ms']:.3f} | {r['fused']['ms']:.3f} | {r['fused_vs_grouped']:.2f} | "
                  f"{r['fused_vs_native']:.2f} | {r['grouped']['host_ms']:.2f} / {r['fused']['host_ms']:.2f} | "
                  f"{r.get('fused_equals_fold_of_single_segments', '-')} | "
                  f"{r.get('fused_max_rel_err', float('nan')):.1e} / "
                  f"{r.get('grouped_max_rel_err', float('nan')):.1e} |",
                  flush=True)
            if configs or segments:
                print("  configs ms: " + ", ".join(f"{k} {v:.3f}" for k, v in r["configs_ms"].items()), flush=True)
            if r["variants"]:
                print("  variants ms (bits of the static chain): " + ", ".join(
                    f"{k} {v['ms']:.3f} ({v['bits_of_static']})" for k, v in r["variants"].items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
