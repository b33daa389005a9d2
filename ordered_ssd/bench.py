"""``ordered-ssd bench``: what does reproducibility cost? One Mamba-2 layer, four ways, side by side.

One training step is the forward and the backward of a single layer: ``out = layer(u)``,
``out.backward(dout)``, with ``u`` and ``dout`` bf16 tensors [B, L, d_model] and fp32 parameters under
``torch.autocast("cuda", dtype=torch.bfloat16)`` (the usual mixed-precision Mamba setup; the same for every
mode). Modes:

* ``native``: ``mamba_ssm.modules.mamba2.Mamba2`` as shipped (autotuned kernels, atomic reductions);
* ``upstream-det``: the same module in a fresh child process started with ``MAMBA_DETERMINISTIC=1`` and
  ``CAUSAL_CONV1D_DETERMINISTIC=1`` in its environment (set for the child only, never in this process); the child
  prints its timings, memory and bit check as JSON on stdout. A second child with the same harness and neither
  variable set measures ``native`` in a fresh process too, so the upstream-det ratio is given both to this
  process's native time and to that child's;
* ``literal``: :class:`~ordered_ssd.OrderedMamba2` with ``layer.literal = True`` (one native launch per example);
* ``ordered``: :class:`~ordered_ssd.OrderedMamba2`.

All layers of a shape share the same parameter tensors (hence the same ``state_dict``); the inputs come from a
seeded generator. Per shape, in this process:

1. warm-up: ``--warmup`` steps per mode (this is where the native autotuner runs); excluded from everything;
2. timing: ``--repeats`` rounds; each round runs one step of every mode, the order rotating from round to
   round (interleaved A/B, so drift cancels); each step is timed with ``torch.cuda.Event``s (``time.perf_counter``
   on the CPU); the median is reported, and the ratio to native's median;
3. memory: per mode, in its own phase: ``torch.cuda.reset_peak_memory_stats``, one step,
   ``torch.cuda.max_memory_allocated`` (the layer's parameters and ``u``/``dout`` are resident in every mode);
4. bits: per mode, ``--bit-repeats`` steps on the same inputs; the SHA-256
   (:func:`ordered_ssd.digest.tensor_sha256`) of every parameter gradient and of the input gradient must be the
   same every time.

``--breakdown`` profiles a few ``native`` and ``ordered`` steps of S2 with ``torch.profiler`` (CUDA activity) and
aggregates the GPU time per kernel name (Triton SSD kernels, ``fold_kernel``/``scan_kernel``, cuBLAS,
causal-conv1d, ...). Outputs under ``--out``: ``bench.md``, ``bench.json``, ``bench.png``, ``breakdown.md``,
``breakdown.json`` (rewritten after every shape, so an interrupted run leaves what it measured).

``--device cpu`` runs the same harness on the pure-PyTorch reference path (fp32, ``ordered``/``literal`` only):
a smoke test of the harness, not a benchmark.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import torch

from ._files import atomic_savefig, atomic_write_bytes, nonnegative_int, positive_int

__all__ = ["Shape", "SHAPES", "MODES", "BenchError", "parse_shape", "parse_shape_list", "parse_modes",
           "missing_requirements", "build_parser", "format_table", "format_breakdown", "write_results",
           "write_plot", "aggregate_kernels", "kernel_category", "main"]

MODES = ("native", "upstream-det", "literal", "ordered")
IN_PROCESS_MODES = ("native", "literal", "ordered")
DET_ENV = ("MAMBA_DETERMINISTIC", "CAUSAL_CONV1D_DETERMINISTIC")
INSTALL = "pip install ordered-ssd[cuda]"
CHILD_MARK = "@@ordered-ssd-bench-child@@ "
EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE = 0, 1, 2
MiB = float(2 ** 20)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BenchError(RuntimeError):
    """A user-facing failure (bad argument, missing requirement, unwritable output): one line, exit 2."""


# ----------------------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    """One benchmark problem: batch ``B``, sequence length ``L``, ``d_model``, state dim ``N``, groups ``G``,
    ``headdim`` and ``chunk_size`` (``d_conv`` 4 and ``expand`` 2 always)."""

    name: str
    B: int
    L: int
    d_model: int
    N: int
    G: int
    headdim: int = 64
    chunk: int = 256

    @property
    def nheads(self) -> int:
        return 2 * self.d_model // self.headdim

    def dims(self) -> str:
        return f"B{self.B} L{self.L} d{self.d_model} N{self.N} G{self.G} P{self.headdim} cs{self.chunk}"

    def spec(self) -> str:
        return f"{self.B},{self.L},{self.d_model},{self.N},{self.G},{self.headdim},{self.chunk}"


SHAPES: Dict[str, Shape] = {s.name: s for s in (
    Shape("S1", 2, 2048, 1024, 128, 1),
    Shape("S2", 8, 4096, 2048, 128, 1),
    Shape("S3", 4, 4096, 4096, 128, 8),
    Shape("S4", 1, 65536, 1024, 128, 1),
    Shape("S5", 64, 512, 768, 64, 1),
)}
SHAPE_FORMAT = "B,L,d_model,N,G[,headdim,chunk]"


def parse_shape(text: str, name: Optional[str] = None) -> Shape:
    """Parse ``"B,L,d_model,N,G[,headdim,chunk]"`` (positive integers; headdim 64 and chunk 256 by default).

    Returns a :class:`Shape` named ``name`` (default: the normalised spec). Raises ``ValueError`` with a message
    naming the problem: not 5 or 7 integers, a value < 1, ``headdim`` not dividing ``2 * d_model`` (expand 2), or
    ``G`` not dividing the number of heads ``2 * d_model / headdim``.
    """
    if not isinstance(text, str):
        raise ValueError(f"--shape: expected a string {SHAPE_FORMAT}, got {type(text).__name__}")
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (5, 7):
        raise ValueError(f"--shape: expected {SHAPE_FORMAT} (5 or 7 comma-separated positive integers), "
                         f"got {text!r}")
    vals = []
    for label, p in zip(("B", "L", "d_model", "N", "G", "headdim", "chunk"), parts):
        try:
            v = int(p)
        except ValueError:
            raise ValueError(f"--shape: {label} must be a positive integer, got {p!r} in {text!r}") from None
        if v < 1:
            raise ValueError(f"--shape: {label} must be a positive integer, got {v} in {text!r}")
        vals.append(v)
    B, L, d, N, G = vals[:5]
    P, cs = (vals[5], vals[6]) if len(vals) == 7 else (64, 256)
    if (2 * d) % P:
        raise ValueError(f"--shape: headdim {P} must divide d_inner = 2 * d_model = {2 * d} in {text!r}")
    if ((2 * d) // P) % G:
        raise ValueError(f"--shape: G {G} must divide the number of heads 2 * d_model / headdim = {(2 * d) // P} "
                         f"in {text!r}")
    shape = Shape(name or "", B, L, d, N, G, P, cs)
    return shape if name else Shape(shape.spec(), B, L, d, N, G, P, cs)


def named_or_parsed_shape(text: str) -> Shape:
    """A named shape (``"S2"``, any case) or a :func:`parse_shape` spec. Raises ``ValueError`` as that does."""
    key = text.strip().upper()
    return SHAPES[key] if key in SHAPES else parse_shape(text)


def parse_shape_list(text: str) -> List[Shape]:
    """``"S1,S3"`` -> the named shapes, in the order given. Raises ``ValueError`` for an unknown or empty name."""
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"--shapes: expected comma-separated names from {', '.join(SHAPES)}, got {text!r}")
    out = []
    for n in names:
        key = n.upper()
        if key not in SHAPES:
            raise ValueError(f"--shapes: unknown shape {n!r}; known: {', '.join(SHAPES)} (use --shape "
                             f"{SHAPE_FORMAT} for any other)")
        if SHAPES[key] not in out:
            out.append(SHAPES[key])
    return out


def parse_modes(text: str) -> List[str]:
    """``"ordered,native"`` -> the modes in canonical order (native, upstream-det, literal, ordered).
    Raises ``ValueError`` for an unknown or empty name."""
    names = [n.strip().lower() for n in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"--modes: expected comma-separated names from {', '.join(MODES)}, got {text!r}")
    for n in names:
        if n not in MODES:
            raise ValueError(f"--modes: unknown mode {n!r}; known: {', '.join(MODES)}")
    return [m for m in MODES if m in names]


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
    p = argparse.ArgumentParser(
        prog=prog, description="Time and measure one Mamba-2 layer's training step (forward + backward) with "
                               "mamba-ssm's Mamba2 (native, and upstream-det in a fresh process with its "
                               "deterministic switches) and OrderedMamba2 (ordered, literal). Needs a CUDA GPU and "
                               f"the native extras ({INSTALL}).",
        epilog=f"Shapes: {shapes}.")
    p.add_argument("--shapes", type=_argtype(parse_shape_list), default=None,
                   help="comma-separated named shapes (default: all, unless --shape is given)")
    p.add_argument("--shape", type=_argtype(parse_shape), action="append", default=[], metavar=SHAPE_FORMAT,
                   help="an extra shape (repeatable); headdim 64 and chunk 256 unless given")
    p.add_argument("--modes", type=_argtype(parse_modes), default=None,
                   help=f"comma-separated from {','.join(MODES)} (default: all on CUDA, ordered on the CPU)")
    p.add_argument("--repeats", type=positive_int, default=20, help="timed steps per mode (median; default 20)")
    p.add_argument("--warmup", type=nonnegative_int, default=5,
                   help="untimed steps per mode first (native autotuning happens here; default 5)")
    p.add_argument("--bit-repeats", type=positive_int, default=10,
                   help="steps per mode whose gradient digests must agree (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="ordered-ssd-bench", help="output directory (default ./ordered-ssd-bench)")
    p.add_argument("--breakdown", action="store_true",
                   help="also profile native and ordered steps per kernel (torch.profiler) on --breakdown-shape")
    p.add_argument("--breakdown-shape", default="S2", metavar=f"NAME|{SHAPE_FORMAT}",
                   help="shape of the per-kernel breakdown (default S2)")
    p.add_argument("--breakdown-steps", type=positive_int, default=3, help="profiled steps per mode (default 3)")
    p.add_argument("--no-native-child", action="store_true",
                   help="skip the fresh-process native baseline of upstream-det (its ratio is then only to this "
                        "process's native)")
    p.add_argument("--time-budget", type=_seconds, default=None, metavar="SECONDS",
                   help="start no new shape or child process after this many seconds (skipped work is marked, exit "
                        "status 1); a child still running 15 s after it is killed")
    p.add_argument("--device", default="cuda",
                   help="cuda or cuda:N (default); cpu runs the harness on the reference path in fp32 "
                        "(ordered/literal only): a smoke test, not a benchmark")
    p.add_argument("--merge", nargs="+", default=None, metavar="BENCH_JSON",
                   help="measure nothing: combine earlier bench.json files (a later file's shape replaces an "
                        "earlier one of the same name) and write the table, JSON and chart to --out")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--_child-spec", dest="child_spec", default=None, help=argparse.SUPPRESS)
    return p


# ----------------------------------------------------------------------------------------------- requirements
def missing_requirements(device: str, modes: Sequence[str], *, cuda_available: Optional[bool] = None,
                         find_spec: Callable = importlib.util.find_spec,
                         native_path: Optional[Callable] = None) -> Optional[str]:
    """``None`` if ``modes`` can run on ``device`` here, else a one-line message naming what is missing and the
    install command. ``cuda_available`` / ``find_spec`` / ``native_path`` override the probes (for tests)."""
    try:
        dev_type = torch.device(device).type
    except (RuntimeError, TypeError):
        return f"--device: expected cuda, cuda:N or cpu, got {device!r}"
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    absent = [n for m, n in (("mamba_ssm", "mamba-ssm"), ("causal_conv1d", "causal-conv1d"), ("triton", "triton"))
              if find_spec(m) is None]
    if dev_type == "cpu":
        gpu_modes = [m for m in modes if m in ("native", "upstream-det")]
        if gpu_modes:
            return (f"--modes {','.join(gpu_modes)} need a CUDA device and mamba-ssm ({INSTALL}); "
                    f"on the CPU only ordered,literal run (a smoke test of the harness)")
        return None
    if dev_type != "cuda":
        return f"--device: expected cuda, cuda:N or cpu, got {device!r}"
    problems = []
    if not cuda_available:
        problems.append(f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)")
    if absent:
        problems.append(", ".join(absent) + " not installed")
    if problems:
        return (" and ".join(problems) + f"; the benchmark needs a CUDA GPU and the native extras: {INSTALL}")
    if any(m in modes for m in ("ordered", "literal")):
        if native_path is None:
            from .mamba2 import native_path_available as native_path
        ok, why = native_path()
        if not ok:
            return f"OrderedMamba2's native path is unavailable here ({why}); {INSTALL}"
    return None


# ----------------------------------------------------------------------------------------------- one layer
def _share_parameters(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Make ``dst`` use ``src``'s parameter tensors (same names and shapes required)."""
    dst.load_state_dict(src.state_dict(), strict=True)  # also checks names and shapes
    src_params = dict(src.named_parameters())
    for name in [n for n, _ in dst.named_parameters()]:
        if name not in src_params:
            raise BenchError(f"internal: parameter {name} of {type(dst).__name__} has no counterpart")
        path, _, leaf = name.rpartition(".")
        setattr(dst.get_submodule(path) if path else dst, leaf, src_params[name])


