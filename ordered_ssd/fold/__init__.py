"""The lexical fold: the one place where ordered-ssd decides the order of a gradient sum.

Every gradient of a parameter that is shared across examples, chunks or tiles is computed as

    g = fold(+, [p[k] for k in lexical order])      # k = (example b, chunk c, tile t), b slowest

in the *accumulation dtype* (fp32, or fp64 for fp64 parameters), starting from +0.0, one addition
at a time, and cast to the parameter dtype once, at the end. The partition into partials depends
only on the problem shape (batch, sequence length, chunk size, tile sizes), never on the device or
its SM count, so the rounding of the sum, and hence the bits of the gradient, are fixed.

* :mod:`~ordered_ssd.fold.primitives`: :class:`LexicalFold`, :func:`lexical_fold`, :func:`tree_fold` (the
  pairwise tree of the split-invariant accumulation), :func:`fold_dims`,
  :func:`lexical_cumsum`, :func:`dA_cumsum_grad_scans` (the SSD backward's ``dA_cumsum`` running sums, one
  launch on CUDA): the CPU loops, and the CUDA launches of the kernels;
* :mod:`~ordered_ssd.fold.gemm`: :func:`fold_example_gemms` (the projections' weight gradients: per-(example,
  segment) GEMM partials folded in order; one launch on CUDA) and :func:`fold_example_gemms_grouped`;
* :mod:`~ordered_ssd.fold.many`: :func:`fold_many` (several :func:`fold_dims` folds in one launch, the same bits)
  and :func:`fold_example_sums` (the projection bias's fold of per-example folds, two launches);
* :mod:`~ordered_ssd.fold.conv1d`: :func:`conv1d_grad_partials`, ordered-ssd's own kernel for the causal conv1d's
  per-(example, tile) weight/bias gradient partials, and its order in PyTorch (:func:`conv1d_grad_partials_torch`);
* :mod:`~ordered_ssd.fold.kernels`: their Triton kernels (imported on first CUDA use only);
* :mod:`~ordered_ssd.fold.settings`: every order-deciding setting of ordered-ssd's own code (the fused GEMM fold's
  pinned configurations, the shape rules that pick an algorithm or a partition), :data:`REDUCTION_VERSION` and
  :func:`reduction_fingerprint`.

Both the CPU reference path and the CUDA path reduce through these; nothing else in the package sums partials
over a partition axis. Importing this package does not import triton.
"""
from .conv1d import conv1d_grad_partials, conv1d_grad_partials_torch
from .many import FOLD_MANY_MAX, fold_example_sums, fold_many
from .gemm import fold_example_gemms, fold_example_gemms_grouped, gemm_fold_timed_choices
from .primitives import LexicalFold, dA_cumsum_grad_scans, fold_dims, lexical_cumsum, lexical_fold, tree_fold
from .settings import (CONV1D_BWD_BLOCK_D, CONV1D_BWD_NUM_WARPS, CONV1D_BWD_TILE_L, GEMM_FOLD_CHAIN_RULE,
                       GEMM_FOLD_CONFIGS, GEMM_FOLD_FIT_RULE, GEMM_FOLD_PROGRAMS_PER_SM, GEMM_FOLD_TIMED_RULE,
                       GEMM_FOLD_VARIANTS, GEMM_FOLD_SEGMENT_L, GEMM_FOLD_WORKSPACE_BYTES, LINEAR_GROUP_BYTES,
                       REDUCTION_VERSION, accumulation_dtype,
                       gemm_fold_config, gemm_fold_configs_for, gemm_fold_segments, gemm_fold_segments_per_program,
                       gemm_fold_shared_bytes, linear_weight_grad_is_fused, reduction_fingerprint,
                       rmsnorm_rows_per_program)

__all__ = ["LexicalFold", "lexical_fold", "tree_fold", "fold_dims", "fold_many", "fold_example_sums", "FOLD_MANY_MAX",
           "lexical_cumsum", "dA_cumsum_grad_scans", "fold_example_gemms",
           "fold_example_gemms_grouped", "conv1d_grad_partials", "conv1d_grad_partials_torch", "accumulation_dtype",
           "CONV1D_BWD_TILE_L", "CONV1D_BWD_BLOCK_D", "CONV1D_BWD_NUM_WARPS",
           "GEMM_FOLD_CONFIGS", "GEMM_FOLD_FIT_RULE", "gemm_fold_config", "gemm_fold_configs_for",
           "gemm_fold_shared_bytes", "GEMM_FOLD_SEGMENT_L", "gemm_fold_segments", "LINEAR_GROUP_BYTES",
           "REDUCTION_VERSION",
           "reduction_fingerprint", "linear_weight_grad_is_fused", "rmsnorm_rows_per_program",
           "GEMM_FOLD_CHAIN_RULE", "GEMM_FOLD_PROGRAMS_PER_SM", "gemm_fold_segments_per_program",
           "GEMM_FOLD_TIMED_RULE", "GEMM_FOLD_VARIANTS", "GEMM_FOLD_WORKSPACE_BYTES", "gemm_fold_timed_choices"]
