"""The bench's command line (``ordered-ssd bench``, ``benchmarks/bench_layer.py``)."""
from __future__ import annotations

import argparse
from typing import Dict, List, Optional

from ..errors import OneLineParser
from ..files import nonnegative_int, positive_int
from .requirements import INSTALL, BenchError
from .shapes import (ALL_NAMED, GRID, LAYER_DEFAULT_SHAPES, LAYER_MODES, LAYER_NAMES, LAYERS, MAMBA3_SHAPES, MODES,
                     SHAPE_FORMAT, SHAPES, Shape, named_or_parsed_shape, parse_modes, parse_shape,
                     parse_shape_list)

# Per-row settings: rows of the grid (--grid) take GRID_DEFAULTS unless the option is given (then it applies to every
# row). A grid row's steps take a few ms; the bit check's digests (every gradient copied to the host and hashed) and
# native's autotuning cost more than its steps, so the grid runs fewer of each.
DEFAULTS = {"repeats": 20, "warmup": 5, "bit_repeats": 10}
GRID_DEFAULTS = {"repeats": 15, "warmup": 3, "bit_repeats": 5}


def _argtype(fn):
    def conv(s):
        try:
            return fn(s)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1] if str(e).startswith("--") else str(e))
    conv.__name__ = fn.__name__.replace("parse_", "")
    return conv


def parse_shape_text(text: str) -> str:
    """A ``--shape`` text, checked by :func:`parse_shape` (the rules both layers share) and kept as given: the
    layer's defaults apply in :func:`resolve_shapes`, once ``--layer`` is known. Raises ``ValueError`` as that."""
    parse_shape(text)
    return text.strip()


