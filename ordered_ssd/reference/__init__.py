"""The pure-PyTorch reference of the Mamba-2 layer: runs anywhere, the CPU path and the oracle of the tests.

* :mod:`~ordered_ssd.reference.naive`: the layer written from the SSD definition with plain autograd
  (:func:`reference_mamba2_layer` and its pieces), and the per-time-step recurrence it is checked against;
* :mod:`~ordered_ssd.reference.canonical`: each sequence of a layout computed alone, chunk by chunk, and its
  ordered backward (per-sequence partials folded in sequence order); parity decoding's prefill and step;
* :mod:`~ordered_ssd.reference.ordered`: the custom op over it, the compute of ``OrderedMamba2`` off the CUDA path
  (and Mamba-3's per-example ordered backward);
* :mod:`~ordered_ssd.reference.decode`: one decoding step against the cache (conv state, SSM state).

Imports nothing from the CUDA path (:mod:`ordered_ssd.ops`, :mod:`csrc_bindings`).
"""
from .decode import reference_causal_conv1d_update, reference_mamba2_step, reference_selective_state_update
from .naive import (Mamba2Dims, Mamba2Params, discretize_dt, reference_causal_conv1d, reference_chunk_scan,
                    reference_conv_state, reference_gated_rmsnorm, reference_mamba2_layer, reference_sequential_scan)
from .ordered import ordered_reference_mamba2, ordered_reference_mamba2_bwd, ordered_reference_mamba2_fwd

__all__ = ["Mamba2Dims", "Mamba2Params", "discretize_dt", "reference_causal_conv1d", "reference_chunk_scan",
           "reference_sequential_scan", "reference_gated_rmsnorm", "reference_mamba2_layer",
           "ordered_reference_mamba2_fwd", "ordered_reference_mamba2_bwd", "ordered_reference_mamba2",
           "reference_conv_state", "reference_causal_conv1d_update", "reference_selective_state_update",
           "reference_mamba2_step"]
