"""The split-conv1d-scan layer (conv1d + SSD + gated RMSNorm + out_proj, the whole Mamba-2 layer after in_proj),
ordered.

Mirrors ``MambaSplitConv1dScanCombinedFn`` / ``mamba_split_conv1d_scan_combined`` of
``mamba_ssm/ops/triton/ssd_combined.py`` (mamba-ssm 2.3.2.post1). Layers, as everywhere in ordered-ssd:

* composition, plain functions without autograd: :func:`ordered_mamba_split_conv1d_scan_combined_fwd` /
  :func:`ordered_mamba_split_conv1d_scan_combined_bwd` (upstream ``MambaSplitConv1dScanCombinedFn``'s
  forward/backward bodies), on the SSD composition (:mod:`~ordered_ssd.ops.ssd_combined`) and the conv, gated
  RMSNorm and out_proj compositions of their own ops (:mod:`~ordered_ssd.ops.causal_conv1d`,
  :mod:`~ordered_ssd.ops.layernorm_gated`, :mod:`~ordered_ssd.ops.linear`);
* custom op (``torch.library``, with a fake and with autograd through its ``*_backward`` custom op):
  ``ordered_ssd::mamba_split_conv1d_scan_combined``;
* public functions: :func:`ordered_mamba_split_conv1d_scan_combined` (and :func:`split_conv1d_scan_partials` for
  tests and debugging).

Determinism: as :mod:`~ordered_ssd.ops.ssd_combined` (every parameter gradient a lexical fp32 fold over
per-(example, chunk, tile) partials, cast once; ``literal=True`` gives the same bits with per-example launches;
once-differentiable; the eager bits under ``torch.compile``, ``docs/compile.md``). Scope: CUDA tensors with the
native extras installed, else ``ImportError`` at the first launch.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

import csrc_bindings

from ..fold import fold_many, rmsnorm_rows_per_program
from .causal_conv1d import conv1d_weight_folds, ordered_causal_conv1d_bwd, ordered_causal_conv1d_fwd
from .common import (NO_LIMIT, absent, as_dtype_of, autocast_casts, auxiliary_outputs, autocast_context,
                     autocast_dtype, call_op, cast_copy, check_split_conv1d_scan_args, check_states_args, or_none,
                     ordered_custom_op, register_op_autograd, require_cuda)
from .layernorm_gated import ordered_rmsnorm_gated_bwd, ordered_rmsnorm_gated_fwd
from .linear import ordered_linear_fwd, ordered_linear_weight_grad
from .ssd_combined import (dense, ordered_mamba_chunk_scan_combined_bwd, ordered_mamba_chunk_scan_combined_fwd,
                           parameter_folds)

__all__ = ["ordered_mamba_split_conv1d_scan_combined_fwd", "ordered_mamba_split_conv1d_scan_combined_bwd",
           "ordered_mamba_split_conv1d_scan_combined", "split_conv1d_scan_partials"]


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


def _split_last(t, parts):
    """``t`` [..., parts * k] as [..., parts, k] (``reshape``: a view where the strides allow, as einops'
    ``"b l (h p) -> b l h p"``)."""
    return t.reshape(*t.shape[:-1], parts, t.shape[-1] // parts)


def _conv_split(xBC, conv1d_weight, conv1d_bias, seq_idx, silu, nheads, ngroups, dstate):
    """causal-conv1d forward (+ SiLU) of ``xBC`` [B, L, d_ssm + 2 G N], split into x [B, L, H, P] and
    B, C [B, L, G, N] (views of one buffer)."""
    if xBC.stride(-2) % 8 != 0:  # causal-conv1d's channel-last kernel needs strides that are multiples of 8
        xBC = xBC.contiguous()
    xBC_conv = ordered_causal_conv1d_fwd(xBC.permute(0, 2, 1), conv1d_weight, conv1d_bias, seq_idx=seq_idx,
                                         silu=silu).permute(0, 2, 1)
    dim = xBC.shape[-1] - 2 * ngroups * dstate
    x, B, C = torch.split(xBC_conv, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    return _split_last(x, nheads), _split_last(B, ngroups), _split_last(C, ngroups)


def ordered_mamba_split_conv1d_scan_combined_fwd(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, *,
                                                 seq_idx=None, dt_limit=NO_LIMIT, activation="silu",
                                                 rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
                                                 outproj_bias=None, headdim=None, ngroups=1, norm_before_gate=True,
                                                 initial_states=None):
    """Forward of ``mamba_split_conv1d_scan_combined`` with pinned launches.

    Returns ``(out, saved)``: ``out`` [B, L, d_out]; ``saved`` a dict of what the backward needs, and
    ``saved["final_states"]`` [B, H, P, N] fp32 (the SSM state after the last position; ``initial_states``
    [B, H, P, N] is the state before the first).
    """
    nheads, headdim, dstate, d_nonssm = _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups)
    batch, seqlen, _ = zxbcdt.shape
    dim = nheads * headdim
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    x, B, C = _conv_split(xBC, conv1d_weight, conv1d_bias, seq_idx, activation in ("silu", "swish"), nheads,
                          ngroups, dstate)
    z_heads = _split_last(z, nheads)
    rstd = None
    ssd_kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=dt_limit, seq_idx=seq_idx,
                  initial_states=initial_states)
    if rmsnorm_weight is None:
        out, out_x, *_, final_states = ordered_mamba_chunk_scan_combined_fwd(x, dt, A, B, C, chunk_size, z=z_heads,
                                                                             **ssd_kw)
        out = out.reshape(batch, seqlen, dim)
        if d_nonssm > 0:
            out = torch.cat([csrc_bindings.launch_swiglu_fwd(zx0), out], dim=-1)
    else:
        out_x, *_, final_states = ordered_mamba_chunk_scan_combined_fwd(x, dt, A, B, C, chunk_size, z=None, **ssd_kw)
        x_rms = out_x.reshape(batch * seqlen, dim)
        z_rms = z_heads.reshape(batch * seqlen, dim)
        if d_nonssm == 0:
            out_buf = None
        else:
            out01 = torch.empty((batch, seqlen, d_nonssm + dim), dtype=x_rms.dtype, device=x_rms.device)
            out_buf = out01[..., d_nonssm:].reshape(batch * seqlen, dim)
            csrc_bindings.launch_swiglu_fwd(zx0, out=out01[..., :d_nonssm])
        out, rstd = ordered_rmsnorm_gated_fwd(x_rms, rmsnorm_weight.contiguous(), rmsnorm_eps, z=z_rms,
                                              group_size=dim // ngroups, norm_before_gate=norm_before_gate,
                                              out=out_buf)
        out = out.reshape(batch, seqlen, out.shape[-1]) if d_nonssm == 0 else out01
    outproj_weight_cast = None
    if outproj_weight is not None:
        out, _, outproj_weight_cast = ordered_linear_fwd(out, outproj_weight, outproj_bias)
    saved = dict(out_x=out_x, rstd=rstd, headdim=headdim, nheads=nheads, ngroups=ngroups, dstate=dstate,
                 d_nonssm=d_nonssm, final_states=final_states, outproj_weight_cast=outproj_weight_cast)
    return out, saved


def ordered_mamba_split_conv1d_scan_combined_bwd(dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias,
                                                 chunk_size, *, saved, seq_idx=None, dt_limit=NO_LIMIT,
                                                 activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6, rstd=None,
                                                 outproj_weight=None, outproj_bias=None, norm_before_gate=True,
                                                 initial_states=None, dfinal_states=None, literal=False,
                                                 return_partials=False, outproj_weight_cast=None):
    """Ordered backward of ``mamba_split_conv1d_scan_combined``.

    ``outproj_weight_cast``: the forward's cast of ``outproj_weight`` to the autocast dtype (``saved``'s entry of
    the forward; None: ``outproj_weight`` is cast to ``dout``'s dtype here, the same values).

    Returns:
        ``(dzxbcdt, dconv1d_weight [D, W], dconv1d_bias, ddt_bias, dA, dD, drmsnorm_weight, doutproj_weight,
        doutproj_bias, dinitial_states)``; every parameter gradient is a lexical fp32 fold over examples (and
        chunks/tiles), cast once to the parameter's dtype; ``dinitial_states`` [B, H, P, N] is per example (None
        without ``initial_states``). With ``return_partials`` also a dict of the per-example partials.
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
    z_heads, dx, dB, dC = _split_last(z, nheads), _split_last(dx, nheads), _split_last(dB, ngroups), _split_last(
        dC, ngroups)
    dout_og = dout
    if outproj_weight is not None:
        w_cast = outproj_weight_cast if outproj_weight_cast is not None else outproj_weight.to(dout.dtype)
        dout = F.linear(dout, w_cast.t())
    if d_nonssm > 0:
        dout0, dout = dout.split([d_nonssm, dim], dim=-1)
        csrc_bindings.launch_swiglu_bwd(zx0, dout0, dxy=dzx0, recompute_output=recompute_output,
                                        out=out0_recompute if recompute_output else None)
    dout = _split_last(dout, nheads)
    drmsnorm_weight = None
    partials: Dict[str, torch.Tensor] = {}
    ssd_kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=dt_limit, seq_idx=seq_idx, dx=dx, ddt=ddt_given,
                  dB=dB, dC=dC, literal=literal, return_partials=True, initial_states=initial_states,
                  dfinal_states=dfinal_states, fold=False)
    if rmsnorm_weight is None:
        dz_heads = _split_last(dz, nheads)
        (_, _, dA, _, _, dD, _, ddt_bias, dinit, outz), ssd_parts = ordered_mamba_chunk_scan_combined_bwd(
            dout, x, dt, A, B, C, out_x, chunk_size, z=z_heads, dz=dz_heads, recompute_output=recompute_output,
            **ssd_kw)
        out_for_linear = outz.reshape(batch, seqlen, dim) if recompute_output else None
        if recompute_output and d_nonssm > 0:
            out1_recompute.copy_(out_for_linear)
            out_for_linear = out_recompute
    else:
        dout_ssd, drmsnorm_weight, _, _, dw_partial = ordered_rmsnorm_gated_bwd(
            dout.reshape(batch * seqlen, dim), out_x.reshape(batch * seqlen, dim), rmsnorm_weight,
            rmsnorm_eps, rstd, rows_per_program=rmsnorm_rows_per_program(seqlen, chunk_size),
            z=z_heads.reshape(batch * seqlen, dim), group_size=dim // ngroups,
            norm_before_gate=norm_before_gate, recompute_output=recompute_output,
            dz=dz.reshape(batch * seqlen, dim),
            out=out1_recompute.reshape(batch * seqlen, dim) if recompute_output else None,
            examples=batch if literal else None, fold=False)
        partials["drmsnorm_weight"] = dw_partial.view(batch, -1, dw_partial.shape[-1])
        out_for_linear = out_recompute if recompute_output else None
        dout_ssd = dout_ssd.reshape(batch, seqlen, nheads, headdim)
        (_, _, dA, _, _, dD, _, ddt_bias, dinit, _), ssd_parts = ordered_mamba_chunk_scan_combined_bwd(
            dout_ssd, x, dt, A, B, C, out_x, chunk_size, z=None, **ssd_kw)
    partials.update(ssd_parts)
    doutproj_weight = doutproj_bias = None
    if outproj_weight is not None:
        doutproj_weight, doutproj_bias = ordered_linear_weight_grad(
            dout_og, out_for_linear.to(dout_og.dtype), outproj_weight.dtype,
            outproj_bias.dtype if outproj_bias is not None else None)
    _, _, _, dw_part, db_part = ordered_causal_conv1d_bwd(
        xBC.permute(0, 2, 1), conv1d_weight, conv1d_bias, dxBC.permute(0, 2, 1), seq_idx=seq_idx, silu=silu,
        dx=dxBC_given.permute(0, 2, 1), literal=literal, fold=False)
    partials["dconv1d_weight"] = dw_part
    partials["dconv1d_bias"] = db_part
    # Every parameter gradient of the layer but the projections' in one fold launch: each the fp32 fold of
    # fold_dims over its partials in lexical order, cast once to the parameter's dtype.
    rms_fold = (dw_partial, 0, rmsnorm_weight.dtype) if rmsnorm_weight is not None else None
    dA, ddt_bias, dD, drmsnorm_weight, dweight, dbias = fold_many(
        [*parameter_folds(ssd_parts, D, dt_bias), rms_fold,
         *conv1d_weight_folds(conv1d_weight, conv1d_bias, dw_part, db_part)])
    dA = dA.to(A.dtype)
    dD = dD.to(D.dtype)
    ddt_bias = ddt_bias.to(dt_bias.dtype) if ddt_bias is not None else None
    if dinit is not None:
        dinit = dinit.to(initial_states.dtype)
    result = (dzxbcdt, dweight, dbias, ddt_bias, dA, dD, drmsnorm_weight, doutproj_weight, doutproj_bias, dinit)
    return (result, partials) if return_partials else result


