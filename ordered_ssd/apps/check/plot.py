"""``loss.png`` of ``ordered-ssd check``: per step, whether each run has its reference run's bits, and how far it is.

The runs' loss curves lie on top of each other whether or not the bits agree, so the picture shows the comparisons
first, one per compared pair (``b`` and ``c`` against ``a``, ``native-2`` against ``native-1``; in a
split-invariance run every run against the first split), in one map: a cell per step (across) and, per pair, a row
for each of

- the loss: ``|loss - loss_ref|`` in nats per byte, from the records' ``float.hex`` losses (exact);
- the gradients: where the records hold every parameter's gradient L2 norm (``grad_norms``, ``float.hex``), the
  largest relative difference ``|n - n_ref| / n_ref`` over the parameters whose gradient digest differs (a lower
  bound of ``||g - g_ref|| / ||g_ref||``); otherwise, the number of parameters whose gradient digest differs;
- the parameters: the same from the parameters after every step (``param_norms``, digests ``params``); where the
  records hold the final parameters only, the number that differ at the last step.

A cell whose bits are the same (equal ``float.hex`` loss, equal digests of every tensor) is green (``identical
bits``); a difference is coloured by its size on a log scale (a colour bar beside the map), or is a category of its
own: ``not finite`` (a difference involving nan or inf), ``bits differ, norms equal`` (digests differ, but no
recorded norm does), a count (no norms recorded); a step not recorded is white. Under the map, a panel of the
sizes for each of the three with a difference to draw (none for a reproducible run), then the loss curves.
:func:`plot_data` computes everything drawn; :func:`plot` draws it.
"""
from __future__ import annotations

import math
import textwrap
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..files import atomic_savefig

IDENTICAL = "identical bits"
NOT_FINITE = "not finite"
NORMS_EQUAL = "bits differ, norms equal"

Value = Union[None, str, int, float]  # None: not recorded at that step; str: a category; a number: the difference


def plot_pairs(runs: dict) -> List[Tuple[str, str]]:
    """``(run, reference)`` of every series: the first run is the reference of the others, except that
    ``native-2`` is compared with ``native-1`` (the native control; ``native-1`` is not compared with ``a``, another
    mixer)."""
    labels = list(runs)
    ref = labels[0]
    return [(lab, "native-1" if lab.startswith("native-") else ref) for lab in labels[1:] if lab != "native-1"]


def loss_difference(ref_step: dict, step: dict) -> Value:
    """``IDENTICAL`` (the same ``float.hex``), ``NOT_FINITE`` (either loss is nan or inf), else ``|loss -
    loss_ref|``."""
    if ref_step["loss"] == step["loss"]:
        return IDENTICAL
    a, b = float.fromhex(ref_step["loss"]), float.fromhex(step["loss"])
    if not (math.isfinite(a) and math.isfinite(b)):
        return NOT_FINITE
    return abs(a - b)


def _norm(norms: dict, name: str) -> Optional[float]:
    value = norms.get(name)
    return None if value in (None, "none") else float.fromhex(value)


def tensor_difference(ref: Optional[dict], other: Optional[dict], ref_norms: Optional[dict] = None,
                      other_norms: Optional[dict] = None) -> Value:
    """The difference of one step's tensors, from their digests ``{name: sha256}`` and, where recorded, their L2
    norms ``{name: float.hex}``: None (no digests), ``IDENTICAL`` (every digest equal); with norms, the largest
    ``|n - n_ref| / n_ref`` over the tensors whose digests differ (``|n|`` where ``n_ref`` is 0; ``NOT_FINITE`` where
    a norm is nan or inf, or only one side has the tensor; ``NORMS_EQUAL`` where every such norm is equal); without
    norms, the number of tensors whose digests differ (an int)."""
    if ref is None or other is None:
        return None
    bad = [name for name in dict.fromkeys(list(ref) + list(other)) if ref.get(name) != other.get(name)]
    if not bad:
        return IDENTICAL
    if ref_norms is None or other_norms is None:
        return len(bad)
    worst = 0.0
    for name in bad:
        a, b = _norm(ref_norms, name), _norm(other_norms, name)
        if a is None and b is None:
            continue  # neither has a gradient; the digests differ in how they say so
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            return NOT_FINITE
        worst = max(worst, abs(b - a) / a if a else abs(b))
    return worst if worst > 0 else NORMS_EQUAL


