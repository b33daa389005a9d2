"""SSD (chunked state-space duality, Mamba-2 paper section 6) and the split-conv1d-scan layer, ordered.

Mirrors ``mamba_ssm/ops/triton/ssd_combined.py`` (mamba-ssm 2.3.2.post1). Layers, as everywhere in ordered-ssd:

* composition, plain functions without autograd: :func:`ordered_mamba_chunk_scan_combined_fwd` /
  :func:`ordered_mamba_chunk_scan_combined_bwd` (upstream ``_mamba_chunk_scan_combined_fwd/_bwd``) and
  :func:`ordered_mamba_split_conv1d_scan_combined_fwd` / :func:`ordered_mamba_split_conv1d_scan_combined_bwd`
  (upstream ``MambaSplitConv1dScanCombinedFn``'s forward/backward bodies); every kernel is launched through
  :mod:`csrc_bindings` at its pinned configuration, and every partial a kernel leaves per (example, chunk, tile)
  is reduced with :mod:`ordered_ssd.fold` in lexical order; the conv, the gated RMSNorm and the out_proj of the
  layer go through their own ops (:mod:`~ordered_ssd.ops.causal_conv1d`, :mod:`~ordered_ssd.ops.layernorm_gated`,
  :mod:`~ordered_ssd.ops.linear`);
* custom ops (``torch.library``, each with a fake and with autograd through its ``*_backward`` custom op):
  ``ordered_ssd::mamba_chunk_scan_combined``, ``ordered_ssd::mamba_split_conv1d_scan_combined``;
* public functions: :func:`ordered_mamba_chunk_scan_combined`, :func:`ordered_mamba_split_conv1d_scan_combined`
  (and :func:`split_conv1d_scan_partials` for tests and debugging).

Determinism (CUDA): the outputs and the gradients are bitwise identical across repeats, processes and restarts for
the same inputs, GPU model and versions of torch / triton / mamba-ssm / causal-conv1d; every gradient of a shared
parameter is a lexical fp32 fold over per-(example, chunk, tile) partials, cast once. ``literal=True`` computes the
same backward by launching the kernels once per example (a batch of one) and concatenating the partials before the
same folds; it gives the same bits (tested on the GPU). The custom ops are once-differentiable (their backward is
an opaque custom op calling native kernels): a double backward raises ``RuntimeError``. They trace under
``torch.compile`` without a graph break and give the eager bits there (``docs/compile.md``). Scope: CUDA tensors
with the native extras installed (``pip install ordered-ssd[cuda]``), else ``ImportError`` at the first launch.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from einops import rearrange

import csrc_bindings

from ..fold import fold_dims, lexical_cumsum, rmsnorm_rows_per_program
from .causal_conv1d import ordered_causal_conv1d_bwd, ordered_causal_conv1d_fwd
from .common import (NAMESPACE, NO_LIMIT, OP_TAGS, absent, as_dtype_of, autocast_context, autocast_dtype,
                     auxiliary_outputs, not_supported, or_none, require_cuda)
from .layernorm_gated import ordered_rmsnorm_gated_bwd, ordered_rmsnorm_gated_fwd
from .linear import ordered_linear_fwd, ordered_linear_weight_grad

__all__ = [
    "ordered_mamba_chunk_scan_combined_fwd", "ordered_mamba_chunk_scan_combined_bwd",
    "ordered_mamba_split_conv1d_scan_combined_fwd", "ordered_mamba_split_conv1d_scan_combined_bwd",
    "ordered_mamba_chunk_scan_combined",
    "ordered_mamba_split_conv1d_scan_combined", "split_conv1d_scan_partials",
]


# ------------------------------------------------------------------------------------------ composition: SSD
def ordered_mamba_chunk_scan_combined_fwd(x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None,
                                          dt_softplus=False, dt_limit=NO_LIMIT, seq_idx=None, initial_states=None):
    """SSD forward with pinned launches (no reductions across programs, so nothing to order).

    Args: x [B, L, H, P]; dt [B, L, H]; A [H] fp32; B, C [B, L, G, N]; D [H] or [H, P]; z [B, L, H, P];
    dt_bias [H]; seq_idx [B, L] int32; initial_states [B, H, P, N].

    Returns:
        ``(out, out_x, dt_out, dA_cumsum, states, final_states)`` as upstream's
        ``_mamba_chunk_scan_combined_fwd``: out [B, L, H, P] (gated when z is given), out_x (ungated, None
        without z), dt_out / dA_cumsum [B, H, C, cs] fp32, states [B, C, H, P, N] (entering each chunk),
        final_states [B, H, P, N] fp32.
    """
    N = B.shape[-1]
    if B.stride(-1) != 1:
        B = B.contiguous()
    if C.stride(-1) != 1:
        C = C.contiguous()
    if x.stride(-1) != 1 and x.stride(1) != 1:
        x = x.contiguous()
    if z is not None and z.stride(-1) != 1 and z.stride(1) != 1:
        z = z.contiguous()
    if D is not None and D.stride(-1) != 1:
        D = D.contiguous()
    dA_cumsum, dt_out = csrc_bindings.launch_chunk_cumsum_fwd(dt, A, chunk_size, dt_bias=dt_bias,
                                                              dt_softplus=dt_softplus, dt_limit=dt_limit)
    states = csrc_bindings.launch_chunk_state_fwd(B, x, dt_out, dA_cumsum, seq_idx=seq_idx, states_in_fp32=True)
    init = rearrange(initial_states, "... p n -> ... (p n)") if initial_states is not None else None
    states, final_states = csrc_bindings.launch_state_passing_fwd(
        rearrange(states, "... p n -> ... (p n)"), dA_cumsum[:, :, :, -1], initial_states=init, seq_idx=seq_idx,
        chunk_size=chunk_size, out_dtype=C.dtype)
    states = rearrange(states, "... (p n) -> ... p n", n=N)
    final_states = rearrange(final_states, "... (p n) -> ... p n", n=N)
    CB = csrc_bindings.launch_bmm_chunk_fwd(C, B, chunk_size, seq_idx=seq_idx, output_dtype=torch.float32)
    out, out_x = csrc_bindings.launch_chunk_scan_fwd(CB, x, dt_out, dA_cumsum, C, states, D=D, z=z, seq_idx=seq_idx)
    return out, out_x, dt_out, dA_cumsum, states, final_states


def _chunk_scan_bwd_pass(dout, x, dt, A, B, C, out, chunk_size, *, D, z, dt_bias, dt_softplus, dt_limit, seq_idx,
                         dx, ddt, dB, dC, dz, recompute_output) -> Dict[str, Optional[torch.Tensor]]:
    """One pass of the SSD backward kernels over the given examples.

    Per-position outputs (dx, ddt, dB, dC, dz, outz) are written in place into the given buffers; per-position
    tile partials (ddt over headdim tiles, dA_cumsum terms over tiles, dB/dC/dCB over head splits) are folded
    here, elementwise, in tile order. The shared-parameter partials are returned unfolded:
    ``dA_partial``/``ddt_bias_partial`` [B, C, H] and ``dD_partial`` ([B, C, T, H, P] or [B, C, T, H, Tn]).
    """
    Bsz, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    dt_in = dt.clone()
    dA_cumsum, dt_out = csrc_bindings.launch_chunk_cumsum_fwd(dt_in, A, chunk_size, dt_bias=dt_bias,
                                                              dt_softplus=dt_softplus, dt_limit=dt_limit)
    CB = csrc_bindings.launch_bmm_chunk_fwd(C, B, chunk_size, seq_idx=seq_idx, output_dtype=torch.float32)
    states = csrc_bindings.launch_chunk_state_fwd(B, x, dt_out, dA_cumsum, seq_idx=seq_idx, states_in_fp32=True)
    states, _ = csrc_bindings.launch_state_passing_fwd(rearrange(states, "... p n -> ... (p n)"),
                                                       dA_cumsum[:, :, :, -1], seq_idx=seq_idx, chunk_size=chunk_size)
    states = rearrange(states, "... (p n) -> ... p n", n=N)
    dD_partial = None
    outz = None
    if z is not None:
        dz, dout, dD_partial, _, outz = csrc_bindings.launch_chunk_scan_bwd_dz(
            x, z, out, dout, chunk_size, D=D, has_ddAcs=False, recompute_output=recompute_output, dz=dz)
        if not recompute_output:
            outz = None
    dstates = csrc_bindings.launch_chunk_scan_bwd_dstates(C, dA_cumsum, dout, seq_idx=seq_idx, dtype=states.dtype)
    dstates, ddA_chunk_partial, _, states = csrc_bindings.launch_state_passing_bwd(
        rearrange(states, "... p n -> ... (p n)"), dA_cumsum[:, :, :, -1], rearrange(dstates, "... p n -> ... (p n)"),
        seq_idx=seq_idx, has_initial_states=False, dstates_dtype=x.dtype, states_dtype=x.dtype,
        chunk_size=chunk_size)
    states = rearrange(states, "... (p n) -> ... p n", n=N)
    dstates = rearrange(dstates, "... (p n) -> ... p n", n=N)
    dx, ddt_partial, dD_from_x = csrc_bindings.launch_chunk_scan_chunk_state_bwd_dx(
        x, dt_out, dA_cumsum, B, CB, dout, dstates, D=D, seq_idx=seq_idx, dx=dx)
    ddt_dx = fold_dims(ddt_partial, -1)  # [B, H, C, cs] fp32, headdim tiles in order
    dB_partial, ddA_next_partial = csrc_bindings.launch_chunk_state_bwd_db(x, dt_out, dA_cumsum, dstates, B=B,
                                                                           seq_idx=seq_idx, ngroups=G)
    dC_partial, ddA_prev_partial = csrc_bindings.launch_chunk_scan_bwd_dC(states.to(x.dtype), dA_cumsum, dout, C=C,
                                                                          seq_idx=seq_idx, ngroups=G)
    dcb_partial = csrc_bindings.launch_chunk_scan_bwd_dcb(x, dt_out, dA_cumsum, dout, seq_idx=seq_idx, ngroups=G)
    dCB = fold_dims(dcb_partial, 2).to(CB.dtype)  # head splits in order
    dB_fold = fold_dims(dB_partial, 2)  # [B, L, G, N] fp32
    dC_fold = fold_dims(dC_partial, 2)
    csrc_bindings.launch_bmm_chunk_bwd(C, dCB, residual=dB_fold, out=dB)
    csrc_bindings.launch_bmm_chunk_bwd(B, rearrange(dCB, "... l s -> ... s l"), residual=dC_fold, out=dC)
    if z is None:
        dD_partial = dD_from_x
    # dA_cumsum gradient, as upstream assembles it, with every tile sum and scan done in a fixed order.
    ddA_prev = fold_dims(ddA_prev_partial, -1)  # [B, H, C, cs]
    ddA_prev[..., -1] += fold_dims(ddA_chunk_partial, -1)
    ddA_prev = lexical_cumsum(ddA_prev, dim=-1, reverse=True)
    ddA_next = lexical_cumsum(fold_dims(ddA_next_partial, -1), dim=-1)
    ddA = fold_dims(csrc_bindings.launch_chunk_scan_bwd_ddAcs_stable(x, dt_out, dA_cumsum, dout, CB), 3)
    ddA += ddA_next + ddA_prev
    _, dA_partial, ddt_bias_partial = csrc_bindings.launch_chunk_cumsum_bwd(
        ddA, ddt_dx, dt_in, A, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit, ddt=ddt)
    return {"dx": dx, "ddt": ddt, "dB": dB, "dC": dC, "dz": dz, "outz": outz, "dA_partial": dA_partial,
            "ddt_bias_partial": ddt_bias_partial, "dD_partial": dD_partial}


_PARTIALS = ("dA_partial", "ddt_bias_partial", "dD_partial")


def ordered_mamba_chunk_scan_combined_bwd(dout, x, dt, A, B, C, out, chunk_size, *, D=None, z=None, dt_bias=None,
                                          dt_softplus=False, dt_limit=NO_LIMIT, seq_idx=None, dx=None, ddt=None,
                                          dB=None, dC=None, dz=None, recompute_output=False, literal=False,
                                          return_partials=False):
    """Ordered SSD backward.

    Args: as upstream's ``_mamba_chunk_scan_combined_bwd`` (``out`` is the ungated scan output); ``dx``,
    ``ddt``, ``dB``, ``dC``, ``dz`` optional output buffers (may be strided views of one ``dzxbcdt``).
    ``literal``: launch every kernel once per example (the reference the fast path is tested against).

    Returns:
        ``(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, outz)`` with ``dA`` [H], ``dD`` [H] or [H, P] and
        ``ddt_bias`` [H] fp32 lexical folds over (example, chunk[, tile]); with ``return_partials`` also a dict
        of the unfolded partials (leading axis = example).
    """
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    Bsz = x.shape[0]
    dx = torch.empty_like(x) if dx is None else dx
    ddt = torch.empty_like(dt) if ddt is None else ddt
    dB = torch.empty_like(B) if dB is None else dB
    dC = torch.empty_like(C) if dC is None else dC
    if z is not None and dz is None:
        dz = torch.empty_like(z)
    outz = torch.empty_like(x) if (z is not None and recompute_output) else None
    kw = dict(D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit, recompute_output=recompute_output)
    if not literal:
        res = _chunk_scan_bwd_pass(dout, x, dt, A, B, C, out, chunk_size, z=z, seq_idx=seq_idx, dx=dx, ddt=ddt, dB=dB,
                                   dC=dC, dz=dz, **kw)
        if outz is not None:
            outz.copy_(res["outz"])
        partials = {k: res[k] for k in _PARTIALS}
    else:
        parts = {k: [] for k in _PARTIALS}
        for b in range(Bsz):
            s = slice(b, b + 1)
            res = _chunk_scan_bwd_pass(dout[s], x[s], dt[s], A, B[s], C[s], out[s], chunk_size,
                                       z=None if z is None else z[s], seq_idx=None if seq_idx is None else seq_idx[s],
                                       dx=dx[s], ddt=ddt[s], dB=dB[s], dC=dC[s], dz=None if dz is None else dz[s], **kw)
            if outz is not None:
                outz[s].copy_(res["outz"])
            for k in _PARTIALS:
                parts[k].append(res[k])
        partials = {k: (torch.cat(v, 0) if v[0] is not None else None) for k, v in parts.items()}
    dA = fold_dims(partials["dA_partial"], (0, 1))
    ddt_bias = fold_dims(partials["ddt_bias_partial"], (0, 1)) if dt_bias is not None else None
    dD = None
    if D is not None:
        p = partials["dD_partial"]  # [B, C, T, H, P] (D [H, P]) or [B, C, T, H, Tn] (D [H])
        dD = fold_dims(p, (0, 1, 2)) if D.dim() == 2 else fold_dims(p, (0, 1, 2, 4))
    result = (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, outz)
    return (result, partials) if return_partials else result


# ----------------------------------------------------------------------------- composition: split conv1d scan
def _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups):
    """``(nheads, headdim, dstate, d_nonssm)`` of the layer, from the shapes as upstream derives them."""
    if D.dim() == 1:
        nheads = D.shape[0]
    else:
        nheads, headdim = D.shape
    dim = nheads * headdim
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    d_nonssm = (zxbcdt.shape[-1] - 2 * dim - 2 * ngroups * dstate - nheads) // 2
    return nheads, headdim, dstate, d_nonssm


def _conv_split(xBC, conv1d_weight, conv1d_bias, seq_idx, silu, nheads, ngroups, dstate):
    """causal-conv1d forward (+ SiLU) of ``xBC`` [B, L, d_ssm + 2 G N], split into x [B, L, H, P] and
    B, C [B, L, G, N] (views of one buffer)."""
    if xBC.stride(-2) % 8 != 0:  # causal-conv1d's channel-last kernel needs strides that are multiples of 8
        xBC = xBC.contiguous()
    xBC_conv = rearrange(ordered_causal_conv1d_fwd(rearrange(xBC, "b s d -> b d s"), conv1d_weight, conv1d_bias,
                                                   seq_idx=seq_idx, silu=silu), "b d s -> b s d")
    dim = xBC.shape[-1] - 2 * ngroups * dstate
    x, B, C = torch.split(xBC_conv, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    return (rearrange(x, "b l (h p) -> b l h p", h=nheads), rearrange(B, "b l (g n) -> b l g n", g=ngroups),
            rearrange(C, "b l (g n) -> b l g n", g=ngroups))


def ordered_mamba_split_conv1d_scan_combined_fwd(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, *,
                                                 seq_idx=None, dt_limit=NO_LIMIT, activation="silu",
                                                 rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
                                                 outproj_bias=None, headdim=None, ngroups=1, norm_before_gate=True):
    """Forward of ``mamba_split_conv1d_scan_combined`` with pinned launches.

    Returns ``(out, saved)``: ``out`` [B, L, d_out]; ``saved`` a dict of what the backward needs.
    """
    nheads, headdim, dstate, d_nonssm = _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups)
    batch, seqlen, _ = zxbcdt.shape
    dim = nheads * headdim
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    x, B, C = _conv_split(xBC, conv1d_weight, conv1d_bias, seq_idx, activation in ("silu", "swish"), nheads,
                          ngroups, dstate)
    z_heads = rearrange(z, "b l (h p) -> b l h p", h=nheads)
    rstd = None
    ssd_kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=dt_limit, seq_idx=seq_idx)
    if rmsnorm_weight is None:
        out, out_x, *_ = ordered_mamba_chunk_scan_combined_fwd(x, dt, A, B, C, chunk_size, z=z_heads, **ssd_kw)
        out = rearrange(out, "b s h p -> b s (h p)")
        if d_nonssm > 0:
            out = torch.cat([csrc_bindings.launch_swiglu_fwd(zx0), out], dim=-1)
    else:
        out_x, *_ = ordered_mamba_chunk_scan_combined_fwd(x, dt, A, B, C, chunk_size, z=None, **ssd_kw)
        x_rms = rearrange(out_x, "b s h p -> (b s) (h p)")
        z_rms = rearrange(z_heads, "b s h p -> (b s) (h p)")
        if d_nonssm == 0:
            out_buf = None
        else:
            out01 = torch.empty((batch, seqlen, d_nonssm + dim), dtype=x_rms.dtype, device=x_rms.device)
            out_buf = rearrange(out01[..., d_nonssm:], "b s d -> (b s) d")
            csrc_bindings.launch_swiglu_fwd(zx0, out=out01[..., :d_nonssm])
        out, rstd = ordered_rmsnorm_gated_fwd(x_rms, rmsnorm_weight.contiguous(), rmsnorm_eps, z=z_rms,
                                              group_size=dim // ngroups, norm_before_gate=norm_before_gate,
                                              out=out_buf)
        out = rearrange(out, "(b s) d -> b s d", b=batch) if d_nonssm == 0 else out01
    if outproj_weight is not None:
        out = ordered_linear_fwd(out, outproj_weight, outproj_bias)[0]
    saved = dict(out_x=out_x, rstd=rstd, headdim=headdim, nheads=nheads, ngroups=ngroups, dstate=dstate,
                 d_nonssm=d_nonssm)
    return out, saved


def ordered_mamba_split_conv1d_scan_combined_bwd(dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias,
                                                 chunk_size, *, saved, seq_idx=None, dt_limit=NO_LIMIT,
                                                 activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6, rstd=None,
                                                 outproj_weight=None, outproj_bias=None, norm_before_gate=True,
                                                 literal=False, return_partials=False):
    """Ordered backward of ``mamba_split_conv1d_scan_combined``.

    Returns:
        ``(dzxbcdt, dconv1d_weight [D, W], dconv1d_bias, ddt_bias, dA, dD, drmsnorm_weight, doutproj_weight,
        doutproj_bias)``; every parameter gradient is a lexical fp32 fold over examples (and chunks/tiles),
        cast once to the parameter's dtype. With ``return_partials`` also a dict of the per-example partials.
    """
    headdim, nheads, ngroups, dstate, d_nonssm = (saved[k] for k in ("headdim", "nheads", "ngroups", "dstate",
                                                                     "d_nonssm"))
    dim = nheads * headdim
    batch, seqlen, _ = zxbcdt.shape
    silu = activation in ("silu", "swish")
    recompute_output = outproj_weight is not None
    if recompute_output:
        out_recompute = torch.empty(batch, seqlen, d_nonssm + dim, device=out_x.device, dtype=out_x.dtype)
        out0_recompute, out1_recompute = out_recompute.split([d_nonssm, dim], dim=-1)
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    x, B, C = _conv_split(xBC, conv1d_weight, conv1d_bias, seq_idx, silu, nheads, ngroups, dstate)  # recompute
    dzxbcdt = torch.empty_like(zxbcdt)
    dzx0, dz, dxBC_given, ddt_given = torch.split(dzxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads],
                                                  dim=-1)
    dxBC = torch.empty_like(xBC)
    dx, dB, dC = torch.split(dxBC, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    z_heads = rearrange(z, "b l (h p) -> b l h p", h=nheads)
    dx = rearrange(dx, "b l (h p) -> b l h p", h=nheads)
    dB = rearrange(dB, "b l (g n) -> b l g n", g=ngroups)
    dC = rearrange(dC, "b l (g n) -> b l g n", g=ngroups)
    dout_og = dout
    if outproj_weight is not None:
        dout = F.linear(dout, outproj_weight.to(dout.dtype).t())
    if d_nonssm > 0:
        dout0, dout = dout.split([d_nonssm, dim], dim=-1)
        csrc_bindings.launch_swiglu_bwd(zx0, dout0, dxy=dzx0, recompute_output=recompute_output,
                                        out=out0_recompute if recompute_output else None)
    dout = rearrange(dout, "b s (h p) -> b s h p", p=headdim)
    drmsnorm_weight = None
    partials: Dict[str, torch.Tensor] = {}
    ssd_kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=dt_limit, seq_idx=seq_idx, dx=dx, ddt=ddt_given,
                  dB=dB, dC=dC, literal=literal, return_partials=True)
    if rmsnorm_weight is None:
        dz_heads = rearrange(dz, "b l (h p) -> b l h p", h=nheads)
        (_, _, dA, _, _, dD, _, ddt_bias, outz), ssd_parts = ordered_mamba_chunk_scan_combined_bwd(
            dout, x, dt, A, B, C, out_x, chunk_size, z=z_heads, dz=dz_heads, recompute_output=recompute_output,
            **ssd_kw)
        out_for_linear = rearrange(outz, "b s h p -> b s (h p)") if recompute_output else None
        if recompute_output and d_nonssm > 0:
            out1_recompute.copy_(out_for_linear)
            out_for_linear = out_recompute
    else:
        dout_ssd, drmsnorm_weight, _, _, dw_partial = ordered_rmsnorm_gated_bwd(
            rearrange(dout, "b s h p -> (b s) (h p)"), rearrange(out_x, "b s h p -> (b s) (h p)"), rmsnorm_weight,
            rmsnorm_eps, rstd, rows_per_program=rmsnorm_rows_per_program(seqlen, chunk_size),
            z=rearrange(z_heads, "b s h p -> (b s) (h p)"), group_size=dim // ngroups,
            norm_before_gate=norm_before_gate, recompute_output=recompute_output,
            dz=rearrange(dz, "b l d -> (b l) d"),
            out=rearrange(out1_recompute, "b s d -> (b s) d") if recompute_output else None,
            examples=batch if literal else None)
        partials["drmsnorm_weight"] = dw_partial.view(batch, -1, dw_partial.shape[-1])
        out_for_linear = out_recompute if recompute_output else None
        dout_ssd = rearrange(dout_ssd, "(b s) (h p) -> b s h p", b=batch, p=headdim)
        (_, _, dA, _, _, dD, _, ddt_bias, _), ssd_parts = ordered_mamba_chunk_scan_combined_bwd(
            dout_ssd, x, dt, A, B, C, out_x, chunk_size, z=None, **ssd_kw)
    partials.update(ssd_parts)
    dA = dA.to(A.dtype)
    dD = dD.to(D.dtype)
    ddt_bias = ddt_bias.to(dt_bias.dtype) if ddt_bias is not None else None
    doutproj_weight = doutproj_bias = None
    if outproj_weight is not None:
        doutproj_weight, doutproj_bias = ordered_linear_weight_grad(
            dout_og, out_for_linear.to(dout_og.dtype), outproj_weight.dtype,
            outproj_bias.dtype if outproj_bias is not None else None)
    _, dweight, dbias, dw_part, db_part = ordered_causal_conv1d_bwd(
        rearrange(xBC, "b s d -> b d s"), conv1d_weight, conv1d_bias, rearrange(dxBC, "b s d -> b d s"),
        seq_idx=seq_idx, silu=silu, dx=rearrange(dxBC_given, "b s d -> b d s"))
    partials["dconv1d_weight"] = dw_part
    partials["dconv1d_bias"] = db_part
    result = (dzxbcdt, dweight, dbias, ddt_bias, dA, dD, drmsnorm_weight, doutproj_weight, doutproj_bias)
    return (result, partials) if return_partials else result


# -------------------------------------------------------------------------------------------- custom ops: SSD
def _dense(t):
    return torch.empty_like(t, memory_format=torch.contiguous_format) if t is not None else None


@torch.library.custom_op(f"{NAMESPACE}::mamba_chunk_scan_combined", mutates_args=(), tags=OP_TAGS)
def _chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
                D: Optional[torch.Tensor], z: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
                seq_idx: Optional[torch.Tensor], dt_softplus: bool, dt_limit: List[float], literal: bool,
                autocast: Optional[torch.dtype]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out, out_x)``: out [B, L, H, P] (gated with z); out_x the ungated output, :func:`absent` without z."""
    with autocast_context(autocast):
        out, out_x, *_ = ordered_mamba_chunk_scan_combined_fwd(
            x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
            dt_limit=tuple(dt_limit), seq_idx=seq_idx)
    return out.contiguous(), (out_x.contiguous() if z is not None else absent(x))


