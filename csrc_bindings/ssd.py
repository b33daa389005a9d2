"""Launchers for mamba-ssm's chunked-SSD Triton kernels (``mamba_ssm/ops/triton/ssd_*.py``), pinned configurations.

Terms: ``B`` batch, ``L`` seqlen, ``H`` nheads, ``P`` headdim, ``G`` ngroups, ``N`` dstate, ``cs`` chunk_size,
``C = ceil(L / cs)`` nchunks. Every launcher

* launches the kernel's JIT function directly (``autotuner.fn``), never the autotuner, with the configuration
  ``config`` (a :class:`~csrc_bindings.KernelConfig` or dict) or, when ``config`` is None, the pinned one for the
  kernel's autotune key (see :mod:`csrc_bindings._configs`: table, else the ``mincost-v1`` rule);
* re-does what the autotuner pre-hook did (zeroing the accumulation buffers it names);
* passes ``DETERMINISTIC_REDUCTION=True`` with a per-tile workspace wherever the kernel has that constexpr, so no
  ``atomic_add`` is reached; every output element has exactly one writer;
* returns raw per-tile / per-split partials in fp32 where the upstream wrapper would have summed them (the caller
  folds them in its own order); the layouts are documented per launcher;
* allocates only the buffers it documents (each can be passed in instead) and runs under the device guard.

Determinism guarantee (scope): for the same inputs, configuration, GPU model, and versions of torch / triton /
mamba-ssm (see :func:`csrc_bindings.fingerprint`), the outputs are bitwise identical across repeats, processes and
restarts; they never depend on the SM count, timing, environment variables or process-global modes.

Errors: ``ValueError`` for shapes/dtypes that do not match the documented contract; ``ImportError`` /
``RuntimeError`` from the first-use check (missing extras, unsupported mamba-ssm version, changed kernel signature).
"""
from __future__ import annotations

import torch

from ._configs import resolve_config
from ._native import launch, native
from ._util import cdiv, check, next_pow2, out_buffer, strides

_INF = float("inf")


def _dot_dtype(*ts):
    tl = native().tl
    if any(t.dtype == torch.bfloat16 for t in ts):
        return tl.bfloat16
    if any(t.dtype == torch.float16 for t in ts):
        return tl.float16
    return tl.float32


def _nsplits(nheads: int, ngroups: int, nheads_per_program):
    check(nheads % ngroups == 0, f"nheads ({nheads}) must be a multiple of ngroups ({ngroups})")
    ratio = nheads // ngroups
    nhpp = ratio if nheads_per_program is None else int(nheads_per_program)
    check(1 <= nhpp <= ratio, f"nheads_per_program must be in [1, nheads // ngroups = {ratio}], got {nhpp}")
    return nhpp, cdiv(ratio, nhpp)


# --------------------------------------------------------------------------------------------- chunk cumsum
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
    """
    batch, seqlen, nheads = dt.shape
    check(tuple(A.shape) == (nheads,), f"A must be [{nheads}]")
    if dt_bias is not None:
        check(tuple(dt_bias.shape) == (nheads,), f"dt_bias must be [{nheads}]")
    nchunks = cdiv(seqlen, chunk_size)
    cfg = resolve_config("chunk_cumsum_fwd", {"chunk_size": chunk_size, "nheads": nheads}, dt.dtype, dt.device,
                         config)
    shape = (batch, nheads, nchunks, chunk_size)
    dt_out = out_buffer(dt_out, shape, torch.float32, dt, "dt_out")
    dA_cumsum = out_buffer(dA_cumsum, shape, torch.float32, dt, "dA_cumsum")
    args = dict(dt_ptr=dt, A_ptr=A, dt_bias_ptr=dt_bias, dt_out_ptr=dt_out, dA_cumsum_ptr=dA_cumsum,
                batch=batch, seqlen=seqlen, nheads=nheads, chunk_size=chunk_size,
                dt_min=dt_limit[0], dt_max=dt_limit[1],
                DT_SOFTPLUS=bool(dt_softplus), HAS_DT_BIAS=dt_bias is not None,
                BLOCK_SIZE_CHUNK=next_pow2(chunk_size))
    args.update(strides("stride_dt_batch stride_dt_seqlen stride_dt_head", dt, (0, 1, 2)))
    args["stride_A_head"] = A.stride(0)
    args["stride_dt_bias_head"] = dt_bias.stride(0) if dt_bias is not None else 0
    args.update(strides("stride_dt_out_batch stride_dt_out_chunk stride_dt_out_head stride_dt_out_csize",
                        dt_out, (0, 2, 1, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize",
                        dA_cumsum, (0, 2, 1, 3)))
    grid = (batch, nchunks, cdiv(nheads, cfg["BLOCK_SIZE_H"]))
    launch("chunk_cumsum_fwd", grid, args, cfg, dt)
    return dA_cumsum, dt_out


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
    """
    batch, seqlen, nheads = dt.shape
    _, _, nchunks, chunk_size = ddA.shape
    check(tuple(ddA.shape) == (batch, nheads, nchunks, chunk_size), "ddA must be [B, H, C, cs]")
    check(tuple(ddt_out.shape) == tuple(ddA.shape), "ddt_out must be [B, H, C, cs]")
    check(tuple(A.shape) == (nheads,), f"A must be [{nheads}]")
    cfg = resolve_config("chunk_cumsum_bwd", {"chunk_size": chunk_size, "nheads": nheads}, dt.dtype, dt.device,
                         config)
    if ddt is None:
        ddt = torch.empty_like(dt)
    check(tuple(ddt.shape) == tuple(dt.shape), "ddt must be [B, L, H]")
    dA_partial = out_buffer(dA_partial, (batch, nchunks, nheads), torch.float32, dt, "dA_partial", zero=True)
    if dt_bias is not None:
        check(tuple(dt_bias.shape) == (nheads,), f"dt_bias must be [{nheads}]")
        ddt_bias_partial = out_buffer(ddt_bias_partial, (batch, nchunks, nheads), torch.float32, dt,
                                      "ddt_bias_partial", zero=True)
    else:
        ddt_bias_partial = None
    args = dict(ddA_ptr=ddA, ddt_out_ptr=ddt_out, dt_ptr=dt, A_ptr=A, dt_bias_ptr=dt_bias, ddt_ptr=ddt,
                dA_ptr=dA_partial, ddt_bias_ptr=ddt_bias_partial,
                batch=batch, seqlen=seqlen, nheads=nheads, chunk_size=chunk_size,
                dt_min=dt_limit[0], dt_max=dt_limit[1],
                DT_SOFTPLUS=bool(dt_softplus), HAS_DT_BIAS=dt_bias is not None,
                BLOCK_SIZE_CHUNK=next_pow2(chunk_size), DETERMINISTIC_REDUCTION=True)
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
    launch("chunk_cumsum_bwd", grid, args, cfg, dt)
    return ddt, dA_partial, ddt_bias_partial


