"""The bench's command line (``ordered-ssd bench``, ``benchmarks/bench_layer.py``)."""
from __future__ import annotations

import argparse
from typing import List

from ..files import nonnegative_int, positive_int
from .requirements import INSTALL
from .shapes import MODES, SHAPE_FORMAT, SHAPES, Shape, parse_modes, parse_shape, parse_shape_list


def _argtype(fn):
    def conv(s):
        try:
            return fn(s)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1] if str(e).startswith("--") else str(e))
    conv.__name__ = fn.__name__.replace("parse_", "")
    return conv


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
    parser = argparse.ArgumentParser(
        prog=prog, description="Time and measure one Mamba-2 layer's training step (forward + backward) with "
                               "mamba-ssm's Mamba2 (native, and upstream-det in a fresh process with its "
                               "deterministic switches) and OrderedMamba2 (ordered, literal). Needs a CUDA GPU and "
                               f"the native extras ({INSTALL}).",
        epilog=f"Shapes: {shapes}.")
    parser.add_argument("--shapes", type=_argtype(parse_shape_list), default=None,
                   help="comma-separated named shapes (default: all, unless --shape is given)")
    parser.add_argument("--shape", type=_argtype(parse_shape), action="append", default=[], metavar=SHAPE_FORMAT,
                   help="an extra shape (repeatable; default: none); headdim 64 and chunk 256 unless given")
    parser.add_argument("--modes", type=_argtype(parse_modes), default=None,
                   help=f"comma-separated from {','.join(MODES)} (default: all on CUDA, ordered on the CPU)")
    parser.add_argument("--repeats", type=positive_int, default=20, help="timed steps per mode (median; default 20)")
    parser.add_argument("--warmup", type=nonnegative_int, default=5,
                   help="untimed steps per mode first (native autotuning happens here; default 5)")
    parser.add_argument("--bit-repeats", type=positive_int, default=10,
                   help="steps per mode whose gradient digests must agree (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and the layer (default 0)")
    parser.add_argument("--out", default="ordered-ssd-bench", help="output directory (default ./ordered-ssd-bench)")
    parser.add_argument("--breakdown", action="store_true",
                   help="also profile native and ordered steps per kernel (torch.profiler) on --breakdown-shape")
    parser.add_argument("--breakdown-shape", default="S2", metavar=f"NAME|{SHAPE_FORMAT}",
                   help="shape of the per-kernel breakdown (default S2)")
    parser.add_argument("--breakdown-steps", type=positive_int, default=3, help="profiled steps per mode (default 3)")
    parser.add_argument("--no-native-child", action="store_true",
                   help="skip the fresh-process native baseline of upstream-det (its ratio is then only to this "
                        "process's native)")
    parser.add_argument("--time-budget", type=_seconds, default=None, metavar="SECONDS",
                   help="start no new shape or child process after this many seconds (skipped work is marked, exit "
                        "status 1); a child still running 15 s after it is killed (default: no limit)")
    parser.add_argument("--device", default="cuda",
                   help="cuda or cuda:N (default); cpu runs the harness on the reference path in fp32 "
                        "(ordered/literal only): a smoke test, not a benchmark")
    parser.add_argument("--merge", nargs="+", default=None, metavar="BENCH_JSON",
                   help="measure nothing: combine earlier bench.json files (a later file's shape replaces an "
                        "earlier one of the same name) and write the table, JSON and chart to --out (default: measure)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--_child-spec", dest="child_spec", default=None, help=argparse.SUPPRESS)
    return parser


def resolve_shapes(args) -> List[Shape]:
    """The shapes of parsed arguments: ``--shapes`` then every ``--shape`` (named X1, X2, ... unless given a name);
    all named shapes if neither is given."""
    shapes = list(args.shapes or [])
    for i, s in enumerate(args.shape, 1):
        shapes.append(Shape(f"X{i}" if s.name == s.spec() else s.name, s.B, s.L, s.d_model, s.N, s.G, s.headdim,
                            s.chunk))
    if not shapes:
        shapes = list(SHAPES.values())
    return shapes