def _measure(steps: Sequence[dict], digests: str, norms: str) -> Optional[str]:
    """``"norm"`` (every step has digests and norms), ``"count"`` (digests), or None."""
    if not steps or not all(digests in s for s in steps):
        return None
    return "norm" if all(norms in s for s in steps) else "count"


def plot_data(runs: dict, *, stop_at: int, verdict: str, diverged: Optional[dict] = None,
              command: str = "ordered-ssd check", lr=None) -> dict:
    """Everything :func:`plot` draws, from the run records ``runs`` (``{label: record}``, the reference first):

    - ``title`` (``"<command>: <verdict>"``), ``subtitle``, ``ok`` (the verdict is a passing one);
    - ``pairs``: per compared pair, ``{"run", "ref", "label", "steps", "loss", "grads", "params"}``, one value per
      step of the reference (:func:`loss_difference`, :func:`tensor_difference`; None where not recorded);
    - ``grads_measure`` / ``params_measure``: ``"norm"``, ``"count"``, ``"final"`` (params: the final digests,
      at the last step only) or None; ``n_params``: the number of parameters;
    - ``restarts``: ``[{"step", "runs"}]``, the steps a run resumed at from a checkpoint (the line is drawn just
      before the step);
    - ``curves``: per run ``{"steps", "loss"}`` (floats; nan or inf kept) and ``nonfinite``: per run the steps whose
      loss is not finite;
    - ``annotation``: the divergence (``diverged`` of :func:`.report.first_nonfinite`) in words, else None.
    """
    pairs = plot_pairs(runs)
    ref_label = list(runs)[0]
    all_steps = [s for rec in runs.values() for s in rec["steps"]]
    grads_measure = _measure(all_steps, "grads", "grad_norms")
    params_measure = _measure(all_steps, "params", "param_norms")
    if params_measure is None and all(rec.get("final") is not None for rec in runs.values()):
        params_measure = "final"
    n_params = len(runs[ref_label].get("param_names") or runs[ref_label]["steps"][0]["grads"]
                   if runs[ref_label]["steps"] else [])
    series = []
    for lab, ref in pairs:
        other = {s["step"]: s for s in runs[lab]["steps"]}
        ref_steps = runs[ref]["steps"]
        entry = {"run": lab, "ref": ref, "label": f"{lab} vs {ref}", "steps": [s["step"] for s in ref_steps],
                 "loss": [], "grads": [], "params": []}
        for s in ref_steps:
            o = other.get(s["step"])
            if o is None:  # the run has no such step
                for key in ("loss", "grads", "params"):
                    entry[key].append(None)
                continue
            entry["loss"].append(loss_difference(s, o))
            entry["grads"].append(tensor_difference(s.get("grads"), o.get("grads"), s.get("grad_norms"),
                                                    o.get("grad_norms")) if grads_measure else None)
            entry["params"].append(tensor_difference(s.get("params"), o.get("params"), s.get("param_norms"),
                                                     o.get("param_norms")) if params_measure in ("norm", "count")
                                   else None)
        if params_measure == "final" and ref_steps and runs[lab]["steps"]:
            entry["params"][-1] = tensor_difference(runs[ref]["final"], runs[lab]["final"])
        series.append(entry)
    restarts: Dict[int, List[str]] = {}
    for lab, rec in runs.items():
        for step in rec.get("restarts") or ([stop_at] if lab == "c" else []):
            restarts.setdefault(int(step), []).append(lab)
    curves, nonfinite = {}, {}
    for lab, rec in runs.items():
        losses = [float.fromhex(s["loss"]) for s in rec["steps"]]
        curves[lab] = {"steps": [s["step"] for s in rec["steps"]], "loss": losses, "mixer": rec.get("mixer")}
        bad = [s["step"] for s, v in zip(rec["steps"], losses) if not math.isfinite(v)]
        if bad:
            nonfinite[lab] = bad
    ok = verdict in ("REPRODUCIBLE", "SPLIT-INVARIANT")
    restart_text = "; ".join(f"{', '.join(labs)} resumed from a checkpoint at step {step}"
                             for step, labs in sorted(restarts.items()))
    subtitle = (f"a cell per step: the loss, gradient and parameter bits of a run against its reference's "
                f"({', '.join(p['label'] for p in series)})" + (f"\n{restart_text}" if restart_text else ""))
    annotation = None
    if diverged is not None:
        where = (f"the validation loss of run {diverged['run']} is {diverged['loss']}" if diverged["step"] is None
                 else f"the training loss of run {diverged['run']} is {diverged['loss']} from step {diverged['step']}")
        annotation = (f"DIVERGED: {where}{f' (--lr {lr})' if lr is not None else ''}: a diverged run proves nothing "
                      f"about reproducibility")
    return {"title": f"{command}: {verdict}", "subtitle": subtitle, "verdict": verdict, "ok": ok,
            "pairs": series, "grads_measure": grads_measure, "params_measure": params_measure,
            "n_params": n_params, "restarts": [{"step": k, "runs": v} for k, v in sorted(restarts.items())],
            "curves": curves, "nonfinite": nonfinite, "annotation": annotation}


