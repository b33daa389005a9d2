"""What every ordered op shares: argument checks, the autocast dtype, the default ``dt_limit``.

Nothing here decides the order of a sum (that is :mod:`ordered_ssd.fold`) or launches a kernel (that is
:mod:`csrc_bindings`).
"""
from __future__ import annotations

from typing import Optional

import torch

from .._checks import check_tensor

__all__ = ["NO_LIMIT", "custom_fwd", "custom_bwd", "require_cuda", "autocast_dtype"]

#: Upstream's default ``dt_limit``: no clamp of the discretised step.
NO_LIMIT = (0.0, float("inf"))

#: ``torch.amp`` decorators for the Functions' forward/backward on CUDA (cast inputs as autocast would).
custom_fwd = torch.amp.custom_fwd(device_type="cuda")
custom_bwd = torch.amp.custom_bwd(device_type="cuda")


def require_cuda(name: str, t) -> None:
    """Check that ``t`` is a CUDA tensor.

    Raises:
        TypeError: ``t`` is not a tensor. ValueError: it is not on a CUDA device (the message names ``name``).
    """
    check_tensor(name, t)
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor (the ordered CUDA path), got device {t.device}")


def autocast_dtype(t: torch.Tensor) -> Optional[torch.dtype]:
    """The CUDA autocast dtype when ``t`` is a CUDA tensor and autocast is on, else None."""
    if t.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return None