@_chunk_scan.register_fake
def _(x, dt, A, B, C, chunk_size, D, z, dt_bias, seq_idx, dt_softplus, dt_limit, literal, autocast):
    return _dense(x), (_dense(x) if z is not None else absent(x))


@torch.library.custom_op(f"{NAMESPACE}::mamba_chunk_scan_combined_backward", mutates_args=(), tags=OP_TAGS)
def _chunk_scan_backward(dout: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                         C: torch.Tensor, out: torch.Tensor, chunk_size: int, D: Optional[torch.Tensor],
                         z: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor], seq_idx: Optional[torch.Tensor],
                         dt_softplus: bool, dt_limit: List[float], literal: bool,
                         autocast: Optional[torch.dtype]) -> List[torch.Tensor]:
    """``[dx, ddt, dA, dB, dC, dD, dz, ddt_bias]`` (:func:`absent` for a None input)."""
    with autocast_context(autocast):
        grads = ordered_mamba_chunk_scan_combined_bwd(
            dout, x, dt, A, B, C, out, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
            dt_limit=tuple(dt_limit), seq_idx=seq_idx, literal=literal)[:8]
    return as_dtype_of(grads, (x, dt, A, B, C, D, z, dt_bias), x)


@_chunk_scan_backward.register_fake
def _(dout, x, dt, A, B, C, out, chunk_size, D, z, dt_bias, seq_idx, dt_softplus, dt_limit, literal, autocast):
    return [_dense(t) if t is not None else absent(x) for t in (x, dt, A, B, C, D, z, dt_bias)]


