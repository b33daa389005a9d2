"""The suite: the precompile phase, every shape and mode asked for, the launch counts, the breakdown and the child
processes; the results rewritten after each (so an interrupted run leaves what it measured)."""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import List, Optional, Sequence

import torch

from ...fingerprint import package_versions
from ..errors import EXIT_OK, plural
from ..files import prepare_out_dir
from .args import resolve_breakdown_shape, resolve_layer, resolve_settings, resolve_shapes, shape_settings
from .breakdown import profile_breakdown, write_breakdown
from .children import ROOT, run_child
from .precompile import DEFAULT_JOBS_CUDA, run_precompile
from .report import format_table, merge_results, write_results
from .requirements import AUTOTUNE_CACHE_ENV, DET_ENV, BenchError, missing_requirements
from .results import load_runs, merge_run, render
from .runner import error_text, free_memory, resolve_device
from .shapes import IN_PROCESS_MODES, LAYER_DEFAULT_MODES, Shape, torch_dtype
from .timing import bench_shape, count_launches, finalize_ratios, shape_result

EXIT_INCOMPLETE = 1
# With --time-budget and upstream-det, this share of the budget is kept for the upstream-det child: the shapes,
# launch counts and breakdown of this process start nothing after the rest of it has passed.
CHILD_RESERVE = 0.35
#: the share of ``--time-budget`` the precompile phase may take (its workers are killed then; the timed warm-up
#: compiles what they did not)
PRECOMPILE_SHARE = 0.4


def _git(*args: str, root: str = ROOT, timeout: float = 10, env=None) -> subprocess.CompletedProcess:
    """``git -C root *args``, output captured as text."""
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _commit() -> Optional[str]:
    """The checkout's commit (``abc1234``, ``+dirty`` if it has changes), or None without git or a checkout."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return None
        dirty = _git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _tree(root: str = ROOT) -> Optional[str]:
    """The git tree id of the checkout's tracked files as they are on disk (``git write-tree`` over a throwaway
    index that ``git add -u`` filled; the working tree and the real index are untouched): the tree of the commit
    that a ``git commit -a`` would make, so a ``+dirty`` run can be matched to a later commit
    (``git rev-parse COMMIT^{tree}``). None without git or a checkout."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kw = dict(root=root, timeout=60, env={**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")})
            for step in (("read-tree", "HEAD"), ("add", "-u", ".")):
                if _git(*step, **kw).returncode != 0:
                    return None
            tree = _git("write-tree", **kw)
            return tree.stdout.strip() if tree.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


#: ``meta["precision"]`` of a CUDA run, per layer (:class:`~ordered_ssd.apps.bench.runner.LayerRunner`)
PRECISION = {
    "mamba2": ("fp32 parameters; u/dout in the row's dtype (bf16 or fp16, shown in dims) and "
               "torch.autocast('cuda', dtype=that dtype)"),
    "mamba3": ("the layers built in the row's dtype (shown in dims; dt_bias, B_bias, C_bias and D fp32, as "
               "Mamba3's), u/dout in that dtype, no autocast"),
}


