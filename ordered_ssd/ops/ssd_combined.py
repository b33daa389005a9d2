"""SSD (chunked state-space duality, Mamba-2 paper section 6), ordered.

Mirrors ``mamba_ssm/ops/triton/ssd_combined.py`` (mamba-ssm 2.3.2.post1), its ``mamba_chunk_scan_combined``; the
split-conv1d-scan layer of the same upstream file is :mod:`ordered_ssd.ops.ssd_split_conv1d`. Layers, as everywhere
in ordered-ssd:

* composition, plain functions without autograd: :func:`ordered_mamba_chunk_scan_combined_fwd` /
  :func:`ordered_mamba_chunk_scan_combined_bwd` (upstream ``_mamba_chunk_scan_combined_fwd/_bwd``); every kernel is
  launched through :mod:`csrc_bindings` at its pinned configuration, and every partial a kernel leaves per
  (example, chunk, tile) is reduced with :mod:`ordered_ssd.fold` in lexical order;
* custom op (``torch.library``, with a fake and with autograd through its ``*_backward`` custom op):
  ``ordered_ssd::mamba_chunk_scan_combined``;
* public function: :func:`ordered_mamba_chunk_scan_combined`.

Determinism (CUDA): the outputs and the gradients are bitwise identical across repeats, processes and restarts for
the same inputs, GPU model and versions of torch / triton / mamba-ssm / causal-conv1d; every gradient of a shared
parameter is a lexical fp32 fold over per-(example, chunk, tile) partials, cast once. ``literal=True`` computes the
same backward by launching the kernels once per example (a batch of one) and concatenating the partials before the
same folds; it gives the same bits (tested on the GPU). The custom op is once-differentiable (its backward is an
opaque custom op calling native kernels): a double backward raises ``RuntimeError``. It traces under
``torch.compile`` without a graph break and gives the eager bits there (``docs/compile.md``). Scope: CUDA tensors
with the native extras installed (``pip install --no-build-isolation mamba-ssm==2.3.2.post1
causal-conv1d==1.7.0``), else ``ImportError`` at the first launch.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

import csrc_bindings

from ..fold import dA_cumsum_grad_scans, fold_many
from .common import (NO_LIMIT, absent, as_dtype_of, auxiliary_outputs, autocast_context, autocast_dtype, call_op,
                     check_chunk_scan_args, check_states_args, or_none, ordered_custom_op, register_op_autograd,
                     require_cuda)

__all__ = ["ordered_mamba_chunk_scan_combined_fwd", "ordered_mamba_chunk_scan_combined_bwd",
           "ordered_mamba_chunk_scan_combined"]

# ------------------------------------------------------------------------------------------ composition: SSD
def _flat_state(t):
    """A state ``[..., P, N]`` as ``[..., P * N]``, the layout of the state-passing kernels (``reshape``)."""
    return t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1])


def _split_state(t, N):
    """``[..., P * N]`` back to ``[..., P, N]`` (``reshape``)."""
    return t.reshape(*t.shape[:-1], t.shape[-1] // N, N)


def ordered_mamba_chunk_scan_combined_fwd(x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None,
                                          dt_softplus=False, dt_limit=NO_LIMIT, seq_idx=None, initial_states=None,
                                          cu_seqlens=None):
    """SSD forward with pinned launches (no reductions across programs, so nothing to order).

    Args: x [B, L, H, P]; dt [B, L, H]; A [H] fp32; B, C [B, L, G, N]; D [H] or [H, P]; z [B, L, H, P];
    dt_bias [H]; seq_idx [B, L] int32; initial_states [B, H, P, N]; cu_seqlens [S + 1] int32 (B == 1, checked by
    the caller), for the varlen states.

    Returns:
        ``(out, out_x, dt_out, dA_cumsum, states, final_states)`` as upstream's
        ``_mamba_chunk_scan_combined_fwd``: out [B, L, H, P] (gated when z is given), out_x (ungated, None
        without z), dt_out / dA_cumsum [B, H, C, cs] fp32, states [B, C, H, P, N] (entering each chunk),
        final_states [B, H, P, N] fp32; with ``cu_seqlens`` also ``varlen_states`` [S, H, P, N] (the state at the
        end of each sequence, upstream's ``chunk_state_varlen``).
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
    init = _flat_state(initial_states) if initial_states is not None else None
    states, final_states = csrc_bindings.launch_state_passing_fwd(
        _flat_state(states), dA_cumsum[:, :, :, -1], initial_states=init, seq_idx=seq_idx,
        chunk_size=chunk_size, out_dtype=C.dtype)
    states = _split_state(states, N)
    final_states = _split_state(final_states, N)
    CB = csrc_bindings.launch_bmm_chunk_fwd(C, B, chunk_size, seq_idx=seq_idx, output_dtype=torch.float32)
    out, out_x = csrc_bindings.launch_chunk_scan_fwd(CB, x, dt_out, dA_cumsum, C, states, D=D, z=z, seq_idx=seq_idx)
    if cu_seqlens is None:
        return out, out_x, dt_out, dA_cumsum, states, final_states
    varlen_states = csrc_bindings.launch_chunk_state_varlen(B[0], x[0], dt_out[0], dA_cumsum[0], cu_seqlens,
                                                            states[0])
    if initial_states is not None and (seq_idx is None or int(seq_idx[0, 0]) == 0):
        # Upstream's kernel adds the state entering the last chunk only for a sequence that started before it; the
        # first sequence (id 0) also starts from the initial state when it ends inside chunk 0 (as the reference).
        end = int(cu_seqlens[1])
        if end <= chunk_size:
            decay = torch.exp(dA_cumsum[0, :, 0, end - 1])  # [H] fp32
            varlen_states[0] += (decay[:, None, None] * initial_states[0].float()).to(varlen_states.dtype)
    return out, out_x, dt_out, dA_cumsum, states, final_states, varlen_states


def _chunk_scan_bwd_pass(dout, x, dt, A, B, C, out, chunk_size, *, D, z, dt_bias, dt_softplus, dt_limit, seq_idx,
                         dx, ddt, dB, dC, dz, recompute_output, initial_states=None,
                         dfinal_states=None) -> Dict[str, Optional[torch.Tensor]]:
    """One pass of the SSD backward kernels over the given examples.

    Per-position outputs (dx, ddt, dB, dC, dz, outz) are written in place into the given buffers; per-position
    tile partials (ddt over headdim tiles, dA_cumsum terms over tiles, dB/dC/dCB over head splits) are folded
    here, elementwise, in tile order. The shared-parameter partials are returned unfolded:
    ``dA_partial``/``ddt_bias_partial`` [B, C, H] and ``dD_partial`` ([B, C, T, H, P] or [B, C, T, H, Tn]).
    ``dinitial_states`` [B, H, P, N] (dtype of x; None without ``initial_states``) is per example: one program per
    (example, head, tile) walks the chunks backwards, nothing is summed across examples.
    """
    Bsz, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    dt_in = dt.clone()
    dA_cumsum, dt_out = csrc_bindings.launch_chunk_cumsum_fwd(dt_in, A, chunk_size, dt_bias=dt_bias,
                                                              dt_softplus=dt_softplus, dt_limit=dt_limit)
    CB = csrc_bindings.launch_bmm_chunk_fwd(C, B, chunk_size, seq_idx=seq_idx, output_dtype=torch.float32)
    states = csrc_bindings.launch_chunk_state_fwd(B, x, dt_out, dA_cumsum, seq_idx=seq_idx, states_in_fp32=True)
    init = _flat_state(initial_states) if initial_states is not None else None
    states, _ = csrc_bindings.launch_state_passing_fwd(_flat_state(states),
                                                       dA_cumsum[:, :, :, -1], initial_states=init, seq_idx=seq_idx,
                                                       chunk_size=chunk_size)
    states = _split_state(states, N)
    dD_partial = None
    outz = None
    if z is not None:
        dz, dout, dD_partial, _, outz = csrc_bindings.launch_chunk_scan_bwd_dz(
            x, z, out, dout, chunk_size, D=D, has_ddAcs=False, recompute_output=recompute_output, dz=dz)
        if not recompute_output:
            outz = None
    dstates = csrc_bindings.launch_chunk_scan_bwd_dstates(C, dA_cumsum, dout, seq_idx=seq_idx, dtype=states.dtype)
    dstates, ddA_chunk_partial, dinit, states = csrc_bindings.launch_state_passing_bwd(
        _flat_state(states), dA_cumsum[:, :, :, -1], _flat_state(dstates),
        dfinal_states=_flat_state(dfinal_states) if dfinal_states is not None else None,
        seq_idx=seq_idx, has_initial_states=initial_states is not None, dstates_dtype=x.dtype, states_dtype=x.dtype,
        chunk_size=chunk_size)
    dinit = _split_state(dinit, N) if dinit is not None else None
    states = _split_state(states, N)
    dstates = _split_state(dstates, N)
    dx, ddt_partial, dD_from_x = csrc_bindings.launch_chunk_scan_chunk_state_bwd_dx(
        x, dt_out, dA_cumsum, B, CB, dout, dstates, D=D, seq_idx=seq_idx, dx=dx)
    dB_partial, ddA_next_partial = csrc_bindings.launch_chunk_state_bwd_db(x, dt_out, dA_cumsum, dstates, B=B,
                                                                           seq_idx=seq_idx, ngroups=G)
    dC_partial, ddA_prev_partial = csrc_bindings.launch_chunk_scan_bwd_dC(states.to(x.dtype), dA_cumsum, dout, C=C,
                                                                          seq_idx=seq_idx, ngroups=G)
    dcb_partial = csrc_bindings.launch_chunk_scan_bwd_dcb(x, dt_out, dA_cumsum, dout, seq_idx=seq_idx, ngroups=G)
    ddA_stable_partial = csrc_bindings.launch_chunk_scan_bwd_ddAcs_stable(x, dt_out, dA_cumsum, dout, CB)
    # Every tile fold of the pass in one launch (each output the same fp32 fold in tile order as fold_dims).
    ddt_dx, dCB, dB_fold, dC_fold, ddA_prev, ddA_chunk, ddA_next, ddA = fold_many([
        (ddt_partial, -1),  # [B, H, C, cs] fp32, headdim tiles in order
        (dcb_partial, 2),  # head splits in order
        (dB_partial, 2),  # [B, L, G, N] fp32
        (dC_partial, 2),
        (ddA_prev_partial, -1),  # [B, H, C, cs]
        (ddA_chunk_partial, -1),
        (ddA_next_partial, -1),
        (ddA_stable_partial, 3)])
    dCB = dCB.to(CB.dtype)
    csrc_bindings.launch_bmm_chunk_bwd(C, dCB, residual=dB_fold, out=dB)
    csrc_bindings.launch_bmm_chunk_bwd(B, dCB.transpose(-1, -2), residual=dC_fold, out=dC)
    if z is None:
        dD_partial = dD_from_x
    # dA_cumsum gradient, as upstream assembles it, with every tile sum and scan done in a fixed order.
    ddA = dA_cumsum_grad_scans(ddA, ddA_prev, ddA_chunk, ddA_next)  # one launch on CUDA
    _, dA_partial, ddt_bias_partial = csrc_bindings.launch_chunk_cumsum_bwd(
        ddA, ddt_dx, dt_in, A, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit, ddt=ddt)
    return {"dx": dx, "ddt": ddt, "dB": dB, "dC": dC, "dz": dz, "outz": outz, "dA_partial": dA_partial,
            "ddt_bias_partial": ddt_bias_partial, "dD_partial": dD_partial, "dinitial_states": dinit}


_PARTIALS = ("dA_partial", "ddt_bias_partial", "dD_partial")


def parameter_folds(partials, D, dt_bias) -> list:
    """The :func:`~ordered_ssd.fold.fold_many` requests of the SSD parameters' gradients ``[dA, ddt_bias, dD]``
    (fp32 folds over (example, chunk[, tile]); None for an absent ``dt_bias`` / ``D``) from the partials of
    :func:`ordered_mamba_chunk_scan_combined_bwd`."""
    dD = None
    if D is not None:
        p = partials["dD_partial"]  # [B, C, T, H, P] (D [H, P]) or [B, C, T, H, Tn] (D [H])
        dD = (p, (0, 1, 2) if D.dim() == 2 else (0, 1, 2, 4))
    return [(partials["dA_partial"], (0, 1)),
            (partials["ddt_bias_partial"], (0, 1)) if dt_bias is not None else None, dD]


def ordered_mamba_chunk_scan_combined_bwd(dout, x, dt, A, B, C, out, chunk_size, *, D=None, z=None, dt_bias=None,
                                          dt_softplus=False, dt_limit=NO_LIMIT, seq_idx=None, initial_states=None,
                                          dfinal_states=None, dx=None, ddt=None, dB=None, dC=None, dz=None,
                                          recompute_output=False, literal=False, return_partials=False,
                                          fold=True):
    """Ordered SSD backward.

    Args: as upstream's ``_mamba_chunk_scan_combined_bwd`` (``out`` is the ungated scan output; ``initial_states``
    [B, H, P, N] as in the forward, ``dfinal_states`` [B, H, P, N] the gradient of the final states); ``dx``,
    ``ddt``, ``dB``, ``dC``, ``dz`` optional output buffers (may be strided views of one ``dzxbcdt``).
    ``literal``: launch every kernel once per example (the reference the fast path is tested against).

    Returns:
        ``(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states, outz)`` with ``dA`` [H], ``dD`` [H] or [H, P]
        and ``ddt_bias`` [H] fp32 lexical folds over (example, chunk[, tile]); ``dinitial_states`` [B, H, P, N]
        (dtype of x, per example, no fold; None without ``initial_states``); with ``return_partials`` also a dict of
        the unfolded partials (leading axis = example). ``fold=False`` leaves ``dA``, ``dD``, ``ddt_bias`` None
        for a caller that folds the partials itself (:func:`parameter_folds`, with its own in one launch).
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
                                   dC=dC, dz=dz, initial_states=initial_states, dfinal_states=dfinal_states, **kw)
        if outz is not None:
            outz.copy_(res["outz"])
        partials = {k: res[k] for k in _PARTIALS}
        dinit = res["dinitial_states"]
    else:
        parts = {k: [] for k in (*_PARTIALS, "dinitial_states")}

        def one(t, s):
            return None if t is None else t[s]
        for b in range(Bsz):
            s = slice(b, b + 1)
            res = _chunk_scan_bwd_pass(dout[s], x[s], dt[s], A, B[s], C[s], out[s], chunk_size, z=one(z, s),
                                       seq_idx=one(seq_idx, s), dx=dx[s], ddt=ddt[s], dB=dB[s], dC=dC[s],
                                       dz=one(dz, s), initial_states=one(initial_states, s),
                                       dfinal_states=one(dfinal_states, s), **kw)
            if outz is not None:
                outz[s].copy_(res["outz"])
            for k in parts:
                parts[k].append(res[k])
        partials = {k: (torch.cat(v, 0) if v[0] is not None else None) for k, v in parts.items()}
        dinit = partials.pop("dinitial_states")
    dA = ddt_bias = dD = None
    if fold:
        dA, ddt_bias, dD = fold_many(parameter_folds(partials, D, dt_bias))
    result = (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinit, outz)
    return (result, partials) if return_partials else result


# ---------------------------------------------------------------------------------------------- custom op
def dense(t):
    """A fresh contiguous tensor like ``t`` (the fakes' outputs), None for None."""
    return torch.empty_like(t, memory_format=torch.contiguous_format) if t is not None else None


def _chunk_scan_body(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                     chunk_size: int, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                     dt_bias: Optional[torch.Tensor],
                     initial_states: Optional[torch.Tensor], seq_idx: Optional[torch.Tensor],
                     cu_seqlens: Optional[torch.Tensor], dt_softplus: bool, dt_limit: List[float],
                     return_final_states: bool, return_varlen_states: bool, literal: bool,
                     autocast: Optional[torch.dtype]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, out_x, final_states, varlen_states)``: out [B, L, H, P] (gated with z); out_x the ungated output
    (:func:`absent` without z); final_states [B, H, P, N] fp32 (always computed by the forward); varlen_states
    [S, H, P, N] (dtype of C) with ``return_varlen_states``, else :func:`absent`."""
    with autocast_context(autocast):
        out, out_x, _, _, _, final_states, *rest = ordered_mamba_chunk_scan_combined_fwd(
            x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
            dt_limit=tuple(dt_limit), seq_idx=seq_idx, initial_states=initial_states,
            cu_seqlens=cu_seqlens if return_varlen_states else None)
    return (out.contiguous(), (out_x.contiguous() if z is not None else absent(x)), final_states.contiguous(),
            (rest[0].contiguous() if return_varlen_states else absent(x)))


_chunk_scan = ordered_custom_op("mamba_chunk_scan_combined", _chunk_scan_body)


@_chunk_scan.register_fake
def _(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit,
      return_final_states, return_varlen_states, literal, autocast):
    Bsz, _, H, P = x.shape
    final_states = x.new_empty((Bsz, H, P, B.shape[-1]), dtype=torch.float32)
    varlen_states = (C.new_empty((cu_seqlens.shape[0] - 1, H, P, B.shape[-1])) if return_varlen_states
                     else absent(x))
    return dense(x), (dense(x) if z is not None else absent(x)), final_states, varlen_states


def _chunk_scan_backward_body(dout: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                              C: torch.Tensor, out: torch.Tensor, chunk_size: int, D: Optional[torch.Tensor],
                              z: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
                              initial_states: Optional[torch.Tensor], dfinal_states: Optional[torch.Tensor],
                              seq_idx: Optional[torch.Tensor], dt_softplus: bool, dt_limit: List[float], literal: bool,
                              autocast: Optional[torch.dtype]) -> List[torch.Tensor]:
    """``[dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states]``, each in its input's dtype (:func:`absent` for
    a None input)."""
    with autocast_context(autocast):
        grads = ordered_mamba_chunk_scan_combined_bwd(
            dout, x, dt, A, B, C, out, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
            dt_limit=tuple(dt_limit), seq_idx=seq_idx, initial_states=initial_states, dfinal_states=dfinal_states,
            literal=literal)[:9]
    return as_dtype_of(grads, (x, dt, A, B, C, D, z, dt_bias, initial_states), x)


_chunk_scan_backward = ordered_custom_op("mamba_chunk_scan_combined_backward", _chunk_scan_backward_body)


@_chunk_scan_backward.register_fake
def _(dout, x, dt, A, B, C, out, chunk_size, D, z, dt_bias, initial_states, dfinal_states, seq_idx, dt_softplus,
      dt_limit, literal, autocast):
    return [dense(t) if t is not None else absent(x) for t in (x, dt, A, B, C, D, z, dt_bias, initial_states)]


def _chunk_scan_setup_context(ctx, inputs, output):
    (x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit,
     return_final_states, return_varlen_states, literal, autocast) = inputs
    out, out_x, final_states, varlen_states = output
    ctx.save_for_backward(out if z is None else out_x, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx,
                          final_states)
    auxiliary_outputs(ctx, out_x, varlen_states)
    ctx.args = (chunk_size, dt_softplus, dt_limit, return_final_states, return_varlen_states, literal, autocast)


def _chunk_scan_bwd(backward, ctx, dout, _dout_x, dfinal_states, _dvarlen_states):
    out, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, final_states = ctx.saved_tensors
    chunk_size, dt_softplus, dt_limit, return_final_states, return_varlen_states, literal, autocast = ctx.args
    if return_varlen_states:
        raise NotImplementedError("ordered_mamba_chunk_scan_combined: no backward with return_varlen_states=True "
                                  "(as upstream); run the forward without it to train")
    # Gradients of returned outputs that did not reach the loss are zeros, as autograd materialised them for the
    # former autograd.Function (final_states is returned to the caller only with return_final_states).
    if dout is None:
        dout = torch.zeros_like(out)
    if not return_final_states:
        dfinal_states = None
    elif dfinal_states is None:
        dfinal_states = torch.zeros_like(final_states)
    dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinit = backward(
        dout, x, dt, A, B, C, out, chunk_size, D, z, dt_bias, initial_states, dfinal_states, seq_idx, dt_softplus,
        dt_limit, literal, autocast)
    return (dx, ddt, dA, dB, dC, None, or_none(dD, D), or_none(dz, z), or_none(ddt_bias, dt_bias),
            or_none(dinit, initial_states), None, None, None, None, None, None, None, None)


_ChunkScanFunction = register_op_autograd(_chunk_scan, _chunk_scan_body, _chunk_scan_setup_context, _chunk_scan_bwd,
                                          _chunk_scan_backward, _chunk_scan_backward_body)


# --------------------------------------------------------------------------------------------- public function
def ordered_mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                                      initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                                      dt_limit=NO_LIMIT, return_final_states=False, return_varlen_states=False,
                                      *, literal=False):
    """Ordered ``mamba_chunk_scan_combined`` (SSD, paper section 6; native ``_chunk_*`` Triton kernels).

    Args:
        x: [B, L, H, P]; dt: [B, L, H]; A: [H] (fp32, negative); B, C: [B, L, G, N]; chunk_size: int;
        D: [H] or [H, P]; z: [B, L, H, P] (``y * silu(z)``); dt_bias: [H]; seq_idx: [B, L] int32;
        dt_softplus, dt_limit: as upstream. ``literal``: per-example kernel launches in the backward.
        initial_states: [B, H, P, N] (any float dtype), the state before position 0, of the sequence with id 0
            (upstream's kernels); differentiable: its gradient is per example (one program per example, head and
            tile walks the chunks backwards; no sum across examples), bitwise repeatable.
        return_final_states: also return the state after position L - 1, [B, H, P, N] fp32 (differentiable).
        cu_seqlens: [S + 1] int32 offsets of S packed sequences in one example (B == 1), strictly increasing from 0
            to L, matching ``seq_idx``; read only with ``return_varlen_states``.
        return_varlen_states: also return the state at the end of each sequence, [S, H, P, N] (dtype of C; no
            backward, as upstream: calling backward raises ``NotImplementedError``).

    Returns:
        ``out`` [B, L, H, P] (dtype of x); with the flags, as upstream: ``(out, final_states)``,
        ``(out, varlen_states)`` or ``(out, final_states, varlen_states)``.

    Raises:
        TypeError / ValueError (naming the argument, before any kernel;
            :func:`~ordered_ssd.ops.common.check_chunk_scan_args`): a non-tensor, a dtype outside fp32/fp16/bf16, a
            wrong rank, shape or device (all tensors on x's device), ``chunk_size`` not an int >= 1 (any such int:
            the kernels mask the last chunk tile, so no power of two is needed), a tensor of the CUDA path reaching
            2**31 elements (32-bit offsets); ``initial_states`` not floating, of another shape or device;
            ``cu_seqlens`` not a 1-d integer tensor on x's device, not starting at 0, not strictly increasing, not
            ending at L, with B != 1 or ids of ``seq_idx`` changing elsewhere; ``return_varlen_states`` without
            ``cu_seqlens``; then ValueError for non-CUDA tensors. NaN/inf values are not checked: they propagate.
    """
    check_chunk_scan_args(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, seq_idx=seq_idx,
                          dt_limit=dt_limit)
    check_states_args(x.shape, B.shape[-1], x.device, initial_states, cu_seqlens, seq_idx, return_varlen_states)
    require_cuda("x", x)
    return_final_states, return_varlen_states = bool(return_final_states), bool(return_varlen_states)
    out, _, final_states, varlen_states = call_op(
        _chunk_scan, _ChunkScanFunction, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
        cu_seqlens if return_varlen_states else None, bool(dt_softplus), [float(v) for v in dt_limit],
        return_final_states, return_varlen_states, bool(literal), autocast_dtype(x))
    extra = ((final_states,) if return_final_states else ()) + ((varlen_states,) if return_varlen_states else ())
    return (out, *extra) if extra else out
