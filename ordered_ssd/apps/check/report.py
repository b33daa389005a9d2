"""What ``ordered-ssd check`` reports: the comparison of the runs' records, the table and the verdict, the loss
plot and ``report.json``."""
from __future__ import annotations

import json
import math
import os
from typing import Callable, Optional

from ..files import atomic_write_json
from .errors import plural, writing
from .plot import differences, plot, plot_data
from .spec import DEFAULT_LAYER, layer_name, layer_of


def load_record(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


def merge_restart(first: dict, second: dict) -> dict:
    """Run ``c``: the record of the run stopped at step k followed by the record of its resumption."""
    merged = dict(second)
    merged["steps"] = first["steps"] + second["steps"]
    merged["train_s"] = first["train_s"] + second["train_s"]
    merged["s_per_step"] = merged["train_s"] / max(len(merged["steps"]), 1)
    if "timings" in first and "timings" in second:  # the two processes' times, each part summed where both have it
        merged["timings"] = {k: (None if first["timings"].get(k) is None and second["timings"].get(k) is None else
                                 (first["timings"].get(k) or 0.0) + (second["timings"].get(k) or 0.0))
                             for k in second["timings"]}
    merged["label"] = "c"
    if "rank_train_s" in first and "rank_train_s" in second:  # data-parallel runs
        merged["rank_train_s"] = [a + b for a, b in zip(first["rank_train_s"], second["rank_train_s"])]
        merged["rank_s_per_step"] = [t / max(len(merged["steps"]), 1) for t in merged["rank_train_s"]]
        merged["s_per_step"] = max(merged["rank_s_per_step"])
        merged["ranks_agree"] = first["ranks_agree"] and second["ranks_agree"]
        merged["ranks_disagreeing"] = sorted(set(first["ranks_disagreeing"]) | set(second["ranks_disagreeing"]))
    return merged


def compare_runs(ref: dict, other: dict) -> dict:
    """Where ``other`` first differs from ``ref``: loss, gradient digests, final parameters; where the steps record
    the parameters after every step (split-invariance runs), also ``first_param_diff``."""
    out = {"loss_equal_steps": 0, "first_loss_diff": None, "first_grad_diff": None, "final_equal": None,
           "steps_compared": min(len(ref["steps"]), len(other["steps"])),
           "same_length": len(ref["steps"]) == len(other["steps"])}
    for r, o in zip(ref["steps"], other["steps"]):
        if r["loss"] == o["loss"]:
            out["loss_equal_steps"] += 1
        elif out["first_loss_diff"] is None:
            out["first_loss_diff"] = r["step"]
        if out["first_grad_diff"] is None:
            bad = sorted(n for n in r["grads"] if r["grads"][n] != o["grads"].get(n))
            if bad:
                out["first_grad_diff"] = {"step": r["step"], "params": bad[:8], "count": len(bad)}
        if "params" in r and out.setdefault("first_param_diff", None) is None:
            bad = sorted(n for n in r["params"] if r["params"][n] != o.get("params", {}).get(n))
            if bad:
                out["first_param_diff"] = {"step": r["step"], "params": bad[:8], "count": len(bad)}
    out["first_module_diff"] = first_module_diff(ref, other)
    if ref["final"] is not None and other["final"] is not None:
        out["final_equal"] = ref["final"] == other["final"]
    out["steps"] = [len(ref["steps"]), len(other["steps"])]
    out["val_loss_equal"] = ref.get("val_loss") == other.get("val_loss")
    out["val_losses"] = [ref.get("val_loss"), other.get("val_loss")]  # float.hex (or None)
    out["identical"] = (out["same_length"] and out["first_loss_diff"] is None and out["first_grad_diff"] is None
                        and out.get("first_param_diff") is None and out["final_equal"] is True
                        and out["val_loss_equal"])
    return out


def first_module_diff(ref: dict, other: dict) -> Optional[dict]:
    """The first step at which a module's gradient digest (:mod:`.modules`) differs between the two runs, and the
    modules that differ there in model order: ``{"step", "module" (the first in model order), "last_module",
    "modules" (at most 8), "count", "of" (modules in the model), "loss_equal" (the step's losses agree: the
    forward agreed)}``; None where none differs or the records have no module digests (records of older
    versions)."""
    order = ref.get("module_names")
    for r, o in zip(ref["steps"], other["steps"]):
        if "modules" not in r or "modules" not in o:
            return None
        names = order or list(r["modules"])
        bad = [m for m in names if r["modules"].get(m) != o["modules"].get(m)]
        if bad:
            diff = {"step": r["step"], "module": bad[0], "last_module": bad[-1], "modules": bad[:8],
                    "count": len(bad), "of": len(names), "loss_equal": r["loss"] == o["loss"]}
            if "outputs" in r and "outputs" in o:
                diff["output_module"] = _first_output_diff(ref, other, r["step"])
            return diff
    return None


def _first_output_diff(ref: dict, other: dict, until: int) -> Optional[dict]:
    """The first module, in the order the modules ran, whose forward output differs, at the first step up to
    ``until`` where one does (``{"step", "module"}``), or None where every output agreed up to then."""
    for r, o in zip(ref["steps"], other["steps"]):
        if r["step"] > until:
            break
        for name, digest in r.get("outputs", {}).items():
            if o.get("outputs", {}).get(name) != digest:
                return {"step": r["step"], "module": name}
    return None


def describe_module_diff(diff: dict) -> str:
    """``"first module whose gradient differs: model.layers.1 (step 0; 1 of 5 modules differ: model.layers.1;
    the losses of step 0 are equal)"``."""
    more = ", ..." if diff["count"] > len(diff["modules"]) else ""
    loss = "equal" if diff["loss_equal"] else "different"
    text = (f"first module whose gradient differs: {diff['module']} (step {diff['step']}; {diff['count']} of "
            f"{diff['of']} modules differ: {', '.join(diff['modules'])}{more}; the losses of step {diff['step']} are "
            f"{loss})")
    if "output_module" not in diff:
        return text
    out = diff["output_module"]
    if out is not None:
        return text + (f"; the forward differs first: the output of {out['module']} at step {out['step']} (a "
                       f"forward that is not deterministic there, or in what it calls)")
    return text + (f"; every forward output agreed up to step {diff['step']}: the backward differs, in the modules "
                   f"listed (each in its own weight-gradient sums, or the last, {diff['last_module']}, in the input "
                   f"gradient it hands to the modules before it)")


def first_nonfinite(runs: dict, labels) -> Optional[dict]:
    """The first step at which the training loss of one of the runs ``labels`` is nan or inf (``{"step", "run",
    "loss"}``; ``step`` None where only the validation loss is), or None if every loss is finite."""
    found = []
    for lab in labels:
        rec = runs[lab]
        for s in rec["steps"]:
            if not math.isfinite(float.fromhex(s["loss"])):
                found.append({"step": s["step"], "run": lab, "loss": repr(float.fromhex(s["loss"]))})
                break
        else:
            if rec.get("val_loss") is not None and not math.isfinite(float.fromhex(rec["val_loss"])):
                found.append({"step": None, "run": lab, "loss": repr(float.fromhex(rec["val_loss"]))})
    if not found:
        return None
    return min(found, key=lambda f: (f["step"] is None, f["step"] or 0))


def diverged_verdict(diverged: dict) -> str:
    """``DIVERGED at step k`` (or ``DIVERGED in the validation loss``)."""
    return ("DIVERGED in the validation loss" if diverged["step"] is None
            else f"DIVERGED at step {diverged['step']}")


def _describe_divergence(diverged: dict, lr) -> str:
    where = ("the validation loss" if diverged["step"] is None
             else f"the training loss from step {diverged['step']}")
    return (f"{where} of run {diverged['run']} is {diverged['loss']} (not finite): the training diverged "
            f"(--lr {lr}), and a diverged run proves nothing about reproducibility")


def _first_diff(what: str, diff: Optional[dict]) -> str:
    """``"gradients differ from step 0 in 20 tensors (a.weight, ...)"``, or ``"gradients equal"``."""
    if diff is None:
        return f"{what} equal"
    more = ", ..." if diff["count"] > len(diff["params"]) else ""
    return (f"{what} differ from step {diff['step']} in {plural(diff['count'], 'tensor')} "
            f"({', '.join(diff['params'])}{more})")


def describe_comparison(comparison: dict) -> str:
    """One line for a :func:`compare_runs` result: ``identical``, or where the two runs first differ."""
    if comparison["identical"]:
        return "identical"
    loss = comparison["first_loss_diff"]
    parts = []
    if not comparison["same_length"]:
        n_ref, n_other = comparison["steps"]
        parts.append(f"the runs have {n_ref} and {n_other} steps (the first {comparison['steps_compared']} compared)")
    parts += ["losses equal" if loss is None else f"losses differ from step {loss}",
              _first_diff("gradients", comparison["first_grad_diff"])]
    if comparison.get("first_module_diff") is not None:
        parts.append(describe_module_diff(comparison["first_module_diff"]))
    if "first_param_diff" in comparison:
        parts.append(_first_diff("parameters", comparison["first_param_diff"]))
    final = {True: "yes", False: "no", None: "not recorded"}[comparison["final_equal"]]
    parts.append(f"final parameters equal: {final}")
    if not comparison["val_loss_equal"]:
        values = [_loss_text(v) for v in comparison.get("val_losses") or []]
        parts.append("validation losses differ" + (f" ({values[0]} vs {values[1]})" if values else ""))
    return f"DIFFERENT ({'; '.join(parts)})"


def _loss_text(value: Optional[str]) -> str:
    """A recorded loss (``float.hex``) as the shortest decimal that gives its bits back (``repr``)."""
    return "not recorded" if value is None else repr(float.fromhex(value))


def val_loss_texts(runs: dict) -> dict:
    """Per run, its validation loss as printed: to 4 decimals where every run's has the same bits, else every one
    in full (:func:`_loss_text`), so that losses that differ look different."""
    values = {lab: rec.get("val_loss") for lab, rec in runs.items()}
    if len(set(values.values())) == 1 and None not in values.values():
        return {lab: f"{float.fromhex(v):.4f}" for lab, v in values.items()}
    return {lab: _loss_text(v) for lab, v in values.items()}


def same_step(a: dict, b: dict) -> bool:
    """Whether two steps' records have the same loss, gradient (and, if recorded, parameter) bits."""
    return not step_differences(a, b)


#: the parts of a step's record the table compares, and how its cells name them
STEP_PARTS = (("loss", "loss"), ("grads", "grads"), ("params", "params"))


def step_differences(ref: dict, other: dict) -> list:
    """What differs between two steps' records: ``"loss"`` (its ``float.hex``), ``"grads"`` (a gradient digest),
    ``"params"`` (a digest of the parameters after the step, where recorded), in that order; empty if none."""
    return [name for key, name in STEP_PARTS if ref.get(key) != other.get(key)]


def _print_table(runs: dict, stop_at: int, print_fn: Callable) -> None:
    """The per-step table: the loss of the first run, then per other run ``= bits`` (its loss, gradient and
    parameter bits of the step are the first run's) or what differs (``loss``, ``grads``, ``params``, joined by
    ``+``); the native control: its loss, ``*`` where its loss or gradient bits differ from ``native-1``'s."""
    labels = list(runs)
    ref_label = labels[0]
    n_steps = len(runs[ref_label]["steps"])
    show = sorted(set(list(range(min(n_steps, 5))) + list(range(0, n_steps, max(1, n_steps // 10)))
                      + [n_steps - 1, stop_at - 1, stop_at]))
    table = []
    for i in show:
        if not 0 <= i < n_steps:
            continue
        ref = runs[ref_label]["steps"][i]
        cells = []
        for lab in labels[1:]:
            other = runs[lab]["steps"][i] if i < len(runs[lab]["steps"]) else None
            if other is None:
                cells.append("missing")
            elif lab.startswith("native"):
                native_ref = runs["native-1"]["steps"][i]
                same = other["loss"] == native_ref["loss"] and other["grads"] == native_ref["grads"]
                cells.append(f"{float.fromhex(other['loss']):.4f}" + ("" if same or lab == "native-1" else "*"))
            else:
                cells.append("+".join(step_differences(ref, other)) or "= bits")
        table.append((i, float.fromhex(ref["loss"]), cells))
    widths = [max([8, len(lab)] + [len(cells[k]) for _, _, cells in table]) for k, lab in enumerate(labels[1:])]
    print_fn("")
    print_fn(f"(per step: the loss of run {ref_label}; per run, '= bits' where the step's loss, gradient and "
             f"parameter bits are {ref_label}'s, else which differ)")
    print_fn(f"{'step':>5} {f'loss ({ref_label})':>10}  " + "  ".join(f"{lab:>{w}}" for lab, w in
                                                                     zip(labels[1:], widths)))
    for i, loss, cells in table:
        print_fn(f"{i:>5} {loss:>10.6f}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    print_fn("")


def _cpu_caveat(spec: dict) -> str:
    """The end of a passing verdict line on the CPU for a Hugging Face model in which :func:`ordered_ssd.hf.audit_model`
    finds pieces that repeat on the CPU but not on CUDA: a CPU pass is no CUDA promise. Else ``""``."""
    hf = spec.get("hf") or {}
    found = hf.get("not_deterministic_on_cuda") or []
    if not found or not str(spec.get("device", "")).startswith("cpu"):
        return ""
    return (f"; on the CPU only: on CUDA, audit_model finds {plural(len(found), 'piece')} not deterministic there "
            f"({', '.join(found)})")


def report(runs: dict, spec: dict, out_dir: str, *, source: str, n_params: int, stop_at: int, wall: float,
           nproc: Optional[int], print_fn: Callable = print) -> bool:
    """Compare the runs (``a``, ``b``, ``c`` and the native control's ``native-1``/``native-2`` if present),
    print the table, the comparisons and the verdict, write ``loss.png`` and ``report.json`` under ``out_dir``.
    Returns whether a, b and c (and, data-parallel, every rank of each) agree bit for bit."""
    ddp = nproc is not None
    native = "native-1" in runs
    cmp_b, cmp_c = compare_runs(runs["a"], runs["b"]), compare_runs(runs["a"], runs["c"])
    cmp_native = compare_runs(runs["native-1"], runs["native-2"]) if native else None
    ranks_agree = all(runs[lab].get("ranks_agree", True) for lab in ("a", "b", "c"))
    reproducible = cmp_b["identical"] and cmp_c["identical"] and ranks_agree
    diverged = first_nonfinite(runs, ("a", "b", "c"))
    ok = reproducible and diverged is None
    _print_table(runs, stop_at, print_fn)
    if ddp:
        print_fn(f"b (fresh processes) vs a:             {describe_comparison(cmp_b)}")
        print_fn(f"c (stopped at {stop_at}, resumed) vs a:    {describe_comparison(cmp_c)}")
        print_fn("ranks agree (loss, gradient and parameter bits on every rank): " + (
            "yes, in every run" if ranks_agree else "NO: " + ", ".join(
                f"run {lab} ranks {runs[lab]['ranks_disagreeing']}" for lab in ("a", "b", "c")
                if not runs[lab]["ranks_agree"])))
    else:
        print_fn(f"b (fresh process) vs a:               {describe_comparison(cmp_b)}")
        print_fn(f"c (stopped at {stop_at}, resumed) vs a:    {describe_comparison(cmp_c)}")
    if native:
        print_fn("(native columns: the loss; '*' marks a step whose loss or gradient bits differ from native-1)")
        native_layer = "Mamba3" if spec.get("model") and layer_of(spec["model"]) == "mamba3" else "Mamba2"
        print_fn(f"native {native_layer} run 1 vs run 2 (control): " + (
            "identical" if cmp_native["identical"] else
            f"diverged: first gradient difference at step "
            f"{cmp_native['first_grad_diff']['step'] if cmp_native['first_grad_diff'] else '-'}, first loss "
            f"difference at step {cmp_native['first_loss_diff']}"
            + (f"; {describe_module_diff(cmp_native['first_module_diff'])}" if cmp_native.get("first_module_diff")
               else "")))
    val = val_loss_texts(runs)
    for lab, rec in runs.items():
        per_rank = ("" if "rank_s_per_step" not in rec else
                    " (per rank: " + ", ".join(f"{1000 * t:.1f}" for t in rec["rank_s_per_step"]) + ")")
        print_fn(f"  run {lab:>8}: {1000 * rec['s_per_step']:.1f} ms/step{per_rank}, val loss {val[lab]}")
    first_module = min(([dict(c["first_module_diff"], run=lab) for lab, c in (("b", cmp_b), ("c", cmp_c))
                         if c.get("first_module_diff") is not None]), key=lambda d: d["step"], default=None)
    if first_module is not None:
        print_fn(f"where (run {first_module['run']} vs a): {describe_module_diff(first_module)}")
    verdict = "REPRODUCIBLE" if reproducible else "NOT REPRODUCIBLE"
    n_steps = len(runs["a"]["steps"])
    hf = spec.get("hf")
    model = "" if hf is None else f"{hf['model_type']} ({hf['architecture']}), "
    if hf is None and layer_of(spec.get("model") or {}) != DEFAULT_LAYER:  # a mamba2 run's line is as it was
        model = f"byte-level {layer_name(spec['model'])} LM, "
    if diverged is not None:
        verdict = diverged_verdict(diverged)
        print_fn(f"verdict: {verdict}: {_describe_divergence(diverged, spec.get('lr'))}; the digests of a, b and c "
                 f"{'are identical' if reproducible else 'differ'}")
    elif ddp:
        print_fn(f"verdict: {verdict}: {model}{plural(n_steps, 'step')}, world size {nproc}, loss, per-parameter "
                 f"gradient and final parameter digests {'identical' if ok else 'differ'} across 3 runs and every rank "
                 f"(fresh processes; restart at step {stop_at}){_cpu_caveat(spec) if ok else ''}")
    else:
        print_fn(f"verdict: {verdict}: {model}{plural(n_steps, 'step')}, loss, per-parameter gradient and final "
                 f"parameter digests {'identical' if ok else 'differ'} across 3 runs (fresh process; restart at step "
                 f"{stop_at}){_cpu_caveat(spec) if ok else ''}")
    if diverged is not None and not reproducible:
        print_fn("(the runs also differ: see the comparisons above)")

    summary = {"verdict": verdict, "ok": ok, "reproducible": reproducible, "diverged": diverged, "spec": spec,
               "data_source": source, "n_params": n_params,
               "stop_at": stop_at, "wall_s": wall, "threads": spec.get("threads"),
               "fingerprint": runs["a"]["fingerprint"],
               "fingerprint_info": runs["a"]["fingerprint_info"],
               "model": _model_summary(spec), "first_module_diff": first_module,
               "comparisons": {"b_vs_a": cmp_b, "c_vs_a": cmp_c, "native_2_vs_native_1": cmp_native},
               "runs": {lab: {"mixer": rec["mixer"], "s_per_step": rec["s_per_step"], "val_loss": rec["val_loss"],
                              "losses": [s["loss"] for s in rec["steps"]], "final": rec["final"],
                              "timings": rec.get("timings"), "wall_s": rec.get("wall_s"),
                              "threads": (rec.get("fingerprint_info") or {}).get("threads")}
                        for lab, rec in runs.items()},
               "module_names": runs["a"].get("module_names"),
               "per_step": [{"step": s["step"], "loss": s["loss"], "grads": s["grads"], "modules": s.get("modules")}
                            for s in runs["a"]["steps"]]}
    if ddp:
        summary["world_size"] = nproc
        summary["backend"] = spec["ddp"]["backend"]
        summary["ranks_agree"] = ranks_agree
        for lab, rec in runs.items():
            summary["runs"][lab].update({k: rec[k] for k in ("rank_s_per_step", "ranks_agree", "ranks_disagreeing",
                                                             "world_size")})
    write_report(out_dir, summary, runs, print_fn, command=check_command(spec))
    return ok


def check_command(spec: dict, *flags: str) -> str:
    """The command the plot's title names: ``ordered-ssd check`` and ``flags``, with ``--layer mamba3`` for a byte LM
    of Mamba-3 layers (a mamba2 run's title is as it was)."""
    model = spec.get("model") if spec.get("hf") is None else None
    if model is not None and layer_of(model) != DEFAULT_LAYER:
        flags += (f"--layer {layer_of(model)}",)
    return " ".join(("ordered-ssd check",) + flags)


def _model_summary(spec: dict) -> dict:
    """What was trained: the byte LM's shape and layer kind (``layer``: ``mamba2`` or ``mamba3``), or the Hugging
    Face model (type, architecture, config SHA-256)."""
    hf = spec.get("hf")
    if hf is None:
        model = spec.get("model") or {}
        return {"kind": "byte-lm", **model, "layer": layer_of(model)}
    return {"kind": "hf", **{k: hf[k] for k in ("model_type", "architecture", "source", "config_file",
                                                "config_sha256", "weights_sha256", "attn_implementation",
                                                "embedding", "transformers")}}


def write_report(out_dir: str, summary: dict, runs: dict, print_fn: Callable,
                 command: str = "ordered-ssd check") -> None:
    """Draw ``loss.png`` (:mod:`.plot`: per step, each run's difference from its reference; when matplotlib can),
    write ``summary`` (with its ``plot`` and ``differences`` fields: :func:`.plot.differences`) to ``report.json``
    atomically, and print where both are."""
    data = plot_data(runs, stop_at=summary["stop_at"], verdict=summary["verdict"], diverged=summary.get("diverged"),
                     command=command, lr=summary["spec"].get("lr"))
    with writing("loss plot", os.path.join(out_dir, "loss.png")):
        note = plot(os.path.join(out_dir, "loss.png"), data)
    summary["plot"] = None if note else "loss.png"
    summary["differences"] = differences(data)
    with writing("report", os.path.join(out_dir, "report.json")):
        atomic_write_json(os.path.join(out_dir, "report.json"), summary)
    if note:
        print_fn(f"note: {note}")
    print_fn(f"report: {os.path.join(out_dir, 'report.json')}"
             + ("" if note else f", plot: {os.path.join(out_dir, 'loss.png')}"))
