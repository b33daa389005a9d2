"""Launchers for the fused ``dx`` backward of the chunk scan and the chunk state
(``_chunk_scan_chunk_state_bwd_dx_kernel``): the mirror of ``mamba_ssm/ops/triton/ssd_combined.py``.

Layout (launcher, example runner, spec per kernel): see :mod:`csrc_bindings._spec`.
"""
from __future__ import annotations

import torch

from ._configs import launch_config
from ._native import launch, native
from ._plans import alloc_like, planned
from ._spec import KernelSpec
from ._util import cdiv, check_D, check_groups, check_shape, next_pow2, out_buffer, strides

UPSTREAM = "mamba_ssm.ops.triton.ssd_combined"
_INF = float("inf")


# ------------------------------------------------------------------------------------- chunk_scan_chunk_state_bwd_dx
@planned
def launch_chunk_scan_chunk_state_bwd_dx(x, dt, dA_cumsum, B, CB, dout, dstates, *, D=None, seq_idx=None,
                                         config=None, dx=None, ddt_partial=None, dD_partial=None):
    """Fused gradient w.r.t. ``x`` from the intra-chunk scan and the chunk state (plus ``dt`` and ``D`` terms).
    Source: ``_chunk_scan_chunk_state_bwd_dx_kernel`` (``mamba_ssm/ops/triton/ssd_combined.py``).

    Args:
        x: ``[B, L, H, P]`` (key dtype); dt, dA_cumsum: ``[B, H, C, cs]``; B: ``[B, L, G, N]``;
        CB: ``[B, C, G, cs, cs]``; dout: ``[B, L, H, P]``; dstates: ``[B, C, H, P, N]`` (gradient w.r.t. each chunk's
        final state, in ``x.dtype`` as upstream passes it); D: ``[H]`` or ``[H, P]`` (stride 1 last) or None;
        seq_idx: ``[B, L]`` or None.
        config: ``BLOCK_SIZE_M/N/K`` config or None (key: ``chunk_size``, ``hdim``, ``dstate``).
        dx: optional output ``[B, L, H, P]`` (any strides), else ``empty_like(x)``.
    Returns:
        ``(dx, ddt_partial, dD_partial)``:
        ``ddt_partial`` ``[B, H, C, cs, Tn]`` fp32, ``Tn = ceil(P / BLOCK_SIZE_N)`` headdim tiles, zeroed first;
        ``ddt = fold(+, ddt_partial[..., t] for t)``.
        ``dD_partial`` (None without D) fp32, zeroed first: ``[B, C, Tm, H, P]`` for ``D`` of shape ``[H, P]``,
        ``[B, C, Tm, H, Tn]`` for ``D`` of shape ``[H]``; ``Tm = ceil(cs / BLOCK_SIZE_M)``;
        ``dD = fold(+, dD_partial[b, c, t] for b, c, t)`` (then over the last dim for ``[H]``).
    Raises:
        ValueError: ``nheads`` not a multiple of ``ngroups``; ``B``, ``CB``, ``dt``, ``dA_cumsum``, ``dout``,
            ``dstates``, ``seq_idx``, ``D`` or a given ``dx`` of another shape; a given output buffer of another shape,
            dtype or device; a ``config`` for another kernel or without exactly its block sizes (the message names the
            argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    _, _, ngroups, dstate = B.shape
    check_groups(nheads, ngroups)
    check_shape("B", B, (batch, seqlen, ngroups, dstate), "[B, L, G, N]")
    check_shape("CB", CB, (batch, nchunks, ngroups, chunk_size, chunk_size), "[B, C, G, cs, cs]")
    check_shape("dt", dt, (batch, nheads, nchunks, chunk_size), "[B, H, C, cs]")
    check_shape("dA_cumsum", dA_cumsum, dt.shape, "[B, H, C, cs]")
    check_shape("dout", dout, x.shape, "[B, L, H, P]")
    check_shape("dstates", dstates, (batch, nchunks, nheads, headdim, dstate), "[B, C, H, P, N]")
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    args = dict(chunk_size=chunk_size, hdim=headdim, dstate=dstate, batch=batch, seqlen=seqlen,
                nheads_ngroups_ratio=nheads // ngroups, HAS_SEQ_IDX=seq_idx is not None,
                BLOCK_SIZE_DSTATE=max(next_pow2(dstate), 16), DETERMINISTIC_REDUCTION=True)
    cfg = launch_config(CHUNK_SCAN_CHUNK_STATE_BWD_DX, args, x, config)
    tm = cdiv(chunk_size, cfg["BLOCK_SIZE_M"])
    tn = cdiv(headdim, cfg["BLOCK_SIZE_N"])
    if D is not None:
        check_D(D, nheads, headdim)
        dD_partial = out_buffer(dD_partial, (batch, nchunks, tm, nheads, headdim if D.dim() == 2 else tn),
                                torch.float32, x, "dD_partial", zero=True)
    else:
        dD_partial = None
    if dx is None:
        dx = alloc_like(x)
    check_shape("dx", dx, x.shape, "[B, L, H, P]")
    ddt_partial = out_buffer(ddt_partial, (batch, nheads, nchunks, chunk_size, tn), torch.float32, x, "ddt_partial",
                             zero=True)
    args.update(x_ptr=x, cb_ptr=CB, dout_ptr=dout, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx, D_ptr=D,
                b_ptr=B, dstates_ptr=dstates, dx_ptr=dx, ddt_ptr=ddt_partial, dD_ptr=dD_partial,
                stride_D_head=D.stride(0) if D is not None else 0, HAS_D=D is not None,
                D_HAS_HDIM=(D.dim() == 2) if D is not None else True, IS_TRITON_22=native().triton_22)
    args.update(strides("stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim", x, (0, 1, 2, 3)))
    # as upstream: the kernel reads CB transposed (csize_m <- stride(-1), csize_k <- stride(-2))
    args.update(strides("stride_cb_batch stride_cb_chunk stride_cb_head stride_cb_csize_m stride_cb_csize_k", CB,
                        (0, 1, 2, -1, -2)))
    args.update(strides("stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim", dout, (0, 1, 2, 3)))
    args.update(strides("stride_dt_batch stride_dt_chunk stride_dt_head stride_dt_csize", dt, (0, 2, 1, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    args.update(strides("stride_b_batch stride_b_seqlen stride_b_head stride_b_dstate", B, (0, 1, 2, 3)))
    args.update(strides("stride_dstates_batch stride_dstates_chunk stride_dstates_head stride_dstates_hdim "
                        "stride_dstates_dstate", dstates, (0, 1, 2, 3, 4)))
    args.update(strides("stride_dx_batch stride_dx_seqlen stride_dx_head stride_dx_hdim", dx, (0, 1, 2, 3)))
    args.update(strides("stride_ddt_batch stride_ddt_chunk stride_ddt_head stride_ddt_csize stride_ddt_tile",
                        ddt_partial, (0, 2, 1, 3, 4)))
    args.update(strides("stride_dD_batch stride_dD_chunk stride_dD_head stride_dD_csize stride_dD_hdim", dD_partial,
                        (0, 1, 3, 2, 4)))
    grid = (tm * tn, batch * nchunks, nheads)
    launch(CHUNK_SCAN_CHUNK_STATE_BWD_DX, grid, args, cfg, x)
    return dx, ddt_partial, dD_partial


def _example_chunk_scan_chunk_state_bwd_dx(p, config=None):
    return launch_chunk_scan_chunk_state_bwd_dx(p["x"], p["dt"], p["dA_cumsum"], p["Bm"], p["CB"], p["dout"],
                                                p["dstates"], D=p["D"], config=config)


CHUNK_SCAN_CHUNK_STATE_BWD_DX = KernelSpec(
    name="chunk_scan_chunk_state_bwd_dx", module=UPSTREAM, attr="_chunk_scan_chunk_state_bwd_dx_kernel",
    arg_names=("x_ptr cb_ptr dout_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr D_ptr b_ptr dstates_ptr dx_ptr ddt_ptr dD_ptr "
               "chunk_size hdim dstate batch seqlen nheads_ngroups_ratio stride_x_batch stride_x_seqlen stride_x_head "
               "stride_x_hdim stride_cb_batch stride_cb_chunk stride_cb_head stride_cb_csize_m stride_cb_csize_k "
               "stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim stride_dt_batch stride_dt_chunk "
               "stride_dt_head stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head "
               "stride_dA_cs_csize stride_seq_idx_batch stride_seq_idx_seqlen stride_D_head stride_b_batch "
               "stride_b_seqlen stride_b_head stride_b_dstate stride_dstates_batch stride_dstates_chunk "
               "stride_dstates_head stride_dstates_hdim stride_dstates_dstate stride_dx_batch stride_dx_seqlen "
               "stride_dx_head stride_dx_hdim stride_ddt_batch stride_ddt_chunk stride_ddt_head stride_ddt_csize "
               "stride_ddt_tile stride_dD_batch stride_dD_chunk stride_dD_head stride_dD_csize stride_dD_hdim HAS_D "
               "D_HAS_HDIM HAS_SEQ_IDX BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K BLOCK_SIZE_DSTATE IS_TRITON_22 "
               "DETERMINISTIC_REDUCTION"),
    autotune_key=("chunk_size", "hdim", "dstate"),
    candidates=(
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64}, 8, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, 4, 5),
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, 4, 5),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, 4, 4),
    ),
    pre_hook_zero=("ddt_ptr", "dD_ptr"),
    example=_example_chunk_scan_chunk_state_bwd_dx,
    # the head-dim tile: a program covers BLOCK_SIZE_N head dims of one head (masked past hdim); its ddt partial is
    # one sum over them, so a tile wider than the head dim only adds masked lanes (0.80 ms against 0.48 at N 128 over
    # hdim 32, bench G12 on the H200, docs/performance.md)
    tile_bounds={"BLOCK_SIZE_N": "hdim"},
)