def _seconds(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {s!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {s!r}")
    return v


def build_parser(prog: str = "ordered-ssd bench") -> argparse.ArgumentParser:
    """The argument parser of the suite (``ordered-ssd bench`` and ``benchmarks/bench_layer.py``)."""
    shapes = "; ".join(f"{s.name} {s.dims()}" for s in SHAPES.values())
    grid = "; ".join(f"{s.name} {s.dims()}" for s in GRID.values())
    mamba3 = "; ".join(f"{s.name} {s.dims()}" for s in MAMBA3_SHAPES.values())
    parser = OneLineParser(
        prog=prog, description="Time and measure one Mamba-2 layer's training step (forward + backward) with "
                               "mamba-ssm's Mamba2 (native, and upstream-det in a fresh process with its "
                               "deterministic switches) and OrderedMamba2 (ordered, literal); with --layer mamba3 "
                               "mamba-ssm's Mamba3 (native) and OrderedMamba3 (ordered, literal). Needs a CUDA GPU "
                               f"and the native extras ({INSTALL}).",
        epilog=f"Shapes: {shapes}. Grid (--grid; 7 kernel keys (chunk, headdim, d_state, dtype) in all): {grid}. "
               f"Mamba-3 (--layer mamba3; 3 kernel keys): {mamba3}.")
    parser.add_argument("--layer", choices=LAYERS, default=None,
                   help="the layer: mamba2 (Mamba2 against OrderedMamba2) or mamba3 (Mamba3 against "
                        "OrderedMamba3, single-input single-output; modes native, literal, ordered: mamba-ssm has "
                        "no deterministic mode for it; shapes M1-M6); recorded in every result row (default: "
                        "mamba2; with --render: every layer's table)")
    parser.add_argument("--shapes", type=_argtype(parse_shape_list), default=None,
                   help="comma-separated named shapes, S1-S5, G1-G13, or grid for G1-G13; M1-M6 with --layer "
                        "mamba3 (default: S1-S5, M1-M6 with --layer mamba3, unless --shape is given)")
    parser.add_argument("--shape", type=_argtype(parse_shape_text), action="append", default=[],
                   metavar=SHAPE_FORMAT,
                   help="an extra shape (repeatable; default: none); headdim 64, chunk 256 (64 with --layer "
                        "mamba3) and dtype bf16 (or fp16) unless given")
    parser.add_argument("--grid", action="store_true",
                   help="add the grid G1-G13 to the shapes (B 1-64, L 512-16384, d_state 16-256, headdim 32-128, "
                        "ngroups 1-8, chunk 64-256, bf16 and fp16; see the list below); its rows run with "
                        f"--repeats {GRID_DEFAULTS['repeats']} --warmup {GRID_DEFAULTS['warmup']} --bit-repeats "
                        f"{GRID_DEFAULTS['bit_repeats']} unless those are given")
    parser.add_argument("--modes", type=_argtype(parse_modes), default=None,
                   help=f"comma-separated from {','.join(MODES)}; with --layer mamba3 from "
                        f"{','.join(LAYER_MODES['mamba3'])} (default on CUDA: native, upstream-det, literal, ordered; native, literal, ordered with --layer mamba3; "
                        "ordered on the CPU; invariant, OrderedMamba2 with sequence_invariant, only by name)")
    parser.add_argument("--repeats", type=positive_int, default=None,
                   help=f"timed steps per mode (median; default {DEFAULTS['repeats']}, {GRID_DEFAULTS['repeats']} on "
                        "grid rows)")
    parser.add_argument("--warmup", type=nonnegative_int, default=None,
                   help=f"untimed steps per mode first (native autotuning happens here; default {DEFAULTS['warmup']}, "
                        f"{GRID_DEFAULTS['warmup']} on grid rows)")
    parser.add_argument("--bit-repeats", type=positive_int, default=None,
                   help=f"steps per mode whose gradient digests must agree (default {DEFAULTS['bit_repeats']}, "
                        f"{GRID_DEFAULTS['bit_repeats']} on grid rows)")
    parser.add_argument("--host-steps", type=positive_int, default=5,
                   help="steps per mode of the host-time phase: synchronize, time the Python call of one step, "
                        "synchronize; median (default 5)")
    parser.add_argument("--launch-steps", type=nonnegative_int, default=2,
                   help="steps per mode profiled (torch.profiler) to count GPU launches per step, kernels, memset "
                        "and memcpy; after all timing; 0 skips (default 2)")
    parser.add_argument("--precompile-jobs", type=nonnegative_int, default=None, metavar="N",
                   help="before any timing, N fresh worker processes run 2 untimed steps of every mode on their "
                        "share of the shapes so that Triton's on-disk cache holds every kernel (native's "
                        "candidates of every shape compiled in slices over the workers); 0 turns "
                        "it off (default: 8 on CUDA, 0 on the CPU)")
    parser.add_argument("--results-json", default=None, metavar="PATH",
                   help="also merge this run (or, with --merge, the combined one) into PATH (e.g. "
                        "docs/results/bench_h200.json), which keeps the current row of every shape with its run's "
                        "provenance: the shapes this run measured replace theirs, the others stay; rewritten after "
                        "every shape (default: none)")
    parser.add_argument("--render", default=None, metavar="RESULTS_JSON",
                   help="measure nothing: print the current table of a --results-json file (every shape's row, "
                        "each run named with its shapes) as the markdown section for docs/performance.md; one "
                        "table per layer, Mamba-2's first (only --layer's, if given) (default: measure)")
    parser.add_argument("--render-run", type=nonnegative_int, default=None, metavar="I",
                   help="with --render: only the rows of run I, 0 the newest (default: every shape's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and the layer (default 0)")
    parser.add_argument("--out", default="ordered-ssd-bench", help="output directory (default ./ordered-ssd-bench)")
    parser.add_argument("--breakdown", action="store_true",
                   help="also profile native and ordered steps per kernel (torch.profiler) on --breakdown-shape")
    parser.add_argument("--breakdown-shape", default=None, metavar=f"NAME|{SHAPE_FORMAT}",
                   help="shape of the per-kernel breakdown, of the --layer (default S2; M1 with --layer mamba3)")
    parser.add_argument("--breakdown-steps", type=positive_int, default=3, help="profiled steps per mode (default 3)")
    parser.add_argument("--no-native-child", action="store_true",
                   help="skip the fresh-process native baseline of upstream-det (its ratio is then only to this "
                        "process's native; Mamba-2 only)")
    parser.add_argument("--time-budget", type=_seconds, default=None, metavar="SECONDS",
                   help="start no new shape or child process after this many seconds (skipped work is marked, exit "
                        "status 1); a child still running 15 s after it is killed; with upstream-det its children "
                        "keep the last 35%% of the budget (default: no limit)")
    parser.add_argument("--device", default="cuda",
                   help="cuda or cuda:N (default); cpu runs the harness on the reference path in fp32 "
                        "(ordered/literal only): a smoke test, not a benchmark")
    parser.add_argument("--merge", nargs="+", default=None, metavar="BENCH_JSON",
                   help="measure nothing: combine earlier bench.json files (a later file's shape replaces an "
                        "earlier one of the same name, unless it was skipped and the earlier one measured) and "
                        "write the table, JSON and chart to --out (default: measure)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--_child-spec", dest="child_spec", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_precompile-spec", dest="precompile_spec", default=None, help=argparse.SUPPRESS)
    return parser


def resolve_layer(args) -> str:
    """The layer of parsed arguments (``--layer``, ``"mamba2"`` by default) after the options that do not go with
    it are refused. Raises :class:`BenchError` (one line, exit 2) for ``--layer mamba3`` with a mode it does not have
    (``upstream-det``: mamba-ssm has no deterministic mode for Mamba-3) or with a Mamba-2-only option (``--grid``,
    ``--no-native-child``), and for a named shape of the other layer."""
    layer = getattr(args, "layer", None) or "mamba2"
    name = LAYER_NAMES[layer]
    if layer == "mamba3":
        other = [m for m in (args.modes or ()) if m not in LAYER_MODES[layer]]
        if other:
            raise BenchError(f"--modes {','.join(other)}: mamba-ssm has no deterministic mode for Mamba-3; "
                             f"--layer mamba3 runs {', '.join(LAYER_MODES[layer])}")
        for flag, given in (("--grid", args.grid), ("--no-native-child", args.no_native_child)):
            if given:
                raise BenchError(f"{flag} is a Mamba-2 option; --layer mamba3 does not take it")
    for s in args.shapes or ():
        if s.layer != layer:
            hint = ("add --layer mamba3" if s.layer == "mamba3" else
                    f"--layer {layer} takes {', '.join(LAYER_DEFAULT_SHAPES[layer])} or --shape")
            raise BenchError(f"--shapes {s.name}: a {LAYER_NAMES[s.layer]} shape, not a {name} one; {hint}")
    return layer


#: the per-kernel breakdown's shape when ``--breakdown-shape`` is not given, per layer
BREAKDOWN_DEFAULT = {"mamba2": "S2", "mamba3": "M1"}


def resolve_breakdown_shape(args) -> Optional[Shape]:
    """The shape of ``--breakdown`` (None without it): ``--breakdown-shape``, a named shape of the layer or a
    :data:`~.shapes.SHAPE_FORMAT` spec parsed for it, :data:`BREAKDOWN_DEFAULT` if not given. Raises
    :class:`BenchError` (exit 2) for a spec that does not parse or a named shape of the other layer."""
    if not getattr(args, "breakdown", False):
        return None
    layer = resolve_layer(args)
    try:
        shape = named_or_parsed_shape(args.breakdown_shape or BREAKDOWN_DEFAULT[layer], ALL_NAMED, layer)
    except ValueError as e:
        raise BenchError(str(e).replace("--shape", "--breakdown-shape", 1)) from None
    if shape.layer != layer:
        raise BenchError(f"--breakdown-shape {shape.name}: a {LAYER_NAMES[shape.layer]} shape, not a "
                         f"{LAYER_NAMES[layer]} one")
    return shape


def resolve_shapes(args) -> List[Shape]:
    """The shapes of parsed arguments, of the layer :func:`resolve_layer` gives: ``--shapes`` then every
    ``--shape`` (named X1, X2, ... for Mamba-2, MX1, MX2, ... for Mamba-3, so that the rows of the two layers keep
    apart in a results file), the layer's named shapes (S1-S5, M1-M6) if neither is given; then, with ``--grid``,
    G1-G13 (those not already there). Raises :class:`BenchError` as :func:`resolve_layer`, or for a ``--shape``
    the layer cannot take (Mamba-3: ``N``, ``headdim`` or ``chunk`` not a power of two >= 16)."""
    layer = resolve_layer(args)
    shapes = list(args.shapes or [])
    prefix = "X" if layer == "mamba2" else "MX"
    for i, text in enumerate(args.shape, 1):
        try:
            shapes.append(parse_shape(text, name=f"{prefix}{i}", layer=layer))
        except ValueError as e:
            raise BenchError(str(e)) from None
    if not shapes:
        shapes = list(LAYER_DEFAULT_SHAPES[layer].values())
    if getattr(args, "grid", False):
        shapes += [s for s in GRID.values() if s not in shapes]
    return shapes


def is_grid_row(shape: Shape) -> bool:
    """Whether ``shape`` is one of the grid's (G1-G13, as named there)."""
    return GRID.get(shape.name) == shape


def resolve_settings(args) -> Dict[str, dict]:
    """``{"default": settings, "grid": settings}`` of parsed arguments: ``repeats``, ``warmup``, ``bit_repeats``
    (an option given applies to both; otherwise :data:`DEFAULTS` / :data:`GRID_DEFAULTS`), ``host_steps``,
    ``launch_steps``, ``seed``."""
    common = {"host_steps": args.host_steps, "launch_steps": args.launch_steps, "seed": args.seed}
    out = {}
    for kind, defaults in (("default", DEFAULTS), ("grid", GRID_DEFAULTS)):
        out[kind] = {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in defaults.items()}
        out[kind].update(common)
    return out


def shape_settings(shape: Shape, settings: Dict[str, dict]) -> dict:
    """The settings of one row: ``settings["grid"]`` for a grid row, ``settings["default"]`` otherwise."""
    return settings["grid" if is_grid_row(shape) else "default"]
