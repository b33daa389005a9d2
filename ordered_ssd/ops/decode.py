"""One decoding step of the Mamba-2 layer on the CUDA path: the conv update and the SSM state update.

Mirrors what mamba-ssm 2.3.2.post1's ``Mamba2.step`` calls: causal-conv1d's ``causal_conv1d_update`` and mamba-ssm's
``selective_state_update`` (``mamba_ssm/ops/triton/selective_state_update.py``), launched through
:mod:`csrc_bindings` (:func:`~csrc_bindings.launch_causal_conv1d_update`,
:func:`~csrc_bindings.launch_selective_state_update`). Layers, as everywhere in ordered-ssd: composition
(:func:`ordered_selective_state_update_fwd`, the arguments shaped as the kernel wants them) then the public
functions. There is no backward: decoding is inference, and the native kernels have none (upstream's neither).

Determinism: both kernels write every output element from one thread / program and sum nothing across programs or
examples (the conv's ``W`` taps and the SSM output's sum over ``N`` happen inside one thread / program), and
neither has an autotuner (``selective_state_update``'s block size follows upstream's rule on ``N``). So a step is
bitwise repeatable for the same inputs, GPU model and versions, and example ``b``'s result does not depend on the
rest of the batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import csrc_bindings

from .. import _checks
from .common import NO_LIMIT, require_cuda

__all__ = ["ordered_causal_conv1d_update", "ordered_selective_state_update_fwd", "ordered_selective_state_update"]


def ordered_causal_conv1d_update(x, conv_state, weight, bias=None, activation=None):
    """``causal_conv1d_update``: shift ``x`` into ``conv_state`` (in place) and return the conv output at it.

    Args:
        x: [B, D] CUDA tensor (fp32/fp16/bf16); conv_state: [B, D, W] of the dtype of ``x`` (``Mamba2``'s cache
            layout); weight: [D, W]; bias: [D] or None; activation: None, "silu" or "swish".

    Returns:
        [B, D], the dtype of ``x``.

    Raises:
        TypeError: a non-tensor. ValueError: not on CUDA, ``activation`` not None/"silu"/"swish", shapes the
            launcher rejects (naming the argument).
    """
    require_cuda("x", x)
    require_cuda("conv_state", conv_state)
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    return csrc_bindings.launch_causal_conv1d_update(x, conv_state, weight, bias,
                                                    silu_activation=activation in ("silu", "swish"))


def ordered_selective_state_update_fwd(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                                       dt_limit=NO_LIMIT):
    """Composition: shape Mamba-2's per-head arguments as ``Mamba2.step`` hands them to the kernel (``dt``, ``A``,
    ``dt_bias`` and a 1-d ``D`` expanded over ``P`` with stride 0, so the kernel ties them per head) and launch it.

    With a ``dt_limit`` other than ``(0, inf)`` (which upstream's step ignores), ``dt`` is discretised here in fp32
    (``clamp(softplus(dt + dt_bias), *dt_limit)``, as the forward's ``_chunk_cumsum_fwd_kernel``) and handed over
    with ``dt_softplus=False`` and a zero bias, so that a step equals the forward over the same tokens.
    """
    Bsz, H, P = x.shape
    N = state.shape[-1]
    if tuple(dt_limit) != NO_LIMIT:
        dt = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
        if dt_softplus:
            dt = F.softplus(dt, beta=1.0, threshold=20.0)
        dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
        dt_bias, dt_softplus = torch.zeros(H, device=x.device, dtype=torch.float32), False
    dt_e = dt[:, :, None].expand(Bsz, H, P)
    A_e = A.to(torch.float32)[:, None, None].expand(H, P, N)
    dt_bias_e = dt_bias[:, None].expand(H, P) if dt_bias is not None else None
    D_e = (D[:, None].expand(H, P) if D.dim() == 1 else D) if D is not None else None
    return csrc_bindings.launch_selective_state_update(state, x, dt_e, A_e, B, C, D=D_e, z=z, dt_bias=dt_bias_e,
                                                       dt_softplus=dt_softplus)


def ordered_selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                   dt_limit=NO_LIMIT):
    """One token of the SSM (``selective_state_update``, Mamba-2 per-head form): ``state`` is updated in place.

    Args:
        state: [B, H, P, N] CUDA tensor (any float dtype; computed in fp32, stored back in its dtype);
        x: [B, H, P]; dt: [B, H] (raw); A: [H] (negative, fp32); B, C: [B, G, N] with ``H % G == 0``;
        D: [H] or [H, P] or None; z: [B, H, P] gate (``y * silu(z)``) or None; dt_bias: [H] or None;
        dt_softplus: softplus of ``dt + dt_bias``; dt_limit: ``(min, max)`` clamp of the discretised ``dt``.

    Returns:
        y [B, H, P] in the dtype of ``x``: ``h = exp(dt A) h + dt x B^T``, ``y = h C + D x`` (times ``silu(z)``).

    Raises:
        TypeError: a non-tensor. ValueError: not on CUDA, or shapes the launcher rejects (naming the argument).
    """
    require_cuda("state", state)
    _checks.check_tensor("x", x)
    if x.dim() != 3 or dt.dim() != 2 or tuple(dt.shape) != tuple(x.shape[:2]):
        raise ValueError(f"x, dt: expected [B, H, P] and [B, H], got {tuple(x.shape)} and {tuple(dt.shape)}")
    return ordered_selective_state_update_fwd(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                                              dt_softplus=dt_softplus, dt_limit=dt_limit)
