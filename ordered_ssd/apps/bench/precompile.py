"""The precompile phase (``--precompile-jobs N``): fill Triton's on-disk cache before anything is timed.

Every distinct kernel key (chunk_size, headdim, d_state, dtype) costs native's autotuner a compile of every candidate
configuration and ordered-ssd a compile of its pinned ones; done in the timing process, one key after another, that
is most of a run's wall time. Here, before any timing, up to ``N`` fresh worker processes (``python -m
ordered_ssd.apps.bench --_precompile-spec ...``) run :data:`PRECOMPILE_STEPS` untimed steps of each mode on their
share of the shapes, so that every kernel the timed run launches is already in the cache (Triton's cache directory,
``TRITON_CACHE_DIR`` or its default, is the same for every process: the workers inherit the environment) and the
timed process only loads it. The workers run the exact shapes of the run (a kernel compiled for another batch or
head count may be another specialisation). Two kinds of task (:func:`precompile_tasks`), each a fresh process:

* ``plain``: the in-process modes asked for (``native``, ``literal``, ``ordered``) on one shape, in an environment
  without the deterministic switches (``MAMBA_DETERMINISTIC``, ``CAUSAL_CONV1D_DETERMINISTIC`` removed);
* ``upstream-det``: ``native`` with both switches set on every shape of one kernel key, for the kernels the
  upstream-det child will launch.

**Native's candidates in slices.** Native's first step in a fresh process compiles every candidate configuration
of every autotuned kernel in turn (about 150 for Mamba-2, 170-185 s per key on the H200's machine with 14 workers;
about 230 for Mamba-3's SISO kernels, keyed as :meth:`Shape.kernel_key` says), and each
worker is a fresh process. So every shape gets ``k`` native tasks (``k = jobs // keys``, 2 to :data:`MAX_SLICES`),
and task ``i`` restricts each of mamba-ssm's live autotuners *in its own throwaway process* to the candidates
``i, i + k, i + 2k, ...`` (:func:`restrict_native_autotuners`) before its steps. Between them the ``k`` tasks
compile every candidate once for that shape (so its specialisation; a later shape of the same key mostly finds
them in the cache). The timed process never runs this: its autotuners keep every candidate and time them all,
each compile a cache hit.

Native's autotuner still times its candidates in the timing process (its choices are kept per process, not on disk:
``TRITON_CACHE_AUTOTUNING`` is removed from the workers' environment so that choices timed on a GPU shared by
several workers are never written for a later process to read), but each candidate's compile is a cache hit there.
The phase's wall time is recorded in ``bench.json`` (``precompile``); it is excluded from every measurement. A
worker that fails (an exception, out of memory, a crash) is reported there, never fatal: the timed run then compiles
what is missing in its warm-up, as it would without this phase. Each worker's output goes to
``<out>/precompile/<task>.log``.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ...modules import NATIVE_LAYERS
from ..errors import EXIT_OK, plural
from ..files import atomic_write_bytes
from .children import child_env, deterministic_mode_here
from .runner import LayerRunner, device_is_cuda, error_text, free_memory, resolve_device, sync
from .shapes import IN_PROCESS_MODES, Shape

PRECOMPILE_STEPS = 2
DEFAULT_JOBS_CUDA = 8
MAX_SLICES = 8
SPEC_FLAG = "--_precompile-spec"


def restrict_native_autotuners(index: int, count: int, layers: Sequence[str] = ("mamba2",)) -> int:
    """Restrict every live Triton autotuner of mamba-ssm's Triton ops to its candidates ``index, index + count,
    ...`` (at least the first one), each run once instead of timed (the autotuner's ``_do_bench``, where it has
    one); return how many autotuners were restricted.

    **Only for a precompile worker**: it changes mamba-ssm's module state for the rest of the process, so the
    process must measure nothing (the module docstring says why the phase does it). Imports the native module of
    every one of ``layers`` (``mamba_ssm.modules.mamba2``, ``...mamba3``: :data:`ordered_ssd.modules.NATIVE_LAYERS`)
    and through them the Triton ops (Mamba-3's under ``mamba_ssm.ops.triton.mamba3``) and their autotuners. Raises
    ``ValueError`` unless ``0 <= index < count``."""
    if not (isinstance(index, int) and isinstance(count, int) and 0 <= index < count):
        raise ValueError(f"slice: expected 0 <= index < count, got index {index!r} of {count!r}")
    for layer in layers:
        importlib.import_module(NATIVE_LAYERS[layer][0])

    n = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("mamba_ssm.ops.triton") or module is None:
            continue
        for obj in list(vars(module).values()):
            if type(obj).__name__ == "Autotuner" and isinstance(getattr(obj, "configs", None), list):
                if getattr(obj, "_ordered_ssd_full_configs", None) is None:
                    obj._ordered_ssd_full_configs = list(obj.configs)
                full = obj._ordered_ssd_full_configs
                obj.configs = full[index::count] or full[:1]
                if hasattr(obj, "_do_bench"):  # compile and run each candidate once; its timing is thrown away
                    obj._do_bench = _run_once
                n += 1
    return n


def _run_once(kernel_call, quantiles=None):
    """A stand-in for the autotuner's benchmark in a precompile worker: one call (which compiles), no timing."""
    kernel_call()
    return [1.0, 1.0, 1.0] if quantiles is not None else 1.0


def slices_per_key(jobs: int, keys: int) -> int:
    """How many native slice tasks each shape gets: ``jobs // keys``, between 2 and :data:`MAX_SLICES` (1 with a
    single job)."""
    if jobs <= 1:
        return 1
    return max(2, min(MAX_SLICES, jobs // max(1, keys)))


def precompile_tasks(shapes: Sequence[Shape], modes: Sequence[str], jobs: int = 1) -> List[dict]:
    """The tasks of the phase, ``{"name", "kind", "modes", "key", "shapes"[, "slice": [i, k]]}``, in the order
    they start:

    * ``plain`` (if an in-process mode is asked for): one task per shape, the first shape of every kernel key
      (:meth:`Shape.kernel_key`) first, then the second of every key, and so on, so that the first workers compile
      different keys at once and a later shape of a key mostly finds its kernels in the cache (it still compiles
      what its own values specialise: Triton compiles an integer argument equal to 1, or divisible by 16, apart);
      with ``native`` asked for and :func:`slices_per_key` ``k`` > 1, every shape is ``k`` tasks instead: slice 0
      runs every in-process mode with native's candidates ``0, k, 2k, ...``, slice ``i`` only ``native`` with
      candidates ``i, i + k, ...``;
    * ``upstream-det`` (if that mode is asked for): one task per kernel key with all its shapes (``native`` under
      the deterministic switches compiles one configuration per kernel: a short task).

    Duplicates of a spec and dtype are dropped."""
    groups: Dict[Tuple, List[Shape]] = {}
    seen = set()
    for s in shapes:
        if (s.spec(), s.dtype) in seen:
            continue
        seen.add((s.spec(), s.dtype))
        groups.setdefault(s.kernel_key(), []).append(s)
    tasks = []
    plain_modes = [m for m in IN_PROCESS_MODES if m in modes]
    k = slices_per_key(jobs, len(groups)) if "native" in plain_modes else 1
    if plain_modes:
        for rank in range(max((len(g) for g in groups.values()), default=0)):
            for key, group in groups.items():
                if rank >= len(group):
                    continue
                shape = group[rank]
                if k > 1:
                    for i in range(k):
                        tasks.append({"name": f"plain-{shape.name}-slice{i}of{k}", "kind": "plain",
                                      "modes": plain_modes if i == 0 else ["native"], "key": list(key),
                                      "shapes": [shape], "slice": [i, k]})
                else:
                    tasks.append({"name": f"plain-{shape.name}", "kind": "plain", "modes": plain_modes,
                                  "key": list(key), "shapes": [shape]})
    if "upstream-det" in modes:
        for key, group in groups.items():
            chunk, headdim, dstate, dtype = key[:4]
            tasks.append({"name": f"upstream-det-cs{chunk}-P{headdim}-N{dstate}-{dtype}", "kind": "upstream-det",
                          "modes": ["native"], "key": list(key), "shapes": list(group)})
    return tasks


def worker_command(task: dict, device: str, seed: int, result_path: str) -> Tuple[List[str], dict]:
    """``(argv, env)`` of the worker process of one task: this interpreter running ``python -m
    ordered_ssd.apps.bench --_precompile-spec JSON``; the environment of :func:`children.child_env` for the
    task's kind (the deterministic switches only for ``upstream-det``; never ``TRITON_CACHE_AUTOTUNING``). The
    worker writes its result as JSON to ``result_path``."""
    spec = {"name": task["name"], "kind": task["kind"], "modes": task["modes"], "device": device, "seed": seed,
            "steps": PRECOMPILE_STEPS, "shapes": [asdict(s) for s in task["shapes"]], "result_path": result_path,
            "slice": task.get("slice")}
    cmd = [sys.executable, "-m", "ordered_ssd.apps.bench", SPEC_FLAG, json.dumps(spec)]
    return cmd, child_env("upstream-det" if task["kind"] == "upstream-det" else "native")


def _task_summary(task: dict) -> dict:
    return {"name": task["name"], "kind": task["kind"], "modes": task["modes"], "key": task["key"],
            "shapes": [s.name for s in task["shapes"]], "returncode": None, "wall_s": None, "error": None,
            "log": None, "steps": None}


def _finish(entry: dict, proc: subprocess.Popen, result_path: str) -> None:
    entry["returncode"] = proc.returncode
    result = None
    try:
        with open(result_path) as fh:
            result = json.load(fh)
    except (OSError, json.JSONDecodeError):
        pass
    errors = []
    if result is not None:
        entry["steps"] = result.get("shapes")
        entry["deterministic_mode"] = result.get("deterministic_mode")
        for shape in result.get("shapes", []):
            if shape.get("error"):
                errors.append(f"{shape['name']}: {shape['error']}")
            errors += [f"{shape['name']} {m}: {r['error']}" for m, r in shape.get("modes", {}).items()
                       if r.get("error")]
    if proc.returncode != 0 and not entry["error"]:
        errors.insert(0, f"worker exited with status {proc.returncode} (its output: {entry['log']})")
    if errors and not entry["error"]:
        entry["error"] = "; ".join(errors)[:600]


def run_precompile(shapes: Sequence[Shape], modes: Sequence[str], device: str, jobs: int, seed: int,
                   log_dir: str, deadline: Optional[float] = None,
                   log: Callable[[str], None] = lambda s: None) -> dict:
    """Run the tasks of :func:`precompile_tasks` in at most ``jobs`` worker processes at once (each task a fresh
    process); wait for all. ``deadline`` (``time.monotonic()``): no task starts after it and running ones are
    killed at it. Returns ``{"jobs", "tasks": [per task: name, kind, modes, key, shapes, returncode, wall_s,
    error, log, steps], "failed", "wall_s", "triton_cache_dir", "excluded_from_measurements": True}``. Never
    raises for a failing worker (its ``error`` says what happened); raises ``ValueError`` for ``jobs`` < 1."""
    if jobs < 1:
        raise ValueError(f"jobs: expected a positive number of worker processes, got {jobs}")
    os.makedirs(log_dir, exist_ok=True)
    tasks = precompile_tasks(shapes, modes, jobs)
    entries = [_task_summary(t) for t in tasks]
    t_start = time.monotonic()
    pending = list(range(len(tasks)))
    running: Dict[int, tuple] = {}

    def over() -> bool:
        return deadline is not None and time.monotonic() > deadline

    log(f"precompile: {plural(len(tasks), 'task')} in up to {plural(jobs, 'worker process', 'worker processes')}")
    try:
        while pending or running:
            while pending and len(running) < jobs and not over():
                i = pending.pop(0)
                entry = entries[i]
                entry["log"] = os.path.join(log_dir, f"{entry['name']}.log")
                result_path = os.path.join(log_dir, f"{entry['name']}.json")
                if os.path.exists(result_path):
                    os.unlink(result_path)
                cmd, env = worker_command(tasks[i], device, seed, result_path)
                fh = open(entry["log"], "w")
                proc = subprocess.Popen(cmd, env=env, cwd=os.getcwd(), stdout=fh, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
                running[i] = (proc, time.monotonic(), fh, result_path)
            if over():
                for i in pending:
                    entries[i]["error"] = "skipped: time budget"
                pending = []
                for i, (proc, _, _, _) in running.items():
                    if proc.poll() is None:
                        proc.kill()
                        entries[i]["error"] = "killed at the time budget"
            for i, (proc, t0, fh, result_path) in list(running.items()):
                if proc.poll() is None:
                    continue
                fh.close()
                entries[i]["wall_s"] = round(time.monotonic() - t0, 1)
                _finish(entries[i], proc, result_path)
                del running[i]
                log(f"precompile {entries[i]['name']}: {entries[i]['wall_s']} s"
                    + (f", FAILED: {entries[i]['error']}" if entries[i]["error"] else ""))
            time.sleep(0.05)
    finally:
        for proc, _, fh, _ in running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            fh.close()
    return {"jobs": jobs, "steps": PRECOMPILE_STEPS, "tasks": entries,
            "failed": sum(1 for e in entries if e["error"]), "wall_s": round(time.monotonic() - t_start, 1),
            "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"), "excluded_from_measurements": True}


def precompile_main(spec_json: str) -> int:
    """The worker process of one task (``--_precompile-spec``): :data:`PRECOMPILE_STEPS` untimed steps of every
    mode of the task on each of its shapes; what happened is written as JSON to the spec's ``result_path`` after
    every shape (so a worker killed later leaves what it did). Exit status 0 unless the spec itself is broken."""
    spec = json.loads(spec_json)
    device = resolve_device(spec["device"], index=device_is_cuda(spec["device"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    out = {"name": spec["name"], "kind": spec["kind"], "pid": os.getpid(), "shapes": [],
           "deterministic_mode": deterministic_mode_here() if device.type == "cuda" else None,
           "slice": spec.get("slice"), "restricted_autotuners": None}
    if spec.get("slice") and "native" in spec["modes"]:
        layers = sorted({Shape(**fields).layer for fields in spec["shapes"]})
        out["restricted_autotuners"] = restrict_native_autotuners(*spec["slice"], layers=layers)
    for fields in spec["shapes"]:
        shape = Shape(**fields)
        entry: dict = {"name": shape.name, "modes": {}, "error": None}
        out["shapes"].append(entry)
        try:
            runner = LayerRunner(shape, spec["modes"], device, spec["seed"])
        except Exception as e:  # noqa: BLE001 - reported, the next shape goes on
            entry["error"] = "building the layer: " + error_text(e)
        else:
            for m in spec["modes"]:
                t0 = time.perf_counter()
                try:
                    for _ in range(spec["steps"]):
                        runner.step(m)
                    sync(device)
                    entry["modes"][m] = {"s": round(time.perf_counter() - t0, 2), "error": None}
                except Exception as e:  # noqa: BLE001
                    entry["modes"][m] = {"s": round(time.perf_counter() - t0, 2), "error": error_text(e)}
                runner.zero_grads()
                print(f"[precompile {spec['name']}] {shape.name} {m}: {entry['modes'][m]}", file=sys.stderr,
                      flush=True)
            del runner
        free_memory(device)
        atomic_write_bytes(spec["result_path"], json.dumps(out, default=str).encode())
    return EXIT_OK