# ---------------------------------------------------------------------------------------------- custom op
def _split_conv1d_scan_body(zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor, conv1d_bias: Optional[torch.Tensor],
                            dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, chunk_size: int,
                            initial_states: Optional[torch.Tensor], seq_idx: Optional[torch.Tensor],
                            dt_limit: List[float], return_final_states: bool, activation: Optional[str],
                            rmsnorm_weight: Optional[torch.Tensor], rmsnorm_eps: float,
                            outproj_weight: Optional[torch.Tensor],
                            outproj_bias: Optional[torch.Tensor], headdim: Optional[int], ngroups: int,
                            norm_before_gate: bool, literal: bool, autocast: Optional[torch.dtype]
                            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out [B, L, d_out], out_x [B, L, H, P], rstd [G * B * L] fp32 or :func:`absent`, final_states
    [B, H, P, N] fp32, outproj_weight_cast [d_out, d_mlp + d_ssm] or :func:`absent`)``: the last is the forward's
    autocast copy of ``outproj_weight`` (absent without a cast), returned to be saved so that the backward does not
    cast again (native autocast keeps its cast too)."""
    with autocast_context(autocast):
        out, saved = ordered_mamba_split_conv1d_scan_combined_fwd(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx=seq_idx, dt_limit=tuple(dt_limit),
            activation=activation, rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=rmsnorm_eps,
            outproj_weight=outproj_weight, outproj_bias=outproj_bias, headdim=headdim, ngroups=ngroups,
            norm_before_gate=norm_before_gate, initial_states=initial_states)
    rstd = saved["rstd"]
    w_cast = saved["outproj_weight_cast"]
    return (out.contiguous(), saved["out_x"].contiguous(), (rstd if rstd is not None else absent(zxbcdt)),
            saved["final_states"].contiguous(),
            cast_copy(w_cast, outproj_weight) if w_cast is not None else absent(zxbcdt))


_split_conv1d_scan = ordered_custom_op("mamba_split_conv1d_scan_combined", _split_conv1d_scan_body)


@_split_conv1d_scan.register_fake
def _(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx, dt_limit,
      return_final_states, activation, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias, headdim, ngroups,
      norm_before_gate, literal, autocast):
    nheads, headdim, dstate, d_nonssm = _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups)
    batch, seqlen, _ = zxbcdt.shape
    if outproj_weight is not None:
        out = zxbcdt.new_empty((batch, seqlen, outproj_weight.shape[0]),
                               dtype=autocast if autocast is not None else zxbcdt.dtype)
    else:
        out = zxbcdt.new_empty((batch, seqlen, d_nonssm + nheads * headdim))
    out_x = zxbcdt.new_empty((batch, seqlen, nheads, headdim))
    rstd = (zxbcdt.new_empty((ngroups * batch * seqlen,), dtype=torch.float32) if rmsnorm_weight is not None
            else absent(zxbcdt))
    final_states = zxbcdt.new_empty((batch, nheads, headdim, dstate), dtype=torch.float32)
    w_cast = (outproj_weight.new_empty(outproj_weight.shape, dtype=autocast)
              if autocast_casts(outproj_weight, autocast) else absent(zxbcdt))
    return out, out_x, rstd, final_states, w_cast


def _split_conv1d_scan_backward_body(dout: torch.Tensor, zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor,
                                     conv1d_bias: Optional[torch.Tensor], out_x: torch.Tensor, A: torch.Tensor,
                                     D: torch.Tensor, dt_bias: torch.Tensor, chunk_size: int,
                                     initial_states: Optional[torch.Tensor], dfinal_states: Optional[torch.Tensor],
                                     seq_idx: Optional[torch.Tensor], dt_limit: List[float], activation: Optional[str],
                                     rmsnorm_weight: Optional[torch.Tensor], rmsnorm_eps: float, rstd: torch.Tensor,
                                     outproj_weight: Optional[torch.Tensor], outproj_bias: Optional[torch.Tensor],
                                     headdim: Optional[int], ngroups: int, norm_before_gate: bool, literal: bool,
                                     autocast: Optional[torch.dtype],
                                     outproj_weight_cast: Optional[torch.Tensor]) -> List[torch.Tensor]:
    """The gradients of (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, rmsnorm_weight, outproj_weight,
    outproj_bias, initial_states) in that order, each in its input's dtype (:func:`absent` for a None input).
    ``outproj_weight_cast``: the forward's autocast copy of ``outproj_weight`` (None: no cast happened)."""
    nheads, headdim, dstate, d_nonssm = _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups)
    saved = dict(headdim=headdim, nheads=nheads, ngroups=ngroups, dstate=dstate, d_nonssm=d_nonssm)
    with autocast_context(autocast):
        grads = ordered_mamba_split_conv1d_scan_combined_bwd(
            dout.contiguous() if dout.stride(-1) != 1 else dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D,
            dt_bias, chunk_size, saved=saved, seq_idx=seq_idx, dt_limit=tuple(dt_limit), activation=activation,
            rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=rmsnorm_eps,
            rstd=rstd if rmsnorm_weight is not None else None, outproj_weight=outproj_weight,
            outproj_bias=outproj_bias, norm_before_gate=norm_before_gate, literal=literal,
            initial_states=initial_states, dfinal_states=dfinal_states, outproj_weight_cast=outproj_weight_cast)
    return as_dtype_of(grads, (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, rmsnorm_weight, outproj_weight,
                               outproj_bias, initial_states), zxbcdt)


