"""A sequence's canonical computation on the reference path: the bits of a sequence are its own.

The canonical computation of a sequence of ``T`` tokens is the layer run on that sequence alone, chunk by chunk:
the sequence is zero-padded to ``nchunks * chunk_size`` positions, and chunk ``c`` (positions
``c * chunk_size`` to ``(c + 1) * chunk_size - 1``) is computed from its ``chunk_size`` rows, the conv inputs of the
``d_conv - 1`` positions before it and the SSM state entering it::

    zxbcdt_c = F.linear(u_c, in_proj)                       [chunk_size, d_in_proj]
    xBC_c    = silu(conv taps k = 0 .. d_conv - 1, then + bias)   (the taps reach back into the carry)
    y_c, S   = reference_chunk_scan(chunk c alone, initial_states=S)   (none for chunk 0)
    out_c    = F.linear(gate(norm(y_c), z_c), out_proj)     [chunk_size, d_model]

Every operation runs on tensors of the same shape for every chunk of every sequence (the matmuls always have
``chunk_size`` rows), so the bits of an output row depend only on the values the computation reads, never on the
layout the sequence came in. A position never reads a later one (the conv is causal, the scan's intra-chunk terms
of later positions are masked to zero, the norm is per row), so the real positions of a sequence have the same bits
whether what follows it in its chunk is zero padding (the sequence alone), other tokens (a right-padded row) or
nothing. Hence :func:`canonical_mamba2_layer` gives each sequence its canonical bits whether it is a row of a
batch of any size, a right-padded row, or one of several sequences packed into a row and marked by ``seq_idx``
(at any offset).

The ordered backward (:func:`canonical_mamba2_bwd`) differentiates each sequence alone, chunk by chunk
(:func:`canonical_mamba2_sequence_bwd`: each chunk's own graph, last chunk first, handed the gradients of its rows,
of the conv carry and of the state it passed on, zeros after the last chunk), so the order in which autograd adds
inside a chunk is the same in every layout. A sequence's partial of a parameter is the lexical fold of its chunks'
contributions, chunk 0 first; the gradient is the lexical fold of the sequences' partials in
:func:`sequence_spans` order. The chunks past a sequence's end in a right-padded row get a zero output gradient
(a loss that masks the padding) and contribute exact zeros, so the same sequences, in the same order, give the same
bits whether they come as rows, right-padded rows or packed rows (docs/guarantees.md, "A sequence's bits are its
own").

Scope: the reference path (fp32 or fp64, any device, the CPU path of ``OrderedMamba2``), one torch build, CPU
model and thread count (as every bit of the reference path). Source: ordered-ssd design, contract 9; the
arithmetic of each chunk is :func:`~ordered_ssd.reference.naive.reference_chunk_scan` and the pieces of
:func:`~ordered_ssd.reference.naive.reference_mamba2_layer`.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from ..fold import LexicalFold
from .naive import Mamba2Dims, Mamba2Params, reference_chunk_scan, reference_gated_rmsnorm

__all__ = ["sequence_spans", "conv_chunk", "chunked_graphs", "chunked_backward", "canonical_mamba2_sequence",
           "canonical_mamba2_sequence_bwd", "canonical_mamba2_layer", "canonical_mamba2_bwd", "canonical_mamba2_prefill",
           "canonical_mamba2_step"]


def sequence_spans(batch: int, seqlen: int, seq_idx: Optional[torch.Tensor] = None) -> List[Tuple[int, int, int]]:
    """The sequences of a layout, in their canonical order: ``(row, start, end)`` for rows ``0 .. batch - 1`` in
    order and, inside a row, one sequence per run of equal ``seq_idx`` values in order of position (the whole row
    without ``seq_idx``).

    Args: ``batch``, ``seqlen``: the layout's ``B`` and ``L``; ``seq_idx``: [B, L] integer ids or None.
    """
    if seq_idx is None:
        return [(b, 0, seqlen) for b in range(batch)]
    change = (seq_idx[:, 1:] != seq_idx[:, :-1]).cpu()
    spans = []
    for b in range(batch):
        starts = [0] + (torch.nonzero(change[b]).flatten() + 1).tolist() + [seqlen]
        spans.extend((b, s, e) for s, e in zip(starts[:-1], starts[1:]) if e > s)
    return spans


def conv_chunk(xBC_ext: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], rows: int) -> torch.Tensor:
    """Causal depthwise conv of ``rows`` positions from ``xBC_ext`` [W - 1 + rows, C] (the ``W - 1`` positions
    before the chunk first): taps ``k = 0 .. W - 1`` added in order, then the bias, then SiLU (the order of
    :func:`~ordered_ssd.reference.naive.reference_causal_conv1d`)."""
    out = None
    for k in range(weight.shape[-1]):
        term = xBC_ext[k:k + rows] * weight[:, k]
        out = term if out is None else out + term
    if bias is not None:
        out = out + bias
    return F.silu(out)


def _chunk(u_c: torch.Tensor, carry: torch.Tensor, state: Optional[torch.Tensor], params: Mamba2Params,
           dims: Mamba2Dims):
    """One chunk: ``u_c`` [chunk_size, d_model], ``carry`` [d_conv - 1, conv_dim] (the conv inputs before the chunk),
    ``state`` [1, H, P, N] entering it (None for a sequence's first chunk) -> ``(out_c, carry_out, state_out)``."""
    cs, W = dims.chunk_size, dims.d_conv
    H, P, G, N = dims.nheads, dims.headdim, dims.ngroups, dims.d_state
    A = -torch.exp(params.A_log)
    D = params.D.reshape(H, P) if dims.D_has_hdim else params.D
    zxbcdt = F.linear(u_c, params.in_proj_weight, params.in_proj_bias)
    z0, x0, z, xBC, dt = torch.split(zxbcdt, [dims.d_mlp, dims.d_mlp, dims.d_ssm, dims.conv_dim, H], dim=-1)
    xBC_ext = torch.cat([carry, xBC], dim=0)
    carry_out = xBC_ext[xBC_ext.shape[0] - (W - 1):]
    xBC = conv_chunk(xBC_ext, params.conv1d_weight.reshape(params.conv1d_weight.shape[0], W), params.conv1d_bias,
                      cs)
    x, B, C = torch.split(xBC, [dims.d_ssm, G * N, G * N], dim=-1)
    y, state_out = reference_chunk_scan(
        x.reshape(1, cs, H, P), dt.reshape(1, cs, H), A, B.reshape(1, cs, G, N), C.reshape(1, cs, G, N), cs,
        D=D, z=None if dims.rmsnorm else z.reshape(1, cs, H, P), dt_bias=params.dt_bias, dt_softplus=True,
        dt_limit=dims.dt_limit, initial_states=state, return_final_states=True)
    y = y.reshape(cs, dims.d_ssm)
    if dims.rmsnorm:
        y = reference_gated_rmsnorm(y, z, params.norm_weight, dims.norm_eps, dims.d_ssm // G, dims.norm_before_gate)
    if dims.d_mlp > 0:
        y = torch.cat([F.silu(z0) * x0, y], dim=-1)
    return F.linear(y, params.out_proj_weight, params.out_proj_bias), carry_out, state_out


def _padded_chunks(u: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``u`` [T, ...] zero-padded to ``nchunks * chunk_size`` rows, as [nchunks, chunk_size, ...]."""
    nchunks = -(-u.shape[0] // chunk_size)
    pad = u.new_zeros(nchunks * chunk_size - u.shape[0], *u.shape[1:])
    return torch.cat([u, pad], dim=0).reshape(nchunks, chunk_size, *u.shape[1:])


def chunked_graphs(chunk_fn, u: torch.Tensor, chunk_size: int, carry: torch.Tensor, needs_input_grad: bool,
                   extra: Optional[torch.Tensor] = None) -> list:
    """Run a sequence chunk by chunk with autograd, each chunk its own graph: ``chunk_fn(u_c, extra_c, carry,
    state) -> (out_c, carry_out, state_out)`` on ``u`` [T, ...] zero-padded to whole chunks (``extra`` [T, ...],
    e.g. a padding mask, the same way), from ``carry`` and no state. The rows, the carry and the state entering
    each chunk are detached leaves (the rows requiring grad with ``needs_input_grad``; the carry and the state
    from the second chunk on). Returns the list of ``(u_c, carry_in, state_in, out_c, carry_out, state_out)``."""
    graphs = []
    state = None
    extras = _padded_chunks(extra, chunk_size) if extra is not None else None
    with torch.enable_grad():
        for c, u_c in enumerate(_padded_chunks(u.detach(), chunk_size)):
            u_c = u_c.requires_grad_(needs_input_grad)
            carry_in = carry.detach().requires_grad_(c > 0)
            state_in = state.detach().requires_grad_(True) if state is not None else None
            out_c, carry, state = chunk_fn(u_c, None if extras is None else extras[c], carry_in, state_in)
            graphs.append((u_c, carry_in, state_in, out_c, carry, state))
    return graphs


def chunked_backward(graphs: list, dout: torch.Tensor, inputs: List[torch.Tensor], needs_input_grad: bool):
    """The ordered backward of :func:`chunked_graphs`' chunks: ``(du [T, ...] or None, [partial per input])``.

    The chunks are differentiated last first with ``torch.autograd.grad``, each handed the gradients of its output
    rows (``dout`` [T, ...], zero-padded), of the carry and of the state it passed on (zeros after the last chunk),
    so every chunk's graph and the order autograd adds in it are the same in every layout. An input's partial is
    the :class:`~ordered_ssd.fold.LexicalFold` of the chunks' contributions, chunk 0 first (zeros where an input
    does not reach a chunk), in its dtype's accumulation dtype, cast once to its dtype."""
    T, cs = dout.shape[0], graphs[0][0].shape[0]
    dout_chunks = _padded_chunks(dout, cs)
    dcarry, dstate = torch.zeros_like(graphs[-1][4]), torch.zeros_like(graphs[-1][5])
    du = dout.new_empty(len(graphs) * cs, *graphs[0][0].shape[1:]) if needs_input_grad else None
    contributions: List[List[torch.Tensor]] = [[] for _ in inputs]
    for c in range(len(graphs) - 1, -1, -1):
        u_c, carry_in, state_in, out_c, carry_out, state_out = graphs[c]
        leaves = ([u_c] if needs_input_grad else []) + ([carry_in, state_in] if c > 0 else []) + list(inputs)
        grads = list(torch.autograd.grad((out_c, carry_out, state_out), leaves,
                                         (dout_chunks[c].to(out_c.dtype), dcarry, dstate), allow_unused=True))
        if needs_input_grad:
            du[c * cs:(c + 1) * cs] = grads.pop(0)
        if c > 0:
            dcarry, dstate = grads.pop(0), grads.pop(0)
        for k, g in enumerate(grads):
            contributions[k].append(torch.zeros_like(inputs[k]) if g is None else g)
    partials = []
    for k, t in enumerate(inputs):
        fold = LexicalFold(t.dtype)
        for g in reversed(contributions[k]):  # chunk 0 first
            fold.add(g)
        partials.append(fold.result(like=t))
    return (du[:T] if du is not None else None), partials


def canonical_mamba2_sequence(u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims) -> torch.Tensor:
    """The layer on one sequence, chunk by chunk (the module docstring): ``u`` [T, d_model] -> [T, d_model].

    ``u`` and the parameters share a dtype (fp32 or fp64) and a device; differentiable with plain autograd (the
    ordered backward is :func:`canonical_mamba2_sequence_bwd`).
    """
    carry = u.new_zeros(dims.d_conv - 1, dims.conv_dim)
    state = None
    outs = []
    for u_c in _padded_chunks(u, dims.chunk_size):
        out_c, carry, state = _chunk(u_c, carry, state, params, dims)
        outs.append(out_c)
    return torch.cat(outs, dim=0)[:u.shape[0]]


def canonical_mamba2_sequence_bwd(dout: torch.Tensor, u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
                                  needs_input_grad: bool, wanted: List[int]):
    """The ordered backward of one sequence (:func:`chunked_graphs`, :func:`chunked_backward`):
    ``(du [T, d_model] or None, {field index: partial})``; ``wanted``: the indices of the fields of ``params``
    whose gradient is wanted."""
    leaves = [p.detach().requires_grad_(i in wanted) if p is not None else None for i, p in enumerate(params)]
    lp = Mamba2Params(*leaves)
    graphs = chunked_graphs(lambda u_c, _, carry, state: _chunk(u_c, carry, state, lp, dims), u, dims.chunk_size,
                            u.new_zeros(dims.d_conv - 1, dims.conv_dim), needs_input_grad)
    du, partials = chunked_backward(graphs, dout, [leaves[i] for i in wanted], needs_input_grad)
    return du, {i: g.to(params[i].dtype) for i, g in zip(wanted, partials)}


def canonical_mamba2_layer(u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
                           seq_idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The layer on a layout: each sequence of :func:`sequence_spans` computed alone
    (:func:`canonical_mamba2_sequence`). ``u`` [B, L, d_model] -> [B, L, d_model]; ``seq_idx`` [B, L] or None
    (then each row is one sequence)."""
    out = u.new_empty(*u.shape[:-1], params.out_proj_weight.shape[0])
    for b, s, e in sequence_spans(u.shape[0], u.shape[1], seq_idx):
        out[b, s:e] = canonical_mamba2_sequence(u[b, s:e], params, dims)
    return out


def canonical_mamba2_bwd(dout: torch.Tensor, u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
                         seq_idx: Optional[torch.Tensor] = None, needs_input_grad: bool = True,
                         needs_param_grad: Optional[Tuple[bool, ...]] = None, return_partials: bool = False):
    """The ordered backward of the layer on a layout: ``(du or None, Mamba2Params of gradients, partials or None)``.

    Each sequence of :func:`sequence_spans` is differentiated alone (:func:`canonical_mamba2_sequence_bwd`); a
    parameter's gradient is the :class:`~ordered_ssd.fold.LexicalFold` of the sequences' partials, the first
    sequence first, cast once. ``partials``: a list over the sequences of :class:`Mamba2Params` (None where not
    computed)."""
    if needs_param_grad is None:
        needs_param_grad = tuple(p is not None for p in params)
    wanted = [i for i, (p, need) in enumerate(zip(params, needs_param_grad)) if need and p is not None]
    folds = {i: LexicalFold(params[i].dtype) for i in wanted}
    du = torch.zeros_like(u) if needs_input_grad else None
    partials: Optional[list] = [] if return_partials else None
    for b, s, e in sequence_spans(u.shape[0], u.shape[1], seq_idx):
        du_s, parts = canonical_mamba2_sequence_bwd(dout[b, s:e], u[b, s:e], params, dims, needs_input_grad, wanted)
        if du is not None:
            du[b, s:e] = du_s
        for i, g in parts.items():
            folds[i].add(g)
        if partials is not None:
            partials.append(Mamba2Params(*(parts.get(i) for i in range(len(params)))))
    grads = Mamba2Params(*(folds[i].result(like=params[i]) if i in folds else None for i in range(len(params))))
    return du, grads, partials


# ------------------------------------------------------------------------------------------- parity decoding
def canonical_mamba2_prefill(u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims):
    """A prefill of one sequence with the canonical computation, and what a parity step needs to continue it:
    ``(out [T, d_model], state, carry, rows)``: the SSM state entering the sequence's current (last, partial or
    next) chunk ([1, H, P, N]; None while it is the first chunk), the conv inputs of the ``d_conv - 1`` positions
    before that chunk ([d_conv - 1, conv_dim]) and the current chunk's rows so far ([T % chunk_size, d_model]).
    Without autograd."""
    T, cs = u.shape[0], dims.chunk_size
    with torch.no_grad():
        carry = u.new_zeros(dims.d_conv - 1, dims.conv_dim)
        state = None
        outs = []
        for c, u_c in enumerate(_padded_chunks(u, cs)):
            out_c, carry_out, state_out = _chunk(u_c, carry, state, params, dims)
            outs.append(out_c)
            if (c + 1) * cs <= T:  # a whole chunk: the next one starts from its state and carry
                carry, state = carry_out, state_out
        nfull = T // cs
        return torch.cat(outs, dim=0)[:T], state, carry, u[nfull * cs:]


def canonical_mamba2_step(u_t: torch.Tensor, rows: torch.Tensor, state: Optional[torch.Tensor],
                          carry: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims):
    """One token of a sequence with the canonical computation: the current chunk (``rows`` [n, d_model] so far,
    then ``u_t`` [d_model], zero-padded) recomputed from the state and carry entering it. Returns
    ``(out_t [d_model], state, carry, rows)`` for the next token: when the chunk is whole, the state and carry
    after it and no rows. The output has the bits of the canonical forward over the whole sequence at this
    position (a position never reads a later one). Without autograd."""
    cs = dims.chunk_size
    n = rows.shape[0]
    with torch.no_grad():
        chunk = u_t.new_zeros(cs, u_t.shape[-1])
        chunk[:n] = rows
        chunk[n] = u_t
        out_c, carry_out, state_out = _chunk(chunk, carry, state, params, dims)
        if n + 1 == cs:
            return out_c[n], state_out, carry_out, chunk[:0]
        return out_c[n], state, carry, chunk[:n + 1]
