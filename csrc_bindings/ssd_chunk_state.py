"""Launchers for the per-chunk ``dt`` cumsum (``_chunk_cumsum_fwd_kernel`` / ``_bwd_kernel``) and the chunk states
(``_chunk_state_fwd_kernel``, ``_chunk_state_bwd_db_kernel``): the mirror of
``mamba_ssm/ops/triton/ssd_chunk_state.py``.

Layout (launcher, example runner, spec per kernel): see :mod:`csrc_bindings._spec`.
"""
from __future__ import annotations

import torch

from ._configs import launch_config
from ._native import launch
from ._plans import alloc_like, planned
from ._spec import KernelSpec
from ._util import cdiv, check_groups, check_shape, next_pow2, nsplits, out_buffer, strides

UPSTREAM = "mamba_ssm.ops.triton.ssd_chunk_state"
_INF = float("inf")


# -------------------------------------------------------------------------------------------------- chunk_cumsum_fwd
@planned
def launch_chunk_cumsum_fwd(dt, A, chunk_size, *, dt_bias=None, dt_softplus=False, dt_limit=(0.0, _INF),
                            config=None, dA_cumsum=None, dt_out=None):
    """Per-chunk ``dt`` processing and cumulative sum of ``dt * A``. Source: ``_chunk_cumsum_fwd_kernel``.

    Args:
        dt: ``[B, L, H]`` (any float dtype; the key dtype), pre-softplus step.
        A: ``[H]`` (fp32 in Mamba-2).
        chunk_size: int.
        dt_bias: ``[H]`` or None, added before softplus.
        dt_softplus: apply softplus (where ``dt + bias <= 20``).
        dt_limit: ``(dt_min, dt_max)`` clamp.
        config: explicit config (``BLOCK_SIZE_H``, num_warps, num_stages) or None for the pinned one
            (key: ``chunk_size``, ``nheads``).
        dA_cumsum, dt_out: optional output buffers.
    Returns:
        ``(dA_cumsum, dt_out)``, both ``[B, H, C, cs]`` fp32 (allocated if not given); positions past ``L`` hold 0
        in ``dt_out`` and the running sum in ``dA_cumsum``.
    Raises:
        ValueError: ``A`` or ``dt_bias`` not ``[H]``; a given output buffer of another shape, dtype or device; a
            ``config`` for another kernel or without exactly its block sizes (the message names the argument, the
            expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads = dt.shape
    check_shape("A", A, (nheads,), "[H]")
    if dt_bias is not None:
        check_shape("dt_bias", dt_bias, (nheads,), "[H]")
    nchunks = cdiv(seqlen, chunk_size)
    args = dict(batch=batch, seqlen=seqlen, nheads=nheads, chunk_size=chunk_size,
                dt_min=dt_limit[0], dt_max=dt_limit[1],
                DT_SOFTPLUS=bool(dt_softplus), HAS_DT_BIAS=dt_bias is not None,
                BLOCK_SIZE_CHUNK=next_pow2(chunk_size))
    cfg = launch_config(CHUNK_CUMSUM_FWD, args, dt, config)
    shape = (batch, nheads, nchunks, chunk_size)
    dt_out = out_buffer(dt_out, shape, torch.float32, dt, "dt_out")
    dA_cumsum = out_buffer(dA_cumsum, shape, torch.float32, dt, "dA_cumsum")
    args.update(dt_ptr=dt, A_ptr=A, dt_bias_ptr=dt_bias, dt_out_ptr=dt_out, dA_cumsum_ptr=dA_cumsum)
    args.update(strides("stride_dt_batch stride_dt_seqlen stride_dt_head", dt, (0, 1, 2)))
    args["stride_A_head"] = A.stride(0)
    args["stride_dt_bias_head"] = dt_bias.stride(0) if dt_bias is not None else 0
    args.update(strides("stride_dt_out_batch stride_dt_out_chunk stride_dt_out_head stride_dt_out_csize",
                        dt_out, (0, 2, 1, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize",
                        dA_cumsum, (0, 2, 1, 3)))
    grid = (batch, nchunks, cdiv(nheads, cfg["BLOCK_SIZE_H"]))
    launch(CHUNK_CUMSUM_FWD, grid, args, cfg, dt)
    return dA_cumsum, dt_out


def _example_chunk_cumsum_fwd(p, config=None):
    return launch_chunk_cumsum_fwd(p["dt_raw"], p["A"], p["chunk_size"], dt_bias=p["dt_bias"], dt_softplus=True,
                                   config=config)


CHUNK_CUMSUM_FWD = KernelSpec(
    name="chunk_cumsum_fwd", module=UPSTREAM, attr="_chunk_cumsum_fwd_kernel",
    arg_names=("dt_ptr A_ptr dt_bias_ptr dt_out_ptr dA_cumsum_ptr batch seqlen nheads chunk_size dt_min dt_max "
               "stride_dt_batch stride_dt_seqlen stride_dt_head stride_A_head stride_dt_bias_head stride_dt_out_batch "
               "stride_dt_out_chunk stride_dt_out_head stride_dt_out_csize stride_dA_cs_batch stride_dA_cs_chunk "
               "stride_dA_cs_head stride_dA_cs_csize DT_SOFTPLUS HAS_DT_BIAS BLOCK_SIZE_H BLOCK_SIZE_CHUNK"),
    autotune_key=("chunk_size", "nheads"),
    order_nearest=("nheads",),
    candidates=(
        ({"BLOCK_SIZE_H": 1}, 4, 3),
        ({"BLOCK_SIZE_H": 2}, 4, 3),
        ({"BLOCK_SIZE_H": 4}, 4, 3),
        ({"BLOCK_SIZE_H": 8}, 4, 3),
        ({"BLOCK_SIZE_H": 16}, 4, 3),
        ({"BLOCK_SIZE_H": 32}, 4, 3),
        ({"BLOCK_SIZE_H": 64}, 4, 3),
    ),
    example=_example_chunk_cumsum_fwd,
)


# -------------------------------------------------------------------------------------------------- chunk_cumsum_bwd
@planned
def launch_chunk_cumsum_bwd(ddA, ddt_out, dt, A, *, dt_bias=None, dt_softplus=False, dt_limit=(0.0, _INF),
                            config=None, ddt=None, dA_partial=None, ddt_bias_partial=None):
    """Backward of :func:`launch_chunk_cumsum_fwd`. Source: ``_chunk_cumsum_bwd_kernel``.

    Args:
        ddA: ``[B, H, C, cs]`` gradient w.r.t. ``dA_cumsum`` *already reverse-cumsummed* (i.e. w.r.t. ``dt*A``),
            as upstream passes it.
        ddt_out: ``[B, H, C, cs]`` gradient w.r.t. ``dt_out``.
        dt, A, dt_bias, dt_softplus, dt_limit: as in the forward (``dt`` is the raw ``[B, L, H]`` input).
        config: ``BLOCK_SIZE_H`` config or None (key: ``chunk_size``, ``nheads``).
        ddt: optional ``[B, L, H]`` output buffer (may be a strided view), dtype of ``dt`` by default.
    Returns:
        ``(ddt, dA_partial, ddt_bias_partial)``:
        ``ddt`` ``[B, L, H]``; ``dA_partial`` ``[B, C, H]`` fp32 with ``dA[h] = fold(+, dA_partial[b, c, h] for b, c)``;
        ``ddt_bias_partial`` ``[B, C, H]`` fp32 (None without ``dt_bias``), same fold for ``ddt_bias``.
        Each partial is one program's ``tl.sum`` over the chunk positions. Both partial buffers are zeroed first
        (the autotuner pre-hook's ``dA_ptr``/``ddt_bias_ptr``).
    Raises:
        ValueError: ``ddA``, ``ddt_out``, ``A``, ``dt_bias`` or a given ``ddt`` of another shape; a given output buffer
            of another shape, dtype or device; a ``config`` for another kernel or without exactly its block sizes (the
            message names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads = dt.shape
    _, _, nchunks, chunk_size = ddA.shape
    check_shape("ddA", ddA, (batch, nheads, nchunks, chunk_size), "[B, H, C, cs]")
    check_shape("ddt_out", ddt_out, ddA.shape, "[B, H, C, cs]")
    check_shape("A", A, (nheads,), "[H]")
    args = dict(batch=batch, seqlen=seqlen, nheads=nheads, chunk_size=chunk_size,
                dt_min=dt_limit[0], dt_max=dt_limit[1],
                DT_SOFTPLUS=bool(dt_softplus), HAS_DT_BIAS=dt_bias is not None,
                BLOCK_SIZE_CHUNK=next_pow2(chunk_size), DETERMINISTIC_REDUCTION=True)
    cfg = launch_config(CHUNK_CUMSUM_BWD, args, dt, config)
    if ddt is None:
        ddt = alloc_like(dt)
    check_shape("ddt", ddt, dt.shape, "[B, L, H]")
    dA_partial = out_buffer(dA_partial, (batch, nchunks, nheads), torch.float32, dt, "dA_partial", zero=True)
    if dt_bias is not None:
        check_shape("dt_bias", dt_bias, (nheads,), "[H]")
        ddt_bias_partial = out_buffer(ddt_bias_partial, (batch, nchunks, nheads), torch.float32, dt,
                                      "ddt_bias_partial", zero=True)
    else:
        ddt_bias_partial = None
    args.update(ddA_ptr=ddA, ddt_out_ptr=ddt_out, dt_ptr=dt, A_ptr=A, dt_bias_ptr=dt_bias, ddt_ptr=ddt,
                dA_ptr=dA_partial, ddt_bias_ptr=ddt_bias_partial)
    args.update(strides("stride_ddA_batch stride_ddA_chunk stride_ddA_head stride_ddA_csize", ddA, (0, 2, 1, 3)))
    args.update(strides("stride_ddt_out_batch stride_ddt_out_chunk stride_ddt_out_head stride_ddt_out_csize",
                        ddt_out, (0, 2, 1, 3)))
    args.update(strides("stride_dt_batch stride_dt_seqlen stride_dt_head", dt, (0, 1, 2)))
    args["stride_A_head"] = A.stride(0)
    args["stride_dt_bias_head"] = dt_bias.stride(0) if dt_bias is not None else 0
    args.update(strides("stride_ddt_batch stride_ddt_seqlen stride_ddt_head", ddt, (0, 1, 2)))
    args.update(strides("stride_dA_batch stride_dA_chunk stride_dA_head", dA_partial, (0, 1, 2)))
    args.update(strides("stride_ddt_bias_batch stride_ddt_bias_chunk stride_ddt_bias_head", ddt_bias_partial,
                        (0, 1, 2)))
    grid = (batch, nchunks, cdiv(nheads, cfg["BLOCK_SIZE_H"]))
    launch(CHUNK_CUMSUM_BWD, grid, args, cfg, dt)
    return ddt, dA_partial, ddt_bias_partial


def _example_chunk_cumsum_bwd(p, config=None):
    return launch_chunk_cumsum_bwd(p["ddA"], p["ddt_out"], p["dt_raw"], p["A"], dt_bias=p["dt_bias"],
                                   dt_softplus=True, config=config)


CHUNK_CUMSUM_BWD = KernelSpec(
    name="chunk_cumsum_bwd", module=UPSTREAM, attr="_chunk_cumsum_bwd_kernel",
    arg_names=("ddA_ptr ddt_out_ptr dt_ptr A_ptr dt_bias_ptr ddt_ptr dA_ptr ddt_bias_ptr batch seqlen nheads "
               "chunk_size dt_min dt_max stride_ddA_batch stride_ddA_chunk stride_ddA_head stride_ddA_csize "
               "stride_ddt_out_batch stride_ddt_out_chunk stride_ddt_out_head stride_ddt_out_csize stride_dt_batch "
               "stride_dt_seqlen stride_dt_head stride_A_head stride_dt_bias_head stride_ddt_batch stride_ddt_seqlen "
               "stride_ddt_head stride_dA_batch stride_dA_chunk stride_dA_head stride_ddt_bias_batch "
               "stride_ddt_bias_chunk stride_ddt_bias_head DT_SOFTPLUS HAS_DT_BIAS BLOCK_SIZE_H BLOCK_SIZE_CHUNK "
               "DETERMINISTIC_REDUCTION"),
    autotune_key=("chunk_size", "nheads"),
    order_nearest=("nheads",),
    candidates=(
        ({"BLOCK_SIZE_H": 1}, 4, 3),
        ({"BLOCK_SIZE_H": 2}, 4, 3),
        ({"BLOCK_SIZE_H": 4}, 4, 3),
        ({"BLOCK_SIZE_H": 8}, 4, 3),
        ({"BLOCK_SIZE_H": 16}, 4, 3),
        ({"BLOCK_SIZE_H": 32}, 4, 3),
        ({"BLOCK_SIZE_H": 64}, 4, 3),
    ),
    pre_hook_zero=("dA_ptr", "ddt_bias_ptr"),
    example=_example_chunk_cumsum_bwd,
)


# --------------------------------------------------------------------------------------------------- chunk_state_fwd
@planned
def launch_chunk_state_fwd(B, x, dt, dA_cumsum, *, seq_idx=None, states_in_fp32=True, config=None, states=None):
    """Per-chunk final states ``states[b, c, h] = sum_l exp(dA_cs_last - dA_cs_l) dt_l x_l B_l^T``.
    Source: ``_chunk_state_fwd_kernel``.

    Args:
        B: ``[B, L, G, N]``; x: ``[B, L, H, P]`` (key dtype); dt, dA_cumsum: ``[B, H, C, cs]`` fp32;
        seq_idx: ``[B, L]`` int32 or None.
        states_in_fp32: output dtype fp32 (default) or ``B.dtype``.
        config: ``BLOCK_SIZE_M/N/K`` config or None (key: ``hdim``, ``dstate``, ``chunk_size``).
    Returns:
        ``states`` ``[B, C, H, P, N]``; each element is one program's sequential sum over its chunk.
    Raises:
        ValueError: ``nheads`` not a multiple of ``ngroups``; ``B``, ``dt``, ``dA_cumsum`` or ``seq_idx`` of another
            shape; a given output buffer of another shape, dtype or device; a ``config`` for another kernel or without
            exactly its block sizes (the message names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    _, _, ngroups, dstate = B.shape
    check_groups(nheads, ngroups)
    check_shape("B", B, (batch, seqlen, ngroups, dstate), "[B, L, G, N]")
    check_shape("dt", dt, (batch, nheads, nchunks, chunk_size), "[B, H, C, cs]")
    check_shape("dA_cumsum", dA_cumsum, dt.shape, "[B, H, C, cs]")
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    args = dict(hdim=headdim, dstate=dstate, chunk_size=chunk_size, batch=batch, seqlen=seqlen,
                nheads_ngroups_ratio=nheads // ngroups, HAS_SEQ_IDX=seq_idx is not None)
    cfg = launch_config(CHUNK_STATE_FWD, args, x, config)
    states = out_buffer(states, (batch, nchunks, nheads, headdim, dstate),
                        torch.float32 if states_in_fp32 else B.dtype, x, "states")
    args.update(x_ptr=x, b_ptr=B, states_ptr=states, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx)
    args.update(strides("stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim", x, (0, 1, 2, 3)))
    args.update(strides("stride_b_batch stride_b_seqlen stride_b_head stride_b_dstate", B, (0, 1, 2, -1)))
    args.update(strides("stride_states_batch stride_states_chunk stride_states_head stride_states_hdim "
                        "stride_states_dstate", states, (0, 1, 2, 3, 4)))
    args.update(strides("stride_dt_batch stride_dt_chunk stride_dt_head stride_dt_csize", dt, (0, 2, 1, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    def grid(m):
        return (cdiv(headdim, m["BLOCK_SIZE_M"]) * cdiv(dstate, m["BLOCK_SIZE_N"]), batch * nchunks, nheads)
    launch(CHUNK_STATE_FWD, grid, args, cfg, x)
    return states


def _example_chunk_state_fwd(p, config=None):
    return (launch_chunk_state_fwd(p["Bm"], p["x"], p["dt"], p["dA_cumsum"], config=config),)


CHUNK_STATE_FWD = KernelSpec(
    name="chunk_state_fwd", module=UPSTREAM, attr="_chunk_state_fwd_kernel",
    arg_names=("x_ptr b_ptr states_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr hdim dstate chunk_size batch seqlen "
               "nheads_ngroups_ratio stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim stride_b_batch "
               "stride_b_seqlen stride_b_head stride_b_dstate stride_states_batch stride_states_chunk "
               "stride_states_head stride_states_hdim stride_states_dstate stride_dt_batch stride_dt_chunk "
               "stride_dt_head stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head "
               "stride_dA_cs_csize stride_seq_idx_batch stride_seq_idx_seqlen HAS_SEQ_IDX BLOCK_SIZE_M BLOCK_SIZE_N "
               "BLOCK_SIZE_K"),
    autotune_key=("hdim", "dstate", "chunk_size"),
    candidates=(
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64}, 8, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, 2, 5),
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, 2, 5),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, 2, 4),
    ),
    example=_example_chunk_state_fwd,
    timing_outputs=('states_ptr',),
)


# ------------------------------------------------------------------------------------------------ chunk_state_bwd_db
@planned
def launch_chunk_state_bwd_db(x, dt, dA_cumsum, dstates, *, B=None, seq_idx=None, ngroups=1,
                              nheads_per_program=None, config=None, dB_partial=None, ddA_partial=None):
    """Gradient w.r.t. ``B`` of the chunk states (and the ``dA_cumsum`` term that goes with it).
    Source: ``_chunk_state_bwd_db_kernel``.

    Args:
        x: ``[B, L, H, P]`` (key dtype); dt, dA_cumsum: ``[B, H, C, cs]``; dstates: ``[B, C, H, P, N]``;
        B: ``[B, L, G, N]`` or None (None: no ``ddA`` output, ``HAS_DDA_CS=False``); seq_idx: ``[B, L]`` or None.
        ngroups: G.
        nheads_per_program: heads summed inside one program (sequentially, in head order); default ``H // G``
            (one split). Upstream derives it from the SM count; here it must come from the caller and should be a
            pure function of the shape.
        config: ``BLOCK_SIZE_M/N`` config or None (key: ``chunk_size``, ``dstate``, ``hdim``).
    Returns:
        ``(dB_partial, ddA_partial)``:
        ``dB_partial`` ``[B, L, S, G, N]`` fp32, ``S = ceil((H // G) / nheads_per_program)`` splits;
        ``dB = fold(+, dB_partial[:, :, s] for s)``.
        ``ddA_partial`` ``[B, H, C, cs, T]`` fp32 (None without ``B``), ``T = ceil(N / BLOCK_SIZE_N)`` dstate tiles,
        zeroed first (pre-hook); entry ``[..., j, t]`` (``j >= 1``) is tile ``t``'s term for position ``j``, entry
        ``j = 0`` stays 0. Upstream's ``ddA_next = cumsum_j(sum_t ddA_partial)``.
    Raises:
        ValueError: ``dt``, ``dA_cumsum``, ``dstates``, ``seq_idx`` or ``B`` of another shape; ``nheads`` not a multiple
            of ``ngroups``, ``nheads_per_program`` outside ``[1, nheads // ngroups]``; a given output buffer of another
            shape, dtype or device; a ``config`` for another kernel or without exactly its block sizes (the message
            names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    dstate = dstates.shape[-1]
    check_shape("dt", dt, (batch, nheads, nchunks, chunk_size), "[B, H, C, cs]")
    check_shape("dA_cumsum", dA_cumsum, dt.shape, "[B, H, C, cs]")
    check_shape("dstates", dstates, (batch, nchunks, nheads, headdim, dstate), "[B, C, H, P, N]")
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    nhpp, splits = nsplits(nheads, ngroups, nheads_per_program)
    args = dict(chunk_size=chunk_size, dstate=dstate, hdim=headdim, batch=batch, seqlen=seqlen, nheads=nheads,
                nheads_per_program=nhpp, ngroups=ngroups, HAS_SEQ_IDX=seq_idx is not None,
                DETERMINISTIC_REDUCTION=True, BLOCK_SIZE_K=max(next_pow2(headdim), 16))
    cfg = launch_config(CHUNK_STATE_BWD_DB, args, x, config)
    if B is not None:
        check_shape("B", B, (batch, seqlen, ngroups, dstate), "[B, L, G, N]")
        ntiles = cdiv(dstate, cfg["BLOCK_SIZE_N"])
        ddA_partial = out_buffer(ddA_partial, (batch, nheads, nchunks, chunk_size, ntiles), torch.float32, x,
                                 "ddA_partial", zero=True)
    else:
        ddA_partial = None
    dB_partial = out_buffer(dB_partial, (batch, seqlen, splits, ngroups, dstate), torch.float32, x, "dB_partial")
    args.update(x_ptr=x, dstates_ptr=dstates, b_ptr=B, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx,
                db_ptr=dB_partial, ddA_cumsum_ptr=ddA_partial, HAS_DDA_CS=ddA_partial is not None)
    args.update(strides("stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim", x, (0, 1, 2, 3)))
    args.update(strides("stride_dstates_batch stride_dstates_chunk stride_states_head stride_states_hdim "
                        "stride_states_dstate", dstates, (0, 1, 2, 3, 4)))
    args.update(strides("stride_b_batch stride_b_seqlen stride_b_head stride_b_dstate", B, (0, 1, 2, 3)))
    args.update(strides("stride_dt_batch stride_dt_chunk stride_dt_head stride_dt_csize", dt, (0, 2, 1, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    args.update(strides("stride_db_batch stride_db_seqlen stride_db_split stride_db_group stride_db_dstate",
                        dB_partial, (0, 1, 2, 3, 4)))
    args.update(strides("stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize "
                        "stride_ddA_tile", ddA_partial, (0, 2, 1, 3, 4)))
    grid = (cdiv(chunk_size, cfg["BLOCK_SIZE_M"]) * cdiv(dstate, cfg["BLOCK_SIZE_N"]), batch * nchunks,
            splits * ngroups)
    launch(CHUNK_STATE_BWD_DB, grid, args, cfg, x)
    return dB_partial, ddA_partial


def _example_chunk_state_bwd_db(p, config=None):
    return launch_chunk_state_bwd_db(p["x"], p["dt"], p["dA_cumsum"], p["dstates"], B=p["Bm"], ngroups=p["ngroups"],
                                     config=config)


CHUNK_STATE_BWD_DB = KernelSpec(
    name="chunk_state_bwd_db", module=UPSTREAM, attr="_chunk_state_bwd_db_kernel",
    arg_names=("x_ptr dstates_ptr b_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr db_ptr ddA_cumsum_ptr chunk_size dstate hdim "
               "batch seqlen nheads nheads_per_program ngroups stride_x_batch stride_x_seqlen stride_x_head "
               "stride_x_hdim stride_dstates_batch stride_dstates_chunk stride_states_head stride_states_hdim "
               "stride_states_dstate stride_b_batch stride_b_seqlen stride_b_head stride_b_dstate stride_dt_batch "
               "stride_dt_chunk stride_dt_head stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head "
               "stride_dA_cs_csize stride_seq_idx_batch stride_seq_idx_seqlen stride_db_batch stride_db_seqlen "
               "stride_db_split stride_db_group stride_db_dstate stride_ddA_cs_batch stride_ddA_cs_chunk "
               "stride_ddA_cs_head stride_ddA_cs_csize stride_ddA_tile HAS_DDA_CS HAS_SEQ_IDX DETERMINISTIC_REDUCTION "
               "BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K"),
    autotune_key=("chunk_size", "dstate", "hdim"),
    candidates=(
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128}, 4, 3),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32}, 4, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128}, 4, 3),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64}, 4, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64}, 4, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32}, 4, 3),
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64}, 4, 3),
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32}, 4, 3),
    ),
    pre_hook_zero=("ddA_cumsum_ptr",),
    example=_example_chunk_state_bwd_db,
)