def _meta(device: torch.device, settings: dict, argv: Sequence[str], prog: str, layer: str = "mamba2") -> dict:
    """The run's provenance and harness; ``layer`` is recorded, and a Mamba-3 run (which has no grid) records no
    ``grid_settings``."""
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "run_id": uuid.uuid4().hex[:16], "commit": _commit(), "tree": _tree(),
            "versions": package_versions(), "device": str(device), "gpu": None, "settings": settings["default"],
            "grid_settings": settings["grid"] if layer == "mamba2" else None, "layer": layer,
            "command": " ".join([prog] + list(argv)),
            "precision": (PRECISION[layer] if device.type == "cuda"
                          else "fp32 parameters and inputs (CPU reference path)"),
            "timer": "torch.cuda.Event per step" if device.type == "cuda" else "time.perf_counter per step",
            "parent_env": {k: os.environ.get(k) for k in DET_ENV + (AUTOTUNE_CACHE_ENV, "TRITON_CACHE_DIR")},
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        meta["gpu"] = "%s (sm_%d%d)" % ((torch.cuda.get_device_name(idx),) + torch.cuda.get_device_capability(idx))
        meta["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        try:
            meta["pinned_configs"] = pinned_fingerprint(layer)
        except Exception as e:  # noqa: BLE001
            meta["pinned_configs"] = f"unavailable: {error_text(e)}"
    return meta


def pinned_fingerprint(layer: str) -> str:
    """What pins the run's kernels: ``csrc_bindings.fingerprint()`` (Mamba-2's tables and rules), and for
    ``layer`` ``"mamba3"`` also ``mamba3=`` OrderedMamba3's order and pinned kernels (``mamba3_fingerprint``)."""
    import csrc_bindings

    text = csrc_bindings.fingerprint()
    if layer == "mamba3":
        from ...ops.mamba3_siso import mamba3_fingerprint

        text += f" mamba3={mamba3_fingerprint()}"
    return text


def _pinned(shape: Shape, device: torch.device) -> Optional[dict]:
    """The configurations ``csrc_bindings.describe_launch`` resolves for ``shape``'s kernels (Mamba-2's), with
    their source and speed rule; None off CUDA and for Mamba-3 (no describer for its kernels yet: they launch at
    the entries of ``csrc_bindings.pinned.mamba3_params.ORDER``, else the ``mincost-v1`` rule)."""
    if device.type != "cuda" or shape.layer != "mamba2":
        return None
    try:
        import csrc_bindings

        launch = csrc_bindings.describe_launch(chunk_size=shape.chunk, headdim=shape.headdim, dstate=shape.N,
                                          nheads=shape.nheads, ngroups=shape.G, dtype=torch_dtype(shape.dtype),
                                          device=device)
        return {k: {"config": v.get("config"), "source": v.get("source"), **({"speed": v["speed"]} if v.get("speed")
                                                                               else {})}
                for k, v in launch["kernels"].items()}
    except Exception as e:  # noqa: BLE001
        return {"error": error_text(e)}


def _fold_variants(shape: Shape) -> list:
    """The projection-fold variants that rule ``gemm-timed-v2`` chose in this process for ``shape``'s two weight
    gradients (``E = B``, ``L``, the row dtype, ``[M, N]`` of :meth:`Shape.projection_weights`): ``[{"M", "N",
    "variant", "config"}]``, sorted; empty where the rule timed nothing (off sm_90, fp32, ``L = 1``)."""
    from ordered_ssd.fold import gemm_fold_timed_choices

    projections = set(shape.projection_weights())
    dtype = torch_dtype(shape.dtype)
    return sorted(({"M": k[4], "N": k[5], "variant": v[0], "config": list(v[1])}
                   for k, v in gemm_fold_timed_choices().items()
                   if (k[1], k[2], k[3]) == (dtype, shape.B, shape.L) and (k[4], k[5]) in projections),
                  key=lambda r: (r["M"], r["N"]))


def _check_environment(modes: Sequence[str], args, device: torch.device, layer: str = "mamba2") -> None:
    if device.type == "cpu" and not args.shape and not args.shapes:
        raise BenchError("--device cpu: give a small --shape (S1-S5, the grid and M1-M6 are GPU sizes)")
    missing = missing_requirements(args.device, modes, layer=layer)
    if missing:
        raise BenchError(missing)
    if "native" in modes and any(os.environ.get(k) for k in DET_ENV):
        raise BenchError(f"{' / '.join(k for k in DET_ENV if os.environ.get(k))} is set in this process, so "
                         "'native' would not be native: unset it (upstream-det sets it for its own child only)")
    if "native" in modes and torch.are_deterministic_algorithms_enabled():
        raise BenchError("torch.use_deterministic_algorithms is on: mamba-ssm would run its deterministic mode "
                         "as 'native'")


def _measure_only(args) -> Optional[int]:
    """``--render`` / ``--merge``: measure nothing; None when neither is given."""
    if args.render:
        sys.stdout.write(render(args.render, args.render_run, getattr(args, "layer", None)))
        return EXIT_OK
    if args.merge:
        out = prepare_out_dir(args.out)
        results = merge_results(args.merge)
        results["meta"]["run_id"] = uuid.uuid4().hex[:16]  # a new run in --results-json, not the first file's
        paths = write_results(out, results)
        if args.results_json:
            merge_run(args.results_json, results)
        sys.stdout.write(format_table(results))
        print(f"\nwrote {paths['md']}, {paths['json']}" + (f", {paths['png']}" if paths["png"] else
                                                             f" ({paths['png_note']})"))
        return EXIT_OK
    return None


def run(args, argv: Sequence[str] = (), prog: str = "ordered-ssd bench") -> int:
    """Run the suite for parsed ``args`` (see :func:`build_parser`); print the table; return the exit status
    (0 everything measured, 1 some rows failed or were skipped, 2 usage). Raises :class:`BenchError`."""
    log = (lambda s: None) if args.quiet else (lambda s: print(f"[bench] {s}", file=sys.stderr, flush=True))
    done = _measure_only(args)
    if done is not None:
        return done
    t_start = time.monotonic()
    deadline = None if args.time_budget is None else t_start + args.time_budget
    device = resolve_device(args.device)
    layer = resolve_layer(args)  # the options that do not go with the layer: refused here, one line
    modes = args.modes or (list(LAYER_DEFAULT_MODES[layer]) if device.type == "cuda" else ["ordered"])
    shapes = resolve_shapes(args)
    _check_environment(modes, args, device, layer)
    breakdown_shape = resolve_breakdown_shape(args)
    if args.results_json:
        load_runs(args.results_json)  # a file that is not a results file: an error now, not after the run
    jobs = args.precompile_jobs if args.precompile_jobs is not None else (
        DEFAULT_JOBS_CUDA if device.type == "cuda" else 0)
    if device.type == "cuda":
        device = resolve_device(args.device, index=True)
        torch.cuda.set_device(device)
    out = prepare_out_dir(args.out)
    settings = resolve_settings(args)
    results = {"meta": _meta(device, settings, argv, prog, layer), "modes": modes, "children": {},
               "shapes": [dict(shape_result(s, device), pinned=_pinned(s, device)) for s in shapes]}
    by_name = {sr["name"]: sr for sr in results["shapes"]}
    in_modes = [m for m in modes if m in IN_PROCESS_MODES]

    def over() -> bool:
        return deadline is not None and time.monotonic() > deadline

    in_process_deadline = deadline
    if deadline is not None and "upstream-det" in modes:
        in_process_deadline = deadline - CHILD_RESERVE * args.time_budget

    def over_in_process() -> bool:
        return in_process_deadline is not None and time.monotonic() > in_process_deadline

    def save() -> dict:
        for sr in results["shapes"]:
            finalize_ratios(sr)
        results["meta"]["elapsed_s"] = round(time.monotonic() - t_start, 1)
        paths = write_results(out, results)
        if args.results_json:
            merge_run(args.results_json, results)
        return paths

    if jobs:
        pre_shapes = list(shapes) + ([breakdown_shape] if breakdown_shape is not None else [])
        # its own share of the budget: a slow precompile must not leave the timed shapes nothing (what it did not
        # compile, the warm-up compiles)
        pre_deadline = None if deadline is None else min(in_process_deadline, t_start + PRECOMPILE_SHARE
                                                         * args.time_budget)
        results["precompile"] = run_precompile(pre_shapes, modes, str(device), jobs, args.seed,
                                               os.path.join(out, "precompile"), deadline=pre_deadline, log=log)
        save()
    if in_modes:
        for s in shapes:
            if over_in_process():
                by_name[s.name]["rows"].update({m: {"mode": m, "error": "skipped: time budget"} for m in in_modes})
                continue
            log(f"{s.name} ({s.dims(s.run_dtype(device.type == 'cuda'))}): {', '.join(in_modes)}")
            measured = bench_shape(s, in_modes, shape_settings(s, settings), device, log=log)
            by_name[s.name]["rows"].update(measured["rows"])
            by_name[s.name]["settings"] = measured["settings"]
            by_name[s.name]["pinned"] = _pinned(s, device)  # with the choices native-autotune-v1 timed in the run
            by_name[s.name]["fold_variants"] = _fold_variants(s)  # rule gemm-timed-v2's choices for the shape
            save()
        _launch_phase(shapes, in_modes, settings, device, by_name, over_in_process, log)
        save()
    if breakdown_shape is not None:
        _breakdown_phase(breakdown_shape, modes, in_modes, settings["default"], device, args, out, results,
                         over_in_process, log)
        save()
    if "upstream-det" in modes:
        skipped = {s.name for s in shapes if in_modes and all(
            by_name[s.name]["rows"][m].get("error") == "skipped: time budget" for m in in_modes)}
        for s in shapes:
            if s.name in skipped:
                by_name[s.name]["rows"]["upstream-det"] = {"mode": "upstream-det", "error": "skipped: time budget"}
        _child_phase([s for s in shapes if s.name not in skipped], settings, device, args, results, deadline,
                     over, log, save)
    note = save()["png_note"]
    sys.stdout.write(format_table(results))
    if results.get("breakdown", {}).get("file"):
        print(f"\nper-kernel breakdown: {os.path.join(out, 'breakdown.md')}")
    print(f"\nwrote {os.path.join(out, 'bench.md')}, bench.json" + (f" ({note})" if note else ", bench.png")
          + (f", {args.results_json}" if args.results_json else ""))
    complete = all(not r.get("error") for sr in results["shapes"] for r in sr["rows"].values())
    return EXIT_OK if complete else EXIT_INCOMPLETE


def _launch_phase(shapes: Sequence[Shape], in_modes: Sequence[str], settings: dict, device: torch.device,
                  by_name: dict, over, log) -> None:
    """GPU launches per step of every in-process mode that was measured, after all timing of this process."""
    for s in shapes:
        rows = by_name[s.name]["rows"]
        alive: List[str] = [m for m in in_modes if m in rows and not rows[m].get("error")]
        if not alive or not shape_settings(s, settings)["launch_steps"]:
            continue
        if over():
            for m in alive:
                rows[m]["launches_error"] = "skipped: time budget"
            continue
        for m, counted in count_launches(s, alive, shape_settings(s, settings), device, log=log).items():
            rows[m].update(counted)


def _breakdown_phase(shape: Shape, modes, in_modes, settings: dict, device, args, out: str, results: dict, over,
                     log) -> None:
    breakdown_modes = [m for m in ("native", "ordered") if m in modes] or [m for m in in_modes[:1]]
    if over():
        log("breakdown skipped: time budget")
        results["breakdown"] = {"error": "skipped: time budget"}
    elif breakdown_modes:
        log(f"breakdown: {shape.name} ({shape.dims(shape.run_dtype(device.type == 'cuda'))}), "
            f"{', '.join(breakdown_modes)}")
        try:
            breakdown = profile_breakdown(shape, breakdown_modes, settings, device, args.breakdown_steps, log=log)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory building the layer; the rest goes on
            results["breakdown"] = {"error": error_text(e)}
            log(f"breakdown failed: {error_text(e)}")
        else:
            write_breakdown(out, breakdown)
            results["breakdown"] = {"file": "breakdown.md", "shape": shape.name, "total_ms_per_step": {
                m: v["total_ms_per_step"] for m, v in breakdown["modes"].items()}}
        free_memory(device)


def _ordered_in_det_process(rows: dict, child_row: Optional[dict]) -> None:
    """Put the ordered row that the upstream-det child measured beside its deterministic native layer under this
    process's ordered row as ``in_det_process``: ``ms`` (its median, timed interleaved with upstream-det's steps;
    ``ratio_ms_det_same_process`` is it over upstream-det's median), ``ratio_per_round`` (the median over rounds of
    ordered / upstream-det, for reference), ``host_ms``, ``bitwise``, ``same_bits`` (its gradient digests equal this
    process's ordered ones: mamba-ssm's switches change no bit of the ordered layer) or ``error``."""
    ordered = rows.get("ordered")
    if child_row is None or not ordered or ordered.get("error"):
        return
    if child_row.get("error"):
        ordered["in_det_process"] = {"error": child_row["error"]}
        return
    digests, here = child_row.get("digests"), ordered.get("digests")
    ordered["in_det_process"] = {
        "ms": child_row.get("ms"), "ratio_per_round": child_row.get("ratio_ms_paired"),
        "host_ms": child_row.get("host_ms"), "bitwise": child_row.get("bitwise"),
        "same_bits": None if digests is None or here is None else digests == here}


def _child_phase(shapes: Sequence[Shape], settings: dict, device, args, results: dict, deadline, over, log,
                 save) -> None:
    """The upstream-det child process (and, unless ``--no-native-child``, the fresh native one), on ``shapes``
    (those this process did not skip)."""
    kinds = ["upstream-det"] + ([] if args.no_native_child else ["native"])
    names = {s.name for s in shapes}
    for kind in kinds:
        if over() or not shapes:
            results["children"][kind] = {"error": "skipped: time budget"}
            for sr in results["shapes"]:
                if kind == "upstream-det":
                    sr["rows"]["upstream-det"] = {"mode": "upstream-det", "error": "skipped: time budget"}
            continue
        # ordered beside upstream-det in its process: a ratio of the two measured in one process; beside the fresh
        # native too, so that both children time their native layer interleaved with the same second layer
        extra = ("ordered",) if "ordered" in results["modes"] else ()
        log(f"starting the {kind} child process ({plural(len(shapes), 'shape')}{', with ordered' if extra else ''})")
        free_memory(device)
        child = run_child(kind, shapes, settings, str(device), extra_modes=extra, deadline=deadline, log=log)
        results["children"][kind] = {k: child[k] for k in ("returncode", "meta", "error", "wall_s")}
        for sr in results["shapes"]:
            if sr["name"] not in names:
                continue
            row = dict(child["shapes"][sr["name"]]["rows"]["native"])
            row.pop("ratio_ms_paired", None)  # native / native inside the child: meaningless here
            row["mode"] = "upstream-det" if kind == "upstream-det" else "native"
            row["process"] = f"child ({kind})"
            if kind == "upstream-det":
                row["deterministic_mode"] = (child.get("meta") or {}).get("deterministic_mode")
                sr["rows"]["upstream-det"] = row
                _ordered_in_det_process(sr["rows"], child["shapes"][sr["name"]]["rows"].get("ordered"))
            elif "upstream-det" in sr["rows"]:
                sr["rows"]["upstream-det"]["child_native"] = {k: row.get(k) for k in (
                    "ms", "ms_min", "ms_max", "n", "peak_mib", "step_mib", "bitwise", "error", "host_ms",
                    "launches")}
        save()