_split_conv1d_scan_backward = ordered_custom_op("mamba_split_conv1d_scan_combined_backward",
                                                _split_conv1d_scan_backward_body)


@_split_conv1d_scan_backward.register_fake
def _(dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, chunk_size, initial_states, dfinal_states,
      seq_idx, dt_limit, activation, rmsnorm_weight, rmsnorm_eps, rstd, outproj_weight, outproj_bias, headdim, ngroups,
      norm_before_gate, literal, autocast, outproj_weight_cast):
    return [dense(t) if t is not None else absent(zxbcdt)
            for t in (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, rmsnorm_weight, outproj_weight, outproj_bias,
                      initial_states)]


def _split_conv1d_scan_setup_context(ctx, inputs, output):
    (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx, dt_limit,
     return_final_states, activation, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias, headdim, ngroups,
     norm_before_gate, literal, autocast) = inputs
    out, out_x, rstd, final_states, w_cast = output
    # the forward's autocast copy of outproj_weight, where it made one (the backward's GEMM uses it)
    ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, seq_idx, rmsnorm_weight, rstd,
                          outproj_weight, outproj_bias, initial_states, final_states,
                          w_cast if autocast_casts(outproj_weight, autocast) else None)
    auxiliary_outputs(ctx, out_x, rstd, w_cast)
    ctx.out_like = (out.shape, out.dtype)
    ctx.args = (chunk_size, dt_limit, return_final_states, activation, rmsnorm_eps, headdim, ngroups,
                norm_before_gate, literal, autocast)