# --------------------------------------------------------------------------------------------- bmm (C^T B)
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
    """
    has_groups = a.dim() == 4
    if has_groups:
        batch, seqlen, ngroups, k = a.shape
    else:
        batch, seqlen, k = a.shape
        ngroups = 1
    check(tuple(b.shape) == tuple(a.shape), "a and b must have the same shape")
    if seq_idx is not None:
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    if a.stride(-1) != 1 and a.stride(1) != 1:
        a = a.contiguous()
    if b.stride(-1) != 1 and b.stride(1) != 1:
        b = b.contiguous()
    nchunks = cdiv(seqlen, chunk_size)
    cfg = resolve_config("bmm_chunk_fwd", {"chunk_size": chunk_size, "K": k, "IS_CAUSAL": bool(causal)}, a.dtype,
                         a.device, config)
    oshape = (batch, nchunks, ngroups, chunk_size, chunk_size) if has_groups else (batch, nchunks, chunk_size,
                                                                                   chunk_size)
    out = out_buffer(out, oshape, a.dtype if output_dtype is None else output_dtype, a, "out")
    args = dict(a_ptr=a, b_ptr=b, out_ptr=out, seq_idx_ptr=seq_idx, seqlen=seqlen, chunk_size=chunk_size, K=k,
                ngroups=ngroups, IS_CAUSAL=bool(causal), dot_dtype=_dot_dtype(a, b), HAS_SEQ_IDX=seq_idx is not None)
    args.update(stride_a_batch=a.stride(0), stride_a_seqlen=a.stride(1),
                stride_a_head=a.stride(2) if has_groups else 0, stride_ak=a.stride(-1),
                stride_b_batch=b.stride(0), stride_b_seqlen=b.stride(1),
                stride_b_head=b.stride(2) if has_groups else 0, stride_bk=b.stride(-1),
                stride_out_batch=out.stride(0), stride_out_chunk=out.stride(1),
                stride_out_head=out.stride(2) if has_groups else 0, stride_outm=out.stride(-2),
                stride_outn=out.stride(-1))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    grid = (cdiv(chunk_size, cfg["BLOCK_SIZE_M"]) * cdiv(chunk_size, cfg["BLOCK_SIZE_N"]), batch, nchunks * ngroups)
    launch("bmm_chunk_fwd", grid, args, cfg, a)
    return out


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
    """
    has_groups = a.dim() == 4
    if has_groups:
        batch, seqlen, ngroups, k = a.shape
    else:
        batch, seqlen, k = a.shape
        ngroups = 1
    nchunks, chunk_size = dout.shape[1], dout.shape[-1]
    if a.stride(-1) != 1 and a.stride(-2) != 1:
        a = a.contiguous()
    if dout.stride(-1) != 1 and dout.stride(-2) != 1:
        dout = dout.contiguous()
    if residual is not None:
        check(tuple(residual.shape) == tuple(a.shape), "residual must have the shape of a")
        if residual.stride(-1) != 1 and residual.stride(1) != 1:
            residual = residual.contiguous()
    if out is None:
        out = torch.empty_like(a)
    else:
        check(tuple(out.shape) == tuple(a.shape), "out must have the shape of a")
        check(out.stride(-1) == 1 or out.stride(1) == 1, "out needs stride 1 in the last or the seqlen dim")
    cfg = resolve_config("bmm_chunk_bwd", {"chunk_size": chunk_size, "K": k}, a.dtype, a.device, config)
    g = 2 if has_groups else None
    args = dict(a_ptr=a, dout_ptr=dout, db_ptr=out, res_ptr=residual, seqlen=seqlen, chunk_size=chunk_size, K=k,
                ngroups=ngroups, dot_dtype=_dot_dtype(a, dout), HAS_RESIDUAL=residual is not None)
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
    grid = (cdiv(chunk_size, cfg["BLOCK_SIZE_M"]) * cdiv(k, cfg["BLOCK_SIZE_N"]), batch, nchunks * ngroups)
    launch("bmm_chunk_bwd", grid, args, cfg, a)
    return out


