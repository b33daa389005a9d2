"""What the bench writes: the markdown table, ``bench.json``, the chart, and the merge of earlier results."""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence

from ..files import atomic_savefig, atomic_write_bytes
from .requirements import BenchError
from .shapes import MODES


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
    versions = meta.get("versions", {})
    lines = ["# ordered-ssd bench: one Mamba-2 layer, forward + backward", ""]
    lines.append(f"{meta.get('gpu') or meta.get('device', '?')} · torch {versions.get('torch')} · "
                 f"triton {versions.get('triton')} · mamba-ssm {versions.get('mamba-ssm')} · "
                 f"causal-conv1d {versions.get('causal-conv1d')} · ordered-ssd {versions.get('ordered-ssd')} · "
                 f"{meta.get('date', '?')}")
    lines.append("")
    settings = meta.get("settings", {})
    lines.append(f"{meta.get('precision', '')}; median of {settings.get('repeats')} interleaved steps per mode "
                 f"after {settings.get('warmup')} warm-up steps ({meta.get('timer', '')}); peak = "
                 f"max_memory_allocated over one step, per mode in its own phase; bitwise = the SHA-256 of every "
                 f"parameter gradient and of the input gradient agree over {settings.get('bit_repeats')} steps.")
    if meta.get("command"):
        lines += ["", f"Command: `{meta['command']}`"]
    lines += ["", "| shape | dims | mode | ms/step | × native | × native (child) | peak MiB | × native | "
                  "bitwise |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    notes = []
    for shape_result in results.get("shapes", []):
        for m in MODES:
            r = shape_result.get("rows", {}).get(m)
            if r is None:
                continue
            if r.get("error"):
                lines.append(f"| {shape_result['name']} | {shape_result['dims']} | {m} | — | — | — | — | — "
                             f"| error¹ |")
                notes.append(f"{shape_result['name']} {m}: {r['error']}")
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
            lines.append(f"| {shape_result['name']} | {shape_result['dims']} | {m} | {_f(r.get('ms'), '.3f')} | "
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

    shapes = [shape_result["name"] for shape_result in results.get("shapes", [])]
    modes = [m for m in MODES if any(m in shape_result.get("rows", {}) for shape_result in results.get("shapes", []))]
    colors = {"native": "#7f7f7f", "upstream-det": "#d62728", "literal": "#ff7f0e", "ordered": "#1f77b4"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / max(1, len(modes))
    for ax, key, title, target in ((axes[0], "ms", "ms / step (log)", None),
                                   (axes[1], "ratio_ms", "step time / native", 1.05),
                                   (axes[2], "ratio_mem", "peak memory / native", 1.10)):
        for i, m in enumerate(modes):
            xs, ys = [], []
            for j, shape_result in enumerate(results.get("shapes", [])):
                r = shape_result.get("rows", {}).get(m) or {}
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
    md_path = os.path.join(out_dir, "bench.md")
    json_path = os.path.join(out_dir, "bench.json")
    png = os.path.join(out_dir, "bench.png")
    atomic_write_bytes(md_path, format_table(results).encode())
    atomic_write_bytes(json_path, (json.dumps(results, indent=1, sort_keys=True, default=str) + "\n").encode())
    note = write_plot(png, results) if plot else "not requested"
    return {"md": md_path, "json": json_path, "png": None if note else png, "png_note": note}


def merge_results(paths: Sequence[str]) -> dict:
    """The results of several ``bench.json`` files as one (``--merge``): shapes in first-seen order, a later file's
    result for a shape replacing an earlier one's, the first file's meta.

    Raises:
        BenchError: a file cannot be read, is not JSON, or is not a bench.json.
    """
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
        for shape_result in r["shapes"]:
            if shape_result["name"] not in merged:
                order.append(shape_result["name"])
            merged[shape_result["name"]] = shape_result
    meta["merged_from"] = [os.path.abspath(p) for p in paths]
    return {"meta": meta, "shapes": [merged[n] for n in order]}
