"""Gated RMSNorm (``mamba_ssm.ops.triton.layernorm_gated``) with an ordered weight gradient.

Layers: composition (:func:`ordered_rmsnorm_gated_fwd`, :func:`ordered_rmsnorm_gated_bwd`; plain functions on
rows [M, N], no autograd) → the custom op ``ordered_ssd::gated_rmsnorm`` (fake, autograd through
``ordered_ssd::gated_rmsnorm_backward``) → :func:`ordered_gated_rmsnorm`.

Determinism: the backward kernel writes one fp32 weight-gradient partial per block of
:func:`~ordered_ssd.fold.rmsnorm_rows_per_program` rows (rows summed in order inside the block, no block straddling
two examples), and the partials are folded in block order (:func:`ordered_ssd.fold.fold_dims`). Source:
``_layer_norm_fwd_1pass_kernel`` / ``_layer_norm_bwd_kernel`` with ``IS_RMS_NORM=True``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

import csrc_bindings

from ..fold import fold_dims, rmsnorm_rows_per_program
from .common import (absent, as_dtype_of, autocast_context, autocast_dtype, auxiliary_outputs, call_op, or_none,
                     ordered_custom_op, register_op_autograd, require_cuda)

__all__ = ["ordered_rmsnorm_gated_fwd", "ordered_rmsnorm_gated_bwd", "ordered_gated_rmsnorm"]


# ------------------------------------------------------------------------------------------------ composition
def ordered_rmsnorm_gated_fwd(x, weight, eps, *, z=None, group_size, norm_before_gate, out=None):
    """``(out, rstd)`` for rows ``x``/``z`` [M, N] (stride 1 last), ``weight`` [N]; ``out`` may be given."""
    return csrc_bindings.launch_rmsnorm_gated_fwd(x, weight, eps, z=z, group_size=group_size,
                                                  norm_before_gate=norm_before_gate, out=out)


def ordered_rmsnorm_gated_bwd(dy, x, weight, eps, rstd, *, rows_per_program, z=None, group_size, norm_before_gate,
                              recompute_output=False, dz=None, out=None, examples: Optional[int] = None,
                              fold: bool = True):
    """Backward on rows [M, N]: ``(dx, dweight, dz, out, dweight_partial)``.

    ``dweight`` is the fp32 fold of ``dweight_partial`` [R, N] (one row per block of ``rows_per_program`` rows, in
    row order), cast once to ``weight.dtype``. ``dz``/``out`` (the recomputed forward output, with
    ``recompute_output``) are written into the given buffers. ``examples``: None for one launch over all rows, or
    the number of examples ``E`` (``M = E * L``) to launch once per example (the literal mode: the same partials,
    the same bits). ``fold=False`` leaves ``dweight`` None (a caller that folds ``dweight_partial`` itself, as
    ``fold_dims(dweight_partial, 0, dtype=weight.dtype)``, with others in one launch).

    Raises:
        ValueError: ``examples`` does not divide the rows; shapes the kernel rejects (from :mod:`csrc_bindings`).
    """
    common = dict(rows_per_program=rows_per_program, group_size=group_size, norm_before_gate=norm_before_gate,
                  recompute_output=recompute_output)
    if examples is None:
        dx, dweight_partial, _, dz, out = csrc_bindings.launch_rmsnorm_gated_bwd(dy, x, weight, eps, rstd, z=z, dz=dz,
                                                                                 out=out, **common)
    else:
        if examples < 1 or dy.shape[0] % examples:
            raise ValueError(f"examples: expected a positive divisor of the {dy.shape[0]} rows, got {examples}")
        rows = dy.shape[0] // examples
        dx = torch.empty_like(dy)
        if z is not None and dz is None:
            dz = torch.empty_like(z)
        if recompute_output and out is None:
            out = torch.empty_like(x)
        pieces = []
        norm_groups = rstd.shape[0] // dy.shape[0] if dy.shape[0] else 1
        rstd_by_group = rstd.view(norm_groups, dy.shape[0]) if norm_groups > 1 else rstd.view(1, dy.shape[0])
        for b in range(examples):
            r = slice(b * rows, (b + 1) * rows)
            dx_b, dweight_b, _, _, _ = csrc_bindings.launch_rmsnorm_gated_bwd(
                dy[r], x[r], weight, eps, rstd_by_group[:, r].reshape(-1).contiguous(), z=None if z is None else z[r],
                dz=None if dz is None else dz[r], out=None if out is None else out[r], **common)
            dx[r].copy_(dx_b)
            pieces.append(dweight_b)
        dweight_partial = torch.cat(pieces, 0)
    dweight = fold_dims(dweight_partial, 0, dtype=weight.dtype) if fold else None
    return dx, dweight, dz, out, dweight_partial


# --------------------------------------------------------------------------------------------- custom op
def _rows(t):
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _gated_rmsnorm_body(x: torch.Tensor, weight: torch.Tensor, z: Optional[torch.Tensor], eps: float, group_size: int,
                        norm_before_gate: bool, chunk_size: int,
                        autocast: Optional[torch.dtype]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out [B, L, D] in x.dtype, rstd [(D / group_size) * B * L] fp32)``; ``chunk_size`` is for the backward."""
    with autocast_context(autocast):
        out, rstd = ordered_rmsnorm_gated_fwd(_rows(x), weight.contiguous(), eps,
                                              z=_rows(z) if z is not None else None, group_size=group_size,
                                              norm_before_gate=norm_before_gate)
    return out.reshape(x.shape).contiguous(), rstd


