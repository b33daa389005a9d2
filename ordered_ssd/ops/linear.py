"""The linear layers of Mamba2 (``in_proj``, ``out_proj``) with ordered weight and bias gradients.

Layers: composition (:func:`ordered_linear_fwd`, :func:`ordered_linear_bwd`, :func:`ordered_linear_weight_grad`;
plain functions, no autograd) → the custom op ``ordered_ssd::linear`` (fake, autograd through the custom op
``ordered_ssd::linear_backward``) → :func:`ordered_linear`. Under CUDA autocast the op returns its casts of ``x``
and ``weight`` beside the output, and the backward uses them (one cast per operand and step, as native autocast).

Determinism: ``dW = fold_b(dy_b^T x_b)`` and ``db = fold_b(fold_l(dy_b))``, fp32 lexical folds over examples
(example 0 first, :mod:`ordered_ssd.fold`), cast once; bitwise identical across repeats, processes and restarts
for the same inputs, GPU model and versions. Source: ``torch.nn.functional.linear`` forward; the input gradient
is the plain GEMM ``dy W`` (no sum across examples).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ..fold import (LINEAR_GROUP_BYTES, fold_example_gemms, fold_example_gemms_grouped, fold_example_sums,
                    linear_weight_grad_is_fused)
from .row_invariant_gemm import row_invariant_linear, row_invariant_matmul
from .common import (absent, as_dtype_of, autocast_casts, autocast_context, autocast_dtype, auxiliary_outputs, call_op,
                     cast_copy, or_none, ordered_custom_op, register_op_autograd)

__all__ = ["ordered_linear_fwd", "ordered_linear_input_grad", "ordered_linear_bwd", "ordered_linear_weight_grad", "ordered_linear"]


# ------------------------------------------------------------------------------------------------ composition
def ordered_linear_fwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       row_invariant: bool = False):
    """``y = x W^T + b``, computed in the CUDA autocast dtype when autocast is on (like ``F.linear``); with
    ``row_invariant`` by :func:`~ordered_ssd.ops.row_invariant_gemm.row_invariant_linear` (a row's bits do not
    depend on the number of rows), else by ``F.linear``.

    Returns ``(y, x, weight)``: the output and the (possibly cast) operands the backward needs.
    """
    autocast = autocast_dtype(x)
    if autocast is not None:
        x, weight = x.to(autocast), weight.to(autocast)
        bias = bias.to(autocast) if bias is not None else None
    if row_invariant:
        return row_invariant_linear(x, weight, bias), x, weight
    return F.linear(x, weight, bias), x, weight


def ordered_linear_input_grad(dy: torch.Tensor, weight: torch.Tensor, row_invariant: bool = False) -> torch.Tensor:
    """``dx = dy W`` (dy ``[..., out]``, weight ``[out, in]``): ``F.linear(dy, W^T)``, or with ``row_invariant``
    the row-invariant GEMM (a row of ``dx`` depends on that row of ``dy`` alone)."""
    if row_invariant:
        rows = dy.reshape(-1, dy.shape[-1])
        return row_invariant_matmul(rows, weight).reshape(*dy.shape[:-1], weight.shape[1])
    return F.linear(dy, weight.t())


def ordered_linear_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, *, need_dx: bool = True,
                       need_dweight: bool = True, has_bias: bool = False, row_invariant: bool = False):
    """``(dx, dW, db)``: ``dx = dy W`` (None unless ``need_dx``; :func:`ordered_linear_input_grad`); ``dW``,
    ``db`` fp32 ordered folds (:func:`ordered_linear_weight_grad`; None unless ``need_dweight``; ``db`` None without
    a bias)."""
    dx = ordered_linear_input_grad(dy, weight, row_invariant) if need_dx else None
    dW = db = None
    if need_dweight:
        dW, db = ordered_linear_weight_grad(dy, x, torch.float32, torch.float32 if has_bias else None)
    return dx, dW, db


def ordered_linear_weight_grad(dy: torch.Tensor, x: torch.Tensor, weight_dtype: torch.dtype,
                               bias_dtype: Optional[torch.dtype] = None, *,
                               group_bytes: int = LINEAR_GROUP_BYTES) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``dW`` = the lexical fold of per-example (on CUDA per-(example, segment)) partials ``dy_b^T x_b``, and
    ``db = fold_b(fold_l(dy_b))`` over examples, example 0 first.

    Args: dy [B, L, out]; x [B, L, in]; ``weight_dtype`` / ``bias_dtype``: dtypes of the results (no bias
    gradient when ``bias_dtype`` is None); ``group_bytes``: see :data:`~ordered_ssd.fold.LINEAR_GROUP_BYTES`.

    Two algorithms, chosen by :func:`~ordered_ssd.fold.linear_weight_grad_is_fused` from the device type and
    dtypes alone (never the batch size):

    - fused (CUDA, bf16/fp16/fp32, any ``L``): :func:`~ordered_ssd.fold.fold_example_gemms`, one Triton launch at a
      pinned configuration whatever ``B``: the lexical fold of per-(example, segment) fp32 partials, example 0's
      first (segments of :data:`~ordered_ssd.fold.GEMM_FOLD_SEGMENT_L` positions; one per example up to that
      length), each computed from its segment alone; the programs hand the running sum on in segment order;
    - per example (fp64, off CUDA): :func:`~ordered_ssd.fold.fold_example_gemms_grouped`, one GEMM in the
      accumulation dtype per example into a slot of a group buffer, each group folded into the running sum by one
      :func:`~ordered_ssd.fold.fold_dims` launch: the bits of :class:`~ordered_ssd.fold.LexicalFold` over
      per-example partials, example 0 first, whatever the group size.

    The bias partial of an example is a fold over its positions in order, and those are folded over examples
    (:func:`~ordered_ssd.fold.fold_example_sums`: two launches on CUDA).
    Runs under ``torch.no_grad()``: the result is not differentiable (the Functions that call it are
    once-differentiable).

    Returns:
        ``(dW [out, in] in weight_dtype, db [out] in bias_dtype or None)``.
    """
    with torch.no_grad():  # a backward helper; ``mm(out=...)`` refuses inputs that require grad
        if linear_weight_grad_is_fused(dy, weight_dtype):
            dW = fold_example_gemms(dy, x).to(weight_dtype)
        else:
            dW = fold_example_gemms_grouped(dy, x, weight_dtype, group_bytes)
        # per example a fold over its positions in order, those folded over examples (two launches on CUDA)
        db = fold_example_sums(dy, bias_dtype) if bias_dtype is not None else None
        return dW, db


