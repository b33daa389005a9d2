"""SHA-256 digests of tensor bytes (no numpy needed), for reproducibility checks and reports."""
from __future__ import annotations

import ctypes
import hashlib

import torch

__all__ = ["tensor_sha256", "bit_view"]

_INT_OF_SIZE = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """An integer view of the bytes of ``t`` (detached, contiguous; int64/int32/int16/uint8 by element size), on
    ``t``'s device: ``torch.equal(bit_view(a), bit_view(b))`` compares bits, NaN payloads and signed zeros included.
    """
    return t.detach().contiguous().view(_INT_OF_SIZE[t.element_size()])


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