class LayerRunner:
    """One shape's layers (sharing parameters) and inputs; ``step(mode)`` runs one training step.

    ``mode`` is ``native`` (mamba-ssm ``Mamba2``; in an upstream-det child this is the deterministic one),
    ``ordered`` or ``literal`` (``OrderedMamba2`` with ``literal`` False / True). On CUDA: fp32 parameters, bf16
    ``u``/``dout`` [B, L, d_model], autocast bf16. On the CPU: fp32 everything, no autocast.
    """

    def __init__(self, shape: Shape, modes: Iterable[str], device: torch.device, seed: int):
        from .mamba2 import OrderedMamba2

        self.device = device
        self.cuda = device.type == "cuda"
        kw = dict(d_model=shape.d_model, d_state=shape.N, d_conv=4, expand=2, headdim=shape.headdim,
                  ngroups=shape.G, chunk_size=shape.chunk)
        torch.manual_seed(seed)
        self.ordered = OrderedMamba2(**kw, device=device)  # fp32 parameters
        self.layers = {"ordered": self.ordered, "literal": self.ordered}
        if "native" in modes:
            from mamba_ssm.modules.mamba2 import Mamba2

            native = Mamba2(**kw, device=device)
            _share_parameters(native, self.ordered)
            self.layers["native"] = native
        self.params = list(self.ordered.named_parameters())
        self.in_dtype = torch.bfloat16 if self.cuda else torch.float32
        g = torch.Generator(device=device).manual_seed(seed + 1)
        shp = (shape.B, shape.L, shape.d_model)
        self.u = torch.randn(shp, generator=g, device=device).to(self.in_dtype).requires_grad_(True)
        self.dout = torch.randn(shp, generator=g, device=device).to(self.in_dtype)

    def zero_grads(self) -> None:
        for _, p in self.params:
            p.grad = None
        self.u.grad = None

    def step(self, mode: str) -> None:
        layer = self.layers[mode]
        if mode != "native":
            layer.literal = mode == "literal"
        self.zero_grads()
        if self.cuda:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = layer(self.u)
        else:
            out = layer(self.u)
        out.backward(self.dout)

    def grad_digests(self) -> Dict[str, str]:
        from .digest import tensor_sha256

        d = {name: (tensor_sha256(p.grad) if p.grad is not None else "none") for name, p in self.params}
        d["input"] = tensor_sha256(self.u.grad) if self.u.grad is not None else "none"
        return d


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stats(ms: List[float]) -> dict:
    q = statistics.quantiles(ms, n=4) if len(ms) >= 2 else [ms[0]] * 3
    return {"ms": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms), "ms_q1": q[0], "ms_q3": q[2],
            "n": len(ms), "ms_all": [round(t, 4) for t in ms]}


