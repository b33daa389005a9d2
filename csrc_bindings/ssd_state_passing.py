"""Launchers for the sequential scan of the chunk states across chunks (``_state_passing_fwd_kernel`` /
``_state_passing_bwd_kernel``): the mirror of ``mamba_ssm/ops/triton/ssd_state_passing.py``.

Layout (launcher, example runner, spec per kernel): see :mod:`csrc_bindings._spec`.
"""
from __future__ import annotations

import torch

from ._configs import launch_config
from ._native import launch
from ._plans import alloc, alloc_like, planned
from ._spec import KernelSpec
from ._util import cdiv, check, check_shape, out_buffer, strides

UPSTREAM = "mamba_ssm.ops.triton.ssd_state_passing"
_INF = float("inf")


# ------------------------------------------------------------------------------------------------- state_passing_fwd
@planned
def launch_state_passing_fwd(states, dA_chunk_cumsum, *, initial_states=None, seq_idx=None, chunk_size=None,
                             out_dtype=None, config=None, out=None, final_states=None):
    """Sequential scan of the chunk states across chunks. Source: ``_state_passing_fwd_kernel``.

    Args:
        states: ``[B, C, H, D]`` (``D = P * N``; key dtype, fp32 in Mamba-2).
        dA_chunk_cumsum: ``[B, H, C]`` (``dA_cumsum[..., -1]``, any strides).
        initial_states: ``[B, H, D]`` or None. seq_idx: ``[B, L]`` (needs ``chunk_size``) or None.
        out_dtype: dtype of ``out`` (default ``states.dtype``).
        config: ``BLOCK_SIZE`` config or None (key: ``dim``).
    Returns:
        ``(out, final_states)``: ``out`` ``[B, C, H, D]`` holds the state *entering* each chunk (index 0 = initial
        state); ``final_states`` ``[B, H, D]`` fp32. Each element has one program walking the chunks in order.
    Raises:
        ValueError: ``dA_chunk_cumsum``, ``initial_states`` or ``seq_idx`` of another shape, ``seq_idx`` without
            ``chunk_size``; a given output buffer of another shape, dtype or device; a ``config`` for another kernel or
            without exactly its block sizes (the message names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, nchunks, nheads, dim = states.shape
    check_shape("dA_chunk_cumsum", dA_chunk_cumsum, (batch, nheads, nchunks), "[B, H, C]")
    if initial_states is not None:
        check_shape("initial_states", initial_states, (batch, nheads, dim), "[B, H, D]")
    seqlen = 0
    if seq_idx is not None:
        check(chunk_size is not None, "chunk_size: expected an int with seq_idx, got None")
        seqlen = seq_idx.shape[-1]
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    args = dict(dim=dim, nchunks=nchunks, seqlen=seqlen, chunk_size=chunk_size if seq_idx is not None else 0,
                HAS_INITSTATES=initial_states is not None, HAS_SEQ_IDX=seq_idx is not None)
    cfg = launch_config(STATE_PASSING_FWD, args, states, config)
    out = out_buffer(out, (batch, nchunks, nheads, dim), states.dtype if out_dtype is None else out_dtype, states,
                     "out")
    final_states = out_buffer(final_states, (batch, nheads, dim), torch.float32, states, "final_states")
    args.update(states_ptr=states, out_ptr=out, final_states_ptr=final_states, dA_cs_ptr=dA_chunk_cumsum,
                initstates_ptr=initial_states, seq_idx_ptr=seq_idx)
    args.update(strides("stride_states_batch stride_states_chunk stride_states_head stride_states_dim", states,
                        (0, 1, 2, 3)))
    args.update(strides("stride_out_batch stride_out_chunk stride_out_head stride_out_dim", out, (0, 1, 2, 3)))
    args.update(strides("stride_final_states_batch stride_final_states_head stride_final_states_dim", final_states,
                        (0, 1, 2)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head", dA_chunk_cumsum, (0, 2, 1)))
    args.update(strides("stride_initstates_batch stride_initstates_head stride_initstates_dim", initial_states,
                        (0, 1, 2)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    def grid(m):
        return (cdiv(dim, m["BLOCK_SIZE"]), batch, nheads)
    launch(STATE_PASSING_FWD, grid, args, cfg, states)
    return out, final_states


def _example_state_passing_fwd(p, config=None):
    return launch_state_passing_fwd(p["sp_states"], p["dA_cumsum"][..., -1], initial_states=p["sp_init"],
                                    config=config)


STATE_PASSING_FWD = KernelSpec(
    name="state_passing_fwd", module=UPSTREAM, attr="_state_passing_fwd_kernel",
    arg_names=("states_ptr out_ptr final_states_ptr dA_cs_ptr initstates_ptr seq_idx_ptr dim nchunks seqlen chunk_size "
               "stride_states_batch stride_states_chunk stride_states_head stride_states_dim stride_out_batch "
               "stride_out_chunk stride_out_head stride_out_dim stride_final_states_batch stride_final_states_head "
               "stride_final_states_dim stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head "
               "stride_initstates_batch stride_initstates_head stride_initstates_dim stride_seq_idx_batch "
               "stride_seq_idx_seqlen HAS_INITSTATES HAS_SEQ_IDX BLOCK_SIZE"),
    autotune_key=("dim",),
    candidates=(
        ({"BLOCK_SIZE": 64}, 4, 3),
        ({"BLOCK_SIZE": 128}, 4, 3),
        ({"BLOCK_SIZE": 256}, 4, 3),
        ({"BLOCK_SIZE": 512}, 4, 3),
        ({"BLOCK_SIZE": 1024}, 4, 3),
        ({"BLOCK_SIZE": 2048}, 4, 3),
    ),
    layer_dtype="fp32",
    example=_example_state_passing_fwd,
    timing_outputs=('out_ptr', 'final_states_ptr'),
)


# ------------------------------------------------------------------------------------------------- state_passing_bwd
@planned
def launch_state_passing_bwd(states, dA_chunk_cumsum, dout, *, dfinal_states=None, seq_idx=None,
                             has_initial_states=False, dstates_dtype=None, states_dtype=None, chunk_size=None,
                             config=None):
    """Backward of :func:`launch_state_passing_fwd`. Source: ``_state_passing_bwd_kernel``.

    Args:
        states: ``[B, C, H, D]``, the forward's ``out`` (state entering each chunk).
        dA_chunk_cumsum: ``[B, H, C]``. dout: ``[B, C, H, D]`` gradient w.r.t. ``out``.
        dfinal_states: ``[B, H, D]`` or None. seq_idx: ``[B, L]`` (needs ``chunk_size``) or None.
        has_initial_states: also return the gradient w.r.t. the initial states.
        dstates_dtype: dtype of ``dstates`` (default ``dout.dtype``).
        states_dtype: if given and different from ``states.dtype``, also return ``states`` converted to
            ``dstates_dtype`` (upstream's ``CONVERT_STATES``); if equal, ``states`` itself is returned.
        config: ``BLOCK_SIZE`` config or None (key: ``dim``).
    Returns:
        ``(dstates, ddA_partial, dinitial_states, states_converted)``:
        ``dstates`` ``[B, C, H, D]`` (gradient w.r.t. the chunk states); ``ddA_partial`` ``[B, H, C, T]`` fp32,
        ``T = ceil(D / BLOCK_SIZE)``, ``ddA_chunk_cumsum = fold(+, ddA_partial[..., t] for t)`` (each entry is one
        program's ``tl.sum`` over its ``BLOCK_SIZE`` slice); ``dinitial_states`` ``[B, H, D]`` or None;
        ``states_converted`` or None (when ``states_dtype`` is None).
    Raises:
        ValueError: ``dA_chunk_cumsum``, ``dout``, ``dfinal_states`` or ``seq_idx`` of another shape, ``seq_idx``
            without ``chunk_size``, non-dense ``states`` to convert; a ``config`` for another kernel or without exactly
            its block sizes (the message names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, nchunks, nheads, dim = states.shape
    check_shape("dA_chunk_cumsum", dA_chunk_cumsum, (batch, nheads, nchunks), "[B, H, C]")
    check_shape("dout", dout, (batch, nchunks, nheads, dim), "[B, C, H, D]")
    seqlen = 0
    if seq_idx is not None:
        check(chunk_size is not None, "chunk_size: expected an int with seq_idx, got None")
        seqlen = seq_idx.shape[-1]
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    if dfinal_states is not None:
        check_shape("dfinal_states", dfinal_states, (batch, nheads, dim), "[B, H, D]")
    args = dict(dim=dim, nchunks=nchunks, seqlen=seqlen, chunk_size=chunk_size if seq_idx is not None else 0,
                HAS_DFINAL_STATES=dfinal_states is not None, HAS_SEQ_IDX=seq_idx is not None)
    cfg = launch_config(STATE_PASSING_BWD, args, states, config)
    ddtype = dstates_dtype if dstates_dtype is not None else dout.dtype
    dstates = alloc_like(dout, dtype=ddtype)
    if states_dtype is not None and states_dtype != states.dtype:
        states_converted = alloc_like(states, dtype=ddtype)
        check(states_converted.stride() == states.stride(), f"states: expected dense strides "
              f"{tuple(states_converted.stride())} to be converted, got {tuple(states.stride())}")
    else:
        states_converted = None
    dinitstates = alloc_like(dstates[:, 0]) if has_initial_states else None
    ntiles = cdiv(dim, cfg["BLOCK_SIZE"])
    ddA_partial = alloc((batch, nheads, nchunks, ntiles), torch.float32, states.device)
    args.update(dout_ptr=dout, out_ptr=states, dA_cs_ptr=dA_chunk_cumsum, dfinal_states_ptr=dfinal_states,
                seq_idx_ptr=seq_idx, dstates_ptr=dstates, ddA_cs_ptr=ddA_partial, dinitstates_ptr=dinitstates,
                states_converted_ptr=states_converted, CONVERT_STATES=states_converted is not None,
                HAS_DINITSTATES=dinitstates is not None)
    args.update(strides("stride_dout_batch stride_dout_chunk stride_dout_head stride_dout_dim", dout, (0, 1, 2, 3)))
    args.update(strides("stride_out_batch stride_out_chunk stride_out_head stride_out_dim", states, (0, 1, 2, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head", dA_chunk_cumsum, (0, 2, 1)))
    args.update(strides("stride_dfinal_states_batch stride_dfinal_states_head stride_dfinal_states_dim",
                        dfinal_states, (0, 1, 2)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    args.update(strides("stride_dstates_batch stride_dstates_chunk stride_dstates_head stride_dstates_dim", dstates,
                        (0, 1, 2, 3)))
    # the kernel indexes the tile dimension with stride 1 (``ddA_cs_ptr + pid_m``): ddA_partial is contiguous
    args.update(strides("stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head", ddA_partial, (0, 2, 1)))
    args.update(strides("stride_dinitstates_batch stride_dinitstates_head stride_dinitstates_dim", dinitstates,
                        (0, 1, 2)))
    grid = (ntiles, batch, nheads)
    launch(STATE_PASSING_BWD, grid, args, cfg, states)
    if states_dtype is not None and states_dtype == states.dtype:
        states_converted = states
    return dstates, ddA_partial, dinitstates, states_converted


def _example_state_passing_bwd(p, config=None):
    return launch_state_passing_bwd(p["sp_states"], p["dA_cumsum"][..., -1], p["sp_dout"],
                                    dfinal_states=p["sp_dfinal"], has_initial_states=True,
                                    dstates_dtype=p["dtype"], states_dtype=p["dtype"], config=config)


STATE_PASSING_BWD = KernelSpec(
    name="state_passing_bwd", module=UPSTREAM, attr="_state_passing_bwd_kernel",
    arg_names=("dout_ptr out_ptr dA_cs_ptr dfinal_states_ptr seq_idx_ptr dstates_ptr ddA_cs_ptr dinitstates_ptr "
               "states_converted_ptr dim nchunks seqlen chunk_size stride_dout_batch stride_dout_chunk "
               "stride_dout_head stride_dout_dim stride_out_batch stride_out_chunk stride_out_head stride_out_dim "
               "stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dfinal_states_batch "
               "stride_dfinal_states_head stride_dfinal_states_dim stride_seq_idx_batch stride_seq_idx_seqlen "
               "stride_dstates_batch stride_dstates_chunk stride_dstates_head stride_dstates_dim stride_ddA_cs_batch "
               "stride_ddA_cs_chunk stride_ddA_cs_head stride_dinitstates_batch stride_dinitstates_head "
               "stride_dinitstates_dim CONVERT_STATES HAS_DFINAL_STATES HAS_DINITSTATES HAS_SEQ_IDX BLOCK_SIZE"),
    autotune_key=("dim",),
    order_nearest=("dim",),
    candidates=(
        ({"BLOCK_SIZE": 64}, 4, 3),
        ({"BLOCK_SIZE": 128}, 4, 3),
        ({"BLOCK_SIZE": 256}, 4, 3),
        ({"BLOCK_SIZE": 512}, 4, 3),
        ({"BLOCK_SIZE": 1024}, 4, 3),
        ({"BLOCK_SIZE": 2048}, 4, 3),
    ),
    layer_dtype="fp32",
    example=_example_state_passing_bwd,
)
