"""What sequence invariance costs on CUDA: one layer's training step (forward + backward) with mamba-ssm's ``Mamba2``
(``native``), ``OrderedMamba2`` (``ordered``, the default) and ``OrderedMamba2`` with ``sequence_invariant = True``
(``invariant``), on a batch of rows and on the same kind of tokens packed into one row (``seq_idx``, sequences of
random lengths), plus the projections' GEMMs alone (cuBLAS's ``F.linear`` against the row-invariant GEMM).

fp32 parameters under ``torch.autocast("cuda", dtype=torch.bfloat16)`` (as ``ordered-ssd bench``); every mode
timed interleaved in this process (median of ``--repeats`` steps after ``--warmup``), peak memory per mode from
``torch.cuda.max_memory_allocated`` around one step. The packed ``invariant`` step moves each sequence to its own
row (``ordered_ssd.modules._layout``), so its tokens include the rows' padding to the longest sequence.

    python benchmarks/invariance_cost.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys

import torch
import torch.nn.functional as F


def _interleaved(fns: dict, repeats: int, warmup: int) -> dict:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times[k].append(a.elapsed_time(b))
    return {k: statistics.median(v) for k, v in times.items()}


def _peak_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--headdim", type=int, default=64)
    p.add_argument("--d-state", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seqlen", type=int, default=2048)
    p.add_argument("--pack-len", type=int, default=16384)
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import csrc_bindings
    from ordered_ssd import OrderedMamba2
    from ordered_ssd.ops.row_invariant_gemm import row_invariant_linear, row_invariant_matmul

    dev = torch.device("cuda")
    kw = dict(d_model=args.d_model, d_state=args.d_state, headdim=args.headdim, chunk_size=args.chunk_size,
              device=dev)
    torch.manual_seed(args.seed)
    ordered = OrderedMamba2(**kw)
    native = csrc_bindings.mamba2_class()(**kw)
    native.load_state_dict(ordered.state_dict())
    g = torch.Generator(device=dev).manual_seed(args.seed + 1)

    def step_fn(layer, invariant, u, dout, seq_idx=None):
        def run():
            if layer is ordered:
                layer.sequence_invariant = invariant
            layer.zero_grad(set_to_none=True)
            uu = u.detach().requires_grad_(True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = layer(uu, seq_idx=seq_idx) if seq_idx is not None else layer(uu)
            out.backward(dout)
        return run

    results = {"args": vars(args), "device": torch.cuda.get_device_name(), "layouts": {}, "gemm": {}}
    rng = random.Random(args.seed)
    lengths, total = [], 0
    while total < args.pack_len:
        n = min(rng.randint(args.min_len, args.max_len), args.pack_len - total)
        lengths.append(n)
        total += n
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32),
                                      torch.tensor(lengths)).to(dev)[None]
    layouts = {
        f"batched B={args.batch} L={args.seqlen}": ((args.batch, args.seqlen), None),
        f"packed 1 x {args.pack_len} ({len(lengths)} sequences of {args.min_len}-{args.max_len})":
            ((1, args.pack_len), seq_idx),
    }
    for name, ((B, L), sidx) in layouts.items():
        u = torch.randn(B, L, args.d_model, device=dev, generator=g).to(torch.bfloat16)
        dout = torch.randn(B, L, args.d_model, device=dev, generator=g).to(torch.bfloat16)
        fns = {"native": step_fn(native, False, u, dout, sidx), "ordered": step_fn(ordered, False, u, dout, sidx),
               "invariant": step_fn(ordered, True, u, dout, sidx)}
        ms = _interleaved(fns, args.repeats, args.warmup)
        mem = {k: _peak_mib(fn) for k, fn in fns.items()}
        row = {k: {"ms": ms[k], "peak_mib": mem[k], "ratio_ms": ms[k] / ms["native"],
                   "ratio_mem": mem[k] / mem["native"]} for k in fns}
        results["layouts"][name] = row
        for k, r in row.items():
            print(f"{name:>60} {k:>10}: {r['ms']:8.3f} ms ({r['ratio_ms']:.3f}x native), peak {r['peak_mib']:8.1f} MiB "
                  f"({r['ratio_mem']:.3f}x)")
    ordered.sequence_invariant = False
    M = args.batch * args.seqlen
    for name, (K, N) in {"in_proj": (args.d_model, ordered.in_proj.weight.shape[0]),
                         "out_proj": (ordered.out_proj.weight.shape[1], args.d_model)}.items():
        x = torch.randn(M, K, device=dev, generator=g).to(torch.bfloat16)
        w = (torch.randn(N, K, device=dev, generator=g) / K ** 0.5).to(torch.bfloat16)
        dy = torch.randn(M, N, device=dev, generator=g).to(torch.bfloat16)
        ms = _interleaved({"cublas y": lambda: F.linear(x, w), "invariant y": lambda: row_invariant_linear(x, w),
                           "cublas dx": lambda: F.linear(dy, w.t()),
                           "invariant dx": lambda: row_invariant_matmul(dy, w)}, args.repeats, args.warmup)
        flops = 2 * M * K * N
        results["gemm"][name] = {k: {"ms": v, "tflops": flops / v / 1e9} for k, v in ms.items()}
        for k, v in ms.items():
            print(f"{name:>10} [{M} x {K}] x [{K} x {N}] {k:>13}: {v:7.3f} ms ({flops / v / 1e9:6.1f} TFLOP/s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
