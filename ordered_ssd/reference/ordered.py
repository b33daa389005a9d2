"""Ordered gradients of the reference Mamba-2 layer (the CPU path of ``OrderedMamba2``).

Layers, as everywhere in ordered-ssd:

* composition: :func:`ordered_reference_mamba2_fwd` / :func:`ordered_reference_mamba2_bwd`,
  plain functions, testable without the autograd Function;
* the custom op ``ordered_ssd::reference_mamba2`` (``torch.library``; a fake, and autograd through the custom op
  ``ordered_ssd::reference_mamba2_backward``), opaque to ``torch.compile`` so that a compiled layer runs exactly
  the eager computation, and the wrapper :func:`ordered_reference_mamba2`.

The forward computes each sequence of the layout alone, chunk by chunk (:mod:`~ordered_ssd.reference.canonical`).
The backward computes, for each sequence alone (each row, or each run of ``seq_idx`` in a row), chunk by chunk,
the input gradient and each parameter's partial, and folds the partials over the sequences in order (rows in order,
inside a row by position) with :class:`ordered_ssd.fold.LexicalFold`. Mamba-3's reference layer uses
:func:`per_example_ordered_bwd` (each example alone). Hence:

* the gradients are bitwise identical across repeats and processes (same torch build, same
  device type and thread count);
* the partial of a sequence does not depend on the other sequences, nor on the layout it came in: its outputs,
  its input gradient and its partials have its canonical bits as a row of any batch, a right-padded row (with a
  zero output gradient on the padding) or packed with others by ``seq_idx``.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import List, Optional, Tuple

import torch

from ..fold import LexicalFold
from .canonical import canonical_mamba2_bwd, canonical_mamba2_layer
from .naive import Mamba2Dims, Mamba2Params

__all__ = [
    "per_example_ordered_bwd",
    "ordered_reference_mamba2_fwd",
    "ordered_reference_mamba2_bwd",
    "ordered_reference_mamba2",
]


def ordered_reference_mamba2_fwd(u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
                                 seq_idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Forward of the layer, [B, L, d_model] -> [B, L, d_model], without building a graph: each sequence of the
    layout (each row, or each run of ``seq_idx`` in a row) computed alone, chunk by chunk
    (:func:`~ordered_ssd.reference.canonical.canonical_mamba2_layer`), so its bits are its own."""
    with torch.no_grad():
        return canonical_mamba2_layer(u, params, dims, seq_idx)


def ordered_reference_mamba2_bwd(
    dout: torch.Tensor, u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
    seq_idx: Optional[torch.Tensor] = None, needs_input_grad: bool = True,
    needs_param_grad: Optional[Tuple[bool, ...]] = None, return_partials: bool = False,
) -> Tuple[Optional[torch.Tensor], Mamba2Params, Optional[List[Mamba2Params]]]:
    """Backward of the layer with per-sequence partials folded in lexical order (the sequences of
    :func:`~ordered_ssd.reference.canonical.sequence_spans`: rows in order, inside a row by position).

    Args:
        dout: [B, L, d_model], gradient of the output.
        u: [B, L, d_model], the layer input. params, dims, seq_idx: as in the forward.
        needs_input_grad: compute ``du``.
        needs_param_grad: one flag per field of :class:`Mamba2Params` (default: every parameter
            that is not None).
        return_partials: also return the per-sequence partials (a list over the sequences of
            :class:`Mamba2Params`, None where not computed), as used by the independence tests.

    Returns:
        ``(du, grads, partials)``: ``du`` [B, L, d_model] or None; ``grads`` a
        :class:`Mamba2Params` of folded gradients (dtype of each parameter, None where not
        requested); ``partials`` or None.
    """
    return canonical_mamba2_bwd(dout, u, params, dims, seq_idx, needs_input_grad, needs_param_grad, return_partials)


def per_example_ordered_bwd(layer_of_example, dout: torch.Tensor, u: torch.Tensor, params: tuple,
                            needs_input_grad: bool = True, needs_param_grad: Optional[Tuple[bool, ...]] = None,
                            return_partials: bool = False):
    """The ordered backward of a reference layer (Mamba-2's and Mamba-3's): for each example ``b`` alone,
    ``torch.autograd.grad`` of ``layer_of_example(b, u[b:b+1], leaves)`` (``leaves``: ``params`` detached, the
    wanted ones requiring grad) against ``dout[b:b+1]``; ``du[b]`` written in place, each parameter's gradient
    added to a :class:`~ordered_ssd.fold.LexicalFold` (example 0 first, cast once).

    Args:
        params: a NamedTuple of parameters (None for an absent one); the results use its type.
        needs_param_grad: one flag per field (default: every parameter that is not None).
    Returns:
        ``(du or None, params' type of folded gradients (None where not asked), per-example partials or None)``.
    """
    cls = type(params)
    if needs_param_grad is None:
        needs_param_grad = tuple(p is not None for p in params)
    wanted = [i for i, (p, need) in enumerate(zip(params, needs_param_grad)) if need and p is not None]
    folds = {i: LexicalFold(params[i].dtype) for i in wanted}
    du = torch.empty_like(u) if needs_input_grad else None
    partials: Optional[list] = [] if return_partials else None
    for b in range(u.shape[0]):
        with torch.enable_grad():
            u_b = u[b:b + 1].detach().requires_grad_(needs_input_grad)
            leaves = [p.detach().requires_grad_(i in folds) if p is not None else None
                      for i, p in enumerate(params)]
            out_b = layer_of_example(b, u_b, leaves)
            inputs = ([u_b] if needs_input_grad else []) + [leaves[i] for i in wanted]
            grads = list(torch.autograd.grad(out_b, inputs, dout[b:b + 1], allow_unused=True)) if inputs else []
        if needs_input_grad:
            du[b:b + 1] = grads.pop(0)
        per_example = [None] * len(params)
        for i, g in zip(wanted, grads):
            if g is None:  # a parameter that does not reach the output
                g = torch.zeros_like(params[i])
            folds[i].add(g)
            per_example[i] = g
        if partials is not None:
            partials.append(cls(*per_example))
    folded = [folds[i].result(like=params[i]) if i in folds else None for i in range(len(params))]
    return du, cls(*folded), partials


