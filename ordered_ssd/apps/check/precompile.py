"""The native control's precompile workers (``--native`` on a GPU): Triton's on-disk cache filled for mamba-ssm's
layers while run a trains.

The control trains mamba-ssm's own layer (``Mamba2`` or ``Mamba3``) in two fresh processes. Its first step there
compiles every candidate configuration of every one of mamba-ssm's autotuned kernels to time them: about 150 per
key for Mamba-2 and about 230 for Mamba-3's SISO kernels, one after another, which alone takes minutes. So once run
a's first step is done, ``jobs`` worker processes (``python -m ordered_ssd _train --precompile I/K``) each run one
forward and backward of the control's model with mamba-ssm's live autotuners restricted to their share of the
candidates (``I, I + K, ...``: :func:`ordered_ssd.apps.bench.precompile.restrict_native_autotuners`, which runs
each candidate once instead of timing it), so that between them every candidate is compiled once; the control's
runs start after them and time the candidates from the cache. The workers train nothing and write nothing but
Triton's cache and their logs (``runs/precompile-I.log``); their choices are thrown away with them. A worker that
fails, or still runs after ``Launcher.worker_timeout_s`` (900 s) and is killed, is named in one line and the check
goes on (the control's runs then compile what is missing themselves): the workers change the wall time only, never
which kernels run or a bit. Runs a, b and c (the ordered layer) get none:
their kernels compile in a's first step, faster than workers start (:func:`ordered_ssd.apps.check.run.run_check`).
"""
from __future__ import annotations

from typing import Tuple

import torch

from ..lm import lm_loss
from .launch import usable_cores
from .spec import layer_of

#: at most this many workers (each a process with its own CUDA context)
MAX_JOBS = 8


def default_jobs() -> int:
    """Half the usable cores, 2 to :data:`MAX_JOBS` (one worker would compile what the control compiles itself)."""
    return max(2, min(MAX_JOBS, usable_cores() // 2))


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
    """One forward and backward of ``spec``'s model (the byte LM of ``spec["model"]`` with its ``mixer``) on random
    bytes of the spec's batch shape, mamba-ssm's autotuners restricted to the candidates ``index, index + count,
    ...``; no optimizer step, nothing written. Changes mamba-ssm's module state for the rest of the process: a
    worker's only step. Raises ImportError without mamba-ssm."""
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