# ----------------------------------------------------------------------------------------------- drawing
#: the comparisons' colours in the magnitude panels: no green (the map's identical bits) and no red (its differences)
_COLORS = ("tab:blue", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:cyan", "tab:olive", "tab:gray")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_STYLES = ("-", "--", ":", "-.")

#: the map's rows of one comparison, top to bottom: ``(key of the pair's values, row label)``
MAP_ROWS = (("loss", "loss"), ("grads", "gradients"), ("params", "parameters"))
#: the colour of a map cell of each kind (a difference of a size: :data:`MAGNITUDE_CMAP`)
CELL_COLORS = {IDENTICAL: "#9fd49a", NORMS_EQUAL: "#d7c8ee", NOT_FINITE: "#111111", None: "#ffffff",
               "count": "#d62728"}
#: what the legend calls each kind of cell
CELL_LABELS = {IDENTICAL: "identical bits", NORMS_EQUAL: "bits differ, norms equal", NOT_FINITE: "not finite",
               None: "not recorded", "count": "bits differ (no norms recorded: the number of parameters)"}
#: the hatching over the map's cells of a step whose loss is not finite (in the run or its reference)
NONFINITE_HATCH, NONFINITE_EDGE = "////", "tab:red"
#: the differences coloured by size: a log scale from :data:`MAGNITUDE_RANGE`'s low end (yellow) through orange to
#: its high end (dark red); a difference outside it takes the colour of the end it passed
MAGNITUDE_CMAP = ("YlOrRd", 0.2, 1.0)
MAGNITUDE_RANGE = (1e-10, 1.0)


def _magnitude_colors():
    """``(colormap, norm)`` of the differences' sizes."""
    import matplotlib
    from matplotlib.colors import LinearSegmentedColormap, LogNorm

    name, lo, hi = MAGNITUDE_CMAP
    base = matplotlib.colormaps[name]
    cmap = LinearSegmentedColormap.from_list("ordered-ssd-differences", base([lo + (hi - lo) * i / 255
                                                                              for i in range(256)]))
    return cmap, LogNorm(*MAGNITUDE_RANGE, clip=True)


def cell_kind(value: Value, measure: Optional[str]) -> Union[None, str, float]:
    """What a map cell shows: a category (:data:`IDENTICAL`, :data:`NORMS_EQUAL`, :data:`NOT_FINITE`), None (not
    recorded), ``"count"`` (digests differ, no norms: ``measure`` ``"count"`` or ``"final"``), or the size of the
    difference (a float, coloured by :data:`MAGNITUDE_CMAP`)."""
    if value is None or isinstance(value, str):
        return value
    if measure in ("count", "final"):
        return "count"
    return float(value)


def map_rows(data: dict) -> List[dict]:
    """The map's rows, top to bottom: per pair its loss, gradient and parameter rows, each ``{"pair", "run", "ref",
    "row" (the row label), "key", "measure", "values" (the pair's, per step), "cells" (:func:`cell_kind` per
    step)}``."""
    measures = {"loss": "number", "grads": data["grads_measure"], "params": data["params_measure"]}
    return [{"pair": p["label"], "run": p["run"], "ref": p["ref"], "row": name, "key": key, "measure": measures[key],
             "values": p[key], "cells": [cell_kind(v, measures[key]) for v in p[key]]}
            for p in data["pairs"] for key, name in MAP_ROWS]


def cell_rgba(kind, cmap, norm) -> Tuple[float, float, float, float]:
    """The RGBA colour of a map cell of :func:`cell_kind` ``kind``."""
    from matplotlib.colors import to_rgba

    if isinstance(kind, float):
        return tuple(cmap(norm(max(kind, MAGNITUDE_RANGE[0]))))
    return to_rgba(CELL_COLORS[kind])


def _panel_labels(data: dict) -> Dict[str, str]:
    n = data["n_params"]
    grads = {"norm": "gradients: largest relative\ndifference of a parameter's\ngradient L2 norm",
             "count": f"gradients: parameters\nwhose gradient bits\ndiffer (of {n})"}
    params = {"norm": "parameters: largest relative\ndifference of a parameter's\nL2 norm after the step",
              "count": f"parameters: parameters\nwhose bits differ after\nthe step (of {n})",
              "final": f"parameters: final\nparameters whose bits\ndiffer (of {n})"}
    return {"loss": "loss: |loss - loss_ref|\n(nats/byte)", "grads": grads.get(data["grads_measure"], ""),
            "params": params.get(data["params_measure"], "")}


def _drawable(v: Value) -> bool:
    """Whether a difference goes on a magnitude panel's axis: a positive number (else a category, or nothing)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _has_number(data: dict, key: str) -> bool:
    """Whether some pair has a difference of metric ``key`` to draw on a magnitude panel (else no panel)."""
    return any(_drawable(v) for p in data["pairs"] for v in p[key])


def _draw_map(ax, data: dict, rows: List[dict], steps: List[int], cmap, norm) -> None:
    """The map: a cell per step (across; ``steps``, consecutive) and per row (:func:`map_rows`, down), coloured by
    :func:`cell_rgba`; white lines between the comparisons, each comparison's name left of its rows, a count
    written in its cell (up to 30 steps), the steps whose loss is not finite hatched, and a dashed line just before
    the step a compared run resumed at, across that comparison's rows."""
    import matplotlib.transforms as mtransforms
    import numpy as np
    from matplotlib.patches import Rectangle

    n, per = len(steps), len(MAP_ROWS)
    image = np.ones((len(rows), max(n, 1), 4))
    for i, row in enumerate(rows):
        for j, kind in enumerate(row["cells"][:n]):
            image[i, j] = cell_rgba(kind, cmap, norm)
    x0 = steps[0] if steps else 0
    ax.imshow(image, aspect="auto", interpolation="nearest",
              extent=(x0 - 0.5, x0 + max(n, 1) - 0.5, len(rows) - 0.5, -0.5))
    if n <= 60:  # a thin white line between the cells, where they are wide enough to show it
        for x in range(1, n):
            ax.axvline(x0 + x - 0.5, color="white", linewidth=0.6)
    for i in range(per, len(rows), per):
        ax.axhline(i - 0.5, color="white", linewidth=3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["row"] for r in rows], fontsize=8)
    ax.tick_params(axis="y", length=0)
    left = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
    for i in range(0, len(rows), per):
        first = rows[i]
        name = first["pair"] if len(first["pair"]) <= 10 else first["pair"].replace(" vs ", "\nvs ")
        name += "\n(control)" if first["run"].startswith("native-") else ""
        ax.text(-0.115, i + (per - 1) / 2, name, transform=left, ha="right", va="center", fontsize=9,
                fontweight="bold")
        nonfinite = set(data["nonfinite"].get(first["run"], [])) | set(data["nonfinite"].get(first["ref"], []))
        for step in sorted(nonfinite):
            ax.add_patch(Rectangle((step - 0.5, i - 0.5), 1, per, fill=False, hatch=NONFINITE_HATCH,
                                   edgecolor=NONFINITE_EDGE, linewidth=0))
        for r in data["restarts"]:
            if first["run"] in r["runs"]:
                ax.plot([r["step"] - 0.5] * 2, [i - 0.5, i + per - 0.5], color="0.1", linestyle="--", linewidth=1.4)
    if n <= 30:
        for i, row in enumerate(rows):
            for j, (kind, value) in enumerate(zip(row["cells"], row["values"])):
                if kind == "count":
                    ax.text(x0 + j, i, str(value), ha="center", va="center", fontsize=7, color="white")
    for spine in ax.spines.values():
        spine.set_visible(False)


