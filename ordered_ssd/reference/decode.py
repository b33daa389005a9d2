"""Pure-PyTorch decoding of the Mamba-2 layer: one token at a time against a cache (the CPU path of
``OrderedMamba2.step`` and the oracle of the CUDA step).

Mirrors mamba-ssm 2.3.2.post1's ``Mamba2.step`` (its PyTorch fallback, the same math as causal-conv1d's
``causal_conv1d_update`` and mamba-ssm's ``selective_state_update``). The cache is what ``Mamba2`` allocates:

* ``conv_state`` [B, conv_dim, d_conv], the last ``d_conv`` conv inputs (``xBC`` before the conv), oldest first;
* ``ssm_state`` [B, H, P, N], the SSM state ``h`` after the last position.

Both are updated in place. The recurrence is the one of :mod:`ordered_ssd.reference.naive` (Dao & Gu 2024, SSD as
an SSM, section 3): ``h = exp(dt A) h + dt x B^T``, ``y = h C + D x``. One difference from upstream's step, which
ignores ``dt_limit``: the step clamps ``dt`` to ``dt_limit`` as the forward does, so that a step equals the
forward over the same tokens for every setting (with the default ``dt_limit = (0, inf)`` the two agree).

Imports nothing from the CUDA path. No argument checking here: ``OrderedMamba2.step`` checks.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .naive import Mamba2Dims, Mamba2Params, discretize_dt, reference_gated_rmsnorm

__all__ = ["reference_causal_conv1d_update", "reference_selective_state_update", "reference_mamba2_step"]


def reference_causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                                   bias: Optional[torch.Tensor] = None, activation: Optional[str] = "silu"):
    """One step of the causal depthwise conv: shift ``x`` [B, C] into ``conv_state`` [B, C, W] (in place) and
    return ``act(sum_k conv_state[..., k] * weight[:, k] + bias)`` [B, C] in the dtype of ``x``.

    ``weight``: [C, W] or [C, 1, W]; ``bias``: [C] or None; ``activation``: "silu", "swish" or None. Computed in
    the dtype of ``weight`` (as causal-conv1d's reference).
    """
    if weight.dim() == 3:
        weight = weight.squeeze(1)
    conv_state.copy_(torch.roll(conv_state, shifts=-1, dims=-1))
    conv_state[:, :, -1] = x
    out = torch.sum(conv_state.to(weight.dtype) * weight, dim=-1)
    if bias is not None:
        out = out + bias
    if activation in ("silu", "swish"):
        out = F.silu(out)
    return out.to(x.dtype)


def reference_selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                                     B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor] = None,
                                     z: Optional[torch.Tensor] = None, dt_bias: Optional[torch.Tensor] = None,
                                     dt_softplus: bool = False, dt_limit=(0.0, float("inf"))) -> torch.Tensor:
    """One step of the SSM: ``state`` [B, H, P, N] is updated in place and ``y`` [B, H, P] returned.

    ``x`` [B, H, P]; ``dt`` [B, H] raw (``dt_bias`` [H] added, then softplus, then the clamp to ``dt_limit``, as
    :func:`~ordered_ssd.reference.naive.discretize_dt`); ``A`` [H]; ``B``, ``C`` [B, G, N]; ``D`` [H] or [H, P];
    ``z`` [B, H, P] gate (``y * silu(z)``). Computed in the dtype of ``state``.
    """
    H = x.shape[1]
    dtype = state.dtype
    dt = discretize_dt(dt.to(dtype), None if dt_bias is None else dt_bias.to(dtype), dt_softplus, dt_limit)
    Bh = B.to(dtype).repeat_interleave(H // B.shape[1], dim=1)  # [B, H, N]
    Ch = C.to(dtype).repeat_interleave(H // C.shape[1], dim=1)
    xs = x.to(dtype)
    dA = torch.exp(dt * A.to(dtype))  # [B, H]
    state.copy_(state * dA[:, :, None, None] + torch.einsum("bh,bhp,bhn->bhpn", dt, xs, Bh))
    y = torch.einsum("bhpn,bhn->bhp", state, Ch)
    if D is not None:
        D = D.to(dtype)
        y = y + xs * (D.unsqueeze(-1) if D.dim() == 1 else D)
    if z is not None:
        y = y * F.silu(z.to(dtype))
    return y.to(x.dtype)


def reference_mamba2_step(u: torch.Tensor, params: Mamba2Params, dims: Mamba2Dims, conv_state: torch.Tensor,
                          ssm_state: torch.Tensor) -> torch.Tensor:
    """One decoding step of the layer: ``u`` [B, 1, d_model] -> [B, 1, d_model]; the cache is updated in place.

    ``conv_state`` [B, conv_dim, d_conv] and ``ssm_state`` [B, H, P, N] as
    :func:`~ordered_ssd.reference.naive.reference_mamba2_layer` (``return_states=True``) returns them after a
    prefill. Equals the last position of the layer's forward over all tokens so far (to rounding).
    """
    H, P, G, N = dims.nheads, dims.headdim, dims.ngroups, dims.d_state
    Bsz = u.shape[0]
    zxbcdt = F.linear(u.squeeze(1), params.in_proj_weight, params.in_proj_bias)
    z0, x0, z, xBC, dt = torch.split(zxbcdt, [dims.d_mlp, dims.d_mlp, dims.d_ssm, dims.conv_dim, H], dim=-1)
    xBC = reference_causal_conv1d_update(xBC, conv_state, params.conv1d_weight, params.conv1d_bias, "silu")
    x, B, C = torch.split(xBC, [dims.d_ssm, G * N, G * N], dim=-1)
    A = -torch.exp(params.A_log)
    D = params.D.reshape(H, P) if dims.D_has_hdim else params.D
    y = reference_selective_state_update(
        ssm_state, x.reshape(Bsz, H, P), dt, A, B.reshape(Bsz, G, N), C.reshape(Bsz, G, N), D=D,
        z=None if dims.rmsnorm else z.reshape(Bsz, H, P), dt_bias=params.dt_bias, dt_softplus=True,
        dt_limit=dims.dt_limit)
    y = y.reshape(Bsz, dims.d_ssm)
    if dims.rmsnorm:
        y = reference_gated_rmsnorm(y, z, params.norm_weight, dims.norm_eps, dims.d_ssm // G, dims.norm_before_gate)
    if dims.d_mlp > 0:
        y = torch.cat([F.silu(z0) * x0, y], dim=-1)
    return F.linear(y, params.out_proj_weight, params.out_proj_bias).unsqueeze(1)
