"""Launchers for mamba-ssm's Mamba-3 single-input single-output (SISO) Triton kernels, at pinned configurations:
the mirror of ``mamba_ssm/ops/triton/mamba3/`` (``angle_dt.py``, ``mamba3_siso_fwd.py``, ``mamba3_siso_bwd.py``).

The same contract as the Mamba-2 launchers (:mod:`csrc_bindings`): each launcher takes tensors and an optional
explicit configuration, launches the kernel's JIT function directly (never upstream's autotuner) with the pinned
configuration of :mod:`csrc_bindings._configs` (the table ``ORDER`` of :mod:`csrc_bindings.pinned.mamba3_params`,
else the ``mincost-v1`` rule over upstream's candidates; ``maxnreg`` left at Triton's default), and returns raw
outputs; cross-example partials
(``dD`` per sequence, the ``B``/``C`` bias gradients per example and chunk) come back unfolded, for
:mod:`ordered_ssd.ops.mamba3_siso` to fold in its documented order. Their specs are not part of
:data:`csrc_bindings._registry.SPECS` (the Mamba-2 layer's kernels, their pinned table and tuner):
:data:`MAMBA3_SPECS` lists them.

Two pieces of Triton state, kept local:

* importing upstream's ``mamba3_siso_bwd`` sets Triton's allocator for the whole process (an import side effect
  of mamba-ssm 2.3.2.post1); :func:`import_kernels` imports the three modules once and puts back the allocator that
  was there before;
* the kernels build TMA descriptors on the device, which need Triton's allocator at launch: :func:`allocator` sets
  a torch-backed one only around launches (around each launch, and, once upstream's modules are imported, around
  each whole launcher call, so that a launch plan's replay is inside it; Triton keeps it in a ``ContextVar``, and
  the previous value comes back after the block).

Each launcher is a launch plan (:func:`._runtime.planned_launcher`, :mod:`csrc_bindings._plans`): a call whose
signature was seen before replays the launches without the launcher's Python, inside the same allocator block.

Importing this package imports nothing native.
"""
from ._runtime import UPSTREAM, allocator, import_kernels
from .angle_dt import ANGLE_DT_BWD, ANGLE_DT_FWD, launch_angle_dt_bwd, launch_angle_dt_fwd
from .mamba3_siso_bwd import (DDT_DTRAP, DQKV, DZDO, ROTARY_BIAS_ANGLES, launch_ddt_dtrap, launch_dqkv,
                              launch_dzdo, launch_rotary_bias_angles)
from .mamba3_siso_fwd import MAMBA3_SISO_FWD, launch_mamba3_siso_fwd

#: the Mamba-3 SISO kernels, in the order one training step launches them
MAMBA3_SPECS = (ANGLE_DT_FWD, MAMBA3_SISO_FWD, DZDO, DQKV, ROTARY_BIAS_ANGLES, DDT_DTRAP, ANGLE_DT_BWD)

__all__ = ["UPSTREAM", "import_kernels", "allocator", "MAMBA3_SPECS", "launch_angle_dt_fwd", "launch_angle_dt_bwd",
           "launch_mamba3_siso_fwd", "launch_dzdo", "launch_dqkv", "launch_rotary_bias_angles", "launch_ddt_dtrap"]
