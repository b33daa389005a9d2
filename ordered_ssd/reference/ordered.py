"""Ordered gradients of the reference Mamba-2 layer (the CPU path of ``OrderedMamba2``).

Layers, as everywhere in ordered-ssd:

* composition: :func:`ordered_reference_mamba2_fwd` / :func:`ordered_reference_mamba2_bwd`,
  plain functions, testable without the autograd Function;
* autograd: :class:`OrderedReferenceMamba2Function` and the wrapper
  :func:`ordered_reference_mamba2`.

The backward computes, for each example ``b`` alone (a batch of one, the same shapes for every
``b``), the input gradient and the gradient of every parameter, and folds the parameter gradients
over ``b = 0, 1, ..., B-1`` with :class:`ordered_ssd.fold.LexicalFold`. Hence:

* the gradients are bitwise identical across repeats and processes (same torch build, same
  device type and thread count);
* the partial of example ``b`` does not depend on the other examples of the batch.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..fold import LexicalFold
from .naive import Mamba2Dims, Mamba2Params, reference_mamba2_layer

__all__ = [
    "ordered_reference_mamba2_fwd",
    "ordered_reference_mamba2_bwd",
    "OrderedReferenceMamba2Function",
    "ordered_reference_mamba2",
]


def ordered_reference_mamba2_fwd(u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
                                 seq_idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Forward of the layer, [B, L, d_model] -> [B, L, d_model], without building a graph."""
    with torch.no_grad():
        return reference_mamba2_layer(u, params, dims, seq_idx)


def ordered_reference_mamba2_bwd(
    dout: torch.Tensor, u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
    seq_idx: Optional[torch.Tensor] = None, needs_input_grad: bool = True,
    needs_param_grad: Optional[Tuple[bool, ...]] = None, return_partials: bool = False,
) -> Tuple[Optional[torch.Tensor], Mamba2Params, Optional[List[Mamba2Params]]]:
    """Backward of the layer with per-example partials folded in lexical order.

    Args:
        dout: [B, L, d_model], gradient of the output.
        u: [B, L, d_model], the layer input. params, dims, seq_idx: as in the forward.
        needs_input_grad: compute ``du``.
        needs_param_grad: one flag per field of :class:`Mamba2Params` (default: every parameter
            that is not None).
        return_partials: also return the per-example partials (a list over ``b`` of
            :class:`Mamba2Params`, None where not computed), as used by the independence tests.

    Returns:
        ``(du, grads, partials)``: ``du`` [B, L, d_model] or None; ``grads`` a
        :class:`Mamba2Params` of folded gradients (dtype of each parameter, None where not
        requested); ``partials`` or None.
    """
    if needs_param_grad is None:
        needs_param_grad = tuple(p is not None for p in params)
    wanted = [i for i, (p, need) in enumerate(zip(params, needs_param_grad)) if need and p is not None]
    folds = {i: LexicalFold(params[i].dtype) for i in wanted}
    du = torch.empty_like(u) if needs_input_grad else None
    partials: Optional[List[Mamba2Params]] = [] if return_partials else None
    Bsz = u.shape[0]
    for b in range(Bsz):
        with torch.enable_grad():
            u_b = u[b:b + 1].detach().requires_grad_(needs_input_grad)
            leaves = [p.detach().requires_grad_(i in folds) if p is not None else None
                      for i, p in enumerate(params)]
            out_b = reference_mamba2_layer(u_b, Mamba2Params(*leaves), dims,
                                           None if seq_idx is None else seq_idx[b:b + 1])
            inputs = ([u_b] if needs_input_grad else []) + [leaves[i] for i in wanted]
            if inputs:
                grads = torch.autograd.grad(out_b, inputs, dout[b:b + 1], allow_unused=True)
            else:
                grads = []
        if needs_input_grad:
            du[b:b + 1] = grads[0]
            grads = grads[1:]
        per_example = [None] * len(params)
        for i, g in zip(wanted, grads):
            if g is None:  # parameter does not reach the output (cannot happen for Mamba-2's parameters)
                g = torch.zeros_like(params[i])
            folds[i].add(g)
            per_example[i] = g
        if partials is not None:
            partials.append(Mamba2Params(*per_example))
    folded = [folds[i].result(like=params[i]) if i in folds else None for i in range(len(params))]
    return du, Mamba2Params(*folded), partials


class OrderedReferenceMamba2Function(torch.autograd.Function):
    """Autograd Function over the reference layer with the ordered (per-example, lexical) backward.

    ``forward(ctx, u, seq_idx, dims, *params)`` with ``params`` the ten fields of
    :class:`Mamba2Params` in order. Returns [B, L, d_model].
    """

    @staticmethod
    def forward(ctx, u, seq_idx, dims, *params):
        ctx.dims = dims
        ctx.has_seq_idx = seq_idx is not None
        ctx.save_for_backward(u, seq_idx, *params)
        return ordered_reference_mamba2_fwd(u, Mamba2Params(*params), dims, seq_idx)

    @staticmethod
    def backward(ctx, dout):
        u, seq_idx, *params = ctx.saved_tensors
        needs = ctx.needs_input_grad
        du, grads, _ = ordered_reference_mamba2_bwd(
            dout.contiguous(), u, Mamba2Params(*params), ctx.dims, seq_idx if ctx.has_seq_idx else None,
            needs_input_grad=needs[0], needs_param_grad=tuple(needs[3:]))
        return (du, None, None, *grads)


def ordered_reference_mamba2(u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
                             seq_idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Differentiable reference layer whose backward is ordered (see the module docstring).

    No argument checking happens here; :class:`ordered_ssd.OrderedMamba2` validates its inputs.
    """
    return OrderedReferenceMamba2Function.apply(u, seq_idx, dims, *params)
