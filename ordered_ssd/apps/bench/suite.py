"""The suite: every shape and mode asked for, the breakdown and the child processes; the results rewritten after
each (so an interrupted run leaves what it measured)."""
from __future__ import annotations

import datetime
import os
import sys
import time
from dataclasses import asdict
from typing import Optional, Sequence

import torch

from ...fingerprint import package_versions
from ..errors import EXIT_OK
from ..files import prepare_out_dir
from .breakdown import profile_breakdown, write_breakdown
from .children import run_child
from .report import format_table, merge_results, write_results
from .requirements import DET_ENV, BenchError, missing_requirements
from .args import resolve_shapes
from .runner import error_text, free_memory, resolve_device
from .shapes import IN_PROCESS_MODES, MODES, Shape, named_or_parsed_shape
from .timing import bench_shape, finalize_ratios

EXIT_INCOMPLETE = 1


def _meta(device: torch.device, settings: dict, argv: Sequence[str], prog: str) -> dict:
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
            meta["pinned_configs"] = f"unavailable: {error_text(e)}"
    return meta


def _pinned(shape: Shape, device: torch.device) -> Optional[dict]:
    if device.type != "cuda":
        return None
    try:
        import csrc_bindings

        launch = csrc_bindings.describe_launch(chunk_size=shape.chunk, headdim=shape.headdim, dstate=shape.N,
                                          nheads=shape.nheads, ngroups=shape.G, dtype=torch.bfloat16, device=device)
        return {k: {"config": v.get("config"), "source": v.get("source")} for k, v in launch["kernels"].items()}
    except Exception as e:  # noqa: BLE001
        return {"error": error_text(e)}


def run(args, argv: Sequence[str] = (), prog: str = "ordered-ssd bench") -> int:
    """Run the suite for parsed ``args`` (see :func:`build_parser`); print the table; return the exit status
    (0 everything measured, 1 some rows failed or were skipped, 2 usage). Raises :class:`BenchError`."""
    log = (lambda s: None) if args.quiet else (lambda s: print(f"[bench] {s}", file=sys.stderr, flush=True))
    if args.merge:
        out = prepare_out_dir(args.out)
        results = merge_results(args.merge)
        paths = write_results(out, results)
        sys.stdout.write(format_table(results))
        print(f"\nwrote {paths['md']}, {paths['json']}" + (f", {paths['png']}" if paths["png"] else
                                                             f" ({paths['png_note']})"))
        return EXIT_OK
    t_start = time.monotonic()
    deadline = None if args.time_budget is None else t_start + args.time_budget
    device = resolve_device(args.device)
    modes = args.modes or (list(MODES) if device.type == "cuda" else ["ordered"])
    shapes = resolve_shapes(args)
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
    breakdown_shape = None
    if args.breakdown:
        name = args.breakdown_shape.strip()
        try:
            breakdown_shape = named_or_parsed_shape(name)
        except ValueError as e:
            raise BenchError(str(e).replace("--shape", "--breakdown-shape", 1)) from None
    if device.type == "cuda":
        device = resolve_device(args.device, index=True)
        torch.cuda.set_device(device)
    out = prepare_out_dir(args.out)
    settings = {"repeats": args.repeats, "warmup": args.warmup, "bit_repeats": args.bit_repeats, "seed": args.seed}
    results = {"meta": _meta(device, settings, argv, prog), "modes": modes, "children": {},
               "shapes": [{"name": s.name, "dims": s.dims(), "spec": s.spec(), "shape": asdict(s), "rows": {},
                           "pinned": _pinned(s, device)} for s in shapes]}
    by_name = {shape_result["name"]: shape_result for shape_result in results["shapes"]}
    in_modes = [m for m in modes if m in IN_PROCESS_MODES]

    def over() -> bool:
        return deadline is not None and time.monotonic() > deadline

    def save() -> dict:
        for shape_result in results["shapes"]:
            finalize_ratios(shape_result)
        results["meta"]["elapsed_s"] = round(time.monotonic() - t_start, 1)
        return write_results(out, results)

    if in_modes:
        for s in shapes:
            if over():
                by_name[s.name]["rows"].update({m: {"mode": m, "error": "skipped: time budget"} for m in in_modes})
                continue
            log(f"{s.name} ({s.dims()}): {', '.join(in_modes)}")
            measured = bench_shape(s, in_modes, settings, device, log=log)
            by_name[s.name]["rows"].update(measured["rows"])
            save()
    if breakdown_shape is not None:
        breakdown_modes = [m for m in ("native", "ordered") if m in modes] or [m for m in in_modes[:1]]
        if over():
            log("breakdown skipped: time budget")
            results["breakdown"] = {"error": "skipped: time budget"}
        elif breakdown_modes:
            log(f"breakdown: {breakdown_shape.name} ({breakdown_shape.dims()}), {', '.join(breakdown_modes)}")
            try:
                breakdown = profile_breakdown(breakdown_shape, breakdown_modes, settings, device,
                                              args.breakdown_steps, log=log)
            except Exception as e:  # noqa: BLE001 - e.g. out of memory building the layer; the rest goes on
                results["breakdown"] = {"error": error_text(e)}
                log(f"breakdown failed: {error_text(e)}")
            else:
                write_breakdown(out, breakdown)
                results["breakdown"] = {"file": "breakdown.md", "shape": breakdown_shape.name, "total_ms_per_step": {
                    m: v["total_ms_per_step"] for m, v in breakdown["modes"].items()}}
            free_memory(device)
            save()
    if "upstream-det" in modes:
        kinds = ["upstream-det"] + ([] if args.no_native_child else ["native"])
        for kind in kinds:
            if over():
                results["children"][kind] = {"error": "skipped: time budget"}
                for shape_result in results["shapes"]:
                    if kind == "upstream-det":
                        shape_result["rows"]["upstream-det"] = {"mode": "upstream-det", "error": "skipped: time budget"}
                continue
            log(f"starting the {kind} child process ({len(shapes)} shapes)")
            free_memory(device)
            child = run_child(kind, shapes, settings, str(device), deadline=deadline, log=log)
            results["children"][kind] = {k: child[k] for k in ("returncode", "meta", "error", "wall_s")}
            for shape_result in results["shapes"]:
                row = dict(child["shapes"][shape_result["name"]]["rows"]["native"])
                row["mode"] = "upstream-det" if kind == "upstream-det" else "native"
                row["process"] = f"child ({kind})"
                if kind == "upstream-det":
                    row["deterministic_mode"] = (child.get("meta") or {}).get("deterministic_mode")
                    shape_result["rows"]["upstream-det"] = row
                elif "upstream-det" in shape_result["rows"]:
                    shape_result["rows"]["upstream-det"]["child_native"] = {k: row.get(k) for k in (
                        "ms", "ms_min", "ms_max", "n", "peak_mib", "step_mib", "bitwise", "error")}
            save()
    note = save()["png_note"]
    sys.stdout.write(format_table(results))
    if results.get("breakdown", {}).get("file"):
        print(f"\nper-kernel breakdown: {os.path.join(out, 'breakdown.md')}")
    print(f"\nwrote {os.path.join(out, 'bench.md')}, bench.json" + (f" ({note})" if note else ", bench.png"))
    complete = all(not r.get("error") for shape_result in results["shapes"] for r in shape_result["rows"].values())
    return EXIT_OK if complete else EXIT_INCOMPLETE