def _map_legend(data: dict, rows: List[dict]) -> Tuple[list, int]:
    """The map's legend: a patch for each kind of cell it holds (``identical bits`` always), the hatching of the
    steps whose loss is not finite and the restart line; ``(handles, columns)``."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    present = {kind for row in rows for kind in row["cells"] if not isinstance(kind, float)}
    handles = [Patch(facecolor=CELL_COLORS[kind], edgecolor="0.6", label=CELL_LABELS[kind])
               for kind in (IDENTICAL, NORMS_EQUAL, NOT_FINITE, "count", None) if kind == IDENTICAL or kind in present]
    if data["nonfinite"]:
        handles.append(Patch(facecolor="white", edgecolor=NONFINITE_EDGE, hatch=NONFINITE_HATCH, linewidth=0,
                             label="the loss of the run or its reference is not finite"))
    if data["restarts"]:
        handles.append(Line2D([], [], color="0.1", linestyle="--",
                              label="resumed from a checkpoint (before step "
                                    + ", ".join(str(r["step"]) for r in data["restarts"]) + ")"))
    wide = sum(len(h.get_label()) for h in handles[:3]) > 90
    return handles, min(len(handles), 2 if wide else 3)


def _bar_label(rows: List[dict]) -> str:
    """The colour bar's label: what its sizes are, for the rows that have one (the loss's in nats per byte, the
    gradients' and parameters' relative), a line each."""
    keys = {row["key"] for row in rows if any(isinstance(k, float) for k in row["cells"])}
    lines = ["size of a difference"] + (["loss: nats/byte"] if "loss" in keys else [])
    tensors = [name for key, name in MAP_ROWS[1:] if key in keys]
    if tensors:
        lines += [", ".join(tensors) + ":", "relative"] if len(tensors) > 1 else [f"{tensors[0]}: relative"]
    return "\n".join(lines)


def _draw_magnitudes(ax, data: dict, key: str, measure: Optional[str], size: float) -> None:
    """One metric's differences, where the bits differ: per pair a line over the steps with a number (a log axis
    where they span a decade or more, else a linear one; counts on a linear one); identical steps leave a gap."""
    n_pairs = max(len(data["pairs"]), 1)
    for i, pair in enumerate(data["pairs"]):
        ys = [v if _drawable(v) else math.nan for v in pair[key]]
        if all(math.isnan(y) for y in ys):
            continue
        # the first pair's markers largest: pairs with the same values stay visible, one inside the other
        grow = 1.0 + 0.8 * (n_pairs - 1 - i) / max(n_pairs - 1, 1)
        ax.plot(pair["steps"], ys, color=_COLORS[i % len(_COLORS)], marker=_MARKERS[i % len(_MARKERS)],
                markersize=size * grow, linewidth=1.0, linestyle=_STYLES[i % len(_STYLES)], label=pair["label"])
    if measure in ("count", "final"):
        from matplotlib.ticker import MaxNLocator

        ax.set_ylim(0.5, max(data["n_params"], 1) + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        drawn = [v for p in data["pairs"] for v in p[key] if _drawable(v)]
        ax.margins(y=0.12)
        if max(drawn) >= 10 * min(drawn):  # a log axis; within a decade its labels would repeat one rounded value
            ax.set_yscale("log")
        else:  # from 0, each tick labelled by its value (no offset label)
            from matplotlib.ticker import FormatStrFormatter

            ax.set_ylim(0, max(drawn) * 1.15)
            ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    ax.grid(alpha=0.25, which="major")


def plot(path: str, data: dict) -> Optional[str]:
    """Draw :func:`plot_data`'s ``data`` (:func:`figure`) to ``path`` (PNG, atomically); a note instead where
    matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install ordered-ssd[plot]); loss plot skipped"
    atomic_savefig(path, figure(data), dpi=100, layout=False)
    return None


