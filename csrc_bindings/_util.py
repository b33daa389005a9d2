"""Small helpers shared by the launchers (no native imports)."""
from __future__ import annotations

import torch


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """``triton.next_power_of_2`` (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def strides(names: str, t: torch.Tensor | None, dims) -> dict:
    """``{name_i: t.stride(dim_i)}`` for the space-separated ``names``; all zeros when ``t`` is None."""
    keys = names.split()
    if t is None:
        return {k: 0 for k in keys}
    assert len(keys) == len(dims)
    return {k: t.stride(d) for k, d in zip(keys, dims)}


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def out_buffer(buf, shape, dtype, like: torch.Tensor, name: str, zero: bool = False) -> torch.Tensor:
    """Return ``buf`` (checked: shape, dtype, device) or a new ``torch.empty`` / ``torch.zeros`` buffer."""
    shape = tuple(int(s) for s in shape)
    if buf is None:
        return (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=like.device)
    check(tuple(buf.shape) == shape, f"{name} must have shape {list(shape)}, got {list(buf.shape)}")
    check(buf.dtype == dtype, f"{name} must be {dtype}, got {buf.dtype}")
    check(buf.device == like.device, f"{name} must be on {like.device}, got {buf.device}")
    if zero:
        buf.zero_()
    return buf
