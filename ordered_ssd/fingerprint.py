"""The determinism fingerprint: everything that must match for two runs to be expected bit-identical."""
from __future__ import annotations

import hashlib
import json
import platform
from typing import Optional

import torch
import csrc_bindings

__all__ = ["package_versions", "determinism_fingerprint", "fingerprint_string", "fingerprint_diff"]


def package_versions() -> dict:
    """Installed versions (None if absent), read from package metadata without importing the packages."""
    from ._version import __version__

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": csrc_bindings.installed_version("triton"),
        "cuda": torch.version.cuda,
        "mamba-ssm": csrc_bindings.installed_version("mamba_ssm"),
        "causal-conv1d": csrc_bindings.installed_version("causal_conv1d"),
        "ordered-ssd": __version__,
    }


def determinism_fingerprint(device: torch.device | str, world_size: int = 1,
                            cuda_path: Optional[bool] = None) -> dict:
    """What the bits of a training step depend on, besides the inputs.

    Args:
        device: the compute device.
        world_size: number of data-parallel ranks.
        cuda_path: include what the CUDA path's bits depend on (the mamba-ssm / causal-conv1d versions, the
            ``csrc_bindings`` table fingerprint of their kernels' pinned configurations and ordered-ssd's
            reduction algorithms, ``reduction``; Mamba-3's order and kernels, ``mamba3``). ``None`` (default):
            exactly when ``OrderedMamba2`` would take the CUDA path on ``device`` (CUDA with the extras installed);
            this imports mamba-ssm then.
    """
    device = torch.device(device)
    v = package_versions()
    info = {"ordered-ssd": v["ordered-ssd"], "torch": v["torch"], "python": v["python"],
            "device_type": device.type, "world_size": int(world_size)}
    if device.type == "cpu":
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["threads"] = torch.get_num_threads()
    else:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        info["gpu"] = torch.cuda.get_device_name(idx)
        info["capability"] = "sm_%d%d" % torch.cuda.get_device_capability(idx)
        info["cuda"] = v["cuda"]
        info["triton"] = v["triton"]
        if cuda_path is None:
            from .modules import cuda_path_available

            cuda_path = cuda_path_available()[0]
        if cuda_path:
            info["mamba-ssm"] = v["mamba-ssm"]
            info["causal-conv1d"] = v["causal-conv1d"]
            # without the speed choice of bit-neutral parameters: retuning it changes no bit, so it must not
            # refuse a restart (docs/bindings.md, "Order parameters and bit-neutral parameters")
            info["pinned_configs"] = csrc_bindings.fingerprint(speed=False)
            from .fold import reduction_fingerprint

            info["reduction"] = reduction_fingerprint(device)
            from .ops.mamba3_siso import mamba3_fingerprint

            info["mamba3"] = mamba3_fingerprint()  # OrderedMamba3's order and pinned kernels (docs/mamba3.md)
    return info


def fingerprint_string(info: dict) -> str:
    """Short stable hex digest of a fingerprint dict."""
    return hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint_diff(a: dict, b: dict) -> dict:
    """``{key: (a_value, b_value)}`` for every key whose value differs."""
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