def figure(data: dict):
    """The matplotlib figure of :func:`plot_data`'s ``data`` (Agg backend), top to bottom: the title (the
    verdict), the divergence in a red box; the map (axes label ``map``: per comparison its loss, gradient and
    parameter rows, a cell per step, :func:`map_rows`) with a colour bar of the differences' sizes (``colorbar``,
    only where some cell has a size); a magnitude panel (``loss``, ``grads``, ``params``) for each metric with a
    difference to draw, and nothing for the others; the loss curves of every run (``curves``). A dashed line just
    before every step a run resumed at (across its comparison's rows in the map, across the other panels).
    ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = map_rows(data)
    ref_steps = data["pairs"][0]["steps"] if data["pairs"] else next(
        (c["steps"] for c in data["curves"].values()), [])
    n_steps = max([len(p["steps"]) for p in data["pairs"]] + [len(c["steps"]) for c in data["curves"].values()]
                  + [1])
    size = 6 if n_steps <= 40 else 4 if n_steps <= 200 else 2
    magnitudes = [key for key, _ in MAP_ROWS if _has_number(data, key)]
    measures = {"loss": "number", "grads": data["grads_measure"], "params": data["params_measure"]}
    cmap, norm = _magnitude_colors()
    sized = any(isinstance(k, float) for row in rows for k in row["cells"])
    handles, columns = _map_legend(data, rows)
    # heights in inches: the header, the map's legend, the map (a row a quarter inch), the panels below
    header = 1.3 if data["annotation"] else 0.8
    heights = [0.22 + 0.18 * math.ceil(len(handles) / columns), max(len(rows), 1) * 0.25]
    for i, _ in enumerate(magnitudes):  # the first with its legend above it
        heights += [0.85 if i == 0 else 0.35, 1.6]
    heights += [0.85 if not magnitudes else 0.75, 1.9]
    bottom = 0.5
    fig = plt.figure(figsize=(9, header + sum(heights) + bottom))
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights, width_ratios=(60, 1), hspace=0.0,
                            wspace=0.03)
    map_ax = fig.add_subplot(grid[1, 0])
    map_ax.set_label("map")
    _draw_map(map_ax, data, rows, ref_steps, cmap, norm)
    map_ax.legend(handles=handles, fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=columns,
                  frameon=False, handlelength=1.6)
    if sized:
        from matplotlib.cm import ScalarMappable

        bar_ax = fig.add_subplot(grid[1, 1])
        bar_ax.set_label("colorbar")
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=bar_ax, extend="both")
        bar.set_label(_bar_label(rows), fontsize=7)
        bar.ax.tick_params(labelsize=7)
    axes = [map_ax]
    labels = _panel_labels(data)
    for i, key in enumerate(magnitudes):
        ax = fig.add_subplot(grid[3 + 2 * i, 0], sharex=map_ax)
        ax.set_label(key)
        _draw_magnitudes(ax, data, key, measures[key], size)
        ax.set_ylabel(labels[key], fontsize=8)
        if i == 0:
            ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=min(len(data["pairs"]), 4),
                      frameon=False, title="the size of each difference, at the steps whose bits differ",
                      title_fontsize=8, alignment="left")
        axes.append(ax)
    curves = fig.add_subplot(grid[len(heights) - 1, 0], sharex=map_ax)
    curves.set_label("curves")
    for i, (lab, c) in enumerate(data["curves"].items()):
        finite = [(x, y) for x, y in zip(c["steps"], c["loss"]) if math.isfinite(y)]
        mixer = f" ({c['mixer']})" if c.get("mixer") else ""
        curves.plot([x for x, _ in finite], [y for _, y in finite], _STYLES[i % len(_STYLES)], linewidth=1.2,
                    label=f"{lab}{mixer}", marker="." if len(finite) < 3 else None)
    if data["nonfinite"]:
        import matplotlib.transforms as mtransforms

        top = mtransforms.blended_transform_factory(curves.transData, curves.transAxes)
        steps = sorted({s for ss in data["nonfinite"].values() for s in ss})
        curves.plot(steps, [0.9] * len(steps), "x", color="tab:red", transform=top, markersize=size + 2)
        runs = ", ".join(data["nonfinite"])
        curves.annotate(f"x: loss not finite (run {runs}) from step {steps[0]}", xy=(steps[0], 0.9), xycoords=top,
                        xytext=(8, -16), textcoords="offset points", color="tab:red", fontsize=9)
    curves.set_ylabel("train loss\n(nats/byte)", fontsize=9)
    curves.set_xlabel("step")
    curves.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=min(len(data["curves"]), 5),
                  frameon=False, title="the loss of every run", title_fontsize=8, alignment="left")
    curves.grid(alpha=0.25)
    axes.append(curves)
    for r in data["restarts"]:
        for ax in axes[1:]:
            ax.axvline(r["step"] - 0.5, color="0.35", linestyle="--", linewidth=1.0)
    x0 = ref_steps[0] if ref_steps else 0
    map_ax.set_xlim(x0 - 0.5, x0 + n_steps - 0.5)
    if n_steps <= 20:
        map_ax.set_xticks(range(x0, x0 + n_steps))
    else:
        from matplotlib.ticker import MaxNLocator

        map_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes:
        ax.tick_params(axis="x", labelbottom=True, labelsize=8)
    height = fig.get_figheight()
    fig.suptitle(data["title"], fontsize=14, fontweight="bold", color="tab:green" if data["ok"] else "tab:red",
                 y=1 - 0.08 / height)
    fig.text(0.5, 1 - 0.42 / height, data["subtitle"], ha="center", va="top", fontsize=9)
    if data["annotation"]:
        fig.text(0.5, 1 - 0.9 / height, textwrap.fill(data["annotation"], 100), ha="center", va="top", fontsize=10,
                 color="tab:red", bbox={"facecolor": "white", "edgecolor": "tab:red", "boxstyle": "round"})
    fig.subplots_adjust(left=0.2, right=0.9, top=1 - header / height, bottom=bottom / height)
    return fig


def differences(data: dict) -> dict:
    """The numbers behind the picture, for ``report.json``: the measures and, per pair (``"b vs a"``), the steps
    and the loss, gradient and parameter differences (numbers, category strings, or null: not recorded)."""
    return {"grads_measure": data["grads_measure"], "params_measure": data["params_measure"],
            "pairs": {p["label"]: {k: p[k] for k in ("run", "ref", "steps", "loss", "grads", "params")}
                      for p in data["pairs"]}}
