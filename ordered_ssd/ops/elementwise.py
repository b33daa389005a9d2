"""The elementwise steps of the Mamba-2 layer outside the fused ops, as custom ops, so compiling keeps eager's bits.

``A = -exp(A_log)`` (:func:`ordered_A_from_log`) and the gated-MLP branch ``silu(z0) * x0``
(:func:`ordered_silu_mul`). No sum over examples happens here, so there is nothing to order; the reason for the
custom ops is ``torch.compile``: inductor generates its own code for pointwise ops, which may differ from eager's
ATen kernels by an ulp (libdevice's ``exp`` against ATen's ``expf``; a fused ``silu * x`` without eager's rounding
to bf16 in between; ``silu_backward`` decomposed). Inside an opaque custom op the compiled model runs exactly the
eager kernels, forward and backward, so a compiled layer gives the eager bits.

Layers: the eager expression (forward and backward, the ATen ops autograd would run) → the custom ops
``ordered_ssd::A_from_log`` / ``ordered_ssd::silu_mul`` (fake, autograd through ``*_backward`` custom ops) → the
public functions.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from .common import call_op, ordered_custom_op, register_op_autograd

__all__ = ["ordered_A_from_log", "ordered_silu_mul"]


# --------------------------------------------------------------------------------------- A = -exp(A_log) (fp32)
def _A_from_log_body(A_log: torch.Tensor) -> torch.Tensor:
    return -torch.exp(A_log.float())


_A_from_log = ordered_custom_op("A_from_log", _A_from_log_body)


@_A_from_log.register_fake
def _(A_log):
    return torch.empty_like(A_log, dtype=torch.float32, memory_format=torch.contiguous_format)


def _A_from_log_backward_body(dA: torch.Tensor, A: torch.Tensor, A_log: torch.Tensor) -> torch.Tensor:
    # What autograd runs for -exp(A_log.float()): NegBackward (-dA), ExpBackward (times the saved exp result, which
    # is -A exactly), ToCopyBackward (cast to A_log's dtype).
    return (dA.neg() * A.neg()).to(A_log.dtype).contiguous()


_A_from_log_backward = ordered_custom_op("A_from_log_backward", _A_from_log_backward_body)


@_A_from_log_backward.register_fake
def _(dA, A, A_log):
    return torch.empty_like(A_log, memory_format=torch.contiguous_format)


def _A_setup_context(ctx, inputs, output):
    ctx.save_for_backward(output, inputs[0])


def _A_bwd(backward, ctx, dA):
    A, A_log = ctx.saved_tensors
    return backward(dA, A, A_log)


_AFromLogFunction = register_op_autograd(_A_from_log, _A_from_log_body, _A_setup_context, _A_bwd, _A_from_log_backward,
                                         _A_from_log_backward_body)


def ordered_A_from_log(A_log: torch.Tensor) -> torch.Tensor:
    """``A = -exp(A_log.float())`` [H] fp32, as ``Mamba2.forward`` computes it, with eager's bits under
    ``torch.compile`` too. ``A_log``: [H], any float dtype (the gradient comes back in its dtype)."""
    return call_op(_A_from_log, _AFromLogFunction, A_log)


# ------------------------------------------------------------------------------------ silu(z0) * x0 (gated MLP)
def _silu_mul_body(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (F.silu(z) * x).contiguous()


_silu_mul = ordered_custom_op("silu_mul", _silu_mul_body)


@_silu_mul.register_fake
def _(z, x):
    return torch.empty(torch.broadcast_shapes(z.shape, x.shape), dtype=torch.promote_types(z.dtype, x.dtype),
                       device=z.device)


def _silu_mul_backward_body(dout: torch.Tensor, z: torch.Tensor, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    # What autograd runs for silu(z) * x: MulBackward (dout * x, dout * silu(z): the same silu kernel as the
    # forward, so the same bits as the saved result), SiluBackward (aten.silu_backward).
    dz = torch.ops.aten.silu_backward(dout * x, z)
    dx = dout * F.silu(z)
    return dz.to(z.dtype).contiguous(), dx.to(x.dtype).contiguous()


_silu_mul_backward = ordered_custom_op("silu_mul_backward", _silu_mul_backward_body)


@_silu_mul_backward.register_fake
def _(dout, z, x):
    return (torch.empty_like(z, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


def _silu_mul_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _silu_mul_bwd(backward, ctx, dout):
    z, x = ctx.saved_tensors
    return backward(dout, z, x)


_SiluMulFunction = register_op_autograd(_silu_mul, _silu_mul_body, _silu_mul_setup_context, _silu_mul_bwd,
                                        _silu_mul_backward, _silu_mul_backward_body)


def ordered_silu_mul(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``silu(z) * x`` (the gated-MLP branch of ``Mamba2``, ``z``/``x`` [B, L, d_mlp] of one dtype), with eager's
    bits under ``torch.compile`` too. Returns a contiguous [B, L, d_mlp] tensor of their dtype."""
    return call_op(_silu_mul, _SiluMulFunction, z, x)
