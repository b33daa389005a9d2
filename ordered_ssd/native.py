"""Composition: the ordered forward and backward of Mamba-2's SSD and split-conv1d-scan on the native kernels.

Every kernel is launched through :mod:`csrc_bindings` with a pinned configuration; every partial that a
kernel leaves per (example, chunk, tile) is reduced here with :mod:`ordered_ssd.fold` in lexical order.
These are plain functions (no autograd): :mod:`ordered_ssd.functions` wraps them.

``literal=True`` computes the same backward by launching the kernels once per example (a batch of one)
and concatenating the partials before the same folds; the fast path (one launch for the whole batch) must
give the same bits (tested on the GPU).

Source: mamba-ssm 2.3.2.post1 ``ssd_combined._mamba_chunk_scan_combined_fwd/_bwd`` and
``MambaSplitConv1dScanCombinedFn``; the order of operations mirrors them, only the reductions differ.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from einops import rearrange

from .fold import GEMM_FOLD_CONFIGS, LexicalFold, accumulation_dtype, fold_dims, fold_example_gemms, lexical_cumsum

_NO_LIMIT = (0.0, float("inf"))


def _cb():
    import csrc_bindings

    return csrc_bindings


# --------------------------------------------------------------------------------------------------- SSD
def ordered_chunk_scan_fwd(x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                           dt_limit=_NO_LIMIT, seq_idx=None, initial_states=None):
    """SSD forward with pinned launches (no reductions across programs, so nothing to order).

    Args: x [B, L, H, P]; dt [B, L, H]; A [H] fp32; B, C [B, L, G, N]; D [H] or [H, P]; z [B, L, H, P];
    dt_bias [H]; seq_idx [B, L] int32; initial_states [B, H, P, N].

    Returns:
        ``(out, out_x, dt_out, dA_cumsum, states, final_states)`` as upstream's
        ``_mamba_chunk_scan_combined_fwd``: out [B, L, H, P] (gated when z is given), out_x (ungated, None
        without z), dt_out / dA_cumsum [B, H, C, cs] fp32, states [B, C, H, P, N] (entering each chunk),
        final_states [B, H, P, N] fp32.
    """
    cb = _cb()
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
    dA_cumsum, dt_out = cb.launch_chunk_cumsum_fwd(dt, A, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                                   dt_limit=dt_limit)
    states = cb.launch_chunk_state_fwd(B, x, dt_out, dA_cumsum, seq_idx=seq_idx, states_in_fp32=True)
    init = rearrange(initial_states, "... p n -> ... (p n)") if initial_states is not None else None
    states, final_states = cb.launch_state_passing_fwd(rearrange(states, "... p n -> ... (p n)"),
                                                       dA_cumsum[:, :, :, -1], initial_states=init, seq_idx=seq_idx,
                                                       chunk_size=chunk_size, out_dtype=C.dtype)
    states = rearrange(states, "... (p n) -> ... p n", n=N)
    final_states = rearrange(final_states, "... (p n) -> ... p n", n=N)
    CB = cb.launch_bmm_chunk_fwd(C, B, chunk_size, seq_idx=seq_idx, output_dtype=torch.float32)
    out, out_x = cb.launch_chunk_scan_fwd(CB, x, dt_out, dA_cumsum, C, states, D=D, z=z, seq_idx=seq_idx)
    return out, out_x, dt_out, dA_cumsum, states, final_states


def _ssd_bwd_core(dout, x, dt, A, B, C, out, chunk_size, *, D, z, dt_bias, dt_softplus, dt_limit, seq_idx,
                  dx, ddt, dB, dC, dz, recompute_output) -> Dict[str, Optional[torch.Tensor]]:
    """One pass of the SSD backward kernels over the given examples.

    Per-position outputs (dx, ddt, dB, dC, dz, outz) are written in place into the given buffers; per-position
    tile partials (ddt over headdim tiles, dA_cumsum terms over tiles, dB/dC/dCB over head splits) are folded
    here, elementwise, in tile order. The shared-parameter partials are returned unfolded:
    ``dA_partial``/``ddt_bias_partial`` [B, C, H] and ``dD_partial`` ([B, C, T, H, P] or [B, C, T, H, Tn]).
    """
    cb = _cb()
    Bsz, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    dt_in = dt.clone()
    dA_cumsum, dt_out = cb.launch_chunk_cumsum_fwd(dt_in, A, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                                   dt_limit=dt_limit)
    CB = cb.launch_bmm_chunk_fwd(C, B, chunk_size, seq_idx=seq_idx, output_dtype=torch.float32)
    states = cb.launch_chunk_state_fwd(B, x, dt_out, dA_cumsum, seq_idx=seq_idx, states_in_fp32=True)
    states, _ = cb.launch_state_passing_fwd(rearrange(states, "... p n -> ... (p n)"), dA_cumsum[:, :, :, -1],
                                            seq_idx=seq_idx, chunk_size=chunk_size)
    states = rearrange(states, "... (p n) -> ... p n", n=N)
    dD_partial = None
    outz = None
    if z is not None:
        dz, dout, dD_partial, _, outz = cb.launch_chunk_scan_bwd_dz(
            x, z, out, dout, chunk_size, D=D, has_ddAcs=False, recompute_output=recompute_output, dz=dz)
        if not recompute_output:
            outz = None
    dstates = cb.launch_chunk_scan_bwd_dstates(C, dA_cumsum, dout, seq_idx=seq_idx, dtype=states.dtype)
    dstates, ddA_chunk_partial, _, states = cb.launch_state_passing_bwd(
        rearrange(states, "... p n -> ... (p n)"), dA_cumsum[:, :, :, -1], rearrange(dstates, "... p n -> ... (p n)"),
        seq_idx=seq_idx, has_initial_states=False, dstates_dtype=x.dtype, states_dtype=x.dtype,
        chunk_size=chunk_size)
    states = rearrange(states, "... (p n) -> ... p n", n=N)
    dstates = rearrange(dstates, "... (p n) -> ... p n", n=N)
    dx, ddt_partial, dD_from_x = cb.launch_chunk_scan_chunk_state_bwd_dx(x, dt_out, dA_cumsum, B, CB, dout, dstates,
                                                                         D=D, seq_idx=seq_idx, dx=dx)
    ddt_dx = fold_dims(ddt_partial, -1)  # [B, H, C, cs] fp32, headdim tiles in order
    dB_partial, ddA_next_partial = cb.launch_chunk_state_bwd_db(x, dt_out, dA_cumsum, dstates, B=B, seq_idx=seq_idx,
                                                                ngroups=G)
    dC_partial, ddA_prev_partial = cb.launch_chunk_scan_bwd_dC(states.to(x.dtype), dA_cumsum, dout, C=C,
                                                               seq_idx=seq_idx, ngroups=G)
    dcb_partial = cb.launch_chunk_scan_bwd_dcb(x, dt_out, dA_cumsum, dout, seq_idx=seq_idx, ngroups=G)
    dCB = fold_dims(dcb_partial, 2).to(CB.dtype)  # head splits in order
    dB_fold = fold_dims(dB_partial, 2)  # [B, L, G, N] fp32
    dC_fold = fold_dims(dC_partial, 2)
    cb.launch_bmm_chunk_bwd(C, dCB, residual=dB_fold, out=dB)
    cb.launch_bmm_chunk_bwd(B, rearrange(dCB, "... l s -> ... s l"), residual=dC_fold, out=dC)
    if z is None:
        dD_partial = dD_from_x
    # dA_cumsum gradient, as upstream assembles it, with every tile sum and scan done in a fixed order.
    ddA_prev = fold_dims(ddA_prev_partial, -1)  # [B, H, C, cs]
    ddA_prev[..., -1] += fold_dims(ddA_chunk_partial, -1)
    ddA_prev = lexical_cumsum(ddA_prev, dim=-1, reverse=True)
    ddA_next = lexical_cumsum(fold_dims(ddA_next_partial, -1), dim=-1)
    ddA = fold_dims(cb.launch_chunk_scan_bwd_ddAcs_stable(x, dt_out, dA_cumsum, dout, CB), 3)
    ddA += ddA_next + ddA_prev
    _, dA_partial, ddt_bias_partial = cb.launch_chunk_cumsum_bwd(ddA, ddt_dx, dt_in, A, dt_bias=dt_bias,
                                                                 dt_softplus=dt_softplus, dt_limit=dt_limit, ddt=ddt)
    return {"dx": dx, "ddt": ddt, "dB": dB, "dC": dC, "dz": dz, "outz": outz, "dA_partial": dA_partial,
            "ddt_bias_partial": ddt_bias_partial, "dD_partial": dD_partial}


_PARTIALS = ("dA_partial", "ddt_bias_partial", "dD_partial")


def ordered_chunk_scan_bwd(dout, x, dt, A, B, C, out, chunk_size, *, D=None, z=None, dt_bias=None,
                           dt_softplus=False, dt_limit=_NO_LIMIT, seq_idx=None, dx=None, ddt=None, dB=None, dC=None,
                           dz=None, recompute_output=False, literal=False, return_partials=False):
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
        res = _ssd_bwd_core(dout, x, dt, A, B, C, out, chunk_size, z=z, seq_idx=seq_idx, dx=dx, ddt=ddt, dB=dB,
                            dC=dC, dz=dz, **kw)
        if outz is not None:
            outz.copy_(res["outz"])
        partials = {k: res[k] for k in _PARTIALS}
    else:
        parts = {k: [] for k in _PARTIALS}
        for b in range(Bsz):
            s = slice(b, b + 1)
            res = _ssd_bwd_core(dout[s], x[s], dt[s], A, B[s], C[s], out[s], chunk_size,
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


# --------------------------------------------------------------------------------------------- helpers
def _rows_per_program(seqlen: int, chunk_size: int) -> int:
    """RMSNorm-backward row block: the largest divisor of ``L`` that divides ``chunk_size``, so every partial
    lies inside one example (and one chunk) and the partition depends only on the shape."""
    return math.gcd(seqlen, chunk_size)


#: Bound on the bytes of the fp32 buffer of per-example weight-gradient partials that
#: :func:`ordered_linear_weight_grad` folds in one launch when it runs one GEMM per example (at least one example;
#: the group size depends on the shape alone and never changes a value).
LINEAR_GROUP_BYTES = 64 << 20

#: Sequence length from which :func:`ordered_linear_weight_grad` runs one cuBLAS GEMM per example instead of the
#: fused one-launch fold (:func:`~ordered_ssd.fold.fold_example_gemms`). Short sequences: the per-example launches
#: cost host time (bench S5: 128 GEMM launches per step) and the fused kernel was faster on the GPU too at
#: L = 4096 (S2, S3); long ones: the fused kernel's tiles are too few for the long loop (bench S4, L 65536: in_proj
#: 1.82 ms fused against 0.75 ms). Nothing between 4096 and 65536 was timed (``benchmarks/linear_grad_bench.py``).
LINEAR_FUSED_BELOW_L = 8192


#: Version of ordered-ssd's own reduction algorithms on the native path; raised whenever a change gives other bits
#: for the same kernels and pinned table. 1: grouped per-example cuBLAS GEMMs for the projections; 2:
#: :func:`~ordered_ssd.fold.fold_example_gemms` below :data:`LINEAR_FUSED_BELOW_L`.
REDUCTION_VERSION = 2


def reduction_fingerprint() -> str:
    """``"v{REDUCTION_VERSION} gemm={hash}"``: the native path's reduction algorithms and their pinned settings
    (:data:`~ordered_ssd.fold.GEMM_FOLD_CONFIGS`, :data:`LINEAR_FUSED_BELOW_L`); part of the determinism
    fingerprint."""
    settings = json.dumps({"configs": {str(k): list(v) for k, v in GEMM_FOLD_CONFIGS.items()},
                           "fused_below_l": LINEAR_FUSED_BELOW_L}, sort_keys=True)
    return f"v{REDUCTION_VERSION} gemm={hashlib.sha256(settings.encode()).hexdigest()[:12]}"


def ordered_linear_weight_grad(dy: torch.Tensor, x: torch.Tensor, weight_dtype: torch.dtype,
                               bias_dtype: Optional[torch.dtype] = None, *,
                               group_bytes: int = LINEAR_GROUP_BYTES) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``dW = fold_b(dy_b^T x_b)`` and ``db = fold_b(fold_l(dy_b))`` over examples, example 0 first.

    Args: dy [B, L, out]; x [B, L, in]; ``weight_dtype`` / ``bias_dtype``: dtypes of the results (no bias
    gradient when ``bias_dtype`` is None); ``group_bytes``: see :data:`LINEAR_GROUP_BYTES`.

    Two algorithms, chosen by :func:`linear_weight_grad_is_fused` from the shape and dtypes alone; both give the
    bits of :class:`~ordered_ssd.fold.LexicalFold` over per-example fp32 partials, example 0 first:

    - fused (CUDA, ``L <`` :data:`LINEAR_FUSED_BELOW_L`): :func:`~ordered_ssd.fold.fold_example_gemms`, one Triton
      launch at a pinned configuration; each program computes its tile's partial of one example at a time and
      adds it to the running sum;
    - per example (long sequences, fp64, off CUDA): one cuBLAS GEMM with fp32 output per example
      (``torch.mm(..., out_dtype=torch.float32)``; a plain fp32 GEMM for fp32 inputs and off CUDA) into a slot of a
      group buffer (slots 256-byte aligned), each group folded into the running sum by one
      :func:`~ordered_ssd.fold.fold_dims` launch; the group size never changes a value. cuBLAS picks its
      algorithm per GPU model, so these bits are fixed per GPU model (the scope of the guarantee).

    The bias partial of an example is a fold over its positions in order.
    Runs under ``torch.no_grad()``: the result is not differentiable (the Functions that call it are
    once-differentiable).

    Returns:
        ``(dW [out, in] in weight_dtype, db [out] in bias_dtype or None)``.
    """
    with torch.no_grad():  # a backward helper; ``mm(out=...)`` refuses inputs that require grad
        return _linear_weight_grad(dy, x, weight_dtype, bias_dtype, group_bytes)


