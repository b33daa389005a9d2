"""Launchers for the chunked scan's output (``_chunk_scan_fwd_kernel``) and its backward pieces
(``_chunk_scan_bwd_*``): the mirror of ``mamba_ssm/ops/triton/ssd_chunk_scan.py``.

Layout (launcher, example runner, spec per kernel): see :mod:`csrc_bindings._spec`.
"""
from __future__ import annotations

import torch

from ._configs import launch_config
from ._native import launch, native
from ._plans import planned
from ._spec import KernelSpec
from ._util import (cdiv, check, check_D, check_groups, check_last_stride_1, check_shape, next_pow2, nsplits,
                    out_buffer, strides)

UPSTREAM = "mamba_ssm.ops.triton.ssd_chunk_scan"
_INF = float("inf")


# ---------------------------------------------------------------------------------------------------- chunk_scan_fwd
@planned
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
    Raises:
        ValueError: ``nheads`` not a multiple of ``ngroups``; ``C``, ``cb``, ``z``, ``D``, ``dt``, ``dA_cumsum``,
            ``states`` or ``seq_idx`` of another shape; a given output buffer of another shape, dtype or device, ``out``
            without stride 1 in the last dim or ``out_x`` with other strides than ``out``; a ``config`` for another
            kernel or without exactly its block sizes (the message names the argument, the expected and the actual
            value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    _, _, ngroups, dstate = C.shape
    check_groups(nheads, ngroups)
    check_shape("C", C, (batch, seqlen, ngroups, dstate), "[B, L, G, N]")
    check_shape("cb", cb, (batch, nchunks, ngroups, chunk_size, chunk_size), "[B, C, G, cs, cs]")
    if z is not None:
        check_shape("z", z, x.shape, "[B, L, H, P]")
    if D is not None:
        check_D(D, nheads, headdim)
    check_shape("dt", dt, (batch, nheads, nchunks, chunk_size), "[B, H, C, cs]")
    check_shape("dA_cumsum", dA_cumsum, dt.shape, "[B, H, C, cs]")
    check_shape("states", states, (batch, nchunks, nheads, headdim, dstate), "[B, C, H, P, N]")
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    args = dict(chunk_size=chunk_size, hdim=headdim, dstate=dstate, batch=batch, seqlen=seqlen,
                nheads_ngroups_ratio=nheads // ngroups, stride_D_head=D.stride(0) if D is not None else 0,
                IS_CAUSAL=True, HAS_D=D is not None, D_HAS_HDIM=(D.dim() == 2) if D is not None else True,
                HAS_Z=z is not None, HAS_SEQ_IDX=seq_idx is not None, BLOCK_SIZE_DSTATE=max(next_pow2(dstate), 16))
    cfg = launch_config(CHUNK_SCAN_FWD, args, x, config)
    out = out_buffer(out, (batch, seqlen, nheads, headdim), x.dtype, x, "out")
    check_last_stride_1("out", out)
    if z is not None:
        out_x = out_buffer(out_x, (batch, seqlen, nheads, headdim), x.dtype, x, "out_x")
        check(out_x.stride() == out.stride(),
              f"out_x: expected the strides of out {tuple(out.stride())}, got {tuple(out_x.stride())}")
    else:
        out_x = None
    args.update(cb_ptr=cb, x_ptr=x, z_ptr=z, out_ptr=out, out_x_ptr=out_x, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum,
                seq_idx_ptr=seq_idx, C_ptr=C, prev_states_ptr=states, D_ptr=D, IS_TRITON_22=native().triton_22)
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
    def grid(m):
        return (cdiv(chunk_size, m["BLOCK_SIZE_M"]) * cdiv(headdim, m["BLOCK_SIZE_N"]), batch * nchunks, nheads)
    launch(CHUNK_SCAN_FWD, grid, args, cfg, x)
    return out, out_x


def _example_chunk_scan_fwd(p, config=None):
    return launch_chunk_scan_fwd(p["CB"], p["x"], p["dt"], p["dA_cumsum"], p["Cm"], p["states_lo"], D=p["D"],
                                 z=p["z"], config=config)


CHUNK_SCAN_FWD = KernelSpec(
    name="chunk_scan_fwd", module=UPSTREAM, attr="_chunk_scan_fwd_kernel",
    arg_names=("cb_ptr x_ptr z_ptr out_ptr out_x_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr C_ptr prev_states_ptr D_ptr "
               "chunk_size hdim dstate batch seqlen nheads_ngroups_ratio stride_cb_batch stride_cb_chunk "
               "stride_cb_head stride_cb_csize_m stride_cb_csize_k stride_x_batch stride_x_seqlen stride_x_head "
               "stride_x_hdim stride_z_batch stride_z_seqlen stride_z_head stride_z_hdim stride_out_batch "
               "stride_out_seqlen stride_out_head stride_out_hdim stride_dt_batch stride_dt_chunk stride_dt_head "
               "stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize "
               "stride_seq_idx_batch stride_seq_idx_seqlen stride_C_batch stride_C_seqlen stride_C_head "
               "stride_C_dstate stride_states_batch stride_states_chunk stride_states_head stride_states_hdim "
               "stride_states_dstate stride_D_head IS_CAUSAL HAS_D D_HAS_HDIM HAS_Z HAS_SEQ_IDX BLOCK_SIZE_M "
               "BLOCK_SIZE_N BLOCK_SIZE_K BLOCK_SIZE_DSTATE IS_TRITON_22"),
    autotune_key=("chunk_size", "hdim", "dstate", "IS_CAUSAL"),
    candidates=(
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64}, 8, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, 4, 4),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64}, 4, 4),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, 4, 4),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}, 2, 5),
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, 2, 5),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}, 2, 4),
    ),
    layer_key_consts={"IS_CAUSAL": True},
    example=_example_chunk_scan_fwd,
    timing_outputs=('out_ptr', 'out_x_ptr'),
)