def time_interleaved(step: Callable[[str], None], modes: Sequence[str], repeats: int, device: torch.device,
                     before: Optional[Callable[[], None]] = None,
                     host: Optional[Dict[str, List[float]]] = None) -> Dict[str, List[float]]:
    """Run ``repeats`` rounds; each round runs ``step(m)`` once for every mode, starting at mode ``round % len``
    (rotating order). Returns the milliseconds of every step per mode, in round order. CUDA: one pair of
    ``torch.cuda.Event``s per step, no synchronisation between steps (read after the last round); CPU:
    ``time.perf_counter``. ``before()`` runs before each step, outside the timed region. ``host``: if given, gets
    the host (Python) milliseconds of every call ``step(m)`` per mode (on CUDA: the time to enqueue the step)."""
    modes = list(modes)
    times: Dict[str, List[float]] = {m: [] for m in modes}
    cuda = device.type == "cuda"
    pending = []
    for r in range(repeats):
        k = r % len(modes)
        for m in modes[k:] + modes[:k]:
            if before is not None:
                before()
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                t0 = time.perf_counter()
                step(m)
                t1 = time.perf_counter()
                e.record()
                pending.append((m, s, e))
            else:
                t0 = time.perf_counter()
                step(m)
                t1 = time.perf_counter()
                times[m].append(1000.0 * (t1 - t0))
            if host is not None:
                host.setdefault(m, []).append(1000.0 * (t1 - t0))
    if cuda:
        torch.cuda.synchronize(device)
        for m, s, e in pending:
            times[m].append(s.elapsed_time(e))
    return times


def _peak_memory(runner: LayerRunner, mode: str) -> dict:
    runner.zero_grads()
    gc.collect()
    if not runner.cuda:
        runner.step(mode)
        return {"peak_mib": None, "step_mib": None}
    dev = runner.device
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    runner.step(mode)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    return {"peak_mib": peak / MiB, "step_mib": (peak - base) / MiB, "resident_mib": base / MiB}


