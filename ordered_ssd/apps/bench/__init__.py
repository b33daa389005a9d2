"""``ordered-ssd bench``: what does reproducibility cost? One Mamba-2 layer, four ways, side by side (or, with
``--layer mamba3``, one Mamba-3 layer, three ways: see the end).

One training step is the forward and the backward of a single layer: ``out = layer(u)``,
``out.backward(dout)``, with ``u`` and ``dout`` tensors [B, L, d_model] in the shape's dtype (bf16, or fp16 for
some grid rows) and fp32 parameters under ``torch.autocast("cuda", dtype=<that dtype>)`` (the usual mixed-precision
Mamba setup; the same for every mode). Shapes: S1-S5, and with ``--grid`` G1-G13 (:mod:`.shapes`). Modes:

* ``native``: ``mamba_ssm.modules.mamba2.Mamba2`` as shipped (autotuned kernels, atomic reductions);
* ``upstream-det``: the same module in a fresh child process started with ``MAMBA_DETERMINISTIC=1`` and
  ``CAUSAL_CONV1D_DETERMINISTIC=1`` in its environment (set for the child only, never in this process); the child
  prints its timings, memory and bit check as JSON on stdout. A second child with the same harness and neither
  variable set measures ``native`` in a fresh process too, so the upstream-det ratio is given both to this
  process's native time and to that child's;
* ``literal``: :class:`~ordered_ssd.OrderedMamba2` with ``layer.literal = True`` (one native launch per example);
* ``ordered``: :class:`~ordered_ssd.OrderedMamba2`.

All layers of a shape share the same parameter tensors (hence the same ``state_dict``); the inputs come from a
seeded generator. First, unless ``--precompile-jobs 0``, worker processes fill Triton's on-disk cache with every
kernel of every shape and mode (:mod:`.precompile`; untimed, its wall time recorded apart). Per shape, in this
process:

1. warm-up: ``--warmup`` steps per mode (this is where the native autotuner runs); excluded from everything;
2. timing: ``--repeats`` rounds; each round runs one step of every mode, the order rotating from round to
   round (interleaved A/B, so drift cancels); each step is timed with ``torch.cuda.Event``s (``time.perf_counter``
   on the CPU); the median is reported, and the ratio to native's median;
3. memory: per mode, in its own phase: ``torch.cuda.reset_peak_memory_stats``, one step,
   ``torch.cuda.max_memory_allocated`` (the layer's parameters and ``u``/``dout`` are resident in every mode);
4. host time: per mode, ``--host-steps`` steps, each between two synchronisations, the Python call timed
   (median);
5. bits: per mode, ``--bit-repeats`` steps on the same inputs; the SHA-256
   (:func:`ordered_ssd.digest.tensor_sha256`) of every parameter gradient and of the input gradient must be the
   same every time.

After all shapes, the GPU launches per step of every mode (``torch.profiler`` over ``--launch-steps`` steps; the
profiler is never on while anything is timed). Grid rows take ``--repeats 15 --warmup 3 --bit-repeats 5`` unless
those options are given.

``--breakdown`` profiles a few ``native`` and ``ordered`` steps of ``--breakdown-shape`` (S2 by default, M1 with
``--layer mamba3``) with ``torch.profiler`` (CUDA activity) and aggregates the GPU time per kernel name (Triton SSD
and Mamba-3 kernels, ``fold_kernel``/``scan_kernel``, cuBLAS, causal-conv1d, ...). Outputs under ``--out``:
``bench.md``, ``bench.json``, ``bench.png``, ``breakdown.md``, ``breakdown.json`` (rewritten after every shape, so
an interrupted run leaves what it measured), and with ``--results-json PATH`` the run merged into that file (which
keeps the current row of each shape with the provenance of the run that measured it; :mod:`.results`, whose
``--render`` prints the current table of ``docs/performance.md``).

``--device cpu`` runs the same harness on the pure-PyTorch reference path (fp32, ``ordered``/``literal`` only):
a smoke test of the harness, not a benchmark.

``--layer mamba3`` measures mamba-ssm's ``Mamba3`` (``native``, as shipped) against
:class:`~ordered_ssd.modules.mamba3.OrderedMamba3` (``ordered``, and ``literal`` with ``layer.literal = True``, a
cross-check of the bits) with the same harness: the same phases, children of the precompile phase and results.
Its shapes are M1-M6 (:data:`.shapes.MAMBA3_SHAPES`, bf16; ``--shape`` takes any other); the layers are built in
the row's dtype and run without autocast (``OrderedMamba3`` takes inputs of its weights' dtype only). mamba-ssm
has no deterministic mode for Mamba-3, so there is no ``upstream-det`` mode, and the targets are time and memory.
Every result row records its layer (``"layer"``; rows without one are Mamba-2's); the table and ``--render`` keep
the layers apart, one table each. The Mamba-2-only options (``--grid``, ``--no-native-child``) and
``upstream-det`` are refused with ``--layer mamba3``; ``--breakdown`` profiles a Mamba-3 shape (M1 by default).

Files: :mod:`.shapes` (shapes and modes), :mod:`.args` (the command line), :mod:`.requirements` (what it
needs), :mod:`.runner` (one layer, one step), :mod:`.timing` (timing, memory, bits of one shape),
:mod:`.children` (the fresh child processes), :mod:`.breakdown` (per-kernel profile), :mod:`.report` (table,
JSON, chart, merge), :mod:`.results` (the committed results file), :mod:`.precompile` (the precompile phase),
:mod:`.suite` (:func:`run`), :mod:`.host_profile` (where a step's host time goes).
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from ..errors import run_reporting
from .args import build_parser, resolve_layer, resolve_settings, resolve_shapes
from .breakdown import aggregate_kernels, format_breakdown, kernel_category, profile_breakdown
from .children import child_main, run_child
from .precompile import precompile_main, precompile_tasks, run_precompile, worker_command
from .report import format_table, targets_summary, write_plot, write_results
from .requirements import DET_ENV, BenchError, missing_requirements
from .results import load_runs, merge_run, render, render_run
from .runner import LayerRunner
from .shapes import (GRID, LAYERS, MAMBA3_SHAPES, MODES, SHAPES, Shape, named_or_parsed_shape, parse_modes,
                     parse_shape, parse_shape_list)
from .suite import run
from .timing import bench_shape, count_launches, finalize_ratios, targets, time_interleaved

__all__ = ["Shape", "SHAPES", "GRID", "MAMBA3_SHAPES", "LAYERS", "MODES", "DET_ENV", "BenchError", "LayerRunner",
           "parse_shape", "parse_shape_list", "parse_modes", "named_or_parsed_shape", "missing_requirements",
           "build_parser", "resolve_layer", "resolve_shapes", "resolve_settings", "bench_shape", "time_interleaved",
           "count_launches", "finalize_ratios", "targets", "run_child", "precompile_tasks", "worker_command",
           "run_precompile", "profile_breakdown", "format_table", "targets_summary", "format_breakdown",
           "write_results", "write_plot", "aggregate_kernels", "kernel_category", "load_runs", "merge_run", "render",
           "render_run", "run", "main"]


def main(argv: Optional[Sequence[str]] = None, prog: str = "ordered-ssd bench") -> int:
    """Entry point of ``ordered-ssd bench`` / ``benchmarks/bench_layer.py``. Returns the exit status: 0 all
    measured, 1 some rows failed or were skipped (time budget), 2 usage error or missing requirement (one line on
    stderr naming it and the install command). Argument errors exit 2 through argparse."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    if args.child_spec is not None:
        return child_main(args.child_spec)
    if args.precompile_spec is not None:
        return precompile_main(args.precompile_spec)
    return run_reporting(prog, lambda: run(args, argv, prog))  # BenchError and the out-dir error: one line, 2