# ------------------------------------------------------------------------------------------------ chunk_state_varlen
@planned
def launch_chunk_state_varlen(B, x, dt, dA_cumsum, cu_seqlens, chunk_states, *, config=None, states=None):
    """The state at the end of each packed sequence of one example. Source: ``_chunk_state_varlen_kernel``
    (upstream ``chunk_state_varlen``, forward only).

    Args:
        B: ``[L, G, N]``; x: ``[L, H, P]`` (key dtype); dt, dA_cumsum: ``[H, C, cs]`` fp32 (example 0 of the
        forward's); cu_seqlens: ``[S + 1]`` int32 offsets, strictly increasing from 0 to ``L`` (not checked here:
        the caller checks; an empty sequence makes the kernel read out of bounds); chunk_states: ``[C, H, P, N]``, the
        states *entering* each chunk (the state-passing output).
        config: ``BLOCK_SIZE_M/N/K`` config or None (key: ``hdim``, ``dstate``, ``chunk_size``).
    Returns:
        ``states`` ``[S, H, P, N]`` (dtype of ``chunk_states``): for sequence ``s`` ending in chunk ``c``, its inputs
        in chunk ``c`` decayed to its end, plus ``chunk_states[c]`` decayed when the sequence starts before chunk
        ``c``. One program per (``P``/``N`` tile, sequence, head), a sequential sum over ``BLOCK_SIZE_K`` position
        blocks: nothing is summed across programs.
    Raises:
        ValueError: ``nheads`` not a multiple of ``ngroups``; ``B``, ``dt``, ``dA_cumsum``, ``chunk_states`` or
            ``cu_seqlens`` of another shape; a given output buffer of another shape, dtype or device; a ``config`` for
            another kernel or without exactly its block sizes (the message names the argument, the expected and the
            actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    total_seqlen, nheads, headdim = x.shape
    _, nchunks, chunk_size = dt.shape
    _, ngroups, dstate = B.shape
    check_groups(nheads, ngroups)
    check_shape("B", B, (total_seqlen, ngroups, dstate), "[L, G, N]")
    check_shape("dt", dt, (nheads, nchunks, chunk_size), "[H, C, cs]")
    check_shape("dA_cumsum", dA_cumsum, dt.shape, "[H, C, cs]")
    check_shape("chunk_states", chunk_states, (nchunks, nheads, headdim, dstate), "[C, H, P, N]")
    check_shape("cu_seqlens", cu_seqlens, (cu_seqlens.shape[0],), "[S + 1]")
    batch = cu_seqlens.shape[0] - 1
    args = dict(hdim=headdim, dstate=dstate, chunk_size=chunk_size, seqlen=total_seqlen,
                nheads_ngroups_ratio=nheads // ngroups)
    cfg = launch_config(CHUNK_STATE_VARLEN, args, x, config)
    states = out_buffer(states, (batch, nheads, headdim, dstate), chunk_states.dtype, x, "states")
    args.update(x_ptr=x, b_ptr=B, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, chunk_states_ptr=chunk_states,
                cu_seqlens_ptr=cu_seqlens, states_ptr=states)
    args.update(strides("stride_x_seqlen stride_x_head stride_x_hdim", x, (0, 1, 2)))
    args.update(strides("stride_b_seqlen stride_b_head stride_b_dstate", B, (0, 1, 2)))
    args.update(strides("stride_dt_chunk stride_dt_head stride_dt_csize", dt, (1, 0, 2)))
    args.update(strides("stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum, (1, 0, 2)))
    args.update(strides("stride_chunk_states_chunk stride_chunk_states_head stride_chunk_states_hdim "
                        "stride_chunk_states_dstate", chunk_states, (0, 1, 2, 3)))
    args.update(strides("stride_states_batch stride_states_head stride_states_hdim stride_states_dstate", states,
                        (0, 1, 2, 3)))
    def grid(m):
        return (cdiv(headdim, m["BLOCK_SIZE_M"]) * cdiv(dstate, m["BLOCK_SIZE_N"]), batch, nheads)
    launch(CHUNK_STATE_VARLEN, grid, args, cfg, x)
    return states


def example_cu_seqlens(p):
    """The packed sequences of the varlen example: example 0 of problem ``p`` cut at ``L / 3``, ``cs + 1`` and
    ``2 L / 3`` (sequences ending inside a chunk, spanning one, and starting before it), int32 on its device."""
    L, cs = p["seqlen"], p["chunk_size"]
    cuts = sorted({0, L} | {c for c in (L // 3, cs + 1, (2 * L) // 3) if 0 < c < L})
    return torch.tensor(cuts, dtype=torch.int32, device=p["x"].device)


def _example_chunk_state_varlen(p, config=None):
    return (launch_chunk_state_varlen(p["Bm"][0], p["x"][0], p["dt"][0], p["dA_cumsum"][0], example_cu_seqlens(p),
                                      p["states"][0], config=config),)


CHUNK_STATE_VARLEN = KernelSpec(
    name="chunk_state_varlen", module=UPSTREAM, attr="_chunk_state_varlen_kernel",
    arg_names=("x_ptr b_ptr dt_ptr dA_cumsum_ptr chunk_states_ptr cu_seqlens_ptr states_ptr hdim dstate chunk_size "
               "seqlen nheads_ngroups_ratio stride_x_seqlen stride_x_head stride_x_hdim stride_b_seqlen stride_b_head "
               "stride_b_dstate stride_dt_chunk stride_dt_head stride_dt_csize stride_dA_cs_chunk stride_dA_cs_head "
               "stride_dA_cs_csize stride_chunk_states_chunk stride_chunk_states_head stride_chunk_states_hdim "
               "stride_chunk_states_dstate stride_states_batch stride_states_head stride_states_hdim "
               "stride_states_dstate BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K"),
    autotune_key=("hdim", "dstate", "chunk_size"),
    candidates=CHUNK_STATE_FWD.candidates,  # upstream lists the same nine configurations for both kernels
    example=_example_chunk_state_varlen,
    timing_outputs=('states_ptr',),
)