def _bit_check(runner: LayerRunner, mode: str, repeats: int) -> dict:
    first, distinct, differing = None, set(), set()
    for _ in range(repeats):
        runner.step(mode)
        d = runner.grad_digests()
        distinct.add(json.dumps(d, sort_keys=True))
        if first is None:
            first = d
        else:
            differing.update(k for k in d if d[k] != first[k])
    runner.zero_grads()
    return {"bitwise": len(distinct) == 1, "bit_repeats": repeats, "distinct_digest_sets": len(distinct),
            "differing": sorted(differing), "digests": first,
            "grads_sha256": hashlib.sha256(json.dumps(first, sort_keys=True).encode()).hexdigest()}


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bench_shape(shape: Shape, modes: Sequence[str], settings: dict, device: torch.device,
                log: Callable[[str], None] = lambda s: None) -> dict:
    """Warm up, time (interleaved), measure peak memory and check the bits of every in-process mode of one
    shape. Returns ``{"name", "dims", "spec", "rows": {mode: row}}``; a mode that raises gets ``{"error": ...}``
    and the others go on. ``settings``: ``repeats``, ``warmup``, ``bit_repeats``, ``seed``."""
    res = {"name": shape.name, "dims": shape.dims(), "spec": shape.spec(), "shape": asdict(shape), "rows": {}}
    rows = res["rows"]
    try:
        runner = LayerRunner(shape, modes, device, settings["seed"])
    except Exception as e:  # noqa: BLE001 - recorded in the row; the suite goes on
        for m in modes:
            rows[m] = {"mode": m, "error": "building the layer: " + _err(e)}
        _free(device)
        return res
    alive = []
    for m in modes:
        try:
            t0 = time.perf_counter()
            for _ in range(settings["warmup"]):
                runner.step(m)
            _sync(device)
            alive.append(m)
            rows[m] = {"mode": m, "process": "this", "warmup_s": round(time.perf_counter() - t0, 3)}
            log(f"{shape.name} {m}: warm-up {settings['warmup']} steps {time.perf_counter() - t0:.1f} s")
        except Exception as e:  # noqa: BLE001
            rows[m] = {"mode": m, "error": "warm-up: " + _err(e)}
            log(f"{shape.name} {m}: {rows[m]['error']}")
            runner.zero_grads()
            _free(device)
    if alive:
        try:
            host: Dict[str, List[float]] = {}
            times = time_interleaved(runner.step, alive, settings["repeats"], device, before=runner.zero_grads,
                                     host=host)
            for m in alive:
                rows[m].update(_stats(times[m]))
                rows[m]["host_ms"] = statistics.median(host[m])
            if "native" in times:
                for m in alive:
                    paired = [a / b for a, b in zip(times[m], times["native"]) if b > 0]
                    rows[m]["ratio_ms_paired"] = statistics.median(paired) if paired else None
            log(f"{shape.name}: " + ", ".join(f"{m} {rows[m]['ms']:.3f} ms" for m in alive))
        except Exception as e:  # noqa: BLE001
            for m in alive:
                rows[m]["error"] = "timing: " + _err(e)
            alive = []
    for phase in ("memory", "bits"):  # each mode in its own phase (peaks do not mix)
        for m in list(alive):
            try:
                rows[m].update(_peak_memory(runner, m) if phase == "memory"
                               else _bit_check(runner, m, settings["bit_repeats"]))
            except Exception as e:  # noqa: BLE001
                rows[m]["error"] = f"{phase}: " + _err(e)
                alive.remove(m)
                runner.zero_grads()
                _free(device)
    if "ordered" in alive and "literal" in alive:
        rows["literal"]["same_bits_as_ordered"] = rows["literal"]["digests"] == rows["ordered"]["digests"]
    runner.zero_grads()
    del runner
    _free(device)
    return res


def finalize_ratios(shape_res: dict) -> None:
    """Fill ``ratio_ms`` / ``ratio_mem`` of every row (to this process's native row), and for upstream-det also
    ``ratio_ms_child`` / ``ratio_mem_child`` (to the native measured in its own fresh child process)."""
    rows = shape_res["rows"]
    nat = rows.get("native") or {}

    def ratio(a, b):
        return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None

    for m, r in rows.items():
        if r.get("error"):
            continue
        r["ratio_ms"] = ratio(r.get("ms"), nat.get("ms")) if not nat.get("error") else None
        r["ratio_mem"] = ratio(r.get("peak_mib"), nat.get("peak_mib")) if not nat.get("error") else None
        child = r.get("child_native")
        if m == "upstream-det" and child and not child.get("error"):
            r["ratio_ms_child"] = ratio(r.get("ms"), child.get("ms"))
            r["ratio_mem_child"] = ratio(r.get("peak_mib"), child.get("peak_mib"))


# ----------------------------------------------------------------------------------------------- child processes
def _child_env(kind: str) -> dict:
    env = dict(os.environ)
    for k in DET_ENV:
        env.pop(k, None)
    if kind == "upstream-det":
        env.update({k: "1" for k in DET_ENV})
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_child(kind: str, shapes: Sequence[Shape], settings: dict, device: str, *, mode: str = "native",
              deadline: Optional[float] = None, log: Callable[[str], None] = lambda s: None) -> dict:
    """Run ``mode`` for every shape in a fresh ``python -m ordered_ssd.bench`` process.

    ``kind`` ``"upstream-det"`` sets ``MAMBA_DETERMINISTIC=1`` and ``CAUSAL_CONV1D_DETERMINISTIC=1`` in the
    child's environment only; ``"native"`` removes both. The child prints one JSON line per shape (marker
    :data:`CHILD_MARK`) and a final one with everything. ``deadline`` (``time.monotonic()`` value): the child
    starts no shape after it and is killed at it. Returns ``{"kind", "returncode", "meta", "shapes": {name:
    shape result}, "error"}``; a shape the child did not report has ``{"error": ...}`` rows. Raises
    ``ValueError`` for another ``kind``; a failing child is reported in ``error``, never raised.
    """
    if kind not in ("upstream-det", "native"):
        raise ValueError(f"kind: expected 'upstream-det' or 'native', got {kind!r}")
    spec = {"kind": kind, "mode": mode, "device": device, "settings": settings,
            "shapes": [asdict(s) for s in shapes],
            "time_budget": None if deadline is None else max(1.0, deadline - time.monotonic())}
    cmd = [sys.executable, "-m", "ordered_ssd.bench", "--_child-spec", json.dumps(spec)]
    out = {"kind": kind, "returncode": None, "meta": None, "shapes": {}, "error": None}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=_child_env(kind), cwd=os.getcwd(), stdout=subprocess.PIPE, stderr=None,
                            stdin=subprocess.DEVNULL, text=True)
    timer = None
    killed = threading.Event()
    if deadline is not None:
        def _kill():
            killed.set()
            proc.kill()
        timer = threading.Timer(max(1.0, deadline - time.monotonic() + 15.0), _kill)
        timer.daemon = True
        timer.start()
    try:
        for line in proc.stdout:
            if not line.startswith(CHILD_MARK):  # something else printed to stdout: show it, with stderr
                sys.stderr.write(line)
                continue
            try:
                msg = json.loads(line[len(CHILD_MARK):])
            except json.JSONDecodeError:
                continue
            if msg.get("type") == "shape":
                out["shapes"][msg["result"]["name"]] = msg["result"]
                log(f"{kind} child: {msg['result']['name']} done")
            elif msg.get("type") == "done":
                out["meta"] = msg.get("meta")
                out["shapes"].update({r["name"]: r for r in msg.get("shapes", [])})
        proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out["returncode"] = proc.returncode
    out["wall_s"] = round(time.monotonic() - t0, 1)
    if killed.is_set():
        out["error"] = "stopped at the time budget"
    elif proc.returncode != 0:
        out["error"] = f"child exited with status {proc.returncode} (its stderr is above)"
    for s in shapes:
        if s.name not in out["shapes"]:
            why = out["error"] or "not reported by the child"
            out["shapes"][s.name] = {"name": s.name, "dims": s.dims(), "spec": s.spec(), "shape": asdict(s),
                                     "rows": {mode: {"mode": mode, "error": f"{kind} child: {why}"}}}
    return out


