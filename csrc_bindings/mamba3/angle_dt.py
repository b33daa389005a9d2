"""Launchers for the rotary-angle cumsum of Mamba-3 (``angle_dt_fwd_kernel``, ``angle_dt_bwd_kernel``): the mirror
of ``mamba_ssm/ops/triton/mamba3/angle_dt.py``.

Forward: ``theta[b, t, h] = (sum_{s <= t} pi tanh(angle[b, s, h]) dt[b, h, s]) mod 2 pi``, chunk by chunk (a running
state per ``(b, h)`` program). Backward: the reverse cumsum. One program per ``(head, example)``: no sum across
examples or programs.
"""
from __future__ import annotations

import torch

from .._spec import KernelSpec
from .._util import check_shape, next_pow2, prefixed_strides
from .._plans import alloc
from ._runtime import launch_kernel, planned_launcher

MODULE = "mamba_ssm.ops.triton.mamba3.angle_dt"
_CANDIDATES = tuple(({}, w, s) for s in (1, 2, 3) for w in (2, 4, 8))


@planned_launcher
def launch_angle_dt_fwd(angle: torch.Tensor, dt: torch.Tensor, chunk_size: int, *, return_output_state: bool = False,
                        config=None):
    """``(theta [B, L, H, S], final [B, H, S] or None)``: the cumulative rotary angles in ``[0, 2 pi)``, in
    ``angle``'s dtype as upstream (bf16 in the layer: upstream's wrapper casts the angles to bf16).
    Source: ``angle_dt_fwd_kernel`` (no initial state, not varlen).

    Args:
        angle: [B, L, H, S] (before the tanh; contiguous). dt: [B, H, L] fp32. chunk_size: the layer's.
        return_output_state: also return the angle after the last position (the decoding cache's angle state).
        config: explicit ``{"num_warps": .., "num_stages": ..}`` or None (pinned).
    Raises:
        ValueError: ``dt`` not of shape [B, H, L].
    """
    batch, seqlen, nheads, dim = angle.shape
    check_shape("dt", dt, (batch, nheads, seqlen), "[B, H, L]")
    out = alloc(angle.shape, angle.dtype, angle.device)
    state = alloc((batch, nheads, dim), angle.dtype, angle.device) if return_output_state else None
    args = dict(OUT=out, OUTPUT_STATE=state if state is not None else out, ANGLE=angle, DT=dt, INIT_STATE=angle,
                CU_SEQLENS=angle, **prefixed_strides("stride_out", "batch seq head dim", out),
                **prefixed_strides("stride_output_state", "seq head dim", state),
                **prefixed_strides("stride_angle", "batch seq head dim", angle),
                **prefixed_strides("stride_dt", "batch head seq", dt),
                **prefixed_strides("stride_init", "seq head dim", None), stride_cu_seqlen=0, seqlen=seqlen,
                dim=dim, CHUNK_SIZE=chunk_size, BLOCK_D=next_pow2(dim), HAS_INIT_STATE=False,
                RETURN_OUTPUT_STATE=bool(return_output_state), IS_VARLEN=False)
    launch_kernel(ANGLE_DT_FWD, (nheads, batch), args, angle, config)
    return out, state


ANGLE_DT_FWD = KernelSpec(
    name="mamba3_angle_dt_fwd", module=MODULE, attr="angle_dt_fwd_kernel",
    arg_names=("OUT OUTPUT_STATE ANGLE DT INIT_STATE CU_SEQLENS stride_out_batch stride_out_seq stride_out_head "
               "stride_out_dim stride_output_state_seq stride_output_state_head stride_output_state_dim "
               "stride_angle_batch stride_angle_seq stride_angle_head stride_angle_dim stride_dt_batch stride_dt_head "
               "stride_dt_seq stride_init_seq stride_init_head stride_init_dim stride_cu_seqlen seqlen dim CHUNK_SIZE "
               "BLOCK_D HAS_INIT_STATE RETURN_OUTPUT_STATE IS_VARLEN"),
    autotune_key=("CHUNK_SIZE", "BLOCK_D", "HAS_INIT_STATE", "RETURN_OUTPUT_STATE", "IS_VARLEN"),
    candidates=_CANDIDATES,
)


