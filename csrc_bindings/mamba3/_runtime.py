"""What the Mamba-3 launchers need of Triton's runtime, kept local: :func:`import_kernels` (upstream's modules
imported once, the allocator their import sets put back), :func:`allocator` (one set around each launch, and
around a whole launcher call once those modules are imported) and :func:`planned_launcher` (the launchers'
decorator: a launch plan under that allocator). See :mod:`csrc_bindings.mamba3`. Imports nothing native."""
from __future__ import annotations

import contextlib
import functools
import threading

import torch

from .. import _plans

__all__ = ["UPSTREAM", "import_kernels", "allocator", "launch_kernel", "planned_launcher"]

#: the upstream modules mirrored here
UPSTREAM = ("mamba_ssm.ops.triton.mamba3.angle_dt", "mamba_ssm.ops.triton.mamba3.mamba3_siso_fwd",
            "mamba_ssm.ops.triton.mamba3.mamba3_siso_bwd")

_lock = threading.Lock()
_imported = False


def _allocation():
    from triton.runtime import _allocation  # triton >= 3.2: the allocator lives here
    return _allocation


def _torch_alloc(size: int, alignment: int, stream):
    """Triton's runtime memory (TMA descriptors, scratch) as a torch CUDA buffer on the current device."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


@contextlib.contextmanager
def _kept_allocator():
    """Put Triton's allocator back as it was after the block (a ``ContextVar`` or a module attribute)."""
    alloc = _allocation()
    var = alloc._allocator
    if hasattr(var, "get") and hasattr(var, "set"):  # ContextVar
        before = var.get()
        try:
            yield
        finally:
            alloc._allocator.set(before)
    else:
        try:
            yield
        finally:
            alloc._allocator = var


def import_kernels() -> None:
    """Import upstream's three Mamba-3 SISO kernel modules once, undoing the allocator their import sets.

    Raises:
        ImportError: mamba-ssm or triton missing (the message gives the install command, as every launcher's).
    """
    global _imported
    if _imported:
        return
    from .._native import _import_extra
    with _lock:
        if _imported:
            return
        _import_extra("triton", "triton")
        with _kept_allocator():
            for name in UPSTREAM:
                _import_extra(name, "mamba-ssm")
        _imported = True


@contextlib.contextmanager
def allocator():
    """Triton's allocator set to :func:`_torch_alloc` for the block only (the kernels' TMA descriptors need one)."""
    alloc = _allocation()
    var = alloc._allocator
    if hasattr(var, "set") and hasattr(var, "reset"):
        token = var.set(_torch_alloc)
        try:
            yield
        finally:
            var.reset(token)
    else:
        alloc._allocator = _torch_alloc
        try:
            yield
        finally:
            alloc._allocator = var


def launch_kernel(spec, grid, args: dict, ref: torch.Tensor, config=None) -> None:
    """One launch of a Mamba-3 kernel: upstream's modules imported (:func:`import_kernels`; called by the launchers
    after their checks, so bad input is refused first), the pinned (or given) configuration
    (:func:`csrc_bindings._configs.launch_config_for_grid`: the rule ``few-programs-v1`` may change its bit-neutral
    parameters for a launch of few programs), :func:`csrc_bindings._native.launch` under :func:`allocator`."""
    from .._configs import launch_config_for_grid
    from .._native import launch

    import_kernels()
    cfg = launch_config_for_grid(spec, grid, args, ref, config)
    with allocator():
        launch(spec, grid, args, cfg, ref)


def planned_launcher(fn):
    """Decorate a Mamba-3 launcher with a launch plan (:func:`csrc_bindings._plans.planned`: a call whose signature
    was seen before replays the launches the launcher made, without its Python), run under :func:`allocator` once
    upstream's modules are imported: a replay's launches build their TMA descriptors as the launcher's own do (a
    plan exists only after a launcher call that imported them). Before that, the call runs as it is: the
    launcher's checks, then :func:`launch_kernel` imports and sets the allocator."""
    inner = _plans.planned(fn)

    @functools.wraps(fn)
    def launcher(*args, **kwargs):
        if not _imported:
            return inner(*args, **kwargs)
        with allocator():
            return inner(*args, **kwargs)
    return launcher
