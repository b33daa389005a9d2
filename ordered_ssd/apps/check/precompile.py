"""The check's precompile phase on a GPU: Triton's on-disk cache filled before the runs start.

A fresh process's first training step compiles every kernel the step launches, and the kernels that
``native-autotune-v1`` covers (``docs/bindings.md``) compile every one of upstream's candidate configurations to
time them: about a minute for the check's default model on an H100, in each of the runs a, b and c (they start
together on a GPU, so none finds the others' compiles in the cache). Before them, ``jobs`` fresh worker processes
(``python -m ordered_ssd _train --precompile I/K``) each run one forward and backward of the spec's model with
mamba-ssm's live autotuners restricted to their share of the candidates (``I, I + K, ...``:
:func:`ordered_ssd.apps.bench.precompile.restrict_native_autotuners`, which runs each candidate once instead of
timing it), so that between them every candidate is compiled once; the runs then time the candidates from the
cache. The workers train nothing and write nothing but Triton's cache and their logs (``runs/precompile-I.log``);
their choices are thrown away with them. A worker that fails is named in one line and the runs go on (they then
compile what is missing themselves): the phase changes the wall time only, never which kernels run or a bit.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import List, Sequence, Tuple

import torch

from ..lm import lm_loss
from .spec import layer_of

#: at most this many workers (each a process with its own CUDA context)
MAX_JOBS = 8


def default_jobs() -> int:
    """Half the usable cores, 1 to :data:`MAX_JOBS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_JOBS, cores // 2))


def parse_slice(text: str) -> Tuple[int, int]:
    """``"I/K"`` -> ``(I, K)`` with ``0 <= I < K``; ValueError otherwise."""
    try:
        index, count = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--precompile: expected I/K (two integers), got {text!r}") from None
    if not 0 <= index < count:
        raise ValueError(f"--precompile: expected 0 <= I < K, got {text!r}")
    return index, count


def warm_step(spec: dict, index: int, count: int) -> None:
    """One forward and backward of ``spec``'s model (the byte LM of ``spec["model"]``, its ``mixer``) on a batch of
    the spec's shape, mamba-ssm's autotuners restricted to the candidates ``index, index + count, ...``; no
    optimizer step, nothing written. Changes mamba-ssm's module state for the rest of the process: a worker's
    only step."""
    from ..bench.precompile import restrict_native_autotuners
    from .train import build_model

    device = torch.device(spec["device"])
    restrict_native_autotuners(index, count, layers=(layer_of(spec["model"]),))
    model, _ = build_model(spec, device)
    g = torch.Generator().manual_seed(index)
    tokens = torch.randint(0, 256, (spec["batch"], spec["seq_len"] + 1), generator=g).to(device)
    lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def precompile(spec_paths: Sequence[str], runs_dir: str, jobs: int) -> Tuple[float, List[str]]:
    """Run ``jobs`` workers for each spec of ``spec_paths`` (the check's, and the native control's), all at once;
    ``(seconds, the failures' one-line descriptions)``."""
    from .launch import failure_reason

    t0 = time.perf_counter()
    procs = []
    for n, spec_path in enumerate(spec_paths):
        for i in range(jobs):
            log_path = os.path.join(runs_dir, f"precompile-{n * jobs + i}.log")
            log = open(log_path, "w")
            cmd = [sys.executable, "-m", "ordered_ssd", "_train", "--spec", spec_path, "--record", os.devnull,
                   "--label", f"precompile {i}/{jobs}", "--precompile", f"{i}/{jobs}", "--quiet"]
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL),
                          log, log_path))
    failures = []
    try:
        for proc, log, log_path in procs:
            rc = proc.wait()
            log.close()
            if rc != 0:
                with open(log_path, errors="replace") as fh:
                    lines = fh.read().splitlines()
                failures.append(f"{os.path.basename(log_path)}: exit code {rc}: {failure_reason(lines, rc)}")
    except BaseException:
        for proc, log, _ in procs:
            proc.terminate()
            log.close()
        raise
    return time.perf_counter() - t0, failures
