"""The measurements of one shape in this process: interleaved timing, peak memory, the bit check."""
from __future__ import annotations

import gc
import hashlib
import json
import statistics
import time
from dataclasses import asdict
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .runner import LayerRunner, error_text, free_memory, sync
from .shapes import Shape

MiB = float(2 ** 20)


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
    and the others go on. ``settings``: ``repeats``, ``warmup``, ``bit_repeats``, ``seed``."""
    res = {"name": shape.name, "dims": shape.dims(), "spec": shape.spec(), "shape": asdict(shape), "rows": {}}
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
            log(f"{shape.name} {m}: warm-up {settings['warmup']} steps {time.perf_counter() - t0:.1f} s")
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
                rows[m]["host_ms"] = statistics.median(host[m])
            if "native" in times:
                for m in alive:
                    paired = [a / b for a, b in zip(times[m], times["native"]) if b > 0]
                    rows[m]["ratio_ms_paired"] = statistics.median(paired) if paired else None
            log(f"{shape.name}: " + ", ".join(f"{m} {rows[m]['ms']:.3f} ms" for m in alive))
        except Exception as e:  # noqa: BLE001
            for m in alive:
                rows[m]["error"] = "timing: " + error_text(e)
            alive = []
    for phase in ("memory", "bits"):  # each mode in its own phase (peaks do not mix)
        for m in list(alive):
            try:
                rows[m].update(_peak_memory(runner, m) if phase == "memory"
                               else _bit_check(runner, m, settings["bit_repeats"]))
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


def finalize_ratios(shape_res: dict) -> None:
    """Fill ``ratio_ms`` / ``ratio_mem`` of every row (to this process's native row), and for upstream-det also
    ``ratio_ms_child`` / ``ratio_mem_child`` (to the native measured in its own fresh child process)."""
    rows = shape_res["rows"]
    native = rows.get("native") or {}

    def ratio(a, b):
        return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None

    for m, r in rows.items():
        if r.get("error"):
            continue
        r["ratio_ms"] = ratio(r.get("ms"), native.get("ms")) if not native.get("error") else None
        r["ratio_mem"] = ratio(r.get("peak_mib"), native.get("peak_mib")) if not native.get("error") else None
        child = r.get("child_native")
        if m == "upstream-det" and child and not child.get("error"):
            r["ratio_ms_child"] = ratio(r.get("ms"), child.get("ms"))
            r["ratio_mem_child"] = ratio(r.get("peak_mib"), child.get("peak_mib"))