def _child_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    deadline = None if spec.get("time_budget") is None else time.monotonic() + float(spec["time_budget"])
    device = _resolve_device(spec["device"], index=_device_is_cuda(spec["device"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mode = spec["mode"]
    env = {k: os.environ.get(k) for k in DET_ENV + ("TRITON_CACHE_AUTOTUNING",)}
    meta = {"kind": spec["kind"], "mode": mode, "pid": os.getpid(), "env": env, "deterministic_mode": None}
    if mode == "native" and device.type == "cuda":
        try:
            from mamba_ssm.utils.determinism import use_deterministic_mode

            meta["deterministic_mode"] = bool(use_deterministic_mode())
        except ImportError as e:
            meta["deterministic_mode"] = f"unknown ({e})"
    log = lambda s: print(f"[bench {spec['kind']} child] {s}", file=sys.stderr, flush=True)  # noqa: E731
    results = []
    for sd in spec["shapes"]:
        shape = Shape(**sd)
        if deadline is not None and time.monotonic() > deadline:
            r = {"name": shape.name, "dims": shape.dims(), "spec": shape.spec(), "shape": sd,
                 "rows": {mode: {"mode": mode, "error": "skipped: time budget"}}}
        else:
            r = bench_shape(shape, [mode], spec["settings"], device, log=log)
        results.append(r)
        print(CHILD_MARK + json.dumps({"type": "shape", "result": r}, default=str), flush=True)
    print(CHILD_MARK + json.dumps({"type": "done", "meta": meta, "shapes": results}, default=str), flush=True)
    return EXIT_OK


# ----------------------------------------------------------------------------------------------- breakdown
def kernel_category(name: str) -> str:
    """The group of a GPU kernel name, for the breakdown: ``fold (ordered-ssd)``, ``SSD (mamba-ssm Triton)``,
    ``gated RMSNorm / SwiGLU (Triton)``, ``causal-conv1d``, ``GEMM (cuBLAS)``, ``memcpy/memset``,
    ``torch elementwise/reduce`` or ``other``."""
    n = name.strip()
    if n.startswith("void "):
        n = n[5:]
    low = n.lower()
    if n.startswith(("fold_kernel", "scan_kernel")):
        return "fold (ordered-ssd)"
    if n.startswith(("_chunk_", "_bmm_chunk", "_state_passing")):
        return "SSD (mamba-ssm Triton)"
    if n.startswith(("_layer_norm", "_swiglu")):
        return "gated RMSNorm / SwiGLU (Triton)"
    if "causal_conv1d" in low:
        return "causal-conv1d"
    if any(k in low for k in ("gemm", "cutlass", "nvjet", "xmma", "cublas", "gemv", "splitkreduce", "sm90_",
                              "sm80_")):
        return "GEMM (cuBLAS)"
    if "memcpy" in low or "memset" in low:
        return "memcpy/memset"
    if "at::native" in n or "elementwise" in low or "reduce_kernel" in low:
        return "torch elementwise/reduce"
    return "other"


def aggregate_kernels(events: Iterable[tuple], steps: int) -> List[dict]:
    """``events``: ``(name, microseconds)`` per kernel launch (or ``(name, us, count)`` pre-aggregated) over
    ``steps`` steps. Returns one dict per name ``{"name", "category", "calls_per_step", "ms_per_step"}``,
    slowest first."""
    acc: Dict[str, list] = {}
    for ev in events:
        name, us = ev[0], float(ev[1])
        count = int(ev[2]) if len(ev) > 2 else 1
        a = acc.setdefault(name, [0.0, 0])
        a[0] += us
        a[1] += count
    rows = [{"name": n, "category": kernel_category(n), "calls_per_step": c / steps,
             "ms_per_step": us / 1000.0 / steps} for n, (us, c) in acc.items()]
    rows.sort(key=lambda r: (-r["ms_per_step"], r["name"]))
    return rows


def _profile_mode(runner: LayerRunner, mode: str, steps: int) -> List[tuple]:
    from torch.profiler import ProfilerActivity, profile

    cuda = runner.cuda
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(runner.device)
    with profile(activities=acts) as prof:
        for _ in range(steps):
            runner.step(mode)
        _sync(runner.device)
    if cuda:
        evs = []
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA"):
                evs.append((e.name, e.time_range.elapsed_us()))
        return evs
    return [(k.key, k.self_cpu_time_total, k.count) for k in prof.key_averages() if k.self_cpu_time_total > 0]


def profile_breakdown(shape: Shape, modes: Sequence[str], settings: dict, device: torch.device, steps: int,
                      log: Callable[[str], None] = lambda s: None) -> dict:
    """Per-kernel GPU time of ``steps`` steps of each mode (after ``settings["warmup"]`` untimed steps, at least
    one), with ``torch.profiler``. On the CPU: self CPU time per operator instead. Returns
    ``{"shape", "dims", "steps", "unit", "modes": {mode: {"kernels": [...], "total_ms_per_step", "error"}}}``."""
    out = {"shape": shape.name, "dims": shape.dims(), "steps": steps,
           "unit": "GPU kernel time (CUDA activity)" if device.type == "cuda" else "self CPU time per operator",
           "modes": {}}
    runner = LayerRunner(shape, modes, device, settings["seed"])
    try:
        for m in modes:
            try:
                for _ in range(max(1, settings["warmup"])):
                    runner.step(m)
                kernels = aggregate_kernels(_profile_mode(runner, m, steps), steps)
                cats: Dict[str, float] = {}
                for k in kernels:
                    cats[k["category"]] = cats.get(k["category"], 0.0) + k["ms_per_step"]
                out["modes"][m] = {"kernels": kernels, "categories": cats, "error": None,
                                   "total_ms_per_step": sum(k["ms_per_step"] for k in kernels)}
                log(f"breakdown {shape.name} {m}: {len(kernels)} kernels, "
                    f"{out['modes'][m]['total_ms_per_step']:.3f} ms/step")
            except Exception as e:  # noqa: BLE001
                out["modes"][m] = {"kernels": [], "categories": {}, "total_ms_per_step": None, "error": _err(e)}
            runner.zero_grads()
    finally:
        del runner
        _free(device)
    return out


def _short(name: str, width: int = 72) -> str:
    n = name[5:] if name.startswith("void ") else name
    n = n.replace("|", "\\|")
    return n if len(n) <= width else n[:width - 1] + "…"


def format_breakdown(bd: dict, top: int = 40) -> str:
    """Markdown: per category and per kernel (``top`` slowest names, the rest summed), ms and calls per step for
    every profiled mode, and the difference ordered - native when both are present."""
    modes = [m for m in ("native", "literal", "ordered") if m in bd["modes"]]
    both = "native" in modes and "ordered" in modes
    lines = [f"# Per-kernel breakdown: {bd['shape']} ({bd['dims']})", "",
             f"{bd['unit']}, per step, summed over {bd['steps']} profiled steps per mode after warm-up "
             f"(torch.profiler).", ""]
    for m in modes:
        if bd["modes"][m].get("error"):
            lines.append(f"- {m}: error: {bd['modes'][m]['error']}")
    lines += ["", "## By category", ""]
    head = "| category | " + " | ".join(f"{m} ms" for m in modes) + (" | ordered - native ms |" if both else " |")
    lines += [head, "|" + "---|" * (1 + len(modes) + (1 if both else 0))]
    cats = sorted({c for m in modes for c in bd["modes"][m].get("categories", {})},
                  key=lambda c: -max(bd["modes"][m].get("categories", {}).get(c, 0.0) for m in modes))
    for c in cats + ["total"]:
        vals = [(bd["modes"][m].get("total_ms_per_step") if c == "total"
                 else bd["modes"][m].get("categories", {}).get(c, 0.0)) for m in modes]
        cells = [f"{v:.3f}" if v is not None else "—" for v in vals]
        if both:
            a, b = vals[modes.index("ordered")], vals[modes.index("native")]
            cells.append(f"{a - b:+.3f}" if a is not None and b is not None else "—")
        lines.append(f"| {'**total**' if c == 'total' else c} | " + " | ".join(cells) + " |")
    lines += ["", "## By kernel", ""]
    head = ("| kernel | category | " + " | ".join(f"{m} calls | {m} ms" for m in modes)
            + (" | ordered - native ms |" if both else " |"))
    lines += [head, "|" + "---|" * (2 + 2 * len(modes) + (1 if both else 0))]
    table: Dict[str, dict] = {}
    for m in modes:
        for k in bd["modes"][m].get("kernels", []):
            t = table.setdefault(k["name"], {"category": k["category"]})
            t[m] = k
    names = sorted(table, key=lambda n: -max(table[n].get(m, {}).get("ms_per_step", 0.0) for m in modes))
    rest = names[top:]

    def delta(n: str) -> float:
        return table[n].get("ordered", {}).get("ms_per_step", 0.0) - table[n].get("native", {}).get("ms_per_step", 0.0)

    for n in names[:top]:
        cells = []
        for m in modes:
            k = table[n].get(m)
            cells += [f"{k['calls_per_step']:g}", f"{k['ms_per_step']:.3f}"] if k else ["0", "0"]
        if both:
            cells.append(f"{delta(n):+.3f}")
        lines.append(f"| `{_short(n)}` | {table[n]['category']} | " + " | ".join(cells) + " |")
    if rest:
        cells = []
        for m in modes:
            cells += [f"{sum(table[n].get(m, {}).get('calls_per_step', 0) for n in rest):g}",
                      f"{sum(table[n].get(m, {}).get('ms_per_step', 0.0) for n in rest):.3f}"]
        if both:
            cells.append(f"{sum(delta(n) for n in rest):+.3f}")
        lines.append(f"| ({len(rest)} other kernels) | | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- output
def _f(v, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and v is not None else "—"


def _bits_cell(r: dict) -> str:
    if r.get("bitwise") is None:
        return "—"
    n = r.get("bit_repeats", "?")
    if r["bitwise"]:
        return f"yes ({n}/{n})"
    return f"**no** ({r.get('distinct_digest_sets', '?')} distinct of {n})"


def format_table(results: dict) -> str:
    """The markdown report of ``results`` (the ``bench.json`` structure): a header with the machine, versions
    and method, then one row per (shape, mode): ms/step, ratio to native, peak MiB, ratio, bitwise over N."""
    meta = results.get("meta", {})
    v = meta.get("versions", {})
    lines = ["# ordered-ssd bench: one Mamba-2 layer, forward + backward", ""]
    lines.append(f"{meta.get('gpu') or meta.get('device', '?')} · torch {v.get('torch')} · "
                 f"triton {v.get('triton')} · mamba-ssm {v.get('mamba-ssm')} · "
                 f"causal-conv1d {v.get('causal-conv1d')} · ordered-ssd {v.get('ordered-ssd')} · "
                 f"{meta.get('date', '?')}")
    lines.append("")
    s = meta.get("settings", {})
    lines.append(f"{meta.get('precision', '')}; median of {s.get('repeats')} interleaved steps per mode after "
                 f"{s.get('warmup')} warm-up steps ({meta.get('timer', '')}); peak = max_memory_allocated over one "
                 f"step, per mode in its own phase; bitwise = the SHA-256 of every parameter gradient and of the "
                 f"input gradient agree over {s.get('bit_repeats')} steps.")
    if meta.get("command"):
        lines += ["", f"Command: `{meta['command']}`"]
    lines += ["", "| shape | dims | mode | ms/step | × native | × native (child) | peak MiB | × native | "
                  "bitwise |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    notes = []
    for sr in results.get("shapes", []):
        for m in MODES:
            r = sr.get("rows", {}).get(m)
            if r is None:
                continue
            if r.get("error"):
                lines.append(f"| {sr['name']} | {sr['dims']} | {m} | — | — | — | — | — | error¹ |")
                notes.append(f"{sr['name']} {m}: {r['error']}")
                continue
            child = ""
            if m == "upstream-det":
                child = _f(r.get("ratio_ms_child"), ".3f")
                if r.get("ratio_mem_child") is not None:
                    child += f" (mem {_f(r.get('ratio_mem_child'), '.3f')})"
            bits = _bits_cell(r)
            if m == "upstream-det" and r.get("deterministic_mode") is False:
                bits += " (child NOT in deterministic mode!)"
            if m == "literal" and r.get("same_bits_as_ordered") is not None:
                bits += ", = ordered" if r["same_bits_as_ordered"] else ", **≠ ordered**"
            lines.append(f"| {sr['name']} | {sr['dims']} | {m} | {_f(r.get('ms'), '.3f')} | "
                         f"{_f(r.get('ratio_ms'), '.3f')} | {child} | {_f(r.get('peak_mib'), '.0f')} | "
                         f"{_f(r.get('ratio_mem'), '.3f')} | {bits} |")
    lines += ["", "× native: to the native median measured in this process (interleaved). × native (child), "
                  "upstream-det only: to the native median measured by the same harness in a fresh process "
                  "without the deterministic switches."]
    if notes:
        lines += ["", "¹ " + "; ".join(notes)]
    return "\n".join(lines) + "\n"


def write_plot(path: str, results: dict) -> Optional[str]:
    """A PNG bar chart (ms/step; step-time and peak-memory ratios to native) of ``results``. Returns ``None``, or a
    message if matplotlib is missing (``pip install ordered-ssd[bench]``); writes atomically."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install ordered-ssd[bench]); chart skipped"

    shapes = [sr["name"] for sr in results.get("shapes", [])]
    modes = [m for m in MODES if any(m in sr.get("rows", {}) for sr in results.get("shapes", []))]
    colors = {"native": "#7f7f7f", "upstream-det": "#d62728", "literal": "#ff7f0e", "ordered": "#1f77b4"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / max(1, len(modes))
    for ax, key, title, target in ((axes[0], "ms", "ms / step (log)", None),
                                   (axes[1], "ratio_ms", "step time / native", 1.05),
                                   (axes[2], "ratio_mem", "peak memory / native", 1.10)):
        for i, m in enumerate(modes):
            xs, ys = [], []
            for j, sr in enumerate(results.get("shapes", [])):
                r = sr.get("rows", {}).get(m) or {}
                val = r.get(key) if not r.get("error") else None
                if isinstance(val, (int, float)):
                    xs.append(j + (i - (len(modes) - 1) / 2) * width)
                    ys.append(val)
            if xs:
                ax.bar(xs, ys, width=width, label=m, color=colors.get(m))
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes)
        ax.set_title(title)
        if key == "ms":
            ax.set_yscale("log")
        else:
            vals = [v for c in ax.containers for v in c.datavalues]
            if key == "ratio_ms" and vals and max(vals) > 4:  # e.g. literal at 30x: keep the 1.05 target readable
                ax.set_yscale("log")
                ax.set_title(title + " (log)")
            ax.axhline(1.0, color="k", linewidth=0.8)
            if target:
                ax.axhline(target, color="k", linestyle="--", linewidth=0.8, label=f"target {target}")
    for ax in axes[:2]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"ordered-ssd bench: {results.get('meta', {}).get('gpu') or results.get('meta', {}).get('device')}")
    atomic_savefig(path, fig, dpi=100)
    return None


def write_results(out_dir: str, results: dict, plot: bool = True) -> dict:
    """Write ``bench.md``, ``bench.json`` and (``plot``) ``bench.png`` under ``out_dir`` (atomically). Returns
    ``{"md", "json", "png", "png_note"}`` paths (``png`` None when skipped, with the reason in ``png_note``).
    ``out_dir`` must exist; ``OSError`` from writing propagates (nothing half-written: temporary file + rename)."""
    md = os.path.join(out_dir, "bench.md")
    js = os.path.join(out_dir, "bench.json")
    png = os.path.join(out_dir, "bench.png")
    atomic_write_bytes(md, format_table(results).encode())
    atomic_write_bytes(js, (json.dumps(results, indent=1, sort_keys=True, default=str) + "\n").encode())
    note = write_plot(png, results) if plot else "not requested"
    return {"md": md, "json": js, "png": None if note else png, "png_note": note}


def write_breakdown(out_dir: str, bd: dict) -> None:
    atomic_write_bytes(os.path.join(out_dir, "breakdown.md"), format_breakdown(bd).encode())
    data = json.dumps(bd, indent=1, sort_keys=True, default=str) + "\n"
    atomic_write_bytes(os.path.join(out_dir, "breakdown.json"), data.encode())


def _prepare_out(path: str) -> str:
    from .check import CheckError, prepare_out_dir

    try:
        return prepare_out_dir(path)
    except CheckError as e:
        raise BenchError(str(e)) from None


# ----------------------------------------------------------------------------------------------- driver
def _meta(device: torch.device, settings: dict, argv: Sequence[str], prog: str) -> dict:
    from .fingerprint import package_versions

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "versions": package_versions(), "device": str(device), "gpu": None, "settings": settings,
            "command": " ".join([prog] + list(argv)),
            "precision": ("fp32 parameters, bf16 u/dout, torch.autocast('cuda', dtype=torch.bfloat16)"
                          if device.type == "cuda" else "fp32 parameters and inputs (CPU reference path)"),
            "timer": "torch.cuda.Event per step" if device.type == "cuda" else "time.perf_counter per step",
            "parent_env": {k: os.environ.get(k) for k in DET_ENV + ("TRITON_CACHE_AUTOTUNING",)},
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        meta["gpu"] = "%s (sm_%d%d)" % ((torch.cuda.get_device_name(idx),) + torch.cuda.get_device_capability(idx))
        meta["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        try:
            import csrc_bindings

            meta["pinned_configs"] = csrc_bindings.fingerprint()
        except Exception as e:  # noqa: BLE001
            meta["pinned_configs"] = f"unavailable: {_err(e)}"
    return meta


def _pinned(shape: Shape, device: torch.device) -> Optional[dict]:
    if device.type != "cuda":
        return None
    try:
        import csrc_bindings

        d = csrc_bindings.describe_launch(chunk_size=shape.chunk, headdim=shape.headdim, dstate=shape.N,
                                          nheads=shape.nheads, ngroups=shape.G, dtype=torch.bfloat16, device=device)
        return {k: {"config": v.get("config"), "source": v.get("source")} for k, v in d["kernels"].items()}
    except Exception as e:  # noqa: BLE001
        return {"error": _err(e)}


def _device_is_cuda(text: str) -> bool:
    return str(text).strip().lower().startswith("cuda")


def _resolve_device(text: str, index: bool = False) -> torch.device:
    """``cpu`` / ``cuda`` / ``cuda:N`` -> a torch.device (``index``: ``cuda`` becomes ``cuda:<current>``, which
    ``torch.cuda.set_device`` needs). Raises :class:`BenchError` for anything else."""
    try:
        dev = torch.device(text)
    except (RuntimeError, TypeError):
        raise BenchError(f"--device: expected cuda, cuda:N or cpu, got {text!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise BenchError(f"--device: expected cuda, cuda:N or cpu, got {text!r}")
    if index and dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _resolve_shapes(args) -> List[Shape]:
    shapes = list(args.shapes or [])
    for i, s in enumerate(args.shape, 1):
        shapes.append(Shape(f"X{i}" if s.name == s.spec() else s.name, s.B, s.L, s.d_model, s.N, s.G, s.headdim,
                            s.chunk))
    if not shapes:
        shapes = list(SHAPES.values())
    return shapes


def _merge(paths: Sequence[str]) -> dict:
    merged, order, meta = {}, [], None
    for p in paths:
        try:
            with open(p) as fh:
                r = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            raise BenchError(f"--merge: cannot read {p}: {e}") from None
        if not isinstance(r, dict) or not isinstance(r.get("shapes"), list):
            raise BenchError(f"--merge: {p} is not a bench.json (no 'shapes' list)")
        meta = meta or dict(r.get("meta", {}))
        for sr in r["shapes"]:
            if sr["name"] not in merged:
                order.append(sr["name"])
            merged[sr["name"]] = sr
    meta["merged_from"] = [os.path.abspath(p) for p in paths]
    return {"meta": meta, "shapes": [merged[n] for n in order]}


def run(args, argv: Sequence[str] = (), prog: str = "ordered-ssd bench") -> int:
    """Run the suite for parsed ``args`` (see :func:`build_parser`); print the table; return the exit status
    (0 everything measured, 1 some rows failed or were skipped, 2 usage). Raises :class:`BenchError`."""
    log = (lambda s: None) if args.quiet else (lambda s: print(f"[bench] {s}", file=sys.stderr, flush=True))
    if args.merge:
        out = _prepare_out(args.out)
        results = _merge(args.merge)
        paths = write_results(out, results)
        sys.stdout.write(format_table(results))
        print(f"\nwrote {paths['md']}, {paths['json']}" + (f", {paths['png']}" if paths["png"] else
                                                             f" ({paths['png_note']})"))
        return EXIT_OK
    t_start = time.monotonic()
    deadline = None if args.time_budget is None else t_start + args.time_budget
    device = _resolve_device(args.device)
    modes = args.modes or (list(MODES) if device.type == "cuda" else ["ordered"])
    shapes = _resolve_shapes(args)
    if device.type == "cpu" and not args.shape and not args.shapes:
        raise BenchError("--device cpu: give a small --shape (S1-S5 are GPU sizes)")
    missing = missing_requirements(args.device, modes)
    if missing:
        raise BenchError(missing)
    if "native" in modes and any(os.environ.get(k) for k in DET_ENV):
        raise BenchError(f"{' / '.join(k for k in DET_ENV if os.environ.get(k))} is set in this process, so "
                         "'native' would not be native: unset it (upstream-det sets it for its own child only)")
    if "native" in modes and torch.are_deterministic_algorithms_enabled():
        raise BenchError("torch.use_deterministic_algorithms is on: mamba-ssm would run its deterministic mode "
                         "as 'native'")
    bd_shape = None
    if args.breakdown:
        name = args.breakdown_shape.strip()
        try:
            bd_shape = named_or_parsed_shape(name)
        except ValueError as e:
            raise BenchError(str(e).replace("--shape", "--breakdown-shape", 1)) from None
    if device.type == "cuda":
        device = _resolve_device(args.device, index=True)
        torch.cuda.set_device(device)
    out = _prepare_out(args.out)
    settings = {"repeats": args.repeats, "warmup": args.warmup, "bit_repeats": args.bit_repeats, "seed": args.seed}
    results = {"meta": _meta(device, settings, argv, prog), "modes": modes, "children": {},
               "shapes": [{"name": s.name, "dims": s.dims(), "spec": s.spec(), "shape": asdict(s), "rows": {},
                           "pinned": _pinned(s, device)} for s in shapes]}
    by_name = {sr["name"]: sr for sr in results["shapes"]}
    in_modes = [m for m in modes if m in IN_PROCESS_MODES]

    def over() -> bool:
        return deadline is not None and time.monotonic() > deadline

    def save() -> dict:
        for sr in results["shapes"]:
            finalize_ratios(sr)
        results["meta"]["elapsed_s"] = round(time.monotonic() - t_start, 1)
        return write_results(out, results)

    if in_modes:
        for s in shapes:
            if over():
                by_name[s.name]["rows"].update({m: {"mode": m, "error": "skipped: time budget"} for m in in_modes})
                continue
            log(f"{s.name} ({s.dims()}): {', '.join(in_modes)}")
            r = bench_shape(s, in_modes, settings, device, log=log)
            by_name[s.name]["rows"].update(r["rows"])
            save()
    if bd_shape is not None:
        bd_modes = [m for m in ("native", "ordered") if m in modes] or [m for m in in_modes[:1]]
        if over():
            log("breakdown skipped: time budget")
            results["breakdown"] = {"error": "skipped: time budget"}
        elif bd_modes:
            log(f"breakdown: {bd_shape.name} ({bd_shape.dims()}), {', '.join(bd_modes)}")
            try:
                bd = profile_breakdown(bd_shape, bd_modes, settings, device, args.breakdown_steps, log=log)
            except Exception as e:  # noqa: BLE001 - e.g. out of memory building the layer; the rest goes on
                results["breakdown"] = {"error": _err(e)}
                log(f"breakdown failed: {_err(e)}")
            else:
                write_breakdown(out, bd)
                results["breakdown"] = {"file": "breakdown.md", "shape": bd_shape.name, "total_ms_per_step": {
                    m: v["total_ms_per_step"] for m, v in bd["modes"].items()}}
            _free(device)
            save()
    if "upstream-det" in modes:
        kinds = ["upstream-det"] + ([] if args.no_native_child else ["native"])
        for kind in kinds:
            if over():
                results["children"][kind] = {"error": "skipped: time budget"}
                for sr in results["shapes"]:
                    if kind == "upstream-det":
                        sr["rows"]["upstream-det"] = {"mode": "upstream-det", "error": "skipped: time budget"}
                continue
            log(f"starting the {kind} child process ({len(shapes)} shapes)")
            _free(device)
            ch = run_child(kind, shapes, settings, str(device), deadline=deadline, log=log)
            results["children"][kind] = {k: ch[k] for k in ("returncode", "meta", "error", "wall_s")}
            for sr in results["shapes"]:
                row = dict(ch["shapes"][sr["name"]]["rows"]["native"])
                row["mode"] = "upstream-det" if kind == "upstream-det" else "native"
                row["process"] = f"child ({kind})"
                if kind == "upstream-det":
                    row["deterministic_mode"] = (ch.get("meta") or {}).get("deterministic_mode")
                    sr["rows"]["upstream-det"] = row
                elif "upstream-det" in sr["rows"]:
                    sr["rows"]["upstream-det"]["child_native"] = {k: row.get(k) for k in (
                        "ms", "ms_min", "ms_max", "n", "peak_mib", "step_mib", "bitwise", "error")}
            save()
    note = save()["png_note"]
    sys.stdout.write(format_table(results))
    if results.get("breakdown", {}).get("file"):
        print(f"\nper-kernel breakdown: {os.path.join(out, 'breakdown.md')}")
    print(f"\nwrote {os.path.join(out, 'bench.md')}, bench.json" + (f" ({note})" if note else ", bench.png"))
    complete = all(not r.get("error") for sr in results["shapes"] for r in sr["rows"].values())
    return EXIT_OK if complete else EXIT_INCOMPLETE


def main(argv: Optional[Sequence[str]] = None, prog: str = "ordered-ssd bench") -> int:
    """Entry point of ``ordered-ssd bench`` / ``benchmarks/bench_layer.py``. Returns the exit status: 0 all
    measured, 1 some rows failed or were skipped (time budget), 2 usage error or missing requirement (one line on
    stderr naming it and the install command). Argument errors exit 2 through argparse."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    if args.child_spec is not None:
        return _child_main(args.child_spec)
    try:
        return run(args, argv, prog)
    except BenchError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        sys.stderr.flush()
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