# --------------------------------------------------------------------------------------------- custom op
_NAMESPACE = "ordered_ssd"  # as ordered_ssd.ops.common.NAMESPACE (this package imports nothing from the CUDA path)
OP_TAGS = (torch.Tag.needs_exact_strides,)  # as ordered_ssd.ops.common.OP_TAGS
_AUTOGRAD_KEYS = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality)
                  | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradOther)
                  | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradNestedTensor)
                  | torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView))


@contextlib.contextmanager
def _autograd_inside_custom_op():
    """Let autograd record again inside a custom op's body, where torch excludes the autograd dispatch keys.

    The ordered backward differentiates the reference layer per example with ``torch.autograd.grad``; inside the
    backward custom op that needs the autograd keys back (``torch.func.vjp`` would work too, but gives other bits
    than ``torch.autograd.grad`` for some inputs, and the bits of this path are recorded in
    ``tests/data/layer_digests.json``). Uses torch's dispatch-key TLS guard; restores the state on exit.
    """
    exclude = torch._C._dispatch_tls_local_exclude_set()
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude - _AUTOGRAD_KEYS):
        yield


def _dims_args(dims: Mamba2Dims) -> tuple:
    return (dims.d_model, dims.d_inner, dims.d_ssm, dims.headdim, dims.ngroups, dims.d_state, dims.d_conv,
            dims.chunk_size, [float(v) for v in dims.dt_limit], dims.rmsnorm, dims.norm_before_gate,
            float(dims.norm_eps), dims.D_has_hdim)


def _dims_of(d_model, d_inner, d_ssm, headdim, ngroups, d_state, d_conv, chunk_size, dt_limit, rmsnorm,
             norm_before_gate, norm_eps, D_has_hdim) -> Mamba2Dims:
    return Mamba2Dims(d_model=d_model, d_inner=d_inner, d_ssm=d_ssm, headdim=headdim, ngroups=ngroups,
                      d_state=d_state, d_conv=d_conv, chunk_size=chunk_size, dt_limit=tuple(dt_limit),
                      rmsnorm=rmsnorm, norm_before_gate=norm_before_gate, norm_eps=norm_eps, D_has_hdim=D_has_hdim)


@torch.library.custom_op(f"{_NAMESPACE}::reference_mamba2", mutates_args=(), tags=OP_TAGS)
def _reference_mamba2(u: torch.Tensor, seq_idx: Optional[torch.Tensor], in_proj_weight: torch.Tensor,
                      in_proj_bias: Optional[torch.Tensor], conv1d_weight: torch.Tensor,
                      conv1d_bias: Optional[torch.Tensor], dt_bias: torch.Tensor, A_log: torch.Tensor, D: torch.Tensor,
                      norm_weight: Optional[torch.Tensor], out_proj_weight: torch.Tensor,
                      out_proj_bias: Optional[torch.Tensor], d_model: int, d_inner: int, d_ssm: int, headdim: int,
                      ngroups: int, d_state: int, d_conv: int, chunk_size: int, dt_limit: List[float], rmsnorm: bool,
                      norm_before_gate: bool, norm_eps: float, D_has_hdim: bool) -> torch.Tensor:
    params = Mamba2Params(in_proj_weight, in_proj_bias, conv1d_weight, conv1d_bias, dt_bias, A_log, D, norm_weight,
                          out_proj_weight, out_proj_bias)
    dims = _dims_of(d_model, d_inner, d_ssm, headdim, ngroups, d_state, d_conv, chunk_size, dt_limit, rmsnorm,
                    norm_before_gate, norm_eps, D_has_hdim)
    with torch.autocast(u.device.type, enabled=False):  # as under torch.compile, where the body runs without it
        return ordered_reference_mamba2_fwd(u, params, dims, seq_idx).contiguous()


@_reference_mamba2.register_fake
def _(u, seq_idx, in_proj_weight, *rest):
    out_proj_weight = rest[7]
    return u.new_empty((*u.shape[:-1], out_proj_weight.shape[0]))


