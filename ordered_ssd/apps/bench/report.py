"""What the bench writes: the markdown table, ``bench.json``, the chart, and the merge of earlier results."""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence

from ..errors import plural
from ..files import atomic_savefig, atomic_write_bytes
from .requirements import BenchError
from .shapes import LAYER_NAMES, LAYERS, MODES, result_layer
from .timing import TARGET_MEMORY, TARGET_TIME, finalize_ratios


def _f(v, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and v is not None else "—"


def _bits_cell(r: dict) -> str:
    if r.get("bitwise") is None:
        return "—"
    n = r.get("bit_repeats", "?")
    if r["bitwise"]:
        return f"yes ({n}/{n})"
    return f"**no** ({r.get('distinct_digest_sets', '?')} distinct of {n})"


def _targets_cell(t: Optional[dict]) -> str:
    if not t:
        return ""
    marks = {True: "✓", False: "**✗**", None: "—"}
    labels = [("time", "time"), ("mem", "memory")] + ([("det", "upstream_det")] if "upstream_det" in t else [])
    cell = " · ".join(f"{label} {marks[t.get(key)]}" for label, key in labels)  # Mamba-3: no det target
    return cell + (_det_basis(t) if t.get("upstream_det") is not None else "")


#: how the table names the ratio the det target was judged on (the direct one: no name)
_DET_BASIS = {"ratio_ms_det_paired": "paired", "ratio_ms_det_same_process": "same process"}


def _det_basis(t: dict) -> str:
    """``" (paired)"`` / ``" (same process)"`` after a det verdict judged on that ratio; ``""`` for the direct one."""
    basis = _DET_BASIS.get(t.get("upstream_det_ratio"))
    return f" ({basis})" if basis else ""


def targets_summary(results: dict) -> str:
    """One line on the targets of every shape's ordered row (:func:`timing.targets`): the shapes that met all
    three (Mamba-3: both), those that missed one (with the ratios that missed), those not fully measured; of one
    layer's shapes (those of the first shape's layer)."""
    layer = next((result_layer(sr) for sr in results.get("shapes", [])), "mamba2")
    met, missed, partial = [], [], []
    for shape_result in results.get("shapes", []):
        r = shape_result.get("rows", {}).get("ordered") or {}
        t = r.get("targets")
        if not t:
            continue
        if t.get("met"):
            met.append(shape_result["name"])
        elif t.get("met") is False:
            det_key = t.get("upstream_det_ratio") or "ratio_ms_det"
            why = [f"{label} {_f(r.get(key), '.3f')}" for label, key, k in (
                ("time", "ratio_ms", "time"), ("mem", "ratio_mem", "memory"),
                ("det" + _det_basis(t), det_key, "upstream_det")) if t.get(k) is False]
            missed.append(f"{shape_result['name']} ({', '.join(why)})")
        else:
            partial.append(shape_result["name"])
    total = len(met) + len(missed) + len(partial)
    if not total:
        return ""
    det = ", ordered ≤ upstream-det" if layer == "mamba2" else ""
    line = (f"Targets (ordered / native ≤ {TARGET_TIME:.2f} step time and ≤ {TARGET_MEMORY:.2f} peak memory{det}): "
            f"all met on {len(met)} of {plural(total, 'shape')}" + (f" ({', '.join(met)})" if met else ""))
    if missed:
        line += f"; missed on {', '.join(missed)}"
    if partial:
        line += f"; not all measured on {', '.join(partial)}"
    return line + "."


def _settings_text(meta: dict) -> str:
    settings, grid = meta.get("settings", {}), meta.get("grid_settings")
    text = (f"median of {settings.get('repeats')} interleaved steps per mode after {settings.get('warmup')} warm-up "
            f"steps")
    if grid and any(grid.get(k) != settings.get(k) for k in ("repeats", "warmup", "bit_repeats")):
        text += (f" (grid rows: {grid.get('repeats')} after {grid.get('warmup')}, bit check over "
                 f"{grid.get('bit_repeats')})")
    return text


def _precompile_text(pre: Optional[dict]) -> Optional[str]:
    if not pre:
        return None
    text = (f"Precompile: {len(pre.get('tasks', []))} tasks in up to {pre.get('jobs')} worker processes, "
            f"{_f(pre.get('wall_s'), '.1f')} s wall before any timing (excluded from every measurement)")
    failed = [t for t in pre.get("tasks", []) if t.get("error")]
    if failed:
        text += f"; {len(failed)} failed: " + "; ".join(f"{t['name']}: {t['error']}" for t in failed)
    return text + "."


#: the columns of a Mamba-3 table leave out those of upstream-det (mamba-ssm has no deterministic mode for it):
#: ``× native (child)`` and ``× upstream-det``, by their place in the Mamba-2 row
_NO_DET_COLUMNS = (5, 6)
_HEADER = ("shape", "dims", "mode", "ms/step", "× native", "× native (child)", "× upstream-det", "host ms", "launches",
           "peak MiB", "× native", "bitwise", "targets")
_ALIGN = ("---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---", "---")
_LEGEND = {
    "mamba2": ("× native: to the native median measured in this process (interleaved). × native (child), "
               "upstream-det only: to the native median measured by the same harness in a fresh process "
               "without the deterministic switches. × upstream-det, ordered only: ordered ms / upstream-det ms "
               "(paired, where the fresh-process native ran: ordered / native in this process over "
               "upstream-det / native in fresh processes; same process, where the upstream-det child ran "
               "ordered too: ordered's median over upstream-det's, interleaved there). "
               f"targets, ordered only: time = ordered / native ≤ {TARGET_TIME:.2f}, mem = peak memory ratio ≤ "
               f"{TARGET_MEMORY:.2f}, det = ordered ≤ upstream-det, judged on the same-process ratio where "
               "there is one, else the paired one, else the direct one, named after the marks where not the "
               "direct one (✓ met, ✗ missed, — not measured)."),
    "mamba3": ("× native: to the native median (mamba-ssm's Mamba3) measured in this process (interleaved). "
               f"targets, ordered only: time = ordered / native ≤ {TARGET_TIME:.2f}, mem = peak memory ratio ≤ "
               f"{TARGET_MEMORY:.2f} (✓ met, ✗ missed, — not measured). mamba-ssm has no deterministic mode for "
               "Mamba-3, so there is no upstream-det row; literal (OrderedMamba3 with layer.literal = True) is a "
               "cross-check of the bits (= ordered), not a mode to train with."),
}


def _row(cells: Sequence[str], layer: str) -> str:
    """A markdown table row of the Mamba-2 columns ``cells``, those of ``layer``'s table kept."""
    keep = [c for i, c in enumerate(cells) if layer == "mamba2" or i not in _NO_DET_COLUMNS]
    return "| " + " | ".join(keep) + " |"


def _table_lines(shape_results: Sequence[dict], layer: str, notes: list) -> list:
    """One layer's table (its columns, :data:`_NO_DET_COLUMNS`), its legend and its targets line; the notes of its
    rows appended to ``notes``."""
    lines = ["", _row(_HEADER, layer), _row(_ALIGN, layer).replace(" ", "")]
    for shape_result in shape_results:
        for m in MODES:
            r = shape_result.get("rows", {}).get(m)
            if r is None:
                continue
            if r.get("error"):
                # the targets cell of an error row is one space wide
                lines.append(_row([shape_result["name"], shape_result["dims"], m] + ["—"] * 8 + ["error¹"], layer)
                             + " |")
                notes.append(f"{shape_result['name']} {m}: {r['error']}")
                continue
            child = ""
            if m == "upstream-det":
                child = _f(r.get("ratio_ms_child"), ".3f")
                if r.get("ratio_mem_child") is not None:
                    child += f" (mem {_f(r.get('ratio_mem_child'), '.3f')})"
            det = _f(r.get("ratio_ms_det"), ".3f") if m == "ordered" else ""
            if m == "ordered" and r.get("ratio_ms_det_paired") is not None:
                det += f" (paired {_f(r['ratio_ms_det_paired'], '.3f')})"
            if m == "ordered" and r.get("ratio_ms_det_same_process") is not None:
                det += f" (same process {_f(r['ratio_ms_det_same_process'], '.3f')})"
            same = (r.get("in_det_process") or {}) if m == "ordered" else {}
            if same.get("same_bits") is False:
                notes.append(f"{shape_result['name']} ordered: different bits in the upstream-det process")
            elif same.get("bitwise") is False:
                notes.append(f"{shape_result['name']} ordered: not repeatable in the upstream-det process")
            elif same.get("error"):
                notes.append(f"{shape_result['name']} ordered in the upstream-det process: {same['error']}")
            bits = _bits_cell(r)
            if m == "upstream-det" and r.get("deterministic_mode") is False:
                bits += " (child NOT in deterministic mode!)"
            if m == "literal" and r.get("same_bits_as_ordered") is not None:
                bits += ", = ordered" if r["same_bits_as_ordered"] else ", **≠ ordered**"
            host = _f(r.get("host_ms"), ".2f") if "host_steps" in r else "—"  # older files: enqueue time, not this
            if r.get("launches_error"):
                notes.append(f"{shape_result['name']} {m} launches: {r['launches_error']}")
            lines.append(_row([shape_result["name"], shape_result["dims"], m, _f(r.get("ms"), ".3f"),
                               _f(r.get("ratio_ms"), ".3f"), child, det, host, _f(r.get("launches"), "g"),
                               _f(r.get("peak_mib"), ".0f"), _f(r.get("ratio_mem"), ".3f"), bits,
                               _targets_cell(r.get("targets")) if m == "ordered" else ""], layer))
    lines += ["", _LEGEND[layer]]
    summary = targets_summary({"shapes": list(shape_results)})
    if summary:
        lines += ["", summary]
    return lines


def format_table(results: dict, heading: bool = True) -> str:
    """The markdown report of ``results`` (the ``bench.json`` structure): a header with the machine, versions
    and method (``heading``: under a ``#`` title), then one table per layer (Mamba-2, then Mamba-3; each under a
    ``####`` heading where there are both), one row per (shape, mode): ms/step, ratio to native (and, for
    upstream-det, to the native of its own child process), ordered / upstream-det (these two columns for Mamba-2
    only), host ms, GPU launches per step, peak MiB, ratio, bitwise over N, and on the ordered row the targets;
    then a line on the targets."""
    meta = results.get("meta", {})
    versions = meta.get("versions", {})
    shape_results = results.get("shapes", [])
    layers = [layer for layer in LAYERS if any(result_layer(sr) == layer for sr in shape_results)] or ["mamba2"]
    title = " / ".join(LAYER_NAMES[layer] for layer in layers)
    lines = [f"# ordered-ssd bench: one {title} layer, forward + backward", ""] if heading else []
    lines.append(f"{meta.get('gpu') or meta.get('device', '?')} · torch {versions.get('torch')} · "
                 f"triton {versions.get('triton')} · mamba-ssm {versions.get('mamba-ssm')} · "
                 f"causal-conv1d {versions.get('causal-conv1d')} · ordered-ssd {versions.get('ordered-ssd')}"
                 + (f" ({meta['commit']})" if meta.get("commit") else "") + f" · {meta.get('date', '?')}")
    lines.append("")
    settings = meta.get("settings", {})
    lines.append(f"{meta.get('precision', '')}; {_settings_text(meta)} ({meta.get('timer', '')}); host ms = the "
                 f"Python call of one step with an idle GPU (synchronize before and after), median of "
                 f"{settings.get('host_steps', '?')}; launches = GPU kernels, memsets and memcpys per step "
                 f"(torch.profiler, after all timing); peak = max_memory_allocated over one step, per mode in its "
                 f"own phase; bitwise = the SHA-256 of every parameter gradient and of the input gradient agree "
                 f"over the bit-check steps.")
    if meta.get("sources"):  # a --merge of several runs: every run's command, commit and precompile time
        lines += ["", "Merged from:"]
        for src in meta["sources"]:
            pre = (f"; precompile {src['precompile_wall_s']} s, {src['precompile_failed']} failed"
                   if src.get("precompile_wall_s") is not None else "")
            fp = (f"; pinned `{src['pinned_configs']}`" if "pinned_configs" in meta.get("sources_differ_in", ())
                  and src.get("pinned_configs") else "")
            tree = f", tree {src['tree'][:8]}" if src.get("tree") else ""
            lines.append(f"- {', '.join(src['shapes'])}: `{src['command']}` ({src.get('commit') or '?'}{tree}, "
                         f"{src.get('date') or '?'}{pre}{fp})")
        if meta.get("sources_differ_in"):
            lines.append(f"- **the runs differ in {', '.join(meta['sources_differ_in'])}**")
    elif meta.get("command"):
        lines += ["", f"Command: `{meta['command']}`"]
    pre = _precompile_text(results.get("precompile"))
    if pre:
        lines += ["", pre]
    notes: list = []
    for layer in layers:
        if len(layers) > 1:
            lines += ["", f"#### {LAYER_NAMES[layer]}"]
        lines += _table_lines([sr for sr in shape_results if result_layer(sr) == layer], layer, notes)
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


def measured(shape_result: dict) -> bool:
    """Whether a shape result holds a measurement: a row that is not ``skipped: ...`` (a failure is one)."""
    return any(not str(row.get("error") or "").startswith("skipped")
               for row in shape_result.get("rows", {}).values())


#: what ``meta`` of a merge takes from the newest run that still contributes a shape (the rest, the harness's
#: settings, from the first file)
_RUN_META = ("command", "date", "commit", "tree", "gpu", "versions", "pinned_configs")


def merge_results(paths: Sequence[str]) -> dict:
    """The results of several ``bench.json`` files as one (``--merge``): shapes in first-seen order, a later file's
    result for a shape replacing an earlier one's, unless the later one is not :func:`measured` (only ``skipped:
    ...`` rows, or none) and the earlier one is: a skipped shape replaces no measurement. ``meta["sources"]`` lists
    the runs the shapes come from, in file order, each with only the shapes it still contributes, its command,
    commit, tree, date, versions and pinned fingerprint; a file that is itself a merge contributes its own runs.
    ``meta`` is the first file's, with :data:`_RUN_META` (date, commit, fingerprint, ...) from the last run in
    ``sources``; ``meta["sources_differ_in"]`` names what the runs differ in among the GPU, the versions and the
    pinned fingerprint (``pinned_configs``). Every shape's ratios and targets are recomputed
    (:func:`~ordered_ssd.apps.bench.timing.finalize_ratios`).

    Raises:
        ValueError: ``paths`` is empty.
        BenchError: a file cannot be read, is not JSON, or is not a bench.json.
    """
    if not paths:
        raise ValueError("paths: expected at least one bench.json path, got none")
    merged, order, meta, sources, owner = {}, [], None, [], {}
    for p in paths:
        try:
            with open(p) as fh:
                r = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            raise BenchError(f"--merge: cannot read {p}: {e}") from None
        if not isinstance(r, dict) or not isinstance(r.get("shapes"), list):
            raise BenchError(f"--merge: {p} is not a bench.json (no 'shapes' list)")
        m = r.get("meta", {})
        meta = meta if meta is not None else dict(m)
        pre = r.get("precompile") or {}
        own = {"path": os.path.abspath(p), **{k: m.get(k) for k in _RUN_META}, "elapsed_s": m.get("elapsed_s"),
               "precompile_wall_s": pre.get("wall_s"), "precompile_failed": pre.get("failed"),
               "shapes": [s["name"] for s in r["shapes"]]}
        earlier = m.get("sources") if isinstance(m.get("sources"), list) else []
        # an earlier merge: its own runs (the file's fingerprint where a source of an older format has none)
        file_sources = ([{"pinned_configs": m.get("pinned_configs"), **src} for src in earlier] if earlier
                        else [own])
        sources.extend(file_sources)
        for shape_result in r["shapes"]:
            name = shape_result["name"]
            if name not in merged:
                order.append(name)
            elif measured(merged[name]) and not measured(shape_result):
                continue  # a later run that skipped the shape keeps the earlier run's measurement
            merged[name] = shape_result
            # within a merged file, the last of its runs that lists the shape (a later run replaced earlier ones)
            owner[name] = next((src for src in reversed(file_sources) if name in src.get("shapes", ())),
                               file_sources[-1])
    for src in sources:  # the shapes each run still contributes
        src["shapes"] = [n for n in order if owner[n] is src]
    sources = [src for src in sources if src["shapes"]]
    for key in ("sources_differ_in", "merged_from", "sources"):
        meta.pop(key, None)
    if sources:  # the newest contributing run's date, commit, tree, fingerprint, ...
        newest = sources[-1]
        for k in _RUN_META:
            if newest.get(k) is not None:
                meta[k] = newest[k]
            else:
                meta.pop(k, None)
    meta["merged_from"] = [s["path"] for s in sources]
    meta["sources"] = sources
    differ = [k for k in ("gpu", "versions", "pinned_configs")
              if len({json.dumps(s.get(k), sort_keys=True) for s in sources}) > 1]
    if differ:
        meta["sources_differ_in"] = differ
    shapes = [merged[n] for n in order]
    for shape_result in shapes:  # ratios and targets by this version's rules (older files judged det directly)
        finalize_ratios(shape_result)
    return {"meta": meta, "shapes": shapes}
