"""Autograd Functions of the native ordered path, and the public functional API.

* :func:`ordered_mamba_split_conv1d_scan_combined` mirrors ``mamba_ssm.ops.triton.ssd_combined.
  mamba_split_conv1d_scan_combined`` (``Mamba2`` with ``use_mem_eff_path=True``);
* :func:`ordered_mamba_chunk_scan_combined` mirrors ``mamba_chunk_scan_combined``;
* :func:`ordered_linear`, :func:`ordered_causal_conv1d` and :func:`ordered_gated_rmsnorm` are the ordered
  versions of the other pieces ``Mamba2`` uses (in_proj / out_proj, ``causal_conv1d_fn``, ``RMSNormGated``).

Determinism (all of them, CUDA): the outputs and the gradients are bitwise identical across repeats,
processes and restarts for the same inputs, GPU model and versions of torch / triton / mamba-ssm /
causal-conv1d; every gradient of a shared parameter is a lexical fp32 fold over per-(example, chunk, tile)
partials, cast once. ``literal=True`` computes the same backward with one kernel launch per example; it
gives the same bits (tested). Scope: CUDA tensors; the native extras must be installed
(``pip install ordered-ssd[cuda]``), else ``ImportError``. The Functions are once-differentiable (their
backward calls native kernels): a double backward raises ``RuntimeError``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import native as _n
from .fold import fold_dims

_NO_LIMIT = (0.0, float("inf"))
custom_fwd = torch.amp.custom_fwd(device_type="cuda")
custom_bwd = torch.amp.custom_bwd(device_type="cuda")


def _require_cuda(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor (the native ordered path), got device {t.device}")


def _not_supported(**kwargs) -> None:
    for name, value in kwargs.items():
        if value is not None and value is not False:
            raise NotImplementedError(f"{name} is not supported by the ordered path yet; pass None/False")


# ------------------------------------------------------------------------------------------- linear
class OrderedLinearFunction(torch.autograd.Function):
    """``y = x W^T + b`` with ``dW``, ``db`` lexical fp32 folds over examples
    (:func:`~ordered_ssd.native.ordered_linear_weight_grad`)."""

    @staticmethod
    @custom_fwd
    def forward(ctx, x, weight, bias):
        ac = _n._autocast_dtype(x)
        if ac is not None:
            x, weight = x.to(ac), weight.to(ac)
            bias = bias.to(ac) if bias is not None else None
        ctx.save_for_backward(x, weight)
        ctx.weight_dtype = ctx.bias_dtype = None
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    @custom_bwd
    @once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx = F.linear(dy, weight.t()) if ctx.needs_input_grad[0] else None
        dW = db = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            dW, db = _n.ordered_linear_weight_grad(dy, x, torch.float32, torch.float32 if ctx.has_bias else None)
        return dx, dW, db


def ordered_linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """Linear layer with ordered weight/bias gradients. ``x`` [B, L, in] (the example axis first),
    ``weight`` [out, in], ``bias`` [out] or None; returns [B, L, out]. Under autocast, computes in the autocast
    dtype like ``F.linear``; the gradients come back in fp32 and autograd casts them to the parameters' dtype."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x: expected a 3-d tensor [B, L, in], got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    return OrderedLinearFunction.apply(x, weight, bias)


# --------------------------------------------------------------------------------------------- conv
class OrderedCausalConv1dFunction(torch.autograd.Function):
    """causal-conv1d with ``dweight``/``dbias`` folded over per-example (per-sequence) partials."""

    @staticmethod
    @custom_fwd
    def forward(ctx, x, weight, bias, seq_idx, silu):
        cb = _n._cb()
        out = cb.launch_causal_conv1d_fwd(x, weight, bias, seq_idx=seq_idx, silu_activation=silu)
        ctx.save_for_backward(x, weight, bias, seq_idx)
        ctx.silu = silu
        return out

    @staticmethod
    @custom_bwd
    @once_differentiable
    def backward(ctx, dout):
        x, weight, bias, seq_idx = ctx.saved_tensors
        cb = _n._cb()
        dx, dw_part, db_part, _ = cb.launch_causal_conv1d_bwd_per_example(x, weight, bias, dout, seq_idx=seq_idx,
                                                                          silu_activation=ctx.silu)
        dw = fold_dims(dw_part, 0, dtype=weight.dtype)
        db = fold_dims(db_part, 0, dtype=bias.dtype) if bias is not None else None
        return dx, dw, db, None, None