# ------------------------------------------------------------------------------------------------- chunk_scan_bwd_dz
@planned
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
    Raises:
        ValueError: ``z``, ``out``, ``dout`` not of the shape of ``x``, or ``D`` neither ``[H, P]`` nor ``[H]``; a given
            output buffer of another shape, dtype or device; a ``config`` for another kernel or without exactly its
            block sizes (the message names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads, headdim = x.shape
    for name, t in (("z", z), ("out", out), ("dout", dout)):
        check_shape(name, t, x.shape, "[B, L, H, P] (that of x)")
    nchunks = cdiv(seqlen, chunk_size)
    if D is not None:
        check_D(D, nheads, headdim)
    args = dict(chunk_size=chunk_size, hdim=headdim, batch=batch, seqlen=seqlen,
                stride_D_head=D.stride(0) if D is not None else 0,
                HAS_D=D is not None, D_HAS_HDIM=(D.dim() == 2) if D is not None else True,
                HAS_DDACS=bool(has_ddAcs), RECOMPUTE_OUTPUT=bool(recompute_output),
                BLOCK_SIZE_N=max(next_pow2(headdim), 16))
    cfg = launch_config(CHUNK_SCAN_BWD_DZ, args, x, config)
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
    args.update(dout_ptr=dout, out_ptr=out, z_ptr=z, x_ptr=x, D_ptr=D, outz_ptr=outz, dz_ptr=dz, dout_x_ptr=dout_x,
                dD_ptr=dD_partial, ddA_cumsum_ptr=ddA_cumsum)
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
    launch(CHUNK_SCAN_BWD_DZ, grid, args, cfg, x)
    return dz, dout_x, dD_partial, ddA_cumsum, outz


def _example_chunk_scan_bwd_dz(p, config=None):
    return launch_chunk_scan_bwd_dz(p["x"], p["z"], p["out_x"], p["dout"], p["chunk_size"], D=p["D"], config=config)


CHUNK_SCAN_BWD_DZ = KernelSpec(
    name="chunk_scan_bwd_dz", module=UPSTREAM, attr="_chunk_scan_bwd_dz_kernel",
    arg_names=("dout_ptr out_ptr z_ptr x_ptr D_ptr outz_ptr dz_ptr dout_x_ptr dD_ptr ddA_cumsum_ptr chunk_size hdim "
               "batch seqlen stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim stride_out_batch "
               "stride_out_seqlen stride_out_head stride_out_hdim stride_z_batch stride_z_seqlen stride_z_head "
               "stride_z_hdim stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim stride_D_head "
               "stride_outz_batch stride_outz_seqlen stride_outz_head stride_outz_hdim stride_dz_batch "
               "stride_dz_seqlen stride_dz_head stride_dz_hdim stride_doutx_batch stride_doutx_seqlen "
               "stride_doutx_head stride_doutx_hdim stride_dD_batch stride_dD_chunk stride_dD_head stride_dD_csize "
               "stride_dD_hdim stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize HAS_D "
               "D_HAS_HDIM HAS_DDACS RECOMPUTE_OUTPUT BLOCK_SIZE_M BLOCK_SIZE_N"),
    autotune_key=("chunk_size", "hdim"),
    candidates=(
        ({"BLOCK_SIZE_M": 32}, 4, 3),
        ({"BLOCK_SIZE_M": 64}, 4, 3),
        ({"BLOCK_SIZE_M": 128}, 4, 3),
        ({"BLOCK_SIZE_M": 256}, 4, 3),
    ),
    example=_example_chunk_scan_bwd_dz,
)


# -------------------------------------------------------------------------------------------- chunk_scan_bwd_dstates
@planned
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
    Raises:
        ValueError: ``nheads`` not a multiple of ``ngroups``; ``C``, ``dA_cumsum`` or ``seq_idx`` of another shape; a
            given output buffer of another shape, dtype or device; a ``config`` for another kernel or without exactly
            its block sizes (the message names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads, headdim = dout.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    _, _, ngroups, dstate = C.shape
    check_groups(nheads, ngroups)
    check_shape("C", C, (batch, seqlen, ngroups, dstate), "[B, L, G, N]")
    check_shape("dA_cumsum", dA_cumsum, (batch, nheads, nchunks, chunk_size), "[B, H, C, cs]")
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    args = dict(hdim=headdim, dstate=dstate, chunk_size=chunk_size, batch=batch, seqlen=seqlen, nchunks=nchunks,
                nheads_ngroups_ratio=nheads // ngroups, HAS_SEQ_IDX=seq_idx is not None)
    cfg = launch_config(CHUNK_SCAN_BWD_DSTATES, args, dout, config)
    dprev_states = out_buffer(dprev_states, (batch, nchunks, nheads, headdim, dstate),
                              C.dtype if dtype is None else dtype, dout, "dprev_states")
    args.update(dout_ptr=dout, c_ptr=C, dprev_states_ptr=dprev_states, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx)
    args.update(strides("stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim", dout, (0, 1, 2, 3)))
    args.update(strides("stride_c_batch stride_c_seqlen stride_c_head stride_c_dstate", C, (0, 1, 2, 3)))
    args.update(strides("stride_dprev_states_batch stride_dprev_states_chunk stride_dprev_states_head "
                        "stride_dprev_states_hdim stride_dprev_states_dstate", dprev_states, (0, 1, 2, 3, 4)))
    args.update(strides("stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize", dA_cumsum,
                        (0, 2, 1, 3)))
    args.update(strides("stride_seq_idx_batch stride_seq_idx_seqlen", seq_idx, (0, 1)))
    def grid(m):
        return (cdiv(headdim, m["BLOCK_SIZE_M"]) * cdiv(dstate, m["BLOCK_SIZE_N"]), batch * nchunks, nheads)
    launch(CHUNK_SCAN_BWD_DSTATES, grid, args, cfg, dout)
    return dprev_states


def _example_chunk_scan_bwd_dstates(p, config=None):
    return (launch_chunk_scan_bwd_dstates(p["Cm"], p["dA_cumsum"], p["dout"], dtype=torch.float32, config=config),)


CHUNK_SCAN_BWD_DSTATES = KernelSpec(
    name="chunk_scan_bwd_dstates", module=UPSTREAM, attr="_chunk_scan_bwd_dstates_kernel",
    arg_names=("dout_ptr c_ptr dprev_states_ptr dA_cumsum_ptr seq_idx_ptr hdim dstate chunk_size batch seqlen nchunks "
               "nheads_ngroups_ratio stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim "
               "stride_c_batch stride_c_seqlen stride_c_head stride_c_dstate stride_dprev_states_batch "
               "stride_dprev_states_chunk stride_dprev_states_head stride_dprev_states_hdim stride_dprev_states_dstate "
               "stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize stride_seq_idx_batch "
               "stride_seq_idx_seqlen HAS_SEQ_IDX BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K"),
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
    example=_example_chunk_scan_bwd_dstates,
    timing_outputs=('dprev_states_ptr',),
)


# ------------------------------------------------------------------------------------------------- chunk_scan_bwd_dC
@planned
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
    Raises:
        ValueError: ``dA_cumsum``, ``dout``, ``seq_idx`` or ``C`` of another shape; ``nheads`` not a multiple of
            ``ngroups``, ``nheads_per_program`` outside ``[1, nheads // ngroups]``; a given output buffer of another
            shape, dtype or device; a ``config`` for another kernel or without exactly its block sizes (the message
            names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, nchunks, nheads, headdim, dstate = prev_states.shape
    _, seqlen, _, _ = dout.shape
    chunk_size = dA_cumsum.shape[-1]
    check_shape("dA_cumsum", dA_cumsum, (batch, nheads, nchunks, chunk_size), "[B, H, C, cs]")
    check_shape("dout", dout, (batch, seqlen, nheads, headdim), "[B, L, H, P]")
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    nhpp, splits = nsplits(nheads, ngroups, nheads_per_program)
    args = dict(chunk_size=chunk_size, dstate=dstate, hdim=headdim, batch=batch, seqlen=seqlen, nheads=nheads,
                nheads_per_program=nhpp, ngroups=ngroups, HAS_SEQ_IDX=seq_idx is not None,
                DETERMINISTIC_REDUCTION=True, BLOCK_SIZE_K=max(next_pow2(headdim), 16))
    cfg = launch_config(CHUNK_SCAN_BWD_DC, args, dout, config)
    if C is not None:
        check_shape("C", C, (batch, seqlen, ngroups, dstate), "[B, L, G, N]")
        ntiles = cdiv(dstate, cfg["BLOCK_SIZE_N"])
        ddA_partial = out_buffer(ddA_partial, (batch, nheads, nchunks, chunk_size, ntiles), torch.float32, dout,
                                 "ddA_partial", zero=True)
    else:
        ddA_partial = None
    dC_partial = out_buffer(dC_partial, (batch, seqlen, splits, ngroups, dstate), torch.float32, dout, "dC_partial")
    args.update(dout_ptr=dout, prev_states_ptr=prev_states, C_ptr=C, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx,
                dc_ptr=dC_partial, ddA_cumsum_ptr=ddA_partial, HAS_DDA_CS=ddA_partial is not None)
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
            splits * ngroups)
    launch(CHUNK_SCAN_BWD_DC, grid, args, cfg, dout)
    return dC_partial, ddA_partial


def _example_chunk_scan_bwd_dC(p, config=None):
    return launch_chunk_scan_bwd_dC(p["states_lo"], p["dA_cumsum"], p["dout"], C=p["Cm"], ngroups=p["ngroups"],
                                    config=config)


CHUNK_SCAN_BWD_DC = KernelSpec(
    name="chunk_scan_bwd_dC", module=UPSTREAM, attr="_chunk_scan_bwd_dc_kernel",
    arg_names=("dout_ptr prev_states_ptr C_ptr dA_cumsum_ptr seq_idx_ptr dc_ptr ddA_cumsum_ptr chunk_size dstate hdim "
               "batch seqlen nheads nheads_per_program ngroups stride_dout_batch stride_dout_seqlen stride_dout_head "
               "stride_dout_hdim stride_prev_states_batch stride_prev_states_chunk stride_prev_states_head "
               "stride_prev_states_hdim stride_prev_states_dstate stride_C_batch stride_C_seqlen stride_C_head "
               "stride_C_dstate stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize "
               "stride_seq_idx_batch stride_seq_idx_seqlen stride_dc_batch stride_dc_seqlen stride_dc_split "
               "stride_dc_group stride_dc_dstate stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head "
               "stride_ddA_cs_csize stride_ddA_tile HAS_DDA_CS HAS_SEQ_IDX DETERMINISTIC_REDUCTION BLOCK_SIZE_M "
               "BLOCK_SIZE_N BLOCK_SIZE_K"),
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
    example=_example_chunk_scan_bwd_dC,
)


# ------------------------------------------------------------------------------------------------ chunk_scan_bwd_dcb
@planned
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
    Raises:
        ValueError: ``dt``, ``dA_cumsum``, ``dout`` or ``seq_idx`` of another shape; ``nheads`` not a multiple of
            ``ngroups``, ``nheads_per_program`` outside ``[1, nheads // ngroups]``; a given output buffer of another
            shape, dtype or device; a ``config`` for another kernel or without exactly its block sizes (the message
            names the argument, the expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    check_shape("dt", dt, (batch, nheads, nchunks, chunk_size), "[B, H, C, cs]")
    check_shape("dA_cumsum", dA_cumsum, dt.shape, "[B, H, C, cs]")
    check_shape("dout", dout, x.shape, "[B, L, H, P]")
    if seq_idx is not None:
        check_shape("seq_idx", seq_idx, (batch, seqlen), "[B, L]")
    nhpp, splits = nsplits(nheads, ngroups, nheads_per_program)
    args = dict(chunk_size=chunk_size, hdim=headdim, batch=batch, seqlen=seqlen, nheads=nheads,
                nheads_per_program=nhpp, ngroups=ngroups, HAS_DDA_CS=False, HAS_SEQ_IDX=seq_idx is not None,
                BLOCK_SIZE_K=max(next_pow2(headdim), 16))
    cfg = launch_config(CHUNK_SCAN_BWD_DCB, args, x, config)
    dcb_partial = out_buffer(dcb_partial, (batch, nchunks, splits, ngroups, chunk_size, chunk_size), torch.float32,
                             x, "dcb_partial")
    args.update(x_ptr=x, dout_ptr=dout, cb_ptr=None, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, seq_idx_ptr=seq_idx,
                dcb_ptr=dcb_partial, ddA_cumsum_ptr=None)
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
            splits * ngroups)
    launch(CHUNK_SCAN_BWD_DCB, grid, args, cfg, x)
    return dcb_partial


def _example_chunk_scan_bwd_dcb(p, config=None):
    return (launch_chunk_scan_bwd_dcb(p["x"], p["dt"], p["dA_cumsum"], p["dout"], ngroups=p["ngroups"],
                                      config=config),)


CHUNK_SCAN_BWD_DCB = KernelSpec(
    name="chunk_scan_bwd_dcb", module=UPSTREAM, attr="_chunk_scan_bwd_dcb_kernel",
    arg_names=("x_ptr dout_ptr cb_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr dcb_ptr ddA_cumsum_ptr chunk_size hdim batch "
               "seqlen nheads nheads_per_program ngroups stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim "
               "stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim stride_cb_batch stride_cb_chunk "
               "stride_cb_head stride_cb_csize_m stride_cb_csize_n stride_dt_batch stride_dt_chunk stride_dt_head "
               "stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize "
               "stride_seq_idx_batch stride_seq_idx_seqlen stride_dcb_batch stride_dcb_chunk stride_dcb_split "
               "stride_dcb_group stride_dcb_csize_m stride_dcb_csize_n stride_ddA_cs_batch stride_ddA_cs_chunk "
               "stride_ddA_cs_head stride_ddA_cs_csize_m stride_ddA_cs_csize_n HAS_DDA_CS HAS_SEQ_IDX BLOCK_SIZE_M "
               "BLOCK_SIZE_N BLOCK_SIZE_K"),
    autotune_key=("chunk_size", "hdim"),
    candidates=(
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128}, 4, 3),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32}, 4, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64}, 4, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32}, 4, 3),
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64}, 4, 3),
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32}, 4, 3),
    ),
    example=_example_chunk_scan_bwd_dcb,
)


