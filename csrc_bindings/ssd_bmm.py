"""Launchers for the per-chunk ``C B^T`` products (``_bmm_chunk_fwd_kernel``, ``_bmm_chunk_bwd_kernel``): the mirror
of ``mamba_ssm/ops/triton/ssd_bmm.py``.

Layout (launcher, example runner, spec per kernel): see :mod:`csrc_bindings._spec`.
"""
from __future__ import annotations

import torch

from ._configs import launch_config
from ._native import dot_dtype, launch
from ._plans import alloc_like, planned
from ._spec import KernelSpec
from ._util import cdiv, check, check_shape, out_buffer, strides

UPSTREAM = "mamba_ssm.ops.triton.ssd_bmm"


def _dims(a):
    """``(has_groups, batch, seqlen, ngroups, K)`` of ``a`` ``[B, L, G, K]`` (or ``[B, L, K]``: one group)."""
    if a.dim() == 4:
        return (True, *a.shape)
    batch, seqlen, k = a.shape
    return False, batch, seqlen, 1, k


# ----------------------------------------------------------------------------------------------------- bmm_chunk_fwd
@planned
def launch_bmm_chunk_fwd(a, b, chunk_size, *, seq_idx=None, causal=False, output_dtype=None, config=None,
                         out=None):
    """Per-chunk ``out[i, j] = a[i] . b[j]`` (``CB = C B^T`` in Mamba-2). Source: ``_bmm_chunk_fwd_kernel``.

    Args:
        a, b: ``[B, L, G, K]`` (or ``[B, L, K]``), same dtype (the key dtype); copied contiguous if neither the
            last nor the seqlen dim has stride 1 (as upstream).
        chunk_size: int. seq_idx: ``[B, L]`` int32 or None (zeroes cross-sequence entries).
        causal: only ``out[i, j]`` with ``i >= j`` is computed (key ``IS_CAUSAL``; Mamba-2 uses False).
        output_dtype: default ``a.dtype`` (Mamba-2 uses fp32).
        config: ``BLOCK_SIZE_M/N/K`` config or None (key: ``chunk_size``, ``K``, ``IS_CAUSAL``).
    Returns:
        ``out`` ``[B, C, G, cs, cs]`` (``[B, C, cs, cs]`` without groups). No reduction across programs.
    Raises:
        ValueError: ``b`` or ``seq_idx`` of another shape; a given output buffer of another shape, dtype or device; a
            ``config`` for another kernel or without exactly its block sizes (the message names the argument, the
            expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    has_groups, batch, seqlen, ngroups, k = _dims(a)
    check_shape("b", b, a.shape, "the shape of a")
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    if a.stride(-1) != 1 and a.stride(1) != 1:
        a = a.contiguous()
    if b.stride(-1) != 1 and b.stride(1) != 1:
        b = b.contiguous()
    nchunks = cdiv(seqlen, chunk_size)
    args = dict(seqlen=seqlen, chunk_size=chunk_size, K=k, ngroups=ngroups, IS_CAUSAL=bool(causal),
                HAS_SEQ_IDX=seq_idx is not None)
    cfg = launch_config(BMM_CHUNK_FWD, args, a, config)
    oshape = (batch, nchunks, ngroups, chunk_size, chunk_size) if has_groups else (batch, nchunks, chunk_size,
                                                                                   chunk_size)
    out = out_buffer(out, oshape, a.dtype if output_dtype is None else output_dtype, a, "out")
    args.update(a_ptr=a, b_ptr=b, out_ptr=out, seq_idx_ptr=seq_idx, dot_dtype=dot_dtype(a, b))
    args.update(stride_a_batch=a.stride(0), stride_a_seqlen=a.stride(1),
                stride_a_head=a.stride(2) if has_groups else 0, stride_ak=a.stride(-1),
                stride_b_batch=b.stride(0), stride_b_seqlen=b.stride(1),
                stride_b_head=b.stride(2) if has_groups else 0, stride_bk=b.stride(-1),
                stride_out_batch=out.stride(0), stride_out_chunk=out.stride(1),
                stride_out_head=out.stride(2) if has_groups else 0, stride_outm=out.stride(-2),
                stride_outn=out.stride(-1))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    def grid(m):
        return (cdiv(chunk_size, m["BLOCK_SIZE_M"]) * cdiv(chunk_size, m["BLOCK_SIZE_N"]), batch, nchunks * ngroups)
    launch(BMM_CHUNK_FWD, grid, args, cfg, a)
    return out


def _example_bmm_chunk_fwd(p, config=None):
    return (launch_bmm_chunk_fwd(p["Cm"], p["Bm"], p["chunk_size"], output_dtype=torch.float32, config=config),)


BMM_CHUNK_FWD = KernelSpec(
    name="bmm_chunk_fwd", module=UPSTREAM, attr="_bmm_chunk_fwd_kernel",
    arg_names=("a_ptr b_ptr out_ptr seq_idx_ptr seqlen chunk_size K ngroups stride_a_batch stride_a_seqlen "
               "stride_a_head stride_ak stride_b_batch stride_b_seqlen stride_b_head stride_bk stride_out_batch "
               "stride_out_chunk stride_out_head stride_outm stride_outn stride_seq_idx_batch stride_seq_idx_seqlen "
               "IS_CAUSAL dot_dtype HAS_SEQ_IDX BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K"),
    autotune_key=("chunk_size", "K", "IS_CAUSAL"),
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
    layer_key_consts={"IS_CAUSAL": False},
    example=_example_bmm_chunk_fwd,
    timing_outputs=('out_ptr',),
)


# ----------------------------------------------------------------------------------------------------- bmm_chunk_bwd
@planned
def launch_bmm_chunk_bwd(a, dout, *, residual=None, config=None, out=None):
    """``out[l] = sum_s dout[l, s] a[s] (+ residual)`` per chunk: the gradient of :func:`launch_bmm_chunk_fwd`
    w.r.t. its other operand. Source: ``_bmm_chunk_bwd_kernel``.

    Args:
        a: ``[B, L, G, K]`` (or ``[B, L, K]``); key dtype. dout: ``[B, C, G, cs, cs]`` (or ``[B, C, cs, cs]``).
        residual: like ``a`` or None, added in fp32 before the store.
        config: ``BLOCK_SIZE_M/N/CS`` config or None (key: ``chunk_size``, ``K``).
        out: optional output (same shape as ``a``; stride 1 in the last or the seqlen dim), else ``empty_like(a)``.
    Returns:
        ``out``. Each element is one program's sequential sum over the chunk (no cross-program reduction).
    Raises:
        ValueError: ``residual`` or ``out`` not of the shape of ``a``, ``out`` without stride 1 in the last or the
            seqlen dim; a ``config`` for another kernel or without exactly its block sizes (the message names the
            argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    has_groups, batch, seqlen, ngroups, k = _dims(a)
    nchunks, chunk_size = dout.shape[1], dout.shape[-1]
    if a.stride(-1) != 1 and a.stride(-2) != 1:
        a = a.contiguous()
    if dout.stride(-1) != 1 and dout.stride(-2) != 1:
        dout = dout.contiguous()
    if residual is not None:
        check_shape("residual", residual, a.shape, "the shape of a")
        if residual.stride(-1) != 1 and residual.stride(1) != 1:
            residual = residual.contiguous()
    if out is None:
        out = alloc_like(a)
    else:
        check_shape("out", out, a.shape, "the shape of a")
        check(out.stride(-1) == 1 or out.stride(1) == 1,
              f"out: expected stride 1 in the last or the seqlen dim, got strides {tuple(out.stride())}")
    args = dict(seqlen=seqlen, chunk_size=chunk_size, K=k, ngroups=ngroups, HAS_RESIDUAL=residual is not None)
    cfg = launch_config(BMM_CHUNK_BWD, args, a, config)
    g = 2 if has_groups else None
    args.update(a_ptr=a, dout_ptr=dout, db_ptr=out, res_ptr=residual, dot_dtype=dot_dtype(a, dout))
    args.update(stride_a_batch=a.stride(0), stride_a_seqlen=a.stride(1), stride_a_head=a.stride(g) if g else 0,
                stride_ak=a.stride(-1),
                stride_dout_batch=dout.stride(0), stride_dout_chunk=dout.stride(1),
                stride_dout_head=dout.stride(2) if has_groups else 0, stride_dout_csize_m=dout.stride(-2),
                stride_dout_csize_n=dout.stride(-1),
                stride_db_batch=out.stride(0), stride_db_seqlen=out.stride(1), stride_db_head=out.stride(g) if g else 0,
                stride_db_k=out.stride(-1))
    if residual is not None:
        args.update(stride_res_batch=residual.stride(0), stride_res_seqlen=residual.stride(1),
                    stride_res_head=residual.stride(g) if g else 0, stride_res_k=residual.stride(-1))
    else:
        args.update(stride_res_batch=0, stride_res_seqlen=0, stride_res_head=0, stride_res_k=0)
    def grid(m):
        return (cdiv(chunk_size, m["BLOCK_SIZE_M"]) * cdiv(k, m["BLOCK_SIZE_N"]), batch, nchunks * ngroups)
    launch(BMM_CHUNK_BWD, grid, args, cfg, a)
    return out


def _example_bmm_chunk_bwd(p, config=None):
    return (launch_bmm_chunk_bwd(p["Cm"], p["dCB"], residual=p["dB_res"], config=config),)


BMM_CHUNK_BWD = KernelSpec(
    name="bmm_chunk_bwd", module=UPSTREAM, attr="_bmm_chunk_bwd_kernel",
    arg_names=("a_ptr dout_ptr db_ptr res_ptr seqlen chunk_size K ngroups stride_a_batch stride_a_seqlen stride_a_head "
               "stride_ak stride_dout_batch stride_dout_chunk stride_dout_head stride_dout_csize_m stride_dout_csize_n "
               "stride_db_batch stride_db_seqlen stride_db_head stride_db_k stride_res_batch stride_res_seqlen "
               "stride_res_head stride_res_k dot_dtype HAS_RESIDUAL BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_CS"),
    autotune_key=("chunk_size", "K"),
    candidates=(
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_CS": 64}, 8, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_CS": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_CS": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_CS": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_CS": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_CS": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_CS": 32}, 2, 5),
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_CS": 32}, 2, 5),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_CS": 32}, 2, 4),
    ),
    example=_example_bmm_chunk_bwd,
    timing_outputs=('db_ptr',),
)
