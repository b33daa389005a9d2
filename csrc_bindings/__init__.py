"""csrc_bindings: pinned-configuration launchers for the native kernels of the Mamba-2 layer.

This is the only part of ordered-ssd that touches mamba-ssm 2.3.2.post1 and causal-conv1d 1.7.0 internals.

* One plain Python launcher per native kernel (``launch_*``), each taking tensors, an explicit configuration (or
  ``None`` for the pinned one) and optional output/workspace buffers; it launches the kernel's JIT function /
  C++ op directly under the device guard; only the first launch of a key of the seven kernels whose every parameter
  is bit-neutral goes through upstream's autotuner (rule ``native-autotune-v1``, :mod:`._configs`).
* No atomics reach a result: ``DETERMINISTIC_REDUCTION=True`` with per-tile workspaces where a kernel has it;
  causal-conv1d's backward is used for ``dx`` only (its atomic weight/bias gradients are discarded; ordered-ssd
  computes those itself, :func:`ordered_ssd.fold.conv1d_grad_partials`). Partials come back raw (fp32) with
  documented layouts; folding them is the caller's job (``ordered_ssd``).
* No global state: importing or using this package never patches a module attribute, never reads or writes
  ``MAMBA_DETERMINISTIC`` / ``CAUSAL_CONV1D_DETERMINISTIC`` / ``TRITON_*``, never toggles
  ``torch.use_deterministic_algorithms`` and leaves the mamba-ssm kernel objects (``configs``, ``cache``, hooks) as
  they were (an autotuner it calls gets its ``cache`` and its record of the run back); a native ``Mamba2`` in the
  same process behaves as before.
* ``import csrc_bindings`` imports neither triton nor mamba-ssm nor causal-conv1d; the first launcher call does,
  and checks versions and kernel signatures (:func:`check_native`).

Layout: one file per upstream module, named as upstream (``ssd_chunk_state.py``, ``ssd_bmm.py``,
``ssd_state_passing.py``, ``ssd_chunk_scan.py``, ``ssd_combined.py``, ``k_activations.py``, ``layernorm_gated.py``
and ``selective_state_update.py`` of ``mamba_ssm/ops/triton/``; ``causal_conv1d.py`` for causal-conv1d's interface),
each holding, per kernel, its
launcher, its example runner and its spec (:class:`~csrc_bindings._spec.KernelSpec`: argument names, autotune key,
candidates, pre-hook). :mod:`._registry` assembles them; :mod:`._configs` resolves configurations (the pinned table
and its tuner are in :mod:`.pinned`); :mod:`._native` loads and checks the natives.

See ``docs/bindings.md`` for the layouts, the pinned table and the fallback rule.
"""
from ._configs import KernelConfig, fingerprint, table_hash
from ._native import INSTALL_HINT, SUPPORTED_VERSIONS, installed_version, mamba2_class
from ._registry import CONV_OPS, KERNELS, describe_launch, layer_keys, pinned_config, rule_config, table_key
from ._resources import FIT_RULE, shared_memory_limit
from .causal_conv1d import launch_causal_conv1d_bwd_dx, launch_causal_conv1d_fwd, launch_causal_conv1d_update
from .k_activations import launch_swiglu_bwd, launch_swiglu_fwd
from .layernorm_gated import launch_rmsnorm_gated_bwd, launch_rmsnorm_gated_fwd
from .ssd_bmm import launch_bmm_chunk_bwd, launch_bmm_chunk_fwd
from .ssd_chunk_scan import (launch_chunk_scan_bwd_dC, launch_chunk_scan_bwd_dcb, launch_chunk_scan_bwd_ddAcs_stable,
                             launch_chunk_scan_bwd_dstates, launch_chunk_scan_bwd_dz, launch_chunk_scan_fwd)
from .selective_state_update import launch_selective_state_update
from .ssd_chunk_state import (launch_chunk_cumsum_bwd, launch_chunk_cumsum_fwd, launch_chunk_state_bwd_db,
                              launch_chunk_state_fwd, launch_chunk_state_varlen)
from .ssd_combined import launch_chunk_scan_chunk_state_bwd_dx
from .ssd_state_passing import launch_state_passing_bwd, launch_state_passing_fwd


def check_native(conv: bool = True) -> dict:
    """Import the native extras now and run the version + signature check; return the installed versions.

    Raises:
        ImportError: an extra is missing (``pip install --no-build-isolation mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0``).
        RuntimeError: unsupported installed version or changed kernel signature (message names both versions).
    """
    from ._native import conv_op, kernel_jit, native, native_conv
    versions = dict(native().versions)
    for spec in KERNELS.values():
        kernel_jit(spec)
    if conv:
        versions.update(native_conv().versions)
        for spec in CONV_OPS.values():
            conv_op(spec)
    return versions


__all__ = [
    "KernelConfig", "describe_launch", "fingerprint", "layer_keys", "pinned_config", "rule_config", "table_hash",
    "table_key", "check_native", "FIT_RULE", "shared_memory_limit", "installed_version", "mamba2_class", "INSTALL_HINT",
    "SUPPORTED_VERSIONS",
    "launch_chunk_cumsum_fwd", "launch_chunk_cumsum_bwd", "launch_bmm_chunk_fwd", "launch_bmm_chunk_bwd",
    "launch_chunk_state_fwd", "launch_chunk_state_bwd_db", "launch_state_passing_fwd", "launch_state_passing_bwd",
    "launch_chunk_scan_fwd", "launch_chunk_scan_bwd_dz", "launch_chunk_scan_bwd_dstates", "launch_chunk_scan_bwd_dC",
    "launch_chunk_scan_bwd_dcb", "launch_chunk_scan_bwd_ddAcs_stable", "launch_chunk_scan_chunk_state_bwd_dx",
    "launch_rmsnorm_gated_fwd", "launch_rmsnorm_gated_bwd", "launch_swiglu_fwd", "launch_swiglu_bwd",
    "launch_causal_conv1d_fwd", "launch_causal_conv1d_bwd_dx", "launch_chunk_state_varlen",
    "launch_causal_conv1d_update", "launch_selective_state_update",
]