def linear_weight_grad_is_fused(dy: torch.Tensor, weight_dtype: torch.dtype) -> bool:
    """Whether :func:`ordered_linear_weight_grad` runs :func:`~ordered_ssd.fold.fold_example_gemms` (one launch)
    rather than one cuBLAS GEMM per example: on CUDA, bf16/fp16/fp32 inputs, an fp32 accumulator and sequences
    shorter than :data:`LINEAR_FUSED_BELOW_L`. Depends on the shape and dtypes only (never on the batch size), so
    an example's partial has the same bits alone or in any batch."""
    return (dy.device.type == "cuda" and dy.dtype in GEMM_FOLD_CONFIGS and dy.shape[1] < LINEAR_FUSED_BELOW_L
            and accumulation_dtype(weight_dtype) == torch.float32)


def _linear_weight_grad(dy, x, weight_dtype, bias_dtype, group_bytes):
    if linear_weight_grad_is_fused(dy, weight_dtype):
        dW = fold_example_gemms(dy, x).to(weight_dtype)
    else:
        dW = _weight_grad_grouped(dy, x, weight_dtype, group_bytes)
    db = None
    if bias_dtype is not None:
        fb = LexicalFold(bias_dtype)
        for b in range(dy.shape[0]):
            fb.add(fold_dims(dy[b], 0, dtype=torch.float32))  # the example's positions in order
        db = fb.result(like=torch.empty(dy.shape[-1], device=dy.device))
    return dW, db


