"""The reference path of :class:`~ordered_ssd.hf.OrderedHFMamba2Mixer` without a cache: each sequence computed
alone, chunk by chunk, with the ordered backward of :mod:`ordered_ssd.reference.canonical` (docs/guarantees.md,
"A sequence's bits are its own").

Two entries with the same bits:

* eager: the autograd Function :class:`_CanonicalMixer`, whose forward keeps each chunk's graph for the backward
  (nothing is recomputed, so a LoRA dropout inside a projection draws once);
* under ``torch.compile``: the custom ops ``ordered_ssd::hf_canonical_mixer`` and its backward (opaque to the
  compiler, traced with ``fullgraph=True``), which recompute the chunks' graphs in the backward. A mixer holding an
  active dropout is refused there (a recomputed dropout would draw another mask).

The ops find their mixer through a registry of weak references keyed by ``id(mixer)`` (a custom op takes no
module), filled by :func:`register_mixer` at conversion, when a mixer is copied or unpickled, and at each eager
call. A second backward through one forward raises (the first used up the chunks' graphs).
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from torch.autograd.function import once_differentiable

from ..fold import LexicalFold
from ..reference.canonical import chunked_backward, chunked_graphs, sequence_spans
from ..reference.ordered import _NAMESPACE, OP_TAGS, _autograd_inside_custom_op

__all__ = ["canonical_mixer_forward", "register_mixer"]

_MIXERS: Dict[int, "weakref.ReferenceType[nn.Module]"] = {}


def _trainable(mixer) -> List[torch.Tensor]:
    return [p for p in mixer.parameters() if p.requires_grad]


def _carry(mixer, u):
    spec = mixer._ordered_spec
    return u.new_zeros(spec.d_conv - 1, spec.d_ssm + 2 * spec.ngroups * spec.d_state)


def _graphs(mixer, u, mask, seq_idx, needs_input_grad: bool, build: bool):
    """``[(b, s, e, graphs)]`` per sequence, and the output [B, L, d_model]."""
    spec = mixer._ordered_spec
    carry = _carry(mixer, u)
    out, pieces = None, []
    for b, s, e in sequence_spans(u.shape[0], u.shape[1], seq_idx):
        extra = mask[b, s:e] if mask is not None else None
        if build:
            graphs = chunked_graphs(mixer._chunk, u[b, s:e], spec.chunk_size, carry, needs_input_grad, extra)
            y = torch.cat([g[3].detach() for g in graphs], dim=0)[:e - s]
            pieces.append((b, s, e, graphs))
        else:
            with torch.no_grad():
                graphs = chunked_graphs(mixer._chunk, u[b, s:e], spec.chunk_size, carry, False, extra)
            y = torch.cat([g[3] for g in graphs], dim=0)[:e - s]
        if out is None:
            out = u.new_empty(*u.shape[:2], y.shape[-1], dtype=y.dtype)
        out[b, s:e] = y
    return pieces, out


def _backward(pieces, dout, u_shape, u_dtype, params: List[torch.Tensor], need_u: bool, wanted: List[int]):
    """``(du or None, [gradient or None per parameter])``: the chunks of every sequence differentiated, each
    parameter's sequence partials folded in sequence order (``LexicalFold``, cast once)."""
    folds = {k: LexicalFold(params[k].dtype) for k in wanted}
    du = dout.new_zeros(u_shape, dtype=u_dtype) if need_u else None
    for b, s, e, graphs in pieces:
        du_s, parts = chunked_backward(graphs, dout[b, s:e], [params[k] for k in wanted], need_u)
        if du is not None:
            du[b, s:e] = du_s
        for k, g in zip(wanted, parts):
            folds[k].add(g)
    return du, [folds[k].result(like=params[k]) if k in folds else None for k in range(len(params))]


class _CanonicalMixer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mixer, u, mask, seq_idx, *params):
        pieces, out = _graphs(mixer, u, mask, seq_idx, bool(ctx.needs_input_grad[1]), any(ctx.needs_input_grad))
        ctx.pieces, ctx.params, ctx.u_meta = pieces, params, (u.shape, u.dtype)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        if ctx.pieces is None:
            raise RuntimeError("OrderedHFMamba2Mixer (reference path): a second backward through the same forward is "
                               "not supported (the first one used up the chunks' graphs); run the forward again")
        wanted = [k for k in range(len(ctx.params)) if ctx.needs_input_grad[4 + k]]
        du, grads = _backward(ctx.pieces, dout, *ctx.u_meta, ctx.params, bool(ctx.needs_input_grad[1]), wanted)
        ctx.pieces = None
        return (None, du, None, None, *grads)