def _chunk_scan_setup_context(ctx, inputs, output):
    x, dt, A, B, C, chunk_size, D, z, dt_bias, seq_idx, dt_softplus, dt_limit, literal, autocast = inputs
    out, out_x = output
    ctx.save_for_backward(out if z is None else out_x, x, dt, A, B, C, D, z, dt_bias, seq_idx)
    auxiliary_outputs(ctx, out_x)
    ctx.args = (chunk_size, dt_softplus, dt_limit, literal, autocast)


def _chunk_scan_bwd(ctx, dout, _dout_x):
    out, x, dt, A, B, C, D, z, dt_bias, seq_idx = ctx.saved_tensors
    chunk_size, dt_softplus, dt_limit, literal, autocast = ctx.args
    dx, ddt, dA, dB, dC, dD, dz, ddt_bias = _chunk_scan_backward(
        dout, x, dt, A, B, C, out, chunk_size, D, z, dt_bias, seq_idx, dt_softplus, dt_limit, literal, autocast)
    return (dx, ddt, dA, dB, dC, None, or_none(dD, D), or_none(dz, z), or_none(ddt_bias, dt_bias), None, None, None,
            None, None)


_chunk_scan.register_autograd(_chunk_scan_bwd, setup_context=_chunk_scan_setup_context)


