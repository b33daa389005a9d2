"""The measurements of one shape in this process: interleaved timing, host time, peak memory, the bit check; the
launch count (after all timing); the ratios and the targets."""
from __future__ import annotations

import gc
import hashlib
import json
import statistics
import time
from dataclasses import asdict
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..errors import plural
from .breakdown import kernel_category, profile_events
from .runner import LayerRunner, error_text, free_memory, sync
from .shapes import Shape, result_layer

MiB = float(2 ** 20)
# The targets of issue 14, on every shape: ordered / native <= 1.05 step time and <= 1.10 peak memory, and ordered
# no slower than upstream-det (Mamba-2; Mamba-3, which has no upstream-det, the first two).
TARGET_TIME = 1.05
TARGET_MEMORY = 1.10


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
    device = runner.device
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    runner.step(mode)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"peak_mib": peak / MiB, "step_mib": (peak - base) / MiB, "resident_mib": base / MiB}


def _host_time(runner: LayerRunner, mode: str, steps: int) -> dict:
    """The host (Python) time of one step with an idle GPU: synchronize, time the call ``runner.step(mode)``,
    synchronize; ``steps`` times, median. On CUDA this is the time to enqueue the step without waiting on a full
    launch queue; it includes any synchronisation the step does itself."""
    ms = []
    for _ in range(steps):
        runner.zero_grads()
        sync(runner.device)
        t0 = time.perf_counter()
        runner.step(mode)
        t1 = time.perf_counter()
        sync(runner.device)
        ms.append(1000.0 * (t1 - t0))
    runner.zero_grads()
    return {"host_ms": statistics.median(ms), "host_ms_all": [round(t, 4) for t in ms], "host_steps": steps}


def _bit_check(runner: LayerRunner, mode: str, repeats: int) -> dict:
    first, distinct, differing = None, set(), set()
    for _ in range(repeats):
        runner.step(mode)
        digests = runner.grad_digests()
        distinct.add(json.dumps(digests, sort_keys=True))
        if first is None:
            first = digests
        else:
            differing.update(k for k in digests if digests[k] != first[k])
    runner.zero_grads()
    return {"bitwise": len(distinct) == 1, "bit_repeats": repeats, "distinct_digest_sets": len(distinct),
            "differing": sorted(differing), "digests": first,
            "grads_sha256": hashlib.sha256(json.dumps(first, sort_keys=True).encode()).hexdigest()}


def bench_shape(shape: Shape, modes: Sequence[str], settings: dict, device: torch.device,
                log: Callable[[str], None] = lambda s: None) -> dict:
    """Warm up, time (interleaved), measure peak memory and check the bits of every in-process mode of one
    shape. Returns ``{"name", "dims", "spec", "rows": {mode: row}}``; a mode that raises gets ``{"error": ...}``
    and the others go on. ``settings``: ``repeats``, ``warmup``, ``bit_repeats``, ``seed``, ``host_steps``
    (default 5). The launch count is not measured here (:func:`count_launches`, after all timing)."""
    res = shape_result(shape, device)
    res["settings"] = dict(settings)
    rows = res["rows"]
    try:
        runner = LayerRunner(shape, modes, device, settings["seed"])
    except Exception as e:  # noqa: BLE001 - recorded in the row; the suite goes on
        for m in modes:
            rows[m] = {"mode": m, "error": "building the layer: " + error_text(e)}
        free_memory(device)
        return res
    alive = []
    for m in modes:
        try:
            t0 = time.perf_counter()
            for _ in range(settings["warmup"]):
                runner.step(m)
            sync(device)
            alive.append(m)
            rows[m] = {"mode": m, "process": "this", "warmup_s": round(time.perf_counter() - t0, 3)}
            log(f"{shape.name} {m}: warm-up {plural(settings['warmup'], 'step')} {time.perf_counter() - t0:.1f} s")
        except Exception as e:  # noqa: BLE001
            rows[m] = {"mode": m, "error": "warm-up: " + error_text(e)}
            log(f"{shape.name} {m}: {rows[m]['error']}")
            runner.zero_grads()
            free_memory(device)
    if alive:
        try:
            host: Dict[str, List[float]] = {}
            times = time_interleaved(runner.step, alive, settings["repeats"], device, before=runner.zero_grads,
                                     host=host)
            for m in alive:
                rows[m].update(_stats(times[m]))
                rows[m]["enqueue_ms"] = statistics.median(host[m])
            if "native" in times:
                for m in alive:
                    paired = [a / b for a, b in zip(times[m], times["native"]) if b > 0]
                    rows[m]["ratio_ms_paired"] = statistics.median(paired) if paired else None
            log(f"{shape.name}: " + ", ".join(f"{m} {rows[m]['ms']:.3f} ms" for m in alive))
        except Exception as e:  # noqa: BLE001
            for m in alive:
                rows[m]["error"] = "timing: " + error_text(e)
            alive = []
    for phase in ("host", "memory", "bits"):  # each mode in its own phase (peaks do not mix)
        for m in list(alive):
            try:
                if phase == "host":
                    rows[m].update(_host_time(runner, m, settings.get("host_steps", 5)))
                elif phase == "memory":
                    rows[m].update(_peak_memory(runner, m))
                else:
                    rows[m].update(_bit_check(runner, m, settings["bit_repeats"]))
            except Exception as e:  # noqa: BLE001
                rows[m]["error"] = f"{phase}: " + error_text(e)
                alive.remove(m)
                runner.zero_grads()
                free_memory(device)
    if "ordered" in alive and "literal" in alive:
        rows["literal"]["same_bits_as_ordered"] = rows["literal"]["digests"] == rows["ordered"]["digests"]
    runner.zero_grads()
    del runner
    free_memory(device)
    return res