def _split_conv1d_scan_bwd(backward, ctx, dout, _dout_x, _drstd, dfinal_states, _doutproj_weight_cast=None):
    (zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, seq_idx, rmsnorm_weight, rstd, outproj_weight,
     outproj_bias, initial_states, final_states, outproj_weight_cast) = ctx.saved_tensors
    (chunk_size, dt_limit, return_final_states, activation, rmsnorm_eps, headdim, ngroups, norm_before_gate, literal,
     autocast) = ctx.args
    # As in the chunk-scan op: unused returned outputs get zero gradients, as autograd materialised them before.
    if dout is None:
        dout = torch.zeros(ctx.out_like[0], dtype=ctx.out_like[1], device=zxbcdt.device)
    if not return_final_states:
        dfinal_states = None
    elif dfinal_states is None:
        dfinal_states = torch.zeros_like(final_states)
    (dzxbcdt, dconv1d_weight, dconv1d_bias, ddt_bias, dA, dD, drmsnorm_weight, doutproj_weight, doutproj_bias,
     dinit) = backward(
        dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, chunk_size, initial_states, dfinal_states,
        seq_idx, dt_limit, activation, rmsnorm_weight, rmsnorm_eps, rstd, outproj_weight, outproj_bias, headdim,
        ngroups, norm_before_gate, literal, autocast, outproj_weight_cast)
    return (dzxbcdt, dconv1d_weight, or_none(dconv1d_bias, conv1d_bias), ddt_bias, dA, dD, None,
            or_none(dinit, initial_states), None, None, None, None, or_none(drmsnorm_weight, rmsnorm_weight), None,
            or_none(doutproj_weight, outproj_weight), or_none(doutproj_bias, outproj_bias), None, None, None, None,
            None)


