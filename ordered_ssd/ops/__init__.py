"""The ordered operations of the Mamba-2 layer on the CUDA path, one file per upstream operation.

Each file holds one operation's whole stack: composition (plain ``ordered_*_fwd`` / ``ordered_*_bwd`` functions
built from :mod:`csrc_bindings` launchers and :mod:`ordered_ssd.fold` folds, testable without autograd), then its
``torch.library`` custom op (``ordered_ssd::<op>``, with a fake and with autograd through
``ordered_ssd::<op>_backward``) and its eager twin (an ``autograd.Function`` of the same forward body, backward rule
and backward body, applied in plain eager mode to skip the custom-op dispatch; :func:`~ordered_ssd.ops.common.call_op`),
then its public function:

* ``ssd_combined.py`` (upstream ``mamba_ssm/ops/triton/ssd_combined.py``, ``mamba_chunk_scan_combined``):
  :func:`ordered_mamba_chunk_scan_combined` (initial, final and varlen states);
* ``ssd_split_conv1d.py`` (the same upstream file, ``mamba_split_conv1d_scan_combined``):
  :func:`ordered_mamba_split_conv1d_scan_combined`, :func:`split_conv1d_scan_partials`;
* ``causal_conv1d.py`` (upstream ``causal_conv1d.causal_conv1d_fn``): :func:`ordered_causal_conv1d`;
* ``layernorm_gated.py`` (upstream ``mamba_ssm/ops/triton/layernorm_gated.py``): :func:`ordered_gated_rmsnorm`;
* ``linear.py`` (``torch.nn.functional.linear``, the projections): :func:`ordered_linear`;
* ``elementwise.py`` (the layer's own elementwise steps, ``-exp(A_log)`` and ``silu(z0) * x0``):
  :func:`ordered_A_from_log`, :func:`ordered_silu_mul`, custom ops only so that ``torch.compile`` keeps eager's bits;
* ``decode.py`` (one decoding step: causal-conv1d's ``causal_conv1d_update``, mamba-ssm's
  ``selective_state_update``): :func:`ordered_causal_conv1d_update`, :func:`ordered_selective_state_update`;
* ``common.py``: argument checks, the autocast dtype and context, the custom-op helpers, shared by all of them.

Importing this package imports :mod:`csrc_bindings` (which imports nothing native until its first launch).
"""
from .causal_conv1d import ordered_causal_conv1d
from .elementwise import ordered_A_from_log, ordered_silu_mul
from .decode import ordered_causal_conv1d_update, ordered_selective_state_update
from .layernorm_gated import ordered_gated_rmsnorm
from .linear import ordered_linear
from .ssd_combined import ordered_mamba_chunk_scan_combined
from .ssd_split_conv1d import ordered_mamba_split_conv1d_scan_combined, split_conv1d_scan_partials

__all__ = ["ordered_mamba_chunk_scan_combined", "ordered_mamba_split_conv1d_scan_combined", "ordered_causal_conv1d",
           "ordered_gated_rmsnorm", "ordered_linear", "split_conv1d_scan_partials", "ordered_A_from_log",
           "ordered_silu_mul", "ordered_causal_conv1d_update", "ordered_selective_state_update"]