def shape_result(shape: Shape, device: torch.device) -> dict:
    """The empty result of one shape: ``{"name", "dims", "spec", "shape", "dtype", "layer", "rows": {}}``;
    ``dtype`` is what the steps run in (the shape's on CUDA, ``fp32`` on the CPU's reference path), ``layer``
    ``"mamba2"`` or ``"mamba3"`` (:func:`~ordered_ssd.apps.bench.shapes.result_layer` reads it, ``"mamba2"`` for
    results that have none)."""
    dtype = shape.run_dtype(device.type == "cuda")
    return {"name": shape.name, "dims": shape.dims(dtype), "spec": shape.spec(), "shape": asdict(shape),
            "dtype": dtype, "layer": shape.layer, "rows": {}}


def count_launches(shape: Shape, modes: Sequence[str], settings: dict, device: torch.device,
                   log: Callable[[str], None] = lambda s: None) -> Dict[str, dict]:
    """GPU launches per step of every mode of one shape: one untimed step, then ``settings["launch_steps"]`` steps
    under ``torch.profiler`` (CUDA activity); every kernel, memset and memcpy the GPU ran counts. Run it after all
    timing in a process (the profiler is never active while anything is timed). Returns ``{mode: {"launches",
    "launch_steps", "launches_by_category"}}`` (``launches`` None on the CPU, which launches no GPU work), or
    ``{mode: {"launches_error": ...}}`` for a mode that raises."""
    steps = settings.get("launch_steps", 2)
    out: Dict[str, dict] = {}
    try:
        runner = LayerRunner(shape, modes, device, settings["seed"])
    except Exception as e:  # noqa: BLE001
        free_memory(device)
        return {m: {"launches_error": "building the layer: " + error_text(e)} for m in modes}
    for m in modes:
        try:
            runner.step(m)
            if device.type != "cuda":
                out[m] = {"launches": None, "launch_steps": steps, "launches_by_category": None}
                continue
            events = profile_events(runner, m, steps)
            cats: Dict[str, float] = {}
            for name, _ in events:
                cats[kernel_category(name)] = cats.get(kernel_category(name), 0) + 1.0 / steps
            out[m] = {"launches": len(events) / steps, "launch_steps": steps, "launches_by_category": cats}
            n = out[m]["launches"]
            log(f"{shape.name} {m}: {n:g} {'launch' if n == 1 else 'launches'} per step")
        except Exception as e:  # noqa: BLE001
            out[m] = {"launches_error": error_text(e)}
        runner.zero_grads()
    del runner
    free_memory(device)
    return out


def _ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


#: the ratios of ordered to upstream-det that :func:`targets` judges on, the first one present
DET_RATIOS = ("ratio_ms_det_same_process", "ratio_ms_det_paired", "ratio_ms_det")