_gated_rmsnorm = ordered_custom_op("gated_rmsnorm", _gated_rmsnorm_body)


@_gated_rmsnorm.register_fake
def _(x, weight, z, eps, group_size, norm_before_gate, chunk_size, autocast):
    rows = x.numel() // x.shape[-1]
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(((x.shape[-1] // group_size) * rows,), dtype=torch.float32))


def _gated_rmsnorm_backward_body(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, z: Optional[torch.Tensor],
                                 rstd: torch.Tensor, eps: float, group_size: int, norm_before_gate: bool,
                                 chunk_size: int, autocast: Optional[torch.dtype]
                                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with autocast_context(autocast):
        dx, dweight, dz, _, _ = ordered_rmsnorm_gated_bwd(
            _rows(dy), _rows(x), weight.contiguous(), eps, rstd,
            rows_per_program=rmsnorm_rows_per_program(x.shape[1], chunk_size),
            z=_rows(z) if z is not None else None, group_size=group_size, norm_before_gate=norm_before_gate)
    dx = dx.reshape(x.shape)
    dz = dz.reshape(x.shape) if z is not None else None
    return tuple(as_dtype_of((dx, dweight, dz), (x, weight, z), x))


_gated_rmsnorm_backward = ordered_custom_op("gated_rmsnorm_backward", _gated_rmsnorm_backward_body)


@_gated_rmsnorm_backward.register_fake
def _(dy, x, weight, z, rstd, eps, group_size, norm_before_gate, chunk_size, autocast):
    def like(t):
        return torch.empty_like(t, memory_format=torch.contiguous_format) if t is not None else absent(x)
    return like(x), like(weight), like(z)


def _gated_rmsnorm_setup_context(ctx, inputs, output):
    x, weight, z, eps, group_size, norm_before_gate, chunk_size, autocast = inputs
    ctx.save_for_backward(x, weight, z, output[1])
    auxiliary_outputs(ctx, output[1])
    ctx.args = (eps, group_size, norm_before_gate, chunk_size, autocast)


def _gated_rmsnorm_bwd(backward, ctx, dy, _drstd):
    x, weight, z, rstd = ctx.saved_tensors
    dx, dweight, dz = backward(dy, x, weight, z, rstd, *ctx.args)
    return dx, dweight, or_none(dz, z), None, None, None, None, None


_GatedRmsnormFunction = register_op_autograd(_gated_rmsnorm, _gated_rmsnorm_body, _gated_rmsnorm_setup_context,
                                             _gated_rmsnorm_bwd, _gated_rmsnorm_backward, _gated_rmsnorm_backward_body)


# --------------------------------------------------------------------------------------------- public function
def ordered_gated_rmsnorm(x, weight, z=None, eps=1e-6, group_size=None, norm_before_gate=True, chunk_size=256):
    """``rmsnorm_fn`` (``layernorm_gated``) with an ordered weight gradient.

    Args:
        x, z: [B, L, D] CUDA tensors (``z`` the gate, or None). weight: [D]. eps: float. group_size: the norm's
            group (default D). norm_before_gate: as upstream. chunk_size: the layer's chunk size; the row blocks
            of the weight-gradient partials are ``gcd(L, chunk_size)`` rows, so no block straddles two examples.

    Returns:
        [B, L, D], the dtype of ``x``.

    Raises:
        TypeError: ``x`` is not a tensor. ValueError: ``x`` not on CUDA or not 3-d; shapes the kernel rejects.
    """
    require_cuda("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: expected a 3-d tensor [B, L, D], got shape {tuple(x.shape)}")
    return call_op(_gated_rmsnorm, _GatedRmsnormFunction, x, weight, z, eps, group_size or x.shape[-1],
                   norm_before_gate, chunk_size, autocast_dtype(x))[0]
