"""Where the host time of one layer step goes: enqueue time, idle-GPU host time, per-op and per-launcher host time,
and a ``cProfile`` over training steps of one bench shape.

Launch-bound shapes (small ``L``, large ``B``) run at the speed of the Python and launch path, not the GPU; the
per-kernel breakdown of ``ordered-ssd bench --breakdown`` cannot see that. For each mode asked for this tool
measures, over ``steps`` steps each:

* ``host_ms_median``: the host time to enqueue a step with the bench's own timing
  (:func:`ordered_ssd.apps.bench.timing.time_interleaved`: no synchronisation between steps, so once the GPU queue is
  full the host waits for the GPU and this approaches the GPU time), and ``gpu_ms_median`` (CUDA events);
* ``idle_host_ms``: the host time of a step started on an idle GPU (``synchronize; t0; step; t1; synchronize``),
  median, also split into the forward (``idle_forward_ms``, to the layer's output) and the backward
  (``idle_backward_ms``, ``out.backward``): the Python and launch cost alone, what remains to remove;
* ``calls``: per function of the CUDA path (the public ops, the compositions ``ordered_*_fwd/bwd``, every
  ``csrc_bindings`` launcher (Mamba-3's in ``csrc_bindings.mamba3`` too, with their ``launch_kernel``), the common
  launch path ``launch`` / ``launch_fitting`` (which calls Triton's ``run``;
  a launcher replaying its plan, ``csrc_bindings._plans``, reaches ``launch_fitting`` through ``replay`` instead;
  ``run_compiled`` launches a compiled kernel kept for its key, ``csrc_bindings._launch_cache``: once warm, every
  launch whose key is cached ends there, a plan's launches included, with or without plans),
  the fold launches of :mod:`ordered_ssd.fold`): calls per step and inclusive host microseconds per call and per
  step, over idle-GPU steps with every such function wrapped by a timer (:func:`timed_calls`; each wrapper adds
  about a microsecond; nested functions are counted in their callers too);
* a ``cProfile`` (own and cumulative time) over another ``steps`` steps.

    python -m ordered_ssd.apps.bench.host_profile --shape S5 --modes ordered,native --steps 20 --out prof/

Uses the bench's ``LayerRunner`` (fp32 parameters; on CUDA ``u``/``dout`` and autocast in the shape's dtype, bf16
unless the shape says fp16; fp32 on the CPU). A measuring tool, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections import defaultdict
from typing import Callable, Dict, Iterator

import torch

from .runner import LayerRunner, sync
from .shapes import ALL_NAMED, named_or_parsed_shape, parse_modes
from .timing import time_interleaved


#: modules whose functions :func:`timed_calls` may wrap (where the CUDA path's functions are defined or imported)
_PREFIXES = ("ordered_ssd.ops", "ordered_ssd.fold", "ordered_ssd.modules", "csrc_bindings")


def _timed_functions() -> Dict[str, Callable]:
    """``{label: function}``: the public ops, the compositions, the launchers, the launch path and the folds."""
    import csrc_bindings
    from csrc_bindings import _launch_cache, _native, _plans, _resources

    from ... import fold, ops
    from ...ops import (causal_conv1d, elementwise, layernorm_gated, linear, ssd_combined, ssd_split_conv1d)
    found = {}
    for name in ops.__all__:
        found[f"op {name}"] = getattr(ops, name)
    for mod in (ssd_combined, ssd_split_conv1d, causal_conv1d, layernorm_gated, linear, elementwise):
        for name in getattr(mod, "__all__", ()):
            if name.endswith(("_fwd", "_bwd", "_weight_grad")):
                found[f"composition {name}"] = getattr(mod, name)
    for name in dir(csrc_bindings):
        if name.startswith("launch_"):
            found[f"launcher {name}"] = getattr(csrc_bindings, name)
    from csrc_bindings import mamba3
    from csrc_bindings.mamba3 import _runtime as mamba3_runtime

    from ...ops import mamba3_siso
    for name in mamba3.__all__:  # OrderedMamba3's kernels (csrc_bindings.mamba3)
        if name.startswith("launch_"):
            found[f"launcher {name}"] = getattr(mamba3, name)
    for name in ("ordered_mamba3_siso_fwd", "ordered_mamba3_siso_bwd"):
        found[f"composition {name}"] = getattr(mamba3_siso, name)
    for name in ("ordered_mamba3_siso_combined", "ordered_dt_softplus"):
        found[f"op {name}"] = getattr(mamba3_siso, name)
    found["launch path mamba3 launch_kernel (config)"] = mamba3_runtime.launch_kernel
    found["launch path _native.launch"] = _native.launch
    found["launch path _plans.replay (a launcher's plan)"] = _plans.replay
    found["launch path launch_fitting (Triton run)"] = _resources.launch_fitting
    found["launch path run_compiled (a kept kernel)"] = _launch_cache.run_compiled
    for name in ("fold_many", "fold_example_sums", "fold_dims", "fold_example_gemms", "fold_example_gemms_grouped",
                 "lexical_cumsum", "dA_cumsum_grad_scans", "conv1d_grad_partials"):
        found[f"fold {name}"] = getattr(fold, name)
    return found


@contextlib.contextmanager
def timed_calls(functions: Dict[str, Callable], cuda_sync: Callable[[], None] = lambda: None
                ) -> Iterator[Dict[str, list]]:
    """Wrap every function of ``functions`` (``{label: function}``) wherever a module of :data:`_PREFIXES` holds it
    (by identity, so ``from x import f`` copies are wrapped too) with a timer; yields ``{label: [calls, seconds]}``
    (inclusive wall time of the host). Everything is put back on exit. ``cuda_sync`` is not called by the
    wrappers (the step decides when the GPU is idle)."""
    stats: Dict[str, list] = defaultdict(lambda: [0, 0.0])
    by_id = {id(f): label for label, f in functions.items()}
    wrappers: Dict[int, Callable] = {}

    def wrap(label, fn):
        entry = stats[label]

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                entry[1] += time.perf_counter() - t0
                entry[0] += 1
        return timed

    patched = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(_PREFIXES):
            continue
        for attr, value in list(vars(mod).items()):
            label = by_id.get(id(value))
            if label is None or not callable(value):
                continue
            if id(value) not in wrappers:
                wrappers[id(value)] = wrap(label, value)
            setattr(mod, attr, wrappers[id(value)])
            patched.append((mod, attr, value))
    try:
        yield stats
    finally:
        for mod, attr, value in patched:
            setattr(mod, attr, value)


def _split_step(runner, mode):
    """``runner.step(mode)`` with the forward and the backward timed apart: ``(forward_s, backward_s)``."""
    layer = runner.start(mode)
    t0 = time.perf_counter()
    out = runner.forward(layer)
    t1 = time.perf_counter()
    out.backward(runner.dout)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def idle_host_times(runner, mode, steps):
    """Host milliseconds of ``steps`` steps each started on an idle GPU (synchronised before and after, outside the
    timed region): ``{"step": [...], "forward": [...], "backward": [...]}``."""
    out = {"step": [], "forward": [], "backward": []}
    for _ in range(steps):
        sync(runner.device)
        fwd, bwd = _split_step(runner, mode)
        sync(runner.device)
        out["forward"].append(1000.0 * fwd)
        out["backward"].append(1000.0 * bwd)
        out["step"].append(1000.0 * (fwd + bwd))
    return out


def per_call_host_times(runner, mode, steps):
    """Per timed function (:func:`timed_calls`) over ``steps`` idle-GPU steps: ``{label: {"calls_per_step",
    "us_per_call", "us_per_step"}}``, largest ``us_per_step`` first."""
    with timed_calls(_timed_functions()) as stats:
        for _ in range(steps):
            sync(runner.device)
            _split_step(runner, mode)
            sync(runner.device)
    rows = {label: {"calls_per_step": n / steps, "us_per_call": 1e6 * t / n, "us_per_step": 1e6 * t / steps}
            for label, (n, t) in stats.items() if n}
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["us_per_step"]))


def _calls_table(calls) -> str:
    lines = [f"{'calls/step':>10} {'us/call':>9} {'us/step':>9}  function (inclusive host time, idle GPU)"]
    for label, r in calls.items():
        lines.append(f"{r['calls_per_step']:10.1f} {r['us_per_call']:9.1f} {r['us_per_step']:9.1f}  {label}")
    return "\n".join(lines)


def profile_mode(runner, mode, steps, top):
    cuda = runner.cuda
    for _ in range(5):  # warm-up (compilation, native autotuning)
        runner.step(mode)
    host = {}
    times = time_interleaved(runner.step, [mode], steps, runner.device, host=host)  # the bench's timing
    idle = idle_host_times(runner, mode, steps)
    calls = per_call_host_times(runner, mode, steps)
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
            "gpu_ms_median": statistics.median(times[mode]) if cuda else None,
            "idle_host_ms": statistics.median(idle["step"]), "idle_forward_ms": statistics.median(idle["forward"]),
            "idle_backward_ms": statistics.median(idle["backward"]), "calls": calls, "profile": text}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ordered_ssd.apps.bench.host_profile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="S5", help="a named bench shape (S1-S5, G1-G13; M1-M6: a Mamba-3 "
                                                       "layer) or B,L,d_model,N,G[,headdim,chunk[,dtype]]")
    parser.add_argument("--modes", default="ordered")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="directory for host_profile.json (optional)")
    args = parser.parse_args(argv)
    shape = named_or_parsed_shape(args.shape, ALL_NAMED)
    modes = parse_modes(args.modes)
    if "upstream-det" in modes:  # its switches are read at import: it never runs in this process
        parser.error("--modes: expected modes that run in this process (native, ordered, ...), got 'upstream-det'; "
                     "profile mamba-ssm's deterministic mode as native in a process started with "
                     "MAMBA_DETERMINISTIC=1 CAUSAL_CONV1D_DETERMINISTIC=1")
    runner = LayerRunner(shape, modes, torch.device(args.device), args.seed)
    res = {"shape": shape.name, "dims": shape.dims(shape.run_dtype(runner.cuda)), "steps": args.steps,
           "modes": {}}
    for m in modes:
        r = profile_mode(runner, m, args.steps, args.top)
        res["modes"][m] = r
        print(f"== {shape.name} {m}: host {r['host_ms_median']:.3f} ms/step, GPU "
              f"{r['gpu_ms_median'] if r['gpu_ms_median'] is None else round(r['gpu_ms_median'], 3)} ms/step")
        print(f"   idle GPU: host {r['idle_host_ms']:.3f} ms/step (forward {r['idle_forward_ms']:.3f}, backward "
              f"{r['idle_backward_ms']:.3f})")
        print(_calls_table(r["calls"]))
        print(r["profile"]["tottime"])
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"host_profile_{shape.name}.json"), "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
