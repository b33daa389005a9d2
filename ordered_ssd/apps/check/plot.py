"""``loss.png`` of ``ordered-ssd check``: per step, how far each run is from its reference run.

The runs' loss curves lie on top of each other whether or not the bits agree, so the picture shows the differences
instead, per step, one series per compared pair (``b`` and ``c`` against ``a``, ``native-2`` against ``native-1``;
in a split-invariance run every run against the first split), in three panels, and the loss curves in a small
fourth one:

- the loss: ``|loss - loss_ref|`` in nats per byte, from the records' ``float.hex`` losses (exact);
- the gradients: where the records hold every parameter's gradient L2 norm (``grad_norms``, ``float.hex``), the
  largest relative difference ``|n - n_ref| / n_ref`` over the parameters whose gradient digest differs (a lower
  bound of ``||g - g_ref|| / ||g_ref||``); otherwise, the number of parameters whose gradient digest differs;
- the parameters: the same from the parameters after every step (``param_norms``, digests ``params``); where the
  records hold the final parameters only, the number that differ at the last step.

A step whose bits are the same (equal ``float.hex`` loss, equal digests of every tensor) has no difference to put
on a log axis: it is drawn in a strip under its panel, on the row ``identical bits``. The strip's other rows are
``not finite`` (a difference involving nan or inf) and ``bits differ, norms equal`` (digests differ, but no
recorded norm does). :func:`plot_data` computes everything drawn; :func:`plot` draws it.
"""
from __future__ import annotations

import math
import textwrap
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..files import atomic_savefig

IDENTICAL = "identical bits"
NOT_FINITE = "not finite"
NORMS_EQUAL = "bits differ, norms equal"
#: the rows of a panel's strip, bottom to top (a row is drawn only where some step falls on it)
CATEGORIES = (IDENTICAL, NORMS_EQUAL, NOT_FINITE)

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
    subtitle = (f"per step, each run's difference from its reference ({', '.join(p['label'] for p in series)})"
                + (f"\n{restart_text}" if restart_text else ""))
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
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _panel_labels(data: dict) -> Dict[str, str]:
    n = data["n_params"]
    grads = {"norm": "gradients: largest relative\ndifference of a parameter's\ngradient L2 norm",
             "count": f"gradients: parameters\nwhose gradient bits\ndiffer (of {n})"}
    params = {"norm": "parameters: largest relative\ndifference of a parameter's\nL2 norm after the step",
              "count": f"parameters: parameters\nwhose bits differ after\nthe step (of {n})",
              "final": f"parameters: final\nparameters whose bits\ndiffer (of {n})"}
    return {"loss": "loss: |loss - loss_ref|\n(nats/byte)", "grads": grads.get(data["grads_measure"], ""),
            "params": params.get(data["params_measure"], "")}


#: a panel's name where it has no difference to draw (its text then says what it shows, and it has no axis label)
_SHORT = {"loss": "loss", "grads": "gradients", "params": "parameters"}