# --------------------------------------------------------------------------------------- chunk_scan_bwd_ddAcs_stable
@planned
def launch_chunk_scan_bwd_ddAcs_stable(x, dt, dA_cumsum, dout, cb, *, config=None, ddA_partial=None):
    """The numerically stable intra-chunk ``dA_cumsum`` gradient. Source: ``_chunk_scan_bwd_ddAcs_stable_kernel``.

    Args:
        x: ``[B, L, H, P]`` (key dtype); dt, dA_cumsum: ``[B, H, C, cs]``; dout: ``[B, L, H, P]``;
        cb: ``[B, C, G, cs, cs]`` (fp32 in Mamba-2).
        config: ``BLOCK_SIZE_M/N`` config or None (key: ``chunk_size``, ``hdim``).
    Returns:
        ``ddA_partial`` ``[B, H, C, T, cs]`` fp32, ``T = ceil(cs / BLOCK_SIZE_M)`` row tiles, every entry written;
        ``ddA = fold(+, ddA_partial[:, :, :, t] for t)``.
    Raises:
        ValueError: ``dt``, ``dout``, ``dA_cumsum`` or ``cb`` of another shape, ``nheads`` not a multiple of
            ``ngroups``; a given output buffer of another shape, dtype or device; a ``config`` for another kernel or
            without exactly its block sizes, or with ``BLOCK_SIZE_M`` not a multiple of ``BLOCK_SIZE_N`` (upstream's
            kernel then races: its zeroing loop writes into the next row tile) (the message names the argument, the
            expected and the actual value).
        ImportError, RuntimeError: at the first launch, from :func:`csrc_bindings._native.kernel_jit`: triton or
            mamba-ssm missing, another mamba-ssm version, or the kernel's arguments or autotune key changed.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    check_shape("dt", dt, (batch, nheads, nchunks, chunk_size), "[B, H, C, cs]")
    check_shape("dout", dout, x.shape, "[B, L, H, P]")
    check_shape("dA_cumsum", dA_cumsum, dt.shape, "[B, H, C, cs]")
    ngroups = cb.shape[2]
    check_groups(nheads, ngroups)
    check_shape("cb", cb, (batch, nchunks, ngroups, chunk_size, chunk_size), "[B, C, G, cs, cs]")
    args = dict(chunk_size=chunk_size, hdim=headdim, batch=batch, seqlen=seqlen,
                nheads_ngroups_ratio=nheads // ngroups, BLOCK_SIZE_K=max(next_pow2(headdim), 16))
    cfg = launch_config(CHUNK_SCAN_BWD_DDACS_STABLE, args, x, config)  # refuses _ddAcs_config_error's configs
    ntiles = cdiv(chunk_size, cfg["BLOCK_SIZE_M"])
    ddA_partial = out_buffer(ddA_partial, (batch, nheads, nchunks, ntiles, chunk_size), torch.float32, x,
                             "ddA_partial")
    args.update(x_ptr=x, dout_ptr=dout, dt_ptr=dt, dA_cumsum_ptr=dA_cumsum, cb_ptr=cb, ddA_cumsum_ptr=ddA_partial)
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
    launch(CHUNK_SCAN_BWD_DDACS_STABLE, grid, args, cfg, x)
    return ddA_partial


def _ddAcs_config_error(block: dict):
    """The kernel's zeroing loop starts at ``(pid_m + 1) * BLOCK_SIZE_M`` but at a pointer rounded up to a multiple
    of ``BLOCK_SIZE_N``: unless ``BLOCK_SIZE_M`` is a multiple of ``BLOCK_SIZE_N`` it writes zeros into the next row
    tile's entries, a race (the neutrality proof saw other bits from run to run at 32 / 64 on the H200). Upstream's
    candidates all have ``BLOCK_SIZE_M`` a multiple of ``BLOCK_SIZE_N``."""
    if block["BLOCK_SIZE_M"] % block["BLOCK_SIZE_N"]:
        return (f"config: chunk_scan_bwd_ddAcs_stable needs BLOCK_SIZE_M to be a multiple of BLOCK_SIZE_N, got "
                f"BLOCK_SIZE_M={block['BLOCK_SIZE_M']}, BLOCK_SIZE_N={block['BLOCK_SIZE_N']}")
    return None


def _example_chunk_scan_bwd_ddAcs_stable(p, config=None):
    return (launch_chunk_scan_bwd_ddAcs_stable(p["x"], p["dt"], p["dA_cumsum"], p["dout"], p["CB"], config=config),)


CHUNK_SCAN_BWD_DDACS_STABLE = KernelSpec(
    name="chunk_scan_bwd_ddAcs_stable", module=UPSTREAM, attr="_chunk_scan_bwd_ddAcs_stable_kernel",
    arg_names=("x_ptr dout_ptr dt_ptr dA_cumsum_ptr cb_ptr ddA_cumsum_ptr chunk_size hdim batch seqlen "
               "nheads_ngroups_ratio stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim stride_dout_batch "
               "stride_dout_seqlen stride_dout_head stride_dout_hdim stride_dt_batch stride_dt_chunk stride_dt_head "
               "stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize "
               "stride_cb_batch stride_cb_chunk stride_cb_head stride_cb_csize_m stride_cb_csize_n stride_ddA_cs_batch "
               "stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize_m stride_ddA_cs_csize_n BLOCK_SIZE_M "
               "BLOCK_SIZE_N BLOCK_SIZE_K"),
    autotune_key=("chunk_size", "hdim"),
    candidates=(
        ({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32}, 4, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32}, 4, 3),
        ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64}, 4, 3),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32}, 4, 3),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64}, 4, 3),
        ({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128}, 4, 3),
    ),
    example=_example_chunk_scan_bwd_ddAcs_stable,
    config_error=_ddAcs_config_error,
)