_SplitConv1dScanFunction = register_op_autograd(_split_conv1d_scan, _split_conv1d_scan_body,
                                                _split_conv1d_scan_setup_context, _split_conv1d_scan_bwd,
                                                _split_conv1d_scan_backward, _split_conv1d_scan_backward_body)


# -------------------------------------------------------------------------------------------- public functions
def ordered_mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                             initial_states=None, seq_idx=None, dt_limit=NO_LIMIT,
                                             return_final_states=False, activation="silu", rmsnorm_weight=None,
                                             rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                             ngroups=1, norm_before_gate=True, *, literal=False):
    """Ordered ``mamba_split_conv1d_scan_combined``: the whole Mamba-2 layer after in_proj.

    Args (as upstream):
        zxbcdt: [B, L, 2 d_mlp + 2 d_ssm + 2 G N + H]; conv1d_weight: [d_ssm + 2 G N, W]; conv1d_bias: same first
        dim or None; dt_bias: [H]; A: [H] fp32; D: [H] (then ``headdim`` is required) or [H, P]; chunk_size: int;
        initial_states: [B, H, P, N] SSM state before position 0 (the conv starts from zeros, as upstream), with a
        per-example gradient; seq_idx: [B, L] int32; dt_limit: (min, max); return_final_states: also return the SSM
        state after position L - 1 ([B, H, P, N] fp32); activation: "silu"/"swish"/None; rmsnorm_weight: [d_ssm] or
        None (plain ``silu(z)`` gate); outproj_weight: [d_out, d_mlp + d_ssm] or None; outproj_bias: [d_out] or
        None; ngroups: G; norm_before_gate: bool. ``literal``: per-example kernel launches in the backward.

    Returns:
        [B, L, d_out] (or [B, L, d_mlp + d_ssm] without out_proj); ``(out, final_states)`` with
        ``return_final_states``.

    Raises:
        TypeError / ValueError (naming the argument, before any kernel;
            :func:`~ordered_ssd.ops.common.check_split_conv1d_scan_args`): a dtype outside fp32/fp16/bf16, ``D``
            1-d without ``headdim``, shapes that do not fit together, a conv width outside 2..4, ``chunk_size`` not
            an int >= 1, mixed devices, a tensor of the CUDA path reaching 2**31 elements; ``initial_states`` not
            floating, of another shape or device; then ValueError for non-CUDA tensors. NaN/inf values are not
            checked: they propagate.
    """
    check_split_conv1d_scan_args(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx=seq_idx,
                                 rmsnorm_weight=rmsnorm_weight, outproj_weight=outproj_weight,
                                 outproj_bias=outproj_bias, headdim=headdim, ngroups=ngroups, dt_limit=dt_limit)
    if initial_states is not None:
        nheads, hdim, dstate, _ = _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups)
        check_states_args((zxbcdt.shape[0], zxbcdt.shape[1], nheads, hdim), dstate, zxbcdt.device, initial_states)
    require_cuda("zxbcdt", zxbcdt)
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    return_final_states = bool(return_final_states)
    out, _, _, final_states, _ = call_op(
        _split_conv1d_scan, _SplitConv1dScanFunction, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
        initial_states, seq_idx, [float(v) for v in dt_limit], return_final_states, activation, rmsnorm_weight,
        float(rmsnorm_eps), outproj_weight, outproj_bias, headdim, ngroups, bool(norm_before_gate), bool(literal),
        autocast_dtype(zxbcdt))
    return (out, final_states) if return_final_states else out


def split_conv1d_scan_partials(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, dout, *, literal=False,
                               **kwargs):
    """Forward + ordered backward without autograd, returning the per-example partials of every SSD parameter
    (``dA_partial``, ``ddt_bias_partial``, ``dD_partial``, ``drmsnorm_weight``, ``dconv1d_weight``,
    ``dconv1d_bias``; leading axis = example) and the folded gradients. For tests and debugging."""
    _, saved = ordered_mamba_split_conv1d_scan_combined_fwd(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                                                            chunk_size, **kwargs)
    kw = {k: v for k, v in kwargs.items() if k not in ("headdim", "ngroups")}
    grads, partials = ordered_mamba_split_conv1d_scan_combined_bwd(
        dout, zxbcdt, conv1d_weight, conv1d_bias, saved["out_x"], A, D, dt_bias, chunk_size, saved=saved,
        rstd=saved["rstd"], literal=literal, return_partials=True, **kw)
    return grads, partials