# ------------------------------------------------------------------------------ custom ops: split conv1d scan
@torch.library.custom_op(f"{NAMESPACE}::mamba_split_conv1d_scan_combined", mutates_args=(), tags=OP_TAGS)
def _split_conv1d_scan(zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor, conv1d_bias: Optional[torch.Tensor],
                       dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, chunk_size: int,
                       seq_idx: Optional[torch.Tensor], dt_limit: List[float], activation: Optional[str],
                       rmsnorm_weight: Optional[torch.Tensor], rmsnorm_eps: float,
                       outproj_weight: Optional[torch.Tensor], outproj_bias: Optional[torch.Tensor],
                       headdim: Optional[int], ngroups: int, norm_before_gate: bool, literal: bool,
                       autocast: Optional[torch.dtype]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out [B, L, d_out], out_x [B, L, H, P], rstd [G * B * L] fp32 or :func:`absent`)``."""
    with autocast_context(autocast):
        out, saved = ordered_mamba_split_conv1d_scan_combined_fwd(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx=seq_idx, dt_limit=tuple(dt_limit),
            activation=activation, rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=rmsnorm_eps,
            outproj_weight=outproj_weight, outproj_bias=outproj_bias, headdim=headdim, ngroups=ngroups,
            norm_before_gate=norm_before_gate)
    rstd = saved["rstd"]
    return out.contiguous(), saved["out_x"].contiguous(), (rstd if rstd is not None else absent(zxbcdt))


@_split_conv1d_scan.register_fake
def _(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx, dt_limit, activation, rmsnorm_weight,
      rmsnorm_eps, outproj_weight, outproj_bias, headdim, ngroups, norm_before_gate, literal, autocast):
    nheads, headdim, _, d_nonssm = _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups)
    batch, seqlen, _ = zxbcdt.shape
    if outproj_weight is not None:
        out = zxbcdt.new_empty((batch, seqlen, outproj_weight.shape[0]),
                               dtype=autocast if autocast is not None else zxbcdt.dtype)
    else:
        out = zxbcdt.new_empty((batch, seqlen, d_nonssm + nheads * headdim))
    out_x = zxbcdt.new_empty((batch, seqlen, nheads, headdim))
    rstd = (zxbcdt.new_empty((ngroups * batch * seqlen,), dtype=torch.float32) if rmsnorm_weight is not None
            else absent(zxbcdt))
    return out, out_x, rstd


_SPLIT_GRAD_INPUTS = ("zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D", "rmsnorm_weight",
                      "outproj_weight", "outproj_bias")


@torch.library.custom_op(f"{NAMESPACE}::mamba_split_conv1d_scan_combined_backward", mutates_args=(), tags=OP_TAGS)
def _split_conv1d_scan_backward(dout: torch.Tensor, zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor,
                                conv1d_bias: Optional[torch.Tensor], out_x: torch.Tensor, A: torch.Tensor,
                                D: torch.Tensor, dt_bias: torch.Tensor, chunk_size: int,
                                seq_idx: Optional[torch.Tensor], dt_limit: List[float], activation: Optional[str],
                                rmsnorm_weight: Optional[torch.Tensor], rmsnorm_eps: float, rstd: torch.Tensor,
                                outproj_weight: Optional[torch.Tensor], outproj_bias: Optional[torch.Tensor],
                                headdim: Optional[int], ngroups: int, norm_before_gate: bool, literal: bool,
                                autocast: Optional[torch.dtype]) -> List[torch.Tensor]:
    """The gradients of ``_SPLIT_GRAD_INPUTS`` in that order (:func:`absent` for a None input)."""
    nheads, headdim, dstate, d_nonssm = _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups)
    saved = dict(headdim=headdim, nheads=nheads, ngroups=ngroups, dstate=dstate, d_nonssm=d_nonssm)
    with autocast_context(autocast):
        grads = ordered_mamba_split_conv1d_scan_combined_bwd(
            dout.contiguous() if dout.stride(-1) != 1 else dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D,
            dt_bias, chunk_size, saved=saved, seq_idx=seq_idx, dt_limit=tuple(dt_limit), activation=activation,
            rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=rmsnorm_eps,
            rstd=rstd if rmsnorm_weight is not None else None, outproj_weight=outproj_weight,
            outproj_bias=outproj_bias, norm_before_gate=norm_before_gate, literal=literal)
    return as_dtype_of(grads, (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, rmsnorm_weight, outproj_weight,
                               outproj_bias), zxbcdt)


@_split_conv1d_scan_backward.register_fake
def _(dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, chunk_size, seq_idx, dt_limit, activation,
      rmsnorm_weight, rmsnorm_eps, rstd, outproj_weight, outproj_bias, headdim, ngroups, norm_before_gate, literal,
      autocast):
    return [_dense(t) if t is not None else absent(zxbcdt)
            for t in (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, rmsnorm_weight, outproj_weight, outproj_bias)]


def _split_conv1d_scan_setup_context(ctx, inputs, output):
    (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx, dt_limit, activation, rmsnorm_weight,
     rmsnorm_eps, outproj_weight, outproj_bias, headdim, ngroups, norm_before_gate, literal, autocast) = inputs
    _, out_x, rstd = output
    ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, seq_idx, rmsnorm_weight, rstd,
                          outproj_weight, outproj_bias)
    auxiliary_outputs(ctx, out_x, rstd)
    ctx.args = (chunk_size, dt_limit, activation, rmsnorm_eps, headdim, ngroups, norm_before_gate, literal, autocast)


def _split_conv1d_scan_bwd(ctx, dout, _dout_x, _drstd):
    (zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, seq_idx, rmsnorm_weight, rstd, outproj_weight,
     outproj_bias) = ctx.saved_tensors
    chunk_size, dt_limit, activation, rmsnorm_eps, headdim, ngroups, norm_before_gate, literal, autocast = ctx.args
    (dzxbcdt, dconv1d_weight, dconv1d_bias, ddt_bias, dA, dD, drmsnorm_weight, doutproj_weight,
     doutproj_bias) = _split_conv1d_scan_backward(
        dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, chunk_size, seq_idx, dt_limit, activation,
        rmsnorm_weight, rmsnorm_eps, rstd, outproj_weight, outproj_bias, headdim, ngroups, norm_before_gate, literal,
        autocast)
    return (dzxbcdt, dconv1d_weight, or_none(dconv1d_bias, conv1d_bias), ddt_bias, dA, dD, None, None, None, None,
            or_none(drmsnorm_weight, rmsnorm_weight), None, or_none(doutproj_weight, outproj_weight),
            or_none(doutproj_bias, outproj_bias), None, None, None, None, None)


_split_conv1d_scan.register_autograd(_split_conv1d_scan_bwd, setup_context=_split_conv1d_scan_setup_context)


# --------------------------------------------------------------------------------------------- public functions
def ordered_mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                      initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                      dt_limit=NO_LIMIT, return_final_states=False, return_varlen_states=False,
                                      *, literal=False):
    """Ordered ``mamba_chunk_scan_combined`` (SSD, paper section 6; native ``_chunk_*`` Triton kernels).

    Args:
        x: [B, L, H, P]; dt: [B, L, H]; A: [H] (fp32, negative); B, C: [B, L, G, N]; chunk_size: int;
        D: [H] or [H, P]; z: [B, L, H, P] (``y * silu(z)``); dt_bias: [H]; seq_idx: [B, L] int32;
        dt_softplus, dt_limit: as upstream. ``literal``: per-example kernel launches in the backward.

    Returns:
        y [B, L, H, P] (dtype of x).

    Raises:
        NotImplementedError: ``initial_states``, ``cu_seqlens``, ``return_final_states``,
            ``return_varlen_states`` (not supported yet).
        ValueError: non-CUDA tensors or shapes the kernels do not accept.
    """
    not_supported(initial_states=initial_states, cu_seqlens=cu_seqlens, return_final_states=return_final_states,
                  return_varlen_states=return_varlen_states)
    require_cuda("x", x)
    return _chunk_scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, seq_idx, dt_softplus,
                       [float(v) for v in dt_limit], literal, autocast_dtype(x))[0]


def ordered_mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                             initial_states=None, seq_idx=None, dt_limit=NO_LIMIT,
                                             return_final_states=False, activation="silu", rmsnorm_weight=None,
                                             rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                             ngroups=1, norm_before_gate=True, *, literal=False):
    """Ordered ``mamba_split_conv1d_scan_combined``: the whole Mamba-2 layer after in_proj.

    Args (as upstream):
        zxbcdt: [B, L, 2 d_mlp + 2 d_ssm + 2 G N + H]; conv1d_weight: [d_ssm + 2 G N, W]; conv1d_bias: same first
        dim or None; dt_bias: [H]; A: [H] fp32; D: [H] (then ``headdim`` is required) or [H, P]; chunk_size: int;
        seq_idx: [B, L] int32; dt_limit: (min, max); activation: "silu"/"swish"/None; rmsnorm_weight: [d_ssm] or
        None (plain ``silu(z)`` gate); outproj_weight: [d_out, d_mlp + d_ssm] or None; outproj_bias: [d_out] or
        None; ngroups: G; norm_before_gate: bool. ``literal``: per-example kernel launches in the backward.

    Returns:
        [B, L, d_out] (or [B, L, d_mlp + d_ssm] without out_proj).

    Raises:
        NotImplementedError: ``initial_states`` / ``return_final_states``.
        ValueError: ``D`` 1-d without ``headdim``; non-CUDA tensors; shapes the kernels reject.
    """
    not_supported(initial_states=initial_states, return_final_states=return_final_states)
    require_cuda("zxbcdt", zxbcdt)
    if outproj_bias is not None and outproj_weight is None:
        raise ValueError("outproj_bias: expected None when outproj_weight is None, got a tensor")
    if D.dim() == 1 and headdim is None:
        raise ValueError("headdim: required when D is 1-d ([H]), got None")
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    return _split_conv1d_scan(
        zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx, [float(v) for v in dt_limit],
        activation, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias, headdim, ngroups, norm_before_gate,
        literal, autocast_dtype(zxbcdt))[0]


def split_conv1d_scan_partials(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, dout, *, literal=False,
                               **kwargs):
    """Forward + ordered backward without autograd, returning the per-example partials of every SSD parameter
    (``dA_partial``, ``ddt_bias_partial``, ``dD_partial``, ``drmsnorm_weight``, ``dconv1d_weight``,
    ``dconv1d_bias``; leading axis = example or sequence) and the folded gradients. For tests and debugging."""
    _, saved = ordered_mamba_split_conv1d_scan_combined_fwd(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                                                            chunk_size, **kwargs)
    kw = {k: v for k, v in kwargs.items() if k not in ("headdim", "ngroups")}
    grads, partials = ordered_mamba_split_conv1d_scan_combined_bwd(
        dout, zxbcdt, conv1d_weight, conv1d_bias, saved["out_x"], A, D, dt_bias, chunk_size, saved=saved,
        rstd=saved["rstd"], literal=literal, return_partials=True, **kw)
    return grads, partials