# --------------------------------------------------------------------------------------------- chunk state
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
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    _, _, ngroups, dstate = B.shape
    check(nheads % ngroups == 0, "nheads must be a multiple of ngroups")
    check(tuple(B.shape) == (batch, seqlen, ngroups, dstate), "B must be [B, L, G, N]")
    check(tuple(dt.shape) == (batch, nheads, nchunks, chunk_size), "dt must be [B, H, C, cs]")
    check(tuple(dA_cumsum.shape) == tuple(dt.shape), "dA_cumsum must be [B, H, C, cs]")
    if seq_idx is not None:
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    cfg = resolve_config("chunk_state_fwd", {"hdim": headdim, "dstate": dstate, "chunk_size": chunk_size}, x.dtype,
                         x.device, config)
    states = out_buffer(states, (batch, nchunks, nheads, headdim, dstate),
                        torch.float32 if states_in_fp32 else B.dtype, x, "states")
    args = dict(x_ptr=x, b_ptr=B, states_ptr=states, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx,
                hdim=headdim, dstate=dstate, chunk_size=chunk_size, batch=batch, seqlen=seqlen,
                nheads_ngroups_ratio=nheads // ngroups, HAS_SEQ_IDX=seq_idx is not None)
    args.update(strides("stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim", x, (0, 1, 2, 3)))
    args.update(strides("stride_b_batch stride_b_seqlen stride_b_head stride_b_dstate", B, (0, 1, 2, -1)))
    args.update(strides("stride_states_batch stride_states_chunk stride_states_head stride_states_hdim "
                        "stride_states_dstate", states, (0, 1, 2, 3, 4)))
    args.update(strides("stride_dt_batch stride_dt_chunk stride_dt_head stride_dt_csize", dt, (0, 2, 1, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    grid = (cdiv(headdim, cfg["BLOCK_SIZE_M"]) * cdiv(dstate, cfg["BLOCK_SIZE_N"]), batch * nchunks, nheads)
    launch("chunk_state_fwd", grid, args, cfg, x)
    return states


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
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    dstate = dstates.shape[-1]
    check(tuple(dt.shape) == (batch, nheads, nchunks, chunk_size), "dt must be [B, H, C, cs]")
    check(tuple(dA_cumsum.shape) == tuple(dt.shape), "dA_cumsum must be [B, H, C, cs]")
    check(tuple(dstates.shape) == (batch, nchunks, nheads, headdim, dstate), "dstates must be [B, C, H, P, N]")
    if seq_idx is not None:
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    nhpp, nsplits = _nsplits(nheads, ngroups, nheads_per_program)
    cfg = resolve_config("chunk_state_bwd_db", {"chunk_size": chunk_size, "dstate": dstate, "hdim": headdim},
                         x.dtype, x.device, config)
    if B is not None:
        check(tuple(B.shape) == (batch, seqlen, ngroups, dstate), "B must be [B, L, G, N]")
        ntiles = cdiv(dstate, cfg["BLOCK_SIZE_N"])
        ddA_partial = out_buffer(ddA_partial, (batch, nheads, nchunks, chunk_size, ntiles), torch.float32, x,
                                 "ddA_partial", zero=True)
    else:
        ddA_partial = None
    dB_partial = out_buffer(dB_partial, (batch, seqlen, nsplits, ngroups, dstate), torch.float32, x, "dB_partial")
    args = dict(x_ptr=x, dstates_ptr=dstates, b_ptr=B, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx,
                db_ptr=dB_partial, ddA_cumsum_ptr=ddA_partial, chunk_size=chunk_size, dstate=dstate, hdim=headdim,
                batch=batch, seqlen=seqlen, nheads=nheads, nheads_per_program=nhpp, ngroups=ngroups,
                HAS_DDA_CS=ddA_partial is not None, HAS_SEQ_IDX=seq_idx is not None, DETERMINISTIC_REDUCTION=True,
                BLOCK_SIZE_K=max(next_pow2(headdim), 16))
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
            nsplits * ngroups)
    launch("chunk_state_bwd_db", grid, args, cfg, x)
    return dB_partial, ddA_partial


# --------------------------------------------------------------------------------------------- state passing
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
    """
    batch, nchunks, nheads, dim = states.shape
    check(tuple(dA_chunk_cumsum.shape) == (batch, nheads, nchunks), "dA_chunk_cumsum must be [B, H, C]")
    if initial_states is not None:
        check(tuple(initial_states.shape) == (batch, nheads, dim), "initial_states must be [B, H, D]")
    seqlen = 0
    if seq_idx is not None:
        check(chunk_size is not None, "seq_idx needs chunk_size")
        seqlen = seq_idx.shape[-1]
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    cfg = resolve_config("state_passing_fwd", {"dim": dim}, states.dtype, states.device, config)
    out = out_buffer(out, (batch, nchunks, nheads, dim), states.dtype if out_dtype is None else out_dtype, states,
                     "out")
    final_states = out_buffer(final_states, (batch, nheads, dim), torch.float32, states, "final_states")
    args = dict(states_ptr=states, out_ptr=out, final_states_ptr=final_states, dA_cs_ptr=dA_chunk_cumsum,
                initstates_ptr=initial_states, seq_idx_ptr=seq_idx, dim=dim, nchunks=nchunks, seqlen=seqlen,
                chunk_size=chunk_size if seq_idx is not None else 0,
                HAS_INITSTATES=initial_states is not None, HAS_SEQ_IDX=seq_idx is not None)
    args.update(strides("stride_states_batch stride_states_chunk stride_states_head stride_states_dim", states,
                        (0, 1, 2, 3)))
    args.update(strides("stride_out_batch stride_out_chunk stride_out_head stride_out_dim", out, (0, 1, 2, 3)))
    args.update(strides("stride_final_states_batch stride_final_states_head stride_final_states_dim", final_states,
                        (0, 1, 2)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head", dA_chunk_cumsum, (0, 2, 1)))
    args.update(strides("stride_initstates_batch stride_initstates_head stride_initstates_dim", initial_states,
                        (0, 1, 2)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    grid = (cdiv(dim, cfg["BLOCK_SIZE"]), batch, nheads)
    launch("state_passing_fwd", grid, args, cfg, states)
    return out, final_states


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
    """
    batch, nchunks, nheads, dim = states.shape
    check(tuple(dA_chunk_cumsum.shape) == (batch, nheads, nchunks), "dA_chunk_cumsum must be [B, H, C]")
    check(tuple(dout.shape) == (batch, nchunks, nheads, dim), "dout must be [B, C, H, D]")
    seqlen = 0
    if seq_idx is not None:
        check(chunk_size is not None, "seq_idx needs chunk_size")
        seqlen = seq_idx.shape[-1]
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    if dfinal_states is not None:
        check(tuple(dfinal_states.shape) == (batch, nheads, dim), "dfinal_states must be [B, H, D]")
    cfg = resolve_config("state_passing_bwd", {"dim": dim}, states.dtype, states.device, config)
    ddtype = dstates_dtype if dstates_dtype is not None else dout.dtype
    dstates = torch.empty_like(dout, dtype=ddtype)
    if states_dtype is not None and states_dtype != states.dtype:
        states_converted = torch.empty_like(states, dtype=ddtype)
        check(states_converted.stride() == states.stride(), "states must be contiguous to be converted")
    else:
        states_converted = None
    dinitstates = torch.empty_like(dstates[:, 0]) if has_initial_states else None
    ntiles = cdiv(dim, cfg["BLOCK_SIZE"])
    ddA_partial = torch.empty(batch, nheads, nchunks, ntiles, dtype=torch.float32, device=states.device)
    args = dict(dout_ptr=dout, out_ptr=states, dA_cs_ptr=dA_chunk_cumsum, dfinal_states_ptr=dfinal_states,
                seq_idx_ptr=seq_idx, dstates_ptr=dstates, ddA_cs_ptr=ddA_partial, dinitstates_ptr=dinitstates,
                states_converted_ptr=states_converted, dim=dim, nchunks=nchunks, seqlen=seqlen,
                chunk_size=chunk_size if seq_idx is not None else 0,
                CONVERT_STATES=states_converted is not None, HAS_DFINAL_STATES=dfinal_states is not None,
                HAS_DINITSTATES=dinitstates is not None, HAS_SEQ_IDX=seq_idx is not None)
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
    launch("state_passing_bwd", grid, args, cfg, states)
    if states_dtype is not None and states_dtype == states.dtype:
        states_converted = states
    return dstates, ddA_partial, dinitstates, states_converted


# --------------------------------------------------------------------------------------------- chunk scan
def launch_chunk_scan_fwd(cb, x, dt, dA_cumsum, C, states, *, D=None, z=None, seq_idx=None, config=None,
                          out=None, out_x=None):
    """Output of the chunked scan: intra-chunk (``cb``) plus inter-chunk (``C . states``) terms, ``+ D x``, optional
    ``* silu(z)``. Source: ``_chunk_scan_fwd_kernel`` (launched with ``IS_CAUSAL=True`` as upstream).

    Args:
        cb: ``[B, C, G, cs, cs]`` (fp32 in Mamba-2); x: ``[B, L, H, P]`` (key dtype); dt, dA_cumsum: ``[B, H, C, cs]``;
        C: ``[B, L, G, N]``; states: ``[B, C, H, P, N]`` (state entering each chunk); D: ``[H]`` or ``[H, P]``
        (stride 1 in the last dim) or None; z: ``[B, L, H, P]`` or None; seq_idx: ``[B, L]`` or None.
        config: ``BLOCK_SIZE_M/N/K`` config or None (key: ``chunk_size``, ``hdim``, ``dstate``, ``IS_CAUSAL``).
        out, out_x: optional outputs ``[B, L, H, P]`` of dtype ``x.dtype``, stride 1 in the last dim, equal strides.
    Returns:
        ``(out, out_x)``; ``out_x`` (the output before the ``z`` gate) is None without ``z``. No cross-program
        reduction.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    _, _, ngroups, dstate = C.shape
    check(nheads % ngroups == 0, "nheads must be a multiple of ngroups")
    check(tuple(C.shape) == (batch, seqlen, ngroups, dstate), "C must be [B, L, G, N]")
    check(tuple(cb.shape) == (batch, nchunks, ngroups, chunk_size, chunk_size), "cb must be [B, C, G, cs, cs]")
    if z is not None:
        check(tuple(z.shape) == tuple(x.shape), "z must be [B, L, H, P]")
    if D is not None:
        check(tuple(D.shape) in ((nheads, headdim), (nheads,)), "D must be [H, P] or [H]")
        check(D.stride(-1) == 1, "D must have stride 1 in its last dim")
    check(tuple(dt.shape) == (batch, nheads, nchunks, chunk_size), "dt must be [B, H, C, cs]")
    check(tuple(dA_cumsum.shape) == tuple(dt.shape), "dA_cumsum must be [B, H, C, cs]")
    check(tuple(states.shape) == (batch, nchunks, nheads, headdim, dstate), "states must be [B, C, H, P, N]")
    if seq_idx is not None:
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    cfg = resolve_config("chunk_scan_fwd", {"chunk_size": chunk_size, "hdim": headdim, "dstate": dstate,
                                            "IS_CAUSAL": True}, x.dtype, x.device, config)
    out = out_buffer(out, (batch, seqlen, nheads, headdim), x.dtype, x, "out")
    check(out.stride(-1) == 1, "out must have stride 1 in its last dim")
    if z is not None:
        out_x = out_buffer(out_x, (batch, seqlen, nheads, headdim), x.dtype, x, "out_x")
        check(out_x.stride() == out.stride(), "out_x must have the strides of out")
    else:
        out_x = None
    args = dict(cb_ptr=cb, x_ptr=x, z_ptr=z, out_ptr=out, out_x_ptr=out_x, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum,
                seq_idx_ptr=seq_idx, C_ptr=C, prev_states_ptr=states, D_ptr=D, chunk_size=chunk_size,
                hdim=headdim, dstate=dstate, batch=batch, seqlen=seqlen, nheads_ngroups_ratio=nheads // ngroups,
                stride_D_head=D.stride(0) if D is not None else 0,
                IS_CAUSAL=True, HAS_D=D is not None, D_HAS_HDIM=(D.dim() == 2) if D is not None else True,
                HAS_Z=z is not None, HAS_SEQ_IDX=seq_idx is not None,
                BLOCK_SIZE_DSTATE=max(next_pow2(dstate), 16), IS_TRITON_22=native().triton_22)
    args.update(strides("stride_cb_batch stride_cb_chunk stride_cb_head stride_cb_csize_m stride_cb_csize_k", cb,
                        (0, 1, 2, 3, 4)))
    args.update(strides("stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim", x, (0, 1, 2, 3)))
    args.update(strides("stride_z_batch stride_z_seqlen stride_z_head stride_z_hdim", z, (0, 1, 2, 3)))
    args.update(strides("stride_out_batch stride_out_seqlen stride_out_head stride_out_hdim", out, (0, 1, 2, 3)))
    args.update(strides("stride_dt_batch stride_dt_chunk stride_dt_head stride_dt_csize", dt, (0, 2, 1, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    args.update(strides("stride_C_batch stride_C_seqlen stride_C_head stride_C_dstate", C, (0, 1, 2, 3)))
    args.update(strides("stride_states_batch stride_states_chunk stride_states_head stride_states_hdim "
                        "stride_states_dstate", states, (0, 1, 2, 3, 4)))
    grid = (cdiv(chunk_size, cfg["BLOCK_SIZE_M"]) * cdiv(headdim, cfg["BLOCK_SIZE_N"]), batch * nchunks, nheads)
    launch("chunk_scan_fwd", grid, args, cfg, x)
    return out, out_x


def launch_chunk_scan_bwd_dz(x, z, out, dout, chunk_size, *, D=None, has_ddAcs=True, recompute_output=False,
                             config=None, dz=None, dout_x=None, dD_partial=None, ddA_cumsum=None, outz=None):
    """Backward through the ``silu(z)`` gate (and the ``D`` skip / ``dA_cumsum`` terms that reuse it).
    Source: ``_chunk_scan_bwd_dz_kernel``.

    Args:
        x, z: ``[B, L, H, P]`` (x: key dtype); out: ``[B, L, H, P]`` the *ungated* scan output (``out_x``);
        dout: ``[B, L, H, P]`` gradient w.r.t. the gated output; chunk_size: int.
        D: ``[H]`` or ``[H, P]`` (stride 1 in the last dim) or None.
        has_ddAcs: also compute ``ddA_cumsum`` (the ``sum_p dout_x * (out - D x)`` term).
        recompute_output: also write ``outz = out * silu(z)``.
        config: ``BLOCK_SIZE_M`` config or None (key: ``chunk_size``, ``hdim``).
    Returns:
        ``(dz, dout_x, dD_partial, ddA_cumsum, outz)``: ``dz`` like z; ``dout_x`` like dout (gradient w.r.t.
        ``out``); ``dD_partial`` ``[B, C, T, H, P or 1]`` fp32 (None without D), ``T = ceil(cs / BLOCK_SIZE_M)``,
        ``dD = fold(+, dD_partial[b, c, t] for b, c, t)`` (last dim 1 for ``D`` of shape ``[H]``);
        ``ddA_cumsum`` ``[B, H, C, cs]`` fp32 or None; ``outz`` or None.
    """
    batch, seqlen, nheads, headdim = x.shape
    check(tuple(z.shape) == tuple(x.shape) and tuple(out.shape) == tuple(x.shape)
          and tuple(dout.shape) == tuple(x.shape), "x, z, out, dout must all be [B, L, H, P]")
    nchunks = cdiv(seqlen, chunk_size)
    if D is not None:
        check(tuple(D.shape) in ((nheads, headdim), (nheads,)), "D must be [H, P] or [H]")
        check(D.stride(-1) == 1, "D must have stride 1 in its last dim")
    cfg = resolve_config("chunk_scan_bwd_dz", {"chunk_size": chunk_size, "hdim": headdim}, x.dtype, x.device, config)
    ntiles = cdiv(chunk_size, cfg["BLOCK_SIZE_M"])
    ddA_cumsum = (out_buffer(ddA_cumsum, (batch, nheads, nchunks, chunk_size), torch.float32, x, "ddA_cumsum")
                  if has_ddAcs else None)
    if D is not None:
        dD_partial = out_buffer(dD_partial, (batch, nchunks, ntiles, nheads, headdim if D.dim() == 2 else 1),
                                torch.float32, x, "dD_partial")
    else:
        dD_partial = None
    dz = out_buffer(dz, z.shape, z.dtype, z, "dz")
    dout_x = out_buffer(dout_x, dout.shape, dout.dtype, dout, "dout_x")
    outz = out_buffer(outz, x.shape, x.dtype, x, "outz") if recompute_output else None
    args = dict(dout_ptr=dout, out_ptr=out, z_ptr=z, x_ptr=x, D_ptr=D, outz_ptr=outz, dz_ptr=dz, dout_x_ptr=dout_x,
                dD_ptr=dD_partial, ddA_cumsum_ptr=ddA_cumsum, chunk_size=chunk_size, hdim=headdim, batch=batch,
                seqlen=seqlen, stride_D_head=D.stride(0) if D is not None else 0,
                HAS_D=D is not None, D_HAS_HDIM=(D.dim() == 2) if D is not None else True,
                HAS_DDACS=bool(has_ddAcs), RECOMPUTE_OUTPUT=bool(recompute_output),
                BLOCK_SIZE_N=max(next_pow2(headdim), 16))
    args.update(strides("stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim", dout, (0, 1, 2, 3)))
    args.update(strides("stride_out_batch stride_out_seqlen stride_out_head stride_out_hdim", out, (0, 1, 2, 3)))
    args.update(strides("stride_z_batch stride_z_seqlen stride_z_head stride_z_hdim", z, (0, 1, 2, 3)))
    args.update(strides("stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim", x, (0, 1, 2, 3)))
    args.update(strides("stride_outz_batch stride_outz_seqlen stride_outz_head stride_outz_hdim", outz, (0, 1, 2, 3)))
    args.update(strides("stride_dz_batch stride_dz_seqlen stride_dz_head stride_dz_hdim", dz, (0, 1, 2, 3)))
    args.update(strides("stride_doutx_batch stride_doutx_seqlen stride_doutx_head stride_doutx_hdim", dout_x,
                        (0, 1, 2, 3)))
    args.update(strides("stride_dD_batch stride_dD_chunk stride_dD_head stride_dD_csize stride_dD_hdim", dD_partial,
                        (0, 1, 3, 2, 4)))
    args.update(strides("stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize", ddA_cumsum,
                        (0, 2, 1, 3)))
    grid = (ntiles, batch * nchunks, nheads)
    launch("chunk_scan_bwd_dz", grid, args, cfg, x)
    return dz, dout_x, dD_partial, ddA_cumsum, outz


def launch_chunk_scan_bwd_dstates(C, dA_cumsum, dout, *, seq_idx=None, dtype=None, config=None,
                                  dprev_states=None):
    """Gradient w.r.t. the state entering each chunk, from the inter-chunk output term.
    Source: ``_chunk_scan_bwd_dstates_kernel``.

    Args:
        C: ``[B, L, G, N]``; dA_cumsum: ``[B, H, C, cs]``; dout: ``[B, L, H, P]`` (key dtype);
        seq_idx: ``[B, L]`` or None; dtype: output dtype (default ``C.dtype``; Mamba-2 passes fp32).
        config: ``BLOCK_SIZE_M/N/K`` config or None (key: ``hdim``, ``dstate``, ``chunk_size``).
    Returns:
        ``dprev_states`` ``[B, C, H, P, N]``; each element one program's sequential sum over the chunk.
    """
    batch, seqlen, nheads, headdim = dout.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    _, _, ngroups, dstate = C.shape
    check(nheads % ngroups == 0, "nheads must be a multiple of ngroups")
    check(tuple(C.shape) == (batch, seqlen, ngroups, dstate), "C must be [B, L, G, N]")
    check(tuple(dA_cumsum.shape) == (batch, nheads, nchunks, chunk_size), "dA_cumsum must be [B, H, C, cs]")
    if seq_idx is not None:
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    cfg = resolve_config("chunk_scan_bwd_dstates", {"hdim": headdim, "dstate": dstate, "chunk_size": chunk_size},
                         dout.dtype, dout.device, config)
    dprev_states = out_buffer(dprev_states, (batch, nchunks, nheads, headdim, dstate),
                              C.dtype if dtype is None else dtype, dout, "dprev_states")
    args = dict(dout_ptr=dout, c_ptr=C, dprev_states_ptr=dprev_states, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx,
                hdim=headdim, dstate=dstate, chunk_size=chunk_size, batch=batch, seqlen=seqlen, nchunks=nchunks,
                nheads_ngroups_ratio=nheads // ngroups, HAS_SEQ_IDX=seq_idx is not None)
    args.update(strides("stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim", dout, (0, 1, 2, 3)))
    args.update(strides("stride_c_batch stride_c_seqlen stride_c_head stride_c_dstate", C, (0, 1, 2, 3)))
    args.update(strides("stride_dprev_states_batch stride_dprev_states_chunk stride_dprev_states_head "
                        "stride_dprev_states_hdim stride_dprev_states_dstate", dprev_states, (0, 1, 2, 3, 4)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    grid = (cdiv(headdim, cfg["BLOCK_SIZE_M"]) * cdiv(dstate, cfg["BLOCK_SIZE_N"]), batch * nchunks, nheads)
    launch("chunk_scan_bwd_dstates", grid, args, cfg, dout)
    return dprev_states


def launch_chunk_scan_bwd_dC(prev_states, dA_cumsum, dout, *, C=None, seq_idx=None, ngroups=1,
                             nheads_per_program=None, config=None, dC_partial=None, ddA_partial=None):
    """Gradient w.r.t. ``C`` from the inter-chunk output term (and its ``dA_cumsum`` term).
    Source: ``_chunk_scan_bwd_dc_kernel``.

    Args:
        prev_states: ``[B, C, H, P, N]`` (state entering each chunk, in the dtype of ``dout`` as upstream passes);
        dA_cumsum: ``[B, H, C, cs]``; dout: ``[B, L, H, P]`` (key dtype); C: ``[B, L, G, N]`` or None (None: no
        ``ddA`` output); seq_idx: ``[B, L]`` or None; ngroups: G.
        nheads_per_program: heads summed sequentially (head order) in one program; default ``H // G`` (one split).
        config: ``BLOCK_SIZE_M/N`` config or None (key: ``chunk_size``, ``dstate``, ``hdim``).
    Returns:
        ``(dC_partial, ddA_partial)``: ``dC_partial`` ``[B, L, S, G, N]`` fp32 (``S`` splits as in
        :func:`launch_chunk_state_bwd_db`), ``dC = fold(+, dC_partial[:, :, s] for s)``;
        ``ddA_partial`` ``[B, H, C, cs, T]`` fp32 or None, ``T = ceil(N / BLOCK_SIZE_N)``, zeroed first;
        upstream's ``ddA_cumsum_prev = sum_t ddA_partial`` (no cumsum here).
    """
    batch, nchunks, nheads, headdim, dstate = prev_states.shape
    _, seqlen, _, _ = dout.shape
    chunk_size = dA_cumsum.shape[-1]
    check(tuple(dA_cumsum.shape) == (batch, nheads, nchunks, chunk_size), "dA_cumsum must be [B, H, C, cs]")
    check(tuple(dout.shape) == (batch, seqlen, nheads, headdim), "dout must be [B, L, H, P]")
    if seq_idx is not None:
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    nhpp, nsplits = _nsplits(nheads, ngroups, nheads_per_program)
    cfg = resolve_config("chunk_scan_bwd_dC", {"chunk_size": chunk_size, "dstate": dstate, "hdim": headdim},
                         dout.dtype, dout.device, config)
    if C is not None:
        check(tuple(C.shape) == (batch, seqlen, ngroups, dstate), "C must be [B, L, G, N]")
        ntiles = cdiv(dstate, cfg["BLOCK_SIZE_N"])
        ddA_partial = out_buffer(ddA_partial, (batch, nheads, nchunks, chunk_size, ntiles), torch.float32, dout,
                                 "ddA_partial", zero=True)
    else:
        ddA_partial = None
    dC_partial = out_buffer(dC_partial, (batch, seqlen, nsplits, ngroups, dstate), torch.float32, dout, "dC_partial")
    args = dict(dout_ptr=dout, prev_states_ptr=prev_states, C_ptr=C, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx,
                dc_ptr=dC_partial, ddA_cumsum_ptr=ddA_partial, chunk_size=chunk_size, dstate=dstate, hdim=headdim,
                batch=batch, seqlen=seqlen, nheads=nheads, nheads_per_program=nhpp, ngroups=ngroups,
                HAS_DDA_CS=ddA_partial is not None, HAS_SEQ_IDX=seq_idx is not None, DETERMINISTIC_REDUCTION=True,
                BLOCK_SIZE_K=max(next_pow2(headdim), 16))
    args.update(strides("stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim", dout, (0, 1, 2, 3)))
    args.update(strides("stride_prev_states_batch stride_prev_states_chunk stride_prev_states_head "
                        "stride_prev_states_hdim stride_prev_states_dstate", prev_states, (0, 1, 2, 3, 4)))
    args.update(strides("stride_C_batch stride_C_seqlen stride_C_head stride_C_dstate", C, (0, 1, 2, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    args.update(strides("stride_dc_batch stride_dc_seqlen stride_dc_split stride_dc_group stride_dc_dstate",
                        dC_partial, (0, 1, 2, 3, 4)))
    args.update(strides("stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize "
                        "stride_ddA_tile", ddA_partial, (0, 2, 1, 3, 4)))
    grid = (cdiv(chunk_size, cfg["BLOCK_SIZE_M"]) * cdiv(dstate, cfg["BLOCK_SIZE_N"]), batch * nchunks,
            nsplits * ngroups)
    launch("chunk_scan_bwd_dC", grid, args, cfg, dout)
    return dC_partial, ddA_partial


def launch_chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, *, seq_idx=None, ngroups=1, nheads_per_program=None,
                              config=None, dcb_partial=None):
    """Gradient w.r.t. ``CB`` (the intra-chunk ``C B^T``). Source: ``_chunk_scan_bwd_dcb_kernel`` (with
    ``HAS_DDA_CS=False``, as upstream's combined backward uses it).

    Args:
        x: ``[B, L, H, P]`` (key dtype); dt, dA_cumsum: ``[B, H, C, cs]``; dout: ``[B, L, H, P]``;
        seq_idx: ``[B, L]`` or None; ngroups: G; nheads_per_program: as in :func:`launch_chunk_state_bwd_db`.
        config: ``BLOCK_SIZE_M/N`` config or None (key: ``chunk_size``, ``hdim``).
    Returns:
        ``dcb_partial`` ``[B, C, S, G, cs, cs]`` fp32 (lower triangle; zeros elsewhere),
        ``dCB = fold(+, dcb_partial[:, :, s] for s)``.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    check(tuple(dt.shape) == (batch, nheads, nchunks, chunk_size), "dt must be [B, H, C, cs]")
    check(tuple(dA_cumsum.shape) == tuple(dt.shape), "dA_cumsum must be [B, H, C, cs]")
    check(tuple(dout.shape) == tuple(x.shape), "dout must be [B, L, H, P]")
    if seq_idx is not None:
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    nhpp, nsplits = _nsplits(nheads, ngroups, nheads_per_program)
    cfg = resolve_config("chunk_scan_bwd_dcb", {"chunk_size": chunk_size, "hdim": headdim}, x.dtype, x.device, config)
    dcb_partial = out_buffer(dcb_partial, (batch, nchunks, nsplits, ngroups, chunk_size, chunk_size), torch.float32,
                             x, "dcb_partial")
    args = dict(x_ptr=x, dout_ptr=dout, cb_ptr=None, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx,
                dcb_ptr=dcb_partial, ddA_cumsum_ptr=None, chunk_size=chunk_size, hdim=headdim, batch=batch,
                seqlen=seqlen, nheads=nheads, nheads_per_program=nhpp, ngroups=ngroups,
                HAS_DDA_CS=False, HAS_SEQ_IDX=seq_idx is not None, BLOCK_SIZE_K=max(next_pow2(headdim), 16))
    args.update(strides("stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim", x, (0, 1, 2, 3)))
    args.update(strides("stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim", dout, (0, 1, 2, 3)))
    args.update(strides("stride_cb_batch stride_cb_chunk stride_cb_head stride_cb_csize_m stride_cb_csize_n", None,
                        ()))
    args.update(strides("stride_dt_batch stride_dt_chunk stride_dt_head stride_dt_csize", dt, (0, 2, 1, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    args.update(strides("stride_dcb_batch stride_dcb_chunk stride_dcb_split stride_dcb_group stride_dcb_csize_m "
                        "stride_dcb_csize_n", dcb_partial, (0, 1, 2, 3, 4, 5)))
    args.update(strides("stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize_m "
                        "stride_ddA_cs_csize_n", None, ()))
    grid = (cdiv(chunk_size, cfg["BLOCK_SIZE_M"]) * cdiv(chunk_size, cfg["BLOCK_SIZE_N"]), batch * nchunks,
            nsplits * ngroups)
    launch("chunk_scan_bwd_dcb", grid, args, cfg, x)
    return dcb_partial


def launch_chunk_scan_bwd_ddAcs_stable(x, dt, dA_cumsum, dout, cb, *, config=None, ddA_partial=None):
    """The numerically stable intra-chunk ``dA_cumsum`` gradient. Source: ``_chunk_scan_bwd_ddAcs_stable_kernel``.

    Args:
        x: ``[B, L, H, P]`` (key dtype); dt, dA_cumsum: ``[B, H, C, cs]``; dout: ``[B, L, H, P]``;
        cb: ``[B, C, G, cs, cs]`` (fp32 in Mamba-2).
        config: ``BLOCK_SIZE_M/N`` config or None (key: ``chunk_size``, ``hdim``).
    Returns:
        ``ddA_partial`` ``[B, H, C, T, cs]`` fp32, ``T = ceil(cs / BLOCK_SIZE_M)`` row tiles, every entry written;
        ``ddA = fold(+, ddA_partial[:, :, :, t] for t)``.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    check(tuple(dt.shape) == (batch, nheads, nchunks, chunk_size), "dt must be [B, H, C, cs]")
    check(tuple(dout.shape) == tuple(x.shape), "dout must be [B, L, H, P]")
    check(tuple(dA_cumsum.shape) == tuple(dt.shape), "dA_cumsum must be [B, H, C, cs]")
    ngroups = cb.shape[2]
    check(nheads % ngroups == 0, "nheads must be a multiple of ngroups")
    check(tuple(cb.shape) == (batch, nchunks, ngroups, chunk_size, chunk_size), "cb must be [B, C, G, cs, cs]")
    cfg = resolve_config("chunk_scan_bwd_ddAcs_stable", {"chunk_size": chunk_size, "hdim": headdim}, x.dtype,
                         x.device, config)
    ntiles = cdiv(chunk_size, cfg["BLOCK_SIZE_M"])
    ddA_partial = out_buffer(ddA_partial, (batch, nheads, nchunks, ntiles, chunk_size), torch.float32, x,
                             "ddA_partial")
    args = dict(x_ptr=x, dout_ptr=dout, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, cb_ptr=cb, ddA_cumsum_ptr=ddA_partial,
                chunk_size=chunk_size, hdim=headdim, batch=batch, seqlen=seqlen,
                nheads_ngroups_ratio=nheads // ngroups, BLOCK_SIZE_K=max(next_pow2(headdim), 16))
    args.update(strides("stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim", x, (0, 1, 2, 3)))
    args.update(strides("stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim", dout, (0, 1, 2, 3)))
    args.update(strides("stride_dt_batch stride_dt_chunk stride_dt_head stride_dt_csize", dt, (0, 2, 1, 3)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_cb_batch stride_cb_chunk stride_cb_head stride_cb_csize_m stride_cb_csize_n", cb,
                        (0, 1, 2, 3, 4)))
    args.update(strides("stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize_m "
                        "stride_ddA_cs_csize_n", ddA_partial, (0, 2, 1, 3, 4)))
    grid = (ntiles, batch * nchunks, nheads)
    launch("chunk_scan_bwd_ddAcs_stable", grid, args, cfg, x)
    return ddA_partial


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
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    _, _, ngroups, dstate = B.shape
    check(nheads % ngroups == 0, "nheads must be a multiple of ngroups")
    check(tuple(B.shape) == (batch, seqlen, ngroups, dstate), "B must be [B, L, G, N]")
    check(tuple(CB.shape) == (batch, nchunks, ngroups, chunk_size, chunk_size), "CB must be [B, C, G, cs, cs]")
    check(tuple(dt.shape) == (batch, nheads, nchunks, chunk_size), "dt must be [B, H, C, cs]")
    check(tuple(dA_cumsum.shape) == tuple(dt.shape), "dA_cumsum must be [B, H, C, cs]")
    check(tuple(dout.shape) == tuple(x.shape), "dout must be [B, L, H, P]")
    check(tuple(dstates.shape) == (batch, nchunks, nheads, headdim, dstate), "dstates must be [B, C, H, P, N]")
    if seq_idx is not None:
        check(tuple(seq_idx.shape) == (batch, seqlen), "seq_idx must be [B, L]")
    cfg = resolve_config("chunk_scan_chunk_state_bwd_dx", {"chunk_size": chunk_size, "hdim": headdim,
                                                           "dstate": dstate}, x.dtype, x.device, config)
    tm = cdiv(chunk_size, cfg["BLOCK_SIZE_M"])
    tn = cdiv(headdim, cfg["BLOCK_SIZE_N"])
    if D is not None:
        check(tuple(D.shape) in ((nheads, headdim), (nheads,)), "D must be [H, P] or [H]")
        check(D.stride(-1) == 1, "D must have stride 1 in its last dim")
        dD_partial = out_buffer(dD_partial, (batch, nchunks, tm, nheads, headdim if D.dim() == 2 else tn),
                                torch.float32, x, "dD_partial", zero=True)
    else:
        dD_partial = None
    if dx is None:
        dx = torch.empty_like(x)
    check(tuple(dx.shape) == tuple(x.shape), "dx must be [B, L, H, P]")
    ddt_partial = out_buffer(ddt_partial, (batch, nheads, nchunks, chunk_size, tn), torch.float32, x, "ddt_partial",
                             zero=True)
    args = dict(x_ptr=x, cb_ptr=CB, dout_ptr=dout, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx, D_ptr=D,
                b_ptr=B, dstates_ptr=dstates, dx_ptr=dx, ddt_ptr=ddt_partial, dD_ptr=dD_partial,
                chunk_size=chunk_size, hdim=headdim, dstate=dstate, batch=batch, seqlen=seqlen,
                nheads_ngroups_ratio=nheads // ngroups, stride_D_head=D.stride(0) if D is not None else 0,
                HAS_D=D is not None, D_HAS_HDIM=(D.dim() == 2) if D is not None else True,
                HAS_SEQ_IDX=seq_idx is not None, BLOCK_SIZE_DSTATE=max(next_pow2(dstate), 16),
                IS_TRITON_22=native().triton_22, DETERMINISTIC_REDUCTION=True)
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
    launch("chunk_scan_chunk_state_bwd_dx", grid, args, cfg, x)
    return dx, ddt_partial, dD_partial