def ordered_causal_conv1d(x, weight, bias=None, seq_idx=None, activation=None):
    """``causal_conv1d_fn`` with ordered gradients. ``x`` [B, D, L], ``weight`` [D, W], ``bias`` [D];
    ``activation`` None or "silu"/"swish"; returns [B, D, L]."""
    _require_cuda("x", x)
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    if x.stride(1) == 1 and (x.stride(0) % 8 or x.stride(2) % 8):
        # channel-last view whose strides causal-conv1d's channel-last kernel rejects: copy it channel-last
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif x.stride(1) != 1 and x.stride(2) != 1:
        x = x.contiguous()
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    return OrderedCausalConv1dFunction.apply(x, weight, bias, seq_idx, activation is not None)


# ------------------------------------------------------------------------------------------ rmsnorm
class OrderedGatedRMSNormFunction(torch.autograd.Function):
    """Gated RMSNorm (``layernorm_gated``) with the weight gradient folded over per-row-block partials."""

    @staticmethod
    def forward(ctx, x, weight, z, eps, group_size, norm_before_gate, rows_per_program):
        cb = _n._cb()
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        z2 = None
        if z is not None:
            z2 = z.reshape(-1, shape[-1])
            z2 = z2 if z2.stride(-1) == 1 else z2.contiguous()
        out, rstd = cb.launch_rmsnorm_gated_fwd(x2, weight.contiguous(), eps, z=z2, group_size=group_size,
                                                norm_before_gate=norm_before_gate)
        ctx.save_for_backward(x2, weight, z2, rstd)
        ctx.args = (eps, group_size, norm_before_gate, rows_per_program, shape)
        return out.reshape(shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2, weight, z2, rstd = ctx.saved_tensors
        eps, group_size, norm_before_gate, rpp, shape = ctx.args
        cb = _n._cb()
        dy2 = dy.reshape(-1, shape[-1])
        dy2 = dy2 if dy2.stride(-1) == 1 else dy2.contiguous()
        dx, dw_part, _, dz, _ = cb.launch_rmsnorm_gated_bwd(dy2, x2, weight.contiguous(), eps, rstd,
                                                            rows_per_program=rpp, z=z2, group_size=group_size,
                                                            norm_before_gate=norm_before_gate)
        dw = fold_dims(dw_part, 0, dtype=weight.dtype)
        return dx.reshape(shape), dw, (dz.reshape(shape) if z2 is not None else None), None, None, None, None


def ordered_gated_rmsnorm(x, weight, z=None, eps=1e-6, group_size=None, norm_before_gate=True, chunk_size=256):
    """``rmsnorm_fn`` with an ordered weight gradient. ``x``, ``z`` [B, L, D]; ``weight`` [D]. The row blocks
    of the weight-gradient partials are ``gcd(L, chunk_size)`` rows, so no block straddles two examples."""
    _require_cuda("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: expected a 3-d tensor [B, L, D], got shape {tuple(x.shape)}")
    rpp = _n._rows_per_program(x.shape[1], chunk_size)
    return OrderedGatedRMSNormFunction.apply(x, weight, z, eps, group_size or x.shape[-1], norm_before_gate, rpp)


# ------------------------------------------------------------------------------------------ SSD scan
class OrderedChunkScanFunction(torch.autograd.Function):
    """Ordered ``MambaChunkScanCombinedFn`` (no initial states, no final states)."""

    @staticmethod
    @custom_fwd
    def forward(ctx, x, dt, A, B, C, chunk_size, D, z, dt_bias, seq_idx, dt_softplus, dt_limit, literal):
        out, out_x, *_ = _n.ordered_chunk_scan_fwd(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                                   dt_softplus=dt_softplus, dt_limit=dt_limit, seq_idx=seq_idx)
        ctx.save_for_backward(out if z is None else out_x, x, dt, A, B, C, D, z, dt_bias, seq_idx)
        ctx.args = (chunk_size, dt_softplus, dt_limit, literal)
        return out

    @staticmethod
    @custom_bwd
    @once_differentiable
    def backward(ctx, dout):
        out, x, dt, A, B, C, D, z, dt_bias, seq_idx = ctx.saved_tensors
        chunk_size, dt_softplus, dt_limit, literal = ctx.args
        dx, ddt, dA, dB, dC, dD, dz, ddt_bias, _ = _n.ordered_chunk_scan_bwd(
            dout, x, dt, A, B, C, out, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
            dt_limit=dt_limit, seq_idx=seq_idx, literal=literal)
        dA = dA.to(A.dtype)
        dD = dD.to(D.dtype) if dD is not None else None
        ddt_bias = ddt_bias.to(dt_bias.dtype) if ddt_bias is not None else None
        return dx, ddt, dA, dB, dC, None, dD, dz, ddt_bias, None, None, None, None


def ordered_mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                      initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                      dt_limit=_NO_LIMIT, return_final_states=False, return_varlen_states=False,
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
    _not_supported(initial_states=initial_states, cu_seqlens=cu_seqlens, return_final_states=return_final_states,
                   return_varlen_states=return_varlen_states)
    _require_cuda("x", x)
    return OrderedChunkScanFunction.apply(x, dt, A, B, C, chunk_size, D, z, dt_bias, seq_idx, dt_softplus,
                                          tuple(dt_limit), literal)


# ------------------------------------------------------------------------------------- split conv scan
class OrderedSplitConv1dScanFunction(torch.autograd.Function):
    """Ordered ``MambaSplitConv1dScanCombinedFn``: conv1d + SSD + gated RMSNorm + out_proj."""

    @staticmethod
    @custom_fwd
    def forward(ctx, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx, dt_limit, activation,
                rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias, headdim, ngroups, norm_before_gate,
                literal):
        out, saved = _n.ordered_split_conv1d_scan_fwd(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx=seq_idx, dt_limit=dt_limit,
            activation=activation, rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=rmsnorm_eps,
            outproj_weight=outproj_weight, outproj_bias=outproj_bias, headdim=headdim, ngroups=ngroups,
            norm_before_gate=norm_before_gate)
        ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, saved["out_x"], A, D, dt_bias, seq_idx,
                              rmsnorm_weight, saved["rstd"], outproj_weight, outproj_bias)
        ctx.saved_meta = {k: v for k, v in saved.items() if k not in ("out_x", "rstd")}
        ctx.args = (chunk_size, dt_limit, activation, rmsnorm_eps, norm_before_gate, literal)
        return out

    @staticmethod
    @custom_bwd
    @once_differentiable
    def backward(ctx, dout):
        (zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, seq_idx, rmsnorm_weight, rstd, outproj_weight,
         outproj_bias) = ctx.saved_tensors
        chunk_size, dt_limit, activation, rmsnorm_eps, norm_before_gate, literal = ctx.args
        (dzxbcdt, dweight, dbias, ddt_bias, dA, dD, drms, dW, db) = _n.ordered_split_conv1d_scan_bwd(
            dout.contiguous() if dout.stride(-1) != 1 else dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D,
            dt_bias, chunk_size, saved=ctx.saved_meta, seq_idx=seq_idx, dt_limit=dt_limit, activation=activation,
            rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=rmsnorm_eps, rstd=rstd, outproj_weight=outproj_weight,
            outproj_bias=outproj_bias, norm_before_gate=norm_before_gate, literal=literal)
        return (dzxbcdt, dweight, dbias, ddt_bias, dA, dD, None, None, None, None, drms, None, dW, db, None, None, None,
                None)