@planned_launcher
def launch_angle_dt_bwd(grad_theta: torch.Tensor, angle: torch.Tensor, dt: torch.Tensor, chunk_size: int, *,
                        config=None):
    """``(d_angle [B, L, H, S] (angle's dtype), d_dt [B, H, L] fp32)`` from the gradient of ``theta``.
    Source: ``angle_dt_bwd_kernel`` (no initial state, no gradient of the final angle, not varlen).

    Raises:
        ValueError: ``grad_theta`` not of ``angle``'s shape, ``dt`` not [B, H, L].
    """
    batch, seqlen, nheads, dim = angle.shape
    check_shape("grad_theta", grad_theta, angle.shape, "the shape of angle")
    check_shape("dt", dt, (batch, nheads, seqlen), "[B, H, L]")
    d_angle = alloc(angle.shape, angle.dtype, angle.device)
    d_dt = alloc(dt.shape, dt.dtype, dt.device)
    args = dict(GRAD_ANGLE=d_angle, GRAD_DT=d_dt, GRAD_INIT_STATE=d_angle, GRAD_OUT=grad_theta,
                GRAD_OUTPUT_STATE=d_angle, ANGLE=angle, DT=dt, CU_SEQLENS=angle,
                **prefixed_strides("stride_grad_angle", "batch seq head dim", d_angle),
                **prefixed_strides("stride_grad_dt", "batch head seq", d_dt),
                **prefixed_strides("stride_grad_init", "seq head dim", None),
                **prefixed_strides("stride_grad_out", "batch seq head dim", grad_theta),
                **prefixed_strides("stride_grad_output_state", "seq head dim", None),
                **prefixed_strides("stride_angle", "batch seq head dim", angle),
                **prefixed_strides("stride_dt", "batch head seq", dt), stride_cu_seqlen=0, seqlen=seqlen, dim=dim,
                CHUNK_SIZE=chunk_size, BLOCK_D=next_pow2(dim), HAS_INIT_STATE=False, HAS_GRAD_OUTPUT_STATE=False,
                IS_VARLEN=False)
    launch_kernel(ANGLE_DT_BWD, (nheads, batch), args, angle, config)
    return d_angle, d_dt


ANGLE_DT_BWD = KernelSpec(
    name="mamba3_angle_dt_bwd", module=MODULE, attr="angle_dt_bwd_kernel",
    arg_names=("GRAD_ANGLE GRAD_DT GRAD_INIT_STATE GRAD_OUT GRAD_OUTPUT_STATE ANGLE DT CU_SEQLENS "
               "stride_grad_angle_batch stride_grad_angle_seq stride_grad_angle_head stride_grad_angle_dim "
               "stride_grad_dt_batch stride_grad_dt_head stride_grad_dt_seq stride_grad_init_seq "
               "stride_grad_init_head stride_grad_init_dim stride_grad_out_batch stride_grad_out_seq "
               "stride_grad_out_head stride_grad_out_dim stride_grad_output_state_seq stride_grad_output_state_head "
               "stride_grad_output_state_dim stride_angle_batch stride_angle_seq stride_angle_head stride_angle_dim "
               "stride_dt_batch stride_dt_head stride_dt_seq stride_cu_seqlen seqlen dim CHUNK_SIZE BLOCK_D "
               "HAS_INIT_STATE HAS_GRAD_OUTPUT_STATE IS_VARLEN"),
    autotune_key=("CHUNK_SIZE", "BLOCK_D", "HAS_INIT_STATE", "HAS_GRAD_OUTPUT_STATE", "IS_VARLEN"),
    candidates=_CANDIDATES,
)
