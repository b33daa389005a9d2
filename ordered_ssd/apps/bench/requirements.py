"""What the bench needs (a CUDA device, the native extras, the ordered layers' CUDA path) and the error it raises."""
from __future__ import annotations

import importlib.util
from typing import Callable, Optional, Sequence

import torch
from csrc_bindings import INSTALL_HINT as INSTALL  # importing csrc_bindings imports nothing native

from ..errors import AppError

DET_ENV = ("MAMBA_DETERMINISTIC", "CAUSAL_CONV1D_DETERMINISTIC")
#: Triton's switch that keeps autotuning choices on disk: removed from the environment of every child process of
#: the bench and of the check's precompile workers, so that each process times its own candidates
AUTOTUNE_CACHE_ENV = "TRITON_CACHE_AUTOTUNING"


class BenchError(AppError):
    """A user-facing failure (bad argument, missing requirement, unwritable output): one line, exit 2."""


def missing_requirements(device: str, modes: Sequence[str], *, cuda_available: Optional[bool] = None,
                         find_spec: Callable = importlib.util.find_spec,
                         cuda_path: Optional[Callable] = None, layer: str = "mamba2") -> Optional[str]:
    """``None`` if ``modes`` of ``layer`` (``"mamba2"``, ``"mamba3"``) can run on ``device`` here, else a one-line
    message naming what is missing and the install command. ``cuda_available`` / ``find_spec`` / ``cuda_path``
    override the probes (for tests)."""
    try:
        dev_type = torch.device(device).type
    except (RuntimeError, TypeError):
        return f"--device: expected cuda, cuda:N or cpu, got {device!r}"
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    absent = [n for m, n in (("mamba_ssm", "mamba-ssm"), ("causal_conv1d", "causal-conv1d"), ("triton", "triton"))
              if find_spec(m) is None]
    if dev_type == "cpu":
        gpu_modes = [m for m in modes if m in ("native", "upstream-det")]
        if gpu_modes:
            return (f"--modes {','.join(gpu_modes)} need a CUDA device and mamba-ssm ({INSTALL}); "
                    f"on the CPU only ordered,literal run (a smoke test of the harness)")
        return None
    if dev_type != "cuda":
        return f"--device: expected cuda, cuda:N or cpu, got {device!r}"
    problems = []
    if not cuda_available:
        problems.append(f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)")
    if absent:
        problems.append(", ".join(absent) + " not installed")
    if problems:
        return (" and ".join(problems) + f"; the benchmark needs a CUDA GPU and the native extras: {INSTALL} "
                f"(--device cpu --modes ordered runs a smoke test of the harness on the CPU)")
    if any(m in modes for m in ("ordered", "literal")):
        if cuda_path is None:
            from ...modules import cuda_path_available as cuda_path
        ok, why = cuda_path()
        if not ok:
            cls = "OrderedMamba3" if layer == "mamba3" else "OrderedMamba2"
            return f"{cls}'s CUDA path is unavailable here ({why}); {INSTALL}"
    return None