def _drawable(v: Value) -> bool:
    """Whether a difference goes on a panel's axis: a positive number (else a category of its strip, or nothing)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _has_number(data: dict, key: str) -> bool:
    """Whether some pair has a difference of metric ``key`` to draw on its axis (else only categories)."""
    return any(_drawable(v) for p in data["pairs"] for v in p[key])


def _draw_panel(ax, strip, data: dict, key: str, measure: Optional[str], size: float) -> None:
    """One metric: its numbers on ``ax`` (log axis; a count on a linear one), its categories on ``strip``."""
    rows = [c for c in CATEGORIES if c == IDENTICAL or any(v == c for p in data["pairs"] for v in p[key])]
    n_pairs = max(len(data["pairs"]), 1)
    any_number = False
    for i, pair in enumerate(data["pairs"]):
        color, marker = _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]
        xs = pair["steps"]
        ys = [v if _drawable(v) else math.nan for v in pair[key]]
        if any(not math.isnan(y) for y in ys):
            any_number = True
            # the first pair's markers largest: pairs with the same values stay visible, one inside the other
            grow = 1.0 + 0.8 * (n_pairs - 1 - i) / max(n_pairs - 1, 1)
            ax.plot(xs, ys, color=color, marker=marker, markersize=size * grow, linewidth=1.0,
                    linestyle=("-", "--", ":", "-.")[i % 4])
        offset = (i - (n_pairs - 1) / 2) * min(0.5 / n_pairs, 0.18)
        for row, category in enumerate(rows):
            cx = [x for x, v in zip(xs, pair[key]) if v == category]
            if cx:
                ax_marker = "x" if category == NOT_FINITE else marker
                strip.plot(cx, [row + offset] * len(cx), ax_marker, color=color, markersize=size * 0.9,
                           linestyle="none", markerfacecolor="none" if category != NOT_FINITE else color)
    strip.set_ylim(-0.5, len(rows) - 0.5)
    strip.set_yticks(range(len(rows)))
    strip.set_yticklabels(rows, fontsize=8)
    strip.tick_params(axis="y", length=0)
    strip.grid(axis="x", alpha=0.2)
    name = _SHORT[key]
    if measure is None:
        ax.set_yticks([])
        ax.text(0.5, 0.5, f"{name}: not recorded", transform=ax.transAxes, ha="center", va="center", color="0.4")
    elif not any_number:
        ax.set_yticks([])
        drawn = [v for p in data["pairs"] for v in p[key] if v is not None]
        same = bool(drawn) and all(v == IDENTICAL for v in drawn)
        text = (("identical bits in the final parameters" if measure == "final" else
                 "identical bits at every step compared") if same else "no numeric difference: see the strip below")
        good = same and data["ok"]  # identical bits in a diverged run: no good news
        ax.text(0.5, 0.5, f"{name}: {text}", transform=ax.transAxes, ha="center", va="center",
                color="tab:green" if good else "0.3", fontsize=11)
    elif measure in ("count", "final"):
        from matplotlib.ticker import MaxNLocator

        ax.set_ylim(0.5, max(data["n_params"], 1) + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.set_yscale("log")
        ax.margins(y=0.12)
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
    """The matplotlib figure of :func:`plot_data`'s ``data`` (Agg backend): the title (the verdict), the three
    difference panels with their strips (a panel with no difference to draw a third of the height: its strip
    shows the steps), the loss curves, a dashed line just before every restart step, the divergence in a red box.
    ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    n_steps = max([len(p["steps"]) for p in data["pairs"]] + [len(c["steps"]) for c in data["curves"].values()]
                  + [1])
    size = 6 if n_steps <= 40 else 4 if n_steps <= 200 else 2
    header = 1.7 if data["annotation"] else 1.15  # inches above the first panel: title, subtitle (divergence)
    panels = (("loss", "number"), ("grads", data["grads_measure"]), ("params", data["params_measure"]))
    # a panel with no difference to draw (identical bits, or not recorded) is short: its strip says it all
    tall = {key: _has_number(data, key) for key, _ in panels}
    ratios = []
    for key, _ in panels:
        ratios += [3 if tall[key] else 1.0, 0.7]
    ratios += [0.75, 2.2]
    fig = plt.figure(figsize=(9, 0.78 * sum(ratios) + header))
    grid = fig.add_gridspec(8, 1, height_ratios=ratios, hspace=0.08)
    axes = {}
    share = None
    labels = _panel_labels(data)
    for i, (key, measure) in enumerate(panels):
        ax = fig.add_subplot(grid[2 * i], sharex=share)
        share = share or ax
        strip = fig.add_subplot(grid[2 * i + 1], sharex=share)
        _draw_panel(ax, strip, data, key, measure, size)
        if tall[key]:
            ax.set_ylabel(labels[key], fontsize=9)
        ax.tick_params(axis="x", labelbottom=False)
        if i < 2:
            strip.tick_params(axis="x", labelbottom=False)
        axes[key], axes[key + "_strip"] = ax, strip
    curves = fig.add_subplot(grid[7], sharex=share)
    styles = ("-", "--", ":", "-.")
    for i, (lab, c) in enumerate(data["curves"].items()):
        finite = [(x, y) for x, y in zip(c["steps"], c["loss"]) if math.isfinite(y)]
        mixer = f" ({c['mixer']})" if c.get("mixer") else ""
        curves.plot([x for x, _ in finite], [y for _, y in finite], styles[i % len(styles)], linewidth=1.2,
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
    if n_steps <= 20:
        curves.set_xticks(range(n_steps))
    for r in data["restarts"]:
        for ax in list(axes.values()) + [curves]:
            ax.axvline(r["step"] - 0.5, color="0.35", linestyle="--", linewidth=1.0)
    handles = [Line2D([], [], color=_COLORS[i % len(_COLORS)], marker=_MARKERS[i % len(_MARKERS)],
                      linestyle=("-", "--", ":", "-.")[i % 4],
                      label=p["label"] + (" (control)" if p["run"].startswith("native-") else ""))
               for i, p in enumerate(data["pairs"])]
    if data["restarts"]:
        handles.append(Line2D([], [], color="0.35", linestyle="--",
                              label="restart from a checkpoint (before step "
                                    + ", ".join(str(r["step"]) for r in data["restarts"]) + ")"))
    axes["loss"].legend(handles=handles, fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0),
                        ncol=min(len(handles), 4), frameon=False)
    height = fig.get_figheight()
    fig.suptitle(data["title"], fontsize=14, fontweight="bold", color="tab:green" if data["ok"] else "tab:red",
                 y=1 - 0.08 / height)
    fig.text(0.5, 1 - 0.45 / height, data["subtitle"], ha="center", va="top", fontsize=9)
    if data["annotation"]:
        fig.text(0.5, 1 - 0.9 / height, textwrap.fill(data["annotation"], 100), ha="center", va="top", fontsize=10,
                 color="tab:red", bbox={"facecolor": "white", "edgecolor": "tab:red", "boxstyle": "round"})
    fig.subplots_adjust(left=0.2, right=0.97, top=1 - header / height, bottom=0.5 / height)
    return fig


def differences(data: dict) -> dict:
    """The numbers behind the picture, for ``report.json``: the measures and, per pair (``"b vs a"``), the steps
    and the loss, gradient and parameter differences (numbers, category strings, or null: not recorded)."""
    return {"grads_measure": data["grads_measure"], "params_measure": data["params_measure"],
            "pairs": {p["label"]: {k: p[k] for k in ("run", "ref", "steps", "loss", "grads", "params")}
                      for p in data["pairs"]}}
