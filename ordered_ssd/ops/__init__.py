"""The ordered operations of the Mamba-2 layer on the CUDA path, one file per upstream operation.

Each file holds one operation's whole stack: composition (plain ``ordered_*_fwd`` / ``ordered_*_bwd`` functions
built from :mod:`csrc_bindings` launchers and :mod:`ordered_ssd.fold` folds, testable without autograd), then its
``torch.autograd.Function``, then its public function:

* ``ssd_combined.py`` (upstream ``mamba_ssm/ops/triton/ssd_combined.py``):
  :func:`ordered_mamba_chunk_scan_combined`, :func:`ordered_mamba_split_conv1d_scan_combined`;
* ``causal_conv1d.py`` (upstream ``causal_conv1d.causal_conv1d_fn``): :func:`ordered_causal_conv1d`;
* ``layernorm_gated.py`` (upstream ``mamba_ssm/ops/triton/layernorm_gated.py``): :func:`ordered_gated_rmsnorm`;
* ``linear.py`` (``torch.nn.functional.linear``, the projections): :func:`ordered_linear`;
* ``decode.py`` (one decoding step: causal-conv1d's ``causal_conv1d_update``, mamba-ssm's
  ``selective_state_update``): :func:`ordered_causal_conv1d_update`, :func:`ordered_selective_state_update`;
* ``common.py``: argument checks and the autocast dtype, shared by the others.

Importing this package imports :mod:`csrc_bindings` (which imports nothing native until its first launch).
"""
from .causal_conv1d import ordered_causal_conv1d
from .decode import ordered_causal_conv1d_update, ordered_selective_state_update
from .layernorm_gated import ordered_gated_rmsnorm
from .linear import ordered_linear
from .ssd_combined import (ordered_mamba_chunk_scan_combined, ordered_mamba_split_conv1d_scan_combined,
                           split_conv1d_scan_partials)

__all__ = ["ordered_mamba_chunk_scan_combined", "ordered_mamba_split_conv1d_scan_combined", "ordered_causal_conv1d",
           "ordered_gated_rmsnorm", "ordered_linear", "split_conv1d_scan_partials", "ordered_causal_conv1d_update",
           "ordered_selective_state_update"]
