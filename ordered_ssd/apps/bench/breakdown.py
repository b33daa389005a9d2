"""The per-kernel breakdown (``--breakdown``): ``torch.profiler`` over a few steps, kernel names grouped, markdown."""
from __future__ import annotations

import json
import os
from typing import Callable, Dict, Iterable, List, Sequence

import torch

from ..errors import plural
from ..files import atomic_write_bytes
from .runner import LayerRunner, error_text, free_memory, sync
from .shapes import Shape


def kernel_category(name: str) -> str:
    """The group of a GPU kernel name, for the breakdown: ``fold (ordered-ssd)``, ``SSD (mamba-ssm Triton)``,
    ``Mamba-3 (mamba-ssm Triton)``, ``gated RMSNorm / SwiGLU (Triton)``, ``causal-conv1d``, ``GEMM (cuBLAS)``,
    ``memcpy/memset``, ``torch elementwise/reduce`` or ``other``."""
    n = name.strip()
    if n.startswith("void "):
        n = n[5:]
    low = n.lower()
    # ordered-ssd's own kernels (ordered_ssd/fold/kernels.py)
    if n.startswith(("fold_kernel", "scan_kernel", "fold_many_kernel", "example_sums_kernel", "gemm_fold_",
                     "conv1d_grad_partials_kernel", "dA_cumsum_grad_kernel")):
        return "fold (ordered-ssd)"
    if n.startswith(("_chunk_", "_bmm_chunk", "_state_passing")):
        return "SSD (mamba-ssm Triton)"
    if n.startswith(("mamba3_siso_", "angle_dt_")):  # mamba_ssm/ops/triton/mamba3/ (csrc_bindings.mamba3)
        return "Mamba-3 (mamba-ssm Triton)"
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
    for event in events:
        name, us = event[0], float(event[1])
        count = int(event[2]) if len(event) > 2 else 1
        a = acc.setdefault(name, [0.0, 0])
        a[0] += us
        a[1] += count
    rows = [{"name": n, "category": kernel_category(n), "calls_per_step": c / steps,
             "ms_per_step": us / 1000.0 / steps} for n, (us, c) in acc.items()]
    rows.sort(key=lambda r: (-r["ms_per_step"], r["name"]))
    return rows


def profile_events(runner: LayerRunner, mode: str, steps: int) -> List[tuple]:
    """``steps`` steps of ``mode`` under ``torch.profiler``. CUDA: ``(name, microseconds)`` of every kernel, memset
    and memcpy the GPU ran; CPU: ``(operator, self CPU microseconds, calls)`` per operator."""
    from torch.profiler import ProfilerActivity, profile

    cuda = runner.cuda
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(runner.device)
    with profile(activities=acts) as prof:
        for _ in range(steps):
            runner.step(mode)
        sync(runner.device)
    if cuda:
        events = []
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA"):
                events.append((e.name, e.time_range.elapsed_us()))
        return events
    return [(k.key, k.self_cpu_time_total, k.count) for k in prof.key_averages() if k.self_cpu_time_total > 0]


def profile_breakdown(shape: Shape, modes: Sequence[str], settings: dict, device: torch.device, steps: int,
                      log: Callable[[str], None] = lambda s: None) -> dict:
    """Per-kernel GPU time of ``steps`` steps of each mode (after ``settings["warmup"]`` untimed steps, at least
    one), with ``torch.profiler``. On the CPU: self CPU time per operator instead. Returns
    ``{"shape", "dims", "steps", "unit", "modes": {mode: {"kernels": [...], "total_ms_per_step", "error"}}}``."""
    out = {"shape": shape.name, "dims": shape.dims(shape.run_dtype(device.type == "cuda")), "steps": steps,
           "unit": "GPU kernel time (CUDA activity)" if device.type == "cuda" else "self CPU time per operator",
           "modes": {}}
    runner = LayerRunner(shape, modes, device, settings["seed"])
    try:
        for m in modes:
            try:
                for _ in range(max(1, settings["warmup"])):
                    runner.step(m)
                kernels = aggregate_kernels(profile_events(runner, m, steps), steps)
                cats: Dict[str, float] = {}
                for k in kernels:
                    cats[k["category"]] = cats.get(k["category"], 0.0) + k["ms_per_step"]
                out["modes"][m] = {"kernels": kernels, "categories": cats, "error": None,
                                   "total_ms_per_step": sum(k["ms_per_step"] for k in kernels)}
                log(f"breakdown {shape.name} {m}: {plural(len(kernels), 'kernel')}, "
                    f"{out['modes'][m]['total_ms_per_step']:.3f} ms/step")
            except Exception as e:  # noqa: BLE001
                out["modes"][m] = {"kernels": [], "categories": {}, "total_ms_per_step": None, "error": error_text(e)}
            runner.zero_grads()
    finally:
        del runner
        free_memory(device)
    return out


def _short(name: str, width: int = 72) -> str:
    n = name[5:] if name.startswith("void ") else name
    n = n.replace("|", "\\|")
    return n if len(n) <= width else n[:width - 1] + "…"


def format_breakdown(breakdown: dict, top: int = 40) -> str:
    """Markdown: per category and per kernel (``top`` slowest names, the rest summed), ms and calls per step for
    every profiled mode, and the difference ordered - native when both are present."""
    modes = [m for m in ("native", "literal", "ordered") if m in breakdown["modes"]]
    both = "native" in modes and "ordered" in modes
    lines = [f"# Per-kernel breakdown: {breakdown['shape']} ({breakdown['dims']})", "",
             f"{breakdown['unit']}, per step, summed over {breakdown['steps']} profiled steps per mode after warm-up "
             f"(torch.profiler).", ""]
    for m in modes:
        if breakdown["modes"][m].get("error"):
            lines.append(f"- {m}: error: {breakdown['modes'][m]['error']}")
    lines += ["", "## By category", ""]
    head = "| category | " + " | ".join(f"{m} ms" for m in modes) + (" | ordered - native ms |" if both else " |")
    lines += [head, "|" + "---|" * (1 + len(modes) + (1 if both else 0))]
    cats = sorted({c for m in modes for c in breakdown["modes"][m].get("categories", {})},
                  key=lambda c: -max(breakdown["modes"][m].get("categories", {}).get(c, 0.0) for m in modes))
    for c in cats + ["total"]:
        vals = [(breakdown["modes"][m].get("total_ms_per_step") if c == "total"
                 else breakdown["modes"][m].get("categories", {}).get(c, 0.0)) for m in modes]
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
        for k in breakdown["modes"][m].get("kernels", []):
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


def write_breakdown(out_dir: str, breakdown: dict) -> None:
    atomic_write_bytes(os.path.join(out_dir, "breakdown.md"), format_breakdown(breakdown).encode())
    data = json.dumps(breakdown, indent=1, sort_keys=True, default=str) + "\n"
    atomic_write_bytes(os.path.join(out_dir, "breakdown.json"), data.encode())