# --------------------------------------------------------------------------------------------- custom op
def _linear_body(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 autocast: Optional[torch.dtype], row_invariant: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, x_cast, weight_cast)``: the output, and the operands as the forward cast them to the autocast dtype
    (:func:`cast_copy`; :func:`absent` where no cast happened), returned only to be saved: the backward reuses the
    forward's casts instead of casting again, as native autocast keeps its cast weight for the backward."""
    with autocast_context(autocast):
        y, xc, wc = ordered_linear_fwd(x, weight, bias, row_invariant)
    return y.contiguous(), cast_copy(xc, x), cast_copy(wc, weight)


_linear = ordered_custom_op("linear", _linear_body)


@_linear.register_fake
def _(x, weight, bias, autocast, row_invariant):
    def cast(t):
        return t.new_empty(t.shape, dtype=autocast) if autocast_casts(t, autocast) else absent(x)
    y = x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=autocast if autocast is not None else x.dtype)
    return y, cast(x), cast(weight)


def _linear_backward_body(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                          autocast: Optional[torch.dtype], row_invariant: bool, need_dx: bool,
                          need_dweight: bool, x_dtype: torch.dtype,
                          weight_cast: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dW, db)`` in the dtypes of ``x`` (``x_dtype``: ``x`` may be the forward's cast of it), ``weight`` and
    ``bias``. ``weight_cast``: the forward's cast of ``weight`` (None: ``weight`` is used as it is, or cast here)."""
    with autocast_context(autocast):
        xc = x.to(autocast) if autocast is not None else x  # no copy: the forward's cast, or already that dtype
        wc = weight_cast if weight_cast is not None else (weight.to(autocast) if autocast is not None else weight)
        dx, dW, db = ordered_linear_bwd(dy, xc, wc, need_dx=need_dx, need_dweight=need_dweight,
                                        has_bias=bias is not None, row_invariant=row_invariant)
    return tuple(as_dtype_of((dx, dW, db), (x_dtype, weight, bias), dy))


_linear_backward = ordered_custom_op("linear_backward", _linear_backward_body)


@_linear_backward.register_fake
def _(dy, x, weight, bias, autocast, row_invariant, need_dx, need_dweight, x_dtype, weight_cast):
    def grad(t, dtype, need):
        return t.new_empty(t.shape, dtype=dtype) if need and t is not None else absent(dy)
    return (grad(x, x_dtype, need_dx), grad(weight, weight.dtype, need_dweight),
            grad(bias, bias.dtype if bias is not None else None, need_dweight))


def _linear_setup_context(ctx, inputs, output):
    x, weight, bias, autocast, row_invariant = inputs
    _, x_cast, weight_cast = output
    # the forward's casts stand for the operands: an input the forward cast is not kept for the backward
    ctx.save_for_backward(x_cast if autocast_casts(x, autocast) else x, weight, bias,
                          weight_cast if autocast_casts(weight, autocast) else None)
    auxiliary_outputs(ctx, x_cast, weight_cast)
    ctx.autocast, ctx.x_dtype, ctx.row_invariant = autocast, x.dtype, row_invariant


def _linear_bwd(backward, ctx, dy, _dx_cast=None, _dweight_cast=None):
    x, weight, bias, weight_cast = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dW, db = backward(dy, x, weight, bias, ctx.autocast, ctx.row_invariant, need[0], need[1] or need[2],
                          ctx.x_dtype, weight_cast)
    return or_none(dx, need[0]), or_none(dW, need[1]), or_none(db, bias is not None and need[2]), None, None


_LinearFunction = register_op_autograd(_linear, _linear_body, _linear_setup_context, _linear_bwd, _linear_backward,
                                       _linear_backward_body)


# --------------------------------------------------------------------------------------------- public function
def ordered_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                   row_invariant: bool = False) -> torch.Tensor:
    """Linear layer with ordered weight/bias gradients.

    Args:
        x: [B, L, in] (the example axis first), any float dtype, on the device of ``weight``.
        weight: [out, in]. bias: [out] or None.
        row_invariant: compute ``y`` and ``dx`` with the row-count-invariant GEMM
            (:mod:`ordered_ssd.ops.row_invariant_gemm`: a row's bits depend on that row alone, not on ``B * L``)
            instead of cuBLAS (``F.linear``, the default: native's bits, chosen by shape).

    Returns:
        [B, L, out]. Under CUDA autocast, computed in the autocast dtype like ``F.linear``; the fp32 gradient folds
        are cast once to the parameters' dtype.

    Raises:
        TypeError: ``x`` is not a tensor, ``row_invariant`` not a bool. ValueError: ``x`` is not 3-d.

    Determinism: ``dW``/``db`` are fp32 lexical folds over examples (:func:`ordered_linear_weight_grad`).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor [B, L, in], got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"x: expected a 3-d tensor [B, L, in], got shape {tuple(x.shape)}")
    if not isinstance(row_invariant, bool):
        raise TypeError(f"row_invariant: expected a bool, got {type(row_invariant).__name__}")
    return call_op(_linear, _LinearFunction, x, weight, bias, autocast_dtype(x), row_invariant)[0]
