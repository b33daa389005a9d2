"""The bench's child processes: the same harness in a fresh interpreter, with (``upstream-det``) or without
(``native``) mamba-ssm's deterministic switches in its environment."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import Callable, Optional, Sequence

import torch

import ordered_ssd

from ..errors import EXIT_OK
from .args import shape_settings
from .requirements import AUTOTUNE_CACHE_ENV, DET_ENV
from .runner import device_is_cuda, resolve_device
from .shapes import Shape
from .timing import bench_shape, count_launches, shape_result

CHILD_MARK = "@@ordered-ssd-bench-child@@ "
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ordered_ssd.__file__)))  # put on the child's path


def child_env(kind: str) -> dict:
    """The environment of a fresh bench process: this one's, with ordered-ssd's root first on ``PYTHONPATH`` and
    ``MAMBA_DETERMINISTIC`` / ``CAUSAL_CONV1D_DETERMINISTIC`` set to 1 for ``kind`` ``"upstream-det"`` and removed
    for any other; ``TRITON_CACHE_AUTOTUNING`` always removed."""
    env = dict(os.environ)
    for k in DET_ENV:
        env.pop(k, None)
    # no autotuning choice read from or written to disk: every process times its own candidates
    env.pop(AUTOTUNE_CACHE_ENV, None)
    if kind == "upstream-det":
        env.update({k: "1" for k in DET_ENV})
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def per_row_settings(settings: dict) -> dict:
    """``{"default": ..., "grid": ...}`` from either that or one flat settings dict (then used for every row)."""
    return settings if "default" in settings else {"default": settings, "grid": settings}


def deterministic_mode_here() -> object:
    """Whether mamba-ssm runs its deterministic mode in this process (imports mamba-ssm): True / False, or a
    string saying why it is unknown."""
    try:
        from mamba_ssm.utils.determinism import use_deterministic_mode

        return bool(use_deterministic_mode())
    except ImportError as e:
        return f"unknown ({e})"


def run_child(kind: str, shapes: Sequence[Shape], settings: dict, device: str, *, mode: str = "native",
              extra_modes: Sequence[str] = (), deadline: Optional[float] = None,
              log: Callable[[str], None] = lambda s: None) -> dict:
    """Run ``mode`` for every shape in a fresh ``python -m ordered_ssd.apps.bench`` process.

    ``extra_modes`` (e.g. ``("ordered",)`` beside the deterministic native layer of an upstream-det child) run in
    the same process, interleaved with ``mode`` round by round (:func:`~ordered_ssd.apps.bench.timing.bench_shape`),
    so their ``ratio_ms_paired`` (where ``mode`` is native) is a ratio measured in one process; their launches are
    not counted.

    ``kind`` ``"upstream-det"`` sets ``MAMBA_DETERMINISTIC=1`` and ``CAUSAL_CONV1D_DETERMINISTIC=1`` in the
    child's environment only; ``"native"`` removes both. The child prints one JSON line per shape (marker
    :data:`CHILD_MARK`) and a final one with everything. ``deadline`` (``time.monotonic()`` value): the child
    starts no shape after it and is killed at it. Returns ``{"kind", "returncode", "meta", "shapes": {name:
    shape result}, "error"}``; a shape the child did not report has ``{"error": ...}`` rows. Raises
    ``ValueError`` for another ``kind``; a failing child is reported in ``error``, never raised. ``settings``: one
    dict for every row, or ``{"default": ..., "grid": ...}`` (grid rows take the second).
    """
    if kind not in ("upstream-det", "native"):
        raise ValueError(f"kind: expected 'upstream-det' or 'native', got {kind!r}")
    spec = {"kind": kind, "mode": mode, "extra_modes": list(extra_modes), "device": device,
            "settings": per_row_settings(settings),
            "shapes": [asdict(s) for s in shapes],
            "time_budget": None if deadline is None else max(1.0, deadline - time.monotonic()),
            # the parent's deadline itself (CLOCK_MONOTONIC is one clock for every process of the machine): the
            # child's own clock would start after its imports, 10-20 s late
            "deadline_monotonic": deadline}
    cmd = [sys.executable, "-m", "ordered_ssd.apps.bench", "--_child-spec", json.dumps(spec)]
    out = {"kind": kind, "returncode": None, "meta": None, "shapes": {}, "error": None}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=child_env(kind), cwd=os.getcwd(), stdout=subprocess.PIPE, stderr=None,
                            stdin=subprocess.DEVNULL, text=True)
    timer = None
    killed = threading.Event()
    if deadline is not None:
        def _kill():
            killed.set()
            proc.kill()
        timer = threading.Timer(max(1.0, deadline - time.monotonic() + 15.0), _kill)
        timer.daemon = True
        timer.start()
    try:
        for line in proc.stdout:
            if not line.startswith(CHILD_MARK):  # something else printed to stdout: show it, with stderr
                sys.stderr.write(line)
                continue
            try:
                msg = json.loads(line[len(CHILD_MARK):])
            except json.JSONDecodeError:
                continue
            if msg.get("type") == "shape":
                out["shapes"][msg["result"]["name"]] = msg["result"]
                log(f"{kind} child: {msg['result']['name']} done")
            elif msg.get("type") == "done":
                out["meta"] = msg.get("meta")
                out["shapes"].update({r["name"]: r for r in msg.get("shapes", [])})
        proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out["returncode"] = proc.returncode
    out["wall_s"] = round(time.monotonic() - t0, 1)
    if killed.is_set():
        out["error"] = "stopped at the time budget"
    elif proc.returncode != 0:
        out["error"] = f"child exited with status {proc.returncode} (its stderr is above)"
    for s in shapes:
        if s.name not in out["shapes"]:
            why = out["error"] or "not reported by the child"
            out["shapes"][s.name] = dict(shape_result(s, torch.device(device)),
                                         rows={m: {"mode": m, "error": f"{kind} child: {why}"}
                                               for m in dict.fromkeys((mode, *extra_modes))})
    return out


def child_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    deadline = None if spec.get("time_budget") is None else time.monotonic() + float(spec["time_budget"])
    if spec.get("deadline_monotonic") is not None and sys.platform.startswith("linux"):
        deadline = float(spec["deadline_monotonic"])
    device = resolve_device(spec["device"], index=device_is_cuda(spec["device"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mode = spec["mode"]
    modes = list(dict.fromkeys([mode, *spec.get("extra_modes", ())]))  # each mode once
    env = {k: os.environ.get(k) for k in DET_ENV + (AUTOTUNE_CACHE_ENV,)}
    meta = {"kind": spec["kind"], "mode": mode, "pid": os.getpid(), "env": env, "deterministic_mode": None}
    if mode == "native" and device.type == "cuda":
        meta["deterministic_mode"] = deterministic_mode_here()
    log = lambda s: print(f"[bench {spec['kind']} child] {s}", file=sys.stderr, flush=True)  # noqa: E731
    settings = per_row_settings(spec["settings"])
    shapes = [Shape(**shape_fields) for shape_fields in spec["shapes"]]
    results = []
    for shape in shapes:
        if deadline is not None and time.monotonic() > deadline:
            result = dict(shape_result(shape, device),
                          rows={m: {"mode": m, "error": "skipped: time budget"} for m in modes})
        else:
            result = bench_shape(shape, modes, shape_settings(shape, settings), device, log=log)
        results.append(result)
        print(CHILD_MARK + json.dumps({"type": "shape", "result": result}, default=str), flush=True)
    for shape, result in zip(shapes, results):  # after all timing: the profiler is never on while timing
        row = result["rows"][mode]
        if row.get("error") or not shape_settings(shape, settings).get("launch_steps", 2):
            continue
        if deadline is not None and time.monotonic() > deadline:
            row["launches_error"] = "skipped: time budget"
            continue
        row.update(count_launches(shape, [mode], shape_settings(shape, settings), device, log=log)[mode])
    print(CHILD_MARK + json.dumps({"type": "done", "meta": meta, "shapes": results}, default=str), flush=True)
    return EXIT_OK
