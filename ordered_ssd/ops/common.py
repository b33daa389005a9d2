"""What every ordered op shares: argument checks, the autocast dtype and context, the default ``dt_limit``, the
helpers of the ``torch.library`` custom ops (absent gradients, the custom-op namespace).

Nothing here decides the order of a sum (that is :mod:`ordered_ssd.fold`) or launches a kernel (that is
:mod:`csrc_bindings`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .._checks import check_tensor

__all__ = ["NO_LIMIT", "NAMESPACE", "OP_TAGS", "require_cuda", "not_supported", "autocast_dtype", "autocast_context",
           "absent", "or_none", "as_dtype_of", "auxiliary_outputs"]

#: Upstream's default ``dt_limit``: no clamp of the discretised step.
NO_LIMIT = (0.0, float("inf"))

#: The ``torch.library`` namespace of ordered-ssd's custom ops (``torch.ops.ordered_ssd.*``).
NAMESPACE = "ordered_ssd"

#: Tags of every custom op: inductor passes each tensor argument with the exact strides it has in eager mode (the
#: launchers choose a kernel by layout, e.g. causal-conv1d's channel-last or channel-first one).
OP_TAGS = (torch.Tag.needs_exact_strides,)


def require_cuda(name: str, t) -> None:
    """Check that ``t`` is a CUDA tensor.

    Raises:
        TypeError: ``t`` is not a tensor. ValueError: it is not on a CUDA device (the message names ``name``).
    """
    check_tensor(name, t)
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor (the ordered CUDA path), got device {t.device}")


def not_supported(**kwargs) -> None:
    """Raise ``NotImplementedError`` naming the first argument that is set (not None / False).

    Raises:
        NotImplementedError: as said.
    """
    for name, value in kwargs.items():
        if value is not None and value is not False:
            raise NotImplementedError(f"{name} is not supported by the ordered path yet; pass None/False")


def autocast_dtype(t: torch.Tensor) -> Optional[torch.dtype]:
    """The CUDA autocast dtype when ``t`` is a CUDA tensor and autocast is on, else None."""
    if t.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return None


def autocast_context(dtype: Optional[torch.dtype]):
    """The CUDA autocast state a custom op's body runs under: on at ``dtype``, or off when ``dtype`` is None.

    The public functions read the caller's state with :func:`autocast_dtype` and pass it to their custom op as an
    argument; the op's forward and backward bodies run under this context. That is what ``torch.amp.custom_fwd``
    / ``custom_bwd`` gave the former ``autograd.Function`` classes (forward under the caller's autocast, backward
    under the forward's), made explicit, because a custom op's body otherwise runs with autocast excluded under
    ``torch.compile`` but not in eager mode.
    """
    if dtype is None:
        return torch.autocast("cuda", enabled=False)
    return torch.autocast("cuda", dtype=dtype)


def absent(like: torch.Tensor) -> torch.Tensor:
    """The stand-in a custom op returns for an output that does not exist (a gradient of an input that is None):
    an empty fp32 tensor on the device of ``like`` (custom-op schemas cannot return None)."""
    return like.new_empty((0,), dtype=torch.float32)


def or_none(t: torch.Tensor, present) -> Optional[torch.Tensor]:
    """``t`` when ``present`` (the input it belongs to, or a flag) is not None/False, else None (undoes
    :func:`absent`)."""
    return t if present is not None and present is not False else None


def as_dtype_of(grads: Sequence[Optional[torch.Tensor]], inputs: Sequence[Optional[torch.Tensor]],
                like: torch.Tensor) -> list:
    """Each gradient contiguous and in the dtype of its input; :func:`absent` (on the device of ``like``) where the
    gradient or its input is None. This is what autograd's engine did to the former Functions' gradients (a cast
    of an fp32 fold to the parameter dtype rounds once, as before), done inside the custom op so that its fake
    gives the exact dtypes and strides."""
    return [absent(like) if g is None or inp is None else g.to(inp.dtype).contiguous()
            for g, inp in zip(grads, inputs)]


def auxiliary_outputs(ctx, *outputs: torch.Tensor) -> None:
    """In a custom op's ``setup_context``: ``outputs`` are returned only to be saved for the backward (``out_x``,
    ``rstd``), not differentiable, and their gradients are not materialised as zeros (no allocation per step)."""
    ctx.mark_non_differentiable(*outputs)
    ctx.set_materialize_grads(False)
