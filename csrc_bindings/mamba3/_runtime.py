"""What the Mamba-3 launchers need of Triton's runtime, kept local: :func:`import_kernels` (upstream's modules
imported once, the allocator their import sets put back), :func:`allocator` (one set around each launcher call) and
:func:`planned_launcher` (the launchers' decorator: both, around a launch plan). See :mod:`csrc_bindings.mamba3`.
Imports nothing native."""
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
    """One launch of a Mamba-3 kernel at the pinned (or given) configuration
    (:func:`csrc_bindings._configs.launch_config`) through :func:`csrc_bindings._native.launch`. Called by the
    launchers, inside :func:`planned_launcher`'s block (upstream's modules imported, :func:`allocator` set)."""
    from .._configs import launch_config
    from .._native import launch

    launch(spec, grid, args, launch_config(spec, args, ref, config), ref)


def planned_launcher(fn):
    """Decorate a Mamba-3 launcher: :func:`import_kernels` once, then the call under :func:`allocator`, through a
    launch plan (:func:`csrc_bindings._plans.planned`: a call whose signature was seen before replays the launches
    the launcher made, without its Python). The replay launches inside the same allocator block, so the kernels'
    TMA descriptors are built as in the launcher's own launches."""
    inner = _plans.planned(fn)

    @functools.wraps(fn)
    def launcher(*args, **kwargs):
        if not _imported:
            import_kernels()
        with allocator():
            return inner(*args, **kwargs)
    return launcher