def targets(rows: dict, layer: str = "mamba2") -> Optional[dict]:
    """The targets of the ordered row of one shape: ``{"time", "memory", "upstream_det"}``, each True (met), False
    (missed) or None (not measured: no native / upstream-det row, or an error), ``"met"``: True if all three were
    measured and met, False if one was missed, else None; for ``layer`` ``"mamba3"`` (mamba-ssm has no
    deterministic mode for it) only ``{"time", "memory", "met"}``, ``met`` over those two. And, for Mamba-2,
    ``"upstream_det_ratio"``: the ratio the upstream-det
    target was judged on, the first there is of ``"ratio_ms_det_same_process"`` (ordered and upstream-det
    interleaved in the upstream-det child), ``"ratio_ms_det_paired"`` (where the fresh-process native ran: each mode
    against native in the same kind of process) and ``"ratio_ms_det"`` (ordered ms here / upstream-det ms in its
    child), None when there is none. Each is a ratio of medians, as the time target's. Why not the direct ratio
    first: host-bound steps run at another speed in another process (native in a fresh process ran 0.2-26 % faster
    than in the bench's, ``docs/performance.md``, "Method"). ``None`` without an ordered row."""
    ordered = rows.get("ordered")
    if not ordered or ordered.get("error"):
        return None

    def check(value, limit):
        return None if value is None else bool(value <= limit)

    det_key = next((k for k in DET_RATIOS if ordered.get(k) is not None), None)
    out = {"time": check(ordered.get("ratio_ms"), TARGET_TIME),
           "memory": check(ordered.get("ratio_mem"), TARGET_MEMORY)}
    if layer == "mamba2":
        out["upstream_det"] = check(ordered.get(det_key) if det_key else None, 1.0)
    verdicts = list(out.values())
    out["met"] = False if False in verdicts else (True if None not in verdicts else None)
    if layer == "mamba2":
        out["upstream_det_ratio"] = det_key
    return out


def finalize_ratios(shape_res: dict) -> None:
    """Fill ``ratio_ms`` / ``ratio_mem`` of every row (to this process's native row); for upstream-det also
    ``ratio_ms_child`` / ``ratio_mem_child`` (to the native measured in its own fresh child process); for ordered
    ``ratio_ms_det`` (ordered ms / upstream-det ms, where upstream-det ran) and ``targets`` (:func:`targets`), and,
    where the fresh-process native ran too, ``ratio_ms_det_paired``: ordered / native in this process over
    upstream-det / native in fresh processes (each mode against native in the same kind of process), and where
    the upstream-det child also ran ordered (``in_det_process``), ``ratio_ms_det_same_process``: ordered's median
    over upstream-det's median, both timed interleaved in that process (:func:`targets` judges on the first of
    these). None of the three where the upstream-det row is an error or its child was not in mamba-ssm's
    deterministic mode."""
    rows = shape_res["rows"]
    native = rows.get("native") or {}
    det = rows.get("upstream-det") or {}
    det_ok = bool(det) and not det.get("error") and det.get("deterministic_mode") is not False
    ratio = _ratio

    for m, r in rows.items():
        if r.get("error"):
            continue
        r["ratio_ms"] = ratio(r.get("ms"), native.get("ms")) if not native.get("error") else None
        r["ratio_mem"] = ratio(r.get("peak_mib"), native.get("peak_mib")) if not native.get("error") else None
        child = r.get("child_native")
        if m == "upstream-det" and child and not child.get("error"):
            r["ratio_ms_child"] = ratio(r.get("ms"), child.get("ms"))
            r["ratio_mem_child"] = ratio(r.get("peak_mib"), child.get("peak_mib"))
    ordered = rows.get("ordered")
    if not ordered or ordered.get("error"):
        return
    ordered["ratio_ms_det"] = ratio(ordered.get("ms"), det.get("ms")) if det_ok else None
    same = ordered.get("in_det_process") or {}
    ordered["ratio_ms_det_same_process"] = (ratio(same.get("ms"), det.get("ms"))
                                            if det_ok and not same.get("error") else None)
    if det_ok and (det.get("child_native") or {}).get("ms"):
        # each mode against native in the same kind of process: (ordered / native, this process) over
        # (upstream-det / native, fresh processes)
        ordered["ratio_ms_det_paired"] = ratio(ordered.get("ratio_ms"), det.get("ratio_ms_child"))
    else:
        ordered.pop("ratio_ms_det_paired", None)  # from an earlier pass, no longer applicable
    ordered["targets"] = targets(rows, result_layer(shape_res))