def _weight_grad_grouped(dy, x, weight_dtype, group_bytes):
    """The weight gradient where it is not fused (sequences of ``LINEAR_FUSED_BELOW_L`` positions or more, fp64,
    off CUDA): one GEMM per example into a slot of a group buffer, one fold launch per group."""
    Bsz, _, out_f = dy.shape
    in_f = x.shape[-1]
    acc_w = accumulation_dtype(weight_dtype)
    n = out_f * in_f
    acc = None
    if Bsz > 0 and n > 0:
        slot = -(-n // 64) * 64  # 256-byte aligned slots, as a fresh allocation would be
        group = max(1, min(Bsz, group_bytes // (4 * slot)))
        buf = torch.empty(group, slot, dtype=torch.float32, device=dy.device)
        native_out_dtype = dy.device.type == "cuda" and dy.dtype != torch.float32
        dyT = dy.transpose(1, 2)  # dyT[b] is dy[b].t()
        for g0 in range(0, Bsz, group):
            g1 = min(Bsz, g0 + group)
            # the per-example views made in one call each (host time at large B)
            parts = buf[:g1 - g0, :n].view(g1 - g0, out_f, in_f).unbind(0)
            for part, a, b in zip(parts, dyT[g0:g1].unbind(0), x[g0:g1].unbind(0)):
                if native_out_dtype:
                    torch.mm(a, b, out_dtype=torch.float32, out=part)
                else:
                    torch.mm(a.float(), b.float(), out=part)
            acc = fold_dims(buf[:g1 - g0, :n], 0, dtype=acc_w, init=acc)
    dW = (acc.view(out_f, in_f) if acc is not None else torch.zeros(out_f, in_f, dtype=acc_w, device=dy.device))
    return dW.to(weight_dtype)


def _autocast_dtype(t: torch.Tensor) -> Optional[torch.dtype]:
    if t.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return None


# --------------------------------------------------------------------------------------- split conv scan
def ordered_split_conv1d_scan_fwd(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, *, seq_idx=None,
                                  dt_limit=_NO_LIMIT, activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6,
                                  outproj_weight=None, outproj_bias=None, headdim=None, ngroups=1,
                                  norm_before_gate=True):
    """Forward of ``mamba_split_conv1d_scan_combined`` with pinned launches.

    Returns ``(out, saved)``: ``out`` [B, L, d_out]; ``saved`` a dict of what the backward needs.
    """
    cb = _cb()
    if D.dim() == 1:
        nheads = D.shape[0]
    else:
        nheads, headdim = D.shape
    Bsz, L, _ = zxbcdt.shape
    dim = nheads * headdim
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    d_nonssm = (zxbcdt.shape[-1] - 2 * dim - 2 * ngroups * dstate - nheads) // 2
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    x, Bm, Cm = _conv_split(xBC, conv1d_weight, conv1d_bias, seq_idx, activation in ("silu", "swish"), nheads,
                            ngroups, dstate)
    zh = rearrange(z, "b l (h p) -> b l h p", h=nheads)
    rstd = None
    if rmsnorm_weight is None:
        out, out_x, *_ = ordered_chunk_scan_fwd(x, dt, A, Bm, Cm, chunk_size, D=D, z=zh, dt_bias=dt_bias,
                                                dt_softplus=True, dt_limit=dt_limit, seq_idx=seq_idx)
        out = rearrange(out, "b s h p -> b s (h p)")
        if d_nonssm > 0:
            out = torch.cat([cb.launch_swiglu_fwd(zx0), out], dim=-1)
    else:
        out_x, *_ = ordered_chunk_scan_fwd(x, dt, A, Bm, Cm, chunk_size, D=D, z=None, dt_bias=dt_bias,
                                           dt_softplus=True, dt_limit=dt_limit, seq_idx=seq_idx)
        x_rms = rearrange(out_x, "b s h p -> (b s) (h p)")
        z_rms = rearrange(zh, "b s h p -> (b s) (h p)")
        if d_nonssm == 0:
            out_buf = None
        else:
            out01 = torch.empty((Bsz, L, d_nonssm + dim), dtype=x_rms.dtype, device=x_rms.device)
            out_buf = rearrange(out01[..., d_nonssm:], "b s d -> (b s) d")
            cb.launch_swiglu_fwd(zx0, out=out01[..., :d_nonssm])
        out, rstd = cb.launch_rmsnorm_gated_fwd(x_rms, rmsnorm_weight.contiguous(), rmsnorm_eps, z=z_rms,
                                                group_size=dim // ngroups, norm_before_gate=norm_before_gate,
                                                out=out_buf)
        out = rearrange(out, "(b s) d -> b s d", b=Bsz) if d_nonssm == 0 else out01
    if outproj_weight is not None:
        ac = _autocast_dtype(out)
        w, bias = outproj_weight, outproj_bias
        if ac is not None:
            out, w = out.to(ac), w.to(ac)
            bias = bias.to(ac) if bias is not None else None
        out = F.linear(out, w, bias)
    saved = dict(out_x=out_x, rstd=rstd, headdim=headdim, nheads=nheads, ngroups=ngroups, dstate=dstate,
                 d_nonssm=d_nonssm)
    return out, saved


def _conv_split(xBC, conv1d_weight, conv1d_bias, seq_idx, silu, nheads, ngroups, dstate):
    """causal-conv1d forward (+ SiLU) of ``xBC`` [B, L, d_ssm + 2 G N], split into x [B, L, H, P] and
    B, C [B, L, G, N] (views of one buffer)."""
    xBC_conv = rearrange(_cb().launch_causal_conv1d_fwd(rearrange(_ensure_stride(xBC), "b s d -> b d s"),
                                                        conv1d_weight, conv1d_bias, seq_idx=seq_idx,
                                                        silu_activation=silu), "b d s -> b s d")
    dim = xBC.shape[-1] - 2 * ngroups * dstate
    x, Bm, Cm = torch.split(xBC_conv, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    return (rearrange(x, "b l (h p) -> b l h p", h=nheads), rearrange(Bm, "b l (g n) -> b l g n", g=ngroups),
            rearrange(Cm, "b l (g n) -> b l g n", g=ngroups))


def _ensure_stride(t: torch.Tensor) -> torch.Tensor:
    """causal-conv1d's channel-last kernel needs strides that are multiples of 8 (as upstream ensures)."""
    return t if t.stride(-2) % 8 == 0 else t.contiguous()


def ordered_split_conv1d_scan_bwd(dout, zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, chunk_size, *,
                                  saved, seq_idx=None, dt_limit=_NO_LIMIT, activation="silu", rmsnorm_weight=None,
                                  rmsnorm_eps=1e-6, rstd=None, outproj_weight=None, outproj_bias=None,
                                  norm_before_gate=True, literal=False, return_partials=False):
    """Ordered backward of ``mamba_split_conv1d_scan_combined``.

    Returns:
        ``(dzxbcdt, dconv1d_weight [D, W], dconv1d_bias, ddt_bias, dA, dD, drmsnorm_weight, doutproj_weight,
        doutproj_bias)``; every parameter gradient is a lexical fp32 fold over examples (and chunks/tiles),
        cast once to the parameter's dtype. With ``return_partials`` also a dict of the per-example partials.
    """
    cb = _cb()
    headdim, nheads, ngroups, dstate, d_nonssm = (saved[k] for k in ("headdim", "nheads", "ngroups", "dstate",
                                                                      "d_nonssm"))
    dim = nheads * headdim
    Bsz, L, _ = zxbcdt.shape
    silu = activation in ("silu", "swish")
    recompute_output = outproj_weight is not None
    if recompute_output:
        out_recompute = torch.empty(Bsz, L, d_nonssm + dim, device=out_x.device, dtype=out_x.dtype)
        out0_recompute, out1_recompute = out_recompute.split([d_nonssm, dim], dim=-1)
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    x, Bm, Cm = _conv_split(xBC, conv1d_weight, conv1d_bias, seq_idx, silu, nheads, ngroups, dstate)  # recompute
    dzxbcdt = torch.empty_like(zxbcdt)
    dzx0, dz, dxBC_given, ddt_given = torch.split(dzxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads],
                                                  dim=-1)
    dxBC = torch.empty_like(xBC)
    dx, dB, dC = torch.split(dxBC, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    zh = rearrange(z, "b l (h p) -> b l h p", h=nheads)
    dx = rearrange(dx, "b l (h p) -> b l h p", h=nheads)
    dB = rearrange(dB, "b l (g n) -> b l g n", g=ngroups)
    dC = rearrange(dC, "b l (g n) -> b l g n", g=ngroups)
    dout_og = dout
    if outproj_weight is not None:
        w = outproj_weight.to(dout.dtype)
        dout = F.linear(dout, w.t())
    if d_nonssm > 0:
        dout0, dout = dout.split([d_nonssm, dim], dim=-1)
        cb.launch_swiglu_bwd(zx0, dout0, dxy=dzx0, recompute_output=recompute_output,
                             out=out0_recompute if recompute_output else None)
    dout = rearrange(dout, "b s (h p) -> b s h p", p=headdim)
    drmsnorm_weight = None
    partials: Dict[str, torch.Tensor] = {}
    ssd_kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True, dt_limit=dt_limit, seq_idx=seq_idx, dx=dx, ddt=ddt_given,
                  dB=dB, dC=dC, literal=literal, return_partials=True)
    if rmsnorm_weight is None:
        dzh = rearrange(dz, "b l (h p) -> b l h p", h=nheads)
        (_, _, dA, _, _, dD, _, ddt_bias, outz), ssd_parts = ordered_chunk_scan_bwd(
            dout, x, dt, A, Bm, Cm, out_x, chunk_size, z=zh, dz=dzh, recompute_output=recompute_output, **ssd_kw)
        out_for_linear = rearrange(outz, "b s h p -> b s (h p)") if recompute_output else None
        if recompute_output and d_nonssm > 0:
            out1_recompute.copy_(out_for_linear)
            out_for_linear = out_recompute
    else:
        dy_rms = rearrange(dout, "b s h p -> (b s) (h p)")
        dz2 = rearrange(dz, "b l d -> (b l) d")
        x_rms = rearrange(out_x, "b s h p -> (b s) (h p)")
        z_rms = rearrange(zh, "b s h p -> (b s) (h p)")
        out1 = rearrange(out1_recompute, "b s d -> (b s) d") if recompute_output else None
        rpp = _rows_per_program(L, chunk_size)
        if not literal:
            dout_ssd, dw_partial, _, _, _ = cb.launch_rmsnorm_gated_bwd(
                dy_rms, x_rms, rmsnorm_weight, rmsnorm_eps, rstd, rows_per_program=rpp, z=z_rms,
                group_size=dim // ngroups, norm_before_gate=norm_before_gate, recompute_output=recompute_output,
                dz=dz2, out=out1)
        else:
            dout_ssd = torch.empty_like(dy_rms)
            pieces = []
            ng = rstd.shape[0] // (Bsz * L)
            rstd_g = rstd.view(ng, Bsz * L) if ng > 1 else rstd.view(1, Bsz * L)
            for b in range(Bsz):
                r = slice(b * L, (b + 1) * L)
                rstd_b = rstd_g[:, r].reshape(-1).contiguous()
                dxb, dwb, _, _, _ = cb.launch_rmsnorm_gated_bwd(
                    dy_rms[r], x_rms[r], rmsnorm_weight, rmsnorm_eps, rstd_b, rows_per_program=rpp, z=z_rms[r],
                    group_size=dim // ngroups, norm_before_gate=norm_before_gate, recompute_output=recompute_output,
                    dz=dz2[r], out=None if out1 is None else out1[r])
                dout_ssd[r].copy_(dxb)
                pieces.append(dwb)
            dw_partial = torch.cat(pieces, 0)
        drmsnorm_weight = fold_dims(dw_partial, 0, dtype=rmsnorm_weight.dtype)
        partials["drmsnorm_weight"] = dw_partial.view(Bsz, -1, dw_partial.shape[-1])
        out_for_linear = out_recompute if recompute_output else None
        dout_ssd = rearrange(dout_ssd, "(b s) (h p) -> b s h p", b=Bsz, p=headdim)
        (_, _, dA, _, _, dD, _, ddt_bias, _), ssd_parts = ordered_chunk_scan_bwd(
            dout_ssd, x, dt, A, Bm, Cm, out_x, chunk_size, z=None, **ssd_kw)
    partials.update(ssd_parts)
    dA = dA.to(A.dtype)
    dD = dD.to(D.dtype)
    ddt_bias = ddt_bias.to(dt_bias.dtype) if ddt_bias is not None else None
    doutproj_weight = doutproj_bias = None
    if outproj_weight is not None:
        doutproj_weight, doutproj_bias = ordered_linear_weight_grad(
            dout_og, out_for_linear.to(dout_og.dtype), outproj_weight.dtype,
            outproj_bias.dtype if outproj_bias is not None else None)
    dxBC_given_t = rearrange(dxBC_given, "b s d -> b d s")
    dxBC_pre, dw_part, db_part, _ = cb.launch_causal_conv1d_bwd_per_example(
        rearrange(xBC, "b s d -> b d s"), conv1d_weight, conv1d_bias, rearrange(dxBC, "b s d -> b d s"),
        silu_activation=silu, seq_idx=seq_idx, dx=dxBC_given_t)
    dweight = fold_dims(dw_part, 0, dtype=conv1d_weight.dtype)
    dbias = fold_dims(db_part, 0, dtype=conv1d_bias.dtype) if conv1d_bias is not None else None
    partials["dconv1d_weight"] = dw_part
    partials["dconv1d_bias"] = db_part
    result = (dzxbcdt, dweight, dbias, ddt_bias, dA, dD, drmsnorm_weight, doutproj_weight, doutproj_bias)
    return (result, partials) if return_partials else result