def ordered_mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                             initial_states=None, seq_idx=None, dt_limit=_NO_LIMIT,
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
    _not_supported(initial_states=initial_states, return_final_states=return_final_states)
    _require_cuda("zxbcdt", zxbcdt)
    if outproj_bias is not None and outproj_weight is None:
        raise ValueError("outproj_bias: expected None when outproj_weight is None, got a tensor")
    if D.dim() == 1 and headdim is None:
        raise ValueError("headdim: required when D is 1-d ([H]), got None")
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    return OrderedSplitConv1dScanFunction.apply(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                                seq_idx, tuple(dt_limit), activation, rmsnorm_weight, rmsnorm_eps,
                                                outproj_weight, outproj_bias, headdim, ngroups, norm_before_gate,
                                                literal)


def split_conv1d_scan_partials(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, dout, *, literal=False,
                               **kwargs):
    """Forward + ordered backward without autograd, returning the per-example partials of every SSD parameter
    (``dA_partial``, ``ddt_bias_partial``, ``dD_partial``, ``drmsnorm_weight``, ``dconv1d_weight``,
    ``dconv1d_bias``; leading axis = example or sequence) and the folded gradients. For tests and debugging."""
    _, saved = _n.ordered_split_conv1d_scan_fwd(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                                **kwargs)
    kw = {k: v for k, v in kwargs.items() if k not in ("headdim", "ngroups")}
    grads, partials = _n.ordered_split_conv1d_scan_bwd(
        dout, zxbcdt, conv1d_weight, conv1d_bias, saved["out_x"], A, D, dt_bias, chunk_size, saved=saved,
        rstd=saved["rstd"], literal=literal, return_partials=True, **kw)
    return grads, partials


__all__ = [
    "ordered_linear", "ordered_causal_conv1d", "ordered_gated_rmsnorm", "ordered_mamba_chunk_scan_combined",
    "ordered_mamba_split_conv1d_scan_combined", "split_conv1d_scan_partials", "OrderedLinearFunction",
    "OrderedCausalConv1dFunction", "OrderedGatedRMSNormFunction", "OrderedChunkScanFunction",
    "OrderedSplitConv1dScanFunction",
]
