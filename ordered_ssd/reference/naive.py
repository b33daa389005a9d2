"""Pure-PyTorch reference of the Mamba-2 layer (any device; fp32 or fp64).

This module is the oracle of the test-suite and the compute of ``OrderedMamba2``'s CPU path. It
imports nothing from the CUDA path (:mod:`ordered_ssd.ops`, :mod:`csrc_bindings`). It is written from the
state-space-duality (SSD) definition of Mamba-2 (Dao & Gu, "Transformers are SSMs", 2024, sections 3
and 6 — the chunked "block decomposition" of the semiseparable matrix) and checked in the tests against the
plain per-time-step recurrence :func:`reference_sequential_scan`.

The SSM, per example, head ``h`` (group ``g = h // (H / G)``), time ``t``::

    dt_t   = clamp(softplus(dt_raw_t + dt_bias_h), dt_limit)        (softplus optional)
    h_t    = exp(dt_t * A_h) * h_{t-1} + dt_t * x_t B_t^T            h_t: [P, N]
    y_t    = h_t C_t + D_h * x_t            (then * silu(z_t) when a z gate is given)

with the state reset to zero where ``seq_idx`` changes (packed sequences).

Terms: ``B`` batch, ``L`` sequence length, ``H`` heads, ``P`` head dim, ``G`` groups, ``N`` state
dim. All functions are differentiable with ordinary autograd; the *ordered* gradients are built
on top of them in :mod:`ordered_ssd.reference.ordered`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = [
    "Mamba2Dims",
    "Mamba2Params",
    "discretize_dt",
    "reference_causal_conv1d",
    "reference_chunk_scan",
    "reference_sequential_scan",
    "reference_gated_rmsnorm",
    "reference_mamba2_layer",
    "reference_conv_state",
]

_NO_LIMIT = (0.0, float("inf"))


@dataclass(frozen=True)
class Mamba2Dims:
    """Static sizes and options of one Mamba-2 layer (what the kernels need besides tensors).

    ``d_inner = expand * d_model``; ``d_ssm <= d_inner`` channels go through the SSM, the
    remaining ``d_mlp = d_inner - d_ssm`` through a SiLU-gated MLP branch. ``nheads = d_ssm /
    headdim``. The in_proj output ``zxbcdt`` is split as ``[z0, x0, z, xBC, dt]`` with widths
    ``[d_mlp, d_mlp, d_ssm, d_ssm + 2 G N, H]``.
    """

    d_model: int
    d_inner: int
    d_ssm: int
    headdim: int
    ngroups: int
    d_state: int
    d_conv: int
    chunk_size: int
    dt_limit: Tuple[float, float] = _NO_LIMIT
    rmsnorm: bool = True
    norm_before_gate: bool = False
    norm_eps: float = 1e-5
    D_has_hdim: bool = False

    @property
    def nheads(self) -> int:
        return self.d_ssm // self.headdim

    @property
    def d_mlp(self) -> int:
        return self.d_inner - self.d_ssm

    @property
    def conv_dim(self) -> int:
        return self.d_ssm + 2 * self.ngroups * self.d_state

    @property
    def d_in_proj(self) -> int:
        return 2 * self.d_inner + 2 * self.ngroups * self.d_state + self.nheads


class Mamba2Params(NamedTuple):
    """The parameters of one layer, in the shapes of ``Mamba2``'s ``state_dict``.

    ``in_proj_weight`` [d_in_proj, d_model], ``in_proj_bias`` [d_in_proj] or None,
    ``conv1d_weight`` [conv_dim, 1, d_conv], ``conv1d_bias`` [conv_dim] or None,
    ``dt_bias`` [H], ``A_log`` [H], ``D`` [H] (or [d_ssm] with ``D_has_hdim``),
    ``norm_weight`` [d_ssm] or None (``rmsnorm=False``), ``out_proj_weight`` [d_model, d_inner],
    ``out_proj_bias`` [d_model] or None.
    """

    in_proj_weight: torch.Tensor
    in_proj_bias: Optional[torch.Tensor]
    conv1d_weight: torch.Tensor
    conv1d_bias: Optional[torch.Tensor]
    dt_bias: torch.Tensor
    A_log: torch.Tensor
    D: torch.Tensor
    norm_weight: Optional[torch.Tensor]
    out_proj_weight: torch.Tensor
    out_proj_bias: Optional[torch.Tensor]


def discretize_dt(dt: torch.Tensor, dt_bias: Optional[torch.Tensor] = None, dt_softplus: bool = False,
                  dt_limit: Tuple[float, float] = _NO_LIMIT) -> torch.Tensor:
    """``clamp(softplus(dt + dt_bias), *dt_limit)``; ``dt`` [B, L, H], ``dt_bias`` [H].

    Mirrors the native ``_chunk_cumsum_fwd_kernel``: softplus(x) = x for x > 20, and the clamp to
    ``dt_limit`` (default ``(0, inf)``) is always applied.
    """
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt, beta=1.0, threshold=20.0)
    return dt.clamp(min=dt_limit[0], max=dt_limit[1])


def reference_causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                            seq_idx: Optional[torch.Tensor] = None, activation: Optional[str] = "silu") -> torch.Tensor:
    """Causal depthwise conv1d over time, channel-last.

    Args:
        x: [B, L, C]. weight: [C, W] (or [C, 1, W]). bias: [C] or None.
        seq_idx: [B, L] integer ids of packed sequences; taps that reach into another sequence
            contribute zero (as causal-conv1d's ``seq_idx`` does).
        activation: "silu" or None.

    Returns:
        [B, L, C]: ``out[b, t, c] = bias[c] + sum_k weight[c, k] * x[b, t - (W - 1) + k, c]``.

    Raises:
        ValueError: ``activation`` is not "silu", "swish" or None.
    """
    if weight.dim() == 3:
        weight = weight.squeeze(1)
    W = weight.shape[-1]
    L = x.shape[1]
    xp = F.pad(x, (0, 0, W - 1, 0))
    if seq_idx is not None:
        sp = F.pad(seq_idx, (W - 1, 0), value=0)
    out = None
    for k in range(W):
        term = xp[:, k:k + L, :] * weight[:, k]
        if seq_idx is not None:
            same = (sp[:, k:k + L] == seq_idx).unsqueeze(-1)
            term = torch.where(same, term, torch.zeros_like(term))
        out = term if out is None else out + term
    if bias is not None:
        out = out + bias
    if activation is not None:
        if activation not in ("silu", "swish"):
            raise ValueError(f"activation: expected 'silu', 'swish' or None, got {activation!r}")
        out = F.silu(out)
    return out


def _heads_from_groups(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """[B, L, G, N] -> [B, L, H, N]: head h reads group h // (H / G)."""
    G = t.shape[2]
    return t.repeat_interleave(nheads // G, dim=2)


def _apply_D_and_gate(y, x, D, z):
    if D is not None:
        y = y + x * (D.unsqueeze(-1) if D.dim() == 1 else D)
    if z is not None:
        y = y * F.silu(z)
    return y


def reference_chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                         chunk_size: int, D: Optional[torch.Tensor] = None, z: Optional[torch.Tensor] = None,
                         dt_bias: Optional[torch.Tensor] = None, dt_softplus: bool = False,
                         dt_limit: Tuple[float, float] = _NO_LIMIT,
                         seq_idx: Optional[torch.Tensor] = None, initial_states: Optional[torch.Tensor] = None,
                         return_final_states: bool = False, cu_seqlens: Optional[torch.Tensor] = None,
                         return_varlen_states: bool = False):
    """Chunked SSD scan, vectorised over chunks (mirror of ``mamba_chunk_scan_combined``).

    Args:
        x: [B, L, H, P]; dt: [B, L, H] (raw, before ``dt_bias``/softplus); A: [H] (negative);
        B, C: [B, L, G, N] with ``H % G == 0``; chunk_size: positive int; D: [H] or [H, P];
        z: [B, L, H, P] gate (``y * silu(z)``); dt_bias: [H]; seq_idx: [B, L] non-decreasing ids.
        initial_states: [B, H, P, N], the state before position 0. As upstream's kernels, it belongs to the
            sequence with id 0: with ``seq_idx``, positions of another id never see it.
        return_final_states: also return the state after position L - 1 ([B, H, P, N]; with ``seq_idx``, the
            state of the last sequence only).
        cu_seqlens: [S + 1] integer offsets of S packed sequences (B == 1; ``seq_idx`` must mark the same
            sequences), used only with ``return_varlen_states``.
        return_varlen_states: also return the state at the end of each of the S sequences, [S, H, P, N]
            (zeros for an empty sequence).

    Returns:
        ``y`` [B, L, H, P] in the dtype of ``x``; with the flags, as upstream: ``(y, final_states)``,
        ``(y, varlen_states)`` or ``(y, final_states, varlen_states)``.

    No argument checking happens here (the public entry points check).

    Any ``L`` >= 1 works: the last chunk is padded with ``dt = 0`` (no decay, no input), which
    leaves the outputs of the real positions unchanged. Intra-chunk terms use the
    ``exp(segsum)`` mask of the SSD block decomposition; inter-chunk states are combined with a
    chunk-level segment sum, so there is no Python loop over chunks.
    """
    Bsz, L, H, P = x.shape
    N = B.shape[-1]
    chunk_size = int(chunk_size)
    nchunks = -(-L // chunk_size)
    pad = nchunks * chunk_size - L
    dt = discretize_dt(dt, dt_bias, dt_softplus, dt_limit)
    Bh = _heads_from_groups(B, H)
    Ch = _heads_from_groups(C, H)
    if pad:
        x_p = F.pad(x, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
        Bh = F.pad(Bh, (0, 0, 0, 0, 0, pad))
        Ch = F.pad(Ch, (0, 0, 0, 0, 0, pad))
    else:
        x_p = x
    xc = x_p.reshape(Bsz, nchunks, chunk_size, H, P)
    Bc = Bh.reshape(Bsz, nchunks, chunk_size, H, N)
    Cc = Ch.reshape(Bsz, nchunks, chunk_size, H, N)
    dtc = dt.reshape(Bsz, nchunks, chunk_size, H)
    dA_cumsum = torch.cumsum(dtc * A, dim=2)  # [B, nchunks, chunk_size, H]

    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()  # [t, s], t >= s
    intra_mask = causal.view(1, 1, chunk_size, chunk_size, 1)
    if seq_idx is not None:
        seq_p = F.pad(seq_idx, (0, pad), mode="replicate") if pad else seq_idx
        sc = seq_p.reshape(Bsz, nchunks, chunk_size)
        intra_mask = intra_mask & (sc.unsqueeze(-1) == sc.unsqueeze(-2)).unsqueeze(-1)
    # Intra-chunk (diagonal blocks): y[t] = sum_{s<=t} (C_t . B_s) exp(cs_t - cs_s) dt_s x_s
    seg = dA_cumsum.unsqueeze(3) - dA_cumsum.unsqueeze(2)  # [B, nchunks, t, s, H]
    decay = torch.exp(seg.masked_fill(~intra_mask, float("-inf")))
    CB = torch.einsum("bcthn,bcshn->bctsh", Cc, Bc)
    y = torch.einsum("bctsh,bcsh,bcshp->bcthp", CB * decay, dtc, xc)

    # Chunk states: S_c = sum_s exp(cs_last - cs_s) dt_s x_s B_s^T (only positions of the last sequence)
    decay_states = torch.exp(dA_cumsum[:, :, -1:, :] - dA_cumsum)  # [B, nchunks, chunk_size, H]
    if seq_idx is not None:
        last = sc[:, :, -1]  # [B, nchunks] sequence id at each chunk end
        decay_states = decay_states * (sc == last.unsqueeze(-1)).unsqueeze(-1).to(decay_states.dtype)
    states = torch.einsum("bcsh,bcsh,bcshn,bcshp->bchpn", decay_states, dtc, Bc, xc)

    chunk_cumsum = torch.cumsum(dA_cumsum[:, :, -1, :], dim=1)  # [B, nchunks, H]
    prev = F.pad(chunk_cumsum[:, :-1, :], (0, 0, 1, 0))  # cumsum through chunk c'-1
    last_prev = F.pad(last[:, :-1], (1, 0), value=0) if seq_idx is not None else None  # id at the end of c'-1
    entering = None
    if nchunks > 1:
        # State entering chunk c' = sum_{c < c'} exp(sum of chunk totals c+1 .. c'-1) S_c
        seg_c = prev.unsqueeze(2) - chunk_cumsum.unsqueeze(1)  # [B, c', c, H]
        cmask = torch.ones(nchunks, nchunks, dtype=torch.bool, device=x.device).tril(-1).view(1, nchunks, nchunks, 1)
        if seq_idx is not None:
            cmask = cmask & (last_prev.unsqueeze(2) == last.unsqueeze(1)).unsqueeze(-1)
        w = torch.exp(seg_c.masked_fill(~cmask, float("-inf")))
        entering = torch.einsum("bxch,bchpn->bxhpn", w, states)  # [B, nchunks, H, P, N]
    if initial_states is not None:
        # The initial state enters chunk c' decayed by all of chunks 0 .. c'-1 (sequence id 0 only).
        w0 = torch.exp(prev)  # [B, nchunks, H]
        if seq_idx is not None:
            w0 = w0 * (last_prev == 0).unsqueeze(-1).to(w0.dtype)
        from_init = torch.einsum("bxh,bhpn->bxhpn", w0, initial_states.to(states.dtype))
        entering = from_init if entering is None else entering + from_init
    if entering is not None:
        out_decay = torch.exp(dA_cumsum)  # [B, nchunks, chunk_size, H]
        if seq_idx is not None:
            out_decay = out_decay * (sc == last_prev.unsqueeze(-1)).unsqueeze(-1).to(out_decay.dtype)
        y = y + torch.einsum("bcthn,bchpn,bcth->bcthp", Cc, entering, out_decay)

    y = y.reshape(Bsz, nchunks * chunk_size, H, P)[:, :L]
    y = _apply_D_and_gate(y, x, D, z)
    if not (return_final_states or return_varlen_states):
        return y
    result = (y,)
    if return_final_states:
        # The state after the last chunk: chunk states decayed by the later chunks (same sequence only).
        wf = torch.exp(chunk_cumsum[:, -1:, :] - chunk_cumsum)  # [B, nchunks, H]
        if seq_idx is not None:
            wf = wf * (last == last[:, -1:]).unsqueeze(-1).to(wf.dtype)
        final = torch.einsum("bch,bchpn->bhpn", wf, states)
        if initial_states is not None:
            w0f = torch.exp(chunk_cumsum[:, -1, :])
            if seq_idx is not None:
                w0f = w0f * (last[:, -1:] == 0).to(w0f.dtype)
            final = final + w0f[:, :, None, None] * initial_states.to(final.dtype)
        result += (final,)
    if return_varlen_states:
        if entering is None:
            entering = torch.zeros_like(states)
        result += (_varlen_states(cu_seqlens, dA_cumsum[0], dtc[0], Bc[0], xc[0], entering[0], chunk_size),)
    return result


def _varlen_states(cu_seqlens, dA_cumsum, dtc, Bc, xc, entering, chunk_size):
    """State at the end of each packed sequence (B == 1; the tensors of example 0): [S, H, P, N].

    Sequence ``i`` ends at ``e = cu_seqlens[i + 1] - 1`` in chunk ``c = e // chunk_size``, position ``r``; its state is
    the state entering chunk ``c`` decayed to ``r`` (if the sequence started before chunk ``c``, or is the first one:
    then the state entering chunk 0 is the initial state) plus the chunk's own inputs at positions ``<= r`` of
    sequence ``i``. An empty sequence has the zero state. (Upstream's ``chunk_state_varlen`` omits the initial state
    when the first sequence ends inside chunk 0; the CUDA path adds it back.)
    """
    cu = cu_seqlens.to(torch.long).tolist()
    H, P, N = xc.shape[-2], xc.shape[-1], Bc.shape[-1]
    out = xc.new_zeros(len(cu) - 1, H, P, N)
    for i in range(len(cu) - 1):
        start, end = cu[i], cu[i + 1]
        if end <= start:
            continue
        c, r = divmod(end - 1, chunk_size)
        decay = torch.exp(dA_cumsum[c, r] - dA_cumsum[c, :r + 1])  # [r + 1, H]
        mine = torch.arange(c * chunk_size, c * chunk_size + r + 1, device=xc.device) >= start
        decay = decay * mine.unsqueeze(-1).to(decay.dtype)
        state = torch.einsum("sh,sh,shn,shp->hpn", decay, dtc[c, :r + 1], Bc[c, :r + 1], xc[c, :r + 1])
        if start < c * chunk_size or start == 0:  # the state entering chunk c is this sequence's (or the initial one)
            state = state + torch.exp(dA_cumsum[c, r])[:, None, None] * entering[c]
        out[i] = state
    return out


def reference_sequential_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                              C: torch.Tensor, D: Optional[torch.Tensor] = None, z: Optional[torch.Tensor] = None,
                              dt_bias: Optional[torch.Tensor] = None, dt_softplus: bool = False,
                              dt_limit: Tuple[float, float] = _NO_LIMIT,
                              seq_idx: Optional[torch.Tensor] = None, initial_states: Optional[torch.Tensor] = None,
                              return_final_states: bool = False):
    """The SSM as a plain per-time-step recurrence (tests only: a Python loop over ``L``).

    Same arguments and result as :func:`reference_chunk_scan` (no ``chunk_size``, no varlen states):
    ``initial_states`` [B, H, P, N] is the state before position 0 (kept only where ``seq_idx[:, 0] == 0``);
    ``return_final_states`` also returns the state after position L - 1.
    """
    Bsz, L, H, P = x.shape
    N = B.shape[-1]
    dt = discretize_dt(dt, dt_bias, dt_softplus, dt_limit)
    Bh = _heads_from_groups(B, H)
    Ch = _heads_from_groups(C, H)
    h = x.new_zeros(Bsz, H, P, N)
    if initial_states is not None:
        h = initial_states.to(x.dtype)
        if seq_idx is not None:
            h = h * (seq_idx[:, 0] == 0).to(x.dtype).view(Bsz, 1, 1, 1)
    ys = []
    for t in range(L):
        if seq_idx is not None and t > 0:
            keep = (seq_idx[:, t] == seq_idx[:, t - 1]).to(x.dtype).view(Bsz, 1, 1, 1)
            h = h * keep
        dA = torch.exp(dt[:, t] * A)  # [B, H]
        h = h * dA[:, :, None, None] + torch.einsum("bh,bhp,bhn->bhpn", dt[:, t], x[:, t], Bh[:, t])
        ys.append(torch.einsum("bhpn,bhn->bhp", h, Ch[:, t]))
    y = _apply_D_and_gate(torch.stack(ys, dim=1), x, D, z)
    return (y, h) if return_final_states else y


def reference_gated_rmsnorm(y: torch.Tensor, z: Optional[torch.Tensor], weight: torch.Tensor, eps: float,
                            group_size: int, norm_before_gate: bool) -> torch.Tensor:
    """Gated RMSNorm over groups of ``group_size`` channels (mirror of ``layernorm_gated.RMSNorm``).

    ``norm_before_gate=True``: ``rmsnorm(y) * weight * silu(z)``; ``False``:
    ``rmsnorm(y * silu(z)) * weight``. ``y``, ``z``: [..., D]; ``weight``: [D].
    """
    if z is not None and not norm_before_gate:
        y = y * F.silu(z)
    shape = y.shape
    yg = y.reshape(*shape[:-1], shape[-1] // group_size, group_size)
    rstd = torch.rsqrt(yg.square().mean(dim=-1, keepdim=True) + eps)
    out = (yg * rstd).reshape(shape) * weight
    if z is not None and norm_before_gate:
        out = out * F.silu(z)
    return out


def reference_mamba2_layer(u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims,
                           seq_idx: Optional[torch.Tensor] = None, scan: str = "chunked", *,
                           return_states: bool = False, cu_seqlens: Optional[torch.Tensor] = None):
    """The full Mamba-2 layer as ``Mamba2(use_mem_eff_path=True)`` computes it.

    in_proj -> split ``[z0, x0, z, xBC, dt]`` -> causal depthwise conv1d (+bias) + SiLU on ``xBC``
    -> SSD scan with ``dt = clamp(softplus(dt + dt_bias), dt_limit)``, ``A = -exp(A_log)``,
    grouped B/C, D skip -> gated RMSNorm (or the plain ``y * silu(z)`` gate) -> concat with the
    gated-MLP branch ``silu(z0) * x0`` -> out_proj.

    Args:
        u: [B, L, d_model] (fp32 or fp64; parameters of the same dtype and device).
        params: :class:`Mamba2Params`. dims: :class:`Mamba2Dims`.
        seq_idx: [B, L] integer, non-decreasing along L, or None.
        scan: "chunked" (vectorised, default) or "sequential" (per-step recurrence, tests only).
        return_states: also return the decoding cache after the last position, as ``Mamba2``'s prefill
            (``forward`` with ``inference_params`` at ``seqlen_offset == 0``) writes it: ``conv_state``
            [B, conv_dim, d_conv], the last ``d_conv`` conv inputs (``xBC`` before the conv, zeros before position
            0), and ``ssm_state`` [B, H, P, N]. With ``cu_seqlens`` ([S + 1], B == 1, ``seq_idx`` marking the same
            sequences): one of each per sequence, [S, conv_dim, d_conv] and [S, H, P, N]. Chunked scan only.

    Returns:
        [B, L, d_model]; with ``return_states``, ``(out, conv_state, ssm_state)``.

    Raises:
        ValueError: ``scan`` is not "chunked" or "sequential". Shapes are not checked here (``OrderedMamba2``
        checks them); wrong ones fail in the torch ops.
    """
    Bsz, L, _ = u.shape
    H, P, G, N = dims.nheads, dims.headdim, dims.ngroups, dims.d_state
    zxbcdt = F.linear(u, params.in_proj_weight, params.in_proj_bias)
    z0, x0, z, xBC, dt = torch.split(zxbcdt, [dims.d_mlp, dims.d_mlp, dims.d_ssm, dims.conv_dim, H], dim=-1)
    xBC_in = xBC
    xBC = reference_causal_conv1d(xBC, params.conv1d_weight, params.conv1d_bias, seq_idx, activation="silu")
    x, B, C = torch.split(xBC, [dims.d_ssm, G * N, G * N], dim=-1)
    x = x.reshape(Bsz, L, H, P)
    B = B.reshape(Bsz, L, G, N)
    C = C.reshape(Bsz, L, G, N)
    A = -torch.exp(params.A_log)
    D = params.D.reshape(H, P) if dims.D_has_hdim else params.D
    z_heads = None if dims.rmsnorm else z.reshape(Bsz, L, H, P)
    kw = dict(D=D, z=z_heads, dt_bias=params.dt_bias, dt_softplus=True, dt_limit=dims.dt_limit, seq_idx=seq_idx)
    if return_states:
        if scan != "chunked":
            raise ValueError(f"scan: expected 'chunked' with return_states=True, got {scan!r}")
        conv_state = reference_conv_state(xBC_in, dims.d_conv, cu_seqlens)
        y, ssm_state = reference_chunk_scan(x, dt, A, B, C, dims.chunk_size, **kw,
                                            return_final_states=cu_seqlens is None, cu_seqlens=cu_seqlens,
                                            return_varlen_states=cu_seqlens is not None)
    elif scan == "chunked":
        y = reference_chunk_scan(x, dt, A, B, C, dims.chunk_size, **kw)
    elif scan == "sequential":
        y = reference_sequential_scan(x, dt, A, B, C, **kw)
    else:
        raise ValueError(f"scan: expected 'chunked' or 'sequential', got {scan!r}")
    y = y.reshape(Bsz, L, dims.d_ssm)
    if dims.rmsnorm:
        y = reference_gated_rmsnorm(y, z, params.norm_weight, dims.norm_eps, dims.d_ssm // G, dims.norm_before_gate)
    if dims.d_mlp > 0:
        y = torch.cat([F.silu(z0) * x0, y], dim=-1)
    out = F.linear(y, params.out_proj_weight, params.out_proj_bias)
    return (out, conv_state, ssm_state) if return_states else out


def reference_conv_state(xBC: torch.Tensor, state_len: int, cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The conv part of the decoding cache after a prefill: the last ``state_len`` conv inputs.

    Args:
        xBC: [B, L, C], the conv input (before the conv). state_len: ``d_conv``.
        cu_seqlens: None, or [S + 1] offsets of S packed sequences in example 0 (as causal-conv1d's
            ``causal_conv1d_varlen_states``).

    Returns:
        [B, C, state_len] (or [S, C, state_len]): ``out[..., -k:]`` holds the last ``k = min(state_len, length)``
        inputs of the (sequence of the) example, the rest zeros. As ``Mamba2`` allocates it: a transposed view of a
        contiguous [B, state_len, C] tensor.
    """
    if cu_seqlens is None:
        xt = F.pad(xBC, (0, 0, max(state_len - xBC.shape[1], 0), 0))[:, -state_len:]
        return xt.contiguous().transpose(1, 2)
    cu = cu_seqlens.to(torch.long).tolist()
    out = xBC.new_zeros(len(cu) - 1, state_len, xBC.shape[-1])
    for i in range(len(cu) - 1):
        start = max(cu[i], cu[i + 1] - state_len)
        if cu[i + 1] > start:
            out[i, state_len - (cu[i + 1] - start):] = xBC[0, start:cu[i + 1]]
    return out.transpose(1, 2)
