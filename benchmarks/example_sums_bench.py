#!/usr/bin/env python
"""Time :func:`ordered_ssd.fold.kernels.example_sums_kernel` (each example's sequential sum over its positions, the
first launch of :func:`ordered_ssd.fold.fold_example_sums`) at several ``UNROLL`` values and input layouts, and
check that every ``UNROLL`` gives the bits of the one the library launches (``UNROLL`` only decides how many loads
are issued before their additions, which stay in order: it must be bit-neutral).

The shapes are the ``[B, L, H]`` gradients of Mamba-3's ``dt_bias`` at the bench shapes M1-M6 and the check's
default model, plus a projection bias's ``[B, L, M]`` (``--shape B,L,M`` adds one). Per shape, modes:

* ``U<n>``: a contiguous input at ``UNROLL = n``;
* ``T-U<n>``: the same values in the layout the layer's backward produced before the fold got a contiguous input
  (``[B, L, H]`` viewed from ``[B, H, L]``: a position's heads ``L`` elements apart), at the library's ``UNROLL``;
* ``T-copy-U<n>``: that layout copied contiguous first (what :func:`~ordered_ssd.fold.fold_example_sums` does), then
  the launch.

GPU time only: before each timed launch the L2 cache is flushed (a 256 MiB write) and the GPU is kept busy
(``torch.cuda._sleep``) while the launch is enqueued, so CUDA events time the kernel, not the Python launch path;
median of ``--repeats`` interleaved launches (:func:`ordered_ssd.apps.bench.time_interleaved`). A measuring tool,
not a test::

    python benchmarks/example_sums_bench.py --unroll 16,32,64,128,256 --json sums.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

#: name -> (B, L, M): Mamba-3's dt_bias gradient at the bench shapes (M = nheads = 2 * d_model / headdim)
SHAPES = {"M1": (8, 1024, 32), "M2": (2, 4096, 64), "M3": (4, 2048, 32), "M4": (16, 1024, 64),
          "M5": (8, 2048, 32), "M6": (1, 4096, 64), "check": (8, 512, 16), "bias": (4, 2048, 2048)}


def main(argv=None) -> int:
    from ordered_ssd.apps.bench import time_interleaved
    from ordered_ssd.fold.many import _EXAMPLE_SUMS_UNROLL as LIB
    from ordered_ssd.fold.many import example_sums as launch  # the launch fold_example_sums makes, at any UNROLL

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--unroll", default="16,32,64,128,256", help="comma-separated UNROLL values (powers of two)")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--shape", action="append", default=[], metavar="B,L,M")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    unrolls = sorted({int(u) for u in args.unroll.split(",")} | {LIB})
    shapes = [(n, SHAPES[n]) for n in args.shapes.split(",") if n]
    shapes += [(s, tuple(int(v) for v in s.split(","))) for s in args.shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def before():
        flush.fill_(1)
        torch.cuda._sleep(200_000)

    rows = []
    for name, (E, L, M) in shapes:
        t = torch.randn(E, L, M, device="cuda", generator=g).to(getattr(torch, args.dtype))
        tt = t.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, a position's features L apart
        ref = launch(t, LIB)
        steps = {f"U{u}": (lambda u=u: launch(t, u)) for u in unrolls}
        steps[f"T-U{LIB}"] = lambda: launch(tt, LIB)
        steps[f"T-copy-U{LIB}"] = lambda: launch(tt.contiguous(), LIB)
        same = {m: torch.equal(f().view(torch.int32), ref.view(torch.int32)) for m, f in steps.items()}
        times = time_interleaved(lambda m: steps[m](), list(steps), args.repeats, t.device, before=before)
        row = {"shape": name, "E": E, "L": L, "M": M, "dtype": args.dtype, "library_unroll": LIB,
               "ms": {m: statistics.median(v) for m, v in times.items()}, "same_bits": same}
        rows.append(row)
        print(f"{name} [{E}, {L}, {M}] {args.dtype}: " +
              "  ".join(f"{m} {row['ms'][m]:.4f}{'' if same[m] else ' BITS DIFFER'}" for m in steps), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0 if all(all(r["same_bits"].values()) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
