"""Where the host time of one layer step goes: ``cProfile`` over training steps of one bench shape.

Launch-bound shapes (small ``L``, large ``B``) run at the speed of the Python and launch path, not the GPU; the
per-kernel breakdown of ``ordered-ssd bench --breakdown`` cannot see that. This tool times ``steps`` steps of each
mode asked for with the bench's own timing (:func:`ordered_ssd.apps.bench.timing.time_interleaved`: host time to
enqueue a step, GPU time between CUDA events, no synchronisation between steps), then prints the functions with the
largest own (``tottime``) and cumulative host time over another ``steps`` steps under ``cProfile``.

    python -m ordered_ssd.apps.bench.host_profile --shape S5 --modes ordered,native --steps 20 --out prof/

Uses the bench's ``LayerRunner`` (fp32 parameters; on CUDA ``u``/``dout`` and autocast in the shape's dtype, bf16
unless the shape says fp16; fp32 on the CPU). A measuring tool, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys

import torch

from .runner import LayerRunner
from .shapes import named_or_parsed_shape, parse_modes
from .timing import time_interleaved


def profile_mode(runner, mode, steps, top):
    cuda = runner.cuda
    for _ in range(5):  # warm-up (compilation, native autotuning)
        runner.step(mode)
    host = {}
    times = time_interleaved(runner.step, [mode], steps, runner.device, host=host)  # the bench's timing
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        runner.step(mode)
    if cuda:
        torch.cuda.synchronize()
    profiler.disable()
    text = {}
    for key in ("tottime", "cumulative"):
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats(key).print_stats(top)
        text[key] = stream.getvalue()
    return {"host_ms_median": statistics.median(host[mode]),
            "gpu_ms_median": statistics.median(times[mode]) if cuda else None, "profile": text}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ordered_ssd.apps.bench.host_profile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="S5", help="a named bench shape (S1-S5, G1-G13) or "
                                                       "B,L,d_model,N,G[,headdim,chunk[,dtype]]")
    parser.add_argument("--modes", default="ordered")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="directory for host_profile.json (optional)")
    args = parser.parse_args(argv)
    shape = named_or_parsed_shape(args.shape)
    modes = parse_modes(args.modes)
    runner = LayerRunner(shape, modes, torch.device(args.device), args.seed)
    res = {"shape": shape.name, "dims": shape.dims(None if runner.cuda else "fp32"), "steps": args.steps,
           "modes": {}}
    for m in modes:
        r = profile_mode(runner, m, args.steps, args.top)
        res["modes"][m] = r
        print(f"== {shape.name} {m}: host {r['host_ms_median']:.3f} ms/step, GPU "
              f"{r['gpu_ms_median'] if r['gpu_ms_median'] is None else round(r['gpu_ms_median'], 3)} ms/step")
        print(r["profile"]["tottime"])
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"host_profile_{shape.name}.json"), "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
