"""SHA-256 digests of tensor bytes (no numpy needed), for reproducibility checks and reports."""
from __future__ import annotations

import ctypes
import hashlib

import torch

__all__ = ["tensor_sha256"]


def tensor_sha256(t: torch.Tensor) -> str:
    """Hex SHA-256 of the raw bytes of ``t`` (copied to contiguous CPU memory first).

    Two tensors have the same digest iff they have the same bytes; dtype and shape are not hashed,
    so compare them separately where it matters.

    Raises:
        TypeError: ``t`` is not a tensor.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t: expected a torch.Tensor, got {type(t).__name__}")
    c = t.detach().to("cpu").contiguous()
    nbytes = c.numel() * c.element_size()
    data = ctypes.string_at(c.data_ptr(), nbytes) if nbytes else b""
    return hashlib.sha256(data).hexdigest()
