"""What upstream's live autotuners hold, read without running them: their configuration lists
(:func:`live_candidates`, checked against the specs' copies before a tuning run) and the arguments their pre-hooks
zero (:func:`live_pre_hook_zero`, checked against the specs' ``pre_hook_zero`` on the GPU). Used by
:mod:`csrc_bindings.pinned.tune`; importing this module imports nothing native.
"""
from __future__ import annotations

from .. import _native, _registry


def live_candidates():
    """The autotuners' own config lists, as (block kwargs, num_warps, num_stages); checked against the copy.

    Raises:
        SystemExit: a live list differs from the spec's ``candidates`` (e.g. mamba-ssm's deterministic mode
            filtered it).
        ImportError, RuntimeError: as :func:`csrc_bindings._native.kernel_jit` (extras missing, another mamba-ssm
            version, changed kernel).
    """
    ns = _native.native()
    out = {}
    for name, spec in _registry.KERNELS.items():
        if spec.candidates is None:
            continue
        _native.kernel_jit(spec)  # checks the kernel and fills ns.kernels
        live = _native.live_configs(ns.kernels[name])
        if live != spec.candidates:
            raise SystemExit(f"{name}: the live autotuner lists {len(live)} configs that differ from the "
                             f"{len(spec.candidates)} upstream ones (is MAMBA_DETERMINISTIC or "
                             f"torch.use_deterministic_algorithms on, or TRITON_AUTOTUNE_BLOCK_SIZE_* set?). "
                             f"Run the tuner without them.")
        out[name] = live
    return out


class _ZeroRecorder:
    """Stands for one kernel argument in a pre-hook's argument dict; ``zero_()`` records the argument's name."""

    def __init__(self, name, zeroed):
        self.name, self.zeroed = name, zeroed

    def zero_(self):
        self.zeroed.add(self.name)
        return self

    def clone(self):  # a Triton autotuner's own pre-hook copies its ``restore_value`` arguments
        return self


class _RecorderArgs(dict):
    """``{name: _ZeroRecorder}`` for whatever name a pre-hook asks for."""

    def __init__(self, zeroed):
        super().__init__()
        self.zeroed = zeroed

    def __missing__(self, name):
        self[name] = rec = _ZeroRecorder(name, self.zeroed)
        return rec


def live_pre_hook_zero(spec) -> set:
    """The argument names that upstream's live autotuner of Triton kernel ``spec`` zeroes before a launch: every
    config's ``pre_hook`` and the autotuner's own ``pre_hook`` (its ``reset_to_zero``), each called with a dict of
    recorders (no tensor is touched). The launchers zero ``spec.pre_hook_zero`` by hand; the GPU test compares.

    Raises:
        ImportError, RuntimeError: as :func:`csrc_bindings._native.kernel_jit`.
    """
    _native.kernel_jit(spec)  # checks the kernel and fills native().kernels
    kernel = _native.native().kernels[spec.name]
    zeroed: set = set()
    hooks = [c.pre_hook for c in getattr(kernel, "configs", ()) if getattr(c, "pre_hook", None) is not None]
    if getattr(kernel, "pre_hook", None) is not None:
        hooks.append(kernel.pre_hook)
    for hook in hooks:
        hook(_RecorderArgs(zeroed))
    zeroed.update(n for n in (getattr(kernel, "reset_to_zero", None) or ()) if isinstance(n, str))
    return zeroed