def _mixer_of(key: int):
    ref = _MIXERS.get(key)
    mixer = ref() if ref is not None else None
    if mixer is None:
        raise RuntimeError(f"ordered_ssd::hf_canonical_mixer: the mixer {key} of this graph no longer exists")
    return mixer


@torch.library.custom_op(f"{_NAMESPACE}::hf_canonical_mixer", mutates_args=(), tags=OP_TAGS)
def _canonical_op(u: torch.Tensor, mask: Optional[torch.Tensor], seq_idx: Optional[torch.Tensor],
                  params: List[torch.Tensor], key: int) -> torch.Tensor:
    return _graphs(_mixer_of(key), u, mask, seq_idx, False, False)[1]


@_canonical_op.register_fake
def _(u, mask, seq_idx, params, key):
    return u.new_empty(*u.shape[:2], _mixer_of(key)._ordered_spec.d_model)


@torch.library.custom_op(f"{_NAMESPACE}::hf_canonical_mixer_backward", mutates_args=(), tags=OP_TAGS)
def _canonical_backward_op(dout: torch.Tensor, u: torch.Tensor, mask: Optional[torch.Tensor],
                           seq_idx: Optional[torch.Tensor], params: List[torch.Tensor], key: int,
                           needs_grad: List[bool]) -> List[torch.Tensor]:
    """``[du, *grads]`` (an empty tensor where not computed); the mixer's trainable parameters are ``params``."""
    mixer = _mixer_of(key)
    live = _trainable(mixer)
    wanted = [k for k, need in enumerate(needs_grad[1:]) if need]
    with _autograd_inside_custom_op():
        pieces, _ = _graphs(mixer, u, mask, seq_idx, needs_grad[0], True)
        du, grads = _backward(pieces, dout.contiguous(), u.shape, u.dtype, live, needs_grad[0], wanted)
    return [t.contiguous() if t is not None else u.new_empty((0,)) for t in (du, *grads)]


@_canonical_backward_op.register_fake
def _(dout, u, mask, seq_idx, params, key, needs_grad):
    return [torch.empty_like(t, memory_format=torch.contiguous_format) if need else u.new_empty((0,))
            for t, need in zip((u, *params), needs_grad)]


def _setup_context(ctx, inputs, output):
    u, mask, seq_idx, params, key = inputs
    ctx.save_for_backward(u, mask, seq_idx, *params)
    ctx.key = key


def _op_backward(ctx, dout):
    u, mask, seq_idx, *params = ctx.saved_tensors
    needs = ctx.needs_input_grad
    needs_grad = [bool(needs[0])] + [bool(needs[3])] * len(params)
    grads = _canonical_backward_op(dout, u, mask, seq_idx, params, ctx.key, needs_grad)
    return (grads[0] if needs_grad[0] else None, None, None,
            [g if need else None for g, need in zip(grads[1:], needs_grad[1:])], None)


_canonical_op.register_autograd(_op_backward, setup_context=_setup_context)


def canonical_mixer_forward(mixer, u: torch.Tensor, mask: Optional[torch.Tensor],
                            seq_idx: Optional[torch.Tensor]) -> torch.Tensor:
    """The mixer's canonical forward (the module docstring): ``u`` [B, L, d_model] -> [B, L, d_model].

    Raises: NotImplementedError: under ``torch.compile``, a mixer holding a dropout in training mode."""
    params = _trainable(mixer) if torch.is_grad_enabled() else []
    if not torch.compiler.is_compiling():
        register_mixer(mixer)
        return _CanonicalMixer.apply(mixer, u, mask, seq_idx, *params)
    if any(isinstance(m, nn.Dropout) and m.p > 0 and m.training for m in mixer.modules()):
        raise NotImplementedError(f"{type(mixer).__name__}: torch.compile of the reference path (the CPU) with a "
                                  "dropout inside the mixer (e.g. a LoRA dropout) is not supported: its backward "
                                  "recomputes the forward, which would draw another dropout mask; run it eagerly, "
                                  "or set the dropout to 0")
    return _canonical_op(u, mask, seq_idx, params, id(mixer))


def register_mixer(mixer) -> None:
    """Make ``mixer`` findable by the custom ops (at conversion: a registration while dynamo traces would be
    deferred past the trace)."""
    _MIXERS[id(mixer)] = weakref.ref(mixer)