@torch.library.custom_op(f"{_NAMESPACE}::reference_mamba2_backward", mutates_args=(), tags=OP_TAGS)
def _reference_mamba2_backward(dout: torch.Tensor, u: torch.Tensor, seq_idx: Optional[torch.Tensor],
                               params: List[Optional[torch.Tensor]], needs_grad: List[bool], d_model: int,
                               d_inner: int, d_ssm: int, headdim: int, ngroups: int, d_state: int, d_conv: int,
                               chunk_size: int, dt_limit: List[float], rmsnorm: bool, norm_before_gate: bool,
                               norm_eps: float, D_has_hdim: bool) -> List[torch.Tensor]:
    """``[du, *grads]`` (the ten fields of :class:`Mamba2Params`); an empty tensor where not computed."""
    dims = _dims_of(d_model, d_inner, d_ssm, headdim, ngroups, d_state, d_conv, chunk_size, dt_limit, rmsnorm,
                    norm_before_gate, norm_eps, D_has_hdim)
    with _autograd_inside_custom_op(), torch.autocast(u.device.type, enabled=False):
        du, grads, _ = ordered_reference_mamba2_bwd(dout.contiguous(), u, Mamba2Params(*params), dims, seq_idx,
                                                    needs_input_grad=needs_grad[0],
                                                    needs_param_grad=tuple(needs_grad[1:]))
    return [g.contiguous() if g is not None else u.new_empty((0,)) for g in (du, *grads)]


def backward_op_fake(dout, u, extra, params, needs_grad, *dims):
    """The fake of a reference layer's backward op (``[du, *grads]``, an empty tensor where not computed)."""
    return [torch.empty_like(t, memory_format=torch.contiguous_format) if t is not None and need else u.new_empty((0,))
            for t, need in zip((u, *params), needs_grad)]


def register_reference_autograd(op, backward_op, n_params: int) -> None:
    """Register ``op``'s autograd (``op(u, extra, *n_params parameters, *dims)``, ``extra`` a tensor or None that
    takes no gradient: ``seq_idx``, ``cu_seqlens``) through ``backward_op(dout, u, extra, params, needs_grad,
    *dims)``, which returns ``[du, *grads]``."""
    def setup_context(ctx, inputs, output):
        u, extra, *rest = inputs
        ctx.save_for_backward(u, extra, *rest[:n_params])
        ctx.dims = rest[n_params:]

    def backward(ctx, dout):
        u, extra, *params = ctx.saved_tensors
        needs = ctx.needs_input_grad
        needs_grad = [needs[0]] + [bool(n) and p is not None for n, p in zip(needs[2:2 + n_params], params)]
        grads = backward_op(dout, u, extra, params, needs_grad, *ctx.dims)
        return (grads[0] if needs_grad[0] else None, None,
                *(g if need else None for g, need in zip(grads[1:], needs_grad[1:])), *([None] * len(ctx.dims)))

    op.register_autograd(backward, setup_context=setup_context)


_reference_mamba2_backward.register_fake(backward_op_fake)
register_reference_autograd(_reference_mamba2, _reference_mamba2_backward, len(Mamba2Params._fields))


#: Whether :func:`warn_if_autocast` has warned in this process (it warns once).
_AUTOCAST_WARNED = False


def warn_if_autocast(u: torch.Tensor) -> None:
    """Warn, once per process, when autocast is on for ``u``'s device type: the reference path does not autocast.

    Its custom ops run their bodies with autocast off (as under ``torch.compile``, where a custom op's body runs
    without it), so the layer computes in ``u``'s dtype (fp32 or fp64, the parameters') and returns that dtype,
    with the bits of a run without autocast. Not checked while ``torch.compile`` traces."""
    global _AUTOCAST_WARNED
    if _AUTOCAST_WARNED or u.device.type not in ("cpu", "cuda") or torch.compiler.is_compiling():
        return
    if not torch.is_autocast_enabled(u.device.type):
        return
    _AUTOCAST_WARNED = True
    warnings.warn(
        f"ordered-ssd: torch.autocast is on for {u.device.type!r} (dtype "
        f"{torch.get_autocast_dtype(u.device.type)}), but the reference path (OrderedMamba2 and OrderedMamba3 on "
        f"the CPU and in fp64) does not autocast: it computes the forward and the ordered backward in the input's "
        f"dtype, {u.dtype}, returns {u.dtype}, and gives the bits of a run without autocast. Shown once per "
        f"process (docs/guarantees.md, \"Autocast\").", UserWarning, stacklevel=3)


def ordered_reference_mamba2(u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
                             seq_idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Differentiable reference layer whose backward is ordered (see the module docstring): the custom op
    ``ordered_ssd::reference_mamba2`` (traced by ``torch.compile`` without a graph break, run as in eager mode).

    No argument checking happens here; :class:`ordered_ssd.OrderedMamba2` validates its inputs. Under autocast it
    computes in ``u``'s dtype all the same, and warns once per process (:func:`warn_if_autocast`).
    """
    warn_if_autocast(u)
    return _reference_mamba2(u, seq_idx, *params, *_dims_args(dims))
